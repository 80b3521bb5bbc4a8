import pytest
import torch

from attnzoo import causal_mask, combine_masks, padding_mask, window_mask


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
