"""The model and task registries agree with each other, with the CLI and with the configs:
every check compares against the registries themselves, never a typed copy of them."""

import dataclasses

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
