"""docs/PAGE.md is its template docs/templates/PAGE.md rendered from the benchmarks' JSON
(benchmarks/report.py), and no number in a page is typed by hand: the template's own prose
holds none, the committed page equals a fresh rendering, and every number of the page is a
value of the JSON it was made from, at the precision shown."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402

TEMPLATES = sorted(p.stem for p in (ROOT / "docs" / "templates").glob("*.md"))

# A number standing alone (not part of a name such as seq2seq, bf16, L4096 or len80).
NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
# What prose may hold: a year, a list item's number, a paper's table/figure/section number.
ALLOWED_BEFORE = re.compile(
    r"(?:Table|Tables|Fig\.|Figure|Figures|sec\.|Section|eq\.|Eq\.|issue|arXiv:)\s*$"
)


def _prose(text: str) -> str:
    """`text` without code (fenced and inline), link targets, HTML comments and Jinja tags."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "] ", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return re.sub(r"\{[{%#].*?[}%#]\}", " ", text, flags=re.S)


def _typed_numbers(text: str) -> list[str]:
    """Numbers in prose that are not a year, a list item's number or a citation's number."""
    found = []
    for line in _prose(text).splitlines():
        line = re.sub(r"^\s*\d+\.\s", " ", line)  # an ordered list item
        for match in NUMBER.finditer(line):
            token = match.group()
            if re.fullmatch(r"(19|20)\d\d", token):  # a year (Bahdanau et al. 2015)
                continue
            if ALLOWED_BEFORE.search(line[: match.start()]) and "." not in token:
                continue
            found.append(token)
    return found


def _leaves(value, out: list[float]) -> list[float]:
    if isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(float(value))
    return out


def _shown(token: str, values: list[float]) -> bool:
    """Whether some JSON value, rounded as `token` is written, reads as `token`."""
    x = float(token.replace("−", "-"))
    if "e" in token:  # written with %g: three significant digits
        return any(math.isclose(v, x, rel_tol=5e-3) for v in values)
    decimals = len(token.split(".")[1]) if "." in token else 0
    tolerance = 0.5 * 10**-decimals + 1e-9
    if any(abs(v - x) <= tolerance for v in values):
        return True
    # %g / %.3g round large numbers to three significant digits
    return any(abs(v) >= 100 and math.isclose(v, x, rel_tol=5e-3) for v in values)


def test_every_page_has_a_template():
    assert set(TEMPLATES) == set(report.PAGES), "docs/templates/ and report.PAGES disagree"


def test_the_readme_names_every_task_and_links_every_page():
    """The README's task list and its table of pages, against the registry and report.PAGES:
    a task or a page added later is not left out of the front page."""
    from attnzoo.tasks.registry import TASKS

    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`(\w+)`", text))
    assert set(TASKS) - named == set()
    assert {p for p in report.PAGES if f"(docs/{p}.md)" not in text} == set()


@pytest.mark.parametrize("page", TEMPLATES)
def test_template_prose_types_no_number(page):
    text = (ROOT / "docs" / "templates" / f"{page}.md").read_text()
    typed = _typed_numbers(text)
    assert not typed, f"docs/templates/{page}.md types numbers into prose: {typed[:10]}"


def test_the_prose_check_finds_typed_numbers():
    """The rule above must be able to fail: typed results are found, names and years are not."""
    text = "Bahdanau et al. 2015 reach 26.75 BLEU; seq2seq with bf16 at L4096 in `--steps 9`."
    assert _typed_numbers(text) == ["26.75"]
    assert _typed_numbers("{{ stat('ntm', 'a', 'b') }} over 3 seeds") == ["3"]


@pytest.mark.parametrize("page", TEMPLATES)
def test_page_is_its_rendered_template(page):
    """docs/PAGE.md equals its template rendered from the committed JSON (none edited by hand,
    none stale after a benchmark re-run)."""
    committed = (ROOT / "docs" / f"{page}.md").read_text()
    assert committed == report.Page(page, report.RESULTS).render(), (
        f"docs/{page}.md is stale: run `python benchmarks/report.py {page}`"
    )


@pytest.mark.parametrize("page", TEMPLATES)
def test_every_number_of_a_page_is_in_its_json(page):
    values: list[float] = []
    for bench in report.PAGES[page]:
        _leaves(json.loads((report.RESULTS / f"{bench}.json").read_text()), values)
    text = (ROOT / "docs" / f"{page}.md").read_text()
    template = (ROOT / "docs" / "templates" / f"{page}.md").read_text()
    allowed = set(NUMBER.findall(_prose(template)))  # years and citations the template holds
    missing = [
        t for t in NUMBER.findall(_prose(text)) if t not in allowed and not _shown(t, values)
    ]
    assert not missing, f"docs/{page}.md shows numbers no JSON value reads as: {missing[:10]}"


def _pages() -> list[Path]:
    """README.md and the docs pages, the files a reader copies commands and code from."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(program: str) -> list[tuple[str, str]]:
    """(file, command) for every `program ...` line in a code block of README.md and the
    docs pages (a command joined by `&&` split into its parts, a trailing comment dropped)."""
    found = []
    for path in _pages():
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", path.read_text(), re.S | re.M):
            for line in block.splitlines():
                for part in line.split(" #")[0].split("&&"):
                    if part.strip().startswith(f"{program} "):
                        found.append((path.name, part.strip()))
    return found


def test_every_train_command_of_the_docs_resolves():
    """A page's `attnzoo train ...` names a model, a task and overrides that exist: each is
    parsed by the CLI's own parser and its config resolved and checked as `attnzoo train`
    does before any work (a renamed field or model would otherwise leave a page that fails
    for its first reader)."""
    import shlex

    from attnzoo import cli, runs

    commands = [(f, c) for f, c in _commands("attnzoo") if c.split()[1] == "train"]
    for path in _pages():  # inline ones too
        prose = re.sub(r"```.*?```", " ", path.read_text(), flags=re.S)
        commands += [(path.name, c) for c in re.findall(r"`(attnzoo train [^`]*)`", prose)]
    assert len(commands) >= 30  # the README and every model page have some
    for name, command in commands:
        try:
            args = cli.parser().parse_args(shlex.split(command)[1:])
            if args.resume:  # the saved run's config: no model or task on the line
                continue
            config = runs.apply_overrides(runs.default_config(args.model, args.task), args.set)
            runs.configs(config)
        except (ValueError, TypeError, SystemExit) as err:
            pytest.fail(f"{name}: {command!r}: {err}")


FRAGMENT = "# a fragment"  # a block's first line when it reads names it does not define


def _examples() -> dict[str, list[str]]:
    """file -> the python code blocks of README.md and the docs pages meant to run, in order
    (a page's blocks share one namespace, as its reader's session would)."""
    found = {}
    for path in _pages():
        blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)
        if runnable := [b for b in blocks if not b.startswith(FRAGMENT)]:
            found[path.name] = runnable
    return found


def test_the_examples_find_the_readmes_and_keras_pages_code():
    assert {"README.md", "keras.md"} <= set(_examples())


@pytest.mark.parametrize("name", sorted(_examples()))
def test_every_python_example_of_the_docs_runs(name):
    """A page's python blocks run as written, in a fresh interpreter (Keras on the torch
    backend, as the keras page says to set it): a renamed function or argument, or a shape
    comment's claim checked by the block, fails here before a reader finds it."""
    import importlib.util
    import os
    import subprocess

    code = "\n".join(_examples()[name])
    if "keras" in code and importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed (the [keras] extra)")
    env = {**os.environ, "KERAS_BACKEND": "torch", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{name}'s example failed:\n{done.stderr[-3000:]}"


def test_every_attnzoo_command_of_the_docs_parses():
    """Every `attnzoo ...` line of the docs is a command and flags the CLI accepts."""
    import shlex

    from attnzoo import cli

    commands = _commands("attnzoo")
    assert {c.split()[1] for _, c in commands} >= {"train", "eval", "plot", "explore", "repro"}
    for name, command in commands:
        try:
            cli.parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"{name}: {command!r} does not parse")


def _rendered_with(page: str, tmp_path: Path, **changes) -> str:
    """`page` rendered from a copy of its JSON, each bench's changed by `changes[bench](data)`:
    the wording a template picks for data it does not have today."""
    for bench in report.PAGES[page]:
        data = json.loads((report.RESULTS / f"{bench}.json").read_text())
        changes.get(bench, lambda data: None)(data)
        (tmp_path / f"{bench}.json").write_text(json.dumps(data))
    return report.Page(page, tmp_path).render()


@pytest.mark.parametrize(
    ("worst", "says"),
    [
        (8.3, "every seed left chance"),
        (60.0, "its worst seed ended at 60.0 % error, off chance"),
        (88.0, "a seed still ended near chance"),
    ],
)
def test_ram_page_words_the_pulled_back_rows_worst_seed_by_its_error(tmp_path, worst, says):
    """'Near chance' is for a seed near a sum's chance error (nine in ten), not any seed
    above 50 % (an audit finding: a seed at 60 % would have been called near chance)."""

    def change(data):
        data["summary"]["addition-dram-pull"]["metrics"]["error"]["max"] = worst

    assert says in _rendered_with("ram", tmp_path, dram=change)


def test_ram_page_claims_no_loss_timing_it_has_not_measured(tmp_path):
    """With a row's `loss_falls_at` missing, 'sooner' stood on a default of 0."""

    def change(data):  # a row that never logged its curve
        data["summary"]["addition-dram-g6-s3"]["metrics"].pop("loss_falls_at", None)
        for row in data["rows"]:
            if row["id"] == "addition-dram-g6-s3":
                row["metrics"].pop("loss_falls_at", None)

    text = _rendered_with("ram", tmp_path, dram=change)
    assert "when its loss started to fall is not in the JSON" in text
    assert "its loss started to fall sooner" not in text


def test_sat_page_says_both_worse_only_when_both_are(tmp_path):
    """'The finer map made both worse' had tested the mass inside the box alone."""

    def change(data):
        data["summary"]["soft-lambda0-grid16"]["metrics"]["exact_match_pct"]["mean"] = 99.0

    text = _rendered_with("show_attend_tell", tmp_path, show_attend_tell=change)
    assert "made both worse" not in text
    assert "lowered the mass inside the box at this budget, though not the exact match" in text
    assert "made both worse" in report.Page("show_attend_tell", report.RESULTS).render()


def test_sat_narrower_view_claims_only_what_every_seed_shows(tmp_path):
    """'lowered both' needs every seed of the kernel-1 pre-trained row below the default
    kernel's on both; 'Nor does its weight stay next to the digit' every seed of the kernel-1
    row below soft-lambda0's within a cell."""
    says_both, says_nor = "the narrower view lowered both", "Nor does its weight stay"
    page = report.Page("show_attend_tell", report.RESULTS).render()
    assert says_both in " ".join(page.split()) and says_nor in page

    def change(data):
        summary = data["summary"]
        summary["soft-lambda0-kernel1-pretrained"]["metrics"]["exact_match_pct"]["max"] = 99.0
        summary["soft-lambda0-kernel1"]["metrics"]["near_correctness"]["max"] = 0.99

    text = " ".join(_rendered_with("show_attend_tell", tmp_path, show_attend_tell=change).split())
    assert says_both not in text and says_nor not in text
    assert "the narrower view lowered the weight inside the box at this budget, though" in text


def test_snail_bandit_sentences_follow_each_seeds_interval(tmp_path):
    """An audit found 'no better than random' on a row whose every seed's interval lay above
    the random policy's (the test compared the mean difference with twice one interval), and
    'earned more than Thompson sampling' on a row one of whose seeds earned less."""
    row = "bandits-n10-k100"
    says_random = "the agent is no better than random at this budget"
    says_begun = "it has barely\nbegun to exploit"

    def no_seed_above(data):  # the best seed's interval reaches down into random's
        m = data["summary"][row]["metrics"]
        m["reward_agent"]["max"] = m["reward_random"]["mean"] + m["ci95_agent"]["max"] / 2

    committed = report.Page("snail", report.RESULTS).render()
    assert says_random not in committed and says_begun in committed
    assert says_random in _rendered_with("snail", tmp_path, snail=no_seed_above)
    assert "earned more than Thompson sampling on every seed" in committed  # n5-k10: every seed
    assert "on par with Thompson sampling" in committed  # lr3e-3-4k: one seed below
