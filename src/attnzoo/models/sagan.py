"""Self-Attention GAN (Zhang et al. 2018, arXiv:1805.08318): a class-conditional generator and a
projection discriminator, both with a self-attention block over the N = H * W positions of a
feature map, spectral normalisation on both, the hinge loss and two time-scale learning rates.

    f(x) = W_f x,  g(x) = W_g x  (1 x 1 convolutions, C / 8 channels),  h(x) = W_h x  (C)
    s_ij = f(x_i)^T g(x_j),  beta_ji = exp(s_ij) / sum_i exp(s_ij)        (eq. 1)
    o_j = sum_i beta_ji h(x_i)                                           (eq. 2)
    y_j = gamma o_j + x_j,  gamma a learnable scalar initialised to 0    (eq. 3)

The hinge loss (eq. 4) is the task's (`attnzoo.tasks.gan_mnist`: `d_hinge_loss`,
`g_hinge_loss`).

`SelfAttention2d` computes eq. 1-2 with core `attention()` (query g(x_j), key f(x_i), value
h(x_i), the unscaled "dot" score); its attention maps are `attention(..., return_weights=True)`'s
weights, (batch, N queries, N keys), each row summing to 1 over the N positions.

The generator is conditioned by conditional batch normalisation (a per-class scale and shift
after a batch norm without affine parameters, as in the paper); the discriminator by the
projection of Miyato & Koyama 2018 (D(x, y) = psi(phi(x)) + embed(y)^T phi(x)). Every
convolution, linear layer and the projection embedding of both networks is spectrally
normalised (`torch.nn.utils.parametrizations.spectral_norm`); the conditional batch norm's
class embeddings are not (the paper's generator, like BigGAN's, leaves them plain).

The model declares its two optimiser groups (`optimizer_groups`: the discriminator's at
`d_lr`, the generator's at `g_lr`, Adam betas `betas`); the training loop steps them in that
order, each on its own phase of the task's loss (`attnzoo.train.loop`). `log_scalars` gives
the gammas, which the loop logs every step.

Note:
    - CPU scale: a 32 x 32 image (MNIST padded), base width `channels` (16), a latent of
      `z_dim` (64); the paper's ImageNet networks are residual and 128 x 128. Here each
      network is plain: the generator's three upsampling 3 x 3 convolutions (4 -> 8 -> 16 ->
      32) and the discriminator's three 4 x 4 stride-2 convolutions (32 -> 16 -> 8 -> 4); the
      self-attention block sits on the 16 x 16 map of each (after the generator's second
      upsampling, after the discriminator's first downsampling), or with `attention_side` 8
      on the 8 x 8 map (after the generator's first upsampling, the discriminator's second
      downsampling).
    - The generator's batch norm uses the batch's statistics in training and evaluation alike
      (no running averages), so samples drawn in eval mode come from the network that trained.
    - The baseline (`attention=False`) is the same networks without the two blocks; the blocks
      add under 2% of the parameters at widths up to the default 16 (0.5% on the 16 x 16 map,
      1.9% on the 8 x 8 map, whose blocks see 2C channels), so the counts stay within 2%
      without widening anything
      (`tests/models/test_sagan.py` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from attnzoo.core.attention import attention
from attnzoo.core.checks import (
    check_fields,
    check_floating,
    check_image_size,
    check_images,
    check_labels,
    check_like_module,
    check_size,
    fail,
)

GROUPS = ("discriminator", "generator")  # the optimiser groups, in the order they step


@dataclass(frozen=True)
class SAGANConfig:
    """Attributes:
    channels: base width C; the generator runs 4C -> 2C -> C -> C, the discriminator
        C -> C -> 2C -> 4C; the attention blocks see C channels (f and g: C / 8).
    z_dim: the latent's size.
    attention: one self-attention block in each network (False: the baseline).
    attention_side: the side of the feature map each block attends over (Zhang 2018, Table 1
        compares such placements, "feat8" to "feat64"): half the image's side (None, the
        default: 16 at 32 x 32, C channels) or a quarter of it (8 at 32 x 32, 2C channels,
        N = 64 positions instead of 256).
    d_lr, g_lr: the two time-scale learning rates (Zhang 2018, sec. 4: 4e-4 and 1e-4).
    betas: Adam's (beta1, beta2) for both (sec. 5: 0 and 0.9).
    """

    channels: int = 16
    z_dim: int = 64
    attention: bool = True
    attention_side: int | None = None
    d_lr: float = 4e-4
    g_lr: float = 1e-4
    betas: tuple[float, float] = (0.0, 0.9)

    def __post_init__(self):
        check_fields(self)
        check_size("SAGANConfig", "channels", self.channels)
        check_size("SAGANConfig", "z_dim", self.z_dim)
        if self.channels < 8:
            fail(
                "SAGANConfig", "channels", "an int >= 8 (f and g have channels // 8)", self.channels
            )
        if not isinstance(self.attention, bool):
            fail("SAGANConfig", "attention", "True or False", repr(self.attention))
        check_size("SAGANConfig", "attention_side", self.attention_side, optional=True)
        if not self.attention and self.attention_side is not None:  # no block to place
            fail("SAGANConfig", "attention_side", "None without attention", self.attention_side)
        for name in ("d_lr", "g_lr"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                fail("SAGANConfig", name, "a positive, finite learning rate", repr(value))
        betas = self.betas
        if (
            not isinstance(betas, tuple | list)
            or len(betas) != 2
            or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
        ):
            fail("SAGANConfig", "betas", "two numbers in [0, 1), e.g. 0,0.9", repr(betas))


def sagan(**overrides) -> SAGANConfig:
    """Zhang 2018 at CPU scale (module Note)."""
    return replace(SAGANConfig(), **overrides)


def sagan_noattn(**overrides) -> SAGANConfig:
    """The same networks without the self-attention blocks (the baseline)."""
    return replace(SAGANConfig(attention=False), **overrides)


def _sn(module: nn.Module) -> nn.Module:
    return spectral_norm(module)


class SelfAttentionOutput(NamedTuple):
    features: torch.Tensor  # (batch, C, H, W): x + gamma * o
    weights: torch.Tensor | None  # (batch, N queries, N keys), N = H * W; rows sum to 1


class SelfAttention2d(nn.Module):
    """The self-attention block of eq. 1-3 (module docstring), spectrally normalised 1 x 1
    convolutions f, g (C / 8 channels) and h (C), gamma a scalar initialised to 0."""

    def __init__(self, channels: int, spectral: bool = True):
        super().__init__()
        check_size("SelfAttention2d", "channels", channels)
        if channels < 8:
            fail("SelfAttention2d", "channels", "an int >= 8 (f and g have C // 8)", channels)
        wrap = _sn if spectral else (lambda m: m)
        self.channels = channels
        self.f = wrap(nn.Conv2d(channels, channels // 8, 1))
        self.g = wrap(nn.Conv2d(channels, channels // 8, 1))
        self.h = wrap(nn.Conv2d(channels, channels, 1))
        self.gamma = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, return_weights: bool = False) -> SelfAttentionOutput:
        """x (batch, C, H, W) -> x + gamma * o, and with `return_weights` beta (batch, N, N):
        row j is query position j's weights over the N positions i (row-major j = r * W + c)."""
        if x.dim() != 4 or x.shape[1] != self.channels:
            fail("SelfAttention2d", "x", f"(batch, {self.channels}, H, W)", tuple(x.shape))
        b, c, height, width = x.shape
        key = self.f(x).flatten(2).transpose(1, 2)  # (b, N, C/8): f(x_i)
        query = self.g(x).flatten(2).transpose(1, 2)  # (b, N, C/8): g(x_j)
        value = self.h(x).flatten(2).transpose(1, 2)  # (b, N, C): h(x_i)
        out = attention(query, key, value, score="dot", return_weights=return_weights)
        o = out.context.transpose(1, 2).reshape(b, c, height, width)  # (b, C, H, W)
        return SelfAttentionOutput(x + self.gamma * o, out.weights)


class ConditionalBatchNorm2d(nn.Module):
    """Batch norm without affine parameters, then a per-class scale (initialised to 1) and
    shift (0); batch statistics in training and evaluation alike (module Note)."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, affine=False, track_running_stats=False)
        self.scale = nn.Embedding(classes, channels)
        self.shift = nn.Embedding(classes, channels)
        nn.init.ones_(self.scale.weight)
        nn.init.zeros_(self.shift.weight)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        scale = self.scale(labels)[:, :, None, None]  # (b, C, 1, 1)
        return self.norm(x) * scale + self.shift(labels)[:, :, None, None]


class GeneratorOutput(NamedTuple):
    images: torch.Tensor  # (batch, channels, H, W) in [-1, 1]
    weights: torch.Tensor | None  # the block's (batch, N, N) on its map, or None


class Generator(nn.Module):
    """z (batch, z_dim), labels (batch,) -> images (batch, channels, side, side) in [-1, 1]."""

    def __init__(self, config: SAGANConfig, side: int, channels: int, classes: int):
        super().__init__()
        c, self.start, self.z_dim = config.channels, side // 8, config.z_dim
        self.classes = classes
        widths = (4 * c, 2 * c, c, c)
        self.top = widths[0]
        self.project = _sn(nn.Linear(config.z_dim, widths[0] * self.start**2))
        self.norms = nn.ModuleList(ConditionalBatchNorm2d(w, classes) for w in widths)
        self.convs = nn.ModuleList(
            _sn(nn.Conv2d(widths[k], widths[k + 1], 3, padding=1)) for k in range(3)
        )
        # the block follows the convolution whose output has the attention side: the second
        # (side / 2, C channels) or the first (side / 4, 2C)
        self.attend_after = 1 if _attention_side(config, side) == side // 2 else 0
        attend_width = widths[self.attend_after + 1]
        self.attend = SelfAttention2d(attend_width) if config.attention else None
        self.out = _sn(nn.Conv2d(c, channels, 3, padding=1))

    def forward(
        self, z: torch.Tensor, labels: torch.Tensor, return_weights: bool = False
    ) -> GeneratorOutput:
        """The task's loss calls it directly: z and one label per row, checked here (a single
        label broadcast over the batch, silently)."""
        check_floating("Generator", "z", z)
        check_like_module("Generator", "z", z, self)
        if z.dim() != 2 or z.shape[1] != self.z_dim:
            fail("Generator", "z", f"(batch, {self.z_dim})", tuple(z.shape))
        check_labels("Generator", "labels", labels, self.classes, z.shape[:1])
        x = self.project(z).view(-1, self.top, self.start, self.start)  # (b, 4C, s/8, s/8)
        weights = None
        for k, conv in enumerate(self.convs):
            x = F.relu(self.norms[k](x, labels))
            x = conv(F.interpolate(x, scale_factor=2, mode="nearest"))  # doubles the side
            if k == self.attend_after and self.attend is not None:  # the attention side
                x, weights = self.attend(x, return_weights)
        x = F.relu(self.norms[3](x, labels))
        return GeneratorOutput(torch.tanh(self.out(x)), weights)


class DiscriminatorOutput(NamedTuple):
    scores: torch.Tensor  # (batch,)
    weights: torch.Tensor | None  # (batch, N, N) on its map (`attention_side`), or None


class Discriminator(nn.Module):
    """Projection discriminator: images (batch, channels, side, side), labels -> scores."""

    def __init__(self, config: SAGANConfig, side: int, channels: int, classes: int):
        super().__init__()
        c = config.channels
        self.side, self.channels, self.classes = side, channels, classes
        self.first = _sn(nn.Conv2d(channels, c, 3, padding=1))
        widths = (c, c, 2 * c, 4 * c)
        self.downs = nn.ModuleList(
            _sn(nn.Conv2d(widths[k], widths[k + 1], 4, stride=2, padding=1)) for k in range(3)
        )
        # the block follows the downsampling whose output has the attention side: the first
        # (side / 2, C channels) or the second (side / 4, 2C)
        self.attend_after = 0 if _attention_side(config, side) == side // 2 else 1
        attend_width = widths[self.attend_after + 1]
        self.attend = SelfAttention2d(attend_width) if config.attention else None
        self.linear = _sn(nn.Linear(widths[-1], 1))
        self.embed = _sn(nn.Embedding(classes, widths[-1]))

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor, return_weights: bool = False
    ) -> DiscriminatorOutput:
        """Images of the side it was built for (another side's sum pooling scores on another
        scale) and one label per image, checked here: the task's loss calls it directly."""
        check_images("Discriminator", images, self.channels, (self.side, self.side), like=self)
        check_labels("Discriminator", "labels", labels, self.classes, images.shape[:1])
        x = F.leaky_relu(self.first(images), 0.1)
        weights = None
        for k, down in enumerate(self.downs):
            x = F.leaky_relu(down(x), 0.1)  # halves the side
            if k == self.attend_after and self.attend is not None:  # the attention side
                x, weights = self.attend(x, return_weights)
        phi = x.sum((2, 3))  # (b, 4C): global sum pooling
        scores = self.linear(phi).squeeze(-1) + (self.embed(labels) * phi).sum(-1)
        return DiscriminatorOutput(scores, weights)


def _attention_side(config: SAGANConfig, side: int) -> int:
    """The side of the map the blocks attend over (`SAGANConfig.attention_side`)."""
    if config.attention_side is None:
        return side // 2
    if config.attention_side not in (side // 2, side // 4):
        fail(
            "SAGAN",
            "attention_side",
            f"{side // 2} or {side // 4} (half or a quarter of the image's side {side}) or None",
            config.attention_side,
        )
    return config.attention_side


class OptimizerGroup(NamedTuple):
    """One optimiser of a model that trains several (`attnzoo.train.loop`)."""

    name: str  # the task's loss phase it steps on
    params: list[nn.Parameter]
    lr: float
    betas: tuple[float, float]


class SAGAN(nn.Module):
    """Generator and discriminator of one run ("gan" interface: `(config, image_size,
    channels, classes)`). `model(z, labels)` draws images; the task's loss calls the two
    networks (`generator`, `discriminator`)."""

    def __init__(
        self, config: SAGANConfig, image_size: tuple[int, int], channels: int, classes: int
    ):
        super().__init__()
        check_size("SAGAN", "channels", channels)
        check_size("SAGAN", "classes", classes)
        side = check_image_size("SAGAN", image_size)[0]
        if image_size[1] != side or side < 8 or side % 8:
            fail("SAGAN", "image_size", "a square (side, side), side a multiple of 8", image_size)
        _attention_side(config, side)  # checked before any layer is built
        self.config, self.image_size = config, (side, side)
        self.channels, self.classes = channels, classes
        self.generator = Generator(config, side, channels, classes)
        self.discriminator = Discriminator(config, side, channels, classes)

    def forward(
        self, z: torch.Tensor, labels: torch.Tensor, return_weights: bool = False
    ) -> GeneratorOutput:
        return self.generator(z, labels, return_weights)  # (which checks z and labels)

    def optimizer_groups(self) -> list[OptimizerGroup]:
        """The discriminator's optimiser, then the generator's (the loop steps them in this
        order: D step, then G step)."""
        betas = tuple(float(b) for b in self.config.betas)
        return [
            OptimizerGroup(
                "discriminator", list(self.discriminator.parameters()), self.config.d_lr, betas
            ),
            OptimizerGroup("generator", list(self.generator.parameters()), self.config.g_lr, betas),
        ]

    def gammas(self) -> dict[str, torch.Tensor]:
        """Each attention block's gamma (none without attention)."""
        return {
            f"gamma_{name}": net.attend.gamma
            for name, net in (("generator", self.generator), ("discriminator", self.discriminator))
            if net.attend is not None
        }

    def log_scalars(self) -> dict[str, torch.Tensor]:
        """What the loop logs every step (`attnzoo.train.loop`): the gammas."""
        return {k: v.detach() for k, v in self.gammas().items()}
