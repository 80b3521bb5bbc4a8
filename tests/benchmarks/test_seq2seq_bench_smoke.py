"""Smoke run of the seq2seq throughput benchmark (tiny sizes). bench_seq2seq.py itself: see
test_trained_benches.py and `attnzoo repro seq2seq --budget smoke`."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_throughput_quick(tmp_path):
    out = tmp_path / "t.json"
    r = subprocess.run(
        [sys.executable, BENCH / "bench_seq2seq_throughput.py", "--quick", "--out", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["rows"][0]["attnzoo_tokens_per_s"] > 0 and "met" in data["targets"][0]
