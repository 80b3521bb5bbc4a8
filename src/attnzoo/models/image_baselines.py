"""The baselines of the RAM experiments (Mnih et al. 2014, Tables 1 and 2): classifiers that see
the whole image at once, trained by the same loop on the same tasks ("image" interface).

- `FullyConnected`: two hidden layers of 256 rectifier units ("FC, 2 layers (256 hiddens
  each)").
- `ConvNet`: two convolutional layers of rectifier units, then a linear classifier.

Note:
    The paper gives the convnet's depth ("Convolutional, 2 layers") but its filter sizes are not
    confirmed from any copy here; the preset is 5 x 5 filters, 8 then 16 channels, each layer
    followed by 2 x 2 max pooling.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.checks import check_fields, check_image_size, check_images, check_size, fail
from attnzoo.core.normalisers import at_least_float32


def pool_then_relu(size: int = 2) -> list[nn.Module]:
    """A `size` x `size` max pool, then ReLU: the same function, value and gradient, as ReLU
    then the pool (both pick values and ReLU is monotone; where every value of a window is
    <= 0 both give 0 and a zero gradient), with the ReLU's forward and backward on a quarter
    of the values. A convolution block's ReLU runs here. Measured: the Omniglot embedding of
    `attnzoo.models.snail` (4 blocks of 64, 832 glyphs, forward + backward, one thread's CPU
    time, medians of 7 interleaved, two runs): 1.34 -> 1.13 s and 1.40 -> 1.16 s (1.19x and
    1.20x; the same order measured twice differed by 1.06x and 1.03x), outputs and gradients
    bit-identical."""
    return [nn.MaxPool2d(size), nn.ReLU()]


class ClassifierOutput(NamedTuple):
    log_probs: torch.Tensor  # (batch, classes)


def _check_ints(owner: str, config, names) -> None:
    for name in names:
        check_size(owner, name, getattr(config, name))


@dataclass(frozen=True)
class FCConfig:
    hidden: int = 256
    layers: int = 2

    def __post_init__(self):
        check_fields(self)
        _check_ints("FCConfig", self, ("hidden", "layers"))


def fc(**overrides) -> FCConfig:
    """Mnih 2014's FC baseline: 2 layers of 256."""
    return replace(FCConfig(), **overrides)


@dataclass(frozen=True)
class ConvConfig:
    channels: int = 8  # of the first layer; the second has twice as many
    kernel: int = 5
    hidden: int = 256  # a rectifier layer before the classifier (0: none)

    def __post_init__(self):
        check_fields(self)
        _check_ints("ConvConfig", self, ("channels", "kernel"))
        if self.kernel % 2 == 0:  # "same" padding (kernel // 2) keeps the side only when odd
            fail("ConvConfig", "kernel", "an odd int (same padding)", repr(self.kernel))
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 0:
            fail("ConvConfig", "hidden", "an int >= 0", repr(self.hidden))


def conv(**overrides) -> ConvConfig:
    """A two-layer convnet (see the module Note)."""
    return replace(ConvConfig(), **overrides)


class FullyConnected(nn.Module):
    """log softmax(W_out ReLU(... ReLU(W_1 vec(x)))): the whole image, no attention."""

    def __init__(self, config: FCConfig, image_size: tuple[int, int], channels: int, classes: int):
        super().__init__()
        check_size("FullyConnected", "channels", channels)
        check_size("FullyConnected", "classes", classes)
        self.image_size = image_size = check_image_size("FullyConnected", image_size)
        self.channels = channels
        width = channels * image_size[0] * image_size[1]
        layers: list[nn.Module] = []
        for _ in range(config.layers):
            layers += [nn.Linear(width, config.hidden), nn.ReLU()]
            width = config.hidden
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, images: torch.Tensor, **_sampling) -> ClassifierOutput:
        """images (batch, channels, height, width); sampling options are ignored."""
        check_images("FullyConnected", images, self.channels, self.image_size, like=self)
        logits = at_least_float32(self.net(images.flatten(1)))  # float32 under autocast
        return ClassifierOutput(torch.log_softmax(logits, -1))


class ConvNet(nn.Module):
    """Two conv + ReLU + 2 x 2 max-pool layers, then (optionally) a ReLU layer, then linear."""

    def __init__(
        self, config: ConvConfig, image_size: tuple[int, int], channels: int, classes: int
    ):
        super().__init__()
        check_size("ConvNet", "channels", channels)
        check_size("ConvNet", "classes", classes)
        self.image_size = image_size = check_image_size(type(self).__name__, image_size)
        self.channels = channels
        c, k = config.channels, config.kernel
        self.conv1 = nn.Conv2d(channels, c, k, padding=k // 2)
        self.conv2 = nn.Conv2d(c, 2 * c, k, padding=k // 2)
        height, width = image_size[0] // 4, image_size[1] // 4  # after two 2 x 2 pools
        flat = 2 * c * height * width
        if config.hidden:
            self.head = nn.Sequential(
                nn.Linear(flat, config.hidden), nn.ReLU(), nn.Linear(config.hidden, classes)
            )
        else:
            self.head = nn.Linear(flat, classes)
        self.feature_size = config.hidden or flat  # of `features`

    def flat(self, images: torch.Tensor, owner: str = "ConvNet") -> torch.Tensor:
        """The two convolutional layers' output, flattened: (batch, 2c H/4 W/4)."""
        check_images(owner, images, self.channels, self.image_size, like=self)
        x = F.max_pool2d(F.relu(self.conv1(images)), 2)  # (b, c, H/2, W/2)
        return F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)  # (b, 2c, H/4, W/4) flat

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The penultimate layer (batch, feature_size): the ReLU layer's output, or the flat
        convolutional features without one (the GAN metrics' feature extractor,
        `attnzoo.tasks.gan_mnist`)."""
        x = self.flat(images)
        return self.head[:-1](x) if isinstance(self.head, nn.Sequential) else x

    def forward(self, images: torch.Tensor, **_sampling) -> ClassifierOutput:
        """images (batch, channels, height, width); sampling options are ignored."""
        logits = at_least_float32(self.head(self.flat(images)))  # float32 under autocast
        return ClassifierOutput(torch.log_softmax(logits, -1))


class MultiHeadConvNet(ConvNet):
    """The DRAM experiments' convnet baseline (Ba 2014, sec. 4.1): the two-layer convnet's
    features, then one softmax head per label position ("multi_image" interface)."""

    def __init__(
        self,
        config: ConvConfig,
        image_size: tuple[int, int],
        channels: int,
        classes: int,
        labels: int,
    ):
        check_size("MultiHeadConvNet", "labels", labels)
        check_size("MultiHeadConvNet", "classes", classes)
        super().__init__(config, image_size, channels, classes * labels)
        self.labels, self.classes = labels, classes

    def forward(self, images: torch.Tensor, **_sampling) -> ClassifierOutput:
        """images (batch, channels, height, width) -> log_probs (batch, labels, classes)."""
        flat = self.flat(images, "MultiHeadConvNet")
        logits = self.head(flat).view(-1, self.labels, self.classes)  # (b, s, classes)
        return ClassifierOutput(torch.log_softmax(at_least_float32(logits), -1))
