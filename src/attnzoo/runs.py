"""Runs: a resolved config -> task and model on a device -> the training loop -> a run directory.

A run directory holds config.json (resolved; the device requested), metrics.jsonl, final.json
(the device used among the metrics), checkpoints/ and figures/ (DESIGN.md, "Runs"). Tasks and
models come from their registries; what is task-specific (budgets, model sizes, figures) is the
task's (`attnzoo.tasks.base.Task`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from attnzoo import config as overrides
from attnzoo.core.checks import fail
from attnzoo.models.registry import MODELS
from attnzoo.tasks.registry import TASKS, EvalConfig
from attnzoo.train.checkpoint import atomic_write_json, latest_checkpoint, load_weights
from attnzoo.train.device import resolve_device
from attnzoo.train.loop import TrainConfig, train


def default_config(model: str, task: str) -> dict[str, Any]:
    if model not in MODELS:
        fail("attnzoo", "MODEL", f"one of {sorted(MODELS)}", repr(model))
    if task not in TASKS:
        fail("attnzoo", "--task", f"one of {sorted(TASKS)}", repr(task))
    spec = TASKS[task]
    if MODELS[model].interface != spec.interface:
        fitting = sorted(name for name, m in MODELS.items() if m.interface == spec.interface)
        fail("attnzoo", "MODEL", f"a model for --task {task}: one of {fitting}", repr(model))
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
    any work."""
    overrides.apply(config, _classes(config), sets)
    _configs(config)
    return config


def _configs(config: dict) -> dict[str, Any]:
    return {s: overrides.build(cls, config[s]) for s, cls in _classes(config).items()}


def read_config(run_dir: Path) -> dict:
    """A run directory's config.json, its model section in today's fields (a config written by
    an earlier version is upgraded by its model's registry entry)."""
    path = Path(run_dir) / "config.json"
    if not path.exists():
        fail("attnzoo", "DIR", "a run directory with config.json", str(run_dir))
    config = json.loads(path.read_text())
    if config.get("model_name") in MODELS:
        config["model"] = MODELS[config["model_name"]].upgrade(config["model"])
    return config


def build(config: dict):
    """(task, model) from a resolved config, on the CPU: a seed gives the same weights
    whatever device the run then moves them to."""
    c = _configs(config)
    spec = TASKS[config["task_name"]]
    task = spec.build(c["task"], seed=c["train"].seed, eval_config=c["eval"])
    torch.manual_seed(c["train"].seed)
    return task, MODELS[config["model_name"]].build(c["model"], task)


def run_train(config: dict, out: Path, *, resume: bool = False, progress: bool = True):
    """Train in `out` on `train.device` (the loop moves the model there)."""
    out, train_config = Path(out), _configs(config)["train"]
    resolve_device(train_config.device)  # a device this machine lacks fails before any work
    task, model = build(config)
    if not resume:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "config.json", config)
    final = train(task, model, train_config, out, resume=resume, progress=progress)
    return task, model, final


def load_run(run_dir: Path, device: str = "auto"):
    """(config, task, model) of a run, the newest weights on `device` (as `train.device`)."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    task, model = build(config)
    folder = latest_checkpoint(run_dir / "checkpoints")
    if folder is None:
        fail("attnzoo", "DIR", "a run with a checkpoint", f"none under {run_dir}/checkpoints")
    device = resolve_device(device)
    model.to(device).load_state_dict(load_weights(folder, device))
    return config, task, model.eval()


def write_figures(run_dir: Path, task, model, *, count: int = 3) -> list[Path]:
    """The task's figures (`task.figures`) and loss.png, the learning curve, in figures/."""
    from attnzoo.viz import loss_figure

    figures = Path(run_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        written = list(task.figures(model.eval(), figures, count))
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        fig = loss_figure([r["step"] for r in rows], [r["loss"] for r in rows])
        fig.savefig(figures / "loss.png", dpi=110)
        written.append(figures / "loss.png")
    return written
