import math

import pytest
import torch

from attnzoo import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, sinusoidal_encoding


def test_sinusoidal_exact_values():
    pe = sinusoidal_encoding(3, 4, dtype=torch.float64)
    pos = 2
    expected = [math.sin(pos), math.cos(pos), math.sin(pos / 100), math.cos(pos / 100)]
    torch.testing.assert_close(pe[2], torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize(
    ("length", "d_model", "offset"), [(143, 17, 0), (17, 143, 1000), (7, 1, 3)]
)
def test_sinusoidal_follows_the_formula_written_out(length, d_model, offset):
    """Vaswani 2017 sec. 3.5 element by element in Python floats, odd widths and a late offset
    (only one row of a 3 x 4 table was checked)."""
    pe = sinusoidal_encoding(length, d_model, offset=offset, dtype=torch.float64)
    want = torch.empty(length, d_model, dtype=torch.float64)
    for p in range(length):
        for c in range(d_model):
            angle = (p + offset) / 10000 ** (2 * (c // 2) / d_model)
            want[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(pe, want, rtol=0, atol=1e-12)


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
