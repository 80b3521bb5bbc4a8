"""The RAM benchmark on the shared driver: the full budget declares every row of the issue
with >= 3 seeds; the smoke budget trains, evaluates (both errors), draws the glimpse figures,
times the two sensors and the batched step, and writes the JSON with the issue's targets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_ram.py"
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def _run(*args, timeout=600):
    r = subprocess.run(
        [sys.executable, BENCH, *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_full_budget_declares_every_row_with_three_seeds():
    listing = json.loads(_run("--budget", "full", "--list", timeout=120))
    rows = {e["id"]: e for e in listing["experiments"]}
    expected = {f"mnist-g{g}" for g in range(2, 8)} | {"translated-g4", "translated-g6"}
    expected |= {"translated-g8", "cluttered-g8", "speed"}
    expected |= {
        f"{k}-{m}" for k in ("mnist", "translated", "cluttered") for m in ("fc", "convnet")
    }
    assert set(rows) == expected
    assert all(e["seeds"] >= 3 for i, e in rows.items() if i != "speed")


@pytest.mark.slow
def test_smoke_budget(tmp_path):
    _run("--budget", "smoke", "--results", str(tmp_path))
    data = json.loads((tmp_path / "ram.json").read_text())
    assert all(r["status"] == "ok" for r in data["rows"]), data["rows"]
    metrics = data["summary"]["mnist-g6"]["metrics"]
    assert {"error", "error_mc", "train_minutes"} <= set(metrics)
    assert "error_mc" not in data["summary"]["mnist-fc"]["metrics"]
    speed = data["summary"]["speed"]["metrics"]
    assert speed["step_speedup"]["mean"] > 1
    assert {"retina_ms_grid", "retina_ms_index", "retina_ms_crop_then_pool"} <= set(speed)
    assert [t["id"] for t in data["targets"]] == [
        "mnist-g6",
        "translated-g6",
        "cluttered-g8",
        "translated-ram-minus-fc",
        "speed",
    ]
    figures = tmp_path / "runs" / "ram" / "mnist-g6" / "seed0" / "figures"
    assert (figures / "glimpses_wrong.png").exists()


@pytest.mark.slow
def test_dram_smoke_budget(tmp_path):
    dram = BENCH.parent / "bench_dram.py"
    r = subprocess.run(
        [sys.executable, dram, "--budget", "smoke", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "dram.json").read_text())
    assert {r["id"] for r in data["rows"] if r["status"] == "ok"} == {
        "multi-dram",
        "multi-convnet-multi",
    }
    metrics = data["summary"]["multi-dram"]["metrics"]
    assert {"error", "label_error", "pixels_read", "pixels_read_ratio"} <= set(metrics)
    # the retinas take in fewer values than the image's pixels; the convnet all of them
    assert metrics["pixels_read_ratio"]["mean"] < 1
    assert data["summary"]["multi-convnet-multi"]["metrics"]["pixels_read_ratio"]["mean"] == 1
    assert [t["id"] for t in data["targets"]] == ["multi-dram", "multi-dram", "addition-dram"]
    assert (
        tmp_path / "runs" / "dram" / "multi-dram" / "seed0" / "figures" / "glimpses.png"
    ).exists()
