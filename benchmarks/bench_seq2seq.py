"""Seq2seq experiments (one run per seed through `attnzoo.runs.run_train`, one thread).

1. "decoders": every decoder (no attention, Bahdanau, Luong dot/general/concat, local-m,
   local-p, the SimpleRNN lecture model) on dates and numbers: exact match and alignment (share
   of output tokens whose attention argmax falls in the true span).
2. "length-TASK": no attention, Bahdanau and Luong at (nearly) equal parameter count (`sized`)
   and steps, scored per source-length bucket (Bahdanau 2015 Fig. 2) on reverse and kjv2web;
   on kjv2web also Luong with one of Bahdanau's choices each (`PROBES`).
3. "transformer": the tiny preset on the generated tasks, dates, numbers and kjv2web, and
   `transformer-lm` on `kjv_lm` (bits per character).
4. "matched": per task a unit, Bahdanau and the Transformer sized to its parameter count, each
   trained for the unit's wall-clock budget over its seconds per step (`prepare`).
5. "ceiling": no model: kjv2web's test references written through the target vocabulary
   (`TranslationTask.scores`), the score no model of that vocabulary passes; the split and so
   the vocabulary are `task.seed`'s, the same for every run seed.
BLEU is sacrebleu's; its signature is recorded beside the score.

    python benchmarks/bench_seq2seq.py [--budget smoke|full] [--seeds N] [--only ID|GROUP ...]
"""

from __future__ import annotations

import operator
from fnmatch import fnmatch
from itertools import pairwise
from pathlib import Path

import _common as C
from _common import Bench, Experiment, Table, columns, drive, targets

LOCAL = ["model.attention=luong-local", "model.window=3"]
DECODERS = {  # name -> (model, overrides)
    "encdec": ("encdec", []),
    "bahdanau": ("bahdanau", []),
    "luong-dot": ("luong", ["model.score=dot"]),
    "luong-general": ("luong", []),
    "luong-concat": ("luong", ["model.score=additive"]),
    "luong-local-m": ("luong", [*LOCAL, "model.local=local-m"]),
    "luong-local-p": ("luong", [*LOCAL, "model.local=local-p"]),
    "simple": ("simple", []),
}
KJV = ["train.batch_size=48", "task.n_test=2000", "eval.limit=2000"]
WHOLE = ["task.n_test=2000"]  # dates and numbers: the whole test split
# CPU-minutes per seed below: the earlier single-seed runs' (benchmarks/results/seq2seq.json).
DECODER_TASKS = {"dates": (1000, 2.6), "numbers": (1500, 4.4)}  # steps, minutes
REVERSE = ["task.min_len=4", "task.max_len=40", "train.batch_size=32", "eval.limit=2000"]
LENGTH = {  # task -> (overrides, bucket edges with >= 50 held-out sentences each, minutes)
    "reverse": ([*REVERSE, "train.steps=3000", *WHOLE], [4, 10, 20, 30, 41], 16.4),
    "kjv2web": ([*KJV, "train.steps=1500"], [1, 20, 30, 40, 50, 61], 17.0),
}
# length rows beyond the three decoders, per task: Luong with one of Bahdanau's choices, to see
# which of them closes its kjv2web gap (name -> (model, overrides))
PROBES = {
    "kjv2web": {
        "luong-general-bi": ("luong", ["model.bidirectional=true"]),
        "luong-general-gru": ("luong", ["model.cell=gru"]),
    }
}
TRANSFORMER = {  # task -> (overrides, minutes); model transformer, on kjv_lm transformer-lm
    "copy": (["train.steps=2000"], 4.2),
    "reverse": (["train.steps=2000"], 4.2),
    "sort": (["train.steps=2000"], 3.9),
    "dates": (["train.steps=2000", *WHOLE], 4.4),
    "numbers": (["train.steps=1500", *WHOLE], 1.5),
    "kjv2web": (["train.steps=1500", *KJV], 14.1),
    "kjv_lm": ([], 7.6),
}
MATCHED = {"dates": (3, WHOLE), "numbers": (3, WHOLE), "kjv2web": (15, KJV)}  # minutes, sets
CALIBRATION = {"steps": 20, "rounds": 3}  # steps per calibration run, timed rounds
SMALL = ["train.steps=6", "task.n_train=400", "task.n_valid=20", "task.n_test=60", "eval.limit=60"]
SMALL_HELD_OUT = ["task.n_test=60", "eval.limit=60"]  # the smoke ceiling's (no training)
SMALL_MODEL = {"transformer": ["model.d_model=16"], "rnn": ["model.hidden=16", "model.embed_dim=8"]}
# the smoke budget's experiments (globs), at small sizes
SMOKE = ("decoders-dates-[eb]*", "decoders-dates-luong-local-p", "length-reverse-[eb]*")
SMOKE += ("transformer-copy", "matched-dates-*", "ceiling-*")


def experiments(budget: str) -> list[Experiment]:
    rows = [  # id, group, name, model, task, overrides, minutes, more params
        (f"decoders-{t}-{n}", "decoders", n, m, t, [*s, f"train.steps={k}", *WHOLE], c, {})
        for t, (k, c) in DECODER_TASKS.items()
        for n, (m, s) in DECODERS.items()
    ]
    rows += [
        (f"length-{t}-{n}", f"length-{t}", n, m, t, [*s, *more], c, {"edges": e})
        for t, (s, e, c) in LENGTH.items()
        for n, (m, more) in (
            {n: DECODERS[n] for n in ("encdec", "bahdanau", "luong-general")} | PROBES.get(t, {})
        ).items()
    ]
    rows += [
        (f"transformer-{t}", "transformer", m, m, t, s, c, {})
        for t, (s, c) in TRANSFORMER.items()
        for m in ["transformer-lm" if t == "kjv_lm" else "transformer"]
    ]
    rows += [
        (f"matched-{t}-{m}", "matched", m, m, t, s, c + 1, {"budget_minutes": c})
        for t, (c, s) in MATCHED.items()
        for m in ("bahdanau", "transformer")
    ]
    rows += [("ceiling-kjv2web", "ceiling", "reference", "bahdanau", "kjv2web", KJV, 0.3, {})]
    found = []
    for id, group, name, model, task, sets, minutes, more in rows:
        unit, seeds = id.rsplit("-", 1)[0] if group == "matched" else "", 3 if minutes > 5 else 5
        if budget == "smoke":
            if not any(fnmatch(id, pattern) for pattern in SMOKE):
                continue
            if group == "ceiling":
                small = SMALL_HELD_OUT
            else:
                small = [*SMALL, *SMALL_MODEL["transformer" if "transformer" in model else "rnn"]]
            sets, seeds, minutes = [*sets, *small], 1, 0.2
            more = {**more, **({"budget_minutes": 0.05} if unit else {})}
        params = {"name": name, "model": model, "task": task, "sets": sets, **more}
        if group == "ceiling":  # no model; one split (`task.seed`) for every run seed
            params, seeds = {k: v for k, v in params.items() if k != "model"}, 1
            params["ceiling"] = True
        found.append(Experiment(id, group, params, seeds, minutes, unit))
    return found


def sized(params: dict, reference: list[str]) -> list[str]:
    """Overrides that bring the model's parameter count nearest Bahdanau's (with the overrides
    `reference`) on the task: an RNN's hidden width; the Transformer's d_model (over multiples
    of `heads`, d_ff = 4 d_model, the paper's ratio), then its d_ff (the count is linear in
    d_ff: solved from the slope)."""
    from attnzoo import runs

    if params["model"] == "bahdanau":
        return []
    task, reference = runs.build(C.resolved_config(reference, "bahdanau", params["task"], 0))
    target = sum(p.numel() for p in reference.parameters())
    own = C.resolved_config(params["sets"], params["model"], params["task"], 0)["model"]

    def count(**changes) -> int:
        return C.parameter_count(params["model"], params["task"], params["sets"], task, **changes)

    if "hidden" in own:
        best = min(range(8, 4 * own["hidden"] + 1, 4), key=lambda h: abs(count(hidden=h) - target))
        return [f"model.hidden={best}"]
    heads = own["heads"]
    d = min(
        range(heads, 2 * own["d_model"] + 1, heads),
        key=lambda d: abs(count(d_model=d, d_ff=4 * d) - target),
    )
    base = count(d_model=d, d_ff=4 * d)
    slope = count(d_model=d, d_ff=4 * d + 1) - base
    return [f"model.d_model={d}", f"model.d_ff={max(1, 4 * d + round((target - base) / slope))}"]


def prepare(unit: list[Experiment], budget: str) -> dict[str, dict]:
    """Both sides of a matched unit: their sizes (`sized`), then their steps for the unit's
    wall-clock budget (`calibrate_unit`)."""
    reference = next(e.params["sets"] for e in unit if e.params["model"] == "bahdanau")
    sizes = {e.id: sized(e.params, reference) for e in unit}
    return C.calibrate_unit(unit, CALIBRATION, sizes, budget=budget)


def worker(params: dict, ctx: C.Context) -> dict:
    import torch

    sets = [*params["sets"], *ctx.extra.get("sets", [])]
    if params.get("ceiling"):
        return _ceiling(sets, params, ctx)
    if params.get("edges"):  # the length experiment: sized to Bahdanau's parameter count
        sets += sized(params, params["sets"])
    metrics, config, task, model = C.train_worker(sets, params["model"], params["task"], ctx)
    metrics.update({k: v for k, v in config["model"].items() if k in ("hidden", "d_model", "d_ff")})
    for key in ("exact_match", "alignment"):
        if key in metrics:
            metrics[f"{key}_pct"] = 100 * metrics[key]
    if "bleu" in metrics:
        metrics["sacrebleu"] = _signature()
    if "budget_minutes" in params:
        metrics["budget_minutes"] = params["budget_minutes"]
        metrics["sec_per_step_planned"] = ctx.extra.get("sec_per_step")
    if params.get("edges"):
        with torch.no_grad():
            buckets = task.by_source_length(model, params["edges"])
        metrics["by_length"] = buckets
        metrics["bucket"] = {
            f"{b['min_len']}-{b['max_len']}": {"exact_pct": 100 * b["exact_match"], **b}
            for b in buckets
        }
    return {k: v for k, v in metrics.items() if v is not None}


def _signature() -> str:
    import sacrebleu

    scorer = sacrebleu.BLEU()  # the defaults `attnzoo.tasks.text.bleu` scores with
    scorer.corpus_score(["a"], [["a"]])  # the signature names its reference count
    return str(scorer.get_signature())


def _ceiling(sets: list[str], params: dict, ctx: C.Context) -> dict:
    """The test references through the task's target vocabulary: no model, no training."""
    from attnzoo import runs
    from attnzoo.tasks.registry import TASKS

    # the task's config as the kjv2web rows resolve it (the model named changes none of it)
    c = runs.configs(C.resolved_config(sets, "bahdanau", params["task"], ctx.seed))
    task = TASKS[params["task"]].build(c["task"], seed=ctx.seed, eval_config=c["eval"])
    examples = task.examples()
    scores = task.scores(None, examples)
    return {
        **scores,
        "exact_match_pct": 100 * scores["exact_match"],
        "target_vocab": len(task.target_vocab),
        "n_eval": len(examples),
        "sacrebleu": _signature(),
    }


# Bahdanau et al. 2015 (arXiv 1409.0473), Table 1: BLEU on WMT'14 En->Fr, all sentences and
# sentences without unknown words (PAPERS.md, confirmed).
PAPER = {
    "RNNencdec-50": {"all": 17.82, "no_unk": 26.71},
    "RNNsearch-50": {"all": 26.75, "no_unk": 34.16},
    "RNNsearch-50*": {"all": 28.45, "no_unk": 36.15},
}


def derive(summary: dict) -> dict:
    """The paper's numbers, and per matched task and seed the Transformer's gain over Bahdanau
    in the task's headline score and its measured training minutes over Bahdanau's (did "equal
    wall clock" hold?)."""
    derived: dict = {"paper": PAPER}
    for task in MATCHED:
        b, t = (f"matched-{task}-{m}" for m in ("bahdanau", "transformer"))
        gain = C.paired(summary, "bleu" if task == "kjv2web" else "exact_match_pct", t, b)
        minutes = C.paired(summary, "train_minutes", t, b, operator.truediv)
        if gain and minutes:
            derived[f"matched-{task}"] = {"gain": gain, "train_minutes_ratio": minutes}
    return derived


def figures(data: dict, folder: Path, runs: Path) -> list[Path]:
    """Score against source length (from the JSON; buckets of >= 50 sentences), and seed 0's
    alignment figures of the runs shown (when their run dirs exist)."""
    drawn = []
    for task in LENGTH:
        key, groups = "bleu" if task == "kjv2web" else "exact_match", {}
        for row in data["rows"]:
            kept = [b for b in row["metrics"].get("by_length", []) if b["n"] >= 50]
            if row["group"] == f"length-{task}" and row.get("status") == "ok" and kept:
                xs = [(b["min_len"] + b["max_len"]) / 2 for b in kept]
                ys = [b[key] * (1 if key == "bleu" else 100) for b in kept]
                groups.setdefault(row["params"]["name"], []).append((xs, ys))
        if groups:
            title = f"{task}: score against source length (buckets of >= 50 sentences)"
            xlabel = "source length (tokens, bucket middle)"
            ylabel = "BLEU" if key == "bleu" else "exact match %"
            path = Path(folder) / f"length_{task}.png"
            drawn.append(C.draw_seeds(path, groups, title=title, xlabel=xlabel, ylabel=ylabel))
    pairs = {}
    for task in ("dates", "numbers", "reverse", "kjv2web"):
        group = "decoders" if task in ("dates", "numbers") else "length"
        for name in ("bahdanau", "luong-general"):
            run = C.run_folder(runs, "seq2seq", f"{group}-{task}-{name}", 0)
            pairs[f"alignment_{task}_{name}.png"] = run / "figures/alignment.png"
    return drawn + C.copy_run_figures(pairs, folder)


NAME = columns("task=params.task; model=params.name")
RUN = columns("params=params; steps=steps; batch=batch_size", 0)
RUN += columns("train min=train_minutes", 1)
SCORES = columns("exact match %=exact_match_pct; BLEU=bleu; alignment %=alignment_pct")
SCORES += columns("held-out n=n_eval", 0)


def _length_table(task: str) -> Table:
    edges, score = LENGTH[task][1], "bleu" if task == "kjv2web" else "exact_pct"
    buckets = [f"{lo}-{hi - 1}=bucket.{lo}-{hi - 1}.{score}" for lo, hi in pairwise(edges)]
    overall = "all=bleu" if task == "kjv2web" else "all=exact_match_pct"
    cells = (
        NAME[1:] + columns("hidden=hidden", 0) + RUN + columns("; ".join([*buckets, overall]), 1)
    )
    return Table(f"length-{task}", cells, [f"length-{task}"])


MATCHED_COLUMNS = NAME + columns("params=params; hidden=hidden; d_model=d_model; d_ff=d_ff", 0)
MATCHED_COLUMNS += columns(
    "s/step planned=sec_per_step_planned; s/step in the run=sec_per_step_run", 3
)
MATCHED_COLUMNS += columns("steps=steps; batch=batch_size", 0)
MATCHED_COLUMNS += columns("budget min=budget_minutes; train min=train_minutes", 1)
MATCHED_COLUMNS += SCORES[:2]
TARGETS = targets(
    "issue 4",
    ("Transformer on dates: exact match %", "transformer-dates", "exact_match_pct", ">=", 99.5),
    ("kjv2web at equal size and wall clock: BLEU gain", "matched-kjv2web", "gain", ">", 0),
)
TABLES = [
    Table("decoders", NAME + SCORES[:1] + SCORES[2:] + RUN, ["decoders"]),
    _length_table("reverse"),
    _length_table("kjv2web"),
    Table(
        "transformer",
        NAME[:1] + SCORES + RUN,
        ["transformer"],
        [f"transformer-{t}" for t in TRANSFORMER if t != "kjv_lm"],
    ),
    Table("matched", MATCHED_COLUMNS, ["matched"]),
    Table(
        "lm",
        RUN + columns("held-out chars=n_chars", 0) + columns("bits/char=bits_per_char", 3),
        ids=["transformer-kjv_lm"],
    ),
]
BENCH = Bench("seq2seq", __file__, experiments, worker, TARGETS, TABLES, prepare, derive, figures)

if __name__ == "__main__":
    drive(BENCH)
