"""DRAM experiments (Ba, Mnih & Kavukcuoglu 2014) on the shared driver (_common.py).

Each row trains `attnzoo train MODEL --task TASK` (bench_ram's worker: a fresh process, one
torch thread) and reports on the test images `error` (% of images with any label wrong) and
`label_error` (% of labels wrong, the end class included) of one pass with the mean locations:

- multi: two MNIST digits on 64 x 64, read left to right then "end" (sec. 4.1);
- addition: the sum of the two digits (sec. 4.1);
- each beside the two-layer convnet with one softmax head per label, at the same budget.

The paper's numbers for these tasks are not confirmed from any copy here (PAPERS.md), so the
rows carry no target.

    python benchmarks/bench_dram.py [--budget smoke|full] [--only ID ...] [--seeds N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import Bench, Column, Experiment, Table, drive
from bench_ram import worker

FULL = {"steps": 60_000, "batch_size": 64}  # untuned, like bench_ram's
SMOKE = {"steps": 10, "batch_size": 16}
SMOKE_SETS = ["task.n_test=64", "model.hidden=32"]
MINUTES = 80.0  # one seed at the full budget (~75 ms a DRAM step, one thread)


def experiments(budget: str) -> list[Experiment]:
    smoke = budget == "smoke"
    train = SMOKE if smoke else FULL
    out = []
    for task, kind in (("multi_mnist", "multi"), ("mnist_addition", "addition")):
        for model in ("dram", "convnet-multi"):
            if smoke and kind == "addition":
                continue
            sets = [f"train.{k}={v}" for k, v in train.items()] + (SMOKE_SETS if smoke else [])
            params = {"model": model, "task": task, "sets": sets}
            minutes = 0.2 if smoke else MINUTES
            out.append(Experiment(f"{kind}-{model}", kind, params, 1 if smoke else 3, minutes))
    return out


COLUMNS = [
    Column("row", "id"),
    Column("error % (any label)", "error"),
    Column("label error %", "label_error"),
    Column("minutes", "train_minutes", 1),
]
TABLES = [
    Table("two digits, left to right, then end", COLUMNS, groups=["multi"]),
    Table("the sum of two digits", COLUMNS, groups=["addition"]),
]
BENCH = Bench("dram", __file__, experiments, worker, tables=TABLES)

if __name__ == "__main__":
    drive(BENCH)
