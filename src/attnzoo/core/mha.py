"""Multi-head attention (Vaswani 2017, sec. 3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

over any score. Self- vs cross-attention is a call pattern: `mha(x)` or `mha(x, memory)`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.attention import _attend
from attnzoo.core.checks import (
    check_dropout,
    check_flag,
    check_like_parameter,
    check_mask,
    check_size,
    check_tensor,
    check_window,
    fail,
)
from attnzoo.core.masks import (
    attended_keys,
    clear_unattended,
    combine_masks,
    geometry_mask,
    reached_keys,
    same_mask,
    unreached_clearing,
)
from attnzoo.core.scores import Score, make_score, resolve_score
from attnzoo.core.types import AttentionOutput, mask_version


class CacheError(ValueError):
    """A `KVCache` used where it does not belong: by another module, for the other kind of
    attention (self vs cross), or with another batch, head count, d_head, dtype or device."""


@dataclass
class KVCache:
    """Projected keys and values of earlier calls, for incremental decoding.

    Self-attention appends the new positions at every call; cross-attention (`static=True`
    after the first call) projects the memory once and reuses it.
    key, value: (batch, heads, cached_len, d_head).

    A cache belongs to what filled it: the `MultiHeadAttention` (`owner`, a weak reference),
    self- or cross-attention (`static`), and the batch, heads and d_head of `key`'s shape.
    Any other use raises `CacheError`, from plain Python ints (no value is read). A cache
    built by hand with tensors (no owner yet) is adopted by the first module that uses it,
    after the same shape checks.

    Without autograd (decoding), self-attention writes the new positions into buffers of
    spare capacity (doubled when full) and `key`, `value` are views of their first
    `length` positions: appending costs O(new positions), where a concatenation copies the
    whole cache at every step (at batch 32 it was ~1/8 of a Transformer decoding step). A
    buffer is written only past the end of the view it last gave out, so an earlier view,
    or a copy of the cache that another step extended, never changes (the copy gets a buffer
    of its own on its next call).
    """

    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    static: bool = False
    owner: weakref.ref | None = field(default=None, repr=False, compare=False)
    _tape: _Tape | None = field(default=None, repr=False, compare=False)
    # cross-attention: (mask, its version, the keys it let some query attend (b, 1, j), read
    # then: a later change of `mask` in place leaves them) the memory was cleared under
    _cleared_under: tuple[torch.Tensor, int | None, torch.Tensor] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[-2]

    def reorder(
        self, index: torch.Tensor, *, masks: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """Keep batch rows `index` (beam search reordering hypotheses): a 1-D integer tensor
        on the cache's device with values in [0, batch); it may repeat rows or change the
        batch size (the next call must then bring that batch).

        masks: `(mask, kept)` for a cross-attention cache, where `mask` is the padding mask
            its memory was cleared under and `kept` the caller's `mask.index_select(0, index)`,
            the mask its next calls pass: rows kept from rows cleared under `mask` are cleared
            under `kept`, so those calls skip clearing them again (at beam search's every step
            otherwise). Ignored unless the cache was cleared under that very `mask`, unchanged
            since; a `kept` changed in place later is cleared under again. Without it (or
            ignored), the rows' padding stays excluded all the same, and is applied again at
            each later call.
        """
        if self.key is None:
            return
        batch = self.key.shape[0]
        if (
            not isinstance(index, torch.Tensor)
            or index.dim() != 1
            or index.is_floating_point()
            or index.is_complex()
            or index.dtype == torch.bool
        ):
            got = (
                f"{index.dtype} of shape {tuple(index.shape)}"
                if isinstance(index, torch.Tensor)
                else type(index).__name__
            )
            fail("KVCache.reorder", "index", "a 1-D integer tensor (new_batch,)", got, CacheError)
        if index.device != self.key.device:
            fail("KVCache.reorder", "index", f"device {self.key.device}", index.device, CacheError)
        tape = self._writable_tape()
        try:  # an index out of range is found by the kernel, not by reading values here
            if tape is None:
                key, value = self.key.index_select(0, index), self.value.index_select(0, index)
            else:  # the rows of the whole buffers, spare capacity included: a tape again
                tape = _Tape(
                    tape.key_buffer.index_select(0, index),
                    tape.value_buffer.index_select(0, index),
                    self.key.shape[-2],
                )
                key, value = tape.key, tape.value
        except (IndexError, RuntimeError) as error:
            fail(
                "KVCache.reorder",
                "index",
                f"batch rows in [0, {batch})",
                f"an index out of range ({error})".splitlines()[0],
                CacheError,
            )
        cleared = None
        if masks is not None and same_mask(masks[0], self._cleared_under):
            mask, kept = masks
            if not isinstance(kept, torch.Tensor) or kept.shape != (len(index), *mask.shape[1:]):
                expected = f"the rows index of the mask, shape {(len(index), *mask.shape[1:])}"
                got = tuple(kept.shape) if isinstance(kept, torch.Tensor) else type(kept).__name__
                fail("KVCache.reorder", "masks", expected, got, CacheError)
            cleared = _cleared_record(kept)
        elif self._cleared_under is not None:  # its padding rows hold no memory: still out
            attended = self._cleared_under[2]  # (b | 1, 1, j)
            if attended.shape[0] != 1:  # a batch dim, not a broadcast one
                attended = attended.index_select(0, index)  # (new_batch, 1, j)
            cleared = (attended, None, attended)  # a mask no call passes: never "the same"
        self.key, self.value, self._tape, self._cleared_under = key, value, tape, cleared

    def _writable_tape(self) -> _Tape | None:
        """The buffers behind `key` and `value` where new positions may be written in place:
        the views they gave out last are this cache's (not a reordered, replaced or
        left-behind copy's), and a buffer made under torch.inference_mode is written only
        there."""
        tape = self._tape
        if (
            tape is None
            or tape.key is not self.key
            or tape.value is not self.value
            or (tape.key_buffer.is_inference() and not torch.is_inference_mode_enabled())
        ):
            return None
        return tape

    def _append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """Extend the cache by `key`, `value` (batch, heads, new_len, d_head), checked by
        `MultiHeadAttention._check_cache` to match it."""
        if self.key is None:
            self.key, self.value, self._tape = key, value, None
            return
        if torch.is_grad_enabled() and (key.requires_grad or self.key.requires_grad):
            # a write into a buffer that an earlier step's graph saved would fail its backward
            self.key = torch.cat([self.key, key], dim=-2)  # (b, h, past + t, d_head)
            self.value = torch.cat([self.value, value], dim=-2)
            self._tape = None
            return
        end = self.key.shape[-2] + key.shape[-2]
        tape = self._writable_tape()
        if (
            tape is None
            or end > tape.key_buffer.shape[-2]
            or key.dtype != self.key.dtype  # (autocast: concatenation would promote)
            or value.dtype != self.value.dtype
        ):
            tape = _Tape.holding(self.key, self.value, capacity=max(2 * end, 16))
        self._tape = tape.extend(key, value)
        self.key, self.value = tape.key, tape.value


class _Tape:
    """The buffers behind a self-attention `KVCache`, (batch, heads, capacity, d_head) each,
    and the views of their first `length` positions last handed out (`key`, `value`)."""

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int):
        self.key_buffer, self.value_buffer = key_buffer, value_buffer
        self.key, self.value = key_buffer[..., :length, :], value_buffer[..., :length, :]

    @classmethod
    def holding(cls, key: torch.Tensor, value: torch.Tensor, capacity: int) -> _Tape:
        """New buffers of `capacity` positions starting with `key` and `value`."""
        key_buffer = key.new_empty(*key.shape[:-2], capacity, key.shape[-1])
        value_buffer = value.new_empty(*value.shape[:-2], capacity, value.shape[-1])
        past = key.shape[-2]
        key_buffer[..., :past, :].copy_(key)
        value_buffer[..., :past, :].copy_(value)
        return cls(key_buffer, value_buffer, past)

    def extend(self, key: torch.Tensor, value: torch.Tensor) -> _Tape:
        """Write the new positions after the filled ones (in place) and return self."""
        past = self.key.shape[-2]
        end = past + key.shape[-2]
        self.key_buffer[..., past:end, :].copy_(key)
        self.value_buffer[..., past:end, :].copy_(value)
        self.key, self.value = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self


def _per_head_score(score: Score | str, d_head: int) -> Score:
    return make_score(score, d_head, d_head) if isinstance(score, str) else resolve_score(score)


class StackedLinear(nn.Linear):
    """`blocks` linear maps of one input stacked into one layer: weight (blocks * out_features,
    in_features), so a single matmul computes all of them (e.g. [W_q; W_k; W_v], the
    `in_proj_weight` of `torch.nn.MultiheadAttention`).

    Each block is initialised as its own `nn.Linear(in_features, out_features)` would be, in
    block order (weight, then bias, per block): from one seed, the same numbers as `blocks`
    separate layers created one after the other. `block_views()` gives each block's
    (weight, bias) views for initialisers that must see a block's own fan-in and fan-out.
    """

    def __init__(
        self, in_features: int, out_features: int, blocks: int, bias: bool = True, **factory
    ):
        self.blocks = blocks  # read by reset_parameters, which nn.Linear.__init__ calls
        super().__init__(in_features, blocks * out_features, bias, **factory)

    def block_views(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        rows = self.out_features // self.blocks
        biases = [None] * self.blocks if self.bias is None else self.bias.split(rows)
        return list(zip(self.weight.split(rows), biases, strict=True))

    def reset_parameters(self) -> None:
        bound = self.in_features**-0.5 if self.in_features > 0 else 0.0
        for weight, bias in self.block_views():  # nn.Linear.reset_parameters, per block
            nn.init.kaiming_uniform_(weight, a=5**0.5)
            if bias is not None:
                nn.init.uniform_(bias, -bound, bound)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with any score.

    Args:
        d_model: model size (query features and output features).
        num_heads: h; d_model must divide by it (d_head = d_model / h).
        score: a per-head score module working on d_head features, or a name of
            `attnzoo.scores.SCORES` (e.g. "scaled_dot", Vaswani's), built with d_head sizes.
        d_memory: feature size of the memory in cross-attention (defaults to d_model).
        bias: biases in the four projections.
        dropout: on the attention weights, in training mode.

    Parameters: with d_memory == d_model, one fused in-projection `in_proj` (a `StackedLinear`,
    weight [W_q; W_k; W_v] of shape (3 d_model, d_model), as `torch.nn.MultiheadAttention`'s
    `in_proj_weight`): self-attention projects with one matmul, cross-attention uses its query
    rows on the query and its key/value rows on the memory. With d_memory != d_model, separate
    `q_proj`, `k_proj`, `v_proj`. Then `out_proj`. A state dict of the earlier layout
    (`q_proj.*`, `k_proj.*`, `v_proj.*` for every d_memory) still loads: see
    `_load_from_state_dict`.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        score: Score | str = "scaled_dot",
        *,
        d_memory: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        check_size("MultiHeadAttention", "d_model", d_model)
        check_size("MultiHeadAttention", "num_heads", num_heads)
        if d_memory is not None:
            check_size("MultiHeadAttention", "d_memory", d_memory)
        if not isinstance(bias, bool):
            fail("MultiHeadAttention", "bias", "a bool", repr(bias), TypeError)
        if d_model % num_heads != 0:
            fail(
                "MultiHeadAttention",
                "num_heads",
                f"a positive divisor of d_model={d_model}",
                num_heads,
            )
        check_dropout("MultiHeadAttention", dropout)
        self.d_model, self.num_heads = d_model, num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.d_memory = d = d_model if d_memory is None else d_memory
        # Created in the order of the earlier q_proj, k_proj, v_proj layers, each initialised
        # as they were: one seed gives the same initial weights as before the fusion.
        if d == d_model:
            self.in_proj = StackedLinear(d_model, d_model, 3, bias=bias)
            self.q_proj = self.k_proj = self.v_proj = None
        else:
            self.in_proj = None
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.k_proj = nn.Linear(d, d_model, bias=bias)
            self.v_proj = nn.Linear(d, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.score = _per_head_score(score, self.d_head)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Load hook: a state dict of the earlier layout (separate `q_proj`, `k_proj`, `v_proj`
        also when d_memory == d_model) has its three projections stacked into `in_proj`."""
        old = [f"{prefix}{name}_proj." for name in "qkv"]
        if self.in_proj is not None and f"{old[0]}weight" in state_dict:
            for field in ("weight", "bias"):
                parts = [state_dict.pop(f"{o}{field}") for o in old if f"{o}{field}" in state_dict]
                if parts:
                    state_dict[f"{prefix}in_proj.{field}"] = torch.cat(parts)  # (3 d_model, ...)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _heads(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """n projections side by side (batch, len, n * d_model) -> n x (batch, heads, len,
        d_head), each contiguous: SDPA ran ~20% slower on the strided views."""
        b, t, _ = x.shape
        x = x.view(b, t, n, self.num_heads, self.d_head)  # (b, t, n, h, d_head)
        return x.permute(2, 0, 3, 1, 4).contiguous().unbind(0)  # n x (b, h, t, d_head)

    def _project_self(self, x: torch.Tensor):
        """q, k, v of x, each (batch, heads, len, d_head), with one matmul."""
        if self.in_proj is None:
            fail(
                "MultiHeadAttention",
                "memory",
                f"a memory tensor: self-attention needs d_memory == d_model = {self.d_model}",
                f"None with d_memory = {self.d_memory}",
            )
        return self._heads(self.in_proj(x), 3)

    def _project_cross(self, query: torch.Tensor, memory: torch.Tensor | None):
        """q of the query, and k, v of the memory (None: q only); each (batch, heads, len,
        d_head). The fused layer's rows [:d_model] are W_q, its rows [d_model:] W_k and W_v."""
        if self.in_proj is None:
            q = self._heads(self.q_proj(query), 1)[0]
            if memory is None:
                return q, None, None
            k, v = self._heads(self.k_proj(memory), 1)[0], self._heads(self.v_proj(memory), 1)[0]
            return q, k, v
        d, weight, bias = self.d_model, self.in_proj.weight, self.in_proj.bias
        q = self._heads(F.linear(query, weight[:d], None if bias is None else bias[:d]), 1)[0]
        if memory is None:
            return q, None, None
        kv = F.linear(memory, weight[d:], None if bias is None else bias[d:])  # (b, j, 2 d)
        k, v = self._heads(kv, 2)
        return q, k, v

    def forward(
        self,
        query: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
        return_weights: bool = False,
        cache: KVCache | None = None,
    ) -> AttentionOutput:
        """
        Args:
            query: (batch, query_len, d_model).
            memory: (batch, key_len, d_memory) for cross-attention; None for self-attention.
            mask: bool, (batch, query_len, key_len), each dim 1 or that size (e.g.
                (batch, 1, key_len) for padding), shared by all heads; or (batch, heads,
                query_len, key_len). A (batch, key_len) mask is refused: with batch ==
                query_len it would line up as (query_len, key_len).
                With a self-attention cache, key_len counts cached plus new positions.
            causal: query i attends to keys j <= i (offset by the cache length when caching).
            window: keys within `window` positions (local-m).
            return_weights: also return per-head weights (batch, heads, query_len, key_len).
            cache: a `KVCache` to read and extend (incremental decoding).
        Returns:
            AttentionOutput(context (batch, query_len, d_model), weights or None).
        """
        check_tensor("MultiHeadAttention", "query", query, (3,))
        if query.shape[-1] != self.d_model:
            fail(
                "MultiHeadAttention",
                "query",
                f"last dimension d_model = {self.d_model}",
                query.shape[-1],
            )
        parameter = self.out_proj.weight
        check_like_parameter("MultiHeadAttention", "query", query, parameter)
        if memory is not None:
            check_tensor("MultiHeadAttention", "memory", memory, (3,))
            if memory.shape[-1] != self.d_memory:
                fail(
                    "MultiHeadAttention",
                    "memory",
                    f"last dimension d_memory = {self.d_memory}",
                    memory.shape[-1],
                )
            if memory.shape[0] != query.shape[0]:
                fail(
                    "MultiHeadAttention", "memory", f"batch size {query.shape[0]}", memory.shape[0]
                )
            check_like_parameter("MultiHeadAttention", "memory", memory, parameter)
        if cache is not None:
            self._check_cache(cache, query, memory)
        check_window("MultiHeadAttention", window)
        if causal.__class__ is not bool:
            check_flag("MultiHeadAttention", "causal", causal)
        if return_weights.__class__ is not bool:
            check_flag("MultiHeadAttention", "return_weights", return_weights)
        if mask is not None:  # checked before a cache is touched, in the caller's shape
            if not isinstance(mask, torch.Tensor):  # (its rank picks the shape to check)
                fail(
                    "MultiHeadAttention",
                    "mask",
                    "a bool torch.Tensor",
                    type(mask).__name__,
                    TypeError,
                )
            b, i = query.shape[:2]
            past_len = cache.length if cache is not None else 0
            j = memory.shape[1] if memory is not None else i + past_len
            shape = (b, self.num_heads, i, j) if mask.dim() == 4 else (b, i, j)
            check_mask("MultiHeadAttention", mask, shape, query.device, full_rank=True)

        past, cleared = 0, False
        if memory is None:
            q, k, v = self._project_self(query)  # (b, h, t, d_head) each
            if cache is not None:
                past = cache.length
                cache._append(k, v)
                k, v, cache.owner = cache.key, cache.value, weakref.ref(self)  # (b, h, past + t, d)
        else:
            static = cache is not None and cache.key is not None  # checked: a cross cache
            reached = None  # with fewer queries than memory rows: those some query reaches
            if causal or window is not None:
                i, j = query.shape[1], memory.shape[1]
                reached = reached_keys(i, j, causal=causal, window=window, device=query.device)
            padding = None if mask is None else _per_batch(mask)
            clearing = padding
            if cache is None and (causal or window is not None):  # the mask and the geometry
                clearing = unreached_clearing(
                    padding, i, j, causal=causal, window=window, device=query.device
                )
            # (a cache this call fills serves later calls, which may reach the rows this one
            # does not: those are projected as they are, and cleared after, below)
            if clearing is not None and not static:
                # padding cleared before the projection (W_k and W_v's gradients read it);
                # the projected rows there are finite and get weight 0: not cleared again
                (memory,) = clear_unattended(clearing, memory)
                cleared = padding is not None  # (what a cross cache records it was cleared under)
            q, k, v = self._project_cross(query, None if static else memory)  # (b, h, *, d_head)
            if static:
                k, v, cleared = cache.key, cache.value, same_mask(mask, cache._cleared_under)
                if cache._cleared_under is not None and not cleared:
                    # its keys and values were made from memory cleared under that mask:
                    # the keys no query of it attended stay excluded (they hold no memory)
                    kept = cache._cleared_under[2]  # (b, 1, j), as the mask was then
                    kept = kept if mask is None or mask.dim() == 3 else kept.unsqueeze(1)
                    mask = combine_masks(mask, kept)
            elif cache is not None:
                cache.key, cache.value, cache.static = k, v, True
                cache.owner = weakref.ref(self)
                cache._cleared_under = _cleared_record(mask) if cleared else None
            if cache is not None and reached is not None:  # for this call only
                k, v = clear_unattended(reached, k, v)
            cleared = cleared and not causal and window is None

        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # shared by all heads: (b, 1, i, j)
        if past and (causal or window is not None):
            # The new queries sit at positions past..past+i-1 of the cached sequence.
            i = query.shape[1]
            geometric = geometry_mask(
                i, past + i, causal=causal, window=window, offset=past, device=query.device
            )
            mask = combine_masks(mask, geometric)  # (b, 1|h, i, past + i) or (i, past + i)
            causal, window = False, None
        # q, k and v were built here and the caller's mask and window checked above
        out = _attend(
            q,
            self.score.prepare_key(k),
            v,
            self.score,
            mask,
            causal,
            window,
            self.dropout if self.training else 0.0,
            return_weights,
            cleared,
        )
        b, _, i, _ = out.context.shape
        context = out.context.transpose(1, 2).reshape(b, i, self.d_model)  # (b, i, d_model)
        return AttentionOutput(self.out_proj(context), out.weights)

    def _check_cache(self, cache: KVCache, query: torch.Tensor, memory) -> None:
        """The cache was filled by this module, for this kind of attention (cross with a
        `memory`), with this batch, head count, d_head, dtype and device, and a cross cache
        from a memory of this length (shapes and attributes only). A cross cache reads no
        memory again, by design; one of another length is another memory, never attended."""
        cross = memory is not None
        name, kind = "MultiHeadAttention", "cross" if cross else "self"
        if not isinstance(cache, KVCache):
            fail(name, "cache", "a KVCache", type(cache).__name__, TypeError)
        if cache.key is None:
            if cache.static and not cross:
                fail(name, "cache", "a self-attention cache", "a static (cross) one", CacheError)
            return
        if cache.owner is not None and cache.owner() is not self:
            fail(
                name,
                "cache",
                "a KVCache filled by this module",
                "one filled by another MultiHeadAttention",
                CacheError,
            )
        if cache.static != cross:
            other = "cross" if cache.static else "self"
            fail(
                name,
                "cache",
                f"a {kind}-attention cache",
                f"one filled by {other}-attention",
                CacheError,
            )
        key, value = cache.key, cache.value
        shape = (query.shape[0], self.num_heads, key.shape[-2], self.d_head)
        if key.dim() != 4 or tuple(key.shape) != shape:
            b, h, d = shape[0], self.num_heads, self.d_head
            fail(
                name,
                "cache",
                f"keys (batch={b}, heads={h}, cached_len, d_head={d})",
                f"shape {tuple(key.shape)}",
                CacheError,
            )
        if value is None or value.shape != key.shape:
            got = None if value is None else tuple(value.shape)
            fail(name, "cache", f"values of the keys' shape {shape}", got, CacheError)
        if cross and key.shape[-2] != memory.shape[1]:
            wanted = f"a cross cache of the memory's {memory.shape[1]} positions"
            fail(name, "cache", wanted, f"one of {key.shape[-2]}", CacheError)
        if key.device != query.device:
            fail(name, "cache", f"device {query.device}", key.device, CacheError)
        if key.dtype != query.dtype and not torch.is_autocast_enabled(query.device.type):
            fail(name, "cache", f"dtype {query.dtype}", key.dtype, CacheError)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build one with the weights of a `torch.nn.MultiheadAttention`.

        The result is batch-first whatever `module.batch_first` says (the weights do not
        depend on it), and its masks say True = may attend (PyTorch's `key_padding_mask` says
        True = ignore: pass `~key_padding_mask` as `mask[:, None, :]`). Copied: the weights,
        the biases (all or none), the head count, kdim (as d_memory) and dropout. Refused,
        each by name, as it cannot be copied: a subclass (its forward may differ),
        add_bias_kv, add_zero_attn, kdim != vdim, and biases on some projections only.
        """
        name = "MultiHeadAttention.from_torch"
        if type(module) is not nn.MultiheadAttention:
            fail(
                name,
                "module",
                "a torch.nn.MultiheadAttention (not a subclass)",
                type(module).__name__,
                TypeError,
            )
        if module.bias_k is not None or module.bias_v is not None:
            fail(name, "module", "add_bias_kv=False", "add_bias_kv=True")
        if module.add_zero_attn:
            fail(name, "module", "add_zero_attn=False", "add_zero_attn=True")
        if module.kdim != module.vdim:
            fail(name, "module", "kdim == vdim", f"kdim={module.kdim}, vdim={module.vdim}")
        if (module.in_proj_bias is None) != (module.out_proj.bias is None):
            fail(
                name,
                "module",
                "bias on the in- and out-projections or on neither",
                f"in_proj_bias {'absent' if module.in_proj_bias is None else 'present'}, "
                f"out_proj.bias {'absent' if module.out_proj.bias is None else 'present'}",
            )
        has_bias = module.in_proj_bias is not None
        new = cls(
            module.embed_dim,
            module.num_heads,
            "scaled_dot",
            d_memory=module.kdim,
            bias=has_bias,
            dropout=module.dropout,
        )
        new = new.to(device=module.out_proj.weight.device, dtype=module.out_proj.weight.dtype)
        with torch.no_grad():
            if module._qkv_same_embed_dim:  # the same fused layout as ours
                new.in_proj.weight.copy_(module.in_proj_weight)
            else:
                new.q_proj.weight.copy_(module.q_proj_weight)
                new.k_proj.weight.copy_(module.k_proj_weight)
                new.v_proj.weight.copy_(module.v_proj_weight)
            new.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                if new.in_proj is not None:
                    new.in_proj.bias.copy_(module.in_proj_bias)
                else:
                    bq, bk, bv = module.in_proj_bias.split(module.embed_dim)
                    new.q_proj.bias.copy_(bq)
                    new.k_proj.bias.copy_(bk)
                    new.v_proj.bias.copy_(bv)
                new.out_proj.bias.copy_(module.out_proj.bias)
        return new


def _cleared_record(mask: torch.Tensor) -> tuple[torch.Tensor, int | None, torch.Tensor]:
    """`KVCache._cleared_under` for memory cleared under `mask`: the mask and its version (is a
    later call's mask that one, unchanged?) and the keys it let some query attend, (b | 1, 1, j),
    read now (a mask widened in place later let the cleared keys, zeros, be attended)."""
    attended = attended_keys(_per_batch(mask)).transpose(-2, -1)  # (a view of a (b, 1, j) mask)
    if attended.dim() == 2:  # a (key_len,) mask's: (1, j)
        attended = attended.unsqueeze(0)
    return mask, mask_version(mask), attended.clone()


def _per_batch(mask: torch.Tensor) -> torch.Tensor:
    """A (b, i, j) mask as it is, a per-head (b, h, i, j) one as (b, i, j): where some head may
    attend (the memory rows the heads share are cleared under it)."""
    return mask.any(1) if mask.dim() == 4 else mask
