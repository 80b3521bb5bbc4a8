"""`Task.explore` of every registered model/task pair, on a tiny untrained model: the data fit
the explorer's schema (`attnzoo.viz.explore.validate`), each kind's maps have the shape of its
labels, every row of a softmax is a distribution, and a model without attention gives none."""

import math
import re

import pytest
import torch
from tests.test_devices import tiny_config

from attnzoo import runs
from attnzoo.models.registry import MODELS
from attnzoo.tasks.base import MissingDataDependency
from attnzoo.tasks.registry import TASKS
from attnzoo.viz.explore import validate

PAIRS = [
    (model, task)
    for model, m in MODELS.items()
    for task, t in TASKS.items()
    if m.interface == t.interface
]
COUNT = 2


def explored(model_name: str, task_name: str, prepare=None):
    """(config, model, explorer data) of the pair's tiny untrained model; `prepare(task)`,
    where given, first changes the task (what the untrained model would predict, say)."""
    config = tiny_config(model_name, task_name)
    try:
        task, model = runs.build(config)
    except MissingDataDependency as err:
        pytest.skip(str(err))
    if prepare is not None:
        prepare(task)
    return config, model, task.explore(model.eval(), COUNT)


def test_every_model_task_pair_is_covered():
    assert len(PAIRS) >= len(MODELS)  # every model fits some task (test_registries)
    assert {m for m, _ in PAIRS} == set(MODELS)


@pytest.mark.parametrize(("model_name", "task_name"), PAIRS)
def test_explore_fits_the_schema(model_name, task_name):
    config, model, data = explored(model_name, task_name)
    validate(data)
    assert 1 <= len(data["examples"]) <= COUNT
    assert not model.training  # explore leaves the model as it was given: in eval mode
    for example in data["examples"]:
        for kind in example["attention"]:
            w = kind["weights"]
            assert isinstance(w, torch.Tensor) and w.device.type == "cpu"
            assert w.shape[2:] == (len(kind["rows"]), len(kind["columns"]))
            # every attention here is a softmax (or a normalised NTM weighting): rows sum to 1
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:3]), atol=1e-4, rtol=0)
            assert w.min() >= 0
        if data["layout"] == "points":
            for kind in example["attention"]:
                # the column the model chose at each step is a column of that step's row
                assert len(example["output"]) == len(kind["rows"])
    attention = [k for e in data["examples"] for k in e["attention"]]
    if TASKS[task_name].interface == "lm":  # a position attends over the tokens up to it
        start = getattr(model, "tape_start", None)  # or over its tape, from the initial state
        for kind in attention:
            assert kind["columns"] == ([start, *kind["rows"][:-1]] if start else kind["rows"])
    heads = config["model"].get("heads")
    if not MODELS[model_name].attends:
        assert attention == []  # no attention: examples without kinds, not an error
    elif heads is not None:  # per layer and head
        layers = {config["model"].get("layers_enc"), config["model"].get("layers_dec")}
        assert {k["weights"].shape[1] for k in attention} == {heads}
        assert {k["weights"].shape[0] for k in attention} <= layers | {
            config["model"].get("layers")
        }
    else:
        assert attention


def test_seq2seq_rows_are_the_prediction_then_eos():
    """The explorer shows the attention the model had while writing its own output."""
    _, _, data = explored("bahdanau", "reverse")
    for example in data["examples"]:
        (kind,) = example["attention"]
        rows = kind["rows"]
        assert rows[-1] in ("<eos>", "(next)")
        assert " ".join(rows[:-1]) == example["prediction"]
        assert kind["columns"][-1] == "<eos>"
        assert example["correct"] == (example["prediction"] == example["reference"])


def test_transformer_gives_three_kinds_with_their_labels():
    """Each kind's rows and columns are the tokens its queries and keys stand for: the
    decoder reads <bos> and the output, the cross-attention's rows are the output it writes
    then <eos>. An untrained model writes nothing (every output label list would be empty):
    here it writes each reference."""
    held = []

    def write_references(task):
        held.extend(task.examples()[:COUNT])
        task.translate = lambda model, examples: [list(e.target) for e in examples]

    _, _, data = explored("transformer", "reverse", write_references)
    for example, held_out in zip(data["examples"], held, strict=True):
        names = [k["name"] for k in example["attention"]]
        assert names == [
            "encoder self-attention",
            "decoder self-attention (causal)",
            "cross-attention",
        ]
        encoder, decoder, cross = example["attention"]
        source, target = list(held_out.source), list(held_out.target)
        assert target and example["prediction"] == example["reference"]
        assert encoder["rows"] == encoder["columns"] == cross["columns"] == [*source, "<eos>"]
        assert decoder["rows"] == decoder["columns"] == ["<bos>", *target]
        assert cross["rows"] == [*target, "<eos>"]
        # causal: nothing above the diagonal
        assert torch.triu(decoder["weights"], diagonal=1).abs().max() == 0


def test_pointer_columns_and_output_agree():
    """Each step's chosen column names the point predicted there, then "end". An untrained
    net ends at once (an empty hull): here it predicts each true hull from its second vertex."""
    hulls = []

    def predict_hulls(task):
        _, truth = task.test_set(task.config.sizes[0])
        hulls.extend(list(t[1:]) + list(t[:1]) for t in truth[:COUNT])
        task.predict = lambda model, points: hulls[: len(points)]

    _, _, data = explored("pointer-net", "convex_hull", predict_hulls)
    for example, hull in zip(data["examples"], hulls, strict=True):
        assert example["column_points"][0] is None  # "end"
        assert len(hull) >= 3 and example["output"][-1] == 0  # the hull ends at "end"
        assert [example["column_points"][c] for c in example["output"]] == [*hull, None]
        (kind,) = example["attention"]
        assert kind["rows"] == [f"{s + 1}: {i}" for s, i in enumerate(hull)] + [
            f"{len(hull) + 1}: end"
        ]
        assert example["closed"] is True


def test_a_hull_from_another_start_vertex_is_correct_as_its_score_counts_it():
    """The explorer marked a hull listed from another vertex wrong (exact equality) where
    `hull_metrics` counts it right; the other orientation is wrong in both."""
    from attnzoo.tasks import geometry

    task, model = runs.build(tiny_config("pointer-net", "convex_hull"))
    points, truth = task.test_set(task.config.sizes[0])
    for turn, right in ((lambda t: t[1:] + t[:1], True), (lambda t: t[::-1], False)):
        predicted = [turn(list(t)) for t in truth[:COUNT]]
        task.predict = lambda model, points, predicted=predicted: predicted
        data = task.explore(model.eval(), COUNT)
        scored = geometry.hull_metrics(points[:COUNT], predicted, truth[:COUNT])["accuracy"]
        assert [e["correct"] for e in data["examples"]] == [right] * COUNT
        assert scored == (1.0 if right else 0.0)


def test_memory_gives_read_and_write_heads_over_the_rows():
    """Each kind holds its own heads' weightings, (1, T, heads, N) -> (1, heads, T, N)."""
    outs = []

    def keep_outputs(task):
        run_one = task.run_one

        def kept(model, example):
            result = run_one(model, example)  # (example, out, outputs, errors)
            outs.append(result[1])
            return result

        task.run_one = kept

    config, _, data = explored("ntm", "bit_copy", keep_outputs)
    for example, out in zip(data["examples"], outs, strict=True):
        read, write = example["attention"]
        assert (read["name"], write["name"]) == ("read weightings", "write weightings")
        assert len(read["columns"]) == config["model"]["memory_rows"]
        for kind, w in ((read, out.read_weights), (write, out.write_weights)):
            _, steps, heads, rows = w.shape
            assert kind["weights"].shape == (1, heads, steps, rows)
            for h in range(heads):
                torch.testing.assert_close(kind["weights"][0, h], w[0, :, h].float())
        assert not torch.allclose(out.read_weights, out.write_weights)  # the test can tell
        steps = len(read["rows"])
        assert {k: v.shape[0] for k, v in example["signals"].items()} == dict.fromkeys(
            ("inputs", "targets", "outputs"), steps
        )


def test_explore_runs_without_gradients():
    config = tiny_config("transformer", "reverse")
    task, model = runs.build(config)
    data = task.explore(model.eval(), 1)
    assert not any(k["weights"].requires_grad for k in data["examples"][0]["attention"])


def test_image_layout_glimpses_and_where_they_looked():
    """RAM's explorer data: one row per glimpse, the first at the image centre, its finest
    patch's share over the grid cells."""
    config, _, data = explored("ram", "mnist")
    assert data["layout"] == "image"
    example = data["examples"][0]
    (kind,) = example["attention"]
    glimpses = config["model"]["glimpses"]
    assert len(kind["rows"]) == glimpses and example["glimpses"].shape == (glimpses, 2)
    assert example["glimpses"][0].tolist() == [14.0, 14.0]
    assert example["sizes"] == [
        config["model"]["patch"] * 2**s for s in range(config["model"]["scales"])
    ]
    centre = kind["weights"][0, 0, 0].view(8, 8)  # an 8 x 8 patch at the centre of 28 x 28
    assert centre.sum().item() == pytest.approx(1.0)
    assert centre[:2].sum() == 0 and centre[:, :2].sum() == 0  # nothing in the outer cells


@pytest.mark.parametrize(
    ("x", "y", "patch", "height", "width"),
    [
        (4.0, 20.0, 1, 28, 28),
        (4.3, 20.0, 6, 28, 28),
        (26.0, 3.2, 8, 28, 28),
        (30.0, 5.0, 5, 20, 36),
    ],
)
def test_glimpse_weights_put_each_pixel_in_its_rows_and_columns_cell(x, y, patch, height, width):
    """A glimpse's weight over the GRID x GRID cells (row by row) is its patch's share of
    in-image pixels in each: pixel (row r, column c) lies in cell (r * GRID // height,
    c * GRID // width); the patch's corner is the sensor's, centre - patch / 2 rounded."""
    from attnzoo.tasks.mnist import GRID, glimpse_weights

    left, top = math.floor(x - patch / 2 + 0.5), math.floor(y - patch / 2 + 0.5)
    expected = torch.zeros(GRID, GRID)
    for r in range(max(top, 0), min(top + patch, height)):
        for c in range(max(left, 0), min(left + patch, width)):
            expected[r * GRID // height, c * GRID // width] += 1
    got = glimpse_weights(torch.tensor([[x, y]]), patch, height, width)
    torch.testing.assert_close(got, (expected / expected.sum()).view(1, GRID * GRID))
    if patch == 1:  # (x 4, y 20) of 28 x 28: row 20 * 8 // 28 = 5, column 4 * 8 // 28 = 1
        assert got.view(GRID, GRID)[5, 1] == 1


def test_caption_glimpse_is_the_attended_cells_centre():
    """A caption step's glimpse is the weights' centre of mass over the cells' centres, (x, y)
    pixels; the cells go row by row over the grid (rows, columns). Here all of step s's weight
    is on one cell, row s, column s + 1 (mod the grid's)."""
    cells = {}

    def one_cell_a_step(task):
        attend = task.attend

        def attended(model, count, generator=None):
            images, references, predictions, weights, grid = attend(model, count, generator)
            gh, gw = grid
            for k, w in enumerate(weights):
                cells[k] = [(s % gh, (s + 1) % gw) for s in range(len(w))]
                weights[k] = torch.zeros_like(w)
                for s, (r, c) in enumerate(cells[k]):
                    weights[k][s, r * gw + c] = 1.0
            return images, references, predictions, weights, grid

        task.attend = attended

    _, _, data = explored("show-attend-tell", "digit_captions", one_cell_a_step)
    for k, example in enumerate(data["examples"]):
        (gh, gw), (height, width) = example["grid"], example["image"].shape
        assert any(r != c for r, c in cells[k])  # a transposed grid would be seen
        expected = [((c + 0.5) * width / gw, (r + 0.5) * height / gh) for r, c in cells[k]]
        torch.testing.assert_close(example["glimpses"], torch.tensor(expected))


def test_gan_query_glimpses_are_x_then_y():
    """SAGAN's query pixels go to the page as glimpses at their centres, (x, y) pixels of the
    image: x from the query's column, y from its row."""
    _, _, data = explored("sagan", "gan_mnist")
    for example in data["examples"]:
        (kind,) = example["attention"]
        queries = [tuple(map(int, re.findall(r"\d+", row))) for row in kind["rows"]]
        assert any(r != c for r, c in queries)
        scale = example["image"].shape[-1] / example["grid"][1]
        expected = [((c + 0.5) * scale, (r + 0.5) * scale) for r, c in queries]
        torch.testing.assert_close(example["glimpses"], torch.tensor(expected))
