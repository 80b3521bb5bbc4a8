"""Shared pieces of the sequence-to-sequence text tasks: examples, vocabulary, metrics.

A task module (`dates`, `numbers`, `kjv2web`) turns its source data into `Example`s of string
tokens and returns them as `Splits`; `Vocab` maps tokens to ids for a model; the metrics score
decoded outputs. Nothing here touches the disk or the network.

Metrics:
- `exact_match`: the fraction of output sequences equal to their reference, token for token.
- `bleu`, `chrf`: corpus BLEU (Papineni et al., 2002) and chrF (Popovic, 2015) computed by
  sacrebleu on detokenised strings, so that scores are comparable with published numbers.
- `alignment_score`: how often the attention argmax of a target position falls inside the
  source span the target token was generated from (the alignment-error view of Bahdanau et al.,
  2015, Section 5.2.1, on data whose alignment is known by construction).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnzoo.tasks.base import require

Span = tuple[int, int]
# a target token's source: one span, or several where any of them is right (a sort's equal
# symbols, whose order among themselves nothing in the output tells)
Alignment = Span | tuple[Span, ...]


@dataclass(frozen=True)
class Example:
    """One source/target pair of string tokens.

    Attributes:
        source: the input tokens, (source_len,).
        target: the output tokens, (target_len,).
        spans: for each target token, the half-open range [start, end) of source positions it
            comes from, a tuple of such ranges where it may come from any of them, or None for
            a target token with no source counterpart (a separator). spans itself is None for
            a task whose alignment is unknown.
    """

    source: tuple[str, ...]
    target: tuple[str, ...]
    spans: tuple[Alignment | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.spans is None:
            return
        if len(self.spans) != len(self.target):
            raise ValueError(f"{len(self.spans)} spans for {len(self.target)} target tokens")
        for span in filter(None, self.spans):
            for start, end in ranges(span):
                if not 0 <= start < end <= len(self.source):
                    raise ValueError(f"span {span} outside a source of length {len(self.source)}")


def ranges(span: Alignment) -> tuple[Span, ...]:
    """The ranges of one target token's `Alignment`."""
    return (span,) if isinstance(span[0], int) else span


@dataclass(frozen=True)
class Splits:
    """The train, validation and test examples of one task."""

    train: list[Example]
    valid: list[Example]
    test: list[Example]


class Vocab:
    """A token <-> id mapping with the four special tokens first.

    Ids 0..3 are always `<pad>`, `<bos>`, `<eos>`, `<unk>`; the rest follow in the order given
    (by `build`: frequency, most frequent first, ties broken by the token string).
    """

    PAD, BOS, EOS, UNK = 0, 1, 2, 3
    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

    def __init__(self, tokens: Iterable[str]) -> None:
        """Args: tokens: all tokens by id, starting with `Vocab.SPECIALS`."""
        self._itos = tuple(tokens)
        if self._itos[: len(self.SPECIALS)] != self.SPECIALS:
            raise ValueError(f"a Vocab must start with {self.SPECIALS}")
        self._stoi = {token: i for i, token in enumerate(self._itos)}
        if len(self._stoi) != len(self._itos):
            raise ValueError("duplicate tokens in a Vocab")

    @classmethod
    def build(
        cls, sequences: Iterable[Sequence[str]], max_size: int | None = None, min_freq: int = 1
    ) -> Vocab:
        """Count tokens over `sequences` and keep the frequent ones.

        Args:
            sequences: token sequences, e.g. the sources of the training split.
            max_size: the largest `len(vocab)`, the four special tokens included (so it is the
                embedding table's row count); None keeps every token with `min_freq`.
            min_freq: tokens seen fewer times map to `<unk>`.
        """
        counts = Counter(token for sequence in sequences for token in sequence)
        for special in cls.SPECIALS:
            counts.pop(special, None)
        ranked = sorted(
            (token for token, n in counts.items() if n >= min_freq),
            key=lambda token: (-counts[token], token),
        )
        if max_size is not None:
            if max_size < len(cls.SPECIALS):
                raise ValueError(f"max_size must be at least {len(cls.SPECIALS)}")
            ranked = ranked[: max_size - len(cls.SPECIALS)]
        return cls((*cls.SPECIALS, *ranked))

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._itos == other._itos

    def __hash__(self) -> int:
        return hash(self._itos)

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)})"

    @property
    def tokens(self) -> tuple[str, ...]:
        """All tokens, indexed by id."""
        return self._itos

    def encode(
        self, tokens: Iterable[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[int]:
        """Token ids of `tokens`; a token not in the vocabulary becomes `UNK`."""
        ids = [self._stoi.get(token, self.UNK) for token in tokens]
        if add_bos:
            ids.insert(0, self.BOS)
        if add_eos:
            ids.append(self.EOS)
        return ids

    def decode(self, ids: Iterable[int] | Any) -> list[str]:
        """Tokens of `ids` up to the first `EOS`. `PAD` and `BOS`, which no output should
        hold before its end, appear as "<pad>" and "<bos>": skipping them scored a decoder
        that wrote them as one that had not.

        Args:
            ids: ints, or a 1-d tensor or array of them, (seq_len,).
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        tokens = []
        for i in ids:
            i = int(i)
            if i == self.EOS:
                break
            tokens.append(self._itos[i])
        return tokens

    def to_dict(self) -> dict[str, list[str]]:
        """A JSON-ready form; `Vocab.from_dict` inverts it."""
        return {"tokens": list(self._itos)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Sequence[str]]) -> Vocab:
        return cls(d["tokens"])


def alignment_score(weights: Any, spans: Sequence[Alignment | None]) -> tuple[int, int]:
    """Count target positions whose attention argmax lies inside their known source span (any
    of its ranges, where it has several).

    Args:
        weights: attention weights of one example, (target_len, source_len), a tensor or an
            array. Rows may be longer than the example (padding); they are not looked at.
        spans: `Example.spans`, one per target token.

    Returns:
        (hits, counted): counted is the number of positions t < target_len with a span that
        is not None, hits how many of them have argmax_j weights[t, j] in [start, end) of
        one of its ranges.

    Note: ties go to the first maximal source position (numpy's argmax).
    """
    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    weights = np.asarray(weights)
    if weights.ndim != 2:
        raise ValueError(f"weights must be (target_len, source_len), got shape {weights.shape}")
    best = weights.argmax(axis=1)  # (target_len,)
    hits = counted = 0
    for t, span in enumerate(spans[: weights.shape[0]]):
        if span is None:
            continue
        counted += 1
        hits += any(start <= best[t] < end for start, end in ranges(span))
    return hits, counted


def exact_match(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """The fraction of predictions equal to their reference, as whole token sequences."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        raise ValueError("exact_match of no examples")
    same = sum(list(p) == list(r) for p, r in zip(predictions, references, strict=True))
    return same / len(references)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU in [0, 100] with one reference per hypothesis.

    sacrebleu's `corpus_bleu` with its defaults: the 13a tokenizer (mteval's), exponential
    smoothing, case-sensitive. Inputs are detokenised strings (the task's `detokenize`).
    A corpus with no 4-gram at all (e.g. only 3-word sentences) scores 0.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    sacrebleu = require("sacrebleu")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF in [0, 100] (sacrebleu's `corpus_chrf` defaults: character 6-grams,
    beta = 2, no word n-grams) on detokenised strings, one reference per hypothesis."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    sacrebleu = require("sacrebleu")
    return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)
