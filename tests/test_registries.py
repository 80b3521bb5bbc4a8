"""The model and task registries agree with each other, with the CLI and with the configs:
every check compares against the registries themselves, never a typed copy of them."""

import dataclasses
import inspect
import typing

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


# good values for every size a model class takes (each interface's, registry docstring)
SIZES = {"channels": 1, "classes": 10, "labels": 3, "vocab": 20, "max_len": 8, "ways": 5}
SIZES |= {"shots": 1, "source_vocab": 20, "target_vocab": 20, "max_source_len": 12}
SIZES |= {"max_target_len": 12, "input_dim": 2, "input_size": 8, "output_size": 8}
SIZES |= {"arms": 5, "pulls": 10, "inputs": 7, "image_size": (32, 32), "end_token": True}
BAD = {"image_size": [32, (32,), (32, 0), (32.0, 32.0), (True, 32), "32x32"]}
BAD["end_token"] = [1, "yes", None]
CASES = [
    (name, argument)
    for name, spec in MODELS.items()
    for argument in inspect.signature(spec.model_class).parameters
    if argument != "config"
]


def test_every_size_a_model_takes_has_a_good_value_here():
    assert {argument for _, argument in CASES} <= set(SIZES)


@pytest.mark.parametrize(("name", "argument"), CASES)
def test_a_bad_size_is_an_error_naming_it(name, argument):
    spec = MODELS[name]
    wanted = inspect.signature(spec.model_class).parameters
    sizes = {k: v for k, v in SIZES.items() if k in wanted}
    spec.model_class(spec.preset(), **sizes)  # the same call builds with good values
    for bad in BAD.get(argument, [0, -1, 2.5, True, "8"]):
        with pytest.raises(ValueError, match=f"'{argument}'"):
            spec.model_class(spec.preset(), **{**sizes, argument: bad})


def _configs():
    """Every config class the registries make: the models' presets, the tasks' defaults, the
    training and evaluation configs."""
    found = {type(spec.preset()): spec.preset() for spec in MODELS.values()}
    for spec in TASKS.values():
        found[type(spec.default_config())] = spec.default_config()
        found[EvalConfig] = spec.eval_config()
        found[TrainConfig] = TrainConfig(**spec.train)
    return list(found.values())


BAD_BY_TYPE = {int: [2.5, True, "8"], float: [True, "0.1", None], bool: [1, "yes"]}
BAD_BY_TYPE[tuple[int, ...]] = [(8, 2.5), (True,), ("8",), 8]


@pytest.mark.parametrize("config", _configs(), ids=lambda c: type(c).__name__)
def test_every_config_refuses_a_value_of_the_wrong_type(config):
    hints = typing.get_type_hints(type(config))
    checked = 0
    for field in dataclasses.fields(config):
        kind = hints[field.name]
        plain = (
            [kind]
            if kind in BAD_BY_TYPE
            else [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        )
        if len(plain) != 1 or plain[0] not in BAD_BY_TYPE:
            continue
        optional = type(None) in typing.get_args(kind)
        for bad in [b for b in BAD_BY_TYPE[plain[0]] if not (optional and b is None)]:
            with pytest.raises(ValueError, match=f"'{field.name}'"):
                dataclasses.replace(config, **{field.name: bad})
        checked += 1
    assert checked
