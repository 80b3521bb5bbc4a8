"""A run's config and its directory: resolved from the registries, checked field by field,
read back, resumed and (only when asked) overwritten.

Nothing is silently wrong and nothing is lost:
1. Every field of a config is checked before any data is built (`apply_overrides`,
   `read_config`); a config.json that is not a run's config is an error naming the file.
2. A run directory that holds anything is never written into unless the run resumes it or
   `overwrite=True` (`--overwrite`) clears it, and then only if it holds nothing but a run's
   files; and never by two processes at once (`check_out`).
3. Resuming takes the saved config; only the keys of `RESUMABLE` may change (recorded in
   config.json), and any other difference from the saved config is an error listing each one.
   `train.steps` may change (extend a run) only where the schedule does not depend on it, so
   that the result equals a run started with that many steps: not with `cosine`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnzoo import config as overrides
from attnzoo.core.checks import fail
from attnzoo.models.registry import MODELS
from attnzoo.tasks.registry import TASKS, EvalConfig
from attnzoo.train.files import note, read_json
from attnzoo.train.loop import TrainConfig

try:
    import fcntl
except ImportError:  # not POSIX (Windows): `check_out` takes no lock
    fcntl = None

SECTIONS = ("model", "task", "train", "eval")

# The keys a resumed run may change: how long it trains (see the module docstring for the
# schedule), how often it logs, evaluates and saves, where it runs, and how it is evaluated.
# Everything else (model, task, seed, optimiser, schedule, batch, autocast, label smoothing,
# which enters the training loss) would make a run that is neither the old one nor a new one.
RESUMABLE = (
    "train.steps",
    "train.log_every",
    "train.eval_every",
    "train.checkpoint_every",
    "train.threads",
    "train.device",
    "eval.split",
    "eval.limit",
    "eval.beam_size",
    "eval.batch_size",
)

# The keys `attnzoo eval --set` may change in a finished run's config: how it is evaluated
# (RESUMABLE's eval keys; label smoothing enters the training loss) and the task fields its
# config class names in `HELD_OUT`, which change what is scored and never what was trained
# (e.g. how many test images are drawn from the official test digits): `evaluation_keys`.
EVALUATION = tuple(key for key in RESUMABLE if key.startswith("eval."))

EXPLORER = "explore.html"  # the explorer page's default name in a run (`attnzoo explore`)
DEMO = "demo.json"  # written by `attnzoo demo` into its run: the one kind it replaces
# What a run writes in its directory (`overwrite` clears these, and refuses anything else)
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "final.json",
    "timing.json",
    "checkpoints",
    "figures",
    "scalars.jsonl",
    EXPLORER,
    DEMO,
)


def _check_names(model: str, task: str) -> None:
    if model not in MODELS:
        fail("attnzoo", "MODEL", f"one of {sorted(MODELS)}", repr(model))
    if task not in TASKS:
        fail("attnzoo", "--task", f"one of {sorted(TASKS)}", repr(task))
    if MODELS[model].interface != TASKS[task].interface:
        fitting = sorted(fitting_models(task))
        fail("attnzoo", "MODEL", f"a model for --task {task}: one of {fitting}", repr(model))


def fitting_models(task: str) -> list[str]:
    """The models that train on `task`: those of its interface."""
    return [name for name, m in MODELS.items() if m.interface == TASKS[task].interface]


def default_config(model: str, task: str) -> dict[str, Any]:
    _check_names(model, task)
    spec = TASKS[task]
    return {
        "model_name": model,
        "task_name": task,
        "model": dataclasses.asdict(MODELS[model].preset()),
        "task": dataclasses.asdict(spec.default_config()),
        "train": dataclasses.asdict(TrainConfig(**spec.train)),
        "eval": dataclasses.asdict(spec.eval_config()),
    }


def _classes(config: dict) -> dict[str, type]:
    return {
        "model": MODELS[config["model_name"]].config_class,
        "task": TASKS[config["task_name"]].config_type(),
        "train": TrainConfig,
        "eval": EvalConfig,
    }


def apply_overrides(config: dict, sets: list[str]) -> dict:
    """`section.field=value` strings -> config; every section's own checks then run, before
    any work. A key the model or task never reads (`unread_keys`) set to another value is an
    error: it would be recorded in config.json and change nothing."""
    before = copy.deepcopy(config)
    overrides.apply(config, _classes(config), sets)
    unread = unread_keys(config["model_name"], config["task_name"], config)
    for key, old, new in differences(before, config):
        if key in unread:
            pair = f"{config['model_name']} on {config['task_name']}"
            why = f" ({unread[key]})" if unread[key] else ""
            fail("attnzoo --set", key, f"its value {old!r}: {pair} never reads it{why}", repr(new))
    return config


def unread_keys(model: str, task: str, config: dict | None = None) -> dict[str, str]:
    """The config keys a run of `model` on `task` never reads -> why ("" when it never does):
    the model's and the task's declared `unread`, and the fields a model or task section
    leaves unread at the values of `config` (default: the pair's defaults), by its
    `unread()` (a bits task's repeat counts on kind 'copy'), and a task's fields left unread
    by what the model leaves unread, by its `unread_given(keys)` (the MNIST seed of a model
    that samples no glimpse path). Every section is checked first."""
    built = configs(default_config(model, task) if config is None else config)
    keys = dict.fromkeys([*MODELS[model].unread, *TASKS[task].unread()], "")
    for section in ("model", "task"):
        unread = getattr(built[section], "unread", None)
        for name, why in (unread() if unread else {}).items():
            keys[f"{section}.{name}"] = why
    given = getattr(built["task"], "unread_given", None)  # a task's, by the model's (mnist)
    for name, why in (given(frozenset(keys)) if given else {}).items():
        keys[f"task.{name}"] = why
    return keys


def configs(config: dict) -> dict[str, Any]:
    """Each section of a resolved config (`default_config`, then `apply_overrides`) built into
    its dataclass, every field checked; a config without its names or sections is an error
    naming what it lacks."""
    check_keys(config, "config")
    _check_names(config["model_name"], config["task_name"])
    built = {s: overrides.build(cls, config[s], s) for s, cls in _classes(config).items()}
    _check_kind(config["task_name"], getattr(built["task"], "kind", None))
    return built


def _check_kind(task: str, kind: object) -> None:
    """A task name that fixes its config's kind (copy, reverse, tsp, ...) keeps it: another
    kind trains another task under this one's name (its run directory, its docs row)."""
    named = TASKS[task].defaults.get("kind")
    if named is None or kind == named:
        return
    other = [n for n, s in TASKS.items() if s.defaults.get("kind") == kind]
    hint = f"; --task {other[0]} trains {kind!r}" if other else ""
    fail("attnzoo", "task.kind", f"{named!r}, the kind --task {task} names{hint}", repr(kind))


def check_keys(config: object, argument: str) -> None:
    """A dict with a model and a task name and every section (SECTIONS)."""
    keys = ("model_name", "task_name", *SECTIONS)
    if not isinstance(config, dict) or any(k not in config for k in keys):
        got = sorted(config) if isinstance(config, dict) else type(config).__name__
        fail("attnzoo", argument, f"a run's config with the keys {list(keys)}", got)


def read_config(run_dir: Path, argument: str = "DIR") -> dict:
    """A run directory's config.json, checked field by field, its model section in today's
    fields (a config written by an earlier version is upgraded by its model's registry entry).
    A config.json that is not a run's config is an error naming the file; a missing run
    directory one naming `argument` (the command's: DIR, or train's --out)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "not a directory" if run_dir.exists() else "no such directory"
        fail("attnzoo", argument, "a run directory", f"{run_dir} ({what})", FileNotFoundError)
    path = run_dir / "config.json"
    if not path.is_file():
        expected = "a run directory with config.json"
        fail("attnzoo", argument, expected, str(run_dir), FileNotFoundError)
    config = read_json(path, "a run's config")
    check_keys(config, str(path))
    try:
        _check_names(config["model_name"], config["task_name"])
        config["model"] = MODELS[config["model_name"]].upgrade(config["model"])
        built = configs(config)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{path}: {err}") from err
    # every field, those a config written before a field existed lacks at their defaults
    return {**config, **{s: _normal(dataclasses.asdict(built[s])) for s in SECTIONS}}


def _normal(config: dict) -> dict:
    return json.loads(json.dumps(config))  # tuples as lists, as config.json holds them


def differences(saved: dict, given: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, given value) of every key whose value differs."""
    saved, given = _normal(saved), _normal(given)
    found = [
        (label, saved[name], given[name])
        for name, label in (("model_name", "MODEL"), ("task_name", "--task"))
        if saved[name] != given[name]
    ]
    for section in SECTIONS:
        old, new = saved[section], given[section]
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                found.append((f"{section}.{key}", old.get(key), new.get(key)))
    return found


def listing(changes) -> str:
    return "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)


def check_resumable(saved: dict, given: dict) -> list[tuple[str, Any, Any]]:
    """The changes `given` makes to a run's `saved` config, all of them keys of `RESUMABLE`
    (module docstring); any other difference is an error listing every one."""
    changes = differences(saved, given)
    refused = [c for c in changes if c[0] not in RESUMABLE]
    if refused:
        fail(
            "attnzoo --resume",
            ", ".join(key for key, _, _ in refused),
            "the run's saved config (a resumed run may change only "
            f"{', '.join(RESUMABLE)}; start a new run for the rest)",
            listing(refused),
        )
    schedule = saved["train"]["schedule"]
    if any(key == "train.steps" for key, _, _ in changes) and schedule == "cosine":
        fail(
            "attnzoo --resume",
            "train.steps",
            "the saved number of steps: the cosine schedule decays over train.steps, so a "
            "changed count would equal neither the old run nor a run of the new count "
            "(extend runs of schedule constant or inverse_sqrt)",
            listing(c for c in changes if c[0] == "train.steps"),
        )
    return changes


def resume_config(
    run_dir: Path, model: str | None = None, task: str | None = None, sets: list[str] = ()
) -> dict:
    """The config a resumed run continues with: the saved one (`read_config`), with the
    `--set` items applied. A MODEL or --task other than the saved ones, or a `--set` of a key
    outside `RESUMABLE` to another value, is an error listing every difference."""
    saved = read_config(run_dir, "--out")  # (train --resume's)
    given = copy.deepcopy(saved)
    named = {"model_name": model, "task_name": task}
    if all(saved[k] == v for k, v in named.items() if v is not None):
        apply_overrides(given, list(sets))
    else:  # the --set keys are those of the model and task named
        for key, value in named.items():
            if value is not None:
                given[key] = value
    check_resumable(saved, given)
    return given


def evaluation_keys(task: str) -> tuple[str, ...]:
    """The config keys `evaluation_config` may change for a run of `task` (`EVALUATION`)."""
    held_out = getattr(TASKS[task].config_type(), "HELD_OUT", ())
    return EVALUATION + tuple(f"task.{name}" for name in held_out)


def evaluation_config(run_dir: Path, sets: list[str] = ()) -> dict:
    """A finished run's config (`read_config`) with the `--set` items of `attnzoo eval`
    applied: a key outside `evaluation_keys` set to another value is an error listing every
    such change, before any data is built (the weights were trained under the saved values)."""
    saved = read_config(run_dir)
    given = apply_overrides(copy.deepcopy(saved), list(sets))
    allowed = evaluation_keys(saved["task_name"])
    refused = [c for c in differences(saved, given) if c[0] not in allowed]
    if refused:
        fail(
            "attnzoo eval",
            ", ".join(key for key, _, _ in refused),
            f"a key that changes only the evaluation (one of {', '.join(allowed)}; "
            "train a new run for the rest)",
            listing(refused),
        )
    return given


def main_process() -> bool:
    """Not a torchrun worker other than rank 0 (which alone writes the run directory)."""
    return int(os.environ.get("RANK", "0")) == 0


LOCK = ".lock"  # in a run directory: locked by the process training there (`check_out`)


@contextlib.contextmanager
def check_out(out: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[list[Path]]:
    """Claim `out` as the run directory for the block, checked before any work: a directory
    (made here if need be) that this process can write in, new or empty unless the run resumes
    it; with `overwrite`, one holding only a run's files (`RUN_FILES`). Yields what `overwrite`
    will clear.

    The claim is an exclusive `fcntl.flock` on the directory's `LOCK` file, held to the end of
    the block and released by the OS when the process ends, killed or not: a second process
    training into the directory meanwhile (`--resume` run twice, a benchmark started twice) is
    an error naming --out, and an interrupted run can be resumed at once. Where the file system
    refuses locks (some network mounts), a line on stderr says the directory is unguarded and
    the run goes on."""
    out = Path(out)
    if resume and overwrite:
        fail("attnzoo", "--overwrite", "either --resume or --overwrite", "both")
    made = not out.exists()  # removed again if the block fails before it writes anything
    if out.is_dir():  # a folder that is not to be trained into: refused before the lock file
        _replaceable(out, resume, overwrite)  # is made in it (checked again under the lock)
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / LOCK, "a+")  # noqa: SIM115 (held open to the block's end)
    except OSError as err:
        why = err.strerror or str(err)
        fail("attnzoo", "--out", "a directory attnzoo can create and write in", f"{out} ({why})")
    with lock:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                holder = lock.read().strip() or "?"
                fail(
                    "attnzoo",
                    "--out",
                    "a run directory no other process is training in",
                    f"{out} (locked by process {holder})",
                    BlockingIOError,
                )
            except OSError as err:  # a file system without locks (some NFS): train unlocked
                why = err.strerror or str(err)
                note(f"{out} could not be locked ({why}): nothing stops a second process there")
            lock.truncate(0)
            lock.write(str(os.getpid()))
            lock.flush()
        try:
            yield _replaceable(out, resume, overwrite)
        except BaseException:
            # a check that failed before any work (init_from's weights, a task's needs) leaves
            # no empty run directory behind it, and a user's empty folder as it was
            if [p.name for p in out.iterdir()] == [LOCK]:
                (out / LOCK).unlink()
                if made:
                    out.rmdir()
            raise


def _replaceable(out: Path, resume: bool, overwrite: bool) -> list[Path]:
    entries = sorted(p for p in out.iterdir() if p.name != LOCK)
    if not entries or resume:
        return []
    names = [p.name for p in entries]
    if not overwrite:
        fail(
            "attnzoo",
            "--out",
            "a new or empty run directory (--resume continues the run in it, "
            "--overwrite replaces it)",
            f"{out} holding {names}",
            FileExistsError,
        )
    foreign = [str(p.relative_to(out)) for e in entries for p in _foreign(e)]
    if foreign:
        fail(
            "attnzoo",
            "--out",
            f"a run directory (only {list(RUN_FILES)}, as a run writes them) for --overwrite "
            "to clear",
            f"{out} also holding {foreign}",
            FileExistsError,
        )
    return entries


def _run_file(name: str) -> bool:
    """A file the run writes, or the temp file of one a killed process left (`.NAME.xxxx`,
    `atomic_write`): a hidden entry of anything else (`.git`) is the user's."""
    return name in RUN_FILES or any(name.startswith(f".{n}.") for n in RUN_FILES)


_FIGURE = re.compile(r"[^.][^/]*\.png|\.[^/]+\.png\..+")  # a figure, or its temp file
_CHECKPOINT = re.compile(r"step_\d{8}(\.damaged(-\d+)?)?")  # set aside when damaged
_CHECKPOINT_FILES = {"latest": ("latest.json",), "state": ("state.json", "tensors.safetensors")}


def _foreign(entry: Path) -> list[Path]:
    """What of a run directory's top-level `entry` the run did not write: the entry itself,
    or what a folder of the run's names holds besides the run's files. A user's file put in
    figures/ or checkpoints/, or a config.json that is not a run's, would otherwise be
    cleared with the run's."""
    name = entry.name
    if not _run_file(name):
        return [entry]
    if name == "config.json" and not _run_config(entry):
        return [entry]
    if name == "figures" and entry.is_dir() and not entry.is_symlink():
        return [p for p in entry.iterdir() if not (p.is_file() and _FIGURE.fullmatch(p.name))]
    if name == "checkpoints" and entry.is_dir() and not entry.is_symlink():
        found = []
        for p in entry.iterdir():
            if p.is_dir() and not p.is_symlink() and _CHECKPOINT.fullmatch(p.name):
                found += [f for f in p.iterdir() if not _checkpoint_file(f, "state")]
            elif not _checkpoint_file(p, "latest"):
                found.append(p)
        return found
    return []


def _checkpoint_file(path: Path, kind: str) -> bool:
    """A file `save_checkpoint` writes: latest.json beside the step folders (`kind`
    "latest"), state.json and tensors.safetensors in them ("state"), or a temp file of one."""
    names = _CHECKPOINT_FILES[kind]
    name = path.name
    return path.is_file() and (name in names or any(name.startswith(f".{n}.") for n in names))


def _run_config(path: Path) -> bool:
    """Whether config.json reads as a run's (a JSON object naming its model and task)."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {"model_name", "task_name"} <= config.keys()


def clear(out: Path, entries: list[Path]) -> None:
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    note(f"replacing the run in {out}: cleared {', '.join(p.name for p in entries)}")
