"""Pointer Network experiments (Vinyals et al. 2015) at the scale this CPU allows.

Each row trains `pointer-net` on one task with the same loop and config as
`attnzoo train pointer-net --task T`, in a fresh process with one torch thread, then scores the
held-out instances with greedy decoding and with beam search restricted to valid outputs.
Rows carry the paper's number where it has one, and the budget (steps, batch, minutes).

- sort_numbers: sort 5-10 uniform reals, tested at n = 5, 10 and (generalisation) 15.
- convex_hull n = 10: accuracy, area coverage and FAIL rate (Table 1's columns).
- tsp n = 5 and n = 10, supervised by Held-Karp optimal tours: average tour length beside the
  optimum (Table 2); and tsp n = 10 by REINFORCE with the rollout baseline (Kool et al. 2019).

A finished run directory whose config equals the row's is evaluated again, not retrained
(its minutes then come from the run's file times: config.json written to final.json written).

    python benchmarks/bench_pointer.py [--quick] [--only NAME ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit_result, machine_info, print_table, run_spec, write_json

RESULTS = Path(__file__).parent / "results" / "pointer.json"
RUNS = Path(__file__).parent.parent / "runs" / "bench"
BEAM = 5

# Vinyals et al. 2015 (arXiv 1506.03134v2): Table 2 average tour lengths (optimal, Ptr-Net).
PAPER = {
    "tsp-n5": {"optimal": 2.12, "ptr_net": 2.12, "source": "Vinyals 2015, Table 2"},
    "tsp-n10": {"optimal": 2.87, "ptr_net": 2.88, "source": "Vinyals 2015, Table 2"},
    "tsp-n10-reinforce": {
        "optimal": 2.87,
        "ptr_net": 2.88,
        "source": "Vinyals 2015, Table 2 (supervised); Kool 2019 report gaps for n >= 20 only",
    },
    "convex_hull-n10": {"target": "accuracy >= 85%, area >= 99% (issue 5)"},
}


def experiments(quick: bool) -> list[dict]:
    rows = [
        dict(
            name="sort_numbers",
            task="sort_numbers",
            sets=["train.steps=2000", "task.test_sizes=5,10,15"],
        ),
        dict(name="convex_hull-n10", task="convex_hull", sets=["train.steps=12000"]),
        dict(name="tsp-n5", task="tsp", sets=["task.n_min=5", "task.n_max=5", "train.steps=3000"]),
        dict(
            name="tsp-n10",
            task="tsp",
            sets=["train.steps=8000", "train.log_every=100", "train.eval_every=2000"],
        ),
        dict(
            name="tsp-n10-reinforce",
            task="tsp",
            sets=["task.objective=reinforce", "train.steps=3000", "train.lr=5e-4"],
        ),
    ]
    if quick:
        small = ["train.steps=4", "train.batch_size=8", "task.n_test=20", "model.hidden=16"]
        small += ["model.attn_hidden=16", "train.checkpoint_every=2"]
        rows = [{**r, "sets": [*r["sets"], *small]} for r in rows]
    return rows


def _resolved(spec: dict) -> dict:
    from attnzoo import runs

    return runs.apply_overrides(
        runs.default_config("pointer-net", spec["task"]),
        [*spec["sets"], "train.threads=1", "train.device=cpu"],
    )


def worker(spec: dict) -> dict:
    """Train (or reuse) one run in this process and score it greedily and with beam search."""
    import torch

    from attnzoo import runs
    from attnzoo.train.checkpoint import latest_checkpoint, load_weights

    torch.set_num_threads(1)
    config = _resolved(spec)
    out = Path(spec.get("runs", RUNS)) / f"pointer-{spec['name']}"
    done = out / "final.json"
    saved = json.loads((out / "config.json").read_text()) if done.exists() else None
    if saved == json.loads(json.dumps(config)):  # the same run, finished: score it again
        _, model = runs.build(config)
        model.load_state_dict(load_weights(latest_checkpoint(out / "checkpoints")))
        minutes = (done.stat().st_mtime - (out / "config.json").stat().st_mtime) / 60
        reused = True
    else:
        start = time.perf_counter()
        _, model, _ = runs.run_train(config, out, overwrite=True, progress=False)
        minutes = (time.perf_counter() - start) / 60
        reused = False
    model.eval()
    scores = {}
    for beam in (1, BEAM):
        config["eval"]["beam_size"] = beam
        task, _ = runs.build(config)
        with torch.no_grad():
            scores["greedy" if beam == 1 else f"beam{beam}"] = task.evaluate(model)
    runs.write_figures(out, task, model, count=2)
    return {
        "name": spec["name"],
        "task": spec["task"],
        "overrides": spec["sets"],
        "n_train": [config["task"]["n_min"], config["task"]["n_max"]],
        "objective": config["task"]["objective"],
        "steps": config["train"]["steps"],
        "batch_size": config["train"]["batch_size"],
        "instances_seen": config["train"]["steps"] * config["train"]["batch_size"],
        "run_minutes": minutes,
        "reused_run": reused,
        "params": sum(p.numel() for p in model.parameters()),
        "n_test": config["task"]["n_test"],
        "run_dir": str(out),
        "paper": PAPER.get(spec["name"]),
        **scores,
    }


def run_one(spec: dict) -> dict:
    return run_spec(__file__, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps each (smoke test)")
    parser.add_argument("--only", nargs="*", help="row names to (re)run; the rest are kept")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        emit_result(worker(json.loads(args.worker)))
        return
    specs = [
        {**s, "runs": str(args.runs)}
        for s in experiments(args.quick)
        if not args.only or s["name"] in args.only
    ]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, specs))
    if args.out.exists() and args.only:  # keep the rows not re-run
        previous = json.loads(args.out.read_text())
        redone = {r["name"] for r in rows}
        rows = [r for r in previous["rows"] if r["name"] not in redone] + rows
    order = [s["name"] for s in experiments(args.quick)]
    rows.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    write_json(args.out, {"machine": machine_info(), "quick": args.quick, "rows": rows})
    print_table(
        "Pointer Network runs",
        ["name", "status", "greedy", f"beam{BEAM}", "steps", "min"],
        [
            [
                r["name"],
                r.get("status"),
                json.dumps(r.get("greedy"))[:60],
                json.dumps(r.get(f"beam{BEAM}"))[:60],
                r.get("steps"),
                r.get("run_minutes"),
            ]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
