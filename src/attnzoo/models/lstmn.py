"""Recurrent language models with self-attention over their own past (the "lm" interface).

- `LSTMNLM`: the Long Short-Term Memory-Network of Cheng, Dong & Lapata 2016 ("Long
  Short-Term Memory-Networks for Machine Reading", sec. 3.1, eq. 4-7). The LSTM's single
  memory cell becomes two tapes, hidden states H = (h_0 .. h_{t-1}) and memories
  C = (c_0 .. c_{t-1}); at step t intra-attention reads them:

      a_i^t = v^T tanh(W_h h_i + W_x x_t + W_h~ h~_{t-1})        (eq. 4)
      s^t = softmax(a^t)
      h~_t = sum_i s_i^t h_i,   c~_t = sum_i s_i^t c_i             (eq. 5)
      [i; f; o; c^] = [sigma; sigma; sigma; tanh](W [h~_t; x_t] + b) (eq. 6)
      c_t = f * c~_t + i * c^_t,   h_t = o * tanh(c_t)            (eq. 7)

  The score is the core `Additive` (query [x_t; h~_{t-1}], so its query projection is
  W_x x_t + W_h~ h~_{t-1}; key h_i, its key projection W_h). W_h h_i is computed once, when
  h_i is written, and kept on a third tape of projected keys (`prepare_key`), so a step costs
  O(t) tanh work and never O(t * d^2) (`benchmarks/bench_lstmn.py` times the difference).
  The tapes start with h_0 = c_0 = 0 (slot 0), so the first step has one slot to read.
- `SimpleSelfAttentionLM`: the lecture's "SimpleRNN + Self-Attention" (Shusen Wang's
  attention lecture, after Cheng 2016): c_0 = h_0 = 0,

      h_t = tanh(A [x_t; c_{t-1}] + b)
      alpha_i = align(h_i, h_t), i = 1 .. t                        (h_t itself included)
      c_t = sum_i alpha_i h_i

  with align the core `Additive` score (keys projected once when written, as above); the
  next-word distribution is read from c_t.
- `LSTMLM`: the baseline, `torch.nn.LSTM` (one fused layer stack) without attention.

All three: embedding -> recurrence -> linear output over the vocabulary; id 0 is padding.
`forward(tokens, return_weights=False, mask=None)`: `mask` (batch, len), True at real
tokens. The attention models skip a padded step (their state carries over unchanged and its
tape slot is masked out of every later read), so padding anywhere never reaches an output at a
real position; the LSTM takes right padding only (a mask that is not a prefix is refused).
Outputs at padded positions are those of a zero state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnzoo.core.attention import attention
from attnzoo.core.checks import (
    check_dropout,
    check_fields,
    check_size,
    check_tokens,
    fail,
)
from attnzoo.core.scores import Additive
from attnzoo.core.types import PreparedKey


@dataclass(frozen=True)
class RecurrentLMConfig:
    """Sizes of the recurrent language models of this module.

    Attributes:
        embed_dim: word embedding size.
        hidden: the recurrent state size (h_t, c_t).
        attn_hidden: the size of the additive score's tanh layer (unused by `LSTMLM`).
        layers: stacked layers of `LSTMLM` (the attention models have one).
        dropout: on the embeddings and on the state read by the output layer.
    """

    embed_dim: int = 128
    hidden: int = 256
    attn_hidden: int = 128
    layers: int = 1
    dropout: float = 0.0

    def __post_init__(self):
        check_fields(self)
        for name in ("embed_dim", "hidden", "attn_hidden", "layers"):
            check_size("RecurrentLMConfig", name, getattr(self, name))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float):
            fail("RecurrentLMConfig", "dropout", "a number in [0, 1)", repr(self.dropout))
        check_dropout("RecurrentLMConfig", self.dropout)


def lstmn(**overrides) -> RecurrentLMConfig:
    return replace(RecurrentLMConfig(), **overrides)


def simple_self(**overrides) -> RecurrentLMConfig:
    return replace(RecurrentLMConfig(), **overrides)


def lstm_lm(**overrides) -> RecurrentLMConfig:
    return replace(RecurrentLMConfig(), **overrides)


@dataclass
class RecurrentLMOutput:
    logits: torch.Tensor  # (b, t, vocab); logits[:, i] predicts tokens[:, i + 1]
    # when requested, one entry shaped like a Transformer layer's: (b, 1, t, t), row i the
    # weights of step i over the states written after tokens 0 .. i (see each model)
    weights: tuple[torch.Tensor, ...] | None = None


def _check_inputs(function: str, tokens, mask, vocab: int) -> None:
    check_tokens(function, "tokens", tokens, 2, "(batch, len)", vocab)
    if tokens.shape[1] == 0:
        fail(function, "tokens", "at least one position", tuple(tokens.shape))
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            fail(function, "mask", "a bool tensor (batch, len)", getattr(mask, "dtype", mask))
        if mask.shape != tokens.shape:
            fail(function, "mask", f"shape {tuple(tokens.shape)}", tuple(mask.shape))
        if mask.device != tokens.device:
            fail(function, "mask", f"device {tokens.device}", mask.device)


class _LMBase(nn.Module):
    def __init__(self, name: str, config: RecurrentLMConfig, vocab: int, max_len: int):
        super().__init__()
        check_size(name, "vocab", vocab)
        check_size(name, "max_len", max_len)
        self.config = config
        self.embed = nn.Embedding(vocab, config.embed_dim, padding_idx=0)
        self.drop = nn.Dropout(config.dropout)
        self.output = nn.Linear(self._read_size(), vocab)

    def _read_size(self) -> int:
        return self.config.hidden

    def _logits(self, states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None:  # padded positions read a zero state
            states = states.masked_fill(~mask[..., None], 0.0)
        return self.output(self.drop(states))  # (b, t, V)


class _TapeAttention:
    """The projected-key and value tapes of one sequence batch, read with the core
    `attention()` on a `PreparedKey`: slot k holds the key projection of the k-th state,
    computed once by `write`.

    Each tape is one tensor grown by a slot per write (`torch.cat([tape, slot], 1)`), not a
    list joined again at every read: the copies are the same O(t) per step, but the backward
    has two pieces per step (the prefix and the new slot) instead of one per slot, so a
    sequence of t steps costs O(t) autograd nodes and gradient additions, not O(t^2) (batch 32,
    length 64, hidden 256: 4,281 gradient additions and 5,183 slices per update before, 379
    and 1,344 after). With the input halves of the gate matrices taken out of the loop, one
    training step (forward, backward) against the list version, same weights, interleaved in
    one process, medians of 7, 1 thread: 0.263 -> 0.236 s with a 16-word output layer, 0.778
    -> 0.755 s with the task's 10k-word one (the output softmax dominates)."""

    def __init__(self, score: Additive, batch: int, like: torch.Tensor):
        self.score = score
        self.keys = self.values = self.allowed = None  # (b, slots, A), (b, slots, dv), (b, slots)
        self.ones = torch.ones(batch, 1, dtype=torch.bool, device=like.device)

    @staticmethod
    def append(tape: torch.Tensor | None, slot: torch.Tensor) -> torch.Tensor:
        """tape (b, k, ...) and slot (b, 1, ...) -> (b, k + 1, ...)."""
        return slot if tape is None else torch.cat([tape, slot], 1)

    def write(self, state: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None):
        """state (b, d_key), value (b, d_value), allowed (b,) or None."""
        self.keys = self.append(self.keys, self.score.prepare_key(state[:, None]))  # W_h h_i, once
        self.write_value(value, allowed)

    def write_value(self, value: torch.Tensor, allowed: torch.Tensor | None):
        self.values = self.append(self.values, value[:, None])
        self.allowed = self.append(self.allowed, self.ones if allowed is None else allowed[:, None])

    def key_tensor(self) -> torch.Tensor:
        return self.keys  # (b, slots, A)

    def read(self, query: torch.Tensor, masked: bool, return_weights: bool):
        """query (b, d_query) -> AttentionOutput over every slot written so far."""
        return attention(
            query[:, None],
            PreparedKey(self.key_tensor(), self.score),
            self.values,
            score=self.score,
            mask=self.allowed[:, None] if masked else None,  # (b, 1, k)
            return_weights=return_weights,
        )


class LSTMNLM(_LMBase):
    """LSTMN language model (Cheng 2016): see the module docstring for the equations.

    Args:
        config: `RecurrentLMConfig` (embed_dim, hidden, attn_hidden, dropout; layers unused).
        vocab: vocabulary size (id 0 is padding).
        max_len: the longest sequence (unused: the tapes grow with the input; kept for the
            "lm" interface).
    """

    tape_class = _TapeAttention
    tape_start = "<start>"  # the label of tape slot 0 (h_0) in figures

    def __init__(self, config: RecurrentLMConfig, vocab: int, max_len: int):
        super().__init__("LSTMNLM", config, vocab, max_len)
        e, h = config.embed_dim, config.hidden
        # query [x_t; h~_{t-1}]: W_x x_t + W_h~ h~_{t-1}; key h_i: W_h h_i
        self.score = Additive(e + h, h, config.attn_hidden)
        self.gates = nn.Linear(h + e, 4 * h)  # W [h~_t; x_t] + b -> i, f, o, c^

    def forward(
        self, tokens: torch.Tensor, return_weights: bool = False, mask: torch.Tensor | None = None
    ) -> RecurrentLMOutput:
        """tokens (b, t) ids -> logits (b, t, V); with `return_weights`, the intra-attention
        weights (b, 1, t, t): row i over the states h_0 .. h_i written after tokens 0 .. i-1
        (column j: h_j, the state after token j - 1; column 0: the initial state)."""
        _check_inputs("LSTMNLM", tokens, mask, self.embed.num_embeddings)
        x = self.drop(self.embed(tokens))  # (b, t, E)
        b, t, _ = x.shape
        hid = self.config.hidden
        # W [h~_t; x_t] + b = W_h~ h~_t + (W_x x_t + b): the input half for every step at once
        w_tilde = self.gates.weight[:, :hid].t()  # (H, 4H), sliced once for the whole loop
        from_x = nn.functional.linear(x, self.gates.weight[:, hid:], self.gates.bias)
        xs, from_xs = x.unbind(1), from_x.unbind(1)  # per step (b, E), (b, 4H)
        zero = x.new_zeros(b, hid)
        tape = self.tape_class(self.score, b, x)
        tape.write(zero, torch.cat([zero, zero], -1), None)  # slot 0: h_0 = c_0 = 0
        h_tilde, states, rows = zero, [], []
        for step in range(t):
            x_t = xs[step]
            out = tape.read(torch.cat([x_t, h_tilde], -1), mask is not None, return_weights)
            new_h_tilde, c_tilde = out.context[:, 0].split(hid, -1)  # (b, H) each
            pre = torch.addmm(from_xs[step], new_h_tilde, w_tilde)  # (b, 4H): i, f, o, c^
            ifo, g = torch.sigmoid(pre[:, : 3 * hid]), torch.tanh(pre[:, 3 * hid :])
            i, f, o = ifo.chunk(3, -1)
            c = torch.addcmul(f * c_tilde, i, g)
            h = o * torch.tanh(c)
            allowed = None if mask is None else mask[:, step]
            if allowed is not None:  # a padded step changes nothing
                h_tilde = torch.where(allowed[:, None], new_h_tilde, h_tilde)
            else:
                h_tilde = new_h_tilde
            tape.write(h, torch.cat([h, c], -1), allowed)
            states.append(h)
            if return_weights:
                rows.append(_row(out.weights[:, 0], allowed))  # (b, step + 1)
        logits = self._logits(torch.stack(states, 1), mask)
        return RecurrentLMOutput(logits, (_square(rows, t),) if return_weights else None)


class SimpleSelfAttentionLM(_LMBase):
    """The lecture's SimpleRNN + self-attention as a language model (module docstring).

    Args: as `LSTMNLM` (layers unused).
    """

    tape_class = _TapeAttention

    def __init__(self, config: RecurrentLMConfig, vocab: int, max_len: int):
        super().__init__("SimpleSelfAttentionLM", config, vocab, max_len)
        e, h = config.embed_dim, config.hidden
        self.cell = nn.Linear(e + h, h)  # A [x_t; c_{t-1}] + b
        self.score = Additive(h, h, config.attn_hidden)  # align(h_i, h_t)

    def forward(
        self, tokens: torch.Tensor, return_weights: bool = False, mask: torch.Tensor | None = None
    ) -> RecurrentLMOutput:
        """tokens (b, t) ids -> logits (b, t, V) read from c_t; with `return_weights`, the
        weights (b, 1, t, t): row i over h_1 .. h_{i+1}, the states after tokens 0 .. i
        (column j: the state after token j, the diagonal the current one)."""
        _check_inputs("SimpleSelfAttentionLM", tokens, mask, self.embed.num_embeddings)
        x = self.drop(self.embed(tokens))  # (b, t, E)
        b, t, e = x.shape
        # A [x_t; c_{t-1}] + b = A_c c_{t-1} + (A_x x_t + b): the input half for every step
        from_xs = nn.functional.linear(x, self.cell.weight[:, :e], self.cell.bias).unbind(1)
        w_c = self.cell.weight[:, e:].t()  # (H, H), sliced once for the whole loop
        c = x.new_zeros(b, self.config.hidden)
        tape = self.tape_class(self.score, b, x)
        summaries, rows = [], []
        for step in range(t):
            h = torch.tanh(torch.addmm(from_xs[step], c, w_c))  # (b, H)
            allowed = None if mask is None else mask[:, step]
            tape.write(h, h, allowed)
            out = tape.read(h, mask is not None, return_weights)
            new_c = out.context[:, 0]
            c = new_c if allowed is None else torch.where(allowed[:, None], new_c, c)
            summaries.append(new_c)
            if return_weights:
                rows.append(_row(out.weights[:, 0], allowed))  # (b, step + 1)
        logits = self._logits(torch.stack(summaries, 1), mask)
        return RecurrentLMOutput(logits, (_square(rows, t),) if return_weights else None)


class LSTMLM(_LMBase):
    """An LSTM language model (`torch.nn.LSTM`, `config.layers` layers), the baseline.

    Args: as `LSTMNLM` (attn_hidden unused).
    """

    def __init__(self, config: RecurrentLMConfig, vocab: int, max_len: int):
        super().__init__("LSTMLM", config, vocab, max_len)
        self.lstm = nn.LSTM(config.embed_dim, config.hidden, config.layers, batch_first=True)

    def forward(
        self, tokens: torch.Tensor, return_weights: bool = False, mask: torch.Tensor | None = None
    ) -> RecurrentLMOutput:
        """tokens (b, t) ids -> logits (b, t, V); no attention (weights None). `mask` must
        be right padding: True then False along each row."""
        _check_inputs("LSTMLM", tokens, mask, self.embed.num_embeddings)
        if (
            mask is not None
            and mask.device.type != "meta"
            and bool((mask[:, 1:] & ~mask[:, :-1]).any())
        ):
            fail("LSTMLM", "mask", "right padding (a prefix of True per row)", "a gap")
        states, _ = self.lstm(self.drop(self.embed(tokens)))  # (b, t, H)
        return RecurrentLMOutput(self._logits(states, mask), None)


def _row(weights: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """A step's weights (b, k), zeros in the rows of a padded step (whose query is padding)."""
    return weights if allowed is None else weights.masked_fill(~allowed[:, None], 0.0)


def _square(rows: list[torch.Tensor], t: int) -> torch.Tensor:
    """Rows of growing length (b, k) for k = 1 .. t -> (b, 1, t, t), zeros beyond each row's
    slots (the future)."""
    square = rows[-1].new_zeros(rows[-1].shape[0], t, t)
    for i, row in enumerate(rows):
        square[:, i, : row.shape[1]] = row
    return square[:, None]
