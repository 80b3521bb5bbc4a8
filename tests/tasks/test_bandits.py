"""The `bandits` task (`attnzoo.tasks.bandits`): the draws, the inputs, UCB1 and Thompson
sampling against loops written here, the policy-gradient loss and the evaluation."""

import math
import statistics
from dataclasses import replace

import numpy as np
import pytest
import torch

from attnzoo.models.snail import SnailPolicy, snail_bandit
from attnzoo.tasks import bandits as B
from attnzoo.tasks.base import EvalConfig, held_out_generator, sampling_generator, sampling_seed

CONFIG = B.BanditsConfig(arms=3, pulls=6, test_episodes=40)


@pytest.fixture
def task():
    return B.BanditsTask(CONFIG, seed=1, eval_config=EvalConfig(limit=0))


def tiny_policy():
    torch.manual_seed(0)
    return SnailPolicy(snail_bandit(filters=4, key_size=4, value_size=3), CONFIG.arms, CONFIG.pulls)


def test_draws_are_bernoulli_of_the_probabilities_and_deterministic(task):
    a, b = task.batch(3, 2000, "cpu"), task.batch(3, 2000, "cpu")
    assert torch.equal(a.payoff, b.payoff) and not torch.equal(
        a.payoff, task.batch(4, 2000, "cpu").payoff
    )
    assert a.payoff.shape == (2000, 6, 3) and a.items == 2000 * 6
    assert set(a.payoff.unique().tolist()) <= {0.0, 1.0}
    # the share of wins per arm is its probability (binned over episodes)
    low = a.probs < 0.2
    assert a.payoff.mean(1)[low].mean() < 0.15 and a.payoff.mean(1)[~low].mean() > 0.5


def test_inputs_hold_the_previous_pull_and_its_reward():
    actions, rewards = torch.tensor([[2, 0]]), torch.tensor([[1.0, 0.0]])
    x = B.inputs_of(actions, rewards, 3)
    expected = torch.tensor([[[0, 0, 0, 0, 1], [0, 0, 1, 1, 0], [1, 0, 0, 0, 0]]]).float()
    assert torch.equal(x, expected)


def test_the_outcome_encoding_shows_each_pull_at_its_arm_and_outcome():
    """`arm_outcome`: a success of arm a at channel a, a failure at N + a, then the reward and
    the start flag, so summing the inputs so far counts each arm's successes and failures."""
    actions, rewards = torch.tensor([[2, 0, 2]]), torch.tensor([[1.0, 0.0, 0.0]])
    x = B.inputs_of(actions, rewards, 3, "arm_outcome")
    assert x.shape == (1, 4, B.input_width(3, "arm_outcome")) == (1, 4, 8)
    expected = torch.zeros(1, 4, 8)
    expected[0, 0, 7] = 1  # the start flag
    expected[0, 1, 2] = expected[0, 1, 6] = 1  # arm 2 paid 1
    expected[0, 2, 3] = 1  # arm 0 paid 0
    expected[0, 3, 5] = 1  # arm 2 paid 0
    assert torch.equal(x, expected)
    counts = x[0, 1:, :6].sum(0).reshape(2, 3)  # (successes, failures) per arm
    assert counts.tolist() == [[0, 0, 1], [1, 0, 1]]


@pytest.mark.parametrize(("field", "value"), [("encoding", "onehot"), ("value", "mean")])
def test_unknown_options_are_named(field, value):
    options = {"encoding": B.ENCODINGS, "value": B.VALUES}[field]
    with pytest.raises(ValueError) as error:
        replace(CONFIG, **{field: value})
    assert f"'{field}' expected one of {list(options)}, got {value!r}" in str(error.value)


@pytest.mark.parametrize("encoding", B.ENCODINGS)
def test_the_model_reads_the_encodings_width_and_plays_it(encoding):
    config = replace(CONFIG, encoding=encoding)
    task = B.BanditsTask(config, seed=1, eval_config=EvalConfig(limit=0))
    torch.manual_seed(0)
    dims = task.model_dims()
    assert dims["inputs"] == B.input_width(CONFIG.arms, encoding)
    model = SnailPolicy(snail_bandit(filters=4, key_size=4, value_size=3), **dims)
    loss, _ = task.loss(model, task.batch(0, 4, "cpu"))
    assert loss.isfinite()
    assert task.evaluate(model)["n"] == CONFIG.test_episodes
    with pytest.raises(ValueError, match="'inputs'"):
        model(torch.zeros(1, 2, dims["inputs"] + 1))


@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_a_per_pull_value_is_scaled_by_the_pulls_left(discount):
    """`value="per_pull"`: the baseline at step t is the output times the discounted count of
    the pulls from t on (K - t undiscounted), computed here by a loop."""
    task = B.BanditsTask(replace(CONFIG, value="per_pull", discount=discount), seed=1,
                         eval_config=EvalConfig())  # fmt: skip
    value = torch.rand(2, CONFIG.pulls, dtype=torch.float64)
    left = [sum(discount**k for k in range(CONFIG.pulls - t)) for t in range(CONFIG.pulls)]
    expected = value * torch.tensor(left, dtype=torch.float64)
    torch.testing.assert_close(task.baseline(value), expected, rtol=1e-12, atol=0)
    total = B.BanditsTask(replace(CONFIG, discount=discount), seed=1, eval_config=EvalConfig())
    assert torch.equal(total.baseline(value), value)


def test_ucb1_against_a_loop():
    rng = np.random.default_rng(0)
    payoff = (rng.random((5, 9, 3)) < 0.5).astype(float)
    got = B.ucb1(payoff)
    for e in range(5):
        n, s = [0] * 3, [0.0] * 3
        for t in range(9):
            if t < 3:
                a = t
            else:
                a = max(
                    range(3), key=lambda k: (s[k] / n[k] + math.sqrt(2 * math.log(t) / n[k]), -k)
                )
            assert got[e, t] == payoff[e, t, a]
            n[a] += 1
            s[a] += payoff[e, t, a]


def test_thompson_sampling_finds_the_better_arm():
    """Two arms at 0.9 and 0.1: Thompson sampling earns near the oracle over many pulls, and its
    rewards are the draws of the arms it pulls (it reads nothing else)."""
    rng = np.random.default_rng(1)
    probs = np.array([0.1, 0.9])
    payoff = (rng.random((200, 100, 2)) < probs).astype(float)
    got = B.thompson(payoff, seed=0)
    assert got.mean() > 0.85
    assert np.all((got == payoff[:, :, 0]) | (got == payoff[:, :, 1]))
    assert np.array_equal(got, B.thompson(payoff, seed=0))  # deterministic per seed


def test_thompson_sampling_against_a_loop():
    """Each step, one draw over all episodes' Beta(1 + wins, 1 + losses) posteriors (the
    uniform Beta(1, 1) prior) from numpy's generator of `seed`; the arm of the largest sample
    (ties to the lowest index) is pulled and its draw counted as a win or a loss."""
    rng = np.random.default_rng(0)
    payoff = (rng.random((40, 12, 3)) < rng.random((40, 1, 3))).astype(float)
    got = B.thompson(payoff, seed=5)
    draws = np.random.default_rng(5)
    wins, losses = [[0] * 3 for _ in range(40)], [[0] * 3 for _ in range(40)]
    for t in range(12):
        samples = draws.beta(1 + np.array(wins), 1 + np.array(losses))  # (40, 3)
        for e in range(40):
            a = max(range(3), key=lambda k: (samples[e, k], -k))
            assert got[e, t] == payoff[e, t, a], (e, t)
            wins[e][a] += int(payoff[e, t, a])
            losses[e][a] += 1 - int(payoff[e, t, a])


def test_the_policy_is_causal():
    model = tiny_policy().double()
    x = torch.randn(2, 6, CONFIG.arms + 2, dtype=torch.float64)
    base = model(x)
    for t in range(6):
        y = x.clone()
        y[:, t] += 1
        out = model(y)
        torch.testing.assert_close(out.logits[:, :t], base.logits[:, :t], rtol=0, atol=0)
        torch.testing.assert_close(out.value[:, :t], base.value[:, :t], rtol=0, atol=0)


def test_step_equals_the_forward_pass_at_every_position():
    # 17 pulls: dilations 2 .. 32, some longer than the episode
    torch.manual_seed(3)
    model = SnailPolicy(snail_bandit(filters=5, key_size=4, value_size=3), 4, 17).double()
    x = torch.randn(3, 17, 6, dtype=torch.float64)
    whole = model(x)
    tape = model.start(x[:, 0])
    for t in range(17):
        logits, value = model.step(tape, x[:, t])
        torch.testing.assert_close(logits, whole.logits[:, t], rtol=0, atol=1e-12)
        torch.testing.assert_close(value, whole.value[:, t], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="'tape'"):
        model.step(tape, x[:, 0])
    with pytest.raises(ValueError, match="'inputs'"):
        model.step(model.start(x[:, 0]), x[:, 0, :5])
    # one row would broadcast over the tape's three
    with pytest.raises(ValueError, match="'inputs' expected batch size 3 \\(the tape's\\), got 1"):
        model.step(model.start(x[:, 0]), x[:1, 0])
    # the whole pass past the episode it was built for, as step refuses it
    with pytest.raises(ValueError, match="'inputs' expected at most pulls = 17 steps"):
        model(torch.cat([x, x[:, :1]], 1))


def test_the_first_episodes_are_those_of_the_whole_held_out_set(task):
    """eval.limit and the explorer take the first episodes of the evaluation's set: a draw of
    fewer episodes alone held other payoffs (`draw` takes every arm before any payoff)."""
    whole = task.held_out(CONFIG.test_episodes)
    first = task.held_out(7)
    assert torch.equal(first.probs, whole.probs[:7]) and torch.equal(first.payoff, whole.payoff[:7])
    assert first.items == 7 * CONFIG.pulls
    g = held_out_generator(CONFIG.seed, "test")  # the whole set is the one it always was
    assert torch.equal(whole.payoff, B.draw(CONFIG, CONFIG.test_episodes, g).payoff)
    limited = B.BanditsTask(CONFIG, seed=1, eval_config=EvalConfig(limit=7)).evaluate(None)
    assert limited["reward_ucb1"] == pytest.approx(
        B.ucb1(first.payoff.double().numpy()).sum(1).mean()
    )


def test_a_limit_past_the_held_out_set_scores_the_set(task):
    """eval.limit counts held-out episodes scored: past test_episodes it drew and scored more
    episodes than the set has (n = limit)."""
    over = B.BanditsTask(CONFIG, seed=1, eval_config=EvalConfig(limit=CONFIG.test_episodes + 9))
    assert over.evaluate(None) == task.evaluate(None)


def test_rollout_plays_what_the_policy_picks_on_every_prefix(task):
    # the reference: the whole forward pass on each prefix, the argmax of its last position
    model = tiny_policy().double()
    batch = task.held_out(5)
    batch = B.BanditBatch(batch.probs.double(), batch.payoff.double(), 0, batch.items)
    actions, rewards = B.rollout(model, batch, None, greedy=True)
    played, paid = torch.zeros(5, 0, dtype=torch.long), torch.zeros(5, 0, dtype=torch.float64)
    for t in range(CONFIG.pulls):
        pick = model(B.inputs_of(played, paid, CONFIG.arms)).logits[:, -1].argmax(-1)
        played = torch.cat([played, pick[:, None]], 1)
        paid = torch.cat([paid, batch.payoff[torch.arange(5), t, pick][:, None]], 1)
    assert torch.equal(actions, played) and torch.equal(rewards, paid)


@pytest.mark.parametrize("options", [{}, {"encoding": "arm_outcome", "value": "per_pull"}])
def test_rollout_and_loss_run_on_the_device(options, device):
    task = B.BanditsTask(replace(CONFIG, **options), seed=1, eval_config=EvalConfig())
    torch.manual_seed(0)
    config = snail_bandit(filters=4, key_size=4, value_size=3)
    model = SnailPolicy(config, **task.model_dims()).to(device)
    batch = task.batch(0, 4, device)
    actions, rewards = task._rollout(model, batch, None)
    assert actions.device.type == device.type and rewards.shape == (4, CONFIG.pulls)
    loss, _ = task.loss(model, batch)
    loss.backward()
    assert all(p.grad.device.type == device.type for p in model.parameters())


@pytest.mark.parametrize("detach", [False, True])
def test_a_detached_value_head_trains_itself_alone(detach):
    torch.manual_seed(0)
    config = snail_bandit(filters=4, key_size=4, value_size=3, detach_value=detach)
    model = SnailPolicy(config, CONFIG.arms, CONFIG.pulls)
    model(torch.randn(2, 6, CONFIG.arms + 2)).value.square().sum().backward()
    blocks = [p.grad for p in model.tc.parameters()] + [p.grad for p in model.attend.parameters()]
    assert model.value.weight.grad.abs().sum() > 0 and model.policy.weight.grad is None
    reached = any(g is not None and g.abs().sum() > 0 for g in blocks)
    assert reached != detach


def test_the_loss_is_reinforce_with_the_value_baseline(task):
    model = tiny_policy()
    loss, count = task.loss(model, task.batch(0, 8, "cpu"))
    assert count == 8 * 6 and loss.isfinite()
    loss.backward()
    assert model.value.weight.grad.abs().sum() > 0 and model.policy.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("entropy_weight", "discount", "lam"), [(0.1, 0.9, 0.8), (0.3, 1.0, 0.5)])
def test_the_loss_is_the_a2c_loss_written_out(entropy_weight, discount, lam):
    """A2C (Mnih 2016; Duan 2016's RL^2): -sum_t (G_t - V_t) log pi(a_t | s_t)
    + sum_t (V_t - G_t)^2 - beta sum_t H(pi_t) over the episodes the loss plays from its own
    seeded generator, with G_t the TD(lambda) returns by a backward loop, a_t the arm pulled
    at step t and H = -sum_a p log p; the loss and the policy head's gradient against that
    float64 reference."""
    config = replace(CONFIG, entropy_weight=entropy_weight, discount=discount, gae_lambda=lam)
    task = B.BanditsTask(config, seed=1, eval_config=EvalConfig(limit=0))
    model, reference = tiny_policy().double(), tiny_policy().double()
    batch = task.batch(0, 8, "cpu")
    batch = batch._replace(payoff=batch.payoff.double(), probs=batch.probs.double())
    loss, _ = task.loss(model, batch)
    loss.backward()
    g = sampling_generator(torch.device("cpu")).manual_seed(
        sampling_seed(task.seed * 7 + batch.step, batch.rank)
    )  # the loss's own draws
    actions, rewards = task._rollout(reference, batch, g)
    out = reference(B.inputs_of(actions[:, :-1], rewards[:, :-1], CONFIG.arms))
    log_p = torch.log_softmax(out.logits, -1)  # (b, K, N)
    pulls = CONFIG.pulls
    log_pi = torch.stack([log_p[torch.arange(8), t, actions[:, t]] for t in range(pulls)], 1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    value, v = out.value, out.value.detach()
    returns, gae = torch.zeros_like(rewards), torch.zeros(8, dtype=torch.float64)
    for t in reversed(range(pulls)):
        following = v[:, t + 1] if t + 1 < pulls else torch.zeros_like(gae)
        gae = rewards[:, t] + discount * following - v[:, t] + discount * lam * gae
        returns[:, t] = v[:, t] + gae
    expected = (
        -((returns - v) * log_pi).sum()
        + ((value - returns) ** 2).sum()
        - entropy_weight * entropy.sum()
    )
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    torch.testing.assert_close(model.policy.weight.grad, reference.policy.weight.grad)
    torch.testing.assert_close(model.policy.bias.grad, reference.policy.bias.grad)


@pytest.mark.parametrize(("lam", "discount"), [(0.0, 1.0), (1.0, 1.0), (0.0, 0.9)])
def test_the_loss_learns_from_the_lambda_returns(lam, discount, monkeypatch):
    # the same episodes (the policy head does not read the value head) under two value biases:
    # at lambda 1 the returns are the rewards to go, whatever the value says; at lambda 0 each
    # is r_t + discount V_{t+1}, so the bias shifts every step's but the last
    returns = []

    def spy(log_pi, target, *args, **kwargs):
        returns.append(target)
        return reinforce(log_pi, target, *args, **kwargs)

    reinforce = B.reinforce_loss
    monkeypatch.setattr(B, "reinforce_loss", spy)
    config = replace(CONFIG, gae_lambda=lam, discount=discount)
    task = B.BanditsTask(config, seed=1, eval_config=EvalConfig())
    for bias in (0.0, 5.0):
        model = tiny_policy()
        with torch.no_grad():
            model.value.bias.fill_(bias)
        task.loss(model, task.batch(0, 8, "cpu"))
    shift = returns[1] - returns[0]  # (8, pulls)
    expected = torch.zeros_like(shift)
    if lam == 0.0:
        expected[:, :-1] = 5.0 * discount
    torch.testing.assert_close(shift, expected, rtol=0, atol=1e-5)


def test_evaluation_scores_every_policy_on_the_same_draws(task):
    metrics = task.evaluate(tiny_policy())
    assert metrics["n"] == 40
    for name in B.POLICIES:
        assert 0 <= metrics[f"reward_{name}"] <= CONFIG.pulls
    best = task.held_out(40)
    oracle = best.payoff.gather(2, best.probs.argmax(1)[:, None, None].expand(-1, 6, 1)).sum((1, 2))
    assert metrics["reward_oracle"] == pytest.approx(oracle.mean().item())
    assert metrics["agent_over_thompson"] == pytest.approx(
        metrics["reward_agent"] / metrics["reward_thompson"]
    )


def test_each_policys_interval_is_1_96_standard_errors_over_episodes(task):
    """`ci95_NAME` (docs/snail.md's "± ci95"): 1.96 sample standard deviations of the
    episodes' total rewards over the square root of their count."""
    metrics = task.evaluate(tiny_policy())
    found = task.scores(tiny_policy(), 40)
    assert "agent" in found and {f"ci95_{name}" for name in found} <= set(metrics)
    for name, rewards in found.items():
        totals = [float(t) for t in rewards.sum(1)]
        assert metrics[f"reward_{name}"] == pytest.approx(statistics.mean(totals))  # same draws
        assert metrics[f"ci95_{name}"] == pytest.approx(
            1.96 * statistics.stdev(totals) / math.sqrt(40)
        )


def test_figures_and_explore(task, tmp_path):
    from attnzoo.viz.explore import validate

    model = tiny_policy().eval()
    assert [p.name for p in task.figures(model, tmp_path)] == ["bandit_rewards.png"]
    data = task.explore(model, 2)
    validate(data)
    (kind,) = data["examples"][0]["attention"]
    assert len(kind["rows"]) == 6 and kind["columns"][0] == "start"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"arms": 1}, "'arms'"),
        ({"pulls": 0}, "'pulls'"),
        ({"entropy_weight": 1}, "'entropy_weight'"),
        ({"gae_lambda": 1.5}, "'gae_lambda'"),
        ({"gae_lambda": True}, "'gae_lambda'"),
        ({"discount": -0.5}, "'discount'"),
    ],
)
def test_bad_config_values_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        B.BanditsConfig(**changes)


def test_bad_policy_input_is_named():
    with pytest.raises(ValueError, match="'inputs'"):
        tiny_policy()(torch.zeros(1, 2, 4))
    width = tiny_policy().width
    with pytest.raises(TypeError, match="'inputs' expected a floating-point"):
        tiny_policy()(torch.zeros(1, 2, width, dtype=torch.long))


def _reference_value(arms: int, pulls: int) -> float:
    """The Bayes-optimal expected reward by plain recursion over the unsorted counts (no
    symmetry, no shared code): max over arms of p (1 + V(win)) + (1 - p) V(loss)."""

    def value(counts: list, left: int) -> float:
        if left == 0:
            return 0.0
        best = -1.0
        for a, (w, l) in enumerate(counts):
            p = (w + 1) / (w + l + 2)
            win = value([*counts[:a], (w + 1, l), *counts[a + 1 :]], left - 1)
            loss = value([*counts[:a], (w, l + 1), *counts[a + 1 :]], left - 1)
            best = max(best, p * (1 + win) + (1 - p) * loss)
        return best

    return value([(0, 0)] * arms, pulls)


def test_the_bayes_optimal_value_matches_a_hand_count_and_a_plain_recursion():
    # N=2, K=2: pull one arm (1/2); after a win keep it (2/3), after a loss switch (1/2)
    assert B.bayes_optimal_value(2, 2) == pytest.approx(1 / 2 + 1 / 2 * 2 / 3 + 1 / 2 * 1 / 2)
    assert B.bayes_optimal_value(4, 1) == pytest.approx(0.5)
    for arms, pulls in ((2, 5), (3, 4)):
        expected = _reference_value(arms, pulls)
        assert B.bayes_optimal_value(arms, pulls) == pytest.approx(expected, rel=1e-12)


def test_the_bayes_optimal_policy_earns_its_value_and_beats_ucb1_and_thompson():
    config = B.BanditsConfig(arms=3, pulls=4, test_episodes=20000)
    batch = B.draw(config, 20000, torch.Generator().manual_seed(5))
    payoff = batch.payoff.double().numpy()
    totals = B.bayes_optimal(payoff).sum(1)
    # its rewards are the draws of the arms it pulled, each pull once
    assert set(np.unique(totals)) <= set(range(5))
    standard_error = totals.std(ddof=1) / math.sqrt(len(totals))
    assert abs(totals.mean() - B.bayes_optimal_value(3, 4)) < 4 * standard_error
    for other in (B.ucb1(payoff), B.thompson(payoff, 0)):
        gain = totals - other.sum(1)  # paired on the same draws
        assert gain.mean() > 4 * gain.std(ddof=1) / math.sqrt(len(gain))


def test_bayes_optimal_is_skipped_where_it_is_unaffordable():
    assert B.bayes_feasible(5, 10) and not B.bayes_feasible(10, 100)
    with pytest.raises(ValueError, match="N=10, K=100"):
        B.bayes_optimal(np.zeros((1, 100, 10)))
    config = B.BanditsConfig(arms=10, pulls=100, test_episodes=3)
    metrics = B.BanditsTask(config, seed=0, eval_config=EvalConfig()).evaluate(None)
    assert "reward_bayes" not in metrics and "reward_thompson" in metrics


def test_evaluation_without_a_model_scores_the_other_policies(task):
    metrics = task.evaluate(None)
    with_agent = task.evaluate(tiny_policy())
    assert not any("agent" in key for key in metrics)
    for name in B.POLICIES[1:]:  # the same draws, so the same numbers
        assert metrics[f"reward_{name}"] == with_agent[f"reward_{name}"]
    assert with_agent["agent_over_bayes"] == pytest.approx(
        with_agent["reward_agent"] / with_agent["reward_bayes"]
    )
