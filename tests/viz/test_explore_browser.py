"""The explorer page in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `make test` installs where it can) driven by Selenium, pointed at the
system binaries so that Selenium Manager never downloads one. Skipped, saying what is missing,
where there is no Chromium.

Two tiny runs are trained for a few steps (Bahdanau and a Transformer on dates), their pages
written and opened from disk (file://). The page's data are read back and decoded here, on
their own (base64 -> uint8 levels), and compared with what the page highlights.

`python -m tests.viz.test_explore_browser PAGE PNG` takes a screenshot of a page (the README's).
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from attnzoo import runs
from tests.train.test_loop import TINY

CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
TINY_TRANSFORMER = [
    "model.d_model=16",
    "model.heads=2",
    "model.layers_enc=1",
    "model.layers_dec=2",
    "model.d_ff=32",
]


def _binary(names) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def start_browser(width: int = 1280, height: int = 900):
    """Headless Chromium with its console log kept, or a skip naming what is missing."""
    chromium, driver = _binary(CHROMIUM), _binary(CHROMEDRIVER)
    missing = [
        what for what, path in (("chromium", chromium), ("chromedriver", driver)) if not path
    ]
    if missing:
        pytest.skip(
            f"no {' or '.join(missing)} for the browser test: "
            "apt-get install chromium chromium-driver (make test does, as root)"
        )
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium missing: pip install -e '.[dev]'"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def severe(browser) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def open_page(browser, page: Path) -> dict:
    """Open `page` from disk; its embedded data, decoded here (each kind's "levels": the
    (layers, heads, rows, columns) uint8 array)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(Path(page).resolve().as_uri())
    WebDriverWait(browser, 10).until(
        lambda b: b.execute_script("return document.body.dataset.ready") == "true"
    )
    text = browser.execute_script("return document.getElementById('explore-data').textContent")
    data = json.loads(text)
    for example in data["examples"]:
        for kind in example["attention"]:
            raw = np.frombuffer(base64.b64decode(kind["data"]), dtype=np.uint8)
            kind["levels"] = raw.reshape(kind["shape"])
    return data


def write_page(path: Path, layout: str, example: dict) -> Path:
    """A page of one hand-made example, its fields those of `layout`."""
    from attnzoo.viz.explore import explorer_html

    example = {"input": "i", "reference": "r", "prediction": "p", "correct": None, **example}
    data = {"layout": layout, "title": "t", "note": "", "examples": [example]}
    path.write_text(explorer_html(data, heading=layout))
    return path


def highlighted(browser) -> tuple[int, list[float]]:
    """The step view's highlighted (argmax) column and every cell's level."""
    cells = browser.find_elements("css selector", "#cells .cell")
    marked = [
        int(c.get_attribute("data-col")) for c in cells if "argmax" in c.get_attribute("class")
    ]
    assert len(marked) == 1, marked
    return marked[0], [float(c.get_attribute("data-level")) for c in cells]


def choose(browser, select_id: str, index: int) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", select_id)).select_by_index(index)


def step_of(browser) -> int:
    return int(browser.find_element("id", "step").get_attribute("value"))


def check_row(browser, levels: np.ndarray) -> None:
    """The highlighted cell is the first maximum of `levels` (the current row the page
    should show), and each cell shows its level."""
    column, shown = highlighted(browser)
    assert column == int(np.argmax(levels)), (column, levels)
    np.testing.assert_allclose(shown, levels, atol=1e-9)


def train_and_write(out: Path, model: str, extra=()) -> Path:
    config = runs.default_config(model, "dates")
    sets = [s for s in TINY if not s.startswith("model.") or not extra]  # extra: the model's
    config = runs.apply_overrides(config, [*sets, "train.steps=4", "eval.limit=6", *extra])
    task, net, _ = runs.run_train(config, out, progress=False)
    return runs.write_explorer(out / runs.EXPLORER, task, net, count=4, heading=f"{model} test")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore_browser")
    return {
        "bahdanau": train_and_write(root / "bahdanau", "bahdanau"),
        "transformer": train_and_write(root / "transformer", "transformer", TINY_TRANSFORMER),
    }


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


def test_steps_heads_and_examples_in_the_browser(browser, pages, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    # 1. Bahdanau: one kind, one head; the right arrow moves one step
    data = open_page(browser, pages["bahdanau"])
    assert severe(browser) == []
    assert "Weights shown to 1/255" in browser.find_element("id", "quantised").text
    levels = data["examples"][0]["attention"][0]["levels"]  # (1, 1, rows, columns)
    check_row(browser, levels[0, 0, 0])
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    assert step_of(browser) == 1
    check_row(browser, levels[0, 0, 1])
    # hovering a cell shows its stored weight, levels / 255
    column, _ = highlighted(browser)
    cell = browser.find_element("css selector", f'#cells .cell[data-col="{column}"]')
    ActionChains(browser).move_to_element(cell).perform()
    readout = browser.find_element("id", "readout").text
    assert readout.endswith(f"{levels[0, 0, 1, column] / 255:.3f}"), readout
    # on the focused slider an arrow still moves one step (the page's, not the slider's too)
    browser.execute_script("document.getElementById('step').focus()")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    step = min(2, levels.shape[2] - 1)
    assert step_of(browser) == step
    check_row(browser, levels[0, 0, step])

    # 2. the Transformer: another head, the mean of heads, another kind, another example
    data = open_page(browser, pages["transformer"])
    assert severe(browser) == []
    kinds = data["examples"][0]["attention"]
    assert [k["name"] for k in kinds][-1] == "cross-attention"
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    step = step_of(browser)
    assert step == 1
    check_row(browser, kinds[0]["levels"][0, 0, step])  # encoder self-attention, head 1
    choose(browser, "head", 1)
    check_row(browser, kinds[0]["levels"][0, 1, step])
    choose(browser, "head", 2)  # the mean of the heads' stored levels
    _, shown = highlighted(browser)
    np.testing.assert_allclose(shown, kinds[0]["levels"][0, :, step].mean(0), atol=1e-9)
    choose(browser, "kind", 2)  # cross-attention: back to its first step
    choose(browser, "head", 1)
    choose(browser, "layer", 1)
    assert step_of(browser) == 0
    check_row(browser, kinds[2]["levels"][1, 1, 0])
    browser.execute_script("document.activeElement.blur()")  # the arrows are the page's again
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()  # a short output stays at its end
    step = min(1, kinds[2]["shape"][2] - 1)
    assert step_of(browser) == step
    check_row(browser, kinds[2]["levels"][1, 1, step])
    choose(browser, "example", 1)
    other = data["examples"][1]
    assert browser.find_element("id", "input").text == other["input"]
    step = min(step, other["attention"][2]["shape"][2] - 1)
    check_row(browser, other["attention"][2]["levels"][1, 1, step])
    shot = tmp_path / "explore.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    assert severe(browser) == []


def test_a_cells_every_pixel_reads_that_cell(browser, pages):
    """The matrix's hover and click found the cell from the canvas's bounding box, which holds
    its 1 px border: the last pixel row and column of every cell read the next cell's weight,
    and a click there went to the next step."""
    data = open_page(browser, pages["bahdanau"])
    kind = data["examples"][0]["attention"][0]
    probe = """
        const [x, y, what] = arguments, c = document.getElementById('matrix');
        const r = c.getBoundingClientRect(), cell = Number(c.dataset.cell);
        const at = (offset, inner) => offset + c.clientLeft + inner + 0.5;  // a pixel's middle
        c.dispatchEvent(new MouseEvent(what, {bubbles: true,
            clientX: r.left + at(Number(c.dataset.left), x * cell + (x >= 0 ? cell - 1 : 0)),
            clientY: r.top + at(Number(c.dataset.top), y * cell + cell - 1)}));
        return [document.getElementById('readout').textContent, cell];
    """
    columns = kind["columns"]
    readout, cell = browser.execute_script(probe, 0, 0, "mousemove")  # row 0, column 0's corner
    assert cell > 1 and f"\u2192 {columns[0]}:" in readout, readout
    browser.execute_script(probe, 0, 1, "click")  # row 1's last pixel row: step 1, not 2
    assert step_of(browser) == 1


def screenshot(page: Path, png: Path) -> None:
    """A screenshot of an explorer page, a few steps into its first example."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    browser = start_browser(800, 820)  # a docs page's width
    try:
        open_page(browser, page)
        ActionChains(browser).send_keys(*[Keys.ARROW_RIGHT] * 5).perform()
        column, _ = highlighted(browser)
        cell = browser.find_element("css selector", f'#cells .cell[data-col="{column}"]')
        ActionChains(browser).move_to_element(cell).perform()  # the hover readout shows
        browser.save_screenshot(str(png))
    finally:
        browser.quit()


if __name__ == "__main__":
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))


@pytest.mark.parametrize(
    ("model", "task"),
    [("encdec", "reverse"), ("pointer-net", "convex_hull"), ("ntm", "bit_copy")],
)
def test_every_layout_draws_without_errors(browser, tmp_path, model, task):
    """Untrained tiny models: a model without attention says so; the points and memory
    layouts draw and step."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    from tests.test_devices import tiny_config

    built_task, net = runs.build(tiny_config(model, task))
    page = runs.write_explorer(tmp_path / "explore.html", built_task, net, count=2, heading=model)
    data = open_page(browser, page)
    assert severe(browser) == []
    if not data["examples"][0]["attention"]:
        assert browser.find_element("id", "no-attention").is_displayed()
        assert not browser.find_element("id", "views").is_displayed()
        return
    levels = data["examples"][0]["attention"][0]["levels"]
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    step = min(1, levels.shape[2] - 1)
    assert step_of(browser) == step
    check_row(browser, levels[0, 0, step])
    if data["layout"] == "points":
        assert browser.find_elements("css selector", "#points-view circle")
    if data["layout"] == "memory":
        assert browser.find_elements("css selector", "table.signals td")
    assert severe(browser) == []


@pytest.mark.parametrize("path", [True, False])
def test_image_points_are_a_path_only_when_they_are_one(browser, tmp_path, path):
    """SAGAN's explorer gives each query pixel as a step's point: the page joined them into
    a glimpse path, as if the model had moved from one to the next. With "path": false it
    draws the step's point alone."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    from attnzoo.viz.explore import explorer_html

    kind = {"name": "g", "rows": ["q0", "q1", "q2"], "columns": ["a", "b", "c", "d"]}
    kind["weights"] = np.full((1, 1, 3, 4), 0.25)
    example = {"input": "i", "reference": "1", "prediction": "1", "correct": None}
    example |= {"attention": [kind], "image": np.zeros((8, 8)), "sizes": [], "grid": [2, 2]}
    example |= {"glimpses": [[1.0, 1.0], [6.0, 2.0], [3.0, 7.0]], "path": path}
    page = tmp_path / "explore.html"
    data = {"layout": "image", "title": "t", "note": "", "examples": [example]}
    page.write_text(explorer_html(data, heading="points"))
    open_page(browser, page)
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT).perform()
    assert step_of(browser) == 2
    drawn = browser.find_elements("css selector", "#glimpse-path")
    point = browser.find_elements("css selector", "#glimpse-point")
    assert (len(drawn), len(point)) == ((1, 0) if path else (0, 1))
    if not path:  # the third query's point, in the page's pixels
        cx, cy = (float(point[0].get_attribute(a)) for a in ("cx", "cy"))
        svg = browser.find_element("css selector", "#layout-view svg")
        scale = float(svg.get_attribute("width")) / 8
        assert (cx / scale, cy / scale) == pytest.approx((3.0, 7.0))
    assert severe(browser) == []


def test_a_signal_below_zero_is_drawn_on_a_signed_scale(browser, tmp_path):
    """Repeat copy's count input is normalised (mean 0, sd 1): a count of 1 to 5 is below 0,
    and the memory view clamped it to 0-1, white as no input. A signal with a value below 0
    is drawn on a signed scale (blue below 0, red above); one without stays grey."""
    from attnzoo.viz.explore import explorer_html

    kind = {"name": "read", "rows": ["t0", "t1"], "columns": ["m0", "m1"]}
    kind["weights"] = np.full((1, 1, 2, 2), 0.5)
    example = {"input": "i", "reference": "r", "prediction": "p", "correct": None}
    example["signals"] = {"inputs": [[1.0, -1.57], [0.0, 0.0]], "outputs": [[1.0, 0.0], [0, 0]]}
    example["attention"] = [kind]
    page = tmp_path / "explore.html"
    data = {"layout": "memory", "title": "t", "note": "", "examples": [example]}
    page.write_text(explorer_html(data, heading="signals"))
    open_page(browser, page)
    rows = browser.find_elements("css selector", "table.signals tr")
    colour = [
        [
            td.value_of_css_property("background-color")
            for td in tr.find_elements("css selector", "td")
        ]
        for tr in rows
    ]
    # on one scale of +-1.57, the signal's largest size: +1 light red, -1.57 full blue
    assert colour[0] == ["rgba(255, 93, 93, 1)", "rgba(0, 0, 255, 1)"]
    assert colour[1] == ["rgba(0, 0, 0, 1)", "rgba(255, 255, 255, 1)"]  # 0-1 grey as before
    assert severe(browser) == []


def test_every_layer_and_head_shows_its_own_map(browser, tmp_path):
    """The levels are (layers, heads, rows, columns): layer l's head h is map l * heads + h.
    With 2 layers of 3 heads, each map one constant of its own, every choice (and each
    layer's mean of heads) shows its map. The trained pages' choices are all ones where
    reading map h * layers + l gives the same map (1 layer, or as many layers as heads)."""
    layers, heads = 2, 3
    value = (np.arange(layers * heads).reshape(layers, heads, 1, 1) + 1) / 8
    kind = {"name": "self", "rows": ["a", "b"], "columns": ["x", "y", "z"]}
    kind["weights"] = np.broadcast_to(value, (layers, heads, 2, 3)).copy()
    data = open_page(
        browser, write_page(tmp_path / "explore.html", "tokens", {"attention": [kind]})
    )
    levels = data["examples"][0]["attention"][0]["levels"]
    assert len(np.unique(levels)) == layers * heads  # no two maps alike
    shown = "return [...document.querySelectorAll('#cells .cell')].map(c => c.dataset.level)"
    at = (0, 0)  # the page opens on layer 1, head 1; each choice below changes one control
    for layer, head in [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)]:
        if layer != at[0]:
            choose(browser, "layer", layer)
        if head != at[1]:
            choose(browser, "head", head)  # head 3 (= heads): the mean of the layer's heads
        at = (layer, head)
        want = levels[layer, head, 0] if head < heads else levels[layer, :, 0].mean(0)
        np.testing.assert_allclose(np.float64(browser.execute_script(shown)), want)
    assert severe(browser) == []


def test_each_point_is_drawn_with_its_own_columns_weight(browser, tmp_path):
    """In the points layout a point's circle grows with the weight of the column that names
    it (column_points): the "end" column comes first, so column j is point j - 1."""
    kind = {"name": "pointer", "rows": ["1: 1"], "columns": ["end", "0", "1", "2"]}
    kind["weights"] = np.array([0.1, 0.2, 0.6, 0.1]).reshape(1, 1, 1, 4)
    example = {"attention": [kind], "points": [[0.1, 0.1], [0.5, 0.9], [0.9, 0.2]]}
    example |= {"column_points": [None, 0, 1, 2], "output": [2], "truth": None, "closed": False}
    data = open_page(browser, write_page(tmp_path / "explore.html", "points", example))
    row = data["examples"][0]["attention"][0]["levels"][0, 0, 0]
    circles = browser.find_elements("css selector", "#points-view circle")
    radius = [float(c.get_attribute("r")) for c in circles]
    # point i is column i + 1's; a circle's radius is 4 px + 10 px at weight 1
    np.testing.assert_allclose(radius, 4 + 10 * row[1:].astype(float) / 255)
    assert int(np.argmax(radius)) == 1  # the step's argmax column, "1", is point 1
    assert severe(browser) == []


@pytest.mark.parametrize(("grid", "cells"), [([2, 2], [1]), ([2, 4], [1, 6])])
def test_a_grid_cell_is_drawn_at_its_row_and_column(browser, tmp_path, grid, cells):
    """Grid columns are the cells row by row ([rows, columns]): cell j lies in row
    j // columns, column j % columns, drawn over the image at (x, y) = (column, row) cell
    sizes."""
    gh, gw = grid
    kind = {"name": "grid", "rows": ["q"], "columns": [str(j) for j in range(gh * gw)]}
    kind["weights"] = np.zeros((1, 1, 1, gh * gw))
    kind["weights"][..., cells] = 1 / len(cells)
    example = {"attention": [kind], "image": np.zeros((8, 8)), "glimpses": [[2.0, 2.0]]}
    example |= {"sizes": [], "grid": grid, "path": False}
    open_page(browser, write_page(tmp_path / "explore.html", "image", example))
    svg = browser.find_element("css selector", "#layout-view svg")
    width, height = (float(svg.get_attribute(a)) for a in ("width", "height"))
    drawn = [
        (float(r.get_attribute("x")) / width, float(r.get_attribute("y")) / height)
        for r in browser.find_elements("css selector", "#layout-view rect.grid-cell")
    ]
    assert drawn == [((j % gw) / gw, (j // gw) / gh) for j in cells]
    assert severe(browser) == []
