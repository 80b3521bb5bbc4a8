"""The Recurrent Attention Model (`attnzoo.models.ram`): the glimpse sensor's patches by hand and
against an independent float64 loop, its two implementations equal, the gradient routes of the
paper (each pinned), the test-time pass, every option, and overfitting a tiny batch."""

import dataclasses

import numpy as np
import pytest
import torch

from attnzoo.core.hard import BOUNDS, reinforce_loss
from attnzoo.models.ram import (
    CORES,
    METHODS,
    RAM,
    GlimpseSensor,
    RAMConfig,
    patch_corners,
    ram,
    ram_translated,
)


def overfit(model, images, labels, steps: int = 150) -> float:
    """The last training loss of `steps` Adam steps on one batch, with the mean locations (the
    glimpse models' classification path alone)."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        out = model(images, sample=False)
        loss = -out.log_probs.gather(-1, labels.unsqueeze(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def reference_retina(image, location, patch, scales):
    """An independent float64 loop: for one (channels, H, W) image and one (x, y) location,
    the k patches cut from a zero-padded copy and average-pooled to patch x patch."""
    image = np.asarray(image, dtype=np.float64)
    c, height, width = image.shape
    pad = patch * 2**scales + height + width
    padded = np.zeros((c, height + 2 * pad, width + 2 * pad))
    padded[:, pad : pad + height, pad : pad + width] = image
    cx, cy = (location[0] + 1) * width / 2, (location[1] + 1) * height / 2
    out = []
    for s in range(scales):
        side = patch * 2**s
        top = int(np.floor(cy - side / 2 + 0.5))
        left = int(np.floor(cx - side / 2 + 0.5))
        window = padded[:, pad + top : pad + top + side, pad + left : pad + left + side]
        f = 2**s
        out.append(window.reshape(c, patch, f, patch, f).mean(axis=(2, 4)))
    return np.stack(out)  # (k, c, g, g)


@pytest.mark.parametrize("method", METHODS)
def test_sensor_by_hand(method):
    image = torch.arange(16, dtype=torch.float64).view(1, 1, 4, 4)
    sensor = GlimpseSensor(2, 2, method)
    centre = sensor(image, torch.zeros(1, 2, dtype=torch.float64))[0, :, 0]  # (k, g, g)
    assert centre[0].tolist() == [[5.0, 6.0], [9.0, 10.0]]
    assert centre[1].tolist() == [[2.5, 4.5], [10.5, 12.5]]  # the whole image, 2 x 2 means
    corner = sensor(image, torch.ones(1, 2, dtype=torch.float64))[0, :, 0]  # bottom right
    assert corner[0].tolist() == [[15.0, 0.0], [0.0, 0.0]]
    assert corner[1].tolist() == [[(10 + 11 + 14 + 15) / 4, 0.0], [0.0, 0.0]]
    far = sensor(image, torch.tensor([[5.0, -7.0]], dtype=torch.float64))
    assert far.abs().sum() == 0  # wholly outside: zeros


@pytest.mark.parametrize("method", METHODS)
def test_sensor_equals_an_independent_loop_anywhere(method):
    g = torch.Generator().manual_seed(0)
    images = torch.rand(6, 2, 20, 17, generator=g, dtype=torch.float64)
    location = torch.rand(6, 2, generator=g, dtype=torch.float64) * 3.2 - 1.6  # borders, out
    got = GlimpseSensor(3, 3, method)(images, location)
    for i in range(6):
        want = reference_retina(images[i], location[i].tolist(), 3, 3)
        np.testing.assert_allclose(got[i].numpy(), want, rtol=0, atol=1e-12)


def test_the_two_sensors_give_the_same_patches():
    g = torch.Generator().manual_seed(1)
    images = torch.rand(32, 1, 60, 60, generator=g)
    location = torch.rand(32, 2, generator=g) * 2.4 - 1.2
    a = GlimpseSensor(12, 3, "grid")(images, location)
    b = GlimpseSensor(12, 3, "index")(images, location)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_location_reads_a_non_finite_patch_not_zeros(method, bad):
    images = torch.rand(2, 1, 8, 8)
    location = torch.tensor([[bad, 0.0], [0.1, -0.2]])
    patches = GlimpseSensor(4, 2, method)(images, location)
    assert patches[0].isnan().all() and patches[1].isfinite().all()


def reference_glimpse(network, image, location):
    """Mnih 2014 sec. 3, f_g by hand in float64 from the network's weights, the retina from the
    loop above: h_g = ReLU(W1 rho + b1), h_l = ReLU(W2 l + b2), g = ReLU(W3 h_g + b3 + W4 h_l +
    b4) for one image and one (x, y) location."""
    s = network.sensor
    rho = torch.from_numpy(reference_retina(image, location, s.patch, s.scales)).flatten()
    loc = torch.tensor(location, dtype=torch.float64)
    what, where, what_out, where_out = (
        (layer.weight.double(), layer.bias.double())
        for layer in (network.what, network.where, network.what_out, network.where_out)
    )
    h_g = torch.relu(what[0] @ rho + what[1])
    h_l = torch.relu(where[0] @ loc + where[1])
    return torch.relu(what_out[0] @ h_g + what_out[1] + where_out[0] @ h_l + where_out[1])


def test_glimpse_network_is_the_papers_what_plus_where_by_hand():
    """g_t = ReLU(Linear(h_g) + Linear(h_l)), h_l from l_{t-1}: the location enters every glimpse
    vector. On a blank image every retina is zeros, so two locations differ only through h_l."""
    torch.manual_seed(0)
    model = RAM(ram(glimpses=2, hidden=16, glimpse_hidden=8, scales=2), (20, 24), 2, 10).double()
    network = model.glimpse
    g = torch.Generator().manual_seed(2)
    images = torch.rand(3, 2, 20, 24, generator=g, dtype=torch.float64)
    images[2] = 0.0  # blank
    location = torch.tensor([[-0.5, 0.3], [0.6, -0.2], [0.7, -0.9]], dtype=torch.float64)
    with torch.no_grad():
        got = network(network.sensor.prepare(images), location)
        for i in range(3):
            want = reference_glimpse(network, images[i], location[i].tolist())
            torch.testing.assert_close(got[i], want, rtol=1e-12, atol=1e-12)
        blank = torch.zeros(2, 2, 20, 24, dtype=torch.float64)
        two = network(network.sensor.prepare(blank), location[:2])
    assert (two[0] - two[1]).abs().max() > 1e-3


def test_patch_corners_centre_and_clamp():
    corners = patch_corners(torch.tensor([[0.0, 0.0], [-9.0, 9.0]]), 28, 28, 8, 2)
    assert corners[0].tolist() == [[10, 10], [6, 6]]
    assert corners[1].tolist() == [[28, -16], [28, -16]]  # far away: clamped, still outside


def built(config=None, size=(28, 28), channels=1):
    torch.manual_seed(0)
    return RAM(config or ram(glimpses=4, hidden=32, glimpse_hidden=16), size, channels, 10)


def terms(model, images, labels):
    """The three terms of the hybrid loss, as the MNIST task forms them."""
    out = model(images, generator=torch.Generator().manual_seed(0))
    nll = -out.log_probs.gather(-1, labels.unsqueeze(-1)).sum()
    reward = (out.log_probs.argmax(-1) == labels).float().unsqueeze(-1).expand_as(out.log_pi)
    rl = reinforce_loss(out.log_pi, reward, out.baseline)
    return nll, rl.policy, rl.baseline


def graded(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    return {
        n.split(".")[0] + ("." + n.split(".")[1] if n.startswith("glimpse") else "")
        for n, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }


PARTS = {
    "glimpse.what",
    "glimpse.where",
    "glimpse.what_out",
    "glimpse.where_out",
    "core_input",
    "core_recurrent",
}


def test_gradient_routes_of_the_paper():
    """Classification trains the glimpse network, the core and the action network, never the
    location network or the baseline; REINFORCE trains only the location network; the
    baseline's squared error trains only the baseline."""
    model = built()
    images, labels = torch.rand(8, 1, 28, 28), torch.arange(8) % 10
    nll, policy, baseline = terms(model, images, labels)
    assert graded(model, nll) == PARTS | {"action"}
    assert graded(model, policy) == {"location"}
    assert graded(model, baseline) == {"baseline"}


def test_the_sampled_location_carries_no_gradient():
    model = built()
    out = model(torch.rand(3, 1, 28, 28))
    assert not out.locations.requires_grad
    assert out.log_pi.requires_grad and out.baseline.requires_grad


@pytest.mark.parametrize("sample", [True, False])
def test_each_glimpse_reads_the_location_it_reports(sample, monkeypatch):
    """`out.locations[:, t]` is where glimpse t looked: REINFORCE credits the log-probability of
    that location. A sensor one step behind the reported path passed every other test here."""
    torch.manual_seed(0)
    model = RAM(ram(glimpses=4, start="random"), (28, 28), 1, 10)
    read = GlimpseSensor.read
    seen = []

    def spy(self, pyramid, location):
        seen.append(location.detach().clone())
        return read(self, pyramid, location)

    monkeypatch.setattr(GlimpseSensor, "read", spy)
    g = torch.Generator().manual_seed(1)
    out = model(torch.rand(3, 1, 28, 28), sample=sample, generator=g)
    assert len(seen) == 4
    torch.testing.assert_close(torch.stack(seen, 1), out.locations, rtol=0, atol=0)


def test_test_time_pass_uses_the_mean_and_sampling_is_seeded():
    model = built().eval()
    images = torch.rand(5, 1, 28, 28)
    a, b = model(images, sample=False), model(images, sample=False)
    torch.testing.assert_close(a.locations, b.locations)
    torch.testing.assert_close(a.log_probs, b.log_probs)
    # each mean location is tanh(f_l(h)): none is a sample away from it
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    s1, s2 = model(images, generator=g1), model(images, generator=g2)
    torch.testing.assert_close(s1.locations, s2.locations)
    assert not torch.equal(s1.locations, a.locations)
    assert a.locations[:, 0].abs().sum() == 0  # the first glimpse is at the centre


def test_batched_forward_equals_one_image_at_a_time():
    model = built().eval()
    images = torch.rand(4, 1, 28, 28)
    whole = model(images, sample=False)
    for i in range(4):
        one = model(images[i : i + 1], sample=False)
        torch.testing.assert_close(one.log_probs, whole.log_probs[i : i + 1])
        torch.testing.assert_close(one.locations, whole.locations[i : i + 1])


@pytest.mark.parametrize(
    "options",
    [
        {},
        *({"core": c} for c in CORES),
        *({"method": m} for m in METHODS),
        *({"bound": b} for b in BOUNDS),
        {"learn_std": True},
        {"glimpses": 1},
        {"scales": 3, "patch": 4},
    ],
)
def test_every_option_runs_forward_and_backward(options):
    config = ram(**{"glimpses": 3, "hidden": 16, "glimpse_hidden": 8, **options})
    model = RAM(config, (20, 24), 2, 5)
    out = model(torch.rand(3, 2, 20, 24))
    assert out.log_probs.shape == (3, 5)
    assert out.locations.shape == (3, config.glimpses, 2)
    assert out.log_pi.shape == out.baseline.shape == (3, config.glimpses - 1)
    loss = -out.log_probs[:, 0].sum() - out.log_pi.sum() + out.baseline.pow(2).sum()
    loss.backward()
    if options.get("learn_std"):
        assert model.location.log_std.grad is not None
    assert model.location.bound == config.bound
    if config.bound == "clamp":
        assert out.locations.abs().max() <= 1


def test_overfits_a_tiny_batch():
    torch.manual_seed(0)
    # one glimpse at the centre whose coarser patch covers the whole 16 x 16 image
    model = RAM(ram(glimpses=2, patch=8, scales=2, hidden=64, glimpse_hidden=64), (16, 16), 1, 4)
    images, labels = torch.rand(8, 1, 16, 16), torch.arange(8) % 4
    assert overfit(model, images, labels) < 0.05


def test_presets_cite_the_paper_sizes():
    assert (ram().glimpses, ram().patch, ram().scales, ram().hidden) == (6, 8, 1, 256)
    t = ram_translated()
    assert (t.glimpses, t.patch, t.scales) == (8, 12, 3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("glimpses", 0),
        ("patch", 2.0),
        ("core", "gru"),
        ("method", "unfold"),
        ("std", 0),
        ("bound", "sigmoid"),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"RAMConfig: argument '{field}' expected"):
        dataclasses.replace(RAMConfig(), **{field: value})


def test_bad_images_are_named():
    with pytest.raises(ValueError, match="RAM: argument 'images'"):
        built()(torch.rand(2, 1, 20, 20))
    with pytest.raises(
        ValueError, match="GlimpseSensor: argument 'location' expected a \\(2, 2\\)"
    ):
        GlimpseSensor(4, 1)(torch.rand(2, 1, 8, 8), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="GlimpseSensor: argument 'images'"):
        GlimpseSensor(4, 1)(torch.rand(1, 8, 8), torch.zeros(1, 2))


def test_random_start_draws_the_first_glimpse_in_sampled_passes_only():
    model = built(ram(glimpses=4, hidden=32, glimpse_hidden=16, start="random")).eval()
    images = torch.rand(64, 1, 28, 28)
    mean = model(images, sample=False)
    assert mean.locations[:, 0].abs().sum() == 0  # the mean-location pass starts at the centre
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    first, again = model(images, generator=g1), model(images, generator=g2)
    torch.testing.assert_close(first.locations, again.locations)  # seeded
    start = first.locations[:, 0]  # (64, 2)
    assert start.min() >= -1 and start.max() <= 1
    assert start.std(0).min() > 0.4  # uniform on [-1, 1] has std 0.58; the centre has 0
    assert first.log_pi.shape == (64, model.config.glimpses - 1)  # no log-prob for the start
    centre = built(ram(glimpses=4, hidden=32, glimpse_hidden=16, start="centre"))
    sampled = centre(images, generator=torch.Generator().manual_seed(5))
    assert sampled.locations[:, 0].abs().sum() == 0  # "centre": sampled passes start there too
    with pytest.raises(ValueError, match="start"):
        ram(start="corner")
