"""The RAM paper's baselines (`attnzoo.models.image_baselines`): shapes, every option, bad
input named, and overfitting a tiny batch."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnzoo.models.image_baselines import (
    ConvConfig,
    ConvNet,
    FCConfig,
    FullyConnected,
    conv,
    fc,
    pool_then_relu,
)
from attnzoo.models.show_attend_tell import Encoder
from attnzoo.models.snail import ConvEmbedding


@pytest.mark.parametrize(
    ("cls", "config"),
    [
        (FullyConnected, fc()),
        (FullyConnected, fc(layers=1, hidden=8)),
        (ConvNet, conv()),
        (ConvNet, conv(hidden=0, channels=4, kernel=3)),
    ],
)
def test_shapes_and_overfitting(cls, config):
    torch.manual_seed(0)
    model = cls(config, (12, 16), 2, 4)
    images, labels = torch.rand(8, 2, 12, 16), torch.arange(8) % 4
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        out = model(images, sample=True, generator=None)  # sampling options are ignored
        loss = -out.log_probs.gather(-1, labels.unsqueeze(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert out.log_probs.shape == (8, 4)
    assert loss.item() < 0.05


def test_fc_preset_is_the_papers():
    assert (fc().hidden, fc().layers) == (256, 2)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FCConfig(hidden=0), "FCConfig: argument 'hidden'"),
        (lambda: ConvConfig(kernel=0), "ConvConfig: argument 'kernel'"),
        (lambda: ConvConfig(kernel=4), "ConvConfig: argument 'kernel' expected an odd int"),
        (lambda: ConvConfig(hidden=-1), "ConvConfig: argument 'hidden'"),
        (lambda: FullyConnected(fc(), (4, 4), 1, 3)(torch.rand(2, 1, 5, 4)), "'images'"),
        (lambda: ConvNet(conv(), (8, 8), 1, 3)(torch.rand(2, 2, 8, 8)), "'images'"),
    ],
)
def test_bad_values_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@settings(max_examples=40, deadline=None)
@given(
    height=st.integers(2, 9),
    width=st.integers(2, 9),
    seed=st.integers(0, 2**16),
)
def test_pool_then_relu_is_relu_then_pool(height, width, seed):
    """Value and gradient, exactly, on inputs full of ties (small integers: windows of equal
    values, of zeros and of negatives only), odd sides included."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (2, 3, height, width), generator=g).double()
    up = torch.randn(2, 3, height // 2, width // 2, generator=g, dtype=torch.float64)
    ours = x.clone().requires_grad_()
    theirs = x.clone().requires_grad_()
    out = torch.nn.Sequential(*pool_then_relu())(ours)
    expected = F.max_pool2d(F.relu(theirs), 2)
    (out * up).sum().backward()
    (expected * up).sum().backward()
    assert torch.equal(out, expected)
    assert torch.equal(ours.grad, theirs.grad)


def _reference_blocks(x, convs, norms, pool_after):
    """Conv (+ batch norm in training mode), ReLU, then the pool: each block as its paper
    writes it, in float64, from the modules' weights."""
    for k, c in enumerate(convs):
        x = F.conv2d(x, c.weight.double(), c.bias.double(), padding=c.padding)
        if norms:
            n = norms[k]
            x = F.batch_norm(x, None, None, n.weight.double(), n.bias.double(), True, 0.0, n.eps)
        x = F.relu(x)
        if pool_after(k):
            x = F.max_pool2d(x, 2)
    return x


def _convs(module, kind):
    return [m for m in module.modules() if isinstance(m, kind)]


@pytest.mark.parametrize("size", [(28, 28), (17, 23)])
def test_conv_blocks_match_relu_then_pool_in_float64(size):
    """The three convolution stacks that pool before their ReLU (SNAIL's embedding, the SAT
    encoder, the RAM convnet baseline) against a float64 reference that pools after it, with
    gradients by gradcheck on a small input."""
    torch.manual_seed(0)
    images = torch.rand(3, 1, *size, dtype=torch.float64)
    embed = ConvEmbedding(1, 6, 3, size).double().train()
    convs, norms = _convs(embed, torch.nn.Conv2d), _convs(embed, torch.nn.BatchNorm2d)
    expected = _reference_blocks(images, convs, norms, lambda k: True).flatten(1)
    torch.testing.assert_close(embed(images), expected, rtol=1e-12, atol=1e-12)
    encoder = Encoder(1, (4, 5, 6)).double()
    convs = _convs(encoder, torch.nn.Conv2d)
    expected = _reference_blocks(images, convs, [], lambda k: k < 2).flatten(2).transpose(1, 2)
    torch.testing.assert_close(encoder(images), expected, rtol=1e-12, atol=1e-12)
    net = ConvNet(conv(channels=3, kernel=3), size, 1, 4).double()
    convs = _convs(net, torch.nn.Conv2d)
    expected = _reference_blocks(images, convs, [], lambda k: True).flatten(1)
    torch.testing.assert_close(net.flat(images), expected, rtol=1e-12, atol=1e-12)
    small = images[:2, :, :8, :8].clone().requires_grad_()
    for module in (ConvEmbedding(1, 2, 2, (8, 8)).double(), Encoder(1, (2, 2)).double()):
        assert torch.autograd.gradcheck(module, (small,))
