"""Runs: a resolved config -> task and model on a device -> the training loop -> a run directory.

A run directory holds config.json (resolved; the device requested), metrics.jsonl, final.json
(the device used among the metrics), checkpoints/ and figures/ (DESIGN.md, "Runs"), and the
explorer page explore.html once written (`write_explorer`). Tasks and
models come from their registries; what is task-specific (budgets, model sizes, figures) is the
task's (`attnzoo.tasks.base.Task`); the config and the run directory's rules (checked before
any work, resumed, never overwritten unasked) are `attnzoo.rundir`'s.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from attnzoo.config import qualified
from attnzoo.core.checks import fail
from attnzoo.core.files import atomic_write, atomic_write_json
from attnzoo.models.registry import MODELS
from attnzoo.rundir import (  # noqa: F401  (the config half of this module's public API)
    DEMO,
    EXPLORER,
    LOCK,
    RESUMABLE,
    apply_overrides,
    check_out,
    check_resumable,
    clear,
    configs,
    default_config,
    differences,
    evaluation_config,
    evaluation_keys,
    fitting_models,
    listing,
    main_process,
    read_config,
    resume_config,
    unread_keys,
)
from attnzoo.tasks.registry import TASKS
from attnzoo.train.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    load_model_weights,
    load_shared_weights,
    read_checkpoint,
    resume_point,
)
from attnzoo.train.device import launched_world, resolve_device
from attnzoo.train.files import note, read_metrics
from attnzoo.train.loop import check_world, evaluate, train  # noqa: F401  (evaluate: eval's)


def run_train(
    config: dict,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    demo: bool = False,
):
    """Train in `out` on `train.device` (the loop moves the model there).

    Order: every check before any work (the config, the device, `out`, claimed by this
    process to the loop's end: `check_out`; on resume, the checkpoint to continue from and the
    changes to the saved config: `check_resumable`), then the data and the model, then `out`
    is cleared (`overwrite`), then the loop, which on resume records the changes in config.json
    once the checkpoint has loaded (a resume that fails to load changes nothing). A fresh
    run with `train.init_from` starts from that run's newest weights wherever they fit
    (`init_checkpoint`); a resumed one from its own checkpoint. `demo`: the run is `attnzoo
    demo`'s, marked so (`mark_demo`) before the loop."""
    built = configs(config)
    out, train_config = Path(out), built["train"]
    with _qualified(built):  # 'train.device', not TrainConfig's 'device'
        resolve_device(train_config.device)  # a device this machine lacks: before any work
        check_world(train_config, MODELS[config["model_name"]].model_class, launched_world())
    start = init_checkpoint(train_config.init_from) if not resume else None
    main = main_process()
    saved = read_config(out, "--out") if resume else None  # before check_out makes `out`
    claim = check_out(out, resume=resume, overwrite=overwrite) if main else nullcontext([])
    with claim as entries:  # held to the loop's end: no second process trains in `out`
        folder, changes = None, []
        if resume:
            changes = check_resumable(saved, config)
            folder = resume_point(out / "checkpoints", set_aside=main)
            trained = checkpoint_step(folder) + 1
            if train_config.steps < trained:
                fail(
                    "attnzoo --resume",
                    "train.steps",
                    f"at least the {trained} steps this run has trained ({folder.name})",
                    train_config.steps,
                )
        task, model = build(config)
        getattr(task, "check_ready", lambda: None)()  # what scoring needs, before a step
        if start is not None:
            loaded = load_shared_weights(start, model, "train.init_from")
            listed = ", ".join(loaded[:4])
            note(f"train.init_from: {len(loaded)} tensors from {start} ({listed}, ...)")
        if main and entries:
            clear(out, entries)
        if main and not resume:
            atomic_write_json(out / "config.json", config)
            if demo:  # marked before it trains: an interrupted demo is the demo's to replace
                mark_demo(out)

        def record() -> None:  # a resume's changes, once its checkpoint has loaded
            # final.json and timing.json are the earlier settings' results, written again at
            # the end: left beside the new config.json, an interrupted extension read as a
            # finished run of the new settings (e.g. 6 steps' metrics under train.steps=12)
            for stale in ("final.json", "timing.json"):
                (out / stale).unlink(missing_ok=True)
            atomic_write_json(out / "config.json", config)
            note(f"--resume: {listing(changes)} (recorded in {out / 'config.json'})")

        recorded = record if main and changes else None
        final = train(
            task,
            model,
            train_config,
            out,
            resume=folder or False,
            progress=progress,
            resumed=recorded,
        )
    return task, model, final


def demo_replaces(out: Path) -> bool:
    """Whether `attnzoo demo` replaces a run in `out`: one an earlier demo finished there
    (its `DEMO` file says so), so the demo runs again. A new or empty directory needs no
    replacing; one holding anything else is the user's (a `train` run of the demo's model
    and task too), refused before any work."""
    held = sorted(p.name for p in out.iterdir() if p.name != LOCK) if out.is_dir() else []
    if not held:
        return False
    if not (out / DEMO).is_file():
        wanted = f"a new or empty directory, or an earlier demo's run (with its {DEMO})"
        fail("attnzoo demo", "--out", wanted, f"{out} holding {held}", FileExistsError)
    return True


def mark_demo(out: Path) -> None:
    """`out` holds a run the demo made (`demo_replaces`)."""
    atomic_write_json(out / DEMO, {"made_by": "attnzoo demo"})


def init_checkpoint(run_dir: str) -> Path | None:
    """The checkpoint `train.init_from` names: the newest of the run directory `run_dir`
    (None for ""); a directory without one is an error naming the option."""
    if not run_dir:
        return None
    folder = latest_checkpoint(Path(run_dir) / "checkpoints")
    if folder is None:
        got = f"{run_dir} (no checkpoint)"
        fail("attnzoo", "train.init_from", "a trained run's directory", got)
    return folder


def build(config: dict):
    """(task, model) from a resolved config, on the CPU: a seed gives the same weights
    whatever device the run then moves them to. A section's check that fails only once the
    data is made (a dates `n_train` more than its years can write) names `task.n_train`."""
    c = configs(config)
    spec = TASKS[config["task_name"]]
    with _qualified(c):
        task = spec.build(c["task"], seed=c["train"].seed, eval_config=c["eval"])
        attach_runs(task)
        torch.manual_seed(c["train"].seed)
        return task, MODELS[config["model_name"]].build(c["model"], task)


def _qualified(built: dict):
    """`config.qualified` for the sections `configs` built (section -> dataclass)."""
    return qualified({section: type(value) for section, value in built.items()})


def attach_runs(task) -> None:
    """Hand a task the trained runs its metrics need (`task.required_runs()` -> {config field:
    run directory}, e.g. the GAN task's classifier), each loaded on the CPU by `load_run` and
    given with `task.use_run(field, config, model)`. A directory that is not a usable run is
    an error naming task.FIELD, before any data of the run being built."""
    for field, run_dir in getattr(task, "required_runs", dict)().items():
        path = Path(run_dir)
        try:
            if not (path / "config.json").is_file():
                raise FileNotFoundError("no config.json")
            run_config, _, model = load_run(path, device="cpu")
        except (ValueError, OSError) as err:
            fail("attnzoo", f"task.{field}", "a trained run's directory", f"{run_dir} ({err})")
        task.use_run(field, run_config, model)


def load_run(run_dir: Path, device: str = "auto", sets: list[str] = ()):
    """(config, task, model) of a run, the newest weights on `device` (as `train.device`),
    its config changed by the `sets` items that change only the evaluation
    (`evaluation_config`). A damaged newest checkpoint is an error naming its file (`--resume`
    falls back to an older one; evaluating one would report another run's result)."""
    run_dir = Path(run_dir)
    config = evaluation_config(run_dir, sets)
    folder = latest_checkpoint(run_dir / "checkpoints")
    if folder is None:
        fail("attnzoo", "DIR", "a run with a checkpoint", f"none under {run_dir}/checkpoints")
    read_checkpoint(folder)  # its files, before the data is built
    device = resolve_device(device, ("attnzoo", "--device"))
    task, model = build(config)
    load_model_weights(folder, model.to(device))
    return config, task, model.eval()


def write_figures(run_dir: Path, task, model, *, count: int = 3) -> list[Path]:
    """The task's figures (`task.figures`), loss.png, the learning curve, and scalars.png, the
    model's per-step scalars (scalars.jsonl, when the model logs any), in figures/."""
    from attnzoo.viz import loss_figure, save_figure

    figures = Path(run_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        written = list(task.figures(model.eval(), figures, count))
    metrics = Path(run_dir) / "metrics.jsonl"
    rows = read_metrics(metrics) if metrics.exists() else []
    if rows:
        fig = loss_figure([r["step"] for r in rows], [r["loss"] for r in rows])
        save_figure(fig, figures / "loss.png")
        written.append(figures / "loss.png")
    scalars = Path(run_dir) / "scalars.jsonl"
    rows = read_metrics(scalars, None) if scalars.exists() else []
    if rows:  # the model's per-step scalars (`train.loop`), e.g. the SAGAN gammas
        from attnzoo.viz.gan import scalars_figure

        names = [k for k in rows[0] if k != "step"]
        curves = {k: ([r["step"] for r in rows], [r[k] for r in rows]) for k in names}
        fig = scalars_figure(curves, title="logged every step")
        save_figure(fig, figures / "scalars.png")
        written.append(figures / "scalars.png")
    return written


def check_explorer_out(out: Path) -> None:
    """Fail naming --out unless `out` may receive an explorer page: a new file in an
    existing folder, or a page an earlier `attnzoo explore` wrote (never another file)."""
    from attnzoo.viz.explore import GENERATOR

    out = Path(out)
    if out.is_dir():
        fail("attnzoo explore", "--out", "a file to write the page to", f"the directory {out}")
    if not out.parent.is_dir():
        fail("attnzoo explore", "--out", "a file in an existing folder", f"{out} (no such folder)")
    if out.exists():
        with open(out, "rb") as f:
            head = f.read(1024).decode("utf-8", errors="replace")
        if f'<meta name="generator" content="{GENERATOR}">' not in head:
            fail(
                "attnzoo explore",
                "--out",
                "a new file or an explorer page attnzoo wrote (replaced)",
                f"{out}, an existing file of other content",
            )


def write_explorer(out: Path, task, model, *, count: int, heading: str) -> Path:
    """The explorer page (`attnzoo.viz.explore`) of `count` held-out examples of `task`
    (`task.explore`, the model in eval mode without gradients), written atomically to `out`
    (checked first: `check_explorer_out`)."""
    from attnzoo.viz.explore import explorer_html

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        fail("attnzoo explore", "--examples", "a positive int", repr(count))
    check_explorer_out(out)
    with torch.no_grad():
        data = task.explore(model.eval(), count)
    if (shown := len(data["examples"])) < count:  # a held-out set of fewer (e.g. eval.limit)
        note(f"explorer: {shown} of the {count} examples asked for (all the held-out set has)")
    atomic_write(Path(out), explorer_html(data, heading=heading).encode("utf-8"))
    return Path(out)
