"""Which device a run uses: `train.device` = auto | cpu | cuda | cuda:N | mps.

`check_device` validates the spelling when the config is made (before any work);
`resolve_device` picks the device when the run starts, where the machine and torchrun's
environment are known: under torchrun on CUDA, every process takes the GPU of its local rank
(one process per GPU).
"""

from __future__ import annotations

import os
import re

import torch

from attnzoo.core.checks import fail

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
_SPELLING = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


TRAIN_DEVICE = ("TrainConfig", "device")  # what an error names: the config's field, by default


def check_device(spec: str, named: tuple[str, str] = TRAIN_DEVICE) -> None:
    """Fail unless `spec` is one of `DEVICES` (N a GPU index); `named`: (who, argument)."""
    if not isinstance(spec, str) or not _SPELLING.fullmatch(spec):
        fail(*named, f"one of {list(DEVICES)}", repr(spec))


def launched_world() -> int:
    """The number of processes torchrun started (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_device(spec: str, named: tuple[str, str] = TRAIN_DEVICE) -> torch.device:
    """The device of this process.

    1. "auto": CUDA when this machine has it, else the CPU.
    2. Under torchrun (WORLD_SIZE > 1) on CUDA: cuda:$LOCAL_RANK; naming one GPU (cuda:N)
       there is an error, since every process would take the same one.
    3. A device this machine lacks is an error naming `train.device` (or `named`: (who,
       argument), e.g. the --device of `attnzoo eval`).
    """
    check_device(spec, named)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if not torch.backends.mps.is_available():
            fail(*named, "a device this machine has", "'mps' (unavailable)")
        return torch.device("mps")
    if not torch.cuda.is_available():
        fail(*named, "a device this machine has (try cpu)", f"{spec!r} (no CUDA)")
    if launched_world() > 1:
        if spec != "cuda":
            fail(*named, "cuda or auto under torchrun (one GPU per process)", spec)
        index = int(os.environ.get("LOCAL_RANK", "0"))
    else:
        index = int(spec.partition(":")[2] or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        have = torch.cuda.device_count()
        fail(*named, f"a GPU index below {have}", f"cuda:{index}")
    return torch.device("cuda", index)
