import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnzoo.tasks import geometry
from attnzoo.tasks.geometry import (
    canonical_tour,
    convex_hull,
    held_karp,
    hull_metrics,
    is_simple_polygon,
    is_tour,
    polygon_area,
    sort_targets,
    tour_length,
    uniform_points,
)

pytest.importorskip("scipy.spatial")

SQUARE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)


def close(a, b, tol=1e-12):
    """Elementwise |a - b| <= tol (torch.testing's first call costs ~1 s of imports)."""
    return a.shape == b.shape and bool(((a - b).abs() <= tol).all())


def points(seed, batch, n, dtype=torch.float64):
    return uniform_points(torch.Generator().manual_seed(seed), batch, n).to(dtype)


# --- references written independently of the module --------------------------------------


def loop_length(xy, tour):
    total = 0.0
    for a, b in zip(tour, tour[1:] + tour[:1], strict=True):
        total += math.dist(xy[a].tolist(), xy[b].tolist())
    return total


def brute_force_tsp(xy):
    """Shortest closed tour over all (n-1)! orders of the nodes after node 0, in float64."""
    n = len(xy)
    orders = [(0, *p) for p in itertools.permutations(range(1, n))]
    tours = torch.tensor(orders)  # (orders, n)
    coords = xy.double()[tours]  # (orders, n, 2)
    lengths = (coords.roll(-1, dims=1) - coords).norm(dim=-1).sum(-1)
    return lengths.min().item()


def cross(o, a, b):
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def brute_force_hull(xy):
    """Points in general position: (i, j) is a counter-clockwise hull edge iff every other
    point lies strictly to its left; walk the edges from the lowest vertex."""
    pts = xy.tolist()
    n = len(pts)
    successor = {}
    for i, j in itertools.permutations(range(n), 2):
        if all(cross(pts[i], pts[j], pts[k]) > 0 for k in range(n) if k not in (i, j)):
            successor[i] = j
    hull = [min(successor)]
    while successor[hull[-1]] != hull[0]:
        hull.append(successor[hull[-1]])
    return hull


def signed_area(xy, indices):
    corners = [xy[i].tolist() for i in indices]
    return 0.5 * sum(
        x0 * y1 - x1 * y0
        for (x0, y0), (x1, y1) in zip(corners, corners[1:] + corners[:1], strict=True)
    )


# --- inputs ------------------------------------------------------------------------------


def test_uniform_points_shape_range_and_determinism():
    a = uniform_points(torch.Generator().manual_seed(3), 5, 7)
    b = uniform_points(torch.Generator().manual_seed(3), 5, 7)
    assert a.shape == (5, 7, 2) and a.dtype == torch.float32
    assert torch.equal(a, b) and a.min() >= 0 and a.max() < 1
    assert uniform_points(torch.Generator(), 2, 3, dim=4).shape == (2, 3, 4)


@pytest.mark.parametrize(
    ("kw", "arg"), [({"batch": -1}, "batch"), ({"n": 0}, "n"), ({"dim": 0}, "dim")]
)
def test_uniform_points_errors(kw, arg):
    args = {"batch": 2, "n": 3, "dim": 2, **kw}
    with pytest.raises(ValueError, match=f"'{arg}'"):
        uniform_points(torch.Generator(), **args)


def test_sort_targets_exact_and_stable():
    values = torch.tensor([[0.5, 0.1, 0.5, 0.0], [3.0, 2.0, 1.0, 0.0]])
    assert sort_targets(values).tolist() == [[3, 1, 0, 2], [3, 2, 1, 0]]
    assert sort_targets(values).dtype == torch.long
    with pytest.raises(ValueError, match="'values'"):
        sort_targets(values[0])


# --- travelling salesman -----------------------------------------------------------------


def test_tour_length_hand_values():
    square = SQUARE[None]
    assert tour_length(square, torch.tensor([[0, 1, 2, 3]])).item() == pytest.approx(4.0)
    crossing = tour_length(square, torch.tensor([[0, 2, 1, 3]])).item()
    assert crossing == pytest.approx(2 + 2 * math.sqrt(2))
    assert tour_length(square[:, :1], torch.tensor([[0]])).item() == 0.0


def test_tour_length_matches_loop():
    xy = points(1, 6, 9)
    tours = torch.stack([torch.randperm(9) for _ in range(6)])
    lengths = tour_length(xy, tours)
    assert lengths.dtype == torch.float64
    for b in range(6):
        assert lengths[b].item() == pytest.approx(loop_length(xy[b], tours[b].tolist()), abs=1e-12)


@pytest.mark.parametrize("n", range(1, 9))
def test_held_karp_is_optimal_and_canonical(n):
    xy = points(n, 6, n)
    xy[0, -1] = xy[0, 0]  # a duplicate point: several optimal tours
    if n >= 3:
        xy[1, 1] = xy[1, 2]
    tours, lengths = held_karp(xy)
    assert tours.shape == (6, n) and tours.dtype == torch.long
    assert lengths.shape == (6,) and lengths.dtype == torch.float64
    assert is_tour(tours).all()
    assert torch.equal(canonical_tour(tours), tours)
    assert (tours[:, 0] == 0).all()
    if n >= 3:
        assert (tours[:, 1] < tours[:, -1]).all()
    assert close(tour_length(xy, tours), lengths)
    for b in range(6):
        assert lengths[b].item() == pytest.approx(brute_force_tsp(xy[b]), abs=1e-9)


def test_held_karp_float32_input_and_unit_square():
    tours, lengths = held_karp(SQUARE[None].float())
    assert tours.tolist() == [[0, 1, 2, 3]] and lengths.item() == pytest.approx(4.0, abs=1e-12)
    xy = points(9, 3, 7, torch.float32)
    _, lengths = held_karp(xy)
    for b in range(3):
        assert lengths[b].item() == pytest.approx(brute_force_tsp(xy[b]), abs=1e-9)


def test_held_karp_chunks_give_the_same_answer(monkeypatch):
    xy = points(4, 10, 7)
    whole = held_karp(xy)
    monkeypatch.setattr(geometry, "HELD_KARP_CHUNK_ELEMENTS", 1000)  # chunks of two
    chunked = held_karp(xy)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_held_karp_shares_no_tables_between_calls(monkeypatch):
    """Its index tables were a module-level cache handed to every caller: one caller's
    in-place change to them altered every later solve in the process."""
    xy = points(3, 10, 8)
    want = held_karp(xy)
    plans = []
    made = geometry._held_karp_plan

    def spoil(m, device):
        plans.append(made(m, device))
        return plans[-1]

    monkeypatch.setattr(geometry, "_held_karp_plan", spoil)
    held_karp(xy)
    for step in plans[0]:
        step[2].zero_()  # the edge positions, changed in place
    got = held_karp(xy)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_held_karp_largest_size_and_empty_batch():
    xy = points(5, 2, geometry.MAX_HELD_KARP_NODES)
    tours, lengths = held_karp(xy)
    assert is_tour(tours).all()
    assert close(tour_length(xy, tours), lengths)
    random_tours = torch.stack([torch.randperm(xy.shape[1]) for _ in range(200)])
    for b in range(2):
        assert lengths[b] <= tour_length(xy[b].expand(200, -1, -1), random_tours).min() + 1e-12
    tours, lengths = held_karp(points(0, 0, 6))
    assert tours.shape == (0, 6) and lengths.shape == (0,)


@given(seed=st.integers(0, 2**31), n=st.integers(4, 9))
def test_held_karp_beats_random_tours(seed, n):
    g = torch.Generator().manual_seed(seed)
    xy = uniform_points(g, 1, n).double()
    _, length = held_karp(xy)
    random_tours = torch.stack([torch.randperm(n, generator=g) for _ in range(50)])
    assert (length <= tour_length(xy.expand(50, -1, -1), random_tours) + 1e-12).all()


def test_canonical_tour_exact():
    tours = torch.tensor([[2, 0, 1, 3], [3, 1, 0, 2], [0, 1, 3, 2]])
    assert canonical_tour(tours).tolist() == [[0, 1, 3, 2]] * 3
    assert canonical_tour(torch.tensor([[1, 0]])).tolist() == [[0, 1]]
    assert canonical_tour(torch.tensor([[0]])).tolist() == [[0]]


@given(
    seed=st.integers(0, 2**31), n=st.integers(1, 12), shift=st.integers(0, 11), flip=st.booleans()
)
def test_canonical_tour_invariants(seed, n, shift, flip):
    g = torch.Generator().manual_seed(seed)
    xy = uniform_points(g, 3, n).double()
    tours = torch.stack([torch.randperm(n, generator=g) for _ in range(3)])
    canonical = canonical_tour(tours)
    assert torch.equal(canonical_tour(canonical), canonical)  # idempotent
    assert close(tour_length(xy, canonical), tour_length(xy, tours))
    same_cycle = tours.roll(shift, dims=1)
    if flip:
        same_cycle = same_cycle.flip(1)
    assert torch.equal(canonical_tour(same_cycle), canonical)  # one label per cycle


def test_is_tour():
    assert is_tour(torch.tensor([[1, 0, 2], [0, 0, 2]])).tolist() == [True, False]


@pytest.mark.parametrize(
    ("call", "arg", "match"),
    [
        (lambda: held_karp(points(0, 1, 13)), "points", "at most 12"),
        (lambda: held_karp(torch.rand(5, 2)), "points", "rank 3"),
        (lambda: held_karp(torch.zeros(1, 4, 2, dtype=torch.long)), "points", "floating"),
        (lambda: held_karp(torch.zeros(1, 0, 2)), "points", "at least one point"),
        (
            lambda: tour_length(torch.rand(2, 4, 2), torch.zeros(2, 3, dtype=torch.long)),
            "tours",
            "shape",
        ),
        (
            lambda: tour_length(torch.rand(2, 4, 2), torch.zeros(2, 4, dtype=torch.int32)),
            "tours",
            "long",
        ),
        (lambda: tour_length(torch.rand(1, 3, 2), torch.tensor([[0, 1, 3]])), "tours", "range"),
        (lambda: canonical_tour(torch.tensor([[0, 0, 1]])), "tours", "permutations"),
        (lambda: convex_hull(torch.rand(1, 4, 3)), "points", r"\(batch, n, 2\)"),
    ],
)
def test_bad_input_names_the_argument(call, arg, match):
    with pytest.raises((ValueError, TypeError), match=f"'{arg}'.*{match}"):
        call()


# --- convex hull -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 4, 10, 25])
def test_convex_hull_matches_brute_force(n):
    xy = points(n, 8, n)
    hulls = convex_hull(xy)
    for b in range(8):
        assert hulls[b] == brute_force_hull(xy[b])
        assert hulls[b][0] == min(hulls[b])
        assert signed_area(xy[b], hulls[b]) > 0  # counter-clockwise


@pytest.mark.parametrize("n", [9, geometry._ALIKE_MAX_N + 8], ids=["pairwise", "sorted"])
def test_points_at_one_place_are_named_by_their_lowest_index(monkeypatch, n):
    """The naming of duplicates equals its definition, on grids with many duplicates,
    collinear points and a NaN point: pairwise in chunks (here of two instances) up to
    _ALIKE_MAX_N points, by np.unique past it."""
    import numpy as np

    monkeypatch.setattr(geometry, "_ALIKE_ELEMENTS", 2 * n * n)
    g = torch.Generator().manual_seed(0)
    coords = (torch.randint(0, 3, (25, n, 2), generator=g).double() / 2).numpy()
    coords[0, 4] = np.nan
    for xy, got in zip(coords, geometry._lowest_alike(coords), strict=True):
        alike = [[j for j in range(n) if (xy[j] == xy[i]).all()] for i in range(n)]
        want = [min(same) if same else i for i, same in enumerate(alike)]  # NaN: itself
        assert got.tolist() == want
    labels = convex_hull(torch.from_numpy(coords[1:]))
    for xy, hull in zip(coords[1:], labels, strict=True):  # each vertex its lowest name
        _, first = np.unique(xy, axis=0, return_index=True)
        assert set(hull) <= set(first.tolist())


def test_convex_hull_edge_points_duplicates_and_degenerate_cases():
    # square listed clockwise, its centre, the midpoint of an edge, a duplicate corner
    xy = torch.tensor([[0, 1], [1, 1], [0.5, 0.5], [1, 0], [0.5, 0], [0, 0], [1, 1]]).double()
    assert convex_hull(xy[None]) == [[0, 5, 3, 1]]  # CCW from 0; 4 is on an edge, 6 is 1
    line = torch.tensor([[[0.5, 0.5], [0.0, 0.0], [1.0, 1.0], [0.25, 0.25]]])
    assert convex_hull(line) == [[1, 2]]
    assert convex_hull(torch.tensor([[[0.3, 0.3], [0.3, 0.3]]])) == [[0]]
    assert convex_hull(torch.tensor([[[0.3, 0.3], [0.1, 0.7]]])) == [[0, 1]]
    assert convex_hull(torch.tensor([[[0.3, 0.3]]])) == [[0]]


def test_polygon_area():
    assert polygon_area(SQUARE, [0, 1, 2, 3]) == pytest.approx(1.0)
    assert polygon_area(SQUARE, [3, 2, 1, 0]) == pytest.approx(1.0)  # orientation-free
    assert polygon_area(SQUARE, [0, 1, 2]) == pytest.approx(0.5)
    assert polygon_area(SQUARE, [0, 2]) == 0.0
    batch = torch.stack([SQUARE, 2 * SQUARE])
    areas = polygon_area(batch, [[0, 1, 2, 3], [0, 1, 3]])
    assert areas.dtype == torch.float64 and areas.tolist() == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError, match="'indices'"):
        polygon_area(SQUARE, [0, 4])
    with pytest.raises(ValueError, match="'indices'"):
        polygon_area(batch, [[0, 1, 2]])


@pytest.mark.parametrize(
    ("indices", "simple"),
    [
        ([0, 1, 2, 3], True),  # square
        ([3, 2, 1, 0], True),  # clockwise square
        ([0, 1, 2], True),  # triangle
        ([0, 2, 1, 3], False),  # bow-tie
        ([0, 2], False),  # two points
        ([0], False),
        ([0, 1, 2, 0], False),  # repeated vertex
        ([0, 4, 2], False),  # collinear: 4 is the centre, on the diagonal 0-2
        ([0, 1, 2, 5, 3], False),  # vertex 5 touches the non-adjacent edge 0-1
        ([0, 1, 2, 4], True),  # concave: the centre as a reflex vertex
        ([0, 6, 1, 2], False),  # spike: edge 6-1 folds back along 0-6
    ],
)
def test_is_simple_polygon(indices, simple):
    xy = torch.cat([SQUARE, torch.tensor([[0.5, 0.5], [0.5, 0.0], [2.0, 0.0]]).double()])
    assert is_simple_polygon(xy, indices) is simple


def test_is_simple_polygon_duplicate_coordinates_and_errors():
    xy = torch.cat([SQUARE, SQUARE[:1]])
    assert not is_simple_polygon(xy, [0, 1, 2, 4])
    with pytest.raises(ValueError, match="'indices'"):
        is_simple_polygon(SQUARE, [0, 1, 9])
    with pytest.raises(ValueError, match="'points'"):
        is_simple_polygon(SQUARE[None], [0, 1, 2])


def test_hull_metrics_hand_cases():
    xy = torch.stack([SQUARE] * 5)
    truth = [[0, 1, 2, 3]] * 5
    predicted = [
        [0, 1, 2, 3],  # exact
        [2, 3, 0, 1],  # rotated: accurate
        [0, 3, 2, 1],  # clockwise: wrong, but a simple polygon of full area
        [0, 1, 2],  # a vertex missing: area 1/2
        [0, 2, 1, 3],  # self-intersecting: a failure
    ]
    metrics = hull_metrics(xy, predicted, truth)
    assert metrics == pytest.approx(
        {"accuracy": 2 / 5, "area_coverage": (1 + 1 + 1 + 0.5) / 4, "fail_rate": 1 / 5}
    )
    assert all(isinstance(v, float) for v in metrics.values())
    only_failures = hull_metrics(xy[:1], [[0, 2]], truth[:1])
    assert math.isnan(only_failures["area_coverage"]) and only_failures["fail_rate"] == 1.0


def test_hull_metrics_on_the_true_hulls():
    xy = points(0, 20, 15)
    truth = convex_hull(xy)
    assert hull_metrics(xy, truth, truth) == {
        "accuracy": 1.0,
        "area_coverage": 1.0,
        "fail_rate": 0.0,
    }


def test_hull_metrics_errors():
    with pytest.raises(ValueError, match="'predicted'"):
        hull_metrics(SQUARE[None], [], [[0, 1, 2]])
    with pytest.raises(ValueError, match="'truth'"):
        hull_metrics(SQUARE[None], [[0, 1, 2]], [[0, 1, 7]])
