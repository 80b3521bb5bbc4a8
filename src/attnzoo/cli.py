"""`attnzoo ...`: demo, train, eval, plot, explore, list, repro.

Wrong input (a command line, a `--set`, a run directory's damaged file, a path that cannot be
written) prints one line `attnzoo: error: ...` naming the argument or the file, what was expected
and what was given, and exits with status 2; so do sizes the device's memory cannot hold (`out of
memory: ...`, the allocator's words); `--debug` shows the traceback instead. An exception
of any other type is a bug and keeps its traceback (`_user_error`). `train --resume` continues
with the run's saved config (`runs.resume_config`); `train` refuses a run directory that holds
anything unless `--overwrite` (`attnzoo demo` replaces its own run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()


def _table(title: str, metrics: dict) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in metrics.items():
        table.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    return table


def cmd_list(args) -> None:
    from attnzoo.models.registry import MODELS
    from attnzoo.runs import fitting_models
    from attnzoo.tasks.registry import TASKS

    for title, registry in (("models", MODELS), ("tasks", TASKS)):
        table = Table(title=title)
        table.add_column("name")
        table.add_column("what")
        if registry is TASKS:
            table.add_column("models")
        for name, spec in registry.items():
            row = [name, spec.description]
            if registry is TASKS:
                row.append(", ".join(fitting_models(name)))
            table.add_row(*row)
        console.print(table)


def cmd_repro(args) -> None:
    """`attnzoo repro PAGE` or `attnzoo repro --list` (attnzoo.repro)."""
    from attnzoo import repro

    if args.list:
        table = Table(title="docs pages (attnzoo repro PAGE --budget full)")
        for column in ("page", "benchmarks", "CPU-minutes"):
            table.add_column(column)
        for row in repro.listing(repro.find_checkout(), args.seeds):
            minutes = f"{row['cpu_minutes']:.0f}"
            if row["untimed"]:  # experiments without a declared cost or a timed run yet
                minutes += f" + {row['untimed']} experiments not yet timed"
            table.add_row(row["page"], ", ".join(row["benches"]), minutes)
        console.print(table)
        return
    out = Path(args.out) if args.out else None
    repro.repro(args.page, budget=args.budget, seeds=args.seeds, out=out)  # report.py names it


def cmd_train(args) -> None:
    """Train, or with --resume continue the run in --out with its saved config (MODEL, --task
    and --set checked against it: `runs.resume_config`)."""
    from attnzoo import runs

    if args.resume:
        config = runs.resume_config(Path(args.out), args.model, args.task, args.set)
    else:
        config = runs.apply_overrides(runs.default_config(args.model, args.task), args.set)
    out = Path(args.out or f"runs/{config['model_name']}-{config['task_name']}")
    args.out = str(out)  # (the interrupt hint names it)
    start = time.perf_counter()
    task, model, final = runs.run_train(
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        demo=getattr(args, "demo", False),
    )
    if runs.main_process():  # under torchrun, rank 0 alone writes the run directory
        runs.write_figures(out, task, model)
        final = {**final, "train_minutes": (time.perf_counter() - start) / 60}
        console.print(_table(f"{config['model_name']} on {config['task_name']} -> {out}", final))
    return task, model


def cmd_demo(args) -> None:
    """Bahdanau on dates; prints the result and writes runs/demo/figures/alignment.png and
    the explorer page runs/demo/explore.html. It replaces the run of an earlier demo in its
    --out (and says so), so it can run again; any other run there is refused, as `train`
    refuses it without --overwrite."""
    from attnzoo import runs

    args.model, args.task, args.resume, args.demo = "bahdanau", "dates", False, True
    args.out = args.out or "runs/demo"
    args.overwrite = runs.demo_replaces(Path(args.out))
    task, model = cmd_train(args)  # marks the run a demo's before it trains
    if not runs.main_process():  # a torchrun worker: rank 0 writes and prints
        return
    console.print(f"alignment figure: {Path(args.out) / 'figures' / 'alignment.png'}")
    page = runs.write_explorer(
        Path(args.out) / runs.EXPLORER,
        task,
        model,
        count=EXPLORE_EXAMPLES,
        heading=f"bahdanau on dates: {args.out}",
    )
    console.print(f"attention explorer: {page}")


EXPLORE_EXAMPLES = 20  # held-out examples on an explorer page unless --examples says


def cmd_explore(args) -> None:
    """Write the run's explorer page (--out, default DIR/explore.html) and print its path;
    DIR's config and --out are checked before the run is loaded."""
    from attnzoo import runs
    from attnzoo.core.checks import fail

    out = Path(args.out) if args.out else Path(args.dir) / runs.EXPLORER
    if args.examples < 1:
        fail("attnzoo explore", "--examples", "a positive int", args.examples)
    runs.read_config(Path(args.dir))
    runs.check_explorer_out(out)
    config, task, model = runs.load_run(Path(args.dir), device=args.device)
    heading = f"{config['model_name']} on {config['task_name']}: {args.dir}"
    console.print(str(runs.write_explorer(out, task, model, count=args.examples, heading=heading)))


def cmd_eval(args) -> None:
    """Evaluate a run's newest weights under its config, changed by the --set items that
    change only the evaluation (`runs.evaluation_keys`: e.g. a larger test set, a beam); with
    --json, also write the metrics and the changes to that new file."""
    from attnzoo import runs
    from attnzoo.core.checks import fail

    out = Path(args.json) if args.json else None
    if out is not None and (out.exists() or not out.parent.is_dir()):
        why = "exists" if out.exists() else "no such folder"
        fail("attnzoo eval", "--json", "a new file in an existing folder", f"{out} ({why})")
    config, task, model = runs.load_run(Path(args.dir), device=args.device, sets=args.set)
    metrics = runs.evaluate(task, model)
    console.print(_table(f"{config['model_name']} on {config['task_name']}", metrics))
    if out is not None:
        changes = runs.differences(runs.read_config(Path(args.dir)), config)
        found = {"run": str(args.dir), "changes": {k: new for k, _, new in changes}}
        runs.atomic_write_json(out, {**found, "metrics": metrics})
        console.print(str(out))


def cmd_plot(args) -> None:
    from attnzoo import runs

    _, task, model = runs.load_run(Path(args.dir), device=args.device)
    for path in runs.write_figures(Path(args.dir), task, model):
        console.print(str(path))


class UsageError(Exception):
    """A mistake in the command line itself (argparse's): `main` prints it as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are raised as `UsageError`, for `main` to print as the one
    line `attnzoo: error: ...` and return status 2 (argparse prints the usage and exits)."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnzoo", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train Bahdanau attention on dates, draw its alignment")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    demo.add_argument("--out", default=None, help="run directory (replaced: default runs/demo)")
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=cmd_demo)
    train = sub.add_parser("train", help="train MODEL on --task")
    train.add_argument("model", nargs="?", default=None)
    train.add_argument("--task", default=None)
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. model.hidden=256",
    )
    train.add_argument("--out", default=None, help="run directory")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its saved config (only some keys may --set)",
    )
    train.add_argument(
        "--overwrite", action="store_true", help="clear the run already in --out, then train"
    )
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(func=cmd_train)
    for name, func, text in (
        ("eval", cmd_eval, "evaluate a run"),
        ("plot", cmd_plot, "draw a run's figures"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("dir")
        sp.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
        sp.set_defaults(func=func)
        if name == "eval":
            sp.add_argument(
                "--set",
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="a key that changes only the evaluation: eval.* (not label_smoothing) or "
                "a task field its config lists in HELD_OUT, e.g. task.n_test=5000",
            )
            sp.add_argument("--json", default=None, help="also write the metrics to this new file")
    explore = sub.add_parser(
        "explore", help="write a run's attention explorer (one self-contained HTML page)"
    )
    explore.add_argument("dir", metavar="DIR", help="a run directory")
    explore.add_argument(
        "--examples",
        type=int,
        default=EXPLORE_EXAMPLES,
        metavar="N",
        help=f"held-out examples on the page (default {EXPLORE_EXAMPLES})",
    )
    explore.add_argument("--out", default=None, help="the page to write (default DIR/explore.html)")
    explore.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    explore.set_defaults(func=cmd_explore)
    sub.add_parser("list", help="models and tasks").set_defaults(func=cmd_list)
    repro = sub.add_parser("repro", help="re-run the benchmarks behind a docs page, regenerate it")
    repro.add_argument("page", nargs="?", help="a docs page (see --list)")
    repro.add_argument("--budget", choices=("smoke", "full"), help="(default: full)")
    repro.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds per trained experiment (seeds run before stay)",
    )
    repro.add_argument("--list", action="store_true", help="pages and their full CPU-minutes")
    repro.add_argument("--out", default=None, help="smoke only: folder (default runs/smoke/PAGE)")
    repro.set_defaults(func=cmd_repro)
    return p


def _user_error(err: BaseException) -> bool:
    """Whether `err` is a user's mistake (one line) rather than a bug (a traceback): a
    ValueError (the checks' errors, malformed files), an OSError (a path, a full disk), a
    missing data package, a TypeError worded by `attnzoo.core.checks.fail` (a value of the
    wrong type), or memory the sizes asked for and the device lacks (`_out_of_memory`); any
    other TypeError or RuntimeError is a bug."""
    if isinstance(err, ValueError | OSError | ModuleNotFoundError) or _out_of_memory(err):
        return True
    return isinstance(err, TypeError) and "argument '" in str(err) and " expected " in str(err)


_OOM_MESSAGES = ("can't allocate memory", "out of memory")  # torch's CPU and CUDA allocators


def _out_of_memory(err: BaseException) -> bool:
    """An allocation that failed: Python's MemoryError, or torch's allocators' RuntimeError
    (`torch.OutOfMemoryError` on an accelerator)."""
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _OOM_MESSAGES)


def _check_train_args(args) -> None:
    if args.resume and not args.out:
        raise UsageError("attnzoo train: --resume needs --out DIR (the run to continue)")
    if args.resume and args.overwrite:
        raise UsageError(
            "attnzoo train: --resume continues the run in --out, --overwrite replaces it: not both"
        )
    if not args.resume and (args.model is None or args.task is None):
        raise UsageError("attnzoo train: needs MODEL and --task TASK (see `attnzoo list`)")


def _check_sets(args) -> None:
    """A --set key given twice is refused: the last value would win, the earlier ignored."""
    given: dict[str, str] = {}
    for item in getattr(args, "set", ()):
        key = item.split("=", 1)[0].strip()
        if key in given:
            raise UsageError(
                f"attnzoo {args.command}: --set {key} expected once, got {given[key]!r} and "
                f"{item!r}"
            )
        given[key] = item


def _check_repro_args(args) -> None:
    """PAGE or --list; --list lists every page at its full budget, so PAGE, --budget and
    --out beside it would be ignored: refused instead."""
    if args.page is None and not args.list:
        raise UsageError("attnzoo repro: needs PAGE or --list (see `attnzoo repro --list`)")
    if args.list:
        given = {"PAGE": args.page, "--budget": args.budget, "--out": args.out}
        for name, value in given.items():
            if value is not None:
                raise UsageError(
                    f"attnzoo repro: {name} ({value}) expected alone, without --list "
                    "(it lists every page at its full budget)"
                )
    args.budget = args.budget or "full"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
        _check_sets(args)
        if args.command == "train":
            _check_train_args(args)
        if args.command == "repro":
            _check_repro_args(args)
    except UsageError as err:
        print(f"attnzoo: error: {err}", file=sys.stderr)
        return 2
    try:
        args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        hint = ""
        if args.command == "train" and args.out:  # (a run stopped before its first
            # checkpoint is started again: --resume then says so)
            hint = f" (the run continues with `attnzoo train --resume --out {args.out}`)"
        print(f"attnzoo: interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug or not _user_error(err):
            raise
        message = " ".join(str(err).split())
        if _out_of_memory(err):  # the sizes (model.*, train.batch_size, task.*) or the device
            message = f"out of memory: {message or type(err).__name__} (smaller sizes or batch)"
        print(f"attnzoo: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
