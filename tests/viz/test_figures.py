import io
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from attnzoo.viz import alignment_figure, head_grid_figure, loss_figure, pointer_figure


def test_alignment_figure_has_labelled_axes(tmp_path):
    w = torch.softmax(torch.randn(3, 4), -1)
    fig = alignment_figure(w, ["a", "b", " ", "d"], ["x", "y", "z"], title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "␣", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "z"]
    assert ax.images[0].get_array().shape == (3, 4)
    fig.savefig(tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_alignment_figure_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="'weights'.*\\(2, 4\\)"):
        alignment_figure(torch.zeros(3, 4), ["a"] * 4, ["x", "y"])


def test_loss_figure():
    fig = loss_figure([1, 2, 3], [3.0, 2.0, 1.0])
    assert len(fig.axes[0].lines) == 1 and fig.axes[0].get_yscale() == "log"


def test_a_loss_at_or_below_zero_is_drawn_on_a_linear_axis():
    """A REINFORCE surrogate's loss is often negative: a log axis left those points out
    without a word (20 of 30 in a TSP run)."""
    losses = [2.0, -1.5, 0.0, 0.5]
    fig = loss_figure([0, 1, 2, 3], losses)
    ax = fig.axes[0]
    fig.canvas.draw()  # (matplotlib masks non-positive values when a log axis draws them)
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "linear" and low <= min(losses) and high >= max(losses)


def test_head_grid_figure_one_map_per_layer_and_head(tmp_path):
    w = torch.softmax(torch.randn(2, 3, 4, 5), -1)  # (layers, heads, query_len, key_len)
    source, target = ["a", "b", " ", "d", "e"], ["w", "x", "y", "z"]
    fig = head_grid_figure(w, source, target, title="heads")
    assert len(fig.axes) == 2 * 3
    for k, ax in enumerate(fig.axes):  # row-major: axes[k] is layer k // 3, head k % 3
        layer, head = divmod(k, 3)
        image = ax.images[0].get_array()
        assert image.shape == (4, 5)
        assert torch.allclose(torch.as_tensor(image), w[layer, head].double())
        xlabels = [t.get_text() for t in ax.get_xticklabels()]
        ylabels = [t.get_text() for t in ax.get_yticklabels()]
        assert xlabels == (["a", "b", "␣", "d", "e"] if layer == 1 else [])
        assert ylabels == (target if head == 0 else [])
        assert ax.get_title() == (f"head {head + 1}" if layer == 0 else "")
        assert ax.get_ylabel() == (f"layer {layer + 1}" if head == 0 else "")
    assert fig._suptitle.get_text() == "heads"
    fig.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_head_grid_figure_single_map_and_no_title():
    fig = head_grid_figure([[[[1.0, 0.0], [0.5, 0.5]]]], ["p", "q"], ["r", "s"])
    assert len(fig.axes) == 1 and fig._suptitle is None
    assert fig.axes[0].images[0].get_array().shape == (2, 2)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (1, 2, 2, 3, 4)])
def test_head_grid_figure_rejects_wrong_rank(shape):
    with pytest.raises(ValueError, match=r"'weights'.*4-d.*\(layers, heads, query_len, key_len\)"):
        head_grid_figure(torch.zeros(shape), ["a"] * 4, ["x"] * 3)


def test_head_grid_figure_rejects_mismatched_labels():
    with pytest.raises(ValueError, match=r"'weights'.*\(2, 4\), got \(3, 4\)"):
        head_grid_figure(torch.zeros(1, 2, 3, 4), ["a"] * 4, ["x", "y"])


def _token_axes(kind: str):
    """(Axes, x labels, y labels) of the token map of each figure that labels its cells."""
    source, target = ["a", "b", "c", "d", "e"], ["x", "y", "z"]
    if kind == "alignment":
        return alignment_figure(torch.rand(3, 5), source, target).axes[0], source, target
    if kind == "head_grid":  # the bottom-left map: the only one labelled on both axes
        fig = head_grid_figure(torch.rand(2, 2, 3, 5), source, target)
        return fig.axes[2], source, target
    fig = pointer_figure(torch.rand(4, 2), torch.rand(3, 5), [0, 1], None, source)
    return fig.axes[0], source, ["1", "2", "3"]  # output steps numbered from 1


@pytest.mark.parametrize("kind", ["alignment", "head_grid", "pointer"])
def test_token_ticks_sit_on_their_own_cells(kind):
    """The label of token i is at the centre of the map's cell i (imshow puts cell i's centre
    at i): labels shifted one cell along read the right texts against the wrong cells."""
    ax, xlabels, ylabels = _token_axes(kind)
    rows, cols = len(ylabels), len(xlabels)
    assert ax.images[0].get_extent() == [-0.5, cols - 0.5, rows - 0.5, -0.5]
    assert ax.get_xticks().tolist() == list(range(cols))
    assert ax.get_yticks().tolist() == list(range(rows))
    assert [t.get_text() for t in ax.get_xticklabels()] == xlabels
    assert [t.get_text() for t in ax.get_yticklabels()] == ylabels


DOLLARS = ["$", "$\\frac$", "a$b$c"]


def _literal(texts) -> None:
    for t in texts:
        assert t.get_parse_math() is False and t.get_usetex() is False, t.get_text()


def test_tokens_with_dollars_are_drawn_literally(tmp_path):
    """A "$" in a token is a character, not TeX: "$\\frac$" would crash savefig as mathtext."""
    w = torch.softmax(torch.randn(3, 3), -1)
    fig = alignment_figure(w, DOLLARS, DOLLARS[::-1], title="out: $x$")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == DOLLARS
    assert [t.get_text() for t in ax.get_yticklabels()] == DOLLARS[::-1]
    _literal([*ax.get_xticklabels(), *ax.get_yticklabels(), ax.title])
    fig.savefig(tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 1000
    # after drawing, the labels are still the tokens, still literal
    assert [t.get_text() for t in ax.get_xticklabels()] == DOLLARS
    _literal(ax.get_xticklabels())


def test_head_grid_and_pointer_figures_draw_dollars_literally(tmp_path):
    from attnzoo.viz import pointer_figure

    w = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    fig = head_grid_figure(w, DOLLARS, DOLLARS, title="$\\frac$")
    bottom_left = fig.axes[0]  # layer 1 (the only, so the last), head 1
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == DOLLARS
    assert [t.get_text() for t in bottom_left.get_yticklabels()] == DOLLARS
    _literal([*bottom_left.get_xticklabels(), *bottom_left.get_yticklabels(), fig._suptitle])
    fig.savefig(tmp_path / "h.png")
    points = torch.rand(3, 2)
    fig = pointer_figure(points, torch.rand(2, 3), [0, 1], None, DOLLARS, title="$\\frac$")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == DOLLARS
    fig.savefig(tmp_path / "p.png")
    fig = loss_figure([1, 2], [2.0, 1.0], title="$\\frac$")
    fig.savefig(tmp_path / "l.png")


@pytest.mark.parametrize("closed, dim", [(True, 2), (False, 1)])
def test_pointer_figure_shows_a_correct_output_inside_the_true_band(closed, dim):
    """Where output and truth coincide, the truth is a wider line drawn under the output's
    thinner one in another colour, so both stay visible; the legend names both."""
    from attnzoo.viz import pointer_figure

    order = [0, 2, 1, 3]
    fig = pointer_figure(
        torch.rand(4, dim), torch.rand(4, 4), order, order, list("abcd"), closed=closed
    )
    ax = fig.axes[1]
    lines = {line.get_label(): line for line in ax.lines}
    true, output = lines["true"], lines["output"]
    assert (true.get_xydata() == output.get_xydata()).all()  # the same path...
    assert true.get_linewidth() >= 3 * output.get_linewidth()  # ...in a band round the line
    assert true.get_zorder() < output.get_zorder()
    assert true.get_color() != output.get_color()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["true", "output"]


@pytest.mark.parametrize("closed", [True, False], ids=["tour", "open"])
def test_pointer_figure_draws_the_output_and_the_truth_through_their_own_points(closed):
    """Each path goes through the points in its own order, back to its first point for a
    closed tour (and only then); output and truth differ here, so neither stands in for the
    other. Every vertex is one of the scattered points, (x, y) = (points[:, 0], points[:, 1])."""
    points = torch.tensor([[0.1, 0.9], [0.4, 0.2], [0.8, 0.6], [0.3, 0.5]])
    output, truth = [0, 2, 1, 3], [0, 1, 2, 3]
    weights = torch.rand(5, 5)  # 5 steps over ["end", "0", ..., "3"]
    fig = pointer_figure(points, weights, output, truth, ["end", "0", "1", "2", "3"], closed=closed)
    heat, ax = fig.axes
    assert [t.get_text() for t in heat.get_yticklabels()] == ["1", "2", "3", "4", "5"]
    lines = {line.get_label(): line.get_xydata() for line in ax.lines}
    scattered = ax.collections[0].get_offsets().tolist()
    assert scattered == points.double().tolist()
    for name, order in (("output", output), ("true", truth)):
        drawn = lines[name]
        expected = points.double()[order + order[:1] if closed else order].numpy()
        np.testing.assert_array_equal(drawn, expected, err_msg=name)
        assert (drawn[-1] == drawn[0]).all() == closed, name
        assert all(vertex in scattered for vertex in drawn.tolist()), name


def _memory_example(length: int):
    """An untrained NTM's copy of `length` vectors: the arguments of memory_figure."""
    from attnzoo import runs
    from attnzoo.tasks.bits import BitsBatch

    config = runs.apply_overrides(
        runs.default_config("ntm", "bit_copy"),
        ["task.n_test_per_length=1", f"task.test_lengths={length}"],
    )
    task, model = runs.build(config)
    example = BitsBatch(*(t[:1] for t in task.held_out()[length][0]))
    with torch.no_grad():
        out = model(example.inputs, return_weights=True)
    return dict(
        inputs=example.inputs[0],
        targets=example.targets[0],
        outputs=torch.sigmoid(out.logits[0]),
        mask=example.mask[0],
        adds=out.adds[0, :, 0],
        reads=out.reads[0, :, 0],
        write_weights=out.write_weights[0, :, 0],
        read_weights=out.read_weights[0, :, 0],
        memory=out.memory[0, -1],
    )


@pytest.mark.parametrize("length, pieces", [(20, 1), (80, 4), (160, 7)])
def test_memory_figure_wraps_long_sequences_at_a_bounded_width(length, pieces):
    """Graves's copy at length 20 is one row of panels; length 80 was 4470 px wide,
    unreadable at page width: long sequences wrap into pieces of at most MAX_STEPS_PER_ROW
    steps, stacked, every step as wide as at length 20, ticks apart, the page's 800 px wide."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnzoo.viz.figures import MAX_STEPS_PER_ROW, memory_figure

    steps = 2 * length + 1
    fig = memory_figure(**_memory_example(length), title=f"copy, length {length}")
    FigureCanvasAgg(fig).draw()
    assert fig.get_figwidth() * fig.dpi <= 800
    timed = [ax for ax in fig.axes if ax.get_xlabel() == "time"]
    assert len(timed) == 8 * pieces  # 4 rows of 2 panels per piece
    assert len(fig.axes) == len(timed) + 1  # and the memory under them
    shown = set()
    for ax in timed:
        lo, hi = ax.get_xlim()
        assert hi - lo <= MAX_STEPS_PER_ROW
        assert ax.get_window_extent().width / (hi - lo) >= 6  # pixels per step
        image = ax.images[0].get_array()  # (rows, steps of this piece)
        first = round(ax.images[0].get_extent()[0] + 0.5)
        shown |= set(range(first, first + image.shape[1]))
        boxes = sorted(
            (t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()),
            key=lambda b: b.x0,
        )
        assert len(boxes) >= 3
        assert all(a.x1 + 5 < b.x0 for a, b in itertools.pairwise(boxes))
        assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= 6
        if pieces > 1:
            assert ", steps " in ax.get_title()
    assert shown == set(range(steps))  # every step in some piece
    fig.savefig(io.BytesIO())


def test_memory_figure_shows_each_weighting_and_the_memory_on_the_rows_the_heads_used():
    """A write head on rows 10-12 and a read head on rows 14-16 of 20: the panels show rows
    8-18 (the used ones and 2 either side), each weighting in its own panel, the memory on
    those rows, every row tick labelled with its true row number, not its place in the crop."""
    from attnzoo.viz.figures import memory_figure

    t, n = 6, 20
    write, read = torch.zeros(t, n), torch.zeros(t, n)
    for step in range(t):
        write[step, 10 + step % 3] = 1.0
        read[step, 16 - step % 3] = 0.8
    memory = torch.arange(n)[:, None] + torch.arange(4)[None] / 10  # row r, column c: r + c/10
    fig = memory_figure(
        torch.zeros(t, 3), torch.zeros(t, 2), torch.zeros(t, 2),
        write_weights=write, read_weights=read, memory=memory,
    )  # fmt: skip
    rows = np.arange(8, 19)
    panels = {ax.get_title(): ax for ax in fig.axes}
    drawn = {name: np.asarray(ax.images[0].get_array()) for name, ax in panels.items()}
    np.testing.assert_array_equal(drawn["write weightings"], write[:, rows].T.double())
    np.testing.assert_array_equal(drawn["read weightings"], read[:, rows].T.double())
    mem = drawn["memory after the last step (location across)"]  # (columns, rows shown)
    np.testing.assert_allclose(mem, memory[rows].T.double().numpy(), rtol=1e-6)
    for name, axis in (
        ("write weightings", "y"), ("read weightings", "y"),
        ("memory after the last step (location across)", "x"),
    ):  # fmt: skip
        ax = panels[name]
        at = getattr(ax, f"get_{axis}ticks")()
        labels = [x.get_text() for x in getattr(ax, f"get_{axis}ticklabels")()]
        assert len(at) >= 3, name
        assert labels == [str(rows[int(a)]) for a in at], name


def test_glimpse_figure_one_row_per_image_and_a_column_per_glimpse(tmp_path):
    from attnzoo.viz import glimpse_figure

    images = torch.rand(2, 28, 28)
    paths = torch.tensor([[[0.0, 0.0], [0.5, -0.5], [1.0, 1.0]]] * 2)
    retinas = torch.rand(2, 3, 2, 4, 4)  # (n, glimpses, scales, g, g)
    fig = glimpse_figure(images, paths, retinas, patch=4, titles=["a", "b"])
    assert len(fig.axes) == 2 * (3 + 1)
    assert fig.axes[1].images[0].get_array().shape == (8, 8)  # the largest patch's side
    path_line = fig.axes[0].lines[0]
    assert path_line.get_xdata().tolist() == [13.5, 20.5, 27.5]  # pixel-centre coordinates
    fig.savefig(tmp_path / "g.png")
    with pytest.raises(ValueError, match="'retinas'"):
        glimpse_figure(images, paths, torch.rand(2, 3, 2, 5, 5), patch=4)


def test_glimpse_figure_marks_the_start_and_each_glimpse_where_the_sensor_read():
    """Three glimpses whose x and y differ, the retina of glimpse t a constant (t + 1) / 4:
    the start marker on the first glimpse's centre, each glimpse's squares at the sensor's
    own corners (row down, column across), and panel t showing glimpse t's retina."""
    from attnzoo.models.ram import patch_corners
    from attnzoo.viz import glimpse_figure

    patch, scales, side = 4, 2, 40
    paths = torch.tensor([[-0.6, -0.2], [0.1, 0.5], [0.6, -0.7]])  # (x, y)
    retinas = torch.stack([torch.full((scales, patch, patch), (t + 1) / 4) for t in range(3)])
    fig = glimpse_figure(torch.zeros(1, side, side), paths[None], retinas[None], patch=patch)
    ax = fig.axes[0]
    (start,) = [line for line in ax.lines if line.get_marker() == "s"]
    x, y = (paths[0].double() + 1) * side / 2  # the first centre, pixels from the corner
    np.testing.assert_allclose(start.get_xydata(), [[x - 0.5, y - 0.5]], rtol=1e-6)
    squares = [line.get_xydata().tolist() for line in ax.lines if line.get_color() == "red"]
    corners = patch_corners(paths, side, side, patch, scales)  # (glimpses, scales, 2)
    expected = []
    for t in range(3):
        for s in range(scales):
            top, left = (corners[t, s] - 0.5).tolist()
            size = patch * 2**s
            xs = [left, left + size, left + size, left, left]
            ys = [top, top, top + size, top + size, top]
            expected.append([list(v) for v in zip(xs, ys, strict=True)])
    assert squares == expected
    for t in range(3):
        panel = np.asarray(fig.axes[1 + t].images[0].get_array())
        assert panel.shape == (8, 8) and (panel == (t + 1) / 4).all(), t


@pytest.mark.parametrize("patch", [5, 8])
def test_glimpse_figure_pastes_each_patch_where_the_sensor_read_it(patch):
    """The glimpse panel pasted the finer patches at the coarser one's centre; the sensor
    places each by rounding the location to the pixel grid (`ram.patch_corners`), so with an
    odd g the smallest patch sat one pixel off what it read. Each scale here is a constant,
    so the panel shows where each patch went; against the sensor's own corners."""
    from attnzoo.models.ram import patch_corners
    from attnzoo.viz import glimpse_figure

    # the last location's row and column offsets differ ((7, 8) with patch 5)
    scales, location = 3, torch.tensor([[0.0, 0.0], [0.13, -0.31], [0.0, 0.02]])
    retinas = torch.stack([torch.full((patch, patch), (s + 1) / 4) for s in range(scales)])
    retinas = retinas.expand(1, 3, scales, patch, patch)
    fig = glimpse_figure(torch.zeros(1, 60, 60), location[None], retinas, patch=patch)
    corners = patch_corners(location, 60, 60, patch, scales)  # (glimpses, scales, 2)
    for t in range(3):
        shown = fig.axes[1 + t].images[0].get_array()
        rows, cols = np.nonzero(np.asarray(shown) == 0.25)  # the finest patch's pixels
        top, left = (corners[t, 0] - corners[t, -1]).tolist()
        assert (rows.min(), cols.min()) == (top, left)
        assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (patch, patch)


def _drawn(fig) -> np.ndarray:
    """The figure rendered: (H, W, 3) uint8."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3]


def _bright_green(pixels: np.ndarray) -> int:
    r, g, b = (pixels[..., k].astype(int) for k in range(3))
    return int((g - np.maximum(r, b) > 80).sum())  # also under an overlay's alpha


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weights_are_drawn_in_green_and_counted(bad):
    """A NaN or inf weight is not drawn as a blank cell (which reads as a weight of 0 or 1):
    every weight heatmap draws it bright green and counts it at the figure's foot."""
    w = torch.full((3, 4), 0.25)
    w[1, 2] = bad
    labels = (["a", "b", "c", "d"], ["x", "y", "z"])
    figures = {
        "alignment": (alignment_figure(w, *labels), alignment_figure(w.nan_to_num(0.25), *labels)),
        "head_grid": (
            head_grid_figure(w[None, None], *labels),
            head_grid_figure(w.nan_to_num(0.25)[None, None].clamp(max=1), *labels),
        ),
        "pointer": (
            pointer_figure(torch.rand(3, 2), w[:, :4], [0, 1], [0, 1], ["end", "0", "1", "2"]),
            pointer_figure(
                torch.rand(3, 2), w.nan_to_num(0.25)[:, :4].clamp(max=1), [0, 1], [0, 1],
                ["end", "0", "1", "2"],
            ),
        ),
    }  # fmt: skip
    for name, (broken, clean) in figures.items():
        texts = [t.get_text() for t in broken.texts]
        assert "1 non-finite weight (NaN or inf), drawn in bright green" in texts, name
        assert not clean.texts, name
        assert _bright_green(_drawn(broken)) > _bright_green(_drawn(clean)) + 20, name


def test_memory_figure_counts_a_non_finite_output_as_a_bit_error():
    """A NaN output bit compared with > 0.5 is False: it passed for a 0 target bit. It is an
    error whatever the target, drawn bright green in the outputs panel and counted below."""
    from attnzoo.viz.figures import memory_figure

    t, c = 6, 3
    targets = torch.zeros(t, c)
    outputs = torch.zeros(t, c)
    outputs[2, 1] = float("nan")
    fig = memory_figure(torch.zeros(t, c + 1), targets, outputs)
    assert "bit errors (1)" in [ax.get_title() for ax in fig.axes]
    assert "1 non-finite value (NaN or inf), drawn in bright green" in [
        x.get_text() for x in fig.texts
    ]
    assert _bright_green(_drawn(fig)) > 20
    clean = memory_figure(torch.zeros(t, c + 1), targets, torch.zeros(t, c))
    assert "bit errors (0)" in [ax.get_title() for ax in clean.axes] and not clean.texts


def test_memory_figure_draws_a_negative_input_apart_from_no_input():
    """Repeat copy's count channel is normalised (mean 0, sd 1): a count of 1 to 5 is below 0,
    and the inputs panel's 0-1 grey drew it black, as no input. Inputs with a value below 0
    are drawn on the signed scale, where -1.57 and 0 differ."""
    from attnzoo.viz.figures import memory_figure

    t, c = 6, 3
    inputs = torch.zeros(t, c + 1)
    inputs[2, c] = -1.567  # the count
    fig = memory_figure(inputs, torch.zeros(t, c), torch.zeros(t, c))
    (panel,) = [ax for ax in fig.axes if ax.get_title() == "inputs"]
    image = panel.images[0]
    low, high = image.get_clim()
    assert low < 0 < high  # signed: the count is not at the scale's floor with the zeros
    assert image.to_rgba(-1.567)[:3] != image.to_rgba(0.0)[:3]


def test_caption_figure_draws_every_word_of_a_long_caption():
    """A four-digit caption runs to 17 words: the figure drew the first 12 and dropped the
    rest without a word. A long caption goes on in a further line of its row."""
    from attnzoo.viz.captions import caption_attention_figure

    words = [f"w{k}" for k in range(17)]
    weights = torch.full((17, 16), 1 / 16)
    image = torch.zeros(32, 32)
    fig = caption_attention_figure([(image, words, weights, (4, 4), "soft")] * 2)
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == ["", *words] * 2  # each row: its image (titled on the left), 17 words
    assert fig.get_size_inches()[0] * fig.dpi == 800


@pytest.mark.parametrize("grid", [(4, 4), (2, 4)], ids=["4x4", "2x4"])
def test_caption_figure_shows_each_word_its_own_cell(grid):
    """Each word attends one cell (row, column) of the (h, w) grid, off the diagonal: the
    panel titled with the word lights that cell's pixels of the 32 x 32 image, and only them."""
    from attnzoo.viz.captions import caption_attention_figure, upsample

    gh, gw = grid
    cells = {"top-right": (0, gw - 1), "bottom-left": (gh - 1, 0), "inner": (1, 2)}
    weights = torch.zeros(len(cells), gh * gw)
    expected = np.zeros((len(cells), 32, 32))
    ph, pw = 32 // gh, 32 // gw  # a cell's pixels
    for k, (r, c) in enumerate(cells.values()):
        weights[k, r * gw + c] = 1.0
        expected[k, r * ph : (r + 1) * ph, c * pw : (c + 1) * pw] = 1.0
    np.testing.assert_array_equal(upsample(weights, grid, (32, 32)).numpy(), expected)
    fig = caption_attention_figure([(torch.zeros(32, 32), list(cells), weights, grid, "")])
    panels = {ax.get_title(): ax for ax in fig.axes if ax.images}
    for k, word in enumerate(cells):
        overlay = np.asarray(panels[word].images[-1].get_array())
        np.testing.assert_array_equal(overlay, expected[k], err_msg=word)


def test_caption_and_gan_attention_maps_mark_non_finite_weights():
    """The overlays of Show-Attend-Tell and SAGAN: a NaN weight is counted at the figure's
    foot and drawn bright green, where the overlay left it blank."""
    from attnzoo.viz.captions import caption_attention_figure
    from attnzoo.viz.gan import attention_map_figure

    weights = torch.full((2, 16), 1 / 16)
    weights[1, 5] = float("nan")
    image = torch.zeros(32, 32)
    caption = caption_attention_figure([(image, ["a", "two"], weights, (4, 4), "nan")])
    maps = torch.full((1, 1, 4, 4), 1 / 16)
    maps[0, 0, 2, 2] = float("nan")
    gan = attention_map_figure(torch.zeros(1, 16, 16), maps, torch.tensor([[1, 1]]))
    for fig in (caption, gan):
        assert "non-finite weight" in " ".join(x.get_text() for x in fig.texts)
        green = _bright_green(_drawn(fig))
        # one cell of the 4 x 4 map, not the whole map (each map is scaled to its largest
        # finite weight: a NaN maximum had made every cell NaN)
        panel = fig.axes[-1].get_window_extent()
        assert 20 < green < panel.width * panel.height / 4


def test_intra_attention_figure_says_how_little_the_words_hold():
    """Each line is shaded relative to its largest weight: a step that put 95 % on the
    LSTMN's start state (no word) and 5 % on one earlier word drew that word as dark as a
    step that put all its weight there. Such a line now says what share its words hold."""
    from attnzoo.viz.figures import intra_attention_figure

    words = ["in", "the", "beginning", "god"]
    full = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0]])
    faint = full * 0.05  # 5 % on words: one word (lines 1, 3) or two (line 2)
    texts = [x.get_text() for x in intra_attention_figure(words, faint).axes[0].texts]
    assert [x for x in texts if x.endswith("on words")] == ["0% on words"] + ["5% on words"] * 3
    texts = [x.get_text() for x in intra_attention_figure(words, full).axes[0].texts]
    assert [x for x in texts if x.endswith("on words")] == ["0% on words"]


def test_intra_attention_figure_shades_against_the_current_words_weight_too():
    """A model that attends to the current word too (simplernn-self, transformer-lm): a line
    with 94 % on the current word and 2 % on each earlier word drew every earlier word in the
    darkest blue, as if one held it all, and said nothing. Now the earlier words are shaded
    against the current word's 94 % and the line says the current word's share."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    from attnzoo.viz.figures import intra_attention_figure

    words = ["in", "the", "beginning", "god"]
    w = torch.zeros(4, 4)
    w[3] = torch.tensor([0.02, 0.02, 0.02, 0.94])
    texts = intra_attention_figure(words, w).axes[0].texts
    assert [x.get_text() for x in texts if x.get_text().endswith("itself")] == ["94% on itself"]
    last = [x for x in texts if x.get_text() in words][-4:]  # the last line's four words
    faces = [to_rgba(x.get_bbox_patch().get_facecolor()) for x in last[:3]]
    darkest = to_rgba(colormaps["Blues"](1.0))
    assert all(face != darkest and min(face[:3]) > 0.8 for face in faces)  # 2 / 94: pale


def test_intra_attention_figure_writes_the_current_word_in_red():
    """On line i the one word in red is words[i], the word being read."""
    from matplotlib.colors import to_hex

    from attnzoo.viz.figures import intra_attention_figure

    words = ["in", "the", "beginning", "god", "created"]
    w = torch.tril(torch.ones(5, 5), -1)
    w = w / w.sum(-1, keepdim=True).clamp_min(1)
    texts = intra_attention_figure(words, w).axes[0].texts
    lines = sorted({x.get_position()[1] for x in texts})
    assert len(lines) == len(words)
    for i, y in enumerate(lines):
        on_line = [x for x in texts if x.get_position()[1] == y]
        red = [x.get_text() for x in on_line if to_hex(x.get_color()) == "#c00000"]
        assert red == [words[i]], i


def test_gan_attention_map_draws_a_nearly_flat_map_flat():
    """Each map is scaled to its peak; its colours ran from the map's own minimum to that
    peak, so a flat map with one cell 0.6 % higher was drawn black against bright yellow."""
    from attnzoo.viz.gan import attention_map_figure

    flat = torch.full((1, 1, 8, 8), 1 / 64)
    flat[0, 0, 3, 3] *= 1.006
    fig = attention_map_figure(torch.zeros(1, 16, 16), flat, torch.tensor([[3, 3]]))
    overlay = fig.axes[1].images[-1]
    colours = overlay.to_rgba(overlay.get_array())[..., :3]
    assert np.abs(colours[3, 3] - colours[0, 0]).max() < 0.02


def test_gan_attention_map_marks_each_query_and_its_map_where_they_are():
    """Queries are (row, column) on the 8 x 8 map, off the diagonal, each attending a cell off
    it: the marker is at x = column, y = row (on the image, that cell's centre in pixels),
    and the overlay is the map itself, row down, column across, scaled to its peak."""
    from attnzoo.viz.gan import attention_map_figure

    queries = torch.tensor([[1, 5], [7, 0]])
    maps = torch.full((1, 2, 8, 8), 0.01)
    maps[0, 0, 6, 2] = 0.5
    maps[0, 1, 0, 3] = 0.25
    fig = attention_map_figure(torch.zeros(1, 16, 16), maps, queries)
    image, *panels = fig.axes
    markers = [line.get_xydata().tolist() for line in image.lines]
    # on the 16 x 16 image a map cell is 2 x 2 pixels: cell (r, c)'s centre is (2c + 0.5, 2r + 0.5)
    assert markers == [[[10.5, 2.5]], [[0.5, 14.5]]]
    for j, ((row, col), ax) in enumerate(zip(queries.tolist(), panels, strict=True)):
        assert ax.lines[0].get_xydata().tolist() == [[col, row]], j
        overlay = np.asarray(ax.images[-1].get_array())
        np.testing.assert_allclose(overlay, (maps[0, j] / maps[0, j].max()).numpy(), rtol=1e-6)
        assert np.unravel_index(overlay.argmax(), overlay.shape) == ((6, 2), (0, 3))[j]


def test_a_figure_that_fails_to_save_leaves_the_earlier_one(tmp_path, monkeypatch):
    """savefig straight to the path left a truncated PNG on a full disk (and truncated the
    earlier figure first); save_figure writes atomically, naming the file on failure."""
    from matplotlib.figure import Figure

    from attnzoo.viz import save_figure

    path = tmp_path / "alignment.png"
    save_figure(loss_figure([0, 1], [2.0, 1.0]), path)
    before = path.read_bytes()

    def disk_full(self, fname, **kwargs):
        fname.write(b"\x89PNG\r\n")  # what a writer got out before the disk filled
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        save_figure(loss_figure([0, 1], [2.0, 1.0]), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_every_figure_of_the_package_is_saved_by_save_figure():
    """A task or the runs layer calling savefig itself would write non-atomically again."""
    import attnzoo

    root = Path(attnzoo.__file__).parent
    direct = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if ".savefig(" in p.read_text() and p.name != "figures.py"
    ]
    assert not direct, direct
