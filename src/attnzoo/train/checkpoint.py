"""Checkpoints: safetensors for every tensor, JSON for everything else, written atomically.

A checkpoint is a folder `step_{N:08d}/` holding `tensors.safetensors` (model weights under
`model.`, optimizer tensors under `optimizer.`, the torch RNG states under `rng.`: the CPU's,
and the GPU's of a model on CUDA) and
`state.json` (optimizer hyper-parameters, schedule, step, Python RNG). `latest.json` names
the newest complete one; it is written last, so a run killed mid-save resumes from the
previous checkpoint. Nothing is ever unpickled. Tensors are saved from the CPU and loaded
onto `map_location` (by default the model's device), so a run saved on one device resumes or
evaluates on another.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied embeddings): store independent copies.
    return {k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return _contiguous(model.state_dict())


def save_checkpoint(
    directory: Path, step: int, model, optimizer, scheduler, keep: int = 2, task=None
):
    """Save everything needed to continue bit-for-bit at step + 1, including the tensors of a
    task that keeps state (`task.state_dict()`, e.g. a REINFORCE baseline policy)."""
    directory = Path(directory)
    folder = directory / f"step_{step:08d}"
    tensors = {f"model.{k}": v for k, v in model_tensors(model).items()}
    if hasattr(task, "state_dict"):
        tensors.update({f"task.{k}": v for k, v in task.state_dict().items()})
    opt = optimizer.state_dict()
    opt_scalars = {}
    for pid, entry in opt["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{pid}.{name}"] = value
            else:
                opt_scalars[f"{pid}.{name}"] = value
    tensors["rng.torch"] = torch.get_rng_state()
    device = _device(model)
    if device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(device)
    state = {
        "step": step,
        "optimizer": {"param_groups": opt["param_groups"], "scalars": opt_scalars},
        "scheduler": scheduler.state_dict(),
        "python_rng": _jsonable(random.getstate()),
    }
    atomic_write(folder / "tensors.safetensors", save_tensors(_contiguous(tensors)))
    atomic_write_json(folder / "state.json", state)
    atomic_write_json(directory / "latest.json", {"step": step, "path": folder.name})
    old = sorted(p for p in directory.glob("step_*") if p.is_dir())[:-keep]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return folder


def _jsonable(obj):
    if isinstance(obj, tuple | list):
        return [_jsonable(x) for x in obj]
    return obj


def _tupled(obj):
    if isinstance(obj, list):
        return tuple(_tupled(x) for x in obj)
    return obj


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = Path(directory) / "latest.json"
    if not pointer.exists():
        return None
    return Path(directory) / json.loads(pointer.read_text())["path"]


def _device(model) -> torch.device:
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def _load(folder: Path, map_location: torch.device | str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: the model's and the task's on `map_location`; the RNG
    states and the optimizer's on the CPU (`optimizer.load_state_dict` moves each state to
    its parameter's device, except AdamW's step counts, which belong on the CPU)."""
    tensors = load_tensors((Path(folder) / "tensors.safetensors").read_bytes())
    mapped = ("model.", "task.")
    return {k: v.to(map_location) if k.startswith(mapped) else v for k, v in tensors.items()}


def load_weights(folder: Path, map_location: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint, on `map_location`."""
    tensors = _load(folder, map_location)
    return {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}


def load_checkpoint(folder: Path, model, optimizer, scheduler, task=None, map_location=None) -> int:
    """Restore model, optimizer, schedule, RNG and task states; returns the step saved.
    Tensors go to `map_location`, by default the model's device."""
    folder = Path(folder)
    tensors = _load(folder, map_location or _device(model))
    state = json.loads((folder / "state.json").read_text())
    model.load_state_dict(
        {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    )
    opt_state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, pid, name = key.split(".", 2)
            opt_state.setdefault(int(pid), {})[name] = value
    for key, value in state["optimizer"]["scalars"].items():
        pid, name = key.split(".", 1)
        opt_state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict(
        {"state": opt_state, "param_groups": state["optimizer"]["param_groups"]}
    )
    scheduler.load_state_dict(state["scheduler"])
    if hasattr(task, "load_state_dict"):
        task.load_state_dict({k[5:]: v for k, v in tensors.items() if k.startswith("task.")})
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and _device(model).type == "cuda":
        torch.cuda.set_rng_state(tensors["rng.cuda"], _device(model))
    random.setstate(_tupled(state["python_rng"]))
    return int(state["step"])
