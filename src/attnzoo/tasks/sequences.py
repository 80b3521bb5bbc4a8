"""Generated symbol-sequence tasks: copy, reverse, sort.

Sources are random strings of symbols "0".."V-1" with lengths drawn uniformly from
[min_len, max_len]; the target is the same symbols copied, reversed or sorted (by symbol id,
stable). Each target token's span is the source position it comes from, so alignment can be
scored: the diagonal for copy, the anti-diagonal for reverse, a permutation for sort. A sorted
symbol that occurs more than once may come from any of its positions (its spans are all of
them): the output does not tell equal symbols apart, so attending to either copy is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnzoo.core.checks import check_fields, fail
from attnzoo.tasks.base import EvalConfig, check_counts
from attnzoo.tasks.text import Example, Splits
from attnzoo.tasks.translation import TranslationTask

KINDS = ("copy", "reverse", "sort")


@dataclass(frozen=True)
class SequenceConfig:
    kind: str = "reverse"  # copy | reverse | sort
    symbols: int = 20
    min_len: int = 4
    max_len: int = 20
    n_train: int = 20_000
    n_valid: int = 500
    n_test: int = 1_000
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_counts("SequenceConfig", self, ("n_train",), ("n_valid", "n_test", "seed"))
        if self.kind not in KINDS:
            fail("SequenceConfig", "kind", f"one of {list(KINDS)}", repr(self.kind))
        if self.min_len < 1:
            fail("SequenceConfig", "min_len", "a positive int", self.min_len)
        if self.max_len < self.min_len:
            fail("SequenceConfig", "max_len", f"an int >= min_len = {self.min_len}", self.max_len)
        if self.symbols < 2:
            fail("SequenceConfig", "symbols", "at least 2", self.symbols)


def make_example(ids: Sequence[int], kind: str) -> Example:
    source = tuple(str(i) for i in ids)
    n = len(ids)
    if kind == "copy":
        order = list(range(n))
    elif kind == "reverse":
        order = list(range(n - 1, -1, -1))
    else:
        order = sorted(range(n), key=lambda p: (ids[p], p))
    # each token's source position; a sorted token may come from any position holding its symbol
    where = {p: ((p, p + 1),) for p in range(n)}
    if kind == "sort":
        where = {p: tuple((q, q + 1) for q in range(n) if ids[q] == ids[p]) for p in range(n)}
    spans = tuple(w if len(w := where[p]) > 1 else w[0] for p in order)
    return Example(source, tuple(source[p] for p in order), spans)


def make_splits(config: SequenceConfig | None = None) -> Splits:
    """Deterministic given the seed; held-out sources never occur in train."""
    config = config or SequenceConfig()
    g = torch.Generator().manual_seed(config.seed)
    seen: set[tuple[int, ...]] = set()
    out: list[list[Example]] = []
    for n in (config.n_test, config.n_valid, config.n_train):  # held-out first: stable sets
        examples: list[Example] = []
        attempts = 0
        while len(examples) < n:
            attempts += 1
            if attempts > 50 * max(n, 1):
                fail(
                    "sequences.make_splits",
                    "config",
                    "enough distinct sequences",
                    f"only {len(examples)} of {n} for {config}",
                )
            length = int(torch.randint(config.min_len, config.max_len + 1, (), generator=g))
            ids = tuple(torch.randint(config.symbols, (length,), generator=g).tolist())
            if ids in seen:
                continue
            seen.add(ids)
            examples.append(make_example(ids, config.kind))
        out.append(examples)
    test, valid, train = out
    return Splits(train, valid, test)


def detokenize(tokens: Sequence[str]) -> str:
    return " ".join(tokens)


def make_task(config: SequenceConfig, *, seed: int, eval_config: EvalConfig) -> TranslationTask:
    """The task the runs layer builds: this module's splits, scored by exact_match."""
    return TranslationTask(
        make_splits(config), detokenize, metric="exact_match", seed=seed, eval_config=eval_config
    )
