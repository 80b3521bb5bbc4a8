"""Neural Turing Machine experiments (Graves et al. 2014) at the scale this CPU allows.

1. "tasks": `ntm` and its `lstm` baseline (similar parameter count) trained on `bit_copy`
   (lengths 1-20), `repeat_copy` and `associative_recall` with the config of
   `attnzoo train MODEL --task T`, one seed per run, one torch thread. Every run records the
   held-out bit errors per sequence at the training lengths and at longer lengths (copy is
   tested at 10 to 80 after training on 1-20) and its learning curve.
2. "throughput": training sequences per second of the batched NTM (one forward/backward and
   update per batch) against the per-sample loop pytorch-ntm uses (batch 1, one update per
   sequence), same model and sequences, timed interleaved in one process.

    python benchmarks/bench_ntm.py [--budget smoke|full] [--seeds N] [--only ID|GROUP ...]
"""

from __future__ import annotations

from pathlib import Path

import _common as C
from _common import Bench, Experiment, Table, columns, drive, targets

COPY_LENGTHS = (10, 20, 30, 40, 50, 60, 80)
TARGET_ERRORS = 0.1  # bit errors per sequence on lengths 1-20 (issue 5)
PER_LENGTH = "task.n_test_per_length=256"  # standard error of a length's mean well below 0.5
TASKS = {  # task -> (test lengths beyond training, CPU-minutes per seed: ntm, lstm)
    "bit_copy": (COPY_LENGTHS, (3.0, 0.6)),  # ntm: 1.4-3 min a seed at one thread (timing.json)
    "repeat_copy": ((15, 20), (19.0, 1.3)),
    "associative_recall": ((8, 10, 12), (9.2, 0.5)),
}
SMOKE = ["train.steps=4", "train.batch_size=4", "train.eval_every=2", "train.log_every=2"]
SMOKE += ["train.checkpoint_every=2"]


def experiments(budget: str) -> list[Experiment]:
    found = []
    for task, (lengths, minutes) in TASKS.items():
        if budget == "smoke" and task != "bit_copy":
            continue
        sets = [f"task.test_lengths={','.join(map(str, lengths))}", "train.eval_every=250"]
        sets.append("task.n_test_per_length=2" if budget == "smoke" else PER_LENGTH)
        for model, cost in zip(("ntm", "lstm"), minutes, strict=True):
            params = {"model": model, "task": task, "sets": sets + SMOKE * (budget == "smoke")}
            seeds = 2 if budget == "smoke" else 3 if cost > 5 else 5
            found.append(Experiment(f"{task}-{model}", "tasks", params, seeds, cost))
    throughput = {"length": 20, "batch": 32, "repeats": 7}
    if budget == "smoke":
        throughput = {"length": 3, "batch": 4, "repeats": 2}
    found.append(Experiment("throughput", "throughput", throughput, minutes=1.0))
    return found


def throughput(length: int, batch: int, repeats: int) -> dict:
    """Sequences/s of one batched update of `batch` sequences against `batch` updates of one
    sequence each (pytorch-ntm's loop), same NTM weights and the same sequences."""
    import torch

    from attnzoo import runs
    from attnzoo.tasks.bits import generate

    task, model = runs.build(runs.default_config("ntm", "bit_copy"))
    data = generate(task.config, batch, length, torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def update(part) -> None:
        loss, _ = task.loss(model, part)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    singles = [type(data)(*(t[i : i + 1] for t in data)) for i in range(batch)]
    times = C.time_interleaved(
        {"batched": lambda: update(data), "per_sample": lambda: [update(s) for s in singles]},
        repeats=repeats,
    )
    per = {k: batch / C.median(v) for k, v in times.items()}
    return {"sequences_per_s": per, "speedup": per["batched"] / per["per_sample"]}


def worker(params: dict, ctx: C.Context) -> dict:
    if "model" not in params:
        return throughput(**params)
    metrics, config, _, _ = C.train_worker(
        params["sets"], params["model"], params["task"], ctx, curve="bit_errors", figures=3
    )
    batch = config["train"]["batch_size"]
    for point in metrics["curve"]:
        point["sequences"] = point["step"] * batch
    reached = [c["sequences"] for c in metrics["curve"] if c["bit_errors"] < TARGET_ERRORS]
    metrics["reached_target"] = float(bool(reached))
    if reached:  # absent when never reached: a mean over the seeds that did would flatter
        metrics["sequences_to_target"] = reached[0]
    metrics["sequences"] = config["train"]["steps"] * batch
    metrics["target_bit_errors"] = TARGET_ERRORS
    metrics["n_test_per_length"] = config["task"]["n_test_per_length"]
    metrics["exact_pct"] = 100 * metrics["exact"]
    return metrics


def derive(summary: dict) -> dict:
    """NTM bit errors over the LSTM's at copy length 40, per seed both ran."""
    ntm, lstm = (C.by_seed(summary, f"bit_copy-{m}", "bit_errors_len40") for m in ("ntm", "lstm"))
    ratio = [ntm[k] / lstm[k] for k in sorted(ntm.keys() & lstm.keys()) if lstm[k]]
    ratio = C.Paired(ratio, ("bit_copy-ntm", "bit_copy-lstm"))  # (a verdict's stale sources)
    return {"copy-ratio": {"len40_ntm_over_lstm": ratio, "length": 40}} if ratio else {}


def figures(data: dict, folder: Path, runs: Path) -> list[Path]:
    """The copy learning curve (every seed, from the JSON) and the NTM's memory figures (from
    seed 0's run dir, when it exists)."""
    groups: dict[str, list] = {}
    for row in data["rows"]:
        if row["id"].startswith("bit_copy-") and row.get("status") == "ok":
            curve = row["metrics"]["curve"]
            series = ([c["sequences"] for c in curve], [c["bit_errors"] for c in curve])
            groups.setdefault(f"{row['params']['model']}", []).append(series)
    drawn = []
    if groups:
        path = Path(folder) / "ntm_copy_curve.png"
        title = "copy: learning curve on lengths 1-20 (mean over seeds; band: min to max)"
        labels = dict(xlabel="training sequences", ylabel="bit errors per sequence", title=title)
        drawn.append(C.draw_seeds(path, groups, symlog=0.1, **labels))
    run = C.run_folder(runs, "ntm", "bit_copy-ntm", 0) / "figures"
    shown = {f"ntm_memory_copy_len{n}.png": run / f"memory_copy_len{n}.png" for n in (20, 80)}
    return drawn + C.copy_run_figures(shown, folder)


COPY_TARGETS = [  # on bit_copy-ntm: name, key, op, threshold
    ("copy: sequences to target", "sequences_to_target", "<=", 50000),
    ("copy: share of seeds reaching the target", "reached_target", ">=", 1),
]
TARGETS = targets(
    "issue 5",
    *((name, "bit_copy-ntm", key, op, x) for name, key, op, x in COPY_TARGETS),
    ("copy, length 40: NTM / LSTM bit errors", "copy-ratio", "len40_ntm_over_lstm", "<", 0.25),
    ("training sequences/s: batched / per sample", "throughput", "speedup", ">=", 5),
)
TASK_COLUMNS = columns("task=params.task; model=params.model", 0)
TASK_COLUMNS += columns(
    "params=params; steps=steps; batch=batch_size; held-out per length=n_test_per_length", 0
)
TASK_COLUMNS += columns("train min=train_minutes", 1)
TASK_COLUMNS += columns("bit errors (train lengths)=bit_errors; exact %=exact_pct")
TASK_COLUMNS += columns("sequences to target=sequences_to_target", 0)
COPY = ["bit_copy-ntm", "bit_copy-lstm"]
LENGTH_COLUMNS = "; ".join(f"len{n}=bit_errors_len{n}" for n in (1, *COPY_LENGTHS))
THROUGHPUT = (
    "batched (seq/s)=sequences_per_s.batched; per sample (seq/s)=sequences_per_s.per_sample"
)
TABLES = [
    Table("tasks", TASK_COLUMNS, ["tasks"]),
    Table("copy_lengths", columns("model=params.model") + columns(LENGTH_COLUMNS), ids=COPY),
    Table("throughput", columns(THROUGHPUT + "; speedup=speedup"), ["throughput"]),
]
BENCH = Bench("ntm", __file__, experiments, worker, TARGETS, TABLES, derive=derive, figures=figures)

if __name__ == "__main__":
    drive(BENCH)
