"""DRAM (`attnzoo.models.dram`): shapes, the gradient routes (classification trains the "what"
pathway, REINFORCE the "where" pathway: context, top LSTM, emission; the baseline only itself),
the context network choosing the first location, every option, overfitting a tiny batch."""

import dataclasses

import pytest
import torch

from attnzoo.core.hard import reinforce_loss, rewards_to_go
from attnzoo.models.dram import DRAM, DRAMConfig, dram
from attnzoo.models.image_baselines import MultiHeadConvNet, conv
from tests.models.test_ram import overfit


def built(**options):
    torch.manual_seed(0)
    fields = {"glimpses": 2, "hidden": 16, "glimpse_hidden": 8, "patch": 6, "context": 8}
    return DRAM(dram(**{**fields, **options}), (24, 32), 1, 11, 3)


def test_shapes():
    out = built()(torch.rand(4, 1, 24, 32))
    assert out.log_probs.shape == (4, 3, 11)
    assert out.locations.shape == (4, 6, 2) and not out.locations.requires_grad
    assert out.log_pi.shape == out.baseline.shape == (4, 6)
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(4, 3))


def parts(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    return {
        n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None and p.grad.any()
    }


def test_gradient_routes():
    model = built()
    images, labels = torch.rand(6, 1, 24, 32), torch.randint(11, (6, 3))
    out = model(images, generator=torch.Generator().manual_seed(0))
    nll = -out.log_probs.gather(-1, labels.unsqueeze(-1)).sum()
    rewards = torch.zeros(6, 3, 2)
    rewards[:, :, -1] = (out.log_probs.argmax(-1) == labels).float()
    rl = reinforce_loss(out.log_pi, rewards_to_go(rewards.view(6, -1)), out.baseline)
    assert parts(model, nll) == {"glimpse", "lower", "classifier"}
    assert parts(model, rl.policy) == {"location", "upper", "context"}
    assert parts(model, rl.baseline) == {"baseline"}


def test_the_context_network_chooses_the_first_location():
    model = built().eval()
    images = torch.rand(2, 1, 24, 32)
    first = model(images, sample=False).locations[:, 0]
    torch.testing.assert_close(
        first,
        torch.tanh(
            model.location.mean(model.context(torch.nn.functional.adaptive_avg_pool2d(images, 8)))
        ),
    )
    again = model(images, sample=False)
    torch.testing.assert_close(again.locations[:, 0], first)


@pytest.mark.parametrize("options", [{}, {"method": "index"}, {"learn_std": True}, {"scales": 1}])
def test_every_option_runs(options):
    model = built(**options)
    out = model(torch.rand(2, 1, 24, 32))
    (out.log_probs.sum() + out.log_pi.sum() + out.baseline.sum()).backward()


def test_overfits_a_tiny_batch():
    torch.manual_seed(0)
    model = DRAM(dram(glimpses=1, patch=8, scales=2, hidden=64, context=8), (16, 16), 1, 4, 2)
    images, labels = torch.rand(8, 1, 16, 16), torch.randint(4, (8, 2))
    assert overfit(model, images, labels) < 0.05


def test_multi_head_convnet():
    model = MultiHeadConvNet(conv(channels=4, hidden=16), (16, 16), 1, 11, 3)
    out = model(torch.rand(2, 1, 16, 16))
    assert out.log_probs.shape == (2, 3, 11)
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(2, 3))
    with pytest.raises(ValueError, match="MultiHeadConvNet: argument 'labels'"):
        MultiHeadConvNet(conv(), (16, 16), 1, 11, 0)


@pytest.mark.parametrize(("field", "value"), [("glimpses", 0), ("context", 2), ("method", "x")])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"DRAMConfig: argument '{field}' expected"):
        dataclasses.replace(DRAMConfig(), **{field: value})
