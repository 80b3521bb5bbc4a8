"""The one benchmark driver: experiments -> worker processes -> merge with earlier rows -> JSON
-> tables.

A script declares a `Bench` (its experiments per budget, the worker that runs one experiment
for one seed in a fresh process, its targets and tables) and ends with `drive(BENCH)`. The
rules of `/work/shared/PERF.md`: ratios in one process, implementations interleaved round by
round after identical warm-up, medians (`time_interleaved`, `time_steps`); peak memory in a
fresh process per configuration as the rise of VmHWM over a baseline taken after imports and
inputs (`peak_memory`); a configuration that does not fit is a row with status "oom".

This module imports only the standard library at its top, so a worker pays for nothing else.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import hashlib
import json
import math
import operator
import os
import platform
import re
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
STATUS_OK, STATUS_OOM, STATUS_ERROR = "ok", "oom", "error"
BUDGETS = ("smoke", "full")
ROOT = Path(__file__).resolve().parent.parent
OPS = {"<=": float.__le__, ">=": float.__ge__, "<": float.__lt__, ">": float.__gt__}
# what torch's CPU allocator (a RuntimeError) and Python say when an allocation fails
_OOM_MESSAGES = ("can't allocate memory", "out of memory", "cannot allocate memory")


# 1. Declarations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    """One row of a benchmark: `params` (JSON) go to the worker once per seed.

    `seeds`: how many seeds (0, 1, ...) it runs; a trained comparison takes >= 3 (5 where one
    run takes <= 5 min); `--seeds` overrides it for experiments with more than one.
    `minutes`: CPU-minutes one seed takes at this budget (`attnzoo repro --list`).
    `unit`: experiments sharing a unit (the sides of a matched comparison) are prepared
    together by `Bench.prepare` and re-run together: a re-run of one side re-runs every side.
    `needs`: ids of experiments whose finished run this one builds on (a classifier, a
    pre-trained model): the run of the same seed where that experiment has more than one seed,
    else its seed 0. The driver runs a needed run first when its folder has none (or when it
    runs again anyway), starts this one once it has finished, and gives the worker its folder
    (`sibling_run`).
    """

    id: str
    group: str
    params: Mapping[str, Any]
    seeds: int = 1
    minutes: float = 0.0
    unit: str = ""
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """A claim checked on the mean over seeds of `summary[id][key]`: `mean <op> threshold`."""

    name: str
    id: str
    key: str
    op: str
    threshold: float
    source: str = ""  # where the target comes from (an issue, a paper's table)

    def evaluate(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        stat = summary.get(self.id, {}).get("metrics", {}).get(self.key)
        row = {**asdict(self), "mean": None, "std": None, "n": 0, "met": False}
        if stat is None:
            return {**row, "verdict": "not measured"}
        op, threshold = OPS[self.op], float(self.threshold)
        met = op(float(stat["mean"]), threshold)
        every = all(op(float(v), threshold) for v in stat["values"])
        verdict = "not met" if not met else "met" if every else "met on the mean, not by every seed"
        stats = {k: stat[k] for k in ("mean", "std", "n", "min", "max")}
        return {**row, **stats, "met": met, "every_seed_met": every, "verdict": verdict}


def targets(source: str, *rows: tuple) -> list[Target]:
    """Targets from (name, id, key, op, threshold) rows sharing one source."""
    return [Target(*row, source=source) for row in rows]


@dataclass(frozen=True)
class Column:
    """A table column: `key` is a metric (dotted for nested ones; a string metric is shown as
    it is), `params.NAME` or `id`."""

    header: str
    key: str
    digits: int = 2
    # "range" or "iqr": `key` names a `spread` metric; the cell is "median (low-high)"
    spread: str = ""
    sci: bool = False  # scientific notation (a difference near 0)


def columns(spec: str, digits: int = 2, spread: str = "", sci: bool = False) -> list[Column]:
    """Columns from "header=key; header=key", every one with the same other fields."""
    pairs = [item.rsplit("=", 1) for item in spec.split(";")]
    return [Column(header.strip(), key.strip(), digits, spread, sci) for header, key in pairs]


@dataclass(frozen=True)
class Table:
    """Rows: the experiments of `groups` (in declaration order), or of `ids` when given."""

    name: str
    columns: Sequence[Column | tuple]  # a tuple: Column's fields in order
    groups: Sequence[str] = ()
    ids: Sequence[str] = ()
    # a metric holding one dict per item (e.g. per implementation): then a row per item, the
    # column key "each" is the item's name and "each.KEY" reads metric EACH.ITEM.KEY
    each: str = ""


@dataclass
class Context:
    """What a worker gets beside its params."""

    id: str
    seed: int
    budget: str
    run_dir: Path  # runs/bench/<bench>/<id>/seed<k> (or the --runs folder's)
    extra: dict = field(default_factory=dict)  # `Bench.prepare`'s values for this experiment
    needs: dict = field(default_factory=dict)  # {needed experiment id: its run folder}
    # the row it replaces was made on other task data (`DATA_CHANGED`): the run in `run_dir`
    # was trained on that data too, so `train_worker` trains it again instead of adopting it
    retrain: bool = False


@dataclass
class Bench:
    name: str  # results/<name>.json
    script: str  # the script's __file__
    experiments: Callable[[str], list[Experiment]]  # budget -> experiments
    worker: Callable[[Mapping[str, Any], Context], dict[str, Any]]
    targets: Sequence[Target] = ()
    tables: Sequence[Table] = ()
    # unit's experiments (with budget) -> {id: extra}; run in a fresh process before the unit
    prepare: Callable[[list[Experiment], str], dict[str, dict]] | None = None
    # summary -> {derived id: {key: value, or values paired by seed}}: metrics across experiments
    derive: Callable[[dict[str, Any]], dict[str, dict[str, float]]] | None = None
    # (results JSON, folder) -> the docs figures it drew there from the JSON (and run dirs
    # where they exist; a figure whose run dirs are absent is left as it is)
    figures: Callable[[dict, Path, Path], list[Path]] | None = None  # (data, folder, runs)
    threads: int = 1  # torch threads per worker
    jobs: int | Mapping[str, int] = 2  # workers at once (or per budget)
    # how the metrics are measured (written into the JSON as "method")
    method: Mapping[str, Any] = field(default_factory=dict)
    # spec -> a closure running one call: what a `peak_memory` child process measures
    step: Callable[[Mapping[str, Any]], Callable[[], Any]] | None = None


# 2. Summaries and tables ----------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested dicts, keys joined with "." (bools and None left out)."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = float(value)
    return flat


def summarise(values: Sequence[float]) -> dict[str, Any]:
    # (statistics.stdev fails on a NaN or inf: its spread is then NaN, as its mean is)
    finite = all(math.isfinite(v) for v in values)
    std = (statistics.stdev(values) if finite else math.nan) if len(values) > 1 else None
    stats = {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values)}
    return {**stats, "n": len(values), "values": list(values)}


def summary_of(rows: Sequence[Mapping[str, Any]], experiments: Sequence[Experiment]) -> dict:
    """Per experiment: its ok seeds and every numeric metric's mean/std/min/max over them."""
    summary = {}
    for e in experiments:
        ok = [r for r in rows if r["id"] == e.id and r.get("status") == STATUS_OK]
        flats = [flatten(r["metrics"]) for r in ok]
        # string metrics (a scorer's signature) kept where every seed agrees
        texts = [{k: v for k, v in r["metrics"].items() if isinstance(v, str)} for r in ok]
        same = {k: v for k, v in (texts or [{}])[0].items() if all(t.get(k) == v for t in texts)}
        summary[e.id] = {
            "group": e.group,
            "params": dict(e.params),
            "seeds": [r["seed"] for r in ok],
            "failed": [r["seed"] for r in rows if r["id"] == e.id and r not in ok],
            "metrics": {
                k: summarise([f[k] for f in flats if k in f]) for k in sorted(set().union(*flats))
            },
            "text": same,
        }
    return summary


def by_seed(summary: Mapping[str, Any], experiment_id: str, key: str) -> dict[int, float]:
    """{seed: value} of one metric of one experiment (empty when a seed lacks it)."""
    entry = summary.get(experiment_id, {})
    stat = entry.get("metrics", {}).get(key)
    if stat is None or len(stat["values"]) != len(entry["seeds"]):
        return {}
    return dict(zip(entry["seeds"], stat["values"], strict=True))


class Paired(list):
    """Values paired by seed (`paired`) that know the experiments they come from: a derived
    entry records them (`derived_entry`), so that a verdict over them is marked when one of
    those experiments has stale rows (`report.Page.target`)."""

    def __init__(self, values, sources: Sequence[str]):
        super().__init__(values)
        self.sources = tuple(sources)


def paired(summary: Mapping[str, Any], key: str, a: str, b: str, op: Callable = operator.sub):
    """`op(a's value, b's value)` of metric `key` of experiments a and b, per seed both
    measured (in seed order): e.g. a difference paired by seed."""
    x, y = by_seed(summary, a, key), by_seed(summary, b, key)
    return Paired([op(x[s], y[s]) for s in sorted(x.keys() & y.keys())], (a, b))


def extreme(
    summary: Mapping[str, Any], ids: Sequence[str], key: str, pick: Callable = max
) -> float | None:
    """The largest (`pick`) mean of `key` among experiments `ids`; None if one lacks it."""
    values = [summary.get(i, {}).get("metrics", {}).get(key) for i in ids]
    return pick(v["mean"] for v in values) if values and None not in values else None


def derived_entry(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A summary entry of `Bench.derive`'s metrics: each a number, or a list of values paired by
    seed (`by_seed`), summarised over them (n = the pairs); `sources`: per metric made by
    `paired`, the experiments it was paired from."""
    flat = {**flatten(metrics), **{k: v for k, v in metrics.items() if isinstance(v, list)}}
    stats = {k: summarise(v if isinstance(v, list) else [v]) for k, v in flat.items() if v != []}
    n = max((stat["n"] for stat in stats.values()), default=1)
    entry = {"group": "derived", "params": {}, "seeds": list(range(n)), "failed": [], "text": {}}
    sources = {k: list(v.sources) for k, v in metrics.items() if isinstance(v, Paired)}
    return {**entry, "metrics": stats, **({"sources": sources} if sources else {})}


def format_stat(stat: Mapping[str, Any] | None, digits: int = 2, seeds: int | None = None) -> str:
    """ "mean ± std" over seeds (the mean alone for one seed, or where every seed agrees); "-"
    when not measured. With the experiment's `seeds`, its own n where fewer have it."""
    if stat is None:
        return "-"
    note = f" (n={stat['n']})" if seeds is not None and stat["n"] < seeds else ""
    mean = f"{stat['mean']:.{digits}f}"
    if stat.get("std") is None or stat.get("min") == stat.get("max"):
        return mean + note
    return f"{mean} ± {stat['std']:.{digits}f}{note}"


def readable(x: float) -> str:
    """A number at the precision a sentence wants: whole above 100, two decimals above 1, three
    significant digits below."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def _param(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def cell(entry: Mapping[str, Any], column: Column, experiment_id: str, item: str = "") -> str:
    metrics, key = entry["metrics"], column.key
    if key in ("id", "each"):
        return item or experiment_id
    if key.startswith("params."):
        return _param(entry["params"].get(key.split(".", 1)[1]))
    if key in entry.get("text", {}):  # a string metric every seed agrees on
        return entry["text"][key]
    if column.spread:
        low, high = ("min", "max") if column.spread == "range" else ("q1", "q3")
        stats = [metrics.get(f"{key}.{k}") for k in ("median", low, high)]
        if None in stats:  # the median alone where the spread was not recorded
            return format_stat(stats[0], column.digits)
        mid, lo, hi = (f"{s['mean']:.{column.digits}f}" for s in stats)
        return f"{mid} ({lo}-{hi})"
    if column.sci and key in metrics:
        return f"{metrics[key]['mean']:.{column.digits}e}"
    return format_stat(metrics.get(key), column.digits, len(entry["seeds"]))


STALE_MARK = "†"


def render_table(
    table: Table, data: Mapping[str, Any], stale: Mapping[str, Mapping[int, str]] | None = None
) -> str:
    """A markdown table of the summary in `data` (a results JSON), with each row's n (seeds).
    An experiment with `stale` rows (`stale_rows`) has its n marked, and a note under the
    table names them and why."""
    stale = stale or {}
    summary = data["summary"]
    ids = [i for i in table.ids if i in summary]  # a budget may leave experiments out
    ids = ids or [i for i, e in summary.items() if e["group"] in table.groups]
    given = [c if isinstance(c, Column) else Column(*c) for c in table.columns]
    header = [c.header for c in given] + ["n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i in ids:
        items = {"": STATUS_OK}
        if table.each:  # the items of the first ok row, in the worker's order, with their status
            rows = [
                r for r in data.get("rows", []) if r["id"] == i and r.get("status") == STATUS_OK
            ]
            found = rows[0]["metrics"].get(table.each, {}) if rows else {}
            items = {name: str(value.get("status", STATUS_OK)) for name, value in found.items()}
        for item, status in items.items():
            each = [
                replace(c, key=c.key.replace("each.", f"{table.each}.{item}.", 1)) for c in given
            ]
            cells = [cell(summary[i], c, i, item) for c in each]
            if status != STATUS_OK:  # e.g. "OOM" in its metric columns
                keep = [c.key == "each" or c.key.startswith(("id", "params.")) for c in each]
                cells = [x if k else status.upper() for x, k in zip(cells, keep, strict=True)]
            n = f"{len(summary[i]['seeds'])}{STALE_MARK * bool(stale.get(i))}"
            if summary[i].get("failed"):  # seeds whose rows failed: not in any cell
                n += f" ({len(summary[i]['failed'])} failed)"
            lines.append("| " + " | ".join([*cells, n]) + " |")
    note = stale_note(stale, ids)
    return "\n".join([*lines, "", note] if note else lines)


def stale_note(stale: Mapping[str, Mapping[int, str]], ids: Sequence[str]) -> str:
    """The note under a table of the experiments `ids` naming those with `stale` rows
    (`stale_rows`) and why; "" when none is."""
    marked = {i: sorted(set(stale[i].values())) for i in ids if stale.get(i)}
    if not marked:
        return ""
    return (
        f"{STALE_MARK} Rows made under other params than the bench now declares for their "
        "experiment, on a run trained again since, or on data their task no longer makes, "
        "shown as they ran (the driver would re-run them): "
        + "; ".join(f"{i} ({', '.join(why)})" for i, why in marked.items())
        + "."
    )


# 3. The driver --------------------------------------------------------------------------------
#
# It runs the (experiment, seed) pairs that have no current row (a row is current when its
# params and budget are the experiment's), merges them with the earlier rows of the JSON,
# summarises every numeric metric over seeds (mean, std, n), evaluates each target once on the
# mean and writes one JSON with no absolute paths in it.


def relative_paths(value: Any, base: Path = ROOT) -> Any:
    """`value` with every path under `base` made relative to it; any other absolute path is an
    error (results JSON is shared: no machine's paths in it)."""
    if isinstance(value, Mapping):
        return {k: relative_paths(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_paths(v, base) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        if not Path(value).is_relative_to(base):
            raise ValueError(f"absolute path {value!r} in a result: write it relative to {base}")
        return str(Path(value).relative_to(base))
    return value


def _write_json(path: Path, payload: Mapping[str, Any], base: Path) -> None:
    """Atomically: a temporary file beside `path`, fsynced, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as f:
        f.write(json.dumps(relative_paths(payload, base), indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _cpuinfo(field: str) -> str | None:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = re.search(rf"^{field}\s*:(.*)$", text, re.MULTILINE)
    return found[1].strip() if found else None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux; empty elsewhere), e.g. "amx_bf16", "avx512_bf16"."""
    return set((_cpuinfo("flags") or "").split())


def machine_info(**extra: Any) -> dict[str, Any]:
    """Versions and hardware facts to store next to every result. torch's version comes from
    its installed metadata: the driver imports torch only to check the defaults' stamps of
    rows already there (`_defaults_stand`); its children import it (forked from a server that
    has), and a second import in the driver cost each bench call ~2 s."""
    from importlib.metadata import version

    # thread-pool settings change timings on a shared machine (e.g. OMP_WAIT_POLICY)
    prefixes = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": version("torch"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)},
        **extra,
    }


def _seeds(e: Experiment, override: int | None) -> int:
    return override if override and e.seeds > 1 else e.seeds


def _current(row: Mapping[str, Any], e: Experiment, budget: str, rows: Sequence = ()) -> bool:
    return _stale(row, e, budget, rows) is None


NEEDS_CHANGED = "a run it builds on was trained again since"
DATA_CHANGED = "trained on data its task no longer makes"


def _data_changed(row: Mapping[str, Any]) -> bool:
    """Whether a row's task data version (its `data`, 0 before rows recorded one) is not the
    task's now (`TaskSpec.data`, bumped when a change of the task's code changed its data
    without changing a config value). The task: its params' `task`, else its stamp's."""
    metrics = row.get("metrics", {})
    stamp = metrics.get("defaults")
    task = row.get("params", {}).get("task") or (
        stamp.split("|")[1] if isinstance(stamp, str) else None
    )
    if not isinstance(task, str):
        return False
    from attnzoo.tasks.registry import TASKS

    return task in TASKS and metrics.get("data", 0) != TASKS[task].data


def _run_digest(run_dir: str | Path) -> str | None:
    """A digest of the run folder's final.json (None without one): which run a row measured,
    so that a row built on it (`Experiment.needs`) can tell when that run was trained again."""
    final = Path(run_dir) / "final.json"
    return hashlib.sha256(final.read_bytes()).hexdigest()[:16] if final.exists() else None


def _stale(
    row: Mapping[str, Any], e: Experiment, budget: str, rows: Sequence = (), defaults: bool = True
) -> str | None:
    """Why `row` no longer stands for experiment `e` at `budget` (None: it is current); with
    the JSON's `rows`, also when a row it was built on is now of another run; with `defaults`,
    also when the library's defaults changed since the row's stamp (which imports the library,
    and so torch)."""
    if row.get("status") != STATUS_OK:
        return f"status {row.get('status')}"
    if row.get("budget") != budget:
        return f"budget {row.get('budget')}"
    if row.get("params") != json.loads(json.dumps(dict(e.params))):
        return "its params changed"
    if _data_changed(row):
        return DATA_CHANGED
    if defaults and not _defaults_stand(row):
        return f"the defaults changed since its stamp {row['metrics']['defaults']}"
    for id, need in row.get("needs", {}).items():
        now = [r.get("run") for r in rows if (r["id"], r["seed"]) == (id, need["seed"])]
        if now and now[0] and now[0] != need["run"]:  # (rows from before the digest: unknown)
            return NEEDS_CHANGED
    return None


def stale_rows(data: Mapping[str, Any], experiments: Sequence[Experiment]):
    """{id: {seed: why}} of the ok rows of `data` (a results JSON) whose params are no longer
    those the bench declares for their experiment, that were built on a run trained again
    since, or that were trained on data their task no longer makes (`_stale`'s certain
    kinds). A changed stamp
    of the defaults is not counted here: adding a config field changes the stamp whether or
    not its default keeps the earlier behaviour, and every such stamp in the JSON on
    2026-11-25 was of fields added with defaults that do (`train.init_from`, `task.zoom`, the
    bandit's `detach_value`, `discount` and `gae_lambda`, Show-Attend-Tell's
    `expectation_warmup`), so it is not read here (nor the library imported); the driver
    still re-runs them."""
    declared = {e.id: e for e in experiments}
    found: dict[str, dict[int, str]] = {}
    for r in data.get("rows", []):
        e = declared.get(r["id"])
        why = (
            _stale(r, e, data["budget"], data["rows"], defaults=False)
            if e and r.get("status") == STATUS_OK
            else None
        )
        if why in ("its params changed", NEEDS_CHANGED, DATA_CHANGED):
            found.setdefault(r["id"], {})[r["seed"]] = why
    return found


@functools.cache
def defaults_stamp(model: str, task: str) -> str:
    """The stamp "MODEL|TASK|digest" of the library's default config for the pair (`attnzoo
    train`'s before any --set): a trained row records it, so a changed default (a model's or a
    task's) makes the row stale, where its params alone would still look current."""
    from attnzoo import runs

    text = json.dumps(runs.default_config(model, task), sort_keys=True, default=str)
    return f"{model}|{task}|{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _defaults_stand(row: Mapping[str, Any]) -> bool:
    stamp = row.get("metrics", {}).get("defaults")
    if not isinstance(stamp, str):  # not trained by train_worker, or from before the stamp
        return True
    model, task, _ = stamp.split("|")
    return defaults_stamp(model, task) == stamp


def _says_oom(text: str) -> bool:
    return any(message in text.lower() for message in _OOM_MESSAGES)


def is_oom_error(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and _says_oom(str(error))
    )


# What a child's fork server imports once instead of every child (a child still starts as a
# fresh process): torch, its compiler front end (which every optimizer's constructor imports),
# matplotlib and attnzoo's run system, seconds per child that the smoke runs of `make test` (a
# hundred-odd children) paid one by one.
_PRELOAD = ("torch", "torch._dynamo", "matplotlib.pyplot", "attnzoo.runs")
_STARTING = threading.Lock()


def _process_context(threads: int):
    """Children fork from a server that imported `_PRELOAD` (`spawn` where no fork server is)."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    with _STARTING:
        _start_fork_server(threads)
    return multiprocessing.get_context("forkserver")


@functools.cache
def _start_fork_server(threads: int) -> None:
    """The fork server, started with the bench's thread count in its environment: what reads
    it at import (OpenMP, MKL, OpenBLAS) is sized as in a child started afresh."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(list(_PRELOAD))
    saved = dict(os.environ)
    _set_threads(threads)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _set_threads(threads: int) -> None:
    """This process's environment, as its children see it: the bench's thread count."""
    for key in [k for k in os.environ if k.endswith("_NUM_THREADS")]:
        del os.environ[key]
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def _run_child(bench: Bench, kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Run `kind` ("worker", "prepare" or "peak") in a fresh process with the bench's thread
    count (other settings, e.g. OMP_WAIT_POLICY=PASSIVE, pass through); a child killed by a
    signal or reporting an allocation failure is "oom". Its output goes to a log whose last
    lines are the error of a child that failed."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="attnzoo-child-") as folder:
        log, out = Path(folder, "log"), Path(folder, "result.json")
        args = (bench.script, bench.threads, kind, json.dumps(payload, default=str), log, out)
        try:
            child = _process_context(bench.threads).Process(target=_child, args=args)
            child.start()
            child.join()
        except OSError as error:
            return {"status": STATUS_ERROR, "error": str(error)}
        if child.exitcode == 0 and out.exists():
            return {"status": STATUS_OK, **json.loads(out.read_text())}
        text = log.read_text(errors="replace") if log.exists() else ""
    tail = " | ".join(text.strip().splitlines()[-3:])
    oom = child.exitcode < 0 or _says_oom(text)
    return {
        "status": STATUS_OOM if oom else STATUS_ERROR,
        "error": tail or f"exit {child.exitcode}",
    }


def _child(script: str, threads: int, kind: str, payload: str, log: Path, out: Path) -> None:
    """The child side of `_run_child`: its output to `log`, the bench's thread count (also for
    the processes it starts), one call of `_in_child`, its result to `out`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):
        os.dup2(fd, stream)
    os.close(fd)
    _set_threads(threads)
    result = _in_child(_bench_of(script), kind, json.loads(payload))
    out.write_text(json.dumps(result))


def _bench_of(script: str) -> Bench:
    """The `BENCH` of `script`: its main module's (multiprocessing runs the parent's main
    script in a child), else the script loaded by path, its folder first on the path as when
    it runs (its `import _common` failed in a child of a process that had not put it there)."""
    import importlib.util

    main = sys.modules.get("__main__")
    if Path(getattr(main, "__file__", "") or "").resolve() == Path(script).resolve():
        return main.BENCH
    folder = str(Path(script).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(Path(script).stem, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BENCH


def _in_child(bench: Bench, kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """One worker call, one unit's `prepare` or one peak, in a child."""
    import torch

    torch.set_num_threads(bench.threads)
    if kind == "peak":
        return _peak_child(bench, payload)
    if kind == "worker":
        ctx = Context(**{**payload["ctx"], "run_dir": Path(payload["ctx"]["run_dir"])})
        return {"metrics": bench.worker(payload["params"], ctx)}
    unit = [e for e in bench.experiments(payload["budget"]) if e.id in payload["ids"]]
    return {"extra": bench.prepare(unit, payload["budget"])}


def _needed(
    experiments: Sequence[Experiment], e: Experiment, seed: int, override: int | None
) -> list[tuple[Experiment, int]]:
    """The (experiment, seed) runs that `e`'s run of `seed` builds on (`Experiment.needs`)."""
    by_id = {x.id: x for x in experiments}
    return [(by_id[n], seed if _seeds(by_id[n], override) > 1 else 0) for n in e.needs]


def _with_needs(bench, experiments, todo, override, runs: Path) -> list[tuple[Experiment, int]]:
    """todo with each needed run that has no finished run in its folder added, every needed
    run before the runs that need it (the pool takes them in this order)."""
    ordered: list[tuple[Experiment, int]] = []

    def add(item: tuple[Experiment, int]) -> None:
        for need in _needed(experiments, *item, override):
            n, s = need
            if need not in todo and need not in ordered:
                if (run_folder(runs, bench.name, n.id, s) / "final.json").exists():
                    continue
                print(f"[{bench.name}] {n.id} seed {s} runs first: {item[0].id} needs its run")
            add(need)
        if item not in ordered:
            ordered.append(item)

    for item in todo:
        add(item)
    return ordered


def listing(
    bench: Bench, budget: str, seeds: int | None = None, results: Path | None = None
) -> dict[str, Any]:
    """CPU-minutes of each experiment at `budget`: declared, else timed by its current rows
    (those that trained: a row re-read from its finished run took seconds), else untimed."""
    path = (results or ROOT / "benchmarks/results") / f"{bench.name}.json"
    rows = json.loads(path.read_text()).get("rows", []) if path.exists() else []
    rows = [r for r in rows if r.get("seconds") and not r.get("metrics", {}).get("reused_run")]
    found = []
    for e in bench.experiments(budget):
        # (a row's currency is looked up only where needed: it imports torch and attnzoo)
        timed = [] if e.minutes else [r["seconds"] for r in rows if _current(r, e, budget)]
        each = e.minutes or (statistics.fmean(timed) * bench.threads / 60 if timed else None)
        found.append({**asdict(e), "seeds": _seeds(e, seeds), "minutes": each})
    minutes = sum(x["minutes"] * x["seeds"] for x in found if x["minutes"] is not None)
    untimed = [x["id"] for x in found if x["minutes"] is None]
    return {"bench": bench.name, "minutes": minutes, "untimed": untimed, "experiments": found}


class _Saver:
    """Writes a driver call's finished rows into its results JSON as they come. Each save
    re-reads the file under a lock on its folder and merges: rows another call wrote meanwhile
    (another `--only` of the same bench) are kept, a row this call re-ran replaces the earlier
    one, and a matched unit's rows made under another calibration than the unit's are dropped
    (its sides never mix calibrations). `calibrations` are the units this call calibrated: they
    replace the file's; every other unit's stands as the file has it, since another call may
    have calibrated it meanwhile. A row of an id this call does not declare is dropped if the
    file held it when the call started (`start_rows`: an experiment removed from the bench) and
    kept if another call wrote it since (one started after the experiment was added). Then the
    summary, derived entries and targets are made anew from all the rows."""

    def __init__(self, bench, experiments, budget, path, base, calibrations, start_rows):
        self.bench, self.experiments, self.budget = bench, experiments, budget
        self.path, self.base, self.calibrations = path, base, calibrations
        declared = {e.id for e in experiments}
        self.removed = {_row_key(r) for r in start_rows if r["id"] not in declared}
        self.mine: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, new: list[dict[str, Any]]) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            with self.lock:
                fcntl.flock(folder, fcntl.LOCK_EX)
                return self._merge_and_write(new)
        finally:
            os.close(folder)  # releases the lock

    def _merge_and_write(self, new: list[dict[str, Any]]) -> dict[str, Any]:
        latest = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.mine += new
        calibrations = {**latest.get("calibrations", {}), **self.calibrations}
        # the extra each unit side's rows must carry: its unit's calibration
        wanted = {
            e.id: calibrations[e.unit]["extra"].get(e.id, {})
            for e in self.experiments
            if e.unit and e.unit in calibrations
        }
        mine = {(r["id"], r["seed"]) for r in self.mine}
        order = {e.id: i for i, e in enumerate(self.experiments)}
        current = [r for r in latest.get("rows", []) if r.get("budget") == self.budget]
        rows = [
            r
            for r in current
            if r["id"] in order
            and (r["id"], r["seed"]) not in mine
            and (r["id"] not in wanted or r.get("extra") == wanted[r["id"]])
        ]
        # one row per run: a later row of an (id, seed) replaces an earlier one (this call's
        # last), so that a run never counts twice in a mean
        rows = list({(r["id"], r["seed"]): r for r in rows + self.mine}.values())
        rows = sorted(rows, key=lambda r: (order[r["id"]], r["seed"]))
        # another call's experiments, declared by a newer version of the bench
        newer = [r for r in current if r["id"] not in order and _row_key(r) not in self.removed]
        rows += sorted(newer, key=lambda r: (r["id"], r["seed"]))
        summary = summary_of(rows, self.experiments)
        bench = self.bench
        for i, metrics in (bench.derive(summary) if bench.derive else {}).items():
            summary[i] = derived_entry(metrics)
        data = {
            "bench": bench.name,
            "budget": self.budget,
            # the machine of this call's runs; with none run, the one of the rows kept
            "machine": machine_info(threads_per_run=bench.threads)
            if self.mine or "machine" not in latest
            else latest["machine"],
            "method": dict(bench.method),
            "calibrations": calibrations,
            "rows": rows,
            "summary": summary,
            "targets": [t.evaluate(summary) for t in bench.targets],
        }
        if "converted" in latest and any(r.get("seconds") is None for r in rows):  # old rows
            data["converted"] = latest["converted"]
        _write_json(self.path, data, self.base)
        return data


def _row_key(row: Mapping[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def drive(bench: Bench, argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The command line every benchmark script has (see `--help`)."""
    import argparse
    import fnmatch
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description=f"benchmark {bench.name!r}")
    parser.add_argument("--budget", choices=BUDGETS, default="full")
    parser.add_argument("--seeds", type=int, help="seeds per trained experiment")
    parser.add_argument("--only", nargs="*", default=[], help="ids or groups (globs) to run")
    parser.add_argument("--rerun", action="store_true", help="re-run rows already current")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--results", type=Path, help="results folder (smoke: runs/smoke)")
    parser.add_argument("--runs", type=Path, help="run folders (default beside --results)")
    parser.add_argument("--list", action="store_true", help="experiments and CPU-minutes, JSON")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds: expected a count >= 1, got {args.seeds}")
    if args.list:
        print(json.dumps(listing(bench, args.budget, args.seeds, args.results)))
        return None
    experiments = bench.experiments(args.budget)
    jobs = args.jobs or (bench.jobs if isinstance(bench.jobs, int) else bench.jobs[args.budget])
    # full: results/ and runs/bench/ of the repository; smoke (or --results): one folder
    full = ROOT / "benchmarks/results"
    results = (args.results or (full if args.budget == "full" else ROOT / "runs/smoke")).resolve()
    base = ROOT if results.is_relative_to(ROOT) else results  # JSON paths are relative to it
    runs = args.runs or runs_beside(results)
    path = results / f"{bench.name}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    rows = [r for r in earlier.get("rows", []) if r.get("budget") == args.budget]

    def selected(e: Experiment) -> bool:
        return not args.only or any(fnmatch.fnmatch(e.id, p) or e.group == p for p in args.only)

    # What to run: (experiment, seed) pairs without a current row (all of them with --rerun).
    # Its seeds: the declared ones, and any more an earlier call ran (--seeds): a row that
    # no longer stands is run again whatever its seed, never left in the means as it was
    def seeds_of(e: Experiment) -> list[int]:
        return sorted(
            {*range(_seeds(e, args.seeds)), *(r["seed"] for r in rows if r["id"] == e.id)}
        )

    todo = [
        (e, seed)
        for e in filter(selected, experiments)
        for seed in seeds_of(e)
        if args.rerun
        or not any(
            r["id"] == e.id and r["seed"] == seed and _current(r, e, args.budget, rows)
            for r in rows
        )
    ]
    # A unit keeps its calibration while its sides' params stand, so an interrupted unit
    # resumes under the calibration its finished runs had; calibrated anew (by --rerun, a new
    # unit or a changed side), it re-runs whole: both sides always share one calibration.
    fresh: dict[str, dict] = {}  # the units this call calibrates
    extra: dict[str, dict] = {}
    for unit in sorted({e.unit for e, _ in todo if e.unit} if bench.prepare else ()):
        sides = [e for e in experiments if e.unit == unit]
        params = json.loads(json.dumps({e.id: dict(e.params) for e in sides}))
        kept = earlier.get("calibrations", {}).get(unit, {})
        if not args.rerun and kept.get("params") == params:
            extra.update(kept["extra"])
            continue
        print(f"[{bench.name}] calibrating {unit}: {', '.join(params)}", flush=True)
        prepared = _run_child(bench, "prepare", {"ids": list(params), "budget": args.budget})
        if prepared["status"] != STATUS_OK:
            raise SystemExit(f"[{bench.name}] preparing {unit} failed: {prepared['error']}")
        extra.update(prepared["extra"])
        fresh[unit] = {"params": params, "extra": prepared["extra"]}
        todo += [(e, s) for e in sides for s in range(_seeds(e, args.seeds)) if (e, s) not in todo]
    save = _Saver(bench, experiments, args.budget, path, base, fresh, rows)
    save([])  # a new calibration is kept at once: an interrupted unit resumes under it
    todo = _with_needs(bench, experiments, todo, args.seeds, runs)
    finished = {(e.id, seed): threading.Event() for e, seed in todo}
    failed: set[tuple[str, int]] = set()  # (id, seed) whose run failed

    def run_one(item: tuple[Experiment, int]) -> dict[str, Any]:
        e, seed = item
        failed.add((e.id, seed))  # until its row is saved ok; the runs that need it wait
        try:
            row = run_row(e, seed)
            if row["status"] == STATUS_OK:
                failed.discard((e.id, seed))
            return row
        finally:
            finished[e.id, seed].set()

    def run_row(e: Experiment, seed: int) -> dict[str, Any]:
        ctx = dict(id=e.id, seed=seed, budget=args.budget, extra=extra.get(e.id, {}))
        ctx["run_dir"] = str(run_folder(runs, bench.name, e.id, seed))
        needs = _needed(experiments, e, seed, args.seeds)
        ctx["needs"] = {n.id: str(run_folder(runs, bench.name, n.id, s)) for n, s in needs}
        ctx["retrain"] = any(
            (r["id"], r["seed"]) == (e.id, seed) and _data_changed(r) for r in rows
        )
        for n, s in needs:  # taken from the queue before this one (`_with_needs`' order)
            if (n.id, s) in finished:
                finished[n.id, s].wait()
        start = time.perf_counter()
        built_on = {n.id: {"seed": s, "run": _run_digest(ctx["needs"][n.id])} for n, s in needs}
        if lost := [f"{n.id} seed {s}" for n, s in needs if (n.id, s) in failed]:
            result = {"status": STATUS_ERROR, "error": f"not run: {', '.join(lost)} failed"}
        else:
            result = _run_child(bench, "worker", {"params": dict(e.params), "ctx": ctx})
        seconds = time.perf_counter() - start
        print(
            f"[{bench.name}] {e.id} seed {seed}: {result['status']} ({seconds:.0f} s)", flush=True
        )
        row = {"id": e.id, "group": e.group, "seed": seed, "budget": args.budget}
        row.update(params=dict(e.params), extra=ctx["extra"], seconds=seconds, metrics={})
        row.update(cpu=cpu_model(), load_average=os.getloadavg()[0])  # rows may span machines
        row = {**row, **result, "run": _run_digest(ctx["run_dir"])}
        if built_on:
            row["needs"] = built_on
        save([row])  # each finished run is in the JSON at once: killing the driver loses none
        return row

    for e, seed in todo:  # a row that is there but stale: say why it runs again
        for r in rows:
            if r["id"] == e.id and r["seed"] == seed and (why := _stale(r, e, args.budget, rows)):
                print(f"[{bench.name}] {e.id} seed {seed} runs again: {why}", flush=True)
    print(f"[{bench.name}] {len(todo)} runs to do, {jobs} at a time", flush=True)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(run_one, todo))
    data = save([])
    stale = stale_rows(data, experiments)
    for table in bench.tables:
        print(f"\n{bench.name}: {table.name}\n{render_table(table, data, stale)}")
    for t in data["targets"]:
        print(f"target {t['name']}: {t['verdict']} (mean {t['mean']}, n={t['n']})")
    failed = [r for r in data["rows"] if r.get("status") != STATUS_OK]
    for r in failed:
        print(f"[{bench.name}] FAILED {r['id']} seed {r['seed']}: {r.get('error')}", flush=True)
    if failed:  # the tables and targets stand on the other seeds: a caller must not miss it
        raise SystemExit(f"[{bench.name}] {len(failed)} rows failed (the lines above)")
    return data


# 4. Micro-benchmarks: implementations timed in one worker, peak memory in child processes ------


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of every function, measured round by round.

    Each function is warmed up `warmup` times (all of them, before any timing), then every
    round calls each function once; the order rotates between rounds so no function always
    runs right after the same neighbour. Returns the per-call times, `repeats` per function,
    on `clock` (e.g. `time.thread_time`: this thread's CPU time).
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and range of repeated timings (what seeds are to a trained run)."""
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else []
    q1, _, q3 = quartiles or [values[0]] * 3
    return {"median": median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def per_round(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """The spread of the ratios of two implementations' times of the same rounds."""
    return spread([a / b for a, b in zip(numerator, denominator, strict=True)])


def time_steps(
    builders: Mapping[str, Callable[[], Callable[[], Any]]],
    *,
    repeats: int,
    warmup: int,
    reference: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Build each implementation's step, warm every one up, then time them interleaved.

    Per implementation (in `builders`' order): `ms`, the spread of its per-call milliseconds,
    and `times_ms`; beside the implementation `reference[name]`, `ratio`: the spread of the
    per-round ratios reference time / its time (one round's ratio cancels the machine's drift
    between rounds). A build or warm-up that runs out of memory gives status "oom".
    """
    steps, out = {}, {}
    for name, build in builders.items():
        try:
            steps[name] = build()
            for _ in range(warmup):
                steps[name]()
        except Exception as error:
            if not is_oom_error(error):
                raise
            steps.pop(name, None)
            out[name] = {"status": STATUS_OOM, "error": f"timing: {str(error)[:200]}"}
            gc.collect()
    times = time_interleaved(steps, repeats=repeats, warmup=0) if steps else {}
    del steps
    gc.collect()
    for name, seconds in times.items():
        ms = [t * 1e3 for t in seconds]
        out[name] = {"ms": spread(ms), "times_ms": [round(t, 4) for t in ms]}
    for name, ref in (reference or {}).items():
        if name in times and ref in times:
            out[name]["ratio"] = per_round(times[ref], times[name])
    return {name: out[name] for name in builders}


def peak_memory(
    bench: Bench, spec: Mapping[str, Any], warm: Mapping[str, Any], limit_bytes: int = 0
) -> dict[str, Any]:
    """Peak memory of one call of `bench.step(spec)` in a fresh process: VmHWM after the call
    minus VmHWM after imports, inputs and one unmeasured call of `bench.step(warm)` (a tiny
    size: it starts the thread pool and pays one-time lazy imports). With `limit_bytes` the
    child's address space may grow by that much: beyond it the call fails as "oom"."""
    payload = {"spec": dict(spec), "warm": dict(warm), "limit_bytes": limit_bytes}
    result = _run_child(bench, "peak", payload)
    return {k: v for k, v in result.items() if k in ("status", "peak_mib", "error")}


def _status_kib(name: str) -> int:
    """A `/proc/self/status` field in KiB: "VmHWM" (peak resident set), "VmSize"."""
    return int(re.search(rf"^{name}:\s*(\d+)", Path("/proc/self/status").read_text(), re.M)[1])


def _peak_child(bench: Bench, payload: Mapping[str, Any]) -> dict[str, Any]:
    assert bench.step is not None, f"bench {bench.name!r} has no step for peak memory"
    bench.step(payload["warm"])()
    gc.collect()
    step = bench.step(payload["spec"])
    gc.collect()
    # VmHWM reset to the resident set (Linux >= 4.0): else memory freed during imports keeps it
    # above the resident set, and a small configuration would register no rise at all
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    baseline = _status_kib("VmHWM")
    if payload["limit_bytes"]:  # an allocation error ("oom"), not the kernel's OOM killer
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = _status_kib("VmSize") * 1024 + payload["limit_bytes"]
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        step()
    except Exception as error:
        if not is_oom_error(error):
            raise
        return {"status": STATUS_OOM, "error": str(error)[:300]}
    return {"peak_mib": max(0, _status_kib("VmHWM") - baseline) * 1024 / MIB, "hwm_reset": reset}


def grad_step(forward: Callable[[], Any], leaves: Sequence[Any], out_shape, train: bool):
    """One call of `forward`: under no_grad, or (`train`) forward and backward from a fixed
    random output gradient, the leaves' gradients cleared first."""
    import torch

    if not train:
        return torch.no_grad()(forward)
    grad_output = torch.randn(out_shape)

    def step() -> None:
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_output)

    return step


def optimizer_step(loss_of: Callable[[], Any], optimizer) -> Callable[[], None]:
    """A training step: `loss_of()`, the gradients cleared, backward, `optimizer.step()`."""

    def step() -> None:
        loss = loss_of()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def padded_batch(batch, source_len, target_len, source_vocab, target_vocab, seed: int = 0):
    """A random seq2seq batch (ids >= 4, past the special ones): sources padded with 0 from a
    random length in [source_len / 2, source_len] (the first at full length), targets of
    target_len + 1 tokens (target[:, :-1] in, target[:, 1:] out): (source, lengths, target)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(source_len // 2, source_len + 1, (batch,), generator=g)
    lengths[0] = source_len
    source = torch.randint(4, source_vocab, (batch, source_len), generator=g)
    source[torch.arange(source_len)[None] >= lengths[:, None]] = 0
    return source, lengths, torch.randint(4, target_vocab, (batch, target_len + 1), generator=g)


# 5. Trained benchmarks ------------------------------------------------------------------------
#
# A trained benchmark's worker trains through the library's one loop (`attnzoo.runs.run_train`)
# in its run dir, or adopts the finished run already there (the headline runs may have been
# started with the CLI into exactly those dirs), and reads its timings from timing.json.


def read_sets(sets: Sequence[str], model: str, task: str) -> list[str]:
    """The overrides of `sets` that `model` on `task` reads at its defaults: `--set` refuses
    the others (`runs.unread_keys`), e.g. a smoke budget's small `model.attn_hidden` for a
    model without attention. (A key that `sets` itself leaves unread, final_norm beside
    pre_norm=true, is not judged here: `--set` still refuses it.)"""
    from attnzoo import runs

    unread = runs.unread_keys(model, task)
    return [s for s in sets if s.split("=")[0] not in unread]


def resolved_config(sets: Sequence[str], model: str, task: str, seed: int) -> dict:
    """`attnzoo train MODEL --task TASK --set ...` for one seed, one thread, on the CPU."""
    from attnzoo import runs

    extra = [f"train.seed={seed}", "train.threads=1", "train.device=cpu"]
    return runs.apply_overrides(runs.default_config(model, task), [*sets, *extra])


def parameter_count(model: str, task: str, sets: Sequence[str], built: Any, **changes) -> int:
    """Parameters of MODEL built for the task object `built`, its config resolved from `sets`
    (`resolved_config`) with `changes` (e.g. a width searched for a matched count)."""
    from attnzoo.models.registry import MODELS

    spec, own = MODELS[model], resolved_config(sets, model, task, 0)["model"]
    net = spec.build(spec.config_class(**{**own, **changes}), built)
    return sum(p.numel() for p in net.parameters())


def train_worker(
    sets: Sequence[str], model: str, task: str, ctx: Context, *, curve: str = "", figures: int = 1
) -> tuple[dict[str, Any], dict, Any, Any]:
    """Train (or reuse) one run in `ctx.run_dir`: (metrics, config, task, model in eval mode).

    1. Resolve the config (`resolved_config`).
    2. A run dir holding final.json and timing.json whose config.json equals it is reused
       (loaded, not trained). One with that config but no final.json is an interrupted run,
       resumed from its checkpoints (or a run in progress: `run_train` refuses a run dir another
       process holds). Otherwise `run_train` trains from scratch, as it does when the run
       `train.init_from` names was trained again after this one began, or with `ctx.retrain`
       (the run was made on the task's earlier data).
    3. The task's figures are written when the run has none.
    4. Metrics: final.json's, the minutes from timing.json (over `steps_run` steps: a resumed
       run's earlier processes too, `attnzoo.train.loop.train`), seconds per step, steps,
       batch, parameter count, the
       defaults' stamp (`defaults_stamp`: a row is stale once a default changes) and, with
       `curve`, that metric's learning curve from metrics.jsonl (per evaluation step, or per
       logged step for the training "loss").
    """
    from attnzoo import runs
    from attnzoo.tasks.registry import TASKS

    config = resolved_config(sets, model, task, ctx.seed)
    out = Path(ctx.run_dir)
    files = {name: out / f"{name}.json" for name in ("config", "final", "timing")}
    saved = json.loads(files["config"].read_text()) if files["config"].exists() else None
    same = saved == json.loads(json.dumps(config)) and not ctx.retrain
    start = (
        Path(config["train"]["init_from"]) / "final.json" if config["train"]["init_from"] else None
    )
    if (
        same
        and start
        and start.exists()
        and start.stat().st_mtime > files["config"].stat().st_mtime
    ):
        same = False  # the run it started from was trained again since: train this one again
    reused = same and files["final"].exists() and files["timing"].exists()
    resume = same and not reused and any((out / "checkpoints").glob("step_*"))
    if reused:
        _, built_task, built_model = runs.load_run(out, device="cpu")
    else:
        built_task, built_model, _ = runs.run_train(
            config, out, resume=resume, overwrite=not resume, progress=False
        )
    built_model.eval()
    if not list((out / "figures").glob("*.png")):
        runs.write_figures(out, built_task, built_model, count=figures)
    timing = json.loads(files["timing"].read_text())
    metrics = {
        **json.loads(files["final"].read_text()),
        "train_minutes": timing["train_seconds"] / 60,
        "eval_minutes": timing["eval_seconds"] / 60,
        "eval_minutes_during": timing["eval_seconds_during"] / 60,
        "steps": config["train"]["steps"],
        "steps_run": timing["steps_run"],
        "batch_size": config["train"]["batch_size"],
        "params": sum(p.numel() for p in built_model.parameters()),
        "reused_run": reused,
        "defaults": defaults_stamp(model, task),
        "data": TASKS[task].data,
    }
    if timing["steps_run"]:  # none when resumed at its end from a checkpoint without timing
        metrics["sec_per_step_run"] = 60 * metrics["train_minutes"] / timing["steps_run"]
    if curve:
        logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        points = [(r["step"] + 1, r[curve]) for r in logged if curve in r]
        if curve in metrics:  # an evaluation metric: its final value too (not the loss)
            points.append((config["train"]["steps"], metrics[curve]))
        metrics["curve"] = [{"step": s, curve: v} for s, v in points]
    return metrics, config, built_task, built_model


# a smoke run checks the path, not the timing: one round, its warm-up measured
SMOKE_CALIBRATION = {"steps": 2, "rounds": 0}


def calibrate_unit(
    unit: Sequence[Experiment],
    calibration: Mapping[str, int],
    sizes: Mapping[str, Sequence[str]] | None = None,
    *,
    budget: str = "full",
) -> dict[str, dict]:
    """Steps for every side of a matched unit so that each trains for the unit's
    `budget_minutes`: each side's seconds per step are measured by the training loop itself in
    this one process, in rounds of `calibration["steps"]`-step runs (one per side, the order
    rotating each round, the first round a warm-up, measured only when there are no rounds
    after it) and taken as the median of its runs' timing.json train seconds over steps
    (`SMOKE_CALIBRATION` at the smoke budget). `sizes`
    adds each side's own overrides (e.g. the widths that match parameter counts); they are
    part of the returned `sets`."""
    import tempfile

    from attnzoo import runs

    sizes = sizes or {}
    calibration = SMOKE_CALIBRATION if budget == "smoke" else calibration
    seconds: dict[str, list[float]] = {e.id: [] for e in unit}
    k, load = calibration["steps"], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1 + calibration["rounds"]):
            for e in [*unit[r % len(unit) :], *unit[: r % len(unit)]]:
                own = [*e.params["sets"], *sizes.get(e.id, []), f"train.steps={k}", "eval.limit=1"]
                config = resolved_config(own, e.params["model"], e.params["task"], 0)
                runs.run_train(config, Path(tmp) / e.id, overwrite=True, progress=False)
                timing = json.loads((Path(tmp) / e.id / "timing.json").read_text())
                if r > 0 or not calibration["rounds"]:  # the warm-up, unless it is all
                    seconds[e.id].append(timing["train_seconds"] / k)
    prepared = {}
    for e in unit:
        per_step = median(seconds[e.id])
        steps = max(1, int(60 * e.params["budget_minutes"] / per_step))
        prepared[e.id] = {
            "sets": [*sizes.get(e.id, []), f"train.steps={steps}"],
            "sec_per_step": per_step,
            "load_average": load,
            "calibration": dict(calibration),
        }
    return prepared


def run_folder(runs: Path, bench: str, experiment_id: str, seed: int) -> Path:
    """The run folder of one (experiment, seed) under a runs folder (`--runs`)."""
    return Path(runs) / bench / experiment_id / f"seed{seed}"


def runs_beside(results: Path) -> Path:
    """The driver's runs folder for a results folder (its default `--runs`): the repository's
    runs/bench/ for its benchmarks/results/, else the results folder's runs/ (a smoke run's)."""
    results = Path(results).resolve()
    return ROOT / "runs" / "bench" if results == ROOT / "benchmarks/results" else results / "runs"


def sibling_run(ctx: Context, experiment_id: str) -> Path:
    """The finished run of an experiment this row `needs` (the driver ran it first)."""
    if experiment_id not in ctx.needs:
        raise ValueError(f"{ctx.id!r} does not declare {experiment_id!r} in Experiment.needs")
    run = Path(ctx.needs[experiment_id])
    if not (run / "final.json").exists():
        raise RuntimeError(f"{run} has no finished run: run the {experiment_id!r} row first")
    return run.resolve()


def copy_run_figures(pairs: Mapping[str, Path], folder: Path) -> list[Path]:
    """Copy each existing run figure to folder/NAME; a figure whose run is absent is left as it
    is (the committed one stays)."""
    import shutil

    return [Path(shutil.copyfile(s, Path(folder) / n)) for n, s in pairs.items() if s.exists()]


def draw_seeds(
    path: Path,
    groups: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    symlog: float = 0.0,
) -> Path:
    """Per group (label -> one (xs, ys) per seed): the mean over seeds at each x with markers,
    and the band from the lowest to the highest seed; 800 px wide."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, MaxNLocator

    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    for label, series in groups.items():
        xs = sorted(set().union(*(x for x, _ in series)))
        at = [[dict(zip(x, y, strict=True)).get(v) for x, y in series] for v in xs]
        at = [[a for a in values if a is not None] for values in at]
        mean = [statistics.fmean(a) for a in at]
        line = ax.plot(xs, mean, marker="o", label=f"{label} (n={len(series)})")[0]
        if len(series) > 1:
            ax.fill_between(
                xs, [min(a) for a in at], [max(a) for a in at], alpha=0.2, color=line.get_color()
            )
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    if symlog:
        ax.set_yscale("symlog", linthresh=symlog)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(len(groups), 3), frameon=False
    )
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)
