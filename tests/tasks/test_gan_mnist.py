"""The GAN task (`attnzoo.tasks.gan_mnist`): padded 32 x 32 digits from the official splits,
deterministic batches and latents, the hinge loss of each phase reaching only its network,
the classifier's errors naming `task.classifier`, and the FID against an independent float64
Frechet distance of the same features."""

import json
import shutil

import pytest
import torch

from attnzoo import runs
from attnzoo.models.sagan import SAGAN, sagan, sagan_noattn
from attnzoo.tasks import gan_mnist as G
from attnzoo.tasks.base import EvalConfig, Task
from attnzoo.tasks.gan_mnist import d_hinge_loss, g_hinge_loss
from attnzoo.tasks.registry import TASKS


def task(classifier: str = "", seed: int = 0, **fields):
    """The task as the runs layer builds it: the classifier's run loaded and handed over."""
    config = G.GanMnistConfig(**{"n_fid": 40, "n_valid": 100, "classifier": classifier, **fields})
    built = G.GanMnistTask(config, seed=seed, eval_config=EvalConfig(batch_size=16))
    runs.attach_runs(built)
    return built


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SAGAN(sagan(channels=8, z_dim=6), (32, 32), 1, 10)


def test_the_registry_entry_builds_a_task(digits):
    spec = TASKS["gan_mnist"]
    built = spec.build(spec.default_config(), seed=0, eval_config=spec.eval_config())
    assert isinstance(built, Task) and spec.interface == "gan"
    assert built.model_dims() == {"image_size": (32, 32), "channels": 1, "classes": 10}


def test_batches_are_padded_training_digits_and_deterministic(digits):
    t = task()
    a, b = t.batch(5, 8, "cpu"), t.batch(5, 8, "cpu")
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, t.batch(6, 8, "cpu").images)
    assert not torch.equal(a.images, task(seed=1).batch(5, 8, "cpu").images)
    assert a.images.shape == (8, 1, 32, 32) and a.items == 8
    assert a.images.min() >= -1 and a.images.max() <= 1
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    assert (a.images[:, 0][:, border] == -1).all()  # the pad is black
    # each image is one of the first n_train training digits, with its label
    pool = digits.train_images[: t.n_train].float() / 255 * 2 - 1
    for image, label in zip(a.images[:, 0], a.labels, strict=True):
        hits = (pool == image[2:30, 2:30]).flatten(1).all(-1).nonzero().flatten()
        assert len(hits) >= 1 and int(digits.train_labels[hits[0]]) == int(label)


def test_the_test_split_is_the_official_test_digits(digits):
    t = task()
    images, labels = t.reference("test")
    assert torch.equal(images[:, 0, 2:30, 2:30], digits.test_images[:40].float() / 255)
    assert torch.equal(labels, digits.test_labels[:40])
    valid, _ = t.reference("valid")
    assert torch.equal(valid[:, 0, 2:30, 2:30], digits.train_images[t.n_train :][:40] / 255)


def test_hinge_losses_against_hand_written_ones():
    real = torch.tensor([2.0, 0.5, -1.0, 0.0], dtype=torch.float64)
    fake = torch.tensor([-2.0, -0.5, 1.0], dtype=torch.float64)
    # sum max(0, 1 - r): 0 + 0.5 + 2 + 1; sum max(0, 1 + f): 0 + 0.5 + 2
    assert float(d_hinge_loss(real, fake)) == pytest.approx(3.5 + 2.5)
    assert float(g_hinge_loss(fake)) == pytest.approx(2.0 + 0.5 - 1.0)
    r, f = torch.randn(50), torch.randn(50)
    want = sum(max(0.0, 1 - float(v)) for v in r) + sum(max(0.0, 1 + float(v)) for v in f)
    assert float(d_hinge_loss(r, f)) == pytest.approx(want, rel=1e-5)


def test_each_phase_reaches_only_its_network(digits, model):
    t = task()
    batch = t.batch(0, 4, "cpu")
    for phase in ("discriminator", "generator"):
        model.zero_grad(set_to_none=True)
        loss, count = t.loss(model, batch, phase=phase)
        assert count == 4 and loss.dim() == 0
        loss.backward()
        if phase == "discriminator":  # the generator's output is detached
            assert all(p.grad is None for p in model.generator.parameters())
            assert any(p.grad is not None for p in model.discriminator.parameters())
        else:
            assert all(p.grad is not None for p in model.generator.parameters())
    model.zero_grad(set_to_none=True)


def test_the_phase_losses_are_the_hinge_losses_of_seeded_latents(digits, model):
    model.eval()  # spectral norm's power iteration moves its vectors at every training call
    t = task()
    batch = t.batch(3, 4, "cpu")
    with torch.no_grad():
        d_loss, _ = t.loss(model, batch, phase="discriminator")
        g_loss, _ = t.loss(model, batch, phase="generator")
        both, _ = t.loss(model, batch)
        z = [torch.randn(4, 6, generator=torch.Generator().manual_seed(3 * 2 + k)) for k in (0, 1)]
        fake = [model.generator(zk, batch.labels).images for zk in z]
        real_scores = model.discriminator(batch.images, batch.labels).scores
        want_d = d_hinge_loss(real_scores, model.discriminator(fake[0], batch.labels).scores)
        want_g = g_hinge_loss(model.discriminator(fake[1], batch.labels).scores)
    torch.testing.assert_close(d_loss, want_d)
    torch.testing.assert_close(g_loss, want_g)
    torch.testing.assert_close(both, want_d + want_g)
    with pytest.raises(ValueError, match="'phase'"):
        t.loss(model, batch, phase="critic")


def test_a_missing_or_bad_classifier_is_an_error_naming_task_classifier(digits, model, tmp_path):
    with pytest.raises(ValueError, match="'task.classifier'.*task.classifier=DIR"):
        task().evaluate(model)
    with pytest.raises(ValueError, match="'task.classifier'.*no config.json"):
        task(str(tmp_path / "nowhere"))
    unloaded = G.GanMnistTask(G.GanMnistConfig(classifier="x"), seed=0, eval_config=None)
    with pytest.raises(ValueError, match="'task.classifier'.*not loaded"):
        unloaded.evaluate(model)


def test_a_classifier_of_another_task_is_refused(digits, model, mnist_classifier, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(mnist_classifier, other)
    config = json.loads((other / "config.json").read_text())
    config["task_name"] = "translated_mnist"
    config["task"]["kind"] = "translated"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'task.classifier'.*weights that fit"):
        task(str(other))  # its model is built for 60 x 60 canvases
    mnist_config = {"model_name": "convnet", "task_name": "mnist", "task": {"kind": "mnist"}}
    with pytest.raises(ValueError, match="'task.classifier'.*convnet on translated_mnist"):
        G.check_classifier(config, runs.load_run(mnist_classifier, device="cpu")[2])
    with pytest.raises(ValueError, match="'task.classifier'.*features layer"):
        G.check_classifier({**mnist_config, "model_name": "fc"}, torch.nn.Linear(2, 2))
    config["task_name"], config["task"]["kind"] = "mnist", "mnist"
    (other / "config.json").write_text(json.dumps(config))
    shutil.rmtree(other / "checkpoints")
    with pytest.raises(ValueError, match="'task.classifier'.*checkpoint"):
        task(str(other))


def test_evaluation_is_deterministic_and_its_fid_is_the_frechet_distance(
    digits, model, mnist_classifier
):
    scipy_linalg = pytest.importorskip("scipy.linalg")
    t = task(mnist_classifier)
    metrics = t.evaluate(model.eval())
    assert metrics == t.evaluate(model)
    assert metrics["n_fid"] == 40 and 0 <= metrics["class_accuracy"] <= 100
    assert metrics["gamma_generator"] == 0.0 and metrics["gamma_discriminator"] == 0.0
    # an independent float64 Frechet distance of the classifier's features
    features = t.classifier(torch.device("cpu"))
    real, _ = t.reference("test")
    labels = torch.arange(40) % 10
    fake = t.generate(model, labels, t.config.seed + 31)

    def stats(images):
        with torch.no_grad():
            x = features.classifier.features(images[..., 2:30, 2:30]).double().numpy()
        return x.mean(0), torch.from_numpy(x).T.cov().numpy()

    (m1, c1), (m2, c2) = stats(real), stats(fake)
    root = scipy_linalg.sqrtm(c1 @ c2).real
    want = float(((m1 - m2) ** 2).sum() + (c1 + c2 - 2 * root).trace())
    assert metrics["fid"] == pytest.approx(want, rel=1e-3, abs=1e-3)
    floor = t.fid(features, real, t.floor_images(40))
    assert metrics["fid_floor"] == floor


def test_the_noattention_model_has_no_gammas(digits, mnist_classifier):
    torch.manual_seed(0)
    baseline = SAGAN(sagan_noattn(channels=8, z_dim=6), (32, 32), 1, 10).eval()
    metrics = task(mnist_classifier, n_fid=20).evaluate(baseline)
    assert not any(k.startswith("gamma") for k in metrics)


def test_figures_and_explorer(digits, model, mnist_classifier, tmp_path):
    t = task(mnist_classifier)
    written = t.figures(model.eval(), tmp_path, count=2)
    assert sorted(p.name for p in written) == ["attention.png", "samples.png"]
    data = t.explore(model, 2)
    from attnzoo.viz.explore import validate

    validate(data)
    weights = data["examples"][0]["attention"][0]["weights"]
    assert weights.shape == (1, 1, len(G.QUERIES), 256)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, len(G.QUERIES)))


def test_an_attention_figures_image_is_drawn_in_an_evaluation_sized_batch(digits, model):
    """The generator normalises over its batch: the figure's first image and maps are the
    same whether it draws one or four (eval.batch_size = 16 here), and equal those of the
    first image of a batch of 16 from the same latents (one image drawn alone differed)."""
    t = task()
    (image, label, maps, queries), four = (
        t.attention_maps(model.eval(), 1),
        t.attention_maps(model, 4),
    )
    assert maps is not None and torch.equal(queries, four[3])
    for got, of_four in zip((image, label, maps), four[:3], strict=True):
        torch.testing.assert_close(got, of_four[:1])
    g = G.sampling_generator(torch.device("cpu")).manual_seed(t.config.seed + 97)
    z = G.latents(16, model.config.z_dim, g, model)
    with torch.no_grad():
        batch = model.generator(z, torch.arange(16) % G.CLASSES).images
    torch.testing.assert_close(image[0], ((batch[0, 0] + 1) / 2).clamp(0, 1))


@pytest.mark.parametrize(
    ("fields", "argument"),
    [
        ({"pad": 1}, "pad"),
        ({"n_fid": 0}, "n_fid"),
        ({"n_fid": 20_000}, "n_fid"),
        ({"n_valid": 60_000}, "n_valid"),
        ({"classifier": 3}, "classifier"),
    ],
)
def test_bad_config_is_an_error_naming_the_field(fields, argument):
    with pytest.raises(ValueError, match=f"'{argument}'"):
        G.GanMnistConfig(**fields)


def test_scoring_the_valid_split_needs_a_classifier_that_held_its_digits_out(mnist_classifier):
    """The valid split's real digits are the last n_valid training digits: a classifier that
    held out fewer trained on some of them, and its accuracy on them was inflated."""
    config = G.GanMnistConfig(n_fid=40, n_valid=100, classifier=mnist_classifier)  # it held 16
    for split in ("test", "valid"):
        built = G.GanMnistTask(config, seed=0, eval_config=EvalConfig(batch_size=16, split=split))
        if split == "test":
            runs.attach_runs(built)
            continue
        with pytest.raises(ValueError, match=r"held out at least this task's n_valid = 100"):
            runs.attach_runs(built)
