import datetime
import random
import sys

import pytest

from attnzoo.tasks import dates
from attnzoo.tasks.base import MissingDataDependency

babel_dates = pytest.importorskip("babel.dates")

SMALL = dates.DatesConfig(n_train=300, n_valid=50, n_test=50, seed=3)


def spans_by_field(example):
    """The source text of the year, month and day fields, read through the spans."""
    text = dates.detokenize(example.source)
    year, month, day = example.spans[0], example.spans[5], example.spans[8]
    return text[slice(*year)], text[slice(*month)], text[slice(*day)]


# --- exact examples ----------------------------------------------------------------------


def test_german_full_date_spans():
    # "EEEE, d. MMMM y": f r e i t a g , _ 4 . _ m ä r z _ 2 0 0 5
    #                   0 1 2 3 4 5 6 7 8 9 10 11 12-15 16 17-20
    ex = dates.make_example(datetime.date(2005, 3, 4), "de_DE", "full")
    assert dates.detokenize(ex.source) == "freitag, 4. märz 2005"
    assert ex.target == tuple("2005-03-04")
    year, month, day = (17, 21), (12, 16), (9, 10)
    assert ex.spans == (year, year, year, year, None, month, month, None, day, day)


def test_us_short_date_with_two_digit_year():
    ex = dates.make_example(datetime.date(1999, 12, 31), "en_US", "short")  # "M/d/yy"
    assert dates.detokenize(ex.source) == "12/31/99"
    assert ex.spans == ((6, 8),) * 4 + (None, (0, 2), (0, 2), None, (3, 5), (3, 5))


@pytest.mark.parametrize(
    ("locale", "pattern", "text", "fields"),
    [
        ("es_ES", "long", "4 de marzo de 2005", ("2005", "marzo", "4")),
        ("pt_BR", "medium", "4 de mar. de 2005", ("2005", "mar.", "4")),
        ("fr_FR", "EEE d MMM y", "ven. 4 mars 2005", ("2005", "mars", "4")),
        ("it_IT", "dd.MM.yy", "04.03.05", ("05", "03", "04")),
        ("nl_NL", "short", "04-03-2005", ("2005", "03", "04")),
        ("en_GB", "full", "friday, 4 march 2005", ("2005", "march", "4")),
    ],
)
def test_fields_of_one_date_across_locales(locale, pattern, text, fields):
    ex = dates.make_example(datetime.date(2005, 3, 4), locale, pattern)
    assert dates.detokenize(ex.source) == text
    assert spans_by_field(ex) == fields


def test_resolve_and_dedupe_patterns():
    assert dates.resolve_pattern("de_DE", "medium") == "dd.MM.y"
    assert dates.resolve_pattern("de_DE", "d MMMM y") == "d MMMM y"
    # de_DE's short format is the explicit "dd.MM.yy": listed once.
    assert dates.locale_patterns("de_DE", ("short", "dd.MM.yy")) == ("dd.MM.yy",)


@pytest.mark.parametrize("pattern", ["MMM y", "d MMMM y G", "y-MM-dd HH", "d M M y"])
def test_unsupported_patterns_are_rejected(pattern):
    with pytest.raises(ValueError):
        dates.make_example(datetime.date(2005, 3, 4), "en_GB", pattern)


# --- babel parity ------------------------------------------------------------------------


def test_pieces_concatenate_to_babel_format_date_for_every_locale_and_pattern():
    rng = random.Random(0)
    first = datetime.date(1900, 1, 1).toordinal()
    last = datetime.date(2099, 12, 31).toordinal()
    checked = 0
    for locale in dates.DEFAULT_LOCALES:
        for pattern in dates.locale_patterns(locale, dates.DEFAULT_PATTERNS):
            for _ in range(25):
                date = datetime.date.fromordinal(rng.randint(first, last))
                pieces = dates.format_pieces(date, locale, pattern)
                expected = babel_dates.format_date(date, pattern, locale=locale)
                assert "".join(text for text, _ in pieces) == expected
                ex = dates.make_example(date, locale, pattern)
                assert dates.detokenize(ex.source) == expected.lower()
                # Each span holds exactly the lower-cased text of its field piece.
                by_field = {field: text.lower() for text, field in pieces}
                assert spans_by_field(ex) == (by_field["year"], by_field["month"], by_field["day"])
                checked += 1
    assert checked > 1000


# --- ambiguity ---------------------------------------------------------------------------


def test_readings_find_month_first_and_day_first_meanings():
    assert dates.readings("3/4/05") == {datetime.date(2005, 3, 4), datetime.date(2005, 4, 3)}
    assert dates.readings("3/13/05") == {datetime.date(2005, 3, 13)}  # no 13th month
    assert dates.readings("freitag, 4. märz 2005") == {datetime.date(2005, 3, 4)}
    assert dates.readings("donnerstag, 4. märz 2005") == set()  # wrong weekday


def test_two_digit_years_follow_the_rfc5280_window():
    assert dates.readings("01.01.49") == {datetime.date(2049, 1, 1)}
    assert dates.readings("01.01.50") == {datetime.date(1950, 1, 1)}
    config = dates.DatesConfig(
        n_train=200, n_valid=0, n_test=0, locales=("de_DE",), patterns=("dd.MM.yy",)
    )
    years = {int("".join(ex.target[:4])) for ex in dates.make_splits(config).train}
    lo, hi = dates.TWO_DIGIT_YEARS
    assert min(years) >= lo and max(years) <= hi


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"first_year": 2050, "last_year": 2099, "patterns": ("dd.MM.yy",)}, "first_year"),
        ({"locales": ("en_US", "nan")}, "locales"),  # no such CLDR locale
        ({"locales": ("-1",)}, "locales"),  # not a locale id at all
        ({"patterns": ("medium", "0")}, "patterns"),  # no fields
        ({"patterns": ("d MMM y G",)}, "patterns"),  # an era: a field that aligns to nothing
        # far more dates than one locale and pattern write in a year
        ({"locales": ("en_US",), "patterns": ("short",), "first_year": 2000, "last_year": 2000,
          "n_train": 500, "n_valid": 0, "n_test": 0}, "n_train"),
    ],
)  # fmt: skip
def test_a_config_babel_cannot_draw_is_an_error_naming_the_field(fields, named):
    """Each a ValueError naming the field, as every config error (the command line prints it
    as one line); an unknown locale was babel's UnknownLocaleError (a traceback) and the
    others unnamed ValueErrors or a RuntimeError."""
    with pytest.raises(ValueError, match=f"DatesConfig: argument '{named}' expected"):
        dates.make_splits(dates.DatesConfig(**fields))


def test_more_examples_than_the_config_can_write_are_refused_before_any_draw(monkeypatch):
    """One locale, one pattern, one year write at most 366 dates: 50,000 were drawn for until
    the tries ran out (24 s here; minutes for 10 million on the defaults)."""

    def drawn(*args):
        raise AssertionError("an example was drawn")

    monkeypatch.setattr(dates, "make_example", drawn)
    one_year = dict(locales=("en_US",), patterns=("short",), first_year=2000, last_year=2000)
    config = dates.DatesConfig(n_train=50_000, n_valid=0, n_test=0, **one_year)
    with pytest.raises(ValueError, match=r"'n_train' expected .* got 50000 \(at most 366 can"):
        dates.make_splits(config)


def test_a_year_before_1000_is_refused_by_the_config():  # the ISO target has four digits
    with pytest.raises(ValueError, match="argument 'first_year' expected a year in 1000..9999"):
        dates.DatesConfig(first_year=999)


# --- splits ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_splits():
    return dates.make_splits(SMALL)


def test_split_sizes_and_determinism(small_splits):
    assert (len(small_splits.train), len(small_splits.valid), len(small_splits.test)) == (
        300,
        50,
        50,
    )
    assert dates.make_splits(SMALL) == small_splits
    other = dates.make_splits(dates.DatesConfig(n_train=300, n_valid=50, n_test=50, seed=4))
    assert other.test != small_splits.test


def test_held_out_sets_do_not_move_when_train_grows(small_splits):
    bigger = dates.make_splits(dates.DatesConfig(n_train=400, n_valid=50, n_test=50, seed=3))
    assert bigger.test == small_splits.test and bigger.valid == small_splits.valid


def test_sources_are_distinct_within_and_across_splits(small_splits):
    sources = [ex.source for split in small_splits.__dict__.values() for ex in split]
    assert len(set(sources)) == len(sources) == 400


def test_every_example_is_well_formed_and_unambiguous(small_splits):
    for ex in small_splits.train + small_splits.valid + small_splits.test:
        date = datetime.date.fromisoformat(dates.detokenize(ex.target))
        assert 1900 <= date.year <= 2099
        assert ex.spans[4] is None and ex.spans[7] is None
        for span in ex.spans:
            assert span is None or 0 <= span[0] < span[1] <= len(ex.source)
        year, _, day = spans_by_field(ex)
        assert year in (str(date.year), f"{date.year % 100:02d}")
        assert day.lstrip("0") == str(date.day)
        assert dates.readings(dates.detokenize(ex.source), SMALL) == {date}


def test_missing_babel_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "babel.dates", None)
    with pytest.raises(MissingDataDependency, match="attnzoo\\[data\\]"):
        dates.make_example(datetime.date(2005, 3, 4), "de_DE", "d MMMM y")


def test_repeated_month_names_give_every_reading():
    # Narrow month names repeat: "m" is both March and May in English.
    config = dates.DatesConfig(locales=("en_GB",), patterns=("d MMMMM y",))
    assert dates.readings("4 m 2005", config) == {
        datetime.date(2005, 3, 4),
        datetime.date(2005, 5, 4),
    }
    assert dates.readings("4 f 2005", config) == {datetime.date(2005, 2, 4)}
