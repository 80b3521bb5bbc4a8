"""The attention explorer: one self-contained HTML page (data, JavaScript and CSS inline,
nothing fetched) to pick a held-out example, step through its output and see each step's
attention over the input, beside the full alignment matrix.

A task gives its data through `Task.explore(model, count) -> dict` in the schema below; this
module knows no task and no model: it checks the schema (`validate`), quantises the weights to
8 bits and writes the page (`explorer_html`), which draws each example by its `layout`.
The page's script and style are package data (`attnzoo/viz/explore/`).

Schema (version 1)::

    {
      "layout": "tokens" | "points" | "memory",  # how the step view draws the columns
      "title": str,                  # what the examples are, e.g. "dates, test split"
      "note": str,                   # how the attention was obtained ("" if nothing to say)
      "examples": [{
        "input": str, "reference": str, "prediction": str,
        "correct": bool | None,      # None: the task has no right or wrong per example
        "attention": [{              # one entry per attention kind; [] without attention
          "name": str,               # e.g. "cross-attention"
          "rows": [str],             # the R output steps (queries)
          "columns": [str],          # the C inputs (keys)
          "weights": (layers, heads, R, C) numbers in [0, 1] (a tensor, an array, lists),
        }],
        # layout "points" (a pointer over input points) also has:
        "points": (n, 1 or 2) coordinates,
        "column_points": [int | None] (C): the point each column is (None: e.g. "end"),
        "output": [int] (R): the column the model chose at each step,
        "truth": [int] | None: the true output as point indices,
        "closed": bool: whether the output is a closed tour or hull,
        # layout "memory" (heads over memory rows) also has:
        "signals": {name: (R, channels) numbers}: e.g. the inputs, targets, outputs per step,
        # layout "image" (hard attention: glimpses over an image) also has:
        "image": (height, width) grey levels in [0, 1],
        "glimpses": (R, 2) each step's glimpse centre (x, y) in pixels from the top-left
            corner ([] without glimpses),
        "sizes": [int]: the sides of the retina's square patches, pixels ([] without),
        "grid": [rows, columns] (optional): the columns are the cells of this grid over the
            image, row-major; the page draws the step's weights over the image,
        "path": bool (optional, default true): the glimpses are one path, drawn up to the
            step; false: each step's point alone (e.g. query pixels that follow no path),
      }]
    }

A layout is the fields it adds (`LAYOUT_FIELDS`) and one drawing function in explore.js.

Note:
    The page stores every weight as round(255 w), an 8-bit integer (base64), and says so; the
    values it shows are those integers / 255 (a head mean: the mean of its heads' integers,
    / 255), so what a hover shows is what the data hold.
"""

from __future__ import annotations

import base64
import html
import json
import re
from importlib import resources
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
LEVELS = 255  # weights are stored as round(LEVELS * w), one byte each
GENERATOR = "attnzoo explore"  # the page's <meta name="generator">: how a page is recognised
LAYOUT_FIELDS = {
    "tokens": (),
    "points": ("points", "column_points", "output", "truth", "closed"),
    "memory": ("signals",),
    "image": ("image", "glimpses", "sizes"),
}
_EXAMPLE_FIELDS = ("input", "reference", "prediction", "correct", "attention")
_TOLERANCE = 1e-4  # weights may leave [0, 1] by float rounding


def _fail(where: str, expected: str, received: object) -> None:
    raise ValueError(f"explorer data: {where!r} expected {expected}, got {received}")


def _check_finite(where: str, values: np.ndarray) -> None:
    """Numbers the page draws: JSON has no NaN (the page's parse would fail, leaving it
    blank), and a model that gives one has diverged; its figures mark it, the page refuses."""
    if values.size and not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        _fail(where, "finite values (a NaN or inf: has the model diverged?)", f"{bad} non-finite")


def _array(x, dtype=float) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float()
    return np.asarray(x, dtype=dtype)


def validate(data: dict[str, Any]) -> None:
    """Raise ValueError naming the first field of `data` that does not fit the schema (the
    module docstring): shapes agree with the labels, weights lie in [0, 1]."""
    if not isinstance(data, dict):
        _fail("data", "a dict", type(data).__name__)
    layout = data.get("layout")
    if layout not in LAYOUT_FIELDS:
        _fail("layout", f"one of {list(LAYOUT_FIELDS)}", repr(layout))
    for key in ("title", "note"):
        if not isinstance(data.get(key), str):
            _fail(key, "a string", repr(data.get(key)))
    examples = data.get("examples")
    if not isinstance(examples, list):
        _fail("examples", "a list", type(examples).__name__)
    for k, example in enumerate(examples):
        where = f"examples[{k}]"
        missing = [f for f in (*_EXAMPLE_FIELDS, *LAYOUT_FIELDS[layout]) if f not in example]
        if missing:
            _fail(where, f"the fields {missing}", sorted(example))
        for key in ("input", "reference", "prediction"):
            if not isinstance(example[key], str):
                _fail(f"{where}.{key}", "a string", repr(example[key]))
        if example["correct"] not in (True, False, None):
            _fail(f"{where}.correct", "True, False or None", repr(example["correct"]))
        for j, kind in enumerate(example["attention"]):
            _check_kind(f"{where}.attention[{j}]", kind)
        if layout == "points":
            _check_points(where, example)
        if layout == "image":
            _check_image(where, example)
        if layout == "memory":
            for name, values in example["signals"].items():
                rows = {len(kind["rows"]) for kind in example["attention"]}
                values = _array(values)
                shape = values.shape
                if len(shape) != 2 or (rows and shape[0] not in rows):
                    _fail(f"{where}.signals.{name}", f"(steps {sorted(rows)}, channels)", shape)
                _check_finite(f"{where}.signals.{name}", values)


def _check_kind(where: str, kind: dict) -> None:
    if not isinstance(kind.get("name"), str):
        _fail(f"{where}.name", "a string", repr(kind.get("name")))
    for key in ("rows", "columns"):
        labels = kind.get(key)
        if not isinstance(labels, list) or not all(isinstance(s, str) for s in labels):
            _fail(f"{where}.{key}", "a list of strings", repr(labels))
    w = _array(kind.get("weights"))
    shape = (len(kind["rows"]), len(kind["columns"]))
    if w.ndim != 4 or w.shape[2:] != shape or 0 in w.shape[:2]:
        _fail(f"{where}.weights", f"shape (layers, heads, {shape[0]}, {shape[1]})", w.shape)
    if not np.isfinite(w).all() or w.min() < -_TOLERANCE or w.max() > 1 + _TOLERANCE:
        _fail(f"{where}.weights", "finite values in [0, 1]", f"[{w.min()}, {w.max()}]")


def _check_points(where: str, example: dict) -> None:
    points = _array(example["points"])
    if points.ndim != 2 or points.shape[1] not in (1, 2):
        _fail(f"{where}.points", "shape (n, 1 or 2)", points.shape)
    _check_finite(f"{where}.points", points)
    n = points.shape[0]
    columns = example["column_points"]
    if any(c is not None and not 0 <= c < n for c in columns):
        _fail(f"{where}.column_points", f"point indices in [0, {n}) or None", columns)
    for kind in example["attention"]:
        if len(kind["columns"]) != len(columns):
            _fail(f"{where}.column_points", f"{len(kind['columns'])} entries", len(columns))
        if len(kind["rows"]) != len(example["output"]):
            _fail(f"{where}.output", f"{len(kind['rows'])} steps", len(example["output"]))
    if any(not 0 <= c < len(columns) for c in example["output"]):
        _fail(f"{where}.output", f"columns in [0, {len(columns)})", example["output"])
    truth = example["truth"]
    if truth is not None and any(not 0 <= i < n for i in truth):
        _fail(f"{where}.truth", f"point indices in [0, {n}) or None", truth)


def _check_image(where: str, example: dict) -> None:
    image = _array(example["image"])
    if image.ndim != 2 or not np.isfinite(image).all():
        _fail(f"{where}.image", "finite (height, width) grey levels", image.shape)
    glimpses = _array(example["glimpses"]).reshape(-1, 2)
    _check_finite(f"{where}.glimpses", glimpses)
    for kind in example["attention"]:
        if len(kind["rows"]) != len(glimpses):
            _fail(f"{where}.glimpses", f"{len(kind['rows'])} (x, y) centres", len(glimpses))
    grid = example.get("grid")
    if grid is not None:
        cells = {len(kind["columns"]) for kind in example["attention"]}
        if (
            not isinstance(grid, list)
            or len(grid) != 2
            or not all(isinstance(v, int) and v > 0 for v in grid)
            or any(c != grid[0] * grid[1] for c in cells)
        ):
            _fail(f"{where}.grid", f"[rows, columns] with rows * columns in {sorted(cells)}", grid)
    sizes = example["sizes"]
    if not isinstance(sizes, list) or not all(isinstance(v, int) and v > 0 for v in sizes):
        _fail(f"{where}.sizes", "a list of positive ints", repr(sizes))
    if not isinstance(example.get("path", True), bool):
        _fail(f"{where}.path", "true or false", repr(example["path"]))


def quantise(weights) -> np.ndarray:
    """Weights in [0, 1] -> uint8 levels round(255 w), the page's stored values."""
    w = np.clip(_array(weights), 0.0, 1.0)
    return np.rint(w * LEVELS).astype(np.uint8)


def _b64(levels: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(levels).tobytes()).decode("ascii")


def payload(data: dict[str, Any]) -> dict[str, Any]:
    """The JSON the page embeds: `data` with every kind's weights replaced by "shape" and
    "data" (base64 of the uint8 levels in C order), numbers as plain lists."""
    examples = []
    for example in data["examples"]:
        out = dict(example)
        out["attention"] = [
            {
                "name": kind["name"],
                "rows": list(kind["rows"]),
                "columns": list(kind["columns"]),
                "shape": list(_array(kind["weights"]).shape),
                "data": _b64(quantise(kind["weights"])),
            }
            for kind in example["attention"]
        ]
        if "points" in out:
            out["points"] = np.round(_array(out["points"]), 4).tolist()
        if "image" in out:
            out["image"] = np.round(_array(out["image"]), 3).tolist()
            # cut (not rounded) to hundredths: the page places a square of side s at
            # floor(x - s / 2 + 0.5), as the sensor does, whose steps lie at multiples of 0.5;
            # rounding moved a centre in [k + 0.495, k + 0.5) across one, a pixel off the read
            centres = _array(out["glimpses"]).reshape(-1, 2)
            out["glimpses"] = (np.floor(centres * 100) / 100).tolist()
        if "signals" in out:
            out["signals"] = {k: np.round(_array(v), 3).tolist() for k, v in out["signals"].items()}
        examples.append(out)
    return {
        "version": SCHEMA_VERSION,
        "levels": LEVELS,
        "layout": data["layout"],
        "title": data["title"],
        "note": data["note"],
        "examples": examples,
    }


def _asset(name: str) -> str:
    return resources.files("attnzoo.viz").joinpath("explore", name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' that could end or open a tag."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def explorer_html(data: dict[str, Any], *, heading: str) -> str:
    """The page for explorer data `data` (checked by `validate`), titled `heading`."""
    validate(data)
    parts = {
        "generator": GENERATOR,
        "heading": html.escape(heading),
        "css": _asset("explore.css"),
        "js": _asset("explore.js"),
        "data": _script_json(payload(data)),
    }
    # one pass, so no inserted text is read again as a {{name}} field of the template
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("explore.html"))
