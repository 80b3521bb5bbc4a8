import math

import pytest
import torch

from attnzoo import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, sinusoidal_encoding


def test_sinusoidal_exact_values():
    pe = sinusoidal_encoding(3, 4, dtype=torch.float64)
    pos = 2
    expected = [math.sin(pos), math.cos(pos), math.sin(pos / 100), math.cos(pos / 100)]
    torch.testing.assert_close(pe[2], torch.tensor(expected, dtype=torch.float64))


def test_sinusoidal_offset_and_odd_width():
    torch.testing.assert_close(sinusoidal_encoding(5, 7)[3:], sinusoidal_encoding(2, 7, offset=3))
    x = torch.zeros(2, 5, 6)
    torch.testing.assert_close(
        SinusoidalPositionalEncoding(6)(x, offset=1)[0], sinusoidal_encoding(5, 6, offset=1)
    )


def test_learned_adds_and_checks_length():
    emb = LearnedPositionalEmbedding(4, 3)
    x = torch.zeros(1, 2, 3)
    torch.testing.assert_close(emb(x, offset=2)[0], emb.embedding.weight[2:4])
    with pytest.raises(ValueError, match="max_len = 4"):
        emb(torch.zeros(1, 5, 3))
