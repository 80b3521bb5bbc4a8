import pytest
import torch

import attnzoo
from attnzoo import scores
from tests.core.reference import ref_logits

D = 6


def params_of(score):
    """The parameters of a score module, named as the float64 reference reads them."""
    if isinstance(score, scores.General):
        return {"weight": score.weight}
    if isinstance(score, scores.Cosine):
        return {"beta": score.beta}
    if isinstance(score, scores.Additive):
        wq, wk = score.query_proj, score.key_proj
        return {"wq": wq.weight, "bq": wq.bias, "wk": wk.weight, "v": score.v}
    if isinstance(score, scores.Location):
        return {"weight": score.proj.weight, "bias": score.proj.bias}
    return None


def make(name):
    """(score module, params for the reference)."""
    score = {
        "dot": scores.Dot,
        "scaled_dot": scores.ScaledDot,
        "general": lambda: scores.General(D, D),
        "cosine": lambda: scores.Cosine(beta=2.5),
        "additive": lambda: scores.Additive(D, D, 5),
        "location": lambda: scores.Location(D, 150),
    }[name]()
    return score, params_of(score)


NAMES = list(scores.SCORES)  # the code's registry


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [((2, 7), (2, 17)), ((3, 2, 1), (3, 2, 7)), ((1, 17), (1, 1))])
def test_score_matches_float64_reference(name, shape):
    (qlead_i), (klead_j) = shape
    q = torch.randn(*qlead_i, D, dtype=torch.float64)
    k = torch.randn(*klead_j, D, dtype=torch.float64)
    score, params = make(name)
    score = score.double()
    torch.testing.assert_close(score(q, k), ref_logits(name, q, k, params))


@pytest.mark.parametrize("name", NAMES)
def test_score_gradcheck(name):
    score, _ = make(name)
    score = score.double()
    q = torch.randn(2, 3, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: score(q, k), (q, k))


@pytest.mark.parametrize("name", ["general", "additive", "additive-bias", "location"])
def test_scores_with_other_query_and_key_widths_follow_the_reference(name):
    """d_query 5 != d_key 3 (and Additive's bias inside the tanh), against float64 and by
    gradcheck: the reference tests above use one width for both."""
    torch.manual_seed(0)
    score = {
        "general": lambda: scores.General(5, 3),
        "additive": lambda: scores.Additive(5, 3, 4),
        "additive-bias": lambda: scores.Additive(5, 3, 4, bias=True),
        "location": lambda: scores.Location(5, 9),
    }[name]()
    params = params_of(score)
    score = score.double()
    q = torch.randn(2, 7, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(score(q, k), ref_logits(name.split("-")[0], q, k, params))
    assert torch.autograd.gradcheck(lambda q, k: score(q, k), (q, k))


def test_cosine_per_query_beta_follows_the_reference_with_gradcheck():
    """The NTM's per-step key strength: a (batch, query_len) beta tensor, with gradients to
    beta too."""
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    beta = (torch.rand(2, 3, dtype=torch.float64) * 5).requires_grad_()
    s = scores.Cosine()
    torch.testing.assert_close(
        s.logits(q, s.prepare_key(k), beta), ref_logits("cosine", q, k, {"beta": beta})
    )
    assert torch.autograd.gradcheck(lambda q, k, b: s.logits(q, s.prepare_key(k), b), (q, k, beta))


def test_hand_computed_values():
    q = torch.tensor([[[1.0, 2.0]]])
    k = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])
    assert scores.Dot()(q, k).tolist() == [[[11.0, 0.0]]]
    torch.testing.assert_close(scores.ScaledDot()(q, k), torch.tensor([[[11.0 / 2**0.5, 0.0]]]))
    # cosine: (3 + 8) / (sqrt(5) * 5); the zero key gives 0, not NaN (NTM's empty memory)
    torch.testing.assert_close(
        scores.Cosine(beta=2.0)(q, k), torch.tensor([[[2.0 * 11 / (5**0.5 * 5), 0.0]]])
    )


def test_cosine_zero_memory_has_finite_gradient():
    q = torch.randn(1, 1, 4, requires_grad=True)
    k = torch.zeros(1, 3, 4, requires_grad=True)
    scores.Cosine()(q, k).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cosine_in_half_precision_gives_zero_rows_similarity_zero(dtype):
    """eps = 1e-8 is 0 in fp16: a zero row (the NTM's empty memory, cleared padding) gave
    0 / 0 = NaN. Normalised in float32, it gives similarity 0, and the rest the reference's."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    k[:, 3:] = 0
    got = scores.Cosine()(q.to(dtype), k.to(dtype))
    assert got.dtype == dtype and torch.equal(got[..., 3:], torch.zeros_like(got[..., 3:]))
    torch.testing.assert_close(got.double(), ref_logits("cosine", q, k), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_cosine_of_huge_finite_inputs_is_the_cosine(dtype, scale):
    """Cosine does not depend on scale. The norm squares the entries, which overflowed from
    ~1e19 (norm inf, unit vector 0): every logit 0, uniform weights from finite inputs."""
    torch.manual_seed(0)
    q, k, value = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)
    expected = ref_logits("cosine", q, k)
    huge = scores.Cosine()((q * scale).to(dtype), (k * scale).to(dtype))
    torch.testing.assert_close(huge.double(), expected, rtol=0.02, atol=0.02)
    context = attnzoo.attention(q * scale, k * scale, value, score="cosine").context
    reference = attnzoo.attention(q, k, value, score="cosine").context
    torch.testing.assert_close(context, reference)


def test_cosine_rows_below_the_overflow_bound_are_normalised_as_before():
    """Only rows whose squares could overflow are rescaled: every other row's unit vector is
    F.normalize's, bit for bit (NTM content addressing unchanged); a row whose largest entry
    is below 2^64 but whose squares overflow float32 (1.7e19, d = 16) is rescaled."""
    from attnzoo.core.scores import _unit

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for scale in (1e-9, 1.0, 1e3):
            x = (torch.randn(4, 16, generator=g) * scale).to(dtype)
            assert torch.equal(_unit(x, 1e-8), torch.nn.functional.normalize(x, dim=-1, eps=1e-8))
    x = torch.randn(4, 16, generator=g)
    x = x / x.abs().amax(-1, keepdim=True) * 1.7e19
    expected = torch.nn.functional.normalize(x.double(), dim=-1).float()
    torch.testing.assert_close(_unit(x, 1e-8), expected)


@pytest.mark.parametrize(
    ("score", "arg"),
    [
        (scores.Dot(), "key"),
        (scores.General(4, 4), "key"),
        (scores.Additive(4, 4, 3), "key"),
    ],
)
def test_dimension_mismatch_names_argument(score, arg):
    with pytest.raises(ValueError, match=f"'{arg}'"):
        score(torch.randn(1, 2, 4), torch.randn(1, 2, 5))


def test_location_too_many_keys():
    with pytest.raises(ValueError, match="max_keys = 3"):
        scores.Location(4, 3)(torch.randn(1, 2, 4), torch.randn(1, 5, 4))


# The registry, iterated from the code's own table: a score added to `scores.SCORES` is tested
# here without an edit.
SAME_SIZE_ONLY = set(scores.SCORE_NAMES)  # the scores without parameters (make_score)


@pytest.mark.parametrize("name", list(scores.SCORES))
@pytest.mark.parametrize("lead", [(2,), (2, 3)], ids=["3-D", "4-D"])
def test_registry_builds_every_score_with_the_documented_signature(name, lead):
    """score(query (batch, [heads,] query_len, d_query), key (batch, [heads,] key_len, d_key))
    -> logits (batch, [heads,] query_len, key_len), for equal and, where the score allows it,
    different d_query and d_key."""
    sizes = [(6, 6)] if name in SAME_SIZE_ONLY else [(6, 6), (6, 5)]
    for d_query, d_key in sizes:
        score = scores.make_score(name, d_query, d_key, d_hidden=7, max_keys=9)
        assert isinstance(score, scores.Score)
        q, k = torch.randn(*lead, 4, d_query), torch.randn(*lead, 9, d_key)
        logits = score(q, k)
        assert logits.shape == (*lead, 4, 9)  # (the values: against float64 references below)


@pytest.mark.parametrize("d_hidden", [None, 5])
def test_registry_additive_hidden_width_defaults_to_d_key(d_hidden):
    """make_score's documented default for the additive score's tanh layer is d_key (not
    d_query): with d_query 8 and d_key 12, W_a is (12, 8), U_a (12, 12) and v (12,); a given
    d_hidden is kept. The logits follow the float64 reference."""
    score = scores.make_score("additive", 8, 12, d_hidden=d_hidden)
    hidden = 12 if d_hidden is None else d_hidden
    assert score.v.shape == (hidden,)
    assert score.query_proj.weight.shape == (hidden, 8)
    assert score.key_proj.weight.shape == (hidden, 12)
    assert score.key_proj.out_features == score.query_proj.out_features == hidden
    params = params_of(score)
    score = score.double()
    q = torch.randn(2, 3, 8, dtype=torch.float64)
    k = torch.randn(2, 4, 12, dtype=torch.float64)
    torch.testing.assert_close(score(q, k), ref_logits("additive", q, k, params))


@pytest.mark.parametrize("name", sorted(SAME_SIZE_ONLY))
def test_registry_refuses_different_sizes_by_name(name):
    assert name in scores.SCORES
    with pytest.raises(ValueError, match=rf"'score'.*d_query \(6\) != d_key \(5\).*'{name}'"):
        scores.make_score(name, 6, 5)


def test_registry_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'score'") as error:
        scores.make_score("bogus", 4, 4)
    assert "'bogus'" in str(error.value)
    for name in scores.SCORES:
        assert f"'{name}'" in str(error.value)


def test_registry_location_needs_max_keys():
    with pytest.raises(ValueError, match="'max_keys'.*location"):
        scores.make_score("location", 4, 4)
