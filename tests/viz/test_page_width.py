"""Every figure the package draws fits a docs page: at most 800 px wide as `save_figure` writes
it (at the figure's own dpi), however long its sequence or however many its glimpses, heads
or words, and its token labels stay at a readable size without running into each other."""

import inspect
import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from attnzoo.viz import captions, figures, gan
from attnzoo.viz.figures import MIN_FONT, save_figure

PAGE_PX = 800


def _words(n: int, stem: str = "w") -> list[str]:
    return [f"{stem}{k}" for k in range(n)]


def _weights(rows: int, cols: int) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)), -1)


def _memory(length: int) -> dict:
    steps, g = 2 * length + 1, torch.Generator().manual_seed(0)
    bits = torch.rand(steps, 9, generator=g)
    return dict(
        inputs=bits,
        targets=bits[:, :8],
        outputs=bits[:, :8],
        adds=torch.randn(steps, 20, generator=g),
        reads=torch.randn(steps, 20, generator=g),
        write_weights=_weights(steps, 128),
        read_weights=_weights(steps, 128),
        memory=torch.randn(128, 20, generator=g),
    )


def _glimpses(n: int, glimpses: int) -> dict:
    return dict(
        images=torch.rand(n, 60, 60),
        paths=torch.rand(n, glimpses, 2) * 2 - 1,
        retinas=torch.rand(n, glimpses, 3, 12, 12),
        patch=12,
        titles=[f"true [3, 7, 1], predicted [3, 7, 1], row {r}" for r in range(n)],
    )


# function name -> a figure of it at sizes past what a short example draws
LONG = {
    "alignment_figure": lambda: figures.alignment_figure(
        _weights(90, 143), _words(143), _words(90, "t"), title="long"
    ),
    "head_grid_figure": lambda: figures.head_grid_figure(
        _weights(6 * 8 * 60, 61).view(6, 8, 60, 61), _words(61), _words(60, "t")
    ),
    "pointer_figure": lambda: figures.pointer_figure(
        torch.rand(100, 2),
        _weights(101, 101),
        list(range(100)),
        list(range(100)),
        ["end", *map(str, range(100))],
    ),
    "memory_figure": lambda: figures.memory_figure(**_memory(120), title="copy"),
    "glimpse_figure": lambda: figures.glimpse_figure(**_glimpses(3, 17)),
    "episode_figure": lambda: figures.episode_figure(
        torch.rand(2, 20, 28, 28),
        torch.arange(20).repeat(2, 1),
        torch.rand(2, 28, 28),
        [3, 4],
        [3, 5],
        _weights(2, 21),
        "attention",
    ),
    "intra_attention_figure": lambda: figures.intra_attention_figure(
        _words(60), torch.tril(_weights(60, 60), -1)
    ),
    "loss_figure": lambda: figures.loss_figure(list(range(1000)), list(np.linspace(5, 1, 1000))),
    "sample_grid_figure": lambda: gan.sample_grid_figure(torch.rand(10, 8, 32, 32)),
    "attention_map_figure": lambda: gan.attention_map_figure(
        torch.rand(6, 32, 32), _weights(6 * 5, 64).view(6, 5, 8, 8), torch.randint(0, 8, (5, 2))
    ),
    "scalars_figure": lambda: gan.scalars_figure(
        {f"gamma {k}": (list(range(500)), list(np.linspace(0, k, 500))) for k in range(6)}
    ),
    "caption_attention_figure": lambda: captions.caption_attention_figure(
        [(torch.rand(64, 64), _words(20), _weights(20, 64), (8, 8), f"row {r}") for r in range(3)]
    ),
}


def test_every_figure_function_has_a_long_case():
    """The cases above are the package's own list of figure functions, not a hand-kept copy."""
    found = {
        name
        for module in (figures, gan, captions)
        for name, f in inspect.getmembers(module, inspect.isfunction)
        if name.endswith("_figure") and f.__module__ == module.__name__
    } - {"save_figure"}  # the one that writes them
    assert found == set(LONG)


@pytest.mark.parametrize("name", sorted(LONG))
def test_a_long_figure_is_at_most_a_page_wide(name, tmp_path):
    path = save_figure(LONG[name](), tmp_path / f"{name}.png")
    assert Image.open(path).width <= PAGE_PX


def _labels(axis) -> list:
    return [t for t in axis.get_ticklabels() if t.get_text() and t.get_visible()]


@pytest.mark.parametrize("name", ["alignment_figure", "head_grid_figure", "pointer_figure"])
def test_token_labels_are_readable_and_apart(name):
    """Labels at MIN_FONT points or more; where a long sequence packs its tokens too close for
    that, every k-th is labelled, and no two labels of an axis overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = LONG[name]()
    FigureCanvasAgg(fig).draw()
    checked = 0
    for ax in fig.axes:
        for axis, lo, hi in ((ax.xaxis, "x0", "x1"), (ax.yaxis, "y0", "y1")):
            labels = _labels(axis)
            if len(labels) < 2:
                continue
            checked += 1
            assert min(t.get_fontsize() for t in labels) >= MIN_FONT
            boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: getattr(b, lo))
            for a, b in itertools.pairwise(boxes):
                assert getattr(a, hi) <= getattr(b, lo) + 0.5, (name, axis.axis_name)
    assert checked >= 2


def test_a_short_alignment_keeps_every_token_label_at_full_size():
    """The page limit shrinks only what is too long for it: a dates-sized example keeps its
    0.32-inch cells and labels every token."""
    fig = figures.alignment_figure(_weights(10, 20), _words(20), _words(10, "t"))
    ax = fig.axes[0]
    assert len(_labels(ax.xaxis)) == 20 and len(_labels(ax.yaxis)) == 10
    assert min(t.get_fontsize() for t in _labels(ax.xaxis)) == figures.MAX_FONT


TITLED = {
    "alignment_figure": lambda title: figures.alignment_figure(
        _weights(30, 31), _words(31), _words(30, "t"), title=title
    ),
    "head_grid_figure": lambda title: figures.head_grid_figure(
        _weights(2 * 4 * 9, 9).view(2, 4, 9, 9), _words(9), _words(9, "t"), title=title
    ),
    "pointer_figure": lambda title: figures.pointer_figure(
        torch.rand(10, 2),
        _weights(11, 11),
        list(range(10)),
        list(range(10)),
        ["end", *map(str, range(10))],
        title=title,
    ),
    "memory_figure": lambda title: figures.memory_figure(**_memory(10), title=title),
    "loss_figure": lambda title: figures.loss_figure([1, 2, 3], [3.0, 2.0, 1.0], title=title),
}


@pytest.mark.parametrize("name", sorted(TITLED))
def test_a_long_title_wraps_inside_the_figure(name):
    """A kjv2web reference as an alignment figure's title ran past both edges of the page:
    a title wraps to the figure's width, every line of it inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    fig = TITLED[name](" ".join(["the waters which were above the firmament"] * 8))
    FigureCanvasAgg(fig).draw()
    titles = [t for t in fig.findobj(Text) if "waters" in t.get_text()]
    assert len(titles) == 1
    box = titles[0].get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, box
