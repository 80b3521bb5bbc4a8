import pytest
import torch

from attnzoo import LocalAttention, attention, scores


def test_local_m_equals_attention_with_window():
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 7, 4), torch.randn(2, 7, 3)
    local = LocalAttention(scores.Dot(), window=2)
    a = local(q, k, v)
    b = attention(q, k, v, score="dot", window=2, return_weights=True)
    torch.testing.assert_close(a.context, b.context)
    torch.testing.assert_close(a.weights, b.weights)
    # a single decoding step at position 4
    step = local(q[:, 4:5], k, v, positions=torch.tensor([4]))
    torch.testing.assert_close(step.context, b.context[:, 4:5])


def test_local_p_follows_luong_eq_10():
    torch.manual_seed(1)
    local = LocalAttention(scores.Dot(), window=2, d_query=4).double()
    q = torch.randn(1, 3, 4, dtype=torch.float64)
    k = torch.randn(1, 9, 4, dtype=torch.float64)
    v = torch.randn(1, 9, 2, dtype=torch.float64)
    lengths = torch.tensor([8])
    out = local(q, k, v, lengths=lengths)
    for t in range(3):  # reference written out per query
        p = 8 * torch.sigmoid(local.v_p(torch.tanh(local.w_p(q[0, t])))).item()
        inside = [s for s in range(8) if abs(s - p) <= 2]  # key 8 is past the length: padding
        logits = k[0, inside] @ q[0, t]
        align = torch.softmax(logits, 0)
        gauss = torch.exp(-((torch.tensor(inside, dtype=torch.float64) - p) ** 2) / (2 * 1.0**2))
        expected = torch.zeros(9, dtype=torch.float64)
        expected[inside] = align * gauss
        torch.testing.assert_close(out.weights[0, t], expected)
        torch.testing.assert_close(out.context[0, t], expected @ v[0])
    out.context.sum().backward()
    assert local.w_p.weight.grad.abs().sum() > 0  # p_t learns through the Gaussian


def test_local_window_error():
    with pytest.raises(ValueError, match="'window'"):
        LocalAttention(scores.Dot(), window=0)
    with pytest.raises(ValueError, match="'d_hidden' expected None without d_query"):
        LocalAttention(scores.Dot(), window=2, d_hidden=16)  # local-m: it was dropped


@pytest.mark.parametrize("d_query", [None, 4])
def test_keys_past_a_rows_length_are_padding_in_both_modes(d_query):
    """local-m read `lengths` not at all, local-p only as S: keys past a row's length were
    attended (local-m's context moved by 100 with garbage there; local-p weighed them)."""
    torch.manual_seed(0)
    local = LocalAttention(scores.Dot(), window=2, d_query=d_query)
    q, k, v = torch.randn(2, 6, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 3)
    lengths = torch.tensor([3, 6])
    out = local(q, k, v, lengths=lengths)
    assert (out.weights[0, :, 3:] == 0).all() and (out.weights[1] > 0).any(-1).all()
    k2, v2 = k.clone(), v.clone()
    k2[0, 3:], v2[0, 3:] = 1e4, float("nan")
    again = local(q, k2, v2, lengths=lengths)
    torch.testing.assert_close(again.context, out.context)
    torch.testing.assert_close(again.weights, out.weights)


def test_bf16_windows_are_centred_on_their_own_positions():
    """Positions made in bf16 are exact only up to 256: query 301's window was centred on 300
    and query 255's held four keys."""
    n, window = 600, 1
    q, k, v = (torch.randn(1, n, 8, dtype=torch.bfloat16) for _ in range(3))
    weights = LocalAttention(scores.Dot(), window=window)(q, k, v).weights[0]
    i = torch.arange(n)
    expected = (i[:, None] - i[None, :]).abs() <= window
    assert torch.equal(weights > 0, expected)
