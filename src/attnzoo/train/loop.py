"""One training loop for every model and task (STYLE.md 12).

The task supplies the step (the `attnzoo.tasks.base.Task` protocol, of which the loop calls
three methods): `task.batch(step, batch_size, device, rank, world)` draws the global batch of
`step` (a pure function of the seed and the step, so a resumed run sees the same data) and
returns this process's shard on `device`; `task.loss(model, batch)` returns the summed loss and
the number of items it sums over; `task.evaluate(model)` returns metrics. The loop owns the
device (`train.device`), optimisation (AdamW, schedule, clipping), logging, checkpoints and
torch.distributed (one process per GPU with NCCL on CUDA, gloo on the CPU).

A model that trains several optimisers (a GAN's discriminator and generator) declares them:
`model.optimizer_groups()` -> [(name, params, lr, betas)], each an AdamW of its own lr and
betas (`train.lr` and `train.betas` unused; weight decay, schedule and clipping are
`train`'s, the schedule scaling each group's lr). Every step then runs one phase per group,
in order: `task.loss(model, batch, phase=name)`, backpropagated, clipped over the group's
parameters and stepped into that group's optimiser only, every gradient cleared after it.
The log has each phase's loss (`loss_NAME`, and `loss` their sum) and lr (`lr_NAME`). Every
optimiser and schedule is checkpointed. A model without `optimizer_groups` trains one AdamW,
whose rate `model.lr_scales()` may scale for some parameters (`parameter_groups`).
A model with `log_scalars()` -> {name: scalar tensor} has them logged after every step, one
line per step in scalars.jsonl (trimmed on resume like metrics.jsonl).

metrics.jsonl has a row every `log_every` steps and at every evaluation (`eval_every`, its
metrics on the row: `eval.split`'s, the test split by default, a learning curve that nothing
selects by), every checkpoint and the last step: each row's loss is the mean over the
steps since the row before, so a run resumed from a checkpoint logs what an uninterrupted one
does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.files import atomic_write, atomic_write_json
from attnzoo.core.seeds import sampling_seed
from attnzoo.train.checkpoint import (
    TIMING,
    checkpoint_step,
    load_checkpoint,
    resume_point,
    save_checkpoint,
    saved_timing,
)
from attnzoo.train.device import check_device, launched_world, resolve_device
from attnzoo.train.files import note, read_metrics

SCHEDULES = ("constant", "cosine", "inverse_sqrt")
AUTOCAST = ("none", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "cosine"  # constant | cosine | inverse_sqrt (Vaswani 2017 eq. 3)
    warmup: int = 100
    clip: float = 1.0  # max gradient norm; 0 disables
    log_every: int = 50
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 500
    seed: int = 0
    threads: int = 0  # torch threads; 0 leaves torch's default
    autocast: str = "none"  # none | bf16: forward and loss under torch.autocast in bfloat16
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N | mps
    # a run directory: before a fresh run's first step, its newest weights replace this
    # model's wherever a name and shape match (`attnzoo.runs`); "" starts from the init
    init_from: str = ""

    def __post_init__(self):
        check_fields(self)
        # Every field, before any work: the name of the field, what it takes, what it got.
        if self.schedule not in SCHEDULES:
            fail("TrainConfig", "schedule", f"one of {list(SCHEDULES)}", repr(self.schedule))
        if self.autocast not in AUTOCAST:
            fail("TrainConfig", "autocast", f"one of {list(AUTOCAST)}", repr(self.autocast))
        for name in ("steps", "batch_size", "log_every", "checkpoint_every"):
            _check_int(name, getattr(self, name), 1, "a positive int")
        for name in ("eval_every", "warmup", "threads", "seed"):
            _check_int(name, getattr(self, name), 0, "a non-negative int")
        if self.seed >= 2**31:  # torch's generators read 32 bits: s and s + 2**32 would agree
            fail("TrainConfig", "seed", "a seed below 2**31", self.seed)
        if not _real(self.lr) or self.lr <= 0:
            fail("TrainConfig", "lr", "a positive, finite learning rate", self.lr)
        for name in ("weight_decay", "clip"):
            if not _real(getattr(self, name)) or getattr(self, name) < 0:
                fail("TrainConfig", name, "a finite number >= 0", getattr(self, name))
        betas = self.betas
        if (
            not isinstance(betas, tuple | list)
            or len(betas) != 2
            or not all(_real(b) and 0 <= b < 1 for b in betas)
        ):
            fail("TrainConfig", "betas", "two numbers in [0, 1), e.g. 0.9,0.999", betas)
        check_device(self.device)
        if not isinstance(self.init_from, str):
            fail("TrainConfig", "init_from", "a run directory (str)", repr(self.init_from))


def _real(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(name: str, value, least: int, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        fail("TrainConfig", name, expected, repr(value))


class Task(Protocol):
    """What the loop calls on a task: three methods of `attnzoo.tasks.base.Task` (the loop
    does not import the tasks package, a sibling layer)."""

    def batch(
        self, step: int, batch_size: int, device: torch.device, rank: int, world: int
    ) -> Any: ...

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]: ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]: ...


def lr_factor(config: TrainConfig, step: int) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based)."""
    warm = min(1.0, (step + 1) / config.warmup) if config.warmup > 0 else 1.0
    if config.schedule == "constant":
        return warm
    if config.schedule == "cosine":
        progress = min(1.0, step / max(1, config.steps))
        return warm * 0.5 * (1 + math.cos(math.pi * progress))
    # inverse_sqrt: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), with lr as the peak
    s = step + 1
    return min(s**-0.5, s * max(1, config.warmup) ** -1.5) * math.sqrt(max(1, config.warmup))


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: torch.device) -> Distributed:
    """Join the process group when launched by torchrun: NCCL when this process's device is a
    GPU (`resolve_device` gives each process the GPU of its local rank), gloo otherwise."""
    if launched_world() <= 1:
        return Distributed()
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size())


def parameter_groups(model: torch.nn.Module, lr: float) -> list[dict]:
    """The optimiser's parameter groups: one at `lr`, unless the model scales the learning
    rate of some of its parameters by a method `lr_scales()` -> {parameter name: factor} (the
    ones it leaves out keep `lr`); the schedule then multiplies every group's rate alike."""
    scales = model.lr_scales() if hasattr(model, "lr_scales") else {}
    named = dict(model.named_parameters())
    unknown = sorted(set(scales) - set(named))
    if unknown:
        fail(type(model).__name__ + ".lr_scales", "names", "its parameters' names", unknown[:3])
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, parameter in named.items():
        factor = float(scales.get(name, 1.0))
        if not 0 < factor < math.inf:
            fail(type(model).__name__ + ".lr_scales", name, "a positive factor", factor)
        groups.setdefault(factor, []).append(parameter)
    ordered = sorted(groups, key=lambda f: f != 1.0)  # the run's own rate first (logged)
    return [{"params": groups[f], "lr": lr * f} for f in ordered]


def _evaluated(row: dict) -> bool:
    """Whether a metrics.jsonl row holds an evaluation's metrics (keys beyond a training
    row's: step, loss, items_per_s, the rates and the phases' losses)."""
    return any(
        k not in ("step", "loss", "items_per_s") and not k.startswith(("lr", "loss_")) for k in row
    )


def _timing(earlier: dict, elapsed: float, eval_during: float, saving: float, steps: int) -> dict:
    """`earlier` (a checkpoint's `saved_timing`) plus this process's `elapsed` seconds since
    its loop began, of which `eval_during` evaluating and `saving` writing checkpoints, over its
    `steps` steps."""
    return {
        "train_seconds": earlier["train_seconds"] + elapsed - eval_during - saving,
        "eval_seconds_during": earlier["eval_seconds_during"] + eval_during,
        "steps_run": earlier["steps_run"] + steps,
        "sessions": earlier["sessions"] + 1,
    }


def _restoring_threads(function):
    """`function` with torch's thread count restored when it returns or raises:
    `TrainConfig.threads` sets it for the run, not for the caller's later work."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        threads = torch.get_num_threads()
        try:
            return function(*args, **kwargs)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    return wrapped


@_restoring_threads
def train(
    task: Task,
    model: torch.nn.Module,
    config: TrainConfig,
    run_dir: Path | None,
    *,
    resume: bool | Path = False,
    progress: bool = True,
    resumed: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Train `model` on `task` on `config.device` (the model is moved there); returns the
    final evaluation metrics and the device they were computed on (`"device"`). Seeds torch's
    global generator with `config.seed`; `config.threads` holds for the run only.

    With `run_dir`, writes metrics.jsonl, final.json, timing.json and checkpoints/ there;
    timing.json holds the seconds spent training (`train_seconds`, evaluations during training
    excluded and counted in `eval_seconds_during`, checkpoint writes excluded and this
    process's counted in `checkpoint_seconds`: a short run, such as a benchmark's calibration,
    would otherwise charge its last checkpoint, a cost that grows with the parameter count, to
    a few steps) over the `steps_run` steps they cover and
    the `sessions` processes that trained the run (a resumed run adds the time its checkpoint
    recorded; one from a checkpoint that recorded none counts this process alone), and the
    final evaluation's seconds (`eval_seconds`), kept apart from final.json so that a resumed
    run's final.json still equals an uninterrupted one's. `resume` continues from a checkpoint
    (True: the newest intact one, `checkpoint.resume_point`; or the folder given) to the same
    result as an uninterrupted run; `resumed` is called once its checkpoint has loaded (the
    runs layer records the run's changed settings then, not for a resume that failed).
    """
    if resume and run_dir is None:
        fail("train", "resume", "a run_dir whose checkpoints to continue from", "run_dir=None")
    device = resolve_device(config.device)
    check_world(config, model, launched_world())
    env = setup_distributed(device)
    model.to(device)
    if env.main and config.autocast == "bf16" and slow_bf16_convolutions(model, device):
        note(
            "train.autocast=bf16: this CPU's oneDNN has no bfloat16 kernels, so the model's "
            "convolutions run on PyTorch's reference kernels, several times slower than "
            "float32; train.autocast=none trains faster here"
        )
    if config.threads:
        torch.set_num_threads(config.threads)
    # a stream per process (the model is built, and DDP gives every rank rank 0's weights):
    # seeded alike, every rank drew the same dropout masks for its rows. Rank 0's is the seed's
    torch.manual_seed(sampling_seed(config.seed, env.rank))
    random.seed(config.seed)  # one state on every rank: a checkpoint keeps rank 0's
    phases = _phases(model, config, env)
    if phases is None:
        optimizer = torch.optim.AdamW(
            parameter_groups(model, config.lr),
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(config, s))
    else:  # one optimiser and schedule per phase, checkpointed by name
        optimizer = {name: opt for name, opt, _, _ in phases}
        scheduler = {name: sched for name, _, sched, _ in phases}
    start = 0
    earlier = {k: kind(0) for k, kind in TIMING.items()}  # what a fresh run adds to
    ckpt_dir = Path(run_dir) / "checkpoints" if run_dir else None
    metrics_path = Path(run_dir) / "metrics.jsonl" if run_dir else None
    scalars = getattr(model, "log_scalars", None)
    scalars_path = Path(run_dir) / "scalars.jsonl" if run_dir and scalars else None
    if resume and ckpt_dir is not None:
        # 1. the checkpoint: the one given, or the newest intact one (damaged ones named)
        folder = resume if isinstance(resume, Path) else resume_point(ckpt_dir, set_aside=env.main)
        saved = checkpoint_step(folder)
        if saved + 1 > config.steps:
            fail(
                "TrainConfig",
                "steps",
                f"at least the {saved + 1} steps this run has trained ({folder.name})",
                config.steps,
            )
        ranks = dict(rank=env.rank, world=env.world)
        start = load_checkpoint(folder, model, optimizer, scheduler, task, **ranks) + 1
        if resumed is not None:
            resumed()
        earlier = saved_timing(folder) or earlier  # none recorded: this process's time alone
        # 2. the log: lines written after that checkpoint are dropped (a torn last line too)
        for path, value in ((metrics_path, "loss"), (scalars_path, None)):
            if env.main and path is not None and path.exists():
                kept = [row for row in read_metrics(path, value) if row["step"] < start]
                atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        # 3. an extension: the earlier run did not evaluate at its last step during training
        #    (that evaluation went to final.json, now replaced); a run trained straight to
        #    these steps evaluates there, so it is done now, on the weights of that step
        extends = start < config.steps and config.eval_every and start % config.eval_every == 0
        if env.main and extends and metrics_path is not None and metrics_path.exists():
            rows = read_metrics(metrics_path, "loss")
            if rows and rows[-1]["step"] == start - 1 and not _evaluated(rows[-1]):
                eval_start = time.perf_counter()
                rows[-1].update(evaluate(task, model))
                seconds = earlier["eval_seconds_during"] + time.perf_counter() - eval_start
                earlier = {**earlier, "eval_seconds_during": seconds}
                atomic_write(metrics_path, "".join(json.dumps(r) + "\n" for r in rows).encode())
        if env.main:
            note(f"--resume: continuing from {folder.parent.name}/{folder.name}, step {start}")
    elif env.main:
        for path in (metrics_path, scalars_path):
            if path is not None and path.exists():
                path.unlink()

    trained = model
    if env.world > 1:
        trained = DistributedDataParallel(
            _sync_batch_norm(model, device, env.main),
            device_ids=[device.index] if device.type == "cuda" else None,
        )
    bar = _progress(progress and env.main, config.steps, start)
    loop_start, eval_during, saving = time.perf_counter(), 0.0, 0.0
    window_losses, window_items, window_start = [], 0, time.perf_counter()
    window_first = start  # the window's first step: named when its loss is not finite
    phase_losses: dict[str, list[torch.Tensor]] = {name: [] for name, *_ in phases or ()}
    for step in range(start, config.steps):
        model.train()
        batch = task.batch(step, config.batch_size, device, env.rank, env.world)
        if phases is None:
            with _autocast(config, device):
                loss_sum, count = task.loss(trained, batch)
            total = torch.tensor(float(count), device=device)
            if env.world > 1:  # normalise by the global count so the gradient equals 1 process's
                dist.all_reduce(total)
            (loss_sum * env.world / total).backward()
            if config.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            rates = {"lr": optimizer.param_groups[0]["lr"]}  # this step's, before the schedule's
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            loss_sum, rates = None, {}
            for name, phase_optimizer, phase_scheduler, params in phases:
                with _autocast(config, device):
                    phase_loss, count = task.loss(trained, batch, phase=name)
                (phase_loss / count).backward()
                if config.clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, config.clip)
                rates[f"lr_{name}"] = phase_optimizer.param_groups[0]["lr"]
                rates.setdefault("lr", rates[f"lr_{name}"])  # the first phase's
                phase_optimizer.step()
                phase_scheduler.step()
                model.zero_grad(set_to_none=True)  # a later phase's loss reaches these too
                detached = phase_loss.detach()  # read at the log step, as the window's
                phase_losses[name].append(detached)
                loss_sum = detached if loss_sum is None else loss_sum + detached
        if scalars_path is not None and env.main:
            values = {k: float(v) for k, v in scalars().items()}  # a sync per step
            _append(scalars_path, json.dumps({"step": step, **values}) + "\n")

        window_losses.append(loss_sum.detach())  # read at the log step: one sync per window
        window_items += count
        last = step == config.steps - 1
        checkpoint = ckpt_dir is not None and ((step + 1) % config.checkpoint_every == 0 or last)
        evaluating = config.eval_every and (step + 1) % config.eval_every == 0 and not last
        # A row at every log step, and also at an evaluation (whose metrics it carries) and a
        # checkpoint (a resumed run's windows then start where an uninterrupted run's do)
        if (step + 1) % config.log_every == 0 or last or checkpoint or evaluating:
            loss_total, item_total = _window_stats(window_losses, window_items, device, env)
            _check_finite(loss_total, window_first, step)
            elapsed = time.perf_counter() - window_start
            items = max(1.0, item_total)
            record = {
                "step": step,
                "loss": loss_total / items,
                **rates,  # the rate(s) this step trained at
                "items_per_s": item_total / max(elapsed, 1e-9),
            }
            if phases is not None:
                for name, *_ in phases:
                    summed = float(torch.stack(phase_losses[name]).double().sum())
                    record[f"loss_{name}"] = summed / items
                    phase_losses[name] = []
            if evaluating:
                eval_start = time.perf_counter()
                record.update(evaluate(task, model))
                eval_during += time.perf_counter() - eval_start
            if env.main and metrics_path is not None:
                _append(metrics_path, json.dumps(record) + "\n")
            bar.update(step + 1, record)
            window_losses, window_items, window_start = [], 0, time.perf_counter()
            window_first = step + 1
        rank_rng = _gathered_rng(device) if checkpoint and env.world > 1 else None  # all ranks
        if env.main and checkpoint:
            save_start = time.perf_counter()
            timing = _timing(
                earlier, save_start - loop_start, eval_during, saving, step + 1 - start
            )
            save_checkpoint(
                ckpt_dir,
                step,
                model,
                optimizer,
                scheduler,
                task=task,
                timing=timing,
                rank_rng=rank_rng,
                world=env.world,
            )
            saving += time.perf_counter() - save_start
        if env.world > 1 and (step + 1) % config.checkpoint_every == 0:
            dist.barrier()
    bar.close()
    eval_start = time.perf_counter()
    final = {**evaluate(task, model), "device": str(device)}
    timing = {
        **_timing(earlier, eval_start - loop_start, eval_during, saving, config.steps - start),
        "eval_seconds": time.perf_counter() - eval_start,
        "checkpoint_seconds": saving,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if env.main and run_dir is not None:
        atomic_write_json(Path(run_dir) / "final.json", final)
        atomic_write_json(Path(run_dir) / "timing.json", timing)
    if env.world > 1:
        dist.barrier()
    return final


class DivergedError(ValueError):
    """A run's numbers are not finite: the training loss became NaN or infinite (the run stops
    there, before it saves a checkpoint, logs a metric or evaluates a model from those steps),
    or the model's output on held-out data holds a NaN (`evaluate`). DESIGN.md: nothing
    silently wrong; a NaN row's argmax would still give a plausible-looking accuracy."""


def _window_stats(
    losses: list[torch.Tensor], items: int, device, env: Distributed
) -> tuple[float, float]:
    """(summed loss, items) of the steps since the last log step, over every process: one
    sync, and one all-reduce under DDP, so every process decides alike."""
    total = float(torch.stack(losses).double().sum()) if losses else 0.0
    stats = torch.tensor([total, float(items)], device=device)
    if env.world > 1:
        dist.all_reduce(stats)
    loss_total, item_total = stats.tolist()  # one read of both
    return loss_total, item_total


def _check_finite(loss: float, first: int, step: int) -> None:
    if not math.isfinite(loss):
        fail(
            "train",
            "loss",
            "a finite training loss (try a lower train.lr or train.clip; the checkpoints "
            "saved before these steps are kept)",
            f"{loss} summed over steps {first} to {step}",
            DivergedError,
        )


def check_world(config: TrainConfig, model: torch.nn.Module, world: int) -> None:
    """What a run of `world` processes (torchrun) needs, checked before any work: a batch
    that gives every process a share (an empty one failed inside the task after the run
    directory was written), and one optimiser (DDP wraps one backward per step; a GAN's phases
    would need their own)."""
    if world > 1 and config.batch_size < world:
        wanted = f"at least the {world} processes torchrun started (each takes a share)"
        fail("TrainConfig", "batch_size", wanted, config.batch_size)
    if world > 1 and getattr(model, "optimizer_groups", None) is not None:
        fail("train", "world", "1 process for a model with several optimisers", world)


def _sync_batch_norm(model: torch.nn.Module, device: torch.device, main: bool):
    """A model's BatchNorm layers under several processes: SyncBatchNorm on CUDA (statistics
    of the global batch, as one process computes them); on the CPU, where SyncBatchNorm does
    not run, each process normalises by its own share, said once."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    if device.type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if main:
        note(
            "batch normalisation under torchrun on the CPU uses each process's share of the "
            "batch (SyncBatchNorm needs CUDA): several processes do not train as one would"
        )
    return model


def _phases(model: torch.nn.Module, config: TrainConfig, env: Distributed):
    """[(name, AdamW, its schedule, its parameters)] of a model's `optimizer_groups` (module
    docstring), or None for a model with one optimiser."""
    declared = getattr(model, "optimizer_groups", None)
    if declared is None:
        return None
    if hasattr(model, "lr_scales"):  # each group has its own lr: a scale would be ignored
        fail(type(model).__name__, "lr_scales", "absent with optimizer_groups", "both defined")
    phases = []
    for name, params, lr, betas in declared():
        params = list(params)
        opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=config.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(config, s))
        phases.append((name, opt, sched, params))
    return phases


def slow_bf16_convolutions(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether bf16 autocast sends `model`'s convolutions to PyTorch's slow reference kernels:
    a CPU whose oneDNN reports no bfloat16 support (this project's 2-core machine: a 64 -> 64
    3 x 3 convolution of 200 images of 28 x 28, one thread, channels-last: 126 ms in float32,
    1390 ms under bf16 autocast; matrix products are unaffected)."""
    if device.type != "cpu" or not any(
        isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()
    ):
        return False
    return not _onednn_has_bf16()


def _onednn_has_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _autocast(config: TrainConfig, device: torch.device):
    """bf16 autocast of the forward pass and the loss only, on any device: the tasks' losses
    take their logits to float32, and backward, clipping and AdamW run on the float32
    weights."""
    if config.autocast != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _gathered_rng(device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Every process's RNG states (CPU, and its GPU's), gathered by rank: rank 0 saves them all,
    and each resumed process takes its own back (`load_checkpoint`), so its dropout draws go on
    as they would have; rank 0's alone gave every resumed process rank 0's stream."""
    own = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        own["cuda"] = torch.cuda.get_rng_state(device)
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    gathered: list[dict[str, torch.Tensor]] = [{} for _ in range(dist.get_world_size())]
    for name, state in own.items():
        parts = [torch.empty_like(state, device=on) for _ in gathered]
        dist.all_gather(parts, state.to(on))
        for entry, part in zip(gathered, parts, strict=True):
            entry[name] = part.cpu()
    return gathered


def evaluate(task: Task, model: torch.nn.Module) -> dict[str, float]:
    """`task.evaluate(model)` in eval mode without gradients, refusing a NaN in any output of
    the model's forward (`_refuse_nan`): a NaN row's argmax or threshold still gives a
    plausible prediction, so the metrics would look like a model's. Every process evaluates
    the same data, so no process waits on another."""
    model.eval()
    hook = model.register_forward_hook(_refuse_nan)  # removed below: no state left behind
    try:
        with torch.no_grad():
            return task.evaluate(model)
    finally:
        hook.remove()


def _refuse_nan(module: torch.nn.Module, _inputs, output) -> None:
    """A forward hook: the floating tensors of `output` (a tensor, or a dataclass, tuple,
    list or dict of them) hold no NaN (-inf stays: a masked log-probability)."""
    for name, tensor in _tensors(output, "output"):
        if tensor.is_floating_point() and bool(torch.isnan(tensor).any()):
            got = f"NaN in {type(module).__name__}'s {name}"
            fail("evaluate", "model", "finite outputs on the held-out data", got, DivergedError)


def _tensors(value, name: str):
    """(name, tensor) of every tensor in `value`, searched through containers."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name), f"{name}.{f.name}")
    elif isinstance(value, tuple | list):
        fields = getattr(value, "_fields", None)  # a NamedTuple's names
        for k, item in enumerate(value):
            yield from _tensors(item, f"{name}.{fields[k]}" if fields else f"{name}[{k}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{name}[{key!r}]")


class _progress:
    """A rich progress bar on the main process, nothing elsewhere."""

    def __init__(self, enabled: bool, total: int, start: int):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("train"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("train", total=total, completed=start, info="")

    def update(self, completed: int, record: dict) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=f"loss {record['loss']:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _append(path: Path, line: str) -> None:
    """Append a log line; a failed write (a full disk) is an OSError naming the file. A line
    cut short by it is skipped by `files.read_metrics` and dropped on resume."""
    try:
        with path.open("a") as f:
            f.write(line)
    except OSError as err:
        if err.errno is None:
            raise
        raise type(err)(err.errno, f"{err.strerror} (writing {path})") from err
