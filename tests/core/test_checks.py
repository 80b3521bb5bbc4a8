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


def test_check_fields_reads_each_annotation():
    import dataclasses

    import pytest

    from attnzoo.core.checks import check_fields

    @dataclasses.dataclass(frozen=True)
    class Toy:
        n: int = 1
        rate: float = 0.5
        flag: bool = True
        name: str = "x"
        limit: int | None = None
        sizes: tuple[int, ...] = (1, 2)
        betas: tuple[float, float] = (0.9, 0.99)

        def __post_init__(self):
            check_fields(self)

    Toy()
    Toy(rate=2, limit=3, sizes=[4, 5], betas=[0, 1])  # ints for floats, lists for tuples (JSON)
    bad = {
        "n": [True, 2.5, "1", None],
        "rate": [True, "0.5", None],
        "flag": [1, "yes", None],
        "name": [1, None],
        "limit": [2.5, True],
        "sizes": [1, (1, 2.5), "12"],
        "betas": [(0.9,), (0.9, 0.99, 0.999), (0.9, "x")],
    }
    for field, values in bad.items():
        for value in values:
            with pytest.raises(ValueError, match=f"'{field}'"):
                Toy(**{field: value})
