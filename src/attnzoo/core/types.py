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
    attention is computed once per source sentence)."""

    tensor: torch.Tensor
    score: nn.Module  # the `attnzoo.core.scores.Score` that prepared it
