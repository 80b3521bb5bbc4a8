"""Neural Turing Machine experiments (Graves et al. 2014) at the scale this CPU allows.

1. "tasks": `ntm` and its `lstm` baseline (similar parameter count) trained on `bit_copy`
   (lengths 1-20), `repeat_copy` and `associative_recall` with the same loop and config as
   `attnzoo train MODEL --task T`, one fresh process with one torch thread per run. Every row
   records the held-out bit errors per sequence at the training lengths and at longer lengths
   (generalisation: copy is tested at 10 to 80 after training on 1-20), the learning curve
   (bit errors against sequences seen), and the budget.
2. "throughput": training sequences per second of the batched NTM (one forward/backward and
   update per batch) against the per-sample implementation pytorch-ntm uses (batch 1, one
   update per sequence), same model and sequences, timed interleaved in one process.

    python benchmarks/bench_ntm.py [--quick] [--only tasks|throughput] [--task T ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import (
    emit_result,
    machine_info,
    median,
    print_table,
    run_spec,
    time_interleaved,
    write_json,
)

RESULTS = Path(__file__).parent / "results" / "ntm.json"
RUNS = Path(__file__).parent.parent / "runs" / "bench"
COPY_LENGTHS = (10, 20, 30, 40, 50, 60, 80)
TARGET_ERRORS = 0.1  # bit errors per sequence on lengths 1-20 (issue 5)


def experiments(quick: bool) -> list[dict]:
    rows = []
    for task, extra in (
        ("bit_copy", [f"task.test_lengths={','.join(map(str, COPY_LENGTHS))}"]),
        ("repeat_copy", ["task.test_lengths=15,20"]),
        ("associative_recall", ["task.test_lengths=8,10,12"]),
    ):
        for model in ("ntm", "lstm"):
            sets = [*extra, "train.eval_every=250"]
            if quick:
                sets += ["train.steps=4", "train.batch_size=4", "train.eval_every=2"]
                sets += ["task.n_test_per_length=2", "train.checkpoint_every=2"]
            rows.append(
                dict(experiment="tasks", name=f"{task}-{model}", model=model, task=task, sets=sets)
            )
    return rows


def worker(spec: dict) -> dict:
    """Train one run in this process; its final scores and learning curve."""
    import torch

    from attnzoo import runs

    torch.set_num_threads(1)
    config = runs.apply_overrides(
        runs.default_config(spec["model"], spec["task"]),
        [*spec["sets"], "train.threads=1", "train.device=cpu"],
    )
    out = Path(spec.get("runs", RUNS)) / f"ntm-{spec['name']}"
    start = time.perf_counter()
    task, model, final = runs.run_train(config, out, overwrite=True, progress=False)
    minutes = (time.perf_counter() - start) / 60
    runs.write_figures(out, task, model, count=3)
    batch = config["train"]["batch_size"]
    curve = [
        {"sequences": (r["step"] + 1) * batch, "bit_errors": r["bit_errors"]}
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if "bit_errors" in r
    ]
    curve.append({"sequences": config["train"]["steps"] * batch, "bit_errors": final["bit_errors"]})
    reached = next((c["sequences"] for c in curve if c["bit_errors"] < TARGET_ERRORS), None)
    return {
        **{k: spec[k] for k in ("experiment", "name", "model", "task")},
        "overrides": spec["sets"],
        "steps": config["train"]["steps"],
        "batch_size": batch,
        "sequences": config["train"]["steps"] * batch,
        "train_minutes": minutes,
        "params": sum(p.numel() for p in model.parameters()),
        "train_lengths": [config["task"]["min_len"], config["task"]["max_len"]],
        "curve": curve,
        "sequences_to_target": reached,
        "run_dir": str(out),
        **final,
    }


def throughput(quick: bool, length: int = 20, batch: int = 32, repeats: int = 7) -> dict:
    """Sequences/s of one batched update of `batch` sequences against `batch` updates of one
    sequence each (pytorch-ntm's loop), same NTM weights and the same sequences."""
    import torch

    from attnzoo import runs
    from attnzoo.tasks.bits import generate

    torch.set_num_threads(1)
    if quick:
        length, batch, repeats = 3, 4, 2
    config = runs.default_config("ntm", "bit_copy")
    task, model = runs.build(config)
    data = generate(task.config, batch, length, torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def update(part) -> None:
        loss, _ = task.loss(model, part)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    singles = [type(data)(*(t[i : i + 1] for t in data)) for i in range(batch)]
    times = time_interleaved(
        {"batched": lambda: update(data), "per_sample": lambda: [update(s) for s in singles]},
        repeats=repeats,
    )
    per = {k: batch / median(v) for k, v in times.items()}
    return {
        "experiment": "throughput",
        "name": "throughput",
        "length": length,
        "batch_size": batch,
        "sequences_per_s": per,
        "speedup": per["batched"] / per["per_sample"],
        "status": "ok",
    }


def run_one(spec: dict) -> dict:
    return run_spec(__file__, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps each (smoke test)")
    parser.add_argument("--only", choices=["tasks", "throughput"])
    parser.add_argument("--task", nargs="*", help="tasks to (re)run; other rows are kept")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        emit_result(worker(json.loads(args.worker)))
        return
    rows = []
    if args.only in (None, "tasks"):
        specs = [
            {**s, "runs": str(args.runs)}
            for s in experiments(args.quick)
            if not args.task or s["task"] in args.task
        ]
        with ThreadPoolExecutor(args.jobs) as pool:
            rows += list(pool.map(run_one, specs))
    if args.only in (None, "throughput"):
        rows.append(throughput(args.quick))
    if args.out.exists() and (args.only or args.task):  # keep the rows not re-run
        redone = {r["name"] for r in rows}
        kept = [r for r in json.loads(args.out.read_text())["rows"] if r["name"] not in redone]
        rows = kept + rows
    write_json(args.out, {"machine": machine_info(), "quick": args.quick, "rows": rows})
    print_table(
        "NTM runs",
        ["name", "status", "bit errors 1-20", "len 40", "sequences", "to < 0.1", "min"],
        [
            [
                r["name"],
                r.get("status"),
                r.get("bit_errors"),
                r.get("bit_errors_len40"),
                r.get("sequences"),
                r.get("sequences_to_target"),
                r.get("train_minutes"),
            ]
            for r in rows
            if r.get("experiment") == "tasks"
        ],
    )
    for r in rows:
        if r.get("experiment") == "throughput":
            print(f"throughput: {r['sequences_per_s']} sequences/s, speedup {r['speedup']:.2f}x")


if __name__ == "__main__":
    main()
