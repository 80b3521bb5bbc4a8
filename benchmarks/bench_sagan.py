"""Self-Attention GAN experiments (Zhang et al. 2018) on `gan_mnist` (MNIST padded to 32 x 32),
on the shared driver. Rows, run in this order by one worker at a time (`jobs=1`: the GAN rows
read the classifier's run):

- classifier: the MNIST classifier the GAN metrics use (`convnet` on `mnist`, trained by the
  one loop; its test accuracy must reach 99%); its run dir is the GAN rows' `task.classifier`;
- sagan, sagan-noattn: the GAN with and without the self-attention blocks (parameter counts
  within 2%), the same steps and batch, 3 seeds each, scored by FID (torchmetrics'
  `FrechetInceptionDistance` on the classifier's penultimate features) against the official
  test digits and by the generated-sample class accuracy;
- sagan-8x8: the blocks on the 8 x 8 maps instead of the 16 x 16 ones (`model.attention_side`;
  Zhang 2018's Table 1 compares such placements), the same budget and seeds;
- floor: the real-data floor: the same FID between training digits and the test digits, at
  the same sample size.

The budget (`FULL`: 5,000 steps of 64 images, about 5 epochs) is sized to the issue's 30
minutes per run with attention on one thread of this CPU: 19-24 with the machine otherwise idle
or nearly (the JSON's train minutes); 31-36 in an earlier measurement beside another run.
Zhang 2018's numbers are ImageNet 128 x 128: a different dataset and scale.

    python benchmarks/bench_sagan.py [--budget smoke|full] [--only ID ...] [--seeds N]
"""

from __future__ import annotations

import operator
from pathlib import Path

import _common as C
from _common import Bench, Experiment, Table, columns, drive, targets

MODELS = ("sagan", "sagan-noattn")
# ~4 min on one thread; weight decay 0, the recipe the FID features of the rows were made with
# (the mnist task's default decay came later, for RAM)
CLASSIFIER = ["model.channels=16", "train.steps=5000", "train.weight_decay=0"]
# the GAN budget: ~0.4 s a step with attention at batch 64 on one thread beside another run,
# ~0.17 without; a 1,000-image probe of the baseline classed 12 % of its samples right at 1,000
# steps, 78 % at 3,000 and 98 % at 5,000 (the class condition is learned late: at 1,000 steps
# the generator's output barely changed with the label while its discriminator already told
# labels apart)
STEPS, EVAL_EVERY = 5000, 1000
FULL = [f"train.steps={STEPS}", "train.batch_size=64", f"train.eval_every={EVAL_EVERY}"]
CURVE = range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)  # the steps whose class accuracy is reported
MINUTES = {"classifier": 4.0, "sagan": 24.0, "sagan-8x8": 14.0, "sagan-noattn": 15.0, "floor": 0.5}
# the GAN rows: (id, model, what they set beyond the budget); measured minutes above
GANS = (("sagan", "sagan", []), ("sagan-8x8", "sagan", ["model.attention_side=8"]))
GANS += (("sagan-noattn", "sagan-noattn", []),)
SEEDS = 3
SMOKE_CLASSIFIER = ["model.channels=2", "model.hidden=8", "train.steps=3", "train.batch_size=8"]
SMOKE_CLASSIFIER += ["task.n_test=16", "task.n_valid=16"]
SMOKE = ["train.steps=2", "train.batch_size=4", "model.channels=8", "model.z_dim=8"]
SMOKE += ["task.n_fid=20", "train.checkpoint_every=1"]
# Zhang 2018 (arXiv:1805.08318) abstract, class-conditional ImageNet 128 x 128 (PAPERS.md)
PAPER = {"imagenet_fid": 18.65, "imagenet_is": 52.52}


NEEDS = ("classifier",)  # the FID's features and the class accuracy: the classifier's run


def experiments(budget: str) -> list[Experiment]:
    smoke = budget == "smoke"
    classifier = {"model": "convnet", "task": "mnist"}
    classifier["sets"] = SMOKE_CLASSIFIER if smoke else CLASSIFIER
    minutes = {"classifier": 0.1, "floor": 0.1} if smoke else MINUTES
    rows = [Experiment("classifier", "classifier", classifier, 1, minutes["classifier"])]
    for id, model, sets in GANS:
        params = {"model": model, "task": "gan_mnist", "sets": [*(SMOKE if smoke else FULL), *sets]}
        seeds, cost = (1, 0.2) if smoke else (SEEDS, MINUTES[id])
        rows.append(Experiment(id, "gan", params, seeds, cost, needs=NEEDS))
    floor_sets = ["task.n_fid=20"] if smoke else []
    floor = Experiment("floor", "floor", {"sets": floor_sets}, 1, minutes["floor"], needs=NEEDS)
    rows.append(floor)
    return rows


def worker(params: dict, ctx: C.Context) -> dict:
    if ctx.id == "classifier":
        metrics, *_ = C.train_worker(params["sets"], "convnet", "mnist", ctx)
        return metrics
    classifier = f"task.classifier={C.sibling_run(ctx, 'classifier')}"
    if ctx.id == "floor":
        return floor(params["sets"], classifier)
    sets = [*params["sets"], classifier]
    metrics, config, _, _ = C.train_worker(
        sets, params["model"], "gan_mnist", ctx, curve="class_accuracy"
    )
    for point in metrics.pop("curve"):  # the evaluations during the run (train.eval_every)
        metrics[f"class_accuracy_step{point['step']}"] = point["class_accuracy"]
    metrics["n_fid"] = config["task"]["n_fid"]
    metrics["gamma_curve_steps"] = len(_gammas(Path(ctx.run_dir)))
    return metrics


def floor(sets: list[str], classifier: str) -> dict:
    """The real-data floor: FID between n_fid training images and the first n_fid test images,
    and the classifier's accuracy on those test images."""
    import torch

    from attnzoo import runs
    from attnzoo.tasks.registry import TASKS

    config = runs.apply_overrides(runs.default_config("sagan", "gan_mnist"), [*sets, classifier])
    c = runs.configs(config)
    task = TASKS["gan_mnist"].build(c["task"], seed=0, eval_config=c["eval"])
    runs.attach_runs(task)  # loads the classifier's run
    with torch.no_grad():
        features = task.classifier(torch.device("cpu"))
        real, labels = task.reference("test")
        fid = task.fid(features, real, task.floor_images(len(real)))
        predicted = torch.cat([features.classify(x) for x in real.split(256)])
    accuracy = 100.0 * float((predicted == labels).double().mean())
    return {"fid": fid, "fid_floor": fid, "classifier_accuracy": accuracy, "n_fid": len(real)}


def _gammas(run_dir: Path) -> list[dict]:
    """The run's per-step scalars (the loop's scalars.jsonl; none when the run is absent)."""
    from attnzoo.train.files import read_metrics

    path = Path(run_dir) / "scalars.jsonl"
    return read_metrics(path, None) if path.exists() else []


def derive(summary: dict) -> dict:
    """Zhang 2018's numbers; per seed, FID with attention minus without, and the parameter
    count of the baseline over the attention model's."""
    from dataclasses import asdict

    from attnzoo.models.sagan import sagan
    from attnzoo.tasks.gan_mnist import GanMnistConfig

    setup = {
        k: v
        for k, v in asdict(sagan()).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    setup.update(side=GanMnistConfig().side, pad=GanMnistConfig().pad, curve_steps=list(CURVE))
    return {
        "paper": PAPER,
        "setup": setup,
        "compare": {
            "fid_attn_minus_noattn": C.paired(summary, "fid", "sagan", "sagan-noattn"),
            "fid_attn8_minus_noattn": C.paired(summary, "fid", "sagan-8x8", "sagan-noattn"),
            "fid_attn8_minus_attn": C.paired(summary, "fid", "sagan-8x8", "sagan"),
            "noattn_params_over_attn": C.paired(summary, "params", *MODELS[::-1], operator.truediv),
            "noattn_params_over_attn8": C.paired(
                summary, "params", "sagan-noattn", "sagan-8x8", operator.truediv
            ),
            "attn_minutes_over_noattn": C.paired(
                summary, "train_minutes", *MODELS, operator.truediv
            ),
            "attn8_minutes_over_noattn": C.paired(
                summary, "train_minutes", "sagan-8x8", "sagan-noattn", operator.truediv
            ),
        },
    }


def figures(data: dict, folder: Path, runs: Path) -> list[Path]:
    """Seed 0's samples per class and attention maps (Zhang 2018, Fig. 1), and every seed's
    gammas per step, from the full-budget run dirs where they exist."""
    shown = {
        "sagan": ("samples", "attention"),
        "sagan-8x8": ("samples", "attention"),
        "sagan-noattn": ("samples",),
    }
    pairs = {
        f"{i.replace('-', '_')}_{name}.png": C.run_folder(runs, "sagan", i, 0)
        / f"figures/{name}.png"
        for i, names in shown.items()
        for name in names
    }
    written = C.copy_run_figures(pairs, folder)
    seeds = [_gammas(C.run_folder(runs, "sagan", "sagan", s)) for s in range(SEEDS)]
    seeds = [rows for rows in seeds if rows]
    if seeds:
        from attnzoo.viz.gan import scalars_figure

        curves, styles = {}, {}
        for s, rows in enumerate(seeds):
            for name, dash in (("gamma_generator", "-"), ("gamma_discriminator", "--")):
                label = f"{name.removeprefix('gamma_')}, seed {s}"
                curves[label] = ([r["step"] for r in rows], [r[name] for r in rows])
                styles[label] = {"color": f"C{s}", "linestyle": dash}
        title = "attention blocks' gamma, every step (solid: generator, dashed: discriminator)"
        fig = scalars_figure(curves, ylabel="gamma", title=title, styles=styles)
        path = Path(folder) / "sagan_gamma.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


TARGETS = targets(
    "issue 13",
    ("classifier: test accuracy % >= 99", "classifier", "accuracy", ">=", 99),
    ("FID with attention < without (paired by seed)", "compare", "fid_attn_minus_noattn", "<", 0),
    ("FID with attention on the 8 x 8 maps < without (paired by seed)", "compare",
     "fid_attn8_minus_noattn", "<", 0),
    *((f"{id}: generated-sample class accuracy % >= 95", id, "class_accuracy", ">=", 95)
      for id in ("sagan", "sagan-8x8")),
    *((f"{id}: training minutes <= 30", id, "train_minutes", "<=", 30) for id, *_ in GANS),
)  # fmt: skip
SCORES = columns("row=id; FID=fid; real-data floor=fid_floor", 2)
SCORES += columns("class accuracy %=class_accuracy", 1)
SCORES += columns("classifier % on the FID test images=classifier_accuracy", 1)
SCORES += columns("gamma G=gamma_generator; gamma D=gamma_discriminator", 3)
RUN = columns("params=params; steps=steps; batch=batch_size; FID images=n_fid", 0)
RUN += columns("train min=train_minutes; eval min=eval_minutes", 1)
CURVE_COLUMNS = columns(
    "; ".join(["row=id", *(f"step {s}=class_accuracy_step{s}" for s in CURVE)]), 1
)
TABLES = [
    Table("gan", SCORES, ["gan", "floor"]),
    Table("curve", CURVE_COLUMNS, ["gan"]),
    Table("classifier", columns("row=id; test accuracy %=accuracy", 2) + RUN[:3], ["classifier"]),
    Table("budget", columns("row=id") + RUN, ["gan"]),
]
BENCH = Bench(
    "sagan", __file__, experiments, worker, TARGETS, TABLES, derive=derive, figures=figures, jobs=1
)

if __name__ == "__main__":
    drive(BENCH)
