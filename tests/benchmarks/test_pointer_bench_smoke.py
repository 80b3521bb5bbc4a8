"""Smoke run of the Pointer Network benchmark (tiny sizes): it trains, reuses a finished run,
and writes the JSON the docs generator reads."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"


def _run(tmp_path, *only):
    out = tmp_path / "pointer.json"
    r = subprocess.run(
        [
            sys.executable,
            BENCH / "bench_pointer.py",
            "--quick",
            "--jobs",
            "2",
            "--out",
            out,
            "--runs",
            tmp_path / "runs",
            "--only",
            *only,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return {row["name"]: row for row in json.loads(out.read_text())["rows"]}


def test_bench_pointer_quick(tmp_path):
    rows = _run(tmp_path, "tsp-n5", "convex_hull-n10")
    assert all(row["status"] == "ok" and not row["reused_run"] for row in rows.values())
    tsp = rows["tsp-n5"]
    assert tsp["greedy"]["tour_length"] >= tsp["greedy"]["optimal"] - 1e-9
    assert {"accuracy", "fail_rate"} <= set(rows["convex_hull-n10"]["beam5"])
    assert (tmp_path / "runs" / "pointer-tsp-n5" / "figures" / "pointer.png").exists()
    again = _run(tmp_path, "tsp-n5")  # finished with the same config: scored, not retrained
    assert again["tsp-n5"]["reused_run"] and again["tsp-n5"]["greedy"] == tsp["greedy"]
    assert "convex_hull-n10" in again  # rows not re-run are kept
