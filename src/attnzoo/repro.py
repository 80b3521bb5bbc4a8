"""`attnzoo repro PAGE`: re-run the benchmarks behind one docs page, then regenerate the page.

The benchmarks and the docs templates live in a source checkout (benchmarks/, docs/templates/),
not in the installed package: repro finds the checkout above the working directory and runs
its scripts as subprocesses (the package never imports benchmarks/).

- `--budget full` (the default) runs every experiment of the page's benchmarks at the budget
  its docs state, writes benchmarks/results/*.json and docs/PAGE.md. Rows already current are
  kept (the driver's merge); a changed experiment runs again.
- `--budget smoke` runs tiny versions (about a minute per page) into runs/smoke/PAGE/ and
  renders the page there: it checks the pipeline, never the numbers, and touches nothing
  under docs/ or benchmarks/results/.
- `--seeds N` runs seeds 0..N-1 of every experiment that runs over seeds. Seeds an earlier
  call ran stay in the results (the driver's merge): at `--budget full` it adds seeds to the
  docs' results, never drops them.
- `--list` prints each page, its benchmarks and its full budget in CPU-minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from attnzoo.core.checks import fail

BUDGETS = ("smoke", "full")


def find_checkout(start: Path | None = None) -> Path:
    """The source checkout holding benchmarks/report.py and docs/templates/, at or above
    `start` (the working directory)."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "benchmarks" / "report.py").is_file() and (folder / "docs/templates").is_dir():
            return folder
    fail(
        "attnzoo repro",
        "working directory",
        "inside a source checkout of attnzoo (with benchmarks/report.py and docs/templates/)",
        str(start),
    )
    raise AssertionError  # unreachable: fail raises


def _python(root: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [sys.executable, *args], cwd=root, env=env, text=True, capture_output=capture
    )
    if done.returncode != 0:
        detail = " ".join((done.stderr or "").strip().splitlines()[-1:])
        command = " ".join(args)
        raise ChildProcessError(f"`{command}` failed (exit {done.returncode}) {detail}".strip())
    return done


def pages(root: Path) -> dict[str, dict[str, str]]:
    """page -> {bench name: its script, relative to the checkout}."""
    return json.loads(_python(root, "benchmarks/report.py", "--pages", capture=True).stdout)


def listing(root: Path, seeds: int | None = None) -> list[dict]:
    """Each page with its benches, their full budget in CPU-minutes (a bench shared by two pages
    counts for each) and how many of their experiments no run has timed yet."""
    if seeds is not None and seeds < 1:
        fail("attnzoo repro", "--seeds", "a count >= 1", seeds)
    extra = ["--seeds", str(seeds)] if seeds else []
    return json.loads(_python(root, "benchmarks/report.py", "--list", *extra, capture=True).stdout)


SMOKE_MARK = ".attnzoo-repro"  # in a folder a smoke run writes into: the next may write again


def _claim(folder: Path) -> None:
    """A smoke run's folder: new, empty, or one an earlier smoke run wrote (`SMOKE_MARK`).
    A folder of the user's is refused: the run writes PAGE.md, BENCH.json, figures/ and runs/
    there, over files of those names."""
    held = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if held and SMOKE_MARK not in held:
        expected = "a new or empty folder, or one an earlier smoke run wrote"
        fail("attnzoo repro", "--out", expected, f"{folder} holding {held}", FileExistsError)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SMOKE_MARK).touch()
    except OSError as err:
        fail("attnzoo repro", "--out", "a folder attnzoo can write in", f"{folder} ({err})")


def repro(
    page: str,
    *,
    budget: str = "full",
    seeds: int | None = None,
    root: Path | None = None,
    out: Path | None = None,
) -> Path:
    """Run the page's benchmarks at `budget`, then render it; returns the page written. A smoke
    run writes its results, runs and page under `out` (default runs/smoke/PAGE)."""
    root = root or find_checkout()
    if budget not in BUDGETS:
        fail("attnzoo repro", "--budget", f"one of {list(BUDGETS)}", repr(budget))
    if seeds is not None and seeds < 1:
        fail("attnzoo repro", "--seeds", "a count >= 1", seeds)
    if out is not None and budget != "smoke":
        fail("attnzoo repro", "--out", "only with --budget smoke (full writes docs/)", str(out))
    known = pages(root)
    if page not in known:
        fail("attnzoo repro", "PAGE", f"one of {sorted(known)}", repr(page))
    smoke = Path(out or root / "runs" / "smoke" / page).resolve()
    for committed in (root / "docs", root / "benchmarks"):
        if smoke.is_relative_to(committed.resolve()):
            # a smoke run's results and page would replace the committed ones there
            expected = f"a folder outside {committed} (a smoke run writes results and a page)"
            fail("attnzoo repro", "--out", expected, str(out))
    if out is not None:  # a folder of the user's choosing (the default is attnzoo's own)
        _claim(smoke)
    results = ["--results", str(smoke)] if budget == "smoke" else []
    for script in dict.fromkeys(known[page].values()):
        extra = ["--seeds", str(seeds)] if seeds else []
        _python(root, script, "--budget", budget, *results, *extra)
    where = ["--out", str(smoke)] if budget == "smoke" else []
    _python(root, "benchmarks/report.py", page, *results, *where)
    return (smoke if budget == "smoke" else root / "docs") / f"{page}.md"
