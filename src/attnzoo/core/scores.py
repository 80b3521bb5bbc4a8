"""Score functions: how much query i "matches" key j, before normalisation.

One signature for all (STYLE.md 2):
    score(query (batch, [heads,] query_len, d_query), key (batch, [heads,] key_len, d_key))
        -> logits (batch, [heads,] query_len, key_len)

Each score splits into two stages so a decoder that queries the same keys at every step pays
for the key-side work once per sequence, not once per step:
    prepared = score.prepare_key(key)        # once per sequence
    logits = score.logits(query, prepared)   # once per step
`forward(query, key)` is the two stages in one call.

A score with a kernel of its own says so itself: `fused(query, prepared_key, value, ...)`
returns the whole `AttentionOutput`, or None to let `attention()` take the plain path (logits,
masked softmax, weights @ value). Dot-family scores (Dot, ScaledDot, General, Cosine) expose
`as_dot(query, prepared)` returning `(query', key', scale)` with logits =
scale * query' @ key'^T and run on `torch.nn.functional.scaled_dot_product_attention`;
`Additive` runs on the blockwise kernel of `attnzoo.core.additive`. A new score needs no edit
of `attention()`.
"""

from __future__ import annotations

import abc
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.additive import _additive_attention, _additive_logits, _nonfinite_rows
from attnzoo.core.checks import (
    autocast_dtype,
    broadcast_shape,
    check_floating,
    check_like_parameter,
    check_size,
    check_tensor,
    fail,
)
from attnzoo.core.masks import clear_unattended, combine_masks, geometry_mask
from attnzoo.core.normalisers import (
    all_finite,
    masked_softmax,
    propagate_nonfinite,
    propagate_nonfinite_keys,
)
from attnzoo.core.types import AttentionOutput


class Score(nn.Module, abc.ABC):
    """Base class. Subclasses implement `logits`; most keep `prepare_key` as the identity."""

    def prepare_key(self, key: torch.Tensor) -> torch.Tensor:
        return key

    @abc.abstractmethod
    def logits(self, query: torch.Tensor, prepared_key: torch.Tensor) -> torch.Tensor:
        """query (b, [h,] i, d_q), prepared key (b, [h,] j, .) -> logits (b, [h,] i, j)."""

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """query (b, [h,] i, d_q), key (b, [h,] j, d_k) -> logits (b, [h,] i, j)."""
        name = type(self).__name__
        check_floating(name, "query", query)
        check_floating(name, "key", key)
        check_tensor(name, "query", query, (3, 4))  # a query without its batch dim would
        check_tensor(name, "key", key, (query.dim(),))  # broadcast over the key's batch
        if broadcast_shape(query.shape[:-2], key.shape[:-2]) is None:
            expected = f"leading dims compatible with query {tuple(query.shape[:-2])}"
            fail(name, "key", expected, tuple(key.shape[:-2]))
        return self.logits(query, self.prepare_key(key))

    def fused(
        self,
        query: torch.Tensor,
        prepared_key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        causal: bool,
        window: int | None,
        dropout: float,
        return_weights: bool,
        cleared: bool = False,
    ) -> AttentionOutput | None:
        """Attention with this score's own kernel, or None for `attention()`'s plain path.

        Called by `attention()` after its checks, with the arguments it was given (shapes as
        there; `prepared_key` from `prepare_key`). `cleared`: keys and values were already
        cleared under `mask` (`masks.clear_unattended`, by `prepare_key`). The default has no
        kernel of its own.
        """
        return None


class DotFamily(Score):
    """A score that is a (scaled) dot product after a map of query and/or key."""

    @abc.abstractmethod
    def as_dot(self, query: torch.Tensor, prepared_key: torch.Tensor):
        """-> (query', key', scale) with logits = scale * query' @ key'^T."""

    def logits(self, query: torch.Tensor, prepared_key: torch.Tensor) -> torch.Tensor:
        q, k, scale = self.as_dot(query, prepared_key)
        return (q * scale) @ k.transpose(-2, -1)  # (b, [h,] i, j)

    def fused(
        self,
        query,
        prepared_key,
        value,
        *,
        mask,
        causal,
        window,
        dropout,
        return_weights,
        cleared=False,
    ) -> AttentionOutput:
        """scaled_dot_product_attention, with `is_causal` when causality is the only mask
        (PERF.md: the same mask as a bool tensor cost 1.5-2.2x); None (the plain path) where
        weights are asked for and the plain path is the faster (`_weights_plainly`)."""
        if return_weights and _weights_plainly(query, prepared_key, value):
            return None
        q, k, scale = self.as_dot(query, prepared_key)
        only_causal = causal and mask is None and window is None
        full = mask
        if (causal or window is not None) and (return_weights or not only_causal):
            i, j = q.shape[-2], k.shape[-2]
            geometric = geometry_mask(i, j, causal=causal, window=window, device=q.device)
            full = combine_masks(mask, geometric)
        if full is not None and not cleared:
            # padding's content (NaN, Inf) must not reach the kernel's sums (the kernel adds
            # -inf to a NaN logit)
            k, value = clear_unattended(full, k, value)
        clean = all_finite(q, k)  # on the CPU one read; else the probes below, unread
        if not clean:  # a non-finite key row makes its value row so (what attends it reads it)
            value = propagate_nonfinite(value, k, read=False)
        context = _sdpa(q, k, value, None if only_causal else full, only_causal, dropout, scale)
        if not clean:
            context = propagate_nonfinite(context, q, read=False)
        if not return_weights:
            return AttentionOutput(context, None)
        # Weights, when asked for, come from their own small graph: the context keeps the
        # flash kernel's forward and backward (measured 2.5-3.8x faster than the plain form),
        # and the weights' backward runs only if a loss uses them. In half precision and
        # under autocast the logits are formed in float32, as the kernel accumulates them:
        # fp16 logits overflow to inf (NaN weights) beside the kernel's finite context, and
        # bf16 ones round by 0.25 near 64. The weights take the context's dtype.
        low = autocast_dtype(q) if q.dtype is torch.float32 else None  # (float64 stays)
        if low is not None or q.dtype in _HALF:
            with torch.autocast(q.device.type, enabled=False) if low else nullcontext():
                logits = (q.float() * scale) @ k.float().transpose(-2, -1)  # (b, [h,] i, j)
        else:
            logits = (q * scale) @ k.transpose(-2, -1)  # (b, [h,] i, j)
        if clean:
            return AttentionOutput(context, masked_softmax(logits, full).to(context.dtype))
        logits = propagate_nonfinite_keys(logits, k, read=False)
        weights = masked_softmax(logits, full).to(context.dtype)
        return AttentionOutput(context, propagate_nonfinite(weights, q, read=False))


_HALF = (torch.bfloat16, torch.float16)
_PLAIN_WEIGHTS_MAX_KEYS = 256  # `_weights_plainly`: from 512 keys on SDPA's backward wins
_UPCAST_MAX_KEYS = 256  # `_slow_half`: from 512 keys on the bf16 backward is faster
_PAD_MAX_DIM = 32  # pad d_key or d_value to the other up to this width (`_sdpa`)


def _weights_plainly(query, key, value) -> bool:
    """Whether the plain path (logits, softmax, weights @ value) gives context and weights
    faster than SDPA beside a graph of its own for the weights: it forms the (i, j) logits
    once, not twice. At (batch, 8 heads, len, 64), one thread, on CPU, median ms, SDPA and
    weights against plain: forward only 15.7 / 51.8 / 163.7 against 9.4 / 37.0 / 138.0 at
    len 64 / 256 / 1024; forward and backward 34.9 / 65.1 / 254.5 against 24.6 / 63.8 / 307.8
    (the flash kernel's backward wins on long keys). Measured on CPU only, so there only; not
    in half precision or under autocast, whose logits the fused path forms in float32 (fp16
    logits overflow; the plain path's product under autocast rounds them to bf16)."""
    if not query.is_cpu or query.dtype in _HALF or autocast_dtype(query) is not None:
        return False
    return not _backward_runs(query, key, value) or key.shape[-2] <= _PLAIN_WEIGHTS_MAX_KEYS


def _backward_runs(*tensors) -> bool:
    """Whether autograd records an op on `tensors` (a backward may then run through it)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _sdpa(q, k, value, mask, is_causal, dropout, scale):
    """scaled_dot_product_attention on 4-D tensors: its fast CPU kernel wants
    (batch, heads, len, d); 3-D inputs fell to a path 2x slower."""
    squeeze = q.dim() == 3
    if squeeze:
        q, k, value = q.unsqueeze(1), k.unsqueeze(1), value.unsqueeze(1)  # (b, 1, len, d)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (b, 1, i, j)
    if mask is not None and mask.dim() == 1:
        mask = mask.unsqueeze(0)  # (1, j): the CPU kernel indexes a mask's dim -2
    d_value = half = None  # the output's width where the value is padded; its dtype if upcast
    if q.is_cpu:
        if (half := _slow_half(q, k, value)) is not None:
            q, k, value = q.float(), k.float(), value.float()
        q, k, value, d_value = _kernel_ready(q, k, value)
    if half is None:
        context = F.scaled_dot_product_attention(q, k, value, mask, dropout, is_causal, scale=scale)
    else:
        with torch.autocast("cpu", enabled=False):  # else autocast casts it back to `half`
            context = F.scaled_dot_product_attention(
                q, k, value, mask, dropout, is_causal, scale=scale
            ).to(half)
    if d_value is not None:
        context = context[..., :d_value]  # (b, h|1, i, d)
    return context.squeeze(1) if squeeze else context


def _slow_half(q, k, value) -> torch.dtype | None:
    """The half dtype the CPU kernel would run in when its backward will run over at most
    `_UPCAST_MAX_KEYS` keys, else None.

    In bf16 (fp16 alike) the CPU flash kernel's backward is slow on short keys: at
    (batch, 4 heads, len, 64), one thread, forward and backward took 13.1 / 29.8 / 25.6 /
    30.7 ms at len 16 / 64 / 256 / 512 in bf16 against 2.2 / 11.6 / 24.3 / 40.5 ms cast to
    float32 and back (the math backend in bf16, used here before: 2.7 / 16.3 / 33.8 / 74.6).
    Without a backward the bf16 kernel is the fastest (1.1 ms at len 64; math 5.9)."""
    if k.shape[-2] > _UPCAST_MAX_KEYS or not _backward_runs(q, k, value):
        return None
    if q.dtype in _HALF:
        return q.dtype
    if q.dtype is torch.float32 and torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")  # the dtype autocast would run the kernel in
    return None


def _kernel_ready(q, k, value):
    """(q, k, value as SDPA's CPU kernel takes them, the value's width where it was padded or
    None). Otherwise SDPA runs its math path, which holds every (i, j) logit
    (`benchmarks/bench_attention.py`, rows `unequal`); the checks cost about 1 us a call.
    - d_key != d_value: zero columns make them equal and change no logit (the scale is passed)
      and no output (sliced back), up to `_PAD_MAX_DIM` columns: measured 1.7-5x faster at
      d 2 -> 16 over 64-256 keys; from 64 columns on the padded products cost more than the
      math path's memory traffic;
    - unit stride in the last dimension: a (b, C, N) -> (b, N, C) view of a convolution's
      output took the math path at twice the time; copying it costs O(length d)."""
    d_key, d_value = k.shape[-1], value.shape[-1]
    cut = None  # the value's width when it is padded
    if d_key != d_value and (width := max(d_key, d_value)) <= _PAD_MAX_DIM:
        q, k = F.pad(q, (0, width - d_key)), F.pad(k, (0, width - d_key))
        value, cut = F.pad(value, (0, width - d_value)), d_value
    if q.stride(-1) != 1 or k.stride(-1) != 1 or value.stride(-1) != 1:
        q, k, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, value))
    return q, k, value, cut


def _check_dims(name: str, d_query: int, d_key: int) -> None:
    if d_query != d_key:
        fail(name, "key", f"last dimension d_key == d_query = {d_query}", d_key)


class Dot(DotFamily):
    """Luong 2015 (eq. 8, "dot"): score(h_t, h_s) = h_t^T h_s."""

    def as_dot(self, query, prepared_key):
        if prepared_key.shape[-1] != query.shape[-1]:
            _check_dims("Dot", query.shape[-1], prepared_key.shape[-1])
        return query, prepared_key, 1.0


class ScaledDot(DotFamily):
    """Vaswani 2017 (eq. 1): score(q, k) = q^T k / sqrt(d_k); the scaling keeps the logits'
    variance near 1 so the softmax does not saturate for large d_k."""

    def as_dot(self, query, prepared_key):
        d = query.shape[-1]
        if prepared_key.shape[-1] != d:
            _check_dims("ScaledDot", d, prepared_key.shape[-1])
        return query, prepared_key, 1.0 / math.sqrt(d)


class General(DotFamily):
    """Luong 2015 (eq. 8, "general"): score(h_t, h_s) = h_t^T W_a h_s.

    Args:
        d_query, d_key: feature sizes of query and key.
    Note:
        W_a is applied to the query (h_t^T W_a), which is cheaper than mapping every key when a
        decoder queries one step at a time; the logits are the same.
    """

    def __init__(self, d_query: int, d_key: int):
        super().__init__()
        check_size("General", "d_query", d_query)
        check_size("General", "d_key", d_key)
        self.d_query, self.d_key = d_query, d_key
        self.weight = nn.Parameter(torch.empty(d_query, d_key))
        nn.init.xavier_uniform_(self.weight)

    def as_dot(self, query, prepared_key):
        _check_dims("General", self.d_query, query.shape[-1])
        _check_dims("General", self.d_key, prepared_key.shape[-1])
        check_like_parameter("General", "query", query, self.weight)
        return query @ self.weight, prepared_key, 1.0  # (b, [h,] i, d_key)


class Cosine(DotFamily):
    """Graves 2014 (NTM, eq. 5-6): K[u, v] = u.v / (|u| |v|), sharpened by the key strength
    beta: logits = beta * K[query, key]. `logits()` accepts a per-query beta tensor
    (batch, [heads,] query_len) for an NTM head that emits beta at every step.

    Args:
        beta: the key strength, a finite number (a NaN or infinite one would make every
            weight NaN, which SDPA's CPU kernel turns into a zero context: refused here), or a
            tensor, whose non-finite values propagate to the output.
        eps: the least norm, a positive finite number.
    Note:
        Norms are clamped below by `eps`, so an all-zero memory row (the NTM's initial state)
        gives similarity 0 and finite gradients rather than NaN.
    """

    def __init__(self, beta: float | torch.Tensor = 1.0, eps: float = 1e-8):
        super().__init__()
        if not isinstance(beta, torch.Tensor) and not _finite_number(beta):
            fail("Cosine", "beta", "a finite number or a tensor", repr(beta))
        if not _finite_number(eps) or eps <= 0:
            fail("Cosine", "eps", "a positive finite number", repr(eps))
        self.beta, self.eps = beta, eps

    def prepare_key(self, key):
        return _unit(key, self.eps)

    def as_dot(self, query, prepared_key, beta: torch.Tensor | float | None = None):
        _check_dims("Cosine", query.shape[-1], prepared_key.shape[-1])
        q = _unit(query, self.eps)
        beta = self.beta if beta is None else beta
        if isinstance(beta, torch.Tensor):
            _check_beta(beta, query)
            return q * beta.unsqueeze(-1), prepared_key, 1.0
        return q, prepared_key, float(beta)

    def logits(self, query, prepared_key, beta: torch.Tensor | float | None = None):
        q, k, scale = self.as_dot(query, prepared_key, beta)
        return (q * scale) @ k.transpose(-2, -1)  # (b, [h,] i, j)


def _unit(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / max(|x|, eps) over the last dim; half precision in float32, where `eps` (1e-8 by
    default) is not 0 (in fp16 it is: a zero row, e.g. cleared padding, gave 0 / 0 = NaN).

    A row whose largest magnitude exceeds `_UNIT_SCALE_ABOVE` is divided by it first: the
    norm squares the entries, which overflow float32 from ~1.8e19 / sqrt(d) (norm inf, a zero
    unit vector: uniform weights from finite inputs). Such a row is far above `eps`, where
    the unit vector does not depend on scale; every other row is divided by exactly 1."""
    work = x.float() if x.dtype in _HALF else x
    largest = work.abs().amax(-1, keepdim=True)
    work = work / torch.where(largest > _UNIT_SCALE_ABOVE, largest, 1.0)
    return F.normalize(work, dim=-1, eps=eps).to(x.dtype)


_UNIT_SCALE_ABOVE = 2.0**32  # `_unit`: squares of d entries below it stay far from overflow


class Additive(Score):
    """Bahdanau 2015 (appendix A.1.2): e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j); Luong's
    "concat" score v_a^T tanh(W_a [h_t; h_s]) is the same function.

    Args:
        d_query, d_key: feature sizes of query (decoder state) and key (annotations).
        d_hidden: size of the tanh layer (Bahdanau's n').
        bias: add a bias inside the tanh (on the query side).
    Note:
        The logits are computed blockwise over queries with a recomputing backward
        (`attnzoo.core.additive`): memory O(query_len * key_len), never the
        (query_len, key_len, d_hidden) tensor the broadcast form builds.
    """

    def __init__(self, d_query: int, d_key: int, d_hidden: int, bias: bool = False):
        super().__init__()
        for name, size in (("d_query", d_query), ("d_key", d_key), ("d_hidden", d_hidden)):
            check_size("Additive", name, size)
        if not isinstance(bias, bool):
            fail("Additive", "bias", "a bool", repr(bias), TypeError)
        self.query_proj = nn.Linear(d_query, d_hidden, bias=bias)
        self.key_proj = nn.Linear(d_key, d_hidden, bias=False)
        self.v = nn.Parameter(torch.empty(d_hidden))
        nn.init.uniform_(self.v, -1 / math.sqrt(d_hidden), 1 / math.sqrt(d_hidden))

    def prepare_key(self, key):
        if key.shape[-1] != self.key_proj.in_features:
            fail(
                "Additive",
                "key",
                f"last dimension d_key = {self.key_proj.in_features}",
                key.shape[-1],
            )
        check_like_parameter("Additive", "key", key, self.key_proj.weight)
        return self.key_proj(key)  # (b, [h,] j, d_hidden)

    def prepare_query(self, query):
        if query.shape[-1] != self.query_proj.in_features:
            fail(
                "Additive",
                "query",
                f"last dimension d_query = {self.query_proj.in_features}",
                query.shape[-1],
            )
        check_like_parameter("Additive", "query", query, self.query_proj.weight)
        return self.query_proj(query)  # (b, [h,] i, d_hidden)

    def logits(self, query, prepared_key):
        projected = self.prepare_query(query)
        logits = _additive_logits(projected, prepared_key, self.v)
        if all_finite(projected, self.v):
            return logits
        # tanh saturates: an infinite query, W_a or v would give finite logits
        return propagate_nonfinite(logits, _nonfinite_rows(projected, self.v), read=False)

    def fused(
        self,
        query,
        prepared_key,
        value,
        *,
        mask,
        causal,
        window,
        dropout,
        return_weights,
        cleared=False,
    ) -> AttentionOutput | None:
        """The blockwise kernel, which fuses the softmax and the weighted sum: without weights
        and without dropout (it never holds the weights to return or drop)."""
        if return_weights or dropout > 0:
            return None
        projected = self.prepare_query(query)  # attention() checked the inputs
        # tanh saturates: an infinite query, key, W_a, U_a or v gives finite logits, so each
        # is probed (on the CPU by one read): a key through its value row, the rest by row
        clean = all_finite(projected, prepared_key, self.v)
        if not clean:
            value = propagate_nonfinite(value, prepared_key, read=False)
        context = _additive_attention(
            projected, prepared_key, self.v, value, mask, causal, window, cleared
        )
        if not clean:
            context = propagate_nonfinite(context, _nonfinite_rows(projected, self.v), read=False)
        return AttentionOutput(context, None)


class Location(Score):
    """Luong 2015 (eq. 8, "location"): a_t = softmax(W_a h_t): the weights depend on the
    query alone, one logit per source position; keys give only their count.

    Args:
        d_query: feature size of the query.
        max_keys: the longest key sequence the layer can address.
    """

    def __init__(self, d_query: int, max_keys: int):
        super().__init__()
        check_size("Location", "d_query", d_query)
        check_size("Location", "max_keys", max_keys)
        self.max_keys = max_keys
        self.proj = nn.Linear(d_query, max_keys)

    def logits(self, query, prepared_key):
        key_len = prepared_key.shape[-2]
        if key_len > self.max_keys:
            fail("Location", "key", f"key_len <= max_keys = {self.max_keys}", key_len)
        if query.shape[-1] != self.proj.in_features:
            fail(
                "Location",
                "query",
                f"last dimension d_query = {self.proj.in_features}",
                query.shape[-1],
            )
        check_like_parameter("Location", "query", query, self.proj.weight)
        return self.proj(query)[..., :key_len]  # (b, [h,] i, j)


def _check_beta(beta: torch.Tensor, query: torch.Tensor) -> None:
    """A key strength per query: floating, on the query's device, broadcastable to (batch,
    [heads,] query_len) without enlarging it (a larger one would broadcast the logits)."""
    lead = tuple(query.shape[:-1])
    if (
        not beta.is_floating_point()
        or beta.device != query.device
        or broadcast_shape(beta.shape, lead) != lead
    ):
        wanted = f"a floating tensor on {query.device} broadcastable to {lead} (one per query)"
        fail(
            "Cosine", "beta", wanted, f"{beta.dtype} of shape {tuple(beta.shape)} on {beta.device}"
        )


def _finite_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# The parameter-free scores by name, built once for `attention(score=NAME)` (an nn.Module
# costs ~7 us to construct), which only reads them. A module that keeps a score
# (`make_score`: MultiHeadAttention, the models) gets its own instance, so that setting
# Cosine's beta on one never changes another.
SCORE_NAMES = {"dot": Dot(), "scaled_dot": ScaledDot(), "cosine": Cosine()}


def _same_size(name: str, d_query: int, d_key: int) -> None:
    if d_query != d_key:
        fail(
            "make_score",
            "score",
            f"'general' or 'additive' when d_query ({d_query}) != d_key ({d_key})",
            repr(name),
        )


def _parameter_free(name: str):
    def build(d_query: int, d_key: int, d_hidden: int | None, max_keys: int | None) -> Score:
        _same_size(name, d_query, d_key)
        return type(SCORE_NAMES[name])()

    return build


def _location(d_query: int, d_key: int, d_hidden: int | None, max_keys: int | None) -> Score:
    if max_keys is None:
        fail("make_score", "max_keys", "the longest key sequence for 'location'", None)
    return Location(d_query, max_keys)


# The one registry of scores by name: name -> builder(d_query, d_key, d_hidden, max_keys).
SCORES = {
    "dot": _parameter_free("dot"),
    "scaled_dot": _parameter_free("scaled_dot"),
    "cosine": _parameter_free("cosine"),
    "general": lambda d_query, d_key, d_hidden, max_keys: General(d_query, d_key),
    "additive": lambda d_query, d_key, d_hidden, max_keys: Additive(
        d_query, d_key, d_key if d_hidden is None else d_hidden
    ),
    "location": _location,
}


def make_score(
    name: str,
    d_query: int,
    d_key: int,
    *,
    d_hidden: int | None = None,
    max_keys: int | None = None,
) -> Score:
    """Build the score called `name` (one of `SCORES`) for these sizes.

    Args:
        d_query, d_key: feature sizes of query and key; "dot", "scaled_dot" and "cosine" need
            them equal.
        d_hidden: the tanh layer of "additive" (defaults to d_key).
        max_keys: the longest key sequence "location" can address (required for it).
    """
    if name not in SCORES:
        fail("make_score", "score", f"one of {list(SCORES)}", repr(name))
    return SCORES[name](d_query, d_key, d_hidden, max_keys)


def resolve_score(score: Score | str) -> Score:
    """A score module, or one of the parameter-free names "dot", "scaled_dot", "cosine"."""
    if type(score) is str and score in SCORE_NAMES:  # names first: cheaper than an ABC check
        return SCORE_NAMES[score]
    if isinstance(score, Score):
        return score
    if isinstance(score, str) and score in SCORE_NAMES:  # a str subclass
        return SCORE_NAMES[score]
    fail(
        "attention",
        "score",
        f"a Score module or one of {sorted(SCORE_NAMES)}",
        repr(score),
        TypeError if not isinstance(score, str) else ValueError,
    )
