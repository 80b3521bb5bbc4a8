"""Keras benchmark: attnzoo.keras layers against Keras's own, on the torch backend.

Rows, at bench_attention.py's sizes:
- AdditiveAttention, forward + backward (batch 4, d 64, lengths 128 and 512): attnzoo's
  drop-in against keras.layers.AdditiveAttention with the same weights (matched features:
  Keras's score has d_hidden = d);
- MultiHeadAttention training step, forward + backward of self-attention (batch 8, d_model
  512, 8 heads, lengths 128 and 512): attnzoo's layer built by `from_keras` against
  keras.layers.MultiHeadAttention.

Each row gives the median time per call of both layers, interleaved in this process after
identical warm-up (PERF.md), the peak memory of each in a fresh worker process (VmHWM after
one call minus VmHWM after imports, inputs and a call at a tiny length, as bench_attention.py
measures it), and the largest difference of their outputs. The script checks the targets and
writes one JSON.

    python benchmarks/bench_keras.py                 # full run, writes results/keras.json
    python benchmarks/bench_keras.py --quick         # smoke run with tiny sizes
    python benchmarks/bench_keras.py --worker JSON   # internal: one peak-memory measurement
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"  # before keras is imported, in this and every worker
os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")  # a CPU benchmark, also where CUDA exists

import torch

import _common as common
import attnzoo
import attnzoo.keras as ak
import keras

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "keras.json"
WARM_LENGTH = 8  # a worker's first, unmeasured call
ADDITIVE, MHA = "AdditiveAttention", "MultiHeadAttention"
OURS, KERAS = "attnzoo", "keras"
NOTES = {
    ADDITIVE: "forward + backward from a random output gradient; inputs [query, value, key]",
    MHA: "training step: forward + backward of self-attention layer(x, x), dropout 0",
}


@dataclass(frozen=True)
class Sizes:
    additive_batch: int
    additive_d: int
    mha_batch: int
    mha_d_model: int
    mha_heads: int
    lengths: tuple[int, ...]
    target_length: int
    repeats: dict[int, int]
    warmup: int
    memory: str  # "all", or "targets": only the rows a target reads get a memory worker


def full_sizes() -> Sizes:
    """bench_attention.py's: additive at batch 4, d 64; MHA as Vaswani's base model
    (d_model 512, 8 heads) at batch 8; lengths 128 and 512 (the targets')."""
    return Sizes(4, 64, 8, 512, 8, (128, 512), 512, {128: 30, 512: 10}, 3, "all")


def quick_sizes() -> Sizes:
    return Sizes(2, 8, 2, 16, 2, (16, 32), 32, {16: 2, 32: 2}, 1, "targets")


@dataclass(frozen=True)
class Case:
    layer: str  # ADDITIVE or MHA
    impl: str  # OURS or KERAS
    batch: int
    length: int
    d: int  # features (d_model for MHA)
    heads: int | None = None


def cases(sizes: Sizes) -> list[Case]:
    out = []
    for length in sizes.lengths:
        for impl in (OURS, KERAS):
            out.append(Case(ADDITIVE, impl, sizes.additive_batch, length, sizes.additive_d))
        for impl in (OURS, KERAS):
            out.append(Case(MHA, impl, sizes.mha_batch, length, sizes.mha_d_model, sizes.mha_heads))
    return out


# 1. One call ----------------------------------------------------------------------------------


def build_layers(case: Case):
    """(forward, leaves, output shape) for one case. Keras's layer is built first and attnzoo's
    takes its weights, so both sides compute the same function."""
    torch.manual_seed(0)
    keras.utils.set_random_seed(0)
    b, n, d = case.batch, case.length, case.d
    if case.layer == ADDITIVE:
        q, v, k = (torch.randn(b, n, d, requires_grad=True) for _ in range(3))
        theirs = keras.layers.AdditiveAttention()
        with torch.no_grad():
            theirs([q[:1, :2], v[:1, :2], k[:1, :2]])  # builds the weights
        layer = theirs
        if case.impl == OURS:
            layer = ak.AdditiveAttention()
            with torch.no_grad():
                layer([q[:1, :2], v[:1, :2], k[:1, :2]])
            layer.set_weights(theirs.get_weights())
        leaves = [q, v, k, *(w.value for w in layer.trainable_weights)]
        return lambda: layer([q, v, k], training=True), leaves, (b, n, d)
    x = torch.randn(b, n, d, requires_grad=True)
    theirs = keras.layers.MultiHeadAttention(num_heads=case.heads, key_dim=d // case.heads)
    with torch.no_grad():
        theirs(x[:1, :2], x[:1, :2])
    layer = ak.MultiHeadAttention.from_keras(theirs) if case.impl == OURS else theirs
    leaves = [x, *(w.value for w in layer.trainable_weights)]
    return lambda: layer(x, x, training=True), leaves, (b, n, d)


def build_step(case: Case):
    forward, leaves, shape = build_layers(case)
    grad_output = torch.randn(shape)

    def step():
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_output)

    return step


def max_difference(ours: Case, theirs: Case) -> float:
    """The largest |attnzoo - keras| over the outputs of one configuration."""
    with torch.no_grad():
        a, b = build_layers(ours)[0](), build_layers(theirs)[0]()
    return float((a - b).abs().max())


# 2. Peak memory (worker processes) ------------------------------------------------------------


def worker(payload: dict[str, Any]) -> None:
    torch.set_num_threads(payload["threads"])
    case = Case(**payload["case"])
    build_step(dataclasses.replace(case, length=WARM_LENGTH))()  # thread pool, lazy imports
    gc.collect()
    step = build_step(case)
    peak = common.PeakMemory()
    step()
    common.emit_result({"peak_mib": peak.peak_bytes() / common.MIB, "hwm_reset": peak.reset})


def measure_memory(case: Case, threads: int) -> dict[str, Any]:
    payload = {"case": dataclasses.asdict(case), "threads": threads}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(payload)]
    return common.run_worker(command, timeout=900)


# 3. Targets -----------------------------------------------------------------------------------


def _ratio(numerator, denominator):
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _target(name: str, value, wanted: float) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "target": f"<= {wanted}",
        "met": value is not None and value <= wanted,
    }


def evaluate_targets(rows: list[dict], sizes: Sizes) -> list[dict[str, Any]]:
    def row(layer):
        return next(r for r in rows if r["layer"] == layer and r["length"] == sizes.target_length)

    add, mha = row(ADDITIVE), row(MHA)
    at = f"B{add['batch']} T{add['length']}"
    mha_at = f"B{mha['batch']} T{mha['length']}"
    return [
        _target(
            f"{ADDITIVE} fwd+bwd {at}: time / keras (matched features)", add["time_ratio"], 0.5
        ),
        _target(f"{ADDITIVE} fwd+bwd {at}: peak memory / keras", add["peak_ratio"], 0.1),
        _target(f"{MHA} training step {mha_at}: time / keras", mha["time_ratio"], 1.0),
    ]


# 4. Main --------------------------------------------------------------------------------------


def run(sizes: Sizes, out: Path, threads: int, argv: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(threads)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {message}", file=sys.stderr, flush=True)

    all_cases = cases(sizes)
    measured = [  # a quick run measures what a target reads: additive at the target length
        c
        for c in all_cases
        if sizes.memory == "all" or (c.layer, c.length) == (ADDITIVE, sizes.target_length)
    ]
    peaks: dict[Case, dict] = {}
    # Workers one at a time in a full run (two at once would share the 2 cores and the RAM);
    # the quick run measures its two additive rows side by side to stay short.
    jobs = 1 if sizes.memory == "all" else 2
    with ThreadPoolExecutor(jobs) as pool:
        for case, result in zip(
            measured, pool.map(lambda c: measure_memory(c, threads), measured), strict=True
        ):
            peaks[case] = result
            log(f"memory {case}: {result.get('peak_mib')} MiB, {result['status']}")

    rows = []
    for length in sizes.lengths:
        for layer in (ADDITIVE, MHA):
            ours, theirs = (c for c in all_cases if (c.layer, c.length) == (layer, length))
            steps = {OURS: build_step(ours), KERAS: build_step(theirs)}
            times = common.time_interleaved(
                steps, repeats=sizes.repeats[length], warmup=sizes.warmup
            )
            del steps
            gc.collect()
            ms = {impl: common.median(t) * 1e3 for impl, t in times.items()}
            peak = {
                impl: peaks.get(case, {}).get("peak_mib")
                for impl, case in ((OURS, ours), (KERAS, theirs))
            }
            status = {peaks[c]["status"] for c in (ours, theirs) if c in peaks} or {"ok"}
            rows.append(
                {
                    "layer": layer,
                    "mode": "fwd+bwd",
                    "batch": ours.batch,
                    "length": length,
                    "d": ours.d,
                    "heads": ours.heads,
                    "attnzoo_ms": ms[OURS],
                    "keras_ms": ms[KERAS],
                    "time_ratio": ms[OURS] / ms[KERAS],
                    "attnzoo_peak_mib": peak[OURS],
                    "keras_peak_mib": peak[KERAS],
                    "peak_ratio": _ratio(peak[OURS], peak[KERAS]),
                    "max_abs_diff": max_difference(ours, theirs),
                    "status": "ok" if status == {"ok"} else ",".join(sorted(status)),
                    "repeats": sizes.repeats[length],
                    "warmup": sizes.warmup,
                    "attnzoo_times_ms": [round(t * 1e3, 4) for t in times[OURS]],
                    "keras_times_ms": [round(t * 1e3, 4) for t in times[KERAS]],
                    "note": NOTES[layer],
                }
            )
            log(f"timed {layer} L{length}: {ms[OURS]:.2f} ms vs keras {ms[KERAS]:.2f} ms")

    targets = evaluate_targets(rows, sizes)
    payload = {
        "machine": common.machine_info(
            keras=keras.__version__,
            keras_backend=keras.backend.backend(),
            attnzoo=attnzoo.__version__,
            quick=sizes.memory != "all",
        ),
        "config": {
            **dataclasses.asdict(sizes),
            "threads": threads,
            "command": " ".join([Path(sys.executable).name, *argv]),
            "dtype": "float32",
            "median_ms": "median per call, the two layers interleaved round by round",
            "peak_mib": (
                "VmHWM after one call minus VmHWM after imports, inputs and one call at "
                f"length {WARM_LENGTH}, in a fresh process per layer and size"
            ),
            "wall_seconds": round(time.perf_counter() - start, 1),
        },
        "rows": rows,
        "targets": targets,
    }
    columns = ["layer", "B", "T", "attnzoo ms", "keras ms", "÷", "attnzoo MiB", "keras MiB", "÷"]
    keys = ["layer", "batch", "length", "attnzoo_ms", "keras_ms", "time_ratio"]
    keys += ["attnzoo_peak_mib", "keras_peak_mib", "peak_ratio"]
    common.print_table(
        "attnzoo.keras vs keras.layers", columns, [[r[k] for k in keys] for r in rows]
    )
    common.print_table(
        "Targets",
        ["target", "value", "goal", "met"],
        [[t["name"], t["value"], t["target"], t["met"]] for t in targets],
    )
    path = common.write_json(out, payload)
    log(f"wrote {path}")
    return payload


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return
    sizes = quick_sizes() if args.quick else full_sizes()
    run(sizes, args.out, args.threads, ["benchmarks/bench_keras.py", *argv])


if __name__ == "__main__":
    main()
