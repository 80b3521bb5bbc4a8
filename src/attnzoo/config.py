"""Dotted overrides of a run's config (STYLE.md 8): `section.field=value`, each value parsed as
its dataclass field's type; an unknown key lists the valid ones."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing

from attnzoo.core.checks import fail, matches

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def type_name(annotation) -> str:
    """How an error names a field's type: `int`, `tuple[float, float]`, `Literal['a', 'b']`."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def parse_value(value: str, annotation, key: str):
    """`value` as the field's type `annotation` (each member of a union in turn)."""
    text = value.strip()
    union = typing.get_origin(annotation) in (typing.Union, type(int | None))
    kinds = typing.get_args(annotation) if union else (annotation,)
    if type(None) in kinds and text.lower() == "none":
        return None
    for kind in kinds:
        base, args = typing.get_origin(kind) or kind, typing.get_args(kind)
        try:
            if base is bool:
                return _BOOLS[text.lower()]
            if base in (int, float, str):
                return base(text)
            if base is tuple:
                item = (args or (str,))[0]
                if not text.startswith("["):
                    return tuple(item(x) for x in text.split(","))
                items = json.loads(text)  # of the field's JSON types: 8.5 or true for an
                if matches(items, kind):  # int were read as 8 or 1
                    return tuple(item(x) for x in items)
                continue
            if base is typing.Literal and text in args:
                return text
        except (KeyError, ValueError, TypeError, json.JSONDecodeError):
            continue
    fail("attnzoo --set", key, f"a value of type {type_name(annotation)}", repr(value))


def apply(config: dict, classes: dict[str, type], sets: list[str]) -> dict:
    """Set `section.field=value` items in `config` (section -> field dict), whose sections are
    the dataclasses `classes` (section -> class)."""
    for item in sets:
        if "=" not in item:
            fail("attnzoo --set", "--set", "key=value (e.g. model.hidden=256)", repr(item))
        key, value = item.split("=", 1)
        section, _, name = key.strip().partition(".")
        if section not in classes or name not in {
            f.name for f in dataclasses.fields(classes[section])
        }:
            valid = sorted(
                f"{s}.{f.name}" for s, c in classes.items() for f in dataclasses.fields(c)
            )
            fail("attnzoo --set", key, f"one of {', '.join(valid)}", repr(key))
        hints = typing.get_type_hints(classes[section])
        config[section][name] = parse_value(value, hints[name], key)
    return config


def build(cls: type, values: dict, section: str = "config"):
    """The dataclass `cls` from `section` of a config (JSON lists back to tuples): a key `cls`
    lacks or a value not of its field's type is an error naming `section.key`; a field left out
    takes its default (a config written before the field existed); `cls`'s own checks run
    here, their errors naming `section.field` (`train.steps`, not TrainConfig's `steps`)."""
    if not isinstance(values, dict):
        fail("attnzoo", section, f"a mapping of {cls.__name__} fields", repr(values), TypeError)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            valid = ", ".join(f"{section}.{n}" for n in names)
            fail("attnzoo", f"{section}.{key}", f"one of {valid}", repr(key), TypeError)
        if not matches(value, hints[key]):
            fail(
                "attnzoo",
                f"{section}.{key}",
                f"a value of type {type_name(hints[key])}",
                repr(value),
                TypeError,
            )
    with qualified({section: cls}):
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


@contextlib.contextmanager
def qualified(classes: dict[str, type]):
    """An error of a section's class (section -> class) naming its field as the class knows it,
    `TrainConfig: argument 'steps' ...`, re-raised naming it as the run's config and `--set`
    do: `attnzoo: argument 'train.steps' ...`; any other error as it was."""
    try:
        yield
    except (ValueError, TypeError) as error:
        text = str(error)
        for section, cls in classes.items():
            own = f"{cls.__name__}: argument '"
            if text.startswith(own):
                raise type(error)(f"attnzoo: argument '{section}.{text[len(own) :]}") from error
        raise
