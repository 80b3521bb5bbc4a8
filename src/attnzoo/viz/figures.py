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
