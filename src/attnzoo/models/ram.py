"""The Recurrent Attention Model (Mnih, Heess, Graves & Kavukcuoglu 2014, "Recurrent Models of
Visual Attention", sec. 3 and Fig. 1).

The model never sees the whole image. At step t it takes a glimpse at location l_{t-1}: a
retina of k square patches centred there, of sizes g, 2g, 4g, ..., each resized to g x g
(`GlimpseSensor`, rho(x_t, l_{t-1})). Then

    h_g = ReLU(Linear(rho)),  h_l = ReLU(Linear(l_{t-1})),
    g_t = ReLU(Linear(h_g) + Linear(h_l))                      (glimpse network f_g)
    h_t = ReLU(Linear(h_{t-1}) + Linear(g_t))                  (core network f_h)
    l_t ~ N(f_l(h_t), sigma^2 I)                                (location network f_l)
    p(y | x) = softmax(f_a(h_N))                               (action network f_a)
    b_t = f_b(h_t)                                             (baseline)

and is trained by the hybrid loss (sec. 4): the cross-entropy of the class trains f_a, f_h and
f_g; REINFORCE with reward R = 1[correct] minus the baseline trains f_l; the baseline's squared
error trains f_b (`attnzoo.core.hard.reinforce_loss`, `hybrid_loss`). Locations are in
[-1, 1]^2 across the image: (-1, -1) is the top-left corner, (x, y) = (column, row).

Note:
    - Gradient routes: the sampled location is detached (no classification gradient reaches
      f_l through the next glimpse), and f_l and f_b read h_t detached, so REINFORCE trains
      only f_l and the baseline only f_b; neither trains the core network. The paper's
      estimator may also reach f_h and f_g through log pi; popular public code that let the
      routes mix reports ~14% MNIST error (~1% once fixed), and this is the fixed form.
    - The paper does not say where the first glimpse is. `start="random"` (the default) draws
      it uniformly over the image in every sampled pass (training, and the Monte Carlo average
      at test), as popular public RAM code does, and keeps the centre, the draw's mean, for the
      mean-location pass; `start="centre"` always starts at the centre. On MNIST the random
      start regularises: with every first glimpse at the centre the training digits are
      memorised (`benchmarks/bench_ram.py`'s `mnist-g6-centre` row).
    - The location mean is squashed by tanh into (-1, 1) (`bound`; "clamp" instead clamps the
      draw to the image, as DRAM does: `attnzoo.core.hard.GaussianPolicy`) and sigma is fixed
      (`std`) unless `learn_std`.
    - A glimpse's patches are placed at whole pixels (the centre is rounded); anything outside
      the image reads as zero. The sensor box-filters the image once per scale for all the
      glimpses (`GlimpseSensor.prepare`) and reads g x g entries per patch (`read`), by one
      `F.grid_sample` (`method="grid"`, the default) or one gather of clamped indices
      (`method="index"`): the same patches. `benchmarks/bench_ram.py` times both beside
      cropping each patch at full size and pooling it; on the 2-core CPU of this project the
      three are within noise of each other (batch 128, 3 scales of 12 x 12 on 60 x 60), and
      the batched step beats a per-image retina loop by far more than any of them differ.
    - `core="lstm"` swaps the rectifier core for an LSTM cell (the paper's choice for the
      dynamic game environment).
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

CORES = ("rnn", "lstm")
METHODS = ("grid", "index")
STARTS = ("centre", "random")


@dataclass(frozen=True)
class RAMConfig:
    """Sizes of Mnih 2014 (sec. 4.1: "the glimpse network ... 128 ... 256 hidden units").

    Attributes:
        glimpses: N, glimpses per image.
        patch: g, the side of the smallest patch (and of every resized patch), pixels.
        scales: k, patches per glimpse, each twice the side of the last.
        glimpse_hidden: width of h_g and of h_l.
        hidden: width of g_t and of the core state h_t.
        core: rnn (rectifier units, the paper's for classification) | lstm.
        std: sigma of the location policy, in units of half the image side.
        learn_std: learn log sigma (per coordinate) instead of fixing it.
        method: the glimpse sensor's implementation (grid | index; the same patches).
        bound: how a location stays on the image (`attnzoo.core.hard.BOUNDS`).
        start: the first glimpse's location (`STARTS`): the centre, or uniform over the image
            in sampled passes and the centre in the mean-location pass.
    """

    glimpses: int = 6
    patch: int = 8
    scales: int = 1
    glimpse_hidden: int = 128
    hidden: int = 256
    core: str = "rnn"
    std: float = 0.1
    learn_std: bool = False
    method: str = "grid"
    bound: str = "tanh"
    start: str = "random"

    def __post_init__(self):
        check_fields(self)
        for name in ("glimpses", "patch", "scales", "glimpse_hidden", "hidden"):
            check_size("RAMConfig", name, getattr(self, name))
        if self.core not in CORES:
            fail("RAMConfig", "core", f"one of {list(CORES)}", repr(self.core))
        if self.method not in METHODS:
            fail("RAMConfig", "method", f"one of {list(METHODS)}", repr(self.method))
        if self.bound not in BOUNDS:
            fail("RAMConfig", "bound", f"one of {list(BOUNDS)}", repr(self.bound))
        if self.start not in STARTS:
            fail("RAMConfig", "start", f"one of {list(STARTS)}", repr(self.start))
        std = self.std
        if isinstance(std, bool) or not isinstance(std, int | float) or not 0 < std < 10:
            fail("RAMConfig", "std", "a number in (0, 10)", repr(std))


def ram(**overrides) -> RAMConfig:
    """RAM for 28 x 28 MNIST (Mnih 2014, Table 1a): 6 glimpses of 8 x 8, 1 scale."""
    return replace(RAMConfig(), **overrides)


def ram_translated(**overrides) -> RAMConfig:
    """RAM for 60 x 60 translated or cluttered MNIST (Table 1b, 2): 8 glimpses of 12 x 12,
    3 scales."""
    return replace(RAMConfig(glimpses=8, patch=12, scales=3), **overrides)


def patch_corners(
    location: torch.Tensor, height: int, width: int, patch: int, scales: int
) -> torch.Tensor:
    """The top-left pixel (row, column) of every patch of the retina: (batch, 2) locations ->
    (batch, scales, 2) long. Patch s has side patch * 2^s; its centre is the location rounded
    to the pixel grid, so a patch of even side is centred on a pixel corner."""
    sizes = patch * 2 ** torch.arange(scales, device=location.device)  # (k,)
    centre_x = (location[:, 0] + 1) * (width / 2)  # (b,) pixels from the left edge
    centre_y = (location[:, 1] + 1) * (height / 2)
    centre = torch.stack([centre_y, centre_x], -1).unsqueeze(1)  # (b, 1, 2) row, column
    corner = torch.floor(centre - sizes.view(1, -1, 1) / 2 + 0.5)  # (b, k, 2)
    # a patch wholly outside the image reads zeros wherever it is: clamp so indices stay small
    big = patch * 2 ** (scales - 1)
    limit = torch.tensor([height, width], device=location.device, dtype=corner.dtype)
    return torch.minimum(corner.clamp_min(-big), limit).long()  # (b, k, 2)


class GlimpseSensor(nn.Module):
    """rho(x, l): k patches centred at l, of sides g, 2g, ..., each average-pooled to g x g.

    A patch of side g f (f = 2^s) pooled to g x g is g x g samples, at stride f, of the image
    box-filtered by f x f. `prepare` filters the image once per scale (the image is the same
    at every glimpse); `read` then takes k g^2 samples per glimpse, not sum_s (g 2^s)^2.

    Args:
        patch: g.
        scales: k.
        method: how `read` samples: "grid" (`F.grid_sample`, nearest, zeros outside) or
            "index" (a gather of clamped indices, the outside zeroed): the same patches.
    """

    def __init__(self, patch: int, scales: int, method: str = "grid"):
        super().__init__()
        check_size("GlimpseSensor", "patch", patch)
        check_size("GlimpseSensor", "scales", scales)
        if method not in METHODS:
            fail("GlimpseSensor", "method", f"one of {list(METHODS)}", repr(method))
        self.patch, self.scales, self.method = patch, scales, method

    def forward(self, images: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
        """images (batch, channels, height, width), location (batch, 2) ->
        patches (batch, scales, channels, patch, patch)."""
        return self.read(self.prepare(images), location)

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """images (batch, channels, H, W) -> the pyramid (batch, scales, channels, H + F - 1,
        W + F - 1), F = 2^(scales - 1): scale s is the image box-filtered by f = 2^s, entry
        [u, v] the mean of the image's pixels [u - f + 1, u] x [v - f + 1, v] (zeros outside,
        and past H + f - 1, W + f - 1)."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
            fail("GlimpseSensor", "images", "a (batch, channels, height, width) tensor", got)
        big = 2 ** (self.scales - 1)
        levels = [images]
        for s in range(1, self.scales):
            # a 2f box is the mean of four f boxes f apart (~6x faster than a stride-1 pool)
            f = 2 ** (s - 1)
            q = F.pad(levels[-1], (f,) * 4)  # (b, c, H + 3f - 1, W + 3f - 1)
            boxes = q[..., f:, f:] + q[..., :-f, f:] + q[..., f:, :-f] + q[..., :-f, :-f]
            levels.append(boxes / 4)  # (b, c, H + 2f - 1, W + 2f - 1)
        grow = [big - level.shape[-1] + images.shape[-1] - 1 for level in levels]
        return torch.stack([F.pad(x, (0, e, 0, e)) for x, e in zip(levels, grow, strict=True)], 1)

    def read(self, pyramid: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
        """`prepare`'s pyramid and location (batch, 2) -> (batch, scales, channels, patch,
        patch): scale s's patch is g x g entries of its level, f = 2^s apart."""
        b, k, _, tall, wide = pyramid.shape
        if location.shape != (b, 2):
            fail(
                "GlimpseSensor",
                "location",
                f"a ({b}, 2) tensor beside a pyramid of {b} images",
                tuple(location.shape),
            )
        big = 2 ** (k - 1)
        height, width = tall - big + 1, wide - big + 1
        corners = patch_corners(location, height, width, self.patch, k)  # (b, k, 2)
        f = 2 ** torch.arange(k, device=location.device).view(1, k, 1)  # (1, k, 1)
        steps = torch.arange(self.patch, device=location.device)  # (g,)
        # the level's entry of the f x f block whose top-left pixel is corner + f * step
        start = corners + (f - 1)  # (b, k, 2)
        rows = start[..., 0:1] + f * steps  # (b, k, g)
        cols = start[..., 1:2] + f * steps  # (b, k, g)
        sample = self._index if self.method == "index" else self._grid
        patches = sample(pyramid, rows, cols)  # (b, k, c, g, g)
        # a non-finite location became a corner far outside, hence a patch of zeros: a number
        # made from garbage. + 0 * sum(location) makes that row's patches NaN instead
        probe = location.detach().sum(-1).to(patches.dtype).view(b, 1, 1, 1, 1)
        return torch.add(patches, probe, alpha=0)

    @staticmethod
    def _index(pyramid: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """One gather over every level: pyramid (b, k, c, H', W'), rows and cols (b, k, g) ->
        (b, k, c, g, g); entries outside the level are 0."""
        b, k, c, tall, wide = pyramid.shape
        g = rows.shape[-1]
        inside_r = (rows >= 0) & (rows < tall)  # (b, k, g)
        inside_c = (cols >= 0) & (cols < wide)  # (b, k, g)
        inside = inside_r.unsqueeze(-1) & inside_c.unsqueeze(-2)  # (b, k, g, g)
        level = torch.arange(k, device=rows.device).view(1, k, 1, 1) * (tall * wide)
        r = rows.clamp(0, tall - 1).unsqueeze(-1) * wide  # (b, k, g, 1)
        flat = level + r + cols.clamp(0, wide - 1).unsqueeze(-2)  # (b, k, g, g)
        source = pyramid.transpose(1, 2).reshape(b, c, k * tall * wide)  # (b, c, k H' W')
        window = source.gather(2, flat.view(b, 1, -1).expand(-1, c, -1))  # (b, c, k g g)
        window = window.view(b, c, k, g, g).transpose(1, 2)  # (b, k, c, g, g)
        return window * inside.unsqueeze(2).to(window.dtype)

    @staticmethod
    def _grid(pyramid: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The same samples by one `F.grid_sample` over the levels as a batch, nearest at the
        entries' centres (align_corners=False), zeros outside."""
        b, k, c, tall, wide = pyramid.shape
        g = rows.shape[-1]
        y = (rows.to(pyramid.dtype) + 0.5) * (2 / tall) - 1  # (b, k, g)
        x = (cols.to(pyramid.dtype) + 0.5) * (2 / wide) - 1  # (b, k, g)
        grid = torch.stack(
            [x.unsqueeze(-2).expand(-1, -1, g, -1), y.unsqueeze(-1).expand(-1, -1, -1, g)], -1
        )  # (b, k, g, g, 2): (x, y)
        window = F.grid_sample(
            pyramid.reshape(b * k, c, tall, wide),
            grid.view(b * k, g, g, 2),
            mode="nearest",
            padding_mode="zeros",
            align_corners=False,
        )  # (b k, c, g, g)
        return window.view(b, k, c, g, g)


class GlimpseNetwork(nn.Module):
    """f_g: g_t = ReLU(Linear(ReLU(Linear(rho))) + Linear(ReLU(Linear(l))))."""

    def __init__(self, config: RAMConfig, channels: int):
        super().__init__()
        c = config
        self.sensor = GlimpseSensor(c.patch, c.scales, c.method)
        self.what = nn.Linear(c.scales * channels * c.patch**2, c.glimpse_hidden)
        self.where = nn.Linear(2, c.glimpse_hidden)
        self.what_out = nn.Linear(c.glimpse_hidden, c.hidden)
        self.where_out = nn.Linear(c.glimpse_hidden, c.hidden)

    def forward(self, prepared: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
        """`self.sensor.prepare(images)`, location (batch, 2) -> g_t (batch, hidden)."""
        retina = self.sensor.read(prepared, location).flatten(1)  # (b, k c g g)
        h_g = F.relu(self.what(retina))  # (b, glimpse_hidden)
        h_l = F.relu(self.where(location))  # (b, glimpse_hidden)
        return F.relu(self.what_out(h_g) + self.where_out(h_l))  # (b, hidden)


class RAMOutput(NamedTuple):
    log_probs: torch.Tensor  # (batch, classes) log p(y | x) after the last glimpse
    locations: torch.Tensor  # (batch, glimpses, 2) where each glimpse looked (detached)
    log_pi: torch.Tensor  # (batch, glimpses - 1) log pi(l_t | h_t) of the chosen locations
    baseline: torch.Tensor  # (batch, glimpses - 1) b_t, predicted reward


class RAM(nn.Module):
    """The Recurrent Attention Model for classification ("image" interface).

    Args:
        config: sizes.
        image_size: (height, width) of the input images.
        channels: input channels.
        classes: output classes.
    """

    def __init__(self, config: RAMConfig, image_size: tuple[int, int], channels: int, classes: int):
        super().__init__()
        for name, value in (("channels", channels), ("classes", classes)):
            check_size("RAM", name, value)
        self.config, self.image_size = config, check_image_size("RAM", image_size)
        self.channels = channels
        self.glimpse = GlimpseNetwork(config, channels)
        h = config.hidden
        if config.core == "lstm":
            self.core = nn.LSTMCell(h, h)
        else:
            self.core_input = nn.Linear(h, h)
            self.core_recurrent = nn.Linear(h, h, bias=False)
        self.location = GaussianPolicy(
            h, 2, std=config.std, learn_std=config.learn_std, bound=config.bound
        )
        self.action = nn.Linear(h, classes)
        self.baseline = nn.Linear(h, 1)

    def step(self, g: torch.Tensor, state):
        """f_h: one core update; state is h (rnn) or (h, c) (lstm). Returns (h, state)."""
        if self.config.core == "lstm":
            h, c = self.core(g, state)
            return h, (h, c)
        h = F.relu(self.core_input(g) + self.core_recurrent(state))  # (b, hidden)
        return h, h

    def forward(
        self,
        images: torch.Tensor,
        *,
        sample: bool = True,
        generator: torch.Generator | None = None,
    ) -> RAMOutput:
        """images (batch, channels, height, width) -> RAMOutput. `sample=False`: every
        location is the policy's mean (the deterministic test-time pass)."""
        check_images("RAM", images, self.channels, self.image_size, like=self)
        b = images.shape[0]
        zeros = images.new_zeros(b, self.config.hidden)  # (b, hidden)
        state = (zeros, zeros) if self.config.core == "lstm" else zeros
        location = images.new_zeros(b, 2)  # the first glimpse: the centre ...
        if sample and self.config.start == "random" and images.device.type != "meta":
            u = torch.rand(b, 2, generator=generator, device=images.device, dtype=images.dtype)
            location = 2 * u - 1  # (b, 2): ... or uniform over the image
        locations, log_pi, baseline = [location], [], []
        prepared = self.glimpse.sensor.prepare(images)  # once: every glimpse reads it
        for t in range(self.config.glimpses):
            h, state = self.step(self.glimpse(prepared, location), state)  # (b, hidden)
            if t == self.config.glimpses - 1:
                break
            fixed = h.detach()  # f_l and f_b do not train the core (module Note)
            draw = self.location(fixed, sample=sample, generator=generator)
            location = draw.sample  # (b, 2), detached
            locations.append(location)
            log_pi.append(draw.log_prob)
            baseline.append(self.baseline(fixed).squeeze(-1))  # (b,)
        empty = images.new_zeros(b, 0)
        return RAMOutput(
            torch.log_softmax(self.action(h), -1),
            torch.stack(locations, 1),  # (b, N, 2)
            torch.stack(log_pi, 1) if log_pi else empty,  # (b, N - 1)
            torch.stack(baseline, 1) if baseline else empty,  # (b, N - 1)
        )
