"""The timing and peak-memory helpers of benchmarks/_common.py on their own (every bench's
smoke run with its checks, bench_attention's additive OOM estimate and cap among them, is
tests/test_repro.py's), and the summaries, verdicts and tables made from rows, against values
computed here. No timing is asserted: the machine's speed is not the code's."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
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


def _summary(per_id: dict[str, list[float]]) -> dict:
    """The summary of rows holding metric "x": per experiment id, its values by seed."""
    rows = [
        {"id": i, "seed": s, "status": "ok", "metrics": {"x": v}}
        for i, values in per_id.items()
        for s, v in enumerate(values)
    ]
    experiments = [_common.Experiment(i, "g", {}, seeds=len(v)) for i, v in per_id.items()]
    return _common.summary_of(rows, experiments)


def test_summarise_is_the_mean_sample_std_and_count_of_every_seed():
    """Skewed values, two seeds equal: the mean is not the median (4.0), and n counts seeds,
    not distinct values (3)."""
    values = [1.0, 2.0, 6.0, 6.0]
    stat = _common.summarise(values)
    assert stat["mean"] == pytest.approx((1 + 2 + 6 + 6) / 4) == 3.75
    assert stat["std"] == pytest.approx(statistics.stdev(values))
    assert (stat["n"], stat["min"], stat["max"], stat["values"]) == (4, 1.0, 6.0, values)


@pytest.mark.parametrize(
    ("values", "op", "threshold", "verdict"),
    [
        # mean 0.94: not met, though the best seed (0.99) meets it
        ([0.90, 0.93, 0.99], ">=", 0.95, "not met"),
        # mean 0.963 meets it, seed 2 (0.94) does not
        ([0.96, 0.99, 0.94], ">=", 0.95, "met on the mean, not by every seed"),
        # mean 1.0 exactly at the threshold: >= holds
        ([0.5, 1.5], ">=", 1.0, "met on the mean, not by every seed"),
        # mean 4.0 <= 4.5, seed 1 (5.0) above it
        ([3.0, 5.0, 4.0], "<=", 4.5, "met on the mean, not by every seed"),
        ([2.0, 3.0], ">=", 1.0, "met"),
        ([2.0, 3.0], "<", 1.0, "not met"),
    ],
)
def test_a_target_is_judged_on_the_mean_over_seeds(values, op, threshold, verdict):
    target = _common.Target("t", "e", "x", op, threshold)
    found = target.evaluate(_summary({"e": values}))
    assert found["verdict"] == verdict
    assert found["met"] is (verdict != "not met") and found["every_seed_met"] is (verdict == "met")
    assert found["mean"] == pytest.approx(statistics.mean(values))
    assert found["std"] == pytest.approx(statistics.stdev(values))  # the seeds' spread
    assert (found["n"], found["min"], found["max"]) == (len(values), min(values), max(values))
    missing = _common.Target("t", "e", "y", op, threshold).evaluate(_summary({"e": values}))
    assert (missing["verdict"], missing["met"], missing["n"]) == ("not measured", False, 0)


def test_extreme_is_the_largest_mean_not_the_best_seed():
    summary = _summary({"a": [0.0, 10.0], "b": [4.0, 5.0]})  # means 5.0 and 4.5
    assert _common.extreme(summary, ["a", "b"], "x") == 5.0
    assert _common.extreme(summary, ["a", "b"], "x", pick=min) == 4.5
    assert _common.extreme(summary, ["a", "b", "c"], "x") is None  # "c" has no rows


def test_a_derived_entry_has_as_many_seeds_as_its_most_paired_metric():
    entry = _common.derived_entry({"gain": [1.0, 2.0, 3.0], "ratio": [1.0, 1.0], "k": 7})
    assert entry["seeds"] == [0, 1, 2]
    metrics = entry["metrics"]
    assert (metrics["gain"]["n"], metrics["gain"]["mean"]) == (3, 2.0)
    assert (metrics["ratio"]["n"], metrics["k"]["n"], metrics["k"]["mean"]) == (2, 1, 7.0)


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0, 4.0, 10.0], [4.0, 1.0, 3.0, 2.0], [5.0]])
def test_spread_is_the_median_and_quartiles_interpolated_between_the_values(values):
    """numpy's default percentiles ("linear"): [1, 2, 3, 4, 10] has q1 2 and q3 4 (the
    "exclusive" method reads 1.5 and 7)."""
    found = _common.spread(values)
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    assert found == pytest.approx(
        {"median": median, "q1": q1, "q3": q3, "min": min(values), "max": max(values)}
    )


@pytest.mark.parametrize(
    ("declared", "asked", "runs"), [(1, 5, 1), (3, 5, 5), (3, 2, 2), (3, None, 3), (1, None, 1)]
)
def test_seeds_override_only_experiments_declared_with_several(declared, asked, runs):
    """`--seeds` sets the count of a trained comparison's seeds; an experiment of one seed (a
    timing, a run other rows build on) stays at one."""
    assert _common._seeds(_common.Experiment("e", "g", {}, seeds=declared), asked) == runs
