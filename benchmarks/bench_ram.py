"""Recurrent Attention Model experiments (Mnih et al. 2014) on the shared driver (_common.py).

Each trained row runs `attnzoo train MODEL --task TASK` with the row's overrides, in a fresh
process with one torch thread, through the driver's `train_worker` (a finished run in the
row's directory is reused, an interrupted one resumed), and reports the test error of one pass
with the mean locations (`error`) and of the class probabilities averaged over
`MnistConfig.mc_samples` sampled paths (`error_mc`), on the 10,000 official test digits:

- mnist: 28 x 28, 2 to 7 glimpses of 8 x 8, 1 scale (Table 1a);
- translated: 60 x 60, 4, 6 and 8 glimpses of 12 x 12, 3 scales (Table 1b);
- cluttered: 60 x 60 with 4 pieces of 8 x 8 clutter, 8 glimpses (Table 2);
- the FC (2 x 256) and two-layer convnet baselines on each, at the same steps and batch;
- `ABLATIONS`: mnist-g6 without each regulariser and with a wider policy, translated-g6 at
  twice and four times its steps, and translated-g6 and cluttered-g8 with an LSTM core (full
  budget only).

`speed` times, in one process and interleaved: the retinas of 6 glimpses (batch 128, 3 scales
of 12 x 12 on 60 x 60) by the sensor's two samplers (`F.grid_sample`, a gather of clamped
indices) and by cropping each patch at full size then pooling; and a RAM training step (batch
128, 6 glimpses, 3 scales) against the same model whose retina loops over the batch in Python.

    python benchmarks/bench_ram.py [--budget smoke|full] [--only GROUP ...] [--seeds N]
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import _common as C
from _common import Bench, Experiment, Table, Target, columns, drive

SEEDS = 3
# train steps and batch of every trained row at the full budget, per task (baselines at their
# task's), and the CPU-minutes one RAM seed takes. Calibrated at one thread, batch 64 (medians
# of 20 steps): RAM 6 glimpses ~16-18 ms a step on 28 x 28, ~14-16 ms on 60 x 60 (3 scales),
# 8 glimpses ~19 ms; FC ~4 / ~7 ms; the convnet ~14 / ~34 ms, on a quiet core. The 2-core CPU
# these runs share with ~6 other processes gives one run a third to a half of a core (RAM at
# 30-100 ms a step), so the budgets are sized for that: each run fits well inside the issue's
# 60 minutes there, and is a small fraction of the paper's training.
FULL = {
    "mnist": {"steps": 50_000, "batch_size": 64},
    "translated_mnist": {"steps": 30_000, "batch_size": 64},
    "cluttered_mnist": {"steps": 50_000, "batch_size": 64},
}
MINUTES = {"mnist": 40.0, "translated_mnist": 10.0, "cluttered_mnist": 40.0}  # measured: 39, 7, -
SMOKE = {"steps": 10, "batch_size": 16}
SMOKE_SETS = ["task.n_test=64", "task.mc_samples=2", "model.hidden=32"]
TASK_NAMES = {"mnist": "mnist", "translated": "translated_mnist", "cluttered": "cluttered_mnist"}
# a base row with changes: id -> (base id, sets): the 28 x 28 run without each of its two
# regularisers (the random first glimpse, weight decay), and with a wider location policy;
# the 60 x 60 run at twice and four times its steps (how much of its gap to the paper is budget);
# the 60 x 60 runs with an LSTM core (the paper's RAM core for its dynamic environment, not for
# classification), a second setting tried after the rectifier core missed the translated and
# cluttered targets: a 30,000-step probe on the translated validation digits read 2.34 % against
# the rectifier core's 3.83 % (seed 0), where probes of the policy's std (0.05, 0.2, learned)
# and a learning rate of 3e-3 read 3.89 to 4.62 %. (A probe, 2026-11-29: translated-g6-lstm with
# `model.bound=pull`, DRAM's fix for means lost past the border, in place of the tanh mean: 2.70
# and 2.76 % test error, seeds 0 and 1, against the row's 1.91 and 2.48 %; so not a row.)
STD_ABLATION = 0.17
TRANSLATED_STEPS = FULL["translated_mnist"]["steps"]
CLUTTERED_STEPS = FULL["cluttered_mnist"]["steps"]
LSTM = "model.core=lstm"
LSTM_COST = 1.65  # an LSTM-core step over a rectifier-core step (60 x 60, batch 64, one thread)
ABLATIONS = {
    "mnist-g6-centre": ("mnist-g6", ["model.start=centre"]),
    "mnist-g6-wd0": ("mnist-g6", ["train.weight_decay=0"]),
    "mnist-g6-std0.17": ("mnist-g6", [f"model.std={STD_ABLATION}"]),
    **{
        f"translated-g6-steps{k}x": ("translated-g6", [f"train.steps={k * TRANSLATED_STEPS}"])
        for k in (2, 4)
    },
    "translated-g6-lstm": ("translated-g6", [LSTM]),
    "translated-g6-lstm-steps4x": ("translated-g6", [LSTM, f"train.steps={4 * TRANSLATED_STEPS}"]),
    "cluttered-g8-lstm": ("cluttered-g8", [LSTM]),
    # added after cluttered-g8-lstm missed 6 % by 0.11 (5.97, 6.09, 6.27): how much is budget
    "cluttered-g8-lstm-steps1.5x": (
        "cluttered-g8",
        [LSTM, f"train.steps={CLUTTERED_STEPS * 3 // 2}"],
    ),
}

# Mnih et al. 2014 (NIPS version), test error %: Table 1a (28 x 28), 1b (60 x 60), 2 (cluttered),
# per kind by glimpses or baseline
PAPER = {
    "mnist": {2: 3.79, 3: 1.51, 4: 1.54, 5: 1.34, 6: 1.12, 7: 1.07, "fc": 1.69, "convnet": 1.21},
    "translated": {4: 1.54, 6: 1.22, 8: 1.20, "fc": 2.63, "convnet": 1.62},
    "cluttered": {8: 4.04},
}


def experiments(budget: str) -> list[Experiment]:
    smoke = budget == "smoke"
    seeds = 1 if smoke else SEEDS
    rows = [("mnist", g, 8, 1) for g in range(2, 8)]
    rows += [("translated", g, 12, 3) for g in (4, 6, 8)] + [("cluttered", 8, 12, 3)]
    if smoke:  # 4 workers in 2 rounds: 28 x 28 and 60 x 60 RAM, one baseline, the timings
        rows = [r for r in rows if (r[0], r[1]) in {("mnist", 6), ("cluttered", 8)}]
    out = []
    for kind, glimpses, patch, scales in rows:
        model = "ram" if kind == "mnist" else "ram-translated"
        sets = [f"model.glimpses={glimpses}", f"model.patch={patch}", f"model.scales={scales}"]
        out.append(_trained(f"{kind}-g{glimpses}", kind, model, sets, seeds, smoke))
    for kind in ("mnist", "translated", "cluttered"):
        for model in ("fc", "convnet"):
            if smoke and (kind, model) != ("mnist", "fc"):
                continue
            out.append(_trained(f"{kind}-{model}", f"{kind}-baselines", model, [], seeds, smoke))
    if not smoke:  # the ablations: a base row's experiment with changes (full budget only)
        base = {e.id: e for e in out}
        for id_, (of, changes) in ABLATIONS.items():
            params = {**base[of].params, "sets": [*base[of].params["sets"], *changes]}
            minutes = base[of].minutes * _steps(params["sets"]) / _steps(base[of].params["sets"])
            minutes *= LSTM_COST if LSTM in changes else 1.0
            group = f"{of.split('-')[0]}-ablations"
            out.append(replace(base[of], id=id_, group=group, params=params, minutes=minutes))
    repeats = 3 if smoke else 20
    retina = {"batch": 128, "glimpses": 6, "patch": 12, "scales": 3}
    out.append(Experiment("speed", "speed", {"repeats": repeats, **retina}, minutes=1.0))
    return out


def _steps(sets: list[str]) -> int:
    """The train.steps a list of overrides sets (the last one wins, as in `attnzoo train`)."""
    return int([s for s in sets if s.startswith("train.steps=")][-1].split("=")[1])


def _trained(id_, group, model, sets, seeds, smoke) -> Experiment:
    kind = id_.split("-")[0]
    task = TASK_NAMES[kind]
    train = SMOKE if smoke else FULL[task]
    paper_key = model if model in ("fc", "convnet") else int(id_.split("g")[-1])
    smaller = C.read_sets(SMOKE_SETS, model, task) if smoke else []
    sets = [*sets, *(f"train.{k}={v}" for k, v in train.items()), *smaller]
    params = {"model": model, "task": task, "sets": sets}
    params["paper_error"] = PAPER[kind].get(paper_key)
    minutes = 0.2 if smoke else MINUTES[task]
    return Experiment(id_, group, params, seeds=seeds, minutes=minutes)


def worker(params, ctx) -> dict:
    if params.get("repeats"):
        return speed(params)
    metrics, _, task, model = C.train_worker(
        params["sets"], params["model"], params["task"], ctx, figures=3
    )
    return {**metrics, **pixels_read(task, model)}


def pixels_read(task, model) -> dict:
    """Values a model takes in per image: a hard-attention model's retinas (glimpses x scales x
    patch^2 x channels, each value the mean of its scale's f x f pixels), else every pixel;
    and their ratio to the image's pixels (what a convnet processes)."""
    import torch

    x = task.batch(0, 1, "cpu").images  # (1, channels, H, W)
    sensor = getattr(getattr(model, "glimpse", None), "sensor", None)
    read = x.numel()
    if sensor is not None:
        with torch.no_grad():
            steps = model(x.to(next(model.parameters()).device), sample=False).locations.shape[1]
        read = steps * sensor.scales * sensor.patch**2 * x.shape[1]
    return {"pixels_read": read, "pixels_read_ratio": read / x.numel()}


def speed(params) -> dict:
    """Interleaved timings on translated MNIST: the retinas of `glimpses` glimpses (`scales`
    patches of `patch` at each) by each sensor and by cropping every patch at full size then
    pooling; a RAM step batched vs one whose retina loops over the images."""
    import copy

    import torch
    import torch.nn.functional as F

    from attnzoo.models.ram import RAM, GlimpseSensor, patch_corners, ram_translated
    from attnzoo.tasks.registry import TASKS

    class LoopSensor(GlimpseSensor):
        """The same retina, one image at a time (the per-sample Python loop): each image's
        pyramid built once per forward pass, as the batched sensor builds the batch's."""

        def prepare(self, images):
            parent = super()
            return [parent.prepare(images[i : i + 1]) for i in range(images.shape[0])]

        def read(self, prepared, location):
            parent = super()
            return torch.cat([parent.read(p, location[i : i + 1]) for i, p in enumerate(prepared)])

    def crop_then_pool(images, location):  # every patch read at full size, then pooled
        corners, out = patch_corners(location, canvas, canvas, patch, scales), []
        for s in range(scales):
            side, top = patch * 2**s, corners[:, s].unsqueeze(1).float() + 0.5  # (b, 1, 2)
            pix = (top + torch.arange(side).view(1, -1, 1)) / (canvas / 2) - 1  # (b, side, 2)
            grid = torch.stack(torch.broadcast_tensors(pix[:, None, :, 1], pix[:, :, None, 0]), -1)
            window = F.grid_sample(images, grid, mode="nearest", align_corners=False)
            out.append(F.avg_pool2d(window, 2**s))  # (b, 1, patch, patch)
        return torch.stack(out, 1)

    def retina(sensor, images):  # as RAM reads them: the image filtered once, then each glimpse
        prepared = sensor.prepare(images)
        return [sensor.read(prepared, w) for w in where]

    torch.manual_seed(0)
    repeats, batch, glimpses = params["repeats"], params["batch"], params["glimpses"]
    patch, scales = params["patch"], params["scales"]
    spec = TASKS["translated_mnist"]
    task = spec.build(spec.default_config(), seed=0, eval_config=spec.eval_config())
    canvas = task.model_dims()["image_size"][0]
    images = torch.rand(batch, 1, canvas, canvas)
    where = torch.rand(glimpses, batch, 2) * 2.4 - 1.2
    sensors = {m: GlimpseSensor(patch, scales, m) for m in ("grid", "index")}
    retinas = {m: (lambda s=s: retina(s, images)) for m, s in sensors.items()}
    retinas["crop_then_pool"] = lambda: [crop_then_pool(images, w) for w in where]
    torch.testing.assert_close(retinas["crop_then_pool"]()[0], retinas["index"]()[0])
    sensor_times = C.time_interleaved(retinas, repeats=10 * repeats, warmup=3)
    data = task.batch(0, batch, "cpu")
    config = ram_translated(glimpses=glimpses, patch=patch, scales=scales)
    batched = RAM(config, (canvas, canvas), 1, 10)
    looped = copy.deepcopy(batched)
    looped.glimpse.sensor = LoopSensor(patch, scales)

    def step(model, optimizer):
        loss, count = task.loss(model, data)
        optimizer.zero_grad()
        (loss / count).backward()
        optimizer.step()

    # the same weights and sampled paths: the same loss (the loop does the batched step's work)
    torch.testing.assert_close(task.loss(looped, data)[0], task.loss(batched, data)[0])
    optimizers = {m: torch.optim.Adam(m.parameters(), lr=1e-4) for m in (batched, looped)}
    models = {"batched": batched, "loop": looped}
    step_times = C.time_interleaved(
        {n: (lambda m=m: step(m, optimizers[m])) for n, m in models.items()},
        repeats=repeats,
        warmup=1,
    )
    ms = {f"retina_ms_{m}": 1e3 * C.median(t) for m, t in sensor_times.items()}
    ms.update({f"step_ms_{n}": 1e3 * C.median(t) for n, t in step_times.items()})
    return {
        **ms,
        "retina_index_over_grid": ms["retina_ms_index"] / ms["retina_ms_grid"],
        "step_speedup": ms["step_ms_loop"] / ms["step_ms_batched"],
        "threads": torch.get_num_threads(),
    }


ERRORS = columns("row=id; paper error %=params.paper_error; error % (mean locations)=error")
ERRORS += columns("error % (Monte Carlo)=error_mc") + columns("minutes=train_minutes", 1)
SPEED = columns(
    "batch=params.batch; glimpses=params.glimpses; retinas: grid_sample ms=retina_ms_grid"
)
SPEED += columns("gather ms=retina_ms_index; crop, then pool ms=retina_ms_crop_then_pool")
SPEED += columns("RAM step ms=step_ms_batched; per-image loop step ms=step_ms_loop", 1)
SPEED += columns("speed-up=step_speedup", 1)
TABLES = [
    Table(
        "28 x 28 MNIST, 8 x 8 glimpses (Table 1a)",
        ERRORS,
        ["mnist", "mnist-ablations", "mnist-baselines"],
    ),
    Table(
        "60 x 60 translated MNIST, 12 x 12 glimpses at 3 scales (Table 1b)",
        ERRORS,
        ["translated", "translated-baselines"],
    ),
    Table("60 x 60 cluttered MNIST (Table 2)", ERRORS, ["cluttered", "cluttered-baselines"]),
    Table("speed (ms, medians, interleaved)", SPEED, ids=["speed"]),
]


def figures(data: dict, folder: Path, runs: Path) -> list[Path]:
    """The glimpse figures (Mnih 2014, Fig. 3 layout) of seed 0 of the 6-glimpse runs, copied
    from their run dirs where they exist."""
    shown = {
        f"ram_{i}_glimpses_{kind}.png": C.run_folder(runs, "ram", i, 0)
        / f"figures/glimpses_{kind}.png"
        for i in ("mnist-g6", "translated-g6")
        for kind in ("correct", "wrong")
    }
    return C.copy_run_figures(shown, folder)


def derive(summary: dict) -> dict[str, dict]:
    """RAM's error minus the FC baseline's on the same task at the same steps and batch, paired
    by seed, where both ran; the location policy's std, default and ablation's."""
    out = {}
    for kind, ram_id in (("mnist", "mnist-g6"), ("translated", "translated-g6")):
        if gaps := C.paired(summary, "error", ram_id, f"{kind}-fc"):
            out[f"{kind}-ram-minus-fc"] = {"error": gaps}
    from attnzoo.models.ram import RAMConfig

    out["std"] = {"default": RAMConfig().std, "ablation": STD_ABLATION}  # the ablation's sides
    return out


TARGETS = [
    Target("MNIST 6 glimpses: error <= 1.3%", "mnist-g6", "error", "<=", 1.3, "issue 12"),
    Target("translated 6 glimpses: error <= 1.6%", "translated-g6", "error", "<=", 1.6, "issue 12"),
    Target("cluttered 8 glimpses: error <= 6% (paper 4.04%)", "cluttered-g8", "error", "<=", 6.0,
           "issue 12; Mnih 2014 Table 2"),
    Target("translated 6 glimpses: error below the FC baseline's (same steps and batch)",
           "translated-ram-minus-fc", "error", "<", 0.0, "issue 12"),
    Target("translated 6 glimpses, LSTM core, four times the steps: error <= 1.6%",
           "translated-g6-lstm-steps4x", "error", "<=", 1.6, "issue 12"),
    Target("cluttered 8 glimpses, LSTM core: error <= 6%", "cluttered-g8-lstm", "error", "<=",
           6.0, "issue 12"),
    Target("cluttered 8 glimpses, LSTM core, 1.5 times the steps: error <= 6%",
           "cluttered-g8-lstm-steps1.5x", "error", "<=", 6.0, "issue 12"),
    Target("RAM step >= 5x the per-image loop", "speed", "step_speedup", ">=", 5.0, "issue 12"),
]  # fmt: skip
# in the JSON as "method": the docs list every experiment, run or not, beside the paper
METHOD = {
    "paper": "Mnih et al. 2014, NIPS version: Table 1a (28 x 28), 1b (60 x 60), 2 (cluttered)",
    "paper_error": {
        f"{kind}-{key}" if isinstance(key, str) else f"{kind}-g{key}": error
        for kind, errors in PAPER.items()
        for key, error in errors.items()
    },
    "full_budget": {kind: FULL[task] for kind, task in TASK_NAMES.items()},
    "declared_steps": {
        e.id: _steps(e.params["sets"]) for e in experiments("full") if "sets" in e.params
    },
    "full_minutes": {kind: MINUTES[task] for kind, task in TASK_NAMES.items()},
    "seeds": SEEDS,
}
BENCH = Bench("ram", __file__, experiments, worker, TARGETS, TABLES, derive=derive,
              figures=figures, method=METHOD)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
