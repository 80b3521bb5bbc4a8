"""Shared helpers for the benchmark scripts in this folder.

The rules they implement come from `/work/shared/PERF.md`:
- time ratios in one process, implementations interleaved round by round after identical
  warm-up, and report medians (`time_interleaved`);
- measure peak memory in a fresh process per configuration, from `/proc/self/status` (VmHWM),
  as the rise over a baseline taken after imports and input allocation (`PeakMemory`,
  `run_worker`); `ru_maxrss` of a child would start at its parent's peak;
- record a configuration that does not fit in memory as `"status": "oom"` instead of crashing
  (`run_worker` maps a worker killed by a signal or reporting an allocation failure to it).

This module imports only the standard library, so a worker pays for nothing it does not use.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

THREAD_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")

MIB = 1 << 20
GIB = 1 << 30

STATUS_OK = "ok"
STATUS_OOM = "oom"
STATUS_ERROR = "error"

# How a worker announces its result: the last stdout line starting with this prefix.
RESULT_PREFIX = "@@RESULT "

# Messages of the allocation failures torch and Python raise (torch's CPU allocator raises a
# RuntimeError, not MemoryError).
_OOM_MESSAGES = ("can't allocate memory", "out of memory", "cannot allocate memory")


# 1. Timing ------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], *, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of every function, measured round by round.

    Each function is warmed up `warmup` times (all of them, before any timing), then every
    round calls each function once; the order rotates between rounds so no function always
    runs right after the same neighbour. Returns the per-call times, `repeats` per function.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


# 2. Peak memory -------------------------------------------------------------------------------


def read_status_kib(field: str) -> int:
    """A `/proc/self/status` field in KiB, e.g. "VmHWM" (peak resident set), "VmSize"."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current resident set (Linux >= 4.0); False if not permitted.

    Without the reset, memory freed during imports keeps VmHWM above the resident set and a
    small configuration would register no rise at all.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """Peak resident memory added by the code run after construction, in bytes.

    Build it after imports and input allocation; `peak_bytes()` is then VmHWM minus the
    baseline VmHWM (reset to the resident set first where the kernel allows).
    """

    def __init__(self) -> None:
        gc.collect()
        self.reset = reset_peak_rss()
        self.baseline_kib = read_status_kib("VmHWM")

    def peak_bytes(self) -> int:
        return max(0, read_status_kib("VmHWM") - self.baseline_kib) * 1024


def limit_address_space(extra_bytes: int) -> None:
    """Cap this process's address space at its current size plus `extra_bytes`.

    A configuration that would need more then fails with an allocation error inside the
    worker (reported as "oom") instead of waking the kernel's OOM killer on a shared machine.
    Start thread pools before calling this: thread stacks and malloc arenas count too.
    """
    limit = read_status_kib("VmSize") * 1024 + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def is_oom_error(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        message in str(error).lower() for message in _OOM_MESSAGES
    )


def emit_result(result: Mapping[str, Any]) -> None:
    """Print a worker's result as the one line `run_worker` reads."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_worker(command: Sequence[str], *, timeout: float | None = None) -> dict[str, Any]:
    """Run a worker process and return the JSON result it emitted, with a "status".

    A worker killed by a signal (the OOM killer sends SIGKILL) or reporting an allocation
    failure gives status "oom"; any other failure gives "error" with the end of its stderr.
    """
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": STATUS_ERROR, "error": f"timed out after {timeout} s"}
    result = None
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
    if result is not None and done.returncode == 0:
        result.setdefault("status", STATUS_OK)
        return result
    tail = done.stderr.strip().splitlines()[-3:]
    if done.returncode < 0:
        return {"status": STATUS_OOM, "error": f"killed by signal {-done.returncode}"}
    if any(message in done.stderr.lower() for message in _OOM_MESSAGES):
        return {"status": STATUS_OOM, "error": " | ".join(tail)}
    return {"status": STATUS_ERROR, "error": " | ".join(tail) or f"exit {done.returncode}"}


def run_spec(script: str | Path, spec: dict) -> dict:
    """`script --worker SPEC` in a fresh process (the worker ends with `emit_result`); the row,
    or on failure the spec beside the status and error."""
    return {**spec, **run_worker([sys.executable, str(script), "--worker", json.dumps(spec)])}


# 3. Results -----------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(**extra: Any) -> dict[str, Any]:
    """Versions and hardware facts to store next to every result (torch imported lazily)."""
    import torch

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        # Thread-pool settings change timings on a shared machine (e.g. OMP_WAIT_POLICY).
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(THREAD_ENV_PREFIXES)},
    }
    info.update(extra)
    return info


def write_json(path: str | os.PathLike, payload: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def format_number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout: rich's when installed, aligned plain text otherwise."""
    cells = [[format_number(value) for value in row] for row in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in column) for column in zip(columns, *cells, strict=True)]
        print(f"\n{title}")
        print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for row in cells:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in cells:
        table.add_row(*row)
    Console(file=sys.stdout, width=160).print(table)
