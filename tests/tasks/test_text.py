import json
import math
import sys

import numpy as np
import pytest
import torch

from attnzoo.tasks.base import INSTALL_HINT, MissingDataDependency, require
from attnzoo.tasks.sequences import make_example
from attnzoo.tasks.text import Example, Vocab, alignment_score, bleu, chrf, exact_match

# --- Example -----------------------------------------------------------------------------


def test_example_accepts_spans_inside_the_source():
    ex = Example(source=("a", "b", "c"), target=("x", "-"), spans=((0, 3), None))
    assert ex.spans == ((0, 3), None)
    assert Example(source=("a",), target=("x", "y")).spans is None


@pytest.mark.parametrize(
    "spans",
    [((0, 4), None), ((2, 2), None), ((-1, 1), None), ((0, 1),)],
    ids=["past-end", "empty", "negative", "one-per-target"],
)
def test_example_rejects_bad_spans(spans):
    with pytest.raises(ValueError):
        Example(source=("a", "b", "c"), target=("x", "-"), spans=spans)


# --- Vocab -------------------------------------------------------------------------------


def test_vocab_build_orders_by_frequency_then_token():
    vocab = Vocab.build([["b", "a", "b"], ["c", "a", "b", "d"]])
    assert vocab.tokens == ("<pad>", "<bos>", "<eos>", "<unk>", "b", "a", "c", "d")
    assert (Vocab.PAD, Vocab.BOS, Vocab.EOS, Vocab.UNK) == (0, 1, 2, 3)
    assert len(vocab) == 8


def test_vocab_build_max_size_counts_specials_and_min_freq_drops_rare():
    sequences = [["b", "a", "b"], ["c", "a", "b", "d"]]
    assert Vocab.build(sequences, max_size=6).tokens[4:] == ("b", "a")
    assert Vocab.build(sequences, min_freq=2).tokens[4:] == ("b", "a")
    assert Vocab.build(sequences, max_size=4).tokens == Vocab.SPECIALS
    with pytest.raises(ValueError, match="max_size must be at least"):
        Vocab.build(sequences, max_size=3)


def test_vocab_build_does_not_duplicate_special_tokens_in_data():
    vocab = Vocab.build([["<unk>", "a", "<pad>"]])
    assert vocab.tokens == (*Vocab.SPECIALS, "a")


def test_vocab_encode():
    vocab = Vocab.build([["b", "a", "b"]])  # b = 4, a = 5
    assert vocab.encode(["a", "b", "zzz"]) == [5, 4, Vocab.UNK]
    assert vocab.encode(["a"], add_bos=True, add_eos=True) == [Vocab.BOS, 5, Vocab.EOS]
    assert vocab.encode([], add_eos=True) == [Vocab.EOS]


def test_vocab_decode_stops_at_eos_and_shows_pad_and_bos():
    """A <pad> or <bos> a decoder wrote before its end stays in its output: decode skipped
    them, and a wrong output scored as an exact match."""
    vocab = Vocab.build([["b", "a", "b"]])
    assert vocab.decode([5, 0, 4, 1, 3, 2, 5, 5]) == ["a", "<pad>", "b", "<bos>", "<unk>"]
    assert vocab.decode(torch.tensor([4, 4, 2, 0])) == ["b", "b"]
    assert vocab.decode(np.array([5])) == ["a"]


def test_vocab_round_trips_through_json():
    vocab = Vocab.build([["ü", "a", "ü"], ["<", "é"]])
    restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab
    assert restored.tokens == vocab.tokens
    tokens = ["a", "ü", "é"]
    assert restored.decode(vocab.encode(tokens, add_eos=True)) == tokens


def test_vocab_rejects_missing_specials_and_duplicates():
    with pytest.raises(ValueError, match="a Vocab must start with"):
        Vocab(["a", "b"])
    with pytest.raises(ValueError, match="duplicate tokens"):
        Vocab([*Vocab.SPECIALS, "a", "a"])


# --- alignment_score ---------------------------------------------------------------------

# Row argmaxes: 1, 3, 0.
WEIGHTS = [
    [0.1, 0.6, 0.2, 0.1],
    [0.0, 0.1, 0.2, 0.7],
    [0.5, 0.2, 0.2, 0.1],
]


@pytest.mark.parametrize("as_type", [np.array, torch.tensor], ids=["numpy", "torch"])
def test_alignment_score_counts_argmax_inside_span(as_type):
    # Position 0: 1 in [0, 2) hit; 1: no span; 2: 0 not in [1, 3), miss.
    assert alignment_score(as_type(WEIGHTS), [(0, 2), None, (1, 3)]) == (1, 2)
    # Half-open: the end is excluded.
    assert alignment_score(as_type(WEIGHTS), [(0, 1), (3, 4), (0, 1)]) == (2, 3)


def test_alignment_score_of_several_ranges_hits_inside_any_of_them():
    # argmaxes 1, 3, 0: position 0 in the second range, 1 in neither, 2 in the first
    spans = [((3, 4), (1, 2)), ((0, 1), (2, 3)), ((0, 1), (3, 4))]
    assert alignment_score(np.array(WEIGHTS), spans) == (2, 3)
    with pytest.raises(ValueError, match="outside a source of length 2"):
        Example(("a", "b"), ("b",), (((1, 2), (2, 3)),))


def test_sort_alignment_accepts_every_copy_of_a_repeated_symbol():
    """Attention on either "3" of a sorted [3, 1, 3, 0] is right for either "3" of the
    output; the single symbols keep their one position."""
    e = make_example([3, 1, 3, 0], "sort")
    for j in (0, 2):  # all of both "3" rows on source position j
        weights = np.zeros((4, 4))
        weights[[0, 1], [3, 1]] = 1.0
        weights[[2, 3], j] = 1.0
        assert alignment_score(weights, e.spans) == (4, 4)
    weights[2:] = np.eye(4)[1]  # the "3"s on the "1": misses
    assert alignment_score(weights, e.spans) == (2, 4)


def test_alignment_score_ignores_spans_past_the_weight_rows():
    assert alignment_score(np.array(WEIGHTS[:2]), [(1, 2), (3, 4), (0, 1)]) == (2, 2)


def test_alignment_score_ties_go_to_the_first_position():
    assert alignment_score(np.full((1, 3), 1 / 3), [(0, 1)]) == (1, 1)
    assert alignment_score(np.full((1, 3), 1 / 3), [(1, 3)]) == (0, 1)


def test_alignment_score_accepts_grad_tensors_and_rejects_wrong_rank():
    weights = torch.tensor(WEIGHTS, requires_grad=True)
    assert alignment_score(weights, [None, None, None]) == (0, 0)
    with pytest.raises(ValueError, match=r"weights must be \(target_len, source_len\)"):
        alignment_score(np.zeros((2, 3, 4)), [None, None])


# --- metrics -----------------------------------------------------------------------------


def test_exact_match():
    assert exact_match([["a", "b"], ["c"]], [["a", "b"], ["d"]]) == 0.5
    assert exact_match([("a",)], [["a"]]) == 1.0
    with pytest.raises(ValueError, match="1 predictions for 2 references"):
        exact_match([["a"]], [["a"], ["b"]])
    with pytest.raises(ValueError, match="no examples"):
        exact_match([], [])


def test_exact_match_needs_the_whole_sequence_not_a_prefix():
    """A prediction that starts with its reference but goes on is no match (nor is one that
    stops short): comparing only the reference's length of it counted the first as exact."""
    assert exact_match([["a", "b", "extra"], ["c"]], [["a", "b"], ["c"]]) == 0.5
    assert exact_match([["a"]], [["a", "b"]]) == 0.0


def test_bleu_of_identical_text_is_100_and_disjoint_is_0():
    text = ["the cat sat on the mat .", "a dog barked at the moon"]
    assert bleu(text, text) == pytest.approx(100.0)
    assert bleu(["w x y z v"], ["a b c d e"]) == pytest.approx(0.0)


def test_bleu_matches_hand_computed_precisions():
    # Clipped n-gram precisions 5/6, 3/5, 2/4, 1/3; equal lengths, so no brevity penalty.
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected)


def test_bleu_of_a_prefix_is_the_brevity_penalty():
    """BLEU = BP * exp(mean_n ln p_n), BP = exp(1 - r / c) when the hypotheses' length c is
    below the references' r. A 6-word prefix of a 12-word reference: every n-gram of it is in
    the reference (p_n = 1), so BLEU = 100 exp(1 - 12 / 6). With the two swapped, the
    12-word side is the hypothesis: BP = 1 and p_n < 1."""
    reference = "a b c d e f g h i j k l"
    assert bleu(["a b c d e f"], [reference]) == pytest.approx(100 * math.exp(1 - 12 / 6))
    swapped = 100 * (6 / 12 * 5 / 11 * 4 / 10 * 3 / 9) ** 0.25  # p_n = (7 - n) / (13 - n)
    assert bleu([reference], ["a b c d e f"]) == pytest.approx(swapped)


def test_bleu_tokenizes_punctuation_apart_13a():
    """sacrebleu's 13a tokenizer splits "e." into "e ." and "e!" into "e !": 6 tokens each,
    5 shared, so the clipped precisions are 5/6, 4/5, 3/4, 2/3 (product 1/3), equal lengths,
    BLEU = 100 (1/3)^(1/4). Whitespace tokens alone ("e." vs "e!") would give 4/5 ... 1/2."""
    expected = 100 * (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25
    assert bleu(["a b c d e."], ["a b c d e!"]) == pytest.approx(expected)


def test_chrf_of_identical_text_is_100():
    text = ["the cat sat on the mat .", "a dog barked"]
    assert chrf(text, text) == pytest.approx(100.0)
    assert chrf(["abc"], ["xyz"]) == pytest.approx(0.0)


def test_metrics_reject_length_mismatch():
    with pytest.raises(ValueError, match="1 hypotheses for 2 references"):
        bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="1 hypotheses for 0 references"):
        chrf(["a"], [])


# --- optional dependencies ---------------------------------------------------------------


def test_require_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(MissingDataDependency, match="attnzoo\\[data\\]") as info:
        bleu(["a b c d"], ["a b c d"])
    assert isinstance(info.value, ModuleNotFoundError)
    assert info.value.name == "sacrebleu"
    assert INSTALL_HINT in str(info.value)


def test_require_returns_the_module():
    assert require("json") is json
