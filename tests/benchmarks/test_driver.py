"""The one benchmark driver (benchmarks/_common.py `drive`) as its users run it: a script in a
process of its own, killed part-way, or two calls of one bench at once."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A bench whose worker obeys its params: "kill" kills the driver (its parent) the first time,
# "wait_for" waits until the results JSON holds a row of that id; every call is logged.
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    sys.path.insert(0, {benchmarks!r})
    import _common as C

    HERE = Path(__file__).parent

    def experiments(budget):
        return [
            C.Experiment("e", "g", {{"kill_seed": 1}}, seeds=3),
            C.Experiment("a", "pair", {{"wait_for": "b"}}),
            C.Experiment("b", "pair", {{}}),
        ]

    def worker(params, ctx):
        with open(HERE / "calls.log", "a") as log:
            log.write(f"{{ctx.id}} {{ctx.seed}}\\n")
        if params.get("kill_seed") == ctx.seed and not (HERE / "killed").exists():
            (HERE / "killed").touch()
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(5)
        deadline = time.monotonic() + 120
        while params.get("wait_for") and time.monotonic() < deadline:
            path = HERE / "results" / "toy.json"
            rows = json.loads(path.read_text())["rows"] if path.exists() else []
            if any(r["id"] == params["wait_for"] for r in rows):
                break
            time.sleep(0.2)
        return {{"value": ctx.seed}}

    BENCH = C.Bench("toy", __file__, experiments, worker, threads=1, jobs=1)
    if __name__ == "__main__":
        C.drive(BENCH)
    """
)


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "bench_toy.py"
    path.write_text(SCRIPT.format(benchmarks=str(ROOT / "benchmarks")))
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
