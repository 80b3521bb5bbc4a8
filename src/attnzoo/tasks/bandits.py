"""`bandits`: Bernoulli multi-armed bandits, SNAIL's reinforcement-learning experiment (Mishra
et al. 2017, sec. 5.3; Duan et al. 2016's setup).

An episode is N arms with success probabilities p ~ U(0, 1) each, and K pulls; a pull of arm a
at step t pays 1 with probability p_a. The rewards are drawn once per episode as a table
`payoff (K, N)` of Bernoulli(p) draws (pulling arm a at step t pays payoff[t, a]), so every
policy scored on an episode meets the same draws (common random numbers): the learned agent,
UCB1 and Thompson sampling (`ucb1`, `thompson`, computed exactly as their algorithms say, not
learned), the Bayes-optimal policy for the prior where exact dynamic programming is affordable
(`bayes_optimal`: N = 5, K = 10, not N = 10, K = 100), a uniformly random policy and the
oracle that always pulls the best arm.

Training episodes are drawn from the run's seed and the step; the held-out episodes once from
`BanditsConfig.seed`. The agent is trained by REINFORCE with a learned value baseline
(`attnzoo.core.hard.reinforce_loss`) on the rewards to go.

"bandit" interface (`attnzoo.models.registry`): a model is built with `(config, arms, pulls,
inputs)` and called as `model(inputs (batch, steps, inputs))`, the input at step t describing
the pull of step t - 1 as `BanditsConfig.encoding` says (`inputs_of`), with a flag for t = 0
(zeros otherwise), and returns an
output with `logits` (batch, steps, arms) over the arm to pull at each step, `value`
(batch, steps) (the baseline) and `attention` ((name, weights (batch, heads, steps, steps))
per attention block, when asked). It must be causal: the output at t reads inputs <= t.
Episodes are played one pull at a time through `model.start(inputs (batch, inputs))`, an
empty tape, and `model.step(tape, inputs)` -> (logits (batch, arms), value (batch,)) at the
tape's next step, equal to the forward pass's outputs there. The task reads the value as
`BanditsConfig.value` says.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.hard import lambda_returns, reinforce_loss
from attnzoo.core.normalisers import at_least_float32, sample_hard
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    held_out_generator,
    inner_model,
    model_device,
    sampling_generator,
    sampling_seed,
    training_generator,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.batch_size", "eval.beam_size", "eval.label_smoothing")
POLICIES = ("agent", "ucb1", "thompson", "bayes", "random", "oracle")
# How a pull is shown to the agent at the next step (`inputs_of`): "arm_reward", the paper's
# one-hot of the arm beside the reward; "arm_outcome", one one-hot over the (arm, outcome)
# pairs (successes of arm a at a, failures at N + a) beside the reward, so each arm's counts
# of successes and failures are sums of input channels
ENCODINGS = ("arm_reward", "arm_outcome")
# What the agent's value output stands for (`BanditsTask.loss`): "total", the returns
# themselves; "per_pull", the return per pull still to come, scaled by the discounted count of
# those pulls (the output stays near the mean reward of a pull at every step, where the
# returns shrink from about K / 2 to 0 over an episode)
VALUES = ("total", "per_pull")
# `bayes_optimal`'s bound on the count vectors it may visit, comb(K + 2N, 2N) (N = 5, K = 10:
# 184,756, a quarter of a second; N = 10, K = 100: ~1.7e22)
BAYES_STATES = 2_000_000


@dataclass(frozen=True)
class BanditsConfig:
    """Attributes:
    arms: N.
    pulls: K, pulls per episode.
    test_episodes: held-out episodes (eval.limit may score fewer).
    entropy_weight: the entropy bonus of the policy-gradient loss.
    discount: of the rewards in the returns the agent learns from (1: the episode's total, the
        score; below 1, a pull is credited mostly with the rewards soon after it).
    gae_lambda: lambda of the TD(lambda) returns the policy and the value learn from
        (`attnzoo.core.hard.lambda_returns`): 1 is the plain rewards to go; below 1 the value's
        estimates of later steps stand in for part of the summed rewards (less variance over a
        long episode, some bias).
    encoding: one of ENCODINGS, how the agent sees its earlier pulls.
    value: one of VALUES, what the agent's value output stands for.
    seed: draws the held-out episodes and the held-out sampling.
    """

    HELD_OUT = ("test_episodes",)  # only scoring reads them (attnzoo eval --set)

    arms: int = 5
    pulls: int = 10
    test_episodes: int = 1000
    entropy_weight: float = 0.01
    discount: float = 1.0
    gae_lambda: float = 1.0
    encoding: str = "arm_reward"
    value: str = "total"
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts(
            "BanditsConfig",
            self,
            positive=("arms", "pulls", "test_episodes"),
            non_negative=("seed",),
        )
        if self.arms < 2:
            fail("BanditsConfig", "arms", "an int >= 2", repr(self.arms))
        w = self.entropy_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < 1:
            fail("BanditsConfig", "entropy_weight", "a number in [0, 1)", repr(w))
        for name in ("discount", "gae_lambda"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x <= 1:
                fail("BanditsConfig", name, "a number in [0, 1]", repr(x))
        for name, options in (("encoding", ENCODINGS), ("value", VALUES)):
            if getattr(self, name) not in options:
                fail("BanditsConfig", name, f"one of {list(options)}", repr(getattr(self, name)))


class BanditBatch(NamedTuple):
    probs: torch.Tensor  # (batch, arms) p
    payoff: torch.Tensor  # (batch, pulls, arms) the Bernoulli draws
    step: int
    items: int  # pulls in the batch, counted on the CPU
    rank: int = 0  # the process that drew it (`sampling_seed`)


def draw(config: BanditsConfig, count: int, generator: torch.Generator) -> BanditBatch:
    probs = torch.rand(count, config.arms, generator=generator)  # (b, N)
    u = torch.rand(count, config.pulls, config.arms, generator=generator)  # (b, K, N)
    return BanditBatch(probs, (u < probs.unsqueeze(1)).float(), 0, count * config.pulls)


def input_width(arms: int, encoding: str = "arm_reward") -> int:
    """Channels of one step of `inputs_of`."""
    return (2 * arms if encoding == "arm_outcome" else arms) + 2


def inputs_of(
    actions: torch.Tensor, rewards: torch.Tensor, arms: int, encoding: str = "arm_reward"
) -> torch.Tensor:
    """Pulls so far (b, t) and their rewards (b, t) -> the model's inputs (b, t + 1, width),
    `input_width` channels: step 0 is the start flag (the last channel), step s > 0 the pull of
    step s - 1 as `encoding` shows it (ENCODINGS) and its reward."""
    b, t = actions.shape
    start = rewards.new_zeros(b, 1, input_width(arms, encoding))
    start[..., -1] = 1
    arm = torch.nn.functional.one_hot(actions, arms).to(rewards.dtype)  # (b, t, N)
    reward = rewards.unsqueeze(-1)
    shown = [arm * reward, arm * (1 - reward)] if encoding == "arm_outcome" else [arm]
    past = torch.cat([*shown, reward, rewards.new_zeros(b, t, 1)], -1)
    return torch.cat([start, past], 1)  # (b, t + 1, width)


def rollout(model, batch: BanditBatch, generator, greedy: bool = False, encoding="arm_reward"):
    """Play every episode of `batch` with the model's policy (sampled; `greedy`: its argmax),
    one position at a time through the model's `step`, each pull shown as `encoding` says:
    (actions (b, K), rewards (b, K)), no gradient."""
    b, pulls, arms = batch.payoff.shape
    actions = batch.payoff.new_zeros(b, pulls, dtype=torch.long)
    rewards = batch.payoff.new_zeros(b, pulls)
    inputs = batch.payoff.new_zeros(b, input_width(arms, encoding))
    inputs[:, -1] = 1  # the start flag
    rows = torch.arange(b, device=inputs.device)
    with torch.no_grad():
        tape = model.start(inputs)
        for t in range(pulls):
            logits, _ = model.step(tape, inputs)  # (b, N)
            pick = logits.argmax(-1) if greedy else sample_hard(logits, generator=generator).index
            actions[:, t] = pick
            rewards[:, t] = batch.payoff[rows, t, pick]
            inputs = inputs_of(actions[:, t : t + 1], rewards[:, t : t + 1], arms, encoding)[:, 1]
    return actions, rewards


def ucb1(payoff: np.ndarray) -> np.ndarray:
    """UCB1 (Auer et al. 2002) on the draws `payoff` (b, K, N): each arm once, then the arm
    maximising mean + sqrt(2 ln t / n) (t pulls so far, ties to the lowest index) ->
    rewards (b, K)."""
    b, pulls, arms = payoff.shape
    n, total = np.zeros((b, arms)), np.zeros((b, arms))
    out = np.zeros((b, pulls))
    rows = np.arange(b)
    for t in range(pulls):
        if t < arms:
            pick = np.full(b, t)
        else:
            score = total / n + np.sqrt(2 * math.log(t) / n)
            pick = score.argmax(1)
        out[:, t] = payoff[rows, t, pick]
        n[rows, pick] += 1
        total[rows, pick] += out[:, t]
    return out


def thompson(payoff: np.ndarray, seed: int) -> np.ndarray:
    """Thompson sampling (Thompson 1933) with Beta(1, 1) priors on the draws `payoff`
    (b, K, N): each step pulls the arm with the largest sample of its Beta(1 + wins,
    1 + losses) posterior -> rewards (b, K)."""
    rng = np.random.default_rng(seed)
    b, pulls, arms = payoff.shape
    wins, losses = np.zeros((b, arms)), np.zeros((b, arms))
    out = np.zeros((b, pulls))
    rows = np.arange(b)
    for t in range(pulls):
        pick = rng.beta(1 + wins, 1 + losses).argmax(1)
        out[:, t] = payoff[rows, t, pick]
        wins[rows, pick] += out[:, t]
        losses[rows, pick] += 1 - out[:, t]
    return out


def bayes_feasible(arms: int, pulls: int) -> bool:
    """Whether `bayes_optimal` is affordable for N arms and K pulls (`BAYES_STATES`)."""
    return math.comb(pulls + 2 * arms, 2 * arms) <= BAYES_STATES


def _bayes_q(arms: int, pulls: int):
    """Q(counts, a): the expected reward still to come after pulling arm a with posterior
    counts ((wins, losses) per arm, any order) and playing Bayes-optimally after it, under
    independent U(0, 1) = Beta(1, 1) priors, with K - (pulls so far) pulls left (a pull
    included). The arms are exchangeable, so the value is memoised on the sorted counts."""
    if not bayes_feasible(arms, pulls):
        fail(
            "bayes_optimal",
            "payoff",
            f"episodes small enough for exact dynamic programming, comb(K + 2N, 2N) <= "
            f"{BAYES_STATES}",
            f"N={arms}, K={pulls}",
        )

    def after(counts: tuple, a: int, new: tuple) -> tuple:
        return tuple(sorted((*counts[:a], new, *counts[a + 1 :])))

    @functools.cache
    def value(counts: tuple) -> float:  # sorted counts
        if sum(w + l for w, l in counts) == pulls:
            return 0.0
        return max(q(counts, a) for a in range(arms))

    def q(counts: tuple, a: int) -> float:
        w, l = counts[a]
        p = (1 + w) / (2 + w + l)  # the posterior mean of p_a
        win, loss = value(after(counts, a, (w + 1, l))), value(after(counts, a, (w, l + 1)))
        return p * (1 + win) + (1 - p) * loss

    return q


def bayes_optimal_value(arms: int, pulls: int) -> float:
    """The Bayes-optimal policy's expected total reward over episodes drawn from the prior: the
    most any policy can expect (N = 2, K = 2: 13 / 12)."""
    q = _bayes_q(arms, pulls)
    start = ((0, 0),) * arms
    return max(q(start, a) for a in range(arms))


def bayes_optimal(payoff: np.ndarray) -> np.ndarray:
    """The Bayes-optimal policy for this task's prior (every p_a ~ U(0, 1), independent) and
    horizon K on the draws `payoff` (b, K, N) -> rewards (b, K).

    Exact finite-horizon dynamic programming over the arms' posterior counts: each step pulls
    the arm of largest Q (`_bayes_q`; ties to the lowest index). No policy expects more on
    episodes from the prior; the Gittins index policy, whose numbers RL^2 and SNAIL report,
    approximates it (the Gittins index is optimal for discounted infinite horizons)."""
    b, pulls, arms = payoff.shape
    q = _bayes_q(arms, pulls)
    out = np.zeros((b, pulls))
    for e in range(b):
        counts = [(0, 0)] * arms
        for t in range(pulls):
            state = tuple(counts)
            scores = [q(state, a) for a in range(arms)]
            pick = scores.index(max(scores))
            out[e, t] = reward = payoff[e, t, pick]
            w, l = counts[pick]
            counts[pick] = (w + 1, l) if reward else (w, l + 1)
    return out


class BanditsTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over Bernoulli bandit episodes."""

    def __init__(self, config: BanditsConfig, *, seed: int = 0, eval_config: EvalConfig | None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()

    def model_dims(self) -> dict:
        c = self.config
        return {"arms": c.arms, "pulls": c.pulls, "inputs": input_width(c.arms, c.encoding)}

    def _inputs(self, actions: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        return inputs_of(actions, rewards, self.config.arms, self.config.encoding)

    def _rollout(self, model, batch: BanditBatch, generator, greedy: bool = False):
        return rollout(model, batch, generator, greedy, self.config.encoding)

    def baseline(self, value: torch.Tensor) -> torch.Tensor:
        """The model's value output (b, K) as the expected returns from each step
        (`BanditsConfig.value`): itself ("total") or times the discounted count of the pulls
        from that step on ("per_pull")."""
        if self.config.value == "total":
            return value
        left = torch.arange(value.shape[1], 0, -1, dtype=value.dtype, device=value.device)
        d = self.config.discount
        return value * (left if d == 1 else (1 - d**left) / (1 - d))  # K - t pulls left

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> BanditBatch:
        g = training_generator(self.seed, step)
        whole = draw(self.config, batch_size, g)
        probs, payoff = whole.probs[rank::world], whole.payoff[rank::world]
        move = {"device": device, "non_blocking": True}
        items = payoff.shape[0] * payoff.shape[1]
        return BanditBatch(probs.to(**move), payoff.to(**move), step, items, rank)

    def loss(self, model: torch.nn.Module, batch: BanditBatch) -> tuple[torch.Tensor, int]:
        """REINFORCE with the model's value as a learned baseline (`baseline`), on the
        TD(lambda) returns (the rewards to go at lambda 1) of episodes played by the model's
        sampled policy, plus an entropy bonus."""
        seed = sampling_seed(self.seed * 7 + batch.step, batch.rank)
        g = sampling_generator(batch.payoff.device).manual_seed(seed)
        # the episodes are played without gradient by the model itself (`inner_model`); the
        # update's pass runs through `model`, so that torchrun's wrapper syncs its gradients
        actions, rewards = self._rollout(inner_model(model), batch, g)
        out = model(self._inputs(actions[:, :-1], rewards[:, :-1]))
        # in float32 under bf16 autocast, as the other tasks' losses (`at_least_float32`)
        value = self.baseline(at_least_float32(out.value))
        log_p = torch.log_softmax(at_least_float32(out.logits), -1)  # (b, K, N)
        log_pi = log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # (b, K)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (b, K)
        terms = reinforce_loss(
            log_pi,
            lambda_returns(rewards, value, self.config.discount, self.config.gae_lambda),
            value,
            entropy=entropy,
            entropy_weight=self.config.entropy_weight,
        )
        return terms.total, batch.items

    def held_out(self, count: int) -> BanditBatch:
        """The first `count` held-out episodes of eval.split, from seeds no training step uses
        (`held_out_generator`; the seed `seed * 7919 + 2` they came from was that of training
        step 2 at run seed 0, whose batch was then the test set's first episodes). The whole
        set of `test_episodes` is drawn and cut: `draw` takes every episode's arms before any
        payoff, so a draw of `count` episodes alone held other payoffs (eval.limit scored
        other episodes than the first of the evaluation, and the explorer showed others)."""
        g = held_out_generator(self.config.seed, self.eval_config.split)
        whole = draw(self.config, max(count, self.config.test_episodes), g)
        return BanditBatch(whole.probs[:count], whole.payoff[:count], 0, count * self.config.pulls)

    @torch.no_grad()
    def scores(self, model: torch.nn.Module | None, count: int) -> dict[str, np.ndarray]:
        """Per policy, the rewards (count, K) on the first `count` held-out episodes ("bayes"
        only where `bayes_feasible`; without a model, every policy but the agent)."""
        batch = self.held_out(count)
        found = {}
        if model is not None:
            device = model_device(model)
            g = sampling_generator(device).manual_seed(self.config.seed + 17)
            on = BanditBatch(batch.probs.to(device), batch.payoff.to(device), 0, batch.items)
            found["agent"] = self._rollout(model, on, g)[1].double().cpu().numpy()
        payoff = batch.payoff.double().numpy()
        found["ucb1"] = ucb1(payoff)
        found["thompson"] = thompson(payoff, self.config.seed + 23)
        if bayes_feasible(self.config.arms, self.config.pulls):
            found["bayes"] = bayes_optimal(payoff)
        rng = np.random.default_rng(self.config.seed + 29)
        rows, steps = np.arange(count)[:, None], np.arange(self.config.pulls)
        found["random"] = payoff[rows, steps, rng.integers(0, self.config.arms, payoff.shape[:2])]
        found["oracle"] = payoff[rows, steps, batch.probs.numpy().argmax(1)[:, None]]
        return found

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module | None) -> dict[str, float]:
        """Mean cumulative reward per episode of each policy on the same held-out draws, its
        `ci95` (1.96 standard errors over episodes), and the agent's over Thompson's and over
        the Bayes-optimal policy's (without a model: the other policies alone). The agent
        and Thompson sampling draw their choices from one stream over the scored episodes, so
        under eval.limit an episode's sampled play may differ from the whole evaluation's (the
        payoffs and the deterministic policies' play do not)."""
        count = self.eval_config.scored(self.config.test_episodes)
        found = self.scores(model, count)
        metrics: dict[str, float] = {
            "n": count,
            "arms": self.config.arms,
            "pulls": self.config.pulls,
        }
        for name, rewards in found.items():
            total = rewards.sum(1)
            metrics[f"reward_{name}"] = float(total.mean())
            metrics[f"ci95_{name}"] = (
                float(1.96 * total.std(ddof=1) / math.sqrt(count)) if count > 1 else 0.0
            )
        for other in ("thompson", "bayes"):
            if "agent" in found and other in found:
                metrics[f"agent_over_{other}"] = metrics["reward_agent"] / max(
                    metrics[f"reward_{other}"], 1e-9
                )
        if "bayes" in found:
            metrics["bayes_expected"] = bayes_optimal_value(self.config.arms, self.config.pulls)
        return metrics

    @torch.no_grad()
    def explore(self, model: torch.nn.Module, count: int) -> dict:
        """The explorer's data (layout "tokens"): `count` held-out episodes played greedily,
        the rows and columns the pulls, each attention block a layer."""
        batch = self.held_out(count)
        device = model_device(model)
        on = BanditBatch(batch.probs.to(device), batch.payoff.to(device), 0, batch.items)
        actions, rewards = self._rollout(model, on, None, greedy=True)
        out = model(self._inputs(actions[:, :-1], rewards[:, :-1]), return_weights=True)
        examples = []
        for k in range(count):
            pulls = [
                f"pull {t + 1}: arm {int(a)} -> {int(r)}"
                for t, (a, r) in enumerate(zip(actions[k], rewards[k], strict=True))
            ]
            inputs = ["start", *pulls[:-1]]
            kinds = [
                {
                    "name": name,
                    "rows": pulls,
                    "columns": inputs,
                    "weights": w[k].float().cpu()[None],
                }
                for name, w in out.attention
            ]
            best = int(batch.probs[k].argmax())
            examples.append(
                {
                    "input": "arm probabilities "
                    + ", ".join(f"{p:.2f}" for p in batch.probs[k].tolist()),
                    "reference": f"best arm {best}",
                    "prediction": f"reward {int(rewards[k].sum())} of {self.config.pulls}",
                    "correct": None,
                    "attention": kinds,
                }
            )
        title = f"bandits, {self.config.arms} arms, {self.config.pulls} pulls: held-out episodes"
        note = "Played greedily (the argmax of the policy); row t attends to the inputs up to t"
        return {"layout": "tokens", "title": title, "note": note, "examples": examples}

    @torch.no_grad()
    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/bandit_rewards.png: the mean reward at each pull of every policy on the
        held-out draws."""
        from matplotlib.figure import Figure

        from attnzoo.viz import save_figure

        found = self.scores(model, self.eval_config.scored(self.config.test_episodes))
        fig = Figure(figsize=(8, 4.5), dpi=100)
        ax = fig.add_subplot()
        for name, rewards in found.items():
            ax.plot(np.arange(1, self.config.pulls + 1), rewards.mean(0), marker="o", label=name)
        ax.set(
            xlabel="pull", ylabel="mean reward", title=f"{self.config.arms} arms, held-out episodes"
        )
        ax.grid(alpha=0.3)
        ax.legend()
        path = Path(folder) / "bandit_rewards.png"
        save_figure(fig, path)
        return [path]


def make_task(config: BanditsConfig, *, seed: int, eval_config: EvalConfig) -> BanditsTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return BanditsTask(config, seed=seed, eval_config=eval_config)
