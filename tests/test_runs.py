import dataclasses
import json
import re

import pytest
import torch

from attnzoo import config, rundir, runs
from attnzoo.tasks.base import EvalConfig
from attnzoo.train.loop import SCHEDULES, TrainConfig


def test_overrides_parse_each_field_type():
    config = runs.default_config("bahdanau", "dates")
    runs.apply_overrides(
        config,
        [
            "model.hidden=32",
            "model.bidirectional=false",
            "train.lr=0.01",
            "model.cell=lstm",
            "train.betas=0.8,0.9",
            "task.locales=en_US,de_DE",
            "eval.limit=0",
        ],
    )
    assert config["model"]["hidden"] == 32 and config["model"]["bidirectional"] is False
    assert config["train"]["lr"] == 0.01 and config["model"]["cell"] == "lstm"
    assert config["train"]["betas"] == (0.8, 0.9)
    assert config["task"]["locales"] == ("en_US", "de_DE")


def test_sequence_task_defaults_follow_the_task_name():
    assert runs.default_config("luong", "sort")["task"]["kind"] == "sort"
    assert runs.default_config("luong", "copy")["task"]["kind"] == "copy"


@pytest.mark.parametrize(
    ("item", "pattern"),
    [
        ("model.hidden", "key=value"),
        ("model.nope=1", "'model.nope'.*model.hidden"),
        ("nope.hidden=1", "'nope.hidden'"),
        ("model.hidden=big", "'model.hidden'.*int"),
        ("train.steps=2.7", "'train.steps' expected a value of type int, got '2.7'"),
        ("train.steps=1e3", "'train.steps' expected a value of type int, got '1e3'"),
        ("model.bidirectional=maybe", "'model.bidirectional'"),
        ("train.schedule=linear", "'train.schedule' expected one of"),
    ],
)
def test_bad_overrides(item, pattern):
    with pytest.raises(ValueError, match=pattern):
        runs.apply_overrides(runs.default_config("bahdanau", "dates"), [item])


def test_qualified_names_only_its_sections_fields():
    """A section's class error is re-raised naming `section.field`, of the same type; another
    function's error, or one of a class not among the sections, passes unchanged."""
    classes = {"train": TrainConfig, "eval": EvalConfig}
    named = r"^attnzoo: argument 'eval.limit' expected x, got 1$"
    with pytest.raises(TypeError, match=named), config.qualified(classes):
        raise TypeError("EvalConfig: argument 'limit' expected x, got 1")
    for text in ("NTMConfig: argument 'limit' expected x", "attention: argument 'x' expected y"):
        with pytest.raises(ValueError, match=f"^{re.escape(text)}$"), config.qualified(classes):
            raise ValueError(text)


@pytest.mark.parametrize("items", ["[40.5,80]", "[40,true]", '["40",80]', "[[40],80]"])
def test_a_json_list_item_of_another_type_is_refused_not_converted(items):
    """int(40.5) and int(True) read `[40.5,80]` as (40, 80) and `[40,true]` as (40, 1)."""
    config = runs.default_config("ntm", "bit_copy")
    pattern = re.escape(
        f"'task.test_lengths' expected a value of type tuple[int, ...], got '{items}'"
    )
    with pytest.raises(ValueError, match=pattern):
        runs.apply_overrides(config, [f"task.test_lengths={items}"])
    for ok, parsed in (("[40,80]", (40, 80)), ("40,80", (40, 80))):
        assert (
            runs.apply_overrides(config, [f"task.test_lengths={ok}"])["task"]["test_lengths"]
            == parsed
        )
    betas = runs.apply_overrides(config, ["train.betas=[0,0.9]"])["train"]["betas"]
    assert betas == (0.0, 0.9) and isinstance(betas[0], float)  # an int is a float


@pytest.mark.parametrize("lacks", ["model_name", "task_name", *rundir.SECTIONS])
def test_a_config_without_a_key_is_an_error_naming_it_before_any_work(lacks, tmp_path):
    """A config written by hand for the API (runs.build, runs.run_train) without one of its
    keys: one error listing the keys, not a KeyError from deep inside."""
    config = runs.default_config("bahdanau", "dates")
    del config[lacks]
    for call in (lambda: runs.build(config), lambda: runs.run_train(config, tmp_path / "run")):
        with pytest.raises(ValueError, match="argument 'config' expected a run's config with"):
            call()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="argument 'config' .* got list"):
        runs.build([config])
    with pytest.raises(ValueError, match="argument 'MODEL' expected one of"):
        runs.build({**runs.default_config("bahdanau", "dates"), "model_name": "nope"})


def test_build_sizes_the_location_score_to_the_data():
    config = runs.apply_overrides(
        runs.default_config("luong", "reverse"),
        [
            "model.score=location",
            "task.n_train=50",
            "task.n_valid=5",
            "task.n_test=5",
            "task.max_len=9",
        ],
    )
    task, model = runs.build(config)
    assert model.decoder.score.max_keys == task.model_dims()["max_source_len"] == 10


def test_literal_fields_accept_only_their_choices():
    config = runs.apply_overrides(runs.default_config("luong", "numbers"), ["task.target=english"])
    assert config["task"]["target"] == "english"
    with pytest.raises(ValueError, match="'task.target'.*digits"):
        runs.apply_overrides(runs.default_config("luong", "numbers"), ["task.target=french"])


def test_every_model_is_sized_by_its_tasks_model_dims(monkeypatch):
    """The registry builds `model_class(config, **task.model_dims())`: what the model is
    given is exactly what the task names."""
    from attnzoo.models.registry import MODELS

    config = runs.apply_overrides(
        runs.default_config("pointer-net", "convex_hull"), ["task.n_test=4", "model.hidden=8"]
    )
    seen = {}
    spec = MODELS["pointer-net"]

    def spy(model_config, **dims):
        seen.update(dims)
        return spec.model_class(model_config, **dims)

    monkeypatch.setitem(MODELS, "pointer-net", dataclasses.replace(spec, model_class=spy))
    task, _ = runs.build(config)
    assert seen == task.model_dims() == {"input_dim": 2, "end_token": True}


def test_config_json_records_the_requested_device(tmp_path):
    config = runs.apply_overrides(
        runs.default_config("luong", "reverse"),
        [
            "task.n_train=50",
            "task.n_valid=5",
            "task.n_test=5",
            "model.hidden=8",
            "train.steps=2",
            "train.threads=1",
            "train.device=cpu",
            "eval.limit=2",
        ],
    )
    _, model, final = runs.run_train(config, tmp_path, progress=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["train"]["device"] == "cpu" and final["device"] == "cpu"
    _, _, loaded = runs.load_run(tmp_path, device="cpu")
    for a, b in zip(model.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a.detach(), b.detach())


# "model" sections of config.json as attnzoo wrote them before the decoder families were
# classes and the position sizes came from the task (copied from runs made by commit a42dda1)
OLD_MODEL_SECTIONS = {
    "luong": {
        "attention": "luong",
        "attn_hidden": 128,
        "bidirectional": False,
        "cell": "lstm",
        "dropout": 0.1,
        "embed_dim": 64,
        "hidden": 128,
        "input_feeding": True,
        "layers": 1,
        "local": "local-p",
        "max_source_len": 128,
        "score": "general",
        "window": 3,
    },
    "transformer": {
        "d_ff": 512,
        "d_model": 128,
        "dropout": 0.1,
        "final_norm": False,
        "heads": 4,
        "layers_dec": 2,
        "layers_enc": 2,
        "max_source_len": 256,
        "max_target_len": 256,
        "positions": "sinusoidal",
        "pre_norm": False,
        "tie_embeddings": True,
    },
}


@pytest.mark.parametrize("model", sorted(OLD_MODEL_SECTIONS))
def test_a_config_written_by_an_earlier_version_still_builds(model, tmp_path):
    config = runs.default_config(model, "reverse")
    config["model"] = OLD_MODEL_SECTIONS[model]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TypeError, match=r"argument 'model\.max_source_len' expected one of"):
        runs.build(config)
    upgraded = runs.read_config(tmp_path)
    assert "max_source_len" not in upgraded["model"]
    runs.build(upgraded)


def _tiny(model="luong", task="reverse", extra=()):
    return runs.apply_overrides(
        runs.default_config(model, task), ["model.hidden=8", "train.steps=10", *extra]
    )


def test_check_resumable_allows_only_the_resumable_keys():
    saved = _tiny(extra=["train.schedule=constant"])
    given = json.loads(json.dumps(saved))
    for key, value in [("steps", 20), ("log_every", 2), ("device", "cpu"), ("threads", 1)]:
        given["train"][key] = value
    given["eval"]["beam_size"] = 3
    assert runs.check_resumable(saved, given) == [
        ("train.device", "auto", "cpu"),
        ("train.log_every", 50, 2),
        ("train.steps", 10, 20),
        ("train.threads", 0, 1),
        ("eval.beam_size", 1, 3),
    ]
    given["train"]["seed"], given["model"]["hidden"] = 1, 9
    with pytest.raises(ValueError, match=r"'model.hidden, train.seed'.*hidden: 8 -> 9; train"):
        runs.check_resumable(saved, given)


@pytest.mark.parametrize("steps", [20, 8])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_extending_steps_on_resume_depends_on_the_schedule(schedule, steps):
    """Another step count (more, or fewer for a run stopped before its last step) is refused
    under the cosine schedule alone (`runs.run_train` refuses fewer than trained)."""
    saved = _tiny(extra=[f"train.schedule={schedule}"])
    given = json.loads(json.dumps(saved))
    given["train"]["steps"] = steps
    if schedule == "cosine":
        with pytest.raises(ValueError, match=f"'train.steps'.*cosine.*train.steps: 10 -> {steps}"):
            runs.check_resumable(saved, given)
    else:
        assert runs.check_resumable(saved, given) == [("train.steps", 10, steps)]


def test_resume_config_takes_the_saved_config(tmp_path):
    saved = _tiny(extra=["train.schedule=constant"])
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = runs.resume_config(tmp_path, None, None, ["train.steps=30"])
    assert config["train"]["steps"] == 30 and config["model"]["hidden"] == 8
    with pytest.raises(ValueError, match="MODEL: 'luong' -> 'bahdanau'"):
        runs.resume_config(tmp_path, "bahdanau", "reverse", [])


def _checked_out(out, **flags):
    with runs.check_out(out, **flags) as entries:
        return entries


def test_check_out(tmp_path):
    assert _checked_out(tmp_path / "new" / "run") == []
    assert (tmp_path / "new" / "run").is_dir()
    assert _checked_out(tmp_path / "new" / "run") == []  # its lock file alone: still empty
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model_name": "luong", "task_name": "reverse"}')
    with pytest.raises(FileExistsError, match="'--out' expected a new or empty run directory"):
        _checked_out(run)
    assert _checked_out(run, resume=True) == []
    assert [p.name for p in _checked_out(run, overwrite=True)] == ["config.json"]
    with pytest.raises(ValueError, match="'--overwrite' expected either --resume or"):
        _checked_out(run, resume=True, overwrite=True)


def test_a_refused_folder_is_left_as_it_was(tmp_path):
    """A user's folder refused as --out (not empty, or not a run's for --overwrite) got the
    run's lock file left in it, and a `.lock` of the user's own was truncated to a pid."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for flags in ({}, {"overwrite": True}):
        with pytest.raises(FileExistsError, match="'--out'"):
            _checked_out(mine, **flags)
        assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (mine / rundir.LOCK).write_text("the user's")
    with pytest.raises(FileExistsError, match="'--out'"):
        _checked_out(mine)
    assert (mine / rundir.LOCK).read_text() == "the user's"


@pytest.mark.skipif(rundir.fcntl is None, reason="no fcntl.flock on this platform")
def test_a_run_directory_is_claimed_by_one_process_at_a_time(tmp_path):
    """While one process trains in a run dir, another (here a second `check_out` of the same
    directory) is refused before any work, with the holder's pid; the claim ends with the
    block, or with the process (a killed run is resumable at once: see test_trained_benches)."""
    import os

    run = tmp_path / "run"
    with runs.check_out(run):
        with pytest.raises(BlockingIOError, match=f"no other process .* process {os.getpid()}"):
            _checked_out(run, resume=True)
        with pytest.raises(BlockingIOError, match="'--out'"):
            runs.run_train(_tiny(), run, resume=False, overwrite=True, progress=False)
    assert _checked_out(run, resume=True) == []  # released


@pytest.mark.skipif(rundir.fcntl is None, reason="no fcntl.flock on this platform")
def test_a_file_system_without_locks_trains_unguarded_and_says_so(tmp_path, monkeypatch, capsys):
    import errno

    def refuse(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rundir.fcntl, "flock", refuse)
    run = tmp_path / "run"
    runs.run_train(_tiny(), run, resume=False, overwrite=False, progress=False)
    assert (run / "final.json").exists()
    assert "could not be locked (No locks available)" in capsys.readouterr().err


@pytest.mark.skipif(rundir.fcntl is None, reason="no fcntl.flock on this platform")
def test_a_killed_process_releases_its_run_directory(tmp_path):
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    code = (
        "import sys, time\nfrom attnzoo import runs\n"
        f"with runs.check_out({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BlockingIOError, match=f"locked by process {holder.pid}"):
            _checked_out(run, resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert _checked_out(run, resume=True) == []


@pytest.mark.skipif(rundir.fcntl is None, reason="no fcntl.flock on this platform")
def test_the_lock_file_names_the_process_holding_it_not_a_killed_one(tmp_path):
    """A killed run leaves its pid in the lock file: the next process claiming the directory
    replaces it with its own (a third is told who holds it), not appended to it."""
    import os

    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.LOCK).write_text("99999999")
    with runs.check_out(run, resume=True):
        assert (run / rundir.LOCK).read_text() == str(os.getpid())


def test_read_config_fills_a_field_an_older_config_lacks(tmp_path):
    saved = _tiny()
    del saved["train"]["autocast"], saved["eval"]["batch_size"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = runs.read_config(tmp_path)
    assert config["train"]["autocast"] == "none" and config["eval"]["batch_size"] == 256
    config = runs.resume_config(tmp_path, None, None, ["eval.batch_size=16"])
    assert config["eval"]["batch_size"] == 16


def _tiny_run(model, task, out, *sets):
    config = runs.apply_overrides(
        runs.default_config(model, task),
        ["train.steps=1", "train.batch_size=2", "train.threads=1", "train.device=cpu", *sets],
    )
    return config, runs.run_train(config, out, progress=False)[1]


CAPTION_SETS = ("task.n_test=2", "task.n_valid=8", "model.hidden=8", "model.attn_hidden=8")


def test_init_from_starts_the_shared_weights_from_the_run_and_no_others(tmp_path):
    _, encoder = _tiny_run("sat-encoder", "mnist", tmp_path / "enc", "task.n_test=4")
    config, captioner = _tiny_run(
        "show-attend-tell",
        "digit_captions",
        tmp_path / "cap",
        *CAPTION_SETS,
        "train.lr=1e-12",  # one step of Adam moves a weight by about lr: next to nothing
        f"train.init_from={tmp_path / 'enc'}",
    )
    fresh = runs.build(config)[1].state_dict()  # the same seed's start, without init_from
    trained = captioner.state_dict()
    from_run = encoder.state_dict()
    assert any(k.startswith("encoder.") for k in from_run)
    for name, value in trained.items():
        start = from_run[name] if name.startswith("encoder.") else fresh[name]
        assert torch.allclose(value, start, atol=1e-9), name
    assert not torch.allclose(trained["encoder.net.0.weight"], fresh["encoder.net.0.weight"])


def test_init_from_fails_naming_it_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="train.init_from.*no checkpoint"):
        _tiny_run("show-attend-tell", "digit_captions", tmp_path / "cap",
                  *CAPTION_SETS, f"train.init_from={tmp_path / 'missing'}")  # fmt: skip
    assert not (tmp_path / "cap").exists()
    _tiny_run("sat-encoder", "mnist", tmp_path / "enc", "task.n_test=4", "model.channels=[8,8]")
    with pytest.raises(ValueError, match=r"train.init_from.*encoder.net.0.bias of shape \(16,\)"):
        _tiny_run("show-attend-tell", "digit_captions", tmp_path / "cap2",
                  *CAPTION_SETS, f"train.init_from={tmp_path / 'enc'}")  # fmt: skip
    assert not (tmp_path / "cap2").exists()  # (the weights are read after --out is claimed)
    mine = tmp_path / "mine"  # an empty folder the user made: left as it was, not removed
    mine.mkdir()
    with pytest.raises(ValueError, match=r"train.init_from.*encoder.net.0.bias of shape"):
        _tiny_run("show-attend-tell", "digit_captions", mine,
                  *CAPTION_SETS, f"train.init_from={tmp_path / 'enc'}")  # fmt: skip
    assert mine.is_dir() and not any(mine.iterdir())
    _tiny_run("luong", "reverse", tmp_path / "other", "task.n_train=8", "task.n_test=2",
              "task.n_valid=2", "model.hidden=8", "eval.limit=2")  # fmt: skip
    with pytest.raises(ValueError, match="train.init_from.*weights named as this model's"):
        _tiny_run("show-attend-tell", "digit_captions", tmp_path / "cap3",
                  *CAPTION_SETS, f"train.init_from={tmp_path / 'other'}")  # fmt: skip
