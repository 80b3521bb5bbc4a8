"""Generated bit-vector tasks of the Neural Turing Machine (Graves et al. 2014, sec. 4).

- "copy" (sec. 4.1): L random `bits`-bit vectors, then a delimiter on its own channel; the
  model must then output the L vectors with no input.
- "repeat_copy" (sec. 4.2): L vectors, then the delimiter with the repeat count K on another
  channel (normalised to mean 0 and variance 1 over the training counts, as in the paper);
  the model must output the sequence K times, then an end marker on an extra output channel.
- "associative_recall" (sec. 4.3): L items of `item_len` vectors, each item led by a
  delimiter; then a query item between two query delimiters; the model must output the item
  that followed the query item.

Inputs and targets are float tensors (batch, T, channels); the loss and the metric cover the
output phase only (`mask`). Training batches draw one length (and one repeat count) per step:
every sequence of a batch has the same shape, so there is no padding and the NTM's step loop
runs over exactly T steps. The held-out set holds `n_test_per_length` sequences of every
length in [min_len, max_len] (the mean over it is the mean over uniformly drawn lengths), and
as many of each of `test_lengths` (generalisation to longer sequences, Graves Fig. 4).

The metric is Graves's: bit errors per sequence, the number of output-phase bits whose
sigmoid output thresholded at 0.5 differs from the target, averaged over sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import check_fields, fail
from attnzoo.core.normalisers import at_least_float32
from attnzoo.tasks.base import (
    EvalConfig,
    check_counts,
    held_out_generator,
    model_device,
    training_generator,
)

# config keys this task never reads: `attnzoo --set` refuses them (rundir.unread_keys)
UNREAD = ("eval.beam_size", "eval.label_smoothing", "eval.limit")
KINDS = ("copy", "repeat_copy", "associative_recall")


@dataclass(frozen=True)
class BitsConfig:
    """One of the bit tasks (see the module docstring).

    Attributes:
        kind: "copy", "repeat_copy" or "associative_recall".
        bits: width of each random vector.
        min_len, max_len: training lengths, drawn uniformly: vectors (copy, repeat copy) or
            items (associative recall; the paper trains on 2-6).
        test_lengths: extra held-out lengths, reported as `bit_errors_len{L}`.
        min_repeats, max_repeats: repeat counts of repeat_copy (the paper: 1-10).
        item_len: vectors per item of associative_recall (the paper: 3).
        n_test_per_length: held-out sequences per length; the mean bit errors at one
            length have standard error sd / sqrt(n_test_per_length), sd being the spread
            of a sequence's bit errors (an untrained model's, ~Binomial(bits L, 1/2), has
            sd sqrt(bits L) / 2: 6.3 bits at L = 20).
        seed: the held-out set (the training batches follow `train.seed`).
    """

    HELD_OUT = ("test_lengths", "n_test_per_length")  # only scoring reads them (attnzoo eval --set)

    kind: str = "copy"
    bits: int = 8
    min_len: int = 1
    max_len: int = 20
    test_lengths: tuple[int, ...] = (40,)
    min_repeats: int = 1
    max_repeats: int = 10
    item_len: int = 3
    n_test_per_length: int = 256
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts("BitsConfig", self, non_negative=("seed",))
        if self.kind not in KINDS:
            fail("BitsConfig", "kind", f"one of {list(KINDS)}", repr(self.kind))
        for name in ("bits", "min_len", "max_len", "min_repeats", "max_repeats", "item_len"):
            _positive(name, getattr(self, name))
        _positive("n_test_per_length", self.n_test_per_length)
        if self.max_len < self.min_len:
            fail("BitsConfig", "max_len", f"at least min_len = {self.min_len}", self.max_len)
        if self.max_repeats < self.min_repeats:
            fail(
                "BitsConfig",
                "max_repeats",
                f"at least min_repeats = {self.min_repeats}",
                self.max_repeats,
            )
        if self.kind == "associative_recall" and self.min_len < 2:
            fail("BitsConfig", "min_len", "at least 2 items for associative_recall", self.min_len)
        for length in self.test_lengths:
            _positive("test_lengths", length)
            if self.kind == "associative_recall" and length < 2:
                fail("BitsConfig", "test_lengths", "lengths of at least 2 items", length)

    def unread(self) -> dict[str, str]:
        """The fields this kind never reads -> why (`rundir.unread_keys`: `--set` refuses
        them): the repeat counts outside repeat_copy, the item length outside
        associative_recall."""
        why = f"kind {self.kind!r}"
        names = [] if self.kind == "repeat_copy" else ["min_repeats", "max_repeats"]
        names += [] if self.kind == "associative_recall" else ["item_len"]
        return dict.fromkeys(names, why)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail("BitsConfig", name, "a positive int", value)


class BitsBatch(NamedTuple):
    inputs: torch.Tensor  # (batch, T, input_size)
    targets: torch.Tensor  # (batch, T, output_size)
    mask: torch.Tensor  # (batch, T) bool, True = output phase (scored)

    def to(self, device: torch.device | str) -> BitsBatch:
        return BitsBatch(*(t.to(device, non_blocking=True) for t in self))


def dims(config: BitsConfig) -> dict[str, int]:
    """The model sizes of a task: input and output channels."""
    b = config.bits
    return {
        "copy": {"input_size": b + 1, "output_size": b},
        "repeat_copy": {"input_size": b + 2, "output_size": b + 1},
        "associative_recall": {"input_size": b + 2, "output_size": b},
    }[config.kind]


def generate(
    config: BitsConfig, batch: int, length: int, generator: torch.Generator, repeats: int = 1
) -> BitsBatch:
    """`batch` sequences of `length` (vectors or items) of `config.kind`; `repeats` is K of
    repeat_copy."""
    bits = config.bits
    if config.kind == "associative_recall":
        return _associative_recall(config, batch, length, generator)
    seq = torch.randint(0, 2, (batch, length, bits), generator=generator).float()  # (b, L, bits)
    out_len = length * repeats + 1 if config.kind == "repeat_copy" else length
    steps = length + 1 + out_len
    d = dims(config)
    inputs = torch.zeros(batch, steps, d["input_size"])
    targets = torch.zeros(batch, steps, d["output_size"])
    inputs[:, :length, :bits] = seq
    inputs[:, length, bits] = 1.0  # the delimiter
    if config.kind == "copy":
        targets[:, length + 1 :] = seq
    else:
        inputs[:, length, bits + 1] = normalised_repeats(config, repeats)
        targets[:, length + 1 : steps - 1, :bits] = seq.repeat(1, repeats, 1)  # (b, L K, bits)
        targets[:, -1, bits] = 1.0  # the end marker
    mask = torch.zeros(batch, steps, dtype=torch.bool)
    mask[:, length + 1 :] = True
    return BitsBatch(inputs, targets, mask)


def normalised_repeats(config: BitsConfig, repeats: int) -> float:
    """K as the repeat-count channel shows it: (K - mean) / std of the uniform training
    counts (std 1 when there is one count)."""
    lo, hi = config.min_repeats, config.max_repeats
    std = math.sqrt(((hi - lo + 1) ** 2 - 1) / 12) or 1.0
    return (repeats - (lo + hi) / 2) / std


def _associative_recall(config, batch, n_items, generator) -> BitsBatch:
    bits, il = config.bits, config.item_len
    items = torch.randint(0, 2, (batch, n_items, il, bits), generator=generator).float()
    query = torch.randint(0, n_items - 1, (batch,), generator=generator)  # (b,)
    rows = torch.arange(batch)
    # 1. the items, each led by a delimiter step on channel `bits`
    body = torch.zeros(batch, n_items, il + 1, bits + 2)
    body[:, :, 0, bits] = 1.0
    body[:, :, 1:, :bits] = items
    body = body.reshape(batch, n_items * (il + 1), bits + 2)  # (b, n (il + 1), bits + 2)
    # 2. the query item between two query delimiters (channel bits + 1), then silence
    tail = torch.zeros(batch, 2 * il + 2, bits + 2)
    tail[:, 0, bits + 1] = 1.0
    tail[:, 1 : il + 1, :bits] = items[rows, query]  # (b, il, bits)
    tail[:, il + 1, bits + 1] = 1.0
    inputs = torch.cat([body, tail], dim=1)  # (b, T, bits + 2)
    steps = inputs.shape[1]
    targets = torch.zeros(batch, steps, bits)
    targets[:, steps - il :] = items[rows, query + 1]  # the item after the query
    mask = torch.zeros(batch, steps, dtype=torch.bool)
    mask[:, steps - il :] = True
    return BitsBatch(inputs, targets, mask)


class BitsTask:
    """The Task protocol (`attnzoo.tasks.base.Task`) over a bit task. A model of this task
    ("bits" interface) offers `forward(inputs, return_weights=False) -> output with .logits`
    (and, for the figures, optionally the NTM's `.write_weights`, `.read_weights`, `.adds`,
    `.reads`, `.memory`).

    Args:
        config: `BitsConfig`.
        seed: draws the training batches; step s's batch depends only on (seed, s).
        eval_config: `batch_size` is the number of held-out sequences per forward pass;
            `split` picks the held-out draw ("valid" from other seeds than "test"), each
            sized by `config.n_test_per_length`; `limit`, `beam_size` and `label_smoothing`
            are unused.
    """

    metric = "bit_errors"

    def __init__(self, config: BitsConfig, *, seed: int, eval_config: EvalConfig):
        self.config, self.seed, self.eval = config, seed, eval_config
        self._held_out: dict[int, BitsBatch] | None = None

    def model_dims(self) -> dict[str, int]:
        return dims(self.config)

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> BitsBatch:
        """The global batch of `step`, one length (and repeat count) for all its sequences;
        this process's rows, generated on the CPU and moved to `device`."""
        c = self.config
        g = training_generator(self.seed, step)
        length = int(torch.randint(c.min_len, c.max_len + 1, (), generator=g))
        repeats = int(torch.randint(c.min_repeats, c.max_repeats + 1, (), generator=g))
        full = generate(c, batch_size, length, g, repeats)
        return BitsBatch(*(t[rank::world] for t in full)).to(device)

    def loss(self, model, batch: BitsBatch) -> tuple[torch.Tensor, int]:
        """Sigmoid cross-entropy (nats) summed over the output-phase bits of every sequence,
        and the number of sequences (so the logged loss is nats per sequence)."""
        logits = at_least_float32(model(batch.inputs).logits)  # (b, T, output_size)
        bce = F.binary_cross_entropy_with_logits(logits, batch.targets, reduction="none")
        return (bce * batch.mask.unsqueeze(-1)).sum(), batch.inputs.shape[0]

    def held_out(self) -> dict[int, list[BitsBatch]]:
        """Length -> the held-out sequences of that length, grouped by shape (one group per
        repeat count for repeat_copy). Built once, from `config.seed` and eval.split."""
        if self._held_out is None:
            c = self.config
            # (from seeds no training step uses: the earlier 2**40 + seed was read as seed)
            g = held_out_generator(c.seed, self.eval.split)
            lengths = sorted({*range(c.min_len, c.max_len + 1), *c.test_lengths})
            held = {}
            for length in lengths:
                singles = [
                    generate(
                        c,
                        1,
                        length,
                        g,
                        int(torch.randint(c.min_repeats, c.max_repeats + 1, (), generator=g)),
                    )
                    for _ in range(c.n_test_per_length)
                ]
                groups: dict[int, list[BitsBatch]] = {}
                for s in singles:
                    groups.setdefault(s.inputs.shape[1], []).append(s)
                held[length] = [
                    BitsBatch(*(torch.cat(parts) for parts in zip(*group, strict=True)))
                    for group in groups.values()
                ]
            self._held_out = held
        return self._held_out

    def errors(self, model, batch: BitsBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per sequence: (bit errors over the output phase, summed cross-entropy in nats)."""
        logits = at_least_float32(model(batch.inputs).logits)  # (b, T, output_size)
        wrong = ((logits > 0).float() != batch.targets) & batch.mask.unsqueeze(-1)
        bce = F.binary_cross_entropy_with_logits(logits, batch.targets, reduction="none")
        return wrong.sum((1, 2)).float(), (bce * batch.mask.unsqueeze(-1)).sum((1, 2))

    def evaluate(self, model) -> dict[str, float]:
        """{"bit_errors": mean bit errors per sequence over lengths min_len..max_len, "loss":
        nats per sequence over them, "exact": the fraction with no bit wrong,
        "bit_errors_len{L}": the mean at each length L of the held-out set}."""
        c = self.config
        per_length: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        device = model_device(model)
        with torch.no_grad():
            for length, groups in self.held_out().items():
                errs, nats = [], []
                for group in groups:
                    for start in range(0, group.inputs.shape[0], self.eval.batch_size):
                        part = BitsBatch(*(t[start : start + self.eval.batch_size] for t in group))
                        part = part.to(device)
                        e, n = self.errors(model, part)
                        errs.append(e)
                        nats.append(n)
                per_length[length] = (torch.cat(errs), torch.cat(nats))
        train_range = [per_length[k] for k in range(c.min_len, c.max_len + 1)]
        errors = torch.cat([e for e, _ in train_range])
        nats = torch.cat([n for _, n in train_range])
        result = {
            "bit_errors": float(errors.mean()),
            "loss": float(nats.mean()),
            "exact": float((errors == 0).float().mean()),
        }
        lengths = sorted({c.min_len, c.max_len, *c.test_lengths})
        for length in lengths:
            result[f"bit_errors_len{length}"] = float(per_length[length][0].mean())
        return result

    def figures(self, model, folder: Path, count: int = 3) -> list[Path]:
        """Graves 2014 Fig. 6 for held-out examples: `count` figures, the first of length
        max_len, then the test lengths, longest first; memory_{kind}_len{L}.png."""
        from attnzoo.viz import memory_figure, save_figure

        c = self.config
        longest_first = sorted(c.test_lengths, reverse=True)
        lengths = list(dict.fromkeys([c.max_len, *longest_first]))[: max(1, count)]
        written = []
        for length in lengths:
            example = BitsBatch(*(t[:1] for t in self.held_out()[length][0]))
            example, out, outputs, errors = self.run_one(model, example)
            extra = {}
            if getattr(out, "write_weights", None) is not None:
                extra = dict(
                    adds=out.adds[0, :, 0],  # first write head: (T, M)
                    reads=out.reads[0, :, 0],  # first read head: (T, M)
                    write_weights=out.write_weights[0, :, 0],  # (T, N)
                    read_weights=out.read_weights[0, :, 0],  # (T, N)
                    memory=out.memory[0, -1],  # after the last step: (N, M)
                )
            title = f"{c.kind}, length {length}: {errors} bit errors"
            fig = memory_figure(
                example.inputs[0],
                example.targets[0],
                outputs,
                mask=example.mask[0],
                title=title,
                **extra,
            )
            path = Path(folder) / f"memory_{c.kind}_len{length}.png"
            save_figure(fig, path)
            written.append(path)
        return written

    def run_one(self, model, example: BitsBatch):
        """One held-out sequence (a batch of 1) through the model with its weightings: the
        sequence on the model's device, the output (`.read_weights`, `.write_weights`, ... for
        a memory model), the sigmoid outputs (T, output_size) and its bit errors."""
        example = example.to(model_device(model))
        out = model(example.inputs, return_weights=True)
        outputs = torch.sigmoid(out.logits[0].float())  # (T, output_size)
        return example, out, outputs, int(self.errors(model, example)[0][0])

    @torch.no_grad()
    def explore(self, model, count: int) -> dict:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`, layout "memory"):
        `count` held-out sequences, one of each length in turn (the figures' lengths first:
        max_len, then the test lengths longest first), with every read and write head's
        weighting over the memory rows at every step, and the step's inputs, targets and
        outputs as signals; no weightings for a model without memory."""
        c = self.config
        held = self.held_out()
        first = [c.max_len, *sorted(c.test_lengths, reverse=True)]
        lengths = list(dict.fromkeys([*first, *sorted(held, reverse=True)]))
        singles = {
            length: [
                BitsBatch(*(t[i : i + 1] for t in g))
                for g in held[length]
                for i in range(len(g.inputs))
            ]
            for length in lengths
        }
        chosen = []
        for turn in range(max(len(v) for v in singles.values())):
            chosen += [(n, singles[n][turn]) for n in lengths if turn < len(singles[n])]
        items = []
        for length, example in chosen[:count]:
            example, out, outputs, errors = self.run_one(model, example)
            steps = example.inputs.shape[1]
            mask = example.mask[0].tolist()
            rows = [f"{t + 1} ({'out' if m else 'in'})" for t, m in enumerate(mask)]
            kinds = []
            for name, field in (("read", "read_weights"), ("write", "write_weights")):
                weights = getattr(out, field, None)  # (1, T, heads, N)
                if weights is not None:
                    memory_rows = [str(i) for i in range(weights.shape[-1])]
                    kinds.append(
                        {
                            "name": f"{name} weightings",
                            "rows": rows,
                            "columns": memory_rows,
                            # (1, heads, T, N): the heads are the explorer's heads
                            "weights": weights[0].transpose(0, 1)[None].float().cpu(),
                        }
                    )
            items.append(
                {
                    "input": f"{c.kind.replace('_', ' ')}, length {length}: {steps} steps",
                    "reference": f"{int(example.mask[0].sum())} output steps of "
                    f"{example.targets.shape[-1]} bits",
                    "prediction": f"{errors} bit errors",
                    "correct": errors == 0,
                    "attention": kinds,
                    "signals": {
                        "inputs": example.inputs[0].float().cpu(),
                        "targets": example.targets[0].float().cpu(),
                        "outputs": outputs.cpu(),
                    },
                }
            )
        return {
            "layout": "memory",
            "title": f"{c.kind.replace('_', ' ')}: {len(items)} held-out sequences",
            "note": "Columns are memory rows; heads are the read or write heads",
            "examples": items,
        }


def make_task(config: BitsConfig, *, seed: int, eval_config: EvalConfig) -> BitsTask:
    """The task of this module's registry entries (`TaskSpec.build`)."""
    return BitsTask(config, seed=seed, eval_config=eval_config)
