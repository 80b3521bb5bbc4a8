"""Geometry for the Pointer Network tasks (Vinyals, Fortunato and Jaitly, 2015, Section 4).

Pure functions on torch tensors, no model code: the inputs (points drawn uniformly in the unit
square, as for every problem of Section 4), the exact labels and the metrics:

- Convex hull (Section 4.1): `convex_hull` (qhull through scipy), `polygon_area`,
  `is_simple_polygon` and `hull_metrics`, the "accuracy" and "area" columns of Table 1 plus the
  share of outputs that are not a polygon.
- Planar travelling salesman (Section 4.3): `tour_length`, the exact solver `held_karp` (the
  paper's exact labels for small n come from Held-Karp too) and `canonical_tour`, which makes
  the label unique so that a cross-entropy on it is well defined.
- Sorting numbers (not in the Pointer Networks paper; the set-to-sequence warm-up of Vinyals,
  Bengio and Kudlur, 2016, "Order Matters"): `sort_targets`.

Shapes: `(batch, n, dim)` for points, `(batch, n)` for tours (node indices). Lengths and areas
are computed in float64 whatever the dtype of the points.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnzoo.core.checks import check_tensor, fail
from attnzoo.tasks.base import require

MAX_HELD_KARP_NODES = 12
# Elements of the (chunk, 2^(n-1) * (n-1)) dynamic-programming table per chunk of instances:
# bounds the memory of `held_karp` (~25 MB with the temporaries) at any batch size.
HELD_KARP_CHUNK_ELEMENTS = 1 << 20


# --- inputs ------------------------------------------------------------------------------


def uniform_points(generator: torch.Generator, batch: int, n: int, dim: int = 2) -> torch.Tensor:
    """`batch` sets of `n` points drawn uniformly in [0, 1)^dim (Section 4), float32.

    Returns:
        (batch, n, dim) on the generator's device.
    """
    for name, value, least in (("batch", batch, 0), ("n", n, 1), ("dim", dim, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            fail("uniform_points", name, f"an int >= {least}", repr(value))
    return torch.rand((batch, n, dim), generator=generator, device=generator.device)


def sort_targets(values: torch.Tensor) -> torch.Tensor:
    """The pointer targets of sorting: the positions of `values` in ascending order.

    Args:
        values: (batch, n) real numbers.

    Returns:
        (batch, n) long; row b lists the positions of values[b] from the smallest up. Stable:
        equal values keep their input order, so the target is unique.
    """
    check_tensor("sort_targets", "values", values, (2,))
    return torch.argsort(values, dim=-1, stable=True)


def _check_points(function: str, points: object, dims: Sequence[int] | None = None) -> None:
    check_tensor(function, "points", points, (3,))
    if not points.is_floating_point():
        fail(function, "points", "a floating-point tensor", points.dtype, TypeError)
    if points.shape[1] < 1:
        fail(function, "points", "at least one point per instance", f"shape {tuple(points.shape)}")
    if dims is not None and points.shape[2] not in dims:
        fail(function, "points", f"(batch, n, {dims[0]})", f"shape {tuple(points.shape)}")


# --- travelling salesman -----------------------------------------------------------------


def _check_tours(function: str, points: torch.Tensor, tours: object) -> None:
    check_tensor(function, "tours", tours, (2,))
    if tours.dtype != torch.long:
        fail(function, "tours", "dtype torch.long (node indices)", tours.dtype, TypeError)
    if tuple(tours.shape) != tuple(points.shape[:2]):
        fail(
            function,
            "tours",
            f"shape (batch, n) = {tuple(points.shape[:2])}",
            f"shape {tuple(tours.shape)}",
        )
    if tours.numel() and not tours.is_meta and (tours.min() < 0 or tours.max() >= points.shape[1]):
        fail(function, "tours", f"indices in [0, {points.shape[1]})", "an index out of range")


def tour_length(points: torch.Tensor, tours: torch.Tensor) -> torch.Tensor:
    """Length of each closed tour: the walk through `tours[b]` and back to its first node.

    Args:
        points: (batch, n, dim) coordinates.
        tours: (batch, n) long node indices (any sequence of indices, not only permutations).

    Returns:
        (batch,) float64 Euclidean lengths.
    """
    _check_points("tour_length", points)
    _check_tours("tour_length", points, tours)
    dim = points.shape[-1]
    visited = points.double().gather(1, tours[..., None].expand(-1, -1, dim))  # (B, n, dim)
    steps = visited.roll(-1, dims=1) - visited  # (B, n, dim): node t to node t + 1, last to first
    return steps.norm(dim=-1).sum(-1)  # (B,)


def is_tour(tours: torch.Tensor) -> torch.Tensor:
    """Whether each row of `tours` (batch, n) is a permutation of 0..n-1, as (batch,) bool.

    A pointer decoder without masking can repeat a node; such rows are not tours.
    """
    check_tensor("is_tour", "tours", tours, (2,))
    n = tours.shape[1]
    expected = torch.arange(n, device=tours.device)
    return (tours.sort(dim=-1).values == expected).all(-1)  # (B,)


def canonical_tour(tours: torch.Tensor) -> torch.Tensor:
    """The one representative of each tour among its 2n rotations and reflections.

    The tour is rotated to start at node 0 and, when n >= 3, walked in the direction that makes
    tour[1] < tour[-1]. All 2n ways of writing the same cycle map to the same row, so the label
    of a TSP instance is unique and a model's output can be compared with it token for token.

    Args:
        tours: (batch, n) long, each row a permutation of 0..n-1 (see `is_tour`).

    Returns:
        (batch, n) long.
    """
    check_tensor("canonical_tour", "tours", tours, (2,))
    if tours.dtype != torch.long:
        fail("canonical_tour", "tours", "dtype torch.long (node indices)", tours.dtype, TypeError)
    if not bool(is_tour(tours).all()):
        fail("canonical_tour", "tours", "rows that are permutations of 0..n-1", "a row that is not")
    n = tours.shape[1]
    if n == 0:
        return tours.clone()
    start = (tours == 0).long().argmax(-1)  # (B,): where node 0 is
    steps = torch.arange(n, device=tours.device)
    rotated = tours.gather(1, (steps + start[:, None]) % n)  # (B, n), rotated[:, 0] == 0
    if n < 3:
        return rotated
    reflected = torch.cat([rotated[:, :1], rotated[:, 1:].flip(-1)], dim=1)  # (B, n)
    backwards = rotated[:, 1] > rotated[:, -1]  # (B,)
    return torch.where(backwards[:, None], reflected, rotated)


def _held_karp_plan(
    m: int, device: torch.device
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], ...]:
    """Index tables of the Held-Karp recursion over the m = n - 1 nodes other than node 0,
    on `device`, made for each `held_karp` call (a module-level cache handed every caller the
    same tensors: one in-place change would have altered every later solve).

    A state is (S, j): a path that starts at node 0, visits exactly the set S of non-start
    nodes (an m-bit mask) and ends at j in S; it is stored at flat position S * m + j. For each
    subset size s = 2..m, one entry per state (S, j) with |S| = s:
        out (P,): position of (S, j);
        prev (P, s - 1): positions of the predecessor states (S - {j}, k), k in S - {j};
        edge (P, s - 1): positions k * m + j of the edges k -> j in the distance table;
        k (P, s - 1): the predecessor nodes themselves, for the back-pointers.
    """
    masks = torch.arange(1 << m, device=device)
    bits = (masks[:, None] >> torch.arange(m, device=device)) & 1  # (2^m, m)
    sizes = bits.sum(-1)  # (2^m,)
    plan = []
    for s in range(2, m + 1):
        subsets = masks[sizes == s]  # (Q,)
        members = bits[subsets].nonzero()[:, 1].view(-1, s)  # (Q, s): the nodes of each S
        others = [[b for b in range(s) if b != a] for a in range(s)]
        others = torch.tensor(others, device=device)  # (s, s - 1)
        end = members.reshape(-1)  # (Q * s,): j, state by state
        k = members[:, others].reshape(-1, s - 1)  # (Q * s, s - 1)
        subset = subsets.repeat_interleave(s)  # (Q * s,)
        before = subset ^ (1 << end)  # (Q * s,): S - {j}
        plan.append((subset * m + end, before[:, None] * m + k, k * m + end[:, None], k))
    return tuple(plan)


def _held_karp_chunk(dist: torch.Tensor, plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Held-Karp on distance matrices (batch, n, n) float64 with n >= 2 (`plan`: the index
    tables of n - 1 nodes on their device); returns (tours (batch, n), lengths (batch,)),
    tours starting at 0 in either direction."""
    batch, n, _ = dist.shape
    m = n - 1
    full = (1 << m) - 1
    device = dist.device
    # State-major tables, (state, batch): a gather of states copies contiguous rows.
    from_start = dist[:, 0, 1:].T  # (m, B): node 0 -> node j + 1
    between = dist[:, 1:, 1:].reshape(batch, m * m).T  # (m*m, B): node k + 1 -> node j + 1
    cost = torch.empty(((1 << m) * m, batch), dtype=dist.dtype, device=device)
    parent = torch.empty(((1 << m) * m, batch), dtype=torch.int8, device=device)

    # 1. Paths of one step: cost[{j}, j] = d(0, j).
    singles = (1 << torch.arange(m, device=device)) * m + torch.arange(m, device=device)
    cost[singles] = from_start
    # 2. cost[S, j] = min over k in S - {j} of cost[S - {j}, k] + d(k, j), by growing |S|: a
    #    subset's predecessors are all one smaller, so each size is one vectorised step, and
    #    every state read has been written.
    for out, prev, edge, k in plan:
        paths = cost[prev]  # (P, s-1, B): cost[S - {j}, k]
        paths += between[edge]  # ... + d(k, j)
        best, arg = paths.min(1)  # (P, B)
        cost[out] = best
        parent[out] = k.gather(1, arg).to(torch.int8)  # (P, B)
    # 3. Close the cycle: back from the last node j to node 0.
    lengths, last = (cost[full * m : full * m + m] + from_start).min(0)  # (B,)
    # 4. Follow the back-pointers from the last node to the first.
    columns = torch.arange(batch, device=device)
    subset = torch.full((batch,), full, dtype=torch.long, device=device)
    node = last
    backwards = []
    for _ in range(m):
        backwards.append(node)
        step = parent[subset * m + node, columns].long()
        subset = subset ^ (1 << node)
        node = step
    path = torch.stack(backwards, dim=1) + 1  # (B, m): the tour after node 0, reversed
    tours = torch.cat([torch.zeros((batch, 1), dtype=torch.long, device=device), path], dim=1)
    return tours, lengths


def held_karp(points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal TSP tours by Held-Karp dynamic programming (Held and Karp, 1962).

    The exact labels of the paper's TSP experiments for small n. Time O(2^n n^2) and memory
    O(2^n n) per instance, vectorised over the batch and over all subsets of one size; the
    batch is solved in chunks so that memory stays bounded.

    Args:
        points: (batch, n, dim) coordinates, 1 <= n <= MAX_HELD_KARP_NODES.

    Returns:
        tours: (batch, n) long, canonical (see `canonical_tour`): starting at node 0 with
            tour[1] < tour[-1]. With ties (duplicate points) the tour is one of the optima.
        lengths: (batch,) float64 optimal closed-tour lengths.

    Note: distances and sums are computed in float64 whatever the dtype of `points`.
    """
    _check_points("held_karp", points)
    batch, n, _ = points.shape
    if n > MAX_HELD_KARP_NODES:
        fail(
            "held_karp",
            "points",
            f"at most {MAX_HELD_KARP_NODES} points per instance (Held-Karp is exponential)",
            f"n = {n}",
        )
    coords = points.detach().double()  # labels: no graph
    if n <= 3:  # every tour is optimal: one cycle up to rotation and reflection
        tours = torch.arange(n, device=points.device).expand(batch, n).clone()
        return tours, tour_length(coords, tours)
    chunk = max(1, HELD_KARP_CHUNK_ELEMENTS // ((1 << (n - 1)) * (n - 1)))
    tours, lengths = [], []
    plan = _held_karp_plan(n - 1, points.device) if batch else ()
    for part in coords.split(chunk):
        dist = (part[:, :, None, :] - part[:, None, :, :]).norm(dim=-1)  # (chunk, n, n)
        t, length = _held_karp_chunk(dist, plan)
        tours.append(t)
        lengths.append(length)
    if not tours:
        return torch.zeros((0, n), dtype=torch.long, device=points.device), coords.new_zeros(0)
    return canonical_tour(torch.cat(tours)), torch.cat(lengths)


# --- convex hull -------------------------------------------------------------------------


def _hull_of(xy, lowest) -> list[int]:
    """Hull vertices of one (n, 2) float64 numpy array, counter-clockwise, from the lowest
    index; each vertex named by `lowest` (n,), the lowest index of the points at its
    coordinates (`_lowest_alike`)."""
    spatial = require("scipy.spatial")
    try:
        vertices = [int(lowest[v]) for v in spatial.ConvexHull(xy).vertices]
    except spatial.QhullError:
        # Fewer than three distinct points, or all on one line: the hull is a segment (or a
        # point), whose vertices are its two extreme points along the line.
        distinct = np.unique(lowest)
        if len(distinct) == 1:
            return [int(distinct[0])]
        direction = xy[distinct[-1]] - xy[distinct[0]]  # nonzero: distinct coordinates
        position = xy[distinct] @ direction
        vertices = sorted({int(distinct[position.argmin()]), int(distinct[position.argmax()])})
    start = vertices.index(min(vertices))
    return vertices[start:] + vertices[:start]


def convex_hull(points: torch.Tensor) -> list[list[int]]:
    """The convex-hull labels of Section 4.1: hull vertices of each instance.

    Args:
        points: (batch, n, 2) coordinates.

    Returns:
        batch lists of point indices, counter-clockwise, starting from the lowest index (the
        convention of the paper's data sets, whose output also starts from the lowest index).

    Note: computed by qhull (scipy.spatial.ConvexHull). Points on an edge of the hull, between
    two vertices, are not vertices; among duplicate points a vertex is named by its lowest
    index. Degenerate instances (fewer than three distinct points, or all collinear) have as
    hull the one or two extreme points. qhull decides "on an edge" with a roundoff tolerance,
    which only matters for points within ~1e-15 of an edge.
    """
    _check_points("convex_hull", points, (2,))
    coords = points.detach().double().cpu().numpy()
    return [_hull_of(xy, lowest) for xy, lowest in zip(coords, _lowest_alike(coords), strict=True)]


def _lowest_alike(coords) -> np.ndarray:
    """(batch, n, d) numpy -> (batch, n): for each point the lowest index of the points at the
    same coordinates (itself where none is lower; a NaN point names itself). Up to
    _ALIKE_MAX_N points, batched comparisons of at most _ALIKE_ELEMENTS pairs at a time (at
    the task's sizes a per-instance np.unique(axis=0) was half the labels' time); past it,
    np.unique per instance, whose sort is O(n log n) against the comparisons' O(n^2)."""
    batch, n, _ = coords.shape
    lowest = np.empty((batch, n), dtype=np.int64)
    if n > _ALIKE_MAX_N:
        for k, xy in enumerate(coords):
            _, first, inverse = np.unique(xy, axis=0, return_index=True, return_inverse=True)
            lowest[k] = first[inverse.reshape(-1)]
        return lowest
    step = max(1, _ALIKE_ELEMENTS // (n * n))
    for start in range(0, batch, step):
        part = coords[start : start + step]
        same = (part[:, :, None, :] == part[:, None, :, :]).all(-1)  # (step, n, n)
        same[:, np.arange(n), np.arange(n)] = True
        lowest[start : start + step] = same.argmax(-1)
    return lowest


# `_lowest_alike`: the largest n compared pairwise (measured faster than np.unique up to ~50
# points), and the pairs per comparison (its memory)
_ALIKE_MAX_N, _ALIKE_ELEMENTS = 32, 1 << 20


def _check_indices(function: str, n: int, indices: object, argument: str = "indices") -> None:
    if not isinstance(indices, Sequence) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indices
    ):
        fail(function, argument, "a sequence of int point indices", repr(indices), TypeError)
    if any(not 0 <= i < n for i in indices):
        fail(function, argument, f"indices in [0, {n})", list(indices))


def _shoelace(xy: np.ndarray, indices: Sequence[int]) -> float:
    """The area through the (n, 2) float64 `xy[indices]` (numpy: a polygon is a few tiny
    operations, several times cheaper than torch's)."""
    if len(indices) < 3:
        return 0.0
    corners = xy[list(indices)]  # (k, 2)
    x, y = corners[:, 0], corners[:, 1]
    return 0.5 * abs(float((x * np.roll(y, -1) - np.roll(x, -1) * y).sum()))


def polygon_area(points: torch.Tensor, indices) -> float | torch.Tensor:
    """Area of the polygon through `points[indices]` in that order (shoelace formula, |.|).

    Args:
        points: (n, 2), with `indices` a sequence of ints; or (batch, n, 2), with `indices` a
            sequence of `batch` sequences of ints.

    Returns:
        a float for one polygon; (batch,) float64 for a batch. Fewer than three vertices have
        area 0. For a self-intersecting polygon this is the absolute signed area, not the area
        enclosed.
    """
    check_tensor("polygon_area", "points", points, (2, 3))
    if points.shape[-1] != 2:
        fail("polygon_area", "points", "(n, 2) or (batch, n, 2)", f"shape {tuple(points.shape)}")
    n = points.shape[-2]
    coords = points.detach().double().cpu().numpy()
    if points.dim() == 2:
        _check_indices("polygon_area", n, indices)
        return _shoelace(coords, indices)
    if not isinstance(indices, Sequence) or len(indices) != points.shape[0]:
        fail("polygon_area", "indices", f"{points.shape[0]} index sequences", repr(indices))
    for one in indices:
        _check_indices("polygon_area", n, one)
    areas = [_shoelace(xy, one) for xy, one in zip(coords, indices, strict=True)]
    return torch.tensor(areas, dtype=torch.float64, device=points.device)


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """z of (a - o) x (b - o): > 0 when o, a, b turn counter-clockwise."""
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (
        b[..., 0] - o[..., 0]
    )


def _on_segment(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether p, known to be collinear with a and b, lies on the closed segment ab."""
    low, high = np.minimum(a, b), np.maximum(a, b)
    return ((p >= low) & (p <= high)).all(-1)


def is_simple_polygon(points: torch.Tensor, indices: Sequence[int]) -> bool:
    """Whether the closed polygon through `points[indices]` is simple: at least three
    vertices, and no two edges meet except consecutive edges at their shared vertex.

    Args:
        points: (n, 2) coordinates.
        indices: the vertices in order (the edge from the last back to the first is implied).

    Note: exact float64 tests without tolerance. A repeated vertex, two vertices at the same
    coordinates, an edge folding back on the previous one, or all vertices on one line make
    the polygon not simple.
    """
    check_tensor("is_simple_polygon", "points", points, (2,))
    if points.shape[-1] != 2:
        fail("is_simple_polygon", "points", "(n, 2)", f"shape {tuple(points.shape)}")
    _check_indices("is_simple_polygon", points.shape[0], indices)
    return _simple(points.detach().double().cpu().numpy(), indices)


def _simple(xy: np.ndarray, indices: Sequence[int]) -> bool:
    """`is_simple_polygon` on the (n, 2) float64 numpy `xy`, indices checked (numpy, not
    torch: a polygon is a few dozen tiny operations, and numpy's are ~5x cheaper)."""
    k = len(indices)
    if k < 3 or len(set(indices)) < k:
        return False
    corners = xy[list(indices)]  # (k, 2)
    e, f = np.triu_indices(k, 1)  # (pairs,), e < f: every pair of vertices, and of edges
    if (corners[e] == corners[f]).all(-1).any():
        return False  # two vertices at the same coordinates
    start, end = corners, np.roll(corners, -1, axis=0)  # (k, 2): edge e runs start[e] -> end[e]
    a, b, c, d = start[e], end[e], start[f], end[f]  # (pairs, 2)
    d1, d2 = _cross(a, b, c), _cross(a, b, d)  # sides of f's ends relative to e
    d3, d4 = _cross(c, d, a), _cross(c, d, b)  # sides of e's ends relative to f
    crossing = (d1 * d2 < 0) & (d3 * d4 < 0)
    touching = (
        ((d1 == 0) & _on_segment(c, a, b))
        | ((d2 == 0) & _on_segment(d, a, b))
        | ((d3 == 0) & _on_segment(a, c, d))
        | ((d4 == 0) & _on_segment(b, c, d))
    )
    meets = crossing | touching  # (pairs,)
    # Consecutive edges share a vertex, so they always "touch"; they only violate simplicity
    # when they overlap along a line, i.e. the far end of one lies on the other.
    follows = f == e + 1  # end[e] == start[f]
    wraps = (e == 0) & (f == k - 1)  # end[f] == start[e]
    overlap_follows = ((d2 == 0) & _on_segment(d, a, b)) | ((d3 == 0) & _on_segment(a, c, d))
    overlap_wraps = ((d1 == 0) & _on_segment(c, a, b)) | ((d4 == 0) & _on_segment(b, c, d))
    bad = np.where(follows, overlap_follows, np.where(wraps, overlap_wraps, meets))
    return not bool(bad.any())


def same_cycle(predicted: Sequence[int], truth: Sequence[int]) -> bool:
    """Whether `predicted` lists `truth`'s cycle in its orientation from any start."""
    if len(predicted) != len(truth):
        return False
    if not truth:
        return True
    doubled = list(truth) * 2
    return any(doubled[r : r + len(truth)] == list(predicted) for r in range(len(truth)))


def hull_metrics(
    points: torch.Tensor, predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]]
) -> dict[str, float]:
    """The convex-hull scores of Table 1 (Section 4.1).

    Args:
        points: (batch, n, 2) coordinates.
        predicted: batch index sequences output by a model, without repeating the first
            vertex at the end.
        truth: batch index sequences from `convex_hull`.

    Returns:
        accuracy: share of predictions equal to the truth as cycles in the same orientation
            (any rotation; a clockwise listing of the right vertices is wrong).
        area_coverage: mean of area(predicted) / area(truth) over the instances whose
            prediction is a simple polygon (and whose true hull has positive area); nan when
            there are none.
        fail_rate: share of predictions that are not a simple polygon.

    Note: the paper counts a prediction accurate only when it is the exact output sequence,
    which starts from the lowest index; any rotation of the right cycle is accepted here, so
    that a model is not penalised for where it starts a correct polygon.
    """
    _check_points("hull_metrics", points, (2,))
    batch, n, _ = points.shape
    for name, lists in (("predicted", predicted), ("truth", truth)):
        if not isinstance(lists, Sequence) or len(lists) != batch:
            fail("hull_metrics", name, f"{batch} index sequences", repr(lists))
        for one in lists:
            _check_indices("hull_metrics", n, one, name)
    if batch == 0:
        fail("hull_metrics", "points", "at least one instance", "batch = 0")
    coords = points.detach().double().cpu().numpy()
    correct, ratios, failures = 0, [], 0
    for xy, guess, label in zip(coords, predicted, truth, strict=True):
        correct += same_cycle(guess, label)
        if not _simple(xy, guess):
            failures += 1
            continue
        true_area = _shoelace(xy, label)
        if true_area > 0:
            ratios.append(_shoelace(xy, guess) / true_area)
    return {
        "accuracy": correct / batch,
        "area_coverage": sum(ratios) / len(ratios) if ratios else float("nan"),
        "fail_rate": failures / batch,
    }
