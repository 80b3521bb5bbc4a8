import pytest
import torch

from attnzoo.viz import alignment_figure, loss_figure


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
