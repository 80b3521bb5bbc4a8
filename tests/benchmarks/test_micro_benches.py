"""The micro-benchmarks on the driver: bench_attention's additive smoke rows (the OOM estimate
and cap; every bench's smoke run with its correctness checks is tests/test_repro.py's), and the
timing and peak-memory helpers of benchmarks/_common.py on their own. No timing is asserted:
the machine's speed is not the code's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import _common

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
HAS_KERAS = importlib.util.find_spec("keras") is not None


def smoke(script: str, tmp_path: Path, *only: str) -> dict:
    """`script --budget smoke` (only the experiments `only`, when given) into tmp_path."""
    command = [sys.executable, BENCH / script, "--budget", "smoke", "--results", tmp_path]
    done = subprocess.run(
        [*command, *(["--only", *only] if only else [])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name = json.loads(subprocess.check_output([*command[:2], "--list"]))["bench"]
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert {"bench", "budget", "machine", "method", "rows", "summary", "targets"} <= set(data)
    assert data["budget"] == "smoke" and all(r["status"] == "ok" for r in data["rows"])
    assert '"/' not in json.dumps(data)  # no absolute paths
    for target in data["targets"]:
        assert target["verdict"] in {"met", "not met", "not measured"}
    return data


def impls(data: dict, experiment_id: str) -> dict:
    return next(r for r in data["rows"] if r["id"] == experiment_id)["metrics"]["impls"]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_KERAS, reason="Keras 3 is not installed: pip install 'attnzoo[keras]'")
def test_attention_additive_smoke(tmp_path):
    data = smoke("bench_attention.py", tmp_path, "additive-*")
    ids = {r["id"] for r in data["rows"]}
    assert ids == {e for e in data["summary"] if e.startswith("additive-")}
    # the long plain additive does not fit the smoke budget: "oom" by its estimate
    long = impls(data, "additive-h32-fwd+bwd-L256")
    assert long["plain"]["status"] == "oom" and "estimated" in long["plain"]["error"]
    target = impls(data, "additive-h32-fwd+bwd-L64")
    cap_mib = (data["rows"][0]["params"]["budget_gib"] + 1) * 1024
    for name, impl in target.items():
        assert len(impl["times_ms"]) == data["rows"][0]["params"]["repeats"]
        assert 0 < impl["peak_mib"] < cap_mib, name  # measured in a child, under the cap
    assert target["plain"]["ratio"]["min"] <= target["plain"]["ratio"]["median"]
    measured = {t["key"] for t in data["targets"] if t["id"] == "additive" and t["n"] == 1}
    assert {"time_over_plain", "peak_over_plain", "peak_over_keras", "gtanh_per_s"} <= measured
    assert data["method"]["peak_mib"].startswith("VmHWM")


def test_peak_memory_child_reports_an_allocation_failure_as_oom():
    # Plain additive at this size needs ~256 MiB for its tanh tensors; the child may grow by
    # 16 MiB of address space, so the allocation fails inside it.
    spec = dict(score="additive", impl="plain", mode="fwd", batch=4, length=256, d=16)
    spec |= dict(d_hidden=128, heads=None)
    bench = _common.Bench("attention", str(BENCH / "bench_attention.py"), list, dict)
    result = _common.peak_memory(bench, spec, {**spec, "length": 8}, limit_bytes=16 << 20)
    assert result["status"] == "oom", result
    assert "peak_mib" not in result


def test_time_steps_interleaves_and_maps_allocation_failures():
    def failing():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    x = torch.randn(256, 256)
    builders = {"a": lambda: lambda: x @ x, "b": lambda: lambda: x + x, "c": failing}
    out = _common.time_steps(builders, repeats=3, warmup=1, reference={"b": "a", "c": "a"})
    assert list(out) == ["a", "b", "c"]
    assert out["c"]["status"] == "oom"
    assert len(out["a"]["times_ms"]) == 3 and "ratio" not in out["a"]
    ratios = [a / b for a, b in zip(out["a"]["times_ms"], out["b"]["times_ms"], strict=True)]
    assert out["b"]["ratio"]["median"] == pytest.approx(sorted(ratios)[1], rel=1e-2)


def test_render_table_gives_a_row_per_item_and_spreads():
    spread = {"median": 2.0, "q1": 1.5, "q3": 2.5, "min": 1.0, "max": 3.0}
    metrics = {"impls": {"ours": {"ms": spread}, "peer": {"status": "oom"}}}
    rows = [{"id": "e", "seed": 0, "status": "ok", "metrics": metrics}]
    summary = _common.summary_of(rows, [_common.Experiment("e", "g", {"n": 4})])
    columns = [("n", "params.n"), ("impl", "each"), ("ms", "each.ms", 1, "iqr")]
    columns.append(("range", "each.ms", 0, "range"))
    table = _common.Table("t", columns, groups=["g"], each="impls")
    text = _common.render_table(table, {"summary": summary, "rows": rows})
    assert text.splitlines()[2:] == [
        "| 4 | ours | 2.0 (1.5-2.5) | 2 (1-3) | 1 |",
        "| 4 | peer | OOM | OOM | 1 |",
    ]


def test_render_table_shows_a_string_metric_only_where_every_seed_agrees():
    rows = [
        {"id": i, "seed": s, "status": "ok", "metrics": {"acc": 1.0 + s, "init": init}}
        for i, inits in (("same", ("a", "a")), ("differ", ("a", "b")))
        for s, init in enumerate(inits)
    ]
    experiments = [_common.Experiment(i, "g", {}) for i in ("same", "differ")]
    summary = _common.summary_of(rows, experiments)
    table = _common.Table("t", [("id", "id"), ("init", "init"), ("acc", "acc", 1)], groups=["g"])
    text = _common.render_table(table, {"summary": summary, "rows": rows})
    assert text.splitlines()[2:] == [
        "| same | a | 1.5 ± 0.7 | 2 |",
        "| differ | - | 1.5 ± 0.7 | 2 |",
    ]
