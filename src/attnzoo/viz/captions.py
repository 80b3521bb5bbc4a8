"""Caption attention figures (Xu et al. 2015, Fig. 2 and 3): an image, then one panel per word
with that word's attention over the feature map upsampled to the image and overlaid."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def upsample(weights: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Attention over the cells (steps, L) -> (steps, H, W), each cell's weight spread over its
    pixels (nearest; the share of the step's attention per pixel, scaled to its maximum for
    display by the caller)."""
    maps = weights.float().view(-1, 1, *grid)  # (steps, 1, h, w)
    return F.interpolate(maps, size=size, mode="nearest")[:, 0]  # (steps, H, W)


def caption_attention_figure(
    rows: Sequence[tuple[torch.Tensor, Sequence[str], torch.Tensor, tuple[int, int], str]],
    *,
    max_words: int = 12,
):
    """One figure row per (image (H, W), words, weights (steps, L), grid, label): the image,
    then each word's attention overlaid (bright = attended; a hard-attention row shows the
    sampled cell). Rows of several models over the same image (soft above hard) compare them.
    At most `max_words` words per line: a longer caption goes on in further lines of its row
    (a four-digit caption has up to 17 words; the words past the 12th were not drawn). 800 px
    wide at dpi 100."""
    from matplotlib.figure import Figure

    from attnzoo.viz.figures import _array, heatmap, note_nonfinite

    longest = max(min(len(words), len(weights)) for _, words, weights, _, _ in rows)
    per_line = max(1, min(max_words, longest))
    lines = -(-longest // per_line)  # each row's lines, the longest caption's (ceil)
    columns = 1 + per_line
    width = 8.0
    cell = width / columns
    fig = Figure(figsize=(width, cell * len(rows) * lines * 1.25 + 0.2), dpi=100)
    axes = fig.subplots(len(rows) * lines, columns, squeeze=False)
    for r, (image, words, weights, grid, label) in enumerate(rows):
        image = image.float().cpu()
        maps = upsample(weights.cpu(), grid, tuple(image.shape))
        # scaled to each step's largest finite weight: a NaN or inf stays in its own cells
        peak = maps.nan_to_num(0.0, 0.0, 0.0).flatten(1).amax(1).clamp_min(1e-12)
        maps = (maps / peak[:, None, None]).numpy()
        image = image.numpy()
        first = axes[r * lines, 0]
        first.imshow(image, cmap="gray", vmin=0, vmax=1)
        first.set_title(label or "image", fontsize=7, loc="left")
        for k in range(min(len(words), len(maps))):
            ax = axes[r * lines + k // per_line, 1 + k % per_line]
            ax.imshow(image, cmap="gray", vmin=0, vmax=1)
            heatmap(ax, maps[k], cmap="inferno", alpha=0.55)
            ax.set_title(words[k], fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        if not ax.images:
            ax.axis("off")
    note_nonfinite(fig, *(_array(w) for _, _, w, _, _ in rows))
    fig.tight_layout(pad=0.3)
    return fig
