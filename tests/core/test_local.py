import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnzoo import LocalAttention, attention, scores
from tests.core.reference import ref_logits
from tests.core.test_scores import D, make


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


# --- against an independent float64 reference, every score of the registry ---------------

NAMES = list(scores.SCORES)


def reference(local, name, params, q, k, v, mask, lengths):
    """A loop over rows and queries: the window around p_t (t, or S sigmoid(v_p^T tanh(W_p
    h_t)) with S the row's length), the score's softmax over the allowed keys in it, times
    the Gaussian for local-p; zero for a query with none."""
    q, k, v = q.detach().double(), k.detach().double(), v.detach().double()
    b, i, j = q.shape[0], q.shape[1], k.shape[1]
    logits = ref_logits(name, q, k, params)
    weights = torch.zeros(b, i, j, dtype=torch.float64)
    for r in range(b):
        size = j if lengths is None else int(lengths[r])
        for t in range(i):
            if local.predictive:
                w_p, v_p = local.w_p.weight.detach().double(), local.v_p.weight.detach().double()
                p = size * torch.sigmoid(v_p @ torch.tanh(w_p @ q[r, t]))[0]
            else:
                p = torch.tensor(float(t), dtype=torch.float64)
            inside = [
                s
                for s in range(size)
                if abs(s - float(p)) <= local.window and (mask is None or mask[r, t, s])
            ]
            if not inside:
                continue
            align = torch.softmax(logits[r, t, inside], 0)
            if local.predictive:
                s = torch.tensor(inside, dtype=torch.float64)
                align = align * torch.exp(-((s - p) ** 2) / (2 * (local.window / 2) ** 2))
            weights[r, t, inside] = align
    return weights @ v, weights


def local_of(name, predictive, window):
    score, params = make(name)
    local = LocalAttention(score, window=window, d_query=D if predictive else None)
    return local, params


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("predictive", [False, True])
@pytest.mark.parametrize(("i", "j"), [(7, 17), (17, 7), (1, 143)])
@pytest.mark.parametrize("given_lengths", [False, True])
def test_both_modes_equal_float64_reference(name, predictive, i, j, given_lengths):
    torch.manual_seed(i + j)
    local, params = local_of(name, predictive, window=2)
    q, k, v = torch.randn(3, i, D), torch.randn(3, j, D), torch.randn(3, j, 5)
    mask = torch.rand(3, i, j) > 0.2
    lengths = torch.tensor([j, max(1, j // 2), 1]) if given_lengths else None
    out = local(q, k, v, mask=mask, lengths=lengths)
    context, weights = reference(local, name, params, q, k, v, mask, lengths)
    torch.testing.assert_close(out.weights.double(), weights, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.context.double(), context, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("predictive", [False, True])
def test_gradcheck_both_modes(name, predictive):
    """With padding and a query whose window holds no key (local-m: query 5 of 6 over 3
    keys, window 1) or a masked row."""
    torch.manual_seed(2)
    local, _ = local_of(name, predictive, window=1)
    local = local.double()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 6, 3, dtype=torch.bool)
    mask[1, 1] = False
    lengths = torch.tensor([3, 2])
    assert torch.autograd.gradcheck(
        lambda q, k, v: local(q, k, v, mask=mask, lengths=lengths).context, (q, k, v)
    )


@settings(deadline=None, max_examples=40)
@given(
    name=st.sampled_from(NAMES),
    predictive=st.booleans(),
    i=st.integers(1, 12),
    j=st.integers(1, 12),
    window=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_properties(name, predictive, i, j, window, seed):
    """local-m rows sum to 1 (0 for a query with no key allowed), local-p rows to at most
    1; weights outside the window or masked are exactly 0; a query with none allowed gets a
    zero context and finite gradients."""
    torch.manual_seed(seed)
    local, _ = local_of(name, predictive, window)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, i, D, generator=g, requires_grad=True)
    k = torch.randn(2, j, D, generator=g, requires_grad=True)
    v = torch.randn(2, j, 3, generator=g, requires_grad=True)
    mask = torch.rand(2, i, j, generator=g) > 0.3
    out = local(q, k, v, mask=mask)
    # p_t written out (Luong eq. 9 for local-p with S = j; t for local-m), not the module's
    # own `centers`: a shifted centre passed this test when it read that
    with torch.no_grad():
        if predictive:
            w_p, v_p = local.w_p.weight, local.v_p.weight  # (h, d), (1, h)
            b_p = local.w_p.bias if local.w_p.bias is not None else torch.zeros(w_p.shape[0])
            p = j * torch.sigmoid(torch.tanh(q @ w_p.T + b_p) @ v_p.T).squeeze(-1)  # (2, i)
        else:
            p = torch.arange(i, dtype=torch.float32).expand(2, i)
    inside = (torch.arange(j)[None, None] - p[..., None]).abs() <= window
    allowed = inside & mask
    assert (out.weights[~allowed] == 0).all()
    sums = out.weights.sum(-1)
    if predictive:
        assert (sums <= 1 + 1e-5).all()
    else:
        torch.testing.assert_close(sums, allowed.any(-1).float())
    assert (out.context[~allowed.any(-1)] == 0).all()
    (out.context * torch.randn_like(out.context)).sum().backward()
    for t in (q, k, v, *local.parameters()):
        assert t.grad is None or torch.isfinite(t.grad).all()
