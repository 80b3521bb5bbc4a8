import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnzoo
from attnzoo import PreparedKey, attention, padding_mask, prepare_key, scores
from attnzoo.core.scores import _PAD_MAX_DIM, _PLAIN_WEIGHTS_MAX_KEYS, _UPCAST_MAX_KEYS
from tests.core.reference import ref_attention, ref_logits
from tests.core.test_scores import make

NAMES = list(scores.SCORES)  # the code's registry: a new score is tested here as it lands


def geometric(i, j, causal, window):
    m = torch.ones(i, j, dtype=torch.bool)
    if causal:
        m &= torch.arange(j)[None] <= torch.arange(i)[:, None]
    if window is not None:
        m &= (torch.arange(j)[None] - torch.arange(i)[:, None]).abs() <= window
    return m


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize(("i", "j", "heads"), [(7, 17, False), (17, 7, True), (1, 143, False)])
@pytest.mark.parametrize("causal", [False, True])
# d_key is 6; on the CPU the dot family's SDPA: d_value 5 and 13 padded to the kernel (value,
# then query and key), 6 the kernel as it is, the widest the math backend
@pytest.mark.parametrize("d_value", [5, 6, 13, _PAD_MAX_DIM + 8])
def test_every_path_equals_float64_reference(name, return_weights, i, j, heads, causal, d_value):
    score, params = make(name)
    lead = (2, 3) if heads else (2,)
    q, k, v = torch.randn(*lead, i, 6), torch.randn(*lead, j, 6), torch.randn(*lead, j, d_value)
    mask = torch.rand(2, *([1] if heads else []), 1, j) > 0.3
    out = attention(q, k, v, score=score, mask=mask, causal=causal, return_weights=return_weights)
    full = mask & geometric(i, j, causal, None)
    expected, weights = ref_attention(ref_logits(name, q, k, params), v, full)
    torch.testing.assert_close(out.context.double(), expected, rtol=1e-4, atol=1e-5)
    if return_weights:
        torch.testing.assert_close(out.weights.double(), weights, rtol=1e-4, atol=1e-6)
    else:
        assert out.weights is None


@pytest.mark.parametrize(("d_key", "d_value"), [(2, 16), (6, 5), (6, _PAD_MAX_DIM + 1)])
def test_unequal_key_and_value_widths_reach_the_kernel_padded_up_to_the_limit(
    monkeypatch, d_key, d_value
):
    """SDPA's CPU kernel wants d_key == d_value: up to `_PAD_MAX_DIM` the narrower side is
    padded with zero columns (the kernel then runs, not the math path holding every logit),
    beyond it the call goes as it is; the output has d_value columns either way."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(2, 7, d_key), torch.randn(2, 17, d_key), torch.randn(2, 17, d_value)
    out = attention(q, k, v, score="dot").context
    assert out.shape == (2, 7, d_value)
    width = max(d_key, d_value)
    padded = width <= _PAD_MAX_DIM
    assert seen == [(width, width, width) if padded else (d_key, d_key, d_value)]


@pytest.mark.parametrize(
    "name", [n for n in NAMES if isinstance(scores.SCORES[n](6, 6, None, 17), scores.DotFamily)]
)
@pytest.mark.parametrize("d_value", [3, 6, 13, _PAD_MAX_DIM + 8])  # as above
@pytest.mark.parametrize("causal", [False, True])
def test_strided_views_follow_the_float64_reference_with_gradients(name, d_value, causal):
    """Query, key and value as transposed views (last stride != 1, as a convolution's
    `(b, C, N) -> (b, N, C)` gives them): the context and every input's gradient."""
    score, params = make(name)
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, d, n).transpose(1, 2) for d, n in ((6, 7), (6, 17), (d_value, 17)))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.rand(2, 1, 17) > 0.3
    out = attention(q, k, v, score=score, mask=mask, causal=causal).context
    up = torch.randn_like(out)
    grads = torch.autograd.grad((out * up).sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    full = mask & geometric(7, 17, causal, None)
    expected, _ = ref_attention(ref_logits(name, q64, k64, params), v64, full)
    expected_grads = torch.autograd.grad((expected * up.double()).sum(), (q64, k64, v64))
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("j", [17, _PLAIN_WEIGHTS_MAX_KEYS + 1])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_weights_on_either_path_follow_the_float64_reference_with_gradients(
    monkeypatch, j, grad, causal
):
    """Asked for weights, the dot family forms them on the plain path (logits once) unless a
    backward runs over more than `_PLAIN_WEIGHTS_MAX_KEYS` keys, where SDPA gives the context
    beside the weights' own graph: both give the reference's context, weights and gradients
    (a loss of both, so the weights' backward runs too)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda *a, **kw: calls.append(1) or real(*a, **kw),
    )
    g = torch.Generator().manual_seed(j)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (7, j, j))
    mask = torch.rand(2, 1, 1, j, generator=g) > 0.3
    mask[..., 0] = True
    for t in (q, k, v):
        t.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = attention(q, k, v, score="scaled_dot", mask=mask, causal=causal, return_weights=True)
    assert len(calls) == (1 if grad and j > _PLAIN_WEIGHTS_MAX_KEYS else 0)
    q64, k64, v64 = (t.detach().double().requires_grad_(grad) for t in (q, k, v))
    full = mask & geometric(7, j, causal, None)
    context, weights = ref_attention(ref_logits("scaled_dot", q64, k64), v64, full)
    torch.testing.assert_close(out.context.double(), context, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.weights.double(), weights, rtol=1e-4, atol=1e-6)
    if grad:
        up, up_w = torch.randn(context.shape, generator=g), torch.randn(weights.shape, generator=g)
        loss = (out.context * up).sum() + (out.weights * up_w).sum()
        want = (context * up.double()).sum() + (weights * up_w.double()).sum()
        grads = torch.autograd.grad(loss, (q, k, v))
        for got, expected in zip(grads, torch.autograd.grad(want, (q64, k64, v64)), strict=True):
            torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("geometry", [{}, {"causal": True}, {"window": 1}])
def test_gradcheck_through_attention(name, geometry):
    """Every score, with padding, causal or window geometry and a fully masked row (row 2
    of example 1; with the window, query 0 of example 1 too: its window holds only a padded
    key), with and without weights."""
    score, _ = make(name)
    score = score.double()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])[:, None]
    mask = mask.expand(2, 3, 4).clone()
    mask[1, 2] = False
    for rw in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v, rw=rw: (
                attention(q, k, v, score=score, mask=mask, return_weights=rw, **geometry).context
            ),
            (q, k, v),
        )


@pytest.mark.parametrize("name", NAMES)
def test_gradgradcheck_through_a_masked_call(name):
    """Second derivatives (create_graph) through a call with padding: the selection that clears
    the padding had a backward autograd could not see through, so the gradients came back
    detached and a double backward lost every term through the keys and values. The paths
    with weights (plain autograd; SDPA's CPU backward has no derivative of its own)."""
    score, _ = make(name)
    score = score.double()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])[:, None]
    assert torch.autograd.gradgradcheck(
        lambda k, v: attention(q, k, v, score=score, mask=mask, return_weights=True).context,
        (k, v),
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize(("i", "j"), [(7, 17), (17, 7)])
def test_window_and_per_query_head_masks_equal_float64_reference(name, causal, window, i, j):
    """The window geometry, and masks per query and per head (not only padding), against
    the float64 reference."""
    score, params = make(name)
    g = torch.Generator().manual_seed(i * j + window)
    q, k, v = (torch.randn(2, 3, n, 6, generator=g) for n in (i, j, j))
    mask = torch.rand(2, 3, i, j, generator=g) > 0.3
    out = attention(
        q, k, v, score=score, mask=mask, causal=causal, window=window, return_weights=True
    )
    full = mask & geometric(i, j, causal, window)
    expected, weights = ref_attention(ref_logits(name, q, k, params), v, full)
    torch.testing.assert_close(out.context.double(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.weights.double(), weights, rtol=1e-4, atol=1e-6)
    plain = attention(q, k, v, score=score, mask=mask, causal=causal, window=window)
    torch.testing.assert_close(plain.context.double(), expected, rtol=1e-4, atol=1e-5)


@given(
    name=st.sampled_from(NAMES),
    i=st.integers(1, 12),
    j=st.integers(1, 12),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 3)),
    seed=st.integers(0, 2**16),
)
def test_properties(name, i, j, causal, window, seed):
    """weights sum to 1 (or 0 for a row with nothing allowed), masked weights exactly 0,
    return_weights on == off, broadcast mask == expanded mask."""
    g = torch.Generator().manual_seed(seed)
    score, _ = make(name)
    q, k, v = (torch.randn(2, n, 6, generator=g) for n in (i, j, j))
    mask = torch.rand(2, 1, j, generator=g) > 0.4
    on = attention(
        q, k, v, score=score, mask=mask, causal=causal, window=window, return_weights=True
    )
    off = attention(q, k, v, score=score, mask=mask, causal=causal, window=window)
    expanded = attention(
        q, k, v, score=score, mask=mask.expand(2, i, j).contiguous(), causal=causal, window=window
    )
    allowed = mask & geometric(i, j, causal, window)
    rows = allowed.any(-1).to(on.weights.dtype)
    torch.testing.assert_close(on.weights.sum(-1), rows)
    assert (on.weights[~allowed] == 0).all()
    torch.testing.assert_close(on.context, off.context, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(expanded.context, off.context, rtol=1e-4, atol=1e-5)
    assert (off.context[~allowed.any(-1)] == 0).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("return_weights", [False, True])
def test_fully_masked_row_zero_output_finite_gradient(name, return_weights):
    score, _ = make(name)
    q = torch.randn(2, 3, 6, requires_grad=True)
    k = torch.randn(2, 4, 6, requires_grad=True)
    v = torch.randn(2, 4, 5, requires_grad=True)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[1, 2] = False
    out = attention(q, k, v, score=score, mask=mask, return_weights=return_weights)
    assert (out.context[1, 2] == 0).all()
    out.context.sum().backward()
    for t in (q, k, v):
        assert t.grad is None or torch.isfinite(t.grad).all()  # location ignores key content


@pytest.mark.parametrize("name", NAMES)
def test_no_causal_leak_by_gradient(name):
    """Output i must not depend on keys or values at positions > i."""
    score, _ = make(name)
    q = torch.randn(1, 6, 6)
    k = torch.randn(1, 6, 6, requires_grad=True)
    v = torch.randn(1, 6, 5, requires_grad=True)
    out = attention(q, k, v, score=score, causal=True)
    for i in range(6):
        gk, gv = torch.autograd.grad(
            out.context[0, i].sum(),
            (k, v),
            retain_graph=True,
            allow_unused=True,
            materialize_grads=True,
        )
        assert (gk[0, i + 1 :] == 0).all() and (gv[0, i + 1 :] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("return_weights", [False, True])
def test_large_norm_queries_and_keys_with_logits_near_minus_2e4_follow_the_reference(
    dtype, return_weights
):
    """Feature 0 of the queries is -141.4 and of the keys +141.4: every dot logit is shifted
    by -2e4, which softmax ignores. Masked logits filled with a finite -1e4 stood above the
    allowed ones (the weights summed to 0, the context was off by 2.8); filled with the
    dtype's minimum they stay below. Context and weights against the float64 reference,
    under a per-query mask with a fully masked row."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, n, 8, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    q[..., 0], k[..., 0] = -(2e4**0.5), 2e4**0.5
    q, k, v = (t.to(dtype) for t in (q, k, v))
    mask = torch.rand(2, 5, 7, generator=g) > 0.4
    mask[..., 1] = True
    mask[1, 2] = False  # nothing to attend: a zero row
    logits = ref_logits("dot", q, k)
    assert (logits < -1.9e4).all()
    expected, weights = ref_attention(logits, v, mask)
    out = attention(q, k, v, score="dot", mask=mask, return_weights=return_weights)
    tol = dict(rtol=0, atol=5e-3) if dtype == torch.float32 else {}  # logits' rounding at 2e4
    torch.testing.assert_close(out.context.double(), expected, **tol)
    if return_weights:
        torch.testing.assert_close(out.weights.double(), weights, **tol)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("return_weights", [False, True])
def test_dropout_zero_in_eval_and_changes_context_in_training(name, return_weights):
    """Every score, with and without weights (the additive score's fused kernel, which
    never holds the weights, ran under dropout and dropped nothing): dropout 0 gives the
    float64 reference; dropout 0.5 gives in each row one of the 2^3 inverted-dropout
    contexts of the reference's weights (each weight kept and doubled, or dropped), never
    the context without dropout, and reports the weights before dropout."""
    score, params = make(name)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, n, 6, generator=g) for n in (5, 3, 3))
    want, want_w = ref_attention(ref_logits(name, q, k, params), v)
    b = attention(q, k, v, score=score, dropout=0.0, return_weights=return_weights)
    torch.testing.assert_close(b.context.double(), want, rtol=1e-4, atol=1e-5)
    torch.manual_seed(3)
    a = attention(q, k, v, score=score, dropout=0.5, return_weights=return_weights)
    if return_weights:  # weights reported before dropout
        torch.testing.assert_close(a.weights.double(), want_w, rtol=1e-4, atol=1e-6)
    else:
        assert a.weights is None
    kept = torch.tensor(list(itertools.product([0.0, 2.0], repeat=3)), dtype=torch.float64)
    candidates = (want_w.detach()[None] * kept[:, None, None]) @ v.double()  # (8, b, i, d_value)
    nearest = (candidates - a.context.double()).abs().amax(-1).amin(0)  # (b, i)
    assert (nearest < 1e-5).all(), nearest
    assert not torch.allclose(a.context, b.context)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("return_weights", [False, True])
def test_dropout_keeps_masks_causality_and_its_expectation(name, return_weights):
    """Under dropout: a fully masked row stays exactly zero with finite gradients, no causal
    leak, and the mean context over many draws is the context without dropout (inverted
    dropout: kept weights scaled by 1 / (1 - p)), on the fused and the plain path alike."""
    score, _ = make(name)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 5, 6, generator=g)
    k = torch.randn(2, 5, 6, generator=g, requires_grad=True)
    v = torch.randn(2, 5, 3, generator=g, requires_grad=True)
    mask = torch.ones(2, 5, 5, dtype=torch.bool)
    mask[1, 3] = False
    options = dict(score=score, mask=mask, causal=True, return_weights=return_weights)
    want = attention(q, k, v, **options).context.detach()
    torch.manual_seed(7)
    draws = 4000  # as many copies of the batch, one call
    copies = [t.detach().repeat(draws, 1, 1) for t in (q, k, v)]
    many = dict(options, mask=mask.repeat(draws, 1, 1))
    mean = attention(*copies, dropout=0.3, **many).context.view(draws, *want.shape).mean(0)
    out = attention(q, k, v, dropout=0.3, **options).context
    assert (out[1, 3] == 0).all()
    for i in range(5):  # no causal leak: context i reads no key or value after i
        gk, gv = torch.autograd.grad(
            out[:, i].sum(), (k, v), retain_graph=True, allow_unused=True, materialize_grads=True
        )  # (location reads no key content)
        assert (gk[:, i + 1 :] == 0).all() and (gv[:, i + 1 :] == 0).all()
        assert torch.isfinite(gk).all() and torch.isfinite(gv).all()
    # the mean of 4000 draws: within 5 standard errors of a weight's Bernoulli noise
    torch.testing.assert_close(mean, want, rtol=0, atol=5 * 3 * (0.3 / 0.7 / draws) ** 0.5)


def test_prepared_key_reused_across_steps():
    score = scores.Additive(4, 4, 8)
    k, v = torch.randn(2, 9, 4), torch.randn(2, 9, 3)
    prepared = prepare_key(score, k)
    assert isinstance(prepared, PreparedKey)
    q = torch.randn(2, 1, 4)
    torch.testing.assert_close(
        attention(q, prepared, v, score=score).context, attention(q, k, v, score=score).context
    )
    with pytest.raises(ValueError, match="same score"):
        attention(q, prepared, v, score=scores.Additive(4, 4, 8))


def test_window_is_local_m():
    q, k, v = torch.randn(1, 5, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 2)
    out = attention(q, k, v, score="dot", window=1, return_weights=True)
    assert (out.weights[0, 0, 2:] == 0).all() and (out.weights[0, 4, :3] == 0).all()


BAD = [
    (dict(query=torch.randn(2, 3)), ValueError, "'query'.*rank 3 or 4"),
    (dict(key=torch.randn(2, 4, 6).double()), TypeError, "'key'.*torch.float32.*float64"),
    (dict(value=torch.randn(2, 5, 6)), ValueError, "'value'.*key_len = 4.*5"),
    (dict(mask=torch.ones(2, 3, 4)), TypeError, "'mask'.*torch.bool.*float32"),
    (dict(mask=torch.ones(2, 3, 5, dtype=torch.bool)), ValueError, "'mask'.*broadcastable"),
    (dict(dropout=1.0), ValueError, "'dropout'.*\\[0, 1\\).*1.0"),
    (dict(window=0), ValueError, "'window'.*positive.*0"),
    (dict(score="bogus"), ValueError, "'score'.*scaled_dot.*bogus"),
    (dict(score=3), TypeError, "'score'"),
    (dict(key=torch.randn(3, 4, 6)), ValueError, "'key'.*leading dims"),
    (dict(mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, "'mask'.*rank 3.*\\(3, 4\\)"),
]


def test_a_mask_of_fewer_dims_than_the_weights_is_refused():
    """It would line up from the right: with batch == heads a (batch, 1, key_len) padding
    mask of 4-D attention was read as (heads, 1, key_len), each row's padding applied to
    another head, and with batch == query_len a (batch, key_len) one as (query_len,
    key_len); the weight on row 1's padding summed to 24.6. The full rank, each dim 1 or the
    weights' size, names the batch."""
    q, k, v = torch.randn(8, 8, 5, 16), torch.randn(8, 8, 6, 16), torch.randn(8, 8, 6, 16)
    mask = padding_mask(torch.tensor([6, 1, 2, 3, 4, 5, 6, 2]), 6)  # (8, 1, 6)
    for name, call in (("attention", attention), ("prepare_key", None)):
        with pytest.raises(ValueError, match=rf"{name}: argument 'mask' expected rank 4"):
            if call is None:
                prepare_key("scaled_dot", k, value=v, mask=mask)
            else:
                attention(q, k, v, score="scaled_dot", mask=mask)
    out = attention(q, k, v, score="scaled_dot", mask=mask.unsqueeze(1), return_weights=True)
    assert (out.weights[1, :, :, 1:] == 0).all()
    with pytest.raises(ValueError, match="'mask' expected rank 3"):  # (batch, key_len), b == i
        attention(q[:, :, 0], k[:, 0], v[:, 0], score="dot", mask=torch.ones(8, 6).bool())


@pytest.mark.parametrize(("override", "error", "pattern"), BAD)
def test_bad_input_names_argument_expected_and_received(override, error, pattern):
    args = dict(
        query=torch.randn(2, 3, 6),
        key=torch.randn(2, 4, 6),
        value=torch.randn(2, 4, 6),
        score="dot",
    )
    args.update(override)
    with pytest.raises(error, match=pattern):
        attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)


# in bf16 on CPU, short keys with a backward run the kernel in float32 (`_slow_half`), long
# keys or no backward in bf16: every branch, with bf16 inputs and with fp32 ones under autocast
@pytest.mark.parametrize("j", [17, 143, _UPCAST_MAX_KEYS + 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_bf16_dot_family_follows_the_float64_reference(j, causal, grad, autocast):
    g = torch.Generator().manual_seed(j)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g, dtype=torch.float64) for n in (7, j, j))
    mask = torch.rand(2, 1, 7, j, generator=g) > 0.2
    mask[..., 0] = True
    full = mask & torch.ones(7, j, dtype=torch.bool).tril() if causal else mask
    inputs = [t.float() if autocast else t.bfloat16() for t in (q, k, v)]
    for t in (q, k, v, *inputs):
        t.requires_grad_(grad)
    want, _ = ref_attention(ref_logits("scaled_dot", q, k), v, full)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        got = attention(*inputs, score="scaled_dot", mask=mask, causal=causal).context
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)
    if grad:
        seed = torch.randn(want.shape, generator=g, dtype=torch.float64)
        wanted = torch.autograd.grad(want, (q, k, v), seed)
        for a, b in zip(torch.autograd.grad(got, inputs, seed.bfloat16()), wanted, strict=True):
            torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("j", [17, 140], ids=["one-block", "blocks"])
def test_mixed_dtypes_under_autocast_follow_the_float64_reference(monkeypatch, name, j):
    """Under autocast a decoder's query comes out of a projection in bfloat16 beside float32
    keys and values (Bahdanau's annotations): attention() refused the mix, so training those
    models with train.autocast=bf16 failed at the first step. The mix is promoted to one dtype,
    as an eager op would, and the result follows the reference."""
    from attnzoo.core import additive

    monkeypatch.setattr(additive, "BLOCK_ELEMENTS", 4096 if j == 140 else additive.BLOCK_ELEMENTS)
    score, params = make(name)
    g = torch.Generator().manual_seed(j)
    q, k, v = (torch.randn(2, n, 6, generator=g, dtype=torch.float64) for n in (3, j, j))
    mask = torch.rand(2, 1, j, generator=g) > 0.2
    mask[..., 0] = True
    want, _ = ref_attention(ref_logits(name, q, k, params), v, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention(q.bfloat16(), k.float(), v.float(), score=score, mask=mask).context
    torch.testing.assert_close(got.double(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("weights", [False, True], ids=["fused", "logits"])
def test_additive_blocks_under_autocast_train_in_the_one_block_dtype(monkeypatch, weights):
    """Past BLOCK_ELEMENTS the additive kernels are autograd Functions whose backward runs
    outside autocast: under bf16 autocast the forward ran, the backward failed ('addmv input
    tensors must have the same dtype': a bf16 block times the float32 v), and the fused
    kernel's context came out float32 where one block gives bf16. Both run in autocast's dtype:
    the one block's dtype, gradients that follow the float64 reference."""
    from attnzoo.core import additive

    score, params = make("additive")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, n, 6, generator=g, dtype=torch.float64) for n in (3, 140, 140))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = torch.rand(2, 1, 140, generator=g) > 0.2
    want, want_w = ref_attention(ref_logits("additive", q, k, params), v, mask)
    seed = torch.randn(want.shape, generator=g, dtype=torch.float64)
    wanted = torch.autograd.grad(want, (q, k, v), seed)
    inputs = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    got = {}
    for block in (additive.BLOCK_ELEMENTS, 4096):  # one block, then blocks
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attention(*inputs, score=score, mask=mask, return_weights=weights)
        got[block] = out.context.dtype
        torch.testing.assert_close(out.context.double(), want, atol=5e-2, rtol=5e-2)
        if weights:
            torch.testing.assert_close(out.weights.double(), want_w, atol=2e-2, rtol=0)
        grads = torch.autograd.grad(out.context, inputs, seed.to(out.context.dtype))
        for a, b in zip(grads, wanted, strict=True):
            torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)
    assert set(got.values()) == {torch.bfloat16}


@pytest.mark.parametrize("block", [None, 1024], ids=["one-block", "blocks"])
def test_bf16_additive_logits_err_with_the_logit_not_with_the_size_of_v(monkeypatch, block):
    """The kernels evaluate v^T tanh(x) as (2 v)^T sigmoid(2 x) - sum(v): in bf16 the product,
    near sum(v), was rounded before the subtraction, so the error grew with sum |v| (0.29 at
    logits up to 20 with v = 4 * ones(16); a plain bf16 tanh form errs by 0.07 there). In half
    precision the sigmoids are centred first, so the product is the logit itself. Against a
    float64 reference on the same bf16 values, logits, context and gradients."""
    from attnzoo.core import additive

    if block:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, 16, generator=g) * 0.5, torch.randn(2, 32, 16, generator=g) * 0.5
    v, values = 4 * torch.ones(16), torch.randn(2, 32, 8, generator=g)
    low = [t.bfloat16().requires_grad_(True) for t in (q, k, v, values)]
    ref = [t.detach().double().requires_grad_(True) for t in low]
    want = torch.tanh(ref[0].unsqueeze(-2) + ref[1].unsqueeze(-3)) @ ref[2]
    assert want.abs().max() > 16  # logits of tens: their own bf16 rounding is 0.06
    logits = additive.additive_logits(*low[:3])
    assert (logits.double() - want).abs().max() < 0.15
    context = additive.additive_attention(*low)
    want_context = torch.softmax(want, -1) @ ref[3]
    assert (context.double() - want_context).abs().max() < 0.06
    seed = torch.randn(want_context.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(context, low, seed.bfloat16())
    for got, wanted in zip(grads, torch.autograd.grad(want_context, ref, seed), strict=True):
        assert (got.double() - wanted).abs().max() <= 0.05 * wanted.abs().max() + 0.05


def test_additive_under_autocast_centres_one_block_and_leaves_float64_alone(monkeypatch):
    """Float32 inputs under bf16 autocast on one block (an RNN decoder's step): the sigmoids
    stay float32 and autocast's bf16 product comes from the centred block (it erred by 0.33
    at logits near 13 with v = 4 * ones(16)). Float64 inputs, which autocast never casts, give
    float64 and what they give without autocast, on one block and on blocks."""
    from attnzoo.core import additive

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, 16, generator=g) * 0.3, torch.randn(2, 16, 16, generator=g) * 0.3
    v = 4 * torch.ones(16)
    want = torch.tanh(q.double().unsqueeze(-2) + k.double().unsqueeze(-3)) @ v.double()
    assert want.abs().max() > 10
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = additive._additive_logits(q, k, v)
    assert got.dtype == torch.bfloat16 and (got.double() - want).abs().max() < 0.1
    values = torch.randn(2, 16, 8, generator=g, dtype=torch.float64)
    wide = (q.double(), k.double(), v.double(), values)
    for block in (additive.BLOCK_ELEMENTS, 256):
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        plain = additive.additive_attention(*wide)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = additive.additive_attention(*wide)
        assert under.dtype == torch.float64
        torch.testing.assert_close(under, plain, rtol=1e-12, atol=1e-12)


def test_bf16_additive_gradient_keeps_small_sigmoids(monkeypatch):
    """tanh'(x) = 4 s (1 - s) with s = sigmoid(2 x): the blockwise bf16 backward took it from
    the centred s - 1/2, which rounds a small s away: at x = -3.5 the gradient was 0. Against
    the float64 derivative on the negative side (the positive side is bf16's rounding of s
    near 1, as before)."""
    from attnzoo.core import additive

    x = torch.linspace(-3.5, -2.0, 7)
    q = x.view(1, -1, 1).expand(1, 7, 4).contiguous().bfloat16().requires_grad_(True)
    monkeypatch.setattr(additive, "BLOCK_ELEMENTS", 8)  # the blockwise Function's backward
    logits = additive._additive_logits(q, torch.zeros(1, 1, 4).bfloat16(), torch.ones(4).bfloat16())
    (grad,) = torch.autograd.grad(logits.sum(), q)
    want = 1 - torch.tanh(q.detach().double()) ** 2
    assert ((grad.double() - want).abs() / want).max() < 0.05


@pytest.mark.parametrize("j", [17, _PLAIN_WEIGHTS_MAX_KEYS + 1])
def test_weights_under_autocast_come_from_float32_logits(j):
    """Asked for weights under bf16 autocast, a float32 query took the plain path (short
    keys with a backward), whose product rounded the logits to bf16: at logits near 70 the
    weights were off by 0.06 and the context moved by 0.14 against the same call without
    weights. The weights' logits are formed in float32 beside the kernel's context, as for
    bf16 inputs, and take the context's dtype."""
    g = torch.Generator().manual_seed(j)
    q, k, v = (torch.randn(2, n, 16, generator=g, dtype=torch.float64) for n in (5, j, j))
    q = q * 8  # scaled-dot logits of tens
    _, want_w = ref_attention(ref_logits("dot", q, k), v)
    inputs = [t.float().requires_grad_(True) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bare = attention(*inputs, score="dot").context
        out = attention(*inputs, score="dot", return_weights=True)
    assert out.weights.dtype == out.context.dtype == torch.bfloat16
    assert torch.equal(out.context, bare)
    torch.testing.assert_close(out.weights.double(), want_w, atol=1e-2, rtol=0)


@pytest.mark.parametrize("name", ["scaled_dot", "additive", "general", "location"])
def test_a_key_prepared_with_its_mask_is_cleared_once_and_gives_the_same_result(name):
    """prepare_key(..., value=, mask=) clears padding once; attention() then skips it (the same
    mask and values) and gives what unprepared attention gives, padding garbage included."""
    torch.manual_seed(0)
    score = scores.make_score(name, 6, 6, d_hidden=5, max_keys=7)
    lengths = torch.tensor([7, 4, 2])
    mask = attnzoo.padding_mask(lengths, 7)  # (3, 1, 7)
    clean_k, clean_v = torch.randn(3, 7, 6), torch.randn(3, 7, 6)
    k, v = clean_k.clone(), clean_v.clone()
    k[~mask.squeeze(1)], v[~mask.squeeze(1)] = float("nan"), float("inf")  # padding garbage
    q = torch.randn(3, 2, 6)
    expected = attnzoo.attention(q, clean_k, clean_v, score=score, mask=mask)
    prepared = attnzoo.prepare_key(score, k, value=v, mask=mask)
    for weights in (False, True):
        out = attnzoo.attention(
            q, prepared, prepared.value, score=score, mask=prepared.mask, return_weights=weights
        )
        torch.testing.assert_close(out.context, expected.context)
    rows = torch.tensor([2, 0])
    picked = prepared.index_select(rows)
    out = attnzoo.attention(q[rows], picked, picked.value, score=score, mask=picked.mask)
    torch.testing.assert_close(out.context, expected.context[rows])


@pytest.mark.parametrize("shape", ["key_len", "broadcast"])
def test_index_select_keeps_a_mask_without_a_batch_dim(shape):
    """A (key_len,) or (1, 1, key_len) padding mask has no batch dim to select rows from: with
    as many rows as keys, the (key_len,) one was reordered over the keys (a wrong context), the
    other raised a bare IndexError. Both stay as they are, and the rows attend as unprepared."""
    torch.manual_seed(0)
    score = scores.make_score("scaled_dot", 4, 4)
    k, v, q = torch.randn(5, 5, 4), torch.randn(5, 5, 4), torch.randn(5, 1, 4)
    padding = torch.tensor([True, True, True, False, False])
    mask = padding if shape == "key_len" else padding.view(1, 1, 5)
    prepared = attnzoo.prepare_key(score, k, value=v, mask=mask)
    rows = torch.tensor([4, 3, 2, 1, 0])
    picked = prepared.index_select(rows)
    assert torch.equal(picked.mask, mask)
    out = attnzoo.attention(q[rows], picked, picked.value, score=score, mask=picked.mask)
    expected, _ = ref_attention(ref_logits("scaled_dot", q[rows], k[rows]), v[rows], padding)
    torch.testing.assert_close(out.context.double(), expected)


@pytest.mark.parametrize("name", ["scaled_dot", "additive"])
def test_the_prepared_mask_widened_in_place_keeps_the_cleared_keys_out(name):
    """PreparedKey.mask itself (the copy prepare_key keeps) widened in place: attention() took
    the changed copy as its record of the cleared keys and attended them as zero keys. The
    record is kept apart: the call gives the raw keys under the widened mask and the padding."""
    torch.manual_seed(0)
    score = scores.make_score(name, 6, 6, d_hidden=5)
    k, v, q = torch.randn(1, 5, 6), torch.randn(1, 5, 6), torch.randn(1, 2, 6)
    padding = torch.tensor([[[True, True, True, False, False]]])
    prepared = attnzoo.prepare_key(score, k, value=v, mask=padding)
    prepared.mask[..., 3] = True
    got = attnzoo.attention(q, prepared, prepared.value, score=score, mask=prepared.mask)
    expected = attnzoo.attention(q, k, v, score=score, mask=padding)
    torch.testing.assert_close(got.context, expected.context)


@pytest.mark.parametrize("name", ["scaled_dot", "additive", "general", "location"])
@pytest.mark.parametrize("given", ["none", "all", "per-query"])
def test_a_key_prepared_under_padding_keeps_it_under_another_mask(name, given):
    """The keys prepare_key cleared under its mask hold zeros: called with another mask (none,
    or one that allows them), they stay excluded, as attention() on the raw keys with that
    mask and the padding (they used to be attended as zero keys, a silently wrong context)."""
    torch.manual_seed(0)
    score = scores.make_score(name, 6, 6, d_hidden=5, max_keys=7)
    padding = attnzoo.padding_mask(torch.tensor([7, 4, 2]), 7)  # (3, 1, 7)
    k, v, q = torch.randn(3, 7, 6), torch.randn(3, 7, 6), torch.randn(3, 2, 6)
    prepared = attnzoo.prepare_key(score, k, value=v, mask=padding)
    mask = {
        "none": None,
        "all": torch.ones(3, 1, 7, dtype=torch.bool),
        "per-query": torch.rand(3, 2, 7) < 0.8,
    }[given]
    expected = attnzoo.attention(
        q, k, v, score=score, mask=padding if mask is None else mask & padding
    )
    for weights in (False, True):
        out = attnzoo.attention(
            q, prepared, prepared.value, score=score, mask=mask, return_weights=weights
        )
        torch.testing.assert_close(out.context, expected.context)


@pytest.mark.parametrize("given", [None, (3, 1, 7), (3, 2, 1, 7)])
def test_a_cross_attention_cache_keeps_the_padding_it_was_filled_under(given):
    """A cross-attention KVCache holds keys and values of memory cleared under the first
    step's mask: a later step with another mask (none, or one allowing the padding) keeps the
    padding excluded, as a fresh call with that mask and the padding."""
    torch.manual_seed(0)
    mha = attnzoo.MultiHeadAttention(8, 2).eval()
    x, memory = torch.randn(3, 1, 8), torch.randn(3, 7, 8)
    padding = attnzoo.padding_mask(torch.tensor([7, 4, 2]), 7)
    cache = attnzoo.KVCache()
    mha(x, memory, mask=padding, cache=cache)
    mask = None if given is None else torch.ones(given, dtype=torch.bool)
    got = mha(x, memory, mask=mask, cache=cache).context
    torch.testing.assert_close(got, mha(x, memory, mask=padding).context)


@pytest.mark.parametrize("name", ["scaled_dot", "additive"])
def test_a_mask_changed_in_place_after_prepare_key_is_cleared_again(name):
    """The keys were cleared under the mask prepare_key saw: when the caller narrows that same
    mask object in place, a key it now excludes (NaN here) must still not reach the output."""
    torch.manual_seed(0)
    score = scores.make_score(name, 6, 6, d_hidden=5)
    k, v, q = torch.randn(2, 5, 6), torch.randn(2, 5, 6), torch.randn(2, 3, 6)
    k[0, 4], v[0, 4] = float("nan"), float("nan")
    mask = torch.ones(2, 1, 5, dtype=torch.bool)
    prepared = attnzoo.prepare_key(score, k, value=v, mask=mask)
    assert (
        attnzoo.attention(q, prepared, prepared.value, score=score, mask=mask)
        .context[0]
        .isnan()
        .all()
    )
    mask[0, :, 4] = False
    expected = attnzoo.attention(q, k, v, score=score, mask=mask).context
    assert expected.isfinite().all()
    got = attnzoo.attention(q, prepared, prepared.value, score=score, mask=mask).context
    torch.testing.assert_close(got, expected)


def test_prepare_key_with_a_mask_needs_the_values():
    with pytest.raises(ValueError, match="'value'"):
        attnzoo.prepare_key("dot", torch.randn(1, 3, 4), mask=torch.ones(1, 1, 3, dtype=torch.bool))


@pytest.mark.parametrize("name", ["scaled_dot", "additive"])
def test_a_mask_widened_in_place_after_prepare_key_keeps_the_cleared_keys_out(name):
    """prepare_key cleared the padding to zeros; the caller's mask then widened in place
    (prepared.mask was that very object) let those zero keys be attended: row 1's context
    moved by 0.41. The prepared mask is a copy: the cleared keys stay excluded."""
    torch.manual_seed(0)
    score = scores.make_score(name, 6, 6, d_hidden=5)
    k, v, q = torch.randn(2, 5, 6), torch.randn(2, 5, 6), torch.randn(2, 3, 6)
    mask = padding_mask(torch.tensor([5, 3]), 5)
    prepared = attnzoo.prepare_key(score, k, value=v, mask=mask)
    before = attnzoo.attention(q, prepared, prepared.value, score=score, mask=prepared.mask)
    mask[1, 0, 3:] = True
    after = attnzoo.attention(q, prepared, prepared.value, score=score, mask=prepared.mask)
    torch.testing.assert_close(after.context, before.context)
    widened = attnzoo.attention(q, prepared, prepared.value, score=score, mask=mask)
    torch.testing.assert_close(widened.context, before.context)  # still the padding's
