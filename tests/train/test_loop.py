import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnzoo.train.checkpoint import (
    atomic_write,
    latest_checkpoint,
    load_checkpoint,
    saved_timing,
)
from attnzoo.train.loop import SCHEDULES, TrainConfig, lr_factor, train

TINY = [
    "task.n_train=300",
    "task.n_valid=20",
    "task.n_test=40",
    "model.hidden=16",
    "model.embed_dim=8",
    "train.steps=40",
    "train.batch_size=16",
    "train.log_every=10",
    "train.checkpoint_every=10",
    "train.threads=1",
    "eval.limit=20",
]


def cli(*args, timeout: float = 300, **kw):
    return subprocess.run(
        [sys.executable, "-m", "attnzoo.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def replacing(base, extra) -> list[str]:
    """`base`'s key=value items with `extra`'s keys replaced (the CLI refuses a key given
    twice)."""
    keys = {item.split("=")[0] for item in extra}
    return [*(item for item in base if item.split("=")[0] not in keys), *extra]


def sets(extra=()):
    return [x for s in replacing(TINY, extra) for x in ("--set", s)]


def test_train_refuses_to_resume_without_a_run_dir():
    """train(..., run_dir=None, resume=True) started a fresh run without a word."""
    with pytest.raises(ValueError, match="'resume' expected a run_dir"):
        train(None, None, TrainConfig(steps=1), None, resume=True)


def test_lr_schedules():
    c = TrainConfig(steps=100, warmup=10, schedule="constant")
    assert lr_factor(c, 0) == pytest.approx(0.1) and lr_factor(c, 50) == 1.0
    c = TrainConfig(steps=100, warmup=0, schedule="cosine")
    assert lr_factor(c, 0) == 1.0 and lr_factor(c, 50) == pytest.approx(0.5)
    assert lr_factor(c, 100) == pytest.approx(0.0)
    c = TrainConfig(steps=100, warmup=16, schedule="inverse_sqrt")
    # peak 1.0 at the end of warm-up, then decays as step^-0.5
    assert lr_factor(c, 15) == pytest.approx(1.0)
    assert lr_factor(c, 63) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="'schedule'"):
        TrainConfig(schedule="linear")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_warms_up_as_written_by_hand(schedule):
    """Each schedule's factor at steps inside and after a warm-up of 16, against the formulas
    written out here (Vaswani 2017 eq. 3 for inverse_sqrt, its peak scaled to 1). The test
    above read inverse_sqrt only past its warm-up and cosine only without one: a schedule
    that dropped its warm-up (4x the peak rate at step 0) passed it."""
    import math

    steps, warmup = 100, 16
    c = TrainConfig(steps=steps, warmup=warmup, schedule=schedule)
    for step in (0, 1, 7, 15, 16, 40, 99):
        s = step + 1
        warm = min(1.0, s / warmup)
        want = {
            "constant": warm,
            "cosine": warm * 0.5 * (1 + math.cos(math.pi * step / steps)),
            "inverse_sqrt": min(s**-0.5, s * warmup**-1.5) * warmup**0.5,
        }[schedule]
        assert lr_factor(c, step) == pytest.approx(want, rel=1e-12), step
    assert lr_factor(c, 0) == pytest.approx(1 / warmup)  # every schedule starts warming up


def test_gradients_are_clipped_to_train_clip_before_each_step(tmp_path, monkeypatch):
    """Nothing tested clipping's effect: deleting the clip from the loop passed the suite.
    Each optimiser step sees gradients of total norm at most train.clip (here far below the
    unclipped norm), and the unclipped norm without it."""
    from attnzoo import runs

    def norms_seen(clip):
        seen = []
        step = torch.optim.AdamW.step

        def recording(self, *args, **kwargs):
            grads = [p.grad for group in self.param_groups for p in group["params"]]
            seen.append(float(torch.linalg.vector_norm(torch.stack([
                torch.linalg.vector_norm(g) for g in grads if g is not None
            ]))))  # fmt: skip
            return step(self, *args, **kwargs)

        monkeypatch.setattr(torch.optim.AdamW, "step", recording)
        config = runs.apply_overrides(
            runs.default_config("luong", "reverse"),
            [*TINY, "train.steps=3", "train.log_every=1", f"train.clip={clip}"],
        )
        runs.run_train(config, tmp_path / f"clip{clip}", progress=False)
        monkeypatch.undo()
        return seen

    unclipped = norms_seen(0)
    assert len(unclipped) == 3 and min(unclipped) > 0.05
    clipped = norms_seen(0.01)
    assert len(clipped) == 3 and max(clipped) <= 0.01 * (1 + 1e-5)


class _Regression:
    """A task the loop trains on: least squares on a fixed linear target, fresh rows each step."""

    def batch(self, step, batch_size, device, rank=0, world=1):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(batch_size, 4, generator=g, dtype=torch.float64)
        noise = 0.1 * torch.randn(batch_size, generator=g, dtype=torch.float64)
        return x, x @ torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64) + noise

    def loss(self, model, batch):
        x, y = batch
        return ((model(x).squeeze(-1) - y) ** 2).sum(), x.shape[0]  # summed, with its count

    def evaluate(self, model):
        return {}


def test_train_takes_the_steps_a_hand_written_loop_takes(tmp_path):
    """The weights after train() equal those of a loop written out here: the mean loss over the
    items (the task's sum divided by its count), backward, the gradient clipped to train.clip,
    AdamW with the config's betas and weight decay, the schedule's factor. A loop that stepped
    on the summed loss (count times the gradient: clipped where the mean's is not), dropped the
    weight decay or the schedule, or clipped after the step passed the suite before. Each
    logged loss is the mean over the items of its window (one counted per window, not the
    last step's count)."""
    config = TrainConfig(
        steps=60, batch_size=64, lr=0.05, warmup=8, schedule="cosine", clip=2.0,
        weight_decay=0.1, betas=(0.8, 0.95), device="cpu", threads=1, log_every=20,
    )  # fmt: skip

    def model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1).double()

    trained, task = model(), _Regression()
    train(task, trained, config, tmp_path, progress=False)

    net, clipped, losses = model(), 0, []
    opt = torch.optim.AdamW(
        net.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    for step in range(config.steps):
        factor = lr_factor(config, step)
        for group in opt.param_groups:
            group["lr"] = config.lr * factor
        total, count = task.loss(net, task.batch(step, config.batch_size, "cpu"))
        losses.append(float(total.detach() / count))
        (total / count).backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), config.clip)
        clipped += bool(norm > config.clip)
        opt.step()
        opt.zero_grad()
    assert 0 < clipped < config.steps  # the clip is active on some steps, not on all
    for got, want in zip(trained.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    every = config.log_every
    assert [r["step"] for r in rows] == list(range(every - 1, config.steps, every))
    for r in rows:  # equal batches: the items' mean is the mean of the steps' means
        window = losses[r["step"] + 1 - every : r["step"] + 1]
        assert r["loss"] == pytest.approx(sum(window) / every, rel=1e-6)  # summed in fp32


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "a.json"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temp files left


def test_atomic_write_syncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """Durable on a power cut: the data reach the disk (fsync of the temporary file) before the
    rename makes them the file, and the rename reaches it (fsync of the folder) after."""
    import attnzoo.core.files as files

    events, fsync, replace = [], os.fsync, os.replace

    def spy_fsync(fd):
        events.append(("fsync", "folder" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        return fsync(fd)

    def spy_replace(src, dst):
        events.append(("replace", Path(dst).name))
        return replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", spy_fsync)
    monkeypatch.setattr(files.os, "replace", spy_replace)
    atomic_write(tmp_path / "a.json", b"one")
    assert events == [("fsync", "file"), ("replace", "a.json"), ("fsync", "folder")]


def test_weights_missing_a_layer_are_refused(tmp_path):
    """A checkpoint without one of the model's layers is a CheckpointError, never a model whose
    missing layer keeps its random initial weights (a non-strict load)."""
    from attnzoo.train.checkpoint import CheckpointError, load_model_weights, save_checkpoint

    small = torch.nn.Sequential(torch.nn.Linear(3, 3))
    opt = torch.optim.AdamW(small.parameters())
    save_checkpoint(tmp_path, 0, small, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1))
    folder = latest_checkpoint(tmp_path)
    large = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    with pytest.raises(CheckpointError, match="weights that fit"):
        load_model_weights(folder, large)
    opt2 = torch.optim.AdamW(large.parameters())
    with pytest.raises(CheckpointError, match="weights that fit"):
        load_checkpoint(folder, large, opt2, torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1))


def test_checkpoint_round_trip_restores_everything(tmp_path):
    from attnzoo.train.checkpoint import save_checkpoint

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    for _ in range(3):
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
        sched.step()
    save_checkpoint(tmp_path, 2, model, opt, sched)
    expected_next, python_next = torch.rand(3), random.random()
    random.seed(123)  # a state the load must replace
    folder = latest_checkpoint(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["state.json", "tensors.safetensors"]
    model2 = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2)
    )
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1 / (s + 1))
    assert load_checkpoint(folder, model2, opt2, sched2) == 2
    assert torch.equal(torch.rand(3), expected_next)  # RNG restored
    assert random.random() == python_next  # Python's too: saved as it was, restored
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert sched2.get_last_lr() == sched.get_last_lr()
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg_sq"], s2[k]["exp_avg_sq"]) for k in s1)


def _weights(run: Path):
    return load_file(latest_checkpoint(run / "checkpoints") / "tensors.safetensors")


def _state(run: Path) -> dict:
    return json.loads((latest_checkpoint(run / "checkpoints") / "state.json").read_text())


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    r = cli(
        "train",
        "bahdanau",
        "--task",
        "dates",
        "--out",
        str(full),
        "--no-progress",
        *sets(["train.steps=60"]),
    )
    assert r.returncode == 0, r.stderr
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnzoo.cli",
            "train",
            "bahdanau",
            "--task",
            "dates",
            "--out",
            str(killed),
            "--no-progress",
            *sets(["train.steps=60"]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pointer = killed / "checkpoints" / "latest.json"
    deadline = time.time() + 240
    while time.time() < deadline:
        if pointer.exists() and json.loads(pointer.read_text())["step"] >= 19:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = json.loads(pointer.read_text())["step"]
    assert saved < 59, "the run finished before it could be killed"
    before = saved_timing(killed / "checkpoints" / f"step_{saved:08d}")  # what the kill left
    r = cli("train", "--resume", "--out", str(killed), "--no-progress")
    assert r.returncode == 0, r.stderr
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the rest of the checkpoint too: the Python random state it saves is the seed's (an
    # unseeded one made two runs of one command write different checkpoints)
    states = [_state(run) for run in (full, killed)]
    for state in states:
        state.pop("timing")
    assert states[0] == states[1]
    log = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert log == sorted(set(log))  # no duplicated log lines after resuming
    assert json.loads((full / "final.json").read_text()) == json.loads(
        (killed / "final.json").read_text()
    )
    # timing.json covers the whole run: the resumed one adds the time its checkpoint recorded
    # (the steps after that checkpoint, trained again, count once)
    timing = {d: json.loads((d / "timing.json").read_text()) for d in (full, killed)}
    assert timing[full]["steps_run"] == timing[killed]["steps_run"] == 60
    assert (timing[full]["sessions"], timing[killed]["sessions"]) == (1, 2)
    assert (before["steps_run"], before["sessions"]) == (saved + 1, 1)
    assert timing[killed]["train_seconds"] > before["train_seconds"] > 0
    assert all(t["train_seconds"] > 0 and t["eval_seconds"] > 0 for t in timing.values())


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
    reason="torchrun not installed",
)
def test_ddp_two_processes_match_one_process(tmp_path):
    """Same global batch: the 2-process loss curve equals the 1-process one within noise."""
    extra = ["model.dropout=0.0", "train.steps=30", "train.batch_size=16"]
    one, two = tmp_path / "one", tmp_path / "two"
    r = cli(
        "train", "bahdanau", "--task", "dates", "--out", str(one), "--no-progress", *sets(extra)
    )
    assert r.returncode == 0, r.stderr
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--standalone",  # a free port of its own: no clash with another job on the machine
            "-m",
            "attnzoo.cli",
            "train",
            "bahdanau",
            "--task",
            "dates",
            "--out",
            str(two),
            "--no-progress",
            *sets(extra),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    curve = [json.loads(x)["loss"] for x in (one / "metrics.jsonl").read_text().splitlines()]
    curve2 = [json.loads(x)["loss"] for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(curve) == len(curve2) == 3
    for a, b in zip(curve, curve2, strict=True):
        assert a == pytest.approx(b, rel=1e-3)


DDP_RUN = [
    "task.n_train=64",
    "task.n_valid=4",
    "task.n_test=4",
    "model.hidden=8",
    "model.dropout=0.5",
    "train.threads=1",
    "eval.limit=2",
    "train.batch_size=8",
    "train.log_every=2",
    "train.checkpoint_every=3",
    "train.schedule=constant",
]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
    reason="torchrun not installed",
)
def test_a_resumed_two_process_run_with_dropout_equals_an_uninterrupted_one(tmp_path):
    """Each process draws its own dropout masks: a checkpoint that kept rank 0's RNG state
    alone gave the resumed rank 1 rank 0's stream, and its weights left the uninterrupted
    run's from the first step after the resume. A 5-step run extended to 8 (the constant
    schedule allows it) now ends with the weights of an 8-step run."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch(out, *extra):
        command = [torchrun, "--nproc-per-node", "2", "--standalone", "-m"]  # a free port
        command += ["attnzoo.cli", "train", "luong", "--task", "reverse", "--out", str(out)]
        r = subprocess.run(
            [*command, "--no-progress", *extra],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-2000:]

    full, cut = tmp_path / "full", tmp_path / "cut"
    launch(full, *[x for s in [*DDP_RUN, "train.steps=8"] for x in ("--set", s)])
    launch(cut, *[x for s in [*DDP_RUN, "train.steps=5"] for x in ("--set", s)])
    launch(cut, "--resume", "--set", "train.steps=8")
    last = "checkpoints/step_00000007/tensors.safetensors"
    want, got = load_file(full / last), load_file(cut / last)
    differing = [k for k in want if k.startswith("model.") and not torch.equal(want[k], got[k])]
    assert not differing


AUTOCAST_RUN = [
    "model.d_model=16",
    "model.heads=2",
    "model.layers_enc=1",
    "model.layers_dec=1",
    "model.d_ff=32",
    "model.dropout=0.0",
    "task.n_train=200",
    "task.n_valid=10",
    "task.n_test=20",
    "train.steps=30",
    "train.batch_size=16",
    "train.log_every=10",
    "train.checkpoint_every=30",
    "train.threads=1",
    "eval.limit=10",
]


def test_bf16_autocast_follows_the_fp32_loss_curve(tmp_path):
    from attnzoo.cli import main

    curves = {}
    for precision in ("none", "bf16"):
        out = tmp_path / precision
        args = ["train", "transformer", "--task", "reverse", "--out", str(out), "--no-progress"]
        extra = [*AUTOCAST_RUN, f"train.autocast={precision}"]
        assert main([*args, *[x for s in extra for x in ("--set", s)]]) == 0
        assert json.loads((out / "config.json").read_text())["train"]["autocast"] == precision
        rows = (out / "metrics.jsonl").read_text().splitlines()
        curves[precision] = [json.loads(x)["loss"] for x in rows]
    fp32, bf16 = curves["none"], curves["bf16"]
    assert len(fp32) == len(bf16) == 3
    assert fp32 != bf16  # the bf16 run did compute in bfloat16
    for a, b in zip(fp32, bf16, strict=True):
        assert abs(a - b) <= max(0.15 * a, 0.1), (fp32, bf16)


class _ConvToy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)

    def forward(self, x):
        return self.conv(x).mean()


class _ConvTask:
    def batch(self, step, batch_size, device, rank=0, world=1):
        return torch.randn(batch_size, 1, 5, 5, generator=torch.Generator().manual_seed(step))

    def loss(self, model, batch):
        return model(batch).square() * len(batch), len(batch)

    def evaluate(self, model):
        return {"w": float(sum(p.sum() for p in model.parameters()))}


@pytest.mark.parametrize("onednn_bf16", [False, True])
@pytest.mark.parametrize("precision", ["none", "bf16"])
@pytest.mark.parametrize("convolutions", [False, True])
def test_bf16_autocast_says_when_convolutions_would_run_slow(
    convolutions, precision, onednn_bf16, tmp_path, capsys, monkeypatch
):
    """Only bf16 autocast of a model with convolutions, on a CPU whose oneDNN lacks bfloat16,
    is told (once) that they run on slow kernels."""
    from attnzoo.train import loop

    monkeypatch.setattr(loop, "_onednn_has_bf16", lambda: onednn_bf16)
    config = TrainConfig(
        steps=1, batch_size=2, warmup=0, threads=1, autocast=precision, device="cpu"
    )
    model = _ConvToy() if convolutions else _LinearToy()
    loop.train(_ConvTask(), model, config, tmp_path, progress=False)
    told = convolutions and precision == "bf16" and not onednn_bf16
    assert capsys.readouterr().err.count("reference kernels") == int(told)


class _LinearToy(torch.nn.Linear):  # no convolutions: (b, 1, 5, 5) -> a scalar
    def __init__(self):
        super().__init__(25, 1)

    def forward(self, x):
        return super().forward(x.flatten(1)).mean()


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_an_evaluation_step_between_log_steps_is_evaluated_and_logged(tmp_path):
    """eval_every that is not a multiple of log_every: every evaluation runs, its metrics on
    a row of its own step (it was skipped unless it fell on a log step)."""
    from attnzoo.train import loop

    config = TrainConfig(
        steps=12, batch_size=2, warmup=0, threads=1, device="cpu", log_every=2, eval_every=3,
        checkpoint_every=100,
    )  # fmt: skip
    loop.train(_ConvTask(), _LinearToy(), config, tmp_path, progress=False)
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows if "w" in r] == [2, 5, 8]  # the last step: final.json
    assert [r["step"] for r in rows] == [1, 2, 3, 5, 7, 8, 9, 11]


def test_batch_norm_of_a_job_of_several_processes(capsys):
    """SyncBatchNorm on CUDA (the global batch's statistics; the conversion itself needs no
    GPU); on the CPU, where it does not run, each process's share normalises: said."""
    from torch import nn

    from attnzoo.train import loop

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    synced = loop._sync_batch_norm(model, torch.device("cuda"), main=True)
    assert isinstance(synced[1], nn.SyncBatchNorm)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    assert loop._sync_batch_norm(model, torch.device("cpu"), main=True) is model
    assert "uses each process's share of the batch" in capsys.readouterr().err
    plain = nn.Linear(2, 2)
    assert loop._sync_batch_norm(plain, torch.device("cpu"), main=True) is plain
    assert capsys.readouterr().err == ""


def test_train_refuses_what_a_job_of_several_processes_cannot_train(monkeypatch):
    """train() called directly (not through the CLI) checks the job before any work: a batch
    smaller than the process count, or a model with several optimisers."""
    from attnzoo.train import loop

    def no_group(device):
        raise AssertionError("the process group was set up before the check")

    monkeypatch.setattr(loop, "launched_world", lambda: 2)
    monkeypatch.setattr(loop, "setup_distributed", no_group)
    config = TrainConfig(steps=1, batch_size=1, warmup=0, threads=1, device="cpu")
    with pytest.raises(ValueError, match="'batch_size' expected at least the 2 processes"):
        loop.train(_ConvTask(), _LinearToy(), config, None, progress=False)
    model = _LinearToy()
    model.optimizer_groups = lambda: []
    config = TrainConfig(steps=1, batch_size=4, warmup=0, threads=1, device="cpu")
    with pytest.raises(ValueError, match="'world' expected 1 process for a model with several"):
        loop.train(_ConvTask(), model, config, None, progress=False)


def test_each_process_of_a_job_seeds_a_stream_of_its_own(monkeypatch):
    """Seeded alike, every rank of a torchrun job drew the same dropout masks for its rows;
    rank 0 keeps the seed's stream (a one-process run's)."""
    from attnzoo.train import loop

    seeds = {}
    for rank in (0, 1, 2):
        monkeypatch.setattr(loop, "setup_distributed", lambda device, r=rank: loop.Distributed(r))
        config = TrainConfig(steps=1, batch_size=2, warmup=0, threads=1, device="cpu", seed=5)
        loop.train(_ConvTask(), _LinearToy(), config, None, progress=False)
        seeds[rank] = torch.initial_seed()
    assert seeds[0] == 5 and len(set(seeds.values())) == 3


@pytest.mark.parametrize("fails", [False, True])
def test_train_threads_are_the_runs_not_the_callers(tmp_path, fails):
    """train.threads sets torch's thread count for the run; the caller's comes back after it,
    also when the run fails (it stayed at the run's)."""
    from attnzoo.train import loop

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = TrainConfig(
            steps=2, batch_size=2, warmup=0, threads=1, device="cpu", checkpoint_every=100
        )
        task = _ConvTask()
        if fails:
            task.batch = None  # not callable: the run raises at its first step
        with pytest.raises(TypeError) if fails else contextlib.nullcontext():
            loop.train(task, _LinearToy(), config, tmp_path, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_checkpoint_writes_are_not_training_time(tmp_path, monkeypatch):
    """A clock that advances only while a checkpoint is written: train_seconds stays 0 (it
    counted every write, the last one always, so that a 10-step calibration charged the
    bigger model's checkpoint to its steps) and checkpoint_seconds holds them all; each
    checkpoint's saved timing excludes the writes before it."""
    from attnzoo.train import loop

    now = [0.0]
    saved = []
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])

    def save(folder, step, *args, timing, **kw):
        saved.append(timing)
        now[0] += 100.0

    monkeypatch.setattr(loop, "save_checkpoint", save)
    config = TrainConfig(
        steps=5, batch_size=2, warmup=0, threads=1, device="cpu", log_every=1,
        checkpoint_every=2,
    )  # fmt: skip
    loop.train(_ConvTask(), _LinearToy(), config, tmp_path, progress=False)
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert [t["steps_run"] for t in saved] == [2, 4, 5]  # every second step and the last
    assert all(t["train_seconds"] == 0 for t in saved)
    assert (timing["train_seconds"], timing["checkpoint_seconds"]) == (0, 300.0)


def test_a_resumed_run_adds_its_checkpoints_recorded_time(tmp_path, monkeypatch):
    """timing.json of a resumed run: the time its checkpoint recorded plus this process's, the
    steps and sessions likewise. On a clock that moves 10 s per read in the resumed process,
    against a recorded time no process could have taken (the SIGKILL test's wall clock could
    not tell a dropped `earlier` from a slow second process)."""
    from attnzoo.train import loop

    config = TrainConfig(
        steps=8, batch_size=2, warmup=0, threads=1, device="cpu", log_every=4,
        checkpoint_every=3, schedule="constant",
    )  # fmt: skip
    loop.train(_ConvTask(), _LinearToy(), config, tmp_path, progress=False)
    folder = tmp_path / "checkpoints" / "step_00000005"
    recorded = {"train_seconds": 1000.0, "eval_seconds_during": 7.0, "steps_run": 6}
    recorded["sessions"] = 3
    monkeypatch.setattr(loop, "saved_timing", lambda f: recorded if f == folder else None)
    ticks = iter(range(0, 10**6, 10))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(ticks)))
    loop.train(_ConvTask(), _LinearToy(), config, tmp_path, resume=folder, progress=False)
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert timing["steps_run"] == 6 + 2 and timing["sessions"] == 4  # steps 6 and 7 ran again
    assert timing["train_seconds"] > 1000.0  # this process's reads of the clock added to it
    assert timing["eval_seconds_during"] == 7.0  # no evaluation during this run
    ran = timing["train_seconds"] - 1000.0
    assert ran == int(ran) and ran % 10 == 0  # whole ticks of the fake clock: none lost


def test_a_logged_rate_is_the_one_its_step_trained_at(tmp_path):
    """The row of step s logged the scheduler's rate after its step, step s + 1's (the last
    row a rate of 0 under cosine, which no step used)."""
    from attnzoo.train import loop

    config = TrainConfig(
        steps=6, batch_size=2, warmup=3, threads=1, device="cpu", log_every=1, lr=0.01,
        checkpoint_every=100, schedule="cosine",
    )  # fmt: skip
    loop.train(_ConvTask(), _LinearToy(), config, tmp_path, progress=False)
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == list(range(6))
    for r in rows:
        assert r["lr"] == pytest.approx(0.01 * loop.lr_factor(config, r["step"]))
    assert rows[-1]["lr"] > 0


def test_a_resumed_log_equals_an_uninterrupted_one_between_log_steps(tmp_path):
    """checkpoint_every that is not a multiple of log_every: the resumed run's rows (steps and
    losses) equal the uninterrupted run's (its first window used to restart at the resume
    point and cover fewer steps under the same step number)."""
    from attnzoo.train import loop

    config = TrainConfig(
        steps=8, batch_size=2, warmup=0, threads=1, device="cpu", log_every=4,
        checkpoint_every=3, schedule="constant",
    )  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    for run in (full, resumed):
        run.mkdir()
        torch.manual_seed(0)
        loop.train(_ConvTask(), _LinearToy(), config, run, progress=False)
    shutil.rmtree(resumed / "checkpoints" / "step_00000007")  # as if killed after step 5
    torch.manual_seed(1)  # the resumed weights come from the checkpoint
    folder = resumed / "checkpoints" / "step_00000005"
    loop.train(_ConvTask(), _LinearToy(), config, resumed, resume=folder, progress=False)
    assert [r["step"] for r in _rows(full)] == [2, 3, 5, 7]
    for a, b in zip(_rows(full), _rows(resumed), strict=True):
        assert (a["step"], a["loss"]) == (b["step"], b["loss"])


def test_bad_autocast_is_a_one_line_error(capsys):
    from attnzoo.cli import main

    argv = ["train", "transformer", "--task", "reverse", "--set", "train.autocast=fp16"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "'train.autocast'" in err and "['none', 'bf16']" in err and "'fp16'" in err
    with pytest.raises(ValueError, match="'autocast'"):
        TrainConfig(autocast="float16")


def test_parameter_groups_follow_a_models_lr_scales():
    """One group at the run's rate unless the model scales some parameters (`lr_scales`): each
    factor is a group at lr * factor, the run's own first (the logged rate); every parameter
    is in exactly one group; a name the model lacks is an error naming the method."""
    from attnzoo.train.loop import parameter_groups

    plain = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    (group,) = parameter_groups(plain, 0.01)
    assert group["lr"] == 0.01 and len(group["params"]) == 4

    class Scaled(torch.nn.Sequential):
        def lr_scales(self):
            return {"1.weight": 0.5, "1.bias": 0.5, "0.bias": 2.0}

    model = Scaled(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    groups = parameter_groups(model, 0.01)
    assert groups[0]["lr"] == 0.01 and groups[0]["params"] == [model[0].weight]
    by_lr = {g["lr"]: {id(p) for p in g["params"]} for g in groups[1:]}
    assert by_lr == {0.005: {id(model[1].weight), id(model[1].bias)}, 0.02: {id(model[0].bias)}}
    optimizer = torch.optim.AdamW(groups, lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5)
    assert sorted(scheduler.get_last_lr()) == pytest.approx([0.0025, 0.005, 0.01])

    class Wrong(torch.nn.Linear):
        def lr_scales(self):
            return {"nope": 0.5}

    with pytest.raises(ValueError, match="Wrong.lr_scales: argument 'names'"):
        parameter_groups(Wrong(2, 2), 0.01)


class _DivergingTask(_ConvTask):
    """The toy's loss, NaN (or inf) from step `at` on: a run that diverged."""

    def __init__(self, at: int, bad: float = float("nan")):
        self.at, self.bad = at, bad

    def batch(self, step, batch_size, device, rank=0, world=1):
        return super().batch(step, batch_size, device), step

    def loss(self, model, batch):
        x, step = batch
        loss, count = super().loss(model, x)
        return (loss * self.bad if step >= self.at else loss), count


@pytest.mark.parametrize(
    ("log_every", "checkpoint_every", "kept", "logged", "steps"),
    # a checkpoint step also writes a row (its window ends there)
    [(2, 5, [], [1], "2 to 3"), (10, 2, ["step_00000001"], [1], "2 to 3")],
    ids=["at-a-log-step", "at-a-checkpoint-between-log-steps"],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_diverged_run_stops_before_it_saves_logs_or_evaluates_the_bad_steps(
    bad, log_every, checkpoint_every, kept, logged, steps, tmp_path
):
    """Without the check the loop trained on to the end, checkpointed NaN weights and wrote a
    final.json from a NaN model (whose argmax still gives a plausible accuracy)."""
    from attnzoo.train import loop

    config = TrainConfig(
        steps=10, batch_size=2, warmup=0, threads=1, device="cpu", log_every=log_every,
        checkpoint_every=checkpoint_every, eval_every=0,
    )  # fmt: skip
    pattern = rf"'loss' expected a finite training loss .*, got {bad} summed over steps {steps}"
    with pytest.raises(loop.DivergedError, match=pattern):
        loop.train(_DivergingTask(at=3, bad=bad), _LinearToy(), config, tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == kept
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines() if logged else []
    assert [json.loads(line)["step"] for line in lines] == logged
    assert not (tmp_path / "final.json").exists()


def test_evaluation_refuses_a_nan_in_any_output_of_the_model():
    """A NaN row's argmax (or a threshold) still gives a plausible prediction: `evaluate`
    refuses a NaN anywhere in the model's output, named by its field, and leaves no hook on
    the model. -inf (a masked log-probability) is an output like any other."""
    from dataclasses import dataclass as plain_dataclass
    from typing import NamedTuple

    from attnzoo.train import loop

    @plain_dataclass
    class Out:
        log_probs: torch.Tensor
        extra: tuple

    class Pair(NamedTuple):
        weights: torch.Tensor
        note: str

    class Toy(torch.nn.Module):
        def __init__(self, bad):
            super().__init__()
            self.bad = bad

        def forward(self, x):
            log_probs = torch.log_softmax(x, -1).masked_fill(x < -1, float("-inf"))
            weights = x.softmax(-1)
            if self.bad == "log_probs":
                log_probs[0, 1] = float("nan")
            if self.bad == "weights":
                weights[1, 0] = float("nan")
            return Out(log_probs, (Pair(weights, "ok"), None))

    class Accuracy:
        def evaluate(self, model):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
            return {"accuracy": float((model(x).log_probs.argmax(-1) == 0).float().mean())}

    assert "accuracy" in loop.evaluate(Accuracy(), Toy(None))
    for bad, field in (
        ("log_probs", "output.log_probs"),
        ("weights", r"output.extra\[0\].weights"),
    ):
        model = Toy(bad)
        with pytest.raises(loop.DivergedError, match=f"NaN in Toy's {field}"):
            loop.evaluate(Accuracy(), model)
        assert not model._forward_hooks
