"""Figures. Each function takes plain tensors/lists and returns a matplotlib Figure; saving is
the caller's business. Uses the non-interactive Agg canvas, so it works without a display."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure


def _label(token: str) -> str:
    return token if token.strip() else "␣"  # make a space token visible


def alignment_figure(
    weights, source: Sequence[str], target: Sequence[str], *, title: str = ""
) -> Figure:
    """Bahdanau 2015 Fig. 3: source tokens across, output tokens down, weight as grey level.

    Args:
        weights: (target_len, source_len) array-like, rows = output tokens.
        source, target: labels; lengths must match the weights' shape.
    """
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    if w.shape != (len(target), len(source)):
        raise ValueError(
            f"alignment_figure: argument 'weights' expected shape "
            f"({len(target)}, {len(source)}), got {w.shape}"
        )
    cell = 0.32
    fig = Figure(figsize=(max(3.0, cell * len(source) + 1.5), max(2.5, cell * len(target) + 1.2)))
    ax = fig.add_subplot()
    ax.imshow(w, cmap="gray", vmin=0.0, vmax=1.0, aspect="equal")
    ax.set_xticks(range(len(source)), [_label(s) for s in source], rotation=90)
    ax.set_yticks(range(len(target)), [_label(t) for t in target])
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title, fontsize=9, pad=28)
    fig.tight_layout()
    return fig


def head_grid_figure(
    weights, source: Sequence[str], target: Sequence[str], *, title: str = ""
) -> Figure:
    """Every head of every layer as its own small heatmap, the per-head view of Vaswani 2017
    (Figs. 3-5): one row per layer, one column per head, weight as grey level.

    Args:
        weights: (layers, heads, query_len, key_len) array-like; each map's rows are queries.
        source: key labels, (key_len,), shown along the bottom row.
        target: query labels, (query_len,), shown down the left column.
    """
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    if w.ndim != 4:
        raise ValueError(
            f"head_grid_figure: argument 'weights' expected a 4-d array "
            f"(layers, heads, query_len, key_len), got shape {w.shape}"
        )
    layers, heads, query_len, key_len = w.shape
    if (query_len, key_len) != (len(target), len(source)):
        raise ValueError(
            f"head_grid_figure: argument 'weights' expected maps of shape "
            f"({len(target)}, {len(source)}), got {(query_len, key_len)}"
        )
    cell = 0.12  # inches per token, smaller than alignment_figure's: many maps share the page
    panel_w, panel_h = max(1.2, cell * key_len), max(1.2, cell * query_len)
    fig = Figure(figsize=(heads * panel_w + 1.2, layers * panel_h + 1.2))
    grid = fig.subplots(layers, heads, squeeze=False)  # (layers, heads) of Axes
    for layer in range(layers):
        for head in range(heads):
            ax = grid[layer, head]
            ax.imshow(w[layer, head], cmap="gray", vmin=0.0, vmax=1.0, aspect="auto")
            # Token labels on the outer axes only: source along the bottom, target down the
            # left; heads named across the top, layers down the left.
            if layer == layers - 1:
                ax.set_xticks(range(key_len), [_label(s) for s in source], rotation=90)
            else:
                ax.set_xticks([])
            if head == 0:
                ax.set_yticks(range(query_len), [_label(t) for t in target])
                ax.set_ylabel(f"layer {layer + 1}", fontsize=7)
            else:
                ax.set_yticks([])
            ax.tick_params(labelsize=5, length=0)
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def loss_figure(steps: Sequence[int], losses: Sequence[float], *, title: str = "") -> Figure:
    fig = Figure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    ax.plot(steps, losses)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (per token)")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
