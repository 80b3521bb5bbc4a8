"""The one benchmark driver (benchmarks/_common.py `drive`) as its users run it: a script in a
process of its own, killed part-way, or two calls of one bench at once."""

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _common  # noqa: E402

# A bench whose worker obeys its params: "kill" kills the driver (an ancestor) the first time,
# "wait_for" waits until the results JSON holds a row of that id, "wait_for_newer" until it
# holds one of that id made under a calibration newer than the worker's own (once the file
# "race" exists: the calls before it would wait for nothing); every call is
# logged. "u1" and "u2" are one-sided units, each calibration stamped with its time. "user"
# needs the runs of "src" (one seed) and "src2" (two; seed 1 fails): "src" takes a while to
# finish its run (a final.json in its run folder; once the file "slow" exists: the tests that
# do not time the order need not wait), and "user" reads both through sibling_run.
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    sys.path.insert(0, {benchmarks!r})
    import _common as C

    C._PRELOAD = ()  # its workers need none of the library: a bare fork server (~3 s a call)
    HERE = Path(__file__).parent

    def experiments(budget):
        return [
            C.Experiment("e", "g", {{"kill_seed": 1}}, seeds=3),
            C.Experiment("a", "pair", {{"wait_for": "b"}}),
            C.Experiment("b", "pair", {{}}),
            C.Experiment("u1-x", "u1", {{"wait_for_newer": "u2-x"}}, unit="u1"),
            C.Experiment("u2-x", "u2", {{}}, unit="u2"),
            C.Experiment("src", "src", {{"run": 1, "sleep": 5.0}}),
            C.Experiment("src2", "src", {{"run": 1, "fail_seed": 1}}, seeds=2),
            C.Experiment("user", "user", {{}}, seeds=2, needs=("src", "src2")),
            C.Experiment("w", "w", {{"wait_for": "new"}}),
            C.Experiment("threads", "threads", {{"threads": 1}}),
            {extra}
        ]

    def prepare(unit, budget):
        return {{e.id: {{"stamp": time.time_ns()}} for e in unit}}

    def driver():  # the nearest ancestor whose command line runs this script
        pid = os.getppid()
        while pid > 1:
            if __file__ in Path(f"/proc/{{pid}}/cmdline").read_bytes().decode().split("\\0"):
                return pid
            pid = int(Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[1])
        raise RuntimeError("no ancestor runs " + __file__)

    def results():
        path = HERE / "results" / "toy.json"
        return json.loads(path.read_text()) if path.exists() else {{}}

    def worker(params, ctx):
        if params.get("threads"):  # what the child runs with, the driver given other settings
            import torch

            env = {{k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}}
            return {{"torch": torch.get_num_threads(), "env": env}}
        needs = [f"{{n}}:{{C.sibling_run(ctx, n).name}}" for n in sorted(ctx.needs)]
        with open(HERE / "calls.log", "a") as log:
            log.write(" ".join([ctx.id, str(ctx.seed), *needs]) + "\\n")
        if ctx.retrain:
            (HERE / "retrained.log").open("a").write(f"{{ctx.id}} {{ctx.seed}}\\n")
        if params.get("fail_seed") == ctx.seed:
            raise RuntimeError("this seed fails")
        time.sleep(params.get("sleep", 0) * (HERE / "slow").exists())
        if params.get("run"):
            Path(ctx.run_dir).mkdir(parents=True, exist_ok=True)  # each run a new final.json
            (Path(ctx.run_dir) / "final.json").write_text(json.dumps(time.time_ns()))
        if params.get("kill_seed") == ctx.seed and not (HERE / "killed").exists():
            (HERE / "killed").touch()
            os.kill(driver(), signal.SIGKILL)
            time.sleep(1)  # (the driver is gone: SIGKILL takes effect at once)
        deadline = time.monotonic() + 120
        while params.get("wait_for") and time.monotonic() < deadline:
            if any(r["id"] == params["wait_for"] for r in results().get("rows", [])):
                break
            time.sleep(0.2)
        racing = (HERE / "race").exists()  # set by the test once both units have a row
        while params.get("wait_for_newer") and racing and time.monotonic() < deadline:
            if any(
                r["id"] == params["wait_for_newer"] and r["extra"]["stamp"] > ctx.extra["stamp"]
                for r in results().get("rows", [])
            ):
                break
            time.sleep(0.2)
        return {{"value": ctx.seed}}

    BENCH = C.Bench("toy", __file__, experiments, worker, prepare=prepare, threads=1, jobs=1)
    if __name__ == "__main__":
        C.drive(BENCH)
    """
)


def _script(tmp_path: Path, name: str = "bench_toy.py", extra: str = "") -> Path:
    """The toy bench; `extra`: more experiments (a later version of it, beside the first)."""
    path = tmp_path / name
    path.write_text(SCRIPT.format(benchmarks=str(ROOT / "benchmarks"), extra=extra))
    return path


def _command(script: Path, *only: str) -> list[str]:
    return [
        sys.executable,
        str(script),
        "--results",
        str(script.parent / "results"),
        "--only",
        *only,
    ]


def _rows(tmp_path: Path) -> list[tuple[str, int]]:
    data = json.loads((tmp_path / "results" / "toy.json").read_text())
    return [(r["id"], r["seed"]) for r in data["rows"]]


def test_a_killed_driver_keeps_the_runs_it_finished_and_resumes_the_rest(tmp_path):
    script = _script(tmp_path)
    killed = subprocess.run(_command(script, "e"), capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert _rows(tmp_path) == [("e", 0)]  # seed 0 finished before the kill; seed 1 did not

    done = subprocess.run(_command(script, "e"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _rows(tmp_path) == [("e", 0), ("e", 1), ("e", 2)]
    calls = (tmp_path / "calls.log").read_text().split("\n")
    assert calls.count("e 0") == 1  # the kept row was not run again
    summary = json.loads((tmp_path / "results" / "toy.json").read_text())["summary"]
    assert summary["e"]["metrics"]["value"]["values"] == [0.0, 1.0, 2.0]


def test_two_calls_of_one_bench_at_once_keep_each_others_rows(tmp_path):
    script = _script(tmp_path)
    # "a" finishes only after the other call has written "b": the later writer is the call
    # that started first, so a write of only its own rows would lose "b"
    first = subprocess.Popen(_command(script, "a"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    second = subprocess.run(_command(script, "b"), capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert _rows(tmp_path) == [("a", 0), ("b", 0)]


def test_a_call_keeps_the_rows_of_experiments_added_to_the_bench_after_it_started(tmp_path):
    """A call of the bench as it was ("w", which waits for a row of "new") and a call of a
    later version that declares "new" and "gone": "new" is written while the first call runs,
    and its row survives that call's save. "gone" was in the file before the first call
    started: an experiment the first call's bench no longer declares, which it drops."""
    old = _script(tmp_path)
    later = 'C.Experiment("new", "new", {}), C.Experiment("gone", "gone", {}),'
    newer = _script(tmp_path, "bench_toy_later.py", extra=later)
    gone = subprocess.run(_command(newer, "gone"), capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    first = subprocess.Popen(_command(old, "w"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log, deadline = tmp_path / "calls.log", time.monotonic() + 120
    while "w 0" not in (log.read_text() if log.exists() else ""):  # it has read the file
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    second = subprocess.run(_command(newer, "new"), capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert _rows(tmp_path) == [("w", 0), ("new", 0)]


def test_a_call_keeps_the_rows_of_a_unit_another_call_calibrated_meanwhile(tmp_path):
    """Two calls, each re-running one unit: the one that started first (and so read the older
    calibration of the other's unit) writes last, and must not put that older calibration back
    and drop the other call's rows as made under another calibration."""
    script = _script(tmp_path)
    for unit in ("u2", "u1"):  # both units have a calibration and a row
        done = subprocess.run(_command(script, unit), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    path = tmp_path / "results" / "toy.json"
    before = json.loads(path.read_text())["calibrations"]["u1"]
    (tmp_path / "race").touch()  # from now on "u1-x" waits for a newer "u2-x" row
    first = subprocess.Popen(
        [*_command(script, "u1"), "--rerun"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120  # until the first call has written its new calibration
    while json.loads(path.read_text())["calibrations"]["u1"] == before:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    second = subprocess.run([*_command(script, "u2"), "--rerun"], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    data = json.loads(path.read_text())
    assert sorted(_rows(tmp_path)) == [("u1-x", 0), ("u2-x", 0)]
    for unit in ("u1", "u2"):  # each row under its unit's newest calibration
        (row,) = [r for r in data["rows"] if r["id"] == f"{unit}-x"]
        assert row["extra"] == data["calibrations"][unit]["extra"][f"{unit}-x"]


def test_a_row_runs_after_the_runs_it_needs_which_run_first_when_missing(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "slow").touch()  # "src" finishes last of the first runs: "user 0" must wait
    done = subprocess.run(
        [*_command(script, "user"), "--jobs", "2"], capture_output=True, text=True
    )
    # src2 seed 1 fails, and user seed 1 with it: the call says so and exits 1
    assert done.returncode == 1 and "[toy] 2 rows failed" in done.stderr, done.stderr
    assert "src seed 0 runs first: user needs its run" in done.stdout
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # each "user" run started after the runs it needs had finished (sibling_run found them):
    # the one-seed "src" run for both seeds, "src2" of the same seed
    assert "user 0 src:seed0 src2:seed0" in calls
    assert sorted(calls) == ["src 0", "src2 0", "src2 1", "user 0 src:seed0 src2:seed0"]
    data = json.loads((tmp_path / "results" / "toy.json").read_text())
    status = {(r["id"], r["seed"]): (r["status"], r.get("error", "")) for r in data["rows"]}
    assert status["user", 0] == ("ok", "")
    assert status["user", 1] == ("error", "not run: src2 seed 1 failed")  # never started

    again = subprocess.run(_command(script, "user"), capture_output=True, text=True)
    assert again.returncode == 1, again.stderr  # the same seeds fail again
    calls = (tmp_path / "calls.log").read_text().splitlines()[4:]
    assert calls == ["src2 1"]  # "user 1" is not run again: its need failed again
    assert "runs first" in again.stdout and "src seed 0" not in again.stdout


def test_a_row_goes_stale_when_a_run_it_needs_is_trained_again(tmp_path):
    script = _script(tmp_path)
    for only in (["user"], ["src", "--rerun"]):
        done = subprocess.run(_command(script, *only), capture_output=True, text=True)
        assert done.returncode == 1, done.stderr  # the JSON holds src2 seed 1's failure
    spec = importlib.util.spec_from_file_location("bench_toy", script)
    bench_toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_toy)
    data = json.loads((tmp_path / "results" / "toy.json").read_text())
    found = _common.stale_rows(data, bench_toy.experiments("full"))
    assert found == {"user": {0: _common.NEEDS_CHANGED}}  # seed 1 never ran (its need failed)
    again = subprocess.run(_command(script, "user"), capture_output=True, text=True)
    assert again.returncode == 1, again.stderr
    assert f"user seed 0 runs again: {_common.NEEDS_CHANGED}" in again.stdout
    data = json.loads((tmp_path / "results" / "toy.json").read_text())
    assert _common.stale_rows(data, bench_toy.experiments("full")) == {}


def test_list_times_an_untimed_experiment_by_the_rows_that_trained(tmp_path):
    """`--list`'s minutes for an experiment that declares none: the mean of its current rows'
    seconds, leaving out a row re-read from a finished run (its seconds are the re-reading's)."""
    e = _common.Experiment("e", "g", {}, seeds=2)
    bench = _common.Bench("toy", __file__, lambda budget: [e], lambda p, c: {}, threads=2)
    row = {"id": "e", "group": "g", "budget": "full", "params": {}, "status": "ok"}
    rows = [
        {**row, "seed": 0, "seconds": 600.0, "metrics": {}},
        {**row, "seed": 1, "seconds": 3.0, "metrics": {"reused_run": True}},
    ]
    (tmp_path / "toy.json").write_text(json.dumps({"rows": rows}))
    listed = _common.listing(bench, "full", results=tmp_path)
    assert listed["experiments"][0]["minutes"] == 600.0 * 2 / 60  # CPU-minutes: 2 threads
    assert listed["minutes"] == 2 * listed["experiments"][0]["minutes"] and not listed["untimed"]


def test_a_child_runs_with_the_bench_thread_count_whatever_the_driver_has(tmp_path):
    script = _script(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "X_NUM_THREADS": "3"}
    done = subprocess.run(_command(script, "threads"), capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    row = json.loads((tmp_path / "results" / "toy.json").read_text())["rows"][0]
    assert row["metrics"] == {
        "torch": 1,
        "env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    }, row


def test_a_stale_row_of_a_seed_beyond_the_declared_ones_runs_again(tmp_path):
    """Rows of an earlier --seeds 3 stay in the means; when their params changed, the driver
    re-ran only the declared seeds, and seeds 1-2 stayed in every cell under the old params
    while the note said the driver would re-run them."""
    script = _script(tmp_path, extra='C.Experiment("b", "many", {}, seeds=2),')
    script.write_text(script.read_text().replace('C.Experiment("b", "pair", {}),', ""))
    done = subprocess.run([*_command(script, "b"), "--seeds", "3"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "results" / "toy.json"
    data = json.loads(path.read_text())
    for r in data["rows"]:  # as if the bench had declared other params when they ran
        r["params"] = {"old": 1}
    path.write_text(json.dumps(data))
    again = subprocess.run(_command(script, "b"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "3 runs to do" in again.stdout
    assert sorted(_rows(tmp_path)) == [("b", 0), ("b", 1), ("b", 2)]
    data = json.loads(path.read_text())
    assert all(r["params"] == {} for r in data["rows"])


def test_a_run_that_appears_twice_in_the_results_counts_once(tmp_path):
    """Two rows of one (id, seed) in the results JSON (an earlier merge's, or a hand edit's)
    both entered the summary: n = 2 and a mean over one run twice. A save keeps the later."""
    script = _script(tmp_path)
    done = subprocess.run(_command(script, "b"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "results" / "toy.json"
    data = json.loads(path.read_text())
    (row,) = data["rows"]
    data["rows"].append({**row, "metrics": {**row["metrics"], "value": 7}})
    path.write_text(json.dumps(data))
    again = subprocess.run(_command(script, "no-such-id"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    data = json.loads(path.read_text())
    assert [(r["id"], r["seed"], r["metrics"]["value"]) for r in data["rows"]] == [("b", 0, 7)]
    assert data["summary"]["b"]["seeds"] == [0]
    assert data["summary"]["b"]["metrics"]["value"]["n"] == 1


def test_a_row_made_on_earlier_task_data_has_its_run_trained_again(tmp_path):
    """A row whose task's data changed since is run again; its run folder's config still
    matches, so `train_worker` adopted the run trained on the old data and the new row
    recorded the new data version: stale no more, and as wrong as before. The driver now
    tells the worker (`Context.retrain`), only for that row."""
    from attnzoo.tasks.registry import TASKS

    script = _script(tmp_path, extra='C.Experiment("d", "data", {"task": "bit_copy"}, seeds=2),')
    done = subprocess.run(_command(script, "d"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "retrained.log").exists()
    path = tmp_path / "results" / "toy.json"
    data = json.loads(path.read_text())
    for r in data["rows"]:
        if r["seed"] == 1:
            r["metrics"]["data"] = TASKS["bit_copy"].data + 1  # made on other data
    path.write_text(json.dumps(data))
    again = subprocess.run(_command(script, "d"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "1 runs to do" in again.stdout
    assert (tmp_path / "retrained.log").read_text() == "d 1\n"


def test_a_row_records_the_load_average_over_the_last_minute(tmp_path):
    """The docs' machine line reads each row's load average as the 1-minute figure."""
    script = _script(tmp_path)
    pinned = "os.getloadavg = lambda: (1.0, 2.0, 3.0)  # 1, 5 and 15 minutes"
    script.write_text(script.read_text().replace("C._PRELOAD = ()", f"C._PRELOAD = ()\n{pinned}"))
    done = subprocess.run(_command(script, "b"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "results" / "toy.json").read_text())
    (row,) = data["rows"]
    assert row["load_average"] == 1.0
    assert data["machine"]["load_average"] == [1.0, 2.0, 3.0]


def test_a_save_summarises_its_budgets_rows_on_the_machine_of_its_runs(tmp_path):
    """A results file holding a smoke row and the machine of an earlier call (9 threads): a
    full-budget call of a 2-thread bench keeps that machine while it has run nothing, and once
    it has, the summary holds the full-budget rows only, and the machine is this call's."""
    e = _common.Experiment("e", "g", {}, seeds=2)
    bench = _common.Bench("toy", __file__, lambda budget: [e], lambda p, c: {}, threads=2)
    row = {"id": "e", "group": "g", "status": "ok", "params": {}}
    earlier = [
        {**row, "seed": 0, "budget": "full", "metrics": {"x": 0.0}},
        {**row, "seed": 1, "budget": "full", "metrics": {"x": 5.0}},
        {**row, "seed": 2, "budget": "smoke", "metrics": {"x": 100.0}},
    ]
    machine = {"threads_per_run": 9, "cpu": "an earlier machine", "python": "2.7"}
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"budget": "full", "machine": machine, "rows": earlier}))

    def saver():
        return _common._Saver(bench, [e], "full", path, tmp_path, {}, earlier[:2])

    assert saver()([])["machine"] == machine  # nothing run: the rows kept are that machine's
    data = saver()([{**row, "seed": 0, "budget": "full", "metrics": {"x": 3.0}}])
    assert data == json.loads(path.read_text())
    assert [(r["seed"], r["budget"], r["metrics"]["x"]) for r in data["rows"]] == [
        (0, "full", 3.0),  # this call's run replaces the earlier one
        (1, "full", 5.0),
    ]
    entry = data["summary"]["e"]
    assert entry["seeds"] == [0, 1]
    x = entry["metrics"]["x"]
    assert (x["n"], x["mean"]) == (2, statistics.mean([3.0, 5.0]))
    assert data["machine"]["threads_per_run"] == 2
    assert data["machine"]["cpu"] == _common.cpu_model()
    assert data["machine"]["python"] == platform.python_version()
