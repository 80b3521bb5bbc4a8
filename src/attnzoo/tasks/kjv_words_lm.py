"""Word-level language modelling of the King James text, with whole books held out.

The text is the KJV of `attnzoo.tasks.kjv_lm.verses()` (no download), lower-cased and cut into
words (letters with inner apostrophes) and punctuation marks (`words`); each verse ends with
the `<eos>` token, as each sentence of the Penn Treebank LM data does (Mikolov et al. 2010).
The vocabulary is fixed: the `vocab_size - 4` most frequent training tokens (ties broken by
the token) and the four specials of `attnzoo.tasks.text.Vocab`; every other word is `<unk>`.

Held out are whole books, by their pythonbible number (verse id BBCCCVVV // 10^6):
`test_books` for the test split, `valid_books` for validation; every other book trains. The
split needs no seed: it is the same on every run.

The metric is perplexity on the held-out split (the PTB convention: every held-out token,
`<eos>` and `<unk>` included, predicted once):

    ppl = exp(-1/N sum_t ln p(w_t | w_<t))

Batches and evaluation windows are those of `attnzoo.tasks.kjv_lm.CharLmTask` (windows of
context + 1 tokens; held-out windows overlap by one token).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import EvalConfig, model_device
from attnzoo.tasks.kjv_lm import POSITION_MARGIN, CharLmTask, verses
from attnzoo.tasks.text import Vocab

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*|[^\sa-z]")
# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size",)
EOS = Vocab.SPECIALS[Vocab.EOS]
FIGURE_WORDS = 18  # a figure's sentence is cut to this many words (readable at 800 px)
EXPLORE_WORDS = 48


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks: "And God said, Let" -> and god said , let."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class KjvWordsLmConfig:
    """Context, vocabulary and held-out books of the KJV word-level language model.

    Attributes:
        context: words the model reads to predict the next one (the window length).
        vocab_size: the vocabulary, the four specials included (`<unk>` for the rest).
        test_books, valid_books: pythonbible book numbers held out (1 Genesis .. 66
            Revelation). Default test: Ruth, Ecclesiastes, Jonah, Mark, Philippians, James;
            validation: Esther, Joel, Galatians (about 3.6% and 1.3% of the words).
    """

    context: int = 64
    vocab_size: int = 10_000
    test_books: tuple[int, ...] = (8, 21, 32, 41, 50, 59)
    valid_books: tuple[int, ...] = (17, 29, 48)

    def __post_init__(self):
        check_fields(self)
        for name in ("context", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail("KjvWordsLmConfig", name, "a positive int", repr(value))
        if self.vocab_size <= len(Vocab.SPECIALS):
            fail(
                "KjvWordsLmConfig", "vocab_size", "more than the 4 special tokens", self.vocab_size
            )
        for name in ("test_books", "valid_books"):
            books = tuple(getattr(self, name))
            if not books or any(isinstance(b, bool) or b not in range(1, 67) for b in books):
                fail("KjvWordsLmConfig", name, "book numbers in 1..66, at least one", books)
            object.__setattr__(self, name, books)  # a list from JSON becomes the tuple
        shared = set(self.test_books) & set(self.valid_books)
        if shared:
            fail("KjvWordsLmConfig", "valid_books", "no book of test_books", sorted(shared))


@lru_cache(maxsize=2)
def split_tokens(config: KjvWordsLmConfig) -> Mapping[str, tuple[str, ...]]:
    """split -> the tokens of its books' verses in canonical order, `<eos>` after each
    (cached per config and shared by every task built with it: read-only)."""
    out: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for verse, text in verses().items():
        book = verse // 1_000_000
        split = (
            "test"
            if book in config.test_books
            else "valid"
            if book in config.valid_books
            else "train"
        )
        out[split] += [*words(text), EOS]
    return MappingProxyType({split: tuple(tokens) for split, tokens in out.items()})


def held_out_verses(config: KjvWordsLmConfig, split: str = "test") -> list[list[str]]:
    """The words of each held-out verse (no `<eos>`), in canonical order."""
    books = config.test_books if split == "test" else config.valid_books
    return [words(t) for v, t in verses().items() if v // 1_000_000 in books]


class WordLmTask(CharLmTask):
    """Next-word prediction over training tokens, scored by perplexity on held-out tokens.

    The Task protocol as `CharLmTask` (same batches, loss and windows) over word ids; the
    metric is perplexity; `figures` draws the intra-attention of held-out verses (Cheng 2016
    Fig. 1) for a model that returns its weights. A model ("lm" interface) offers
    `forward(tokens, return_weights=False) -> output with .logits and .weights` (weights: a
    tuple of (b, heads, t, t) per layer, or None); a model with a `tape_start` label attends
    at step i to the states written before token i (column 0: the initial state so named),
    any other to the tokens up to i.

    Args:
        train: the training tokens.
        held_out: split -> tokens.
        sentences: split -> held-out verses (word lists) for figures and the explorer.
        vocab_size, context, seed, eval_config: as the config and `CharLmTask`.
    """

    metric = "perplexity"

    def __init__(
        self,
        train: Sequence[str],
        held_out: dict[str, Sequence[str]],
        sentences: dict[str, list[list[str]]],
        *,
        vocab_size: int,
        context: int,
        seed: int,
        eval_config,
    ):
        if len(train) <= context:
            fail("WordLmTask", "train", f"more than context = {context} tokens", len(train))
        self.vocab = Vocab.build([train], max_size=vocab_size)
        self.source_vocab = self.target_vocab = self.vocab
        self.context, self.seed, self.eval = context, seed, eval_config
        self._train = self._ids(train)
        self._held_out = {split: self._ids(tokens) for split, tokens in held_out.items()}
        self.sentences = sentences

    def model_dims(self) -> dict[str, int]:
        return {"vocab": len(self.vocab), "max_len": self.context + POSITION_MARGIN}

    def evaluate(self, model) -> dict[str, float]:
        """{"perplexity", "nats_per_word", "n_words", "unk_pct"} over the windows of
        `eval.split` (`unk_pct`: the share of predicted tokens that are `<unk>`)."""
        nats, count, unk = 0.0, 0, 0
        for batch_nats, targets in self.held_out_batches(model):
            nats, count = nats + batch_nats, count + targets.numel()
            unk += int((targets == Vocab.UNK).sum())
        per_word = nats / max(1, count)
        return {
            "perplexity": math.exp(per_word),
            "nats_per_word": per_word,
            "n_words": count,
            "unk_pct": 100 * unk / max(1, count),
        }

    # ----- attention -----
    @torch.no_grad()
    def intra_attention(self, model, sentence: list[str]):
        """One verse through `model` alone: (words, weights (t, t) over `columns` (the last
        layer's, averaged over heads), columns, by_word (t, t): row i's weight on each earlier
        word's state (the LSTMN's states written before word i; a model without
        `tape_start`: the words up to i), every layer's and head's weights (layers, heads, t,
        t)), or None for a model that returns no weights."""
        ids = torch.tensor([self.vocab.encode(sentence)], device=model_device(model))
        return self._intra(model, sentence, ids, model(ids, return_weights=True))

    def _intra(self, model, sentence: list[str], ids: torch.Tensor, out):
        """`intra_attention` from the model's output `out` on `ids` (1, t)."""
        if out.weights is None:
            return None
        every = torch.stack([w[0] for w in out.weights]).float().cpu()  # (layers, heads, t, t)
        weights = every[-1].mean(0)  # the last layer's head mean: (t, t)
        shown = [
            self.vocab.tokens[i] if i != Vocab.UNK else f"<unk:{w}>"
            for i, w in zip(ids[0].tolist(), sentence, strict=True)
        ]
        start = getattr(model, "tape_start", None)
        if start is None:
            return shown, weights, shown, weights, every
        by_word = torch.zeros_like(weights)
        by_word[:, :-1] = weights[:, 1:]  # column k + 1 is the state after word k
        return shown, weights, [start, *shown[:-1]], by_word, every

    def figures(self, model, folder: Path, count: int = 3) -> list[Path]:
        """For the first `count` held-out verses (cut to FIGURE_WORDS words):
        intra_attention.png (+ _1, _2 ...: the word-by-word layout of Cheng 2016 Fig. 1, the
        current word in red, earlier words shaded by their weight) and
        intra_attention_heatmap.png (+ _1 ...). None for a model without attention."""
        from attnzoo.viz.figures import alignment_figure, intra_attention_figure, save_figure

        written = []
        for k, sentence in enumerate(self._figure_sentences(count)):
            got = self.intra_attention(model, sentence)
            if got is None:
                return []
            shown, weights, columns, by_word, _ = got
            suffix = "" if k == 0 else f"_{k}"
            title = "intra-attention over earlier words (current word in red)"
            fig = intra_attention_figure(shown, by_word, title=title)
            path = Path(folder) / f"intra_attention{suffix}.png"
            save_figure(fig, path)
            written.append(path)
            fig = alignment_figure(weights, columns, shown, title="intra-attention weights")
            fig.axes[0].set_xlabel("state read (written after the word shown)")
            fig.axes[0].set_ylabel("current word")
            path = Path(folder) / f"intra_attention_heatmap{suffix}.png"
            save_figure(fig, path)
            written.append(path)
        return written

    def _figure_sentences(self, count: int) -> list[list[str]]:
        """Held-out verses of at least 8 words, cut to FIGURE_WORDS."""
        chosen = [s for s in self.sentences.get(self.eval.split, []) if len(s) >= 8][:count]
        return [s[:FIGURE_WORDS] for s in chosen]

    @torch.no_grad()
    def explore(self, model, count: int) -> dict:
        """The explorer's data: the first `count` held-out verses (cut to EXPLORE_WORDS
        words), each word's attention over the states before it; the prediction is the most
        likely next word at each position, the reference the verse's next word (`<eos>` only
        where the verse ends, not where it is cut)."""
        items = []
        for verse in self.sentences.get(self.eval.split, [])[:count]:
            sentence = verse[:EXPLORE_WORDS]
            # the next word at every position: the verse's own past a cut, <eos> only at its end
            following = [*verse[1 : EXPLORE_WORDS + 1], EOS][: len(sentence)]
            ids = torch.tensor([self.vocab.encode(sentence)], device=model_device(model))
            out = model(ids, return_weights=True)  # one pass for the prediction and weights
            predicted = out.logits[0].argmax(-1).cpu().tolist()
            got = self._intra(model, sentence, ids, out)
            kinds = []
            if got is not None:
                shown, _, columns, _, every = got
                kinds.append(
                    {
                        "name": "intra-attention (causal)",
                        "rows": shown,
                        "columns": columns,
                        "weights": every,
                    }
                )
            items.append(
                {
                    "input": " ".join(sentence),
                    "reference": " ".join(following),
                    "prediction": " ".join(self.vocab.tokens[i] for i in predicted),
                    "correct": None,
                    "attention": kinds,
                }
            )
        return {
            "layout": "tokens",
            "title": f"{len(items)} held-out verses ({self.eval.split} books)",
            "note": "Each word's attention over the states before it (an LSTMN's column 0 is "
            "its initial state); the reference and prediction are the next word at every "
            "position",
            "examples": items,
        }


def make_task(config: KjvWordsLmConfig, *, seed: int, eval_config: EvalConfig) -> WordLmTask:
    """The task of this module's registry entry (`TaskSpec.build`)."""
    tokens = split_tokens(config)
    sentences = {split: held_out_verses(config, split) for split in ("valid", "test")}
    return WordLmTask(
        tokens["train"],
        {"valid": tokens["valid"], "test": tokens["test"]},
        sentences,
        vocab_size=config.vocab_size,
        context=config.context,
        seed=seed,
        eval_config=eval_config,
    )
