"""attention()'s own cost per call: attnzoo.attention(score="scaled_dot") against a direct 4-D
F.scaled_dot_product_attention call, forward under no_grad with one thread: what its checks
and dispatch cost per call, which an RNN decoder pays at every step.

Inputs are 3-D (batch, len, d), as a decoder passes them, and 4-D (batch, 1, len, d), which
spares the views SDPA's fast kernel needs. An experiment is one length, in a worker process
that never imports Keras (importing it slowed every small torch call here, SDPA at length 16
by ~45%). The clock and the pairing of samples are METHOD's: CPU time of the calling thread,
so the time other jobs hold the core does not count, and per-round differences, so drift
between rounds cancels.

    python benchmarks/bench_attention_overhead.py [--budget smoke]  # attention_overhead.json
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import _common as C
import attnzoo
from _common import Bench, Experiment, Table, columns, drive, targets

SIZES = {"full": ((16, 32, 64, 128), 200, 41), "smoke": ((16,), 20, 3)}  # lengths, calls, repeats
METHOD = {
    "clock": "the calling thread's CPU time (time.thread_time), one torch thread",
    "us": "microseconds per call: spread over the samples (median, quartiles, range); one sample "
    "times the row's `calls` (in its params) calls back to back; samples of the implementations "
    "interleaved",
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
    seconds = C.median(C.time_interleaved({"mm": lambda: a @ b}, repeats=15, warmup=3)["mm"])
    return 2 * 1024**3 / seconds / 1e9


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

    def sample(call):
        def step() -> None:
            with torch.no_grad():
                for _ in range(p["calls"]):
                    call()

        return step

    samples = {name: sample(call) for name, call in calls.items()}
    times = C.time_interleaved(
        samples, repeats=p["repeats"], warmup=p["warmup"], clock=time.thread_time
    )
    us = {name: [t / p["calls"] * 1e6 for t in ts] for name, ts in times.items()}
    paired = {name: [a - s for a, s in zip(us[name], us["sdpa"], strict=True)] for name in calls}
    out = {f"{name}_us": C.spread(t) for name, t in us.items()}
    out |= {
        "overhead_us": C.spread(paired["attnzoo"]),
        "overhead_4d_us": C.spread(paired["attnzoo_4d"]),
    }
    out["ratio"] = out["attnzoo_us"]["median"] / out["sdpa_us"]["median"]
    return {**out, "matmul_gflops": {"before": before, "after": matmul_gflops()}}


def derive(summary: dict) -> dict[str, dict]:
    ids = [i for i, e in summary.items() if e["group"] == "overhead"]
    keys = ("overhead_us", "overhead_4d_us")
    return {"worst": {key: C.extreme(summary, ids, f"{key}.median") for key in keys}}


TARGETS = targets(
    "docs/core.md: the cost an RNN decoder pays at every step",
    *((f"attention() own cost over 4-D sdpa, {inputs} inputs: us (worst length)", "worst", key,
       "<=", 5.0) for inputs, key in (("3-D", "overhead_us"), ("4-D", "overhead_4d_us"))),
)  # fmt: skip
COLUMNS = columns("batch=params.batch; length=params.length; d=params.d")
COLUMNS += columns("attnzoo us=attnzoo_us.median; sdpa us=sdpa_us.median")
COLUMNS += columns("own cost us: median (quartiles)=overhead_us", spread="iqr")
COLUMNS += columns("attnzoo / sdpa=ratio", 3)
COLUMNS += columns("own cost, 4-D inputs, us=overhead_4d_us", spread="iqr")
COLUMNS += columns("matmul GFLOP/s before=matmul_gflops.before; after=matmul_gflops.after", 0)
TABLES = [Table("overhead", COLUMNS, ["overhead"])]
BENCH = Bench("attention_overhead", __file__, experiments, worker, TARGETS, TABLES,
              derive=derive, jobs=1, method=METHOD)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
