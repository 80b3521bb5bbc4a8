import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnzoo.models.pointer_net import BOS, PointerNet, PointerNetConfig

SMALL = PointerNetConfig(hidden=12, attn_hidden=10)


def make(end_token=False, input_dim=2, seed=0, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    return PointerNet(PointerNetConfig(**{**SMALL.__dict__, **kw}), input_dim, end_token).to(dtype)


def random_targets(b, n, end_token, g, length=None):
    """Permutations (no end) or prefixes of permutations followed by EOS (with end)."""
    rows = []
    for _ in range(b):
        perm = (torch.randperm(n, generator=g) + int(end_token)).tolist()
        if end_token:
            perm = [*perm[: length or n], 0]
        rows.append(perm)
    return torch.tensor(rows)


def assert_every_parameter_learns(model):
    """Every parameter got a finite, nonzero gradient; the end memory exists only with EOS."""
    names = {name for name, _ in model.named_parameters()}
    assert ("end_memory" in names) == model.end_token
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def reference_log_probs(model, points, targets, mask_chosen=True):
    """Vinyals eq. 3 by loops in float64 from the model's own LSTM states:
    u_ij = v . tanh(W1 e_j + W2 d_i), positions chosen before step i excluded (with
    `mask_chosen=False` none is: the paper's softmax over every u_ij)."""
    model = model.double()
    with torch.no_grad():
        x = model.embed(points.double())
        memory, (h, c) = model.encoder(x)
        if model.end_token:
            memory = torch.cat([model.end_memory.expand(len(points), 1, -1), memory], 1)
            x = torch.cat([x.new_zeros(len(points), 1, x.shape[-1]), x], 1)
        W1, W2 = model.score.key_proj.weight, model.score.query_proj.weight
        v = model.score.v
        out = torch.zeros(targets.shape[0], targets.shape[1], memory.shape[1], dtype=torch.float64)
        for b in range(len(points)):
            state = (h[:, b : b + 1], c[:, b : b + 1])
            inp = model.start_input
            chosen = set()
            for i in range(targets.shape[1]):
                d, state = model.decoder(inp.view(1, 1, -1), state)
                d = d.view(-1)
                u = [
                    float(v @ torch.tanh(W1 @ memory[b, j] + W2 @ d)) for j in range(len(memory[b]))
                ]
                allowed = [
                    not mask_chosen or j not in chosen or (model.end_token and j == 0)
                    for j in range(len(u))
                ]
                top = max(u[j] for j in range(len(u)) if allowed[j])
                z = sum(math.exp(u[j] - top) for j in range(len(u)) if allowed[j])
                for j in range(len(u)):
                    out[b, i, j] = (u[j] - top - math.log(z)) if allowed[j] else -math.inf
                p = int(targets[b, i])
                chosen.add(p)
                inp = x[b, p]
    return out


@pytest.mark.parametrize("end_token", [False, True])
@pytest.mark.parametrize("n", [1, 7])
def test_teacher_forcing_matches_float64_loop_reference(end_token, n):
    g = torch.Generator().manual_seed(n)
    model = make(end_token)
    points = torch.rand(3, n, 2, generator=g)
    targets = random_targets(3, n, end_token, g, length=max(1, n - 2))
    got = model.double()(points.double(), targets).log_probs
    want = reference_log_probs(model, points, targets)
    allowed = want > -math.inf
    torch.testing.assert_close(got[allowed], want[allowed], atol=1e-10, rtol=1e-10)
    assert (got[~allowed] < -1e30).all()  # masked: the dtype's minimum, never chosen


@settings(deadline=None, max_examples=20)
@given(n=st.integers(1, 9), end_token=st.booleans(), seed=st.integers(0, 10_000))
def test_weights_are_distributions_and_chosen_positions_get_exactly_zero(n, end_token, seed):
    g = torch.Generator().manual_seed(seed)
    model = make(end_token, seed=seed % 3)
    targets = random_targets(2, n, end_token, g)
    out = model(torch.rand(2, n, 2, generator=g), targets)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(targets.shape))
    for b in range(2):
        for i in range(targets.shape[1]):
            for p in targets[b, :i].tolist():
                if not (end_token and p == 0):
                    assert out.weights[b, i, p] == 0.0


@pytest.mark.parametrize("end_token", [False, True])
def test_decode_step_equals_teacher_forcing(end_token):
    g = torch.Generator().manual_seed(1)
    model = make(end_token)
    points = torch.rand(4, 6, 2, generator=g)
    targets = random_targets(4, 6, end_token, g, length=4)
    forced = model(points, targets).log_probs
    state = model.start(points)
    tokens = torch.full((4,), BOS)
    for i in range(targets.shape[1]):
        log_probs, state = model.decode_step(tokens, state)
        torch.testing.assert_close(log_probs, forced[:, i], atol=1e-5, rtol=1e-5)
        tokens = targets[:, i]


def test_gradcheck_through_the_pointer_distribution():
    model = make(True, dtype=torch.float64, hidden=4, attn_hidden=3)
    points = torch.rand(2, 3, 2, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[2, 1, 0], [3, 0, 0]])
    assert torch.autograd.gradcheck(lambda p: model(p, targets).log_probs.clamp_min(-1e3), points)


def test_greedy_decoding_outputs_permutations_and_beam_1_equals_greedy():
    model = make(False)
    points = torch.rand(5, 9, 2, generator=torch.Generator().manual_seed(2))
    greedy = model.decode(points)
    for row in greedy.tolist():
        assert sorted(row) == list(range(9))
    assert torch.equal(model.decode(points, beam_size=1), greedy)


def test_end_token_decoding_never_repeats_and_marks_the_end():
    model = make(True)
    points = torch.rand(6, 8, 2, generator=torch.Generator().manual_seed(3))
    for beam in (1, 3):
        for row in model.decode(points, beam_size=beam).tolist():
            kept = [i for i in row if i >= 0]
            assert len(set(kept)) == len(kept) and all(i < 8 for i in kept)
            assert row[: len(kept)] == kept  # -1 only after the end


def test_wide_beam_finds_the_most_likely_permutation():
    """With a beam as wide as the number of permutations, beam search is exhaustive."""
    model = make(False, seed=4)
    points = torch.rand(2, 4, 2, generator=torch.Generator().manual_seed(4))
    beam = model.decode(points, beam_size=24)
    for b in range(2):
        perms = torch.tensor(list(itertools.permutations(range(4))))
        scores = model(points[b : b + 1].expand(24, -1, -1), perms).log_probs
        total = scores.gather(-1, perms.unsqueeze(-1)).squeeze(-1).sum(-1)
        assert beam[b].tolist() == perms[total.argmax()].tolist()


def test_sample_log_prob_is_the_teacher_forced_log_prob_and_differentiable():
    model = make(True, seed=5)
    points = torch.rand(8, 6, 2, generator=torch.Generator().manual_seed(5))
    out = model(points, sample=True, generator=torch.Generator().manual_seed(0))
    positions, log_prob = out
    log_prob.sum().backward()
    assert_every_parameter_learns(model)
    for b in range(8):
        row = positions[b].tolist()
        end = row.index(0) + 1 if 0 in row else len(row)
        targets = torch.tensor([row[:end]])
        forced = model(points[b : b + 1], targets).log_probs
        want = forced.gather(-1, targets.unsqueeze(-1)).sum()
        torch.testing.assert_close(log_prob[b].detach(), want.detach(), atol=1e-5, rtol=1e-5)
        assert len(set(row[: end - 1])) == end - 1  # no point twice


def test_batch_rows_are_independent():
    model = make(True)
    points = torch.rand(3, 5, 2, generator=torch.Generator().manual_seed(6))
    targets = torch.tensor([[1, 2, 0], [3, 4, 0], [5, 0, 0]])
    whole = model(points, targets).log_probs
    for b in range(3):
        torch.testing.assert_close(
            model(points[b : b + 1], targets[b : b + 1]).log_probs[0], whole[b]
        )


def test_bad_input_is_a_clear_error():
    model = make(False)
    with pytest.raises(ValueError, match="points"):
        model(torch.rand(2, 5, 3), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        model(torch.rand(2, 5, 2), torch.full((2, 5), 5))
    # no steps: the decoder's first input alone gave one step of output
    with pytest.raises(ValueError, match=r"'targets' expected .* with 1 to \d+ steps, got shape"):
        model(torch.rand(2, 5, 2), torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="hidden"):
        PointerNetConfig(hidden=0)


@pytest.mark.parametrize("end_token", [False, True])
def test_teacher_forcing_trains_every_parameter(end_token):
    g = torch.Generator().manual_seed(7)
    model = make(end_token, layers=2)
    targets = random_targets(3, 5, end_token, g, length=3)
    model(torch.rand(3, 5, 2, generator=g), targets).log_probs.sum().backward()
    assert_every_parameter_learns(model)


@pytest.mark.parametrize("end_token", [False, True])
def test_runs_on_any_device(end_token, device):
    """Built on `device`, a teacher-forced forward + backward and decode steps make every tensor
    there (meta: shapes and devices only, no values)."""
    model = make(end_token).to(device)
    g = torch.Generator().manual_seed(8)
    points = torch.rand(3, 5, 2, generator=g).to(device)
    targets = random_targets(3, 5, end_token, g, length=3).to(device)
    out = model(points, targets)
    steps, positions = targets.shape[1], 5 + int(end_token)
    assert out.log_probs.shape == out.weights.shape == (3, steps, positions)
    assert out.log_probs.device.type == device.type
    out.log_probs.sum().backward()
    assert all(p.grad.device.type == device.type for p in model.parameters())
    with torch.no_grad():
        state = model.start(points)
        tokens = torch.full((3,), BOS, device=device)
        for i in range(2):
            log_probs, state = model.decode_step(tokens, state)
            assert log_probs.shape == (3, positions) and log_probs.device.type == device.type
            tokens = targets[:, i]
        assert state.chosen.device.type == device.type


@pytest.mark.parametrize("end_token", [False, True])
def test_decodes_and_samples_on_any_device(end_token, device):
    model = make(end_token).to(device)
    points = torch.rand(3, 5, 2, generator=torch.Generator().manual_seed(8)).to(device)
    with torch.no_grad():
        assert model.decode(points, beam_size=2).device.type == device.type
    positions_, log_prob = model(points, sample=True)
    assert positions_.device.type == log_prob.device.type == device.type


@pytest.mark.parametrize("end_token", [False, True])
def test_a_position_twice_before_the_end_is_refused_and_after_it_is_padding(end_token):
    """A repeated target had scored a closed position: a loss of about 3.4e38, no error."""
    model = make(end_token)
    points = torch.rand(2, 4, 2, generator=torch.Generator().manual_seed(7))
    off = int(end_token)
    twice = torch.tensor([[0, 1, 2, 3], [2, 0, 2, 1]]) + off
    if end_token:
        twice = torch.cat([twice, torch.zeros(2, 1, dtype=torch.long)], 1)
    with pytest.raises(ValueError, match="'targets' .* at most once.*position .* again at step 2"):
        model(points, twice)
    if end_token:  # after the first EOS anything goes: the padding of shorter outputs
        padded = torch.tensor([[1, 0, 1, 1, 0], [2, 3, 0, 0, 0]])
        assert torch.isfinite(
            model(points, padded).log_probs.gather(-1, padded[..., None])[:, :2]
        ).all()


def test_an_unconstrained_model_takes_its_own_repeated_outputs():
    """Without the mask (`mask_chosen=False`, the paper's decoder) a repeated position is an
    output the model may give, and its pictures teacher-force those outputs: the repeat check
    of the masked model refused them, so its figures and explorer failed."""
    torch.manual_seed(0)
    model = PointerNet(PointerNetConfig(hidden=8, attn_hidden=8, mask_chosen=False), 2)
    points = torch.rand(2, 4, 2, generator=torch.Generator().manual_seed(7))
    twice = torch.tensor([[0, 1, 2, 3], [2, 0, 2, 1]])
    out = model(points, twice)
    assert torch.isfinite(out.log_probs).all()


def test_an_unconstrained_model_scores_every_position_at_every_step():
    """`mask_chosen=False`: each step is softmax_j(u_ij) over every input (Vinyals eq. 3), a
    position already chosen included. A mask applied anyway gives the repeat the dtype's lowest
    logit, a finite log-prob of about -1.8e308 that `isfinite` accepts."""
    model = make(False, dtype=torch.float64, mask_chosen=False)
    points = torch.rand(2, 4, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    twice = torch.tensor([[0, 1, 2, 3], [2, 0, 2, 1]])
    got = model(points, twice).log_probs
    want = reference_log_probs(model, points, twice, mask_chosen=False)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert got[1, 2, 2] > -1e3  # the repeat keeps a real probability


def test_decoding_state_knows_its_batch():
    """The engine checks its `batch` against this (beam search would otherwise decode the
    first rows of a larger state)."""
    state = make().start(torch.rand(4, 6, 2))
    assert state.batch_size == 4 and state.reorder(torch.tensor([0, 0])).batch_size == 2
