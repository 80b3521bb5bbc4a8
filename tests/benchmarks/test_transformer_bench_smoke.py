"""Smoke run of benchmarks/bench_transformer.py --quick: it runs end to end and writes the
JSON the docs generator reads, with rows and targets that agree with each other (no timing is
asserted: the machine's speed is not the code's)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bench_transformer_quick(tmp_path):
    out = tmp_path / "transformer.json"
    r = subprocess.run(
        [sys.executable, BENCH / "bench_transformer.py", "--quick", "--threads", "1", "--out", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"machine", "config", "rows", "targets"} <= set(data)
    config = data["config"]
    assert data["machine"]["quick"] is True and data["machine"]["threads"] == 1
    training = [row for row in data["rows"] if row["kind"] == "training"]
    decoding = [row for row in data["rows"] if row["kind"] == "decoding"]
    assert [row["dropout"] for row in training] == [0.0, 0.1]
    tokens = config["batch"] * config["length"]
    for row in training:
        assert {k: row[k] for k in config} == config
        # attnzoo loaded from nn.Transformer's weights computes the same loss
        assert row["loss_difference"] < 1e-4
        names = [k[: -len("_ms")] for k in row if k.endswith("_ms")]
        assert {"attnzoo", "torch"} <= set(names)
        for name in names:
            assert row[f"{name}_tokens_per_s"] == pytest.approx(tokens / (row[f"{name}_ms"] / 1e3))
    assert "attnzoo_bf16_ms" in training[0] and "attnzoo_bf16_ms" not in training[1]
    assert [row["batch"] for row in decoding] == [1, 32]
    assert all(row["identical_tokens"] for row in decoding)
    for row in decoding:
        assert row["speedup"] == pytest.approx(row["uncached_ms"] / row["cached_ms"])
    fp32 = training[0]
    values = {
        "training tokens/s vs nn.Transformer (fp32)": fp32["torch_ms"] / fp32["attnzoo_ms"],
        "bf16 autocast training tokens/s vs nn.Transformer fp32": fp32["torch_ms"]
        / fp32["attnzoo_bf16_ms"],
        "cached vs uncached greedy decoding, batch 1": decoding[0]["speedup"],
        "cached vs uncached greedy decoding, batch 32": decoding[1]["speedup"],
    }
    if "x_transformers_ms" in fp32:
        values["training tokens/s vs x-transformers (fp32)"] = (
            fp32["x_transformers_ms"] / fp32["attnzoo_ms"]
        )
    targets = {t["name"]: t for t in data["targets"]}
    assert len(targets) == len(data["targets"]) == 5
    for name, value in values.items():
        t = targets[name]
        assert t["value"] == pytest.approx(value)
        wanted = float(t["target"].removeprefix(">= ").removesuffix("x"))
        assert t["met"] == (t["value"] >= wanted)
