"""Normalisers: logits (batch, [heads,] query_len, key_len) -> weights over keys.

- soft: `masked_softmax` (Bahdanau, Luong global, Vaswani);
- hard: `hard_argmax`, `sample_hard` with the log-probability for REINFORCE (Xu 2015 hard
  attention, Mnih 2014), and `gumbel_softmax_st` (straight-through);
- local: `LocalAttention` (Luong 2015 local-m and local-p).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.checks import fail
from attnzoo.core.masks import window_mask


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


class LocalAttention(nn.Module):
    """Luong 2015 sec. 3.2, local attention around a centre p_t with half-width D.

    local-m (monotonic): p_t = t, the query's own position.
    local-p (predictive, eq. 9-10):
        p_t = S * sigmoid(v_p^T tanh(W_p h_t)),
        a_t(s) = align(h_t, h_s) * exp(-(s - p_t)^2 / (2 sigma^2)),  sigma = D / 2,
    where align is the score's softmax over the keys with |s - p_t| <= D.

    Args:
        score: any score module (`attnzoo.scores`).
        window: D.
        d_query: query size; given, the module is local-p, else local-m.
        d_hidden: size of W_p (defaults to d_query).
    Note:
        As in the paper, local-p's Gaussian-reweighted weights are not renormalised, so its
        rows sum to at most 1. p_t gets its gradient through the Gaussian only (the window edge
        is not differentiable), as in the paper. S is each sequence's true length when
        `lengths` is given, else key_len.
    """

    def __init__(
        self, score: nn.Module, window: int, d_query: int | None = None, d_hidden: int | None = None
    ):
        super().__init__()
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            fail("LocalAttention", "window", "a positive int", window)
        self.score, self.window = score, window
        self.predictive = d_query is not None
        if self.predictive:
            self.w_p = nn.Linear(d_query, d_hidden or d_query, bias=False)
            self.v_p = nn.Linear(d_hidden or d_query, 1, bias=False)

    def centers(
        self,
        query: torch.Tensor,
        key_len: int,
        lengths: torch.Tensor | None,
        positions: torch.Tensor | None,
    ) -> torch.Tensor:
        """p_t for every query: (batch, query_len)."""
        if self.predictive:
            source_len = (
                lengths.to(query.dtype)[:, None]
                if lengths is not None
                else torch.full_like(query[..., 0], float(key_len))
            )
            return source_len * torch.sigmoid(self.v_p(torch.tanh(self.w_p(query)))).squeeze(-1)
        if positions is None:
            positions = torch.arange(query.shape[-2], device=query.device)
        return positions.to(query.dtype).expand(query.shape[:-1])  # (batch, query_len)

    def forward(
        self, query, key, value, *, mask=None, lengths=None, positions=None, prepared_key=None
    ):
        """
        Args:
            query: (batch, query_len, d_query); key: (batch, key_len, d_key);
            value: (batch, key_len, d_value).
            mask: bool broadcastable to (batch, query_len, key_len).
            lengths: (batch,) true source lengths, S in eq. 9 (local-p).
            positions: (batch, query_len) or (query_len,) query positions (local-m);
                defaults to 0..query_len-1.
            prepared_key: `score.prepare_key(key)` if the caller cached it.
        Returns:
            AttentionOutput(context (batch, query_len, d_value), weights (batch, query_len,
            key_len)).
        """
        from attnzoo.core.attention import AttentionOutput

        key_len = key.shape[-2]
        prepared = self.score.prepare_key(key) if prepared_key is None else prepared_key
        logits = self.score.logits(query, prepared)  # (batch, query_len, key_len)
        p = self.centers(query, key_len, lengths, positions)  # (batch, query_len)
        allowed = window_mask(query.shape[-2], key_len, self.window, centers=p.detach())
        if mask is not None:
            allowed = allowed & mask
        weights = masked_softmax(logits, allowed)
        if self.predictive:
            s = torch.arange(key_len, device=query.device, dtype=query.dtype)
            sigma = self.window / 2
            weights = weights * torch.exp(-((s - p.unsqueeze(-1)) ** 2) / (2 * sigma**2))
        return AttentionOutput(weights @ value, weights)  # (batch, query_len, d_value)
