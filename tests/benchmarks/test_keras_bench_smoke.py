"""Smoke run of benchmarks/bench_keras.py --quick: it runs end to end and writes the JSON the
docs generator reads, with rows and targets that agree with each other (no timing is
asserted: the machine's speed is not the code's)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Not imported here: keras picks its backend at its first import, and the script sets
# KERAS_BACKEND=torch in its own processes.
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras 3 is not installed: pip install 'attnzoo[keras]'", allow_module_level=True)

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_keras_quick(tmp_path):
    out = tmp_path / "keras.json"
    done = subprocess.run(
        [sys.executable, BENCH / "bench_keras.py", "--quick", "--out", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"machine", "config", "rows", "targets"} <= set(data)
    assert data["machine"]["quick"] is True and data["machine"]["keras_backend"] == "torch"
    assert data["config"]["threads"] == 1
    rows = data["rows"]
    lengths = data["config"]["lengths"]
    assert [(r["layer"], r["length"]) for r in rows] == [
        (layer, n) for n in lengths for layer in ("AdditiveAttention", "MultiHeadAttention")
    ]
    for row in rows:
        assert row["status"] == "ok"
        assert row["max_abs_diff"] < 1e-4  # the two sides compute the same function
        assert row["time_ratio"] == pytest.approx(row["attnzoo_ms"] / row["keras_ms"])
        assert len(row["attnzoo_times_ms"]) == len(row["keras_times_ms"]) == row["repeats"]
    target = [r for r in rows if r["length"] == data["config"]["target_length"]]
    additive = target[0]  # its peak memory measured in workers (the quick run's only ones)
    assert additive["attnzoo_peak_mib"] is not None and additive["keras_peak_mib"] > 0
    assert additive["peak_ratio"] == pytest.approx(
        additive["attnzoo_peak_mib"] / additive["keras_peak_mib"]
    )
    additive, mha = target
    values = [additive["time_ratio"], additive["peak_ratio"], mha["time_ratio"]]
    assert [t["target"] for t in data["targets"]] == ["<= 0.5", "<= 0.1", "<= 1.0"]
    for t, value in zip(data["targets"], values, strict=True):
        assert set(t) == {"name", "value", "target", "met"}
        assert t["value"] == pytest.approx(value)
        assert t["met"] == (t["value"] <= float(t["target"].removeprefix("<= ")))
