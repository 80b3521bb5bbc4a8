"""Positional encodings (Vaswani 2017, sec. 3.5)."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnzoo.core.checks import check_count, check_floating, check_size, fail


def sinusoidal_encoding(
    length: int,
    d_model: int,
    *,
    offset: int = 0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    Returns (length, d_model) for positions offset..offset+length-1. An odd d_model drops the
    last cosine column.
    """
    check_count("sinusoidal_encoding", "length", length)
    check_size("sinusoidal_encoding", "d_model", d_model)
    check_count("sinusoidal_encoding", "offset", offset)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        fail("sinusoidal_encoding", "dtype", "a floating-point torch.dtype", dtype, TypeError)
    position = torch.arange(offset, offset + length, device=device, dtype=torch.float64)
    rate = torch.exp(
        torch.arange(0, d_model, 2, device=device, dtype=torch.float64)
        * (-math.log(10000.0) / d_model)
    )  # (ceil(d_model / 2),)
    angle = position[:, None] * rate[None, :]  # (length, ceil(d_model / 2))
    encoding = torch.empty(length, d_model, device=device, dtype=torch.float64)
    encoding[:, 0::2] = torch.sin(angle)
    encoding[:, 1::2] = torch.cos(angle)[:, : d_model // 2]
    return encoding.to(dtype)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding: x + PE; any length, no parameters."""

    def __init__(self, d_model: int):
        super().__init__()
        check_size("SinusoidalPositionalEncoding", "d_model", d_model)
        self.d_model = d_model

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (batch, len, d_model) -> (batch, len, d_model); offset: position of x[:, 0]."""
        _check_positions_input("SinusoidalPositionalEncoding", x, self.d_model)
        check_count("SinusoidalPositionalEncoding", "offset", offset)
        pe = sinusoidal_encoding(
            x.shape[-2], self.d_model, offset=offset, device=x.device, dtype=x.dtype
        )
        return x + pe


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned embedding per position (Gehring 2017; Vaswani's sec. 3.5 alternative)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        check_size("LearnedPositionalEmbedding", "max_len", max_len)
        check_size("LearnedPositionalEmbedding", "d_model", d_model)
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (batch, len, d_model) -> (batch, len, d_model); offset: position of x[:, 0]."""
        _check_positions_input("LearnedPositionalEmbedding", x, self.embedding.embedding_dim)
        check_count("LearnedPositionalEmbedding", "offset", offset)
        end = offset + x.shape[-2]
        if end > self.max_len:
            fail(
                "LearnedPositionalEmbedding",
                "x",
                f"positions < max_len = {self.max_len}",
                f"positions up to {end - 1}",
            )
        positions = torch.arange(offset, end, device=x.device)
        return x + self.embedding(positions)


def _check_positions_input(function: str, x: object, d_model: int) -> None:
    """x is a floating (batch, len, d_model) tensor: a (batch, d_model) one, read as (len,
    d_model), would give each row of the batch another position."""
    check_floating(function, "x", x)
    if x.dim() != 3 or x.shape[-1] != d_model:
        fail(function, "x", f"a (batch, len, d_model = {d_model}) tensor", tuple(x.shape))
