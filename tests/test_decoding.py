import inspect
import itertools
from dataclasses import dataclass

import pytest
import torch

from attnzoo.decoding import beam_search, decode, greedy, sample

BOS, EOS, PAD = 1, 2, 0


@dataclass
class TableState:
    """A toy decoder: log-probs from a fixed table indexed by (row id, step, prev token)."""

    rows: torch.Tensor  # (batch,) which original example each row is
    step: int = 0

    @property
    def batch_size(self):
        return self.rows.shape[0]

    def reorder(self, index):
        return TableState(self.rows.index_select(0, index), self.step)


def table_step(table):
    def step(tokens, state):
        lp = table[state.rows, state.step, tokens]  # (batch, V)
        return lp, TableState(state.rows, state.step + 1)

    return step


def make_table():
    """Example 0: greedy takes token 3 (p=.6) then is forced to a bad continuation;
    beam search finds 4 (p=.4) then EOS with p=1."""
    V, T = 5, 4
    p = torch.full((1, T, V, V), 1e-9)
    p[0, 0, BOS] = torch.tensor([0, 0, 0, 0.6, 0.4])
    p[0, 1, 3] = torch.tensor([0, 0, 0.3, 0.35, 0.35])
    p[0, 1, 4] = torch.tensor([0, 0, 1.0, 0, 0])
    p[0, 2, 3] = torch.tensor([0, 0, 1.0, 0, 0])
    p[0, 2, 4] = torch.tensor([0, 0, 1.0, 0, 0])
    p[0, 3, :] = torch.tensor([0, 0, 1.0, 0, 0])
    p[0, :, PAD] = 0
    p = p.clamp_min(1e-9)
    return (p / p.sum(-1, keepdim=True)).log()


def test_greedy_takes_argmax_and_pads_after_eos():
    table = make_table()
    out = greedy(
        table_step(table),
        TableState(torch.tensor([0])),
        1,
        bos=BOS,
        eos=EOS,
        max_len=4,
        device=torch.device("cpu"),
    )
    assert out.tolist()[0][:3] == [3, 3, 2]


def test_beam_search_beats_greedy():
    table = make_table()
    out = beam_search(
        table_step(table),
        TableState(torch.tensor([0])),
        1,
        bos=BOS,
        eos=EOS,
        max_len=4,
        device=torch.device("cpu"),
        beam_size=2,
        length_penalty=0.0,
    )
    assert out.tolist()[0][:2] == [4, 2]


def test_beam_one_equals_greedy_on_random_tables():
    g = torch.Generator().manual_seed(0)
    table = torch.log_softmax(torch.randn(3, 6, 7, 7, generator=g), -1)
    rows = torch.arange(3)
    a = greedy(
        table_step(table),
        TableState(rows),
        3,
        bos=BOS,
        eos=EOS,
        max_len=6,
        device=torch.device("cpu"),
    )
    b = beam_search(
        table_step(table),
        TableState(rows),
        3,
        bos=BOS,
        eos=EOS,
        max_len=6,
        beam_size=1,
        device=torch.device("cpu"),
    )
    assert a.tolist() == b.tolist()


def _exhaustive_best(table, r, alpha):
    """The best sequence of example `r` under log p / length^alpha, by trying every sequence
    of table.shape[1] tokens (cut after its first EOS; one that never ends has length T)."""
    V, T = table.shape[-1], table.shape[1]
    best, best_score = None, -float("inf")
    for seq in itertools.product(range(V), repeat=T):
        trimmed = seq[: seq.index(EOS) + 1] if EOS in seq else seq
        score, prev = 0.0, BOS
        for t, tok in enumerate(trimmed):
            score += table[r, t, prev, tok].item()
            prev = tok
        score /= len(trimmed) ** alpha
        if score > best_score + 1e-9:
            best, best_score = trimmed, score
    return list(best)


def _assert_decodes_to(row, want):
    """`row` (a decoded row) is `want` then padding."""
    assert row.tolist()[: len(want)] == want
    assert all(x == PAD for x in row.tolist()[len(want) :])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_search_returns_highest_scoring_among_exhaustive(alpha):
    """With a beam as wide as all prefixes, the result is the exact best sequence under
    log p / length^alpha (a sequence that never ends is ranked at length T)."""
    g = torch.Generator().manual_seed(1)
    V, T = 4, 3
    table = torch.log_softmax(torch.randn(2, T, V, V, generator=g, dtype=torch.float64), -1)
    out = beam_search(
        table_step(table),
        TableState(torch.arange(2)),
        2,
        bos=BOS,
        eos=EOS,
        max_len=T,
        device=torch.device("cpu"),
        beam_size=V**T,
        length_penalty=alpha,
    )

    for r in range(2):
        _assert_decodes_to(out[r], _exhaustive_best(table, r, alpha))


@pytest.mark.parametrize("seed", [17, 27])
def test_beam_search_of_a_row_does_not_depend_on_the_other_rows(seed):
    """Rows stop searching at different steps; a row decoded beside others gives what it
    gives alone: a stopped row neither takes in later hypotheses nor lets its live ones
    compete at the end (with peaked tables and length normalisation, a live hypothesis can
    later outrank the finished ones it ranked below when its row stopped; these seeds'
    tables have such rows)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.log_softmax(6 * torch.randn(20, 8, 6, 6, generator=g), -1)
    common = dict(bos=BOS, eos=EOS, max_len=8, device="cpu", beam_size=3, length_penalty=1.0)
    together = beam_search(table_step(table), TableState(torch.arange(20)), 20, **common)
    for r in range(20):
        alone = beam_search(table_step(table), TableState(torch.tensor([r])), 1, **common)[0]
        width = min(len(alone), together.shape[1])
        assert together[r, :width].tolist() == alone[:width].tolist(), r
        assert (together[r, width:] == PAD).all() and (alone[width:] == PAD).all()


def test_beam_search_keeps_a_finished_hypothesis_live_ones_outrank_for_a_while():
    """[EOS] (log p = log .1) ends at step 1; the live [A, B] and [A, C] outrank it at step 2
    (log .9 + log .55, log .9 + log .45), then fall below it by the fourth token (each .33).
    Beam search kept finished hypotheses in the k live slots, so [EOS] gave up its place at
    step 2 and the search returned a worse, unfinished [A, B, A, A] (log p -3.2)."""
    A, B, C, V = 3, 4, 5, 6
    p = torch.full((1, 4, V, V), 1e-9, dtype=torch.float64)
    p[0, 0, BOS, EOS], p[0, 0, BOS, A] = 0.1, 0.9
    p[0, 1, A, B], p[0, 1, A, C] = 0.55, 0.45
    p[0, 2:, :, EOS], p[0, 2:, :, A], p[0, 2:, :, B], p[0, 2:, :, C] = 0.01, 0.33, 0.33, 0.33
    table = (p / p.sum(-1, keepdim=True)).log()
    common = dict(bos=BOS, eos=EOS, max_len=4, device="cpu", length_penalty=0.0)
    for k in (2, 3):
        out = beam_search(
            table_step(table), TableState(torch.tensor([0])), 1, beam_size=k, **common
        )
        assert out.tolist() == [[EOS] + [PAD] * (out.shape[1] - 1)], k


A, B, C = 3, 4, 5  # the hand-made tables' tokens (vocabulary of 6: PAD, BOS, EOS, A, B, C)


def _hand_table(spec, T=3, V=6):
    """Example 0's log-probs, float64: spec {(step, previous token): {token: p}}; every other
    token gets 1e-9 before normalising."""
    p = torch.full((1, T, V, V), 1e-9, dtype=torch.float64)
    for (t, previous), dist in spec.items():
        for token, q in dist.items():
            p[0, t, previous, token] = q
    return (p / p.sum(-1, keepdim=True)).log()


# [B, EOS] (log .25 / 2 = -0.69) beats [EOS] (-0.92) and [A, C, x] (log .0735 / 3 = -0.87)
# at alpha 1; at alpha 0 [EOS] (.4) beats every longer sequence.
EOS_FIRST = {
    (0, BOS): {EOS: 0.4, A: 0.35, B: 0.25},
    (1, A): {C: 0.7, EOS: 0.3},
    (1, B): {EOS: 1.0},
    (2, C): {EOS: 0.05, A: 0.3, B: 0.3, C: 0.3},
}


def test_beam_one_is_greedy_when_eos_is_the_second_best_first_token():
    """An EOS extension ranked below the first beam_size joins no finished hypotheses. When it
    did, [EOS] (p .4, the second best first token) made beam_size 1 return [EOS], the best
    sequence at alpha 0 (.4 against .6 * .55), where greedy search takes A (.6), A (.55), EOS."""
    table = _hand_table(
        {(0, BOS): {A: 0.6, EOS: 0.4}, (1, A): {A: 0.55, B: 0.45}, (2, A): {EOS: 1.0}}
    )
    out = _one_row(beam_search, table, beam_size=1, length_penalty=0.0)
    assert torch.equal(out, _one_row(greedy, table))
    _assert_decodes_to(out[0], [A, A, EOS])  # the argmax at each step, read off the table


@pytest.mark.parametrize(
    ("spec", "beam_size", "want"),
    [
        # [EOS] (log .45 = -0.80) outranks the best live [A, B] (log .1925 / 2 = -0.82) at
        # step 1, but [A, B, EOS] (-0.55) wins: a row stopped when its BEST finished one (not
        # its beam_size-th) outranked its live ones returned [EOS]
        (
            {
                (0, BOS): {EOS: 0.45, A: 0.55},
                (1, A): {B: 0.35, C: 0.33, EOS: 0.32},
                (2, B): {EOS: 1.0},
            },
            6**3,
            [A, B, EOS],
        ),
        # at step 1 [A, EOS] (log .276 / 2 = -0.64) outranks the live [A, C] unnormalised
        # (log .312 = -1.16) but not normalised (-0.58); [A, C, EOS] wins (-0.39)
        (
            {
                (0, BOS): {A: 0.6, EOS: 0.35, B: 0.05},
                (1, A): {C: 0.52, EOS: 0.46},
                (2, C): {EOS: 0.99},
            },
            2,
            [A, C, EOS],
        ),
        # [EOS] takes one of the top 2 first extensions; A and B must both go on for [B, EOS]
        (EOS_FIRST, 2, [B, EOS]),
    ],
    ids=["best-finished-outranks-live", "live-normalised", "eos-in-the-top-k"],
)
def test_beam_search_finds_the_exhaustive_best_on_hand_made_tables(spec, beam_size, want):
    """Beam search at alpha 1 returns the best sequence found by exhaustive search."""
    table = _hand_table(spec)
    assert _exhaustive_best(table, 0, 1.0) == want  # the table is the one described
    out = _one_row(beam_search, table, beam_size=beam_size, length_penalty=1.0)
    _assert_decodes_to(out[0], want)


@pytest.mark.parametrize("engine", [greedy, sample, beam_search])
@pytest.mark.parametrize(
    ("change", "kind", "pattern"),
    [
        (dict(max_len=0), ValueError, "'max_len' expected a positive int, got 0"),
        (dict(max_len=2.0), ValueError, "'max_len'"),
        (dict(bos=1.0), TypeError, "'bos' expected an int token id, got 1.0"),
        (dict(eos=True), TypeError, "'eos'"),
        (dict(pad=None), TypeError, "'pad'"),
        (dict(batch=-1), ValueError, "'batch' expected a non-negative int"),
    ],
    ids=["max_len-0", "max_len-float", "bos-float", "eos-bool", "pad-none", "batch-negative"],
)
def test_engine_arguments_are_refused_by_name(engine, change, kind, pattern):
    """Before a step runs: a max_len of 0 stacked no step, a float start token was cast."""
    args = dict(batch=1, bos=BOS, eos=EOS, max_len=3, pad=PAD) | change
    batch = args.pop("batch")
    with pytest.raises(kind, match=f"{engine.__name__}: argument {pattern}"):
        engine(table_step(make_table()), TableState(torch.tensor([0])), batch, device="cpu", **args)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (dict(beam_size=0), "'beam_size' expected an int >= 1, got 0"),
        (dict(beam_size=1.5), "'beam_size'"),
        (dict(length_penalty=float("nan")), "'length_penalty'"),
    ],
)
def test_beam_options_are_refused_by_name(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        _one_row(beam_search, make_table(), **change)


def _one_row(engine, table, **options):
    """`engine` over example 0 of `table`, up to 3 tokens, on the CPU."""
    return engine(
        table_step(table),
        TableState(torch.tensor([0])),
        1,
        bos=BOS,
        eos=EOS,
        max_len=3,
        device="cpu",
        **options,
    )


def test_decode_is_greedy_at_beam_1_and_beam_search_above():
    g = torch.Generator().manual_seed(2)
    table = torch.log_softmax(torch.randn(3, 5, 6, 6, generator=g), -1)
    common = dict(bos=BOS, eos=EOS, max_len=5, device=torch.device("cpu"))
    rows = torch.arange(3)
    for k, search, extra in ((1, greedy, {}), (3, beam_search, {"beam_size": 3})):
        want = search(table_step(table), TableState(rows), 3, **common, **extra)
        got = decode(table_step(table), TableState(rows), 3, beam_size=k, **common)
        assert torch.equal(got, want)


def test_decode_ranks_beams_by_the_default_length_penalty():
    """decode (what every task calls) passes no length_penalty: beam search's default, plain
    length normalisation (alpha 1, as its docstring says), ranks the hypotheses. On this table
    alpha 0 would return [EOS]."""
    alpha = inspect.signature(beam_search).parameters["length_penalty"].default
    assert alpha == 1.0
    table = _hand_table(EOS_FIRST)
    want = _exhaustive_best(table, 0, alpha)
    assert want != _exhaustive_best(table, 0, 0.0)
    _assert_decodes_to(_one_row(decode, table, beam_size=2)[0], want)


@pytest.mark.parametrize("default", [torch.float64, torch.float16])
def test_engine_tensors_do_not_follow_the_default_dtype(default, device):
    """Token ids are long and scores float32 whatever torch's default dtype, on `device`
    (meta included: the engine runs to max_len there, where no row can be seen to end)."""
    table = torch.log_softmax(
        torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(3)), -1
    )
    table = table.to(device)
    rows = torch.arange(2, device=device)
    common = dict(bos=BOS, eos=EOS, max_len=4, device=device)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for k in (1, 3):
            out = decode(table_step(table), TableState(rows), 2, beam_size=k, **common)
            assert out.dtype == torch.long and out.device.type == device.type
        tokens, log_prob = sample(table_step(table), TableState(rows), 2, **common)
    finally:
        torch.set_default_dtype(previous)
    assert tokens.dtype == torch.long and tokens.device.type == device.type
    assert log_prob.dtype == torch.float32 and log_prob.device.type == device.type
    want = decode(table_step(table), TableState(rows), 2, beam_size=3, **common)
    assert out.shape == want.shape
    if device.type != "meta":  # (meta: shapes, no values)
        assert torch.equal(out, want)  # beam scores in float32 either way


@pytest.mark.parametrize("engine", [greedy, sample, beam_search])
def test_a_nan_log_probability_is_an_error_not_a_token(engine):
    """argmax and topk pick a NaN's index as if it were the best token: a diverged decoder
    would decode plausible-looking output. -inf stays a legitimate log-probability."""
    table = make_table()
    table[0, 1, :, 3] = float("-inf")  # a token masked out at step 1: fine
    _one_row(engine, table)
    table[0, 1, :, 2] = float("nan")  # the decoder's output at step 1, whatever came before
    with pytest.raises(
        ValueError,
        match=f"{engine.__name__}: argument 'step' expected finite log-probabilities.*at step 1",
    ):
        _one_row(engine, table)


@pytest.mark.parametrize("engine", [greedy, sample, beam_search])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_batch_other_than_the_states_is_refused(engine, batch):
    """Beam search repeated the state's first `batch` rows: a larger state decoded its first
    rows and dropped the rest without a word (a smaller one failed inside index_select)."""
    state = TableState(torch.tensor([0, 0]))
    with pytest.raises(
        ValueError,
        match=f"{engine.__name__}: argument 'batch' expected the rows of 'state' "
        rf"\(2\), got {batch}",
    ):
        engine(table_step(make_table()), state, batch, bos=BOS, eos=EOS, max_len=3, device="cpu")


def test_a_float64_decoders_sampled_log_probability_stays_float64():
    """A float64 policy's sampled log-probability trains it by REINFORCE: `sample` rounded the
    log-probabilities to float32 (`.float()`), so its gradient was float32-rounded. It equals
    the sum of the chosen tokens' float64 log-probabilities."""
    g = torch.Generator().manual_seed(1)
    table = torch.log_softmax(torch.randn(1, 4, 6, 6, dtype=torch.float64, generator=g), -1)
    common = dict(bos=BOS, eos=EOS, max_len=4, device=torch.device("cpu"))
    state = TableState(torch.zeros(1, dtype=torch.long))
    tokens, log_prob = sample(table_step(table), state, 1, generator=g.manual_seed(0), **common)
    assert log_prob.dtype == torch.float64
    assert log_prob.item() == pytest.approx(_sequence_log_prob(table, 0, tokens[0]), rel=1e-15)


def _sequence_log_prob(table, r, tokens):
    """The sum of example `r`'s log-probs of `tokens` up to and including the first EOS."""
    previous, total = BOS, 0.0
    for t, token in enumerate(tokens.tolist()):
        total += table[r, t, previous, token].item()
        if token == EOS:
            break
        previous = token
    return total


def test_sampled_log_probability_stops_at_each_rows_own_eos():
    """Row 0 ends at its first token (EOS, p .96); row 1 (EOS p 1e-6) goes on to max_len. The
    log-probabilities of the tokens drawn for row 0 after its EOS must not count."""
    V, T = 5, 4
    p = torch.full((2, T, V, V), 1.0 / V, dtype=torch.float64)
    p[0, 0, BOS] = torch.tensor([0.01, 0.01, 0.96, 0.01, 0.01])
    p[1, :, :, EOS] = 1e-6
    table = (p / p.sum(-1, keepdim=True)).log()
    tokens, log_prob = sample(
        table_step(table),
        TableState(torch.arange(2)),
        2,
        bos=BOS,
        eos=EOS,
        max_len=T,
        device="cpu",
        generator=torch.Generator().manual_seed(0),
    )
    assert tokens[0, 0] == EOS and tokens.shape[1] == T  # row 0 ended while row 1 went on
    for r in range(2):
        assert log_prob[r].item() == pytest.approx(
            _sequence_log_prob(table, r, tokens[r]), rel=1e-12
        )
