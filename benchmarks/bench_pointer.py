"""Pointer Network experiments (Vinyals et al. 2015) at the scale this CPU allows.

Each experiment trains `pointer-net` on one task as `attnzoo train pointer-net --task T` does,
then scores the held-out instances greedily and with beam search over valid outputs:
sort_numbers (5-10 reals, tested at 5, 10 and 15); convex_hull n = 10 (Table 1's columns and
the share of outputs that are no simple polygon); tsp n = 5 and 10 supervised by Held-Karp
tours (Table 2), and n = 10 by REINFORCE with the rollout baseline (Kool et al. 2019).

    python benchmarks/bench_pointer.py [--budget smoke|full] [--seeds N] [--only ID ...]
"""

from __future__ import annotations

from pathlib import Path

import _common as C
from _common import Bench, Experiment, Table, columns, drive, targets

BEAM = 5
RUNS = {  # id (TASK-...) -> (CPU-minutes per seed in the earlier single-seed runs, overrides)
    "sort_numbers": (12.5, "train.steps=2000 task.test_sizes=5,10,15 task.n_test=10000"),
    "convex_hull-n10": (27.5, "train.steps=12000 task.n_test=5000"),
    # the row above at 1.5 times its steps (the cosine schedule decays over all of them), added
    # after it missed 85 % by half a point on every seed (84.60, 84.44, 84.52): whether the
    # shortfall is training left undone. A setting chosen after the fact, and said so in the docs
    "convex_hull-n10-steps1.5x": (37.5, "train.steps=18000 task.n_test=5000"),
    "tsp-n5": (8.3, "task.n_min=5 task.n_max=5 train.steps=3000 task.n_test=2000"),
    "tsp-n10": (
        49.1,
        "train.steps=8000 train.log_every=100 train.eval_every=2000 task.n_test=10000",
    ),
    "tsp-n10-reinforce": (
        21.1,
        "task.objective=reinforce train.steps=3000 train.lr=5e-4 task.n_test=10000",
    ),
}
SMOKE = " train.steps=4 train.batch_size=8 task.n_test=20 model.hidden=16 model.attn_hidden=16"
SMOKE += " train.checkpoint_every=2"
# The papers' numbers shown beside ours (derived entry "paper"; PAPERS.md, confirmed from
# transcriptions): Vinyals 2015 (arXiv 1506.03134v2) Table 2 average tour lengths and Table 1
# convex hull n = 50 (accuracy %, area coverage %).
PAPER = {
    "tsp-n5": {"n": 5, "optimal": 2.12, "ptr_net": 2.12},
    "tsp-n10": {"n": 10, "optimal": 2.87, "ptr_net": 2.88},
    "convex_hull-n50": {"n": 50, "accuracy": 72.6, "area": 99.9},
}


def experiments(budget: str) -> list[Experiment]:
    found = []
    for name, (minutes, sets) in RUNS.items():
        task = name.split("-")[0]
        params = {"task": task, "sets": (sets + SMOKE * (budget == "smoke")).split()}
        group = task.split("_")[0] if task != "sort_numbers" else "sort"
        found.append(Experiment(name, group, params, 1 if budget == "smoke" else 3, minutes))
    return found


def worker(params: dict, ctx: C.Context) -> dict:
    """The run's final (greedy) scores, then beam search over valid outputs on the same set."""
    import torch

    from attnzoo import runs

    metrics, config, _, model = C.train_worker(params["sets"], "pointer-net", params["task"], ctx)
    config["eval"]["beam_size"] = BEAM
    task, _ = runs.build(config)
    with torch.no_grad():
        beam = {k: v for k, v in task.evaluate(model).items() if v is not None}
    metrics[f"beam{BEAM}"] = beam
    metrics["n_test"], metrics["beam_size"] = config["task"]["n_test"], BEAM
    return {k: v for k, v in metrics.items() if v is not None}


def derive(summary: dict) -> dict:
    return {"paper": PAPER}


def figures(data: dict, folder: Path, runs: Path) -> list[Path]:
    """Seed 0's pointer figure of each run shown, when its run dir exists."""
    shown = ("tsp-n10", "convex_hull-n10", "sort_numbers")
    run = {i: C.run_folder(runs, "pointer", i, 0) / "figures/pointer.png" for i in shown}
    return C.copy_run_figures({f"pointer_{i}.png": path for i, path in run.items()}, folder)


TARGETS = targets(
    "issue 5",
    # beam search over valid tours, the decoding fixed before the runs (not the better of
    # greedy and beam on the test set)
    ("TSP n5: gap to optimal %, beam search", "tsp-n5", f"beam{BEAM}.gap_pct", "<=", 0.5),
    ("TSP n10: gap to optimal %, beam search", "tsp-n10", f"beam{BEAM}.gap_pct", "<=", 2),
    ("convex hull n10: accuracy %", "convex_hull-n10", "accuracy", ">=", 85),
    ("convex hull n10: area coverage %", "convex_hull-n10", "area_coverage", ">=", 99),
    (
        "convex hull n10, 1.5 times the steps: accuracy %",
        "convex_hull-n10-steps1.5x",
        "accuracy",
        ">=",
        85,
    ),
)
RUN = columns("steps=steps; batch=batch_size; held-out=n_test", 0)
RUN += columns("train min=train_minutes", 1)
B = f"beam{BEAM}"
TOURS = f"our optimal=optimal; ours greedy=tour_length; ours beam={B}.tour_length"
HULL = f"accuracy % greedy=accuracy; accuracy % beam={B}.accuracy; area % greedy=area_coverage"
HULL += f"; area % beam={B}.area_coverage; no simple polygon % greedy (ours)=fail_rate"
SORT = "; ".join(
    f"n{n} greedy=exact_match_n{n}; n{n} beam={B}.exact_match_n{n}" for n in (5, 10, 15)
)
GAPS = columns(f"gap % greedy=gap_pct; gap % beam={B}.gap_pct")
TABLES = [
    Table("tsp", columns("run=id") + columns(TOURS, 3) + GAPS + RUN, ["tsp"]),
    Table("hull", columns("run=id") + columns(HULL) + RUN, ["convex"]),
    Table("sort", columns(SORT, 1) + RUN, ["sort"]),
]
BENCH = Bench("pointer", __file__, experiments, worker, TARGETS, TABLES, derive=derive,
              figures=figures)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
