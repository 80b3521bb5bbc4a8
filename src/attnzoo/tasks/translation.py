"""The sequence-to-sequence task adapter: any `Splits` of token examples becomes a task (the
`attnzoo.tasks.base.Task` protocol): batches, the loss, the metrics, and the figures
(alignments, and per-head maps of a model that returns them).

dates, numbers, kjv2web and the symbol sequences differ only in their data and their metric;
this file is where they meet the models, so no model or task carries that code twice. A model
of this task ("seq2seq" interface) offers `forward(source, lengths, target_in,
return_weights=False) -> output with .logits, .weights` and optionally per-layer per-head maps
`.encoder_weights`, `.decoder_weights`, `.cross_weights`; `encode(source, lengths)`,
`start(memory)` and `decode_step(tokens, state)` for the decoding engine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnzoo.core.normalisers import at_least_float32
from attnzoo.decoding import decode
from attnzoo.tasks.base import EvalConfig, model_device, training_generator
from attnzoo.tasks.text import Splits, Vocab, alignment_score, bleu, chrf, exact_match

DECODE_MARGIN = 5  # decoding may run this many tokens past the longest training target
# Fewest examples a length bucket reports: at 50 the standard error of an accuracy is at most
# 7.1 points, the coarsest a bucket's bar may be and still be compared with its neighbours'.
MIN_BUCKET = 50


def length_buckets(
    lengths: Sequence[int], edges: Sequence[int], least: int = MIN_BUCKET
) -> list[tuple[int, int, list[int]]]:
    """(lo, hi, indices) of the items with lo <= length < hi, per bucket [edges[k],
    edges[k+1]), empty buckets dropped; a bucket of fewer than `least` items is merged with
    the next one, and a short last bucket with the one before it (one bucket stays when all
    items together are fewer)."""
    buckets = []
    for lo, hi in itertools.pairwise(edges):
        picked = [k for k, n in enumerate(lengths) if lo <= n < hi]
        if not picked:
            continue
        if buckets and len(buckets[-1][2]) < least:  # the one before is short: grow it
            start, _, before = buckets.pop()
            lo, picked = start, before + picked
        buckets.append((lo, hi, picked))
    if len(buckets) > 1 and len(buckets[-1][2]) < least:
        lo, _, before = buckets[-2]
        buckets[-2:] = [(lo, buckets[-1][1], before + buckets[-1][2])]
    return buckets


@dataclass
class Batch:
    source: torch.Tensor  # (b, j) ids, 0-padded, ending in EOS
    lengths: torch.Tensor  # (b,)
    target_in: torch.Tensor  # (b, t) BOS + target
    target_out: torch.Tensor  # (b, t) target + EOS
    tokens: int  # non-padding tokens of target_out, counted on the CPU when collated

    def to(self, device: torch.device | str) -> Batch:
        move = {"non_blocking": True}
        return Batch(
            self.source.to(device, **move),
            self.lengths.to(device, **move),
            self.target_in.to(device, **move),
            self.target_out.to(device, **move),
            self.tokens,
        )


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
        self.max_target_len = max(len(e.target) for e in splits.train) + 1  # with EOS
        self.max_source_len = (
            max(len(e.source) for e in (*splits.train, *splits.valid, *splits.test)) + 1
        )
        self._train = [self._encode(e) for e in splits.train]

    def _encode(self, example) -> tuple[list[int], list[int]]:
        return (
            self.source_vocab.encode(example.source, add_eos=True),
            self.target_vocab.encode(example.target),
        )

    def model_dims(self) -> dict[str, int]:
        """Vocabulary sizes; the longest source (Luong's location score, learned positions)
        and the longest output decoding asks for."""
        return {
            "source_vocab": len(self.source_vocab),
            "target_vocab": len(self.target_vocab),
            "max_source_len": self.max_source_len,
            "max_target_len": self.max_decode_len,
        }

    @property
    def max_decode_len(self) -> int:
        return self.max_target_len + DECODE_MARGIN

    def collate(
        self, pairs: Sequence[tuple[list[int], list[int]]], device: torch.device | str = "cpu"
    ) -> Batch:
        """Pad on the CPU, then one copy to `device`."""
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
        tokens = sum(len(y) + 1 for _, y in pairs)
        return Batch(source, lengths, target_in, target_out, tokens).to(device)

    def batch(
        self, step: int, batch_size: int, device: torch.device | str, rank: int = 0, world: int = 1
    ) -> Batch:
        g = training_generator(self.seed, step)
        index = torch.randint(len(self._train), (batch_size,), generator=g)
        return self.collate([self._train[i] for i in index[rank::world].tolist()], device)

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, int]:
        logits = model(batch.source, batch.lengths, batch.target_in).logits  # (b, t, V)
        loss = F.cross_entropy(
            at_least_float32(logits.reshape(-1, logits.shape[-1])),
            batch.target_out.reshape(-1),
            ignore_index=Vocab.PAD,
            reduction="sum",
            label_smoothing=self.eval.label_smoothing,
        )
        return loss, batch.tokens

    def examples(self, split: str | None = None):
        examples = getattr(self.splits, split or self.eval.split)
        return examples[: self.eval.limit] if self.eval.limit else examples

    def translate(self, model, examples) -> list[list[str]]:
        """Decode with the shared engine (greedy, or beam search when beam_size > 1)."""
        outputs = []
        for start in range(0, len(examples), self.eval.batch_size):
            chunk = examples[start : start + self.eval.batch_size]
            batch = self.collate([self._encode(e) for e in chunk], model_device(model))
            state = model.start(model.encode(batch.source, batch.lengths))
            ids = decode(
                model.decode_step,
                state,
                len(chunk),
                bos=Vocab.BOS,
                eos=Vocab.EOS,
                max_len=self.max_decode_len,
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
            batch = self.collate([self._encode(e) for e in chunk], model_device(model))
            weights = model(
                batch.source, batch.lengths, batch.target_in, return_weights=True
            ).weights
            if weights is None:
                return []
            for r, e in enumerate(chunk):
                out.append(weights[r, : len(e.target) + 1, : len(e.source) + 1])
        return out

    def by_source_length(self, model, edges: Sequence[int]) -> list[dict[str, Any]]:
        """The headline metrics (`scores`) per source-length bucket [edges[k], edges[k+1])
        (Bahdanau 2015 Fig. 2): list of {"min_len", "max_len", "n", "exact_match"[, "bleu",
        "chrf"]}. A bucket of fewer than MIN_BUCKET examples is merged into its neighbour
        (`length_buckets`)."""
        examples = self.examples()
        hyps = self.translate(model, examples)
        rows = []
        for lo, hi, picked in length_buckets([len(e.source) for e in examples], edges):
            scored = self.scores([hyps[k] for k in picked], [examples[k] for k in picked])
            rows.append({"min_len": lo, "max_len": hi - 1, "n": len(picked), **scored})
        return rows

    def evaluate(self, model) -> dict[str, Any]:
        """Exact match (and BLEU, chrF), each beside its ceiling (`scores` of no hypotheses),
        and the attention's alignment where the task knows the true spans."""
        examples = self.examples()
        metrics = {
            **self.scores(self.translate(model, examples), examples),
            "n_eval": len(examples),
        }
        metrics |= {f"{k}_ceiling": v for k, v in self.scores(None, examples).items()}
        if examples and examples[0].spans is not None:
            weights = self.alignments(model, examples)
            if weights:
                hits = counted = 0
                for w, e in zip(weights, examples, strict=True):
                    h, c = alignment_score(w, e.spans)
                    hits, counted = hits + h, counted + c
                metrics["alignment"] = hits / max(1, counted)
        return metrics

    def scores(self, hyps: list[list[str]] | None, examples) -> dict[str, float]:
        """Exact match (and BLEU, chrF) of `hyps` against the examples' references; with `hyps`
        None, of the references themselves written through the target vocabulary (a word
        outside it becomes `<unk>`): the ceiling no model of this vocabulary can pass (below
        one on kjv2web, whose target vocabulary leaves rare words out)."""
        refs = [list(e.target) for e in examples]
        if hyps is None:
            vocab = self.target_vocab
            hyps = [vocab.decode(vocab.encode(r)) for r in refs]
        found = {"exact_match": exact_match(hyps, refs)}
        if self.metric == "bleu":
            hyp_text = [self.detokenize(h) for h in hyps]
            ref_text = [self.detokenize(r) for r in refs]
            found |= {"bleu": bleu(hyp_text, ref_text), "chrf": chrf(hyp_text, ref_text)}
        return found

    # ----- pictures -----
    def figures(self, model, folder: Path, count: int = 3) -> list[Path]:
        """alignment.png (+ alignment_1.png ...) of the first `count` held-out examples: the
        attention the model had when it wrote each token of its own output (teacher-forced on
        that output, as the explorer shows it; the title gives the reference); for a model
        whose forward returns per-head maps, also heads_encoder_self.png,
        heads_decoder_self.png and heads_cross.png of the first example on its reference;
        none for a model without attention."""
        from attnzoo.viz import alignment_figure, save_figure

        examples = self.examples()[:count]
        outputs = self.translate(model, examples)
        written = []
        for k, (e, output) in enumerate(zip(examples, outputs, strict=True)):
            w, _ = self.attention_of(model, e, output)
            if w is None:
                break
            title = f"reference: {self.detokenize(e.target)}"
            if getattr(model, "alignment_note", None):  # a model whose map is a summary
                title += f"\n({model.alignment_note})"
            fig = alignment_figure(w, [*e.source, "<eos>"], self.output_labels(output), title=title)
            path = Path(folder) / ("alignment.png" if k == 0 else f"alignment_{k}.png")
            save_figure(fig, path)
            written.append(path)
        if examples:
            written += self.head_figures(model, examples[0], folder)
        return written

    def head_figures(self, model, example, folder: Path) -> list[Path]:
        """One grid of per-head maps (layers x heads) per attention kind the model's forward
        teacher-forced on the reference returns (`attention_of`; its rows and columns are
        labelled with the reference's tokens)."""
        from attnzoo.viz import head_grid_figure, save_figure

        written = []
        for field, title, weights, queries, keys in self.attention_of(model, example)[1]:
            fig = head_grid_figure(weights.float(), keys, queries, title=title)
            path = Path(folder) / f"heads_{HEAD_KINDS[field][0]}.png"
            save_figure(fig, path)
            written.append(path)
        return written

    def attention_of(self, model, example, target: Sequence[str] | None = None):
        """The attention of one teacher-forced forward pass over `example`'s source and
        `target` (default: its reference), on its own (no padding: every map is its own).

        Returns (alignment, heads): the model's one alignment (target_len + 1, source_len + 1)
        or None without attention (EOS row and column included); and for a model whose forward
        returns per-layer per-head maps, per kind of `HEAD_KINDS` it returns
        (field, title, weights (layers, heads, query_len, key_len), query labels, key labels):
        self-attention maps carry the same tokens on both axes (the decoder's inputs start with
        <bos>); cross-attention rows are the output tokens, as in alignment.png.
        """
        target = list(example.target if target is None else target)
        pair = (
            self.source_vocab.encode(example.source, add_eos=True),
            self.target_vocab.encode(target),
        )
        batch = self.collate([pair], model_device(model))
        out = model(batch.source, batch.lengths, batch.target_in, return_weights=True)
        labels = {
            "source": [*example.source, "<eos>"],
            "decoder_in": ["<bos>", *target],
            "outputs": self.output_labels(target),
        }
        heads = []
        for field, (_, title, queries, keys) in HEAD_KINDS.items():
            per_layer = getattr(out, field, None)  # per layer (1, heads, query_len, key_len)
            if per_layer is not None:
                weights = torch.stack([w[0] for w in per_layer])  # (layers, heads, q, k)
                heads.append((field, title, weights, labels[queries], labels[keys]))
        alignment = None if out.weights is None else out.weights[0]  # (t, j)
        return alignment, heads

    def output_labels(self, target: Sequence[str]) -> list[str]:
        """The output steps of a target: its tokens, then "<eos>"; an output cut off at
        max_decode_len (no EOS) has "(next)" there instead."""
        return [*target, "<eos>" if len(target) < self.max_decode_len else "(next)"]

    @torch.no_grad()
    def explore(self, model, count: int) -> dict[str, Any]:
        """The explorer's data (`attnzoo.tasks.base.Task.explore`): the first `count`
        held-out examples, decoded as `evaluate` decodes, with the attention of the forward
        pass teacher-forced on the model's own output (at every step the attention it had
        when it wrote that token): per layer and head of each kind a model returns them,
        else its one alignment."""
        examples = self.examples()[:count]
        outputs = self.translate(model, examples)
        items = []
        for example, output in zip(examples, outputs, strict=True):
            alignment, heads = self.attention_of(model, example, output)
            if alignment is not None and not heads:  # one map: as one layer of one head
                source = [*example.source, "<eos>"]
                rows = self.output_labels(output)
                heads = [(None, "attention", alignment[None, None], rows, source)]
            kinds = [
                {"name": title, "rows": q, "columns": k, "weights": w.float().cpu()}
                for _, title, w, q, k in heads
            ]
            items.append(
                {
                    "input": self.detokenize(example.source),
                    "reference": self.detokenize(example.target),
                    "prediction": self.detokenize(output),
                    "correct": list(output) == list(example.target),
                    "attention": kinds,
                }
            )
        return {
            "layout": "tokens",
            "title": f"{len(items)} held-out examples ({self.eval.split} split)",
            "note": "Attention while the model writes its prediction (teacher-forced on its "
            "own output)",
            "examples": items,
        }


# The per-layer per-head maps a model's forward may return: output field -> (figure file
# stem, title, query labels, key labels), the labels named as `attention_of` builds them.
HEAD_KINDS = {
    "encoder_weights": ("encoder_self", "encoder self-attention", "source", "source"),
    "decoder_weights": (
        "decoder_self",
        "decoder self-attention (causal)",
        "decoder_in",
        "decoder_in",
    ),
    "cross_weights": ("cross", "cross-attention", "outputs", "source"),
}
