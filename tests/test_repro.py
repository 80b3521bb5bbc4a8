"""`attnzoo repro`: every docs page's benchmarks run at the smoke budget and the page renders
(the pipeline, not the numbers); `--list` names every page with its full budget; bad input is
one line naming the argument."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import _common  # noqa: E402
import bench_transformer  # noqa: E402
import report  # noqa: E402
from tests.train.test_loop import cli  # noqa: E402

# What a bench's smoke JSON must show beyond a clean run (the pipeline's correctness checks:
# the compared implementations compute one function); a page's smoke run checks its benches.


def _overhead(data: dict) -> None:
    (row,) = data["rows"]
    metrics = row["metrics"]
    assert metrics["ratio"] == pytest.approx(
        metrics["attnzoo_us"]["median"] / metrics["sdpa_us"]["median"]
    )
    worst = data["summary"]["worst"]["metrics"]["overhead_us"]["mean"]
    assert worst == pytest.approx(metrics["overhead_us"]["median"])


def _keras(data: dict) -> None:
    for row in data["rows"]:
        assert row["metrics"]["max_abs_diff"] < 1e-4  # the two sides compute one function
    row = next(r for r in data["rows"] if r["id"] == "additive-L32")
    peaks, p = row["metrics"]["impls"], row["params"]
    # Keras's score holds a (batch, L, L, d) float32 tensor: the measured rise is at least that
    assert peaks["keras"]["peak_mib"] >= p["batch"] * p["length"] ** 2 * p["d"] * 4 / 2**20
    assert peaks["keras"]["peak_ratio"] == pytest.approx(
        peaks["attnzoo"]["peak_mib"] / peaks["keras"]["peak_mib"]
    )


def _throughput(data: dict) -> None:
    for row in data["rows"]:
        ours = row["metrics"]["impls"]["attnzoo"]
        assert ours["tokens_per_s"] > 0 and row["metrics"]["speedup"]["median"] > 0


def _transformer(data: dict) -> None:
    rows = {r["id"]: r["metrics"] for r in data["rows"]}
    assert set(rows) == {"training-dropout0", "training-dropout0.1", "training-bf16"} | {
        f"decoding-batch{b}" for b in (1, 32)
    }
    assert rows["training-dropout0"]["loss_difference"] < 1e-4  # from_torch: one function
    # bf16 is timed only where the CPU has bf16 matrix units; elsewhere the row says why not
    has_units = bool(_common.cpu_flags() & set(bench_transformer.BF16_UNITS))
    assert ("attnzoo_bf16" in rows["training-bf16"].get("impls", {})) == has_units
    assert ("not_measured" in rows["training-bf16"]) != has_units
    assert all(rows[f"decoding-batch{b}"]["identical_tokens"] == 1.0 for b in (1, 32))


def _ram(data: dict) -> None:  # both errors, no sampled paths for a baseline, the timings
    summary = data["summary"]
    assert {"error", "error_mc", "train_minutes"} <= set(summary["mnist-g6"]["metrics"])
    assert "error_mc" not in summary["mnist-fc"]["metrics"]
    speeds = [r["metrics"] for r in data["rows"] if r["id"] == "speed"]
    assert speeds
    for speed in speeds:
        ratio = speed["step_ms_loop"] / speed["step_ms_batched"]
        assert speed["step_speedup"] == pytest.approx(ratio)  # a ratio, not a timing target
        assert {"retina_ms_grid", "retina_ms_index", "retina_ms_crop_then_pool"} <= set(speed)


def _dram(data: dict) -> None:  # the retinas take in fewer values than the image's pixels
    ratio = {i: e["metrics"]["pixels_read_ratio"]["mean"] for i, e in data["summary"].items()}
    assert ratio["multi-dram"] < 1 and ratio["multi-convnet-multi"] == 1
    assert {"error", "label_error"} <= set(data["summary"]["multi-dram"]["metrics"])
    sampled = data["summary"]["multi-dram"]["metrics"]  # paths averaged: DRAM's, not the convnet's
    assert 0 <= sampled["error_mc"]["mean"] <= 100 and sampled["mc_samples"]["mean"] > 1
    assert "error_mc" not in data["summary"]["multi-convnet-multi"]["metrics"]
    for row in data["rows"]:  # the training loss of every logged step, for the loss figure
        steps = [c["step"] for c in row["metrics"]["curve"]]
        assert steps and steps == sorted(steps) and steps[-1] <= row["metrics"]["steps"], row["id"]
        assert all(math.isfinite(c["loss"]) for c in row["metrics"]["curve"]), row["id"]


def _sagan(data: dict) -> None:  # every row ran in order; the baseline has no gammas
    summary = data["summary"]
    assert {"fid", "fid_floor", "class_accuracy", "gamma_generator"} <= set(
        summary["sagan"]["metrics"]
    )
    assert "gamma_generator" not in summary["sagan-noattn"]["metrics"]
    assert {"accuracy"} <= set(summary["classifier"]["metrics"])
    assert summary["floor"]["metrics"]["fid"]["mean"] >= 0


def _attention(data: dict) -> None:  # the additive rows' OOM estimate, cap and targets
    rows = {r["id"]: r for r in data["rows"]}
    # the long plain additive does not fit the smoke budget: "oom" by its estimate
    long = rows["additive-h32-fwd+bwd-L256"]["metrics"]["impls"]
    assert long["plain"]["status"] == "oom" and "estimated" in long["plain"]["error"]
    row = rows["additive-h32-fwd+bwd-L64"]
    cap_mib = (row["params"]["budget_gib"] + 1) * 1024
    for name, impl in row["metrics"]["impls"].items():
        assert len(impl["times_ms"]) == row["params"]["repeats"], name
        # measured in a child, under the cap; 0 where the allocator served the call from
        # memory the process already held (as Keras's small smoke rows did on a GPU machine;
        # _keras checks that a large rise registers)
        assert 0 <= impl["peak_mib"] < cap_mib, name
    plain = row["metrics"]["impls"]["plain"]["ratio"]
    assert plain["min"] <= plain["median"]
    measured = {t["key"] for t in data["targets"] if t["id"] == "additive" and t["n"] == 1}
    keras = {"peak_over_keras"} if importlib.util.find_spec("keras") else set()
    assert {"time_over_plain", "peak_over_plain", "gtanh_per_s"} | keras <= measured
    assert data["method"]["peak_mib"].startswith("VmHWM")


CHECKS = {
    "attention": _attention,
    "sagan": _sagan,
    "attention_overhead": _overhead,
    "keras": _keras,
    "seq2seq_throughput": _throughput,
    "transformer": _transformer,
    "ram": _ram,
    "dram": _dram,
}


def attnzoo(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return cli(*args, cwd=cwd, timeout=1200)  # a page's smoke run takes minutes under load


def _sharing_groups() -> list[list[str]]:
    """The pages, grouped where they share a benchmark (transformer shows seq2seq's rows):
    a group's pages run one after another into one folder, so a shared bench runs once and
    the later page adopts its current rows, as a user's second `repro` does."""
    groups: list[list[str]] = []
    for page in sorted(report.PAGES):
        joined = [
            g for g in groups if set(report.PAGES[page]) & {b for q in g for b in report.PAGES[q]}
        ]
        merged = [q for g in joined for q in g] + [page]
        groups = [g for g in groups if g not in joined] + [merged]
    return groups


@pytest.mark.slow
@pytest.mark.parametrize("pages", _sharing_groups(), ids="+".join)
def test_smoke_repro_renders_the_page(pages, tmp_path):
    for page in pages:
        _smoke_repro(page, tmp_path)


def _smoke_repro(page: str, tmp_path: Path) -> None:
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
        assert all(t["verdict"] in {"met", "not met", "not measured"} for t in data["targets"])
        CHECKS.get(bench, lambda data: None)(data)
    # nothing of a smoke run lands in docs/ or benchmarks/results/
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.slow
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
        (["repro", "--list", "--seeds", "0"], "--seeds"),
        (["repro", "ntm", "--budget", "full", "--out", "x"], "--out"),
        (["repro"], "PAGE or --list"),
        (["repro", "ntm", "--list"], "PAGE (ntm)"),
        (["repro", "--list", "--budget", "smoke"], "--budget (smoke)"),
        (["repro", "--list", "--out", "x"], "--out (x)"),
    ],
)
def test_bad_input_is_one_line(args, named):
    r = attnzoo(*args)
    assert r.returncode == 2 and named in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("out", ["benchmarks/results", "docs", "docs/figures/x"])
def test_a_smoke_run_never_writes_over_the_committed_results_or_docs(out):
    """`--out benchmarks/results` replaced keras.json's full rows with smoke ones, `--out docs`
    replaced docs/keras.md with smoke numbers: a folder under docs/ or benchmarks/ is refused
    before any run, and nothing there changes."""
    watched = [ROOT / "benchmarks/results/keras.json", ROOT / "docs/keras.md"]
    before = [p.read_bytes() for p in watched]
    r = attnzoo("repro", "keras", "--budget", "smoke", "--out", out, cwd=ROOT)
    assert r.returncode == 2 and "argument '--out' expected a folder outside" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert [p.read_bytes() for p in watched] == before


def test_a_smoke_run_refuses_a_folder_of_the_users(tmp_path):
    """`--out` holding the user's files (a notes file named like the page) was written over:
    refused before any run, untouched; a folder an earlier smoke run wrote is taken again."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "ntm.md").write_text("my own notes on the NTM")
    r = attnzoo("repro", "ntm", "--budget", "smoke", "--out", str(mine), cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "argument '--out' expected a new or empty folder" in r.stderr
    assert (mine / "ntm.md").read_text() == "my own notes on the NTM"
    assert sorted(p.name for p in mine.iterdir()) == ["ntm.md"]
    from attnzoo import repro

    again = tmp_path / "again"
    repro._claim(again)  # new: taken and marked
    (again / "ntm.md").write_text("an earlier smoke page")
    repro._claim(again)  # its own earlier output: taken again


def test_outside_a_checkout_is_one_line(tmp_path):
    r = attnzoo("repro", "ntm", cwd=tmp_path)
    assert r.returncode == 2 and "source checkout" in r.stderr


def test_list_counts_the_seeds_asked_for():
    """`--list --seeds 1` prices one seed of each experiment: below the default for a page
    whose experiments run several seeds, and the sum of its experiments' minutes."""
    default, one = report.budgets(), report.budgets(seeds=1)
    assert [r["page"] for r in one] == list(report.PAGES)
    for full, single in zip(default, one, strict=True):
        each = [
            x["minutes"] or 0
            for b in single["benches"]
            for x in report.listing(report.bench_module(b).BENCH, "full")["experiments"]
        ]
        assert single["cpu_minutes"] == pytest.approx(sum(each))
        assert single["cpu_minutes"] <= full["cpu_minutes"]
    assert sum(r["cpu_minutes"] for r in one) < sum(r["cpu_minutes"] for r in default)


@pytest.mark.parametrize(
    ("x", "threshold", "shown"),
    [(0.9996, 1, "0.9996"), (99.996, 100, "99.996"), (1.0, 1, "1.00"), (0.4, 1, "0.4")],
)
def test_a_target_value_never_reads_as_the_threshold_it_is_not(x, threshold, shown):
    """'not met: 1 (target >= 1)' for a mean of 0.9996: the page contradicted its verdict."""
    assert report.readable_apart(x, threshold) == shown


def test_a_verdict_over_stale_rows_says_so(tmp_path):
    """Tables mark a row made under other params than the bench declares (†); a target
    line computed over it did not."""
    data = json.loads((report.RESULTS / "ntm.json").read_text())
    target = next(t for t in data["targets"] if t["id"] == "bit_copy-ntm")
    row = next(r for r in data["rows"] if r["id"] == "bit_copy-ntm")
    row["params"] = {**row["params"], "steps": 1}
    (tmp_path / "ntm.json").write_text(json.dumps(data))
    line = report.Page("ntm", tmp_path).target("ntm", target["name"])
    assert "† over stale rows of bit_copy-ntm (its params changed)" in line
    clean = report.Page("ntm", report.RESULTS).target("ntm", target["name"])
    assert "stale" not in clean


@pytest.mark.parametrize("seeds", [None, 3])
def test_a_page_runs_each_of_its_benchmarks_with_the_seeds_asked_for(seeds, tmp_path, monkeypatch):
    """Every script behind the page runs once (two benches of one script: once), each with
    `--seeds` where asked, then the page renders; the scripts' runs are recorded, not made."""
    from attnzoo import repro

    scripts = {"a": "benchmarks/bench_a.py", "b": "benchmarks/bench_b.py"}
    known = {"page": {**scripts, "a2": scripts["a"]}, "other": {"c": "benchmarks/bench_c.py"}}
    calls = []
    monkeypatch.setattr(repro, "pages", lambda root: known)
    monkeypatch.setattr(repro, "_python", lambda root, *args, capture=False: calls.append(args))
    out = tmp_path / "out"
    written = repro.repro("page", budget="smoke", seeds=seeds, root=ROOT, out=out)
    assert written == out.resolve() / "page.md"
    results = ("--results", str(out.resolve()))
    extra = ("--seeds", "3") if seeds else ()
    assert calls == [
        (scripts["a"], "--budget", "smoke", *results, *extra),
        (scripts["b"], "--budget", "smoke", *results, *extra),
        ("benchmarks/report.py", "page", *results, "--out", str(out.resolve())),
    ]
