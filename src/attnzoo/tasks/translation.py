"""The sequence-to-sequence task adapter: any `Splits` of token examples becomes a task for the
training loop (batches, the loss, the metrics) and for the figures (alignments).

dates, numbers and kjv2web differ only in their data and their metric; this file is where the
three meet the models, so no model or task carries that code twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnzoo.decoding import decode
from attnzoo.tasks.text import Splits, Vocab, alignment_score, bleu, chrf, exact_match


@dataclass
class Batch:
    source: torch.Tensor  # (b, j) ids, 0-padded, ending in EOS
    lengths: torch.Tensor  # (b,)
    target_in: torch.Tensor  # (b, t) BOS + target
    target_out: torch.Tensor  # (b, t) target + EOS


@dataclass(frozen=True)
class EvalConfig:
    split: str = "test"  # valid | test
    limit: int = 0  # 0: the whole split
    beam_size: int = 1  # 1: greedy
    batch_size: int = 256
    label_smoothing: float = 0.0


class TranslationTask:
    """Args:
    splits: the task's examples.
    detokenize: tokens -> string, for BLEU/chrF and display.
    metric: "exact_match" or "bleu" (the headline metric; the others are reported too).
    seed: draws the training batches; step s's batch depends only on (seed, s).
    max_vocab: vocabulary cap per side (None: every training token).
    """

    def __init__(
        self,
        splits: Splits,
        detokenize: Callable[[Sequence[str]], str],
        *,
        metric: str,
        seed: int,
        eval_config: EvalConfig,
        max_vocab: int | None = None,
    ):
        self.splits, self.detokenize, self.metric = splits, detokenize, metric
        self.seed, self.eval = seed, eval_config
        self.source_vocab = Vocab.build((e.source for e in splits.train), max_size=max_vocab)
        self.target_vocab = Vocab.build((e.target for e in splits.train), max_size=max_vocab)
        self.max_target_len = max(len(e.target) for e in splits.train) + 1
        self.max_source_len = (
            max(len(e.source) for e in (*splits.train, *splits.valid, *splits.test)) + 1
        )
        self._train = [self._encode(e) for e in splits.train]

    def _encode(self, example) -> tuple[list[int], list[int]]:
        return (
            self.source_vocab.encode(example.source, add_eos=True),
            self.target_vocab.encode(example.target),
        )

    def collate(self, pairs: Sequence[tuple[list[int], list[int]]]) -> Batch:
        b = len(pairs)
        j = max(len(s) for s, _ in pairs)
        t = max(len(y) for _, y in pairs) + 1
        source = torch.zeros(b, j, dtype=torch.long)
        target_in = torch.zeros(b, t, dtype=torch.long)
        target_out = torch.zeros(b, t, dtype=torch.long)
        for r, (s, y) in enumerate(pairs):
            source[r, : len(s)] = torch.tensor(s)
            target_in[r, : len(y) + 1] = torch.tensor([Vocab.BOS, *y])
            target_out[r, : len(y) + 1] = torch.tensor([*y, Vocab.EOS])
        lengths = torch.tensor([len(s) for s, _ in pairs])
        return Batch(source, lengths, target_in, target_out)

    def batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        index = torch.randint(len(self._train), (batch_size,), generator=g)
        return self.collate([self._train[i] for i in index[rank::world].tolist()])

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, int]:
        logits = model(batch.source, batch.lengths, batch.target_in).logits  # (b, t, V)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            batch.target_out.reshape(-1),
            ignore_index=Vocab.PAD,
            reduction="sum",
            label_smoothing=self.eval.label_smoothing,
        )
        return loss, int((batch.target_out != Vocab.PAD).sum())

    def examples(self, split: str | None = None):
        examples = getattr(self.splits, split or self.eval.split)
        return examples[: self.eval.limit] if self.eval.limit else examples

    def translate(self, model, examples) -> list[list[str]]:
        """Decode with the shared engine (greedy, or beam search when beam_size > 1)."""
        outputs = []
        for start in range(0, len(examples), self.eval.batch_size):
            chunk = examples[start : start + self.eval.batch_size]
            batch = self.collate([self._encode(e) for e in chunk])
            state = model.start(model.encode(batch.source, batch.lengths))
            ids = decode(
                model.decode_step,
                state,
                len(chunk),
                bos=Vocab.BOS,
                eos=Vocab.EOS,
                max_len=self.max_target_len + 5,
                device=batch.source.device,
                beam_size=self.eval.beam_size,
            )
            outputs += [self.target_vocab.decode(row) for row in ids.tolist()]
        return outputs

    def alignments(self, model, examples) -> list[torch.Tensor]:
        """Teacher-forced attention on the reference targets: (t, j) per example (EOS row and
        column included), or [] for a model without attention."""
        out = []
        for start in range(0, len(examples), self.eval.batch_size):
            chunk = examples[start : start + self.eval.batch_size]
            batch = self.collate([self._encode(e) for e in chunk])
            weights = model(
                batch.source, batch.lengths, batch.target_in, return_weights=True
            ).weights
            if weights is None:
                return []
            for r, e in enumerate(chunk):
                out.append(weights[r, : len(e.target) + 1, : len(e.source) + 1])
        return out

    def by_source_length(self, model, edges: Sequence[int]) -> list[dict[str, Any]]:
        """The headline metric per source-length bucket [edges[k], edges[k+1]) (Bahdanau 2015
        Fig. 2): list of {"min_len", "max_len", "n", "exact_match"[, "bleu"]}."""
        examples = self.examples()
        hyps = self.translate(model, examples)
        rows = []
        for lo, hi in itertools.pairwise(edges):
            picked = [k for k, e in enumerate(examples) if lo <= len(e.source) < hi]
            if not picked:
                continue
            h = [hyps[k] for k in picked]
            r = [list(examples[k].target) for k in picked]
            row = {
                "min_len": lo,
                "max_len": hi - 1,
                "n": len(picked),
                "exact_match": exact_match(h, r),
            }
            if self.metric == "bleu":
                row["bleu"] = bleu([self.detokenize(x) for x in h], [self.detokenize(x) for x in r])
            rows.append(row)
        return rows

    def evaluate(self, model) -> dict[str, Any]:
        examples = self.examples()
        hyps = self.translate(model, examples)
        refs = [list(e.target) for e in examples]
        metrics = {"exact_match": exact_match(hyps, refs), "n_eval": len(examples)}
        if self.metric == "bleu":
            hyp_text = [self.detokenize(h) for h in hyps]
            ref_text = [self.detokenize(r) for r in refs]
            metrics["bleu"] = bleu(hyp_text, ref_text)
            metrics["chrf"] = chrf(hyp_text, ref_text)
        if examples and examples[0].spans is not None:
            weights = self.alignments(model, examples)
            if weights:
                hits = counted = 0
                for w, e in zip(weights, examples, strict=True):
                    h, c = alignment_score(w, e.spans)
                    hits, counted = hits + h, counted + c
                metrics["alignment"] = hits / max(1, counted)
        return metrics
