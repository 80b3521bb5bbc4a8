import pytest

from attnzoo.tasks.sequences import SequenceConfig, make_example, make_splits


def test_examples_and_spans_exact():
    e = make_example([3, 1, 2], "reverse")
    assert e.target == ("2", "1", "3") and e.spans == ((2, 3), (1, 2), (0, 1))
    e = make_example([3, 1, 3, 0], "sort")
    assert e.target == ("0", "1", "3", "3")  # either "3" may be attended for either
    assert e.spans == ((3, 4), (1, 2), ((0, 1), (2, 3)), ((0, 1), (2, 3)))
    e = make_example([5, 6], "copy")
    assert e.target == e.source and e.spans == ((0, 1), (1, 2))


def test_splits_deterministic_disjoint_and_in_range():
    config = SequenceConfig(kind="sort", n_train=300, n_valid=30, n_test=40, max_len=9)
    a, b = make_splits(config), make_splits(config)
    assert a == b
    train = {e.source for e in a.train}
    assert not train & {e.source for e in a.test + a.valid}
    assert all(4 <= len(e.source) <= 9 for e in a.train)
    # growing the training set leaves the held-out sets unchanged
    bigger = make_splits(SequenceConfig(kind="sort", n_train=600, n_valid=30, n_test=40, max_len=9))
    assert bigger.test == a.test


@pytest.mark.parametrize(
    ("kw", "arg"),
    [
        (dict(kind="shuffle"), "kind"),
        (dict(min_len=5, max_len=3), "max_len"),
        (dict(min_len=0), "min_len"),  # was reported as max_len
        (dict(symbols=1), "symbols"),
    ],
)
def test_config_errors(kw, arg):
    with pytest.raises(ValueError, match=f"'{arg}'"):
        SequenceConfig(**kw)


def test_too_few_distinct_sequences_is_an_error():
    with pytest.raises(ValueError, match="enough distinct"):
        make_splits(SequenceConfig(symbols=2, min_len=1, max_len=2, n_train=50))
