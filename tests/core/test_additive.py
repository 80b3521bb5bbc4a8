import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnzoo.core import additive
from attnzoo.core.additive import additive_attention, additive_logits
from tests.core.reference import ref_attention


def plain_logits(a, b, v):
    return torch.tanh(a.double()[..., :, None, :] + b.double()[..., None, :, :]) @ v.double()


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Force many blocks (and partial last blocks) even at small sizes."""
    monkeypatch.setattr(additive, "BLOCK_ELEMENTS", 37)


@pytest.mark.parametrize("i,j", [(1, 1), (7, 17), (17, 7), (143, 9)])
def test_logits_match_plain(i, j, tiny_blocks):
    a, b, v = torch.randn(2, i, 5), torch.randn(2, j, 5), torch.randn(5)
    torch.testing.assert_close(
        additive_logits(a, b, v).double(), plain_logits(a, b, v), rtol=1e-5, atol=1e-5
    )


def test_logits_gradcheck(tiny_blocks):
    a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(additive_logits, (a, b, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("use_mask", [False, True])
def test_fused_gradcheck(causal, window, use_mask, tiny_blocks):
    a = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, dtype=torch.float64, requires_grad=True)
    val = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 4, 5) > 0.3 if use_mask else None
    if use_mask:
        mask[0, 1] = False  # one fully masked row

    def f(a, b, v, val):
        return additive_attention(a, b, v, val, mask=mask, causal=causal, window=window)

    assert torch.autograd.gradcheck(f, (a, b, v, val))


@given(
    i=st.integers(1, 20),
    j=st.integers(1, 20),
    n=st.integers(1, 3),
    heads=st.booleans(),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 4)),
    block=st.sampled_from([1, 13, 1 << 22]),
    seed=st.integers(0, 2**16),
)
def test_fused_equals_float64_reference(i, j, n, heads, causal, window, block, seed):
    """chunked == plain, for every blocking, mask and shape."""
    g = torch.Generator().manual_seed(seed)
    lead = (n, 2) if heads else (n,)
    a, b = torch.randn(*lead, i, 4, generator=g), torch.randn(*lead, j, 4, generator=g)
    v, val = torch.randn(4, generator=g), torch.randn(*lead, j, 3, generator=g)
    mask = torch.rand(n, 1, j, generator=g) > 0.3  # padding-style, broadcast over queries
    if heads:
        mask = mask.unsqueeze(1)
    geo = torch.ones(i, j, dtype=torch.bool)
    if causal:
        geo &= torch.arange(j)[None] <= torch.arange(i)[:, None]
    if window is not None:
        geo &= (torch.arange(j)[None] - torch.arange(i)[:, None]).abs() <= window
    old = additive.BLOCK_ELEMENTS
    additive.BLOCK_ELEMENTS = block
    try:
        out = additive_attention(a, b, v, val, mask=mask, causal=causal, window=window)
    finally:
        additive.BLOCK_ELEMENTS = old
    expected, _ = ref_attention(plain_logits(a, b, v), val, mask & geo)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


def test_fused_backward_equals_plain_autograd(tiny_blocks):
    a = torch.randn(3, 9, 6, requires_grad=True)
    b = torch.randn(3, 11, 6, requires_grad=True)
    v = torch.randn(6, requires_grad=True)
    val = torch.randn(3, 11, 4, requires_grad=True)
    mask = torch.rand(3, 9, 11) > 0.2
    grad = torch.randn(3, 9, 4)
    out = additive_attention(a, b, v, val, mask=mask)
    mine = torch.autograd.grad(out, (a, b, v, val), grad)
    ad, bd, vd, vald = (t.detach().double().requires_grad_() for t in (a, b, v, val))
    ref, _ = ref_attention(plain_logits(ad, bd, vd), vald, mask)
    theirs = torch.autograd.grad(ref, (ad, bd, vd, vald), grad.double())
    for m, t in zip(mine, theirs, strict=True):
        torch.testing.assert_close(m.double(), t, rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_zero_and_finite_gradient():
    a = torch.randn(1, 3, 4, requires_grad=True)
    b = torch.randn(1, 5, 4, requires_grad=True)
    v = torch.randn(4, requires_grad=True)
    val = torch.randn(1, 5, 2, requires_grad=True)
    mask = torch.zeros(1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1] = True
    out = additive_attention(a, b, v, val, mask=mask)
    assert (out[0, 1:] == 0).all()
    out.sum().backward()
    for t in (a, b, v, val):
        assert torch.isfinite(t.grad).all()
    assert (a.grad[0, 1:] == 0).all()


def test_bfloat16_runs_close_to_the_float64_reference():
    a, b, v, val = (
        torch.randn(2, 16, 8),
        torch.randn(2, 16, 8),
        torch.randn(8),
        torch.randn(2, 16, 4),
    )
    ref, _ = ref_attention(plain_logits(a, b, v), val)
    low = additive_attention(*(t.bfloat16() for t in (a, b, v, val)))
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_weights_sum_to_one_across_blocks(dtype, tiny_blocks):
    """Values of ones give a context of ones: each row's weights sum to 1. The log-sum-exp of a
    half-precision row is kept in float32: in bf16 its rounding (0.06 near 8) scaled whole rows
    of weights by up to exp(0.06)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 9, 8, generator=g), torch.randn(2, 301, 8, generator=g)
    v = 20 * torch.randn(8, generator=g)  # large logits: a log-sum-exp far from 0
    ones = torch.ones(2, 301, 1)
    context = additive_attention(*(t.to(dtype) for t in (a, b, v, ones))).float()
    torch.testing.assert_close(context, torch.ones_like(context), rtol=0, atol=2**-7)


@pytest.mark.parametrize("where", ["query", "key", "v"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_the_public_kernels_never_turn_garbage_into_a_number(where, bad):
    """tanh saturates: an infinite projected query, key or v gave finite logits and context
    from `additive_logits` and `additive_attention` (attention() probed; these did not)."""
    torch.manual_seed(0)
    q, k, value = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    v = torch.randn(4)
    {"query": q[0, 1], "key": k[0, 2], "v": v}[where][0] = bad
    logits = additive_logits(q, k, v)
    context = additive_attention(q, k, v, value)
    rows = slice(None) if where == "v" else 0  # v reaches every row; a query or key, row 0's
    if where == "query":
        assert logits[0, 1].isnan().all() and context[0, 1].isnan().all()
        assert logits[0, 0].isfinite().all() and context[0, 0].isfinite().all()
    else:
        assert not logits[rows].isfinite().all() and context[rows].isnan().any()
    assert logits[1].isfinite().all() == context[1].isfinite().all() == (where != "v")
    # the same garbage in padding the mask excludes never reaches the context
    if where == "key":
        mask = torch.ones(2, 1, 5, dtype=torch.bool)
        mask[0, 0, 2] = False
        assert additive_attention(q, k, v, value, mask).isfinite().all()
