"""Generate the result tables and figures of docs/ from benchmarks/results/*.json.

Every number in docs/ comes from here; nothing is typed by hand except the papers' own
numbers (PAPER below, with the table they come from).

    python benchmarks/report.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).parent))
from _common import format_number

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
BEGIN, END = "<!-- generated: {} -->", "<!-- end generated: {} -->"

# Bahdanau et al. 2015 (ICLR, arXiv:1409.0473v7), Table 1, WMT'14 En->Fr BLEU on all test
# sentences / sentences without unknown words.
PAPER = {
    "bahdanau": [
        ("RNNencdec-50", "17.82", "26.71"),
        ("RNNsearch-50", "26.75", "34.16"),
        ("RNNsearch-50*", "28.45", "36.15"),
    ],
}


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(x) -> str:
    # 4 significant digits: 99.45 must not print as 99.5 beside a 99.5 target
    return "**no**" if x is False else format_number(x, 4)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def splice(path: Path, key: str, body: str) -> None:
    """Replace the text between the generated markers of `key` in `path`."""
    text = path.read_text()
    begin, end = BEGIN.format(key), END.format(key)
    if begin not in text:
        raise SystemExit(f"{path}: no marker {begin}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def runs_table(rows: list[dict], *, with_name: bool) -> str:
    """One row per training run: its task, score, alignment, held-out size and budget."""
    bleu = any("bleu" in r for r in rows)
    header = [
        "task",
        *(["model"] if with_name else []),
        "exact match %",
        *(["BLEU"] if bleu else []),
        "alignment %",
        "held-out n",
        "params",
        "steps",
        "minutes",
    ]
    return table(
        header,
        [
            [
                r["task"],
                *([r["name"]] if with_name else []),
                100 * r["exact_match"],
                *([r.get("bleu")] if bleu else []),
                None if r.get("alignment") is None else 100 * r["alignment"],
                r["n_eval"],
                r["params"],
                r["steps"],
                r["train_minutes"],
            ]
            for r in rows
        ],
    )


def targets_table(data: dict) -> str:
    return table(
        ["target", "measured", "wanted", "met"],
        [[t["name"], t["value"], t["target"], t["met"]] for t in data["targets"]],
    )


# the columns of bench_attention's "overhead" rows, in the table's order
OVERHEAD_KEYS = (
    "batch",
    "length",
    "d",
    "attnzoo_us",
    "sdpa_us",
    "overhead_us",
    "ratio",
    "overhead_4d_us",
)


def attention_tables() -> None:
    data = load("attention")
    if data is None:
        return
    rows = [r for r in data["rows"] if r.get("status") == "ok" or r.get("status") == "oom"]
    body = [
        targets_table(data),
        "",
        "Every row: median time and peak memory (fresh process per row, VmHWM).",
        "",
    ]
    keys = sorted(
        {(r["score"], r["mode"], r["length"]) for r in rows}, key=lambda k: (k[0], k[1], k[2])
    )
    lines = []
    for score, mode, length in keys:
        for r in rows:
            if (r["score"], r["mode"], r["length"]) == (score, mode, length):
                lines.append(
                    [
                        score,
                        mode,
                        length,
                        r["impl"],
                        "OOM" if r["status"] == "oom" else r.get("median_ms"),
                        r.get("peak_mib"),
                    ]
                )
    body.append(
        table(["score", "mode", "length", "implementation", "median ms", "peak MiB"], lines)
    )
    overhead = load("attention_overhead")
    if overhead is not None:
        gflops = ", ".join(f"{g:.0f}" for g in overhead["machine"]["matmul_gflops_1_thread"])
        body += [
            "",
            "attention()'s own cost per call over a direct 4-D SDPA call (scaled_dot, forward "
            "under no_grad, 1 thread, the thread's CPU time; own cost = the median of per-round "
            "differences from SDPA in interleaved samples, the other columns medians; "
            "`python benchmarks/bench_attention.py --overhead`, results/attention_overhead.json, "
            f"fp32 matmul at {gflops} GFLOP/s on one thread before and after the rows, against "
            "120-148 on a quiet machine (PERF.md): the microseconds scale with that):",
            "",
            targets_table(overhead),
            "",
            table(
                [
                    "batch",
                    "length",
                    "d",
                    "attnzoo us",
                    "SDPA us",
                    "own cost us",
                    "/ SDPA",
                    "own cost, 4-D inputs, us",
                ],
                [[r[key] for key in OVERHEAD_KEYS] for r in overhead["overhead"]],
            ),
        ]
    splice(DOCS / "core.md", "attention", "\n".join(body))


def length_figure(rows: list[dict], task: str, metric: str) -> Path | None:
    rows = [r for r in rows if r["task"] == task and r.get("by_length")]
    if not rows:
        return None
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.add_subplot()
    for r in rows:
        xs = [(b["min_len"] + b["max_len"]) / 2 for b in r["by_length"]]
        ys = [b[metric] * (100 if metric == "exact_match" else 1) for b in r["by_length"]]
        ax.plot(xs, ys, marker="o", label=f"{r['name']} ({r['params'] / 1e6:.2f}M params)")
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("exact match (%)" if metric == "exact_match" else "BLEU")
    ax.set_title(f"{task}: score against source length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = DOCS / "figures" / f"length_{task}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def seq2seq_tables() -> None:
    data = load("seq2seq")
    body = []
    if data is not None:
        rows = [r for r in data["rows"] if r.get("status") == "ok"]
        dec = [r for r in rows if r["experiment"] == "decoders"]
        body += [
            "### Every decoder on every task",
            "",
            "Budget per run: the steps shown at batch 64, one thread per run, two runs in "
            "parallel on the 2-core CPU" + (" (QUICK smoke run)" if data["quick"] else "") + ".",
            "",
            runs_table(dec, with_name=True),
            "",
        ]
        length = [r for r in rows if r["experiment"] == "length"]
        for task, metric in (("reverse", "exact_match"), ("kjv2web", "bleu")):
            picked = [r for r in length if r["task"] == task]
            if not picked:
                continue
            fig = length_figure(picked, task, metric)
            edges = [f"{b['min_len']}-{b['max_len']}" for b in picked[0]["by_length"]]
            body += [
                f"### Score against source length: {task} (smaller scale than the paper)",
                "",
                f"![length]({fig.relative_to(DOCS)})",
                "",
                table(
                    ["model", "params", "steps", "batch", "minutes", *edges, "all"],
                    [
                        [
                            r["name"],
                            r["params"],
                            r["steps"],
                            r["batch_size"],
                            r["train_minutes"],
                            *[
                                b[metric] * (100 if metric == "exact_match" else 1)
                                for b in r["by_length"]
                            ],
                            r.get(metric, 0) * (100 if metric == "exact_match" else 1),
                        ]
                        for r in picked
                    ],
                ),
                "",
            ]
        shown = []  # alignment figures of the runs, copied next to the docs when present
        for r in dec + length:
            source = Path(r["run_dir"]) / "figures" / "alignment.png"
            if r["name"] in ("bahdanau", "luong-general") and source.exists():
                target = DOCS / "figures" / f"alignment_{r['task']}_{r['name']}.png"
                shutil.copyfile(source, target)
                shown.append(f"![{r['task']} {r['name']}]({target.relative_to(DOCS)})")
        if shown:
            body += ["### Alignments (first held-out example of each run)", "", *shown, ""]
    throughput = load("seq2seq_throughput")
    if throughput is not None:
        body += [
            "### Training throughput against the tutorial-style implementation",
            "",
            table(
                ["shape", "attnzoo tokens/s", "plain tokens/s", "speedup"],
                [
                    [r["config"], r["attnzoo_tokens_per_s"], r["plain_tokens_per_s"], r["speedup"]]
                    for r in throughput["rows"]
                ],
            ),
            "",
            targets_table(throughput),
        ]
    body += [
        "",
        "### The paper (for reference)",
        "",
        "Bahdanau 2015, Table 1 (WMT'14 En->Fr, BLEU): "
        + "; ".join(f"{n} {a} (all) / {b} (no UNK)" for n, a, b in PAPER["bahdanau"]),
    ]
    splice(DOCS / "seq2seq.md", "results", "\n".join(body))


def transformer_tables() -> None:
    data = load("transformer")
    if data is None:
        return
    train = [r for r in data["rows"] if r["kind"] == "training"]
    decode = [r for r in data["rows"] if r["kind"] == "decoding"]
    m = data["machine"]
    body = [
        f"Measured with {m.get('threads')} thread(s), load average "
        f"{fmt(m.get('load_average', [None])[0])} at the start; interleaved medians.",
        "",
        targets_table(data),
        "",
        "### Training throughput (target tokens/s)",
        "",
        table(
            ["dropout", "attnzoo", "nn.Transformer", "x-transformers", "attnzoo bf16"],
            [
                [
                    r["dropout"],
                    r["attnzoo_tokens_per_s"],
                    r["torch_tokens_per_s"],
                    r.get("x_transformers_tokens_per_s"),
                    r.get("attnzoo_bf16_tokens_per_s"),
                ]
                for r in train
            ],
        ),
        "",
        "### Greedy decoding with and without the key/value cache",
        "",
        table(
            ["batch", "steps", "cached ms", "uncached ms", "speedup", "identical tokens"],
            [
                [
                    r["batch"],
                    r["steps"],
                    r["cached_ms"],
                    r["uncached_ms"],
                    r["speedup"],
                    r["identical_tokens"],
                ]
                for r in decode
            ],
        ),
    ]
    runs = load("seq2seq")
    rows = [
        r
        for r in (runs or {"rows": []})["rows"]
        if r.get("experiment") == "transformer"
        and r.get("status") == "ok"
        and "exact_match" in r  # the language model's row has its own table
    ]
    if rows:
        body += [
            "",
            "### Tasks (tiny preset; one thread per run, on the shared 2-core CPU)",
            "",
            runs_table(rows, with_name=False),
        ]
    splice(DOCS / "transformer.md", "transformer", "\n".join(body))


def transformer_run_tables() -> None:
    """The Transformer against Bahdanau at equal parameters and wall clock, and the language
    model's bits per character (experiments "matched" and "transformer" of
    benchmarks/bench_seq2seq.py)."""
    data = load("seq2seq")
    rows = [r for r in (data or {"rows": []})["rows"] if r.get("status") == "ok"]
    order = ["dates", "numbers", "kjv2web"]
    matched = sorted(
        (r for r in rows if r["experiment"] == "matched"),
        key=lambda r: (order.index(r["task"]) if r["task"] in order else len(order), r["name"]),
    )
    lm = [r for r in rows if r["experiment"] == "transformer" and "bits_per_char" in r]
    body = []
    if matched:
        first = next(r["calibration"] for r in matched if "rounds" in r["calibration"])
        rematched = [r for r in matched if r["calibration"].get("method") == "previous runs"]
        body += [
            "### Against Bahdanau at equal size and wall clock (smaller scale than the paper)",
            "",
            "Per task, the Transformer (tiny preset: 4 heads, 2 + 2 layers) gets the d_model "
            "and d_ff that bring its parameter count nearest Bahdanau's. Then one process "
            f"times both models' training steps on that task (one thread, {first['rounds']} "
            f"interleaved rounds of {first['steps']} steps each after a warm-up, median), and "
            "each model trains for budget / (its seconds per step) steps. Runs went one at a "
            "time with one thread on the 2-core CPU, which other people's training shared, so "
            "training minutes can drift from the budget (load average at calibration in the "
            "JSON); the seconds per step in the run (training minutes over steps, model "
            "building and checkpoints included) show by how much. Training minutes exclude "
            "the final evaluation. "
            "Command: `python benchmarks/bench_seq2seq.py --only matched --jobs 1`"
            + (" (QUICK smoke run)" if data["quick"] else "")
            + ".",
            "",
            table(
                [
                    "task",
                    "model",
                    "params",
                    "size",
                    "s/step planned",
                    "s/step in the run",
                    "steps",
                    "batch",
                    "budget min",
                    "train min",
                    "exact match %",
                    "BLEU",
                ],
                [
                    [
                        r["task"],
                        r["name"],
                        r["params"],
                        f"d_model {r['d_model']}, d_ff {r['d_ff']}"
                        if "d_model" in r
                        else f"hidden {r['hidden']}",
                        r["calibration"]["sec_per_step"],
                        60 * (r["train_minutes"] - r["eval_minutes"]) / r["steps"],
                        r["steps"],
                        r["batch_size"],
                        r["budget_seconds"] / 60,
                        r["train_minutes"] - r["eval_minutes"],
                        100 * r["exact_match"],
                        r.get("bleu"),
                    ]
                    for r in matched
                ],
            ),
            "",
        ]
        if rematched:
            body += [
                "Re-run with `--rematch` (the planned s/step is then the model's own from its "
                "previous run, and the budget the reference's measured training time there): "
                + ", ".join(f"{r['task']} {r['name']}" for r in rematched)
                + ". Command: `python benchmarks/bench_seq2seq.py --only matched --task TASK "
                "--rematch --jobs 1`.",
                "",
            ]
    if lm:
        body += [
            "### Character-level language modelling of the King James text",
            "",
            "Bits per character on the held-out test verses (`kjv_lm`, `transformer-lm` tiny "
            "preset, one thread). "
            "Command: `python benchmarks/bench_seq2seq.py --only transformer --task kjv_lm`.",
            "",
            table(
                ["model", "params", "steps", "batch", "train min", "held-out chars", "bits/char"],
                [
                    [
                        r["name"],
                        r["params"],
                        r["steps"],
                        r["batch_size"],
                        r["train_minutes"] - r.get("eval_minutes", 0),
                        r["n_chars"],
                        r["bits_per_char"],
                    ]
                    for r in lm
                ],
            ),
        ]
    if body:
        splice(DOCS / "transformer.md", "transformer-runs", "\n".join(body).rstrip())


def one_thread_runs(data: dict) -> str:
    """How a benchmark of one-thread training runs was measured (its JSON's machine block)."""
    load = (data["machine"].get("load_average") or [None])[0]
    return (
        ("**Smoke run (--quick): not a result.** " if data.get("quick") else "")
        + "One torch thread per run on the shared 2-core CPU (1-minute load average "
        + f"{fmt(load)} at the start)"
    )


def pointer_tables() -> None:
    """docs/pointer_net.md: the paper's TSP and convex-hull columns beside ours, with budgets;
    the pointer figures of the TSP and hull runs."""
    data = load("pointer")
    if data is None:
        return
    rows = {r["name"]: r for r in data["rows"] if r.get("status") == "ok"}
    body = [
        one_thread_runs(data)
        + f"; held-out sets of {next(iter(rows.values()))['n_test'] if rows else '-'} "
        "instances per size; "
        "beam search keeps 5 hypotheses restricted to valid outputs. Minutes are the whole run "
        "(training and its evaluations) on the shared 2-core CPU. "
        "Smaller-scale than the paper: Vinyals et al. train on 1M instances.",
        "",
    ]
    targets = []
    for name, limit in (("tsp-n5", 0.5), ("tsp-n10", 2.0)):
        if name in rows:
            gap = min(rows[name]["greedy"]["gap_pct"], rows[name]["beam5"]["gap_pct"])
            targets.append(
                [
                    f"TSP {name[4:]}: gap to optimal % (best of greedy, beam 5)",
                    gap,
                    f"<= {limit}",
                    gap <= limit,
                ]
            )
    if "convex_hull-n10" in rows:
        hull = rows["convex_hull-n10"]
        best = max((hull["greedy"], hull["beam5"]), key=lambda s: s["accuracy"])
        area = best["area_coverage"] or 0.0
        targets += [
            ["convex hull n=10: accuracy %", best["accuracy"], ">= 85", best["accuracy"] >= 85],
            ["convex hull n=10: area coverage %", area, ">= 99", area >= 99],
        ]
    if targets:
        body += [
            "### Targets (issue 5)",
            "",
            table(
                ["target", "measured", "wanted", "met"],
                [[*t[:3], "yes" if t[3] else False] for t in targets],
            ),
            "",
        ]
    tsp = [rows[k] for k in ("tsp-n5", "tsp-n10", "tsp-n10-reinforce") if k in rows]
    if tsp:
        body += [
            "### TSP: average tour length (Vinyals 2015, Table 2)",
            "",
            table(
                [
                    "run",
                    "objective",
                    "paper optimal",
                    "paper Ptr-Net",
                    "our optimal",
                    "ours greedy",
                    "ours beam 5",
                    "gap % (beam)",
                    "steps",
                    "batch",
                    "minutes",
                ],
                [
                    [
                        r["name"],
                        r["objective"],
                        r["paper"]["optimal"],
                        r["paper"]["ptr_net"],
                        r["greedy"]["optimal"],
                        r["greedy"]["tour_length"],
                        r["beam5"]["tour_length"],
                        r["beam5"]["gap_pct"],
                        r["steps"],
                        r["batch_size"],
                        r["run_minutes"],
                    ]
                    for r in tsp
                ],
            ),
            "",
            "The paper's optimal column is its own test set's average; ours is the exact "
            "Held-Karp optimum of our held-out instances, so compare each Ptr-Net with the "
            "optimum beside it. The paper's numbers are those recorded in the project's "
            "reference list, which marks them as recalled and not yet checked against the "
            "paper's Table 2. The REINFORCE row sits beside the supervised paper numbers: "
            "Kool et al. 2019 report gaps for n >= 20 only.",
            "",
        ]
    if "convex_hull-n10" in rows:
        r = rows["convex_hull-n10"]
        body += [
            "### Convex hull, n = 10 (the columns of Vinyals 2015, Table 1)",
            "",
            table(
                [
                    "decoding",
                    "accuracy %",
                    "area coverage %",
                    "FAIL %",
                    "steps",
                    "batch",
                    "minutes",
                ],
                [
                    [
                        label,
                        s["accuracy"],
                        s["area_coverage"],
                        s["fail_rate"],
                        r["steps"],
                        r["batch_size"],
                        r["run_minutes"],
                    ]
                    for label, s in (("greedy", r["greedy"]), ("beam 5", r["beam5"]))
                ],
            ),
            "",
            "The paper's table is for n = 50 (Ptr-Net 72.6% accuracy, 99.9% area, as the "
            "reference list records them, marked not yet checked); n = 10 is the size this "
            "CPU budget trains to the issue's target.",
            "",
        ]
    if "sort_numbers" in rows:
        r = rows["sort_numbers"]
        sizes = sorted({int(k.split("_n")[1]) for k in r["greedy"] if "_n" in k})
        body += [
            f"### Sorting numbers (trained on n = {r['n_train'][0]}..{r['n_train'][1]})",
            "",
            table(
                ["test n", "exact match % greedy", "exact match % beam 5", "steps", "minutes"],
                [
                    [
                        n,
                        r["greedy"][f"exact_match_n{n}"],
                        r["beam5"][f"exact_match_n{n}"],
                        r["steps"],
                        r["run_minutes"],
                    ]
                    for n in sizes
                ],
            ),
            "",
        ]
    figures = DOCS / "figures"
    for name in ("tsp-n10", "convex_hull-n10", "sort_numbers"):
        if name in rows:
            source = Path(rows[name]["run_dir"]) / "figures" / "pointer.png"
            if source.exists():
                shutil.copy(source, figures / f"pointer_{name}.png")
                body += [f"![{name}](figures/pointer_{name}.png)", ""]
    splice(DOCS / "pointer_net.md", "pointer", "\n".join(body).rstrip())


def ntm_tables() -> None:
    """docs/ntm.md: the issue's targets, NTM against the LSTM baseline per task and per test
    length, the learning curves, the throughput, and the memory figures of the copy run."""
    data = load("ntm")
    if data is None:
        return
    rows = {r["name"]: r for r in data["rows"] if r.get("status") == "ok"}
    tasks = [r for r in rows.values() if r["experiment"] == "tasks"]
    body = [
        one_thread_runs(data) + ", runs one after another. "
        "Bit errors are per sequence over the output phase, on 16 held-out sequences per length.",
        "",
    ]
    ntm, lstm = rows.get("bit_copy-ntm"), rows.get("bit_copy-lstm")
    speed = rows.get("throughput")
    targets = []
    if ntm:
        reached = ntm["sequences_to_target"]
        targets.append(
            [
                "copy: sequences until < 0.1 bit errors on lengths 1-20",
                reached if reached is not None else f"not within {ntm['sequences']}",
                "<= 50000",
                "yes" if reached is not None and reached <= 50000 else False,
            ]
        )
    if ntm and lstm:
        ratio = ntm["bit_errors_len40"] / max(lstm["bit_errors_len40"], 1e-9)
        targets.append(
            [
                "copy length 40: NTM errors / LSTM errors",
                ratio,
                "< 0.25",
                "yes" if ratio < 0.25 else False,
            ]
        )
    if speed:
        targets.append(
            [
                f"training sequences/s: batched ({speed['batch_size']}) / per-sample (batch 1)",
                speed["speedup"],
                ">= 5",
                "yes" if speed["speedup"] >= 5 else False,
            ]
        )
    if targets:
        body += [
            "### Targets (issue 5)",
            "",
            table(["target", "measured", "wanted", "met"], targets),
            "",
        ]
    if tasks:
        body += [
            "### Every task, NTM against the LSTM baseline",
            "",
            table(
                [
                    "task",
                    "model",
                    "params",
                    "steps",
                    "batch",
                    "sequences",
                    "train min",
                    "bit errors (train lengths)",
                    "exact %",
                    "sequences to < 0.1",
                ],
                [
                    [
                        r["task"],
                        r["model"],
                        r["params"],
                        r["steps"],
                        r["batch_size"],
                        r["sequences"],
                        r["train_minutes"],
                        r["bit_errors"],
                        100 * r["exact"],
                        r["sequences_to_target"],
                    ]
                    for r in tasks
                ],
            ),
            "",
        ]
    if ntm and lstm:
        lengths = sorted(
            int(k[len("bit_errors_len") :]) for k in ntm if k.startswith("bit_errors_len")
        )
        body += [
            f"### Copy: generalisation to longer sequences (trained on "
            f"{ntm['train_lengths'][0]}-{ntm['train_lengths'][1]})",
            "",
            "The paper shows this as Fig. 4/5 (NTM copies well past its training lengths, "
            "the LSTM fails); it gives no table.",
            "",
            table(
                ["length", "NTM bit errors", "LSTM bit errors"],
                [[n, ntm[f"bit_errors_len{n}"], lstm[f"bit_errors_len{n}"]] for n in lengths],
            ),
            "",
        ]
        fig = Figure(figsize=(5.2, 3.4))
        ax = fig.add_subplot()
        for r in (ntm, lstm):
            ax.plot(
                [c["sequences"] for c in r["curve"]],
                [c["bit_errors"] for c in r["curve"]],
                marker="o",
                label=f"{r['model']} ({r['params']} params)",
            )
        ax.set_xlabel("training sequences")
        ax.set_ylabel("bit errors per sequence (lengths 1-20)")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_title("copy: learning curve")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(DOCS / "figures" / "ntm_copy_curve.png", dpi=110)
        body += ["![copy learning curve](figures/ntm_copy_curve.png)", ""]
        shown = sorted(
            (Path(ntm["run_dir"]) / "figures").glob("memory_*.png"),
            key=lambda path: int(path.stem.rsplit("len", 1)[1]),
        )
        train_max = [p for p in shown if p.stem.endswith(f"len{ntm['train_lengths'][1]}")]
        for name in dict.fromkeys(train_max + shown[-1:]):  # the longest trained, the longest
            shutil.copy(name, DOCS / "figures" / f"ntm_{name.name}")
            body += [f"![{name.stem}](figures/ntm_{name.name})", ""]
    if speed:
        per = speed["sequences_per_s"]
        body += [
            f"### Training throughput (copy, length {speed['length']}, one thread)",
            "",
            table(
                ["implementation", "sequences/s"],
                [
                    [f"batched, {speed['batch_size']} per update", per["batched"]],
                    ["per sample, one update per sequence (pytorch-ntm's loop)", per["per_sample"]],
                ],
            ),
            "",
        ]
    splice(DOCS / "ntm.md", "ntm", "\n".join(body).rstrip())


def keras_tables() -> None:
    """docs/keras.md: attnzoo.keras layers against Keras's own (bench_keras.py)."""
    data = load("keras")
    if data is None:
        return
    config, machine = data["config"], data["machine"]

    def rounds(r: dict) -> str:
        """The spread of the per-round time ratios (the two layers timed back to back)."""
        ratios = sorted(
            a / k for a, k in zip(r["attnzoo_times_ms"], r["keras_times_ms"], strict=True)
        )
        return f"{fmt(ratios[0])}-{fmt(ratios[-1])}"

    rows = [
        [
            r["layer"],
            r["batch"],
            r["length"],
            r["attnzoo_ms"],
            r["keras_ms"],
            r["time_ratio"],
            rounds(r),
            r["attnzoo_peak_mib"],
            r["keras_peak_mib"],
            r["peak_ratio"],
            r["max_abs_diff"],
        ]
        for r in data["rows"]
    ]
    repeats = ", ".join(f"{n} at length {length}" for length, n in config["repeats"].items())
    body = [
        targets_table(data),
        "",
        f"Median ms per forward + backward ({config['threads']} thread, float32; interleaved "
        f"repeats: {repeats}; per-round: the range of the ratios of the two layers timed back "
        "to back), peak MiB in a fresh process per layer and size (VmHWM), and the largest "
        f"output difference of the two layers on the same weights. Keras {machine['keras']} on "
        f"the {machine['keras_backend']} backend, torch {machine['torch']}.",
        "",
        table(
            [
                "layer",
                "batch",
                "length",
                "attnzoo ms",
                "Keras ms",
                "time / Keras",
                "per-round",
                "attnzoo MiB",
                "Keras MiB",
                "memory / Keras",
                "max abs diff",
            ],
            rows,
        ),
        "",
        f"Command: `{config['command']}`",
    ]
    splice(DOCS / "keras.md", "keras", "\n".join(body))


if __name__ == "__main__":
    attention_tables()
    seq2seq_tables()
    transformer_tables()
    transformer_run_tables()
    pointer_tables()
    ntm_tables()
    keras_tables()
    print("docs updated")
