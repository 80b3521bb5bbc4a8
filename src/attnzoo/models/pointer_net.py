"""Pointer Networks (Vinyals, Fortunato & Jaitly 2015): attention whose softmax is the output.

An LSTM encoder reads the inputs P_1..P_n (points, or numbers) one at a time; an LSTM decoder
emits, at every step i, a distribution over input positions (eq. 3):

    u^i_j = v^T tanh(W_1 e_j + W_2 d_i),    p(C_i | C_1..C_{i-1}, P) = softmax(u^i)

There is no context vector blended into the decoder state: the attention weights are the
prediction. The decoder's next input is the input vector it just pointed at.

Positions are the vocabulary of the decoding engine (`attnzoo.decoding`), so greedy and beam
search are the shared ones. With `end_token=True` (convex hull: the output length varies),
position 0 is a learned "end" memory slot, EOS, and input j is position j + 1; without it
(sorting, TSP: the output is a permutation) input j is position j.

Note:
    - Positions already output are masked (the paper decodes without constraints and reports
      invalid outputs; Vinyals et al. note that a beam search "restricted to valid tours"
      is needed for TSP). The mask is applied in training too, so the loss is over valid
      choices only; `mask_chosen=False` gives the unconstrained model.
    - Inputs are embedded by a linear layer before the encoder (the paper feeds the raw
      coordinates to the LSTM); the decoder starts from a learned input vector.
    - All inputs of a batch have the same count n; no input padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from attnzoo import decoding
from attnzoo.core.checks import (
    check_fields,
    check_floating,
    check_integers,
    check_like_module,
    check_size,
    fail,
)
from attnzoo.core.normalisers import masked_fill_lowest
from attnzoo.core.scores import Additive

BOS = -1  # the decoding engine's start token: "no position chosen yet"


@dataclass(frozen=True)
class PointerNetConfig:
    hidden: int = 256  # LSTM width (Vinyals: 256 or 512)
    attn_hidden: int = 256  # size of the tanh layer of the pointer score
    layers: int = 1
    mask_chosen: bool = True  # forbid pointing at a position twice (see the Note)

    def __post_init__(self):
        check_fields(self)
        for name in ("hidden", "attn_hidden", "layers"):
            if getattr(self, name) < 1:
                fail("PointerNetConfig", name, "a positive int", getattr(self, name))


class PointerOutput(NamedTuple):
    log_probs: torch.Tensor  # (batch, steps, positions), masked positions at -inf-ish
    weights: torch.Tensor | None  # the pointer distributions, exp(log_probs)


class PointerSample(NamedTuple):
    positions: torch.Tensor  # (batch, steps) sampled positions, padding after EOS
    log_prob: torch.Tensor  # (batch,) log p(positions), differentiable (REINFORCE)


@dataclass
class PointerState:
    """The decoding state: LSTM state, the memory to point at, positions chosen so far."""

    h: torch.Tensor  # (layers, batch, hidden)
    c: torch.Tensor
    inputs: torch.Tensor  # (batch, positions, hidden) decoder input for each position
    keys: torch.Tensor  # (batch, positions, attn_hidden) W_1 e_j, computed once
    chosen: torch.Tensor  # (batch, positions) bool

    @property
    def batch_size(self) -> int:
        return self.chosen.shape[0]

    def reorder(self, index: torch.Tensor) -> PointerState:
        return PointerState(
            self.h.index_select(1, index),
            self.c.index_select(1, index),
            self.inputs.index_select(0, index),
            self.keys.index_select(0, index),
            self.chosen.index_select(0, index),
        )


class PointerNet(nn.Module):
    """Args:
    config: sizes.
    input_dim: features per input element (2 for planar points, 1 for numbers).
    end_token: add the EOS position 0 (outputs of varying length).
    """

    def __init__(self, config: PointerNetConfig, input_dim: int, end_token: bool = False):
        super().__init__()
        check_size("PointerNet", "input_dim", input_dim)
        if not isinstance(end_token, bool):
            fail("PointerNet", "end_token", "True or False", repr(end_token))
        self.config, self.input_dim, self.end_token = config, input_dim, end_token
        h = config.hidden
        self.embed = nn.Linear(input_dim, h)
        self.encoder = nn.LSTM(h, h, config.layers, batch_first=True)
        self.decoder = nn.LSTM(h, h, config.layers, batch_first=True)
        self.score = Additive(h, h, config.attn_hidden)
        self.start_input = nn.Parameter(torch.empty(h).uniform_(-0.1, 0.1))
        self.end_memory = nn.Parameter(torch.empty(h).uniform_(-0.1, 0.1)) if end_token else None

    @property
    def offset(self) -> int:
        """Position of input 0 (1 when position 0 is EOS)."""
        return int(self.end_token)

    @property
    def eos(self) -> int:
        """The EOS position, or -1 (never produced) for a model without one."""
        return 0 if self.end_token else -1

    def _check(self, points: torch.Tensor) -> None:
        check_floating("PointerNet", "points", points)
        check_like_module("PointerNet", "points", points, self)
        if points.dim() != 3 or points.shape[-1] != self.input_dim or points.shape[1] < 1:
            fail(
                "PointerNet",
                "points",
                f"a (batch, n >= 1, {self.input_dim}) tensor",
                tuple(points.shape),
            )

    def start(self, points: torch.Tensor) -> PointerState:
        """Encode (batch, n, input_dim) inputs; the state the first decoder step starts from."""
        self._check(points)
        embedded = self.embed(points)  # (b, n, h): the decoder's input when pointed at
        memory, (h, c) = self.encoder(embedded)  # e_j: (b, n, h)
        if self.end_token:
            b = points.shape[0]
            memory = torch.cat([self.end_memory.expand(b, 1, -1), memory], 1)
            embedded = torch.cat([embedded.new_zeros(b, 1, embedded.shape[-1]), embedded], 1)
        chosen = torch.zeros(memory.shape[:2], dtype=torch.bool, device=points.device)
        return PointerState(h, c, embedded, self.score.prepare_key(memory), chosen)

    def _pointer(self, out: torch.Tensor, keys: torch.Tensor, chosen: torch.Tensor):
        """Decoder outputs (b, t, h) -> log p over positions (b, t, positions)."""
        logits = self.score.logits(out, keys)
        if logits.dtype in (torch.bfloat16, torch.float16):  # autocast: softmax in float32
            logits = logits.float()
        if not self.config.mask_chosen:
            return torch.log_softmax(logits, -1)
        allowed = ~chosen
        if self.end_token:
            allowed = allowed.clone()
            allowed[..., 0] = True  # EOS is always allowed
        return torch.log_softmax(masked_fill_lowest(logits, allowed), -1)

    def decode_step(self, tokens: torch.Tensor, state: PointerState):
        """tokens: the positions chosen at the previous step (BOS at the first);
        returns (log_probs (batch, positions), new state)."""
        first = tokens < 0
        index = tokens.clamp_min(0)
        picked = state.inputs[torch.arange(len(tokens), device=tokens.device), index]
        x = torch.where(first.unsqueeze(-1), self.start_input.expand_as(picked), picked)
        # mark the previous positions (none at the first step); no branch on values, so the
        # step never waits for the device
        mark = torch.zeros_like(state.chosen).scatter_(1, index.unsqueeze(-1), True)
        chosen = state.chosen | (mark & ~first.unsqueeze(-1))
        out, (h, c) = self.decoder(x.unsqueeze(1), (state.h, state.c))
        log_probs = self._pointer(out, state.keys, chosen.unsqueeze(1))[:, 0]
        return log_probs, PointerState(h, c, state.inputs, state.keys, chosen)

    def forward(
        self,
        points: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> PointerOutput | PointerSample:
        """Teacher forcing: `targets` (batch, steps) positions (after EOS: anything) ->
        PointerOutput with the log-probabilities of every step, in one pass of the decoder
        LSTM and one call of the score. `sample=True`: draw positions from the model
        itself (REINFORCE) -> PointerSample."""
        state = self.start(points)
        if sample:
            positions, log_prob = decoding.sample(
                self.decode_step,
                state,
                points.shape[0],
                bos=BOS,
                eos=self.eos,
                max_len=self.max_steps(points.shape[1]),
                device=points.device,
                generator=generator,
            )
            return PointerSample(positions, log_prob)
        if targets is None:
            fail("PointerNet", "targets", "a (batch, steps) tensor, or sample=True", None)
        positions = state.inputs.shape[1]
        expected = f"({points.shape[0]}, steps) positions in [0, {positions})"
        if not isinstance(targets, torch.Tensor):
            fail("PointerNet", "targets", expected, type(targets).__name__, TypeError)
        if targets.dim() != 2:
            fail("PointerNet", "targets", expected, f"shape {tuple(targets.shape)}")
        b, steps, most = points.shape[0], targets.shape[1], self.max_steps(points.shape[1])
        if not 1 <= steps <= most:  # past them nothing is left to point at; none: no output
            wanted = f"{expected} with 1 to {most} steps"
            fail("PointerNet", "targets", wanted, f"shape {tuple(targets.shape)}")
        # an integer dtype (bool would index as a mask) and the values (meta has none)
        check_integers(
            *("PointerNet", "targets", targets, (b, steps), 0, positions - 1),
            kind=f"integer {expected}",
            values=expected,
        )
        rows = torch.arange(b, device=points.device).unsqueeze(-1)
        previous = state.inputs[rows, targets[:, :-1]]  # (b, steps - 1, h)
        x = torch.cat([self.start_input.expand(b, 1, -1), previous], 1)
        out, _ = self.decoder(x, (state.h, state.c))  # (b, steps, h)
        one_hot = torch.zeros(b, steps, positions, dtype=torch.bool, device=points.device)
        one_hot.scatter_(2, targets.unsqueeze(-1), True)
        # chosen before step t: the targets at steps < t (an exclusive running "or")
        chosen = (one_hot.cumsum(1) - one_hot.long()) > 0
        # a position the mask closed would score the lowest value: with the mask, each target
        # at most once (read on the CPU only: elsewhere it would stall); without it a repeat is
        # an output the model may give (its pictures teacher-force it)
        if self.config.mask_chosen and targets.device.type == "cpu":
            self._check_each_once(targets, one_hot & chosen, expected)
        log_probs = self._pointer(out, state.keys, chosen)
        return PointerOutput(log_probs, log_probs.exp())

    def _check_each_once(self, targets: torch.Tensor, again: torch.Tensor, expected: str) -> None:
        """Each position at most once in a row's steps up to its end (EOS, the first position
        0, with `end_token`; the padding after it may be anything): a position the mask had
        closed scores the dtype's lowest value, a loss of about 3.4e38, not an error."""
        again = again.any(-1)  # (b, steps): the step's target was a target before
        if self.end_token:
            end = (targets == 0).long()
            again &= (end.cumsum(1) - end) == 0  # through the first EOS
        if bool(again.any()):
            row, step = (int(i) for i in again.nonzero()[0])
            got = f"position {int(targets[row, step])} again at step {step} of row {row}"
            wanted = f"{expected}, each at most once" + " before the end" * self.end_token
            fail("PointerNet", "targets", wanted, got)

    def max_steps(self, n: int) -> int:
        return n + 1 if self.end_token else n

    @torch.no_grad()
    def decode(self, points: torch.Tensor, beam_size: int = 1) -> torch.Tensor:
        """Greedy (beam_size 1) or beam search restricted to unchosen positions.

        Returns input indices (batch, steps), -1 after the end; EOS is not included.
        """
        state = self.start(points)
        positions = decoding.decode(
            self.decode_step,
            state,
            points.shape[0],
            bos=BOS,
            eos=self.eos,
            max_len=self.max_steps(points.shape[1]),
            device=points.device,
            beam_size=beam_size,
        )
        if self.end_token:  # EOS and the padding after it (both position 0) -> -1
            return positions - 1
        return positions
