import pytest
import torch

from attnzoo.viz import alignment_figure, head_grid_figure, loss_figure


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
    assert len(fig.axes[0].lines) == 1


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
