"""Checkpoints: safetensors for every tensor, JSON for everything else, written atomically.

A checkpoint is a folder `step_{N:08d}/` holding `tensors.safetensors` (model weights under
`model.`, optimizer tensors under `optimizer.` (a model with several optimisers: each under
`optimizers.NAME.`), the torch RNG states under `rng.`: the CPU's, and the GPU's of a model on
CUDA) and `state.json` (optimizer hyper-parameters, schedule (several optimisers: each under
`{"groups": {NAME: ...}}`), step, Python RNG, and the SHA-256 of tensors.safetensors).
`latest.json` names the newest complete one; it is written last, so a run killed mid-save
resumes from the previous checkpoint. Nothing is ever unpickled. Tensors are
saved from the CPU and loaded onto `map_location` (by default the model's device), so a run
saved on one device resumes or evaluates on another.

Reading checks every file: a missing, truncated or corrupt file (a pickle put in place of the
safetensors file included), a checksum that does not match, or weights that do not fit the
model is a `CheckpointError` naming the file. `find_resumable` walks the checkpoints newest
first and returns the newest intact one with the ones it skipped and why.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from attnzoo.core.checks import fail
from attnzoo.core.files import atomic_write, atomic_write_json
from attnzoo.train.files import warn

TENSORS, STATE = "tensors.safetensors", "state.json"
_FOLDER = re.compile(r"step_(\d{8})")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: its message names the file and what is wrong."""


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied embeddings): store independent copies.
    return {k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return _contiguous(model.state_dict())


def save_checkpoint(
    directory: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    keep: int = 2,
    task=None,
    timing: dict | None = None,
    rank_rng: list[dict[str, torch.Tensor]] | None = None,
    world: int = 1,
):
    """Save everything needed to continue bit-for-bit at step + 1, including the tensors of a
    task that keeps state (`task.state_dict()`, e.g. a REINFORCE baseline policy).
    `optimizer` and `scheduler`: one each, or dicts {name: one} of a model that trains
    several (`attnzoo.train.loop`), all saved. `timing`: the training time up to this step
    (`saved_timing`), so that a resumed run reports all of it. `rank_rng`: in a run of several
    processes, each one's RNG states ({"torch": ..., "cuda": ...}, by rank), saved beside this
    process's so that each resumed process continues its own stream (`load_checkpoint`).
    `world`: the number of processes that trained it, which a resume must match."""
    directory = Path(directory)
    folder = directory / f"step_{step:08d}"
    tensors = {f"model.{k}": v for k, v in model_tensors(model).items()}
    if hasattr(task, "state_dict"):
        tensors.update({f"task.{k}": v for k, v in task.state_dict().items()})
    if isinstance(optimizer, dict):
        groups = {n: _optimizer_state(o, f"optimizers.{n}.", tensors) for n, o in optimizer.items()}
        opt_json = {"groups": groups}
        sched_json = {"groups": {n: sched.state_dict() for n, sched in scheduler.items()}}
    else:
        opt_json = _optimizer_state(optimizer, "optimizer.", tensors)
        sched_json = scheduler.state_dict()
    tensors["rng.torch"] = torch.get_rng_state()
    device = _device(model)
    if device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(device)
    for rank, states in enumerate(rank_rng or ()):
        tensors.update({f"rng.rank{rank}.{name}": state for name, state in states.items()})
    data = save_tensors(_contiguous(tensors))
    state = {
        "step": step,
        "optimizer": opt_json,
        "scheduler": sched_json,
        "python_rng": _jsonable(random.getstate()),
        "tensors_sha256": hashlib.sha256(data).hexdigest(),
        "world": world,
    }
    if timing is not None:
        state["timing"] = timing
    atomic_write(folder / TENSORS, data)
    atomic_write_json(folder / STATE, state)
    atomic_write_json(directory / "latest.json", {"step": step, "path": folder.name})
    for p in checkpoint_folders(directory)[keep:]:
        shutil.rmtree(p, ignore_errors=True)
    return folder


def _optimizer_state(optimizer, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
    """An optimizer's JSON part ({param_groups, scalars}); its tensors go into `tensors` under
    `prefix`."""
    opt = optimizer.state_dict()
    opt_scalars = {}
    for pid, entry in opt["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}{pid}.{name}"] = value
            else:
                opt_scalars[f"{pid}.{name}"] = value
    return {"param_groups": opt["param_groups"], "scalars": opt_scalars}


def _jsonable(obj):
    if isinstance(obj, tuple | list):
        return [_jsonable(x) for x in obj]
    return obj


def _tupled(obj):
    if isinstance(obj, list):
        return tuple(_tupled(x) for x in obj)
    return obj


def checkpoint_folders(directory: Path) -> list[Path]:
    """The `step_{N:08d}` folders under `directory`, newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _FOLDER.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: p.name, reverse=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The folder `latest.json` names (the newest complete checkpoint); without a usable
    latest.json (or the folder it names), the newest folder holding both files; None when there
    is none."""
    pointer = Path(directory) / "latest.json"
    try:
        named = json.loads(pointer.read_text())["path"]
        named_ok = isinstance(named, str) and _FOLDER.fullmatch(named)
        if named_ok and (Path(directory) / named).is_dir():
            return Path(directory) / named
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for folder in checkpoint_folders(directory):
        if (folder / TENSORS).exists() and (folder / STATE).exists():
            return folder
    return None


def find_resumable(directory: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest checkpoint whose files are intact, [(newer folder skipped, why)]): what a
    resumed run continues from. Only the files are checked here; whether the weights fit the
    model is checked when they are loaded."""
    skipped = []
    for folder in checkpoint_folders(directory):
        try:
            read_checkpoint(folder)
        except CheckpointError as err:
            skipped.append((folder, str(err)))
            continue
        return folder, skipped
    return None, skipped


def checkpoint_step(folder: Path) -> int:
    """The step a checkpoint was saved at (its state.json)."""
    return int(_read_state(Path(folder))["step"])


def _read_state(folder: Path) -> dict:
    path = folder / STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        _corrupt(path, "no such file (an interrupted save?)")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        _corrupt(path, f"unreadable or malformed JSON ({err})")
    needed = ("step", "optimizer", "scheduler", "python_rng")
    if not isinstance(state, dict) or any(k not in state for k in needed):
        _corrupt(path, f"not a checkpoint state (expected the keys {list(needed)})")
    if isinstance(state["step"], bool) or not isinstance(state["step"], int):
        _corrupt(path, f"a non-integer step {state['step']!r}")
    try:  # restored last on resume: checked here, before a resume records or changes anything
        random.Random().setstate(_tupled(state["python_rng"]))
    except (TypeError, ValueError) as err:
        _corrupt(path, f"a malformed 'python_rng' state ({err})")
    return state


TIMING = {"train_seconds": float, "eval_seconds_during": float, "steps_run": int, "sessions": int}


def saved_timing(folder: Path) -> dict | None:
    """The training time a checkpoint records up to its step (`TIMING`'s keys: seconds
    training and evaluating during training, the steps they cover, the processes that trained
    it), or None for a checkpoint written before it was kept."""
    path = Path(folder) / STATE
    timing = _read_state(Path(folder)).get("timing")
    if timing is None:
        return None

    def bad(value, kind) -> bool:
        return isinstance(value, bool) or not isinstance(value, int | kind) or value < 0

    if not isinstance(timing, dict) or any(bad(timing.get(k), t) for k, t in TIMING.items()):
        _corrupt(path, f"a malformed 'timing' {timing!r} (expected {sorted(TIMING)}, each >= 0)")
    return {k: kind(timing[k]) for k, kind in TIMING.items()}


def _corrupt(path: Path, why: str):
    fail("attnzoo", str(path), "an intact checkpoint file", why, CheckpointError)


def read_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors on the CPU, state) of a checkpoint folder, every file checked (module
    docstring): an unusable file is a `CheckpointError` naming it."""
    folder = Path(folder)
    state = _read_state(folder)
    path = folder / TENSORS
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        _corrupt(path, "no such file (an interrupted save?)")
    except OSError as err:
        _corrupt(path, f"unreadable ({err})")
    expected = state.get("tensors_sha256")  # absent in checkpoints written before it was kept
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        _corrupt(path, f"{len(data)} bytes whose SHA-256 differs from the one in {STATE}")
    try:
        tensors = load_tensors(data)
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as err:
        _corrupt(path, f"not a safetensors file ({' '.join(str(err).split())})")
    if "rng.torch" not in tensors:
        _corrupt(path, "no 'rng.torch' tensor (not a checkpoint's tensors)")
    rng = tensors["rng.torch"]
    if rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        _corrupt(path, f"an 'rng.torch' of {rng.dtype} {tuple(rng.shape)}, not a CPU RNG state")
    return tensors, state


def _device(model) -> torch.device:
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def _load(folder: Path, map_location: torch.device | str) -> tuple[dict[str, torch.Tensor], dict]:
    """The checkpoint's tensors and state: the model's and the task's tensors on
    `map_location`; the RNG states and the optimizer's on the CPU (`optimizer.load_state_dict`
    moves each state to its parameter's device, except AdamW's step counts, which belong on the
    CPU)."""
    tensors, state = read_checkpoint(folder)
    mapped = ("model.", "task.")
    tensors = {k: v.to(map_location) if k.startswith(mapped) else v for k, v in tensors.items()}
    return tensors, state


def _section(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_weights(folder: Path, map_location: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint, on `map_location`."""
    return _section(_load(folder, map_location)[0], "model.")


def load_model_weights(folder: Path, model: torch.nn.Module) -> None:
    """Load a checkpoint's weights into `model` (on its device); weights of another shape or
    names are a `CheckpointError` naming the file and the run's config.json."""
    _fit(model, _section(_load(folder, _device(model))[0], "model."), Path(folder) / TENSORS)


def load_shared_weights(folder: Path, model: torch.nn.Module, argument: str) -> list[str]:
    """Copy into `model` (on its device) every weight of the checkpoint whose name its state
    dict has, at the same shape, and leave the rest of `model` as it is: fine-tuning from
    another run's weights, e.g. a classifier's `encoder.` into a captioner's. Returns the names
    copied, sorted. A shared name of another shape, or no shared name at all, is an error
    naming `argument` (the option that asked for it) and the checkpoint."""
    weights = _section(_load(folder, _device(model))[0], "model.")
    own = model.state_dict()
    shared = sorted(set(weights) & set(own))
    if not shared:
        wanted = f"a checkpoint ({folder}) with weights named as this model's"
        fail("attnzoo", argument, wanted, f"only others, e.g. {sorted(weights)[:3]}")
    for name in shared:
        if weights[name].shape != own[name].shape:
            wanted = f"{name} of shape {tuple(own[name].shape)} in {folder}"
            fail("attnzoo", argument, wanted, tuple(weights[name].shape))
    model.load_state_dict({k: weights[k] for k in shared}, strict=False)
    return shared


def _fit(model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path) -> None:
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # size mismatch, missing or unexpected keys
        detail = " ".join(str(err).split())
        if len(detail) > 300:
            detail = detail[:300] + "..."
        fail(
            "attnzoo",
            str(path),
            "weights that fit the model the run's config.json builds",
            detail,
            CheckpointError,
        )


def load_checkpoint(
    folder: Path,
    model,
    optimizer,
    scheduler,
    task=None,
    map_location=None,
    rank: int = 0,
    world: int = 1,
) -> int:
    """Restore model, optimizer, schedule, RNG and task states; returns the step saved.
    Tensors go to `map_location`, by default the model's device. `optimizer` and `scheduler`
    as `save_checkpoint`'s: dicts by name must name the checkpoint's optimisers. `rank`: the
    process's in a run of several, whose own RNG states it restores where the checkpoint has
    them (else the saving process's). `world`: the number of processes resuming, which must
    be the number that trained it: each process draws its own samples and data, so another
    count continues neither run, without a word (refused before anything loads)."""
    folder = Path(folder)
    tensors, state = _load(folder, map_location or _device(model))
    # a checkpoint from before `world` was recorded: its processes' RNG states tell
    ranks = {key.split(".")[1] for key in tensors if key.startswith("rng.rank")}
    trained_by = state.get("world", max(1, len(ranks)))
    if trained_by != world:
        fail(
            "attnzoo --resume",
            "processes",
            f"the {trained_by} process(es) that trained {folder.name} (torchrun "
            f"--nproc_per_node={trained_by}; another count continues neither run)",
            world,
        )
    _fit(model, _section(tensors, "model."), folder / TENSORS)
    several = isinstance(optimizer, dict)
    saved_groups = (
        state["optimizer"].get("groups") if isinstance(state["optimizer"], dict) else None
    )
    if several != (saved_groups is not None) or (
        several and set(optimizer) != set(saved_groups or ())
    ):
        given = sorted(optimizer) if several else "one optimizer"
        saved = sorted(saved_groups) if saved_groups is not None else "one optimizer"
        _corrupt(folder / STATE, f"optimizers {saved}, the model trains {given}")
    try:
        if several:
            for name, opt in optimizer.items():
                _load_optimizer(opt, saved_groups[name], _section(tensors, f"optimizers.{name}."))
                scheduler[name].load_state_dict(state["scheduler"]["groups"][name])
        else:
            _load_optimizer(optimizer, state["optimizer"], _section(tensors, "optimizer."))
            scheduler.load_state_dict(state["scheduler"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        _corrupt(folder / STATE, f"an optimizer state that does not fit the model ({err})")
    if hasattr(task, "load_state_dict"):
        task.load_state_dict(_section(tensors, "task."))
    own = f"rng.rank{rank}."
    torch.set_rng_state(tensors.get(own + "torch", tensors["rng.torch"]))
    cuda = tensors.get(own + "cuda", tensors.get("rng.cuda"))
    if cuda is not None and _device(model).type == "cuda":
        torch.cuda.set_rng_state(cuda, _device(model))
    random.setstate(_tupled(state["python_rng"]))
    return int(state["step"])


def _load_optimizer(optimizer, saved: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Load an optimizer from its JSON part and its tensors (prefix removed)."""
    opt_state: dict[int, dict] = {}
    for key, value in tensors.items():
        pid, name = key.split(".", 1)
        opt_state.setdefault(int(pid), {})[name] = value
    for key, value in saved["scalars"].items():
        pid, name = key.split(".", 1)
        opt_state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": saved["param_groups"]})


def resume_point(directory: Path, *, set_aside: bool = True) -> Path:
    """The checkpoint a resumed run continues from: the newest intact one (`find_resumable`).
    Each newer one skipped is named on stderr with the reason, and, with `set_aside`, renamed
    to `step_N.damaged` (kept, never deleted, and no longer taken for a checkpoint), and
    latest.json names the one used, which is named too. Without `set_aside` (a torchrun worker
    other than rank 0) nothing is reported or moved. No intact checkpoint is an error naming
    each one and why."""
    directory = Path(directory)
    folder, skipped = find_resumable(directory)
    if folder is None:
        if skipped:
            reasons = "; ".join(why for _, why in skipped)
            fail("attnzoo", "--resume", f"an intact checkpoint under {directory}", reasons)
        fail(
            "attnzoo",
            "--resume",
            f"a checkpoint under {directory} (the run saved none: start it again with --overwrite)",
            "none",
        )
    if not set_aside or not skipped:  # a torchrun worker other than rank 0 stays quiet
        return folder
    for damaged, why in skipped:
        target, n = damaged.with_name(damaged.name + ".damaged"), 1
        while target.exists():
            n += 1
            target = damaged.with_name(f"{damaged.name}.damaged-{n}")
        damaged.rename(target)
        warn(f"skipped checkpoint {damaged.name}: {why}; kept as {target.name}")
    step = checkpoint_step(folder)
    atomic_write_json(directory / "latest.json", {"step": step, "path": folder.name})
    warn(f"resuming from the newest intact checkpoint, {folder.name}")
    return folder
