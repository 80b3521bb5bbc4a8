"""The `glyphs` few-shot task (`attnzoo.tasks.glyphs`): the classes and their split, the warp,
episodes (deterministic, well formed, from the right split), the loss and the evaluation."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnzoo.models.snail import FewShotOutput
from attnzoo.tasks import glyphs as G
from attnzoo.tasks.base import EvalConfig

CONFIG = G.GlyphsConfig(ways=4, shots=2, queries=3, eval_queries=2, test_episodes=60)


@pytest.fixture(scope="module")
def task():
    return G.GlyphsTask(CONFIG, seed=1, eval_config=EvalConfig(limit=0))


def test_classes_scripts_and_the_split(task):
    inv = task.inventory
    counts = inv.counts()
    assert len(inv.points) >= 1000 and len(set(inv.points)) == len(inv.points)
    assert len(counts["background"]) + len(counts["evaluation"]) >= 20
    assert set(counts["evaluation"]) == set(CONFIG.test_scripts)
    assert not set(counts["background"]) & set(counts["evaluation"])
    assert min(n for c in counts.values() for n in c.values()) >= CONFIG.min_classes
    assert sorted(inv.background + inv.evaluation) == list(range(len(inv.points)))


def _small(drawings) -> torch.Tensor:
    """(point, face) pairs -> their drawings at 28 x 28 in [0, 1], float64 (n, 784)."""
    images = torch.stack([G.render(p, f) for p, f in drawings]).double() / 255
    return F.avg_pool2d(images.unsqueeze(1), 2).flatten(1)


def _alike(a: list[int], b: list[int]) -> torch.Tensor:
    """(len(a), len(b)) bool: whether characters look alike as the task defines it, an RMS under
    min_distance at 28 x 28 in their first faces or in any face that draws both."""
    cover = G.coverage()
    views = [[(p, cover[p][0]) for p in a], [(p, cover[p][0]) for p in b]]
    alike = torch.cdist(_small(views[0]), _small(views[1])).pow(2) / 784 < CONFIG.min_distance**2
    for face in range(len(G.FACES)):
        rows = [i for i, p in enumerate(a) if face in cover[p]]
        cols = [j for j, p in enumerate(b) if face in cover[p]]
        if rows and cols:
            x, y = _small([(a[i], face) for i in rows]), _small([(b[j], face) for j in cols])
            near = torch.cdist(x, y).pow(2) / 784 < CONFIG.min_distance**2
            alike[torch.tensor(rows)[:, None], torch.tensor(cols)] |= near
    return alike


def test_no_two_classes_look_alike_and_no_test_class_repeats_a_training_one(task):
    """Every two classes at least min_distance apart (RMS at 28 x 28) in their first faces and
    in every face that draws both: an evaluation class is no background class in disguise in
    any face its instances are drawn in (U+2300 and U+2205, one drawing in DejaVu Sans Mono,
    were two classes while only first faces were compared)."""
    points = list(task.inventory.points)
    alike = _alike(points, points)
    alike.fill_diagonal_(False)
    pairs = [(f"U+{points[i]:04X}", f"U+{points[j]:04X}") for i, j in alike.nonzero().tolist()]
    assert not pairs


def test_a_look_alike_is_dropped_from_the_evaluation_set_not_the_background(task):
    """Look-alikes are deduplicated background scripts first: a background character missing
    from the classes (its script kept) that looks like a kept evaluation class was dropped for a
    kept background class it looks like, never for the evaluation class."""
    inv, cover = task.inventory, G.coverage()
    kept = set(inv.points)
    scripts = {inv.scripts[c] for c in inv.background}
    lost = [p for p in sorted(cover) if p not in kept and G.group_of(p) in scripts]
    evaluation = [inv.points[c] for c in inv.evaluation]
    hits = _alike(lost, evaluation).any(1).tolist()
    like_evaluation = [p for p, hit in zip(lost, hits, strict=True) if hit]
    assert like_evaluation  # the case arises
    assert _alike(like_evaluation, [inv.points[c] for c in inv.background]).any(1).all()


def test_a_warp_of_nothing_averages_two_by_two():
    flat = G.GlyphsConfig(rotation=0, scale=0, shear=0, shift=0, elastic=0, stroke=0)
    canvas = torch.randint(256, (3, G.CANVAS, G.CANVAS), dtype=torch.uint8)
    out = G.warp(flat, canvas, torch.Generator().manual_seed(0))
    expected = F.avg_pool2d(canvas.float().unsqueeze(1) / 255, 2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_the_stroke_blends_towards_the_dilation_or_the_erosion():
    """Step 1 alone: weight t ~ U(-stroke, stroke) drawn first from the generator, towards
    the 3 x 3 dilation where t > 0 and the erosion where t < 0 (a float64 reference with
    explicit neighbourhoods), then the identity map's 2 x 2 average."""
    stroke = G.GlyphsConfig(rotation=0, scale=0, shear=0, shift=0, elastic=0, stroke=0.8)
    n, side = 6, G.CANVAS
    canvas = torch.randint(256, (n, side, side), dtype=torch.uint8, generator=torch.Generator())
    out = G.warp(stroke, canvas, torch.Generator().manual_seed(1))
    t = (torch.rand(n, 1, 1, 1, generator=torch.Generator().manual_seed(1)) * 2 - 1) * 0.8
    assert (t > 0).any() and (t < 0).any()
    x = canvas.double() / 255
    padded = {
        "max": F.pad(x, (1, 1, 1, 1), value=-1.0),
        "min": F.pad(x, (1, 1, 1, 1), value=2.0),
    }
    shifts = [(dy, dx) for dy in range(3) for dx in range(3)]

    def around(v):  # (9, n, side, side): each pixel's 3 x 3 neighbourhood
        return torch.stack([v[:, dy : dy + side, dx : dx + side] for dy, dx in shifts])

    dilated, eroded = around(padded["max"]).amax(0), around(padded["min"]).amin(0)
    w = t.double().view(n, 1, 1)
    blended = torch.where(w > 0, x + w * (dilated - x), x - w * (eroded - x))
    expected = F.avg_pool2d(blended.unsqueeze(1), 2)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)


def test_warps_vary_the_instances_within_range():
    canvas = torch.zeros(4, G.CANVAS, G.CANVAS, dtype=torch.uint8)
    canvas[:, 20:36, 24:32] = 255
    out = G.warp(CONFIG, canvas, torch.Generator().manual_seed(0))
    assert out.shape == (4, 1, G.SIDE, G.SIDE) and out.min() >= 0 and out.max() <= 1
    assert not torch.allclose(out[0], out[1])


def test_episodes_are_well_formed_and_deterministic(task):
    a, b = task.batch(5, 6, "cpu"), task.batch(5, 6, "cpu")
    for x, y in zip(a[:5], b[:5], strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a.support, task.batch(6, 6, "cpu").support)
    n, k = CONFIG.ways, CONFIG.shots
    assert a.support.shape == (6, n * k, 1, G.SIDE, G.SIDE)
    assert a.query.shape == (6, CONFIG.queries, 1, G.SIDE, G.SIDE) and a.items == 6 * 3
    for labels in a.support_labels:  # every label K times, in a shuffled order
        assert torch.bincount(labels, minlength=n).tolist() == [k] * n
    assert a.query_labels.min() >= 0 and a.query_labels.max() < n
    assert all(len(set(c.tolist())) == n for c in a.classes)
    assert set(a.classes.flatten().tolist()) <= set(task.inventory.background)


def drawn_episodes(task, monkeypatch, count):
    """`count` training episodes and the class of each image `draw` was asked for (b, N K + q),
    by a spy that draws blank images."""
    asked = []

    def spy(config, inv, classes, generator):
        asked.append(classes.clone())
        return torch.zeros(len(classes), 1, G.SIDE, G.SIDE)

    monkeypatch.setattr(G, "draw", spy)
    batch = task.batch(0, count, "cpu")
    return batch, torch.cat(asked).view(count, -1)


def test_each_image_shows_the_class_of_its_label(task, monkeypatch):
    """Support image j shows classes[support_labels[j]], query q classes[query_labels[q]]."""
    batch, shown = drawn_episodes(task, monkeypatch, 50)
    support = CONFIG.ways * CONFIG.shots
    assert torch.equal(shown[:, :support], batch.classes.gather(1, batch.support_labels))
    assert torch.equal(shown[:, support:], batch.classes.gather(1, batch.query_labels))


def test_query_labels_are_uniform_over_the_ways(task, monkeypatch):
    """Over 400 episodes every label is queried about as often (each count more than half
    its expectation, n / N: 10 standard deviations below it)."""
    batch, _ = drawn_episodes(task, monkeypatch, 400)
    counts = torch.bincount(batch.query_labels.flatten(), minlength=CONFIG.ways)
    assert len(counts) == CONFIG.ways
    assert counts.min() > 0.5 * batch.query_labels.numel() / CONFIG.ways, counts


def test_shards_partition_the_global_batch(task):
    whole = task.batch(2, 4, "cpu")
    parts = [task.batch(2, 4, "cpu", rank=r, world=2) for r in range(2)]
    for r, part in enumerate(parts):
        assert torch.equal(part.support, whole.support[r::2]) and part.items == 2 * 3


def test_held_out_episodes_come_from_the_evaluation_scripts_whatever_the_limit(task):
    first = torch.cat([c.support for c in task.held_out("test", 60)])
    again = torch.cat([c.support for c in task.held_out("test", 7)])
    torch.testing.assert_close(again, first[:7], rtol=0, atol=0)
    classes = torch.cat([c.classes for c in task.held_out("test", 60)])
    assert set(classes.flatten().tolist()) <= set(task.inventory.evaluation)
    valid = torch.cat([c.classes for c in task.held_out("valid", 10)])
    assert set(valid.flatten().tolist()) <= set(task.inventory.background)


def test_held_out_episodes_are_drawn_once_and_handed_out_as_copies(monkeypatch):
    """Each evaluation redrew (and re-warped) every held-out episode; a task draws a chunk
    once, and each call gets its own copy: one changed in place leaves the next call's."""
    task = G.GlyphsTask(CONFIG, eval_config=EvalConfig())
    drawn = []
    real = G.episodes
    monkeypatch.setattr(G, "episodes", lambda *a, **k: drawn.append(1) or real(*a, **k))
    first = task.held_out("test", 60)
    expected = [c.support.clone() for c in first]
    for chunk in first:
        chunk.support.fill_(float("nan"))
    again = task.held_out("test", 60)
    assert len(drawn) == math.ceil(60 / G.EVAL_CHUNK)  # the second call drew nothing
    for got, want in zip(again, expected, strict=True):
        assert torch.equal(got.support, want)


class FirstLabel(torch.nn.Module):
    """Always predicts the label of the first support example; ignores the queries."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def forward(self, support, support_labels, query, return_weights=False):
        ways = CONFIG.ways
        logits = F.one_hot(support_labels[:, :1], ways).float() * 10 + self.weight  # (b, 1, N)
        log_probs = torch.log_softmax(logits.expand(-1, query.shape[1], -1), -1)
        return FewShotOutput(log_probs, [])


def test_evaluation_is_the_mean_over_episodes_with_a_95_percent_interval(task):
    metrics = task.evaluate(FirstLabel())
    hits = torch.cat(
        [
            (c.query_labels == c.support_labels[:, :1]).double().mean(-1)
            for c in task.held_out("test", 60)
        ]
    )
    assert metrics["n"] == 60 and metrics["queries_per_episode"] == 2
    assert metrics["accuracy"] == pytest.approx(100 * hits.mean().item())
    assert metrics["ci95"] == pytest.approx(100 * 1.96 * hits.std().item() / math.sqrt(60))
    assert metrics["classes_evaluation"] == len(task.inventory.evaluation)


def test_a_limit_past_the_held_out_set_scores_the_set(task):
    """eval.limit counts held-out episodes scored: past test_episodes it drew and scored more
    episodes than the set has (n = limit)."""
    over = G.GlyphsTask(CONFIG, seed=1, eval_config=EvalConfig(limit=CONFIG.test_episodes + 9))
    assert over.evaluate(FirstLabel()) == task.evaluate(FirstLabel())


def test_the_loss_never_reads_the_query_labels_as_input(task):
    seen = []

    class Spy(FirstLabel):
        def forward(self, *args, **kwargs):
            seen.append(args)
            return super().forward(*args, **kwargs)

    batch = task.batch(0, 3, "cpu")
    loss, count = task.loss(Spy(), batch)
    (args,) = seen
    assert not any(a is batch.query_labels for a in args) and len(args) == 4
    expected = (
        -F.log_softmax(F.one_hot(batch.support_labels[:, :1], 4).float() * 10, -1)
        .expand(-1, 3, -1)
        .gather(-1, batch.query_labels.unsqueeze(-1))
        .sum()
    )
    torch.testing.assert_close(loss, expected)
    assert count == 9  # the 3 episodes' 3 queries each: the support is not counted


def test_figures_and_explore(task, tmp_path):
    from attnzoo.models.snail import SNAIL, snail
    from attnzoo.viz.explore import validate

    model = SNAIL(snail(embed_dim=4, filters=4, keys=(4, 4), values=(4, 2)), (28, 28), 1, 4, 2)
    paths = task.figures(model.eval(), tmp_path, count=2)
    assert [p.name for p in paths] == ["episodes.png"] and paths[0].stat().st_size > 0
    data = task.explore(model, 2)
    validate(data)
    (kind, _) = data["examples"][0]["attention"]
    assert kind["rows"][-1] == "query" and len(kind["rows"]) == 4 * 2 + 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ways": 1}, "'ways'"),
        ({"shots": 0}, "'shots'"),
        ({"test_scripts": "Latin"}, "'test_scripts'"),
        ({"test_scripts": ()}, "'test_scripts' expected a non-empty tuple of script names"),
        ({"rotation": 200}, "'rotation'"),
        ({"min_distance": -1}, "'min_distance'"),
    ],
)
def test_bad_config_values_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        G.GlyphsConfig(**changes)


def test_an_unknown_test_script_is_named():
    with pytest.raises(ValueError, match="'test_scripts'.*Klingon"):
        G.GlyphsTask(G.GlyphsConfig(test_scripts=("Klingon",)), seed=0, eval_config=None)


def test_the_episode_figure_names_the_weights_columns():
    from attnzoo.viz import episode_figure

    support, labels = torch.rand(1, 3, 28, 28), torch.tensor([[2, 0, 1]])
    args = (support, labels, torch.rand(1, 28, 28), torch.tensor([1]), torch.tensor([1]))
    over_classes = episode_figure(*args, torch.rand(1, 3), "prototypes", ["c0", "c1", "c2"])
    over_positions = episode_figure(*args, torch.rand(1, 4), "attention")
    ticks = [
        [t.get_text() for t in fig.axes[-1].get_xticklabels()]
        for fig in (over_classes, over_positions)
    ]
    assert ticks == [["c0", "c1", "c2"], ["2", "0", "1", "q"]]


def test_every_tensor_of_a_batch_is_on_the_device_asked_for(task):
    """classes stayed on the CPU (Task protocol: a batch's tensors on `device`)."""
    batch = task.batch(0, 2, "meta")
    tensors = {k: v for k, v in batch._asdict().items() if isinstance(v, torch.Tensor)}
    assert "classes" in tensors
    assert {k: v.device.type for k, v in tensors.items()} == dict.fromkeys(tensors, "meta")
