"""Memory-efficient additive (Bahdanau) attention kernels.

The broadcast form of e_ij = v^T tanh(a_i + b_j), with a = W_a s (projected queries) and
b = U_a h (projected keys), builds a (query_len, key_len, d_hidden) tensor and keeps it for the
backward: 2 GiB at batch 4, length 512, d_hidden 128 in fp32. Here the work is cut into blocks
of whole query rows, each evaluated on one scratch buffer of at most `BLOCK_ELEMENTS` elements
that the call allocates and reuses for its blocks, and the backward recomputes tanh block by
block instead of storing it (as FlashAttention does for dot products).

Two autograd Functions share the block machinery:
- `additive_logits(a, b, v)`: the logits (..., query_len, key_len). Memory O(query_len *
  key_len), for callers that need the weights.
- `additive_attention(a, b, v, value, ...)`: softmax and the weighted sum fused in, saving only
  the context and one log-sum-exp per query: memory O(query_len + key_len) beyond the inputs.
  A block holds whole key rows, so the softmax of a block is exact (no online rescaling).

Both compute in the input dtype, except the fused softmax, which half inputs run in float32
(`_softmax_dtype`); both are checked against the float64 broadcast form in tests.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from attnzoo.core.checks import (
    autocast_dtype,
    broadcast_shape,
    check_flag,
    check_floating,
    check_mask,
    check_same_kind,
    check_tensor,
    check_window,
    fail,
)
from attnzoo.core.masks import (
    clear_unattended,
    combine_masks,
    geometry_mask,
    unreached_clearing,
)
from attnzoo.core.normalisers import (
    all_finite,
    masked_softmax,
    propagate_nonfinite,
    propagate_nonfinite_keys,
)

# Scratch budget per block: 4M elements (16 MiB in fp32). Measured here: blocks of 4-16 MiB
# ran 4.5-6x faster than the broadcast form, which pays page faults on fresh large buffers.
BLOCK_ELEMENTS = 1 << 22


class _Scratch:
    """The scratch buffer of one forward or one backward call, reused by its blocks and freed
    with it. Nothing is kept between calls: a buffer kept per module or per thread is shared
    state that a re-entrant call (a dispatch mode, a hook, a checkpoint recompute running the
    kernel inside another kernel's block) overwrites; a fresh buffer per call measured within
    noise of a per-thread one kept between calls (1 thread, medians of 7 interleaved: batch 2,
    length 512, d_hidden 128, fwd 212 vs 212 ms, fwd+bwd 480 vs 489 ms; length 128, fwd+bwd
    31.5 vs 30.7 ms)."""

    __slots__ = ("buffer",)

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def take(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < numel:
            self.buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
        return self.buffer[:numel]


def _blocks(n: int, i: int, j: int, h: int):
    """Slices (batch block, query block) whose tanh tensor fits in BLOCK_ELEMENTS."""
    rows = max(1, BLOCK_ELEMENTS // max(1, j * h))  # (n, i) rows per block
    query_block = min(i, rows)
    batch_block = max(1, rows // i) if query_block == i else 1
    for n0 in range(0, n, batch_block):
        for i0 in range(0, i, query_block):
            yield slice(n0, n0 + batch_block), slice(i0, i0 + query_block)


# tanh(x) = 2 sigmoid(2 x) - 1, so v^T tanh(a_i + b_j) = (2 v)^T sigmoid(2 a_i + 2 b_j) - sum(v).
# Every kernel below evaluates the sigmoid form (`_doubled`; the key's 2 rides on the broadcast
# add as its alpha): torch's CPU tanh is not vectorised on every build (AVX2 here: 0.19 G
# elements/s against sigmoid's 0.7-1.0), and the (query, key, d_hidden) nonlinearity is the
# kernel's cost. In half precision (and under autocast, whose product is bf16) the product
# (2 v)^T s is near sum(v), and rounding it (2^-9 of sum |v|) swamped a small logit: there the
# logits and dL/dv come from the centred block c = s - 1/2 (exact for s >= 1/4), so that
# (2 v)^T c is the logit itself (`_centred`), while tanh' = 4 s (1 - s) keeps s, which c has
# rounded away where s is small.


def _doubled(a, v):
    """The operands of the sigmoid form besides the key: 2a, 2v and sum(v)."""
    return a + a, v + v, v.sum()


def _centred(s: torch.Tensor) -> bool:
    """Whether the logits of a block of sigmoids s come from s - 1/2: in half precision and
    under autocast (the comment above)."""
    return s.dtype in (torch.bfloat16, torch.float16) or autocast_dtype(s) is not None


def _sigmoid_block(scratch, a2, b, ns, qs):
    """sigmoid(a2_i + 2 b_j) = (1 + tanh(a_i + b_j)) / 2 for one block, on the call's scratch
    buffer. Returns (nb, qb, key_len, d_hidden)."""
    a_blk, b_blk = a2[ns, qs], b[ns]  # (nb, qb, H), (nb, J, H)
    nb, qb, h = a_blk.shape
    j = b_blk.shape[1]
    s = scratch.take(nb * qb * j * h, a2).view(nb, qb, j, h)
    torch.add(a_blk.unsqueeze(2), b_blk.unsqueeze(1), alpha=2, out=s)  # (nb, qb, J, H)
    return s.sigmoid_()


def _centred_copy(s: torch.Tensor) -> torch.Tensor | None:
    """s - 1/2 where `_centred` (s itself kept), else None."""
    return s - 0.5 if _centred(s) else None


def _block_logits(s, v2, shift, *, centred=None):
    """The logits v^T tanh(a_i + b_j) of a `_sigmoid_block` s: where `_centred`,
    (2 v)^T (s - 1/2), from `centred` (`_centred_copy(s)`) when given, else from s itself
    turned into s - 1/2; otherwise (2 v)^T s - sum(v)."""
    if _centred(s):
        return (s.sub_(0.5) if centred is None else centred) @ v2
    return (s @ v2).sub_(shift)


def _sigmoid_backward(s, grad_logits, v, centred=None):
    """Gradients of sum(grad_logits * (t @ v)) with t = tanh(a_i + b_j) = 2 s - 1, one block
    of a `_sigmoid_block` s, and `centred`, its `_centred_copy`.

    Overwrites the scratch block s. Returns (grad_a (nb, qb, H), grad_b (nb, J, H), grad_v (H,)).
    """
    h = s.shape[-1]
    g = grad_logits.reshape(1, -1)
    # dL/dv = sum g t = 2 sum g s - sum g = 2 sum g (s - 1/2), the latter where `_centred`
    if centred is not None:
        grad_v = 2 * (g @ centred.reshape(-1, h)).squeeze(0)
    else:
        grad_v = 2 * (g @ s.reshape(-1, h)).squeeze(0) - grad_logits.sum()
    # d tanh(x) = 1 - t^2 = 4 s (1 - s); s (1 - s) in place, the 4 folded into v
    s.addcmul_(s, s, value=-1).mul_(grad_logits.unsqueeze(-1))  # (nb, qb, J, H)
    v4 = 4 * v
    return s.sum(2) * v4, s.sum(1) * v4, grad_v


def _mask_block(mask, ns, qs, causal, window, i, j, device):
    """The boolean mask of one block (True = may attend), or None when all keys are allowed.
    The block's queries are rows qs.start.. of the problem: the geometry at that offset."""
    block = None
    if mask is not None:
        block = mask[
            ns if mask.shape[0] > 1 else slice(None), qs if mask.shape[1] > 1 else slice(None)
        ]  # (nb|1, qb|1, J)
    if causal or window is not None:
        rows = min(qs.stop, i) - qs.start  # the last block may be short
        geometric = geometry_mask(
            rows, j, causal=causal, window=window, offset=qs.start, device=device
        )  # (qb, J) or None
        block = combine_masks(block, geometric)
    return block


def _accumulate(grad: torch.Tensor, ns: slice, qs: slice, block: torch.Tensor) -> None:
    """grad[ns] += block, where the first query block of a batch block assigns instead: the
    gradient buffers start uninitialised (zero-filling them cost page faults on every call)."""
    if qs.start == 0:
        grad[ns] = block
    else:
        grad[ns] += block


class _AdditiveLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, v):
        n, i, h = a.shape
        j = b.shape[1]
        logits = a.new_empty(n, i, j)
        a2, v2, shift = _doubled(a, v)
        scratch = _Scratch()
        for ns, qs in _blocks(n, i, j, h):
            logits[ns, qs] = _block_logits(_sigmoid_block(scratch, a2, b, ns, qs), v2, shift)
        ctx.save_for_backward(a, b, v)
        return logits

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logits):
        a, b, v = ctx.saved_tensors
        n, i, h = a.shape
        grad_a, grad_b, grad_v = torch.empty_like(a), torch.empty_like(b), torch.zeros_like(v)
        a2 = a + a
        scratch = _Scratch()
        for ns, qs in _blocks(n, i, b.shape[1], h):
            s = _sigmoid_block(scratch, a2, b, ns, qs)
            ga, gb, gv = _sigmoid_backward(s, grad_logits[ns, qs], v, _centred_copy(s))
            grad_a[ns, qs] = ga
            _accumulate(grad_b, ns, qs, gb)
            grad_v += gv
        return grad_a, grad_b, grad_v


class _AdditiveAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, v, value, mask, causal, window):
        n, i, h = a.shape
        j = b.shape[1]
        acc = _softmax_dtype(a)
        lowest = torch.finfo(acc).min
        context = value.new_empty(n, i, value.shape[-1])
        lse = a.new_empty(n, i, dtype=acc)
        a2, v2, shift = _doubled(a, v)
        scratch = _Scratch()
        for ns, qs in _blocks(n, i, j, h):
            logits = _block_logits(_sigmoid_block(scratch, a2, b, ns, qs), v2, shift).to(acc)
            allowed = _mask_block(mask, ns, qs, causal, window, i, j, a.device)
            if allowed is not None:
                logits.masked_fill_(~allowed, lowest)
            block_lse = torch.logsumexp(logits, dim=-1)  # (nb, qb)
            weights = logits.sub_(block_lse.unsqueeze(-1)).exp_()  # (nb, qb, J)
            if allowed is not None:
                weights.masked_fill_(~allowed, 0.0)  # fully masked rows -> zero weights
            context[ns, qs] = weights.to(value.dtype) @ value[ns]  # (nb, qb, Dv)
            lse[ns, qs] = block_lse
        ctx.save_for_backward(a, b, v, value, mask, context, lse)
        ctx.causal, ctx.window = causal, window
        return context

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_context):
        a, b, v, value, mask, context, lse = ctx.saved_tensors
        n, i, h = a.shape
        j = b.shape[1]
        acc = lse.dtype  # the softmax's (`_softmax_dtype`)
        lowest = torch.finfo(acc).min
        grad_a, grad_b, grad_v = torch.empty_like(a), torch.empty_like(b), torch.zeros_like(v)
        grad_value = torch.empty_like(value)
        delta = (grad_context.to(acc) * context.to(acc)).sum(-1, keepdim=True)  # (N, I, 1)
        a2, v2, shift = _doubled(a, v)
        scratch = _Scratch()
        for ns, qs in _blocks(n, i, j, h):
            s = _sigmoid_block(scratch, a2, b, ns, qs)
            centred = _centred_copy(s)  # for the logits and dL/dv (tanh' keeps s)
            logits = _block_logits(s, v2, shift, centred=centred).to(acc)  # (nb, qb, J)
            allowed = _mask_block(mask, ns, qs, ctx.causal, ctx.window, i, j, a.device)
            if allowed is not None:
                logits.masked_fill_(~allowed, lowest)
            weights = logits.sub_(lse[ns, qs].unsqueeze(-1)).exp_()  # (nb, qb, J)
            if allowed is not None:
                weights.masked_fill_(~allowed, 0.0)
            g = grad_context[ns, qs]  # (nb, qb, Dv)
            _accumulate(grad_value, ns, qs, weights.to(g.dtype).transpose(1, 2) @ g)  # (nb, J, Dv)
            # softmax backward: dlogits = w * (dw - sum_j w dw), and sum_j w dw = dO . O
            grad_logits = weights.mul_((g @ value[ns].transpose(1, 2)).to(acc) - delta[ns, qs])
            ga, gb, gv = _sigmoid_backward(s, grad_logits.to(a.dtype), v, centred)
            grad_a[ns, qs] = ga
            _accumulate(grad_b, ns, qs, gb)
            grad_v += gv
        return grad_a, grad_b, grad_v, grad_value, None, None, None


def _softmax_dtype(a: torch.Tensor) -> torch.dtype:
    """The dtype of the fused kernel's softmax and log-sum-exp: float32 for half inputs (a
    bf16 log-sum-exp near 8 rounds by 0.06, scaling a whole row of weights by exp(0.03)),
    else the input's."""
    return torch.float32 if a.dtype in (torch.bfloat16, torch.float16) else a.dtype


def _flatten(tensor: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """(..., r, c) broadcast to `lead` and flattened to (N, r, c)."""
    return tensor.expand(*lead, *tensor.shape[-2:]).reshape(-1, *tensor.shape[-2:])


def additive_logits(query: torch.Tensor, key: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """e_ij = v^T tanh(query_i + key_j) for projected queries and keys.

    Args:
        query: (batch, [heads,] query_len, d_hidden), already projected (W_a s).
        key: (batch, [heads,] key_len, d_hidden), already projected (U_a h).
        v: (d_hidden,).
    Returns:
        logits (batch, [heads,] query_len, key_len).
    """
    _check_inputs("additive_logits", query, key, v)
    logits = _additive_logits(query, key, v)
    if all_finite(query, key, v):  # on the CPU one read each; else the probes, unread
        return logits
    # tanh saturates: an infinite query, key or v gave finite logits (`_nonfinite_rows`)
    logits = propagate_nonfinite_keys(logits, key, read=False)
    return propagate_nonfinite(logits, _nonfinite_rows(query, v), read=False)


def _nonfinite_rows(query: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The projected queries, non-finite everywhere if v is: what a probe reads so that a
    tanh never hides garbage (`normalisers.propagate_nonfinite`)."""
    return query + 0 * v.detach()


def _check_inputs(name, query, key, v, value=None) -> tuple[int, ...]:
    """The checks of the public kernels' tensors, each error naming its argument; returns the
    broadcast leading dims. `attention()` checks its own inputs and calls the kernels unchecked
    (`_additive_logits`, `_additive_attention`)."""
    ranks = (3, 4)
    check_tensor(name, "query", query, ranks)
    check_floating(name, "query", query)
    check_tensor(name, "key", key, ranks)
    check_tensor(name, "v", v, (1,))
    others = {"key": key, "v": v}
    if value is not None:
        check_tensor(name, "value", value, ranks)
        others["value"] = value
    check_same_kind(name, "query", query, others)
    d = query.shape[-1]
    if key.shape[-1] != d:
        fail(name, "key", f"last dimension d_hidden = {d} (that of 'query')", key.shape[-1])
    if v.shape[0] != d:
        fail(name, "v", f"shape ({d},) (d_hidden of 'query')", tuple(v.shape))
    shapes = [query.shape[:-2], key.shape[:-2]]
    if value is not None:
        if value.shape[-2] != key.shape[-2]:
            fail(name, "value", f"key_len = {key.shape[-2]} positions", value.shape[-2])
        shapes.append(value.shape[:-2])
    lead = broadcast_shape(*shapes)
    if lead is None:
        expected = f"leading dims compatible with query {tuple(query.shape[:-2])}"
        fail(name, "key/value", expected, [tuple(s) for s in shapes[1:]])
    return lead


def _additive_logits(query, key, v):
    lead = broadcast_shape(query.shape[:-2], key.shape[:-2])
    if _fits_one_block(lead, query, key):
        return _broadcast_logits(query, key, v)
    query, key, v = _in_autocast_dtype(query, key, v)
    logits = _AdditiveLogits.apply(_flatten(query, lead), _flatten(key, lead), v)
    return logits.view(*lead, query.shape[-2], key.shape[-2])


def _in_autocast_dtype(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Under autocast, the blockwise kernels' operands in autocast's dtype, in which the
    one-block path's products run: a Function's backward runs outside autocast, where a bf16
    block times the float32 v was an error, and the fused kernel's context came out float32
    where the one-block path gives bf16. Casts are recorded, so gradients reach the float32
    parameters. Without autocast, as given."""
    dtype = autocast_dtype(tensors[0])
    if dtype is None:
        return tensors
    # float32 only, as autocast casts: float64 stays float64
    return tuple(t.to(dtype) if t.dtype is torch.float32 else t for t in tensors)


def _fits_one_block(lead, query, key) -> bool:
    """A problem whose whole tanh tensor fits in one block gains nothing from recomputation:
    plain autograd keeps exactly one block, and skips the recompute (an RNN decoder's single
    query per step lands here)."""
    return math.prod(lead) * query.shape[-2] * key.shape[-2] * query.shape[-1] <= BLOCK_ELEMENTS


def _broadcast_logits(query, key, v):
    a2, v2, shift = _doubled(query, v)
    s = torch.sigmoid(torch.add(a2.unsqueeze(-2), key.unsqueeze(-3), alpha=2))  # (..., i, j, H)
    # centred out of place: sigmoid's backward reads its output
    return _block_logits(s, v2, shift, centred=_centred_copy(s))


def additive_attention(
    query, key, v, value, mask=None, causal=False, window=None, *, cleared=False
):
    """softmax_j(v^T tanh(query_i + key_j)) @ value, fused, without storing weights.

    Args:
        query: (batch, [heads,] query_len, d_hidden), projected.
        key: (batch, [heads,] key_len, d_hidden), projected.
        v: (d_hidden,).
        value: (batch, [heads,] key_len, d_value).
        mask: bool, (batch, [heads,] query_len, key_len), each dim 1 or that size (the
            weights' rank, as in `attnzoo.attention`); True = may attend.
        causal, window: as in `attnzoo.attention`.
        cleared: key and value are already cleared under `mask` (`prepare_key(..., mask=)`).
    Returns:
        context (batch, [heads,] query_len, d_value); a query with no allowed key gets zeros.
        Keys and values at positions the mask excludes for every query are not read (set to
        0 by selection first): NaN or Inf in padding never reaches the context or a gradient.
    """
    lead = _check_inputs("additive_attention", query, key, v, value)
    weights = (*lead, query.shape[-2], key.shape[-2])
    check_mask("additive_attention", mask, weights, query.device, full_rank=True)
    check_window("additive_attention", window)
    if causal.__class__ is not bool:
        check_flag("additive_attention", "causal", causal)
    if causal or window is not None:
        i, j = query.shape[-2], key.shape[-2]
        clearing = unreached_clearing(mask, i, j, causal=causal, window=window, device=query.device)
        if clearing is not None:  # keys no query reaches: cleared as padding is
            key, value = clear_unattended(clearing, key, value)
            cleared = True
    clean = all_finite(query, key, v)  # as `Additive.fused` probes them (tanh saturates)
    if not clean:  # a non-finite key row makes its value row so (padding's is cleared)
        value = propagate_nonfinite(value, key, read=False)
    context = _additive_attention(query, key, v, value, mask, causal, window, cleared)
    if clean:
        return context
    return propagate_nonfinite(context, _nonfinite_rows(query, v), read=False)


def _additive_attention(query, key, v, value, mask, causal, window, cleared):
    if mask is not None and not cleared:
        key, value = clear_unattended(mask, key, value)
    lead = broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    i, j = query.shape[-2], key.shape[-2]
    if _fits_one_block(lead, query, key):
        geometric = None
        if causal or window is not None:
            geometric = geometry_mask(i, j, causal=causal, window=window, device=query.device)
        allowed = combine_masks(mask, geometric)
        return masked_softmax(_broadcast_logits(query, key, v), allowed) @ value
    mask3 = None
    if mask is not None:
        while mask.dim() < len(lead) + 2:
            mask = mask.unsqueeze(0)
        rows = i if mask.shape[-2] != 1 else 1
        mask3 = mask.expand(*lead, rows, j).reshape(-1, rows, j)  # (N, I|1, J)
    query, key, v, value = _in_autocast_dtype(query, key, v, value)
    context = _AdditiveAttention.apply(
        _flatten(query, lead), _flatten(key, lead), v, _flatten(value, lead), mask3, causal, window
    )
    return context.view(*lead, i, value.shape[-1])
