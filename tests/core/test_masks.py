import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnzoo import causal_mask, combine_masks, padding_mask, window_mask
from attnzoo.core.masks import geometry_mask


def test_padding_mask_exact():
    m = padding_mask(torch.tensor([2, 0, 3]), 4)
    assert m.shape == (3, 1, 4)
    assert m[:, 0].tolist() == [[True, True, False, False], [False] * 4, [True] * 3 + [False]]


def test_padding_mask_default_length():
    assert padding_mask(torch.tensor([1, 3])).shape == (2, 1, 3)


def test_padding_mask_rejects_float_lengths():
    with pytest.raises(TypeError, match="'lengths'"):
        padding_mask(torch.tensor([1.0, 2.0]))


def test_causal_mask_top_left_aligned_like_torch():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, False, False, False], [True, True, False, False]]
    # torch's is_causal aligns the same way
    q, k, v = torch.randn(1, 1, 2, 3), torch.randn(1, 1, 4, 3), torch.randn(1, 1, 4, 3)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(a, b)


def test_causal_mask_offset_for_cache():
    assert causal_mask(2, 5, offset=3).tolist() == [[True, True, True, True, False], [True] * 5]


def test_window_mask_local_m_and_centres():
    assert window_mask(3, 5, 1).tolist() == [
        [True, True, False, False, False],
        [True, True, True, False, False],
        [False, True, True, True, False],
    ]
    m = window_mask(1, 5, 1, centers=torch.tensor([[2.6]]))
    assert m.tolist() == [[[False, False, True, True, False]]]


def test_combine_masks():
    a = torch.tensor([[True, False]])
    b = torch.tensor([[True], [False]])
    assert combine_masks(a, None, b).tolist() == [[True, False], [False, False]]
    assert combine_masks(None, None) is None


@given(
    query_len=st.integers(1, 7),
    key_len=st.integers(1, 9),
    offset=st.integers(0, 6),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 8)),
)
def test_geometry_mask_matches_a_loop(query_len, key_len, offset, causal, window):
    """Query i sits at position i + offset; None exactly when no key is excluded."""
    expected = torch.ones(query_len, key_len, dtype=torch.bool)
    for i in range(query_len):
        for j in range(key_len):
            if causal and j > i + offset:
                expected[i, j] = False
            if window is not None and abs(j - (i + offset)) > window:
                expected[i, j] = False
    got = geometry_mask(query_len, key_len, causal=causal, window=window, offset=offset)
    if expected.all():
        assert got is None
    else:
        assert got is not None and got.dtype == torch.bool
        assert got.tolist() == expected.tolist()


def test_geometry_mask_single_cached_step_is_unconstrained():
    assert geometry_mask(1, 6, causal=True, offset=5) is None
    assert geometry_mask(1, 6, causal=True, window=2, offset=5).tolist() == [
        [False, False, False, True, True, True]
    ]
