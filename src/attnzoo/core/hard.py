"""The hard-attention toolkit: stochastic policies and REINFORCE with baselines.

Hard attention chooses where to look by sampling, which has no gradient; the chooser is trained
by the likelihood-ratio estimator (REINFORCE, Williams 1992), as in the Recurrent Attention
Model (Mnih et al. 2014, sec. 3.2), DRAM (Ba et al. 2014, sec. 3.2), hard Show-Attend-Tell
(Xu et al. 2015, sec. 4.1) and a Pointer Network trained on tour length (Kool et al. 2019):

    grad_theta E[R] = E[ sum_t grad_theta log pi(a_t | s_t; theta) (R_t - b_t) ]

- categorical choices: `attnzoo.core.normalisers.sample_hard` (the chosen index and its
  log-probability);
- continuous locations: `gaussian_sample`, `GaussianPolicy` (a linear map to the mean of
  N(mu, sigma^2 I), sigma fixed or learned, the location kept on the image by clamping the
  draw or by a tanh mean: `BOUNDS`);
- the loss: `reinforce_loss` (policy term, squared-error baseline term, entropy bonus) over
  rewards per step, `rewards_to_go` or `lambda_returns` (generalised advantage estimation);
  `hybrid_loss` adds a supervised term (RAM's classification cross-entropy, Mnih 2014 sec. 4);
  `MovingAverageBaseline` when the baseline is not a network.

Every loss here is a sum over its items (the training loop divides by the count the task
returns), and every sample is detached: gradients reach a policy only through its log-prob.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from attnzoo.core.checks import (
    _broadcasts_to,
    broadcast_shape,
    check_floating,
    check_number,
    check_size,
    fail,
)

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class GaussianSample(NamedTuple):
    sample: torch.Tensor  # (..., d) detached: no gradient flows through the location
    log_prob: torch.Tensor  # (...,) log N(sample; mean, std^2 I), summed over d
    mean: torch.Tensor  # (..., d) the policy's mean (what a deterministic pass uses)


def gaussian_log_prob(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float
) -> torch.Tensor:
    """log N(x; mean, diag(std^2)) summed over the last dim: (..., d) -> (...); `std` a
    positive number or a tensor broadcastable to `mean`."""
    check_floating("gaussian_log_prob", "x", x)
    check_floating("gaussian_log_prob", "mean", mean)
    if x.dim() != mean.dim() or broadcast_shape(x.shape, mean.shape) is None:
        wanted = f"the shape of 'mean' {tuple(mean.shape)}, each dim that size or 1"
        fail("gaussian_log_prob", "x", wanted, tuple(x.shape))  # (4, 2) by (4, 1, 2): (4, 4)
    std = _std_tensor("gaussian_log_prob", std, mean)
    z = (x - mean) / std  # (..., d)
    return (-0.5 * z * z - torch.log(std) - _HALF_LOG_2PI).sum(-1)


def gaussian_sample(
    mean: torch.Tensor,
    std: torch.Tensor | float,
    *,
    generator: torch.Generator | None = None,
) -> GaussianSample:
    """x ~ N(mean, std^2 I), detached, with its log-probability (differentiable in `mean` and
    `std`).

    Args:
        mean: (..., d).
        std: a positive float or a tensor broadcastable to `mean` (a learned std).
        generator: draws the noise (on `mean`'s device; the CPU's on `meta`).
    """
    check_floating("gaussian_sample", "mean", mean)
    std = _std_tensor("gaussian_sample", std, mean)
    if mean.device.type == "meta":
        noise = torch.empty_like(mean)
    else:
        noise = torch.randn(
            mean.shape, dtype=mean.dtype, device=mean.device, generator=generator
        )  # (..., d)
    sample = (mean + std * noise).detach()  # (..., d)
    return GaussianSample(sample, gaussian_log_prob(sample, mean, std), mean)


def _std_tensor(function: str, std: object, mean: torch.Tensor) -> torch.Tensor:
    """A std given as a positive finite number, as a tensor on `mean`'s device and dtype; a
    tensor std (a learned one) is taken as it is, if floating and broadcastable to `mean`."""
    if isinstance(std, torch.Tensor):
        check_floating(function, "std", std)
        if not _broadcasts_to(std.shape, mean.shape):
            fail(
                function,
                "std",
                f"a shape broadcastable to mean's {tuple(mean.shape)}",
                tuple(std.shape),
            )
        return std
    if isinstance(std, bool) or not isinstance(std, int | float) or not 0 < std < math.inf:
        fail(function, "std", "a positive finite number or a tensor", repr(std))
    return torch.full((), float(std), dtype=mean.dtype, device=mean.device)


BOUNDS = ("clamp", "pull", "tanh", "none")


_CLAMPED = ("clamp", "pull")


class GaussianPolicy(nn.Module):
    """A location policy: l ~ N(mu, sigma^2 I) with mu = W h + b, kept on the image by `bound`.

    The RAM location network f_l (Mnih 2014 sec. 3: "the location network outputs the mean of
    the location policy ... a two-component Gaussian with a fixed variance"); coordinates are
    in [-1, 1] across the image. `bound` says how a location stays there:

    - "clamp": the draw is clamped to [-1, 1] (and so is the mean of the deterministic pass);
      the log-prob is the unclamped draw's, so clamping belongs to the environment and the
      REINFORCE estimator stays unbiased for E[R(clamp(l))]. d log pi / d mu = (l - mu) /
      sigma^2 whatever mu is: a mean at the border still learns from the draws inside.
    - "pull": as "clamp", and a mean off the image is pulled back: its gradient gains
      mu - clamp(mu, -1, 1) per row and coordinate (the gradient of half the squared distance
      to the image), whatever the loss's scale. Past the border every draw is clamped to the
      same location, so the reward cannot depend on it and REINFORCE's gradient there is
      zero-mean noise: with "clamp" a mean that wanders off stays off (a DRAM addition run
      ended at chance with every glimpse in the corner (1, 1)). On the image it is "clamp".
    - "tanh": mu = tanh(W h + b), the draw unclamped (it may fall just outside the image).
      d log pi / d(W h + b) carries 1 - mu^2, which vanishes as mu nears a border: a mean
      pushed into a corner stays there (DRAM's glimpses froze in a corner that way).
    - "none": mu = W h + b, nothing bounded.

    Args:
        d_input: features of the state h.
        d_output: dimensions of the location (2 for an image).
        std: sigma, fixed; with `learn_std` its initial value, learned as log sigma per dim.
        bound: one of `BOUNDS`.
    """

    def __init__(
        self,
        d_input: int,
        d_output: int = 2,
        *,
        std: float = 0.1,
        learn_std: bool = False,
        bound: str = "clamp",
    ):
        super().__init__()
        check_size("GaussianPolicy", "d_input", d_input)
        check_size("GaussianPolicy", "d_output", d_output)
        if isinstance(std, bool) or not isinstance(std, int | float) or not 0 < std < math.inf:
            fail("GaussianPolicy", "std", "a positive finite number", repr(std))
        if bound not in BOUNDS:
            fail("GaussianPolicy", "bound", f"one of {list(BOUNDS)}", repr(bound))
        self.mean = nn.Linear(d_input, d_output)
        self.bound = bound
        log_std = torch.full((d_output,), math.log(std))
        self.fixed = None if learn_std else math.log(std)
        if learn_std:
            self.log_std = nn.Parameter(log_std)
        else:
            self.register_buffer("log_std", log_std)

    def _apply(self, fn, recurse=True):
        """As any module's, then a fixed log sigma made again in its new dtype: converted by
        `.double()`, it held log(std) rounded to float32."""
        super()._apply(fn, recurse)
        if self.fixed is not None:
            self.log_std = torch.full_like(self.log_std, self.fixed)
        return self

    def forward(
        self,
        state: torch.Tensor,
        *,
        sample: bool = True,
        generator: torch.Generator | None = None,
    ) -> GaussianSample:
        """state (..., d_input) -> a location (..., d_output); `sample=False`: the mean (clamped
        with "clamp"), with the mean's own log-probability (the mode's)."""
        check_floating("GaussianPolicy", "state", state)
        if state.dim() == 0 or state.shape[-1] != self.mean.in_features:
            d = self.mean.in_features
            fail("GaussianPolicy", "state", f"a (..., d_input = {d}) tensor", tuple(state.shape))
        mean = self.mean(state)  # (..., d_output)
        if self.bound == "tanh":
            mean = torch.tanh(mean)
        elif self.bound == "pull" and mean.requires_grad:
            beyond = (mean - mean.clamp(-1.0, 1.0)).detach()  # 0 on the image
            mean.register_hook(lambda grad: grad + beyond)
        std = self.log_std.exp()  # (d_output,)
        if not sample:
            mode = mean.detach()
            location = mode.clamp(-1.0, 1.0) if self.bound in _CLAMPED else mode
            return GaussianSample(location, gaussian_log_prob(mode, mean, std), mean)
        draw = gaussian_sample(mean, std, generator=generator)
        if self.bound in _CLAMPED:  # the environment's clamp: the log-prob stays the draw's
            return draw._replace(sample=draw.sample.clamp(-1.0, 1.0))
        return draw


def rewards_to_go(rewards: torch.Tensor, discount: float = 1.0) -> torch.Tensor:
    """R_t = sum_{t' >= t} discount^(t' - t) r_t': (batch, steps) -> (batch, steps).

    An action is credited only with the rewards that follow it (RAM's reward arrives at the
    last step, so every R_t equals it). An earlier reward is left out by selection, not by a
    weight of 0 (0 * inf is NaN): a non-finite reward makes its own step's return and the
    earlier ones non-finite, never a later one.
    """
    check_number("rewards_to_go", "discount", discount, "a number in [0, 1]", 0.0, 1.0)
    check_floating("rewards_to_go", "rewards", rewards)
    if rewards.dim() != 2:
        fail("rewards_to_go", "rewards", "a (batch, steps) tensor", tuple(rewards.shape))
    steps = rewards.shape[1]
    t = torch.arange(steps, device=rewards.device)
    power = (t.unsqueeze(0) - t.unsqueeze(1)).to(rewards.dtype)  # (s, s'): t' - t
    weighted = rewards.unsqueeze(1) * discount ** power.clamp_min(0)  # (b, s, s')
    return torch.where(power >= 0, weighted, 0.0).sum(-1)  # (b, s)


def lambda_returns(
    rewards: torch.Tensor, values: torch.Tensor, discount: float = 1.0, lam: float = 1.0
) -> torch.Tensor:
    """TD(lambda) returns G_t = V_t + A_t, with A_t the generalised advantage estimate
    (Schulman et al. 2016): A_t = sum_k (discount lam)^k delta_{t+k}, delta_t = r_t +
    discount V_{t+1} - V_t, the value after the last step 0. (batch, steps) -> (batch, steps).

    Passed as `reinforce_loss`'s reward beside the same values as its baseline, the policy
    learns from A_t and the value regresses on G_t. `lam` = 1 gives `rewards_to_go` exactly
    (the sum telescopes); a smaller `lam` trades the high variance of a long episode's summed
    rewards for the bias of the value's errors. The values are detached.
    """
    for name, x in (("discount", discount), ("lam", lam)):
        check_number("lambda_returns", name, x, "a number in [0, 1]", 0.0, 1.0)
    check_floating("lambda_returns", "rewards", rewards)
    check_floating("lambda_returns", "values", values)
    if rewards.dim() != 2 or values.shape != rewards.shape:
        got = (tuple(rewards.shape), tuple(values.shape))
        fail("lambda_returns", "values", "(batch, steps) tensors of one shape", got)
    v = values.detach().to(rewards.dtype)
    following = torch.cat([v[:, 1:], v.new_zeros(v.shape[0], 1)], 1)  # V_{t+1}, 0 at the end
    delta = rewards + discount * following - v
    return v + rewards_to_go(delta, discount * lam)


class ReinforceLoss(NamedTuple):
    """Summed terms; `total` is what to minimise."""

    policy: torch.Tensor  # -sum (R - b) log pi: the policy's only gradient
    baseline: torch.Tensor  # sum (b - R)^2: the learned baseline's only gradient (0 without)
    entropy: torch.Tensor  # -entropy_weight * sum H (0 without)
    advantage: torch.Tensor  # (batch, [steps]) R - b, detached (for logging)

    @property
    def total(self) -> torch.Tensor:
        return self.policy + self.baseline + self.entropy


def reinforce_loss(
    log_prob: torch.Tensor,
    reward: torch.Tensor,
    baseline: torch.Tensor | float | None = None,
    *,
    entropy: torch.Tensor | None = None,
    entropy_weight: float = 0.0,
    mask: torch.Tensor | None = None,
) -> ReinforceLoss:
    """REINFORCE with a baseline (Williams 1992; Mnih 2014 eq. 2):

        L = -sum_t (R_t - b_t) log pi(a_t)  +  sum_t (b_t - R_t)^2  -  beta sum_t H_t

    The reward and the advantage are detached, so the policy learns only from the first term
    and a learned baseline only from the second: neither pushes gradient into the other (nor,
    through them, into a network they share inputs with, unless that network's output is the
    log-prob or the baseline). A constant or moving-average baseline (a float or a tensor
    without grad) adds no term and keeps the estimator unbiased.

    Args:
        log_prob: (batch,) or (batch, steps) log pi of the actions taken.
        reward: the same shape, each dim that size or 1 (one reward per episode beside
            (batch, steps) log-probs is (batch, 1)), or 0-d: R_t, e.g. `rewards_to_go(r)`.
        baseline: b_t, shaped as `reward` may be: a learned prediction (trained by its
            squared error), a tensor without grad, a float, or None (b = 0).
        entropy: per-step entropies H_t of the policy (an exploration bonus), or None.
        entropy_weight: beta.
        mask: bool like `log_prob`, True = this step counts (steps after an episode's end).
    """
    _check_reinforce_inputs(log_prob, reward, baseline, entropy, entropy_weight, mask)
    reward = reward.detach().to(log_prob.dtype)
    if baseline is None:
        baseline = 0.0
    if isinstance(baseline, torch.Tensor):
        advantage = reward - baseline.detach()
        learned = baseline.requires_grad
    else:
        advantage = reward - float(baseline)
        learned = False
    advantage = advantage.expand_as(log_prob)  # (b, [s])

    def kept(x: torch.Tensor) -> torch.Tensor:
        """x where a step counts, 0 by selection elsewhere: a masked step's -inf log-prob or
        NaN reward never reaches the loss or a gradient (0 * inf is NaN)."""
        x = x.expand_as(log_prob)
        return x if mask is None else torch.where(mask, x, x.new_zeros(()))

    policy = -(kept(advantage) * kept(log_prob)).sum()
    zero = log_prob.new_zeros(())
    base = kept(baseline - reward).pow(2).sum() if learned else zero
    bonus = zero
    if entropy is not None and entropy_weight:
        bonus = -entropy_weight * kept(entropy).sum()
    return ReinforceLoss(policy, base, bonus, advantage.detach())


def _check_reinforce_inputs(log_prob, reward, baseline, entropy, entropy_weight, mask) -> None:
    """`reinforce_loss`'s arguments: each tensor of the log-probs' rank (or 0-d), each dim 1
    or theirs, as the loss expands it; each number finite. A (batch,) reward beside
    (batch, steps) log-probs would line up from the right: refused, not read as per-step
    rewards (when batch == steps it broadcast silently, each row's reward spread over the
    steps of every row)."""
    name = "reinforce_loss"
    if not isinstance(log_prob, torch.Tensor) or log_prob.dim() not in (1, 2):
        got = tuple(log_prob.shape) if isinstance(log_prob, torch.Tensor) else type(log_prob)
        fail(name, "log_prob", "a (batch,) or (batch, steps) tensor", got)
    check_floating(name, "log_prob", log_prob)
    shape = tuple(log_prob.shape)
    wanted = f"a tensor of log_prob's shape {shape}, each dim that size or 1 (or 0-d)"
    for argument, x in (("reward", reward), ("baseline", baseline), ("entropy", entropy)):
        if argument != "reward" and x is None:
            continue
        if argument == "baseline" and not isinstance(x, torch.Tensor):
            check_number(name, "baseline", x, "a tensor, a finite number or None")
            continue
        if not isinstance(x, torch.Tensor) or x.is_complex():
            fail(name, argument, wanted, type(x).__name__, TypeError)
        if x.dim() not in (0, len(shape)) or not _broadcasts_to(x.shape, shape):
            fail(name, argument, wanted, tuple(x.shape))
    check_number(name, "entropy_weight", entropy_weight)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            fail(name, "mask", "a bool tensor (True = the step counts)", got, TypeError)
        if mask.dim() not in (0, len(shape)) or not _broadcasts_to(mask.shape, shape):
            fail(name, "mask", wanted, tuple(mask.shape))


def hybrid_loss(
    supervised: torch.Tensor, reinforce: ReinforceLoss, *, weight: float = 1.0
) -> torch.Tensor:
    """RAM's hybrid objective (Mnih 2014 sec. 4): the classifier's summed cross-entropy plus the
    REINFORCE terms that train the location policy and the baseline. `weight` scales the
    policy and baseline terms (Xu 2015 eq. 12's lambda_r), not the entropy bonus, which has
    its own weight (`reinforce_loss`'s entropy_weight, eq. 12's lambda_e)."""
    check_floating("hybrid_loss", "supervised", supervised)
    if not isinstance(reinforce, ReinforceLoss):
        got = type(reinforce).__name__
        fail("hybrid_loss", "reinforce", "a ReinforceLoss (from reinforce_loss)", got, TypeError)
    check_number("hybrid_loss", "weight", weight)
    return supervised + weight * (reinforce.policy + reinforce.baseline) + reinforce.entropy


def counted_mean(reward: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over the batch dim of the rows of `reward` that `counts` (batch,) selects, their
    count), over every process of a torchrun job: each holds a share of the batch, and a
    mean of one share was another baseline on every rank (DDP then put rank 0's on all).
    Selected, not weighted: 0 * inf = NaN from a row left out would reach the mean. With no
    row counted, the mean is 0. In a process group of several ranks it is a collective: every
    rank calls it."""
    weight = counts.reshape(-1, *([1] * (reward.dim() - 1)))
    summed = torch.where(weight, reward, 0.0).sum(0)  # reward's shape without the batch dim
    total = counts.sum().to(reward.dtype).reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        packed = torch.cat([summed.reshape(-1), total])
        dist.all_reduce(packed)
        summed, total = packed[:-1].reshape(summed.shape), packed[-1:]
    total = total[0]
    return summed / total.clamp(min=1), total


class MovingAverageBaseline(nn.Module):
    """b <- momentum * b + (1 - momentum) * mean(R): a baseline that is not a network.

    Its value is a buffer (saved with the model); `update` is called after the loss uses the
    current value, so the baseline never depends on the rewards it is subtracted from and the
    estimator stays unbiased.
    """

    def __init__(self, momentum: float = 0.9, shape: tuple[int, ...] = ()):
        super().__init__()
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, int | float)
            or not (0.0 <= momentum < 1.0)
        ):
            fail("MovingAverageBaseline", "momentum", "a number in [0, 1)", repr(momentum))
        self.momentum = momentum
        self.register_buffer("value", torch.zeros(shape))
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))

    def forward(self) -> torch.Tensor:
        return self.value

    @torch.no_grad()
    def update(self, reward: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Fold in the batch mean of `reward` (batch, *shape); the first batch sets it.
        `counts` (batch,) bool: only those rows enter the mean, and a batch with none leaves
        the baseline as it was (no host sync: it stays a tensor operation). In a process
        group of several ranks the mean is over every rank's rows (`counted_mean`): a
        collective, which every rank calls, as a task's `loss` does at every step."""
        name = "MovingAverageBaseline.update"
        shape = (*self.value.shape,)
        if not isinstance(reward, torch.Tensor) or reward.is_complex():
            fail(name, "reward", "a real tensor (batch, *shape)", type(reward).__name__, TypeError)
        if reward.dim() != 1 + len(shape) or tuple(reward.shape[1:]) != shape:
            fail(name, "reward", f"a (batch, *{shape}) tensor", tuple(reward.shape))
        if counts is not None and (
            not isinstance(counts, torch.Tensor)
            or counts.dtype != torch.bool
            or tuple(counts.shape) != (reward.shape[0],)
        ):
            got = tuple(counts.shape) if isinstance(counts, torch.Tensor) else counts
            fail(name, "counts", f"a ({reward.shape[0]},) bool tensor", got)
        reward = reward.detach().to(self.value.dtype)
        if counts is None:
            counts = torch.ones(reward.shape[0], dtype=torch.bool, device=reward.device)
        mean, total = counted_mean(reward, counts)
        some = total > 0
        # the rates in the baseline's dtype (Python floats made a float32 tensor: a float64
        # baseline moved by a float32-rounded momentum)
        keep = self.value.new_tensor(1.0 - self.momentum)
        rate = torch.where(self.started, keep, self.value.new_tensor(1.0)) * some
        self.value.add_(rate * (mean - self.value))
        self.started.logical_or_(some)
