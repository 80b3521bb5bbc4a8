"""The training loop's several-optimiser path (`attnzoo.train.loop`, a model's
`optimizer_groups`): each phase's loss is stepped into its own optimiser only, with its own lr
and betas, against a hand-written reference of the same updates; every optimiser and schedule
is checkpointed; a resumed GAN run equals an uninterrupted one (weights, optimiser states,
logs, per-step gammas, final metrics)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from attnzoo import runs
from attnzoo.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from attnzoo.train.loop import TrainConfig, train


class Toy(torch.nn.Module):
    """Two parameter groups; the "second" phase's loss reaches both (as a GAN's G step
    reaches D), so a gradient left on "first" would show."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(3, 3)
        self.second = torch.nn.Linear(3, 1)

    def optimizer_groups(self):
        return [
            ("first", list(self.first.parameters()), 0.05, (0.0, 0.9)),
            ("second", list(self.second.parameters()), 0.01, (0.5, 0.99)),
        ]

    def log_scalars(self):
        return {"bias": self.second.bias.detach()[0]}


class ToyTask:
    def batch(self, step, batch_size, device, rank=0, world=1):
        g = torch.Generator().manual_seed(step)
        return torch.randn(batch_size, 3, generator=g).to(device)

    def loss(self, model, batch, phase=None):
        hidden = torch.tanh(model.first(batch))
        if phase == "first":
            return (model.second(hidden) - 1).square().sum(), len(batch)
        return (model.second(hidden.detach() * 2) + hidden.sum(-1, keepdim=True)).square().sum(), (
            len(batch)
        )

    def evaluate(self, model):
        return {"w": float(model.second.weight.sum())}


def test_each_phase_steps_its_own_optimiser_as_a_hand_written_reference(tmp_path):
    config = TrainConfig(  # on the CPU, as the reference beside it (not "auto": CUDA's sums differ)
        steps=7,
        batch_size=5,
        schedule="cosine",
        warmup=2,
        clip=1.0,  # active on some steps, not all: AdamW hides a gradient's scale, not a clip's
        log_every=3,
        threads=1,
        device="cpu",
    )
    torch.manual_seed(0)
    model = Toy()
    reference = Toy()
    reference.load_state_dict(model.state_dict())
    train(ToyTask(), model, config, tmp_path, progress=False)

    from attnzoo.train.loop import lr_factor

    opts = {
        name: torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=0.0)
        for name, params, lr, betas in reference.optimizer_groups()
    }
    base = {name: lr for name, _, lr, _ in reference.optimizer_groups()}
    task = ToyTask()
    params = {name: p for name, p, _, _ in reference.optimizer_groups()}
    losses, clipped = {name: [] for name in opts}, 0
    for step in range(config.steps):
        batch = task.batch(step, config.batch_size, "cpu")
        for name, opt in opts.items():
            for group in opt.param_groups:
                group["lr"] = base[name] * lr_factor(config, step)
            loss, count = task.loss(reference, batch, phase=name)
            losses[name].append(float(loss.detach() / count))
            (loss / count).backward()
            norm = torch.nn.utils.clip_grad_norm_(params[name], config.clip)
            clipped += bool(norm > config.clip)
            opt.step()
            reference.zero_grad(set_to_none=True)
    assert 0 < clipped < config.steps * len(opts)
    for (n, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=n)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 5, 6]
    assert all({"loss_first", "loss_second", "lr_first", "lr_second"} <= r.keys() for r in rows)
    for r in rows:  # the rate each phase trained at in the logged step (not the next step's)
        for name in base:
            assert r[f"lr_{name}"] == pytest.approx(base[name] * lr_factor(config, r["step"]))
    starts = [0] + [r["step"] + 1 for r in rows[:-1]]
    for r, start in zip(rows, starts, strict=True):  # each phase's mean over its window's items
        for name in losses:
            window = losses[name][start : r["step"] + 1]
            assert r[f"loss_{name}"] == pytest.approx(sum(window) / len(window), rel=1e-5)
        assert r["loss"] == pytest.approx(r["loss_first"] + r["loss_second"])
    scalars = [json.loads(x) for x in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    assert [r["step"] for r in scalars] == list(range(7))  # every step
    assert scalars[-1]["bias"] == pytest.approx(float(model.second.bias[0].detach()))


def test_every_optimiser_and_schedule_is_checkpointed(tmp_path):
    model = Toy()
    groups = model.optimizer_groups()
    opts = {n: torch.optim.AdamW(p, lr=lr, betas=b) for n, p, lr, b in groups}
    scheds = {
        n: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (s + 1)) for n, o in opts.items()
    }
    batch = ToyTask().batch(0, 4, "cpu")
    for _ in range(3):
        for name in opts:
            loss, _ = ToyTask().loss(model, batch, phase=name)
            loss.backward()
            opts[name].step()
            scheds[name].step()
            model.zero_grad()
    folder = save_checkpoint(tmp_path, 2, model, opts, scheds)
    fresh = Toy()
    opts2 = {n: torch.optim.AdamW(p, lr=lr, betas=b) for n, p, lr, b in fresh.optimizer_groups()}
    scheds2 = {
        n: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (s + 1)) for n, o in opts2.items()
    }
    assert load_checkpoint(folder, fresh, opts2, scheds2) == 2
    for name in opts:
        s1, s2 = opts[name].state_dict(), opts2[name].state_dict()
        assert json.loads(json.dumps(s1["param_groups"])) == s2["param_groups"]  # betas: a list
        for k in s1["state"]:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(s1["state"][k][key], s2["state"][k][key]), (name, key)
        assert scheds[name].state_dict() == scheds2[name].state_dict()
    # a single-optimiser model cannot load it, nor the reverse
    single = torch.optim.AdamW(fresh.parameters())
    with pytest.raises(CheckpointError, match="optimizers"):
        load_checkpoint(
            folder, fresh, single, torch.optim.lr_scheduler.LambdaLR(single, lambda s: 1)
        )
    renamed = {"other": opts2["first"], "second": opts2["second"]}
    with pytest.raises(CheckpointError, match="optimizers"):
        load_checkpoint(folder, fresh, renamed, {"other": scheds2["first"], **scheds2})


def test_a_resumed_gan_run_equals_an_uninterrupted_one(tmp_path, mnist_classifier):
    sets = [
        "model.channels=8",
        "model.z_dim=8",
        "train.steps=6",
        "train.batch_size=4",
        "train.log_every=2",
        "train.checkpoint_every=2",
        "train.threads=1",
        "train.device=cpu",
        "task.n_fid=20",
        f"task.classifier={mnist_classifier}",
    ]
    config = runs.apply_overrides(runs.default_config("sagan", "gan_mnist"), sets)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    runs.run_train(config, full, progress=False)
    runs.run_train(config, resumed, progress=False)
    # as if killed after the step-3 checkpoint: the later one and the results are gone
    shutil.rmtree(resumed / "checkpoints" / "step_00000005")
    for name in ("final.json", "timing.json"):
        (resumed / name).unlink()
    runs.run_train(config, resumed, resume=True, progress=False)
    a = load_file(latest_checkpoint(full / "checkpoints") / "tensors.safetensors")
    b = load_file(latest_checkpoint(resumed / "checkpoints") / "tensors.safetensors")
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizers.discriminator.") for k in a)
    assert any(k.startswith("optimizers.generator.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name in ("final.json", "scalars.jsonl"):
        assert (full / name).read_text() == (resumed / name).read_text(), name

    def logged(run):  # the log without its timings
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "items_per_s"} for r in rows]

    assert logged(full) == logged(resumed)
    gammas = [json.loads(x) for x in (full / "scalars.jsonl").read_text().splitlines()]
    assert [r["step"] for r in gammas] == list(range(6))
    assert {"gamma_generator", "gamma_discriminator"} <= gammas[0].keys()
    state = json.loads((latest_checkpoint(full / "checkpoints") / "state.json").read_text())
    assert sorted(state["optimizer"]["groups"]) == ["discriminator", "generator"]
    assert sorted(state["scheduler"]["groups"]) == ["discriminator", "generator"]
    lrs = {
        g: state["optimizer"]["groups"][g]["param_groups"][0]["lr"]
        for g in ("discriminator", "generator")
    }
    assert lrs == {"discriminator": 4e-4, "generator": 1e-4}
    written = runs.write_figures(full, *runs.load_run(full, device="cpu")[1:], count=1)
    assert "scalars.png" in {p.name for p in written}


def test_optimizer_groups_with_lr_scales_is_an_error_naming_it():
    """Each phase's optimiser has its own lr, so a scale from `lr_scales` would be ignored."""

    class Scaled(Toy):
        def lr_scales(self):
            return {"first.weight": 0.1}

    with pytest.raises(ValueError, match="lr_scales"):
        train(ToyTask(), Scaled(), TrainConfig(steps=1, batch_size=2, device="cpu"), None)
