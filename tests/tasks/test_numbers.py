import random
import sys

import pytest

from attnzoo.tasks import numbers
from attnzoo.tasks.base import MissingDataDependency

num2words = pytest.importorskip("num2words").num2words

NINE_NINE_NINE = ("neun", "hundert", "neun", "und", "neunzig")
SMALL = numbers.NumbersConfig(n_train=300, n_valid=50, n_test=50, seed=5)


# --- exact examples ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "source", "spans"),
    [
        # '3' <- drei, '2' <- zwanzig, '4' <- vier: the units come before the tens.
        (324, ("drei", "hundert", "vier", "und", "zwanzig"), ((0, 1), (4, 5), (2, 3))),
        # Both digits of a teen come from the teen word.
        (17, ("siebzehn",), ((0, 1), (0, 1))),
        (10, ("zehn",), ((0, 1), (0, 1))),
        # Zeros no morpheme names have no span.
        (1000, ("ein", "tausend"), ((0, 1), None, None, None)),
        (304, ("drei", "hundert", "vier"), ((0, 1), None, (2, 3))),
        (20, ("zwanzig",), ((0, 1), None)),
        (0, ("null",), ((0, 1),)),
        (1, ("eins",), ((0, 1),)),
        (101, ("ein", "hundert", "eins"), ((0, 1), None, (2, 3))),
        (21_000, ("ein", "und", "zwanzig", "tausend"), ((2, 3), (0, 1), None, None, None)),
        (
            101_000,  # num2words writes "einhunderteinstausend"; corrected to "ein"
            ("ein", "hundert", "ein", "tausend"),
            ((0, 1), None, (2, 3), None, None, None),
        ),
        (
            999_999,
            (*NINE_NINE_NINE, "tausend", *NINE_NINE_NINE),
            ((0, 1), (4, 5), (2, 3), (6, 7), (10, 11), (8, 9)),
        ),
    ],
)
def test_digit_spans(value, source, spans):
    ex = numbers.make_example(value)
    assert ex.source == source
    assert ex.target == tuple(str(value))
    assert ex.spans == spans


def test_segment_prefers_the_longest_morpheme():
    assert numbers.segment("achtzehn") == ("achtzehn",)
    assert numbers.segment("achtundachtzig") == ("acht", "und", "achtzig")
    assert numbers.segment("sechsundsechzig") == ("sechs", "und", "sechzig")
    assert numbers.segment("dreißigtausendzwölf") == ("dreißig", "tausend", "zwölf")
    with pytest.raises(ValueError, match="no morpheme at 'hallo'"):
        numbers.segment("vierzighallo")


@pytest.mark.parametrize("tokens", [("tausend",), ("und",), ("vier", "und"), ("zehn", "zehn"), ()])
def test_parse_rejects_sequences_outside_the_grammar(tokens):
    with pytest.raises(ValueError):
        numbers.parse(tokens)


def test_german_words_fixes_only_eins_before_tausend():
    assert numbers.german_words(101_000) == "einhunderteintausend"
    assert numbers.german_words(1_001) == "eintausendeins"
    assert numbers.german_words(301_001) == "dreihunderteintausendeins"


# --- consistency with num2words ----------------------------------------------------------


def digit_of(morpheme, position_in_teen):
    if morpheme in numbers.UNITS:
        return numbers.UNITS[morpheme]
    if morpheme in numbers.TENS:
        return numbers.TENS[morpheme] // 10
    if morpheme in numbers.TEENS:
        return (1, numbers.TEENS[morpheme] % 10)[position_in_teen]
    assert morpheme == "null"
    return 0


def test_random_values_segment_parse_and_align_consistently():
    rng = random.Random(0)
    values = [rng.randint(0, numbers.MAX_SUPPORTED) for _ in range(300)]
    values += [rng.randint(0, 1000) for _ in range(100)]
    for value in values:
        ex = numbers.make_example(value)
        assert numbers.detokenize(ex.source) == numbers.german_words(value)
        assert numbers.parse(ex.source) == (value, ex.spans)
        teen_seen = set()
        for digit, span in zip(ex.target, ex.spans, strict=True):
            if span is None:
                assert digit == "0"
                continue
            assert span[1] == span[0] + 1 <= len(ex.source)
            morpheme = ex.source[span[0]]
            second = int(morpheme in numbers.TEENS and span in teen_seen)
            teen_seen.add(span)
            assert int(digit) == digit_of(morpheme, second)


def test_english_target_tokens_and_round_trip():
    ex = numbers.make_example(1_324, target="english")
    assert ex.target == ("one", "thousand", ",", "three", "hundred", "and", "twenty", "-", "four")
    assert ex.spans is None
    assert numbers.detokenize(ex.target, "english") == "one thousand, three hundred and twenty-four"
    rng = random.Random(1)
    for value in [0, 21, 100, 101_000] + [rng.randint(0, 999_999) for _ in range(200)]:
        tokens = numbers.make_example(value, target="english").target
        assert numbers.detokenize(tokens, "english") == num2words(value, lang="en")
        assert set(tokens) <= numbers.ENGLISH_VOCABULARY


def test_detokenize_tells_the_vocabularies_apart():
    assert not numbers.ENGLISH_VOCABULARY & {*numbers.MORPHEMES, *"0123456789"}
    assert numbers.detokenize(("vier", "und", "zwanzig")) == "vierundzwanzig"
    assert numbers.detokenize(("2", "4")) == "24"
    assert numbers.detokenize(("twenty", "-", "four", "thousand", ",", "one")) == (
        "twenty-four thousand, one"
    )


def test_bad_values_and_targets_are_rejected():
    with pytest.raises(ValueError, match="value must be in 0..999999, got 1000000"):
        numbers.make_example(1_000_000)
    with pytest.raises(ValueError, match="value must be in 0..999999, got -1"):
        numbers.make_example(-1)
    with pytest.raises(ValueError, match="target must be 'digits' or 'english'"):
        numbers.make_example(5, target="french")
    with pytest.raises(ValueError, match="target must be 'digits' or 'english'"):
        numbers.detokenize(["5"], target="french")


# --- splits ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_splits():
    return numbers.make_splits(SMALL)


def test_split_sizes_and_determinism(small_splits):
    sizes = (len(small_splits.train), len(small_splits.valid), len(small_splits.test))
    assert sizes == (300, 50, 50)
    assert numbers.make_splits(SMALL) == small_splits
    other = numbers.make_splits(numbers.NumbersConfig(n_train=300, n_valid=50, n_test=50, seed=6))
    assert other.test != small_splits.test


def test_splits_are_disjoint_and_held_out_is_stable(small_splits):
    sources = [ex.source for split in small_splits.__dict__.values() for ex in split]
    assert len(set(sources)) == len(sources)
    bigger = numbers.make_splits(numbers.NumbersConfig(n_train=350, n_valid=50, n_test=50, seed=5))
    assert bigger.test == small_splits.test and bigger.valid == small_splits.valid


def test_small_range_uses_every_value_once():
    config = numbers.NumbersConfig(n_train=8, n_valid=1, n_test=2, max_value=10)
    splits = numbers.make_splits(config)
    values = [int("".join(ex.target)) for split in splits.__dict__.values() for ex in split]
    assert sorted(values) == list(range(11))
    # one value too few: refused by the config, naming the field and the least that fits
    with pytest.raises(ValueError, match="argument 'max_value' expected at least .* 11 .*got 10"):
        numbers.NumbersConfig(n_train=9, n_valid=1, n_test=2, max_value=10)


def test_english_splits_share_values_with_digit_splits():
    config = numbers.NumbersConfig(n_train=20, n_valid=5, n_test=5, seed=5, target="english")
    english = numbers.make_splits(config)
    digits = numbers.make_splits(numbers.NumbersConfig(n_train=20, n_valid=5, n_test=5, seed=5))
    assert [ex.source for ex in english.test] == [ex.source for ex in digits.test]
    assert all(ex.spans is None for ex in english.train)
    with pytest.raises(
        ValueError, match=r"argument 'target' expected one of \['digits', 'english'\]"
    ):
        numbers.make_splits(numbers.NumbersConfig(target="roman"))


def test_missing_num2words_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "num2words", None)
    with pytest.raises(MissingDataDependency, match="attnzoo\\[data\\]"):
        numbers.make_example(24)
