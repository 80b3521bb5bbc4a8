"""Normalisers: logits (batch, [heads,] query_len, key_len) -> weights over keys.

- soft: `masked_softmax` (Bahdanau, Luong global, Vaswani);
- hard: `hard_argmax`, `sample_hard` with the log-probability for REINFORCE (Xu 2015 hard
  attention, Mnih 2014), and `gumbel_softmax_st` (straight-through).

Local attention (Luong 2015), which attends rather than normalises, is `attnzoo.core.local`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import fail


def masked_fill_lowest(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Masked logits set to the dtype's minimum (never -1e9, which is not small in bf16)."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over the last dim restricted to allowed keys.

    A row with no allowed key gets all-zero weights and zero (finite) gradients, never NaN.
    """
    weights = torch.softmax(masked_fill_lowest(logits, mask), dim=-1)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


class HardSample(NamedTuple):
    weights: torch.Tensor  # one-hot (batch, [heads,] query_len, key_len)
    log_prob: torch.Tensor  # (batch, [heads,] query_len): log p(chosen key), for REINFORCE
    index: torch.Tensor  # (batch, [heads,] query_len) chosen key


def hard_argmax(logits: torch.Tensor, mask: torch.Tensor | None = None) -> HardSample:
    """Deterministic hard attention: the most likely allowed key."""
    log_p = torch.log_softmax(masked_fill_lowest(logits, mask), dim=-1)
    return _one_hot(log_p, log_p.argmax(dim=-1), mask)


def sample_hard(
    logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> HardSample:
    """Stochastic hard attention (Xu 2015 sec. 4.1): s ~ Multinoulli(softmax(logits)).

    The weights carry no gradient; train the score with REINFORCE on `log_prob`.
    """
    log_p = torch.log_softmax(masked_fill_lowest(logits, mask), dim=-1)
    flat = log_p.detach().exp().reshape(-1, log_p.shape[-1])  # (rows, key_len)
    index = torch.multinomial(flat, 1, generator=generator).view(log_p.shape[:-1])
    return _one_hot(log_p, index, mask)


def _one_hot(log_p, index, mask) -> HardSample:
    weights = F.one_hot(index, log_p.shape[-1]).to(log_p.dtype)
    log_prob = log_p.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    if mask is not None:  # a fully masked row attends nowhere and has no choice to score
        row_ok = mask.expand_as(log_p).any(dim=-1)
        weights = weights * row_ok.unsqueeze(-1)
        log_prob = log_prob.masked_fill(~row_ok, 0.0)
    return HardSample(weights, log_prob, index)


def gumbel_softmax_st(
    logits: torch.Tensor, mask: torch.Tensor | None = None, *, tau: float = 1.0
) -> torch.Tensor:
    """Straight-through Gumbel-softmax (Jang 2017): one-hot forward, soft gradient backward."""
    if tau <= 0:
        fail("gumbel_softmax_st", "tau", "a positive temperature", tau)
    weights = F.gumbel_softmax(masked_fill_lowest(logits, mask), tau=tau, hard=True, dim=-1)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)
