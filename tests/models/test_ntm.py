import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnzoo.models.ntm import NTM, LSTMBaseline, NTMConfig, lstm, ntm
from attnzoo.models.ntm import addressing as A

# --- independent float64 references: plain loops over batch, head and row ----------------


def ref_content(memory, key, beta):
    b_, n_ = memory.shape[0], memory.shape[1]
    out = torch.zeros(b_, key.shape[1], n_, dtype=torch.float64)
    for b in range(b_):
        for h in range(key.shape[1]):
            k = key[b, h].double()
            sims = []
            for i in range(n_):
                row = memory[b, i].double()
                sims.append(
                    float(k @ row) / max(float(k.norm()), 1e-8) / max(float(row.norm()), 1e-8)
                )
            e = [math.exp(float(beta[b, h]) * s) for s in sims]
            for i in range(n_):
                out[b, h, i] = e[i] / sum(e)
    return out


def ref_shift(w, s):
    """w~(i) = sum_j w(j) s(i - j) (mod N), s indexed by offset -r..r."""
    b_, h_, n_ = w.shape
    r = s.shape[-1] // 2
    out = torch.zeros(b_, h_, n_, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(n_):
                for j in range(n_):
                    for o in range(-r, r + 1):
                        if (i - j) % n_ == o % n_:
                            out[b, h, i] += float(w[b, h, j]) * float(s[b, h, o + r])
    return out


def ref_sharpen(w, gamma):
    out = torch.zeros(w.shape, dtype=torch.float64)
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            p = [float(x) ** float(gamma[b, h]) for x in w[b, h]]
            for i, x in enumerate(p):
                out[b, h, i] = x / sum(p)
    return out


def ref_write(memory, w, e, a):
    out = memory.double().clone()
    for b in range(memory.shape[0]):
        for i in range(memory.shape[1]):
            for c in range(memory.shape[2]):
                keep = 1.0
                for h in range(w.shape[1]):
                    keep *= 1 - float(w[b, h, i]) * float(e[b, h, c])
                out[b, i, c] = float(memory[b, i, c]) * keep + sum(
                    float(w[b, h, i]) * float(a[b, h, c]) for h in range(w.shape[1])
                )
    return out


def ref_read(memory, w):
    out = torch.zeros(w.shape[0], w.shape[1], memory.shape[2], dtype=torch.float64)
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            for i in range(memory.shape[1]):
                out[b, h] += float(w[b, h, i]) * memory[b, i].double()
    return out


def rand_weights(g, *shape):
    return torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * 2, -1)


def head_raw(g, b, h, m, s, dtype=torch.float64):
    return [
        torch.randn(b, h, m, generator=g, dtype=dtype),
        torch.randn(b, h, generator=g, dtype=dtype) * 3,
        torch.randn(b, h, generator=g, dtype=dtype),
        torch.randn(b, h, s, generator=g, dtype=dtype),
        torch.randn(b, h, generator=g, dtype=dtype),
    ]


# --- each addressing stage against its reference ------------------------------------------


@pytest.mark.parametrize("n", [7, 17])
def test_content_addressing_matches_reference(n):
    g = torch.Generator().manual_seed(n)
    memory = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    memory[1, 3] = 0.0  # a zero row: similarity 0
    key = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    beta = torch.rand(2, 3, generator=g, dtype=torch.float64) * 10
    torch.testing.assert_close(
        A.content_addressing(memory, key, beta), ref_content(memory, key, beta)
    )


def test_interpolation_by_hand():
    content = torch.tensor([[[1.0, 0.0, 0.0]]])
    previous = torch.tensor([[[0.0, 0.0, 1.0]]])
    out = A.interpolate(content, previous, torch.tensor([[0.25]]))
    torch.testing.assert_close(out, torch.tensor([[[0.25, 0.0, 0.75]]]))


@pytest.mark.parametrize("n", [7, 17])
@pytest.mark.parametrize("shifts", [1, 3, 5])
def test_circular_shift_matches_reference(n, shifts):
    g = torch.Generator().manual_seed(n * shifts)
    w = rand_weights(g, 2, 3, n)
    s = rand_weights(g, 2, 3, shifts)
    torch.testing.assert_close(A.circular_shift(w, s), ref_shift(w, s))


def test_circular_shift_wraps_round_by_hand():
    w = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 1.0]]])  # on the last row
    forward = torch.tensor([[[0.0, 0.0, 1.0]]])  # offset +1
    backward = torch.tensor([[[1.0, 0.0, 0.0]]])  # offset -1
    assert A.circular_shift(w, forward).tolist() == [[[1.0, 0.0, 0.0, 0.0, 0.0]]]
    assert A.circular_shift(w, backward).tolist() == [[[0.0, 0.0, 0.0, 1.0, 0.0]]]


@pytest.mark.parametrize("n", [7, 17])
def test_sharpening_matches_reference(n):
    g = torch.Generator().manual_seed(n)
    w = rand_weights(g, 2, 3, n)
    gamma = 1 + torch.rand(2, 3, generator=g, dtype=torch.float64) * 5
    torch.testing.assert_close(A.sharpen(w, gamma), ref_sharpen(w, gamma))


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_erase_add_and_read_match_reference(heads):
    g = torch.Generator().manual_seed(heads)
    memory = torch.randn(2, 7, 4, generator=g, dtype=torch.float64)
    w = rand_weights(g, 2, heads, 7)
    e = torch.rand(2, heads, 4, generator=g, dtype=torch.float64)
    a = torch.randn(2, heads, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(A.write(memory, w, e, a), ref_write(memory, w, e, a))
    torch.testing.assert_close(A.read(memory, w), ref_read(memory, w))


def test_write_by_hand_erases_then_adds():
    memory = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    w = torch.tensor([[[1.0, 0.0]]])
    e = torch.tensor([[[1.0, 0.5]]])
    a = torch.tensor([[[10.0, 20.0]]])
    assert A.write(memory, w, e, a).tolist() == [[[10.0, 21.0], [3.0, 4.0]]]


@pytest.mark.parametrize("n", [7, 17])
def test_full_addressing_matches_composed_reference(n):
    g = torch.Generator().manual_seed(n)
    memory = torch.randn(2, n, 4, generator=g, dtype=torch.float64)
    head = A.squash_head(*head_raw(g, 2, 3, 4, 3))
    previous = rand_weights(g, 2, 3, n)
    wc = ref_content(memory, head.key, head.beta)
    wg = head.gate[..., None] * wc + (1 - head.gate[..., None]) * previous
    expected = ref_sharpen(ref_shift(wg, head.shift), head.gamma)
    torch.testing.assert_close(A.address(memory, head, previous), expected)


def test_squashing_ranges():
    g = torch.Generator().manual_seed(0)
    head = A.squash_head(*(x * 50 for x in head_raw(g, 4, 2, 3, 5)))
    assert (head.beta >= 0).all() and (head.gate >= 0).all() and (head.gate <= 1).all()
    assert (head.gamma >= 1).all()
    torch.testing.assert_close(head.shift.sum(-1), torch.ones(4, 2, dtype=torch.float64))


# --- gradients ----------------------------------------------------------------------------


def test_gradcheck_addressing_and_write():
    g = torch.Generator().manual_seed(0)
    memory = torch.randn(2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    raw = [x.requires_grad_() for x in head_raw(g, 2, 2, 3, 3)]
    previous = rand_weights(g, 2, 2, 5).requires_grad_()

    def f(memory, previous, *raw):
        return A.address(memory, A.squash_head(*raw), previous)

    assert torch.autograd.gradcheck(f, (memory, previous, *raw))
    w = rand_weights(g, 2, 2, 5).requires_grad_()
    e = torch.rand(2, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    a = torch.randn(2, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(A.write, (memory, w, e, a))
    assert torch.autograd.gradcheck(A.read, (memory, w))


def test_zero_memory_gives_uniform_content_weights_and_finite_gradients():
    memory = torch.zeros(2, 7, 4, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    raw = [x.float().requires_grad_() for x in head_raw(g, 2, 1, 4, 3)]
    torch.testing.assert_close(
        A.content_addressing(memory, raw[0], raw[1].abs()), torch.full((2, 1, 7), 1 / 7)
    )
    previous = torch.zeros(2, 1, 7)
    previous[..., 0] = 1.0
    w = A.address(memory, A.squash_head(*raw), previous)
    (w * torch.arange(7.0)).sum().backward()
    assert torch.isfinite(w).all()
    for t in [memory, *raw]:
        assert torch.isfinite(t.grad).all()


def test_underflowed_weights_give_finite_gradients():
    # a huge beta on a one-hot-like similarity underflows most content weights to exactly 0,
    # and a large gamma then raises zeros to a power: eq. 9 as written gives NaN gradients
    memory = torch.eye(6, 4).unsqueeze(0)  # (1, 6, 4)
    key = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    beta = torch.tensor([[1000.0]], requires_grad=True)
    gamma = torch.tensor([[30.0]], requires_grad=True)
    gate = torch.tensor([[1.0]], requires_grad=True)
    shift = torch.tensor([[[0.0, 1.0, 0.0]]], requires_grad=True)
    content = A.content_addressing(memory, key, beta)
    assert (content == 0).sum() > 0
    head = A.HeadParameters(key, beta, gate, shift, gamma)
    w = A.address(memory, head, torch.full((1, 1, 6), 1 / 6))
    (w * torch.arange(6.0)).sum().backward()
    assert torch.isfinite(w).all()
    for t in (key, beta, gamma, gate, shift):
        assert torch.isfinite(t.grad).all()
    raw_sharpen = torch.tensor([[[0.0, 0.5, 0.5]]], requires_grad=True)
    g2 = torch.tensor([[3.0]], requires_grad=True)
    A.sharpen(raw_sharpen, g2)[..., 1].sum().backward()
    assert torch.isfinite(raw_sharpen.grad).all() and torch.isfinite(g2.grad).all()


# --- properties ---------------------------------------------------------------------------


@given(
    n=st.integers(3, 20),
    heads=st.integers(1, 3),
    shifts=st.sampled_from([1, 3, 5]),
    scale=st.sampled_from([0.0, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_weights_are_distributions_after_every_stage(n, heads, shifts, scale, seed):
    g = torch.Generator().manual_seed(seed)
    memory = torch.randn(2, n, 4, generator=g) * scale
    head = A.squash_head(*(x.float() * max(scale, 1.0) for x in head_raw(g, 2, heads, 4, shifts)))
    previous = rand_weights(g, 2, heads, n).float()
    stages = []
    stages.append(A.content_addressing(memory, head.key, head.beta))
    stages.append(A.interpolate(stages[-1], previous, head.gate))
    stages.append(A.circular_shift(stages[-1], head.shift))
    stages.append(A.sharpen(stages[-1], head.gamma))
    for w in stages:
        assert torch.isfinite(w).all() and (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, heads), atol=1e-5, rtol=0)


@given(n=st.integers(1, 25), position=st.integers(0, 24), step=st.sampled_from([-2, -1, 0, 1, 2]))
def test_a_one_hot_shift_moves_a_one_hot_weighting_circularly(n, position, step):
    position %= n
    w = torch.zeros(1, 1, n)
    w[..., position] = 1.0
    s = torch.zeros(1, 1, 5)
    s[..., step + 2] = 1.0
    if n < 2:
        return
    expected = torch.zeros(1, 1, n)
    expected[..., (position + step) % n] = 1.0
    assert torch.equal(A.circular_shift(w, s), expected)


@given(seed=st.integers(0, 2**16), b=st.integers(2, 4))
def test_batch_equals_separate_runs(seed, b):
    g = torch.Generator().manual_seed(seed)
    memory = torch.randn(b, 9, 4, generator=g, dtype=torch.float64)
    head = A.squash_head(*head_raw(g, b, 2, 4, 3))
    previous = rand_weights(g, b, 2, 9)
    together = A.address(memory, head, previous)
    for k in range(b):
        one = A.HeadParameters(*(t[k : k + 1] for t in head))
        torch.testing.assert_close(
            together[k : k + 1], A.address(memory[k : k + 1], one, previous[k : k + 1])
        )


# --- the model ----------------------------------------------------------------------------


def tiny(**kw) -> NTMConfig:
    return ntm(controller_size=12, memory_rows=9, memory_cols=5, **kw)


VARIANTS = [
    dict(),
    dict(controller="feedforward"),
    dict(memory_init="learned"),
    dict(read_heads=2, write_heads=2, shifts=5),
    dict(shifts=1),
]


@pytest.mark.parametrize(
    "kw", VARIANTS, ids=lambda kw: "-".join(map(str, kw.values())) or "default"
)
def test_every_variant_shapes_and_finite_gradients(kw):
    config = tiny(**kw)
    model = NTM(config, 6, 4)
    x = torch.rand(3, 7, 6)
    out = model(x, return_weights=True)
    r, w = config.read_heads, config.write_heads
    assert out.logits.shape == (3, 7, 4)
    assert out.read_weights.shape == (3, 7, r, 9) and out.write_weights.shape == (3, 7, w, 9)
    assert out.reads.shape == (3, 7, r, 5) and out.adds.shape == (3, 7, w, 5)
    assert out.memory.shape == (3, 7, 9, 5)
    for weights in (out.read_weights, out.write_weights):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    torch.testing.assert_close(model(x).logits, out.logits)
    assert model(x).read_weights is None
    out.logits.sum().backward()
    for p in model.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_model_on_zero_memory_is_finite():
    model = NTM(tiny(), 6, 4)
    model.initial_memory.zero_()
    x = torch.zeros(2, 5, 6, requires_grad=True)
    out = model(x).logits
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_model_batch_equals_separate_runs():
    model = NTM(tiny(read_heads=2), 6, 4)
    x = torch.rand(3, 6, 6)
    together = model(x, return_weights=True)
    for k in range(3):
        alone = model(x[k : k + 1], return_weights=True)
        torch.testing.assert_close(together.logits[k : k + 1], alone.logits)
        torch.testing.assert_close(together.memory[k : k + 1], alone.memory)


def test_first_step_reads_the_initial_memory_before_writing():
    model = NTM(tiny(), 6, 4)
    out = model(torch.rand(1, 1, 6), return_weights=True)
    torch.testing.assert_close(out.reads[0, 0, 0], torch.full((5,), 1e-6))


def test_the_output_reads_this_steps_reads_and_the_controller_the_last_steps():
    """y_t = W_o [h_t; r_t] and the controller's input is [x_t; r_{t-1}] (Graves 2014 Fig. 1):
    the step's output built from r_{t-1} passed every test above. Rebuilt here in float64 from
    the reads the model reports, through its own controller and output layer."""
    torch.manual_seed(0)
    model = NTM(tiny(read_heads=2), 6, 4).double()
    x = torch.rand(2, 5, 6, dtype=torch.float64)
    out = model(x, return_weights=True)
    reads = out.reads.flatten(2)  # (b, T, r m)
    previous = model.initial_reads.expand(2, -1, -1).flatten(1)  # r_0
    zeros = x.new_zeros(2, model.config.controller_size)
    state = (zeros, zeros)
    for t in range(5):
        h, state = model.controller(torch.cat([x[:, t], previous], -1), state)
        want = model.output(torch.cat([h, reads[:, t]], -1))
        torch.testing.assert_close(out.logits[:, t], want, rtol=1e-12, atol=1e-12)
        previous = reads[:, t]


def test_each_step_addresses_from_the_previous_steps_weighting():
    """Eq. 7-8 with g_t = 0 and a one-hot shift: w_t = shift(w_{t-1}). The head layer's weights
    zeroed and its biases set by hand make every step's head the same: gate sigmoid(-40) (location
    addressing only), shift +1 for the read head and -1 for the write head, gamma 1 +
    softplus(40). From w_0 on row 0 the read head must walk one row a step, row (t + 1) mod N at
    step t, and the write head back, row -(t + 1) mod N: a step addressed from w_0 instead of
    w_{t-1} stays on row 1 (and N - 1)."""
    torch.manual_seed(0)
    config = tiny()
    model = NTM(config, 6, 4).double()
    n, heads, s = config.memory_rows, model.heads, config.shifts
    with torch.no_grad():
        model.head_params.weight.zero_()
        bias = model.head_params.bias
        bias.zero_()
        _, _, gate, shift, gamma, *_ = bias.split(model.split)
        gate.fill_(-40.0)
        shift.view(heads, s).copy_(torch.tensor([[-40.0, -40.0, 40.0], [40.0, -40.0, -40.0]]))
        gamma.fill_(40.0)
    steps = 2 * n + 1  # round the memory twice
    out = model(torch.rand(2, steps, 6, dtype=torch.float64), return_weights=True)
    want_read = torch.zeros(2, steps, 1, n, dtype=torch.float64)
    want_write = torch.zeros(2, steps, 1, n, dtype=torch.float64)
    for t in range(steps):
        want_read[:, t, 0, (t + 1) % n] = 1.0
        want_write[:, t, 0, -(t + 1) % n] = 1.0
    torch.testing.assert_close(out.read_weights, want_read, rtol=0, atol=1e-9)
    torch.testing.assert_close(out.write_weights, want_write, rtol=0, atol=1e-9)


def test_model_runs_in_float64():
    model = NTM(tiny(), 6, 4).double()
    assert model(torch.rand(2, 3, 6, dtype=torch.float64)).logits.dtype == torch.float64


@pytest.mark.parametrize(
    "kw, argument",
    [
        (dict(controller="gru"), "controller"),
        (dict(memory_init="zeros"), "memory_init"),
        (dict(memory_rows=0), "memory_rows"),
        (dict(controller_size=2.5), "controller_size"),
        (dict(read_heads=True), "read_heads"),
        (dict(shifts=2), "shifts"),
        (dict(shifts=5, memory_rows=3), "shifts"),
    ],
)
def test_bad_config_names_the_argument(kw, argument):
    with pytest.raises(ValueError, match=f"NTMConfig: argument '{argument}' expected"):
        NTMConfig(**kw)


def test_bad_lstm_config_names_the_argument():
    with pytest.raises(ValueError, match="LSTMConfig: argument 'hidden' expected a positive int"):
        lstm(hidden=0)


def test_shift_offsets():
    assert A.shift_offsets(3) == [-1, 0, 1]
    with pytest.raises(ValueError, match="argument 'shifts'"):
        A.shift_offsets(4)


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_presets_parameter_counts_on_the_copy_task():
    # 8 bits + a delimiter channel in, 8 bits out (tasks.bits "copy")
    ntm_count, lstm_count = count(NTM(ntm(), 9, 8)), count(LSTMBaseline(lstm(), 9, 8))
    assert (ntm_count, lstm_count) == (62_680, 62_000)


def test_lstm_baseline_shapes():
    model = LSTMBaseline(lstm(hidden=7, layers=2), 6, 4)
    out = model(torch.rand(3, 5, 6), return_weights=True)
    assert out.logits.shape == (3, 5, 4)


# --- any device: built on it, run on it (meta: shapes and devices without values) ---------


@pytest.mark.parametrize(
    "kw", VARIANTS, ids=lambda kw: "-".join(map(str, kw.values())) or "default"
)
def test_ntm_on_any_device(device, kw):
    config = tiny(**kw)
    with device:
        model = NTM(config, 6, 4)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {device.type}
    x = torch.rand(3, 7, 6).to(device)
    out = model(x, return_weights=True)
    assert out.logits.shape == (3, 7, 4)
    assert out.memory.shape == (3, 7, 9, 5)
    assert all(t.device.type == device.type for t in out)
    out.logits.sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.device.type == device.type


def test_lstm_baseline_on_any_device(device):
    with device:
        model = LSTMBaseline(lstm(hidden=7, layers=2), 6, 4)
    x = torch.rand(3, 5, 6).to(device)
    out = model(x)
    assert out.logits.device.type == device.type and out.logits.shape == (3, 5, 4)
    out.logits.sum().backward()
    assert all(p.grad.device.type == device.type for p in model.parameters())
