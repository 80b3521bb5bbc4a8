"""Smoke test of benchmarks/bench_attention.py: `--quick` runs end to end, writes the JSON
layout the README promises, and records configurations that do not fit as "oom" instead of
crashing (both the estimate guard and an allocation failure inside a worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _common

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention.py"
ROW_KEYS = {"name", "score", "length", "mode", "impl", "median_ms", "peak_mib", "status"}
TARGET_KEYS = {"name", "value", "target", "met"}


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "attention.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Targets" in done.stdout
    return json.loads(out.read_text())


def test_quick_run_writes_the_documented_layout(quick_results):
    assert set(quick_results) == {"machine", "config", "rows", "targets"}
    assert {"torch", "threads", "cpu"} <= set(quick_results["machine"])
    assert quick_results["machine"]["threads"] == 2
    rows = quick_results["rows"]
    assert rows and all(set(row) >= ROW_KEYS for row in rows)
    assert {row["mode"] for row in rows} == {"fwd", "fwd+bwd"}
    assert {row["status"] for row in rows} <= {"ok", "oom"}
    assert {"dot", "scaled_dot", "general", "cosine", "additive", "location", "mha"} == {
        row["score"] for row in rows
    }
    assert {"attnzoo", "plain", "sdpa", "nn.MultiheadAttention", "keras.AdditiveAttention"} <= {
        row["impl"] for row in rows
    }
    for row in rows:
        if row["status"] == "ok":
            assert row["median_ms"] > 0, row["name"]


def test_quick_run_measures_peak_memory_of_the_target_rows(quick_results):
    measured = [row for row in quick_results["rows"] if row["peak_mib"] is not None]
    assert {row["impl"] for row in measured} == {"attnzoo", "plain", "keras.AdditiveAttention"}
    # Every measured call allocates (its inputs' gradients at least) and runs under the
    # worker's address-space cap of budget + 1 GiB: 0 would mean the baseline swallowed the
    # call, a figure above the cap a wrong unit.
    cap_mib = (quick_results["config"]["budget_gib"] + 1) * 1024
    for row in measured:
        assert 0 < row["peak_mib"] < cap_mib, row["name"]


@pytest.fixture(scope="module")
def overhead_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "attention_overhead.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--overhead", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_overhead_run_times_attention_own_cost(overhead_results):
    assert set(overhead_results) == {"machine", "config", "overhead", "targets"}
    assert len(overhead_results["machine"]["matmul_gflops_1_thread"]) == 2
    rows = overhead_results["overhead"]
    assert [row["length"] for row in rows] == [16]
    for row in rows:
        assert row["attnzoo_us"] > 0 and row["attnzoo_4d_us"] > 0 and row["sdpa_us"] > 0
        assert row["ratio"] == pytest.approx(row["attnzoo_us"] / row["sdpa_us"])
    for target in overhead_results["targets"]:
        worst = max(row[target["by_length_key"]] for row in rows)
        assert target["value"] == pytest.approx(worst)
        assert target["met"] == (worst <= 5.0)


def test_quick_run_records_oom_rows_instead_of_crashing(quick_results):
    oom = [row for row in quick_results["rows"] if row["status"] == "oom"]
    assert oom, "the quick budget should skip the long plain additive row"
    for row in oom:
        assert row["median_ms"] is None and row["peak_mib"] is None
        assert "estimated" in row["error"]


def test_quick_run_evaluates_every_target(quick_results):
    targets = quick_results["targets"]
    assert len(targets) >= 14
    for target in targets:
        assert set(target) >= TARGET_KEYS
        assert isinstance(target["met"], bool)
        assert isinstance(target["target"], str)


def test_worker_reports_an_allocation_failure_as_oom():
    # Plain additive at this size needs ~256 MiB for its tanh tensors; the worker may grow by
    # 16 MiB of address space, so the allocation fails inside the worker.
    case = {
        "score": "additive",
        "impl": "plain",
        "mode": "fwd",
        "batch": 4,
        "length": 256,
        "d": 16,
        "d_hidden": 128,
    }
    payload = json.dumps({"case": case, "limit_bytes": 16 << 20})
    result = _common.run_worker([sys.executable, str(SCRIPT), "--worker", payload], timeout=120)
    assert result["status"] == "oom", result
    assert result["peak_mib"] is None


def test_run_worker_maps_a_killed_worker_to_oom():
    command = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert _common.run_worker(command, timeout=60)["status"] == "oom"


def test_run_worker_reports_other_failures_as_errors():
    result = _common.run_worker([sys.executable, "-c", "raise ValueError('boom')"], timeout=60)
    assert result["status"] == "error"
    assert "boom" in result["error"]
