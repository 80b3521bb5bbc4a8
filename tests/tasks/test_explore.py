"""`Task.explore` of every registered model/task pair, on a tiny untrained model: the data fit
the explorer's schema (`attnzoo.viz.explore.validate`), each kind's maps have the shape of its
labels, every row of a softmax is a distribution, and a model without attention gives none."""

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


def explored(model_name: str, task_name: str):
    config = tiny_config(model_name, task_name)
    try:
        task, model = runs.build(config)
    except MissingDataDependency as err:
        pytest.skip(str(err))
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
    _, _, data = explored("transformer", "reverse")
    example = data["examples"][0]
    names = [k["name"] for k in example["attention"]]
    assert names == ["encoder self-attention", "decoder self-attention (causal)", "cross-attention"]
    encoder, decoder, cross = example["attention"]
    assert encoder["rows"] == encoder["columns"] == cross["columns"]
    assert decoder["rows"][0] == "<bos>" and decoder["rows"][1:] == cross["rows"][:-1]
    # causal: nothing above the diagonal
    assert torch.triu(decoder["weights"], diagonal=1).abs().max() == 0


def test_pointer_columns_and_output_agree():
    _, _, data = explored("pointer-net", "convex_hull")
    for example in data["examples"]:
        assert example["column_points"][0] is None  # "end"
        assert example["output"][-1] == 0  # the hull ends by pointing at "end"
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
    config, _, data = explored("ntm", "bit_copy")
    example = data["examples"][0]
    read, write = example["attention"]
    assert (read["name"], write["name"]) == ("read weightings", "write weightings")
    assert len(read["columns"]) == config["model"]["memory_rows"]
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
