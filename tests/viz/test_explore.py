"""The explorer renderer (`attnzoo.viz.explore`): its schema check, its 8-bit weights, a page
that fetches nothing, and the page's size for the largest current run (the browser test is
tests/viz/test_explore_browser.py)."""

import base64
import json
import re

import numpy as np
import pytest
import torch

from attnzoo.viz.explore import LEVELS, explorer_html, payload, quantise, validate

MAX_PAGE_BYTES = 5_000_000  # the bound for 50 examples of the largest run


def tokens_data(weights=None, rows=("a", "b"), columns=("x", "y", "z")) -> dict:
    if weights is None:
        weights = torch.softmax(torch.randn(2, 3, len(rows), len(columns)), -1)
    kind = {"name": "cross", "rows": list(rows), "columns": list(columns), "weights": weights}
    example = {
        "input": "x y z",
        "reference": "a b",
        "prediction": "a b",
        "correct": True,
        "attention": [kind],
    }
    return {"layout": "tokens", "title": "t", "note": "", "examples": [example]}


def embedded(page: str) -> dict:
    """The page's data, read back without the renderer's code."""
    found = re.search(r'<script type="application/json" id="explore-data">(.*?)</script>', page)
    return json.loads(found.group(1))


def test_valid_data_passes_and_each_mistake_names_its_field():
    validate(tokens_data())
    data = tokens_data()
    data["layout"] = "image?"
    with pytest.raises(ValueError, match="'layout' expected one of"):
        validate(data)
    # a map of another size, or the (2, 3) map transposed: its rows would be read as columns
    for shape in ((1, 1, 2, 2), (1, 1, 3, 2)):
        with pytest.raises(
            ValueError,
            match=r"'examples\[0\].attention\[0\].weights' expected shape \(layers, heads, 2, 3\)",
        ):
            validate(tokens_data(weights=torch.full(shape, 0.5)))
    with pytest.raises(ValueError, match=r"weights' expected finite values in \[0, 1\]"):
        validate(tokens_data(weights=torch.full((1, 1, 2, 3), 1.5)))
    with pytest.raises(ValueError, match=r"weights' expected finite values"):
        validate(tokens_data(weights=torch.full((1, 1, 2, 3), float("nan"))))
    data = tokens_data()
    del data["examples"][0]["reference"]
    with pytest.raises(ValueError, match=r"'examples\[0\]' expected the fields \['reference'\]"):
        validate(data)
    data = tokens_data()
    data["examples"][0]["correct"] = "yes"
    with pytest.raises(ValueError, match="correct' expected True, False or None"):
        validate(data)
    data = tokens_data()
    data["layout"] = "points"  # a points example without its fields
    with pytest.raises(ValueError, match="'points', 'column_points'"):
        validate(data)


def test_points_fields_are_checked_against_the_columns():
    data = tokens_data(rows=("1", "2"), columns=("end", "0", "1"))
    data["layout"] = "points"
    data["examples"][0].update(
        points=[[0.1, 0.2], [0.5, 0.5]], column_points=[None, 0, 1], output=[1, 0], truth=[0, 1]
    )
    data["examples"][0]["closed"] = True
    validate(data)
    data["examples"][0]["output"] = [1, 3]
    with pytest.raises(ValueError, match="output' expected columns in"):
        validate(data)


def test_quantise_stores_round_255_w_and_the_page_holds_exactly_that():
    w = torch.tensor([0.0, 1 / 255, 0.5, 0.9999, 1.0, 1.0000001])
    assert quantise(w).tolist() == [0, 1, 128, 255, 255, 255]
    weights = torch.softmax(torch.randn(2, 3, 4, 5) * 3, -1)
    data = tokens_data(weights, rows="abcd", columns="vwxyz")
    page = explorer_html(data, heading="h")
    kind = embedded(page)["examples"][0]["attention"][0]
    levels = np.frombuffer(base64.b64decode(kind["data"]), np.uint8).reshape(kind["shape"])
    assert kind["shape"] == [2, 3, 4, 5]
    assert (levels == np.rint(weights.numpy() * LEVELS)).all()
    # 8 bits keep every weight within half a level, and the page says so
    assert np.abs(levels / LEVELS - weights.numpy()).max() <= 0.5 / LEVELS + 1e-7
    assert "Weights shown to 1/" in page


def test_the_page_fetches_nothing_and_labels_cannot_end_its_script():
    hostile = ["</script><script>alert(1)</script>", "<!--", "&amp;"]
    page = explorer_html(tokens_data(columns=hostile), heading="<b>run</b>")
    assert page.count("</script>") == 2  # the data's and the code's, nothing a label closed
    assert "<b>run</b>" not in page and "&lt;b&gt;run&lt;/b&gt;" in page
    assert embedded(page)["examples"][0]["attention"][0]["columns"] == hostile
    # no address but the SVG namespace (a name, never fetched) and the empty icon
    addresses = set(re.findall(r"(?:https?|ftp)://[^\s\"')]+", page))
    assert addresses <= {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(?:script|link|img)[^>]+(?:src|href)=\"(?!data:)", page)


def test_payload_keeps_text_fields_and_rounds_signals():
    data = tokens_data()
    data["layout"] = "memory"
    data["examples"][0]["signals"] = {"inputs": torch.tensor([[0.123456], [1.0]])}
    validate(data)
    out = payload(data)
    assert out["version"] == 1 and out["levels"] == LEVELS and out["layout"] == "memory"
    assert out["examples"][0]["signals"]["inputs"] == [[0.123], [1.0]]
    assert out["examples"][0]["reference"] == "a b"


def test_payload_keeps_each_glimpse_square_on_the_pixels_the_sensor_read():
    """The page draws a retina square of side s at floor(x - s / 2 + 0.5), as the sensor
    places it; the centres went to the page rounded to hundredths, so one in [k + 0.495,
    k + 0.5) drew its square a pixel right of (or below) what the sensor read."""
    centres = np.array(
        [k + f for k in range(3, 9) for f in (0.0, 0.004, 0.4951, 0.4999, 0.5, 0.9951)]
    )
    glimpses = np.stack([centres, centres[::-1]], -1)  # (steps, 2) as (x, y) pixels
    kind = {"name": "g", "rows": [str(t) for t in range(len(glimpses))], "columns": ["a"]}
    kind["weights"] = np.ones((1, 1, len(glimpses), 1))
    example = {"input": "i", "reference": "1", "prediction": "1", "correct": None}
    example |= {"attention": [kind], "image": np.zeros((12, 12)), "sizes": [5, 8]}
    example["glimpses"] = glimpses
    data = {"layout": "image", "title": "t", "note": "", "examples": [example]}
    validate(data)
    sent = np.array(payload(data)["examples"][0]["glimpses"])
    for side in (5, 8, 12):
        np.testing.assert_array_equal(
            np.floor(sent - side / 2 + 0.5), np.floor(glimpses - side / 2 + 0.5)
        )
    assert np.abs(sent - glimpses).max() < 0.01


@pytest.mark.slow
def test_fifty_kjv2web_transformer_examples_stay_under_the_size_bound():
    """The largest current run: the default Transformer on kjv2web (layers x heads x three
    kinds). Untrained, its outputs run to the longest decode: the worst case of a run."""
    from attnzoo import runs
    from attnzoo.tasks.base import MissingDataDependency

    try:
        task, model = runs.build(runs.default_config("transformer", "kjv2web"))
    except MissingDataDependency as err:
        pytest.skip(str(err))
    data = task.explore(model.eval(), 50)
    assert len(data["examples"]) == 50
    assert {len(e["attention"]) for e in data["examples"]} == {3}
    size = len(explorer_html(data, heading="kjv2web").encode())
    assert size < MAX_PAGE_BYTES, size


def test_the_page_assets_ship_in_the_wheel():
    """Every file of attnzoo/viz/explore/ matches a package-data glob of pyproject.toml."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["attnzoo.viz"]
    assets = sorted((root / "src" / "attnzoo" / "viz" / "explore").iterdir())
    assert {p.name for p in assets} >= {"explore.html", "explore.js", "explore.css"}
    for path in assets:
        assert any(fnmatch.fnmatch(f"explore/{path.name}", g) for g in globs), path.name


def test_image_layout_checks_its_fields():
    kind = {
        "name": "g",
        "rows": ["1", "2"],
        "columns": ["a", "b"],
        "weights": np.full((1, 1, 2, 2), 0.5),
    }
    example = {
        "input": "i",
        "reference": "1",
        "prediction": "1",
        "correct": True,
        "attention": [kind],
        "image": np.zeros((4, 4)),
        "glimpses": np.ones((2, 2)),
        "sizes": [2, 4],
    }
    data = {"layout": "image", "title": "t", "note": "", "examples": [example]}
    validate(data)
    assert '"layout":"image"' in explorer_html(data, heading="h")
    with pytest.raises(ValueError, match="glimpses"):
        validate({**data, "examples": [{**example, "glimpses": np.ones((3, 2))}]})
    with pytest.raises(ValueError, match="sizes"):
        validate({**data, "examples": [{**example, "sizes": [0]}]})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("field", ["signals", "points", "glimpses"])
def test_a_non_finite_number_the_page_draws_is_refused(field, bad):
    """JSON has no NaN: the page embedded one, its parse failed and it stayed blank while the
    command said it wrote it (a diverged NTM's outputs). The field is named instead."""
    data = tokens_data(rows=("1", "2"), columns=("end", "0", "1"))
    example = data["examples"][0]
    if field == "signals":
        data["layout"] = "memory"
        example["signals"] = {"outputs": torch.tensor([[0.5], [bad]])}
    elif field == "points":
        data["layout"] = "points"
        example.update(
            points=[[0.1, bad], [0.5, 0.5]], column_points=[None, 0, 1], output=[1, 0], truth=None
        )
        example["closed"] = True
    else:
        data["layout"] = "image"
        example.update(image=torch.zeros(4, 4), glimpses=[[0.1, 0.2], [bad, 0.3]], sizes=[2])
    with pytest.raises(ValueError, match=rf"{field}.*expected finite values \(a NaN or inf"):
        explorer_html(data, heading="h")
