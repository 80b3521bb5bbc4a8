"""Keras benchmark: attnzoo.keras layers against Keras's own, on the torch backend, at
bench_attention.py's sizes: AdditiveAttention forward + backward (attnzoo's drop-in with the
same weights; Keras's score has d_hidden = d), and a MultiHeadAttention training step of
self-attention layer(x, x), dropout 0 (attnzoo's layer built by `from_keras`).

An experiment's worker times both layers interleaved round by round after identical warm-up
(PERF.md), measures each one's peak memory in a fresh child process (as bench_attention.py
does) and the largest difference of their outputs on the same weights.

    python benchmarks/bench_keras.py [--budget smoke]    # results/keras.json
"""

from __future__ import annotations

import os
from functools import partial

import torch

from _common import Bench, Experiment, Table, drive, grad_step, peak_memory, targets, time_steps

os.environ["KERAS_BACKEND"] = "torch"  # before keras is imported, in this and every worker
os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")  # a CPU benchmark, also where CUDA exists
ADDITIVE, MHA = "AdditiveAttention", "MultiHeadAttention"
WARM_LENGTH = 8  # a memory child's first, unmeasured call
MINUTES = 0.4  # CPU-minutes an experiment: the earlier full run took 94 s over its 4
# additive (batch, d), MHA (batch, d_model, heads), lengths, target length, repeats by length
SIZES = {
    "full": ((4, 64), (8, 512, 8), (128, 512), 512, {128: 30, 512: 10}, 3),
    # the smoke memory row's Keras side holds (16, 32, 32, 1024) floats (64 MiB): a rise no
    # allocator serves from memory it already holds, so both peaks register on any machine
    "smoke": ((16, 1024), (2, 16, 2), (16, 32), 32, {16: 2, 32: 2}, 1),
}
METHOD = {
    "dtype": "float32",
    "ms": "per-call milliseconds of forward + backward over the repeats (median, quartiles, "
    "range); the two layers timed in one worker process, interleaved round by round",
    "ratio": "attnzoo's time over Keras's, per round: median and range",
    "peak_mib": f"VmHWM after one call minus VmHWM after imports, inputs and one call at length "
    f"{WARM_LENGTH}, in a fresh process per layer and size",
    "peak_ratio": "attnzoo's peak_mib over Keras's",
    "max_abs_diff": "largest |attnzoo - keras| over the outputs, same weights and inputs",
    ADDITIVE: "inputs [query, value, key]; Keras's score is sum_d(scale_d * tanh(q_d + k_d))",
    MHA: "training step: forward + backward of self-attention layer(x, x), dropout 0",
}


def experiments(budget: str) -> list[Experiment]:
    (batch, d), (mha_batch, d_model, heads), lengths, target, repeats, warmup = SIZES[budget]
    out = []
    for n in lengths:
        run = dict(length=n, repeats=repeats[n], warmup=warmup, target=n == target)
        memory = budget == "full" or n == target
        additive = dict(layer=ADDITIVE, batch=batch, d=d, heads=None, memory=memory)
        mha = dict(layer=MHA, batch=mha_batch, d=d_model, heads=heads, memory=budget == "full")
        for name, params in (("additive", additive), ("mha", mha)):
            out.append(Experiment(f"{name}-L{n}", "keras", {**params, **run}, minutes=MINUTES))
    return out


def build_layer(s: dict):
    """(forward, leaves, output shape) of one side. Keras's layer is built first and attnzoo's
    takes its weights, so both sides compute the same function."""
    import attnzoo.keras as ak
    import keras

    torch.manual_seed(0)
    keras.utils.set_random_seed(0)
    b, n, d = s["batch"], s["length"], s["d"]
    if s["layer"] == ADDITIVE:
        q, v, k = (torch.randn(b, n, d, requires_grad=True) for _ in range(3))
        layer = theirs = keras.layers.AdditiveAttention()
        with torch.no_grad():
            theirs([q[:1, :2], v[:1, :2], k[:1, :2]])  # builds the weights
            if s["impl"] == "attnzoo":
                layer = ak.AdditiveAttention()
                layer([q[:1, :2], v[:1, :2], k[:1, :2]])
                layer.set_weights(theirs.get_weights())
        leaves = [q, v, k, *(w.value for w in layer.trainable_weights)]
        return lambda: layer([q, v, k], training=True), leaves, (b, n, d)
    x = torch.randn(b, n, d, requires_grad=True)
    theirs = keras.layers.MultiHeadAttention(num_heads=s["heads"], key_dim=d // s["heads"])
    with torch.no_grad():
        theirs(x[:1, :2], x[:1, :2])
    layer = ak.MultiHeadAttention.from_keras(theirs) if s["impl"] == "attnzoo" else theirs
    leaves = [x, *(w.value for w in layer.trainable_weights)]
    return lambda: layer(x, x, training=True), leaves, (b, n, d)


def build_step(spec: dict):
    return grad_step(*build_layer(spec), train=True)


def worker(params: dict, ctx) -> dict:
    import keras

    specs = {impl: {**params, "impl": impl} for impl in ("attnzoo", "keras")}
    builders = {impl: partial(build_step, spec) for impl, spec in specs.items()}
    impls = time_steps(
        builders, repeats=params["repeats"], warmup=params["warmup"], reference={"keras": "attnzoo"}
    )
    if params["memory"]:
        for impl, spec in specs.items():
            impls[impl].update(peak_memory(BENCH, spec, {**spec, "length": WARM_LENGTH}))
        peaks = [impls[impl].get("peak_mib") for impl in specs]
        if None not in peaks and peaks[1]:
            impls["keras"]["peak_ratio"] = peaks[0] / peaks[1]
    with torch.no_grad():
        ours, theirs = (build_layer(spec)[0]() for spec in specs.values())
    diff = float((ours - theirs).abs().max())
    return {"impls": impls, "max_abs_diff": diff, "keras": keras.__version__}


def derive(summary: dict) -> dict[str, dict]:
    """The targets' values, at the target length whatever the budget's sizes."""
    out: dict[str, float] = {}
    for e in summary.values():
        if e["params"].get("target"):
            name = "additive" if e["params"]["layer"] == ADDITIVE else "mha"
            for key, metric in (("time", "keras.ratio.median"), ("peak", "keras.peak_ratio")):
                if f"impls.{metric}" in e["metrics"]:
                    out[f"{name}_{key}_ratio"] = e["metrics"][f"impls.{metric}"]["mean"]
    return {"target": out} if out else {}


TARGETS = targets(
    "docs/keras.md's targets before the one driver",
    (f"{ADDITIVE} fwd+bwd: time / keras (matched features)", "target", "additive_time_ratio",
     "<=", 0.5),
    (f"{ADDITIVE} fwd+bwd: peak memory / keras", "target", "additive_peak_ratio", "<=", 0.1),
    (f"{MHA} training step: time / keras", "target", "mha_time_ratio", "<=", 1.0),
)  # fmt: skip
COLUMNS = [("layer", "params.layer"), ("batch", "params.batch"), ("length", "params.length")]
COLUMNS += [("attnzoo ms", "impls.attnzoo.ms.median"), ("Keras ms", "impls.keras.ms.median")]
COLUMNS += [("attnzoo / Keras: median (per-round range)", "impls.keras.ratio", 3, "range")]
COLUMNS += [("attnzoo MiB", "impls.attnzoo.peak_mib", 1), ("Keras MiB", "impls.keras.peak_mib", 1)]
COLUMNS += [("memory / Keras", "impls.keras.peak_ratio", 3)]
COLUMNS += [("max abs diff", "max_abs_diff", 2, "", True)]
TABLES = [Table("keras", COLUMNS, ["keras"])]
BENCH = Bench("keras", __file__, experiments, worker, TARGETS, TABLES, derive=derive,
              jobs={"full": 1, "smoke": 2}, method=METHOD, step=build_step)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
