"""Multi-digit MNIST (`attnzoo.tasks.multi_mnist`): digits in their bands, labels left to right
then the end class (or their sum), deterministic batches, the hybrid loss with each label's
reward at its last glimpse, and the evaluation's errors."""

import dataclasses

import pytest
import torch
from tests.tasks.test_mnist import with_blank_part

from attnzoo.core.hard import hybrid_loss, reinforce_loss, rewards_to_go
from attnzoo.models.dram import DRAM, dram
from attnzoo.models.image_baselines import MultiHeadConvNet, conv
from attnzoo.tasks import multi_mnist
from attnzoo.tasks.base import EvalConfig


def task(kind="multi", **fields):
    config = multi_mnist.MultiMnistConfig(kind=kind, **{"n_test": 32, "n_valid": 50, **fields})
    return multi_mnist.MultiMnistTask(config, seed=0, eval_config=EvalConfig(batch_size=16))


def test_digits_sit_in_their_bands_and_labels_read_left_to_right(digits):
    g = torch.Generator().manual_seed(0)
    pair = digits.test_images[:2].unsqueeze(0)  # (1, 2, 28, 28)
    image = multi_mnist.compose(task().config, pair, g)[0, 0]  # (64, 64)
    for i in range(2):
        band = image[:, 32 * i : 32 * (i + 1)]
        assert band.sum().item() == pytest.approx(pair[0, i].float().sum().item() / 255, rel=1e-5)
    labels = torch.tensor([[7, 2]])
    assert multi_mnist.targets(task().config, labels).tolist() == [[7, 2, 10]]
    assert multi_mnist.targets(task("addition").config, labels).tolist() == [[9]]


def test_model_dims_and_batches(digits):
    t = task()
    assert t.model_dims() == {"image_size": (64, 64), "channels": 1, "classes": 11, "labels": 3}
    assert task("addition").model_dims()["classes"] == 19
    a, b = t.batch(2, 8, "cpu"), t.batch(2, 8, "cpu")
    torch.testing.assert_close(a.images, b.images)
    assert a.targets[:, -1].tolist() == [10] * 8
    test_images, test_labels = t.held_out("test")
    assert test_images.shape == (32, 1, 64, 64) and test_labels.shape == (32, 3)


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_each_split_is_composed_from_its_own_digits_only(digits, split):
    """With the split's official digits blank (training: all but the last n_valid training
    digits; validation: those last n_valid; test: the official test digits), its images are
    blank: nothing is drawn from another part. For the training batches half the training
    set is validation, so a draw from it would show within the batch."""
    n_valid = 30_000 if split == "train" else 50
    t = task(n_valid=n_valid)
    t.digits = with_blank_part(digits, split, n_valid)
    if split == "train":
        images = t.batch(0, 64, "cpu").images
    else:
        images, _ = t.held_out(split)
    assert images.shape[0] > 0 and images.abs().sum() == 0


def test_dram_loss_is_the_hybrid_loss(digits):
    t = task()
    torch.manual_seed(0)
    model = DRAM(dram(glimpses=2, hidden=16, glimpse_hidden=8), (64, 64), 1, 11, 3)
    batch = t.batch(0, 4, "cpu")
    loss, count = t.loss(model, batch)
    assert count == 4
    out = model(batch.images, generator=torch.Generator().manual_seed(0))
    nll = -out.log_probs.gather(-1, batch.targets.unsqueeze(-1)).sum()
    rewards = torch.zeros(4, 3, 2)
    rewards[:, :, 1] = (out.log_probs.argmax(-1) == batch.targets).float()
    policy = reinforce_loss(out.log_pi, rewards_to_go(rewards.view(4, 6)), out.baseline)
    torch.testing.assert_close(loss, hybrid_loss(nll, policy))


def test_evaluate_and_figures(digits, tmp_path):
    t = task(mc_samples=2)
    torch.manual_seed(0)
    model = DRAM(dram(glimpses=1, hidden=16, glimpse_hidden=8), (64, 64), 1, 11, 3).eval()
    metrics = t.evaluate(model)
    assert set(metrics) == {"error", "label_error", "n", "error_mc"} and metrics["n"] == 32
    assert [p.name for p in t.figures(model, tmp_path, count=2)] == ["glimpses.png"]
    base = MultiHeadConvNet(conv(channels=4, hidden=8), (64, 64), 1, 11, 3).eval()
    assert set(t.evaluate(base)) == {"error", "label_error", "n"}
    assert t.figures(base, tmp_path) == []


@pytest.mark.parametrize(("field", "value"), [("kind", "x"), ("canvas", 40), ("digits", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"MultiMnistConfig: argument '{field}' expected"):
        dataclasses.replace(multi_mnist.MultiMnistConfig(), **{field: value})
