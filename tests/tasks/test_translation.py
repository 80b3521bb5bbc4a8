from types import SimpleNamespace

import pytest
import torch

from attnzoo.tasks.base import EvalConfig
from attnzoo.tasks.text import Example, Splits, Vocab
from attnzoo.tasks.translation import MIN_BUCKET, TranslationTask, length_buckets


def test_length_buckets_merge_a_short_bucket_into_the_next():
    lengths = [1, 2, 5, 5, 6, 9, 9]  # edges 1 | 3 | 6 | 10: buckets of 2, 2, 3 items
    assert length_buckets(lengths, [1, 3, 6, 10], least=3) == [
        (1, 6, [0, 1, 2, 3]),
        (6, 10, [4, 5, 6]),
    ]


def test_length_buckets_merge_a_short_last_bucket_into_the_one_before():
    lengths = [1, 1, 1, 4, 4, 4, 7]
    assert length_buckets(lengths, [1, 3, 6, 10], least=3) == [
        (1, 3, [0, 1, 2]),
        (3, 10, [3, 4, 5, 6]),
    ]


def test_length_buckets_drop_empty_buckets_and_keep_one_when_all_are_few():
    assert length_buckets([1, 8], [1, 3, 6, 10], least=3) == [(1, 10, [0, 1])]
    assert length_buckets([1, 1, 1, 8, 8, 8], [1, 3, 6, 10], least=3) == [
        (1, 3, [0, 1, 2]),
        (6, 10, [3, 4, 5]),
    ]
    assert length_buckets([], [1, 3], least=3) == []


@pytest.mark.parametrize("least", [1, MIN_BUCKET])
def test_length_buckets_partition_the_items(least):
    lengths = torch.randint(1, 60, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    lengths += [1] * 3 + [59] * 2  # short edge buckets
    buckets = length_buckets(lengths, [1, 2, 10, 20, 30, 40, 50, 58, 60], least=least)
    assert sorted(k for _, _, picked in buckets for k in picked) == list(range(len(lengths)))
    assert all(len(picked) >= least for _, _, picked in buckets)
    for (lo, hi, picked), (next_lo, _, _) in zip(buckets, [*buckets[1:], (60, 0, 0)], strict=True):
        assert hi == next_lo or hi == 60
        assert all(lo <= lengths[k] < hi for k in picked)


def test_by_source_length_reports_no_bucket_under_min_bucket():
    """Built as the length experiment builds it; its first bucket (lengths 4-5) would hold
    fewer than MIN_BUCKET of the 400 test sequences of lengths 4..40."""
    from attnzoo import runs

    config = runs.apply_overrides(
        runs.default_config("bahdanau", "reverse"),
        [
            *("task.min_len=4", "task.max_len=40", "task.n_test=400", "task.n_train=400"),
            *("eval.limit=400", "model.hidden=8", "model.embed_dim=4"),
        ],
    )
    task, model = runs.build(config)
    lengths = [len(e.source) for e in task.examples()]
    edges = [4, 6, 10, 20, 30, 41]
    assert 0 < sum(4 <= n < 6 for n in lengths) < MIN_BUCKET
    model.eval()
    with torch.no_grad():
        rows = task.by_source_length(model, edges)
    assert [(r["min_len"], r["max_len"]) for r in rows] == [(4, 9), (10, 19), (20, 29), (30, 40)]
    assert sum(r["n"] for r in rows) == len(lengths) == 400
    assert min(r["n"] for r in rows) >= MIN_BUCKET
    # the buckets' exact matches average to evaluate's, with every third output wrong
    task.translate = lambda model, examples: [
        list(e.target) if k % 3 else ["x"] for k, e in enumerate(examples)
    ]
    rows = task.by_source_length(model, edges)
    overall = task.evaluate(model)["exact_match"]
    assert 0.6 < overall < 0.7
    assert sum(r["exact_match"] * r["n"] for r in rows) / 400 == pytest.approx(overall)


@pytest.mark.parametrize("model_name", ["bahdanau", "transformer"])
def test_the_alignment_figure_shows_the_attention_of_the_models_own_output(
    model_name, monkeypatch, tmp_path
):
    """Its rows were the reference's tokens, teacher-forced, under a title giving the model's
    output and an axis saying 'output': the figure now draws what the explorer draws, the
    attention the model had when it wrote each token of its own output."""
    from tests.test_devices import tiny_config

    from attnzoo import runs, viz

    task, model = runs.build(tiny_config(model_name, "dates"))
    model.eval()
    drawn, draw = [], viz.alignment_figure

    def capture(weights, source, target, title=None):
        drawn.append((weights, source, target, title))
        return draw(weights, source, target, title=title)

    monkeypatch.setattr(viz, "alignment_figure", capture)
    with torch.no_grad():
        task.figures(model, tmp_path, count=2)
        examples = task.examples()[:2]
        outputs = task.translate(model, examples)
        assert len(drawn) == 2
        for (weights, source, rows, title), e, out in zip(drawn, examples, outputs, strict=True):
            assert rows == task.output_labels(out) and source == [*e.source, "<eos>"]
            torch.testing.assert_close(weights, task.attention_of(model, e, out)[0])
            note = "\n(last layer's cross-attention, mean over heads)"
            wanted = f"reference: {task.detokenize(e.target)}"
            assert title == wanted + (note if model_name == "transformer" else "")


@pytest.mark.parametrize("max_vocab", [None, len(Vocab.SPECIALS) + 2])
@pytest.mark.parametrize("side", ["source", "target"])
def test_each_vocabulary_holds_only_training_tokens(side, max_vocab):
    """Per side, the training tokens by frequency (a 3, b 2, c 1), cut to max_vocab: a token
    seen only in validation or test, however frequent there, maps to <unk>."""

    def example(tokens):
        return Example(tuple(tokens), tuple(tokens.upper()))

    train = [example("ab"), example("abc"), example("a")]
    held_out = [example("vvvvv"), example("ttttttt")]
    splits = Splits(train, held_out[:1], held_out[1:])
    task = TranslationTask(
        splits,
        " ".join,
        metric="exact_match",
        seed=0,
        eval_config=EvalConfig(),
        max_vocab=max_vocab,
    )
    vocab = {"source": task.source_vocab, "target": task.target_vocab}[side]
    words = ("a", "b", "c") if max_vocab is None else ("a", "b")
    case = str.upper if side == "target" else str
    assert vocab.tokens == (*Vocab.SPECIALS, *map(case, words))


class TableDecoder(torch.nn.Module):
    """A causal stub: the logits at each step are a fixed row of `table` chosen by the token
    the decoder reads there (logits = table[target_in])."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, source, lengths, target_in):
        return SimpleNamespace(logits=self.table[target_in])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_loss_scores_each_target_and_its_eos_given_bos_and_the_target_so_far(
    label_smoothing,
):
    """Teacher forcing (Bahdanau 2015, Luong 2015, Vaswani 2017): the decoder reads [BOS, y]
    and is scored on [y, EOS], the padding of the shorter targets not scored nor counted,
    with label smoothing eps: (1 - eps) (-log p_y) + eps mean_k (-log p_k); the float64 sum
    written out here, and the count sum(len(y) + 1)."""

    def example(source, target):
        return Example(tuple(source), tuple(target))

    train = [example("ab", "A"), example("abc", "BCAB"), example("ca", "CA"), example("b", "")]
    splits = Splits(train, train[:1], train[:1])
    task = TranslationTask(
        splits,
        " ".join,
        metric="exact_match",
        seed=0,
        eval_config=EvalConfig(label_smoothing=label_smoothing),
    )
    vocab = task.target_vocab
    table = torch.randn(len(vocab), len(vocab), generator=torch.Generator().manual_seed(0))
    table = table.double()
    pairs = [
        (task.source_vocab.encode(e.source, add_eos=True), vocab.encode(e.target)) for e in train
    ]
    assert len({len(y) for _, y in pairs}) > 1  # the batch holds padding
    loss, count = task.loss(TableDecoder(table), task.collate(pairs))
    eps, expected, tokens = label_smoothing, 0.0, 0
    for _, y in pairs:
        for read, target in zip([Vocab.BOS, *y], [*y, Vocab.EOS], strict=True):
            log_p = torch.log_softmax(table[read], -1).tolist()
            expected += (1 - eps) * -log_p[target] + eps * -sum(log_p) / len(log_p)
            tokens += 1
    assert count == tokens == sum(len(e.target) + 1 for e in train)
    assert float(loss) == pytest.approx(expected, rel=1e-12)
