"""The model and task registries agree with each other, with the CLI and with the configs:
every check compares against the registries themselves, never a typed copy of them."""

import dataclasses
import inspect

import pytest

from attnzoo import runs
from attnzoo.cli import main
from attnzoo.models.registry import MODELS
from attnzoo.tasks.base import EvalConfig
from attnzoo.tasks.registry import TASKS
from attnzoo.train.loop import TrainConfig


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_has_a_fitting_task(name):
    assert any(t.interface == MODELS[name].interface for t in TASKS.values())


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_has_a_fitting_model(name):
    assert any(m.interface == TASKS[name].interface for m in MODELS.values())


@pytest.mark.parametrize("name", list(MODELS))
def test_presets_construct_and_round_trip(name):
    spec = MODELS[name]
    config = spec.preset()
    assert dataclasses.is_dataclass(config) and type(config) is spec.config_class
    assert spec.config_class(**dataclasses.asdict(config)) == config


@pytest.mark.parametrize("name", list(TASKS))
def test_task_defaults_are_valid_configs(name):
    spec = TASKS[name]
    train = TrainConfig(**spec.train)
    assert train.steps > 0 and train.device == "auto"  # the budget leaves the device to the run
    assert isinstance(spec.eval_config(), EvalConfig)
    config = spec.default_config()
    assert dataclasses.is_dataclass(config) and type(config) is spec.config_type()
    for field, value in spec.defaults.items():
        assert getattr(config, field) == value
    assert callable(spec.load().make_task)


@pytest.mark.parametrize("task", list(TASKS))
def test_default_config_of_every_fitting_pair_and_no_other(task):
    for model, spec in MODELS.items():
        if spec.interface == TASKS[task].interface:
            config = runs.default_config(model, task)
            assert config["train"] == dataclasses.asdict(TrainConfig(**TASKS[task].train))
            assert config["eval"] == dataclasses.asdict(EvalConfig(**TASKS[task].eval))
        else:
            with pytest.raises(ValueError, match="'MODEL'"):
                runs.default_config(model, task)


def test_list_prints_every_name(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*MODELS, *TASKS]:
        assert name in out, name


IMAGE_MODELS = [
    n for n, m in MODELS.items() if "image_size" in inspect.signature(m.model_class).parameters
]
SIZES = {"channels": 1, "classes": 10, "labels": 3, "vocab": 20, "max_len": 8, "ways": 5}
SIZES["shots"] = 1


@pytest.mark.parametrize("name", IMAGE_MODELS)
@pytest.mark.parametrize("bad", [32, (32,), (32, 0), (32.0, 32.0), (True, 32), "32x32"])
def test_a_bad_image_size_is_an_error_naming_it(name, bad):
    spec = MODELS[name]
    wanted = inspect.signature(spec.model_class).parameters
    sizes = {k: v for k, v in SIZES.items() if k in wanted}
    spec.model_class(spec.preset(), image_size=(32, 32), **sizes)  # the same call builds
    with pytest.raises(ValueError, match="'image_size'"):
        spec.model_class(spec.preset(), image_size=bad, **sizes)
