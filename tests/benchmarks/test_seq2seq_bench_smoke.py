"""Smoke runs of bench_seq2seq.py (tiny sizes): it runs end to end and writes the JSON the docs
generator reads. bench_seq2seq_throughput.py: test_micro_benches.py."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_seq2seq_quick(tmp_path):
    out = tmp_path / "seq2seq.json"
    r = subprocess.run(
        [
            sys.executable,
            BENCH / "bench_seq2seq.py",
            "--quick",
            "--only",
            "length",
            "--limit",
            "2",
            "--jobs",
            "2",
            "--out",
            out,
            "--runs",
            tmp_path / "runs",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["name"] for row in rows] == ["encdec", "bahdanau"]
    assert all(row["status"] == "ok" and row["by_length"] for row in rows)
    # equal parameter count: the no-attention model was widened towards Bahdanau's size
    assert abs(rows[0]["params"] - rows[1]["params"]) < 0.15 * rows[1]["params"]


def test_bench_seq2seq_matched_quick(tmp_path):
    """The matched experiment: the Transformer sized to Bahdanau's parameter count, each model
    given budget / (its calibrated seconds per step) steps; rows of other runs are kept."""
    out = tmp_path / "seq2seq.json"
    kept = {"experiment": "decoders", "task": "dates", "name": "encdec", "status": "ok"}
    out.write_text(json.dumps({"rows": [kept]}))
    r = subprocess.run(
        [
            sys.executable,
            BENCH / "bench_seq2seq.py",
            "--quick",
            "--only",
            "matched",
            "--task",
            "dates",
            "--jobs",
            "1",
            "--out",
            out,
            "--runs",
            tmp_path / "runs",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows[0] == kept
    bahdanau, transformer = rows[1:]
    assert [bahdanau["name"], transformer["name"]] == ["bahdanau", "transformer"]
    assert abs(transformer["params"] - bahdanau["params"]) < 0.03 * bahdanau["params"]
    for row in (bahdanau, transformer):
        seconds = row["calibration"]["sec_per_step"]
        assert row["status"] == "ok" and seconds > 0
        assert row["steps"] == max(1, int(row["budget_seconds"] / seconds))
        assert 0 <= row["eval_minutes"] < row["train_minutes"]
