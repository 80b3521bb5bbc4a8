"""The hard-attention toolkit (`attnzoo.core.hard`): REINFORCE estimates the exact gradient of
the expected reward (enumerated, or in closed form), a baseline leaves it unbiased, and each
term of the loss reaches only what it should."""

import math

import pytest
import torch

from attnzoo import (
    GaussianPolicy,
    MovingAverageBaseline,
    gaussian_log_prob,
    gaussian_sample,
    hybrid_loss,
    lambda_returns,
    reinforce_loss,
    rewards_to_go,
    sample_hard,
)
from attnzoo.core.hard import BOUNDS
from attnzoo.tasks.base import sampling_generator

REWARD = torch.tensor([1.0, 0.0, 2.0, -0.5], dtype=torch.float64)  # r(a) of 4 actions
LOGITS = torch.tensor([0.3, -0.2, 0.1, 0.5], dtype=torch.float64)


def exact_categorical_gradient() -> torch.Tensor:
    """d/dtheta sum_a softmax(theta)_a r(a), by enumerating the 4 actions."""
    theta = LOGITS.clone().requires_grad_(True)
    (torch.softmax(theta, -1) * REWARD).sum().backward()
    return theta.grad


def categorical_estimates(baseline, chunks=20, per_chunk=10_000, seed=0) -> torch.Tensor:
    """`chunks` independent REINFORCE estimates of the gradient of E[r], each over
    `per_chunk` samples drawn by `sample_hard`: (chunks, 4)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(chunks):
        theta = LOGITS.clone().requires_grad_(True)
        choice = sample_hard(theta.expand(per_chunk, -1), generator=g)
        reward = REWARD[choice.index]  # (n,)
        loss = reinforce_loss(choice.log_prob, reward, baseline)
        (loss.policy / per_chunk).backward()
        out.append(-theta.grad)  # the loss descends; the estimate ascends E[r]
    return torch.stack(out)


def assert_within_monte_carlo(estimates: torch.Tensor, exact: torch.Tensor) -> None:
    mean = estimates.mean(0)
    se = estimates.std(0) / math.sqrt(len(estimates))
    assert torch.all((mean - exact).abs() <= 4 * se + 1e-12), (mean, exact, se)


@pytest.mark.parametrize("baseline", [None, 0.875, "tensor"])
def test_reinforce_matches_the_exact_gradient_of_a_discrete_expectation(baseline):
    """Unbiased with no baseline, a constant one (here E[r]) or a tensor without grad."""
    if baseline == "tensor":
        baseline = torch.full((10_000,), 0.5, dtype=torch.float64)
    estimates = categorical_estimates(baseline)
    assert_within_monte_carlo(estimates, exact_categorical_gradient())


def test_a_baseline_near_the_mean_reward_lowers_the_variance():
    plain = categorical_estimates(None).var(0).sum()
    centred = categorical_estimates((torch.softmax(LOGITS, -1) * REWARD).sum().item()).var(0)
    assert centred.sum() < plain


def test_a_learned_baseline_leaves_the_policy_gradient_unchanged():
    """The baseline network's output enters the policy term only detached: the policy's
    gradient is that of the same baseline given as a plain number."""
    g = torch.Generator().manual_seed(1)
    theta = LOGITS.clone().requires_grad_(True)
    choice = sample_hard(theta.expand(500, -1), generator=g)
    reward = REWARD[choice.index]
    weight = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    learned = weight * torch.ones(500, dtype=torch.float64)
    loss = reinforce_loss(choice.log_prob, reward, learned)
    (policy_grad,) = torch.autograd.grad(loss.total, theta, retain_graph=True)
    fixed = reinforce_loss(choice.log_prob, reward, 0.4)
    (fixed_grad,) = torch.autograd.grad(fixed.total, theta)
    torch.testing.assert_close(policy_grad, fixed_grad)
    # and the baseline learns from its squared error only: d/dw sum (w - r)^2
    (base_grad,) = torch.autograd.grad(loss.total, weight)
    torch.testing.assert_close(base_grad, 2 * (0.4 - reward).sum())
    (none,) = torch.autograd.grad(loss.policy, weight, allow_unused=True)
    assert none is None


@pytest.mark.parametrize("baseline", [None, 0.5, "learned"])
def test_the_reward_is_detached_whatever_it_carries(baseline):
    """The reward enters the loss detached: a reward with a graph (a log-likelihood not yet
    detached, say) gets no gradient from any term, and the log-probs get d/dlog pi_t =
    -(R_t - b_t), by hand."""
    theta = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    r = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    reward = theta * r  # (2, 1): one reward per episode, 2 and 6
    log_prob = torch.log(torch.tensor([[0.2, 0.5], [0.7, 0.1]], dtype=torch.float64))
    log_prob.requires_grad_()
    if baseline == "learned":
        baseline = torch.tensor([[0.5], [0.25]], dtype=torch.float64, requires_grad=True)
    loss = reinforce_loss(log_prob, reward, baseline)
    for term in (loss.policy, loss.baseline, loss.total):
        if term.requires_grad:  # without a learned baseline its term is a constant 0
            (grad,) = torch.autograd.grad(term, theta, retain_graph=True, allow_unused=True)
            assert grad is None or grad.item() == 0.0
    (grad,) = torch.autograd.grad(loss.total, log_prob)
    if baseline is None:
        b = [0.0, 0.0]
    elif isinstance(baseline, float):
        b = [baseline, baseline]
    else:
        b = baseline[:, 0].tolist()
    want = [[-(2.0 * float(r[i, 0]) - b[i])] * 2 for i in range(2)]
    assert grad.tolist() == want


def test_gaussian_reinforce_matches_the_closed_form_gradient():
    """r(x) = -||x - c||^2, x ~ N(mu, sigma^2 I): E[r] = -||mu - c||^2 - d sigma^2, so
    dE/dmu = -2 (mu - c) and dE/dlog sigma_k = -2 sigma^2."""
    c = torch.tensor([0.2, -0.4], dtype=torch.float64)
    mu0 = torch.tensor([0.5, 0.1], dtype=torch.float64)
    log_std0 = torch.tensor([math.log(0.3), math.log(0.3)], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    grads = []
    for _ in range(20):
        mu, log_std = mu0.clone().requires_grad_(True), log_std0.clone().requires_grad_(True)
        n = 20_000
        draw = gaussian_sample(mu.expand(n, -1), log_std.exp(), generator=g)
        reward = -((draw.sample - c) ** 2).sum(-1)
        (reinforce_loss(draw.log_prob, reward, -0.3).policy / n).backward()
        grads.append(-torch.cat([mu.grad, log_std.grad]))
    exact = torch.cat([-2 * (mu0 - c), -2 * log_std0.exp() ** 2])
    assert_within_monte_carlo(torch.stack(grads), exact)


def test_gaussian_log_prob_is_the_density_and_passes_gradcheck():
    x = torch.tensor([[0.1, -0.3]], dtype=torch.float64, requires_grad=True)
    mean = torch.tensor([[0.0, 0.2]], dtype=torch.float64, requires_grad=True)
    std = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    expected = sum(
        -0.5 * ((xv - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
        for xv, m, s in ((0.1, 0.0, 0.5), (-0.3, 0.2, 0.25))
    )
    assert gaussian_log_prob(x, mean, std).item() == pytest.approx(expected, abs=1e-12)
    assert torch.autograd.gradcheck(gaussian_log_prob, (x, mean, std))


def test_the_sample_is_detached_and_the_log_prob_is_not():
    mean = torch.zeros(3, 2, requires_grad=True)
    draw = gaussian_sample(mean, 0.2, generator=torch.Generator().manual_seed(0))
    assert not draw.sample.requires_grad and draw.log_prob.requires_grad
    assert draw.sample.shape == (3, 2) and draw.log_prob.shape == (3,)


def test_gaussian_policy_fixed_or_learned_std_and_the_mean_pass():
    fixed = GaussianPolicy(4, std=0.2)
    assert [n for n, _ in fixed.named_parameters()] == ["mean.weight", "mean.bias"]
    assert fixed.log_std.exp().tolist() == pytest.approx([0.2, 0.2])
    learned = GaussianPolicy(4, std=0.2, learn_std=True)
    assert "log_std" in dict(learned.named_parameters())
    h = torch.randn(5, 4)
    draw = learned(h, generator=torch.Generator().manual_seed(0))
    draw.log_prob.sum().backward()
    assert learned.log_std.grad is not None and learned.mean.weight.grad is not None
    # the deterministic pass: the mean, kept on the image as each bound keeps it
    clamp = lambda m: m.clamp(-1, 1)  # noqa: E731
    modes = {"clamp": clamp, "pull": clamp, "tanh": torch.tanh, "none": lambda m: m}
    assert set(modes) == set(BOUNDS)
    for bound in BOUNDS:
        torch.manual_seed(0)
        policy = GaussianPolicy(4, bound=bound)
        with torch.no_grad():
            policy.mean.bias.copy_(torch.tensor([1.5, -0.3]))  # one coordinate off the image
        want = modes[bound](policy.mean(h)).detach()
        torch.testing.assert_close(policy(h, sample=False).sample, want)


def test_a_clamped_draw_stays_on_the_image_with_the_log_prob_of_the_draw():
    """Clamping is the environment's: the location is clamped, the log-prob is the unclamped
    draw's under N(mu, sigma^2) (so the estimator below stays unbiased)."""
    policy = GaussianPolicy(3, std=0.5, bound="clamp").double()
    with torch.no_grad():
        policy.mean.bias.copy_(torch.tensor([0.9, -1.2], dtype=torch.float64))
    h = torch.randn(400, 3, dtype=torch.float64)
    got = policy(h, generator=torch.Generator().manual_seed(3))
    mean = policy.mean(h)
    noise = torch.randn(mean.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    drawn = mean + 0.5 * noise  # the same draw, unclamped
    assert (drawn.abs() > 1).any()  # some fell off the image ...
    torch.testing.assert_close(got.sample, drawn.clamp(-1, 1).detach())  # ... and were clamped
    torch.testing.assert_close(got.log_prob, gaussian_log_prob(drawn, mean, torch.tensor(0.5)))


def test_pull_is_clamp_on_the_image_and_pulls_a_mean_back_from_off_it():
    """On the image "pull" draws, scores and differentiates exactly as "clamp"; off it the
    mean's gradient gains mu - clamp(mu) per row (here the only gradient: the loss reads the
    log-prob times 0), so a mean that wandered off is brought back, not left to random-walk
    where every draw is clamped to the same location."""
    h = torch.randn(50, 3, dtype=torch.float64)

    def run(bound, bias, weight=1.0):
        torch.manual_seed(0)
        policy = GaussianPolicy(3, std=0.2, bound=bound).double()
        with torch.no_grad():
            policy.mean.weight.mul_(0.1)
            policy.mean.bias.copy_(torch.tensor(bias, dtype=torch.float64))
        draw = policy(h, generator=torch.Generator().manual_seed(1))
        (draw.log_prob.sum() * weight).backward()
        return draw, policy.mean(h).detach(), policy.mean.bias.grad

    inside = [0.3, -0.6]
    (draw, mean, grad), (draw_c, mean_c, grad_c) = run("pull", inside), run("clamp", inside)
    for a, b in zip((*draw, mean, grad), (*draw_c, mean_c, grad_c), strict=True):
        assert torch.equal(a, b)
    _, mean, grad = run("pull", [1.5, -2.0], weight=0.0)
    beyond = mean - mean.clamp(-1, 1)
    assert (beyond[:, 0] > 0).all() and (beyond[:, 1] < 0).all()
    torch.testing.assert_close(grad, beyond.sum(0))  # + 0 from the log-prob
    assert torch.equal(run("clamp", [1.5, -2.0], weight=0.0)[2], torch.zeros(2, dtype=grad.dtype))


@pytest.mark.parametrize("border", [0.995, -0.9993])
def test_the_policy_gradient_does_not_vanish_at_the_border(border):
    """A mean pushed into a corner must still learn from the draws that land inside the image:
    d log pi / d bias is as large there as at the centre. A tanh mean's is scaled by
    1 - mu^2 (1e-2 .. 1e-3 here): such a mean stays in its corner (DRAM's failure)."""

    def mean_gradient(bound, location):
        bias = math.atanh(location) if bound == "tanh" else location
        policy = GaussianPolicy(2, 2, std=0.1, bound=bound).double()
        with torch.no_grad():
            policy.mean.weight.copy_(torch.eye(2))
            policy.mean.bias.fill_(bias)
        state = torch.zeros(2000, 2, dtype=torch.float64, requires_grad=True)
        draw = policy(state, generator=torch.Generator().manual_seed(1))
        inside = (draw.sample.abs() < 1).all(-1)  # draws that saw the image
        assert inside.sum() > 100
        # per draw: d log pi / d (W h + b), the pre-activation (the state enters it as is)
        (score,) = torch.autograd.grad(draw.log_prob.sum(), state)  # (2000, 2)
        return score[inside].abs().mean()

    # "clamp" is the toolkit's default (DRAM's; RAMConfig.bound chooses RAM's)
    assert GaussianPolicy(2).bound == "clamp"
    assert mean_gradient("clamp", border) > 0.5 * mean_gradient("clamp", 0.0)
    assert mean_gradient("tanh", border) < 0.05 * mean_gradient("tanh", 0.0)


def test_reinforce_through_a_clamped_draw_is_unbiased():
    """d/dmu E[R(clamp(mu + sigma eps))] by quadrature in float64 against the REINFORCE
    estimate with the policy's clamped draws, near a border where the clamp matters."""
    sigma, mu0 = 0.3, 0.85

    def reward(location):  # smooth, peaked inside the image near the border
        return torch.exp(-((location - 0.7) ** 2) / 0.05).sum(-1)

    mu = torch.tensor([mu0], dtype=torch.float64, requires_grad=True)
    eps = torch.linspace(-9, 9, 40_001, dtype=torch.float64)
    weight = torch.exp(-0.5 * eps**2) / math.sqrt(2 * math.pi) * (eps[1] - eps[0])
    expected = (reward((mu + sigma * eps).clamp(-1, 1).unsqueeze(-1)) * weight).sum()
    (exact,) = torch.autograd.grad(expected, mu)

    policy = GaussianPolicy(1, 1, std=sigma, bound="clamp").double()
    with torch.no_grad():
        policy.mean.weight.zero_()
        policy.mean.bias.fill_(mu0)
    n = 200_000
    state = torch.zeros(n, 1, dtype=torch.float64)
    draw = policy(state, generator=torch.Generator().manual_seed(0))
    r = reward(draw.sample)  # the environment sees the clamped location
    b = r.mean().item()
    loss = reinforce_loss(draw.log_prob, r, b)
    (grad,) = torch.autograd.grad(-loss.total / n, policy.mean.bias)
    # the same draws' per-sample estimates (R - b) (l - mu) / sigma^2 with l unclamped
    noise = torch.randn(n, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    per_draw = (r - b) * noise[:, 0] / sigma
    assert grad.item() == pytest.approx(per_draw.mean().item(), rel=1e-6)  # sigma = exp(log)
    assert abs(grad.item() - exact.item()) < 4 * per_draw.std().item() / math.sqrt(n)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: GaussianPolicy(4, std=0.0), "GaussianPolicy: argument 'std' expected"),
        (lambda: GaussianPolicy(0), "GaussianPolicy: argument 'd_input' expected"),
        (lambda: GaussianPolicy(4, bound="sigmoid"), "GaussianPolicy: argument 'bound' expected"),
        (lambda: gaussian_sample(torch.zeros(2), -1.0), "gaussian_sample: argument 'std'"),
        (lambda: rewards_to_go(torch.zeros(2, 3), 1.5), "rewards_to_go: argument 'discount'"),
        (lambda: rewards_to_go(torch.zeros(3)), "rewards_to_go: argument 'rewards'"),
        (lambda: reinforce_loss(torch.zeros(1, 2, 3), torch.zeros(1)), "argument 'log_prob'"),
        (lambda: gaussian_log_prob(torch.zeros(4, 2), torch.zeros(4, 1, 2), 1.0), "'x' expected"),
        (lambda: MovingAverageBaseline(1.0), "argument 'momentum' expected"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("argument", ["reward", "baseline", "entropy", "mask"])
def test_one_value_per_episode_beside_per_step_log_probs_needs_its_steps_dim(argument):
    """A (batch,) tensor beside (batch, steps) log-probs lined up from the right: with batch ==
    steps it was read as per-step, each row's reward spread over the steps of every row (the
    policy term 3 here, for 6)."""
    log_prob = torch.zeros(3, 3)
    log_prob[:, 0] = -1.0
    per_episode = torch.tensor([1.0, 2.0, 3.0])
    args = dict(reward=torch.zeros(3, 1), baseline=None, entropy=None, mask=None)
    args[argument] = per_episode > 1 if argument == "mask" else per_episode
    with pytest.raises(ValueError, match=f"reinforce_loss: argument '{argument}' expected a"):
        reinforce_loss(log_prob, args.pop("reward"), args.pop("baseline"), **args)
    assert reinforce_loss(log_prob, per_episode[:, None]).policy == 6.0
    assert reinforce_loss(log_prob, torch.tensor(2.0)).policy == 6.0  # 0-d: every step's


@pytest.mark.parametrize("garbage", [float("-inf"), float("inf"), float("nan")])
@pytest.mark.parametrize("discount", [1.0, 0.9, 0.0])
def test_a_nonfinite_reward_reaches_only_its_own_and_earlier_returns(garbage, discount):
    """R_t sums the rewards from t on: a reward of -inf at step 1 (a token's log-likelihood
    as the reward) made every later return NaN too, through the weight 0 of the past; its own
    and the earlier returns stay non-finite."""
    r = torch.tensor([[0.5, garbage, 1.0, 2.0, 3.0]], dtype=torch.float64)
    want = torch.tensor(
        [[sum(discount ** (u - t) * float(r[0, u]) for u in range(t, 5)) for t in range(5)]],
        dtype=torch.float64,
    )
    got = rewards_to_go(r, discount)
    assert torch.equal(got[:, 2:], want[:, 2:])
    assert not torch.isfinite(got[:, :2]).any()  # (with discount 0 too: 0 * inf is no number)


def test_rewards_to_go_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    expected = [[1 + 2 * 0.5 + 3 * 0.25, 2 + 3 * 0.5, 3.0], [0.25, 0.5, 1.0]]
    assert rewards_to_go(r, 0.5).tolist() == expected
    assert rewards_to_go(r).tolist() == [[6.0, 5.0, 3.0], [1.0, 1.0, 1.0]]
    assert rewards_to_go(r, 0.0).tolist() == r.tolist()


@pytest.mark.parametrize("discount", [1.0, 0.9])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_lambda_returns_against_a_backward_loop(discount, lam):
    g = torch.Generator().manual_seed(1)
    r = torch.rand(3, 7, generator=g, dtype=torch.float64)
    v = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    expected = torch.zeros(3, 7, dtype=torch.float64)
    for b in range(3):  # G_t = r_t + discount ((1 - lam) V_{t+1} + lam G_{t+1}), G_K = V_K = 0
        following = 0.0
        for t in reversed(range(7)):
            next_v = v[b, t + 1].item() if t + 1 < 7 else 0.0
            following = r[b, t].item() + discount * ((1 - lam) * next_v + lam * following)
            expected[b, t] = following
    got = lambda_returns(r, v, discount, lam)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert not got.requires_grad  # the values are detached
    if lam == 1.0:  # the plain rewards to go, whatever the values
        torch.testing.assert_close(got, rewards_to_go(r, discount), rtol=0, atol=1e-12)


def test_loss_terms_by_hand_with_mask_and_entropy():
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    reward = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    baseline = torch.tensor([[0.5, 0.5], [0.5, 0.5]], requires_grad=True)
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, False], [True, True]])
    out = reinforce_loss(log_prob, reward, baseline, entropy=entropy, entropy_weight=0.1, mask=mask)
    # advantages 0.5, -0.5, -0.5 on the kept steps
    assert out.policy.item() == pytest.approx(-(0.5 * -1.0 + -0.5 * -0.5 + -0.5 * -0.25))
    assert out.baseline.item() == pytest.approx(3 * 0.25)
    assert out.entropy.item() == pytest.approx(-0.1 * (1 + 3 + 4))
    assert out.total.item() == pytest.approx((out.policy + out.baseline + out.entropy).item())
    # lambda_r scales the policy and baseline terms, not the entropy bonus (Xu 2015 eq. 12:
    # lambda_e is its own weight; it was scaled by both)
    total = hybrid_loss(torch.tensor(2.0), out, weight=0.5)
    expected = 2.0 + 0.5 * (out.policy + out.baseline).item() + out.entropy.item()
    assert total.item() == pytest.approx(expected)
    zero = reinforce_loss(log_prob, reward)  # no baseline: no baseline or entropy term
    assert zero.baseline.item() == 0.0 and zero.entropy.item() == 0.0


def test_moving_average_baseline():
    b = MovingAverageBaseline(momentum=0.75)
    assert b().item() == 0.0
    b.update(torch.tensor([1.0, 3.0]))  # the first batch sets it
    assert b().item() == pytest.approx(2.0)
    b.update(torch.tensor([6.0]))
    assert b().item() == pytest.approx(0.75 * 2.0 + 0.25 * 6.0)
    assert set(b.state_dict()) == {"value", "started"}
    # only the counted rows enter the mean; a batch with none counted changes nothing
    before = b().item()
    b.update(torch.tensor([100.0, 10.0, -50.0]), torch.tensor([False, True, False]))
    assert b().item() == pytest.approx(0.75 * before + 0.25 * 10.0)
    before = b().item()
    b.update(torch.tensor([100.0]), torch.tensor([False]))
    assert b().item() == before
    fresh = MovingAverageBaseline(momentum=0.75)
    fresh.update(torch.tensor([7.0]), torch.tensor([False]))  # nothing counted: not started
    assert not fresh.started and fresh().item() == 0.0
    fresh.update(torch.tensor([7.0, 1.0]), torch.tensor([False, True]))  # the first sets it
    assert fresh.started and fresh().item() == pytest.approx(1.0)
    # a row left out holds anything, even inf or NaN: it never enters (0 * inf was NaN, and
    # the baseline stayed NaN from then on)
    for garbage in (float("inf"), float("nan")):
        b = MovingAverageBaseline(momentum=0.75)
        b.update(torch.tensor([1.0, 3.0, garbage]), torch.tensor([True, True, False]))
        assert b().item() == pytest.approx(2.0)


def _baseline_in_a_job(rank: int, world: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        b = MovingAverageBaseline(momentum=0.5)
        rewards = torch.tensor([[1.0, 3.0, 100.0], [10.0, 20.0, 30.0]][rank])
        counts = torch.tensor([[True, True, False], [True, True, True]][rank])
        b.update(rewards, counts)
        b.update(torch.full((3,), 4.0 + rank))
        torch.save(b().clone(), f"{out}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_a_moving_average_over_a_torchrun_job_is_the_global_batchs(tmp_path):
    """Each process held its share's mean (DDP then broadcast rank 0's): rank 1's rewards
    never entered. The mean is of every counted row of every process: (1 + 3 + 10 + 20 + 30)
    / 5 = 12.8, then halfway to the mean of the second batch, (4 * 3 + 5 * 3) / 6 = 4.5."""
    init = f"file://{tmp_path}/rendezvous"
    torch.multiprocessing.spawn(_baseline_in_a_job, args=(2, init, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        assert torch.load(tmp_path / f"{rank}.pt").item() == pytest.approx((12.8 + 4.5) / 2)


def test_a_float64_moving_average_moves_in_float64():
    """The update's rate was a float32 tensor made from Python floats: a float64 baseline moved
    by a float32-rounded momentum (2.800000011920929 for 0.9 * 2 + 0.1 * 10)."""
    b = MovingAverageBaseline(momentum=0.9).double()
    b.update(torch.tensor([2.0], dtype=torch.float64))
    b.update(torch.tensor([10.0], dtype=torch.float64))
    assert b().dtype == torch.float64
    assert b().item() == 2.0 + (1.0 - 0.9) * (10.0 - 2.0)  # the update's own float64 steps


def test_toolkit_on_every_device(device):
    policy = GaussianPolicy(4, learn_std=True).to(device)
    h = torch.randn(3, 4, device=device)
    draw = policy(h)
    assert draw.sample.device.type == device.type
    baseline = MovingAverageBaseline().to(device)
    reward = -(draw.sample**2).sum(-1)
    to_go = rewards_to_go(torch.stack([reward, reward], 1), 0.9)
    loss = reinforce_loss(torch.stack([draw.log_prob] * 2, 1), to_go, baseline())
    baseline.update(reward)
    loss.total.backward()
    assert policy.mean.weight.grad.device.type == device.type
    # the rest of the toolkit: a tensor std, TD(lambda) returns, the hybrid loss
    mean = torch.randn(3, 2, device=device, requires_grad=True)
    std = torch.full((3, 2), 0.5, device=device, requires_grad=True)
    drawn = gaussian_sample(mean, std, generator=sampling_generator(device).manual_seed(0))
    rewards = torch.randn(3, 2, device=device)
    returns = lambda_returns(rewards, torch.randn(3, 2, device=device), 0.9, 0.8)
    step = reinforce_loss(drawn.log_prob.sum(-1, keepdim=True).expand(3, 2), returns)
    total = hybrid_loss((mean**2).sum(), step, weight=0.5)
    assert returns.device.type == total.device.type == device.type and total.dim() == 0
    total.backward()
    assert mean.grad.device.type == std.grad.device.type == device.type


def test_a_masked_step_holding_garbage_never_reaches_the_loss_or_a_gradient():
    """Steps after an episode's end may hold anything: a -inf log-prob (a closed choice) or a
    NaN reward there made the loss NaN (0 * inf) when the mask multiplied."""
    log_prob = torch.tensor([[-0.5, -1.0, float("-inf")]], requires_grad=True)
    reward = torch.tensor([[1.0, 2.0, float("nan")]])
    baseline = torch.tensor([[0.5, 0.5, float("inf")]], requires_grad=True)
    entropy = torch.tensor([[0.1, 0.2, float("nan")]])
    mask = torch.tensor([[True, True, False]])
    out = reinforce_loss(log_prob, reward, baseline, entropy=entropy, entropy_weight=0.5, mask=mask)
    out.total.backward()
    assert out.policy.item() == pytest.approx(-(0.5 * -0.5 + 1.5 * -1.0))
    assert out.baseline.item() == pytest.approx(0.25 + 2.25)
    assert out.entropy.item() == pytest.approx(-0.5 * 0.3)
    assert log_prob.grad.isfinite().all() and log_prob.grad[0, 2] == 0
    assert baseline.grad.isfinite().all() and baseline.grad[0, 2] == 0
