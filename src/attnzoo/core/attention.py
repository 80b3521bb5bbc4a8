"""`attention()`: one entry point for every score, mask, window and normaliser path.

    context_i = sum_j softmax_j(score(q_i, k_j) | mask) v_j

Paths, chosen per call, all tested equal to a float64 reference:
1. dot-family scores -> `scaled_dot_product_attention` (4-D, with `is_causal` when causality
   is the only mask: PERF.md measured a causal bool mask 1.5-2.2x slower); requested weights
   are computed beside it;
2. additive without weights and without dropout -> the fused blockwise kernel
   (`attnzoo.core.additive`), memory O(length);
3. otherwise the plain form: logits, masked softmax, dropout, weights @ value.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo.core.additive import additive_attention
from attnzoo.core.checks import (
    broadcast_shape,
    check_dropout,
    check_mask,
    check_same_kind,
    check_tensor,
    check_window,
    fail,
)
from attnzoo.core.masks import causal_mask, combine_masks, window_mask
from attnzoo.core.normalisers import masked_softmax
from attnzoo.core.scores import Additive, DotFamily, Score, resolve_score


class AttentionOutput(NamedTuple):
    """context: (batch, [heads,] query_len, d_value); weights: (batch, [heads,] query_len,
    key_len), rows summing to 1 (0 for a query with no allowed key), or None when not
    requested."""

    context: torch.Tensor
    weights: torch.Tensor | None


class PreparedKey(NamedTuple):
    """Keys after `score.prepare_key`, to reuse across decoding steps (e.g. U_a h for additive
    attention is computed once per source sentence)."""

    tensor: torch.Tensor
    score: Score


def prepare_key(score: Score | str, key: torch.Tensor) -> PreparedKey:
    score = resolve_score(score)
    return PreparedKey(score.prepare_key(key), score)


def attention(
    query: torch.Tensor,
    key: torch.Tensor | PreparedKey,
    value: torch.Tensor,
    *,
    score: Score | str,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    dropout: float = 0.0,
    return_weights: bool = False,
) -> AttentionOutput:
    """Attend from queries to keys and sum the values.

    Args:
        query: (batch, [heads,] query_len, d_query).
        key: (batch, [heads,] key_len, d_key), or a `PreparedKey` made with the same score.
        value: (batch, [heads,] key_len, d_value).
        score: a score module (`attnzoo.scores`) or "dot", "scaled_dot", "cosine".
        mask: bool, broadcastable to (batch, [heads,] query_len, key_len); True = may attend.
        causal: query i attends to keys j <= i (diagonal at the top left when
            query_len != key_len, like PyTorch's `is_causal`).
        window: keep keys with |j - i| <= window (Luong's local-m).
        dropout: probability of zeroing a weight (applied to the context only; the returned
            weights are before dropout). Pass 0 at evaluation.
        return_weights: also return the weights (costs O(query_len * key_len) memory).
    Returns:
        AttentionOutput(context, weights or None).
    """
    score = resolve_score(score)
    check_tensor("attention", "query", query, (3, 4))
    check_tensor("attention", "value", value, (3, 4))
    prepared = _prepared(score, key)
    _validate(query, prepared, value, mask, dropout, window)
    return _attend(query, prepared, value, score, mask, causal, window, dropout, return_weights)


def _attend(query, prepared, value, score, mask, causal, window, dropout, return_weights):
    """`attention()` after its checks, on a prepared key; callers that built query, key and
    value themselves (MultiHeadAttention) and checked the rest call it directly, which saves
    ~20% of a batch-1 decoding step."""
    i, j = query.shape[-2], value.shape[-2]

    if isinstance(score, Additive) and not return_weights and dropout == 0.0:
        context = additive_attention(
            score.prepare_query(query),
            prepared,
            score.v,
            value,
            mask=mask,
            causal=causal,
            window=window,
        )
        return AttentionOutput(context, None)

    geometric = combine_masks(
        causal_mask(i, j, device=query.device) if causal else None,
        window_mask(i, j, window, device=query.device) if window is not None else None,
    )

    full = combine_masks(mask, geometric)
    if isinstance(score, DotFamily):
        q, k, scale = score.as_dot(query, prepared)
        context = _sdpa(
            q, k, value, full, causal and mask is None and window is None, dropout, scale
        )
        # Weights, when asked for, come from their own small graph: the context keeps the
        # flash kernel's forward and backward (measured 2.5-3.8x faster than the plain form),
        # and the weights' backward runs only if a loss uses them.
        weights = (
            masked_softmax((q * scale) @ k.transpose(-2, -1), full) if return_weights else None
        )
        return AttentionOutput(context, weights)

    weights = masked_softmax(score.logits(query, prepared), full)
    kept = F.dropout(weights, dropout) if dropout > 0 else weights
    return AttentionOutput(kept @ value, weights if return_weights else None)


_HALF = (torch.bfloat16, torch.float16)
_MATH_MAX_KEYS = 128


def _sdpa(q, k, value, full, only_causal, dropout, scale):
    """scaled_dot_product_attention on 4-D tensors (its fast CPU kernel wants
    (batch, heads, len, d); 3-D inputs fell to a path 2x slower), with `is_causal` when
    causality is the only mask (a bool causal mask cost 1.5-2.2x)."""
    full = None if only_causal else full
    squeeze = q.dim() == 3
    if squeeze:
        q, k, value = q.unsqueeze(1), k.unsqueeze(1), value.unsqueeze(1)  # (b, 1, len, d)
        if full is not None and full.dim() == 3:
            full = full.unsqueeze(1)  # (b, 1, i, j)
    args = dict(attn_mask=full, dropout_p=dropout, is_causal=only_causal, scale=scale)
    if q.device.type == "cpu" and q.dtype in _HALF and k.shape[-2] <= _MATH_MAX_KEYS:
        # In bf16/fp16 on CPU the flash kernel's backward is slow on short keys: the math
        # path measured 2-3x faster at key_len 64-128 (fwd+bwd), slower from 256 on.
        with sdpa_kernel(SDPBackend.MATH):
            context = F.scaled_dot_product_attention(q, k, value, **args)
    else:
        context = F.scaled_dot_product_attention(q, k, value, **args)
    return context.squeeze(1) if squeeze else context


def _prepared(score: Score, key) -> torch.Tensor:
    if isinstance(key, PreparedKey):
        if key.score is not score:
            fail(
                "attention",
                "key",
                "a PreparedKey made with the same score module",
                f"one made with {type(key.score).__name__} (a different instance)",
            )
        return key.tensor
    check_tensor("attention", "key", key, (3, 4))
    return score.prepare_key(key)


def _validate(query, key, value, mask, dropout, window) -> None:
    check_same_kind("attention", "query", query, {"key": key, "value": value})
    if not (query.dim() == key.dim() == value.dim()):
        fail(
            "attention",
            "key/value",
            f"the rank of 'query' ({query.dim()})",
            f"key rank {key.dim()}, value rank {value.dim()}",
        )
    if key.shape[-2] != value.shape[-2]:
        fail("attention", "value", f"key_len = {key.shape[-2]} positions", value.shape[-2])
    lead = broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if lead is None:
        fail(
            "attention",
            "key",
            f"leading dims compatible with query {tuple(query.shape[:-2])}",
            tuple(key.shape[:-2]),
        )
    check_mask("attention", mask, (*lead, query.shape[-2], key.shape[-2]), query.device)
    check_dropout("attention", dropout)
    check_window("attention", window)
