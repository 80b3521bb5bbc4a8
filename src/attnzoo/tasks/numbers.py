"""German number words -> digits (or English words), with the true digit-to-morpheme alignment.

German says the units before the tens ("vierundzwanzig" = four-and-twenty = 24), so a monotonic
left-to-right alignment fails and attention must reorder: in "drei hundert vier und zwanzig"
-> "324" the '2' comes from the last morpheme and the '4' from the one before "und".

Source: `num2words(value, lang="de")` segmented into morphemes by greedy longest match over
`MORPHEMES` (units "ein"/"eins".."neun", the whole teen words "zehn".."neunzehn", the tens
"zwanzig".."neunzig", "und", "hundert", "tausend", "null"). Teens and tens stay whole words
("siebzehn", not "sieb zehn"): splitting them would invent stems ("sieb", "sech") that occur
nowhere else.

Target "digits": the digits of the value. Spans, one per digit:
- a nonzero hundreds or units digit -> the unit morpheme that names it ("drei" in 324);
- a nonzero tens digit -> its tens morpheme ("zwanzig");
- both digits of 10..19 -> the teen morpheme ("zehn" for the '1' and the '0' of 10);
- "null" (the value 0) -> its only digit;
- any other zero (the 0 of 304, the three of 1000) -> None: no morpheme says it, the model
  infers it from the magnitude words.
Target "english": `num2words(value, lang="en")` as word tokens ("twenty", "-", "four"), with
spans None (no alignment is defined between the two languages' words).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import EvalConfig, check_counts, require
from attnzoo.tasks.text import Example, Span, Splits
from attnzoo.tasks.translation import TranslationTask

MAX_SUPPORTED = 999_999  # "eine Million" starts a new word pattern

UNITS = {
    "ein": 1, "eins": 1, "zwei": 2, "drei": 3, "vier": 4,
    "fünf": 5, "sechs": 6, "sieben": 7, "acht": 8, "neun": 9,
}  # fmt: skip
TEENS = {
    "zehn": 10, "elf": 11, "zwölf": 12, "dreizehn": 13, "vierzehn": 14,
    "fünfzehn": 15, "sechzehn": 16, "siebzehn": 17, "achtzehn": 18, "neunzehn": 19,
}  # fmt: skip
TENS = {
    "zwanzig": 20, "dreißig": 30, "vierzig": 40, "fünfzig": 50,
    "sechzig": 60, "siebzig": 70, "achtzig": 80, "neunzig": 90,
}  # fmt: skip
MORPHEMES = (*UNITS, *TEENS, *TENS, "und", "hundert", "tausend", "null")
# Longest first, so "achtzehn" wins over "acht" and "eins" over "ein".
_SEGMENTER = re.compile("|".join(sorted(MORPHEMES, key=lambda m: (-len(m), m))))
_ENGLISH_TOKEN = re.compile(r"[a-z]+|[^a-z\s]")
# Every token of num2words' English below a million.
ENGLISH_VOCABULARY = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten", "eleven", "twelve", "thirteen", "fourteen",
    "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    "hundred", "thousand", "and", ",", "-",
})  # fmt: skip

Target = Literal["digits", "english"]


@dataclass(frozen=True)
class NumbersConfig:
    """Sizes, seed and value range of the numbers task.

    Attributes:
        max_value: values are drawn uniformly from 0..max_value (at most `MAX_SUPPORTED`).
        target: "digits" (aligned) or "english" (num2words English words, spans None).
    """

    n_train: int = 20_000
    n_valid: int = 1_000
    n_test: int = 2_000
    seed: int = 0
    max_value: int = MAX_SUPPORTED
    target: Target = "digits"

    def __post_init__(self):
        check_fields(self)
        check_counts("NumbersConfig", self, ("n_train",), ("n_valid", "n_test", "seed"))
        if not 0 <= self.max_value <= MAX_SUPPORTED:
            fail("NumbersConfig", "max_value", f"an int in [0, {MAX_SUPPORTED}]", self.max_value)
        total = self.n_train + self.n_valid + self.n_test  # distinct values, one per example
        if total > self.max_value + 1:
            wanted = f"at least n_train + n_valid + n_test - 1 = {total - 1} (distinct values)"
            fail("NumbersConfig", "max_value", wanted, self.max_value)


def german_words(value: int) -> str:
    """`num2words(value, lang="de")`, corrected where it writes "eins" before "tausend".

    Note: num2words 0.5.14 writes 101_000 as "einhunderteinstausend"; German writes "eins"
    only at the end of a number, so this returns "einhunderteintausend".
    """
    num2words = require("num2words").num2words
    return num2words(value, lang="de").replace("einstausend", "eintausend")


def english_words(value: int) -> str:
    """`num2words(value, lang="en")`, e.g. "three hundred and twenty-four"."""
    return require("num2words").num2words(value, lang="en")


def segment(word: str) -> tuple[str, ...]:
    """Split a German number word into `MORPHEMES` by greedy longest match.

    Raises ValueError if some part of `word` is not a morpheme.
    """
    tokens, position = [], 0
    while position < len(word):
        match = _SEGMENTER.match(word, position)
        if match is None:
            raise ValueError(f"{word!r}: no morpheme at {word[position:]!r}")
        tokens.append(match.group())
        position = match.end()
    return tuple(tokens)


def _parse_group(tokens: Sequence[str], start: int) -> tuple[int, dict[str, int], int]:
    """Read one group below a thousand from tokens[start:].

    Returns (value, source position of each named digit ("h", "t", "u"), next position).
    Grammar: [unit "hundert"] [unit | teen | [unit "und"] tens].
    """
    value, where, i = 0, {}, start

    def at(k: int) -> str | None:
        return tokens[k] if k < len(tokens) else None

    if at(i) in UNITS and at(i + 1) == "hundert":
        value, where["h"], i = 100 * UNITS[tokens[i]], i, i + 2
    if at(i) in TEENS:
        value += TEENS[tokens[i]]
        where["t"] = where["u"] = i
        i += 1
    elif at(i) in UNITS and at(i + 1) == "und" and at(i + 2) in TENS:
        value += TENS[tokens[i + 2]] + UNITS[tokens[i]]
        where["u"], where["t"] = i, i + 2
        i += 3
    elif at(i) in TENS:
        value, where["t"], i = value + TENS[tokens[i]], i, i + 1
    elif at(i) in UNITS:
        value, where["u"], i = value + UNITS[tokens[i]], i, i + 1
    return value, where, i


def parse(tokens: Sequence[str]) -> tuple[int, tuple[Span | None, ...]]:
    """The value of a morpheme sequence and the span of each of its digits.

    Raises ValueError on a sequence outside the grammar of `german_words` below a million.
    """
    if tuple(tokens) == ("null",):
        return 0, ((0, 1),)
    thousands, where_thousands, i = _parse_group(tokens, 0)
    if i < len(tokens) and tokens[i] == "tausend":
        if thousands == 0:
            raise ValueError(f"{tokens}: 'tausend' without a count")
        low, where_low, i = _parse_group(tokens, i + 1)
    else:
        thousands, where_thousands, low, where_low = 0, {}, thousands, where_thousands
    if i != len(tokens) or (thousands == 0 and low == 0):
        raise ValueError(f"{tokens}: not a German number word below a million")
    value = 1000 * thousands + low
    digits = str(value)
    spans: list[Span | None] = []
    for k, _ in enumerate(digits):
        # Digit k, counted from the right, is place "u", "t" or "h" of group k // 3.
        place = len(digits) - 1 - k
        where = where_thousands if place >= 3 else where_low
        position = where.get("uth"[place % 3])
        spans.append(None if position is None else (position, position + 1))
    return value, tuple(spans)


def make_example(value: int, target: Target = "digits") -> Example:
    """The example for one value: German morphemes -> digits (with spans) or English words."""
    if not 0 <= value <= MAX_SUPPORTED:
        raise ValueError(f"value must be in 0..{MAX_SUPPORTED}, got {value}")
    source = segment(german_words(value))
    parsed, spans = parse(source)
    if parsed != value:
        raise RuntimeError(f"{value}: segmentation {source} reads as {parsed}")
    if target == "digits":
        return Example(source=source, target=tuple(str(value)), spans=spans)
    if target == "english":
        return Example(source=source, target=tuple(_ENGLISH_TOKEN.findall(english_words(value))))
    raise ValueError(f"target must be 'digits' or 'english', got {target!r}")


def make_splits(config: NumbersConfig | None = None) -> Splits:
    """Draw distinct values uniformly from 0..max_value; deterministic given `config.seed`.

    Test values are drawn first, then valid, then train, so a larger `n_train` leaves the
    held-out sets unchanged; no value (hence no source) is in two splits.
    """
    config = config or NumbersConfig()  # (its sizes, range and target checked by the config)
    rng = random.Random(config.seed)
    values: list[int] = []
    seen: set[int] = set()
    total = config.n_test + config.n_valid + config.n_train
    while len(values) < total:
        value = rng.randint(0, config.max_value)
        if value not in seen:
            seen.add(value)
            values.append(value)
    examples = [make_example(v, config.target) for v in values]
    n_test, n_valid = config.n_test, config.n_valid
    return Splits(
        train=examples[n_test + n_valid :],
        valid=examples[n_test : n_test + n_valid],
        test=examples[:n_test],
    )


def detokenize(tokens: Sequence[str], target: Target | None = None) -> str:
    """Tokens back to text.

    "digits" concatenates, which also rebuilds the German word from its morphemes; "english"
    inverts the English tokenisation: words spaced, '-' joining its neighbours, ',' attached
    to the word before it. None tells the two apart by the tokens (the German, digit and
    English vocabularies are disjoint), so one function serves sources and both targets.
    """
    if target is None:
        target = "english" if any(token in ENGLISH_VOCABULARY for token in tokens) else "digits"
    if target == "digits":
        return "".join(tokens)
    if target != "english":
        raise ValueError(f"target must be 'digits' or 'english', got {target!r}")
    text = ""
    for token in tokens:
        glue = token in ",-" or text.endswith("-") or not text
        text += token if glue else " " + token
    return text


def make_task(config: NumbersConfig, *, seed: int, eval_config: EvalConfig) -> TranslationTask:
    """The task the runs layer builds: this module's splits, scored by exact_match."""
    return TranslationTask(
        make_splits(config), detokenize, metric="exact_match", seed=seed, eval_config=eval_config
    )
