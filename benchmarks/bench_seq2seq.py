"""Seq2seq experiments: every decoder on every task, and score against source length.

1. "decoders": each decoder (no attention, Bahdanau, Luong global dot/general/concat,
   local-m, local-p, the SimpleRNN lecture model) on dates and numbers: exact match and
   alignment score (share of output tokens whose attention argmax falls in the true span).
2. "length": no attention vs Bahdanau vs Luong at (nearly) equal parameter count and equal
   step budget, scored per source-length bucket (Bahdanau 2015 Fig. 2, Luong 2015 Fig. 6), on
   the generated `reverse` task (lengths 4-40) and on kjv2web (BLEU, a small CPU budget).

Every run is a fresh process (one torch thread; two runs in parallel), trained with the same
loop and CLI config as `attnzoo train`; results go to benchmarks/results/seq2seq.json.

    python benchmarks/bench_seq2seq.py [--quick] [--only decoders|length] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, print_table, write_json

RESULTS = Path(__file__).parent / "results" / "seq2seq.json"
RUNS = Path(__file__).parent.parent / "runs" / "bench"

DECODERS = {
    "encdec": ("encdec", []),
    "bahdanau": ("bahdanau", []),
    "luong-dot": ("luong", ["model.score=dot"]),
    "luong-general": ("luong", []),
    "luong-concat": ("luong", ["model.score=additive"]),
    "luong-local-m": ("luong", ["model.local=local-m", "model.window=3"]),
    "luong-local-p": ("luong", ["model.local=local-p", "model.window=3"]),
    "simple": ("simple", []),
}
LENGTH_MODELS = {"encdec": "encdec", "bahdanau": "bahdanau", "luong-general": "luong"}


def experiments(quick: bool) -> list[dict]:
    runs = []
    steps = {"dates": 1000, "numbers": 1500, "reverse": 3000, "kjv2web": 1500}
    if quick:
        steps = {k: 20 for k in steps}
    small = (
        [
            "task.n_train=400",
            "task.n_valid=20",
            "task.n_test=60",
            "eval.limit=60",
            "model.hidden=16",
            "model.attn_hidden=16",
            "model.embed_dim=8",
        ]
        if quick
        else []
    )
    for task in ("dates", "numbers"):
        for name, (model, sets) in DECODERS.items():
            runs.append(
                dict(
                    experiment="decoders",
                    name=name,
                    model=model,
                    task=task,
                    sets=[*sets, f"train.steps={steps[task]}", *small],
                    edges=None,
                )
            )
    length_tasks = {
        "reverse": (
            ["task.min_len=4", "task.max_len=40", "eval.limit=1000", "train.batch_size=32"],
            [4, 10, 20, 30, 41],
        ),
        "kjv2web": (["eval.limit=1000", "train.batch_size=48"], [1, 10, 20, 30, 40, 50, 61]),
    }
    if quick:  # kjv2web has no size knob small enough for a smoke run
        del length_tasks["kjv2web"]
    for task, (sets, edges) in length_tasks.items():
        for name, model in LENGTH_MODELS.items():
            runs.append(
                dict(
                    experiment="length",
                    name=name,
                    model=model,
                    task=task,
                    sets=[*sets, f"train.steps={steps[task]}", *small],
                    edges=[4, 8, 12, 16, 21] if quick else edges,
                    match_params=True,
                )
            )
    if not quick:  # the Transformer (issue 4) on the generated tasks and dates, tiny preset
        for task, sets in (
            ("copy", ["train.steps=2000"]),
            ("reverse", ["train.steps=2000"]),
            ("sort", ["train.steps=2000"]),
            ("dates", ["train.steps=1000"]),
            # the Bahdanau/Luong kjv2web budget of the length experiment
            ("kjv2web", ["train.steps=1500", "train.batch_size=48", "eval.limit=1000"]),
        ):
            runs.append(
                dict(
                    experiment="transformer",
                    name="transformer",
                    model="transformer",
                    task=task,
                    sets=sets,
                    edges=None,
                )
            )
    return runs


def _matched_hidden(config: dict, spec: dict) -> int:
    """The hidden width that brings this model's parameter count closest to Bahdanau's."""
    from attnzoo import runs
    from attnzoo.models.seq2seq import Seq2Seq, Seq2SeqConfig

    task, _ = runs.build(config)
    sizes = len(task.source_vocab), len(task.target_vocab)

    def count(model_config: dict) -> int:
        return sum(p.numel() for p in Seq2Seq(Seq2SeqConfig(**model_config), *sizes).parameters())

    ref = runs.apply_overrides(runs.default_config("bahdanau", spec["task"]), spec["sets"])
    target = count(ref["model"])
    hidden = config["model"]["hidden"]
    return min(
        range(8, 4 * hidden + 1, 4),
        key=lambda h: abs(count({**config["model"], "hidden": h}) - target),
    )


def worker(spec: dict) -> dict:
    """Train one run in this process and evaluate it; returns the result row."""
    import torch

    from attnzoo import runs

    torch.set_num_threads(1)
    config = runs.apply_overrides(
        runs.default_config(spec["model"], spec["task"]), [*spec["sets"], "train.threads=1"]
    )
    if spec.get("match_params") and spec["model"] != "bahdanau":
        config["model"]["hidden"] = _matched_hidden(config, spec)
    out = Path(spec.get("runs", RUNS)) / f"{spec['experiment']}-{spec['task']}-{spec['name']}"
    start = time.perf_counter()
    task, model, final = runs.run_train(config, out, progress=False)
    minutes = (time.perf_counter() - start) / 60
    runs.write_figures(out, task, model, count=1)
    row = {
        **{k: spec[k] for k in ("experiment", "name", "model", "task")},
        "overrides": spec["sets"],
        "steps": config["train"]["steps"],
        "batch_size": config["train"]["batch_size"],
        "train_minutes": minutes,
        "params": sum(p.numel() for p in model.parameters()),
        "run_dir": str(out),
        "hidden": config["model"].get("hidden"),
        **final,
    }
    if spec["edges"]:
        model.eval()
        with torch.no_grad():
            row["by_length"] = task.by_source_length(model, spec["edges"])
    return row


def run_one(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {**spec, "status": "failed", "error": proc.stderr[-2000:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "status": "ok"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", choices=("decoders", "length", "transformer"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--task", help="run only this task's runs")
    p.add_argument("--limit", type=int, default=0, help="run only the first N runs (smoke)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--runs", default=str(RUNS), help="where the run directories go")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    specs = [s for s in experiments(args.quick) if args.only in (None, s["experiment"])]
    specs = [s for s in specs if args.task in (None, s["task"])]
    specs = specs[: args.limit] if args.limit else specs
    specs = [{**s, "runs": args.runs} for s in specs]
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else None
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, specs))
    if previous and (args.only or args.task):  # keep the rows this run did not redo
        redone = {(r["experiment"], r["task"], r["name"]) for r in rows}
        rows = [
            r for r in previous["rows"] if (r["experiment"], r["task"], r["name"]) not in redone
        ] + rows
    write_json(
        args.out,
        {
            "machine": machine_info(threads_per_run=1, parallel_runs=args.jobs),
            "quick": args.quick,
            "rows": rows,
        },
    )
    print_table(
        "seq2seq runs",
        ["experiment", "task", "name", "exact", "bleu", "align", "min"],
        [
            [
                r["experiment"],
                r["task"],
                r["name"],
                r.get("exact_match"),
                r.get("bleu"),
                r.get("alignment"),
                r.get("train_minutes"),
            ]
            for r in rows
        ],
    )
    failed = [r for r in rows if r["status"] != "ok"]
    for r in failed:
        print(f"FAILED {r['task']} {r['name']}: {r['error']}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
