"""`attnzoo repro`: every docs page's benchmarks run at the smoke budget and the page renders
(the pipeline, not the numbers); `--list` names every page with its full budget; bad input is
one line naming the argument."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402


def attnzoo(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnzoo.cli", *args], cwd=cwd, capture_output=True, text=True
    )


@pytest.mark.parametrize("page", sorted(report.PAGES))
def test_smoke_repro_renders_the_page(page, tmp_path):
    kept = [ROOT / "docs" / f"{page}.md"] + [
        report.RESULTS / f"{b}.json" for b in report.PAGES[page]
    ]
    before = {p: p.stat().st_mtime_ns for p in kept if p.exists()}
    r = attnzoo("repro", page, "--budget", "smoke", "--seeds", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = (tmp_path / f"{page}.md").read_text()
    assert "{{" not in text and "{%" not in text
    for bench in report.PAGES[page]:
        raw = (tmp_path / f"{bench}.json").read_text()
        data = json.loads(raw)
        assert data["budget"] == "smoke"
        assert not re.search(r'"/(work|home|tmp|usr)/', raw), f"{bench}.json holds a path"
        failed = [(r["id"], r["seed"], r.get("error")) for r in data["rows"] if r["status"] != "ok"]
        assert not failed, failed
    # nothing of a smoke run lands in docs/ or benchmarks/results/
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_list_names_every_page_with_its_budget():
    r = attnzoo("repro", "--list")
    assert r.returncode == 0, r.stderr
    for page in report.PAGES:
        assert re.search(rf"\b{page}\b.*\b\d+\b", r.stdout), (page, r.stdout)


@pytest.mark.parametrize(
    "args, named",
    [
        (["repro", "nonesuch", "--budget", "smoke"], "PAGE"),
        (["repro", "ntm", "--budget", "smoke", "--seeds", "0"], "--seeds"),
        (["repro", "ntm", "--budget", "full", "--out", "x"], "--out"),
        (["repro"], "PAGE or --list"),
    ],
)
def test_bad_input_is_one_line(args, named):
    r = attnzoo(*args)
    assert r.returncode == 2 and named in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_outside_a_checkout_is_one_line(tmp_path):
    r = attnzoo("repro", "ntm", cwd=tmp_path)
    assert r.returncode == 2 and "source checkout" in r.stderr
