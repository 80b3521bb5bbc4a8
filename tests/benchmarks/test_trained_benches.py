"""The trained benchmarks' declarations and the worker helper they share
(`_common.train_worker`): every bench a docs page lists has enough seeds on every trained
comparison; the headline experiments (bench_ntm, bench_pointer, bench_seq2seq) keep the ids and
overrides their run dirs were trained with, a matched comparison is one unit, and a finished
run is adopted, not trained again."""

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import _common
import bench_ntm
import bench_pointer
import bench_seq2seq
import bench_show_attend_tell
import report

BENCHES = (bench_ntm, bench_pointer, bench_seq2seq, bench_show_attend_tell)
EVERY_BENCH = {report.bench_module(b) for b in set().union(*report.PAGES.values())}
HEADLINE = {  # (bench, id) -> overrides: the CLI runs adopted as they are
    ("ntm", "bit_copy-ntm"): [
        "task.test_lengths=10,20,30,40,50,60,80",
        "train.eval_every=250",
        "task.n_test_per_length=256",
    ],
    ("pointer", "convex_hull-n10"): ["train.steps=12000", "task.n_test=5000"],
    ("pointer", "tsp-n5"): ["task.n_min=5", "task.n_max=5", "train.steps=3000", "task.n_test=2000"],
}


def test_every_bench_script_is_behind_a_page_and_named_by_its_file():
    """`attnzoo repro` and `make bench` find a bench's script by its name (bench_NAME.py)
    without importing the scripts: a script under another name, or behind no page, is lost."""
    scripts = {p.stem for p in report.ROOT.joinpath("benchmarks").glob("bench_*.py")}
    assert {f"bench_{m.BENCH.name}" for m in EVERY_BENCH} == scripts


@pytest.mark.parametrize("module", sorted(EVERY_BENCH, key=lambda m: m.BENCH.name))
@pytest.mark.parametrize("budget", _common.BUDGETS)
def test_experiments_are_unique_and_seeded(module, budget):
    found = module.BENCH.experiments(budget)
    assert found and len({e.id for e in found}) == len(found)
    # a row other rows start from (its seed 0: `init_from`) or build on (`needs`: a classifier
    # that scores them) is a step of theirs, not a result; a row with no model trains nothing
    steps = {e.params.get("init_from") for e in found} | {n for e in found for n in e.needs}
    for e in found:
        json.dumps(e.params)  # params go to the worker and the JSON as they are
        trained = "sets" in e.params and "model" in e.params
        if budget == "full" and trained and e.id not in steps:
            assert e.seeds >= (5 if e.minutes <= 5 else 3), e.id
            assert e.minutes > 0, e.id


def test_headline_experiments_are_the_adopted_runs():
    found = {(m.BENCH.name, e.id): e for m in BENCHES for e in m.BENCH.experiments("full")}
    for key, sets in HEADLINE.items():
        experiment = found[key]
        assert experiment.params["sets"] == sets, key
        assert experiment.seeds == (5 if experiment.minutes <= 5 else 3), key  # issue 11's rule
    assert found["ntm", "bit_copy-ntm"].params["model"] == "ntm"
    assert found["pointer", "tsp-n5"].params["task"] == "tsp"


def test_matched_sides_form_one_unit_with_one_budget():
    matched = [e for e in bench_seq2seq.experiments("full") if e.group == "matched"]
    units: dict[str, list] = {}
    for e in matched:
        units.setdefault(e.unit, []).append(e)
    assert len(units) == 3
    for sides in units.values():
        assert sorted(e.params["model"] for e in sides) == ["bahdanau", "transformer"]
        assert len({e.params["budget_minutes"] for e in sides}) == 1
        assert len({e.seeds for e in sides}) == 1


def test_tables_and_targets_name_declared_experiments():
    for module in BENCHES:
        bench = module.BENCH
        ids = {e.id for e in bench.experiments("full")}
        derived = set(bench.derive(_common.summary_of([], bench.experiments("full"))))
        for table in bench.tables:
            assert set(table.ids) <= ids, table.name
        for target in bench.targets:
            assert target.id in ids | derived | {"copy-ratio", "matched-kjv2web"}, target.name


def test_train_worker_trains_once_then_adopts_the_run(tmp_path):
    sets = ["train.steps=2", "train.batch_size=2", "task.test_lengths=3"]
    sets += ["task.n_test_per_length=2", "train.checkpoint_every=2", "model.controller_size=8"]
    ctx = _common.Context(id="x", seed=1, budget="smoke", run_dir=tmp_path / "seed1")
    first, config, _, _ = _common.train_worker(sets, "ntm", "bit_copy", ctx, curve="bit_errors")
    assert not first["reused_run"] and config["train"]["seed"] == 1
    assert first["steps_run"] == 2 and first["train_minutes"] > 0 and first["curve"]
    assert list((tmp_path / "seed1" / "figures").glob("*.png"))
    again, *_ = _common.train_worker(sets, "ntm", "bit_copy", ctx, curve="bit_errors")
    assert again["reused_run"] and {**again, "reused_run": False} == first
    ctx.retrain = True  # its row was made on the task's earlier data: so was this run
    retrained, *_ = _common.train_worker(sets, "ntm", "bit_copy", ctx, curve="bit_errors")
    assert not retrained["reused_run"] and retrained["steps_run"] == 2


def test_train_worker_trains_again_when_the_run_it_started_from_was_trained_again(tmp_path):
    def train(run, sets, model, task):
        ctx = _common.Context(id=run, seed=0, budget="smoke", run_dir=tmp_path / run / "seed0")
        return _common.train_worker(
            ["train.steps=1", "train.batch_size=2", *sets], model, task, ctx
        )[0]

    encoder = ["task.n_test=4"]
    train("encoder", encoder, "sat-encoder", "mnist")
    sets = ["task.n_test=2", "task.n_valid=8", "model.hidden=8", "model.attn_hidden=8"]
    sets.append(f"train.init_from={tmp_path / 'encoder' / 'seed0'}")
    assert not train("captions", sets, "show-attend-tell", "digit_captions")["reused_run"]
    assert train("captions", sets, "show-attend-tell", "digit_captions")["reused_run"]
    time.sleep(0.01)  # a later mtime for the encoder's new final.json
    train("encoder", ["task.n_test=5"], "sat-encoder", "mnist")  # another config: trained again
    assert not train("captions", sets, "show-attend-tell", "digit_captions")["reused_run"]


def test_matched_derive_pairs_the_sides_by_seed():
    rows = []
    for seed, (bahdanau, transformer) in enumerate([(50.0, 52.0), (51.0, 50.0), (49.0, 0.0)]):
        for model, bleu in (("bahdanau", bahdanau), ("transformer", transformer)):
            metrics = {"bleu": bleu, "train_minutes": 10.0 + seed}
            status = "ok" if (model, seed) != ("transformer", 2) else "error"
            rows.append(
                {
                    "id": f"matched-kjv2web-{model}",
                    "seed": seed,
                    "status": status,
                    "metrics": metrics,
                }
            )
    experiments = bench_seq2seq.experiments("full")
    derived = bench_seq2seq.derive(_common.summary_of(rows, experiments))["matched-kjv2web"]
    assert derived == {"gain": [2.0, -1.0], "train_minutes_ratio": [1.0, 1.0]}
    entry = _common.derived_entry(derived)
    assert entry["metrics"]["gain"]["mean"] == 0.5 and len(entry["seeds"]) == 2


def test_train_worker_resumes_an_interrupted_run_and_leaves_a_live_one(tmp_path):
    from attnzoo import runs
    from attnzoo.train.checkpoint import saved_timing

    sets = ["train.steps=2", "train.batch_size=2", "task.test_lengths=3"]
    sets += ["task.n_test_per_length=2", "train.checkpoint_every=1", "model.controller_size=8"]
    ctx = _common.Context(id="x", seed=0, budget="smoke", run_dir=tmp_path / "seed0")
    first, *_ = _common.train_worker(sets, "ntm", "bit_copy", ctx)
    for name in ("final.json", "timing.json"):  # interrupted before its end
        (tmp_path / "seed0" / name).unlink()
    held = runs.check_out(tmp_path / "seed0", resume=True)  # as a process training in it does
    with held, pytest.raises(BlockingIOError, match="no other process is training in"):
        _common.train_worker(sets, "ntm", "bit_copy", ctx)
    (last,) = sorted((tmp_path / "seed0" / "checkpoints").glob("step_*"))[-1:]
    recorded = saved_timing(last)  # what the first process had trained when it saved
    again, *_ = _common.train_worker(sets, "ntm", "bit_copy", ctx)  # at once: nothing holds it
    assert not again["reused_run"]  # resumed at its last step: its checkpoint's time counts
    assert again["steps_run"] == recorded["steps_run"] == 2  # not this process's 0 steps
    assert again["train_minutes"] >= recorded["train_seconds"] / 60 > 0
    assert again["bit_errors"] == first["bit_errors"]


def test_a_row_goes_stale_when_a_default_changes(monkeypatch):
    """A trained row carries the defaults' stamp; once a default of its model or task changes,
    the row is no longer current though its params are the same."""
    from attnzoo import runs

    (experiment,) = [e for e in bench_show_attend_tell.experiments("full") if e.id == "hard"]
    stamp = _common.defaults_stamp("show-attend-tell-hard", "digit_captions")
    row = {"status": "ok", "budget": "full", "params": json.loads(json.dumps(experiment.params))}
    row["metrics"] = {"defaults": stamp}
    assert _common._current(row, experiment, "full")
    assert _common._current({**row, "metrics": {}}, experiment, "full")  # an unstamped row
    real = runs.default_config

    def changed(model, task):
        config = real(model, task)
        config["model"]["expectation_rate"] = 0.25
        return config

    assert _common._stale({**row, "status": "failed"}, experiment, "full") == "status failed"
    moved = {**row, "params": {**row["params"], "sets": []}}
    assert _common._stale(moved, experiment, "full") == "its params changed"
    monkeypatch.setattr(runs, "default_config", changed)
    _common.defaults_stamp.cache_clear()
    try:
        assert not _common._current(row, experiment, "full")
        assert _common._stale(row, experiment, "full") == (
            f"the defaults changed since its stamp {stamp}"
        )
    finally:
        monkeypatch.undo()
        _common.defaults_stamp.cache_clear()
    assert _common._current(row, experiment, "full")


def test_a_row_goes_stale_when_its_tasks_data_changes(monkeypatch):
    """The kjv2web split fix changed the task's data and no config value: its rows kept their
    params and stamps, so `attnzoo repro` would have left them as they were. A row records its
    task's data version (`TaskSpec.data`); one of another version (0 before rows recorded it)
    is stale for the driver and is marked in the docs (`stale_rows`), whether its task comes
    from its params or from its stamp."""
    import dataclasses

    from attnzoo.tasks import registry

    (experiment,) = [e for e in bench_show_attend_tell.experiments("full") if e.id == "hard"]
    stamp = _common.defaults_stamp("show-attend-tell-hard", "digit_captions")
    row = {"id": "hard", "seed": 0, "status": "ok", "budget": "full"}
    row["params"] = json.loads(json.dumps(experiment.params))
    row["metrics"] = {"defaults": stamp, "data": registry.TASKS["digit_captions"].data}
    data = {"budget": "full", "rows": [row]}
    assert _common._current(row, experiment, "full")
    assert not _common.stale_rows(data, [experiment])
    bumped = dataclasses.replace(registry.TASKS["digit_captions"], data=7)
    monkeypatch.setitem(registry.TASKS, "digit_captions", bumped)
    assert _common._stale(row, experiment, "full") == _common.DATA_CHANGED
    assert _common.stale_rows(data, [experiment]) == {"hard": {0: _common.DATA_CHANGED}}
    by_params = {**row, "params": {**row["params"], "task": "digit_captions"}, "metrics": {}}
    assert _common._data_changed(by_params)  # no stamp, no recorded version: 0, not 7


def test_a_table_marks_the_rows_whose_params_the_bench_no_longer_declares(monkeypatch):
    """`stale_rows` finds the ok rows whose params changed, and the table marks their n and
    says why under it; a current row, and one whose defaults' stamp changed, are unmarked."""
    (experiment,) = [e for e in bench_show_attend_tell.experiments("full") if e.id == "hard"]
    params = json.loads(json.dumps(experiment.params))
    stamp = _common.defaults_stamp("show-attend-tell-hard", "digit_captions")
    rows = [
        {"id": "hard", "seed": s, "status": "ok", "budget": "full", "params": p}
        | {"metrics": {"defaults": stamp, "bleu4": 10.0 + s}}
        for s, p in enumerate([params, {**params, "sets": []}])
    ]
    data = {"budget": "full", "rows": rows}
    stale = _common.stale_rows(data, [experiment])
    assert stale == {"hard": {1: "its params changed"}}
    assert _common.stale_rows({**data, "rows": rows[:1]}, [experiment]) == {}
    data["summary"] = _common.summary_of(rows, [experiment])
    table = _common.Table("t", [("id", "id"), ("BLEU", "bleu4", 1)], ids=["hard"])
    lines = _common.render_table(table, data, stale).splitlines()
    mark = _common.STALE_MARK
    assert lines[2] == f"| hard | 10.5 ± 0.7 | 2{mark} |"
    assert lines[-1].startswith(mark) and lines[-1].endswith("hard (its params changed).")
    assert mark not in _common.render_table(table, data)
    monkeypatch.setitem(rows[0]["metrics"], "defaults", stamp[:-1] + "x")
    assert _common._stale(rows[0], experiment, "full").startswith("the defaults changed")
    assert _common.stale_rows(data, [experiment]) == {"hard": {1: "its params changed"}}


def _with_a_changed_row(folder, bench: str, id: str) -> None:
    """The RAM page's committed results copied into `folder`, the rows of `id` (in `bench`'s
    JSON) with params the bench no longer declares (a learning rate added)."""
    import report

    for name in report.PAGES["ram"]:
        (folder / f"{name}.json").write_bytes((report.RESULTS / f"{name}.json").read_bytes())
    data = json.loads((folder / f"{bench}.json").read_text())
    for row in data["rows"]:
        if row["id"] == id:
            row["params"] = {**row["params"], "sets": [*row["params"]["sets"], "train.lr=1"]}
    (folder / f"{bench}.json").write_text(json.dumps(data))


def test_a_table_a_template_writes_marks_the_rows_whose_params_changed(tmp_path):
    """The tables a docs template writes itself (here DRAM's, on the RAM page) mark the n of an
    experiment with stale rows and name it under the table, as `table()` does; the committed
    results render without a mark there."""
    import report

    mark = _common.STALE_MARK
    before = report.Page("ram", report.RESULTS).render()
    assert mark not in before
    line = next(x for x in before.splitlines() if x.startswith("| addition-dram |"))
    data = json.loads((report.RESULTS / "dram.json").read_text())
    n = len(data["summary"]["addition-dram"]["seeds"])
    _with_a_changed_row(tmp_path, "dram", "addition-dram")
    lines = report.Page("ram", tmp_path).render().splitlines()
    # the target lines over those rows say so too (report.Page.target)
    verdicts = [x for x in lines if f"{mark} over stale rows of addition-dram" in x]
    assert verdicts and all(x.startswith("| addition") for x in verdicts)
    assert [x for x in lines if mark in x and x not in verdicts] == [
        line.removesuffix(f" {n} |") + f" {n}{mark} |",
        f"{mark} Rows made under other params than the bench now declares for their experiment, "
        "on a run trained again since, or on data their task no longer makes, shown as they ran "
        "(the driver would re-run them): addition-dram (its params changed).",
    ]


def test_a_verdict_over_a_paired_difference_is_marked_when_its_rows_are_stale(tmp_path):
    """`translated 6 glimpses: error below the FC baseline's` reads the derived entry
    translated-ram-minus-fc, paired by seed from translated-g6 and translated-fc: stale rows
    of translated-fc marked its table but not that verdict. The entry records its sources,
    and the verdict is marked; the verdicts over other rows are not."""
    import report

    mark = _common.STALE_MARK
    data = json.loads((report.RESULTS / "ram.json").read_text())
    assert data["summary"]["translated-ram-minus-fc"]["sources"]["error"] == [
        "translated-g6",
        "translated-fc",
    ]
    _with_a_changed_row(tmp_path, "ram", "translated-fc")
    lines = report.Page("ram", tmp_path).render().splitlines()
    verdicts = [x for x in lines if f"{mark} over stale rows of translated-fc" in x]
    assert len(verdicts) == 1 and verdicts[0].startswith("| translated 6 glimpses: error below")


def test_the_captions_sampling_error_is_the_binomial_one_of_each_rows_mean():
    """`_sampling`: one run's standard error of exact match, sqrt(p (1 - p) / n) in points at
    each row's mean, and the fewest test images that bring the soft row's to half a point."""
    means = {"soft": (86.0, 1000), "soft-lambda0-pretrained": (95.2, 1000), "hard": (9.1, 400)}
    summary = {
        id: {"metrics": {"exact_match_pct": {"mean": p}, "n_test": {"mean": n}}}
        for id, (p, n) in means.items()
    }
    summary["compare"] = {"metrics": {"hard_minus_soft": {"mean": -77.0}}}  # no exact match
    found = bench_show_attend_tell._sampling(summary)["sampling"]
    se = {id: 100 * (p / 100 * (1 - p / 100) / n) ** 0.5 for id, (p, n) in means.items()}
    assert found["se_soft"] == pytest.approx(se["soft"])
    assert found["se_pretrained"] == pytest.approx(se["soft-lambda0-pretrained"])
    assert (found["se_min"], found["se_max"]) == pytest.approx((min(se.values()), max(se.values())))
    n = found["n_for_half_point"]
    assert 100 * (0.86 * 0.14 / n) ** 0.5 <= 0.5 < 100 * (0.86 * 0.14 / (n - 1)) ** 0.5
    assert bench_show_attend_tell._sampling({"hard": summary["hard"]}) == {}  # no soft row


def test_dram_loss_falls_at_the_first_window_a_tenth_below_the_start():
    """`bench_dram.loss_falls_at`: the step that ends the first window of logged losses whose
    mean is 10% below the mean of the first ten; None for a flat or too short curve."""
    import bench_dram

    def curve(losses):
        return [{"step": 100 * (i + 1), "loss": x} for i, x in enumerate(losses)]

    flat = [3.0] * 30
    assert bench_dram.loss_falls_at(curve(flat)) is None
    assert bench_dram.loss_falls_at(curve(flat[:9])) is None
    # the mean of a window of five reaches 2.7 (a tenth below 3.0) once it holds four 2.6s:
    # (3.0 + 4 * 2.6) / 5 = 2.68
    falls = bench_dram.loss_falls_at(curve(flat[:20] + [2.6] * 10))
    assert falls == 100 * 24


def test_dram_every_band_counts_the_images_whose_glimpses_visit_each_digits_band():
    """`bench_dram.every_band`: a glimpse's centre (x + 1) * canvas / 2 falls in band
    floor(centre / (canvas / digits)), the edges clamped in; a model without glimpses has none."""
    from types import SimpleNamespace

    import torch

    import bench_dram

    x = torch.tensor([[-0.9, 0.5], [0.2, 0.9], [-0.01, 0.0], [-1.0, 1.0]])  # (images, steps)

    class Glimpsing:
        glimpse = None

        def __call__(self, images, sample):
            assert not sample and len(images) == len(x)
            return SimpleNamespace(locations=torch.stack([x, torch.zeros_like(x)], -1))

    task = SimpleNamespace(
        config=SimpleNamespace(digits=2, canvas=64),
        held_out=lambda split: (torch.zeros(len(x), 1, 64, 64), None),
    )
    # only the second image keeps to one band (the right): -0.01 is column 31.68, 0.0 is 32
    assert bench_dram.every_band(task, Glimpsing()) == {"every_band": 75.0, "every_band_n": 4}
    assert bench_dram.every_band(task, object()) == {}


@pytest.mark.parametrize(
    "bench", sorted(EVERY_BENCH, key=lambda m: m.BENCH.name), ids=lambda m: m.BENCH.name
)
def test_a_paired_verdicts_sources_are_experiments_of_its_bench(bench):
    """A verdict over a derived entry is marked through the experiments it was paired from
    (`_common.Paired`): in the committed results each recorded source is one the bench
    declares, so a stale row there marks the verdict."""
    path = report.RESULTS / f"{bench.BENCH.name}.json"
    if not path.exists():
        pytest.skip("no committed results")
    data = json.loads(path.read_text())
    declared = {e.id for e in bench.BENCH.experiments(data["budget"])}
    for target in data["targets"]:
        sources = data["summary"].get(target["id"], {}).get("sources", {})
        assert set(sources.get(target["key"], ())) <= declared, target["name"]
