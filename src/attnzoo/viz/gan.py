"""GAN figures (Zhang et al. 2018): a grid of samples per class, the attention maps of a few
query pixels over generated images (the paper's Fig. 1), and per-step scalar curves such as
the attention blocks' gammas. Plain tensors in, a matplotlib Figure out (800 px wide at dpi
100); saving is the caller's business."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from attnzoo.viz.figures import LITERAL, _array, heatmap, note_nonfinite

QUERY_COLOURS = ("#e41a1c", "#377eb8", "#4daf4a", "#ff7f00", "#984ea3", "#a65628")


def sample_grid_figure(images, *, row_labels: Sequence[str] = ()) -> Figure:
    """images (classes, per_class, H, W) in [0, 1]: one row per class, 8 inches wide."""
    x = _array(images)
    if x.ndim != 4:
        raise ValueError(
            f"sample_grid_figure: argument 'images' expected (classes, per_class, H, W), "
            f"got {x.shape}"
        )
    rows, cols, height, width = x.shape
    labels = list(row_labels) or [str(r) for r in range(rows)]
    grid = np.ones((rows * (height + 2), cols * (width + 2)))
    for r in range(rows):
        for c in range(cols):
            top, left = r * (height + 2) + 1, c * (width + 2) + 1
            grid[top : top + height, left : left + width] = x[r, c]
    fig = Figure(figsize=(8, 8 * grid.shape[0] / grid.shape[1] + 0.4), dpi=100)
    ax = fig.add_subplot()
    ax.imshow(grid, cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks([r * (height + 2) + height / 2 for r in range(rows)], labels, **LITERAL)
    ax.set_xticks([])
    ax.set_ylabel("class")
    ax.set_title("generated samples, one row per class", fontsize=10)
    fig.tight_layout()
    return fig


def attention_map_figure(images, maps, queries, *, labels: Sequence[int] = ()) -> Figure:
    """Zhang 2018, Fig. 1: one row per generated image: the image with its query pixels
    marked, then each query's attention map (its weights over the positions of the map,
    upsampled to the image, brighter = more weight), the query marked in its colour.

    Args:
        images: (n, H, W) in [0, 1].
        maps: (n, queries, h, w) attention weights of each query over the h x w map.
        queries: (queries, 2) (row, col) of each query on the h x w map.
        labels: the class of each image (titles).
    """
    x, m, q = _array(images), _array(maps), _array(queries).astype(int)
    if m.ndim != 4 or m.shape[0] != x.shape[0] or q.shape != (m.shape[1], 2):
        raise ValueError(
            f"attention_map_figure: arguments 'maps' (n, queries, h, w) and 'queries' "
            f"(queries, 2) expected beside images {x.shape}, got {m.shape} and {q.shape}"
        )
    n, k, h, w = m.shape
    scale = x.shape[1] / h
    fig = Figure(figsize=(8, 8 / (k + 1) * n + 0.3), dpi=100)
    for row in range(n):
        ax = fig.add_subplot(n, k + 1, row * (k + 1) + 1)
        ax.imshow(x[row], cmap="gray", vmin=0, vmax=1)
        for j, (qr, qc) in enumerate(q):
            colour = QUERY_COLOURS[j % len(QUERY_COLOURS)]
            ax.plot((qc + 0.5) * scale - 0.5, (qr + 0.5) * scale - 0.5, "o", color=colour, ms=5)
        ax.set_xticks([])
        ax.set_yticks([])
        if row < len(labels):
            ax.set_title(f"class {labels[row]}", fontsize=8)
        for j, (qr, qc) in enumerate(q):
            ax = fig.add_subplot(n, k + 1, row * (k + 1) + 2 + j)
            ax.imshow(x[row], cmap="gray", vmin=0, vmax=1, extent=(-0.5, w - 0.5, h - 0.5, -0.5))
            finite = m[row, j][np.isfinite(m[row, j])]  # a NaN stays in its own cell
            # scaled to its peak, drawn from 0 to 1: a flat map is drawn flat (a scale from the
            # map's own minimum drew a 0.6 % difference as black against bright yellow)
            peak = max(float(finite.max(initial=0.0)), 1e-12)
            heatmap(ax, m[row, j] / peak, cmap="magma", alpha=0.65)
            ax.plot(qc, qr, "o", color=QUERY_COLOURS[j % len(QUERY_COLOURS)], ms=5, mec="white")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"query ({qr}, {qc})", fontsize=8)
    note_nonfinite(fig, m)
    fig.tight_layout()
    return fig


def scalars_figure(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    *,
    ylabel: str = "value",
    title: str = "",
    styles: Mapping[str, dict] | None = None,
) -> Figure:
    """Per-step scalars (name -> (steps, values), e.g. each attention block's gamma), one
    line each (`styles`: matplotlib line options per name), the legend below; 800 px wide."""
    fig = Figure(figsize=(8, 4.2), dpi=100)
    ax = fig.add_subplot()
    for name, (steps, values) in curves.items():
        ax.plot(steps, values, label=name, **{"lw": 1.2, **(styles or {}).get(name, {})})
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(xlabel="step", ylabel=ylabel)
    if title:
        ax.set_title(title, **LITERAL)
    ax.grid(alpha=0.3)
    if curves:
        ncol = min(len(curves), 3)
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol)
    fig.tight_layout()
    return fig
