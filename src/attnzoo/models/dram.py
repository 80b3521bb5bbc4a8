"""The Deep Recurrent Attention Model (Ba, Mnih & Kavukcuoglu 2014, "Multiple Object Recognition
with Visual Attention", sec. 3 and Fig. 1): a sequence of labels read off one image, a fixed
number of glimpses per label.

    r^(2)_0 = C(x_coarse)                                 context network: the top RNN's start
    l_n ~ N(E(r^(2)_{n-1}), sigma^2 I)                    emission network (location policy)
    g_n = G_image(rho(x, l_n)) * G_loc(l_n)               glimpse network (elementwise product)
    r^(1)_n = LSTM_1(g_n, r^(1)_{n-1})                    recurrent core, bottom: "what"
    r^(2)_n = LSTM_2(r^(1)_n, r^(2)_{n-1})                recurrent core, top: "where"
    p(y_s | x) = softmax(W r^(1)_n)                       after the glimpses of label s

The labels end with an end-of-sequence class where the task has one. Training is the hybrid
loss of `attnzoo.core.hard` with the reward of label s (1 if correct) given at its last glimpse
and every location credited with the rewards that follow it (`rewards_to_go`).

Note:
    - Gradient routes: the "what" pathway (glimpse network, r^(1), classifier) learns only
      from the classification loss, the "where" pathway (context network, r^(2), emission
      network) only from REINFORCE, the baseline only from its squared error. So r^(2) reads
      r^(1) detached, the baseline reads r^(2) detached and the sampled location is detached
      (no classification gradient reaches the "where" pathway through the next glimpse). The
      top layer feeds nothing but the emission network, so unlike RAM's core it must learn
      from REINFORCE; the paper lets REINFORCE reach r^(1) too.
    - Keeping the glimpses moving. Until the classifier beats chance the reward carries no
      information, and REINFORCE's gradient on the "where" pathway is noise; AdamW scales
      every parameter's step to ~lr whatever the gradient's size, so the ~0.6M parameters of
      the context network, the top LSTM and the emission network random-walk together and the
      emission's mean drifts by O(1) in a few hundred steps (measured on mnist_addition: a
      corner by step 200). With a tanh mean the corner is a trap: the score carries 1 - mu^2,
      ~0, so the glimpses never leave it (the 20k-step addition run ended at chance). So the
      mean is linear and the draw clamped to the image (`bound="clamp"`: the score of a draw
      that lands inside does not vanish at the border), and the "where" pathway learns at
      `where_lr` (0.1) of the run's rate (`lr_scales`), which keeps the drift small (the mean
      stayed within 0.25 of the centre over the same 2,000 steps). Both untuned.
    - The paper's glimpse and context networks are 3-layer convnets; here G_image is one
      rectifier layer over the retina and C two strided 3 x 3 convolutions over the image
      average-pooled to `context` x `context` (CPU sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.checks import (
    check_fields,
    check_image_size,
    check_images,
    check_size,
    fail,
)
from attnzoo.core.hard import BOUNDS, GaussianPolicy
from attnzoo.models.ram import METHODS, GlimpseSensor


@dataclass(frozen=True)
class DRAMConfig:
    """Attributes:
    glimpses: glimpses per label (the paper: 3 per digit).
    patch, scales, method: the retina (`attnzoo.models.ram.GlimpseSensor`).
    glimpse_hidden: width of G_image and G_loc (the product's width is `hidden`).
    hidden: width of both LSTM layers.
    context: side of the down-sampled image the context network reads.
    std, learn_std: the location policy's sigma.
    bound: how a location stays on the image (`attnzoo.core.hard.BOUNDS`): "clamp" clamps the
        draw, "pull" also pulls a mean that left the image back onto it (with "clamp" one
        `mnist_addition` seed lost the digits that way: `benchmarks/bench_dram.py`), "tanh"
        squashes the mean (it froze DRAM's glimpses in a corner: module Note).
    where_lr: the learning rate of the "where" pathway (context, top LSTM, emission) as a
        fraction of the run's (`lr_scales`).
    """

    glimpses: int = 3
    patch: int = 12
    scales: int = 2
    glimpse_hidden: int = 128
    hidden: int = 256
    context: int = 16
    std: float = 0.1
    learn_std: bool = False
    method: str = "grid"
    bound: str = "clamp"
    where_lr: float = 0.1

    def __post_init__(self):
        check_fields(self)
        for name in ("glimpses", "patch", "scales", "glimpse_hidden", "hidden", "context"):
            check_size("DRAMConfig", name, getattr(self, name))
        if self.context < 4:
            fail("DRAMConfig", "context", "an int >= 4", self.context)
        if self.method not in METHODS:
            fail("DRAMConfig", "method", f"one of {list(METHODS)}", repr(self.method))
        std = self.std
        if isinstance(std, bool) or not isinstance(std, int | float) or not 0 < std < 10:
            fail("DRAMConfig", "std", "a number in (0, 10)", repr(std))
        if self.bound not in BOUNDS:
            fail("DRAMConfig", "bound", f"one of {list(BOUNDS)}", repr(self.bound))
        rate = self.where_lr
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            fail("DRAMConfig", "where_lr", "a number in (0, 1]", repr(rate))


def dram(**overrides) -> DRAMConfig:
    """DRAM at CPU size: 3 glimpses of 12 x 12 at 2 scales per label, LSTMs of 256."""
    return replace(DRAMConfig(), **overrides)


class DRAMGlimpse(nn.Module):
    """g = ReLU(Linear(ReLU(Linear(rho)))) * ReLU(Linear(ReLU(Linear(l))))."""

    def __init__(self, config: DRAMConfig, channels: int):
        super().__init__()
        c = config
        self.sensor = GlimpseSensor(c.patch, c.scales, c.method)
        self.what = nn.Sequential(
            nn.Linear(c.scales * channels * c.patch**2, c.glimpse_hidden),
            nn.ReLU(),
            nn.Linear(c.glimpse_hidden, c.hidden),
            nn.ReLU(),
        )
        self.where = nn.Sequential(
            nn.Linear(2, c.glimpse_hidden),
            nn.ReLU(),
            nn.Linear(c.glimpse_hidden, c.hidden),
            nn.ReLU(),
        )

    def forward(self, prepared: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
        retina = self.sensor.read(prepared, location).flatten(1)  # (b, k c g g)
        return self.what(retina) * self.where(location)  # (b, hidden)


class DRAMOutput(NamedTuple):
    log_probs: torch.Tensor  # (batch, labels, classes)
    locations: torch.Tensor  # (batch, labels * glimpses, 2), detached
    log_pi: torch.Tensor  # (batch, labels * glimpses) log pi(l_n)
    baseline: torch.Tensor  # (batch, labels * glimpses) b_n


class DRAM(nn.Module):
    """The DRAM for a fixed number of labels per image ("multi_image" interface).

    Args:
        config: sizes.
        image_size: (height, width).
        channels: input channels.
        classes: label classes (the end-of-sequence class included, where the task has one).
        labels: labels per image.
    """

    def __init__(
        self,
        config: DRAMConfig,
        image_size: tuple[int, int],
        channels: int,
        classes: int,
        labels: int,
    ):
        super().__init__()
        for name, value in (("channels", channels), ("classes", classes), ("labels", labels)):
            check_size("DRAM", name, value)
        self.config, self.labels = config, labels
        self.image_size = check_image_size("DRAM", image_size)
        h, side = config.hidden, config.context
        self.channels = channels
        self.glimpse = DRAMGlimpse(config, channels)
        self.context = nn.Sequential(
            nn.Conv2d(channels, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * ((side + 3) // 4) ** 2, h),
        )
        self.lower = nn.LSTMCell(h, h)
        self.upper = nn.LSTMCell(h, h)
        self.location = GaussianPolicy(
            h, 2, std=config.std, learn_std=config.learn_std, bound=config.bound
        )
        self.baseline = nn.Linear(h, 1)
        self.classifier = nn.Linear(h, classes)

    WHERE = ("context", "upper", "location")  # the modules REINFORCE alone trains

    def lr_scales(self) -> dict[str, float]:
        """The "where" pathway's parameters at `config.where_lr` of the run's learning rate
        (read by the training loop, `attnzoo.train.loop.parameter_groups`)."""
        return {
            name: self.config.where_lr
            for name, _ in self.named_parameters()
            if name.split(".")[0] in self.WHERE
        }

    def forward(
        self,
        images: torch.Tensor,
        *,
        sample: bool = True,
        generator: torch.Generator | None = None,
    ) -> DRAMOutput:
        """images (batch, channels, height, width) -> DRAMOutput; `sample=False`: every
        location is the policy's mean."""
        check_images("DRAM", images, self.channels, self.image_size, like=self)
        b, h = images.shape[0], self.config.hidden
        coarse = F.adaptive_avg_pool2d(images, self.config.context)  # (b, c, context, context)
        upper = (self.context(coarse), images.new_zeros(b, h))  # r^(2)_0: the context
        lower = (images.new_zeros(b, h), images.new_zeros(b, h))
        prepared = self.glimpse.sensor.prepare(images)
        logits, locations, log_pi, baseline = [], [], [], []
        for n in range(self.labels * self.config.glimpses):
            # REINFORCE trains the emission network, r^(2) and the context (module Note)
            draw = self.location(upper[0], sample=sample, generator=generator)
            locations.append(draw.sample)
            log_pi.append(draw.log_prob)
            baseline.append(self.baseline(upper[0].detach()).squeeze(-1))  # (b,)
            lower = self.lower(self.glimpse(prepared, draw.sample), lower)  # (b, h) x 2
            upper = self.upper(lower[0].detach(), upper)  # "where" does not train "what"
            if n % self.config.glimpses == self.config.glimpses - 1:
                logits.append(self.classifier(lower[0]))  # (b, classes)
        return DRAMOutput(
            torch.log_softmax(torch.stack(logits, 1), -1),  # (b, labels, classes)
            torch.stack(locations, 1),  # (b, labels glimpses, 2)
            torch.stack(log_pi, 1),  # (b, labels glimpses)
            torch.stack(baseline, 1),
        )
