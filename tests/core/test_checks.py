import torch
from hypothesis import given
from hypothesis import strategies as st

from attnzoo.core.checks import broadcast_shape

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple)


@given(a=shapes, b=shapes, c=shapes)
def test_broadcast_shape_agrees_with_torch(a, b, c):
    try:
        expected = tuple(torch.broadcast_shapes(a, b, c))
    except RuntimeError:
        expected = None
    assert broadcast_shape(a, b, c) == expected
