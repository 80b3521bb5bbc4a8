"""Attention benchmark: every attnzoo score against the implementations it replaces.

For every score (dot, scaled_dot, general, cosine, additive, location), length and mode
("fwd" under no_grad, "fwd+bwd" a backward from a random output gradient), and for
MultiHeadAttention, this script measures:
- the median time per call of each implementation, all implementations of one configuration
  interleaved in this process after identical warm-up (PERF.md);
- the peak memory of each implementation in a fresh worker process (`--worker`): VmHWM after
  one call minus VmHWM after imports, input allocation and one unmeasured call at a tiny
  length (which pays one-time lazy imports, not the configuration's memory).

Peers, where they apply: "plain", the broadcast form a tutorial writes (softmax(q k^T s) @ v;
for additive tanh(W_a q_i + U_a k_j) @ v_a); "sdpa", F.scaled_dot_product_attention on 4-D
(batch, 1, len, d) inputs; nn.MultiheadAttention; and the Keras 3 layers on the torch backend.
Configurations estimated above the memory budget, or whose worker runs out of memory, are
recorded with status "oom". The script then checks the project's targets and writes one JSON.

    python benchmarks/bench_attention.py                # full run, writes results/attention.json
    python benchmarks/bench_attention.py --quick        # smoke run with tiny sizes
    python benchmarks/bench_attention.py --overhead     # attention()'s own cost per call (own JSON)
    python benchmarks/bench_attention.py --worker JSON  # internal: one peak-memory measurement

On a machine shared with other CPU-heavy jobs, libgomp's default spin-waiting makes each
parallel region wait for a descheduled thread: small ops cost milliseconds, and the blockwise
additive kernel (hundreds of small parallel ops per call) ran 20x slower than with one thread.
There, run with OMP_WAIT_POLICY=PASSIVE; the JSON records such variables in machine.env.

Note:
    keras.layers.AdditiveAttention is not Bahdanau's score: it has no W_a / U_a projections and
    no d_hidden; it computes sum_d(scale_d * tanh(q_d + k_d)), i.e. d_hidden = d. Its rows use
    d = 64 features and sit next to attnzoo's Additive at d_hidden = 64; the targets compare
    with attnzoo at d_hidden = 128 as stated.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import _common as common
import attnzoo
from attnzoo import scores

THREADS = 2
FWD, FWD_BWD = "fwd", "fwd+bwd"
# Every score of the library's own registry, and those of them that run on SDPA.
SCORE_NAMES = tuple(scores.SCORES)
DOT_FAMILY = tuple(
    name
    for name in SCORE_NAMES
    if isinstance(scores.make_score(name, 1, 1, max_keys=1), scores.DotFamily)
)
FLOAT_BYTES = 4
WARM_LENGTH = 8  # a worker's first, unmeasured call
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "attention.json"
OVERHEAD_OUT = DEFAULT_OUT.with_name("attention_overhead.json")

# Implementations (the "impl" of a row).
OURS = "attnzoo"
OURS_WEIGHTS = "attnzoo+weights"
PLAIN = "plain"
SDPA = "sdpa"
KERAS_DOT = "keras.Attention"
KERAS_DOT_SCALED = "keras.Attention(use_scale)"
KERAS_ADDITIVE = "keras.AdditiveAttention"
KERAS_MHA = "keras.MultiHeadAttention"
KERAS_MHA_WEIGHTS = "keras.MultiHeadAttention+scores"
TORCH_MHA = "nn.MultiheadAttention"
TORCH_MHA_WEIGHTS = "nn.MultiheadAttention+weights"
WEIGHTS_IMPLS = (OURS_WEIGHTS, KERAS_MHA_WEIGHTS, TORCH_MHA_WEIGHTS)

NOTES = {
    OURS: "attnzoo.attention / attnzoo.MultiHeadAttention",
    OURS_WEIGHTS: "attnzoo.MultiHeadAttention(return_weights=True): per-head weights",
    PLAIN: "broadcast tutorial form, softmax(logits) @ value",
    SDPA: "F.scaled_dot_product_attention, 4-D (batch, 1, len, d) inputs",
    KERAS_DOT: "keras.layers.Attention(use_scale=False), torch backend",
    KERAS_DOT_SCALED: "keras.layers.Attention(use_scale=True), learned scalar set to 1/sqrt(d)",
    KERAS_ADDITIVE: (
        "keras.layers.AdditiveAttention: no W_a/U_a projections, no d_hidden; "
        "sum_d(scale_d * tanh(q_d + k_d)), so d_hidden = d"
    ),
    KERAS_MHA: "keras.layers.MultiHeadAttention(key_dim=d_model/heads)",
    KERAS_MHA_WEIGHTS: "keras.layers.MultiHeadAttention(return_attention_scores=True)",
    TORCH_MHA: "nn.MultiheadAttention(batch_first=True), need_weights=False",
    TORCH_MHA_WEIGHTS: "nn.MultiheadAttention, need_weights=True (default: head-averaged)",
}


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the full run and `--quick`."""

    batch: int
    d: int
    lengths: tuple[int, ...]
    d_hidden: int
    keras_d_hidden: int  # attnzoo's Additive at Keras' feature size (d_hidden = d)
    target_length: int  # the additive targets' length
    mha_batch: int
    mha_d_model: int
    mha_heads: int
    mha_lengths: tuple[int, ...]
    mha_target_length: int
    long_batch: int
    long_length: int
    long_d_hidden: int
    budget_gib: float  # skip configurations estimated above this; cap each worker at it
    repeats: dict[int, int] = field(default_factory=dict)  # by length; fewer when long
    warmup: dict[int, int] = field(default_factory=dict)
    memory: str = "all"  # "all" or "targets": which configurations get a worker
    memory_jobs: int = 1  # workers run at once (their peaks add up in RAM)
    # attention()'s own cost per call (batch and d as above, one thread): the lengths, the
    # calls timed back to back in one sample, and the samples per implementation.
    overhead_lengths: tuple[int, ...] = (16, 32, 64, 128)
    overhead_calls: int = 200
    overhead_repeats: int = 41

    def repeats_for(self, length: int) -> int:
        return self.repeats.get(length, min(self.repeats.values()))

    def warmup_for(self, length: int) -> int:
        return self.warmup.get(length, min(self.warmup.values()))


def full_sizes() -> Sizes:
    """The project's benchmark: batch 4, d 64, lengths 128/512/2048; MHA as in Vaswani's base
    model (d_model 512, 8 heads) at batch 8."""
    return Sizes(
        batch=4,
        d=64,
        lengths=(128, 512, 2048),
        d_hidden=128,
        keras_d_hidden=64,
        target_length=512,
        mha_batch=8,
        mha_d_model=512,
        mha_heads=8,
        mha_lengths=(128, 512),  # the target length and a short one; 2048 costs minutes
        mha_target_length=512,
        long_batch=1,
        long_length=4096,
        long_d_hidden=128,
        budget_gib=10.0,
        # A fused additive fwd+bwd call takes tens of seconds at 2048 and 4096 on 2 cores; the
        # 4096 row (attnzoo alone: nothing to interleave) is timed once for information.
        repeats={128: 30, 512: 12, 2048: 3, 4096: 1},
        warmup={128: 3, 512: 2, 2048: 1, 4096: 0},
    )


def quick_sizes() -> Sizes:
    """Tiny sizes for the smoke test; the budget is small enough that the plain additive peer
    of the long configuration is skipped as "oom" by its estimate."""
    return Sizes(
        batch=2,
        d=16,
        lengths=(64,),
        d_hidden=32,
        keras_d_hidden=16,
        target_length=64,
        mha_batch=2,
        mha_d_model=32,
        mha_heads=4,
        mha_lengths=(32,),
        mha_target_length=32,
        long_batch=1,
        long_length=256,
        long_d_hidden=32,
        budget_gib=1 / 32,
        repeats={0: 2},
        warmup={0: 1},
        memory="targets",
        memory_jobs=2,
        overhead_lengths=(16,),
        overhead_calls=20,
        overhead_repeats=3,
    )


@dataclass(frozen=True)
class Case:
    """One configuration of one implementation: a row of the results."""

    score: str  # one of SCORE_NAMES, or "mha"
    impl: str
    mode: str  # FWD or FWD_BWD
    batch: int
    length: int  # query_len = key_len
    d: int  # query/key/value features; d_model for "mha"
    d_hidden: int | None = None  # additive only
    heads: int | None = None  # "mha" only

    @property
    def name(self) -> str:
        hidden = f"(h={self.d_hidden})" if self.d_hidden else ""
        return f"{self.score}{hidden}/B{self.batch}/L{self.length}/{self.mode}/{self.impl}"

    @property
    def group(self) -> tuple:
        """Cases timed together (interleaved): same score, shape and mode."""
        return (self.score, self.batch, self.length, self.mode)


# 1. Configurations ----------------------------------------------------------------------------


def score_impls(score: str) -> list[str]:
    if score == "dot":
        return [OURS, PLAIN, SDPA, KERAS_DOT]
    if score == "scaled_dot":
        return [OURS, PLAIN, SDPA, KERAS_DOT_SCALED]
    if score in DOT_FAMILY:
        return [OURS, PLAIN, SDPA]
    if score == "location":
        return [OURS, PLAIN]
    raise ValueError(score)


def build_cases(sizes: Sizes) -> list[Case]:
    cases = []
    for length in sizes.lengths:
        for mode in (FWD, FWD_BWD):
            shape = {"mode": mode, "batch": sizes.batch, "length": length, "d": sizes.d}
            for score in SCORE_NAMES:
                if score != "additive":
                    cases += [Case(score, impl, **shape) for impl in score_impls(score)]
                    continue
                cases += [
                    Case(score, OURS, **shape, d_hidden=sizes.d_hidden),
                    Case(score, PLAIN, **shape, d_hidden=sizes.d_hidden),
                    Case(score, OURS, **shape, d_hidden=sizes.keras_d_hidden),
                    Case(score, KERAS_ADDITIVE, **shape, d_hidden=sizes.keras_d_hidden),
                ]
    long = {
        "mode": FWD_BWD,
        "batch": sizes.long_batch,
        "length": sizes.long_length,
        "d": sizes.d,
        "d_hidden": sizes.long_d_hidden,
    }
    cases += [Case("additive", OURS, **long), Case("additive", PLAIN, **long)]
    mha_impls = (OURS, OURS_WEIGHTS, TORCH_MHA, TORCH_MHA_WEIGHTS, KERAS_MHA, KERAS_MHA_WEIGHTS)
    for length in sizes.mha_lengths:
        for mode in (FWD, FWD_BWD):
            shape = {"mode": mode, "batch": sizes.mha_batch, "length": length}
            cases += [
                Case("mha", impl, **shape, d=sizes.mha_d_model, heads=sizes.mha_heads)
                for impl in mha_impls
            ]
    return cases


def target_cases(sizes: Sizes) -> set[Case]:
    """The configurations whose peak memory a target uses (all a quick run measures)."""
    at = {
        "mode": FWD_BWD,
        "batch": sizes.batch,
        "length": sizes.target_length,
        "d": sizes.d,
    }
    return {
        Case("additive", OURS, **at, d_hidden=sizes.d_hidden),
        Case("additive", PLAIN, **at, d_hidden=sizes.d_hidden),
        Case("additive", KERAS_ADDITIVE, **at, d_hidden=sizes.keras_d_hidden),
        Case(
            "additive",
            OURS,
            FWD_BWD,
            sizes.long_batch,
            sizes.long_length,
            sizes.d,
            d_hidden=sizes.long_d_hidden,
        ),
    }


def estimate_bytes(case: Case) -> int:
    """A rough upper estimate of the peak memory of one call, to skip what cannot fit.

    Counts the largest tensors alive together: (batch, query_len, key_len) logits and, for the
    broadcast additive forms, (batch, query_len, key_len, d_hidden) tanh tensors; training
    keeps about three times the forward's (PERF.md).
    """
    train = case.mode == FWD_BWD
    b, n = case.batch, case.length
    io = 16 * b * n * case.d * FLOAT_BYTES  # inputs, projections, outputs and their gradients
    logits = b * n * n * FLOAT_BYTES * (case.heads or 1)  # (b, [h,] i, j)
    if case.impl in (PLAIN, KERAS_ADDITIVE) and case.score == "additive":
        tanh = logits * case.d_hidden  # (b, i, j, d_hidden)
        return io + (6 if train else 2) * tanh + 3 * logits
    if case.impl in (PLAIN, KERAS_DOT, KERAS_DOT_SCALED, *WEIGHTS_IMPLS) or (
        case.score == "location"
    ):
        return io + (6 if train else 3) * logits
    if case.score == "additive":  # the fused kernel's tanh blocks, on one workspace
        return io + min(16 * common.MIB, logits * case.d_hidden)
    return io + logits  # SDPA's blocks, bounded by one logits tensor


# 2. Implementations ---------------------------------------------------------------------------


def _keras():
    os.environ["KERAS_BACKEND"] = "torch"
    import keras

    return keras


def _keras_leaves(layer) -> list[torch.Tensor]:
    return [weight.value for weight in layer.trainable_weights]


def _score_module(case: Case) -> scores.Score:
    return scores.make_score(
        case.score, case.d, case.d, d_hidden=case.d_hidden, max_keys=case.length
    )


def _dot_inputs(score: str, module: scores.Score, query, key):
    """(query', key', scale) with logits = scale * query' @ key'^T, written out by hand."""
    if score == "dot":
        return query, key, 1.0
    if score == "scaled_dot":
        return query, key, 1.0 / math.sqrt(query.shape[-1])
    if score == "general":
        return query @ module.weight, key, 1.0  # (b, [1,] i, d)
    if score == "cosine":
        return F.normalize(query, dim=-1), F.normalize(key, dim=-1), module.beta
    raise ValueError(score)


def _plain(score: str, module: scores.Score, query, key, value) -> torch.Tensor:
    """The broadcast form a tutorial writes: logits, softmax, weighted sum."""
    if score == "additive":
        a = module.query_proj(query)  # (b, i, d_hidden)
        b = module.key_proj(key)  # (b, j, d_hidden)
        logits = torch.tanh(a[:, :, None] + b[:, None]) @ module.v  # (b, i, j)
    elif score == "location":
        logits = module.proj(query)[..., : key.shape[-2]]  # (b, i, j)
    else:
        q, k, scale = _dot_inputs(score, module, query, key)
        logits = q @ k.transpose(-2, -1)  # (b, i, j)
        if scale != 1.0:
            logits = logits * scale
    return torch.softmax(logits, dim=-1) @ value  # (b, i, d)


def _score_forward(case: Case, train: bool):
    """(forward, leaves, output shape) for a score row; leaves get their .grad cleared."""
    shape = (case.batch, 1, case.length, case.d) if case.impl == SDPA else None
    shape = shape or (case.batch, case.length, case.d)
    query, key, value = (torch.randn(shape, requires_grad=train) for _ in range(3))
    module = _score_module(case)
    leaves = [query, key, value, *module.parameters()]

    if case.impl == OURS:
        return lambda: attnzoo.attention(query, key, value, score=module).context, leaves, shape
    if case.impl == PLAIN:
        return lambda: _plain(case.score, module, query, key, value), leaves, shape
    if case.impl == SDPA:

        def forward():
            q, k, scale = _dot_inputs(case.score, module, query, key)
            return F.scaled_dot_product_attention(q, k, value, scale=scale)  # (b, 1, i, d)

        return forward, leaves, shape

    keras = _keras()
    if case.impl in (KERAS_DOT, KERAS_DOT_SCALED):
        layer = keras.layers.Attention(use_scale=case.impl == KERAS_DOT_SCALED)
    elif case.impl == KERAS_ADDITIVE:
        layer = keras.layers.AdditiveAttention()
    else:
        raise ValueError(case.impl)
    with torch.no_grad():
        layer([query[:1, :2], value[:1, :2], key[:1, :2]])  # builds the weights
    if case.impl == KERAS_DOT_SCALED:
        layer.scale.assign(1.0 / math.sqrt(case.d))
    leaves += _keras_leaves(layer)
    return lambda: layer([query, value, key], training=train), leaves, shape


def _mha_forward(case: Case, train: bool):
    shape = (case.batch, case.length, case.d)
    x = torch.randn(shape, requires_grad=train)
    if case.impl in (OURS, OURS_WEIGHTS):
        mha = attnzoo.MultiHeadAttention(case.d, case.heads).train(train)
        weights = case.impl == OURS_WEIGHTS
        return lambda: mha(x, return_weights=weights).context, [x, *mha.parameters()], shape
    if case.impl in (TORCH_MHA, TORCH_MHA_WEIGHTS):
        mha = nn.MultiheadAttention(case.d, case.heads, batch_first=True).train(train)
        weights = case.impl == TORCH_MHA_WEIGHTS
        return lambda: mha(x, x, x, need_weights=weights)[0], [x, *mha.parameters()], shape
    keras = _keras()
    layer = keras.layers.MultiHeadAttention(num_heads=case.heads, key_dim=case.d // case.heads)
    with torch.no_grad():
        layer(x[:1, :2], x[:1, :2])  # builds the weights
    leaves = [x, *_keras_leaves(layer)]
    if case.impl == KERAS_MHA_WEIGHTS:
        return (
            lambda: layer(x, x, return_attention_scores=True, training=train)[0],
            leaves,
            shape,
        )
    return lambda: layer(x, x, training=train), leaves, shape


def build_step(case: Case) -> Callable[[], None]:
    """Inputs, modules and a closure running one call (forward, or forward + backward)."""
    torch.manual_seed(0)
    train = case.mode == FWD_BWD
    builder = _mha_forward if case.score == "mha" else _score_forward
    forward, leaves, out_shape = builder(case, train)
    if not train:

        def step():
            with torch.no_grad():
                forward()

        return step

    grad_output = torch.randn(out_shape)

    def step():
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_output)

    return step


# 3. Peak memory (worker processes) ------------------------------------------------------------


def worker(payload: dict[str, Any]) -> None:
    """Measure one configuration's peak memory in this (fresh) process, or with "overhead"
    attention()'s own cost; print one JSON line."""
    if "overhead" in payload:
        sizes = quick_sizes() if payload["overhead"] == "quick" else full_sizes()
        common.emit_result({"rows": overhead_rows(sizes)})
        return
    torch.set_num_threads(THREADS)
    case = Case(**payload["case"])
    # One call at a tiny length first: it starts the thread pool (before any limit) and pays
    # one-time costs that are not the configuration's, e.g. the lazy import of sympy on the
    # first autograd.Function call (~46 MiB).
    build_step(dataclasses.replace(case, length=WARM_LENGTH))()
    gc.collect()
    step = build_step(case)
    peak = common.PeakMemory()
    if payload.get("limit_bytes"):
        common.limit_address_space(int(payload["limit_bytes"]))
    result: dict[str, Any] = {"status": common.STATUS_OK, "hwm_reset": peak.reset}
    try:
        step()
        result["peak_mib"] = peak.peak_bytes() / common.MIB
    except Exception as error:
        if not common.is_oom_error(error):
            raise
        result.update(status=common.STATUS_OOM, peak_mib=None, error=str(error)[:300])
    common.emit_result(result)


def measure_memory(case: Case, budget_bytes: int) -> dict[str, Any]:
    payload = {"case": dataclasses.asdict(case), "limit_bytes": budget_bytes + common.GIB}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(payload)]
    return common.run_worker(command, timeout=900)


# 4. Timing (this process, interleaved) --------------------------------------------------------


def time_group(cases: list[Case], repeats: int, warmup: int, rows: dict[Case, dict]) -> None:
    """Build and warm up every case of one group, then time them interleaved."""
    steps = {}
    for case in cases:
        try:
            step = build_step(case)
            for _ in range(warmup):
                step()
            steps[case] = step
        except Exception as error:
            if not common.is_oom_error(error):
                raise
            rows[case].update(status=common.STATUS_OOM, error=f"timing: {str(error)[:300]}")
            gc.collect()
    if steps:
        times = common.time_interleaved(steps, repeats=repeats, warmup=0)
        for case, samples in times.items():
            rows[case].update(
                median_ms=common.median(samples) * 1e3,
                times_ms=[round(t * 1e3, 4) for t in samples],
                repeats=repeats,
                warmup=warmup,
            )
    del steps
    gc.collect()


# 5. Targets -----------------------------------------------------------------------------------


def _lookup(rows: dict[Case, dict]):
    def get(score, impl, mode, batch, length, key, d_hidden=None):
        for case, row in rows.items():
            if (case.score, case.impl, case.mode, case.batch, case.length) != (
                score,
                impl,
                mode,
                batch,
                length,
            ):
                continue
            if d_hidden is not None and case.d_hidden != d_hidden:
                continue
            return row.get(key) if row["status"] == common.STATUS_OK else None
        return None

    return get


def _ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _target(name, value, target, met, **extra) -> dict[str, Any]:
    return {"name": name, "value": value, "target": target, "met": bool(met), **extra}


def evaluate_targets(rows: dict[Case, dict], sizes: Sizes) -> list[dict[str, Any]]:
    get = _lookup(rows)
    targets = []

    # 1. Dot family without weights: at most 1.1x SDPA at every length.
    for score in DOT_FAMILY:
        for mode in (FWD, FWD_BWD):
            detail = {
                str(n): _ratio(
                    get(score, OURS, mode, sizes.batch, n, "median_ms"),
                    get(score, SDPA, mode, sizes.batch, n, "median_ms"),
                )
                for n in sizes.lengths
            }
            known = [r for r in detail.values() if r is not None]
            worst = max(known) if len(known) == len(detail) else None
            targets.append(
                _target(
                    f"{score} {mode}: time / sdpa (worst length)",
                    worst,
                    "<= 1.1",
                    worst is not None and worst <= 1.1,
                    by_length=detail,
                )
            )

    # 2. Additive at the target length, fwd+bwd.
    at = (FWD_BWD, sizes.batch, sizes.target_length)
    h, hk = sizes.d_hidden, sizes.keras_d_hidden
    ours_peak = get("additive", OURS, *at, "peak_mib", h)
    for impl, peer_h in ((PLAIN, h), (KERAS_ADDITIVE, hk)):
        ratio = _ratio(ours_peak, get("additive", impl, *at, "peak_mib", peer_h))
        targets.append(
            _target(
                f"additive(h={h}) fwd+bwd L{sizes.target_length}: peak / {impl}(h={peer_h})",
                ratio,
                "<= 0.1",
                ratio is not None and ratio <= 0.1,
            )
        )
    ratio = _ratio(
        get("additive", OURS, *at, "median_ms", h), get("additive", PLAIN, *at, "median_ms", h)
    )
    targets.append(
        _target(
            f"additive(h={h}) fwd+bwd L{sizes.target_length}: time / plain",
            ratio,
            "<= 0.6",
            ratio is not None and ratio <= 0.6,
        )
    )
    fwd_ms = get("additive", OURS, FWD, sizes.batch, sizes.target_length, "median_ms", h)
    tanh_count = sizes.batch * sizes.target_length**2 * h
    rate = tanh_count / (fwd_ms / 1e3) / 1e9 if fwd_ms else None
    targets.append(
        _target(
            f"additive(h={h}) fwd L{sizes.target_length}: G tanh/s",
            rate,
            ">= 1.0",
            rate is not None and rate >= 1.0,
        )
    )
    # Matched feature size against Keras (information: Keras has no d_hidden).
    ratio = _ratio(
        get("additive", OURS, *at, "median_ms", hk),
        get("additive", KERAS_ADDITIVE, *at, "median_ms", hk),
    )
    targets.append(
        _target(
            f"additive(h={hk}) fwd+bwd L{sizes.target_length}: time / {KERAS_ADDITIVE} "
            "(matched features, information)",
            ratio,
            "< 1.0",
            ratio is not None and ratio < 1.0,
        )
    )

    # 3. Long additive.
    long_peak = get(
        "additive",
        OURS,
        FWD_BWD,
        sizes.long_batch,
        sizes.long_length,
        "peak_mib",
        sizes.long_d_hidden,
    )
    long_gib = long_peak / 1024 if long_peak is not None else None
    targets.append(
        _target(
            f"additive(h={sizes.long_d_hidden}) fwd+bwd B{sizes.long_batch} "
            f"L{sizes.long_length}: peak GiB",
            long_gib,
            "< 1.5",
            long_gib is not None and long_gib < 1.5,
        )
    )

    # 4. MultiHeadAttention training step.
    at = (FWD_BWD, sizes.mha_batch, sizes.mha_target_length)
    peers = [get("mha", impl, *at, "median_ms") for impl in (TORCH_MHA, KERAS_MHA)]
    known = [p for p in peers if p is not None]
    ratio = _ratio(get("mha", OURS, *at, "median_ms"), min(known) if known else None)
    targets.append(
        _target(
            f"MHA fwd+bwd L{sizes.mha_target_length}: time / min(nn.MHA, keras MHA)",
            ratio,
            "<= 1.0",
            ratio is not None and ratio <= 1.0,
            peers_ms=dict(zip((TORCH_MHA, KERAS_MHA), peers, strict=True)),
        )
    )
    ratio = _ratio(
        get("mha", OURS_WEIGHTS, *at, "median_ms"), get("mha", TORCH_MHA_WEIGHTS, *at, "median_ms")
    )
    targets.append(
        _target(
            f"MHA fwd+bwd L{sizes.mha_target_length} with weights: time / nn.MHA(need_weights)",
            ratio,
            "<= 0.8",
            ratio is not None and ratio <= 0.8,
        )
    )
    return targets


# 6. attention()'s own cost -------------------------------------------------------------------


def _cpu_timed(samples: list[float], n: int, fn: Callable, *args, **kwargs) -> Callable:
    """A step running fn(*args, **kwargs) n times under no_grad and appending its thread CPU
    time to `samples`."""

    def step() -> None:
        start = time.thread_time()
        with torch.no_grad():
            for _ in range(n):
                fn(*args, **kwargs)
        samples.append(time.thread_time() - start)

    return step


def measure_overhead(quick: bool) -> list[dict[str, Any]]:
    """`overhead_rows` in a fresh process that never imports Keras: importing it (torch
    backend) slowed every small torch call of the process here, SDPA at length 16 by ~45%."""
    payload = {"overhead": "quick" if quick else "full"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(payload)]
    result = common.run_worker(command, timeout=900)
    if result["status"] != common.STATUS_OK:
        raise RuntimeError(f"overhead worker: {result.get('error')}")
    return result["rows"]


def overhead_rows(sizes: Sizes) -> list[dict[str, Any]]:
    """attention() against a direct 4-D SDPA call, forward under no_grad with one thread: what
    its checks and dispatch cost per call, which an RNN decoder pays at every step. Inputs are
    3-D (batch, len, d), as a decoder passes them, and 4-D (batch, 1, len, d), which spares
    the views SDPA's fast kernel needs. Each sample times `overhead_calls` calls back to back
    (one call is a few microseconds); samples interleaved (PERF.md). The clock is the calling
    thread's CPU time: with one thread it counts the same work, and on a shared machine the
    time other jobs hold the core (which swamped microsecond wall-clock differences) does not
    count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for length in sizes.overhead_lengths:
            torch.manual_seed(0)
            q, k, v = (torch.randn(sizes.batch, length, sizes.d) for _ in range(3))
            q4, k4, v4 = (t.unsqueeze(1) for t in (q, k, v))  # (b, 1, len, d)

            n = sizes.overhead_calls
            cpu: dict[str, list[float]] = {"attnzoo": [], "attnzoo_4d": [], "sdpa": []}
            ours = attnzoo.attention
            fns = {
                "attnzoo": _cpu_timed(cpu["attnzoo"], n, ours, q, k, v, score="scaled_dot"),
                "attnzoo_4d": _cpu_timed(
                    cpu["attnzoo_4d"], n, ours, q4, k4, v4, score="scaled_dot"
                ),
                "sdpa": _cpu_timed(cpu["sdpa"], n, F.scaled_dot_product_attention, q4, k4, v4),
            }
            repeats = sizes.overhead_repeats
            common.time_interleaved(fns, repeats=repeats, warmup=2)  # its order, our clock
            calls = sizes.overhead_calls
            us = {name: common.median(t[-repeats:]) / calls * 1e6 for name, t in cpu.items()}
            # The own cost is the median of paired differences (one round's attention() sample
            # minus the same round's SDPA sample): drift of this shared machine between rounds
            # cancels, where a difference of two medians kept it (10x the cost at length 128).
            paired = {
                name: common.median(
                    [
                        a - s
                        for a, s in zip(cpu[name][-repeats:], cpu["sdpa"][-repeats:], strict=True)
                    ]
                )
                / calls
                * 1e6
                for name in ("attnzoo", "attnzoo_4d")
            }
            rows.append(
                {
                    "batch": sizes.batch,
                    "length": length,
                    "d": sizes.d,
                    "threads": 1,
                    "attnzoo_us": us["attnzoo"],
                    "attnzoo_4d_us": us["attnzoo_4d"],
                    "sdpa_us": us["sdpa"],
                    "overhead_us": paired["attnzoo"],
                    "overhead_4d_us": paired["attnzoo_4d"],
                    "ratio": us["attnzoo"] / us["sdpa"],
                }
            )
    finally:
        torch.set_num_threads(threads)
    return rows


def overhead_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """attention()'s own cost over a direct 4-D SDPA call at its worst length: at most 5 us
    (the cost an RNN decoder pays at every step), with 3-D inputs and with 4-D ones."""
    targets = []
    for key, inputs in (("overhead_us", "3-D"), ("overhead_4d_us", "4-D")):
        detail = {str(row["length"]): row[key] for row in rows}
        worst = max(detail.values()) if detail else None
        targets.append(
            _target(
                f"attention() own cost over 4-D sdpa, {inputs} inputs: us (worst length)",
                worst,
                "<= 5",
                worst is not None and worst <= 5.0,
                by_length=detail,
                by_length_key=key,
            )
        )
    return targets


def matmul_gflops() -> float:
    """fp32 1024^3 matmul throughput on one thread: how fast this shared machine ran while the
    microsecond rows were measured (PERF.md: 120-148 GFLOP/s when quiet)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        times = common.time_interleaved({"mm": lambda: a @ b}, repeats=15, warmup=3)["mm"]
        return 2 * 1024**3 / common.median(times) / 1e9
    finally:
        torch.set_num_threads(threads)


def run_overhead(quick: bool, out: Path, argv: list[str]) -> dict[str, Any]:
    """attention()'s own cost, with its targets, into its own JSON (`--overhead`)."""
    load_at_start = list(os.getloadavg())
    gflops_before = matmul_gflops()
    rows = measure_overhead(quick)
    payload = {
        "machine": common.machine_info(
            attnzoo=attnzoo.__version__,
            load_average_start=load_at_start,
            matmul_gflops_1_thread=[gflops_before, matmul_gflops()],  # before and after
        ),
        "config": {"command": " ".join([Path(sys.executable).name, *argv])},
        "overhead": rows,
        "targets": overhead_targets(rows),
    }
    print_overhead(rows)
    print_targets(payload["targets"])
    print(f"wrote {common.write_json(out, payload)}", file=sys.stderr)
    return payload


def print_overhead(rows: list[dict[str, Any]]) -> None:
    columns = ["B", "L", "d", "attnzoo us", "sdpa us", "overhead us", "÷ sdpa", "overhead 4-D us"]
    keys = ["batch", "length", "d", "attnzoo_us", "sdpa_us", "overhead_us", "ratio"]
    table = [[row[key] for key in [*keys, "overhead_4d_us"]] for row in rows]
    title = "attention()'s own cost (fwd, no_grad, 1 thread, thread CPU time)"
    common.print_table(title, columns, table)


# 7. Main --------------------------------------------------------------------------------------


def _reference(case: Case, rows: dict[Case, dict]) -> dict | None:
    """The attnzoo row a row is compared with in the table (same group and d_hidden)."""
    impl = OURS_WEIGHTS if case.impl in WEIGHTS_IMPLS else OURS
    for other, row in rows.items():
        if other.group == case.group and other.impl == impl and other.d_hidden == case.d_hidden:
            return row
    return None


def print_rows(rows: dict[Case, dict]) -> None:
    table = []
    for case, row in rows.items():
        reference = _reference(case, rows)
        ratio = _ratio(row.get("median_ms"), reference.get("median_ms") if reference else None)
        table.append(
            [
                case.score,
                case.d_hidden,
                case.batch,
                case.length,
                case.mode,
                case.impl,
                row.get("median_ms"),
                row.get("peak_mib"),
                ratio,
                row["status"],
            ]
        )
    columns = ["score", "h", "B", "L", "mode", "impl", "median ms", "peak MiB", "÷ attnzoo", "st"]
    common.print_table("Rows (÷ attnzoo: time over attnzoo's in the same group)", columns, table)
    print(f"Keras AdditiveAttention: {NOTES[KERAS_ADDITIVE]}.")


def print_targets(targets: list[dict[str, Any]]) -> None:
    table = [[t["name"], t["value"], t["target"], t["met"]] for t in targets]
    common.print_table("Targets", ["target", "value", "goal", "met"], table)


def run(sizes: Sizes, out: Path, argv: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    load_at_start = list(os.getloadavg())
    torch.set_num_threads(THREADS)
    cases = build_cases(sizes)
    budget = int(sizes.budget_gib * common.GIB)
    measured = set(cases) if sizes.memory == "all" else target_cases(sizes)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {message}", file=sys.stderr, flush=True)

    # 1. Estimates, then peak memory in one fresh worker per configuration.
    rows: dict[Case, dict] = {}
    to_measure = []
    for case in cases:
        estimate = estimate_bytes(case)
        row = {
            "name": case.name,
            **dataclasses.asdict(case),
            "median_ms": None,
            "peak_mib": None,
            "status": common.STATUS_OK,
            "estimate_mib": round(estimate / common.MIB, 1),
            "note": NOTES[case.impl],
        }
        rows[case] = row
        if estimate > budget:
            row.update(
                status=common.STATUS_OOM,
                error=f"estimated {estimate / common.GIB:.2f} GiB > budget {sizes.budget_gib} GiB",
            )
            log(f"oom (estimate) {case.name}")
            continue
        if case in measured:
            to_measure.append(case)
    with ThreadPoolExecutor(sizes.memory_jobs) as pool:
        futures = {pool.submit(measure_memory, case, budget): case for case in to_measure}
        for future in as_completed(futures):
            case, result = futures[future], future.result()
            row = rows[case]
            row.update(peak_mib=result.get("peak_mib"), status=result["status"])
            if "error" in result:
                row["error"] = result["error"]
            log(f"memory {case.name}: {row['peak_mib']} MiB, {row['status']}")

    # 2. Times, interleaved per group in this process.
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        if rows[case]["status"] == common.STATUS_OK:
            groups.setdefault(case.group, []).append(case)
    for key, group in groups.items():
        length = group[0].length
        time_group(group, sizes.repeats_for(length), sizes.warmup_for(length), rows)
        log(f"timed {key}: " + ", ".join(f"{c.impl}" for c in group))

    targets = evaluate_targets(rows, sizes)
    keras_version = None
    if "keras" in sys.modules:
        keras_version = sys.modules["keras"].__version__
    payload = {
        "machine": common.machine_info(
            keras=keras_version, attnzoo=attnzoo.__version__, load_average_start=load_at_start
        ),
        "config": {
            **dataclasses.asdict(sizes),
            "command": " ".join([Path(sys.executable).name, *argv]),
            "dtype": "float32",
            "fwd": "forward under torch.no_grad()",
            "fwd+bwd": "forward, then backward from a random output gradient",
            "peak_mib": (
                "VmHWM after one call minus VmHWM after imports, inputs and one call at "
                f"length {WARM_LENGTH}, in a fresh process per row"
            ),
            "median_ms": "median per call, implementations of a group interleaved",
            "wall_seconds": round(time.perf_counter() - start, 1),
        },
        "rows": list(rows.values()),
        "targets": targets,
    }
    print_rows(rows)
    print_targets(targets)
    path = common.write_json(out, payload)
    log(f"wrote {path}")
    return payload


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1-2 repeats")
    parser.add_argument("--out", type=Path, default=None, help="JSON results path")
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="only attention()'s own cost per call, into results/attention_overhead.json",
    )
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return
    sizes = quick_sizes() if args.quick else full_sizes()
    if args.overhead:
        run_overhead(args.quick, args.out or OVERHEAD_OUT, ["benchmarks/bench_attention.py", *argv])
        return
    run(sizes, args.out or DEFAULT_OUT, ["benchmarks/bench_attention.py", *argv])


if __name__ == "__main__":
    main()
