"""The task fields a config class lists in `HELD_OUT` (those `attnzoo eval --set` may change in
a finished run, `runs.evaluation_keys`) change only what is scored: every task built with one
of them changed trains on the very batches of the task without the change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnzoo.tasks.registry import TASKS

CASES = [
    (name, field)
    for name, spec in TASKS.items()
    for field in getattr(spec.config_type(), "HELD_OUT", ())
]


def _other(value):
    """Another valid value of a held-out field: fewer items, or one more size or length."""
    if isinstance(value, bool) or not isinstance(value, int | tuple):
        raise AssertionError(f"no rule here for a held-out field holding {value!r}")
    if isinstance(value, int):
        return value // 2 if value > 1 else value + 1
    return (*value, 3)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and _same(vars(a), vars(b))
    return a == b


def test_some_tasks_declare_held_out_fields_and_each_is_a_field():
    assert CASES
    for name, field in CASES:
        names = {f.name for f in dataclasses.fields(TASKS[name].config_type())}
        assert field in names, (name, field)


@pytest.mark.parametrize("name, field", CASES)
def test_a_held_out_field_leaves_the_training_batches_alone(name, field):
    spec = TASKS[name]
    config = spec.default_config()
    changed = dataclasses.replace(config, **{field: _other(getattr(config, field))})
    tasks = [spec.build(c, seed=3, eval_config=spec.eval_config()) for c in (config, changed)]
    for step in (0, 1):
        first, second = (task.batch(step, 4, "cpu") for task in tasks)
        assert _same(first, second), f"{name}: task.{field} changed the batch of step {step}"
