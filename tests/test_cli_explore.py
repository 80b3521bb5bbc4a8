"""`attnzoo explore DIR [--examples N] [--out FILE] [--device D]`: the page it writes, and
each wrong input as one line naming the argument, what was expected and what was given."""

import pytest

from attnzoo.cli import main
from attnzoo.viz.explore import GENERATOR
from tests.train.test_loop import sets


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("explore") / "run"
    argv = ["train", "bahdanau", "--task", "dates", "--out", str(out), "--no-progress"]
    assert main([*argv, *sets(["train.steps=4"])]) == 0
    return out


def one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo: error:") and "\n" not in err, err
    for word in words:
        assert word in err, err
    return err


def test_explore_writes_the_page_in_the_run_and_replaces_its_own(run, capsys):
    capsys.readouterr()
    assert main(["explore", str(run), "--examples", "3"]) == 0
    page = run / "explore.html"
    assert str(page) in capsys.readouterr().out
    text = page.read_text()
    assert f'<meta name="generator" content="{GENERATOR}">' in text
    assert "bahdanau on dates" in text
    assert main(["explore", str(run), "--examples", "2", "--device", "cpu"]) == 0  # its own page


def test_fewer_examples_than_asked_for_are_said(run, tmp_path, capsys):
    """The run's held-out set (eval.limit=20) caps the page: 100 asked for gave 20 without a
    word."""
    capsys.readouterr()
    out = tmp_path / "many.html"
    assert main(["explore", str(run), "--examples", "100", "--out", str(out)]) == 0
    assert "explorer: 20 of the 100 examples asked for" in capsys.readouterr().err
    assert out.stat().st_size > 1000


def test_out_elsewhere(run, tmp_path):
    assert main(["explore", str(run), "--examples", "1", "--out", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").stat().st_size > 1000


def test_wrong_inputs_are_one_line_errors(run, tmp_path, capsys):
    one_line_error(capsys, ["explore", str(run), "--examples", "0"], "'--examples'", "got 0")
    one_line_error(capsys, ["explore", str(run), "--examples", "many"], "--examples", "'many'")
    one_line_error(capsys, ["explore", str(run), "--out", str(tmp_path)], "'--out'", "directory")
    other = tmp_path / "notes.html"
    other.write_text("<html>mine</html>")
    one_line_error(capsys, ["explore", str(run), "--out", str(other)], "'--out'", str(other))
    assert other.read_text() == "<html>mine</html>"  # never overwritten
    missing = tmp_path / "no" / "x.html"
    one_line_error(capsys, ["explore", str(run), "--out", str(missing)], "'--out'", "no such")
    one_line_error(capsys, ["explore", str(tmp_path / "nothing")], "'DIR'", "no such directory")
    one_line_error(capsys, ["explore", str(run), "--device", "tpu"], "'--device'", "tpu")
    one_line_error(capsys, ["explore"], "DIR")


def test_demo_writes_its_explorer_and_prints_its_path(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--no-progress", *sets(["train.steps=4"])]) == 0
    printed = capsys.readouterr().out
    page = out / "explore.html"
    assert page.stat().st_size > 1000 and "attention explorer" in printed
    assert str(page) in printed.replace("\n", "")
    # it runs again: the page is one of the run's files that the demo replaces
    assert main(["demo", "--out", str(out), "--no-progress", *sets(["train.steps=4"])]) == 0
