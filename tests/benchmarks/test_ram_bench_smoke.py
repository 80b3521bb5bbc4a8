"""The RAM benchmark on the shared driver: the full budget declares every row of the issue
with >= 3 seeds. The smoke budget of both RAM and DRAM benches runs in tests/test_repro.py
(`attnzoo repro ram`), whose checks `_ram` and `_dram` look at their JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
    ablations = {i for i, e in rows.items() if e["group"].endswith("-ablations")}
    assert ablations and set(rows) == expected | ablations  # the rows, then ablations
    for i in ablations:  # each a declared row with sets added
        base = rows[i.rsplit("-", 1)[0]]["params"]
        assert rows[i]["params"]["sets"][: len(base["sets"])] == base["sets"]
        assert len(rows[i]["params"]["sets"]) > len(base["sets"])
    assert all(e["seeds"] >= 3 for i, e in rows.items() if i != "speed")
