"""DRAM (`attnzoo.models.dram`): shapes, the gradient routes (classification trains the "what"
pathway, REINFORCE the "where" pathway: context, top LSTM, emission; the baseline only itself),
the context network choosing the first location, every option, overfitting a tiny batch."""

import dataclasses
import math

import pytest
import torch

from attnzoo.core.hard import BOUNDS, reinforce_loss, rewards_to_go
from attnzoo.models.dram import DRAM, DRAMConfig, dram
from attnzoo.models.image_baselines import MultiHeadConvNet, conv
from attnzoo.train.loop import parameter_groups
from tests.models.test_ram import overfit, reference_retina


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


def test_the_glimpse_is_what_times_where_by_hand():
    """Ba 2014 sec. 3.1: g_n = G_image(x_n) * G_loc(l_n), each a two-layer ReLU network, combined
    element-wise by a product (RAM adds them). By hand in float64 from the layers' weights, the
    retina from RAM's independent loop."""
    model = built(scales=2).double()
    network = model.glimpse
    what = [m for m in network.what if isinstance(m, torch.nn.Linear)]
    where = [m for m in network.where if isinstance(m, torch.nn.Linear)]
    g = torch.Generator().manual_seed(1)
    images = torch.rand(3, 1, 24, 32, generator=g, dtype=torch.float64)
    location = torch.tensor([[0.1, -0.4], [-0.7, 0.5], [0.9, 0.95]], dtype=torch.float64)
    with torch.no_grad():
        got = network(network.sensor.prepare(images), location)
    s = network.sensor
    for i in range(3):
        rho = reference_retina(images[i], location[i].tolist(), s.patch, s.scales)
        x, loc = torch.from_numpy(rho).flatten(), location[i]
        for layer in what:
            x = torch.relu(layer.weight @ x + layer.bias)
        for layer in where:
            loc = torch.relu(layer.weight @ loc + layer.bias)
        torch.testing.assert_close(got[i], (x * loc).detach(), rtol=1e-12, atol=1e-12)


def test_each_label_is_classified_after_its_last_glimpse():
    """Ba 2014 sec. 3: with N glimpses per label, label k is read from r^(1) after glimpse
    (k + 1) N - 1 (0-based), the last of its N: log p(y_k) = log_softmax(W r^(1) + b), by hand in
    float64 from the lower LSTM's states (recorded by a hook)."""
    glimpses, labels = 3, 2
    torch.manual_seed(0)
    fields = {"patch": 8, "scales": 2, "hidden": 16, "glimpse_hidden": 8, "context": 8}
    model = DRAM(dram(glimpses=glimpses, **fields), (24, 32), 1, 11, labels).double()
    states = []
    model.lower.register_forward_hook(lambda module, args, out: states.append(out[0].detach()))
    images = torch.rand(2, 1, 24, 32, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        got = model(images, sample=False).log_probs  # (b, labels, classes)
    assert len(states) == glimpses * labels
    w, b = model.classifier.weight.detach(), model.classifier.bias.detach()
    for k in range(labels):
        r1 = states[(k + 1) * glimpses - 1]  # (b, hidden)
        for row in range(2):
            logits = [float(w[c] @ r1[row] + b[c]) for c in range(11)]
            top = max(logits)
            norm = top + math.log(sum(math.exp(u - top) for u in logits))
            want = torch.tensor([u - norm for u in logits], dtype=torch.float64)
            torch.testing.assert_close(got[row, k], want, rtol=1e-12, atol=1e-12)


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
        model.location.mean(
            model.context(torch.nn.functional.adaptive_avg_pool2d(images, 8))
        ).clamp(-1, 1),
    )
    again = model(images, sample=False)
    torch.testing.assert_close(again.locations[:, 0], first)


def test_the_where_pathway_learns_at_where_lr():
    """The parameters the training loop slows to `where_lr` are exactly those REINFORCE trains
    (the routes of `test_gradient_routes`), and nothing else."""
    model = built(where_lr=0.25)
    out = model(torch.rand(4, 1, 24, 32), generator=torch.Generator().manual_seed(0))
    rl = reinforce_loss(out.log_pi, torch.ones(4, 6), out.baseline.detach())
    model.zero_grad(set_to_none=True)
    rl.policy.backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.any()}
    assert set(model.lr_scales()) == trained
    groups = parameter_groups(model, 1e-3)
    assert [g["lr"] for g in groups] == pytest.approx([1e-3, 2.5e-4])
    named = dict(model.named_parameters())
    assert {id(p) for p in groups[1]["params"]} == {id(named[n]) for n in trained}
    assert sum(len(g["params"]) for g in groups) == len(named)


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_glimpse_path_in_a_corner_still_learns(bound):
    """DRAM's addition runs froze: the emission's tanh mean went to a corner, where 1 - mu^2
    left REINFORCE no gradient. The score d log pi / d bias of a draw that lands on the image
    is ~ 1 / sigma wherever the mean is; at a corner a tanh mean's is ~ 1e-3 of that."""
    model = built(bound=bound)
    corner = -0.999  # the mean location, in both coordinates
    with torch.no_grad():
        model.location.mean.weight.zero_()
        model.location.mean.bias.fill_(math.atanh(corner) if bound == "tanh" else corner)
    out = model(torch.rand(64, 1, 24, 32), generator=torch.Generator().manual_seed(0))
    inside = (out.locations.abs() < 1).all(-1)  # (b, steps): the draws on the image
    assert inside.sum() > 20
    (grad,) = torch.autograd.grad((out.log_pi * inside).sum(), model.location.mean.bias)
    score = grad.abs().sum() / inside.sum()  # all one sign: the draws inside lie above mu
    std = model.config.std
    if bound == "tanh":  # the frozen case this test records
        assert score < 0.01 / std
    else:  # a mean kept as given ("none"), or clamped or pulled back onto the image
        assert score > 0.3 / std


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


@pytest.mark.parametrize(
    ("field", "value"),
    [("glimpses", 0), ("context", 2), ("method", "x"), ("bound", "x"), ("where_lr", 0.0)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"DRAMConfig: argument '{field}' expected"):
        dataclasses.replace(DRAMConfig(), **{field: value})
