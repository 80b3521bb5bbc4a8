"""Smoke run of benchmarks/bench_transformer.py --quick: it runs end to end in well under a
minute and writes the JSON the docs generator reads."""

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_transformer_quick(tmp_path):
    out = tmp_path / "transformer.json"
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, BENCH / "bench_transformer.py", "--quick", "--threads", "1", "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert time.perf_counter() - start < 60
    data = json.loads(out.read_text())
    assert {"machine", "config", "rows", "targets"} <= set(data)
    training = [row for row in data["rows"] if row["kind"] == "training"]
    decoding = [row for row in data["rows"] if row["kind"] == "decoding"]
    assert [row["dropout"] for row in training] == [0.0, 0.1]
    assert training[0]["attnzoo_tokens_per_s"] > 0 and training[0]["torch_tokens_per_s"] > 0
    assert training[0]["attnzoo_bf16_tokens_per_s"] > 0
    assert [row["batch"] for row in decoding] == [1, 32]
    assert all(row["identical_tokens"] for row in decoding)
    assert len(data["targets"]) == 5
    for t in data["targets"]:
        assert {"name", "value", "target", "met"} <= set(t)
