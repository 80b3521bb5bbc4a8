"""Show, Attend and Tell (`attnzoo.models.show_attend_tell`): the attention step and the doubly
stochastic term against float64 references written here, padding excluded from the term, the
hard variant's gradient routes, decoding through the shared engine, the baseline's size."""

import dataclasses
import math

import pytest
import torch

from attnzoo.core.hard import reinforce_loss
from attnzoo.decoding import decode
from attnzoo.models.show_attend_tell import (
    VARIANTS,
    Encoder,
    ShowAttendTell,
    ShowAttendTellConfig,
    doubly_stochastic,
    hard,
    no_attention,
    parameter_count,
    receptive_field,
    soft,
)

SMALL = dict(channels=(4, 6), embed_dim=5, hidden=7, attn_hidden=3, dropout=0.0)
VOCAB = 11


def build(config, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return ShowAttendTell(config, VOCAB, image_size=(8, 12), channels=1).to(dtype).eval()


def inputs(b=3, t=5, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(b, 1, 8, 12, generator=g, dtype=dtype)
    tokens = torch.randint(3, VOCAB, (b, t), generator=g)
    tokens[:, 0] = 1
    lengths = torch.tensor([t, 2, 4][:b])
    return images, tokens, lengths


@torch.no_grad()
def test_soft_attention_step_matches_a_float64_reference():
    """e_i = w^T tanh(W_h h + W_a a_i); alpha = softmax(e); z = sigmoid(f_beta(h)) sum alpha a."""
    model = build(soft(**SMALL))
    images, _, _ = inputs()
    state = model.start(images)
    state.h = torch.randn(state.h.shape, dtype=torch.float64)  # any h_{t-1}
    z, alpha, *_ = model._attend(state, sample=False)
    s = model.score
    a = model.encoder(images)  # (b, L, D)
    assert a.shape[1] == (8 // 2) * (12 // 2) and model.grid == (4, 6)
    for b in range(len(images)):
        logits = torch.stack(
            [
                s.v @ torch.tanh(s.query_proj.weight @ state.h[b] + s.key_proj.weight @ a[b, i])
                for i in range(a.shape[1])
            ]
        )
        weights = torch.exp(logits - logits.max())
        weights = weights / weights.sum()
        gate = 1 / (1 + math.exp(-float(model.beta.weight[0] @ state.h[b] + model.beta.bias[0])))
        expected = gate * sum(weights[i] * a[b, i] for i in range(a.shape[1]))
        torch.testing.assert_close(alpha[b], weights)
        torch.testing.assert_close(z[b], expected)


@torch.no_grad()
def test_start_is_two_separate_mlps_of_the_mean_annotation():
    """Xu 2015 sec. 3.1.2: c_0 = f_init,c(1/L sum_i a_i), h_0 = f_init,h(1/L sum_i a_i), each
    a one-layer tanh MLP of its own (a float64 loop here); c_0 from f_init,h passed."""
    model = build(soft(**SMALL))
    images, _, _ = inputs()
    state = model.start(images)
    a = model.encoder(images)  # (b, L, D)
    for b in range(len(images)):
        mean = sum(a[b, i] for i in range(a.shape[1])) / a.shape[1]  # (D,)
        for got, mlp in ((state.h[b], model.init_h[0]), (state.c[b], model.init_c[0])):
            torch.testing.assert_close(got, torch.tanh(mlp.weight @ mean + mlp.bias))
    assert not torch.allclose(state.h, state.c)  # two MLPs, not one


@torch.no_grad()
def test_a_decoding_step_is_eqs_4_to_7_on_its_attention():
    """Given z_t (its attention, checked above): the LSTM reads [E y_{t-1}; z_t] from
    (h_{t-1}, c_{t-1}), and p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t)) (eq. 7). The
    deep output fed h_{t-1} instead of h_t passed every test; written out here in float64."""
    model = build(soft(**SMALL))
    images, tokens, _ = inputs()
    state = model.start(images)
    state.h = torch.randn(state.h.shape, dtype=torch.float64)  # any h_{t-1}, c_{t-1}
    state.c = torch.randn(state.c.shape, dtype=torch.float64)
    logits, new, *_ = model._step(tokens[:, 1], state, sample=False)
    z = model._attend(state, sample=False)[0]
    e = model.embed.weight[tokens[:, 1]]  # (b, m)
    x = torch.cat([e, z], -1)
    cell = model.cell
    gates = x @ cell.weight_ih.T + cell.bias_ih + state.h @ cell.weight_hh.T + cell.bias_hh
    i, f, g, o = gates.chunk(4, -1)  # PyTorch's LSTMCell order
    c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    torch.testing.assert_close(new.h, h)
    torch.testing.assert_close(new.c, c)
    deep = e + h @ model.out_h.weight.T + model.out_h.bias + z @ model.out_z.weight.T
    if model.out_z.bias is not None:
        deep = deep + model.out_z.bias
    torch.testing.assert_close(logits, deep @ model.out.weight.T + model.out.bias)


def _penalty_loop(weights, lengths, lam):
    total = 0.0
    for b in range(weights.shape[0]):
        for i in range(weights.shape[2]):
            covered = sum(float(weights[b, t, i]) for t in range(int(lengths[b])))
            total += (1 - covered) ** 2
    return lam * total


def test_doubly_stochastic_term_matches_a_loop_over_real_steps_only():
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(3, 7, 17, generator=g, dtype=torch.float64).softmax(-1)
    lengths = torch.tensor([7, 1, 4])
    real = torch.arange(7) < lengths[:, None]
    got = doubly_stochastic(weights, real, 0.3)
    assert got.item() == pytest.approx(_penalty_loop(weights, lengths, 0.3), rel=1e-12)
    garbage = weights.clone()
    garbage[~real] = 1e6  # padding steps: whatever they hold adds nothing
    assert doubly_stochastic(garbage, real, 0.3).item() == pytest.approx(got.item(), rel=1e-12)


def test_soft_models_gradient_matches_finite_differences():
    """The gate beta_t = sigmoid(f_beta(h_{t-1})) is a function of h_{t-1}: the likelihood's
    gradient flows through it into the LSTM and f_init,h. Autograd against central finite
    differences (float64) along a random direction of each parameter; a gate that read h
    detached had the same forward and a wrong gradient."""
    model = build(soft(**SMALL))
    with torch.no_grad():
        model.beta.weight.mul_(20)  # a gate that depends strongly on h
    images, tokens, lengths = inputs()
    targets = torch.roll(tokens, -1, 1)

    def log_likelihood():
        log_probs = model(images, tokens, lengths).log_probs
        return log_probs.gather(-1, targets.unsqueeze(-1)).sum()

    params = dict(model.named_parameters())
    names = ["init_h.0.weight", "init_c.0.weight", "cell.weight_hh", "cell.weight_ih"]
    grads = torch.autograd.grad(log_likelihood(), [params[n] for n in names])
    g = torch.Generator().manual_seed(7)
    eps = 1e-6
    for name, grad in zip(names, grads, strict=True):
        p = params[name]
        v = torch.randn(p.shape, generator=g, dtype=p.dtype)
        with torch.no_grad():
            p += eps * v
            up = log_likelihood().item()
            p -= 2 * eps * v
            down = log_likelihood().item()
            p += eps * v
        numeric = (up - down) / (2 * eps)
        assert float((grad * v).sum()) == pytest.approx(numeric, rel=1e-5, abs=1e-8), name


@torch.no_grad()
def test_forward_penalty_ignores_padding_steps_after_end():
    model = build(soft(**SMALL, doubly_stochastic=0.5))
    images, tokens, lengths = inputs()
    out = model(images, tokens, lengths)
    assert out.penalty.item() == pytest.approx(_penalty_loop(out.weights, lengths, 0.5), rel=1e-10)
    longer = torch.cat([tokens, torch.zeros(3, 4, dtype=torch.long)], 1)  # more padding
    out2 = model(images, longer, lengths)
    assert out2.penalty.item() == pytest.approx(out.penalty.item(), rel=1e-10)
    torch.testing.assert_close(out2.log_probs[:, :5], out.log_probs)


def test_hard_variant_gradients_route_per_the_toolkit():
    """The score (the location policy) learns only through log pi (and the entropy): the
    caption's likelihood gives it no gradient, since the sampled location is not
    differentiable; the likelihood trains the encoder through the chosen annotation."""
    model = build(hard(**SMALL, expectation_rate=0.0)).train()  # every image samples
    images, tokens, lengths = inputs()
    g = torch.Generator().manual_seed(3)
    out = model(images, tokens, lengths, sample=True, generator=g)
    assert out.expected is None
    assert out.locations.shape == tokens.shape and out.log_pi.shape == tokens.shape
    picked = out.weights.gather(-1, out.locations.unsqueeze(-1)).squeeze(-1).log()
    torch.testing.assert_close(out.log_pi, picked)  # log pi is log alpha at the sample
    nll = -out.log_probs.sum()
    score_params = list(model.score.parameters())
    grads = torch.autograd.grad(nll, score_params, allow_unused=True)
    assert all(gr is None or gr.abs().max() == 0 for gr in grads)
    enc = torch.autograd.grad(nll, model.encoder.net[0].weight, retain_graph=True)[0]
    assert enc.abs().max() > 0
    real = torch.arange(tokens.shape[1]) < lengths[:, None]
    reward = torch.randn(3, 1, dtype=torch.float64)
    policy = reinforce_loss(
        out.log_pi, reward, 0.1, entropy=out.entropy, entropy_weight=0.01, mask=real
    )
    grads = torch.autograd.grad(policy.total, score_params[0])
    assert grads[0].abs().max() > 0
    # padding steps take no part in the policy term
    log_pi = out.log_pi.detach().requires_grad_()
    masked = reinforce_loss(log_pi, reward, 0.1, mask=real)
    (grad,) = torch.autograd.grad(masked.total, log_pi)
    assert (grad[~real] == 0).all() and (grad[real] != 0).all()


@torch.no_grad()
def test_hard_entropy_is_that_of_the_location_distribution():
    """`entropy` is H(alpha_t) = -sum_i alpha_ti ln alpha_ti >= 0 (a float64 loop over the
    distribution the locations are drawn from), the bonus of Xu 2015 eq. 12 that
    reinforce_loss adds as -lambda_e H: with its sign flipped, a penalty passed."""
    model = build(hard(**SMALL, expectation_rate=0.0))
    images, tokens, lengths = inputs()
    out = model(images, tokens, lengths, sample=True, generator=torch.Generator().manual_seed(3))
    b_, t_, cells = out.weights.shape
    assert out.entropy.shape == (b_, t_)
    for b in range(b_):
        for t in range(t_):
            alpha = out.weights[b, t].tolist()
            want = -sum(p * math.log(p) for p in alpha)
            assert 0 < want <= math.log(cells)
            assert float(out.entropy[b, t]) == pytest.approx(want, rel=1e-12)


def test_hard_attention_by_expectation_on_the_drawn_images():
    """Xu 2015 sec. 4.1: in training, with probability `expectation_rate` per image, z_t is
    sum_i alpha_ti a_i (a float64 loop here) instead of the sampled annotation, and the
    likelihood's gradient then reaches the location policy; evaluation always samples."""
    model = build(hard(**SMALL, expectation_rate=0.5)).train()
    images, tokens, _ = inputs(b=3)
    images = images.repeat(40, 1, 1, 1)  # 120 images: both kinds occur
    tokens, lengths = tokens.repeat(40, 1), torch.full((120,), tokens.shape[1])
    out = model(images, tokens, lengths, generator=torch.Generator().manual_seed(5))
    drawn = int(out.expected.sum())
    assert out.expected.shape == (120,) and 40 <= drawn <= 80  # Binomial(120, 0.5): ~5 sd
    state = model.start(images)
    state.expected = out.expected
    state.h = torch.randn(state.h.shape, dtype=torch.float64)
    z, alpha, _, _, index = model._attend(state, sample=True)
    a = model.encoder(images)
    for b in (int(out.expected.nonzero()[0]), int((~out.expected).nonzero()[0])):
        if out.expected[b]:
            reference = sum(float(alpha[b, i].detach()) * a[b, i] for i in range(a.shape[1]))
        else:
            reference = a[b, int(index[b])]
        torch.testing.assert_close(z[b], reference, rtol=1e-12, atol=1e-12)
    # the likelihood of an expected image trains the score; a sampled one's does not
    for pick, gets in ((out.expected, True), (~out.expected, False)):
        nll = -out.log_probs[pick].sum()
        grads = torch.autograd.grad(nll, model.score.key_proj.weight, retain_graph=True)
        assert bool(grads[0].abs().max() > 0) is gets
    every = build(hard(**SMALL, expectation_rate=1.0)).train()
    assert every(images[:3], tokens[:3], lengths[:3]).expected.all()
    evaluating = build(hard(**SMALL, expectation_rate=1.0)).eval()
    assert evaluating(images[:3], tokens[:3], lengths[:3]).expected is None


def test_expectation_warmup_falls_linearly_from_one_to_the_rate():
    """With `expectation_warmup` W the chance of attending by expectation at training step s is
    1 - (1 - rate) s / W until W, then the rate; the draws in forward follow it."""
    model = build(hard(**SMALL, expectation_rate=0.2, expectation_warmup=100)).train()
    for step, chance in ((0, 1.0), (25, 0.8), (50, 0.6), (99, 0.208), (100, 0.2), (500, 0.2)):
        assert model.expectation_rate_at(step) == pytest.approx(chance)
    assert model.expectation_rate_at(None) == 0.2  # outside training: the configured rate
    images, tokens, _ = inputs(b=3)
    images, tokens = images.repeat(40, 1, 1, 1), tokens.repeat(40, 1)  # 120 images
    lengths = torch.full((120,), tokens.shape[1])
    drawn = {}
    for step in (0, 50, 100):
        g = torch.Generator().manual_seed(step)
        drawn[step] = int(model(images, tokens, lengths, generator=g, step=step).expected.sum())
    assert drawn[0] == 120  # every image by expectation at the first step
    assert 50 <= drawn[50] <= 94  # Binomial(120, 0.6): 72 +- ~4 sd
    assert 8 <= drawn[100] <= 40  # Binomial(120, 0.2): 24 +- ~4 sd


@torch.no_grad()
def test_hard_decoding_by_expectation_reads_sum_alpha_a_at_every_step():
    """`start(..., expectation=True)`: each decoding step's z_t is sum_i alpha_ti a_i (a float64
    loop here), whatever the generator draws; sampling, the steps differ by generator."""
    model = build(hard(**SMALL))
    images, _, _ = inputs()
    tokens = torch.ones(3, dtype=torch.long)
    out = {}
    for expectation in (True, False):
        for seed in (0, 1):
            g = torch.Generator().manual_seed(seed)
            state = model.start(images, generator=g, expectation=expectation)
            for _ in range(3):
                log_probs, state = model.decode_step(tokens, state)
            out[expectation, seed] = log_probs
    torch.testing.assert_close(out[True, 0], out[True, 1], rtol=0, atol=0)
    assert not torch.equal(out[False, 0], out[False, 1])
    state = model.start(images, expectation=True)
    state.h = torch.randn(state.h.shape, dtype=torch.float64)
    z, alpha, *_ = model._attend(state, sample=True)
    a = model.encoder(images)
    for b in range(len(images)):
        reference = sum(float(alpha[b, i]) * a[b, i] for i in range(a.shape[1]))
        torch.testing.assert_close(z[b], reference, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="expectation"):
        build(soft(**SMALL)).start(images, expectation=True)


def test_hard_decoding_shows_the_sampled_location_one_hot():
    model = build(hard(**SMALL))
    images, _, _ = inputs()
    state = model.start(images, generator=torch.Generator().manual_seed(0))
    _, state = model.decode_step(torch.ones(3, dtype=torch.long), state)
    w = state.weights
    assert ((w == 0) | (w == 1)).all() and (w.sum(-1) == 1).all()


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_nan_pixel_makes_its_own_caption_nan_and_no_other(variant, training):
    """Not a plausible caption from a broken image, nor an error from deep inside sampling
    (the hard variant draws its locations there), and the batch's other images untouched."""
    model = build(ShowAttendTellConfig(variant=variant, **SMALL)).train(training)
    images, tokens, lengths = inputs()
    clean = model(images, tokens, lengths, generator=torch.Generator().manual_seed(0))
    images[1, 0, 3, 4] = math.nan
    out = model(images, tokens, lengths, generator=torch.Generator().manual_seed(0))
    assert out.log_probs[1].isnan().all()
    for b in (0, 2):
        assert torch.equal(out.log_probs[b], clean.log_probs[b])


@pytest.mark.parametrize("variant", ["soft", "none"])
def test_greedy_decoding_through_the_engine_agrees_with_teacher_forcing(variant):
    model = build(ShowAttendTellConfig(variant=variant, **SMALL))
    images, _, _ = inputs()
    tokens = decode(
        model.decode_step, model.start(images), 3, bos=1, eos=2, max_len=6, device=images.device
    )
    forced = torch.cat([torch.ones(3, 1, dtype=torch.long), tokens[:, :-1]], 1)
    out = model(images, forced, torch.full((3,), tokens.shape[1]))
    argmax = out.log_probs.argmax(-1)
    for b in range(3):
        upto = (tokens[b] == 2).nonzero()
        stop = int(upto[0]) + 1 if len(upto) else tokens.shape[1]
        assert torch.equal(argmax[b, :stop], tokens[b, :stop])
    beam = decode(
        model.decode_step,
        model.start(images),
        3,
        bos=1,
        eos=2,
        max_len=6,
        device=images.device,
        beam_size=3,
    )
    assert beam.shape[0] == 3


@pytest.mark.parametrize("last_kernel", [1, 3, 5])
@pytest.mark.parametrize("variant", VARIANTS)
def test_parameter_count_equals_the_built_models(variant, last_kernel):
    config = ShowAttendTellConfig(
        variant=variant, channels=(3, 5, 7), last_kernel=last_kernel, hidden=9, embed_dim=4
    )
    model = ShowAttendTell(config, 13, image_size=(16, 16), channels=1)
    assert parameter_count(config, vocab=13) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("last_kernel", [1, 3, 5])
@pytest.mark.parametrize("channels", [(4,), (4, 4), (4, 4, 4, 4)])
def test_receptive_field_is_the_input_that_reaches_an_annotation(channels, last_kernel):
    """The pixels whose gradient reaches the middle annotation span `receptive_field` each
    way. Every weight is positive, so every unit is active and no path is cut, and each max
    pooling is swapped for an average over the same window, which passes the gradient to
    every pixel of it (max pooling passes it to one)."""
    encoder = Encoder(1, channels, last_kernel).double()
    for p in encoder.parameters():
        torch.nn.init.constant_(p, 0.1)
    for k, layer in enumerate(encoder.net):
        if isinstance(layer, torch.nn.MaxPool2d):
            encoder.net[k] = torch.nn.AvgPool2d(layer.kernel_size, layer.stride)
    images = torch.rand(1, 1, 64, 64, dtype=torch.float64, requires_grad=True)
    maps = encoder.net(images)
    maps[0, :, maps.shape[-2] // 2, maps.shape[-1] // 2].sum().backward()
    reached = images.grad[0, 0] != 0
    field = receptive_field(len(channels), last_kernel)
    for found in (reached.any(1).nonzero(), reached.any(0).nonzero()):
        assert int(found.max() - found.min()) + 1 == field


def test_the_baseline_has_the_soft_models_parameters_within_two_percent():
    reference = soft()
    baseline = no_attention()
    ratio = parameter_count(baseline) / parameter_count(reference)
    assert abs(ratio - 1) <= 0.02
    assert baseline.hidden > reference.hidden  # the width pays for the missing attention


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("variant", "medium"),
        ("channels", ()),
        ("last_kernel", 2),
        ("last_kernel", 0),
        ("hidden", 0),
        ("dropout", 1.0),
        ("expectation_warmup", -1),
        ("expectation_warmup", 2.5),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ShowAttendTellConfig(**{field: value})


def test_an_option_its_variant_does_not_read_is_refused():
    """Set on a variant that never reads it, an option was recorded and ignored (an entropy
    bonus for soft attention, the doubly stochastic weight for hard)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ShowAttendTellConfig)}
    for variant in VARIANTS:
        config = ShowAttendTellConfig(variant=variant)
        for name in set(defaults) - config.reads():
            other = {"credit": "to_go"}.get(name, 0 if defaults[name] else 1)
            with pytest.raises(ValueError, match=f"'{name}' expected its default .* {variant} "):
                ShowAttendTellConfig(variant=variant, **{name: other})
    assert "doubly_stochastic" in soft().reads() and "credit" in hard().reads()
    assert "baseline_momentum" not in hard(credit="to_go").reads()


def test_bad_images_and_sizes_name_the_argument():
    with pytest.raises(ValueError, match="image_size"):
        ShowAttendTell(soft(**SMALL), VOCAB, image_size=(9, 12))
    model = build(soft(**SMALL))
    with pytest.raises(ValueError, match="images"):
        model.start(torch.zeros(1, 8, 12, dtype=torch.float64))
    images, tokens, lengths = inputs()
    with pytest.raises(ValueError, match="tokens_in"):
        model(images, tokens[:2], lengths)


def test_decode_refuses_a_batch_other_than_the_states():
    model = build(ShowAttendTellConfig(variant="soft", **SMALL))
    images, _, _ = inputs()
    state = model.start(images)
    assert state.batch_size == 3 and state.reorder(torch.tensor([2])).batch_size == 1
    with pytest.raises(ValueError, match=r"argument 'batch' expected the rows of 'state' \(3\)"):
        decode(model.decode_step, state, 2, bos=1, eos=2, max_len=4, device=images.device,
               beam_size=2)  # fmt: skip
