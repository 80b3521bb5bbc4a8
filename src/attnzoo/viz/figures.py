"""Figures. Each function takes plain tensors/lists and returns a matplotlib Figure; saving is
the caller's business. Uses the non-interactive Agg canvas, so it works without a display."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from attnzoo.core.files import atomic_write

# Tokens and titles are drawn as the characters they are: a "$" would otherwise start TeX
# (matplotlib's mathtext), so "a$b$c" would lose its dollars and "$\frac$" would crash savefig.
LITERAL = {"parse_math": False, "usetex": False}


def fitted(title: str, inches: float, fontsize: float) -> str:
    """`title` wrapped into lines that fit `inches` at `fontsize` points (about 0.6 em a
    character): a long one (a kjv2web reference) was cut off at both edges of the page."""
    return textwrap.fill(title, max(10, int(inches * 72 / (0.6 * fontsize))))


def _label(token: str) -> str:
    return token if token.strip() else "␣"  # make a space token visible


# Every figure is at most PAGE_WIDTH inches wide at its own dpi DPI (save_figure's default):
# 800 px, a docs page's width, so no figure is shrunk to fit one, however long its sequence. A
# label is never set below MIN_FONT points: where tokens are too close for that, every k-th is
# labelled (`token_ticks`).
DPI = 100
PAGE_WIDTH = 8.0
MIN_FONT = 6.0
MAX_FONT = 10.0


def token_ticks(axis, labels: Sequence[str], spacing: float, *, rotation: float = 0) -> None:
    """Tick `axis` (an Axes' xaxis or yaxis) at its tokens, `spacing` inches apart, labelled
    at the size that fits (at most MAX_FONT), or at MIN_FONT with every k-th token labelled
    where even that does not fit (the first always)."""
    size = min(MAX_FONT, 0.8 * 72 * spacing)
    step = 1 if size >= MIN_FONT else math.ceil(MIN_FONT / max(size, 1e-9))
    at = list(range(0, len(labels), step))
    axis.set_ticks(at, [_label(labels[i]) for i in at], rotation=rotation, **LITERAL)
    axis.set_tick_params(labelsize=max(size, MIN_FONT))


# A non-finite value's colour in every map: in none of the colormaps used here (grey, red-blue,
# inferno, magma). matplotlib would leave such a cell blank, which reads as a value, not as a
# broken one (DESIGN.md: nothing silently wrong).
NONFINITE_COLOUR = "lime"


def heatmap(ax, data, *, cmap: str = "gray", vmin: float = 0.0, vmax: float = 1.0, **options):
    """`ax.imshow` of `data` in `cmap` from vmin to vmax, each NaN or inf cell in
    NONFINITE_COLOUR."""
    from matplotlib import colormaps

    colours = colormaps[cmap].with_extremes(bad=NONFINITE_COLOUR)
    return ax.imshow(np.ma.masked_invalid(data), cmap=colours, vmin=vmin, vmax=vmax, **options)


def note_nonfinite(fig: Figure, *arrays, what: str = "weight") -> None:
    """A line at the figure's foot counting the non-finite values of `arrays`, if any."""
    bad = sum(int(np.size(a) - np.isfinite(a).sum()) for a in arrays)
    if bad:
        text = f"{bad} non-finite {what}{'s' * (bad > 1)} (NaN or inf), drawn in bright green"
        fig.text(0.01, 0.005, text, color="green", fontsize=7, va="bottom")


def save_figure(fig: Figure, path: str | Path, dpi: float | None = None) -> Path:
    """`fig` as a PNG at `path` (at `dpi`, else the figure's own), written atomically
    (`attnzoo.core.files.atomic_write`): a full disk or a kill leaves the earlier figure, never
    a truncated one, and the error names the file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi="figure" if dpi is None else dpi)
    atomic_write(Path(path), buffer.getvalue())
    return Path(path)


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
    # a token's side: 0.32 inch, less for a source too long for the page (cells stay square)
    cell = min(0.32, (PAGE_WIDTH - 1.5) / max(1, len(source)))
    size = (max(3.0, cell * len(source) + 1.5), max(2.5, cell * len(target) + 1.2))
    fig = Figure(figsize=size, dpi=DPI)
    ax = fig.add_subplot()
    heatmap(ax, w, aspect="equal")
    token_ticks(ax.xaxis, source, cell, rotation=90)
    token_ticks(ax.yaxis, target, cell)
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(fitted(title, size[0] - 0.3, 9), fontsize=9, pad=28, **LITERAL)
    note_nonfinite(fig, w)
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
    shrink = min(1.0, (PAGE_WIDTH - 1.2) / (heads * panel_w))  # the heads side by side fit
    panel_w, panel_h = panel_w * shrink, panel_h * shrink
    fig = Figure(figsize=(heads * panel_w + 1.2, layers * panel_h + 1.2), dpi=DPI)
    grid = fig.subplots(layers, heads, squeeze=False)  # (layers, heads) of Axes
    for layer in range(layers):
        for head in range(heads):
            ax = grid[layer, head]
            heatmap(ax, w[layer, head], aspect="auto")
            # Token labels on the outer axes only: source along the bottom, target down the
            # left; heads named across the top, layers down the left.
            if layer == layers - 1:
                token_ticks(ax.xaxis, source, panel_w / key_len, rotation=90)
            else:
                ax.set_xticks([])
            if head == 0:
                token_ticks(ax.yaxis, target, panel_h / query_len)
                ax.set_ylabel(f"layer {layer + 1}", fontsize=7)
            else:
                ax.set_yticks([])
            ax.tick_params(length=0)
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=7)
    if title:
        fig.suptitle(fitted(title, fig.get_figwidth() - 0.3, 9), fontsize=9, **LITERAL)
    note_nonfinite(fig, w)
    fig.tight_layout()
    return fig


def loss_figure(steps: Sequence[int], losses: Sequence[float], *, title: str = "") -> Figure:
    """The logged training losses against their steps: on a log axis when every loss is
    positive, else a linear one (a log axis left out a REINFORCE surrogate's losses at or
    below 0 without a word). The loss is per item of what the task counts (a token, a
    sequence, an image, a pull), as metrics.jsonl logs it."""
    fig = Figure(figsize=(5, 3.2), dpi=DPI)
    ax = fig.add_subplot()
    ax.plot(steps, losses)
    if all(x > 0 for x in losses):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (per counted item)")
    if title:
        ax.set_title(fitted(title, fig.get_figwidth() - 0.4, 12), fontsize=12, **LITERAL)
    fig.tight_layout()
    return fig


# pointer_figure: the true output as a wide light band, the model's output on top as a thin
# dark line, so a correct output is visible inside its band rather than hiding it.
TRUTH_STYLE = dict(color="#9ecae1", linewidth=7, solid_capstyle="round", zorder=1, label="true")
OUTPUT_STYLE = dict(color="#b2182b", linewidth=1.4, zorder=2, label="output")


def pointer_figure(
    points,
    weights,
    output: Sequence[int],
    truth: Sequence[int] | None,
    labels: Sequence[str],
    *,
    closed: bool = True,
    title: str = "",
) -> Figure:
    """Vinyals 2015 Fig. 2 beside its attention: left, the pointer distribution of every
    output step over the input positions (grey level); right, the output drawn over the
    inputs: a closed tour or hull through planar points (`closed`), or, for 1-d inputs, the
    values in output order. The true output is a wide light band under the model's output,
    a thin dark line, so that both show where they coincide (a correct output is a dark
    line down the middle of the band) and where they part.

    Args:
        points: (n, dim) inputs, dim 1 or 2.
        weights: (steps, positions) pointer distributions; positions = len(labels).
        output, truth: input indices in output order (no end marker).
        labels: position labels, e.g. ["end", "0", "1", ...].
    """
    p = np.asarray(points.detach().cpu() if hasattr(points, "detach") else points, dtype=float)
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    if p.ndim != 2 or p.shape[1] not in (1, 2):
        raise ValueError(f"pointer_figure: argument 'points' expected (n, 1 or 2), got {p.shape}")
    if w.ndim != 2 or w.shape[1] != len(labels):
        raise ValueError(
            f"pointer_figure: argument 'weights' expected (steps, {len(labels)}), got {w.shape}"
        )
    fig = Figure(figsize=(PAGE_WIDTH, 3.6), dpi=DPI)
    ax = fig.add_subplot(1, 2, 1)
    heatmap(ax, w, aspect="auto")
    # the map's inches, about (half the page less its labels, the height less title and labels)
    token_ticks(ax.xaxis, labels, (PAGE_WIDTH / 2 - 0.9) / len(labels), rotation=90)
    steps = [str(s + 1) for s in range(w.shape[0])]
    token_ticks(ax.yaxis, steps, 2.4 / max(1, len(steps)))
    ax.set_xlabel("input position")
    ax.set_ylabel("output step")
    ax.set_title("pointer distribution per step", fontsize=9)
    ax = fig.add_subplot(1, 2, 2)
    if p.shape[1] == 2:

        def path(order):
            idx = [*order, order[0]] if closed and order else list(order)
            return p[idx, 0], p[idx, 1]

        ax.scatter(p[:, 0], p[:, 1], s=14, color="black", zorder=3)
        for i, (x, y) in enumerate(p):
            ax.annotate(str(i), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if truth:
            ax.plot(*path(list(truth)), **TRUTH_STYLE)
        if output:
            ax.plot(*path(list(output)), **OUTPUT_STYLE)
        ax.set_aspect("equal")
    else:
        if truth:
            ax.plot(p[list(truth), 0], **TRUTH_STYLE)
        ax.plot(p[list(output), 0], marker="o", markersize=3, **OUTPUT_STYLE)
        ax.set_xlabel("output step")
        ax.set_ylabel("value")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(fitted(title, PAGE_WIDTH / 2 - 0.5, 9), fontsize=9, **LITERAL)
    note_nonfinite(fig, w)
    fig.tight_layout()
    return fig


def _array(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().float() if hasattr(x, "detach") else x, dtype=float)


def _used_rows(*weights: np.ndarray, threshold: float = 0.01, margin: int = 2) -> np.ndarray:
    """The memory rows any weighting puts more than `threshold` on, with a margin, as one
    circular run (a head that moves backwards from row 0 wraps round to row N - 1): the
    indices of the shortest circular range that holds them, in order."""
    n = weights[0].shape[-1]
    used = np.max([w.max(axis=0) for w in weights], axis=0) > threshold  # (n,)
    if not used.any():
        return np.arange(n)
    # the longest circular run of unused rows is left out
    best_len, best_start, run = 0, 0, 0
    for k in range(2 * n):
        run = 0 if used[k % n] else run + 1
        if min(run, n) > best_len:
            best_len, best_start = min(run, n), k - run + 1
    keep = n - best_len + 2 * margin
    if keep >= n:
        return np.arange(n)
    first = best_start + best_len - margin  # just after the gap
    return (first + np.arange(keep)) % n


GLIMPSES_PER_LINE = 7  # glimpse_figure: beside the image; more wrap onto lines below
MAX_STEPS_PER_ROW = 50  # memory_figure: longer sequences wrap into stacked rows
STEP_INCHES = (PAGE_WIDTH - 2) / MAX_STEPS_PER_ROW  # memory_figure: a step's width, both panels


def memory_figure(
    inputs,
    targets,
    outputs,
    *,
    adds=None,
    reads=None,
    write_weights=None,
    read_weights=None,
    memory=None,
    mask=None,
    title: str = "",
) -> Figure:
    """Graves 2014 Fig. 6: one sequence of a memory model, time across every panel.

    Inputs beside outputs, targets beside the bit errors (output-phase bits thresholded at 0.5
    that differ from the target); then the write side left (add vectors, write weightings) and
    the read side right (read vectors, read weightings); the final memory below. The
    weightings and memory show only the rows the heads used, as one circular range (a head
    that moves back from row 0 wraps round to row N - 1). A sequence of more than
    `MAX_STEPS_PER_ROW` steps wraps: its time is cut into near-equal pieces, and the time
    panels are repeated for each piece, one under another, each titled with its steps; so
    the figure is never wider than a sequence of `MAX_STEPS_PER_ROW` steps makes it, and
    every step keeps one width.

    Args:
        inputs: (T, input_size); targets, outputs: (T, output_size), outputs as probabilities.
        adds, reads: (T, M) of one write / read head; write_weights, read_weights: (T, N).
        memory: (N, M) memory contents. Every argument after `outputs` may be None (an LSTM).
        mask: (T,) bool, the steps whose outputs are scored (bit errors count there only).
    """
    x, y, o = _array(inputs), _array(targets), _array(outputs)
    if not (x.shape[0] == y.shape[0] == o.shape[0]) or y.shape != o.shape:
        raise ValueError(
            f"memory_figure: arguments 'inputs', 'targets', 'outputs' expected shapes (T, .), "
            f"(T, C), (T, C), got {x.shape}, {y.shape}, {o.shape}"
        )
    # a non-finite output is an error whatever the target (NaN > 0.5 is False: it would pass
    # for a 0 bit)
    wrong = (((o > 0.5) != (y > 0.5)) | ~np.isfinite(o)).astype(float)  # (T, C)
    if mask is not None:
        wrong = wrong * _array(mask)[:, None]
    panels = [
        [("inputs", x, "channel"), ("outputs", o, "channel")],
        [("targets", y, "channel"), (f"bit errors ({int(wrong.sum())})", wrong, "channel")],
    ]
    if adds is not None and reads is not None:
        panels.append([("adds", _array(adds), "column"), ("reads", _array(reads), "column")])
    rows = None
    if write_weights is not None and read_weights is not None:
        ww, rw = _array(write_weights), _array(read_weights)
        rows = _used_rows(ww, rw)
        label = "location"
        panels.append(
            [("write weightings", ww[:, rows], label), ("read weightings", rw[:, rows], label)]
        )
    if memory is not None:
        m = _array(memory)
        m = m[rows] if rows is not None else m  # (locations, M)
        panels.append([("memory after the last step (location across)", m, "column")])
    steps = x.shape[0]
    # 1. Cut time into `chunks` near-equal pieces of at most MAX_STEPS_PER_ROW steps; each
    #    piece repeats the time panels one under another, so the width (and a step's width
    #    in pixels) stays that of a short sequence however long the sequence is.
    chunks = -(-steps // MAX_STEPS_PER_ROW)  # ceil
    width = -(-steps // chunks)  # steps per piece, ceil
    spans = [(k * width, min(steps, (k + 1) * width)) for k in range(chunks)]
    timed = [row for row in panels if not row[0][0].startswith("memory")]
    rows_out = [(row, span) for span in spans for row in timed]
    rows_out += [(row, None) for row in panels if row[0][0].startswith("memory")]
    size = (max(6.0, STEP_INCHES * width + 2), 1.5 * len(rows_out) + 0.6)
    fig = Figure(figsize=size, dpi=DPI)
    grid = fig.add_gridspec(len(rows_out), 2)
    for r, (row, span) in enumerate(rows_out):
        for col, (name, data, ylabel) in enumerate(row):
            ax = fig.add_subplot(grid[r, col] if len(row) == 2 else grid[r, :])
            # signed where values may be below 0: adds, reads, memory, and inputs that hold a
            # negative value (repeat copy's normalised count), which a 0-1 grey drew black
            finite_values = data[np.isfinite(data)]
            signed = name in ("adds", "reads") or name.startswith("memory")
            signed = signed or bool((finite_values < 0).any())
            finite = np.abs(finite_values)
            limit = max(1.0, float(finite.max(initial=0.0))) if signed else 1.0
            shown, extent = data, None
            if span is not None:
                # 2. time on the x axis in true steps: the piece starting at t0 reads t0...
                t0, t1 = span
                shown = data[t0:t1]
                extent = (t0 - 0.5, t1 - 0.5, data.shape[1] - 0.5, -0.5)
            heatmap(
                ax,
                shown.T,
                cmap="RdBu_r" if signed else "gray",
                vmin=-limit if signed else 0.0,
                vmax=limit,
                aspect="auto",
                interpolation="nearest",
                extent=extent,
            )
            if span is not None:  # a shorter last piece keeps the others' step width
                ax.set_xlim(span[0] - 0.5, span[0] + width - 0.5)
                ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # whole rows
            if chunks > 1 and span is not None:
                name = f"{name}, steps {span[0]}-{span[1] - 1}"
            ax.set_title(name, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=7)
            ax.set_xlabel("location" if span is None else "time", fontsize=7)
            ax.tick_params(labelsize=6)
            if rows is not None and ("weightings" in name or span is None):
                # label the true rows: ~8 across the memory panel, ~5 down a weighting panel
                per = 8 if span is None else 5
                at = np.arange(0, len(rows), max(1, -(-len(rows) // per)))
                axis = ax.set_xticks if span is None else ax.set_yticks
                axis(at, [str(k) for k in rows[at]])
    if title:  # 0.1 inch from the top whatever the figure's height (tight_layout makes room)
        text = fitted(title, fig.get_figwidth() - 0.3, 9)
        fig.suptitle(text, fontsize=9, y=1.0 - 0.1 / fig.get_figheight(), va="top", **LITERAL)
    note_nonfinite(fig, *(data for row in panels for _, data, _ in row), what="value")
    fig.tight_layout()
    return fig


def glimpse_figure(
    images,
    paths,
    retinas,
    *,
    patch: int,
    titles: Sequence[str] = (),
) -> Figure:
    """Mnih 2014 Fig. 3: one row per image; first the image with the glimpse path (a line
    through the glimpse centres, start marked, the retina's squares at every glimpse), then
    each glimpse as the model saw it: the retina's k patches, each at its own resolution,
    the finer ones inside the coarser (the largest drawn at its size).

    Args:
        images: (n, height, width).
        paths: (n, glimpses, 2) locations (x, y) in [-1, 1] across the image.
        retinas: (n, glimpses, scales, patch, patch) what the sensor returned.
        patch: g, the side of the smallest patch.
        titles: one per row (e.g. true and predicted class).
    """
    x, loc, ret = _array(images), _array(paths), _array(retinas)
    if x.ndim != 3 or loc.shape != (x.shape[0], loc.shape[1], 2):
        raise ValueError(
            f"glimpse_figure: argument 'paths' expected ({x.shape[0]}, glimpses, 2) beside "
            f"images (n, height, width), got {loc.shape} and {x.shape}"
        )
    if ret.shape[:2] != loc.shape[:2] or ret.shape[-2:] != (patch, patch):
        raise ValueError(
            f"glimpse_figure: argument 'retinas' expected ({loc.shape[0]}, {loc.shape[1]}, "
            f"scales, {patch}, {patch}), got {ret.shape}"
        )
    n, glimpses, scales = ret.shape[:3]
    height, width = x.shape[1:]
    # a line holds the image and up to GLIMPSES_PER_LINE glimpses; more go on lines below
    per_line = max(1, min(glimpses, GLIMPSES_PER_LINE))
    lines = -(-glimpses // per_line)
    panel = min(1.6, PAGE_WIDTH / (per_line + 1))  # a panel's side, inches: a line fits the page
    wrap = max(10, int(panel * 72 / (0.6 * 7)))  # characters of a 7-point title across a panel
    title_lines = max([len(textwrap.wrap(t, wrap)) for t in titles[:n]], default=1)
    row_height = panel * 1.125 * lines + 0.12 * (title_lines - 1)  # inches
    fig = Figure(figsize=(panel * (per_line + 1), row_height * n + 0.1), dpi=DPI)
    grid = fig.add_gridspec(n * lines, per_line + 1)
    # each patch's top-left pixel (row, column), as the sensor places it
    # (attnzoo.models.ram.patch_corners): the centre rounded to the pixel grid
    sides = patch * 2 ** np.arange(scales)  # (scales,)
    centres = np.stack([(loc[..., 1] + 1) * height / 2, (loc[..., 0] + 1) * width / 2], -1)
    corners = np.floor(centres[..., None, :] - sides[:, None] / 2 + 0.5)  # (n, glimpses, k, 2)
    for row in range(n):
        ax = fig.add_subplot(grid[row * lines, 0])
        ax.imshow(x[row], cmap="gray", vmin=0, vmax=1)
        # pixel centres are at integers in imshow's coordinates; the sensor rounds the centre
        # to the pixel grid (attnzoo.models.ram.patch_corners) and so do the squares here
        cy, cx = centres[row].T  # (glimpses,) each
        ax.plot(cx - 0.5, cy - 0.5, color="lime", lw=1.2, marker="o", ms=2.5)
        ax.plot(cx[0] - 0.5, cy[0] - 0.5, color="lime", marker="s", ms=4)
        for t in range(glimpses):
            for s, (top, left) in enumerate(corners[row, t] - 0.5):
                side = patch * 2**s
                square = [left, left + side, left + side, left, left]
                ax.plot(square, [top, top, top + side, top + side, top], color="red", lw=0.6)
        ax.set_xlim(-0.5, width - 0.5)
        ax.set_ylim(height - 0.5, -0.5)
        ax.set_xticks([])
        ax.set_yticks([])
        if row < len(titles):
            ax.set_title(textwrap.fill(titles[row], wrap), fontsize=7, **LITERAL)
        for t in range(glimpses):
            ax = fig.add_subplot(grid[row * lines + t // per_line, 1 + t % per_line])
            offsets = (corners[row, t] - corners[row, t, -1]).astype(int)  # in the largest
            ax.imshow(_retina(ret[row, t], offsets), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"glimpse {t + 1}", fontsize=7)
    fig.tight_layout()
    return fig


def _retina(patches: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(scales, g, g) -> one picture at the largest patch's size: each patch scaled back up
    to its side, the finer pasted over the coarser at `offsets` (scales, 2): each patch's
    top-left pixel (row, column) from the largest's, where the sensor read it. Not always the
    centre: with an odd g the smallest patch's side is odd, and its corner depends on where the
    location falls in its pixel."""
    scales = patches.shape[0]
    out = np.kron(patches[-1], np.ones((2 ** (scales - 1),) * 2))
    for s in range(scales - 2, -1, -1):
        up = np.kron(patches[s], np.ones((2**s,) * 2))
        r, c = offsets[s]
        out[r : r + up.shape[0], c : c + up.shape[1]] = up
    return out


def episode_figure(
    support,
    support_labels,
    query,
    query_labels,
    predicted,
    weights=None,
    weights_name: str = "",
    weights_columns: Sequence[str] = (),
) -> Figure:
    """Few-shot episodes, one per row: the support images with their labels, the query with its
    true and predicted label, and (`weights`) the query's attention over the columns.

    support (rows, n, H, W), support_labels (rows, n), query (rows, H, W), query_labels and
    predicted (rows,), weights (rows, columns) with the columns' names `weights_columns` (one
    list for every row, e.g. the classes) or, when empty, each row's support labels and "q"
    (the sequence's positions, the query last)."""
    support, query = _array(support), _array(query)
    labels, truth, guess = (
        np.asarray(x).astype(int) for x in (support_labels, query_labels, predicted)
    )
    rows, n = support.shape[:2]
    extra = 1 if weights is not None else 0
    fig = Figure(figsize=(PAGE_WIDTH, 1.3 * rows * (1 + 0.8 * extra) + 0.4), dpi=DPI)
    grid = fig.add_gridspec(rows * (1 + extra), n + 1, height_ratios=[1, 0.8][: 1 + extra] * rows)
    for r in range(rows):
        top = r * (1 + extra)
        for j in range(n + 1):
            ax = fig.add_subplot(grid[top, j])
            ax.imshow(support[r, j] if j < n else query[r], cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if j < n:
                ax.set_title(f"label {labels[r, j]}", fontsize=8)
            else:
                mark = "right" if truth[r] == guess[r] else "WRONG"
                ax.set_title(f"query: {truth[r]}\npredicted {guess[r]} ({mark})", fontsize=8)
                for side in ax.spines.values():
                    side.set_color("tab:red")
        if extra:
            w = _array(weights)[r]
            ax = fig.add_subplot(grid[top + 1, :])
            ax.bar(np.arange(len(w)), w, color="tab:blue")
            names = list(weights_columns) or [f"{y}" for y in labels[r]] + ["q"]
            ax.set_xticks(np.arange(len(w)), names, fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_ylabel("weight", fontsize=7)
            ax.set_title(f"query's weights: {weights_name}", fontsize=8)
    fig.tight_layout()
    return fig


def intra_attention_figure(words: Sequence[str], weights, *, title: str = "") -> Figure:
    """Cheng et al. 2016 Fig. 1: one line per word of a sentence, the words up to it written
    out, the current word in red and each earlier word shaded by the weight the current step
    gave it, relative to the line's largest, the current word's own included (darker blue:
    more). A line whose words hold under 95 % of its weight (the rest on a state that is
    no word, e.g. the LSTMN's start state) says how much they hold at its right, and one whose
    current word holds some (framed in red) says how much: relative shading alone drew 5 %
    spread over the words, or 2 % on each earlier word beside 94 % on the current one, as
    dark as 100 %. 10 inches wide at its dpi of
    80: 800 px (its layout is in points).

    Args:
        words: the sentence, (t,).
        weights: (t, t) array-like; row i holds the weight of each earlier word k < i (a
            weight at k >= i, e.g. a model that attends to the current word too, is drawn on
            the current word's frame).
    """
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    t = len(words)
    if w.shape != (t, t):
        raise ValueError(
            f"intra_attention_figure: argument 'weights' expected shape ({t}, {t}), got {w.shape}"
        )
    from matplotlib import colormaps

    cmap = colormaps["Blues"]
    width_pt, char_pt, line_pt, size = 720.0, 6.0, 15.0, 10
    fig = Figure(figsize=(10, max(1.5, (t * line_pt + 30) / 72)), dpi=80)
    ax = fig.add_axes((0, 0, 1, 1))
    height = t * line_pt + (24 if title else 6)
    ax.set_xlim(0, width_pt)
    ax.set_ylim(height, 0)
    ax.axis("off")
    top = 20 if title else 4
    if title:
        ax.text(6, 12, title, fontsize=size, va="center", **LITERAL)
    for i in range(t):
        y = top + (i + 0.5) * line_pt
        held = float(np.nan_to_num(w[i, : i + 1]).sum())
        room = width_pt - 12
        notes = [f"{held:.0%} on words"] if held < 0.95 else []
        if w[i, i] > 0.02:  # (framed in red below)
            notes.append(f"{w[i, i]:.0%} on itself")
        if notes:
            note = ", ".join(notes)
            ax.text(width_pt - 6, y, note, fontsize=8, va="center", ha="right", **LITERAL)
            room -= 7 * len(note)
        shown = list(range(i + 1))
        while sum(len(words[k]) + 1 for k in shown) * char_pt > room and len(shown) > 1:
            shown.pop(0)  # a long sentence: its earliest words scroll off to the left
        x = 6.0
        top_weight = max(np.nan_to_num(w[i, : i + 1]).max(initial=0.0), 1e-12)
        for k in shown:
            weight = w[i, k] / top_weight if k < i else 0.0
            face = cmap(0.15 + 0.85 * min(1.0, weight)) if weight > 0.02 else "none"
            color = "#c00000" if k == i else ("white" if weight > 0.6 else "black")
            edge = "#c00000" if k == i and w[i, i] > 0.02 else "none"
            ax.text(
                x,
                y,
                _label(words[k]),
                fontsize=size,
                family="monospace",
                va="center",
                color=color,
                fontweight="bold" if k == i else "normal",
                bbox=dict(facecolor=face, edgecolor=edge, pad=1.5, linewidth=1.2),
                **LITERAL,
            )
            x += (len(words[k]) + 1) * char_pt
    return fig
