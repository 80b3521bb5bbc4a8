"""Runs: a resolved config -> task, model, training, figures, in a run directory.

A run directory holds config.json (resolved), metrics.jsonl, final.json, checkpoints/ and
figures/ (DESIGN.md, "Runs").
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import torch

from attnzoo.core.checks import fail
from attnzoo.models.registry import MODELS
from attnzoo.tasks.registry import TASKS
from attnzoo.tasks.translation import EvalConfig, TranslationTask
from attnzoo.train.checkpoint import atomic_write_json, latest_checkpoint, load_weights
from attnzoo.train.loop import TrainConfig, train

# Per-task training budgets sized for this 2-core CPU (see docs/ for what they reach).
TASK_TRAIN = {
    "dates": dict(steps=1000, batch_size=64, lr=3e-3, warmup=100, checkpoint_every=250),
    "numbers": dict(steps=1500, batch_size=64, lr=3e-3, warmup=100, checkpoint_every=250),
    "kjv2web": dict(steps=6000, batch_size=64, lr=2e-3, warmup=200, checkpoint_every=500),
    **{
        k: dict(steps=3000, batch_size=64, lr=3e-3, warmup=100, checkpoint_every=500)
        for k in ("copy", "reverse", "sort")
    },
    "kjv_lm": dict(steps=3000, batch_size=32, lr=1e-3, warmup=200, checkpoint_every=500),
    # Pointer tasks at the budgets of docs/pointer_net.md: TSP n=10 within 1% of the optimum,
    # hull n=10 at 85% accuracy (benchmarks/bench_pointer.py)
    **{
        k: dict(steps=n, batch_size=128, lr=1e-3, warmup=100, checkpoint_every=500, clip=2.0)
        for k, n in (("sort_numbers", 2000), ("convex_hull", 12000), ("tsp", 8000))
    },
    # NTM bit tasks: bit_copy (24k sequences) ends at 0 bit errors per sequence on lengths
    # 1-20 and 40 (train.seed 0 and 1; ~3 min on a quiet thread); repeat_copy and
    # associative_recall are untuned guesses that do not converge (docs/ntm.md)
    **{
        k: dict(
            steps=n, batch_size=16, lr=3e-3, schedule="cosine", warmup=100, checkpoint_every=250
        )
        for k, n in (("bit_copy", 1500), ("repeat_copy", 3000), ("associative_recall", 3000))
    },
}
TASK_EVAL = {
    "dates": dict(limit=0),  # the whole held-out test split
    "numbers": dict(limit=0),
    "kjv2web": dict(limit=500),
    "copy": dict(limit=1000),
    "reverse": dict(limit=1000),
    "sort": dict(limit=1000),
    "kjv_lm": dict(limit=0),  # every held-out window (KjvLmConfig.n_test_chars bounds them)
    **{k: dict(limit=0) for k in ("sort_numbers", "convex_hull", "tsp")},  # n_test instances
    # BitsConfig.n_test_per_length sizes the held-out set; eval.limit is unused
    **{k: dict(limit=0) for k in ("bit_copy", "repeat_copy", "associative_recall")},
}
SECTIONS = ("model", "task", "train", "eval")


def default_config(model: str, task: str) -> dict[str, Any]:
    if model not in MODELS:
        fail("attnzoo", "MODEL", f"one of {sorted(MODELS)}", repr(model))
    if task not in TASKS:
        fail("attnzoo", "--task", f"one of {sorted(TASKS)}", repr(task))
    interface = TASKS[task].interface
    if MODELS[model].interface != interface:
        fitting = sorted(name for name, spec in MODELS.items() if spec.interface == interface)
        fail("attnzoo", "MODEL", f"a model for --task {task}: one of {fitting}", repr(model))
    return {
        "model_name": model,
        "task_name": task,
        "model": dataclasses.asdict(MODELS[model].preset()),
        "task": dataclasses.asdict(TASKS[task].default_config()),
        "train": dataclasses.asdict(TrainConfig(**TASK_TRAIN[task])),
        "eval": dataclasses.asdict(EvalConfig(**TASK_EVAL[task])),
    }


def _classes(config: dict) -> dict[str, type]:
    return {
        "model": MODELS[config["model_name"]].config_class,
        "task": TASKS[config["task_name"]].config_type(),
        "train": TrainConfig,
        "eval": EvalConfig,
    }


def _parse(value: str, annotation, key: str):
    """Parse `value` as the dataclass field's type."""
    text = value.strip()
    origin = typing.get_origin(annotation)
    kinds = (
        typing.get_args(annotation) if origin in (typing.Union, type(int | None)) else (annotation,)
    )
    if type(None) in kinds and text.lower() == "none":
        return None
    for kind in kinds:
        base = typing.get_origin(kind) or kind
        try:
            if base is bool:
                if text.lower() in ("true", "1", "yes"):
                    return True
                if text.lower() in ("false", "0", "no"):
                    return False
                raise ValueError
            if base is int:
                return int(text)
            if base is float:
                return float(text)
            if base is tuple:
                items = json.loads(text) if text.startswith("[") else text.split(",")
                inner = (typing.get_args(kind) or (str,))[0]
                return tuple(inner(x) if callable(inner) else x for x in items)
            if base is str:
                return text
            if base is typing.Literal and text in typing.get_args(kind):
                return text
        except (ValueError, TypeError, json.JSONDecodeError):
            continue
    fail("attnzoo --set", key, f"a value of type {annotation}", repr(value))


def apply_overrides(config: dict, sets: list[str]) -> dict:
    """`section.field=value` strings -> config; an unknown key lists the valid ones."""
    classes = _classes(config)
    for item in sets:
        if "=" not in item:
            fail("attnzoo --set", "--set", "key=value (e.g. model.hidden=256)", repr(item))
        key, value = item.split("=", 1)
        section, _, name = key.strip().partition(".")
        valid = sorted(f"{s}.{f.name}" for s in SECTIONS for f in dataclasses.fields(classes[s]))
        if section not in SECTIONS or name not in config[section]:
            fail("attnzoo --set", key, f"one of {', '.join(valid)}", repr(key))
        hints = typing.get_type_hints(classes[section])
        config[section][name] = _parse(value, hints[name], key)
    validate(config)
    return config


def validate(config: dict) -> None:
    """Construct every config dataclass once so their own checks run before any work."""
    for section, cls in _classes(config).items():
        cls(**_tuples(config[section]))


def _tuples(d: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def build(config: dict):
    """(task, model) from a resolved config."""
    classes = _classes(config)
    spec = TASKS[config["task_name"]]
    module = spec.load()
    task_config = classes["task"](**_tuples(config["task"]))
    seed, eval_config = config["train"]["seed"], EvalConfig(**config["eval"])
    if spec.factory:
        task = getattr(module, spec.factory)(task_config, seed=seed, eval_config=eval_config)
    else:
        task = TranslationTask(
            module.make_splits(task_config),
            module.detokenize,
            metric=spec.metric,
            seed=seed,
            eval_config=eval_config,
            max_vocab=spec.max_vocab,
        )
    model_config = classes["model"](**_tuples(config["model"]))
    if any(f.name == "max_source_len" for f in dataclasses.fields(model_config)):
        # sized by the data (Luong's location score, learned positions): the longest source
        model_config = dataclasses.replace(model_config, max_source_len=task.max_source_len)
    if any(f.name == "max_target_len" for f in dataclasses.fields(model_config)):
        # decoding runs up to max_target_len + 5 tokens (TranslationTask.translate)
        model_config = dataclasses.replace(model_config, max_target_len=task.max_target_len + 5)
    torch.manual_seed(config["train"]["seed"])
    return task, MODELS[config["model_name"]].build(model_config, task)


def run_train(config: dict, out: Path, *, resume: bool = False, progress: bool = True):
    out = Path(out)
    task, model = build(config)
    if not resume:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "config.json", config)
    train_config = TrainConfig(**_tuples(config["train"]))
    final = train(task, model, train_config, out, resume=resume, progress=progress)
    return task, model, final


def load_run(run_dir: Path):
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.exists():
        fail("attnzoo", "DIR", "a run directory with config.json", str(run_dir))
    config = json.loads(path.read_text())
    task, model = build(config)
    folder = latest_checkpoint(run_dir / "checkpoints")
    if folder is None:
        fail("attnzoo", "DIR", "a run with a checkpoint", f"none under {run_dir}/checkpoints")
    model.load_state_dict(load_weights(folder))
    model.eval()
    return config, task, model


def write_figures(run_dir: Path, task, model, *, count: int = 3) -> list[Path]:
    """figures/alignment.png (+ alignment_1.png ...) and figures/loss.png; for a model whose
    forward returns per-head maps (the Transformer), also figures/heads_encoder_self.png,
    heads_decoder_self.png and heads_cross.png of the first example. A task that draws its own
    pictures has `figures(model, folder, count) -> paths` (pointer and memory tasks); a task
    that does neither (a language model) gets loss.png only."""
    from attnzoo.viz import alignment_figure, loss_figure

    figures = Path(run_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    written = []
    if hasattr(task, "figures"):
        with torch.no_grad():
            model.eval()
            written += task.figures(model, figures, count)
    elif hasattr(task, "translate") and hasattr(task, "alignments"):
        examples = task.examples()[:count]
        with torch.no_grad():
            model.eval()
            outputs = task.translate(model, examples)
            weights = task.alignments(model, examples)
        for k, (e, w) in enumerate(zip(examples, weights, strict=False)):
            title = f"output: {task.detokenize(outputs[k])}"
            fig = alignment_figure(w, [*e.source, "<eos>"], [*e.target, "<eos>"], title=title)
            path = figures / ("alignment.png" if k == 0 else f"alignment_{k}.png")
            fig.savefig(path, dpi=110)
            written.append(path)
        if examples:
            written += _head_figures(figures, task, model, examples[0])
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        fig = loss_figure([r["step"] for r in rows], [r["loss"] for r in rows])
        fig.savefig(figures / "loss.png", dpi=110)
        written.append(figures / "loss.png")
    return written


def _head_figures(figures: Path, task, model, example) -> list[Path]:
    """One grid of per-head maps (layers x heads) per attention kind the model's teacher-forced
    forward returns; none for a model without per-head maps. Self-attention maps carry the
    same tokens on both axes (the decoder's inputs start with <bos>); cross-attention rows are
    the output tokens, as in alignment.png."""
    from attnzoo.viz import head_grid_figure

    pair = (
        task.source_vocab.encode(example.source, add_eos=True),
        task.target_vocab.encode(example.target),
    )
    batch = task.collate([pair])  # one example: no padding, so the maps are its own
    with torch.no_grad():
        model.eval()
        out = model(batch.source, batch.lengths, batch.target_in, return_weights=True)
    source = [*example.source, "<eos>"]
    decoder_in = ["<bos>", *example.target]
    kinds = {  # file -> (output field of per-layer maps, key labels, query labels, title)
        "heads_encoder_self.png": ("encoder_weights", source, source, "encoder self-attention"),
        "heads_decoder_self.png": (
            "decoder_weights",
            decoder_in,
            decoder_in,
            "decoder self-attention (causal)",
        ),
        "heads_cross.png": ("cross_weights", source, [*example.target, "<eos>"], "cross-attention"),
    }
    written = []
    for name, (field, keys, queries, title) in kinds.items():
        per_layer = getattr(out, field, None)  # per layer (1, heads, query_len, key_len)
        if per_layer is None:
            continue
        weights = torch.stack([w[0] for w in per_layer])  # (layers, heads, query_len, key_len)
        fig = head_grid_figure(weights.float(), keys, queries, title=title)
        fig.savefig(figures / name, dpi=110)
        written.append(figures / name)
    return written
