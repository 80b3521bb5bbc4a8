"""The Self-Attention GAN (`attnzoo.models.sagan`): the self-attention block against an
independent float64 einsum reference of Zhang 2018 eq. 1-3, its weights (each query's sum to 1
over the N positions), gamma = 0 at init (the identity), gradcheck, the baseline's parameter
count, spectral normalisation, the optimiser groups, the meta device (the hinge losses are
the task's: tests/tasks/test_gan_mnist.py)."""

import dataclasses

import pytest
import torch

from attnzoo.models import sagan as S
from attnzoo.models.registry import MODELS

ODD = (3, 1, 24, 24)  # an odd batch, a map side not a power of two


def reference_block(block: S.SelfAttention2d, x: torch.Tensor):
    """Zhang 2018 eq. 1-3 in float64 with einsum, from the block's (normalised) weights:
    s_ij = f(x_i)^T g(x_j), beta_ji = softmax_i(s_ij), o_j = sum_i beta_ji h(x_i),
    y = gamma o + x."""
    x = x.double()
    b, c, height, width = x.shape
    flat = x.reshape(b, c, height * width)  # (b, C, N)

    def conv(layer):
        w = layer.weight.detach().double()[:, :, 0, 0]  # (out, C)
        return torch.einsum("oc,bcn->bon", w, flat) + layer.bias.detach().double()[None, :, None]

    f, g, h = conv(block.f), conv(block.g), conv(block.h)  # (b, C/8 | C, N)
    s = torch.einsum("bki,bkj->bij", f, g)  # s[b, i, j] = f(x_i) . g(x_j)
    beta = torch.softmax(s, dim=1).transpose(1, 2)  # beta[b, j, i], normalised over i
    o = torch.einsum("bji,bci->bcj", beta, h)  # (b, C, N)
    y = block.gamma.detach().double() * o + flat
    return y.reshape(b, c, height, width), beta


def test_the_block_equals_the_float64_reference():
    block = S.SelfAttention2d(16).eval()  # eval: spectral norm's vectors stay put
    with torch.no_grad():
        block.gamma.fill_(0.7)
    x = torch.randn(3, 16, 5, 7)
    out = block(x, return_weights=True)
    want, beta = reference_block(block, x)
    torch.testing.assert_close(out.features.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights.double(), beta, atol=1e-6, rtol=1e-5)


def test_each_query_positions_weights_sum_to_one_over_the_n_positions():
    """Zhang 2018 eq. (1): sum_i beta_ji = 1 for every query position j."""
    block = S.SelfAttention2d(8).eval()
    x = torch.randn(2, 8, 6, 5)
    weights = block(x, return_weights=True).weights
    n = 6 * 5
    assert weights.shape == (2, n, n)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.double().sum(-1), torch.ones(2, n, dtype=torch.float64))


def test_gamma_is_zero_at_init_so_the_block_is_the_identity():
    block = S.SelfAttention2d(16)
    assert block.gamma.shape == () and float(block.gamma.detach()) == 0.0
    x = torch.randn(2, 16, 4, 4)
    assert torch.equal(block(x).features, x)
    model = S.SAGAN(S.sagan(), (32, 32), 1, 10)
    assert sorted(model.gammas()) == ["gamma_discriminator", "gamma_generator"]
    assert all(float(g.detach()) == 0.0 for g in model.gammas().values())
    assert S.SAGAN(S.sagan_noattn(), (32, 32), 1, 10).gammas() == {}


def test_gradcheck_of_the_block_at_a_small_size():
    block = S.SelfAttention2d(8, spectral=False).double()
    x = torch.randn(2, 8, 3, 2, dtype=torch.float64, requires_grad=True)
    gamma = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    h = block.h.weight.detach().clone().requires_grad_()

    def features(x, gamma, h):
        params = {"gamma": gamma, "h.weight": h}
        return torch.func.functional_call(block, params, (x,)).features

    def weights(x):
        return block(x, return_weights=True).weights

    assert torch.autograd.gradcheck(features, (x, gamma, h))
    assert torch.autograd.gradcheck(weights, (x,))


def test_gamma_receives_a_gradient():
    block = S.SelfAttention2d(8)
    block(torch.randn(2, 8, 4, 4)).features.square().sum().backward()
    assert block.gamma.grad is not None and block.gamma.grad.abs() > 0


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("channels", "side"), [(8, None), (16, None), (32, None), (8, 8), (16, 8)]
)  # on the 8 x 8 map the blocks see 2C channels: within 2% up to the default width
def test_the_baseline_has_the_parameters_within_two_percent(channels, side):
    with_attention = MODELS["sagan"].preset(channels=channels, attention_side=side)
    without = MODELS["sagan-noattn"].preset(channels=channels)
    a = S.SAGAN(with_attention, (32, 32), 1, 10)
    b = S.SAGAN(without, (32, 32), 1, 10)
    assert with_attention.attention and not without.attention
    # the only difference is the two blocks
    assert dataclasses.replace(without, attention=True, attention_side=side) == with_attention
    assert abs(_params(a) / _params(b) - 1) <= 0.02
    assert _params(a) > _params(b)


def test_spectral_norm_on_both_networks():
    model = S.SAGAN(S.sagan(), (32, 32), 1, 10)
    for net in (model.generator, model.discriminator):
        layers = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
        assert layers and all(hasattr(m, "parametrizations") for m in layers)
    assert hasattr(model.discriminator.embed, "parametrizations")


def test_optimizer_groups_follow_the_config():
    config = S.sagan(d_lr=3e-4, g_lr=2e-5, betas=(0.1, 0.8))
    model = S.SAGAN(config, (32, 32), 1, 10)
    groups = model.optimizer_groups()
    assert [g.name for g in groups] == list(S.GROUPS)
    assert [g.lr for g in groups] == [3e-4, 2e-5] and all(g.betas == (0.1, 0.8) for g in groups)
    d_ids = {id(p) for p in model.discriminator.parameters()}
    g_ids = {id(p) for p in model.generator.parameters()}
    assert {id(p) for p in groups[0].params} == d_ids
    assert {id(p) for p in groups[1].params} == g_ids
    assert d_ids.isdisjoint(g_ids) and len(d_ids) + len(g_ids) == len(list(model.parameters()))
    defaults = S.sagan()
    assert (defaults.d_lr, defaults.g_lr, tuple(defaults.betas)) == (4e-4, 1e-4, (0.0, 0.9))


@pytest.mark.parametrize(("name", "side"), [("sagan", None), ("sagan", 8), ("sagan-noattn", None)])
def test_models_on_the_meta_device(name, side):
    model = S.SAGAN(MODELS[name].preset(attention_side=side), (32, 32), 1, 10).to("meta")
    z = torch.randn(3, model.config.z_dim, device="meta")
    labels = torch.zeros(3, dtype=torch.long, device="meta")
    out = model(z, labels, return_weights=True)
    assert out.images.device.type == "meta" and out.images.shape == (3, 1, 32, 32)
    scores = model.discriminator(out.images, labels, return_weights=True)
    assert scores.scores.shape == (3,) and scores.scores.device.type == "meta"
    if model.config.attention:
        n = (side or 16) ** 2  # the positions of the map the blocks attend over
        assert out.weights.shape == (3, n, n) and out.weights.device.type == "meta"
        assert scores.weights.shape == (3, n, n)
    else:
        assert out.weights is None and scores.weights is None
    scores.scores.sum().backward()  # the backward pass too, through both networks
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device.type == "meta" for g in grads)


def test_shapes_at_odd_sizes():
    block = S.SelfAttention2d(ODD[1] * 8)
    x = torch.randn(ODD[0], 8, ODD[2] // 3, 5)
    assert block(x).features.shape == x.shape
    model = S.SAGAN(S.sagan(channels=8, z_dim=5), (24, 24), 3, 7)
    out = model(torch.randn(3, 5), torch.tensor([0, 6, 3]))
    assert out.images.shape == (3, 3, 24, 24)
    assert out.images.abs().max() <= 1
    quarter = S.SAGAN(S.sagan(channels=8, z_dim=5, attention_side=6), (24, 24), 3, 7)
    out = quarter(torch.randn(3, 5), torch.tensor([0, 6, 3]), return_weights=True)
    assert out.images.shape == (3, 3, 24, 24) and out.weights.shape == (3, 36, 36)
    assert quarter.discriminator(out.images, torch.tensor([0, 6, 3]), True).weights.shape == (
        3,
        36,
        36,
    )


def _gan():
    return S.SAGAN(S.sagan(), (32, 32), 1, 10)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: S.sagan(channels=4), "channels"),
        (lambda: S.sagan(channels=0), "channels"),
        (lambda: S.sagan(z_dim=1.5), "z_dim"),
        (lambda: S.sagan(d_lr=0), "d_lr"),
        (lambda: S.sagan(betas=(0.0, 1.0)), "betas"),
        (lambda: S.sagan(attention="yes"), "attention"),
        (lambda: S.sagan(attention_side=0), "attention_side"),
        (lambda: S.sagan(attention_side=8.0), "attention_side"),
        (lambda: S.sagan(attention=False, attention_side=8), "attention_side"),
        (lambda: S.SAGAN(S.sagan(attention_side=4), (32, 32), 1, 10), "attention_side"),
        (lambda: S.SAGAN(S.sagan(), (30, 30), 1, 10), "image_size"),
        (lambda: S.SAGAN(S.sagan(), (32, 16), 1, 10), "image_size"),
        (lambda: S.SAGAN(S.sagan(), 32, 1, 10), "image_size"),
        (lambda: S.SAGAN(S.sagan(), (32.0, 32.0), 1, 10), "image_size"),
        (lambda: S.SAGAN(S.sagan(), (32, 32), 1, 10)(torch.randn(2, 3), torch.zeros(2)), "z"),
        (
            lambda: S.SAGAN(S.sagan(), (32, 32), 1, 10)(torch.randn(2, 64), torch.zeros(3).long()),
            "labels",
        ),
        # a class past the embedding's rows (its bare IndexError) or a negative one
        (
            lambda: S.SAGAN(S.sagan(), (32, 32), 1, 10)(torch.randn(2, 64), torch.tensor([3, 10])),
            r"labels' expected class indices in \[0, 10\), got 3 to 10",
        ),
        (
            lambda: S.SAGAN(S.sagan(), (32, 32), 1, 10)(torch.randn(2, 64), torch.tensor([-1, 0])),
            "labels' expected class indices",
        ),
        (lambda: S.SelfAttention2d(8)(torch.randn(2, 4, 3, 3)), "x"),
        # the networks the task's loss calls: one label for a batch of 4 was broadcast over
        # it, and 64 x 64 images scored by a discriminator built for 32 x 32
        (lambda: _gan().generator(torch.randn(4, 64), torch.tensor([3])), "labels"),
        (lambda: _gan().generator(torch.randn(4, 63), torch.tensor([3] * 4)), "z"),
        (lambda: _gan().discriminator(torch.randn(4, 1, 32, 32), torch.tensor([3])), "labels"),
        (lambda: _gan().discriminator(torch.randn(4, 1, 64, 64), torch.tensor([3] * 4)), "images"),
    ],
)
def test_bad_input_is_an_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=f"'{argument}"):
        call()


@pytest.mark.parametrize(
    ("z", "labels", "argument"),
    [
        (torch.randn(2, 64), torch.zeros(2), "'labels' expected an integer tensor"),
        (torch.ones(2, 64, dtype=torch.long), torch.zeros(2).long(), "'z' expected a floating"),
    ],
)
def test_bad_dtypes_are_errors_naming_the_argument(z, labels, argument):
    with pytest.raises(TypeError, match=argument):
        S.SAGAN(S.sagan(), (32, 32), 1, 10)(z, labels)
