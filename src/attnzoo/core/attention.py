"""`attention()`: one entry point for every score, mask, window and normaliser path.

    context_i = sum_j softmax_j(score(q_i, k_j) | mask) v_j

Paths, chosen per call, all tested equal to a float64 reference:
1. a score with a kernel of its own runs it (`Score.fused`): dot-family scores on
   `scaled_dot_product_attention` (requested weights computed beside it), additive without
   weights and without dropout on the fused blockwise kernel (`attnzoo.core.additive`), memory
   O(length);
2. otherwise the plain form: logits, masked softmax, dropout, weights @ value.

Non-finite values (DESIGN.md: nothing silently wrong), by construction, with no value read:
- a NaN or Inf in an attended position (a query, a key or value some query may attend, a
  score's parameter) makes the outputs that depend on it non-finite, context and weights
  alike; it is never turned into a number. Every path adds 0 * sum(query) to its output rows,
  0 * sum(key) to the logits' columns (or, in a fused kernel, to the value rows) and, for the
  additive score, probes the projections and v, whose tanh would hide garbage
  (`normalisers.propagate_nonfinite`; on the CPU one read of each sum skips it all when the
  inputs are finite). A non-finite query row is non-finite also when it has no allowed key;
  a finite one with no allowed key gets zeros;
- a key or value position that the mask excludes for every query (padding), that no
  query reaches under causal or window when there are fewer queries than keys
  (`masks.reached_keys`), or that a per-query mask and causal or window leave to no query
  together (`masks.unreached_clearing`), is set to 0 by selection before use on every path,
  before the score reads the keys (`masks.clear_unattended`), so what it holds never reaches
  an output or a gradient (keys given prepared were read by `prepare_key` already);
- a position excluded for some queries only (causal, window, a per-query mask) is attended
  input: its key never reaches an excluded query's logits on the plain paths (filled, not
  added), but a non-finite value there can reach an excluded query of the same row through
  the weighted sum (0 * NaN) and make it NaN: never a wrong finite number.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.core.checks import (
    broadcast_shape,
    check_dropout,
    check_flag,
    check_floating,
    check_mask,
    check_same_kind,
    check_tensor,
    check_window,
    fail,
    one_dtype_under_autocast,
)
from attnzoo.core.masks import (
    attended_keys,
    clear_unattended,
    combine_masks,
    geometry_mask,
    same_mask,
    unreached_clearing,
)
from attnzoo.core.normalisers import (
    masked_softmax,
    propagate_nonfinite,
    propagate_nonfinite_keys,
)
from attnzoo.core.scores import Score, resolve_score
from attnzoo.core.types import AttentionOutput, PreparedKey, mask_version

__all__ = ["AttentionOutput", "PreparedKey", "attention", "prepare_key"]


def prepare_key(
    score: Score | str,
    key: torch.Tensor,
    *,
    value: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> PreparedKey:
    """`score.prepare_key(key)`, kept for every step that attends to the same keys.

    With `value` and the padding `mask` the steps will pass, the keys and values are also
    cleared under the mask once here (`masks.clear_unattended`): `attention(query, prepared,
    prepared.value, mask=prepared.mask)` then skips that work at every step. The keys it
    cleared (those no query of `mask` attends) hold zeros from then on, so they stay excluded
    whatever mask a call passes: a call with another mask, or none, gives what the raw keys
    give under that mask and the padding. `PreparedKey.mask` is a copy of `mask`, and the
    keys it cleared are recorded apart (`PreparedKey.attended`): a later change in place of
    `mask` or of that copy leaves the record, hence the padding, as it was.

    Without `mask` the keys are projected as given: a later call's mask keeps their padding
    out of every output, but a score with a key projection (additive, general) then reads
    that padding in its weight's gradient (0 * NaN), so padding that may hold garbage needs
    the mask here.
    """
    score = resolve_score(score)
    _check_prepare_inputs(key, value, mask)
    if mask is None:
        return PreparedKey(score.prepare_key(key), score, value)
    key, value = clear_unattended(mask, key, value)  # before the score's projection
    # a copy: the caller's mask changed in place would otherwise un-exclude the keys cleared
    # here (they hold zeros, attended as zero keys: a context changed without a word)
    mask = mask.clone()
    attended = attended_keys(mask).transpose(-2, -1).clone()  # (..., 1, key_len)
    return PreparedKey(score.prepare_key(key), score, value, mask, mask_version(mask), attended)


def _check_prepare_inputs(key, value, mask) -> None:
    """`prepare_key`'s key, value and mask, checked as `attention()` checks them; the query
    length is not known yet, so a mask's query dim may be any."""
    name = "prepare_key"
    check_tensor(name, "key", key, _RANKS)
    check_floating(name, "key", key)
    if value is None:
        if mask is not None:
            fail(name, "value", "the values to clear with the mask", None)
        return
    check_tensor(name, "value", value, _RANKS)
    check_same_kind(name, "key", key, {"value": value})
    if value.dim() != key.dim():
        fail(name, "value", f"the rank of 'key' ({key.dim()})", value.dim())
    if value.shape[-2] != key.shape[-2]:
        fail(name, "value", f"key_len = {key.shape[-2]} positions", value.shape[-2])
    lead = broadcast_shape(key.shape[:-2], value.shape[:-2])
    if lead is None:
        expected = f"leading dims compatible with key {tuple(key.shape[:-2])}"
        fail(name, "value", expected, tuple(value.shape[:-2]))
    if mask is not None:
        rows = mask.shape[-2] if isinstance(mask, torch.Tensor) and mask.dim() > 1 else 1
        check_mask(name, mask, (*lead, rows, key.shape[-2]), key.device, full_rank=True)


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
        mask: bool, (batch, [heads,] query_len, key_len), each dim 1 or that size (e.g.
            (batch, [1,] 1, key_len) for padding: the weights' rank, so that a batch dim is
            never read as another), or (key_len,); True = may attend.
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
    cleared, padding = False, None
    if isinstance(key, PreparedKey):
        _check_prepared(key, score)
        same = mask is not None and same_mask(mask, (key.mask, key.mask_version))
        # cleared once by prepare_key under this very mask, unchanged since, for these values:
        # not again (geometry may leave other keys unattended, so only without it)
        cleared = same and key.value is value and not causal and window is None
        if key.attended is not None and not same:
            padding = key.attended  # its cleared keys hold zeros: they stay excluded (below)
        key, prepared = key.tensor, True
    else:
        prepared = False
    common = _common_case(query, key, value)
    if not common:  # the full checks: an error on a real problem, else broadcasting leads
        query, key, value = one_dtype_under_autocast(query, key, value)
        _check_inputs(query, key, value)
    if mask is not None:
        lead = (
            query.shape[:-2]
            if common
            else broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        )
        weights = (*lead, query.shape[-2], key.shape[-2])
        check_mask("attention", mask, weights, query.device, full_rank=True)
    if padding is not None:  # (..., 1, key_len): the keys its mask let some query attend
        mask = combine_masks(mask, padding)
    if dropout.__class__ is not float or not 0.0 <= dropout < 1.0:
        check_dropout("attention", dropout)  # (an int 0 passes it)
    if causal.__class__ is not bool:
        check_flag("attention", "causal", causal)
    if return_weights.__class__ is not bool:
        check_flag("attention", "return_weights", return_weights)
    if window is not None:
        check_window("attention", window)
    clearing = mask  # the keys some query attends (under causal or window, those it reaches)
    if causal or window is not None:
        i, j = query.shape[-2], value.shape[-2]
        clearing = unreached_clearing(mask, i, j, causal=causal, window=window, device=query.device)
    if not prepared:
        if clearing is not None:
            # cleared before the score reads the keys (U_a k, a cosine's norm), whose
            # gradient would otherwise read the padding (0 * NaN); once here for every path
            key, value = clear_unattended(clearing, key, value)
            cleared = True
        key = score.prepare_key(key)
    elif clearing is not mask:  # the prepared keys no query reaches (not cleared by the kernels)
        key, value = clear_unattended(clearing, key, value)
    return _attend(query, key, value, score, mask, causal, window, dropout, return_weights, cleared)


def _attend(
    query, prepared, value, score, mask, causal, window, dropout, return_weights, cleared=False
):
    """`attention()` after its checks, on a prepared key: the score's own kernel
    (`Score.fused`) or else the plain path. Callers that built query, key and value themselves
    (MultiHeadAttention) and checked the rest call it directly, which saves ~20% of a batch-1
    decoding step."""
    out = score.fused(
        query,
        prepared,
        value,
        mask=mask,
        causal=causal,
        window=window,
        dropout=dropout,
        return_weights=return_weights,
        cleared=cleared,
    )
    if out is not None:
        return out
    return _plain(
        query, prepared, value, score, mask, causal, window, dropout, return_weights, cleared
    )


def _plain(query, prepared, value, score, mask, causal, window, dropout, return_weights, cleared):
    """Logits, masked softmax, dropout, weights @ value: every score without a kernel."""
    if causal or window is not None:
        i, j = query.shape[-2], value.shape[-2]
        geometric = geometry_mask(i, j, causal=causal, window=window, device=query.device)
        mask = combine_masks(mask, geometric)
    if mask is not None and not cleared:
        prepared, value = clear_unattended(mask, prepared, value)
    logits = propagate_nonfinite_keys(score.logits(query, prepared), prepared)  # (b, [h,] i, j)
    weights = masked_softmax(logits, mask)
    weights = propagate_nonfinite(weights, query)
    kept = F.dropout(weights, dropout) if dropout > 0 else weights
    return AttentionOutput(kept @ value, weights if return_weights else None)  # (b, [h,] i, d)


def _check_prepared(key: PreparedKey, score: Score) -> None:
    if key.score is not score:
        fail(
            "attention",
            "key",
            "a PreparedKey made with the same score module",
            f"one made with {type(key.score).__name__} (a different instance)",
        )


_RANKS = (3, 4)


def _common_case(query, key, value) -> bool:
    """Three floating tensors of rank 3 or 4 with one dtype, one device, the same leading
    dims and key_len: decided in a few attribute reads (this runs at every decoding step), so that
    only other inputs pay for the full checks."""
    if not (
        isinstance(query, torch.Tensor)
        and isinstance(key, torch.Tensor)
        and isinstance(value, torch.Tensor)
    ):
        return False
    qs, ks, vs = query.shape, key.shape, value.shape  # indexed, not sliced: slices cost more
    rank = len(qs)
    if rank == 3:
        same_shapes = len(ks) == len(vs) == 3 and qs[0] == ks[0] == vs[0] and ks[1] == vs[1]
    elif rank == 4:
        same_shapes = (
            len(ks) == len(vs) == 4
            and qs[0] == ks[0] == vs[0]
            and qs[1] == ks[1] == vs[1]
            and ks[2] == vs[2]
        )
    else:
        return False
    if not (same_shapes and key.dtype is query.dtype and value.dtype is query.dtype):
        return False  # (dtypes are singletons)
    if not query.is_floating_point():
        return False
    if query.is_cpu:  # a flag: reading .device builds an object
        return key.is_cpu and value.is_cpu
    device = query.device
    return key.device == device and value.device == device


def _check_inputs(query, key, value) -> None:
    """The full checks of query, key and value, each error naming its argument."""
    check_tensor("attention", "query", query, _RANKS)
    check_tensor("attention", "key", key, _RANKS)
    check_tensor("attention", "value", value, _RANKS)
    check_floating("attention", "query", query)
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
    if broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2]) is None:
        fail(
            "attention",
            "key",
            f"leading dims compatible with query {tuple(query.shape[:-2])}",
            tuple(key.shape[:-2]),
        )
