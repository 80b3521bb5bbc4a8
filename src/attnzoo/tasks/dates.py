"""Human-written dates -> ISO 8601 (`YYYY-MM-DD`), character level, generated with babel (CLDR).

The date-normalisation task popularised as a first exercise for Bahdanau-style attention
(Bahdanau et al., 2015): "freitag, 4. märz 2005" -> "2005-03-04". The source is a date written
by `babel` in one of several locales and patterns, lower-cased, one token per character; the
target is the 10 ISO characters. Because every pattern field is rendered separately, the data
carry the true alignment: each year digit of the target points at the year field of the source,
each month digit at the month field (digits or a name), each day digit at the day field, and the
two '-' at nothing.

Two choices make the mapping a function, so that a perfect model exists:
- A two-digit year ("yy") is only drawn from `TWO_DIGIT_YEARS`, the RFC 5280 (Section
  4.1.2.5.1) UTCTime window: "49" means 2049, "50" means 1950.
- Strings that another configured (locale, pattern) reads as a different date are dropped: en_US
  writes March 4 as "3/4/05" and es_ES writes 3 April the same way. `readings` parses a string
  with every configured pattern to find them.
"""

from __future__ import annotations

import datetime
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import EvalConfig, check_counts, require
from attnzoo.tasks.text import Example, Span, Splits
from attnzoo.tasks.translation import TranslationTask

DEFAULT_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pt_BR")
# CLDR's four named date formats of each locale, plus explicit patterns written in every locale.
DEFAULT_PATTERNS = ("short", "medium", "long", "full", "d MMMM y", "EEE d MMM y", "dd.MM.yy")
NAMED_FORMATS = ("short", "medium", "long", "full")
TWO_DIGIT_YEARS = (1950, 2049)

# Pattern letters of the three aligned fields; weekdays ('E') are rendered but align to nothing.
_FIELD_OF_LETTER = {"y": "year", "M": "month", "L": "month", "d": "day"}
_UNALIGNED_LETTERS = {"E"}
# Target positions of each field in "YYYY-MM-DD"; the '-' at 4 and 7 have no source.
_ISO_FIELDS = ("year",) * 4 + (None,) + ("month",) * 2 + (None,) + ("day",) * 2


@dataclass(frozen=True)
class DatesConfig:
    """Sizes, seed and the (locale, pattern) grid of the dates task.

    Attributes:
        locales: CLDR locale ids.
        patterns: babel date formats: a CLDR format name ("short", "medium", "long", "full"),
            resolved per locale, or an explicit pattern ("d MMMM y"). Each must contain the
            fields y, M (or L) and d once; E (weekday) is allowed.
        first_year, last_year: the range dates are drawn from (uniformly by day); patterns
            with a two-digit year draw from its intersection with `TWO_DIGIT_YEARS`.
    """

    n_train: int = 20_000
    n_valid: int = 1_000
    n_test: int = 2_000
    seed: int = 0
    locales: tuple[str, ...] = DEFAULT_LOCALES
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    first_year: int = 1900
    last_year: int = 2099

    def __post_init__(self):
        check_fields(self)
        check_counts("DatesConfig", self, ("n_train",), ("n_valid", "n_test", "seed"))
        # four-digit years: the target is ISO "YYYY-MM-DD"
        if not 1000 <= self.first_year <= 9999:
            fail("DatesConfig", "first_year", "a year in 1000..9999", self.first_year)
        if not self.first_year <= self.last_year <= 9999:
            fail("DatesConfig", "last_year", f"a year in {self.first_year}..9999", self.last_year)
        for name in ("locales", "patterns"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, str) and v.strip() for v in values):
                fail("DatesConfig", name, "one or more non-empty names", repr(values))


def _babel_dates() -> Any:
    return require("babel.dates")


@cache
def _locale(name: str) -> Any:
    return require("babel").Locale.parse(name)


def resolve_pattern(locale: str, pattern: str) -> str:
    """The CLDR pattern behind a format name ("medium" in de_DE is "dd.MM.y"), or `pattern`."""
    if pattern in NAMED_FORMATS:
        return _babel_dates().get_date_format(pattern, locale=_locale(locale)).pattern
    return pattern


def locale_patterns(locale: str, patterns: Sequence[str] = DEFAULT_PATTERNS) -> tuple[str, ...]:
    """The distinct CLDR patterns `patterns` stand for in `locale`, in order."""
    resolved: list[str] = []
    for pattern in patterns:
        p = resolve_pattern(locale, pattern)
        if p not in resolved:
            resolved.append(p)
    return tuple(resolved)


@cache
def _tokens(pattern: str) -> tuple[tuple[str, Any], ...]:
    """babel's tokens of a pattern, checked to hold each aligned field exactly once."""
    tokens = tuple(_babel_dates().tokenize_pattern(pattern))
    seen = []
    for kind, value in tokens:
        if kind != "field":
            continue
        letter = value[0]
        if letter not in _FIELD_OF_LETTER and letter not in _UNALIGNED_LETTERS:
            raise ValueError(f"pattern {pattern!r}: unsupported field {letter * value[1]!r}")
        if letter in _FIELD_OF_LETTER:
            seen.append(_FIELD_OF_LETTER[letter])
    if sorted(seen) != ["day", "month", "year"]:
        raise ValueError(f"pattern {pattern!r} must have one year, one month and one day field")
    return tokens


def has_two_digit_year(pattern: str) -> bool:
    return any(kind == "field" and value == ("y", 2) for kind, value in _tokens(pattern))


def format_pieces(date: datetime.date, locale: str, pattern: str) -> list[tuple[str, str | None]]:
    """The pieces of `format_date(date, pattern, locale)`, each field rendered on its own.

    Returns:
        (text, field) pairs in order, field being "year", "month", "day", "weekday" or None for
        literal text. Their concatenation is babel's `format_date` output (tested).
    """
    fmt = _babel_dates().DateTimeFormat(date, _locale(locale))
    pieces: list[tuple[str, str | None]] = []
    for kind, value in _tokens(pattern):
        if kind == "chars":
            pieces.append((value, None))
        else:
            letter, count = value
            pieces.append((fmt[letter * count], _FIELD_OF_LETTER.get(letter, "weekday")))
    return pieces


def make_example(date: datetime.date, locale: str, pattern: str) -> Example:
    """The example for one date written in one locale and pattern (a name or a CLDR pattern).

    Source: the lower-cased formatted string, one token per character, (source_len,).
    Target: the 10 characters of `date.isoformat()`; spans point each digit at its field.
    """
    pattern = resolve_pattern(locale, pattern)
    chars: list[str] = []
    field_spans: dict[str, Span] = {}
    for text, field in format_pieces(date, locale, pattern):
        # Lower-case piece by piece so offsets are those of the final string, whatever
        # lower() does to a piece's length.
        lowered = text.lower()
        if field in ("year", "month", "day"):
            field_spans[field] = (len(chars), len(chars) + len(lowered))
        chars.extend(lowered)
    target = tuple(date.isoformat())
    spans = tuple(None if f is None else field_spans[f] for f in _ISO_FIELDS)
    return Example(source=tuple(chars), target=target, spans=spans)


class _Reader:
    """Parses strings written with one (locale, pattern) back to the dates they can mean."""

    def __init__(self, locale: str, pattern: str, years: tuple[int, int]) -> None:
        self.locale, self.pattern = locale, pattern
        self.two_digit_year = has_two_digit_year(pattern)
        if self.two_digit_year:
            years = (max(years[0], TWO_DIGIT_YEARS[0]), min(years[1], TWO_DIGIT_YEARS[1]))
        self.years = years
        self.month_names: dict[str, list[int]] = {}  # names may repeat (narrow: "M" twice)
        bd, loc = _babel_dates(), _locale(locale)
        parts = []
        for kind, value in _tokens(pattern):
            if kind == "chars":
                parts.append(re.escape(value.lower()))
                continue
            letter, count = value
            if letter in "ML" and count >= 3:
                width = {3: "abbreviated", 4: "wide", 5: "narrow"}[count]
                context = "format" if letter == "M" else "stand-alone"
                for m, name in bd.get_month_names(width, context, loc).items():
                    self.month_names.setdefault(name.lower(), []).append(m)
                parts.append(f"(?P<month>{_alternation(self.month_names)})")
            elif letter == "E":
                width = "abbreviated" if count <= 3 else {4: "wide", 5: "narrow", 6: "short"}[count]
                names = bd.get_day_names(width, "format", loc)
                parts.append(f"(?:{_alternation([n.lower() for n in names.values()])})")
            else:
                # Numbers are padded to `count` digits; dates here have 4-digit years.
                digits = r"\d{2}" if (letter, count) == ("y", 2) else rf"\d{{{count},4}}"
                parts.append(f"(?P<{_FIELD_OF_LETTER[letter]}>{digits})")
        self.regex = re.compile("".join(parts))

    def read(self, text: str) -> set[datetime.date]:
        match = self.regex.fullmatch(text)
        if match is None:
            return set()
        month = match["month"]
        months = self.month_names[month] if self.month_names else [int(month)]
        year = int(match["year"])
        if self.two_digit_year:
            year = TWO_DIGIT_YEARS[0] + (year - TWO_DIGIT_YEARS[0]) % 100
        if not self.years[0] <= year <= self.years[1]:
            return set()
        dates = set()
        for month_number in months:
            try:
                date = datetime.date(year, month_number, int(match["day"]))
            except ValueError:
                continue
            # Re-rendering checks what the regex cannot: padding, and the weekday.
            pieces = format_pieces(date, self.locale, self.pattern)
            if "".join(piece for piece, _ in pieces).lower() == text:
                dates.add(date)
        return dates


def _alternation(names: Sequence[str] | dict[str, int]) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))


@lru_cache(maxsize=16)
def _readers(locales: tuple[str, ...], patterns: tuple[str, ...], years: tuple[int, int]):
    return tuple(
        _Reader(locale, p, years) for locale in locales for p in locale_patterns(locale, patterns)
    )


def readings(text: str, config: DatesConfig | None = None) -> set[datetime.date]:
    """Every date that some (locale, pattern) of `config` writes as `text` (lower-cased)."""
    config = config or DatesConfig()
    readers = _readers(config.locales, config.patterns, (config.first_year, config.last_year))
    return set().union(*(reader.read(text) for reader in readers))


def _checked_patterns(config: DatesConfig) -> dict[str, tuple[str, ...]]:
    """Each locale's distinct patterns (`locale_patterns`), after what only babel can tell
    (DatesConfig checks the rest): every locale is one CLDR knows, every pattern resolves in
    every locale to one holding y, M (or L) and d once, and a two-digit-year pattern has
    years to draw from."""
    unknown = require("babel").UnknownLocaleError  # neither a ValueError nor a LookupError
    for locale in config.locales:
        try:
            _locale(locale)
        except (ValueError, unknown) as err:
            fail("DatesConfig", "locales", "CLDR locale ids (e.g. en_US)", f"{locale!r} ({err})")
    patterns = {loc: _named_patterns(loc, config.patterns) for loc in config.locales}
    lo, hi = max(config.first_year, TWO_DIGIT_YEARS[0]), min(config.last_year, TWO_DIGIT_YEARS[1])
    if lo > hi and any(has_two_digit_year(p) for ps in patterns.values() for p in ps):
        wanted = f"years overlapping {TWO_DIGIT_YEARS} for the two-digit-year patterns"
        fail("DatesConfig", "first_year", wanted, (config.first_year, config.last_year))
    return patterns


def _named_patterns(locale: str, patterns: Sequence[str]) -> tuple[str, ...]:
    """`locale_patterns`, each checked by `_tokens`; a bad one is an error naming `patterns`."""
    resolved = locale_patterns(locale, patterns)
    for pattern in resolved:
        try:
            _tokens(pattern)
        except ValueError as err:
            wanted = "CLDR format names (short, medium, long, full) or patterns with y, M, d once"
            fail("DatesConfig", "patterns", wanted, f"{err} in {locale}")
    return resolved


def make_splits(config: DatesConfig | None = None) -> Splits:
    """Draw distinct, unambiguous examples; deterministic given `config.seed`.

    1. Draw a locale, then one of its distinct patterns, then a day, uniformly.
    2. Skip a source string already drawn, so no two examples (in or across splits) share one.
    3. Skip a string that some configured (locale, pattern) reads as another date.
    Test examples are drawn first, then valid, then train, so a larger `n_train` leaves the
    held-out sets unchanged.
    """
    config = config or DatesConfig()
    patterns = _checked_patterns(config)
    rng = random.Random(config.seed)
    readers = _readers(config.locales, config.patterns, (config.first_year, config.last_year))
    days = {
        (r.locale, r.pattern): (
            datetime.date(r.years[0], 1, 1).toordinal(),
            datetime.date(r.years[1], 12, 31).toordinal(),
        )
        for r in readers
    }
    total = config.n_test + config.n_valid + config.n_train
    wanted = "n_train + n_valid + n_test within the distinct dates these locales, patterns and "
    wanted += "years write"
    # at most one example per (locale, pattern, day): more is refused at once (drawing
    # toward an impossible count took minutes before the tries ran out)
    possible = sum(
        days[locale, pattern][1] - days[locale, pattern][0] + 1
        for locale in config.locales
        for pattern in dict.fromkeys(patterns[locale])
    )
    if total > possible:
        fail("DatesConfig", "n_train", wanted, f"{total} (at most {possible} can be written)")
    examples: list[Example] = []
    seen: set[str] = set()
    attempts = 0
    while len(examples) < total:
        attempts += 1
        if attempts > 20 * total + 1000:
            got = f"{total} ({len(examples)} drawn in {attempts - 1} tries)"
            fail("DatesConfig", "n_train", wanted, got)
        locale = rng.choice(config.locales)
        pattern = rng.choice(patterns[locale])
        date = datetime.date.fromordinal(rng.randint(*days[locale, pattern]))
        example = make_example(date, locale, pattern)
        text = detokenize(example.source)
        if text in seen:
            continue
        seen.add(text)
        found = readings(text, config)
        if date not in found:
            raise RuntimeError(f"{text!r} ({locale}, {pattern!r}) does not read back as {date}")
        if len(found) == 1:
            examples.append(example)
    test = examples[: config.n_test]
    valid = examples[config.n_test : config.n_test + config.n_valid]
    return Splits(train=examples[config.n_test + config.n_valid :], valid=valid, test=test)


def detokenize(tokens: Sequence[str]) -> str:
    """Characters back to a string (both sides are character level)."""
    return "".join(tokens)


def make_task(config: DatesConfig, *, seed: int, eval_config: EvalConfig) -> TranslationTask:
    """The task the runs layer builds: this module's splits, scored by exact_match."""
    return TranslationTask(
        make_splits(config), detokenize, metric="exact_match", seed=seed, eval_config=eval_config
    )
