"""attention()'s own cost per call: attnzoo.attention(score="scaled_dot") against a direct 4-D
F.scaled_dot_product_attention call, forward under no_grad with one thread: what its checks
and dispatch cost per call, which an RNN decoder pays at every step.

Inputs are 3-D (batch, len, d), as a decoder passes them, and 4-D (batch, 1, len, d), which
spares the views SDPA's fast kernel needs. An experiment is one length, in a worker process
that never imports Keras (importing it slowed every small torch call here, SDPA at length 16
by ~45%). Each sample times `calls` calls back to back (one call is a few microseconds);
samples of the three implementations interleaved (PERF.md). The clock is the calling thread's
CPU time: with one thread it counts the same work, and the time other jobs hold the core
(which swamped microsecond wall-clock differences) does not count. The own cost is the median
of paired differences (a round's attention() sample minus the same round's SDPA sample):
drift between rounds cancels, where a difference of two medians kept it. A 1024^3 fp32 matmul
before and after the samples says how fast the machine ran (PERF.md: 120-148 GFLOP/s quiet).

    python benchmarks/bench_overhead.py [--budget smoke]    # results/attention_overhead.json
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import attnzoo
from _common import (
    Bench,
    Experiment,
    Table,
    drive,
    extreme,
    median,
    spread,
    targets,
    time_interleaved,
)

SIZES = {"full": ((16, 32, 64, 128), 200, 41), "smoke": ((16,), 20, 3)}  # lengths, calls, repeats
METHOD = {
    "clock": "the calling thread's CPU time (time.thread_time), one torch thread",
    "us": "microseconds per call: spread over the samples (median, quartiles, range); one sample "
    "times params.calls calls back to back; samples of the implementations interleaved",
    "overhead_us": "per round, the attnzoo sample minus the same round's 4-D SDPA sample, per "
    "call (overhead_4d_us: likewise with 4-D inputs to attention()); median over the rounds",
    "matmul_gflops": "a `1024^3` fp32 matmul on one thread, before and after the samples",
}


def experiments(budget: str) -> list[Experiment]:
    lengths, calls, repeats = SIZES[budget]
    params = dict(batch=4, d=64, calls=calls, repeats=repeats, warmup=2)
    return [Experiment(f"L{n}", "overhead", {**params, "length": n}) for n in lengths]


def matmul_gflops() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return (
        2
        * 1024**3
        / median(time_interleaved({"mm": lambda: a @ b}, repeats=15, warmup=3)["mm"])
        / 1e9
    )


def worker(p: dict, ctx) -> dict:
    before = matmul_gflops()
    torch.manual_seed(0)
    q, k, v = (torch.randn(p["batch"], p["length"], p["d"]) for _ in range(3))
    q4, k4, v4 = (t.unsqueeze(1) for t in (q, k, v))  # (b, 1, len, d)
    calls = {
        "attnzoo": lambda: attnzoo.attention(q, k, v, score="scaled_dot"),
        "attnzoo_4d": lambda: attnzoo.attention(q4, k4, v4, score="scaled_dot"),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, k4, v4),
    }
    cpu: dict[str, list[float]] = {name: [] for name in calls}

    def sample(name: str):
        def step() -> None:
            start = time.thread_time()
            with torch.no_grad():
                for _ in range(p["calls"]):
                    calls[name]()
            cpu[name].append((time.thread_time() - start) / p["calls"] * 1e6)

        return step

    time_interleaved(
        {name: sample(name) for name in calls}, repeats=p["repeats"], warmup=p["warmup"]
    )
    us = {name: t[p["warmup"] :] for name, t in cpu.items()}  # its order, our clock
    paired = {name: [a - s for a, s in zip(us[name], us["sdpa"], strict=True)] for name in calls}
    out = {f"{name}_us": spread(t) for name, t in us.items()}
    out |= {
        "overhead_us": spread(paired["attnzoo"]),
        "overhead_4d_us": spread(paired["attnzoo_4d"]),
    }
    out["ratio"] = out["attnzoo_us"]["median"] / out["sdpa_us"]["median"]
    return {**out, "matmul_gflops": {"before": before, "after": matmul_gflops()}}


def derive(summary: dict) -> dict[str, dict]:
    ids = [i for i, e in summary.items() if e["group"] == "overhead"]
    keys = ("overhead_us", "overhead_4d_us")
    return {"worst": {key: extreme(summary, ids, f"{key}.median") for key in keys}}


TARGETS = targets(
    "docs/core.md: the cost an RNN decoder pays at every step",
    *((f"attention() own cost over 4-D sdpa, {inputs} inputs: us (worst length)", "worst", key,
       "<=", 5.0) for inputs, key in (("3-D", "overhead_us"), ("4-D", "overhead_4d_us"))),
)  # fmt: skip
COLUMNS = [("batch", "params.batch"), ("length", "params.length"), ("d", "params.d")]
COLUMNS += [("attnzoo us", "attnzoo_us.median"), ("sdpa us", "sdpa_us.median")]
COLUMNS += [("own cost us: median (quartiles)", "overhead_us", 2, "iqr")]
COLUMNS += [("attnzoo / sdpa", "ratio", 3)]
COLUMNS += [("own cost, 4-D inputs, us", "overhead_4d_us", 2, "iqr")]
COLUMNS += [("matmul GFLOP/s before", "matmul_gflops.before", 0)]
COLUMNS += [("after", "matmul_gflops.after", 0)]
TABLES = [Table("overhead", COLUMNS, ["overhead"])]
BENCH = Bench("attention_overhead", __file__, experiments, worker, TARGETS, TABLES,
              derive=derive, jobs=1, method=METHOD)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
