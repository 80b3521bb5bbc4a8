"""Smoke run of the NTM benchmark (tiny sizes): NTM and LSTM rows with learning curves and
generalisation lengths, and the throughput row, in the JSON the docs generator reads."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_ntm_quick(tmp_path):
    out = tmp_path / "ntm.json"
    r = subprocess.run(
        [
            sys.executable,
            BENCH / "bench_ntm.py",
            "--quick",
            "--task",
            "bit_copy",
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
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"bit_copy-ntm", "bit_copy-lstm", "throughput"}
    for name in ("bit_copy-ntm", "bit_copy-lstm"):
        row = rows[name]
        assert row["status"] == "ok" and row["curve"] and "bit_errors_len80" in row
    assert abs(rows["bit_copy-ntm"]["params"] - rows["bit_copy-lstm"]["params"]) < 2000
    assert rows["throughput"]["speedup"] > 0
    assert list((tmp_path / "runs" / "ntm-bit_copy-ntm" / "figures").glob("memory_*.png"))
