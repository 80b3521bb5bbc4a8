import json

import pytest
import torch

from attnzoo.core.files import atomic_write
from attnzoo.train.checkpoint import (
    CheckpointError,
    find_resumable,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    saved_timing,
)
from attnzoo.train.files import read_metrics
from attnzoo.train.loop import TrainConfig


def test_read_metrics_skips_only_a_torn_last_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.5}\n{"step": 2, "lo')
    assert [r["step"] for r in read_metrics(path)] == [0, 1]
    assert capsys.readouterr().err == (
        f'attnzoo: warning: {path}: skipped the torn last line 3 (\'{{"step": 2, "lo\')\n'
    )
    path.write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.5}')  # no final newline
    assert [r["step"] for r in read_metrics(path)] == [0, 1]
    assert capsys.readouterr().err == ""
    path.write_text("")
    assert read_metrics(path) == []


@pytest.mark.parametrize(
    "bad",
    ["{", "[1]", '{"step": "1", "loss": 1.0}', '{"step": 1}', '{"step": true, "loss": 1}', ""],
)
def test_read_metrics_names_a_bad_line_before_the_last(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{{"step": 0, "loss": 2.0}}\n{bad}\n{{"step": 2, "loss": 1.0}}\n')
    with pytest.raises(ValueError, match=rf"'{path}' expected one JSON object.*got line 2: "):
        read_metrics(path)


def _saved(tmp_path, steps=(0, 1)):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in steps:
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        save_checkpoint(tmp_path, step, model, opt, sched)
    return model, opt, sched


def test_checkpoint_records_a_checksum_that_catches_any_change(tmp_path):
    _saved(tmp_path)
    folder = latest_checkpoint(tmp_path)
    state = json.loads((folder / "state.json").read_text())
    assert len(state["tensors_sha256"]) == 64
    tensors = folder / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 1
    tensors.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"SHA-256 differs from the one in state.json"):
        read_checkpoint(folder)


def test_find_resumable_skips_newer_damaged_checkpoints(tmp_path):
    _saved(tmp_path)
    (tmp_path / "step_00000001" / "state.json").unlink()
    folder, skipped = find_resumable(tmp_path)
    assert folder.name == "step_00000000"
    assert [(p.name, "state.json' expected an intact" in why) for p, why in skipped] == [
        ("step_00000001", True)
    ]


def test_weights_that_do_not_fit_the_model_name_the_file(tmp_path):
    _saved(tmp_path)
    other = torch.nn.Linear(3, 5)
    opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    folder = latest_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"tensors.safetensors' expected weights that fit"):
        load_checkpoint(folder, other, opt, sched)


def test_retention_ignores_folders_set_aside(tmp_path):
    _saved(tmp_path)
    (tmp_path / "step_00000009.damaged").mkdir()
    _saved(tmp_path, steps=(2,))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latest.json", "step_00000001", "step_00000002", "step_00000009.damaged"]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("log_every", 0, "a positive int"),
        ("checkpoint_every", 0, "a positive int"),
        ("eval_every", -1, "a non-negative int"),
        ("threads", -1, "a non-negative int"),
        ("warmup", -1, "a non-negative int"),
        ("steps", 2.0, "an int"),  # the type first (core.checks.check_fields), then the range
        ("clip", -0.5, "a finite number >= 0"),
        ("weight_decay", float("nan"), "a finite number >= 0"),
        ("lr", float("inf"), "a positive, finite learning rate"),
        ("betas", (0.9, 1.0), r"two numbers in \[0, 1\)"),
        ("betas", (0.9, 0.99, 0.9), "2 values: a number, a number"),
    ],
)
def test_train_config_checks_every_field(field, value, expected):
    with pytest.raises(ValueError, match=rf"TrainConfig: argument '{field}' expected {expected}"):
        TrainConfig(**{field: value})


def test_latest_json_naming_a_missing_folder_falls_back_to_the_newest(tmp_path):
    _saved(tmp_path)
    (tmp_path / "latest.json").write_text('{"step": 7, "path": "step_00000007"}')
    assert latest_checkpoint(tmp_path).name == "step_00000001"


def test_resume_point_sets_damaged_checkpoints_aside_and_repoints_latest(tmp_path, capsys):
    from attnzoo.train.checkpoint import resume_point

    _saved(tmp_path, steps=(0, 1, 2))  # keeps 1 and 2
    (tmp_path / "step_00000002.damaged").mkdir()  # an earlier one of the same name
    (tmp_path / "step_00000002" / "tensors.safetensors").write_bytes(b"")
    assert resume_point(tmp_path).name == "step_00000001"
    assert (tmp_path / "step_00000002.damaged-2" / "state.json").exists()
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("attnzoo: warning: skipped checkpoint step_00000002: attnzoo:")
    assert err[0].endswith("; kept as step_00000002.damaged-2")
    assert err[1] == "attnzoo: warning: resuming from the newest intact checkpoint, step_00000001"


def test_a_checkpoint_resumes_only_with_the_process_count_that_trained_it(tmp_path):
    """Each process of a torchrun run draws its own samples: a run checkpointed by two
    processes and resumed by one continued neither run (43 of 73 tensors of a pointer net off
    both), and nothing recorded the count. The checkpoint records it; another count is refused
    before anything loads. A checkpoint from before the record tells it by its ranks' RNG."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    rng = [{"torch": torch.get_rng_state()}] * 2
    two = save_checkpoint(tmp_path / "two", 0, model, opt, sched, rank_rng=rng, world=2)
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(ValueError, match=r"'processes' expected the 2 process\(es\).*got 1"):
        load_checkpoint(two, model, opt, sched)
    assert not torch.equal(model.weight, before)  # refused before the weights loaded
    assert load_checkpoint(two, model, opt, sched, rank=1, world=2) == 0
    state = json.loads((two / "state.json").read_text())
    del state["world"]  # as written before the count was recorded
    (two / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="'processes' expected the 2 process"):
        load_checkpoint(two, model, opt, sched)
    one = save_checkpoint(tmp_path / "one", 0, model, opt, sched)
    with pytest.raises(ValueError, match="'processes' expected the 1 process"):
        load_checkpoint(one, model, opt, sched, world=2)
    assert load_checkpoint(one, model, opt, sched) == 0


def test_a_checkpoint_records_its_timing_and_a_malformed_one_is_named(tmp_path):
    timing = {"train_seconds": 1.5, "eval_seconds_during": 0.25, "steps_run": 2, "sessions": 1}
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    folder = save_checkpoint(tmp_path / "a", 1, model, opt, sched, timing=timing)
    assert saved_timing(folder) == timing
    older = save_checkpoint(tmp_path / "b", 1, model, opt, sched)  # as written before timing
    assert saved_timing(older) is None
    for bad in ({**timing, "steps_run": -1}, {**timing, "sessions": True}, {"steps_run": 2}, 3):
        state = json.loads((folder / "state.json").read_text())
        (folder / "state.json").write_text(json.dumps({**state, "timing": bad}))
        with pytest.raises(CheckpointError, match="malformed 'timing'"):
            saved_timing(folder)


def test_an_atomically_written_file_has_the_mode_a_plain_one_has(tmp_path):
    """mkstemp makes 0o600 files: config.json, final.json and the checkpoints came out
    unreadable to another user while metrics.jsonl (a plain open) did not."""
    atomic_write(tmp_path / "atomic.json", b"{}")
    (tmp_path / "plain.json").write_bytes(b"{}")
    mode = {
        name: (tmp_path / name).stat().st_mode & 0o777 for name in ("atomic.json", "plain.json")
    }
    assert mode["atomic.json"] == mode["plain.json"]
