"""The values attention returns and reuses, in a leaf module (it imports only torch) so that
every other module of the core can name them without importing each other."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class AttentionOutput(NamedTuple):
    """context: (batch, [heads,] query_len, d_value); weights: (batch, [heads,] query_len,
    key_len), rows summing to 1 (0 for a query with no allowed key), or None when not
    requested."""

    context: torch.Tensor
    weights: torch.Tensor | None


class PreparedKey(NamedTuple):
    """Keys after `score.prepare_key`, to reuse across decoding steps (e.g. U_a h for additive
    attention is computed once per source sentence). Made by `prepare_key(..., value=,
    mask=)`, it also holds the values, keys and values cleared once under the padding `mask`
    (what `attention()` would otherwise do at every step)."""

    tensor: torch.Tensor
    score: nn.Module  # the `attnzoo.core.scores.Score` that prepared it
    value: torch.Tensor | None = None  # the values, cleared under `mask`
    mask: torch.Tensor | None = None  # the mask `tensor` and `value` were cleared under
    mask_version: int | None = None  # `mask`'s version counter then (`masks.same_mask`)
    # the keys `mask` let some query attend, read when they were cleared (..., 1, key_len): the
    # record of what is cleared, which a later change of `mask` in place does not move
    attended: torch.Tensor | None = None

    def index_select(self, index: torch.Tensor) -> PreparedKey:
        """Batch rows `index` (beam search), every tensor alike; a mask without a batch dim
        ((key_len,), or a leading dim of 1 that broadcasts) is kept as it is."""
        mask = _rows(self.mask, index)
        return PreparedKey(
            self.tensor.index_select(0, index),
            self.score,
            None if self.value is None else self.value.index_select(0, index),
            mask,
            self.mask_version if mask is self.mask else mask_version(mask),
            _rows(self.attended, index),
        )


def _rows(mask: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """Rows `index` of a mask whose dim 0 is the batch: one of the weights' rank (3 or more
    dims) whose leading dim is not a broadcast 1."""
    if mask is None or mask.dim() < 3 or mask.shape[0] == 1:
        return mask
    return mask.index_select(0, index)


def mask_version(mask: torch.Tensor) -> int | None:
    """The version counter of a tensor (every in-place change advances it), or None for an
    inference tensor, which has none."""
    return None if mask.is_inference() else mask._version
