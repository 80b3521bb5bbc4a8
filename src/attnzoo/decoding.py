"""One decoding engine for every decoder: greedy search, sampling and batched beam search.

Every decoder reaches it the same way: `decode(model.decode_step, state, batch, beam_size=...,
device=...)` with the state its model's `start(...)` returned. A decoder exposes
`decode_step(tokens (batch,), state) -> (log_probs (batch, vocab), state)` and its state
exposes `reorder(index) -> state` (keep rows `index`) and `batch_size`, the rows it holds,
which must equal `batch` (beam search would otherwise decode the first rows of a larger
state and drop the rest without a word). The RNN decoders' state holds their
hidden vectors; the Transformer's holds its key/value caches; the Pointer Network's, the
positions chosen so far. Beam search flattens (batch, beam) into the batch dimension, so every
decoder sees an ordinary batch. `device` is the decoder's (its inputs'): the engine's own
tensors (start tokens, scores) are made there, in explicit dtypes (token ids long, scores
float32, promoted to float64 by a float64 decoder's log-probabilities), never the default
device's or dtype's. On PyTorch's `meta` device, which holds
shapes but no values, the engine runs every one of max_len steps (no row can be seen to end)
and skips its check of the log-probabilities' values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from attnzoo.core.checks import check_count, check_number, check_size, fail
from attnzoo.core.normalisers import at_least_float32, sample_hard


class DecodingState(Protocol):
    @property
    def batch_size(self) -> int | None:
        """The rows the state holds; None while it holds none (an empty cache), which any
        batch fits."""

    def reorder(self, index: torch.Tensor) -> DecodingState: ...


Step = Callable[[torch.Tensor, DecodingState], tuple[torch.Tensor, DecodingState]]


def _check(function: str, state, batch, bos, eos, max_len, pad) -> None:
    """The engine's own arguments, by name, before a step runs (a max_len of 0 stacked no
    step; a float token id was cast to a wrong id; a state of other rows than `batch`)."""
    check_count(function, "batch", batch)
    rows = state.batch_size
    if rows is not None and rows != batch:
        fail(function, "batch", f"the rows of 'state' ({rows})", batch)
    check_size(function, "max_len", max_len)
    for name, value in (("bos", bos), ("eos", eos), ("pad", pad)):
        if isinstance(value, bool) or not isinstance(value, int):
            fail(function, name, "an int token id", repr(value), TypeError)


def _check_log_probs(function: str, log_probs: torch.Tensor, t: int) -> None:
    """A NaN log-probability (a diverged model, a non-finite input) would still be picked by
    argmax or topk as a plausible token: an error instead. -inf is a legitimate log-probability
    (a token masked out, a finished beam's continuations); +inf cannot come from a log_softmax
    of finite logits. Costs one sum and one sync per step, beside the engine's own sync (at
    batch 1, 11 greedy steps of a dates-sized RNNsearch: +2 to 3 %)."""
    if log_probs.is_meta:
        return
    if math.isnan(float(log_probs.detach().sum())):  # one reduction: -inf + finite is -inf, not NaN
        rows = int(torch.isnan(log_probs).any(-1).sum())
        fail(
            function,
            "step",
            "finite log-probabilities from the decoder",
            f"NaN in {rows} row(s) at step {t}",
        )


def _all(ended: torch.Tensor) -> bool:
    """Whether every row has ended; never on `meta` (no values: run to max_len)."""
    return not ended.is_meta and bool(ended.all())


def _pad_after_eos(tokens: torch.Tensor, eos: int, pad: int) -> torch.Tensor:
    """Everything after the first EOS becomes padding. tokens: (batch, t)."""
    after = (tokens == eos).long().cumsum(-1) - (tokens == eos).long()  # EOS seen before
    return tokens.masked_fill(after > 0, pad)


@torch.no_grad()
def greedy(
    step: Step,
    state: DecodingState,
    batch: int,
    *,
    bos: int,
    eos: int,
    max_len: int,
    device: torch.device,
    pad: int = 0,
) -> torch.Tensor:
    """argmax at every step until every row has produced EOS or max_len tokens.

    Returns (batch, <= max_len) token ids, EOS included, padding after it.
    """
    _check("greedy", state, batch, bos, eos, max_len, pad)
    tokens = torch.full((batch,), bos, dtype=torch.long, device=device)
    out, done = [], torch.zeros(batch, dtype=torch.bool, device=device)
    for t in range(max_len):
        log_probs, state = step(tokens, state)
        _check_log_probs("greedy", log_probs, t)
        tokens = log_probs.argmax(-1)  # (batch,)
        out.append(tokens)
        done |= tokens == eos
        if _all(done):
            break
    return _pad_after_eos(torch.stack(out, 1), eos, pad)


def sample(
    step: Step,
    state: DecodingState,
    batch: int,
    *,
    bos: int,
    eos: int,
    max_len: int,
    device: torch.device,
    pad: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestral sampling: a token from p(. | prefix) at every step until EOS or max_len.

    Runs with autograd on, so the returned log-probability of each sequence (the sum over
    its tokens up to and including EOS) trains a policy by REINFORCE.
    Returns (tokens (batch, <= max_len), padding after EOS; log_prob (batch,)).
    """
    _check("sample", state, batch, bos, eos, max_len, pad)
    tokens = torch.full((batch,), bos, dtype=torch.long, device=device)
    out, total = [], torch.zeros(batch, dtype=torch.float32, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for t in range(max_len):
        log_probs, state = step(tokens, state)
        _check_log_probs("sample", log_probs, t)
        choice = sample_hard(at_least_float32(log_probs), generator=generator)  # the core's sampler
        total = total + choice.log_prob.masked_fill(done, 0.0)
        tokens = choice.index
        out.append(tokens)
        done = done | (tokens == eos)
        if _all(done):
            break
    return _pad_after_eos(torch.stack(out, 1), eos, pad), total


@torch.no_grad()
def beam_search(
    step: Step,
    state: DecodingState,
    batch: int,
    *,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    device: torch.device,
    pad: int = 0,
) -> torch.Tensor:
    """Batched beam search; finished hypotheses are ranked by log p / length^length_penalty
    (Wu et al. 2016 use ((5 + len) / 6)^alpha; plain length normalisation is alpha = 1 here).

    `beam_size` live hypotheses go on at every step, none of them finished. Of the best
    2 * beam_size extensions, those among the first beam_size that end in EOS join the row's
    finished ones (the best beam_size kept), and the best beam_size that do not end go on, as in
    fairseq and Hugging Face: a finished hypothesis never gives up its place to live ones that
    may later score lower, and beam_size 1 is greedy search. A row stops once its beam_size-th
    finished hypothesis ranks at or above its best live one (the old rule: every one of its
    beam_size best is finished); its best finished or, at max_len, live one is returned.

    Returns the best hypothesis per batch row: (batch, <= max_len), padding after EOS.
    """
    _check("beam_search", state, batch, bos, eos, max_len, pad)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        fail("beam_search", "beam_size", "an int >= 1", repr(beam_size))
    check_number("beam_search", "length_penalty", length_penalty)
    k = beam_size
    rows = torch.arange(batch, device=device)
    state = state.reorder(rows.repeat_interleave(k))  # (batch * k) rows
    tokens = torch.full((batch * k,), bos, dtype=torch.long, device=device)
    scores = torch.zeros(batch, k, dtype=torch.float32, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one alive
    history = torch.empty(batch, k, 0, dtype=torch.long, device=device)
    kept = torch.full((batch, k), float("-inf"), dtype=torch.float32, device=device)
    finished = torch.full((batch, k, max_len), pad, dtype=torch.long, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    for t in range(max_len):
        log_probs, state = step(tokens, state)  # (batch * k, V)
        _check_log_probs("beam_search", log_probs, t)
        vocab = log_probs.shape[-1]
        candidates = (scores.unsqueeze(-1) + log_probs.view(batch, k, vocab)).view(batch, -1)
        top, best = candidates.topk(min(2 * k, k * vocab), dim=-1)  # all of length t + 1
        beam, token = best // vocab, best % vocab
        ends = token == eos  # at most k of them: one EOS per beam
        ranks = torch.arange(top.shape[1], device=device)  # 0 = the best extension
        norm = (t + 1) ** length_penalty  # every extension has length t + 1
        paths = torch.cat(
            [history.gather(1, beam[..., None].expand(-1, -1, t)), token[..., None]], -1
        )
        # the finished ones (of rows still searching) join the kept ones; the best k stay
        ended = torch.where(ends & (ranks < k) & ~stopped[:, None], top / norm, -math.inf)
        kept, order = torch.cat([kept.to(ended.dtype), ended], 1).topk(k, dim=-1)
        padded = paths.new_full((batch, paths.shape[1], max_len), pad)
        padded[..., : t + 1] = paths
        pool = torch.cat([finished, padded], 1)
        finished = pool.gather(1, order[..., None].expand(-1, -1, max_len))
        # the best k that did not end go on (ended ones rank last; -inf if too few)
        live = (ranks + ends * top.shape[1]).topk(k, dim=-1, largest=False).indices  # best first
        scores = torch.where(ends.gather(1, live), -math.inf, top.gather(1, live))
        history = paths.gather(1, live[..., None].expand(-1, -1, t + 1))
        state = state.reorder((rows[:, None] * k + beam.gather(1, live)).view(-1))
        tokens = token.gather(1, live).view(-1)
        # sticky: a row's result never depends on how long the other rows search
        stopped |= kept[:, -1] >= (scores / norm).amax(-1)
        if _all(stopped):
            break
    steps = history.shape[-1]
    # a row that reached max_len still searching: its live ones compete
    live = torch.where(stopped[:, None], -math.inf, scores / steps**length_penalty)
    everything = torch.cat([kept, live], 1)
    paths = torch.cat([finished[..., :steps], history], 1)  # (batch, 2k, steps)
    chosen = paths[rows, everything.argmax(-1)]
    return _pad_after_eos(chosen, eos, pad)


def decode(
    step: Step,
    state: DecodingState,
    batch: int,
    *,
    bos: int,
    eos: int,
    max_len: int,
    device: torch.device,
    beam_size: int = 1,
    pad: int = 0,
) -> torch.Tensor:
    """Greedy search (beam_size 1) or beam search: the one entry every decoder's task uses.

    Returns (batch, <= max_len) token ids, EOS included, padding after it.
    """
    common = dict(bos=bos, eos=eos, max_len=max_len, device=device, pad=pad)
    if beam_size == 1:
        return greedy(step, state, batch, **common)
    return beam_search(step, state, batch, beam_size=beam_size, **common)
