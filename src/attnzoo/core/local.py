"""Local attention (Luong 2015, sec. 3.2): attention restricted to a window of 2D + 1 source
positions around a centre p_t, either the query's own position (local-m) or one the model
predicts (local-p, with a Gaussian around it)."""

from __future__ import annotations

import torch
from torch import nn

from attnzoo.core.attention import _common_case
from attnzoo.core.checks import (
    check_floating,
    check_mask,
    check_same_kind,
    check_size,
    check_tensor,
    check_window,
    fail,
    is_integer_tensor,
    one_dtype_under_autocast,
)
from attnzoo.core.masks import clear_unattended, combine_masks, window_mask
from attnzoo.core.normalisers import masked_softmax, propagate_nonfinite, propagate_nonfinite_keys
from attnzoo.core.types import AttentionOutput


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
        check_window("LocalAttention", window)
        if d_query is not None:
            check_size("LocalAttention", "d_query", d_query)
        if d_hidden is not None:
            check_size("LocalAttention", "d_hidden", d_hidden)
            if d_query is None:  # local-m has no W_p to size
                fail("LocalAttention", "d_hidden", "None without d_query (local-m)", d_hidden)
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
        """p_t for every query: (batch, query_len), in float32 at least: a position in bf16
        is exact only up to 256 (query 301's window was centred on 300)."""
        dtype = torch.promote_types(query.dtype, torch.float32)
        if self.predictive:
            source_len = (
                lengths.to(query.device, dtype)[:, None]
                if lengths is not None
                else torch.full(query.shape[:-1], float(key_len), dtype=dtype, device=query.device)
            )
            fraction = torch.sigmoid(self.v_p(torch.tanh(self.w_p(query))).squeeze(-1).to(dtype))
            return source_len * fraction
        if positions is None:
            positions = torch.arange(query.shape[-2], device=query.device)
        positions = positions.to(query.device, dtype)
        return positions.expand(query.shape[:-1])  # (batch, query_len)

    def forward(
        self, query, key, value, *, mask=None, lengths=None, positions=None, prepared_key=None
    ):
        """
        Args:
            query: (batch, query_len, d_query); key: (batch, key_len, d_key);
            value: (batch, key_len, d_value).
            mask: bool, (batch, query_len, key_len), each dim 1 or that size.
            lengths: (batch,) true source lengths: S in eq. 9 (local-p), and in both modes
                the keys at or past a row's length are padding, never attended.
            positions: (batch, query_len) or (query_len,) query positions (local-m);
                defaults to 0..query_len-1.
            prepared_key: `score.prepare_key(key)` if the caller cached it.
        Returns:
            AttentionOutput(context (batch, query_len, d_value), weights (batch, query_len,
            key_len)).
        """
        if prepared_key is None:
            query, key, value = one_dtype_under_autocast(query, key, value)
        else:
            query, key, value, prepared_key = one_dtype_under_autocast(
                query, key, value, prepared_key
            )
        self._check_inputs(query, key, value, mask, lengths, positions, prepared_key)
        key_len = key.shape[-2]
        if lengths is not None:  # (batch, 1, key_len): the keys before each row's length
            real = torch.arange(key_len, device=query.device) < lengths.to(query.device)[:, None]
            mask = combine_masks(mask, real.unsqueeze(1))  # (checked: no read on a GPU)
        p = self.centers(query, key_len, lengths, positions)  # (batch, query_len)
        allowed = window_mask(query.shape[-2], key_len, self.window, centers=p.detach())
        if mask is not None:
            allowed = allowed & mask  # (batch, query_len, key_len)
        # keys outside every window or masked for every query: their content is not read,
        # cleared before the score's projection (whose gradient, U_a's or v's, reads it)
        if prepared_key is None:
            key, value = clear_unattended(allowed, key, value)
            prepared = self.score.prepare_key(key)
        else:
            prepared, value = clear_unattended(allowed, prepared_key, value)
        logits = self.score.logits(query, prepared)  # (batch, query_len, key_len)
        logits = propagate_nonfinite_keys(logits, prepared)  # an infinite key: not a number
        weights = masked_softmax(logits, allowed)
        # A NaN query has a NaN centre, hence an empty window and zero weights: the centre
        # joins the probe, and no row is exempt (an empty window may come from the query).
        probe = torch.cat([query, p.unsqueeze(-1).to(query.dtype)], -1)  # (b, i, d + 1)
        weights = propagate_nonfinite(weights, probe)
        if self.predictive:
            s = torch.arange(key_len, device=query.device, dtype=p.dtype)
            sigma = self.window / 2
            gaussian = torch.exp(-((s - p.unsqueeze(-1)) ** 2) / (2 * sigma**2))
            weights = weights * gaussian.to(weights.dtype)
        return AttentionOutput(weights @ value, weights)  # (batch, query_len, d_value)

    def _check_inputs(self, query, key, value, mask, lengths, positions, prepared_key) -> None:
        """Each tensor of `forward` in its documented shape, the errors naming it."""
        name = "LocalAttention"
        if not (_common_case(query, key, value) and query.dim() == 3):  # (a decoding step's)
            for argument, tensor in (("query", query), ("key", key), ("value", value)):
                check_tensor(name, argument, tensor, (3,))
            check_floating(name, "query", query)
            check_same_kind(name, "query", query, {"key": key, "value": value})
            for argument, tensor in (("key", key), ("value", value)):
                if tensor.shape[0] != query.shape[0]:
                    expected = f"batch size {query.shape[0]} (that of 'query')"
                    fail(name, argument, expected, tensor.shape[0])
            if value.shape[1] != key.shape[1]:
                fail(name, "value", f"key_len = {key.shape[1]} positions", value.shape[1])
        b, i, j = query.shape[0], query.shape[1], key.shape[1]
        check_mask(name, mask, (b, i, j), query.device, full_rank=True)
        if lengths is not None and (
            not isinstance(lengths, torch.Tensor)
            or lengths.shape != (b,)
            or not is_integer_tensor(lengths)
        ):
            fail(name, "lengths", f"a ({b},) integer tensor of source lengths", _received(lengths))
        if lengths is not None:
            if lengths.device not in (query.device, torch.device("cpu")):
                fail(
                    name,
                    "lengths",
                    f"device {query.device} (that of 'query') or cpu",
                    lengths.device,
                )
            # S of eq. 9 scales the centre: a length past key_len centres windows past the keys.
            # Read on the CPU only (a step's sync elsewhere would stall the queue)
            if lengths.is_cpu and lengths.numel():
                low, high = (int(x) for x in torch.aminmax(lengths))
                if low < 1 or high > j:
                    fail(name, "lengths", f"source lengths in 1..key_len = {j}", f"{low} to {high}")
        if self.predictive and query.shape[-1] != self.w_p.in_features:
            wanted = f"last dimension d_query = {self.w_p.in_features}"
            fail(name, "query", wanted, query.shape[-1])
        if positions is not None:
            if self.predictive:  # local-p predicts its centres: positions would go unread
                fail(name, "positions", "None for local-p (it predicts its centres)", "a tensor")
            if (
                not isinstance(positions, torch.Tensor)
                or positions.shape not in ((i,), (b, i))
                or positions.dtype == torch.bool
            ):
                expected = f"a ({i},) or ({b}, {i}) numeric tensor"
                fail(name, "positions", expected, _received(positions))
            # a position past the keys is a query beyond the source (local-m's p_t = t); one
            # before them is none (a non-finite one propagates to its output instead). Read on
            # the CPU only, as the lengths
            if positions.is_cpu and positions.numel():
                finite = (
                    positions[positions.isfinite()] if positions.is_floating_point() else positions
                )
                low = float(finite.min()) if finite.numel() else 0.0
                if low < 0:
                    fail(name, "positions", "positions >= 0", f"min {low:g}")
        if prepared_key is not None and (
            not isinstance(prepared_key, torch.Tensor) or prepared_key.shape[:2] != (b, j)
        ):
            got = tuple(prepared_key.shape) if isinstance(prepared_key, torch.Tensor) else None
            fail(name, "prepared_key", f"the score's prepared keys ({b}, {j}, ...)", got)


def _received(value: object) -> object:
    """How an error shows a tensor argument: its dtype and shape (else the value itself)."""
    return (
        f"{value.dtype} of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else value
    )
