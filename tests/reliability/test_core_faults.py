"""Fault injection for the library core (and `Transformer.from_torch`): bad arguments to every
public function, NaN and Inf in attended and in masked positions on every path, two threads
and re-entrant calls, misuse of a KV cache, and settings a converter cannot copy. Each test
asserts the defined behaviour exactly (DESIGN.md: nothing silently wrong, nothing lost)."""

import math
import threading

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import attnzoo.core as core
from attnzoo import (
    CacheError,
    KVCache,
    LearnedPositionalEmbedding,
    LocalAttention,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    additive_attention,
    additive_logits,
    attention,
    causal_mask,
    combine_masks,
    gumbel_softmax_st,
    hard_argmax,
    masked_softmax,
    padding_mask,
    prepare_key,
    sample_hard,
    scores,
    sinusoidal_encoding,
    window_mask,
)
from attnzoo.core import additive
from attnzoo.models.transformer import Transformer
from tests.core.reference import ref_attention, ref_logits
from tests.core.test_attention import geometric
from tests.core.test_scores import params_of

NAN, INF = float("nan"), float("inf")
GARBAGE = {"nan": NAN, "+inf": INF, "-inf": -INF}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_score(name, d=6, j=9):
    return scores.make_score(name, d, d, d_hidden=5, max_keys=j)


def all_nonfinite(t: torch.Tensor) -> bool:
    return bool((~torch.isfinite(t)).all())


# -- 1. shared mutable state -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(scores.SCORE_NAMES))
def test_a_module_owns_its_parameter_free_score(name):
    """Two layers built with the same name keep a score each: Cosine's beta set on one (to
    sharpen it) changed every other layer's and every attention(score="cosine") call."""
    q, k, v = _inputs()
    before = attention(q, k, v, score=name).context
    first, second = (MultiHeadAttention(8, 2, name) for _ in range(2))
    assert first.score is not second.score
    assert first.score is not scores.SCORE_NAMES[name]
    first.score.beta = 10.0  # (an attribute only Cosine reads)
    assert getattr(second.score, "beta", 1.0) == 1.0
    assert torch.equal(attention(q, k, v, score=name).context, before)


def _additive_problem(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 64, 16), (2, 48, 16), (16,), (2, 48, 3))
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).float() for s in shapes)


def _additive_reference(a, b, v, value):
    """float64 e_ij = v^T tanh(a_i + b_j) with a causal mask, by the reference's loops."""
    params = {"wq": torch.eye(16), "wk": torch.eye(16), "v": v}
    logits = ref_logits("additive", a, b, params)
    return ref_attention(logits, value, causal_mask(a.shape[1], b.shape[1]))[0]


def test_two_threads_attending_at_once_get_the_reference(monkeypatch):
    """Blockwise additive kernel in two threads at once, many small blocks: 20 of 20 calls of
    each thread equal the single-threaded result exactly and the float64 reference."""
    monkeypatch.setattr(additive, "BLOCK_ELEMENTS", 4096)
    problems = [_additive_problem(k) for k in range(2)]
    alone = [additive_attention(*p, causal=True) for p in problems]
    for p, out in zip(problems, alone, strict=True):
        torch.testing.assert_close(out.double(), _additive_reference(*p), rtol=1e-5, atol=1e-6)
    results: list[list[torch.Tensor]] = [[], []]
    start = threading.Barrier(2)

    def work(k):
        start.wait()
        for _ in range(20):
            results[k].append(additive_attention(*problems[k], causal=True))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        assert len(results[k]) == 20
        assert all(torch.equal(got, alone[k]) for got in results[k])


class _CallInside(TorchFunctionMode):
    """Runs `nested()` once, at the first in-place sigmoid (a block of the additive kernel being
    evaluated on its scratch buffer): a re-entrant call in the same thread."""

    def __init__(self, nested):
        super().__init__()
        self.nested, self.done = nested, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.sigmoid_ and not self.done:
            self.done = True
            self.nested()
        return func(*args, **(kwargs or {}))


def test_reentrant_call_inside_a_block_and_inside_a_backward(monkeypatch):
    """A call of the kernel made while another call's block sits in scratch memory (forward,
    then backward) leaves both results exact: no buffer is shared between calls."""
    monkeypatch.setattr(additive, "BLOCK_ELEMENTS", 4096)
    outer, inner = _additive_problem(0), _additive_problem(1)
    expected_inner = additive_attention(*inner, causal=True)
    leaves = [t.clone().requires_grad_() for t in outer]
    expected = additive_attention(*leaves, causal=True)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    seen = []

    def nested():
        seen.append(additive_attention(*inner, causal=True))

    with _CallInside(nested) as mode:
        got = additive_attention(*leaves, causal=True)
    assert mode.done and torch.equal(seen[0], expected_inner)
    assert torch.equal(got, expected)
    # autograd runs the backward without the mode: the nested call is injected between a
    # block's sigmoid (in scratch memory) and its use
    block_backward = additive._sigmoid_backward

    def block_backward_with_a_call_inside(s, grad_logits, v, *centred):
        if len(seen) == 1:
            nested()
        return block_backward(s, grad_logits, v, *centred)

    monkeypatch.setattr(additive, "_sigmoid_backward", block_backward_with_a_call_inside)
    grads = torch.autograd.grad(got.sum(), leaves)
    assert len(seen) == 2 and torch.equal(seen[1], expected_inner)
    for g, e in zip(grads, expected_grads, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("d_memory", [None, 6], ids=["fused", "separate"])
def test_in_place_weight_edit_changes_the_output(d_memory):
    """No projection cache keyed on data_ptr/_version: an edit through `.data` (which bumps no
    version) shows in the very next call, with grad off and in eval mode."""
    mha = MultiHeadAttention(8, 2, d_memory=d_memory).eval()
    x = torch.randn(2, 4, 8)
    memory = None if d_memory is None else torch.randn(2, 5, 6)
    with torch.no_grad():
        before = mha(x, memory).context
        proj = mha.in_proj if d_memory is None else mha.q_proj
        proj.weight.data.mul_(2.0)
        after = mha(x, memory).context
        fresh = MultiHeadAttention(8, 2, d_memory=d_memory).eval()
        fresh.load_state_dict(mha.state_dict())
        assert not torch.equal(before, after)
        assert torch.equal(after, fresh(x, memory).context)


# -- 2. non-finite values ----------------------------------------------------------------------

B, I, J, D, DV = 2, 5, 9, 6, 4
LENGTHS = [9, 6]


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in ((B, I, D), (B, J, D), (B, J, DV))]


@pytest.mark.parametrize("name", list(scores.SCORES))
@pytest.mark.parametrize("return_weights", [False, True], ids=["context", "weights"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_nonfinite_query_row_propagates(name, return_weights, garbage):
    """A NaN or Inf in one feature of query (0, 1): that row's context (and weights) are all
    non-finite on every path, every other row equals the clean call exactly."""
    score = make_score(name)
    q, k, v = _inputs()
    clean = attention(q, k, v, score=score, return_weights=return_weights)
    q[0, 1, 2] = GARBAGE[garbage]
    out = attention(q, k, v, score=score, return_weights=return_weights)
    assert all_nonfinite(out.context[0, 1])
    if return_weights:
        assert all_nonfinite(out.weights[0, 1])
    others = torch.ones(B, I, dtype=torch.bool)
    others[0, 1] = False
    assert torch.equal(out.context[others], clean.context[others])
    if return_weights:
        assert torch.equal(out.weights[others], clean.weights[others])


@pytest.mark.parametrize("name", list(scores.SCORES))
def test_query_row_with_no_allowed_key(name):
    """A finite query with no allowed key gives zero context and weights (DESIGN.md); a NaN
    query gives a NaN row there too, context and weights alike: garbage is never a number."""
    score = make_score(name)
    q, k, v = _inputs()
    q[0, 1] = NAN
    mask = torch.ones(B, I, J, dtype=torch.bool)
    mask[0, 1] = mask[1, 2] = False
    for return_weights in (False, True):
        out = attention(q, k, v, score=score, mask=mask, return_weights=return_weights)
        assert all_nonfinite(out.context[0, 1])
        assert torch.equal(out.context[1, 2], torch.zeros(DV))
        if return_weights:
            assert all_nonfinite(out.weights[0, 1])
            assert torch.equal(out.weights[1, 2], torch.zeros(J))


@pytest.mark.parametrize("beta", [NAN, INF, -INF, "2", None, True])
def test_cosine_refuses_a_non_finite_beta(beta):
    with pytest.raises((ValueError, TypeError), match="Cosine: argument 'beta' expected a finite"):
        scores.Cosine(beta=beta)


@pytest.mark.parametrize("eps", [0.0, -1e-8, NAN, INF])
def test_cosine_refuses_a_bad_eps(eps):
    with pytest.raises(ValueError, match="Cosine: argument 'eps' expected a positive finite"):
        scores.Cosine(eps=eps)


def test_cosine_tensor_beta_propagates():
    q, k, v = _inputs()
    score = scores.Cosine(beta=torch.tensor(NAN))
    assert all_nonfinite(attention(q, k, v, score=score).context)
    beta = torch.ones(B, I)
    beta[1, 3] = NAN
    logits = scores.Cosine().logits(q, scores.Cosine().prepare_key(k), beta)
    assert all_nonfinite(logits[1, 3])
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[1, :3]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("key_len", [16, 200], ids=["math", "flash"])
def test_half_logits_that_overflow_give_agreeing_finite_weights_and_context(dtype, key_len):
    """fp16 q.k over 65504: the kernel accumulates in float32, so the weights are formed in
    float32 too: both finite, in agreement, and equal to the float64 reference."""
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 4, 8, generator=g) * 200).to(dtype)
    k = (torch.randn(1, key_len, 8, generator=g) * 200).to(dtype)
    v = torch.randn(1, key_len, 3, generator=g).to(dtype)
    assert not torch.isfinite(q @ k.transpose(1, 2)).all() or dtype == torch.bfloat16
    out = attention(q, k, v, score="dot", return_weights=True)
    assert torch.isfinite(out.context).all() and torch.isfinite(out.weights).all()
    ref_context, ref_weights = ref_attention(ref_logits("dot", q, k), v)
    torch.testing.assert_close(out.weights.double(), ref_weights, rtol=0.02, atol=0.02)
    torch.testing.assert_close(out.context.double(), ref_context, rtol=0.05, atol=0.05)
    agree = out.weights.double() @ v.double()
    torch.testing.assert_close(out.context.double(), agree, rtol=0.05, atol=0.05)


def _garbage_in_padding(tensors, lengths, value):
    """Key and value rows at positions >= length set to `value` (NaN, +-Inf)."""
    out = [t.clone() for t in tensors]
    for t in out:
        for b, n in enumerate(lengths):
            t[b, n:] = value
    return out


PATHS = {
    # name -> (score name, attention() keyword arguments, BLOCK_ELEMENTS or None)
    "sdpa": ("scaled_dot", {}, None),
    "sdpa+weights": ("scaled_dot", {"return_weights": True}, None),
    "sdpa+causal": ("dot", {"causal": True}, None),
    "general": ("general", {}, None),
    "cosine": ("cosine", {"return_weights": True}, None),
    "plain": ("location", {"return_weights": True}, None),
    "additive-one-block": ("additive", {}, None),
    "additive+weights": ("additive", {"return_weights": True}, None),
    "additive-blockwise": ("additive", {"window": 3}, 64),
}


def test_the_fault_paths_cover_every_score():
    """PATHS is typed by hand: a score added to the registry must get its garbage tests."""
    assert {name for name, _, _ in PATHS.values()} == set(scores.SCORES)


def _gradients(outputs, leaves):
    """d(sum of each output times a fixed random tensor) / d(each leaf); None where unused."""
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outputs if o is not None)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _attend_and_differentiate(score, q, k, v, mask, prepared, kwargs, every_gradient=True):
    """attention() on fresh leaves (the keys prepared under `mask` first when `prepared`) and
    the gradients of the query, key, value and score's parameters (with `every_gradient`
    False, of the query and the value attended only)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    q_, k_, v_ = leaves
    if prepared:
        k_ = prepare_key(score, k_, value=v_, mask=mask)
        v_ = k_.value
    out = attention(q_, k_, v_, score=score, mask=mask, **kwargs)
    return out, _gradients(out, [*leaves, *score.parameters()] if every_gradient else [q_, v_])


def _assert_same_gradients(got, want):
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("mask_rank", [1, 3], ids=["1d", "padding"])
@pytest.mark.parametrize("prepared", [False, True], ids=["keys", "prepared"])
def test_garbage_in_masked_keys_and_values_never_reaches_an_output(
    monkeypatch, path, garbage, mask_rank, prepared
):
    """Nor a gradient: not the inputs', not the score's parameters' (U_a's reads the keys)."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    score = make_score(name)
    q, k, v = _inputs()
    lengths = LENGTHS if mask_rank == 3 else [6, 6]
    mask = padding_mask(torch.tensor(lengths), J)
    if mask_rank == 1:
        mask = mask[0, 0]  # (key_len,)

    def run(k, v):
        return _attend_and_differentiate(score, q, k, v, mask, prepared, kwargs)

    clean, clean_gradients = run(k, v)
    out, gradients = run(*_garbage_in_padding([k, v], lengths, GARBAGE[garbage]))
    assert torch.equal(out.context, clean.context)
    if kwargs.get("return_weights"):
        assert torch.equal(out.weights, clean.weights)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("geometry", ["causal", "window"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("prepared", [False, True], ids=["keys", "prepared"])
def test_garbage_in_keys_no_query_reaches_never_reaches_an_output(
    monkeypatch, path, geometry, garbage, prepared
):
    """I = 5 queries, J = 9 keys: the keys past the last query's causal (j >= 5) or window-1
    (j >= 6) reach are attended by no query, padding in all but name. Garbage there changes no
    output and no gradient of the inputs; nor of the score's parameters when the call projects
    the keys (a key prepared without a mask was projected as given: prepare_key's docstring)."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    kwargs = {
        **kwargs,
        "causal": geometry == "causal",
        "window": 1 if geometry == "window" else None,
    }
    reach = I if geometry == "causal" else I + 1
    score = make_score(name)
    q, k, v = _inputs()

    def run(k, v):
        return _attend_and_differentiate(score, q, k, v, None, prepared, kwargs, not prepared)

    clean, clean_gradients = run(k, v)
    k, v = k.clone(), v.clone()
    k[:, reach:], v[:, reach:] = GARBAGE[garbage], GARBAGE[garbage]
    out, gradients = run(k, v)
    assert torch.equal(out.context, clean.context)
    if kwargs.get("return_weights"):
        assert torch.equal(out.weights, clean.weights)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("geometry", ["causal", "window"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("prepared", [False, True], ids=["keys", "prepared"])
def test_garbage_in_a_key_mask_and_geometry_together_leave_unattended_never_reaches_an_output(
    monkeypatch, path, geometry, garbage, prepared
):
    """A (b, i, j) mask lets key 3 be attended by query 0 only, which causality (or window 1)
    keeps from it: the mask alone allows it, the geometry alone reaches it (queries 3 and 4),
    together they leave it to no query, and it is cleared as padding is, before the score
    reads it. Outputs and every gradient equal the clean call's exactly; the clean call
    follows the float64 reference. Cleared under the mask and the reach only, garbage there
    made every row of the fused additive kernel NaN, and the gradients of a cosine's key and
    of the additive score's U_a NaN (each reads the key first). Keys given prepared were read
    by `prepare_key` (which knows no geometry): there the score's parameters and the key's
    gradient are not compared."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    window = 1 if geometry == "window" else None
    kwargs = {**kwargs, "causal": geometry == "causal", "window": window}
    score = make_score(name)
    q, k, v = _inputs()
    mask = torch.ones(B, I, J, dtype=torch.bool)
    mask[:, 1:, 3] = False
    allowed = mask & geometric(I, J, geometry == "causal", window)
    assert not allowed[..., 3].any()

    def run(k, v):
        return _attend_and_differentiate(score, q, k, v, mask, prepared, kwargs, not prepared)

    clean, clean_gradients = run(k, v)
    want, want_weights = ref_attention(ref_logits(name, q, k, params_of(score)), v, allowed)
    torch.testing.assert_close(clean.context.double(), want, rtol=1e-4, atol=1e-5)
    if kwargs.get("return_weights"):
        torch.testing.assert_close(clean.weights.double(), want_weights, rtol=1e-4, atol=1e-6)
    k, v = k.clone(), v.clone()
    k[:, 3], v[:, 3] = GARBAGE[garbage], GARBAGE[garbage]
    out, gradients = run(k, v)
    assert torch.equal(out.context, clean.context)
    if kwargs.get("return_weights"):
        assert torch.equal(out.weights, clean.weights)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("path", list(PATHS))
def test_nan_at_a_position_some_queries_attend_is_never_a_wrong_number(monkeypatch, path):
    """Causal attention with a NaN key and value at position 6: queries 6.. attend it and are
    NaN; queries before it exclude it, and each of their rows is either exactly the clean row
    or all NaN (the weighted sum's 0 * NaN on the fused kernels): never a finite wrong number.
    The plain paths, whose logits are filled rather than added, keep them exactly clean."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    kwargs = {**kwargs, "causal": True, "window": None}
    score = make_score(name)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, J, D, generator=g) for _ in range(3))
    clean = attention(q, k, v, score=score, **kwargs)
    k[:, 6], v[:, 6] = NAN, NAN
    out = attention(q, k, v, score=score, **kwargs)
    if name != "location":  # location reads only the key count: a NaN key is not read
        assert all_nonfinite(out.context[:, 6:])
    for b in range(B):
        for i in range(6):
            row, want = out.context[b, i], clean.context[b, i]
            assert torch.equal(row, want) or all_nonfinite(row), (b, i)
    if kwargs.get("return_weights"):
        assert torch.equal(out.weights[:, :6], clean.weights[:, :6])


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("mask_kind", ["none", "padding"])
def test_a_nonfinite_key_every_query_attends_is_never_a_number(
    monkeypatch, path, garbage, mask_kind
):
    """One feature of key 2 non-finite, its value finite, queries positive: a dot logit of
    -inf gives that key a weight of 0 and the additive score's tanh saturates, so without a
    probe the context would be a finite number made from garbage. Every query attends key 2:
    every row is non-finite, context and weights alike (each weight the mask allows).
    Padding (keys 6.. of row 1) stays out of the probe: row 0, whose keys are all finite,
    keeps its exact clean output."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    kwargs = {**kwargs, "causal": False, "window": None}
    score = make_score(name)
    q, k, v = _inputs()
    q = q.abs() + 0.1
    mask = padding_mask(torch.tensor(LENGTHS), J) if mask_kind == "padding" else None
    clean = attention(q, k, v, score=score, mask=mask, **kwargs)
    k[1, 2, 0] = GARBAGE[garbage]
    out = attention(q, k, v, score=score, mask=mask, **kwargs)
    assert all_nonfinite(out.context[1])
    assert torch.equal(out.context[0], clean.context[0])
    if kwargs.get("return_weights"):  # a masked weight stays exactly 0
        allowed = torch.ones(I, J, dtype=torch.bool) if mask is None else mask[1].expand(I, J)
        assert all_nonfinite(out.weights[1][allowed])
        assert not out.weights[1][~allowed].any()
        assert torch.equal(out.weights[0], clean.weights[0])


@pytest.mark.parametrize("path", [p for p, (name, _, _) in PATHS.items() if name == "additive"])
@pytest.mark.parametrize("parameter", ["query_proj.weight", "key_proj.weight", "v"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_a_nonfinite_additive_parameter_is_never_a_number(monkeypatch, path, parameter, garbage):
    """W_a, U_a or v with one infinite entry: tanh would turn the projections into finite
    logits; the outputs are non-finite instead (DESIGN.md: nothing silently wrong)."""
    name, kwargs, block = PATHS[path]
    if block is not None:
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
    score = make_score(name)
    with torch.no_grad():
        score.get_parameter(parameter).view(-1)[0] = GARBAGE[garbage]
    out = attention(*_inputs(), score=score, **kwargs)
    assert not torch.isfinite(out.context).any()
    if kwargs.get("return_weights"):
        assert not torch.isfinite(out.weights).any()


@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_garbage_in_padding_of_multi_head_attention(garbage):
    """Self-attention over a padded batch (garbage in the padded positions of x) and
    cross-attention to a padded memory, with a (batch, 1, key_len) and a 1-D mask: the real
    queries' outputs equal the clean ones exactly."""
    mha = MultiHeadAttention(8, 2).eval()
    x, memory = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    lengths = [7, 4]
    mask = padding_mask(torch.tensor(lengths), 7)  # (b, 1, j)
    real = mask[:, 0]  # (b, i): the real positions as queries
    clean_self = mha(x, mask=mask).context
    clean_cross = mha(x, memory, mask=mask).context
    (dirty_x,) = _garbage_in_padding([x], lengths, GARBAGE[garbage])
    (dirty_memory,) = _garbage_in_padding([memory], lengths, GARBAGE[garbage])
    assert torch.equal(mha(dirty_x, mask=mask).context[real], clean_self[real])
    assert torch.equal(mha(x, dirty_memory, mask=mask).context, clean_cross)
    short = padding_mask(torch.tensor([4, 4]), 7)[0, 0]  # (key_len,)
    (dirty_memory,) = _garbage_in_padding([memory], [4, 4], GARBAGE[garbage])
    got = mha(x, dirty_memory, mask=short, return_weights=True)
    want = mha(x, memory, mask=short, return_weights=True)
    assert torch.equal(got.context, want.context) and torch.equal(got.weights, want.weights)


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("mask_rank", [3, 4], ids=["shared", "per-head"])
def test_garbage_in_padded_memory_never_reaches_a_gradient(garbage, mask_rank):
    """Cross-attention: the padded memory rows are cleared before W_k and W_v project them,
    so their gradients (and the memory's own) are those of the clean memory."""
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(2, 7, 8), torch.randn(2, 6, 8)
    mask = padding_mask(torch.tensor([6, 3]), 6)  # (b, 1, j)
    if mask_rank == 4:
        mask = mask[:, None].expand(2, 2, 7, 6)  # (b, h, i, j)

    def run(memory):
        leaves = [x.clone().requires_grad_(), memory.clone().requires_grad_()]
        out = mha(*leaves, mask=mask)
        return out, _gradients(out, [*leaves, *mha.parameters()])

    clean, clean_gradients = run(memory)
    out, gradients = run(*_garbage_in_padding([memory], [6, 3], GARBAGE[garbage]))
    assert torch.equal(out.context, clean.context)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("geometry", ["causal", "window"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding"])
def test_garbage_in_memory_no_query_reaches_never_reaches_an_output(geometry, garbage, masked):
    """Cross-attention of 3 queries to 6 memory rows, causal or window 1: rows 3.. (4..) are
    reached by no query; garbage there gave every output NaN. Outputs and every gradient are
    the clean memory's."""
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 6, 8)
    kwargs = {"causal": True} if geometry == "causal" else {"window": 1}
    reach = 3 if geometry == "causal" else 4
    mask = padding_mask(torch.tensor([6, 5]), 6) if masked else None

    def run(memory):
        leaves = [x.clone().requires_grad_(), memory.clone().requires_grad_()]
        out = mha(*leaves, mask=mask, **kwargs)
        return out, _gradients(out, [*leaves, *mha.parameters()])

    clean, clean_gradients = run(memory)
    dirty = memory.clone()
    dirty[:, reach:] = GARBAGE[garbage]
    out, gradients = run(dirty)
    assert torch.equal(out.context, clean.context)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("name", list(scores.SCORES))
@pytest.mark.parametrize("geometry", ["causal", "window"])
@pytest.mark.parametrize("mask_rank", [3, 4], ids=["shared", "per-head"])
def test_garbage_in_memory_mask_and_geometry_together_leave_unattended_never_reaches_an_output(
    name, geometry, mask_rank
):
    """Cross-attention of 5 queries to 6 memory rows: the mask lets row 3 be attended by
    query 0 only (in every head), which causality (or window 1) keeps from it: it is cleared
    as padding is, before the projection. Context, weights and every gradient (the query's,
    the memory's, every parameter's) are the clean memory's. Cleared under the padding part
    of the mask alone, garbage there made W_k's and W_v's gradients NaN, and every output of
    the fused additive kernel."""
    mha = MultiHeadAttention(8, 2, score=scores.make_score(name, 4, 4, max_keys=6))
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 6, 8)
    kwargs = {"causal": True} if geometry == "causal" else {"window": 1}
    mask = torch.ones(2, 5, 6, dtype=torch.bool)
    mask[:, 1:, 3] = False
    if mask_rank == 4:
        mask = mask[:, None].expand(2, 2, 5, 6)  # (b, h, i, j)
    for return_weights in (False, True):

        def run(memory, return_weights=return_weights):
            leaves = [x.clone().requires_grad_(), memory.clone().requires_grad_()]
            out = mha(*leaves, mask=mask, return_weights=return_weights, **kwargs)
            return out, _gradients(out, [*leaves, *mha.parameters()])

        clean, clean_gradients = run(memory)
        for garbage in GARBAGE.values():
            dirty = memory.clone()
            dirty[:, 3] = garbage
            out, gradients = run(dirty)
            assert torch.equal(out.context, clean.context)
            if return_weights:
                assert torch.equal(out.weights, clean.weights)
            _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("predictive", [False, True], ids=["local-m", "local-p"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("name", ["dot", "additive"])
def test_garbage_in_padding_of_local_attention(predictive, garbage, name):
    local = LocalAttention(make_score(name), window=2, d_query=D if predictive else None)
    q, k, v = _inputs()
    lengths = torch.tensor(LENGTHS)
    mask = padding_mask(lengths, J)
    kwargs = {"lengths": lengths} if predictive else {}

    def run(k, v):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = local(*leaves, mask=mask, **kwargs)
        return out, _gradients(out, [*leaves, *local.parameters()])

    clean, clean_gradients = run(k, v)
    out, gradients = run(*_garbage_in_padding([k, v], LENGTHS, GARBAGE[garbage]))
    assert torch.equal(out.context, clean.context) and torch.equal(out.weights, clean.weights)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("name", ["general", "additive"])
def test_garbage_outside_every_window_of_local_attention_reaches_no_gradient(garbage, name):
    """Local-m, I = 5 queries at positions 0..4, window 2: keys 7 and 8 lie outside every
    window. They were cleared after the score projected them, so the additive v's gradient
    read the garbage (0 * NaN); now they are cleared before."""
    local = LocalAttention(make_score(name), window=2)
    q, k, v = _inputs()

    def run(k, v):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = local(*leaves)
        return out, _gradients(out, [*leaves, *local.parameters()])

    clean, clean_gradients = run(k, v)
    k, v = k.clone(), v.clone()
    k[:, 7:], v[:, 7:] = GARBAGE[garbage], GARBAGE[garbage]
    out, gradients = run(k, v)
    assert torch.equal(out.context, clean.context) and torch.equal(out.weights, clean.weights)
    _assert_same_gradients(gradients, clean_gradients)


@pytest.mark.parametrize("predictive", [False, True], ids=["local-m", "local-p"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_nonfinite_query_propagates_in_local_attention(predictive, garbage):
    """local-p's centre of a NaN query is NaN, so its window is empty: without care its row
    would be zero. It is non-finite, and every other row is unchanged."""
    local = LocalAttention(scores.Dot(), window=2, d_query=D if predictive else None)
    q, k, v = _inputs()
    clean = local(q, k, v)
    q[1, 3, 0] = GARBAGE[garbage]
    out = local(q, k, v)
    assert all_nonfinite(out.context[1, 3]) and all_nonfinite(out.weights[1, 3])
    others = torch.ones(B, I, dtype=torch.bool)
    others[1, 3] = False
    assert torch.equal(out.context[others], clean.context[others])


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("per_row", [False, True], ids=["query_len", "batch-query_len"])
def test_nonfinite_position_of_local_m_propagates(garbage, per_row):
    """local-m with a NaN or Inf among the given `positions`: that query's window is empty
    (its weights would be zeros, its context a zero row: a number from garbage); the
    centre joins the probe, so the row is non-finite. The other rows follow the float64
    reference of attention within |j - p_t| <= 2."""
    local = LocalAttention(scores.Dot(), window=2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, d, generator=g) for n, d in ((3, D), (6, D), (6, DV)))
    positions = torch.tensor([0.0, GARBAGE[garbage], 2.0])
    if per_row:
        positions = positions.expand(B, 3)
    out = local(q, k, v, positions=positions)
    assert all_nonfinite(out.context[:, 1]) and all_nonfinite(out.weights[:, 1])
    inside = (torch.arange(6)[None] - torch.tensor([[0], [2]])).abs() <= 2  # rows 0 and 2
    want, want_weights = ref_attention(ref_logits("dot", q[:, ::2], k), v, inside)
    torch.testing.assert_close(out.context[:, ::2].double(), want)
    torch.testing.assert_close(out.weights[:, ::2].double(), want_weights)


def test_garbage_in_padding_of_the_public_additive_kernel(monkeypatch):
    """additive_attention itself (public), blockwise and in one block, forward and backward:
    padding holding NaN changes neither the context nor any gradient."""
    a, b, v, value = _additive_problem(0)
    mask = padding_mask(torch.tensor([48, 30]), 48)  # (b, 1, j)
    for block in (additive.BLOCK_ELEMENTS, 4096):
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        results = []
        for garbage in (0.0, NAN):
            b2, value2 = _garbage_in_padding([b, value], [48, 30], garbage)
            leaves = [t.clone().requires_grad_() for t in (a, b2, v, value2)]
            out = additive_attention(*leaves, mask=mask)
            grads = torch.autograd.grad(out.square().sum(), leaves)
            real = [g if g.dim() < 3 else g[1, :30] for g in grads]
            results.append((out, real))
        (out0, grads0), (out1, grads1) = results
        assert torch.equal(out0, out1)
        for g0, g1 in zip(grads0, grads1, strict=True):
            assert torch.equal(g0, g1)


@pytest.mark.parametrize("geometry", [{"causal": True}, {"window": 2}], ids=["causal", "window"])
def test_garbage_past_every_query_in_the_public_additive_kernel(monkeypatch, geometry):
    """additive_attention itself with 20 queries over 48 keys: the keys past the last query's
    reach (20 on causal, 22 with window 2) hold NaN; the context and every gradient are those of
    clean keys, blockwise and in one block."""
    a, b, v, value = _additive_problem(0)
    a = a[:, :20]
    reach = 20 if geometry.get("causal") else 22
    for block in (additive.BLOCK_ELEMENTS, 4096):
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        results = []
        for garbage in (0.0, NAN):
            b2, value2 = b.clone(), value.clone()
            b2[:, reach:], value2[:, reach:] = garbage, garbage
            leaves = [t.clone().requires_grad_() for t in (a, b2, v, value2)]
            out = additive_attention(*leaves, **geometry)
            grads = torch.autograd.grad(out.square().sum(), leaves)
            results.append(
                (out, [g if g.dim() < 3 or g.shape[1] == 20 else g[:, :reach] for g in grads])
            )
        (out0, grads0), (out1, grads1) = results
        assert torch.equal(out0, out1)
        for g0, g1 in zip(grads0, grads1, strict=True):
            assert torch.equal(g0, g1)


@pytest.mark.parametrize("geometry", [{"causal": True}, {"window": 2}], ids=["causal", "window"])
def test_garbage_a_per_query_mask_and_geometry_leave_in_the_public_additive_kernel(
    monkeypatch, geometry
):
    """additive_attention itself, 20 queries over 48 keys: a (b, i, j) mask lets key 5 be
    attended by query 0 only, which the geometry keeps from it; key 5 holds NaN. The context
    and every gradient are those of a clean key 5, blockwise and in one block (cleared under
    the mask alone, it made every row NaN)."""
    a, b, v, value = _additive_problem(0)
    a = a[:, :20]
    mask = torch.ones(2, 20, 48, dtype=torch.bool)
    mask[:, 1:, 5] = False
    for block in (additive.BLOCK_ELEMENTS, 4096):
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        results = []
        for garbage in (0.0, NAN):
            b2, value2 = b.clone(), value.clone()
            b2[:, 5], value2[:, 5] = garbage, garbage
            leaves = [t.clone().requires_grad_() for t in (a, b2, v, value2)]
            out = additive_attention(*leaves, mask=mask, **geometry)
            results.append((out, torch.autograd.grad(out.square().sum(), leaves)))
        (out0, grads0), (out1, grads1) = results
        assert torch.equal(out0, out1)
        for g0, g1 in zip(grads0, grads1, strict=True):
            assert torch.equal(g0, g1)


@pytest.mark.parametrize("choose", [hard_argmax, sample_hard])
def test_hard_attention_does_not_turn_nan_into_a_choice(choose):
    logits = torch.randn(2, 3, 5)
    logits[1, 2, 4] = NAN
    hard = choose(logits)
    assert all_nonfinite(hard.weights[1, 2]) and math.isnan(hard.log_prob[1, 2])
    assert torch.isfinite(hard.weights[0]).all() and torch.isfinite(hard.weights[1, :2]).all()
    assert torch.isfinite(hard.log_prob[0]).all() and torch.isfinite(hard.log_prob[1, :2]).all()
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2, 4] = False  # the NaN is masked: it is not read
    assert torch.isfinite(choose(logits, mask).weights).all()


# -- 3. KV cache misuse ------------------------------------------------------------------------


def test_one_cache_for_cross_then_self_attention_is_refused():
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(2, 1, 8), torch.randn(2, 5, 8)
    cache = KVCache()
    mha(x, memory, cache=cache)
    with pytest.raises(CacheError, match="'cache' expected a self-attention cache.*cross"):
        mha(x, cache=cache)
    cache = KVCache()
    mha(x, cache=cache)
    with pytest.raises(CacheError, match="'cache' expected a cross-attention cache.*self"):
        mha(x, memory, cache=cache)
    assert cache.length == 1  # the refused call changed nothing
    with pytest.raises(CacheError, match="'cache' expected a self-attention cache.*static"):
        mha(x, cache=KVCache(static=True))


def test_cache_of_another_module_is_refused():
    a, b = MultiHeadAttention(8, 2), MultiHeadAttention(8, 2)
    x = torch.randn(2, 1, 8)
    cache = KVCache()
    a(x, cache=cache)
    with pytest.raises(CacheError, match="'cache' expected a KVCache filled by this module"):
        b(x, cache=cache)
    assert cache.owner() is a


def test_hand_built_cache_with_other_heads_or_batch_is_refused():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 1, 8)
    four_heads = KVCache(torch.randn(2, 4, 3, 2), torch.randn(2, 4, 3, 2))
    with pytest.raises(CacheError, match=r"heads=2.*d_head=4.*\(2, 4, 3, 2\)"):
        mha(x, cache=four_heads)
    other_dtype = KVCache(torch.randn(2, 2, 3, 4).double(), torch.randn(2, 2, 3, 4).double())
    with pytest.raises(CacheError, match="'cache' expected dtype torch.float32"):
        mha(x, cache=other_dtype)
    adopted = KVCache(torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4))
    mha(x, cache=adopted)
    assert adopted.length == 4 and adopted.owner() is mha
    with pytest.raises(TypeError, match="'cache' expected a KVCache"):
        mha(x, cache={"key": None})


def test_wrong_batch_after_reorder_and_bad_indices_are_refused():
    mha = MultiHeadAttention(8, 2)
    cache = KVCache()
    mha(torch.randn(2, 3, 8), causal=True, cache=cache)
    key = cache.key
    for index, pattern in [
        (torch.tensor([0.0, 1.0]), "'index' expected a 1-D integer tensor.*float32"),
        (torch.tensor([[0, 1]]), r"'index' expected a 1-D integer tensor.*\(1, 2\)"),
        (torch.tensor([True, False]), "'index' expected a 1-D integer tensor.*bool"),
        ([0, 1], "'index' expected a 1-D integer tensor.*list"),
        (torch.tensor([0, 2]), r"'index' expected batch rows in \[0, 2\)"),
        (torch.tensor([-3]), r"'index' expected batch rows in \[0, 2\)"),
    ]:
        with pytest.raises(CacheError, match=pattern):
            cache.reorder(index)
        assert cache.key is key  # unchanged
    cache.reorder(torch.tensor([0, 1, 1]))  # beam search may grow the batch
    with pytest.raises(CacheError, match=r"batch=2.*shape \(3, 2, 3, 4\)"):
        mha(torch.randn(2, 1, 8), causal=True, cache=cache)
    out = mha(torch.randn(3, 1, 8), causal=True, cache=cache)
    assert out.context.shape == (3, 1, 8) and cache.length == 4


# -- 4. converters -----------------------------------------------------------------------------

V_SRC, V_TGT, DM = 13, 11, 16


def _torch_transformer(**kwargs):
    kwargs = {"batch_first": True, "dropout": 0.0, **kwargs}
    return nn.Transformer(DM, 2, kwargs.pop("enc", 2), kwargs.pop("dec", 2), 24, **kwargs)


def _convert(module):
    return Transformer.from_torch(module, nn.Embedding(V_SRC, DM), nn.Embedding(V_TGT, DM))


def _decoder_layer(**kwargs):
    kwargs = {"batch_first": True, "dropout": 0.0, **kwargs}
    return nn.TransformerDecoderLayer(DM, 2, kwargs.pop("dim_feedforward", 24), **kwargs)


def test_layer_norm_eps_is_copied_and_the_function_kept():
    ref = _torch_transformer(layer_norm_eps=0.5).eval()  # large: it changes every output
    ours = _convert(ref).eval()
    eps = {m.eps for m in ours.modules() if isinstance(m, nn.LayerNorm)}
    assert eps == {0.5} and ours.config.layer_norm_eps == 0.5  # kept in the config too
    x = torch.randn(2, 5, DM) * 0.3  # small variance: eps matters
    with torch.no_grad():
        memory = ref.encoder(x)
        states = ours.encoder[0](x, None)[0]
        torch.testing.assert_close(states, ref.encoder.layers[0](x), rtol=1e-5, atol=1e-5)
        hidden = ours.decoder[0](x, memory, None)[0]  # causal self-attention
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        want = ref.decoder.layers[0](x, memory, tgt_mask=causal, tgt_is_causal=True)
        torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-5)


def _replace(module, where, new):
    stack, _, k = where.split(".")
    getattr(module, stack).layers[int(k)] = new


class _MyLayer(nn.TransformerDecoderLayer):
    pass


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (
            lambda: _torch_transformer(custom_decoder=nn.TransformerDecoder(
                _decoder_layer(activation="gelu"), 2, norm=nn.LayerNorm(DM))),
            r"activation='relu'.*decoder.layers.0.*gelu",
        ),
        (
            lambda: _torch_transformer(custom_decoder=nn.TransformerDecoder(
                _decoder_layer(norm_first=True), 2, norm=nn.LayerNorm(DM))),
            r"one norm_first in every layer.*False in encoder.layers.0.*True in decoder",
        ),
        (
            lambda: _torch_transformer(custom_decoder=nn.TransformerDecoder(
                _decoder_layer(dim_feedforward=40), 2, norm=nn.LayerNorm(DM))),
            "one dim_feedforward in every layer.*24.*40 in decoder.layers.0",
        ),
        (
            lambda: _torch_transformer(custom_decoder=nn.TransformerDecoder(
                _decoder_layer(layer_norm_eps=1e-3), 2, norm=nn.LayerNorm(DM))),
            "one layer_norm_eps in every layer.*1e-05.*0.001 in decoder.layers.0",
        ),
        (
            lambda: _torch_transformer(custom_decoder=nn.TransformerDecoder(
                _decoder_layer(dropout=0.3), 2, norm=nn.LayerNorm(DM))),
            "one dropout in every layer.*0.0.*0.3 in decoder.layers.0",
        ),
        (lambda: _torch_transformer(bias=False), "bias=True in encoder.layers.0"),
        (lambda: _torch_transformer(activation="gelu"), "activation='relu'.*encoder.layers.0"),
        (
            lambda: _torch_transformer(custom_encoder=nn.Linear(2, 2)),
            "standard TransformerEncoder as encoder.*Linear",
        ),
    ],
    ids=["gelu-decoder", "mixed-norm-first", "mixed-d-ff", "mixed-eps", "mixed-dropout",
         "no-bias", "gelu", "custom-encoder"],
)  # fmt: skip
def test_converter_refuses_what_it_cannot_copy(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        _convert(build())


@pytest.mark.parametrize(
    ("where", "change", "pattern"),
    [
        ("encoder.layers.1", lambda m: setattr(m, "activation", torch.tanh),
         r"activation='relu'.*encoder.layers.1.*tanh"),
        ("decoder.layers.1", lambda m: setattr(m, "norm_first", True),
         "one norm_first.*True in decoder.layers.1"),
        ("decoder.layers.1", lambda m: setattr(m, "norm2", nn.LayerNorm(DM, bias=False)),
         "affine LayerNorms of size 16 with bias in decoder.layers.1.norm2"),
        ("decoder.layers.1", lambda m: setattr(m, "norm3", nn.RMSNorm(DM)),
         "nn.LayerNorm in decoder.layers.1.norm3"),
        ("decoder.layers.1", lambda m: m.multihead_attn.__setattr__("dropout", 0.2),
         "one dropout.*0.2 in decoder.layers.1"),
    ],
    ids=["activation", "norm-first", "norm-bias", "rmsnorm", "attention-dropout"],
)  # fmt: skip
def test_converter_checks_every_layer_not_the_first(where, change, pattern):
    module = _torch_transformer()
    stack, _, k = where.split(".")
    change(getattr(module, stack).layers[int(k)])
    with pytest.raises(ValueError, match=pattern):
        _convert(module)


def test_converter_refuses_a_subclassed_layer_and_a_bad_output():
    module = _torch_transformer()
    layer = _MyLayer(DM, 2, 24, batch_first=True)
    _replace(module, "decoder.layers.1", layer)
    with pytest.raises(ValueError, match="custom _MyLayer at decoder.layers.1"):
        _convert(module)
    with pytest.raises(ValueError, match=r"'output' expected an nn.Linear\(16, 11\)"):
        Transformer.from_torch(
            _torch_transformer(), nn.Embedding(V_SRC, DM), nn.Embedding(V_TGT, DM),
            nn.Linear(DM, 7),
        )  # fmt: skip


def test_converter_ignores_batch_first():
    torch.manual_seed(0)
    a = _torch_transformer(batch_first=True)
    torch.manual_seed(0)
    b = _torch_transformer(batch_first=False)
    ours_a, ours_b = _convert(a).eval(), _convert(b).eval()
    for (name, p), (_, q) in zip(ours_a.named_parameters(), ours_b.named_parameters(), strict=True):
        if "embed" not in name and "output" not in name:
            assert torch.equal(p, q), name


@pytest.mark.parametrize(
    ("kwargs", "pattern", "kind"),
    [
        (dict(add_bias_kv=True), "'module' expected add_bias_kv=False", ValueError),
        (dict(add_zero_attn=True), "'module' expected add_zero_attn=False", ValueError),
        (dict(kdim=6, vdim=5), "'module' expected kdim == vdim.*kdim=6, vdim=5", ValueError),
    ],
)
def test_multi_head_from_torch_refuses_what_it_cannot_copy(kwargs, pattern, kind):
    with pytest.raises(kind, match=pattern):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, batch_first=True, **kwargs))


def test_multi_head_from_torch_refuses_a_subclass_and_partial_biases():
    class Mine(nn.MultiheadAttention):
        pass

    with pytest.raises(TypeError, match="'module' expected a torch.nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(Mine(8, 2))
    module = nn.MultiheadAttention(8, 2, batch_first=True)
    module.out_proj.bias = None
    with pytest.raises(ValueError, match="'module' expected bias on the in- and out-proj"):
        MultiHeadAttention.from_torch(module)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(bias=False), dict(kdim=6, vdim=6), dict(batch_first=False)],
    ids=["default", "no-bias", "kdim", "seq-first"],
)
def test_multi_head_from_torch_copies_what_it_accepts(kwargs):
    theirs = nn.MultiheadAttention(8, 2, **{"batch_first": True, **kwargs}).eval()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    x = torch.randn(2, 4, 8)
    memory = torch.randn(2, 5, kwargs.get("kdim", 8))
    with torch.no_grad():
        got = ours(x, memory).context
        if theirs.batch_first:
            want = theirs(x, memory, memory, need_weights=False)[0]
        else:
            t = (x.transpose(0, 1), memory.transpose(0, 1), memory.transpose(0, 1))
            want = theirs(*t, need_weights=False)[0].transpose(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- 5. bad library input: every public function -----------------------------------------------

q3, k3, v3 = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 2)
FLOATING = "'query' expected a floating-point torch.Tensor"


def _reinforce():
    return core.reinforce_loss(torch.zeros(3), torch.zeros(3))


# public name -> [(call, error type, message pattern)]: an argument each public function of the
# core refuses by name, before any computation.
BAD_CALLS = {
    "attention": [
        (lambda: attention(q3, k3, v3, score="nope"), ValueError, "'score'"),
        (lambda: attention(q3.double(), k3, v3, score="dot"), TypeError, "'key'.*float64"),
        # integer, bool and complex tensors of one dtype (the fast path's common case)
        (lambda: attention(q3.long(), k3.long(), v3.long(), score="dot"), TypeError, FLOATING),
        (
            lambda: attention(q3.bool(), k3.bool(), v3.bool(), score="scaled_dot"),
            TypeError,
            FLOATING,
        ),
        (
            lambda: attention(q3.cfloat(), k3.cfloat(), v3.cfloat(), score="cosine"),
            TypeError,
            FLOATING,
        ),
        (
            lambda: attention(q3[:, None].int(), k3.int(), v3.int(), score="dot"),
            TypeError,
            FLOATING,
        ),
        (lambda: attention(q3, k3, v3, score="dot", dropout=1.0), ValueError, "'dropout'"),
        (lambda: attention(q3, k3, v3, score="dot", dropout="0.1"), ValueError, "'dropout'"),
        (lambda: attention(q3, k3, v3, score="dot", dropout=NAN), ValueError, "'dropout'"),
        (lambda: attention(q3, k3, v3, score="dot", causal="yes"), TypeError, "'causal'"),
        (
            lambda: attention(q3, k3, v3, score="dot", return_weights=1),
            TypeError,
            "'return_weights'",
        ),
        (lambda: attention(q3, k3, v3, score="dot", window=0), ValueError, "'window'"),
        (lambda: attention(q3, k3, v3[:, :4], score="dot"), ValueError, "'value'"),
        (lambda: attention(q3, k3, v3, score="dot", mask=torch.ones(5)), TypeError, "'mask'"),
        (
            lambda: attention(
                q3.double(), k3.double(), v3.double(), score=scores.Additive(4, 4, 3)
            ),
            TypeError,
            "Additive: argument 'key' expected dtype torch.float32",
        ),
    ],
    "prepare_key": [
        (lambda: prepare_key("dot", k3.long()), TypeError, "'key' expected a floating-point"),
        (lambda: prepare_key(3, k3), TypeError, "'score'"),
        (lambda: prepare_key("dot", k3[0]), ValueError, "'key' expected a tensor of rank 3"),
        (
            lambda: prepare_key("dot", k3, mask=torch.ones(5, dtype=torch.bool)),
            ValueError,
            "'value' expected the values to clear with the mask",
        ),
        (lambda: prepare_key("dot", k3, value=v3[:, :4]), ValueError, "'value'.*key_len = 5"),
        (lambda: prepare_key("dot", k3, value=v3.double()), TypeError, "'value'.*float32"),
        (
            lambda: prepare_key("dot", k3, value=v3, mask=torch.ones(2, 1, 5)),
            TypeError,
            "'mask' expected dtype torch.bool",
        ),
        (
            lambda: prepare_key("dot", k3, value=v3, mask=torch.ones(2, 1, 4, dtype=torch.bool)),
            ValueError,
            r"'mask' expected a shape broadcastable to the weights \(2, 1, 5\)",
        ),
    ],
    "additive_attention": [
        (lambda: additive_attention(q3.long(), k3, torch.randn(4), v3), TypeError, FLOATING),
        (lambda: additive_attention(q3, k3, torch.randn(3), v3), ValueError, "'v' expected shape"),
        (lambda: additive_attention(q3, k3[..., :3], torch.randn(4), v3), ValueError, "'key'"),
        (lambda: additive_attention(q3, k3, torch.randn(4), v3[:, :4]), ValueError, "'value'"),
        (
            lambda: additive_attention(q3, k3, torch.randn(4), v3, mask=torch.ones(2, 3, 5)),
            TypeError,
            "'mask' expected dtype torch.bool",
        ),
        (lambda: additive_attention(q3, k3, torch.randn(4), v3, window=0), ValueError, "'window'"),
        (
            lambda: additive_attention(q3, k3, torch.randn(4), v3, causal="no"),
            TypeError,
            "'causal'",
        ),
    ],
    "additive_logits": [
        (lambda: additive_logits(q3.long(), k3.long(), torch.randn(4)), TypeError, FLOATING),
        (lambda: additive_logits(q3, k3, torch.randn(3)), ValueError, "'v' expected shape"),
        (lambda: additive_logits(q3, k3.double(), torch.randn(4)), TypeError, "'key'.*float32"),
        (lambda: additive_logits(q3[0], k3, torch.randn(4)), ValueError, "'query'.*rank"),
    ],
    "MultiHeadAttention": [
        (lambda: MultiHeadAttention(8, 2.0), ValueError, "'num_heads' expected a positive int"),
        (lambda: MultiHeadAttention(0, 2), ValueError, "'d_model' expected a positive int"),
        (lambda: MultiHeadAttention(-8, 2), ValueError, "'d_model' expected a positive int"),
        (lambda: MultiHeadAttention(8, 0), ValueError, "'num_heads' expected a positive int"),
        (lambda: MultiHeadAttention(8, 2, d_memory=0), ValueError, "'d_memory'"),
        (lambda: MultiHeadAttention(8, 3), ValueError, "'num_heads'.*divisor"),
        (lambda: MultiHeadAttention(8, 2, dropout=NAN), ValueError, "'dropout'"),
        (lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), causal=1), TypeError, "'causal'"),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), return_weights="no"),
            TypeError,
            "'return_weights' expected True or False",
        ),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8).double()),
            TypeError,
            "'query' expected dtype torch.float32 \\(that of the module's parameters\\)",
        ),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), torch.randn(2, 3, 8).half()),
            TypeError,
            "'memory' expected dtype torch.float32",
        ),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8, device="meta")),
            ValueError,
            "'query' expected device cpu",
        ),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), mask=[[True] * 3] * 3),
            TypeError,
            "'mask' expected a bool torch.Tensor, got list",
        ),
    ],
    "KVCache": [],  # section 3
    "CacheError": [],
    "LocalAttention": [
        (lambda: LocalAttention(scores.Dot(), 0), ValueError, "'window'"),
        (lambda: LocalAttention(scores.Dot(), 2, d_query=0), ValueError, "'d_query'"),
        (lambda: LocalAttention(scores.Dot(), 2, 4, d_hidden=-1), ValueError, "'d_hidden'"),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3.long(), k3.long(), v3.long()),
            TypeError,
            FLOATING,
        ),
        (lambda: LocalAttention(scores.Dot(), 2)(q3[0], k3, v3), ValueError, "'query'.*rank 3"),
        (lambda: LocalAttention(scores.Dot(), 2)(q3, k3.double(), v3), TypeError, "'key'.*float32"),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3[:1], v3[:1]),
            ValueError,
            "'key'.*batch size 2",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3[:, :4]),
            ValueError,
            "'value'.*key_len = 5",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, mask=torch.ones(2, 3, 4) > 0),
            ValueError,
            "'mask' expected a shape broadcastable",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2, 4)(q3, k3, v3, lengths=torch.ones(2)),
            ValueError,
            r"'lengths' expected a \(2,\) integer tensor",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, positions=torch.arange(4)),
            ValueError,
            "'positions'",
        ),
        (  # read as 0/1, not refused
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, positions=torch.ones(3) > 0),
            ValueError,
            "'positions' expected a .* numeric tensor, got torch.bool",
        ),
        (  # no key lies before position 0: every weight of such a query was 0
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, positions=torch.full((3,), -5)),
            ValueError,
            "'positions' expected positions >= 0, got min -5",
        ),
        (  # local-p predicts its centres: the positions went unread
            lambda: LocalAttention(scores.Dot(), 2, 4)(q3, k3, v3, positions=torch.arange(3)),
            ValueError,
            "'positions' expected None for local-p",
        ),
        (  # read as lengths 1
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, lengths=torch.ones(2) > 0),
            ValueError,
            r"'lengths' expected a \(2,\) integer tensor of source lengths, got torch.bool",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2)(q3, k3, v3, prepared_key=k3[:, :4]),
            ValueError,
            "'prepared_key'",
        ),
        # local-p: the query's size against w_p, and source lengths within the keys
        (lambda: LocalAttention(scores.Dot(), 2, 6)(q3, k3, v3), ValueError, "'query'.*= 6"),
        (
            lambda: LocalAttention(scores.Dot(), 2, 4)(q3, k3, v3, lengths=torch.tensor([-5, 4])),
            ValueError,
            r"'lengths' expected source lengths in 1..key_len = 5, got -5 to 4",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2, 4)(q3, k3, v3, lengths=torch.tensor([5, 40])),
            ValueError,
            "'lengths' expected source lengths in 1..key_len = 5",
        ),
        (
            lambda: LocalAttention(scores.Dot(), 2, 4)(
                q3, k3, v3, lengths=torch.tensor([5, 4], device="meta")
            ),
            ValueError,
            "'lengths' expected device cpu",
        ),
    ],
    "padding_mask": [
        (lambda: padding_mask([1, 2]), TypeError, "'lengths'"),
        (lambda: padding_mask(torch.tensor([-1, 2])), ValueError, "'lengths' expected values >= 0"),
        (lambda: padding_mask(torch.tensor([4, 2]), 3), ValueError, "<= max_len = 3, got 2 to 4"),
        (lambda: padding_mask(torch.tensor([1, 2]), 2.0), ValueError, "'max_len'"),
        (lambda: padding_mask(torch.tensor([True, False]), 3), TypeError, "'lengths'.*torch.bool"),
    ],
    "causal_mask": [
        (lambda: causal_mask(-1), ValueError, "'query_len' expected a non-negative int"),
        (lambda: causal_mask(3, 2.5), ValueError, "'key_len'"),
        (lambda: causal_mask(3, offset=-2), ValueError, "'offset'"),
    ],
    "window_mask": [
        (lambda: window_mask(3, 3, 0), ValueError, "'window' expected a positive int"),
        (lambda: window_mask(3, 3, None), ValueError, "'window'.*got None"),
        (lambda: window_mask(3, -3, 1), ValueError, "'key_len'"),
        (lambda: window_mask(3, 4, 1, centers=torch.zeros(2, 4)), ValueError, "'centers'"),
    ],
    "combine_masks": [
        (lambda: combine_masks(torch.ones(3, 3)), TypeError, r"'masks\[0\]' expected a bool"),
        (
            lambda: combine_masks(torch.ones(3, 3, dtype=torch.bool), torch.ones(4, 4) > 0),
            ValueError,
            "'masks' expected shapes that broadcast together",
        ),
    ],
    "masked_softmax": [
        (lambda: masked_softmax(torch.ones(2, 3, dtype=torch.long)), TypeError, "'logits'"),
        (lambda: masked_softmax(torch.randn(2, 3), torch.ones(2, 3)), TypeError, "'mask'"),
        (
            lambda: masked_softmax(torch.randn(2, 3), torch.ones(2, 4, dtype=torch.bool)),
            ValueError,
            "'mask' expected a shape broadcastable to the weights",
        ),
    ],
    "hard_argmax": [
        (
            lambda: hard_argmax(torch.randn(2, 3, 0)),
            ValueError,
            r"hard_argmax: argument 'logits' expected at least one key.*\(2, 3, 0\)",
        ),
        (lambda: hard_argmax(torch.ones(2, 3, dtype=torch.long)), TypeError, "'logits'"),
        # masks as masked_softmax takes them (a larger one broadcast the logits)
        (lambda: hard_argmax(torch.randn(2, 3), torch.ones(2, 3).long()), TypeError, "'mask'"),
        (
            lambda: hard_argmax(torch.randn(3), torch.ones(2, 3, dtype=torch.bool)),
            ValueError,
            "hard_argmax: argument 'mask' expected a shape broadcastable",
        ),
    ],
    "sample_hard": [
        (
            lambda: sample_hard(torch.randn(2, 0)),
            ValueError,
            "sample_hard: argument 'logits' expected at least one key",
        ),
        (lambda: sample_hard(torch.randn(2, 3), torch.ones(2, 3)), TypeError, "'mask'"),
    ],
    "gumbel_softmax_st": [
        (
            lambda: gumbel_softmax_st(torch.randn(4, 0)),
            ValueError,
            "gumbel_softmax_st: argument 'logits' expected at least one key",
        ),
        (lambda: gumbel_softmax_st(torch.randn(4, 3), tau=NAN), ValueError, "'tau'"),
        (lambda: gumbel_softmax_st(torch.randn(4, 3), tau=0), ValueError, "'tau'"),
        (
            lambda: gumbel_softmax_st(torch.randn(2, 4), torch.ones(2, 3, dtype=torch.bool)),
            ValueError,
            "gumbel_softmax_st: argument 'mask'",
        ),
    ],
    "HardSample": [],
    "LearnedPositionalEmbedding": [
        (lambda: LearnedPositionalEmbedding(4, 8)(torch.randn(3, 8)), ValueError, r"\(3, 8\)"),
        (lambda: LearnedPositionalEmbedding(4, 8)(torch.randn(1, 5, 8)), ValueError, "'x'"),
        (lambda: LearnedPositionalEmbedding(0, 8), ValueError, "'max_len' expected a positive int"),
        (lambda: LearnedPositionalEmbedding(4, 0), ValueError, "'d_model' expected a positive int"),
        (lambda: LearnedPositionalEmbedding(4, 8)(torch.randn(1, 3, 7)), ValueError, "'x'.*= 8"),
        (
            lambda: LearnedPositionalEmbedding(4, 8)(torch.randn(1, 3, 8), -1),
            ValueError,
            "'offset'",
        ),
    ],
    "SinusoidalPositionalEncoding": [
        (lambda: SinusoidalPositionalEncoding(0), ValueError, "'d_model' expected a positive int"),
        (lambda: SinusoidalPositionalEncoding(4)(torch.randn(1, 2, 5)), ValueError, "'x'.*= 4"),
        (
            lambda: SinusoidalPositionalEncoding(4)(torch.ones(1, 2, 4).long()),
            TypeError,
            "'x' expected a floating-point",
        ),
        (lambda: SinusoidalPositionalEncoding(4)(torch.randn(1, 2, 4), -1), ValueError, "'offset'"),
        # a (batch, d_model) input read as (len, d_model): each row another position
        (lambda: SinusoidalPositionalEncoding(4)(torch.randn(3, 4)), ValueError, r"'x'.*\(3, 4\)"),
    ],
    "sinusoidal_encoding": [
        (lambda: sinusoidal_encoding(2.5, 4), ValueError, "'length' expected a non-negative int"),
        (lambda: sinusoidal_encoding(3, 0), ValueError, "'d_model' expected a positive int"),
        (lambda: sinusoidal_encoding(3, 4, offset=-1), ValueError, "'offset'"),
        (lambda: sinusoidal_encoding(3, 4, dtype=torch.long), TypeError, "'dtype'"),
    ],
    # the hard-attention toolkit (attnzoo.core.hard)
    "GaussianSample": [],
    "ReinforceLoss": [],
    "gaussian_log_prob": [
        (lambda: core.gaussian_log_prob([0.0], torch.zeros(1), 1.0), TypeError, "'x'"),
        (
            lambda: core.gaussian_log_prob(torch.zeros(1), torch.zeros(1).long(), 1.0),
            TypeError,
            "'mean'",
        ),
        (lambda: core.gaussian_log_prob(torch.zeros(2), torch.zeros(2), 0.0), ValueError, "'std'"),
        (
            lambda: core.gaussian_log_prob(torch.zeros(2), torch.zeros(2), torch.ones(3)),
            ValueError,
            "'std' expected a shape broadcastable",
        ),
    ],
    "hybrid_loss": [
        (lambda: core.hybrid_loss(torch.zeros(()), 1.0), TypeError, "'reinforce'"),
        (
            lambda: core.hybrid_loss(torch.zeros(()), _reinforce(), weight=NAN),
            ValueError,
            "'weight'",
        ),
        (
            lambda: core.hybrid_loss(torch.zeros((), dtype=torch.long), _reinforce()),
            TypeError,
            "'supervised'",
        ),
    ],
    "GaussianPolicy": [
        (lambda: core.GaussianPolicy(4, std=NAN), ValueError, "GaussianPolicy: argument 'std'"),
        (lambda: core.GaussianPolicy(4, 0), ValueError, "GaussianPolicy: argument 'd_output'"),
        (lambda: core.GaussianPolicy(4)(torch.randn(3, 5)), ValueError, "'state'.*d_input = 4"),
        (lambda: core.GaussianPolicy(4)(torch.ones(3, 4).long()), TypeError, "'state'"),
    ],
    "gaussian_sample": [
        (lambda: core.gaussian_sample([0.0], 1.0), TypeError, "gaussian_sample: argument 'mean'"),
        (lambda: core.gaussian_sample(torch.zeros(2), True), ValueError, "argument 'std'"),
    ],
    "reinforce_loss": [
        (lambda: core.reinforce_loss([0.0], torch.zeros(1)), ValueError, "argument 'log_prob'"),
        (
            lambda: core.reinforce_loss(torch.zeros(3).long(), torch.zeros(3)),
            TypeError,
            "'log_prob'",
        ),
        (lambda: core.reinforce_loss(torch.zeros(3), [1.0, 2.0, 3.0]), TypeError, "'reward'"),
        (lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(4)), ValueError, "'reward'"),
        (
            lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(3), NAN),
            ValueError,
            "'baseline'",
        ),
        (
            lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(3), torch.zeros(2)),
            ValueError,
            "'baseline'",
        ),
        (
            lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(3), entropy_weight=NAN),
            ValueError,
            "'entropy_weight'",
        ),
        (
            lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(3), mask=torch.ones(3)),
            TypeError,
            "'mask'",
        ),
        (
            lambda: core.reinforce_loss(torch.zeros(3), torch.zeros(3), mask=torch.ones(4) > 0),
            ValueError,
            "'mask'",
        ),
    ],
    "rewards_to_go": [
        (lambda: core.rewards_to_go(torch.zeros(2, 3), -0.1), ValueError, "'discount'"),
        (lambda: core.rewards_to_go(torch.zeros(2, 3), True), ValueError, "'discount'"),
        (lambda: core.rewards_to_go(torch.zeros(2, 3).long()), TypeError, "'rewards'"),
        (lambda: core.rewards_to_go([[1.0]]), TypeError, "'rewards'"),
    ],
    "lambda_returns": [
        (
            lambda: core.lambda_returns(torch.zeros(2, 3), torch.zeros(2, 3), 1.0, 1.5),
            ValueError,
            "'lam'",
        ),
        (
            lambda: core.lambda_returns(torch.zeros(2, 3), torch.zeros(2, 3), -0.1),
            ValueError,
            "'discount'",
        ),
        (lambda: core.lambda_returns(torch.zeros(2, 3), torch.zeros(2, 4)), ValueError, "'values'"),
        (
            lambda: core.lambda_returns(torch.zeros(2, 3).long(), torch.zeros(2, 3)),
            TypeError,
            "'rewards'",
        ),
    ],
    "MovingAverageBaseline": [
        (lambda: core.MovingAverageBaseline(-0.5), ValueError, "'momentum' expected"),
        (lambda: core.MovingAverageBaseline(0.9).update([1.0]), TypeError, "'reward'"),
        (
            lambda: core.MovingAverageBaseline(0.9, (2,)).update(torch.ones(4, 3)),
            ValueError,
            "'reward'",
        ),
        (
            lambda: core.MovingAverageBaseline(0.9).update(torch.ones(4), torch.ones(4)),
            ValueError,
            "'counts'",
        ),
    ],
    "AttentionOutput": [],
    "PreparedKey": [],
    "scores": [
        (lambda: scores.General(0, 4), ValueError, "General: argument 'd_query'"),
        (lambda: scores.General(4, 2.0), ValueError, "General: argument 'd_key'"),
        (lambda: scores.Additive(4, 4, 0), ValueError, "Additive: argument 'd_hidden'"),
        (lambda: scores.Additive(0, 4, 4), ValueError, "Additive: argument 'd_query'"),
        (lambda: scores.Additive(4, -1, 4), ValueError, "Additive: argument 'd_key'"),
        (lambda: scores.Location(4, 0), ValueError, "Location: argument 'max_keys'"),
        (lambda: scores.Location(0.5, 4), ValueError, "Location: argument 'd_query'"),
        (lambda: scores.Cosine(beta=NAN), ValueError, "Cosine: argument 'beta'"),
        # a per-query beta of the wrong size, dtype or device (it broadcast the logits)
        (
            lambda: attention(q3, k3, v3, score=scores.Cosine(beta=torch.ones(7))),
            ValueError,
            r"Cosine: argument 'beta' expected a floating tensor on cpu broadcastable to \(2, 3\)",
        ),
        (
            lambda: scores.Cosine().logits(q3, k3, torch.ones(2, 3, dtype=torch.long)),
            ValueError,
            "Cosine: argument 'beta'",
        ),
        (lambda: scores.make_score("additive", 4, 4, d_hidden=0), ValueError, "'d_hidden'"),
        (lambda: scores.make_score("nope", 4, 4), ValueError, "'score'"),
        (
            lambda: scores.General(4, 4)(q3.double(), k3.double()),
            TypeError,
            "General: argument 'query' expected dtype torch.float32",
        ),
        (lambda: scores.Dot()(q3.long(), k3.long()), TypeError, "Dot: argument 'query'"),
        # a query without its batch dim broadcast over the key's batch; another batch's keys
        (lambda: scores.Dot()(q3[0], k3), ValueError, r"Dot: argument 'query' .*rank 3 or 4"),
        (lambda: scores.General(4, 4)(q3[0, 0], k3), ValueError, "General: argument 'query'"),
        (
            lambda: scores.Location(4, 5)(q3, torch.randn(3, 5, 5)),
            ValueError,
            r"Location: argument 'key' expected leading dims compatible with query \(2,\)",
        ),
        (lambda: scores.ScaledDot()(q3, k3.long()), TypeError, "ScaledDot: argument 'key'"),
        (lambda: scores.Cosine()(q3.int(), k3), TypeError, "Cosine: argument 'query'"),
        (
            lambda: scores.Location(4, 9)(q3.double(), k3.double()),
            TypeError,
            "Location: argument 'query' expected dtype torch.float32",
        ),
    ],
}


def test_every_public_name_of_the_core_has_a_row():
    """A new public function must come with its bad calls here (or an empty list)."""
    assert set(BAD_CALLS) == set(core.__all__)


@pytest.mark.parametrize(
    ("call", "kind", "pattern"),
    [row for rows in BAD_CALLS.values() for row in rows],
    ids=[f"{name}-{k}" for name, rows in BAD_CALLS.items() for k in range(len(rows))],
)
def test_bad_arguments_are_refused_by_name(call, kind, pattern):
    with pytest.raises(kind, match=pattern):
        call()


@pytest.mark.parametrize("name", list(scores.SCORES))
@pytest.mark.parametrize("return_weights", [False, True], ids=["context", "weights"])
def test_one_dimensional_mask_broadcasts_on_every_path(monkeypatch, name, return_weights):
    """A (key_len,) mask is broadcastable, as documented: the same result as (1, 1, key_len),
    on the attention paths, the blockwise additive kernel, MultiHeadAttention and
    LocalAttention."""
    score = make_score(name)
    q, k, v = _inputs()
    mask = torch.tensor([True] * 6 + [False] * 3)
    for block in (additive.BLOCK_ELEMENTS, 64):
        monkeypatch.setattr(additive, "BLOCK_ELEMENTS", block)
        got = attention(q, k, v, score=score, mask=mask, return_weights=return_weights)
        want = attention(q, k, v, score=score, mask=mask[None, None], return_weights=return_weights)
        assert torch.equal(got.context, want.context)
    mha = MultiHeadAttention(6, 2, score=name if name != "location" else "dot").eval()
    memory = torch.randn(B, J, 6)
    for key_input in (None, memory):
        x = q if key_input is not None else torch.randn(B, J, 6)
        got = mha(x, key_input, mask=mask, return_weights=True)
        want = mha(x, key_input, mask=mask[None, None], return_weights=True)
        assert torch.equal(got.context, want.context) and torch.equal(got.weights, want.weights)
    local = LocalAttention(score, window=3)
    got, want = local(q, k, v, mask=mask), local(q, k, v, mask=mask[None, None])
    assert torch.equal(got.context, want.context)


def test_masks_and_encodings_helpers_accept_their_documented_inputs():
    """The helpers without checks of their own work on the shapes their docstrings give."""
    assert causal_mask(2, 3).shape == (2, 3) and window_mask(2, 3, 1).shape == (2, 3)
    assert combine_masks(None, None) is None
    assert masked_softmax(torch.randn(2, 0)).shape == (2, 0)
    assert sinusoidal_encoding(3, 5).shape == (3, 5)
    assert SinusoidalPositionalEncoding(4)(torch.randn(1, 2, 4)).shape == (1, 2, 4)
    a, b = torch.randn(1, 2, 3), torch.randn(1, 4, 3)
    assert additive_logits(a, b, torch.randn(3)).shape == (1, 2, 4)


def test_dtype_checks_leave_autocast_alone():
    """Under autocast a query of another dtype than the parameters is the point: accepted, and
    a cache filled in bfloat16 is reused."""
    mha = MultiHeadAttention(8, 2)
    score = scores.Additive(8, 8, 4)
    x = torch.randn(2, 3, 8)
    cache = KVCache()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x.bfloat16(), cache=cache).context
        mha(x[:, :1], cache=cache)
        attention(x.bfloat16(), x.bfloat16(), x.bfloat16(), score=score)
    assert out.dtype == torch.bfloat16 and cache.length == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_clearing_padding_is_an_exact_selection(dtype):
    """Kept rows keep their exact bits (NaN, Inf, -0.0 included), cleared rows are +0.0, and
    the gradient of a cleared row is 0: a selection, not a product."""
    from attnzoo.core.masks import clear_unattended

    t = torch.tensor([[NAN, -0.0], [INF, 1.5], [NAN, -INF], [2.0, -0.0]], dtype=dtype)
    t = t[None].requires_grad_()  # (1, key_len 4, d 2)
    mask = torch.tensor([True, True, False, False])[None, None]  # (1, 1, key_len)
    (out,) = clear_unattended(mask, t)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    assert torch.equal(out[0, :2].detach().view(bits), t[0, :2].detach().view(bits))
    assert torch.equal(out[0, 2:].detach().view(bits), torch.zeros(2, 2, dtype=bits))
    out.backward(torch.ones_like(out))
    assert torch.equal(t.grad[0], torch.tensor([[1, 1], [1, 1], [0, 0], [0, 0]], dtype=dtype))
