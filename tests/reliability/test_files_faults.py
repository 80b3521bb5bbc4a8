"""Fault injection, a run's files: a torn last line of metrics.jsonl is skipped with a warning;
a bad line before it, a damaged checkpoint (truncated, corrupt, a pickle in its place, an
interrupted save), or a config.json that is not the run's is a one-line error naming the file;
--resume falls back to the newest intact checkpoint and says which one it used and which it
skipped; nothing is ever unpickled; a full disk is an error naming the file and the run
resumes once there is room."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest

from attnzoo.cli import main
from attnzoo.train.checkpoint import latest_checkpoint
from tests.reliability.test_cli_faults import copy_run, one_error_line, same_weights, train

STEP4, STEP9 = "step_00000004", "step_00000009"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 10-step run: checkpoints at steps 4 and 9, log lines at steps 4 and 9."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert train(out) == 0
    return out


@pytest.fixture
def run(trained, tmp_path):
    return copy_run(trained, tmp_path / "run")


def _resume(run: Path, capsys) -> tuple[int, str]:
    code = main(["train", "--resume", "--out", str(run), "--no-progress"])
    return code, capsys.readouterr().err


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    return one_error_line(capsys.readouterr().err)


# ---------- metrics.jsonl ----------


def test_a_torn_last_line_is_skipped_with_a_warning(run, capsys):
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 12, "lo')  # killed mid-write
    assert main(["plot", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"attnzoo: warning: {metrics}: skipped the torn last line 3" in err
    assert (run / "figures" / "loss.png").exists()
    assert main(["eval", str(run)]) == 0
    code, err = _resume(run, capsys)
    assert code == 0 and "skipped the torn last line 3" in err
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [4, 9]  # the torn line is gone from the file


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(run, capsys):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0] + "\n" + "garbage\n" + lines[1] + "\n")
    for argv in (["plot", str(run)], ["train", "--resume", "--out", str(run)]):
        error = _error(argv, capsys)
        assert f"argument '{metrics}' expected one JSON object per line" in error
        assert "got line 2: 'garbage'" in error


def test_a_line_without_a_step_is_corruption(run, capsys):
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"loss": 1.0}\n' + metrics.read_text())
    assert "got line 1:" in _error(["plot", str(run)], capsys)


# ---------- checkpoints ----------


def _break(folder: Path, how: str) -> None:
    tensors = folder / "tensors.safetensors"
    if how == "truncated":
        tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    elif how == "flipped":  # same size, one byte changed: only the checksum sees it
        data = bytearray(tensors.read_bytes())
        data[-1] ^= 0xFF
        tensors.write_bytes(bytes(data))
    elif how == "garbage":
        tensors.write_bytes(b"\x00" * 100)
    elif how == "no state":
        (folder / "state.json").unlink()
    elif how == "bad state":
        (folder / "state.json").write_text('{"step": ')
    elif how == "bad rng":  # restored last: a resume recorded its changes, then failed unnamed
        state = json.loads((folder / "state.json").read_text())
        state["python_rng"] = [3, [1, 2], None]
        (folder / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage"])
def test_a_damaged_newest_checkpoint_is_named_by_eval(run, how, capsys):
    _break(run / "checkpoints" / STEP9, how)
    error = _error(["eval", str(run)], capsys)
    assert f"argument '{run / 'checkpoints' / STEP9 / 'tensors.safetensors'}'" in error
    assert "expected an intact checkpoint file" in error


@pytest.mark.parametrize(
    "how", ["truncated", "flipped", "garbage", "no state", "bad state", "bad rng"]
)
def test_resume_falls_back_to_the_newest_intact_checkpoint(run, trained, how, capsys):
    _break(run / "checkpoints" / STEP9, how)
    code, err = _resume(run, capsys)
    assert code == 0, err
    assert f"attnzoo: warning: skipped checkpoint {STEP9}: attnzoo: argument" in err
    assert f"kept as {STEP9}.damaged" in err
    assert f"resuming from the newest intact checkpoint, {STEP4}" in err
    assert f"continuing from checkpoints/{STEP4}, step 5" in err
    assert (run / "checkpoints" / f"{STEP9}.damaged").is_dir()  # nothing lost
    # steps 5-9 trained again from step 4's state: the same weights as the first time
    assert same_weights(run / "checkpoints" / STEP9, trained / "checkpoints" / STEP9)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 9]


def test_every_checkpoint_damaged_is_an_error_naming_each(run, capsys):
    for name in (STEP4, STEP9):
        _break(run / "checkpoints" / name, "truncated")
    error = _error(["train", "--resume", "--out", str(run)], capsys)
    assert "argument '--resume' expected an intact checkpoint under" in error
    assert STEP4 in error and STEP9 in error


def test_an_interrupted_save_is_skipped(run, trained, capsys):
    """What a kill during save leaves (tests/train/test_loop.py kills a real run): a newer
    folder with a temporary file and no state.json, latest.json still naming the last one."""
    partial = run / "checkpoints" / "step_00000014"
    partial.mkdir()
    (partial / ".tensors.safetensors.abc123").write_bytes(b"partial")
    assert main(["eval", str(run)]) == 0  # latest.json names step 9
    capsys.readouterr()
    code, err = _resume(run, capsys)
    assert code == 0
    assert (
        "skipped checkpoint step_00000014" in err and "no such file (an interrupted save?)" in err
    )
    assert f"continuing from checkpoints/{STEP9}, step 10" in err


@pytest.mark.parametrize("partial", [None, "tensors.safetensors", "state.json"])
def test_a_broken_latest_json_is_not_fatal(run, partial, capsys):
    """Without a usable latest.json the newest folder holding both files is taken: a newer
    one an interrupted save left with only one of them is passed over."""
    checkpoints = run / "checkpoints"
    (checkpoints / "latest.json").write_text("{")
    if partial is not None:
        (checkpoints / "step_00000014").mkdir()
        shutil.copy(checkpoints / STEP9 / partial, checkpoints / "step_00000014" / partial)
    assert latest_checkpoint(checkpoints).name == STEP9
    assert main(["eval", str(run)]) == 0


class _Payload:
    """Unpickling this writes a marker file: its absence proves nothing was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def test_a_pickle_in_place_of_the_weights_is_never_unpickled(run, tmp_path, capsys):
    marker = tmp_path / "marker"
    for name in (STEP4, STEP9):
        tensors = run / "checkpoints" / name / "tensors.safetensors"
        tensors.write_bytes(pickle.dumps(_Payload(marker)))
        state = run / "checkpoints" / name / "state.json"
        without = {k: v for k, v in json.loads(state.read_text()).items() if k != "tensors_sha256"}
        state.write_text(json.dumps(without))  # as an old checkpoint: no checksum to catch it
    error = _error(["eval", str(run)], capsys)
    assert "tensors.safetensors' expected an intact checkpoint file, got not a safetensors" in error
    error = _error(["train", "--resume", "--out", str(run)], capsys)
    assert "argument '--resume' expected an intact checkpoint" in error
    assert not marker.exists()


# ---------- config.json ----------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{}", "a run's config with the keys ['model_name', 'task_name', 'model', 'task',"),
        ("[1, 2]", "a run's config with the keys"),
        ("{not json", "expected a run's config, got malformed JSON"),
    ],
)
def test_a_config_json_that_is_not_a_runs_is_named(run, content, expected, capsys):
    path = run / "config.json"
    path.write_text(content)
    for argv in (["eval", str(run)], ["plot", str(run)], ["train", "--resume", "--out", str(run)]):
        error = _error(argv, capsys)
        assert str(path) in error and expected in error


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("model", "hiden", 8), "'model.hiden' expected one of model.attention"),
        (
            ("train", "steps", "10"),
            "'train.steps' expected a value of type int, got '10'",
        ),
        (("model", "cell", "tree"), "'model.cell'"),
        (("train", "log_every", 0), "'train.log_every' expected a positive int"),
    ],
)
def test_a_config_json_with_a_bad_field_is_named(run, edit, expected, capsys):
    path = run / "config.json"
    saved = json.loads(path.read_text())
    section, key, value = edit
    saved[section][key] = value
    path.write_text(json.dumps(saved))
    for argv in (["eval", str(run)], ["train", "--resume", "--out", str(run)]):
        error = _error(argv, capsys)
        assert f"attnzoo: error: {path}: " in error and expected in error


def test_a_config_json_edited_to_another_architecture_is_named(run, capsys):
    path = run / "config.json"
    saved = json.loads(path.read_text())
    saved["model"]["hidden"] = 12
    path.write_text(json.dumps(saved))
    for argv in (["eval", str(run)], ["plot", str(run)], ["train", "--resume", "--out", str(run)]):
        error = _error(argv, capsys)
        assert (
            "tensors.safetensors' expected weights that fit the model the run's config.json"
            in error
        )
        assert "size mismatch" in error


# ---------- a full disk ----------


def test_a_full_disk_is_named_and_the_run_resumes_when_there_is_room(trained, tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    size = sum(p.stat().st_size for p in (trained / "checkpoints" / STEP9).iterdir())
    room = 2 * size + 32 * 1024  # two checkpoints, the logs and pages part-used: not a third
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        out = disk / "run"
        assert train(out, "train.steps=15") == 2
        error = one_error_line(capsys.readouterr().err)
        assert "No space left on device" in error
        assert f"(writing {out}/" in error
        assert not list(out.rglob(".*.*"))  # no temporary file left behind
        assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] in (4, 9)
        subprocess.run(["mount", "-o", f"remount,size={10 * room}", str(disk)], check=True)
        code, err = _resume(out, capsys)
        assert code == 0, err
        straight = tmp_path / "straight"
        assert train(straight, "train.steps=15") == 0
        last = "step_00000014"
        assert same_weights(out / "checkpoints" / last, straight / "checkpoints" / last)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
