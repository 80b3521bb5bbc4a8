"""Normalisers: logits (batch, [heads,] query_len, key_len) -> weights over keys.

- soft: `masked_softmax` (Bahdanau, Luong global, Vaswani);
- hard: `hard_argmax`, `sample_hard` with the log-probability for REINFORCE (Xu 2015 hard
  attention, Mnih 2014), and `gumbel_softmax_st` (straight-through).

Local attention (Luong 2015), which attends rather than normalises, is `attnzoo.core.local`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_mask, fail


def masked_fill_lowest(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Masked logits set to the dtype's minimum (never -1e9, which is not small in bf16)."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over the last dim restricted to allowed keys.

    A row with no allowed key gets all-zero weights and zero (finite) gradients, never NaN.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        fail("masked_softmax", "logits", "a floating-point torch.Tensor", got, TypeError)
    check_mask("masked_softmax", mask, logits.shape, logits.device)
    weights = torch.softmax(masked_fill_lowest(logits, mask), dim=-1)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


_HALF = (torch.bfloat16, torch.float16)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 when it is in half precision (a softmax or a loss over a vocabulary loses
    digits in bfloat16, e.g. under autocast), else as it is: a float64 model's log-probabilities
    and losses stay float64 (`.float()` rounded them to float32)."""
    return x.float() if x.dtype in _HALF else x


def all_finite(*tensors: torch.Tensor) -> bool:
    """Whether every value of `tensors` is finite, known from a read of each one's sum on the
    CPU (a sync that costs nothing there; a sum is non-finite when any value is). False
    elsewhere, without reading (on a GPU the read would stall the queue; `meta` has no
    values): the caller then forms its probes regardless. Half precision sums in float32 so
    that finite values never sum to inf."""
    if not tensors[0].is_cpu:
        return False
    for t in tensors:  # a read per tensor: measured faster than one read of a sum of sums
        if t.requires_grad:
            t = t.detach()
        if not math.isfinite(t.sum(dtype=_summed(t)).item()):
            return False
    return True


def _summed(t: torch.Tensor) -> torch.dtype | None:
    return torch.float32 if t.dtype in _HALF else None  # else the tensor's own dtype


def propagate_nonfinite(out: torch.Tensor, rows: torch.Tensor, *, read: bool = True):
    """out + 0 * sum_d rows: the same values, made non-finite in every row of `out` whose row
    of `rows` is.

    With `rows` the query: SDPA's CPU kernel turns a query row of NaN logits into a finite
    context row at some sizes (measured with torch 2.13 on an AVX-512 Xeon: every key_len from
    1 to 15, float32 and bfloat16, none from 16 to 69; with or without a mask; its math
    backend gives NaN), and tanh turns an infinite query into finite additive logits: numbers
    made from garbage. The product with zero applies to every row, also one with no allowed
    key: a query that is garbage gets a garbage row, never a number (a finite query with no
    allowed key gets zeros, DESIGN.md). With `rows` the keys and `out` the values (or, by
    `propagate_nonfinite_keys`, the logits' columns): a key of -inf gives a dot logit of -inf
    against a positive query, hence a weight of 0 and a finite context, and tanh saturates
    an infinite additive key the same way; the probe makes what reads that key non-finite.
    The result has `out`'s dtype (under autocast a float32 query's context is bf16, as
    SDPA's is).

    On the CPU `all_finite` reads the total first, unless the caller did (`read=False`):
    when it is finite, so is every row, and `out` is returned as it is: one reduction
    instead of a row sum and an add over `out` (measured 2.0 / 3.3 / 7.2 us against 5.5 /
    11.4 / 59.5 us at (4, 1, len, 64), len 16 / 128 / 512).

    Args:
        out: (..., n, m), e.g. context or weights (n queries), or values (n keys).
        rows: (..., n, d).
    """
    if read and all_finite(rows):
        return out
    if rows.requires_grad:  # the probe's gradient is 0: spare the backward its ops
        rows = rows.detach()
    probe = rows.sum(-1, keepdim=True, dtype=_summed(rows))  # (..., n, 1); overflows past max
    result = torch.add(out, probe, alpha=0)  # promoted where the probe is wider than `out`
    return result if result.dtype is out.dtype else result.to(out.dtype)


def propagate_nonfinite_keys(logits: torch.Tensor, key: torch.Tensor, *, read: bool = True):
    """logits (..., i, j) made non-finite in every column j whose key row (..., j, d) is, before
    the mask fills them: a query the mask keeps from key j keeps its exact weights."""
    if read and all_finite(key):
        return logits
    return propagate_nonfinite(logits.transpose(-2, -1), key, read=False).transpose(-2, -1)


class HardSample(NamedTuple):
    weights: torch.Tensor  # one-hot (batch, [heads,] query_len, key_len)
    log_prob: torch.Tensor  # (batch, [heads,] query_len): log p(chosen key), for REINFORCE
    index: torch.Tensor  # (batch, [heads,] query_len) chosen key


def _check_logits(function: str, logits: object, mask: object) -> None:
    """Hard attention chooses one key per row: it needs a floating tensor with at least one,
    and a bool mask broadcastable to it (a larger one would broadcast the logits)."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        fail(function, "logits", "a floating torch.Tensor", got, TypeError)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        fail(function, "logits", "at least one key (key_len >= 1)", f"shape {tuple(logits.shape)}")
    check_mask(function, mask, logits.shape, logits.device)


def hard_argmax(logits: torch.Tensor, mask: torch.Tensor | None = None) -> HardSample:
    """Deterministic hard attention: the most likely allowed key. A row of allowed logits with
    a NaN gets NaN weights and log-probability, not a one-hot chosen from garbage."""
    _check_logits("hard_argmax", logits, mask)
    log_p = torch.log_softmax(masked_fill_lowest(logits, mask), dim=-1)
    return _one_hot(log_p, log_p.argmax(dim=-1), mask)


def sample_hard(
    logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> HardSample:
    """Stochastic hard attention (Xu 2015 sec. 4.1): s ~ Multinoulli(softmax(logits)).

    The weights carry no gradient; train the score with REINFORCE on `log_prob`. A row of
    allowed logits with a NaN gets NaN weights and log-probability, as in `hard_argmax`.
    """
    _check_logits("sample_hard", logits, mask)
    log_p = torch.log_softmax(masked_fill_lowest(logits, mask), dim=-1)
    flat = log_p.detach().exp().reshape(-1, log_p.shape[-1])  # (rows, key_len)
    # A row with a non-finite allowed logit samples from uniform, a stand-in that multinomial
    # accepts: `_one_hot` makes that row's weights and log-probability non-finite anyway.
    flat = torch.where(flat.isfinite().all(-1, keepdim=True), flat, torch.ones_like(flat))
    index = torch.multinomial(flat, 1, generator=generator).view(log_p.shape[:-1])
    return _one_hot(log_p, index, mask)


def _one_hot(log_p, index, mask) -> HardSample:
    weights = F.one_hot(index, log_p.shape[-1]).to(log_p.dtype)
    log_prob = log_p.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    if mask is not None:  # a fully masked row attends nowhere and has no choice to score
        row_ok = mask.expand_as(log_p).any(dim=-1)
        weights = weights * row_ok.unsqueeze(-1)
        log_prob = log_prob.masked_fill(~row_ok, 0.0)
    # + 0 * log p(chosen): the same one-hot, non-finite in a row whose allowed logits are
    # (argmax picks a NaN as the maximum); no value read.
    weights = weights + 0 * log_prob.detach().unsqueeze(-1)
    return HardSample(weights, log_prob, index)


def gumbel_softmax_st(
    logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    tau: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Straight-through Gumbel-softmax (Jang 2017): one-hot forward, soft gradient backward.

    y = softmax((logits + g) / tau) with g ~ Gumbel(0, 1) drawn from `generator`; the forward
    value is the one-hot of argmax y (the Gumbel-max trick: key j with probability
    softmax(logits)_j whatever tau), the gradient that of y. The noise is drawn here rather
    than by `F.gumbel_softmax`, which takes no generator: the same generator state gives the
    same choice, as in `sample_hard`. Masked keys get weight 0 and no gradient; a row with no
    allowed key gets zeros."""
    _check_logits("gumbel_softmax_st", logits, mask)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < math.inf:
        fail("gumbel_softmax_st", "tau", "a positive finite temperature", repr(tau))
    gumbel = -torch.empty_like(logits).exponential_(generator=generator).log()
    soft = ((masked_fill_lowest(logits, mask) + gumbel) / tau).softmax(-1)
    hard = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0)
    weights = hard - soft.detach() + soft
    return weights if mask is None else weights.masked_fill(~mask, 0.0)
