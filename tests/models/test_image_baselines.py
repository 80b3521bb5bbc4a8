"""The RAM paper's baselines (`attnzoo.models.image_baselines`): shapes, every option, bad
input named, and overfitting a tiny batch."""

import pytest
import torch

from attnzoo.models.image_baselines import ConvConfig, ConvNet, FCConfig, FullyConnected, conv, fc


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
        (lambda: ConvConfig(hidden=-1), "ConvConfig: argument 'hidden'"),
        (lambda: FullyConnected(fc(), (4, 4), 1, 3)(torch.rand(2, 1, 5, 4)), "'images'"),
        (lambda: ConvNet(conv(), (8, 8), 1, 3)(torch.rand(2, 2, 8, 8)), "'images'"),
    ],
)
def test_bad_values_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()
