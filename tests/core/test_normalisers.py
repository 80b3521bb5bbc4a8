import math

import pytest
import torch

from attnzoo import gumbel_softmax_st, hard_argmax, masked_softmax, sample_hard
from tests.core.reference import ref_attention


def test_masked_softmax_exact_and_fully_masked_row():
    logits = torch.tensor([[0.0, 0.0, 5.0], [1.0, 2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    w = masked_softmax(logits, mask)
    assert w.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    # a weighted sum: the gradient of a plain sum of softmax rows is zero whatever the mask
    (w * torch.tensor([[1.0, 3.0, 7.0], [2.0, 5.0, 11.0]])).sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[1] == 0).all()
    assert logits.grad[0].tolist() == [-0.5, 0.5, 0.0]  # w(1 - w) * (1 - 3), masked key 0


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 17)])
def test_masked_softmax_follows_float64_reference_with_gradcheck(shape):
    """Against a loop over rows in float64 (softmax over the allowed keys, zero for a row with
    none), and gradcheck, fully masked rows included."""
    g = torch.Generator().manual_seed(sum(shape))
    logits = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(*shape, generator=g) > 0.4
    mask[0, ...] = False  # fully masked rows
    want = torch.zeros(shape, dtype=torch.float64)
    flat_w, flat_l, flat_m = (
        want.view(-1, shape[-1]),
        logits.detach().view(-1, shape[-1]),
        mask.view(-1, shape[-1]),
    )
    for r in range(flat_l.shape[0]):
        if flat_m[r].any():
            e = flat_l[r][flat_m[r]].exp()
            flat_w[r][flat_m[r]] = e / e.sum()
    assert torch.equal(masked_softmax(logits, mask) == 0, want == 0)
    torch.testing.assert_close(masked_softmax(logits, mask), want)
    assert torch.autograd.gradcheck(lambda x: masked_softmax(x, mask), (logits,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [2e4, 1e5])
def test_masked_softmax_of_very_negative_logits_follows_float64_reference(dtype, shift):
    """softmax is shift-invariant: logits around -2e4 or -1e5 (large-norm queries and keys
    with opposite directions) give the weights of the same logits unshifted. A masked logit
    filled with a finite constant such as -1e4 instead of the dtype's minimum stood above
    every allowed one: the softmax went to the masked keys and the rows summed to 0. Against
    the float64 reference's loop over rows on the same values, a fully masked row included."""
    g = torch.Generator().manual_seed(int(shift))
    logits = (torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 3 - shift).to(dtype)
    mask = torch.rand(2, 5, 7, generator=g) > 0.4
    mask[..., 0] = True
    mask[1, 3] = False  # a fully masked row: zeros
    _, want = ref_attention(logits, torch.eye(7, dtype=torch.float64), mask)
    got = masked_softmax(logits, mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.sum(-1), mask.any(-1).to(dtype))


def test_masked_softmax_bf16_uses_dtype_minimum():
    logits = torch.tensor([[1e4, 3.0]], dtype=torch.bfloat16)
    w = masked_softmax(logits, torch.tensor([[False, True]]))
    assert w.tolist() == [[0.0, 1.0]]


def test_hard_argmax_and_log_prob():
    logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]])
    mask = torch.tensor([[[True, False, True], [False, False, False]]])
    out = hard_argmax(logits, mask)
    assert out.weights.tolist() == [[[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]]
    expected = torch.log_softmax(torch.tensor([0.0, 1.0]), -1)[1]
    torch.testing.assert_close(out.log_prob[0, 0], expected)
    assert out.log_prob[0, 1] == 0


def test_sample_hard_frequencies_and_reinforce_gradient():
    logits = torch.tensor([[[0.0, 1.0, 2.0]]]).expand(4000, 1, 3).clone().requires_grad_()
    g = torch.Generator().manual_seed(0)
    out = sample_hard(logits, generator=g)
    freq = out.weights.mean(dim=(0, 1))
    torch.testing.assert_close(
        freq, torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1), atol=0.03, rtol=0
    )
    assert out.weights.grad_fn is None  # hard weights carry no gradient
    out.log_prob.sum().backward()  # REINFORCE flows through log_prob
    assert torch.isfinite(logits.grad).all()


def test_sample_hard_never_picks_masked():
    logits = torch.zeros(500, 1, 4)
    mask = torch.tensor([True, False, True, False])
    out = sample_hard(logits, mask)
    assert out.weights[..., ~mask].sum() == 0


def test_gumbel_straight_through_is_one_hot_with_soft_gradient():
    logits = torch.randn(6, 5, requires_grad=True)
    mask = torch.tensor([True, True, False, True, True])
    w = gumbel_softmax_st(logits, mask, tau=0.5)
    assert ((w == 0) | (w == 1)).all() and (w.sum(-1) == 1).all() and (w[:, 2] == 0).all()
    (w * torch.arange(5.0)).sum().backward()
    assert logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="'tau'"):
        gumbel_softmax_st(logits, tau=0.0)


@pytest.mark.parametrize("tau", [0.3, 1.0, 2.5])
def test_gumbel_straight_through_follows_float64_reference_with_the_same_noise(tau):
    """Forward: the one-hot of argmax over the allowed keys of logits + g; backward: the
    gradient of the soft sample softmax((logits + g) / tau) over the allowed keys, written as
    a loop over rows; g the Gumbel noise drawn from the same generator state. Odd sizes, a
    fully masked row."""
    shape = (3, 7, 17)
    logits = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[1, 4] = False
    probe = torch.randn(*shape, dtype=torch.float64)

    weights = gumbel_softmax_st(logits, mask, tau=tau, generator=torch.Generator().manual_seed(9))
    (grad,) = torch.autograd.grad((weights * probe).sum(), logits)

    noise = torch.empty(*shape, dtype=torch.float64).exponential_(
        generator=torch.Generator().manual_seed(9)
    )
    gumbel = -noise.log()
    want_w = torch.zeros(shape, dtype=torch.float64)
    want_g = torch.zeros(shape, dtype=torch.float64)
    for row in torch.cartesian_prod(torch.arange(shape[0]), torch.arange(shape[1])).tolist():
        allowed = mask[tuple(row)].nonzero().flatten().tolist()
        if not allowed:
            continue
        x = logits.detach()[tuple(row)]
        perturbed = {j: (x[j] + gumbel[tuple(row)][j]).item() for j in allowed}
        want_w[(*row, max(perturbed, key=perturbed.get))] = 1.0
        z = sum(math.exp(perturbed[j] / tau) for j in allowed)
        y = {j: math.exp(perturbed[j] / tau) / z for j in allowed}
        mean = sum(y[j] * probe[(*row, j)].item() for j in allowed)
        for j in allowed:  # d/dx_j sum_k c_k y_k = y_j (c_j - sum_k c_k y_k) / tau
            want_g[(*row, j)] = y[j] * (probe[(*row, j)].item() - mean) / tau
    assert torch.equal(weights.detach(), want_w)
    torch.testing.assert_close(grad, want_g, rtol=1e-9, atol=1e-12)


def test_gumbel_straight_through_draws_keys_with_softmax_probabilities_at_any_tau():
    """The Gumbel-max trick: key j with probability softmax(logits)_j, whatever tau; the same
    generator state gives the same choices at every tau."""
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0]).expand(20_000, 4)
    mask = torch.tensor([True, True, True, False])
    freq = {}
    for tau in (0.2, 5.0):
        g = torch.Generator().manual_seed(4)
        freq[tau] = gumbel_softmax_st(logits, mask, tau=tau, generator=g)
    assert torch.equal(freq[0.2], freq[5.0])
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    torch.testing.assert_close(freq[0.2].mean(0)[:3], want, atol=0.015, rtol=0)
    assert (freq[0.2][:, 3] == 0).all()


def test_gumbel_straight_through_passes_nan_of_an_allowed_logit():
    logits = torch.randn(2, 5)
    logits[0, 3] = float("nan")
    mask = torch.tensor([True, True, True, True, False])
    w = gumbel_softmax_st(logits, mask)
    assert w[0, :4].isnan().all() and (w[0, 4] == 0) and w[1].isfinite().all()
    logits[1, 4] = float("nan")  # masked: never read
    assert gumbel_softmax_st(logits, mask)[1].isfinite().all()


@pytest.mark.parametrize("kind", ["hard_argmax", "sample_hard", "gumbel_softmax_st"])
def test_hard_choices_of_a_fully_masked_row_are_zero_with_finite_gradients(kind):
    """A row with no allowed key attends nowhere: zero weights, a log-probability of 0 (no
    choice to score), finite gradients (hard_argmax had the only such test)."""
    logits = torch.randn(3, 4, 5, requires_grad=True)
    mask = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    mask[1, 2] = False
    if kind == "gumbel_softmax_st":
        weights = gumbel_softmax_st(logits, mask, tau=0.7)
        loss = (weights * torch.randn(3, 4, 5)).sum()
    else:
        choose = {"hard_argmax": hard_argmax, "sample_hard": sample_hard}[kind]
        out = choose(logits, mask)
        weights = out.weights
        assert out.log_prob[1, 2] == 0 and (out.log_prob[mask.sum(-1) > 1] < 0).all()
        loss = out.log_prob.sum()
    assert (weights[1, 2] == 0).all() and (weights[~mask] == 0).all()
    assert (weights.sum(-1)[mask.any(-1)] == 1).all()
    loss.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[1, 2] == 0).all()


@pytest.mark.parametrize("kind", ["hard_argmax", "sample_hard"])
def test_log_prob_of_the_choice_passes_gradcheck_under_a_mask(kind):
    """log p(chosen) = the masked log-softmax at the chosen key, a fully masked row 0; the
    choice itself held fixed (sample_hard from a generator seeded again at each call)."""
    logits = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    mask[2, 3] = False

    def log_prob(x):
        if kind == "hard_argmax":
            return hard_argmax(x, mask).log_prob
        return sample_hard(x, mask, generator=torch.Generator().manual_seed(2)).log_prob

    assert torch.autograd.gradcheck(log_prob, (logits,))
