"""attnzoo.viz: pure functions from weights and labels to matplotlib figures."""

from attnzoo.viz.figures import (
    alignment_figure,
    episode_figure,
    glimpse_figure,
    head_grid_figure,
    intra_attention_figure,
    loss_figure,
    memory_figure,
    pointer_figure,
    save_figure,
)

__all__ = [
    "alignment_figure",
    "episode_figure",
    "glimpse_figure",
    "head_grid_figure",
    "intra_attention_figure",
    "loss_figure",
    "memory_figure",
    "pointer_figure",
    "save_figure",
]
