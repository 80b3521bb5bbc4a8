"""Config keys a model or task never reads (`rundir.unread_keys`) are refused by `--set`: each
was recorded in config.json and changed nothing (`eval.limit` on a bits task scored every
sequence; `train.lr` on a GAN trained at the model's rates). These tests check the
declarations against the code: a key declared unread is never read."""

import dataclasses
import tempfile
from pathlib import Path

import pytest
import torch

from attnzoo import runs
from attnzoo.models.registry import MODELS
from attnzoo.tasks.base import EvalConfig, MissingDataDependency
from attnzoo.tasks.registry import TASKS
from attnzoo.train import loop
from tests.tasks.test_held_out import _same
from tests.test_devices import tiny_config

PAIRS = [
    (m, t) for t, ts in TASKS.items() for m, ms in MODELS.items() if ms.interface == ts.interface
]
EVAL_FIELDS = {f.name for f in dataclasses.fields(EvalConfig)}


class RecordingEvalConfig(EvalConfig):
    """An EvalConfig that notes every field read from it."""

    def __getattribute__(self, name):
        read = object.__getattribute__(self, "__dict__").get("read")
        if read is not None and name in EVAL_FIELDS:
            read.add(name)
        return object.__getattribute__(self, name)


@pytest.mark.parametrize(("model_name", "task_name"), PAIRS)
def test_an_eval_key_declared_unread_is_never_read(model_name, task_name):
    """Training loss, evaluation, the explorer and the figures of a tiny model read no
    declared-unread EvalConfig field (the GAN's evaluation stops at its missing classifier,
    after reading its sizes)."""
    declared = {k.split(".", 1)[1] for k in runs.unread_keys(model_name, task_name)}
    declared &= EVAL_FIELDS
    c = runs.configs(tiny_config(model_name, task_name))
    recording = RecordingEvalConfig(**dataclasses.asdict(c["eval"]))
    object.__setattr__(recording, "read", set())
    try:
        task = TASKS[task_name].build(c["task"], seed=0, eval_config=recording)
    except MissingDataDependency as err:
        pytest.skip(str(err))
    torch.manual_seed(0)
    model = MODELS[model_name].build(c["model"], task)
    phase = {"phase": "discriminator"} if hasattr(model, "optimizer_groups") else {}
    task.loss(model, task.batch(0, 2, "cpu"), **phase)
    model.eval()
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        try:
            task.evaluate(model)
        except ValueError as err:
            assert "classifier" in str(err)  # gan_mnist without a trained classifier
        task.explore(model, 2)
        task.figures(model, Path(folder), 1)
    assert not declared & recording.read
    if not declared:  # a task that reads every field says nothing: the test sees them read
        assert recording.read >= {"split"}


@pytest.mark.parametrize("model_name", [m for m, s in MODELS.items() if "train.lr" in s.unread])
def test_a_model_with_its_own_optimisers_reads_no_train_rate(model_name):
    """Its optimisers take their rates and betas from the model, whatever train.lr and
    train.betas say."""
    task_name = next(t for m, t in PAIRS if m == model_name)
    c = runs.configs(tiny_config(model_name, task_name))
    task = TASKS[task_name].build(c["task"], seed=0, eval_config=c["eval"])
    model = MODELS[model_name].build(c["model"], task)
    phases = {}
    for lr, betas in ((1e-4, (0.9, 0.999)), (0.9, (0.1, 0.2))):
        config = dataclasses.replace(c["train"], lr=lr, betas=betas)
        groups = loop._phases(model, config, loop.Distributed())
        phases[lr] = [
            (o.param_groups[0]["lr"], o.param_groups[0]["betas"]) for _, o, _, _ in groups
        ]
    assert phases[1e-4] == phases[0.9]


def test_a_language_model_reads_no_encoder_depth():
    config = runs.default_config("transformer-lm", "kjv_lm")
    shapes = []
    for layers in (1, 3):
        config["model"]["layers_enc"] = layers
        c = runs.configs(config)
        model = MODELS["transformer-lm"].build(c["model"], TASKS["kjv_lm"].build(
            c["task"], seed=0, eval_config=c["eval"]))  # fmt: skip
        shapes.append({n: p.shape for n, p in model.named_parameters()})
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize(
    ("model_name", "task_name", "key"),
    sorted({(m, t, k) for m, t in PAIRS for k in runs.unread_keys(m, t)}),
)
def test_setting_an_unread_key_is_refused(model_name, task_name, key):
    config = runs.default_config(model_name, task_name)
    section, name = key.split(".")
    old = config[section][name]
    new = {int: 7, float: 0.5, tuple: "0.1,0.2"}[type(old)]
    with pytest.raises(ValueError, match=f"'{key}' expected its value .* never reads it"):
        runs.apply_overrides(config, [f"{key}={new}"])
    same = ",".join(map(str, old)) if isinstance(old, tuple) else old
    runs.apply_overrides(runs.default_config(model_name, task_name), [f"{key}={same}"])


SECTION_KEYS = sorted(
    {
        (m, t, k)
        for m, t in PAIRS
        for k in runs.unread_keys(m, t)
        if k.startswith(("model.", "task."))
    }
)


@pytest.mark.parametrize(("model_name", "task_name", "key"), SECTION_KEYS)
def test_a_model_or_task_key_declared_unread_changes_nothing(model_name, task_name, key):
    """A model or task field declared unread for the pair (in the registry, or by its
    config's `unread()` at these values) changes no initial weight, training batch, loss
    or score when it is changed behind `--set`'s back."""
    section, name = key.split(".")
    base = tiny_config(model_name, task_name)
    changed = {**base, section: {**base[section]}}
    old = base[section][name]
    changed[section][name] = (not old) if isinstance(old, bool) else old + 1
    found = []
    for config in (base, changed):
        c = runs.configs(config)
        try:
            task = TASKS[task_name].build(c["task"], seed=0, eval_config=c["eval"])
        except MissingDataDependency as err:
            pytest.skip(str(err))
        torch.manual_seed(0)
        model = MODELS[model_name].build(c["model"], task)
        batch = task.batch(0, 2, "cpu")
        torch.manual_seed(1)
        loss, _ = task.loss(model, batch)
        model.eval()
        torch.manual_seed(2)
        with torch.no_grad():
            metrics = task.evaluate(model)
        found.append((model.state_dict(), batch, loss, metrics))
    assert _same(found[0], found[1])


def test_a_key_left_unread_by_another_setting_is_refused_with_it():
    """Under pre-LN the Transformer always has its final LayerNorm: final_norm=true is refused
    beside pre_norm=true (with the reason), and the two models it would name are one."""
    config = runs.default_config("transformer", "dates")
    with pytest.raises(ValueError, match="'model.final_norm' expected its value .*pre_norm=True"):
        runs.apply_overrides(config, ["model.pre_norm=true", "model.final_norm=true"])
    runs.apply_overrides(runs.default_config("transformer", "dates"), ["model.pre_norm=true"])
    runs.apply_overrides(runs.default_config("transformer", "dates"), ["model.final_norm=true"])
    built = []
    for final_norm in (False, True):
        c = runs.configs(tiny_config("transformer", "dates"))
        model_config = dataclasses.replace(c["model"], pre_norm=True, final_norm=final_norm)
        task = TASKS["dates"].build(c["task"], seed=0, eval_config=c["eval"])
        torch.manual_seed(0)
        built.append(MODELS["transformer"].build(model_config, task).state_dict())
    assert _same(built[0], built[1])


def test_the_mnist_seed_is_refused_only_where_nothing_reads_it():
    """On plain MNIST at zoom (1, 1) the task's seed draws nothing for a model that samples
    no glimpse path (its held-out images are the official digits as they are): `--set
    task.seed=1` for such a model was recorded and changed nothing. Where something draws
    from it (placement, zoom, sampled paths), it is taken."""
    no_paths = [m for m, t in PAIRS if t == "mnist" and "task.mc_samples" in MODELS[m].unread]
    paths = [m for m, t in PAIRS if t == "mnist" and "task.mc_samples" not in MODELS[m].unread]
    assert no_paths and paths
    for model in no_paths:
        with pytest.raises(ValueError, match="'task.seed' expected its value 0: .* never reads"):
            runs.apply_overrides(runs.default_config(model, "mnist"), ["task.seed=1"])
        zoomed = runs.apply_overrides(runs.default_config(model, "mnist"), ["task.zoom=0.8,1.2"])
        runs.apply_overrides(zoomed, ["task.seed=1"])
        runs.apply_overrides(runs.default_config(model, "translated_mnist"), ["task.seed=1"])
    for model in paths:
        runs.apply_overrides(runs.default_config(model, "mnist"), ["task.seed=1"])
        config = runs.default_config(model, "mnist")
        with pytest.raises(ValueError, match="'task.seed' expected its value 0: .* never reads"):
            runs.apply_overrides(config, ["task.mc_samples=0", "task.seed=1"])
