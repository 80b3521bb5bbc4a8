"""Pointer Network tasks (Vinyals et al. 2015): sort numbers, planar convex hull, planar TSP.

Inputs are drawn uniformly from [0, 1) (numbers for sorting, points in the unit square
otherwise); every batch has one input count n, drawn per step from [n_min, n_max]. Targets:

- `sort_numbers`: the input indices in ascending order of value.
- `convex_hull`: the hull's vertices counter-clockwise from the lowest index, then EOS
  (Vinyals' convention); scored by exact-match accuracy, area coverage and the share of
  outputs that are not a simple polygon ("FAIL"), as the paper's Table 1.
- `tsp`: the optimal tour from node 0 (Held-Karp, exact, n <= 12), in a canonical direction;
  scored by average tour length against the optimum's.

`objective="reinforce"` trains TSP without optimal tours: REINFORCE on the tour length with
the greedy-rollout baseline of Kool, van Hoof & Welling (2019): a frozen copy of the policy,
replaced by the current policy when a paired one-sided t-test on fresh instances says the
policy's greedy tours are shorter (p < 0.05).

Note:
    Kool et al. check the baseline once per epoch of 1.28M instances and warm up with an
    exponential moving-average baseline in the first epoch; here the check runs every
    `baseline_every` steps and the first baseline is the initial policy's greedy rollout.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.hard import reinforce_loss
from attnzoo.tasks import geometry
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    model_device,
    require,
    sampling_generator,
    sampling_seed,
    training_generator,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.label_smoothing",)
KINDS = ("sort_numbers", "convex_hull", "tsp")
OBJECTIVES = ("supervised", "reinforce")
MAX_EXACT_TSP = 12  # Held-Karp sizes: exact tours for training labels and the optimum column


@dataclass(frozen=True)
class PointingConfig:
    HELD_OUT = ("test_sizes", "n_test")  # only scoring reads them (attnzoo eval --set)

    kind: str = "tsp"  # sort_numbers | convex_hull | tsp
    n_min: int = 10  # inputs per training instance: uniform in [n_min, n_max], one n per batch
    n_max: int = 10
    test_sizes: tuple[int, ...] = ()  # input counts evaluated; (): (n_max,)
    # held-out instances per test size: the standard error of a percentage over them,
    # 100 sqrt(p (1 - p) / n_test), is at most 0.5 points at any accuracy p
    n_test: int = 10_000
    objective: str = "supervised"  # supervised | reinforce (tsp only)
    baseline_every: int = 250  # reinforce: steps between checks of the rollout baseline
    baseline_instances: int = 1000  # reinforce: instances of the baseline's t-test
    seed: int = 0  # draws the held-out sets (training batches use the run's seed)

    def __post_init__(self):
        check_fields(self)
        check_counts("PointingConfig", self, non_negative=("seed",))
        if self.kind not in KINDS:
            fail("PointingConfig", "kind", f"one of {list(KINDS)}", repr(self.kind))
        if self.objective not in OBJECTIVES:
            fail("PointingConfig", "objective", f"one of {list(OBJECTIVES)}", repr(self.objective))
        if self.objective == "reinforce" and self.kind != "tsp":
            fail("PointingConfig", "objective", "'supervised' unless kind is 'tsp'", "reinforce")
        smallest = 3 if self.kind == "convex_hull" else 1  # a hull needs three points
        if self.n_min < smallest:
            fail("PointingConfig", "n_min", f"an int >= {smallest} for {self.kind}", self.n_min)
        if self.n_max < self.n_min:
            fail("PointingConfig", "n_max", f"an int >= n_min = {self.n_min}", self.n_max)
        if self.kind == "tsp" and self.objective == "supervised" and self.n_max > MAX_EXACT_TSP:
            fail(
                "PointingConfig",
                "n_max",
                f"<= {MAX_EXACT_TSP} for supervised TSP (exact tours), or objective=reinforce",
                self.n_max,
            )
        for n in self.test_sizes:
            if n < smallest:
                fail("PointingConfig", "test_sizes", f"sizes >= {smallest}", self.test_sizes)
        for name in ("n_test", "baseline_every", "baseline_instances"):
            if getattr(self, name) < 1:
                fail("PointingConfig", name, "a positive int", getattr(self, name))

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.test_sizes or (self.n_max,)

    def unread(self) -> dict[str, str]:
        """The fields this objective never reads -> why (`rundir.unread_keys`): the rollout
        baseline's outside REINFORCE."""
        if self.objective == "reinforce":
            return {}
        return dict.fromkeys(["baseline_every", "baseline_instances"], "objective 'supervised'")


class PointerBatch(NamedTuple):
    points: torch.Tensor  # (batch, n, dim)
    targets: torch.Tensor | None  # (batch, steps) positions; None for REINFORCE
    steps: torch.Tensor | None  # (batch,) target steps that count (through EOS)
    step: int  # the training step that drew the batch
    items: int  # what the loss sums over (target steps; instances for REINFORCE), from the CPU
    rank: int = 0  # the process that drew it (`sampling_seed`)


def draw(kind: str, generator: torch.Generator, batch: int, n: int) -> torch.Tensor:
    return geometry.uniform_points(generator, batch, n, 1 if kind == "sort_numbers" else 2)


def solve(kind: str, points: torch.Tensor) -> list[list[int]]:
    """The true output of every instance, as input indices (no EOS)."""
    if kind == "sort_numbers":
        return geometry.sort_targets(points[..., 0]).tolist()
    if kind == "convex_hull":
        return geometry.convex_hull(points)
    return geometry.held_karp(points)[0].tolist()


class PointingTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over one pointer task. A model of this
    task ("pointer" interface) offers `forward(points, targets) -> output with .log_probs,
    .weights`, `forward(points, sample=True, generator=...) -> sample with .positions,
    .log_prob` (REINFORCE) and `decode(points, beam_size) -> positions`."""

    def __init__(self, config: PointingConfig, *, seed: int = 0, eval_config=None):
        if config.kind == "convex_hull":
            require("scipy.spatial")
        self.config, self.seed = config, seed
        self.eval_config = eval_config
        self.end_token = config.kind == "convex_hull"
        self._test: dict[tuple[str, int], tuple[torch.Tensor, list[list[int]]]] = {}
        self._baseline: torch.nn.Module | None = None
        self._pending: dict[str, torch.Tensor] = {}  # baseline weights restored before use

    def model_dims(self) -> dict:
        return {
            "input_dim": 1 if self.config.kind == "sort_numbers" else 2,
            "end_token": self.end_token,
        }

    # ----- training -----
    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> PointerBatch:
        """Drawn and solved on the CPU, then moved to `device`."""
        g = training_generator(self.seed, step)
        c = self.config
        n = int(torch.randint(c.n_min, c.n_max + 1, (), generator=g))
        points = draw(c.kind, g, batch_size, n)[rank::world]
        move = {"device": device, "non_blocking": True}
        if c.objective == "reinforce":
            return PointerBatch(points.to(**move), None, None, step, points.shape[0], rank)
        targets, steps = self.encode_targets(solve(c.kind, points))
        items = int(steps.sum())
        targets, steps = targets.to(**move), steps.to(**move)
        return PointerBatch(points.to(**move), targets, steps, step, items, rank)

    def encode_targets(self, outputs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input indices -> model positions (batch, steps) with EOS, and the steps that count."""
        off = int(self.end_token)
        rows = [[i + off for i in out] + ([0] if self.end_token else []) for out in outputs]
        width = max(len(r) for r in rows)
        targets = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
        return targets, torch.tensor([len(r) for r in rows])

    def loss(self, model: torch.nn.Module, batch: PointerBatch) -> tuple[torch.Tensor, int]:
        if batch.targets is None:
            return self._reinforce(model, batch)
        out = model(batch.points, batch.targets)
        nll = -out.log_probs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
        position = torch.arange(batch.targets.shape[1], device=batch.targets.device)
        counts = position < batch.steps.unsqueeze(-1)  # (batch, steps)
        return nll.masked_fill(~counts, 0.0).sum(), batch.items

    def _reinforce(self, model, batch: PointerBatch) -> tuple[torch.Tensor, int]:
        """sum over the batch of (L(pi) - L(baseline greedy)) * log p(pi), by the core's
        `reinforce_loss` with reward -L."""
        policy = getattr(model, "module", model)  # DDP wraps the model
        if self._baseline is None:
            self._baseline = copy.deepcopy(policy).requires_grad_(False)
            if self._pending:
                self._baseline.load_state_dict(self._pending)
        seed = sampling_seed(self.seed * 1_000_003 + batch.step + 7, batch.rank)
        g = sampling_generator(batch.points.device).manual_seed(seed)
        sample = model(batch.points, sample=True, generator=g)
        length = geometry.tour_length(batch.points, sample.positions)
        baseline = geometry.tour_length(batch.points, self._baseline.decode(batch.points))
        # reward: minus the tour length; baseline: minus the greedy rollout's (no gradient)
        loss = reinforce_loss(sample.log_prob, -length, -baseline).total
        if (batch.step + 1) % self.config.baseline_every == 0:
            self._update_baseline(policy, batch.step)
        return loss, batch.items

    @torch.no_grad()
    def _update_baseline(self, policy: torch.nn.Module, step: int) -> bool:
        """Kool et al. 2019, sec. 4: replace the baseline when the policy's greedy tours are
        significantly shorter (paired one-sided t-test, alpha 0.05) on fresh instances."""
        stats = require("scipy.stats")
        c = self.config
        g = training_generator(self.seed, step + 11)
        points = draw(c.kind, g, c.baseline_instances, c.n_max).to(model_device(policy))
        was_training = policy.training
        policy.eval()
        ours = geometry.tour_length(points, policy.decode(points))
        theirs = geometry.tour_length(points, self._baseline.decode(points))
        policy.train(was_training)
        test = stats.ttest_rel(ours.cpu().numpy(), theirs.cpu().numpy(), alternative="less")
        better = bool(ours.mean() < theirs.mean() and test.pvalue < 0.05)
        if better:
            self._baseline.load_state_dict(policy.state_dict())
        return better

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The REINFORCE baseline's weights (saved with the checkpoint); empty otherwise."""
        if self._baseline is None:
            return dict(self._pending)
        return dict(self._baseline.state_dict())

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self._pending = dict(tensors)
        if self._baseline is not None and tensors:
            self._baseline.load_state_dict(tensors)

    # ----- evaluation -----
    def test_set(self, n: int, split: str = "test") -> tuple[torch.Tensor, list[list[int]]]:
        """The held-out instances of `split` with n inputs and their true outputs (cached):
        n_test of them, "valid" drawn from other seeds than "test"."""
        if (split, n) not in self._test:
            c = self.config
            stream = 1_000_000_007 if split == "test" else 2_000_000_011
            g = torch.Generator().manual_seed(c.seed * 7919 + n + stream)
            points = draw(c.kind, g, c.n_test, n)
            exact = c.kind != "tsp" or n <= MAX_EXACT_TSP
            self._test[split, n] = (points, solve(c.kind, points) if exact else [])
        return self._test[split, n]

    def predict(self, model, points: torch.Tensor) -> list[list[int]]:
        """Decode (beam_size from the eval config) in batches; input indices per instance."""
        beam = self.eval_config.beam_size if self.eval_config else 1
        size = self.eval_config.batch_size if self.eval_config else 256
        out: list[list[int]] = []
        device = model_device(model)
        for chunk in points.split(size):
            chunk = chunk.to(device, non_blocking=True)
            for row in model.decode(chunk, beam_size=beam).tolist():
                out.append([i for i in row if i >= 0])
        return out

    def evaluate(self, model) -> dict[str, float]:
        metrics: dict[str, float] = {}
        limit = self.eval_config.limit if self.eval_config else 0
        split = self.eval_config.split if self.eval_config else "test"
        for k, n in enumerate(self.config.sizes):
            points, truth = self.test_set(n, split)
            if limit:
                points, truth = points[:limit], truth[:limit]
            predicted = self.predict(model, points)
            scores = self.score(points, predicted, truth)
            metrics.update({f"{key}_n{n}": v for key, v in scores.items()})
            if k == 0:
                metrics.update(scores)
        return metrics

    def score(self, points, predicted: list[list[int]], truth: list[list[int]]) -> dict:
        kind = self.config.kind
        if kind == "sort_numbers":
            exact = sum(p == t for p, t in zip(predicted, truth, strict=True))
            return {"exact_match": 100.0 * exact / len(truth)}
        if kind == "convex_hull":
            m = geometry.hull_metrics(points, predicted, truth)  # nan: no simple polygon
            return {k: None if v != v else 100.0 * float(v) for k, v in m.items()}
        # TSP: an unconstrained decoder (model.mask_chosen=false, the paper's) may repeat a
        # node: such an output is no tour, counted in invalid_pct (as the hull's fail_rate);
        # the lengths and the gap are over the valid tours, paired with their optima
        tours = torch.tensor(predicted, dtype=torch.long)
        valid = geometry.is_tour(tours)
        out: dict = {"invalid_pct": 100.0 * float((~valid).float().mean())}
        if not valid.any():
            out["tour_length"] = None
            if truth:
                out.update(optimal=None, gap_pct=None)
            return out
        length = float(geometry.tour_length(points[valid], tours[valid]).mean())
        out["tour_length"] = length
        if truth:
            best = torch.tensor(truth, dtype=torch.long)[valid]
            optimal = float(geometry.tour_length(points[valid], best).mean())
            out.update(optimal=optimal, gap_pct=100.0 * (length / optimal - 1.0))
        return out

    # ----- pictures -----
    def figures(self, model, folder: Path, count: int = 3) -> list[Path]:
        """figures/pointer.png (+ pointer_1.png ...): the pointer distribution at every
        output step over the inputs, beside the output drawn (tour, hull or sorted values)
        with the true output as a light band under it."""
        from attnzoo.viz import pointer_figure, save_figure

        points, truth = self.test_set(self.config.sizes[0])
        points = points[:count]
        predicted = self.predict(model, points)
        written = []
        for k, weights in enumerate(self.pointer_weights(model, points, predicted)):
            fig = pointer_figure(
                points[k],
                weights,
                predicted[k],
                truth[k] if truth else None,
                self.position_labels(points.shape[1]),
                closed=self.config.kind != "sort_numbers",
                title=f"{self.config.kind}, n = {points.shape[1]}",
            )
            path = Path(folder) / ("pointer.png" if k == 0 else f"pointer_{k}.png")
            save_figure(fig, path)
            written.append(path)
        return written

    def pointer_weights(self, model, points: torch.Tensor, predicted: list[list[int]]):
        """The pointer distribution at every output step of each instance, teacher-forced on
        its predicted output (input indices): (steps, positions) per instance, EOS step and
        position included where the task has them."""
        device = model_device(model)
        for k, output in enumerate(predicted):
            targets, _ = self.encode_targets([output])
            one = points[k : k + 1].to(device)  # (1, n, dim)
            yield model(one, targets.to(device)).weights[0]  # (steps, positions)

    def position_labels(self, n: int) -> list[str]:
        """The model's positions for n inputs: "end" first where the task has EOS."""
        return ["end"] * self.end_token + [str(i) for i in range(n)]

    @torch.no_grad()
    def explore(self, model, count: int) -> dict:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`, layout "points"): the
        first `count` held-out instances of the figures' size, decoded as `evaluate` decodes,
        with the pointer distribution at every step of the predicted output over the input
        positions (`pointer_weights`)."""
        points, truth = self.test_set(self.config.sizes[0])
        points = points[:count]
        predicted = self.predict(model, points)
        off = int(self.end_token)
        n = points.shape[1]
        labels = self.position_labels(n)
        items = []
        for k, weights in enumerate(self.pointer_weights(model, points, predicted)):
            chosen = [i + off for i in predicted[k]] + [0] * self.end_token  # (steps,)
            steps = [f"{s + 1}: {labels[c]}" for s, c in enumerate(chosen)]
            true = truth[k] if truth else None
            items.append(
                {
                    "input": " ".join(_coordinates(p) for p in points[k].tolist()),
                    "reference": " ".join(map(str, true)) if true is not None else "(unknown)",
                    "prediction": " ".join(map(str, predicted[k])),
                    "correct": None if true is None else self._right(points[k], predicted[k], true),
                    "attention": [
                        {
                            "name": "pointer distribution",
                            "rows": steps,
                            "columns": labels,
                            "weights": weights.float().cpu()[
                                None, None
                            ],  # (1, 1, steps, positions)
                        }
                    ],
                    "points": points[k],
                    "column_points": [None] * off + list(range(n)),
                    "output": chosen,
                    "truth": true,
                    "closed": self.config.kind != "sort_numbers",
                }
            )
        kind = self.config.kind.replace("_", " ")
        return {
            "layout": "points",
            "title": f"{kind}: {len(items)} held-out instances of {n} inputs",
            "note": "The pointer distribution at every step of the predicted output "
            "(teacher-forced on it); the output so far drawn red, the true one dashed",
            "examples": items,
        }

    def _right(self, points: torch.Tensor, predicted: list[int], truth: list[int]) -> bool:
        """Whether a prediction is right as the scores count it: an optimal tour (any start or
        direction), the hull's vertices as a cycle of the same orientation (any start:
        `hull_metrics`), the sorted order exactly."""
        if self.config.kind == "convex_hull":
            return geometry.same_cycle(predicted, truth)
        if self.config.kind != "tsp":
            return predicted == truth
        if sorted(predicted) != list(range(len(points))):
            return False
        tours = torch.tensor([predicted, truth])  # (2, n)
        length = geometry.tour_length(points.expand(2, -1, -1), tours)  # (2,)
        return bool(length[0] <= length[1] + 1e-6)


def _coordinates(point: list[float]) -> str:
    return f"{point[0]:.2f}" if len(point) == 1 else f"({point[0]:.2f}, {point[1]:.2f})"


def make_task(config: PointingConfig, *, seed: int, eval_config: EvalConfig) -> PointingTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return PointingTask(config, seed=seed, eval_config=eval_config)
