"""The timing and peak-memory helpers of benchmarks/_common.py on their own (every bench's
smoke run with its checks, bench_attention's additive OOM estimate and cap among them, is
tests/test_repro.py's). No timing is asserted: the machine's speed is not the code's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import _common

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


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


def test_a_cell_names_its_own_n_and_the_row_its_failed_seeds():
    """The n column counted the ok seeds while a cell averaged only those that had its metric
    (docs/ram.md's multi-dram sampled error: 2 seeds under n = 3), and a failed seed vanished
    from every cell without a word."""
    rows = [
        {"id": "e", "seed": 0, "status": "ok", "metrics": {"err": 1.0}},
        {"id": "e", "seed": 1, "status": "ok", "metrics": {"err": 3.0, "mc": 2.0}},
        {"id": "e", "seed": 2, "status": "error", "metrics": {}},
    ]
    summary = _common.summary_of(rows, [_common.Experiment("e", "g", {}, seeds=3)])
    table = _common.Table("t", [("err", "err", 1), ("mc", "mc", 1)], groups=["g"])
    text = _common.render_table(table, {"summary": summary, "rows": rows})
    assert text.splitlines()[2:] == ["| 2.0 ± 1.4 | 2.0 (n=1) | 2 (1 failed) |"]


def test_a_non_finite_metric_is_summarised_not_a_crash():
    """statistics.stdev raised on a NaN or inf, and the driver lost every row not yet saved."""
    for bad in (float("nan"), float("inf")):
        stat = _common.summarise([1.0, bad, 2.0])
        assert stat["n"] == 3 and stat["std"] != stat["std"]  # NaN
