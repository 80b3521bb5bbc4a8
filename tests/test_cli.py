import json
import subprocess
import sys

from attnzoo.cli import main
from tests.train.test_loop import sets


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "bahdanau" in out and "dates" in out and "kjv2web" in out


def test_unknown_key_lists_valid_keys(capsys):
    assert main(["train", "bahdanau", "--task", "dates", "--set", "model.hiden=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0  # one line
    assert "model.hiden" in err and "model.hidden" in err and "train.steps" in err


def test_bad_value_and_bad_names_one_line(capsys):
    assert main(["train", "bahdanau", "--task", "dates", "--set", "train.steps=many"]) == 2
    assert "'train.steps'" in capsys.readouterr().err
    assert main(["train", "bahdanau", "--task", "dates", "--set", "model.cell=tree"]) == 2
    assert "'cell'" in capsys.readouterr().err
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
