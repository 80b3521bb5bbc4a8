"""Boolean attention masks. One convention everywhere: True in row i and column j means query
position i may attend to key position j. Masks broadcast against the weights
(batch, [heads,] query_len, key_len).
"""

from __future__ import annotations

import torch

from attnzoo.core.checks import (
    _broadcasts_to,
    broadcast_shape,
    check_count,
    check_window,
    fail,
    is_integer_tensor,
)
from attnzoo.core.types import mask_version


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """Keys at positions < length are real. Returns (batch, 1, key_len), ready to broadcast over
    queries (and over heads after `unsqueeze(1)`).

    Args:
        lengths: (batch,) integer tensor of valid key counts.
        max_len: key_len; defaults to `lengths.max()` (a value: give it on the meta device).
    """
    tensor = isinstance(lengths, torch.Tensor)
    if not (tensor and lengths.dim() == 1 and is_integer_tensor(lengths)):  # (bool: not counts)
        got = type(lengths).__name__ if not tensor else f"{lengths.dtype} {tuple(lengths.shape)}"
        fail("padding_mask", "lengths", "a 1-D integer tensor (batch,)", got, TypeError)
    check_count("padding_mask", "max_len", max_len, optional=True)
    if lengths.device.type == "meta":  # values cannot be read there
        if max_len is None:
            fail("padding_mask", "max_len", "an int for lengths on the meta device", None)
    elif lengths.numel():
        low, high = (int(x) for x in torch.aminmax(lengths))  # the values this module reads
        if low < 0 or (max_len is not None and high > max_len):
            bound = "" if max_len is None else f" and <= max_len = {max_len}"
            fail("padding_mask", "lengths", f"values >= 0{bound}", f"{low} to {high}")
        max_len = high if max_len is None else max_len
    max_len = 0 if max_len is None else max_len  # no lengths: no keys
    positions = torch.arange(max_len, device=lengths.device)  # (key_len,)
    return (positions[None, :] < lengths[:, None]).unsqueeze(1)  # (batch, 1, key_len)


def geometry_mask(
    query_len: int,
    key_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    offset: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """The positional constraints of attention in one place: query i sits at position
    i + offset of the key sequence (offset = the number of cached keys in incremental decoding,
    or a query block's first row), and

    - causal: it may attend to keys j <= i + offset (offset 0: the diagonal at the top left,
      like PyTorch's `is_causal`, also when query_len != key_len);
    - window=D: to keys with |j - (i + offset)| <= D (Luong's local-m).

    Returns:
        bool (query_len, key_len), True = may attend; None when neither constraint excludes
        any key (nothing asked for, or e.g. one new query that may see its whole cache).
    """
    last = offset + query_len - 1  # position of the last query
    causal = causal and offset < key_len - 1  # the first query sees every key otherwise
    if window is not None and max(last, key_len - 1 - offset) <= window:
        window = None  # every key is within D of every query
    if not causal and window is None:
        return None
    return _geometry(query_len, key_len, causal, window, offset, device)


def _geometry(query_len, key_len, causal, window, offset, device) -> torch.Tensor:
    i = torch.arange(offset, offset + query_len, device=device)[:, None]  # (query_len, 1)
    j = torch.arange(key_len, device=device)[None, :]  # (1, key_len)
    if not causal:
        return (j - i).abs() <= window  # (query_len, key_len)
    allowed = j <= i  # (query_len, key_len)
    return allowed if window is None else allowed & ((j - i).abs() <= window)


def causal_mask(
    query_len: int,
    key_len: int | None = None,
    *,
    offset: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Query i may attend to keys j <= i + offset. Returns (query_len, key_len).

    With offset 0 the diagonal starts at the top left, like PyTorch's `is_causal`, also when
    query_len != key_len; incremental decoding with a cache of P keys uses offset=P.
    """
    check_count("causal_mask", "query_len", query_len)
    check_count("causal_mask", "key_len", key_len, optional=True)
    check_count("causal_mask", "offset", offset)
    key_len = query_len if key_len is None else key_len
    return _geometry(query_len, key_len, True, None, offset, device)


def window_mask(
    query_len: int,
    key_len: int,
    window: int,
    *,
    centers: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Keys within `window` positions of a centre: |j - p_i| <= D (Luong 2015, local attention).

    Args:
        centers: optional (batch, query_len) centres p_i (integer or real); defaults to p_i = i,
            i.e. local-m (monotonic alignment).
        device: where to build the mask without centres; with centres it is theirs.
    Returns:
        (query_len, key_len), or (batch, query_len, key_len) when centres are given.
    """
    check_count("window_mask", "query_len", query_len)
    check_count("window_mask", "key_len", key_len)
    if window is None:  # check_window takes None as "no window": not here
        fail("window_mask", "window", "a positive int (keys within D positions)", None)
    check_window("window_mask", window)
    if centers is None:
        return _geometry(query_len, key_len, False, window, 0, device)
    if not isinstance(centers, torch.Tensor) or centers.shape[-1:] != (query_len,):
        got = centers if not isinstance(centers, torch.Tensor) else tuple(centers.shape)
        fail("window_mask", "centers", f"a tensor (batch, query_len = {query_len})", got)
    j = torch.arange(key_len, device=centers.device)  # (key_len,)
    return (j[None, None, :] - centers[..., None]).abs() <= window  # (batch, query_len, key_len)


def reached_keys(
    query_len: int,
    key_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """bool (key_len,): the keys some query may attend under `geometry_mask`'s constraints at
    offset 0, or None when every key is. The others lie past the last query's reach (causal:
    j >= query_len; window D alone: j >= query_len + D), when there are fewer queries than
    keys: no query attends them, so they are cleared as padding is (`clear_unattended`)."""
    reach = query_len if causal else query_len + window if window is not None else key_len
    if reach >= key_len:
        return None
    return torch.arange(key_len, device=device) < reach


def unreached_clearing(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """The mask to clear keys and values under (`clear_unattended`) before a score reads
    them, with `causal` or `window`: `mask` and the keys some query reaches
    (`reached_keys`). A per-query mask (query dim > 1) is combined with the whole geometry
    instead: it and the geometry may leave a key to no query together though each alone
    leaves it to some (the mask to query 0 only, causality to the later queries), and that
    key must be cleared as padding is. That mask is (..., query_len, key_len) already: the
    combination takes memory of the mask's own size."""
    if mask is not None and mask.dim() > 1 and mask.shape[-2] > 1:
        geometry = geometry_mask(query_len, key_len, causal=causal, window=window, device=device)
    else:
        geometry = reached_keys(query_len, key_len, causal=causal, window=window, device=device)
    return combine_masks(mask, geometry)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of broadcastable masks; None entries mean "no constraint"."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for k, m in enumerate(present):
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
            expected = "a bool torch.Tensor (True = may attend)"
            fail("combine_masks", f"masks[{k}]", expected, got, TypeError)
    if len(present) > 1 and broadcast_shape(*(m.shape for m in present)) is None:
        shapes = [tuple(m.shape) for m in present]
        fail("combine_masks", "masks", "shapes that broadcast together", shapes)
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def attended_keys(mask: torch.Tensor) -> torch.Tensor:
    """mask (..., query_len | 1, key_len), or (key_len,) -> bool (..., key_len, 1): True where
    at least one query may attend key j."""
    if mask.dim() >= 2:
        mask = mask.squeeze(-2) if mask.shape[-2] == 1 else mask.any(-2)  # (..., key_len)
    return mask.unsqueeze(-1)  # (..., key_len, 1)


def same_mask(mask: torch.Tensor | None, under: tuple[torch.Tensor, int | None] | None) -> bool:
    """`under` is (a mask, `mask_version` of it) recorded when keys were cleared under it: is
    `mask` that mask, unchanged since? The same object at the same version counter, which every
    in-place change advances; an inference tensor has no counter, and only identity is
    checked (it can be changed in place only inside `torch.inference_mode`)."""
    return under is not None and under[0] is mask and under[1] == mask_version(mask)


def clear_unattended(mask: torch.Tensor, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each (..., key_len, d) tensor of `rows` (keys, values) with the positions no query may
    attend set to +0 by selection, not by a product (0 * NaN is NaN): whatever padding holds
    (NaN, Inf) never reaches an output, and the masked softmax still gives those keys weight 0.

    The selection is a bitwise AND of the floats' bits with all-ones or zero (`_KeepRows`):
    exact, and measured ~2.5x faster than `torch.where` on CPU (4.4 vs 11.5 us on
    (8, 32, 64)), which a decoder pays at every step.

    A position that the mask excludes for some queries only (causal, window, a per-query mask)
    is an attended input and is kept: see the module docstring of `attnzoo.core.attention`.
    """
    keep = attended_keys(mask)  # (..., key_len, 1)
    bits = None
    out = []
    for t in rows:
        int_dtype = _BITS.get(t.dtype)
        if int_dtype is None or not _broadcasts_to(keep.shape, t.shape):
            out.append(torch.where(keep, t, 0.0))
            continue
        if bits is None or bits.dtype != int_dtype:
            bits = keep.to(int_dtype).neg_()  # -1 (all bits set) = keep, 0 = clear
        out.append(_KeepRows.apply(t, bits) if t.requires_grad else _and(t, bits))
    return tuple(out)


_BITS = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _and(t: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    return (t.view(bits.dtype) & bits).view(t.dtype)


class _KeepRows(torch.autograd.Function):
    """t with the rows where bits == 0 set to +0; the gradient of those rows is 0."""

    @staticmethod
    def forward(ctx, t, bits):
        ctx.save_for_backward(bits)
        return _and(t, bits)

    @staticmethod
    def backward(ctx, grad):
        (bits,) = ctx.saved_tensors
        # the same selection, itself differentiable: a double backward (create_graph) goes
        # through it as through the forward
        return (_KeepRows.apply(grad, bits) if grad.requires_grad else _and(grad, bits)), None
