"""Show, Attend and Tell (Xu et al. 2015, arXiv:1502.03044v3): an image captioner whose LSTM
attends over the L annotation vectors of a convolutional feature map at every word.

    a = {a_1..a_L} = CNN(image)                         annotations, a_i in R^D (sec. 3.1.1)
    c_0 = f_init,c(mean_i a_i), h_0 = f_init,h(mean_i a_i)          (sec. 3.1.2, two MLPs)
    e_ti = f_att(a_i, h_{t-1}) = w^T tanh(W_a a_i + W_h h_{t-1})    (eq. 4, additive)
    alpha_t = softmax(e_t)                                          (eq. 5)
    z_t = beta_t * sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))   (soft, sec. 4.2.1)
    z_t = a_{s_t},  s_t ~ Multinoulli(alpha_t)                      (hard, sec. 4.1)
    i, f, o, g, c_t, h_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_t-1)  (eq. 1-3)
    p(y_t) = softmax(L_o (E y_{t-1} + L_h h_t + L_z z_t))           (eq. 7, the deep output)

`variant` switches the attention: "soft" (deterministic, trained by back-propagation with the
doubly stochastic regulariser lambda * sum_i (1 - sum_t alpha_ti)^2, eq. 14), "hard"
(stochastic, trained by REINFORCE with a moving-average baseline and an entropy bonus: the
task's loss with `attnzoo.core.hard`, eq. 10-12), or "none" (the baseline: z_t is the mean
annotation at every step, no attention, no beta).

The additive score is `attnzoo.core.scores.Additive`: W_a a_i is computed once per image
(`attnzoo.core.attention.prepare_key`), and soft attention runs through core `attention()`.

Note:
    - The encoder is a small CNN (`channels`, 3 x 3 convolutions, ReLU, 2 x 2 max pooling)
      trained from scratch with the captioner in the same run by default, or started from
      the same CNN trained as an MNIST classifier (`EncoderClassifier`, model `sat-encoder`,
      then `train.init_from=ITS_RUN`) and trained on with the captioner; the paper uses a
      VGG net pre-trained on ImageNet and kept fixed. Its last convolution keeps the resolution, so
      the L = (H / 2^pools) * (W / 2^pools) cells see ~30 pixels each.
    - The regulariser sums over the real caption steps only (the words and <end>), never over
      padding after <end>; the paper's captions are bucketed by length and have none.
    - Hard attention in training, as the paper does (sec. 4.1): with probability
      `expectation_rate` (0.5) for a given image, every step of its caption uses the expected
      annotation sum_i alpha_ti a_i instead of a sampled one, so the likelihood's gradient
      reaches the location policy directly on those images; REINFORCE and the moving-average
      baseline (which tracks the whole caption's log-likelihood) count the sampled images
      only. At evaluation the hard model samples (from the task's seeded generator), so its
      scores and figures are those of the locations it actually used; `start(...,
      expectation=True)` decodes by the expectation instead, as the authors' released code
      generates captions from hard models by default (the task reports both).
    - From scratch, with the paper's credit, a sampled cell tells the decoder little, so
      REINFORCE learns to look where the annotations vary least, the background, and the
      policy never finds the digits.
      `expectation_warmup` W (0 by default: the paper's constant mix) reads every caption by
      expectation at the first step and lowers that share linearly to `expectation_rate`
      over W steps, so the expectation's gradient can find the digits before sampled cells
      have to pay for themselves; in the benchmark it does on some seeds only
      (docs/show_attend_tell.md, row hard-warmup).
    - The paper's credit (`credit="caption"`) gives every step of a caption the same
      advantage, the whole caption's log-likelihood minus a moving average, and on
      `digit_captions` that is mostly how many digits the caption names, whatever each step
      looked at. `credit="to_go"` gives step t the words from t on against the same words read
      by expectation; with it the policy finds the digits from scratch on every seed of the
      benchmark (docs/show_attend_tell.md, row hard-togo).
    - lambda defaults to 0.1, not the paper's 1: with T ~ 12 words and L = 64 cells, the term
      (summed per caption, as the log-likelihood is) pushes attention to spread over every
      cell, and at 1 it outweighs the caption's log-likelihood once that is learned.
    - `attention_supervision` (off by default) adds Liu et al. 2017's supervised attention:
      the cross-entropy between each digit word's attention and its box, computed by the
      task (`attnzoo.tasks.captions.attention_supervision`). The paper's attention is
      unsupervised; a model trained with it is not, and its correctness must be read so.
    - Dropout on the LSTM output before the deep output (the paper's dropout; its rate here is
      `dropout`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.attention import attention, prepare_key
from attnzoo.core.checks import (
    check_fields,
    check_image_size,
    check_images,
    check_integers,
    check_size,
    check_tokens,
    fail,
)
from attnzoo.core.hard import MovingAverageBaseline
from attnzoo.core.normalisers import at_least_float32, sample_hard
from attnzoo.core.scores import Additive
from attnzoo.core.types import PreparedKey
from attnzoo.models.image_baselines import ClassifierOutput, pool_then_relu

VARIANTS = ("soft", "hard", "none")
# How REINFORCE credits a sampled location (hard only; ShowAttendTellConfig.credit)
CREDITS = ("caption", "to_go")
CHANNELS = (16, 32, 64, 64)  # the encoder's default convolutions


@dataclass(frozen=True)
class ShowAttendTellConfig:
    """Attributes:
    variant: soft | hard | none (no attention: the mean annotation at every step).
    channels: output channels of the encoder's 3 x 3 convolutions; each but the last is
        followed by 2 x 2 max pooling (D, the annotation size, is the last).
    last_kernel: the side of the last convolution's kernel (odd; 3: the same as the others).
        It sets how far past its own cell an annotation sees: with the default channels a
        cell of 8 pixels sees a square of 38 (`receptive_field`) with 3 and of 22 with 1.
    embed_dim: m, the word embedding (also the deep output's width).
    hidden: n, the LSTM's width.
    attn_hidden: the additive score's tanh layer.
    dropout: before the deep output.
    doubly_stochastic: lambda of the regulariser (soft only; 0: off).
    attention_supervision: lambda_a of supervised attention (Liu et al. 2017, "strong
        supervision"; soft and hard; 0: off, the paper's model): the task adds lambda_a times
        the cross-entropy between each word's attention alpha_t and the ground-truth map of the
        region the word names (`attnzoo.tasks.captions.attention_supervision`), so training
        reads the regions that attention correctness scores: a model trained so is not
        unsupervised attention.
    entropy_weight: lambda_e of the entropy bonus (hard only).
    reinforce_weight: lambda_r of the REINFORCE terms (hard only).
    baseline_momentum: the moving-average baseline's momentum (hard only; the paper: 0.9).
    expectation_rate: hard only, in training: the probability, per image, that its caption
        attends by the expectation sum_i alpha_ti a_i instead of a sampled location (Xu 2015
        sec. 4.1: 0.5; 0: always sample).
    expectation_warmup: hard only: training steps over which that probability falls linearly
        from 1 (every caption by expectation: soft attention without beta) to
        `expectation_rate`; 0: `expectation_rate` from the first step (the paper).
    credit: hard only, one of CREDITS: what REINFORCE credits a sampled location with.
        "caption" (Xu 2015 eq. 12): every step gets the whole caption's log-likelihood minus
        a moving average of it (`baseline_momentum`). "to_go": step t gets the
        log-likelihood of the words from t on, minus that of the same words when the same
        image is read by expectation at every step (a second pass without gradient): a
        baseline per image and step, as self-critical sequence training (Rennie et al. 2017)
        takes its greedy caption's score. Neither baseline depends on the samples, so both
        estimates are unbiased (but for "caption"'s first step, whose baseline is its own
        batch's mean: a moving average of nothing would be 0, not a log-likelihood); "to_go"
        removes what the moving average cannot, the spread of log-likelihoods between
        captions of one to four digits.
    """

    variant: str = "soft"
    channels: tuple[int, ...] = CHANNELS
    last_kernel: int = 3
    embed_dim: int = 64
    hidden: int = 192
    attn_hidden: int = 64
    dropout: float = 0.1
    doubly_stochastic: float = 0.1
    attention_supervision: float = 0.0
    entropy_weight: float = 0.01
    reinforce_weight: float = 1.0
    baseline_momentum: float = 0.9
    expectation_rate: float = 0.5
    expectation_warmup: int = 0
    credit: str = "caption"

    def __post_init__(self):
        check_fields(self)
        if self.variant not in VARIANTS:
            fail("ShowAttendTellConfig", "variant", f"one of {list(VARIANTS)}", repr(self.variant))
        if self.credit not in CREDITS:
            fail("ShowAttendTellConfig", "credit", f"one of {list(CREDITS)}", repr(self.credit))
        _check_channels("ShowAttendTellConfig", self.channels)
        _check_kernel("ShowAttendTellConfig", self.last_kernel)
        for name in ("embed_dim", "hidden", "attn_hidden"):
            check_size("ShowAttendTellConfig", name, getattr(self, name))
        if not 0 <= self.dropout < 1:
            fail("ShowAttendTellConfig", "dropout", "a number in [0, 1)", self.dropout)
        for name in (
            "doubly_stochastic",
            "attention_supervision",
            "entropy_weight",
            "reinforce_weight",
        ):
            if not 0 <= getattr(self, name) < math.inf:
                fail("ShowAttendTellConfig", name, "a finite number >= 0", getattr(self, name))
        if not 0 <= self.expectation_rate <= 1:
            fail(
                "ShowAttendTellConfig",
                "expectation_rate",
                "a probability in [0, 1]",
                self.expectation_rate,
            )
        if self.expectation_warmup < 0:
            fail(
                "ShowAttendTellConfig",
                "expectation_warmup",
                "an int >= 0",
                self.expectation_warmup,
            )
        if not 0 <= self.baseline_momentum < 1:
            fail(
                "ShowAttendTellConfig",
                "baseline_momentum",
                "a number in [0, 1)",
                self.baseline_momentum,
            )
        reads = self.reads()
        for f in dataclasses.fields(self):  # a variant's options only on it: set elsewhere,
            if f.name not in reads and getattr(self, f.name) != f.default:  # ignored
                wanted = f"its default {f.default!r}: the {self.variant} variant does not read it"
                if f.name == "baseline_momentum" and self.variant == "hard":
                    wanted += f" with credit={self.credit!r}"
                fail("ShowAttendTellConfig", f.name, wanted, repr(getattr(self, f.name)))

    def reads(self) -> set[str]:
        """The fields this variant reads: every variant its sizes and dropout; soft the
        doubly stochastic weight; hard the policy-gradient options (the moving-average
        baseline only where a whole caption's reward is credited); both the attention
        supervision weight."""
        fields = {
            "variant", "channels", "last_kernel", "embed_dim", "hidden", "attn_hidden", "dropout"
        }  # fmt: skip
        if self.variant != "none":
            fields.add("attention_supervision")
        if self.variant == "soft":
            fields.add("doubly_stochastic")
        if self.variant == "hard":
            fields |= {"entropy_weight", "reinforce_weight", "credit"}
            fields |= {"expectation_rate", "expectation_warmup"}
            if self.credit == "caption":
                fields.add("baseline_momentum")
        return fields


def _check_channels(owner: str, channels) -> None:
    if not isinstance(channels, tuple | list) or not channels:
        fail(owner, "channels", "a non-empty tuple of ints", channels)
    for c in channels:
        check_size(owner, "channels", c)


def _check_kernel(owner: str, kernel) -> None:
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
        fail(owner, "last_kernel", "an odd int >= 1 (the map keeps its size)", repr(kernel))


def soft(**overrides) -> ShowAttendTellConfig:
    """Soft (deterministic) attention, CPU-sized."""
    return ShowAttendTellConfig(**{"variant": "soft", **overrides})


def hard(**overrides) -> ShowAttendTellConfig:
    """Hard (stochastic) attention, CPU-sized."""
    return ShowAttendTellConfig(**{"variant": "hard", **overrides})


def no_attention(**overrides) -> ShowAttendTellConfig:
    """The baseline without attention; unless `hidden` is given, its LSTM is widened to the
    soft model's parameter count (`matched_hidden`)."""
    config = ShowAttendTellConfig(**{"variant": "none", **overrides})
    if "hidden" not in overrides:
        config = replace(config, hidden=matched_hidden(replace(config, variant="soft")))
    return config


def parameter_count(config: ShowAttendTellConfig, vocab: int = 20) -> int:
    """Parameters of `ShowAttendTell(config, vocab)`, counted from the sizes (building a model
    to count it would draw from the global random generator, or pay ~7 s for the first meta
    build: a preset must do neither). Tested equal to the built model's count."""
    c = config
    d, n, m, a = c.channels[-1], c.hidden, c.embed_dim, c.attn_hidden
    count, previous = 0, 1  # the image channels are not known here: counted as 1, see below
    for out, side in zip(c.channels, kernel_sides(len(c.channels), c.last_kernel), strict=True):
        count += previous * out * side**2 + out
        previous = out
    count += 2 * (d * n + n)  # f_init,h and f_init,c
    count += vocab * m  # E
    if c.variant != "none":
        count += n * a + d * a + a  # W_h, W_a, w of the additive score
    if c.variant == "soft":
        count += n + 1  # f_beta
    count += 4 * n * (m + d) + 4 * n * n + 8 * n  # the LSTM cell
    count += n * m + m + d * m + m * vocab + vocab  # L_h, L_z, L_o
    return count


def matched_hidden(reference: ShowAttendTellConfig) -> int:
    """The LSTM width at which the no-attention model has the parameter count closest to
    `reference`'s (the vocabulary's and the image channels' parameters are the same on both
    sides: they do not depend on the width)."""
    target = parameter_count(reference)
    base = replace(reference, variant="none")
    hidden = reference.hidden  # the count grows with the width: walk up until it passes
    while parameter_count(replace(base, hidden=hidden)) < target:
        hidden += 1
    below = replace(base, hidden=max(1, hidden - 1))
    if abs(parameter_count(below) - target) < abs(
        parameter_count(replace(base, hidden=hidden)) - target
    ):
        return below.hidden
    return hidden


class Encoder(nn.Module):
    """The CNN: 3 x 3 convolutions with ReLU, 2 x 2 max pooling after each but the last (run
    before that block's ReLU, the same function: `image_baselines.pool_then_relu`); the last
    convolution's kernel is `last_kernel` x `last_kernel`.
    images (b, channels, H, W) -> annotations (b, L, D), L = h * w of the last map."""

    def __init__(self, in_channels: int, channels: tuple[int, ...], last_kernel: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
        sides = kernel_sides(len(channels), last_kernel)
        for k, (out, side) in enumerate(zip(channels, sides, strict=True)):
            layers.append(nn.Conv2d(in_channels, out, side, padding=side // 2))
            layers += [nn.ReLU()] if k == len(channels) - 1 else pool_then_relu()
            in_channels = out
        self.net = nn.Sequential(*layers)
        self.pools = len(channels) - 1

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        maps = self.net(images)  # (b, D, h, w)
        return maps.flatten(2).transpose(1, 2)  # (b, L, D)


def kernel_sides(convolutions: int, last_kernel: int = 3) -> list[int]:
    """The side of each of `Encoder`'s convolution kernels: 3, the last `last_kernel`."""
    return [3] * (convolutions - 1) + [last_kernel]


def receptive_field(convolutions: int, last_kernel: int = 3) -> int:
    """The side, in pixels, of the square of input an annotation of `Encoder` sees: a k x k
    convolution adds k - 1 steps of its map, a 2 x 2 pooling 1, and a step doubles with each
    pooling (the default 8 x 8 map of a 64 x 64 canvas: 38 pixels, for a cell of 8)."""
    side, step = 1, 1
    for k, kernel in enumerate(kernel_sides(convolutions, last_kernel)):
        side += (kernel - 1) * step
        if k < convolutions - 1:  # the pooling after it
            side += step
            step *= 2
    return side


@dataclass(frozen=True)
class EncoderConfig:
    """Attributes:
    channels: the encoder's convolutions, as `ShowAttendTellConfig.channels`.
    last_kernel: as `ShowAttendTellConfig.last_kernel`."""

    channels: tuple[int, ...] = CHANNELS
    last_kernel: int = 3

    def __post_init__(self):
        check_fields(self)
        _check_channels("EncoderConfig", self.channels)
        _check_kernel("EncoderConfig", self.last_kernel)


def encoder_classifier(**overrides) -> EncoderConfig:
    """The captioner's default encoder, as a classifier."""
    return EncoderConfig(**overrides)


class EncoderClassifier(nn.Module):
    """The captioner's CNN encoder as an image classifier ("image" interface): the largest
    value of each of its last map's channels (the map's size follows the image's), then a
    linear layer to the classes. Trained on `mnist`, its weights start a captioner's encoder
    (`train.init_from`: the same names, `encoder.`), as the paper starts its encoder from an
    ImageNet classifier; the captioner then trains them further, where the paper keeps its
    fixed."""

    def __init__(
        self, config: EncoderConfig, image_size: tuple[int, int], channels: int, classes: int
    ):
        super().__init__()
        check_size("EncoderClassifier", "channels", channels)
        check_size("EncoderClassifier", "classes", classes)
        self.image_size = image_size = check_image_size("EncoderClassifier", image_size)
        self.encoder = Encoder(channels, tuple(config.channels), config.last_kernel)
        if min(image_size) < 2**self.encoder.pools:
            wanted = f"sides of at least {2**self.encoder.pools}"
            fail("EncoderClassifier", "image_size", wanted, image_size)
        self.channels = channels
        self.head = nn.Linear(config.channels[-1], classes)

    def forward(self, images: torch.Tensor, **_sampling) -> ClassifierOutput:
        """images (batch, channels, H, W) -> log_probs (batch, classes); sampling options
        are ignored."""
        check_images("EncoderClassifier", images, self.channels, like=self)
        pooled = self.encoder(images).amax(1)  # (b, D)
        return ClassifierOutput(torch.log_softmax(at_least_float32(self.head(pooled)), -1))


@dataclass
class CaptionState:
    """One decoding step's state (the engine's `reorder` protocol)."""

    h: torch.Tensor  # (b, n)
    c: torch.Tensor  # (b, n)
    annotations: torch.Tensor  # (b, L, D)
    mean: torch.Tensor  # (b, D)
    keys: PreparedKey | None  # W_a a, once per image
    generator: torch.Generator | None
    weights: torch.Tensor | None = None  # (b, L) the last step's attention (one-hot if hard)
    expected: torch.Tensor | None = None  # (b,) bool: hard, this image attends by expectation

    @property
    def batch_size(self) -> int:
        return self.annotations.shape[0]

    def reorder(self, index: torch.Tensor) -> CaptionState:
        pick = lambda x: None if x is None else x.index_select(0, index)  # noqa: E731
        keys = None if self.keys is None else self.keys.index_select(index)
        return CaptionState(
            pick(self.h),
            pick(self.c),
            pick(self.annotations),
            pick(self.mean),
            keys,
            self.generator,
            pick(self.weights),
            pick(self.expected),
        )


@dataclass
class CaptionOutput:
    log_probs: torch.Tensor  # (b, t, V)
    penalty: torch.Tensor  # () the doubly stochastic term, summed over images (0 without)
    weights: torch.Tensor | None  # (b, t, L) alpha_t (hard: the distribution sampled from)
    grid: tuple[int, int]  # the feature map's (h, w): L = h * w
    log_pi: torch.Tensor | None = None  # (b, t) log alpha_{t, s_t} (hard)
    entropy: torch.Tensor | None = None  # (b, t) H(alpha_t) (hard)
    locations: torch.Tensor | None = None  # (b, t) s_t (hard)
    expected: torch.Tensor | None = None  # (b,) bool: hard, attended by expectation (no s_t)


class ShowAttendTell(nn.Module):
    """Show, Attend and Tell ("caption" interface, `attnzoo.tasks.captions`).

    Args:
        config: `ShowAttendTellConfig`.
        vocab: words, id 0 the padding.
        max_len: unused (the decoder has no length limit).
        image_size: (H, W), each divisible by 2^(pools).
        channels: image channels.
    """

    def __init__(
        self,
        config: ShowAttendTellConfig,
        vocab: int,
        max_len: int | None = None,
        image_size: tuple[int, int] = (64, 64),
        channels: int = 1,
    ):
        super().__init__()
        c = self.config = config
        check_size("ShowAttendTell", "vocab", vocab)
        check_size("ShowAttendTell", "max_len", max_len, optional=True)
        check_size("ShowAttendTell", "channels", channels)
        self.encoder = Encoder(channels, tuple(c.channels), c.last_kernel)
        scale = 2**self.encoder.pools
        image_size = check_image_size("ShowAttendTell", image_size)
        if any(s % scale for s in image_size):
            fail("ShowAttendTell", "image_size", f"sides divisible by {scale}", image_size)
        self.image_size = image_size
        self.grid = (image_size[0] // scale, image_size[1] // scale)
        d = c.channels[-1]
        self.init_h = nn.Sequential(nn.Linear(d, c.hidden), nn.Tanh())  # f_init,h
        self.init_c = nn.Sequential(nn.Linear(d, c.hidden), nn.Tanh())  # f_init,c
        self.embed = nn.Embedding(vocab, c.embed_dim, padding_idx=0)  # E
        self.attends = c.variant != "none"
        if self.attends:
            self.score = Additive(c.hidden, d, c.attn_hidden)  # f_att
        if c.variant == "soft":
            self.beta = nn.Linear(c.hidden, 1)  # f_beta
        self.cell = nn.LSTMCell(c.embed_dim + d, c.hidden)
        self.drop = nn.Dropout(c.dropout)
        self.out_h = nn.Linear(c.hidden, c.embed_dim)  # L_h
        self.out_z = nn.Linear(d, c.embed_dim, bias=False)  # L_z
        self.out = nn.Linear(c.embed_dim, vocab)  # L_o
        if c.variant == "hard" and c.credit == "caption":
            self.reward_baseline = MovingAverageBaseline(c.baseline_momentum)

    # ----- encoder and start -----
    def start(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        expectation: bool = False,
    ):
        """images (b, channels, H, W) -> the decoder's first state. `expectation` (hard
        attention only): every step of every image attends by the expectation
        sum_i alpha_ti a_i instead of a sampled cell, as the authors' released caption
        generator does for hard models by default (arctic-captions, `generate_caps.py`
        without `-sampling`)."""
        self._check_images(images)
        return self._start(images, generator, expectation)

    def _check_images(self, images: torch.Tensor) -> None:
        check_images(
            "ShowAttendTell", images, self.encoder.net[0].in_channels, self.image_size, like=self
        )

    def _start(self, images: torch.Tensor, generator, expectation: bool):
        """`start` after its image check."""
        if expectation and self.config.variant != "hard":
            fail("ShowAttendTell.start", "expectation", "False for a model without hard "
                 "attention", f"True with variant {self.config.variant!r}")  # fmt: skip
        a = self.encoder(images)  # (b, L, D)
        mean = a.mean(1)  # (b, D)
        keys = prepare_key(self.score, a, value=a) if self.attends else None
        state = CaptionState(self.init_h(mean), self.init_c(mean), a, mean, keys, generator)
        if expectation:
            state.expected = torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
        return state

    # ----- one step -----
    def _attend(self, state: CaptionState, sample: bool):
        """z_t from h_{t-1}: (z (b, D), alpha (b, L) or None, log_pi, entropy, location)."""
        if not self.attends:
            return state.mean, None, None, None, None
        query = state.h.unsqueeze(1)  # (b, 1, n)
        if self.config.variant == "soft":
            out = attention(
                query, state.keys, state.keys.value, score=self.score, return_weights=True
            )
            beta = torch.sigmoid(self.beta(state.h))  # (b, 1)
            return beta * out.context.squeeze(1), out.weights.squeeze(1), None, None, None
        logits = self.score.logits(query, state.keys.tensor).squeeze(1)  # (b, L)
        log_alpha = torch.log_softmax(logits, -1)  # (b, L)
        alpha = log_alpha.exp()
        entropy = -(alpha * log_alpha).sum(-1)  # (b,)
        if sample:
            choice = sample_hard(logits, generator=state.generator)
            index, log_pi = choice.index, choice.log_prob  # (b,), (b,)
        else:  # the mode (used only when asked: evaluation samples too)
            index = log_alpha.argmax(-1)
            log_pi = log_alpha.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        z = state.annotations[torch.arange(len(index), device=index.device), index]  # (b, D)
        if state.expected is not None:  # these images use sum_i alpha_i a_i instead
            mean = torch.bmm(alpha.unsqueeze(1), state.annotations).squeeze(1)  # (b, D)
            z = torch.where(state.expected.unsqueeze(-1), mean, z)
        return z, alpha, log_pi, entropy, index

    def _step(self, y_prev: torch.Tensor, state: CaptionState, sample: bool):
        """y_{t-1} ids (b,) -> (logits (b, V), new state, alpha, log_pi, entropy, location)."""
        z, alpha, log_pi, entropy, location = self._attend(state, sample)
        e = self.embed(y_prev)  # (b, m)
        h, c = self.cell(torch.cat([e, z], -1), (state.h, state.c))  # (b, n) each
        deep = e + self.out_h(self.drop(h)) + self.out_z(z)  # (b, m), eq. 7
        logits = self.out(deep)  # (b, V)
        shown = alpha
        if location is not None:  # hard: what the step looked at is the sampled cell
            shown = F.one_hot(location, alpha.shape[-1]).to(alpha.dtype)
        new = replace(state, h=h, c=c, weights=shown)
        return logits, new, alpha, log_pi, entropy, location

    # ----- training: teacher forcing -----
    def forward(
        self,
        images: torch.Tensor,
        tokens_in: torch.Tensor,
        lengths: torch.Tensor,
        *,
        sample: bool = True,
        generator: torch.Generator | None = None,
        step: int | None = None,
        expectation: bool = False,
    ) -> CaptionOutput:
        """Teacher forcing. images (b, C, H, W); tokens_in (b, t) <bos> + words, padded;
        lengths (b,) real steps (words + <end>). Returns `CaptionOutput`; `penalty` is the
        doubly stochastic term lambda * sum_b sum_i (1 - sum_{t < length_b} alpha_bti)^2.
        A hard model in training mode draws, from `generator`, which images attend by
        expectation (`expectation_rate_at(step)`; `CaptionOutput.expected`); with
        `expectation` every image does (as `start`'s)."""
        self._check_images(images)
        vocab, batch = self.embed.num_embeddings, (images.shape[0], "'images'")
        check_tokens(
            *("ShowAttendTell", "tokens_in", tokens_in, 2, "(batch, steps)", vocab), batch=batch
        )
        steps = tokens_in.shape[1]
        # the real steps of each caption (words + <end>): the doubly stochastic term's rows
        check_integers(
            *("ShowAttendTell", "lengths", lengths, batch[:1], 1, steps),
            values=f"values in 1..steps = {steps}",
            shape_note=", one per caption",
        )
        state = self._start(images, generator, expectation)  # (images checked above)
        rate = self.expectation_rate_at(step)
        if self.config.variant == "hard" and sample and self.training and rate and not expectation:
            draw = torch.rand(images.shape[0], generator=generator, device=images.device)
            state.expected = draw < rate  # (b,)
        logits, alphas, log_pis, entropies, locations = [], [], [], [], []
        for y_prev in tokens_in.unbind(1):
            out, state, alpha, log_pi, entropy, location = self._step(y_prev, state, sample)
            logits.append(out)
            alphas.append(alpha)
            log_pis.append(log_pi)
            entropies.append(entropy)
            locations.append(location)
        log_probs = torch.log_softmax(at_least_float32(torch.stack(logits, 1)), -1)  # (b, t, V)
        zero = log_probs.new_zeros(())
        if not self.attends:
            return CaptionOutput(log_probs, zero, None, self.grid)
        weights = torch.stack(alphas, 1)  # (b, t, L)
        real = torch.arange(steps, device=weights.device) < lengths.to(weights.device)[:, None]
        penalty = zero
        if self.config.variant == "soft" and self.config.doubly_stochastic:
            penalty = doubly_stochastic(weights, real, self.config.doubly_stochastic)
        if self.config.variant == "soft":
            return CaptionOutput(log_probs, penalty, weights, self.grid)
        return CaptionOutput(
            log_probs,
            penalty,
            weights,
            self.grid,
            torch.stack(log_pis, 1),
            torch.stack(entropies, 1),
            torch.stack(locations, 1),
            state.expected,
        )

    def expectation_rate_at(self, step: int | None) -> float:
        """The chance that an image attends by expectation at training step `step`: 1 falling
        linearly to `expectation_rate` over `expectation_warmup` steps, then that rate (also
        when `step` is None)."""
        c = self.config
        if step is None or step >= c.expectation_warmup:
            return c.expectation_rate
        return 1 - (1 - c.expectation_rate) * step / c.expectation_warmup

    # ----- decoding engine -----
    def decode_step(self, tokens: torch.Tensor, state: CaptionState):
        """tokens (b,) -> log-probabilities (b, V), new state (whose `weights` are this step's
        attention). Hard attention samples its location from the state's generator."""
        logits, state, *_ = self._step(tokens, state, sample=True)
        return torch.log_softmax(at_least_float32(logits), -1), state


def doubly_stochastic(weights: torch.Tensor, real: torch.Tensor, lam: float) -> torch.Tensor:
    """lambda * sum_b sum_i (1 - sum_t alpha_bti)^2 over the real steps (Xu 2015 eq. 14):
    weights (b, t, L), real (b, t) bool -> a scalar. Padding steps add nothing to sum_t."""
    attended = (weights * real.unsqueeze(-1)).sum(1)  # (b, L)
    return lam * (1 - attended).pow(2).sum()
