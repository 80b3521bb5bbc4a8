"""`glyphs`: few-shot classification of characters rendered from installed fonts, an offline
stand-in for Omniglot (Lake et al. 2015) as SNAIL (Mishra et al. 2017, sec. 5.1) uses it.

Classes and scripts. A class is one Unicode character that the fonts matplotlib ships (its
DejaVu Sans, Serif and Sans Mono faces and STIX General, each in four styles) can draw: letters
(Unicode category L) grouped by their Unicode script (Latin, Greek, Cyrillic, Arabic, Canadian
syllabics, ...), and symbols (categories So, Sm) grouped by their Unicode block (Braille,
arrows, dingbats, Yijing hexagrams, ...), which stand in for Omniglot's invented alphabets.
Characters that look alike once drawn are one class: every candidate is drawn at 28 x 28, fitted
to the box, in its first face and in every other face that covers it, and a candidate within
`GlyphsConfig.min_distance` (root mean square over the pixels) of a kept one, in their first
faces or in any face that draws both, is dropped, background scripts first, so an evaluation
class never repeats a background class in any face its instances are drawn in (Latin A, Greek
Alpha and Cyrillic A are one class, in the background). A group with fewer than `min_classes`
kept classes is dropped.
`inventory(config)` gives the classes; `inventory(config).counts()` the counts per script.

Split. As Omniglot splits its 50 alphabets into 30 background and 20 evaluation ones, whole
scripts are held out: `GlyphsConfig.test_scripts` are the evaluation set, every other script
the background set. Training episodes draw from the background classes; the test split's
episodes from the evaluation classes; the valid split's from the background classes with
fresh instances (it measures fit, not transfer).

Instances. Each instance of a class is its character in a random face among those that cover
it, with a random stroke width (a blend towards a 3 x 3 dilation or erosion), a random affine
map (rotation, scale, shear, shift) and a random elastic warp (a smooth displacement field),
drawn at 56 x 56 and sampled to 28 x 28 by `torch.nn.functional.grid_sample`, batched. Glyph
renders are cached per process.

Episodes. An N-way K-shot episode draws N classes, K support instances of each (shuffled) with
labels 0..N-1 in a random order, and `queries` query instances whose classes are uniform over
the N. Training episodes come from a generator seeded by the run's seed and the step; held-out
episodes in chunks of `EVAL_CHUNK`, one after another from the split's stream of
`GlyphsConfig.seed` (`base.held_out_generator`, where no training batch draws), so the first n
episodes are the same whatever the limit.

"fewshot" interface (`attnzoo.models.registry`): a model is built with `(config, image_size,
channels, ways, shots)` and called as `model(support (batch, ways * shots, channels, H, W),
support_labels (batch, ways * shots), query (batch, queries, channels, H, W))` -> an output
with `log_probs` (batch, queries, ways) and `attention`: a list of named weights
`(name, (batch, queries, heads, rows, columns))` for the explorer ([] without attention). The
query labels are never given to the model. The loss is the summed cross-entropy of the
queries.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    held_out_generator,
    model_device,
    require,
    training_generator,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.batch_size", "eval.beam_size", "eval.label_smoothing")
SIDE = 28  # the side of an instance, Omniglot's side as the few-shot papers resize it
CANVAS = 2 * SIDE  # the side glyphs are drawn at before the warp
FIT = 44  # the side of the box a glyph is fitted into on the canvas
FONT_SIZE = 40  # points: the size a glyph is rendered at before fitting
EVAL_CHUNK = 50  # held-out episodes are generated in chunks of this many
# the faces matplotlib ships (mpl-data/fonts/ttf); a class is drawn in those that cover it
FACES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)
SKIPPED_SCRIPTS = ("Common", "Inherited", "Unknown")  # letters shared by scripts (math letters)
# The evaluation scripts: a third of the groups, letters and symbols, chosen once by hand to
# mix shapes (as Omniglot's evaluation alphabets mix them) and fixed here.
TEST_SCRIPTS = (
    "Armenian",
    "Georgian",
    "Hebrew",
    "Lao",
    "Nko",
    "Ogham",
    "Tifinagh",
    "Braille Patterns",
    "Dingbats",
    "Domino Tiles",
    "Miscellaneous Technical",
    "Supplemental Arrows-B",
    "Tai Xuan Jing Symbols",
)


@dataclass(frozen=True)
class GlyphsConfig:
    """Attributes:
    ways: N, classes per episode.
    shots: K, labelled instances per class.
    queries: query instances per training episode: each a loss term, scored as if alone
        after the support. A SNAIL step shares its pass over the support among them, so
        several cost far less than as many episodes (docs/snail.md measures 5 against 1).
    eval_queries: query instances per held-out episode.
    test_episodes: held-out episodes of the test split (and of valid); eval.limit may score
        fewer.
    test_scripts: the evaluation scripts (names as `inventory(...).counts()` gives them).
    min_distance: characters closer than this (RMS over 28 x 28 pixels in [0, 1]) are one
        class.
    min_classes: a script with fewer kept classes is dropped.
    rotation: degrees, the largest rotation of an instance.
    scale: the largest relative change of size (each axis within 1 +/- scale... see `warp`).
    shear: the largest shear.
    shift: the largest shift, as a fraction of the side.
    elastic: the size of the elastic displacement, as a fraction of the side.
    stroke: the largest blend towards a 3 x 3 dilation (thicker) or erosion (thinner).
    seed: draws the held-out episodes (training episodes use the run's seed).
    """

    HELD_OUT = ("eval_queries", "test_episodes")  # only scoring reads them (attnzoo eval --set)

    ways: int = 5
    shots: int = 1
    queries: int = 5
    eval_queries: int = 5
    test_episodes: int = 1000
    test_scripts: tuple[str, ...] = TEST_SCRIPTS
    min_distance: float = 0.12
    min_classes: int = 10
    rotation: float = 10.0
    scale: float = 0.15
    shear: float = 0.15
    shift: float = 0.08
    elastic: float = 0.02
    stroke: float = 0.7
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts(
            "GlyphsConfig",
            self,
            positive=("ways", "shots", "queries", "eval_queries", "test_episodes", "min_classes"),
            non_negative=("seed",),
        )
        if self.ways < 2:
            fail("GlyphsConfig", "ways", "an int >= 2", repr(self.ways))
        if (
            not isinstance(self.test_scripts, tuple | list)
            or not self.test_scripts  # no evaluation set: here, not after the font inventory
            or not all(isinstance(s, str) for s in self.test_scripts)
        ):
            wanted = "a non-empty tuple of script names"
            fail("GlyphsConfig", "test_scripts", wanted, repr(self.test_scripts))
        limits = (
            ("min_distance", 0, 1),
            ("rotation", 0, 180),
            ("scale", 0, 0.9),
            ("shear", 0, 1),
            ("shift", 0, 0.5),
            ("elastic", 0, 0.5),
            ("stroke", 0, 1),
        )
        for name, low, high in limits:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not low <= value <= high
            ):
                fail("GlyphsConfig", name, f"a number in [{low}, {high}]", repr(value))


# 1. Fonts and classes -------------------------------------------------------------------------


def font_dir() -> Path:
    """matplotlib's own font folder (the fonts travel with the package)."""
    matplotlib = require("matplotlib")
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@lru_cache(maxsize=1)
def coverage() -> Mapping[int, tuple[int, ...]]:
    """Code point -> the indices in FACES of the faces whose character map has it (read-only:
    it is shared by every caller in the process)."""
    ttlib = require("fontTools.ttLib")
    found: dict[int, list[int]] = {}
    for index, face in enumerate(FACES):
        for point in ttlib.TTFont(font_dir() / face, lazy=True).getBestCmap():
            found.setdefault(point, []).append(index)
    return MappingProxyType({p: tuple(f) for p, f in found.items()})


def group_of(point: int) -> str | None:
    """The script a character belongs to here: its Unicode script (letters), its Unicode block
    (symbols), or None (anything else: digits, punctuation, marks, shared letters)."""
    import unicodedata

    from fontTools import unicodedata as ucd

    char = chr(point)
    category = unicodedata.category(char)
    if category.startswith("L"):
        script = ucd.script_name(ucd.script(char))
        return None if script in SKIPPED_SCRIPTS else script
    if category in ("So", "Sm"):
        return ucd.block(char)
    return None


@cache
def _font(face: int, size: int):
    image_font = require("PIL.ImageFont")
    return image_font.truetype(str(font_dir() / FACES[face]), size)


def render(point: int, face: int) -> torch.Tensor:
    """The character in FACES[face], fitted (aspect kept) into a FIT box at the centre of a
    CANVAS x CANVAS canvas: uint8 (CANVAS, CANVAS), ink 255; the caller's own copy of the
    drawing, which is cached per process."""
    return _render(point, face).clone()


@cache
def _render(point: int, face: int) -> torch.Tensor:
    """`render` without the copy, for callers here that stack the drawings at once (a copy)."""
    image = require("PIL.Image")
    draw = require("PIL.ImageDraw")
    font = _font(face, FONT_SIZE)
    char = chr(point)
    left, top, right, bottom = font.getbbox(char)
    width, height = max(1, right - left), max(1, bottom - top)
    picture = image.new("L", (width, height))
    draw.Draw(picture).text((-left, -top), char, font=font, fill=255)
    glyph = torch.frombuffer(bytearray(picture.tobytes()), dtype=torch.uint8)
    glyph = glyph.view(height, width).float()  # (h, w)
    factor = FIT / max(width, height)
    size = (max(1, round(height * factor)), max(1, round(width * factor)))
    glyph = F.interpolate(glyph[None, None], size=size, mode="bilinear", antialias=True)[0, 0]
    glyph = glyph.clamp_(0, 255).round_().to(torch.uint8)
    top_row, left_col = (CANVAS - size[0]) // 2, (CANVAS - size[1]) // 2
    right_col, bottom_row = CANVAS - left_col - size[1], CANVAS - top_row - size[0]
    return F.pad(glyph, (left_col, right_col, top_row, bottom_row))  # on a blank canvas


class Inventory(NamedTuple):
    points: tuple[int, ...]  # the class's character
    scripts: tuple[str, ...]  # its script
    faces: tuple[tuple[int, ...], ...]  # the faces that cover it
    background: tuple[int, ...]  # class indices of the background (training) scripts
    evaluation: tuple[int, ...]  # class indices of the evaluation (test) scripts

    def counts(self) -> dict[str, dict[str, int]]:
        """{"background" | "evaluation": {script: classes}}."""
        out: dict[str, dict[str, int]] = {"background": {}, "evaluation": {}}
        for split, members in (("background", self.background), ("evaluation", self.evaluation)):
            for c in members:
                out[split][self.scripts[c]] = out[split].get(self.scripts[c], 0) + 1
        return out


@lru_cache(maxsize=4)
def inventory(test_scripts: tuple[str, ...], min_distance: float, min_classes: int) -> Inventory:
    """The classes (module docstring): candidates compared in their first faces and in every face
    that draws two of them, look-alikes dropped (background scripts first), small scripts
    dropped."""
    cover = coverage()
    candidates = [(p, g) for p in sorted(cover) if (g := group_of(p)) is not None]
    held_out = set(test_scripts)
    # 1. background scripts first, so that a look-alike is dropped from the evaluation set
    candidates.sort(key=lambda pg: (pg[1] in held_out, pg[1], pg[0]))
    # 2. which candidates look alike: at 28 x 28 in their first faces (characters of different
    # faces), and in each face among the candidates it covers (instances are drawn in every
    # face: U+2300 and U+2205 are one drawing in DejaVu Sans Mono, not in their first faces)
    first = _small([(p, cover[p][0]) for p, _ in candidates])
    inked = first.sum(-1) > 4.0  # a glyph with next to no ink (a space-like mark) is no class
    close = _close(first, min_distance)  # (n, n) bool
    for face in range(len(FACES)):
        members = torch.tensor([i for i, (p, _) in enumerate(candidates) if face in cover[p]])
        if len(members) > 1:
            drawn = _small([(candidates[i][0], face) for i in members.tolist()])
            rows, cols = members[:, None], members[None]
            close[rows, cols] |= _close(drawn, min_distance)
    # 3. greedy: keep a candidate unless it is within min_distance of a kept earlier one
    close, keep = close.numpy(), inked.numpy().copy()
    for i in range(len(candidates)):
        if keep[i] and (close[i, :i] & keep[:i]).any():
            keep[i] = False
    kept = [i for i in range(len(candidates)) if keep[i]]
    # 4. scripts with too few classes are dropped
    sizes: dict[str, int] = {}
    for i in kept:
        sizes[candidates[i][1]] = sizes.get(candidates[i][1], 0) + 1
    kept = [i for i in kept if sizes[candidates[i][1]] >= min_classes]
    points = tuple(candidates[i][0] for i in kept)
    scripts = tuple(candidates[i][1] for i in kept)
    background = tuple(c for c, s in enumerate(scripts) if s not in held_out)
    evaluation = tuple(c for c, s in enumerate(scripts) if s in held_out)
    return Inventory(points, scripts, tuple(cover[p] for p in points), background, evaluation)


def _small(drawings: list[tuple[int, int]]) -> torch.Tensor:
    """(point, face) pairs -> their drawings at 28 x 28 in [0, 1], flattened: (n, SIDE SIDE)."""
    images = torch.stack([_render(p, f) for p, f in drawings]).float() / 255
    return F.avg_pool2d(images.unsqueeze(1), 2).flatten(1)


def _close(small: torch.Tensor, min_distance: float) -> torch.Tensor:
    """(n, n) bool: whether two drawings (`_small`) are within `min_distance` (RMS)."""
    squared = (small * small).sum(-1)  # (n,)
    limit = min_distance**2 * small.shape[1]
    return torch.cat(
        [
            squared[i : i + 512, None] - 2 * small[i : i + 512] @ small.T + squared[None] < limit
            for i in range(0, len(small), 512)
        ]
    )


# 2. Instances ---------------------------------------------------------------------------------


def warp(config: GlyphsConfig, glyphs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Canvases (n, CANVAS, CANVAS) uint8 -> instances (n, 1, SIDE, SIDE) in [0, 1]:
    1. stroke: a blend of weight t ~ U(-stroke, stroke) towards the 3 x 3 dilation (t > 0) or
       erosion (t < 0);
    2. an affine map: rotation, per-axis scale 1 + U(-scale, scale), shear, shift;
    3. an elastic displacement: 4 x 4 Gaussian offsets of size `elastic`, upsampled bicubically;
    4. sampled on the SIDE x SIDE grid (bilinear: each output pixel averages 2 x 2 canvas
       pixels when the map is the identity)."""
    n = glyphs.shape[0]
    x = glyphs.float().unsqueeze(1) / 255  # (n, 1, C, C)

    def uniform(*shape, bound):
        return (torch.rand(*shape, generator=generator) * 2 - 1) * bound

    # 1. stroke width
    t = uniform(n, 1, 1, 1, bound=config.stroke)
    up = t > 0
    # one pool: the dilation of the canvases that thicken, minus the erosion of the others
    pooled = F.max_pool2d(torch.where(up, x, -x), 3, 1, 1)  # (n, 1, C, C)
    x = torch.where(up, x + t * (pooled - x), x - t * (-pooled - x))
    # 2. the affine map (output -> input coordinates, in [-1, 1])
    angle = uniform(n, bound=math.radians(config.rotation))
    scale = 1 + uniform(n, 2, bound=config.scale)  # (n, 2)
    shear = uniform(n, bound=config.shear)
    shift = uniform(n, 2, bound=2 * config.shift)  # (n, 2): the side spans 2
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotate = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    sheared = torch.eye(2).repeat(n, 1, 1)  # (n, 2, 2)
    sheared[:, 0, 1] = shear
    linear = rotate @ sheared / scale.unsqueeze(-1)  # (n, 2, 2)
    theta = torch.cat([linear, shift.unsqueeze(-1)], -1)  # (n, 2, 3)
    grid = F.affine_grid(theta, [n, 1, SIDE, SIDE], align_corners=False)  # (n, S, S, 2)
    # 3. the elastic displacement
    coarse = torch.randn(n, 2, 4, 4, generator=generator) * (2 * config.elastic)
    field = F.interpolate(coarse, size=(SIDE, SIDE), mode="bicubic", align_corners=True)
    grid = grid + field.permute(0, 2, 3, 1)  # (n, S, S, 2)
    # 4. sample
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.clamp(0, 1)  # (n, 1, S, S)


def draw(
    config: GlyphsConfig, inv: Inventory, classes: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Instances of `classes` (n,) (indices into `inv`): (n, 1, SIDE, SIDE), each in a random
    face among those covering its character."""
    picks = torch.rand(len(classes), generator=generator)  # (n,)
    glyphs = []
    for c, u in zip(classes.tolist(), picks.tolist(), strict=True):
        faces = inv.faces[c]
        glyphs.append(_render(inv.points[c], faces[min(len(faces) - 1, int(u * len(faces)))]))
    return warp(config, torch.stack(glyphs), generator)


class EpisodeBatch(NamedTuple):
    support: torch.Tensor  # (batch, ways * shots, 1, SIDE, SIDE)
    support_labels: torch.Tensor  # (batch, ways * shots) in [0, ways)
    query: torch.Tensor  # (batch, queries, 1, SIDE, SIDE)
    query_labels: torch.Tensor  # (batch, queries): never given to the model
    classes: torch.Tensor  # (batch, ways) the inventory's class of each label
    step: int
    items: int  # queries in the batch, counted on the CPU


def episodes(
    config: GlyphsConfig,
    inv: Inventory,
    pool: tuple[int, ...],
    count: int,
    queries: int,
    generator: torch.Generator,
) -> EpisodeBatch:
    """`count` N-way K-shot episodes over the classes `pool` (on the CPU)."""
    ways, shots = config.ways, config.shots
    if len(pool) < ways:
        fail("GlyphsConfig", "ways", f"at most the {len(pool)} classes of the split", ways)
    # 1. N classes per episode; their order is the labels'
    order = torch.rand(count, len(pool), generator=generator).argsort(-1)[:, :ways]  # (b, N)
    classes = torch.tensor(pool)[order]  # (b, N)
    # 2. K support instances per label, shuffled; `queries` query labels uniform over N
    labels = torch.arange(ways).repeat_interleave(shots).expand(count, -1)  # (b, N K)
    shuffle = torch.rand(count, ways * shots, generator=generator).argsort(-1)  # (b, N K)
    support_labels = labels.gather(1, shuffle)  # (b, N K)
    query_labels = torch.randint(ways, (count, queries), generator=generator)  # (b, q)
    wanted = torch.cat([support_labels, query_labels], 1)  # (b, N K + q)
    images = draw(config, inv, classes.gather(1, wanted).flatten(), generator)
    images = images.view(count, ways * shots + queries, 1, SIDE, SIDE)
    support, query = images.split([ways * shots, queries], 1)
    return EpisodeBatch(support, support_labels, query, query_labels, classes, 0, count * queries)


def _to(batch: EpisodeBatch, device, step: int) -> EpisodeBatch:
    move = {"device": device, "non_blocking": True}
    return batch._replace(
        support=batch.support.to(**move),
        support_labels=batch.support_labels.to(**move),
        query=batch.query.to(**move),
        query_labels=batch.query_labels.to(**move),
        classes=batch.classes.to(**move),
        step=step,
    )


# 3. The task ----------------------------------------------------------------------------------


class GlyphsTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over N-way K-shot glyph episodes."""

    def __init__(self, config: GlyphsConfig, *, seed: int = 0, eval_config: EvalConfig | None):
        self.config, self.seed = config, seed
        self.eval_config = eval_config or EvalConfig()
        self._chunks: dict[tuple[str, int], EpisodeBatch] = {}  # `held_out`'s, drawn once
        self._streams: dict[str, torch.Generator] = {}  # per split, the chunks' draws in order
        named = {group_of(p) for p in coverage()} - {None}
        if not set(config.test_scripts) <= named:  # before the classes are drawn
            fail(
                "GlyphsConfig",
                "test_scripts",
                f"scripts among {sorted(named)}",
                repr(tuple(config.test_scripts)),
            )
        self.inventory = inventory(
            tuple(config.test_scripts), float(config.min_distance), config.min_classes
        )
        known = set(self.inventory.scripts)
        unknown = [s for s in config.test_scripts if s not in known]
        if unknown or not self.inventory.evaluation:
            fail(
                "GlyphsConfig",
                "test_scripts",
                f"scripts among {sorted(known)}",
                repr(tuple(config.test_scripts)),
            )

    def model_dims(self) -> dict:
        return {
            "image_size": (SIDE, SIDE),
            "channels": 1,
            "ways": self.config.ways,
            "shots": self.config.shots,
        }

    # ----- training -----
    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> EpisodeBatch:
        """`batch_size` episodes of the background classes (this process's share), drawn on
        the CPU, then moved to `device`."""
        g = training_generator(self.seed, step)
        whole = episodes(
            self.config, self.inventory, self.inventory.background, batch_size,
            self.config.queries, g,
        )  # fmt: skip
        mine = EpisodeBatch(*(t[rank::world] for t in whole[:5]), 0, 0)
        return _to(mine._replace(items=mine.query_labels.numel()), device, step)

    @staticmethod
    def predict(model: torch.nn.Module, batch: EpisodeBatch, return_weights: bool = False):
        """The model's output on the episodes: the query labels are not passed."""
        return model(batch.support, batch.support_labels, batch.query, return_weights)

    def loss(self, model: torch.nn.Module, batch: EpisodeBatch) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy of the queries."""
        log_probs = self.predict(model, batch).log_probs  # (b, q, N)
        nll = -log_probs.gather(-1, batch.query_labels.unsqueeze(-1)).sum()
        return nll, batch.items

    # ----- evaluation -----
    def held_out(self, split: str, count: int) -> list[EpisodeBatch]:
        """The first `count` episodes of `split` in chunks of EVAL_CHUNK (on the CPU), drawn
        one after another from the split's `held_out_generator` stream, where no training batch
        draws (a seed made here by hand, (seed * 7919 + 1) * 100_003 + k, was the one of
        training step 100_003 at run seed 0: the valid split's first chunk was that batch).
        Each chunk is drawn once per task (warping its images was ~a sixth of an evaluation)."""
        pool = self.inventory.evaluation if split == "test" else self.inventory.background
        chunks = []
        for k in range(math.ceil(count / EVAL_CHUNK)):
            if (split, k) not in self._chunks:  # chunks 0 .. k - 1 are drawn: the stream is at k
                if split not in self._streams:
                    self._streams[split] = held_out_generator(self.config.seed, split)
                g = self._streams[split]
                self._chunks[split, k] = episodes(
                    self.config, self.inventory, pool, EVAL_CHUNK, self.config.eval_queries, g
                )
            whole = self._chunks[split, k]
            size = min(EVAL_CHUNK, count - k * EVAL_CHUNK)  # a chunk is drawn whole, then cut
            chunks.append(  # copies: a caller's change in place never reaches the next call
                EpisodeBatch(*(t[:size].clone() for t in whole[:5]), 0, size * whole.query.shape[1])
            )
        return chunks

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Accuracy (%) over the split's episodes (`test_episodes`, or `eval.limit` of them),
        each episode's accuracy the mean over its `eval_queries` queries; `ci95`: 1.96 times
        the standard error of the mean over episodes (the few-shot papers' interval).
        `eval.batch_size` is unused (episodes go in chunks of EVAL_CHUNK)."""
        split = self.eval_config.split
        count = self.eval_config.scored(self.config.test_episodes)
        device = model_device(model)
        per_episode = []
        for chunk in self.held_out(split, count):
            chunk = _to(chunk, device, 0)
            log_probs = self.predict(model, chunk).log_probs  # (b, q, N)
            right = (log_probs.argmax(-1) == chunk.query_labels).float().mean(-1)  # (b,)
            per_episode.append(right.cpu())
        acc = torch.cat(per_episode).double()  # (episodes,)
        n = len(acc)
        spread = float(acc.std()) if n > 1 else 0.0
        inv = self.inventory
        return {
            "accuracy": 100 * float(acc.mean()),
            "ci95": 100 * 1.96 * spread / math.sqrt(n),
            "n": n,
            "queries_per_episode": self.config.eval_queries,
            "ways": self.config.ways,
            "shots": self.config.shots,
            "classes_background": len(inv.background),
            "classes_evaluation": len(inv.evaluation),
            "scripts_background": len({inv.scripts[c] for c in inv.background}),
            "scripts_evaluation": len({inv.scripts[c] for c in inv.evaluation}),
        }

    # ----- pictures -----
    def _describe(self, batch: EpisodeBatch, k: int) -> list[str]:
        """Names of episode k's labels: the script and the character's code point."""
        inv = self.inventory
        return [f"{inv.scripts[c]} U+{inv.points[c]:04X}" for c in batch.classes[k].tolist()]

    @torch.no_grad()
    def explore(self, model: torch.nn.Module, count: int) -> dict:
        """The explorer's data (layout "tokens"): `count` test episodes (at most EVAL_CHUNK),
        one query each; the rows and columns are the sequence's positions (support, then the
        query), each attention block a layer."""
        chunk = self.held_out("test", min(count, EVAL_CHUNK))[0]
        chunk = chunk._replace(query=chunk.query[:, :1], query_labels=chunk.query_labels[:, :1])
        out = self.predict(model, _to(chunk, model_device(model), 0), return_weights=True)
        examples = []
        for k in range(min(count, len(chunk.support))):
            names = self._describe(chunk, k)
            support = [f"{i + 1}: label {int(y)}" for i, y in enumerate(chunk.support_labels[k])]
            predicted = int(out.log_probs[k, 0].argmax())
            truth = int(chunk.query_labels[k, 0])
            kinds = []
            for name, weights in out.attention:
                w = weights[k, 0].float().cpu()  # (heads, rows, columns)
                positions = [*support, "query"]
                rows = positions if w.shape[-2] == len(positions) else ["query"]
                columns = positions[: w.shape[-1]]
                if w.shape[-1] != len(positions):  # over the classes (prototypes)
                    columns = [f"label {j}" for j in range(w.shape[-1])]
                kinds.append({"name": name, "rows": rows, "columns": columns, "weights": w[None]})
            examples.append(
                {
                    "input": f"{self.config.ways}-way {self.config.shots}-shot: "
                    + "; ".join(f"label {j} = {n}" for j, n in enumerate(names)),
                    "reference": f"label {truth}",
                    "prediction": f"label {predicted}",
                    "correct": predicted == truth,
                    "attention": kinds,
                }
            )
        title = f"glyphs, {self.config.ways}-way {self.config.shots}-shot test episodes"
        note = "Each row is a position of the episode's sequence (support, then the query)"
        return {"layout": "tokens", "title": title, "note": note, "examples": examples}

    @torch.no_grad()
    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]:
        """figures/episodes.png: `count` test episodes, the support images with their labels,
        the query with its true and predicted label, and (a model with attention) the query's
        weights over the support in the last attention block."""
        from attnzoo.viz import episode_figure, save_figure

        chunk = self.held_out("test", min(max(1, count), EVAL_CHUNK))[0]
        chunk = chunk._replace(query=chunk.query[:, :1], query_labels=chunk.query_labels[:, :1])
        out = self.predict(model, _to(chunk, model_device(model), 0), return_weights=True)
        weights, name, columns = None, "", []
        if out.attention:
            name, last = out.attention[-1]
            weights = last[:count, 0, :, -1].mean(1).float().cpu()  # (count, columns)
            if weights.shape[-1] != chunk.support.shape[1] + 1:  # over the classes
                columns = [f"class {k}" for k in range(weights.shape[-1])]
        fig = episode_figure(
            chunk.support[:count, :, 0],
            chunk.support_labels[:count],
            chunk.query[:count, 0, 0],
            chunk.query_labels[:count, 0],
            out.log_probs[:count, 0].argmax(-1).cpu(),
            weights,
            name,
            columns,
        )
        path = Path(folder) / "episodes.png"
        save_figure(fig, path)
        return [path]


def make_task(config: GlyphsConfig, *, seed: int, eval_config: EvalConfig) -> GlyphsTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return GlyphsTask(config, seed=seed, eval_config=eval_config)


if __name__ == "__main__":  # pragma: no cover - the counts, for a quick look
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(inventory(TEST_SCRIPTS, GlyphsConfig.min_distance, GlyphsConfig.min_classes).counts())
