"""Attention benchmark: every attnzoo score against the implementations it replaces (IMPLS).

An experiment is one score (additive at one d_hidden) or MultiHeadAttention at one batch,
length and mode ("fwd": forward under no_grad; "fwd+bwd": forward and a backward from a random
output gradient). Its worker process times every implementation interleaved round by round
after identical warm-up (PERF.md) and measures each one's peak memory in a fresh child process
(METHOD). An implementation estimated above the memory budget, or running out of memory under
a cap, is recorded as "oom". keras.layers.AdditiveAttention has no W_a / U_a projections
(d_hidden = d): it is timed beside attnzoo's Additive at d_hidden = d ("matched").

On a machine shared with CPU-heavy jobs run with OMP_WAIT_POLICY=PASSIVE: libgomp's
spin-waiting made the blockwise additive kernel 20x slower there (the JSON records such
variables in machine.env).

    python benchmarks/bench_attention.py [--budget smoke] [--only 'additive-*'] [--rerun]
"""

from __future__ import annotations

import math
import os
import sys
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import _common
import attnzoo
from _common import GIB, MIB, Bench, Experiment, Table, drive, extreme, targets
from attnzoo import scores

FWD, TRAIN = "fwd", "fwd+bwd"
SCORES = tuple(scores.SCORES)
DOT_FAMILY = tuple(
    s for s in SCORES if isinstance(scores.make_score(s, 1, 1, max_keys=1), scores.DotFamily)
)
WARM_LENGTH = 8  # a memory child's first, unmeasured call
IMPLS = {
    "attnzoo": "attnzoo.attention / attnzoo.MultiHeadAttention",
    "attnzoo_weights": "attnzoo.MultiHeadAttention(return_weights=True): per-head weights",
    "plain": "broadcast tutorial form, softmax(logits) @ value",
    "sdpa": "F.scaled_dot_product_attention, 4-D (batch, 1, len, d) inputs",
    "keras_attention": "keras.layers.Attention(use_scale=False), torch backend",
    "keras_attention_scaled": "keras.layers.Attention(use_scale=True), scale set to 1/sqrt(d)",
    "keras_additive": "keras.layers.AdditiveAttention: sum_d(scale_d * tanh(q_d + k_d))",
    "torch_mha": "nn.MultiheadAttention(batch_first=True), need_weights=False",
    "torch_mha_weights": "nn.MultiheadAttention, need_weights=True (head-averaged)",
    "keras_mha": "keras.layers.MultiHeadAttention(key_dim=d_model/heads)",
    "keras_mha_scores": "keras.layers.MultiHeadAttention(return_attention_scores=True)",
}
WEIGHTS = ("attnzoo_weights", "torch_mha_weights", "keras_mha_scores")  # vs attnzoo_weights
PEERS = {  # beside attnzoo; the other dot-family scores: plain and sdpa
    "dot": ["plain", "sdpa", "keras_attention"], "location": ["plain"], "additive": ["plain"],
    "scaled_dot": ["plain", "sdpa", "keras_attention_scaled"],
    "mha": ["attnzoo_weights", "torch_mha", "torch_mha_weights", "keras_mha", "keras_mha_scores"],
}  # fmt: skip
# batch, d, lengths, d_hidden, Keras's d_hidden (= d), target length, MHA (batch, d_model,
# heads, lengths) as Vaswani's base model, long additive (batch, length), memory budget GiB,
# (repeats, warm-up) by length: a fused additive fwd+bwd takes tens of seconds at 2048
SIZES = {
    "full": (4, 64, (128, 512, 2048), 128, 64, 512, (8, 512, 8, (128, 512)), (1, 4096), 10.0,
             {128: (30, 3), 512: (12, 2), 2048: (3, 1), 4096: (1, 0)}),
    "smoke": (2, 16, (64,), 32, 16, 64, (2, 32, 4, (32,)), (1, 256), 1 / 32, {}),
}  # fmt: skip
# d_key != d_value: (batch, length, d_key, d_value) of a Self-Attention GAN block (C = 16
# channels at 16 x 16: f and g C / 8 wide, h C wide), the shape `_sdpa` pads for the kernel
# and its (repeats, warm-up)
UNEQUAL = {"full": (64, 256, 2, 16, (20, 2)), "smoke": (2, 32, 2, 16, (2, 1))}
METHOD = {
    "dtype": "float32",
    FWD: "forward under torch.no_grad()",
    TRAIN: "forward, then backward from a random output gradient",
    "ms": "per-call milliseconds over the repeats (median, quartiles, range); all "
    "implementations of one experiment timed in one worker process, interleaved round by round",
    "ratio": "attnzoo's time (attnzoo_weights' beside implementations returning weights) over "
    "this implementation's, per round: median and range",
    "peak_mib": f"VmHWM after one call minus VmHWM after imports, inputs and one call at length "
    f"{WARM_LENGTH}, in a fresh process per implementation and experiment",
    "peak_ratio": "attnzoo's peak_mib over this implementation's",
    "oom": "estimated above the row's `budget_gib` (in its params), or an allocation failure "
    "under a cap of that + 1 GiB",
    "implementations": IMPLS,
}


def experiments(budget: str) -> list[Experiment]:
    batch, d, lengths, h, keras_h, target, mha, long, budget_gib, repeats = SIZES[budget]
    full, out = budget == "full", []

    def add(
        score,
        mode,
        batch,
        length,
        d,
        h=None,
        heads=None,
        tag="",
        impls=(),
        d_value=None,
        rounds=None,
    ):
        peers = impls or PEERS.get(score, ["plain", "sdpa"])
        params = dict(score=score, mode=mode, batch=batch, length=length, d=d, d_hidden=h)
        params |= dict(heads=heads, impls=["attnzoo", *peers], tag=tag, budget_gib=budget_gib)
        if d_value:
            params["d_value"] = d_value
        rounds = rounds or repeats.get(length, (2, 1))
        params |= dict(zip(("repeats", "warmup"), rounds, strict=True))
        # the smoke run measures the memory of what the additive targets read
        params["memory"] = full or bool(tag and score == "additive" and mode == TRAIN)
        hidden = f"-h{h}" if h else f"-k{d}v{d_value}" if d_value else ""
        group = tag if tag in ("long", "unequal") else score
        # CPU-minutes: the earlier full run took 414 s at 2 threads over its 47 experiments
        out.append(Experiment(f"{score}{hidden}-{mode}-L{length}", group, params, minutes=0.3))

    for n in lengths:
        tag = "target" if n == target else ""
        for mode in (FWD, TRAIN):
            for score in SCORES:  # the smoke run: every path once, and the fwd target
                additive = score == "additive"
                if full or mode == TRAIN or additive:
                    add(score, mode, batch, n, d, h if additive else None, tag=tag * additive)
            if full or mode == TRAIN:
                matched = "matched" * bool(tag)
                add("additive", mode, batch, n, d, keras_h, None, matched, ["keras_additive"])
    add("additive", TRAIN, *long, d, h, None, "long")
    b, n, d_key, d_value, rounds = UNEQUAL[budget]
    for mode in (FWD, TRAIN):
        add("dot", mode, b, n, d_key, tag="unequal", d_value=d_value, rounds=rounds)
    for n in mha[3]:
        for mode in (FWD, TRAIN) if full else (TRAIN,):
            add("mha", mode, mha[0], n, mha[1], None, mha[2], "target" * (n == max(mha[3])))
    order = {group: i for i, group in enumerate([*SCORES, "long", "unequal", "mha"])}
    return sorted(
        out, key=lambda e: (order[e.group], -(e.params["d_hidden"] or 0), e.params["mode"])
    )


def estimate_bytes(s: dict) -> int:
    """A rough upper estimate of one call's peak memory, to skip what cannot fit: the largest
    tensors alive together, (batch, [heads,] i, j) logits and, for the broadcast additive forms,
    (batch, i, j, d_hidden) tanh tensors; training keeps about three times the forward's."""
    train, impl = s["mode"] == TRAIN, s["impl"]
    io = 16 * s["batch"] * s["length"] * s["d"] * 4  # inputs, outputs and their gradients
    logits = s["batch"] * s["length"] ** 2 * 4 * (s["heads"] or 1)
    if impl in ("plain", "keras_additive") and s["score"] == "additive":
        return io + (6 if train else 2) * logits * s["d_hidden"] + 3 * logits
    if impl in ("plain", "keras_attention", "keras_attention_scaled", *WEIGHTS) or (
        s["score"] == "location"
    ):
        return io + (6 if train else 3) * logits
    if s["score"] == "additive":  # the blockwise kernel's tanh blocks, on one workspace
        return io + min(16 * MIB, logits * s["d_hidden"])
    return io + logits  # SDPA's blocks, bounded by one logits tensor


# Implementations ------------------------------------------------------------------------------


def _keras():
    os.environ["KERAS_BACKEND"] = "torch"  # imported only where a Keras layer runs: it slows
    import keras  # every small torch call of the process

    return keras


def _dot_inputs(score: str, module, query, key):
    """(query', key', scale) with logits = scale * query' @ key'^T, written out by hand."""
    if score == "general":
        return query @ module.weight, key, 1.0  # (b, [1,] i, d)
    if score == "cosine":
        return F.normalize(query, dim=-1), F.normalize(key, dim=-1), module.beta
    return query, key, 1.0 / math.sqrt(query.shape[-1]) if score == "scaled_dot" else 1.0


def _plain(score: str, module, query, key, value) -> torch.Tensor:
    """The broadcast form a tutorial writes: logits, softmax, weighted sum."""
    if score == "additive":
        a, b = module.query_proj(query), module.key_proj(key)  # (b, i, h), (b, j, h)
        logits = torch.tanh(a[:, :, None] + b[:, None]) @ module.v  # (b, i, j)
    elif score == "location":
        logits = module.proj(query)[..., : key.shape[-2]]  # (b, i, j)
    else:
        q, k, scale = _dot_inputs(score, module, query, key)
        logits = q @ k.transpose(-2, -1) * scale  # (b, i, j)
    return torch.softmax(logits, dim=-1) @ value  # (b, i, d)


def _score(s: dict, train: bool):
    """(forward, leaves, output shape) of one implementation of a score."""
    impl, d = s["impl"], s["d"]
    shape = (s["batch"], 1, s["length"], d) if impl == "sdpa" else (s["batch"], s["length"], d)
    q, k = (torch.randn(shape, requires_grad=train) for _ in range(2))
    shape = (*shape[:-1], s.get("d_value", d))
    v = torch.randn(shape, requires_grad=train)
    module = scores.make_score(s["score"], d, d, d_hidden=s["d_hidden"], max_keys=s["length"])
    leaves = [q, k, v, *module.parameters()]
    if impl == "attnzoo":
        return lambda: attnzoo.attention(q, k, v, score=module).context, leaves, shape
    if impl == "plain":
        return lambda: _plain(s["score"], module, q, k, v), leaves, shape
    if impl == "sdpa":

        def sdpa():
            query, key, scale = _dot_inputs(s["score"], module, q, k)
            return F.scaled_dot_product_attention(query, key, v, scale=scale)  # (b, 1, i, d)

        return sdpa, leaves, shape
    layers = _keras().layers
    layer = (
        layers.AdditiveAttention()
        if impl == "keras_additive"
        else layers.Attention(use_scale=impl == "keras_attention_scaled")
    )
    with torch.no_grad():
        layer([q[:1, :2], v[:1, :2], k[:1, :2]])  # builds the weights
    if impl == "keras_attention_scaled":
        layer.scale.assign(1.0 / math.sqrt(d))
    leaves += [w.value for w in layer.trainable_weights]
    return lambda: layer([q, v, k], training=train), leaves, shape


def _mha(s: dict, train: bool):
    impl, d, heads = s["impl"], s["d"], s["heads"]
    x = torch.randn(s["batch"], s["length"], d, requires_grad=train)
    weights = impl in WEIGHTS
    if impl.startswith("attnzoo"):
        mha = attnzoo.MultiHeadAttention(d, heads).train(train)
        return lambda: mha(x, return_weights=weights).context, [x, *mha.parameters()], x.shape
    if impl.startswith("torch"):
        mha = nn.MultiheadAttention(d, heads, batch_first=True).train(train)
        return lambda: mha(x, x, x, need_weights=weights)[0], [x, *mha.parameters()], x.shape
    layer = _keras().layers.MultiHeadAttention(num_heads=heads, key_dim=d // heads)
    with torch.no_grad():
        layer(x[:1, :2], x[:1, :2])  # builds the weights
    leaves = [x, *(w.value for w in layer.trainable_weights)]
    if weights:
        return lambda: layer(x, x, return_attention_scores=True, training=train)[0], leaves, x.shape
    return lambda: layer(x, x, training=train), leaves, x.shape


def build_step(spec: dict):
    """One call of one implementation (spec: an experiment's params and "impl")."""
    torch.manual_seed(0)
    train = spec["mode"] == TRAIN
    return _common.grad_step(*(_mha if spec["score"] == "mha" else _score)(spec, train), train)


def worker(params: dict, ctx) -> dict:
    budget = int(params["budget_gib"] * GIB)
    specs = {impl: {**params, "impl": impl} for impl in params["impls"]}
    fits = {impl: spec for impl, spec in specs.items() if estimate_bytes(spec) <= budget}
    reference = {i: "attnzoo_weights" if i in WEIGHTS else "attnzoo" for i in fits}
    reference = {i: ref for i, ref in reference.items() if ref != i and ref in fits}
    builders = {impl: partial(build_step, spec) for impl, spec in fits.items()}
    timed = _common.time_steps(
        builders, repeats=params["repeats"], warmup=params["warmup"], reference=reference
    )
    impls = {}
    for impl, spec in specs.items():
        mib = estimate_bytes(spec) / MIB
        oom = {"status": "oom", "error": f"estimated {mib:.0f} MiB > {budget / MIB:.0f} MiB"}
        impls[impl] = {"status": "ok", "estimate_mib": round(mib, 1), **timed.get(impl, oom)}
        if params["memory"] and impls[impl]["status"] == "ok":
            warm = {**spec, "length": WARM_LENGTH}
            impls[impl].update(_common.peak_memory(BENCH, spec, warm, budget + GIB))
    for impl, ref in reference.items():
        if impls[impl].get("peak_mib") and impls[ref].get("peak_mib") is not None:
            impls[impl]["peak_ratio"] = impls[ref]["peak_mib"] / impls[impl]["peak_mib"]
    keras = sys.modules.get("keras")
    return {"impls": impls, **({"keras": keras.__version__} if keras else {})}


# Targets (on derived entries, the same names at every budget) and tables ---------------------


def derive(summary: dict) -> dict[str, dict]:
    """Ratios across experiments, under names that do not depend on the budget's sizes."""
    params = {i: e["params"] for i, e in summary.items()}
    tagged = {(p.get("score"), p.get("tag"), p.get("mode")): i for i, p in params.items()}

    def find(score: str, tag: str, mode: str = TRAIN) -> dict:  # empty where the budget has none
        return summary.get(tagged.get((score, tag, mode)), {"params": {}, "metrics": {}})

    def get(entry: dict, key: str):
        return entry["metrics"].get(key, {}).get("mean")

    def div(a, b):
        return a / b if a is not None and b else None

    out = {}
    for score in DOT_FAMILY:
        for mode in (FWD, TRAIN):
            ids = [i for i, p in params.items() if (p.get("score"), p.get("mode")) == (score, mode)]
            ids = [i for i in ids if "d_value" not in params[i]]  # those are `unequal`'s
            key = "impls.sdpa.ratio.median"
            worst, best = (extreme(summary, ids, key, pick) for pick in (max, min))
            out[f"{score}-{mode}"] = dict(worst=worst, best=best)
    a, k, long = (find("additive", tag) for tag in ("target", "matched", "long"))
    p, q = a["params"], long["params"]
    tanh_ms = div(get(find("additive", "target", FWD), "impls.attnzoo.ms.median"), 1e3)
    out["additive"] = {
        **{key: p.get(key) for key in ("batch", "length", "d_hidden")},
        "time_over_plain": get(a, "impls.plain.ratio.median"),
        "peak_over_plain": get(a, "impls.plain.peak_ratio"),
        "peak_over_keras": div(
            get(a, "impls.attnzoo.peak_mib"), get(k, "impls.keras_additive.peak_mib")
        ),
        "matched_time_over_keras": get(k, "impls.keras_additive.ratio.median"),
        "gtanh_per_s": p and div(p["batch"] * p["length"] ** 2 * p["d_hidden"] / 1e9, tanh_ms),
        "long_peak_gib": div(get(long, "impls.attnzoo.peak_mib"), 1024),
        **{f"long_{key}": q.get(key) for key in ("batch", "length", "d_hidden")},
    }
    for mode in (FWD, TRAIN):
        u = find("dot", "unequal", mode)
        out[f"unequal-{mode}"] = {
            **{key: u["params"].get(key) for key in ("batch", "length", "d", "d_value")},
            "time_over_sdpa": get(u, "impls.sdpa.ratio.median"),
            "time_over_plain": get(u, "impls.plain.ratio.median"),
        }
    m = find("mha", "target")
    peers = [get(m, f"impls.{i}.ratio.median") for i in ("torch_mha", "keras_mha")]
    out["mha"] = {
        **{key: m["params"].get(key) for key in ("batch", "length", "d", "heads")},
        "time_over_best_peer": None if None in peers else max(peers),
        "weights_time_over_torch": get(m, "impls.torch_mha_weights.ratio.median"),
    }
    return out


TARGETS = targets(
    "docs/core.md's targets before the one driver",
    *((f"{s} {m}: attnzoo / sdpa time, worst length", f"{s}-{m}", "worst", "<=", 1.1)
      for s in DOT_FAMILY for m in (FWD, TRAIN)),
    (f"additive {TRAIN}: attnzoo / plain peak memory", "additive", "peak_over_plain", "<=", 0.1),
    (f"additive {TRAIN}: attnzoo / keras_additive peak memory", "additive", "peak_over_keras",
     "<=", 0.1),
    (f"additive {TRAIN}: attnzoo / plain time", "additive", "time_over_plain", "<=", 0.6),
    (f"additive {FWD}: G tanh/s", "additive", "gtanh_per_s", ">=", 1.0),
    (f"additive {TRAIN}, d_hidden = d: attnzoo / keras_additive time (information)", "additive",
     "matched_time_over_keras", "<", 1.0),
    (f"additive {TRAIN}, long: peak GiB", "additive", "long_peak_gib", "<", 1.5),
    (f"mha {TRAIN}: attnzoo / min(torch_mha, keras_mha) time", "mha", "time_over_best_peer",
     "<=", 1.0),
    (f"mha {TRAIN} with weights: attnzoo_weights / torch_mha_weights time", "mha",
     "weights_time_over_torch", "<=", 0.8),
)  # fmt: skip
TARGETS += targets(
    "core: d_key != d_value padded for SDPA's kernel (`scores._sdpa`)",
    *((f"dot {m}, d_key != d_value: attnzoo / sdpa time", f"unequal-{m}", "time_over_sdpa",
       "<=", 0.8) for m in (FWD, TRAIN)),
)  # fmt: skip
SUMMARY = [("score, mode", "id"), ("worst", "worst", 3), ("best", "best", 3)]
DETAIL = [("score", "params.score"), ("d_hidden", "params.d_hidden"), ("batch", "params.batch")]
DETAIL += [("length", "params.length"), ("mode", "params.mode"), ("implementation", "each")]
DETAIL += [("ms: median (quartiles)", "each.ms", 3, "iqr"), ("peak MiB", "each.peak_mib", 1)]
DETAIL.insert(-1, ("attnzoo / it: median (range)", "each.ratio", 3, "range"))
TABLES = [Table("summary", SUMMARY, ids=[f"{s}-{m}" for s in DOT_FAMILY for m in (FWD, TRAIN)])]
TABLES += [Table("detail", DETAIL, groups=[*SCORES, "long", "mha"], each="impls")]
UNEQUAL_COLUMNS = [("d_key", "params.d"), ("d_value", "params.d_value"), *DETAIL[2:]]
TABLES += [Table("unequal", UNEQUAL_COLUMNS, groups=["unequal"], each="impls")]
BENCH = Bench("attention", __file__, experiments, worker, TARGETS, TABLES, derive=derive,
              threads=2, jobs={"full": 1, "smoke": 2}, method=METHOD, step=build_step)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
