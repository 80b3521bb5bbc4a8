"""RNN sequence-to-sequence models with and without attention.

- "none": Sutskever 2014 / Cho 2014 encoder-decoder; the encoder's final state is the only
  context (the baseline of Bahdanau 2015, "RNNencdec").
- "bahdanau": Bahdanau 2015 ("RNNsearch"): bidirectional encoder; at step i the additive
  score compares the previous decoder state s_{i-1} with every annotation h_j,
      c_i = sum_j softmax_j(v_a^T tanh(W_a s_{i-1} + U_a h_j)) h_j,
  and c_i enters the RNN: s_i = f(s_{i-1}, [E y_{i-1}; c_i]); a maxout readout
  (appendix A.2.2) predicts y_i from (s_i, c_i, E y_{i-1}).
- "luong": Luong 2015: the attention comes after the RNN step: h_t = f(h_{t-1}, x_t),
  c_t = attend(h_t, H) with a global score (dot, general, concat) or local-m / local-p,
  the attentional state h~_t = tanh(W_c [c_t; h_t]) (eq. 5) predicts y_t (eq. 6), and with
  input feeding h~_{t-1} is concatenated to the next input (sec. 3.3).
- "simple": the SimpleRNN with attention of the usual lecture: s_t = tanh(A' [x'_t; s_{t-1};
  c_{t-1}] + b), c_t = attend(s_t, H), y_t predicted from [s_t; c_t].

Note:
    The decoder RNN is one stack of `layers` cells (GRU by default, as in Bahdanau's gated
    unit). The initial decoder state is tanh(W_s h_final) of the encoder's last states
    (Bahdanau appendix A.2.2 uses the first backward state; the final states of both
    directions carry the same information here). The keys are prepared (projected) once per
    source sentence, not once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnzoo.core import LocalAttention, PreparedKey, attention, padding_mask, scores
from attnzoo.core.checks import fail

ATTENTIONS = ("none", "bahdanau", "luong", "simple")
LOCAL = ("global", "local-m", "local-p")
CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


@dataclass(frozen=True)
class Seq2SeqConfig:
    attention: str = "bahdanau"  # one of ATTENTIONS
    score: str = "additive"  # one of scores.SCORES ("additive" is Luong's "concat")
    local: str = "global"  # Luong only: one of LOCAL
    window: int = 4  # D of local attention
    input_feeding: bool = True  # Luong only
    cell: str = "gru"  # rnn | gru | lstm
    embed_dim: int = 64
    hidden: int = 128
    attn_hidden: int = 128  # d_hidden of the additive score
    layers: int = 1
    bidirectional: bool = True
    dropout: float = 0.1
    max_source_len: int = 128  # Location score only: the longest addressable source

    def __post_init__(self):
        for name, allowed in (
            ("attention", ATTENTIONS),
            ("score", tuple(scores.SCORES)),
            ("local", LOCAL),
            ("cell", tuple(CELLS)),
        ):
            if getattr(self, name) not in allowed:
                fail("Seq2SeqConfig", name, f"one of {list(allowed)}", repr(getattr(self, name)))
        if self.local != "global" and self.attention != "luong":
            fail("Seq2SeqConfig", "local", "'global' unless attention='luong'", repr(self.local))


def bahdanau(**overrides) -> Seq2SeqConfig:
    """RNNsearch (Bahdanau 2015): BiGRU encoder, additive score, maxout readout."""
    return replace(Seq2SeqConfig(), **overrides)


def luong(**overrides) -> Seq2SeqConfig:
    """Luong 2015 global attention, general score, input feeding (their best single model used
    local-p with general; global-general is the simplest strong variant)."""
    base = Seq2SeqConfig(attention="luong", score="general", cell="lstm", bidirectional=False)
    return replace(base, **overrides)


@dataclass
class EncoderOutput:
    annotations: torch.Tensor  # (b, j, d_enc)
    mask: torch.Tensor  # (b, 1, j) True = real source token
    lengths: torch.Tensor  # (b,)
    final: torch.Tensor  # (b, d_enc) last states of both directions, concatenated


@dataclass
class DecoderState:
    """Everything one decoding step needs; `reorder` serves beam search."""

    hidden: torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # (layers, b, d) [LSTM: (h, c)]
    feed: torch.Tensor  # (b, d_feed): h~_{t-1} (Luong), c_{t-1} (simple), unused otherwise
    step: int
    memory: EncoderOutput
    keys: PreparedKey | torch.Tensor | None  # keys prepared once per sentence

    def reorder(self, index: torch.Tensor) -> DecoderState:
        hidden = (
            tuple(h.index_select(1, index) for h in self.hidden)
            if isinstance(self.hidden, tuple)
            else self.hidden.index_select(1, index)
        )
        m = self.memory
        memory = EncoderOutput(
            m.annotations.index_select(0, index),
            m.mask.index_select(0, index),
            m.lengths.index_select(0, index),
            m.final.index_select(0, index),
        )
        keys = self.keys
        if isinstance(keys, PreparedKey):
            keys = PreparedKey(keys.tensor.index_select(0, index), keys.score)
        elif isinstance(keys, torch.Tensor):
            keys = keys.index_select(0, index)
        return DecoderState(hidden, self.feed.index_select(0, index), self.step, memory, keys)


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor  # (b, t, vocab)
    weights: torch.Tensor | None  # (b, t, j) attention over source, None without attention


class Seq2Seq(nn.Module):
    """Encoder-decoder over token ids; see the module docstring for the decoders.

    Args:
        config: `Seq2SeqConfig`.
        source_vocab, target_vocab: vocabulary sizes (id 0 is padding).
    """

    def __init__(self, config: Seq2SeqConfig, source_vocab: int, target_vocab: int):
        super().__init__()
        c = self.config = config
        cell = CELLS[c.cell]
        self.source_embed = nn.Embedding(source_vocab, c.embed_dim, padding_idx=0)
        self.target_embed = nn.Embedding(target_vocab, c.embed_dim, padding_idx=0)
        self.drop = nn.Dropout(c.dropout)
        dirs = 2 if c.bidirectional else 1
        d_enc = c.hidden * dirs
        # One single-layer RNN per layer and direction, run on padded batches (see `encode`).
        self.encoder = nn.ModuleList(
            nn.ModuleList(
                cell(c.embed_dim if layer == 0 else d_enc, c.hidden, batch_first=True)
                for _ in range(dirs)
            )
            for layer in range(c.layers)
        )
        self.bridge = nn.Linear(d_enc, c.layers * c.hidden)

        d_in = c.embed_dim
        if c.attention == "bahdanau":
            d_in += d_enc  # context enters the RNN
        elif c.attention == "luong" and c.input_feeding:
            d_in += c.hidden  # h~_{t-1}
        elif c.attention == "simple":
            d_in += d_enc  # c_{t-1}
        self.decoder = cell(
            d_in,
            c.hidden,
            num_layers=c.layers,
            batch_first=True,
            dropout=c.dropout if c.layers > 1 else 0.0,
        )

        self.score = None if c.attention == "none" else self._build_score(c, d_enc)
        self.local = None
        if c.attention == "luong" and c.local != "global":
            self.local = LocalAttention(
                self.score, c.window, d_query=c.hidden if c.local == "local-p" else None
            )
        if c.attention == "bahdanau":  # maxout readout: 2l units pooled in pairs
            self.readout = nn.Linear(c.hidden + d_enc + c.embed_dim, 2 * c.hidden)
            d_out = c.hidden
        elif c.attention == "luong":
            self.combine = nn.Linear(d_enc + c.hidden, c.hidden, bias=False)  # W_c
            d_out = c.hidden
        elif c.attention == "simple":
            d_out = c.hidden + d_enc
        else:
            d_out = c.hidden
        self.output = nn.Linear(d_out, target_vocab)

    @staticmethod
    def _build_score(c: Seq2SeqConfig, d_enc: int) -> scores.Score:
        return scores.make_score(
            c.score, c.hidden, d_enc, d_hidden=c.attn_hidden, max_keys=c.max_source_len
        )

    # -- encoder ---------------------------------------------------------------------------

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """source: (b, j) ids, padded with 0; lengths: (b,) -> EncoderOutput.

        The backward direction reads each sentence reversed within its own length, so padding
        never enters a real state. This replaces `pack_padded_sequence`, whose CPU backward
        zero-fills a whole (tokens, gates) buffer at every time step (measured here: 2-3x the
        encoder's cost).
        """
        if source.dim() != 2:
            fail(
                "Seq2Seq.encode",
                "source",
                "(batch, source_len) token ids",
                f"shape {tuple(source.shape)}",
            )
        b, j = source.shape
        positions = torch.arange(j, device=source.device)[None, :]  # (1, j)
        last = (lengths.to(source.device) - 1)[:, None]  # (b, 1)
        reverse = torch.where(positions <= last, last - positions, positions)  # (b, j)
        x = self.drop(self.source_embed(source))  # (b, j, e)
        for layer, directions in enumerate(self.encoder):
            if layer:
                x = self.drop(x)
            outs = []
            for d, rnn in enumerate(directions):
                if d == 0:
                    outs.append(rnn(x)[0])  # (b, j, d)
                else:
                    flipped = x.gather(1, reverse[..., None].expand_as(x))
                    out = rnn(flipped)[0]
                    outs.append(out.gather(1, reverse[..., None].expand_as(out)))
            x = torch.cat(outs, -1)  # (b, j, d_enc)
        mask = padding_mask(lengths.to(source.device), j)  # (b, 1, j)
        annotations = x * mask.transpose(1, 2)  # zero at padding
        d = self.config.hidden
        final = annotations[torch.arange(b), last.squeeze(1), :d]  # forward state at the end
        if len(self.encoder[0]) == 2:
            final = torch.cat([final, annotations[:, 0, d:]], -1)  # backward state at 0
        return EncoderOutput(annotations, mask, lengths, final)

    # -- decoder -----------------------------------------------------------------------------

    def start(self, memory: EncoderOutput) -> DecoderState:
        c = self.config
        b = memory.final.shape[0]
        h0 = torch.tanh(self.bridge(memory.final)).view(b, c.layers, c.hidden)
        h0 = h0.transpose(0, 1).contiguous()  # (layers, b, d)
        hidden = (h0, torch.zeros_like(h0)) if c.cell == "lstm" else h0
        d_feed = {"luong": c.hidden, "simple": memory.annotations.shape[-1]}.get(c.attention, 0)
        feed = memory.final.new_zeros(b, d_feed)
        keys = None
        if self.score is not None:
            keys = PreparedKey(self.score.prepare_key(memory.annotations), self.score)
        return DecoderState(hidden, feed, 0, memory, keys)

    def _attend(self, query: torch.Tensor, state: DecoderState, need_weights: bool):
        """query: (b, t, d) -> context (b, t, d_enc), weights (b, t, j) or None."""
        m = state.memory
        if self.local is not None:
            positions = torch.arange(state.step, state.step + query.shape[1], device=query.device)
            out = self.local(
                query,
                m.annotations,
                m.annotations,
                mask=m.mask,
                lengths=m.lengths,
                positions=positions,
                prepared_key=state.keys.tensor,
            )
            return out.context, out.weights
        out = attention(
            query,
            state.keys,
            m.annotations,
            score=self.score,
            mask=m.mask,
            return_weights=need_weights,
        )
        return out.context, out.weights

    def _readout(self, features: torch.Tensor) -> torch.Tensor:
        """Per-position features (b, t, d_feat) -> logits (b, t, V). Nothing here feeds back
        into the recurrence, so `_run` applies it once to all positions, not once per step."""
        if self.config.attention == "bahdanau":
            t = self.readout(self.drop(features))  # (b, t, 2d)
            features = t.view(*t.shape[:-1], -1, 2).amax(-1)  # maxout: (b, t, d)
        return self.output(self.drop(features))

    def _run(self, tokens: torch.Tensor, state: DecoderState, need_weights: bool):
        """Decode target inputs `tokens` (b, t) from `state`: logits (b, t, V), weights, state.

        Luong attention without input feeding runs the RNN over all t steps at once and then
        attends for all of them in one call; every other decoder steps one position at a time.
        """
        c = self.config
        embedded = self.drop(self.target_embed(tokens))  # (b, t, e)
        weights = None
        if c.attention == "none":
            features, hidden = self.decoder(embedded, state.hidden)  # (b, t, d)
            state = replace(state, hidden=hidden, step=state.step + tokens.shape[1])
        elif c.attention == "luong" and not c.input_feeding:
            out, hidden = self.decoder(embedded, state.hidden)  # (b, t, d)
            context, weights = self._attend(out, state, need_weights)
            features = torch.tanh(self.combine(torch.cat([context, out], -1)))  # h~_t
            state = replace(state, hidden=hidden, step=state.step + tokens.shape[1])
        else:
            features, weights = [], []
            for x in embedded.unbind(1):  # unbind: one gradient op, not one zero-fill a step
                f, w, state = self._step(x.unsqueeze(1), state, need_weights)
                features.append(f)
                weights.append(w)
            features = torch.cat(features, 1)  # (b, t, d_feat)
            weights = torch.cat(weights, 1) if need_weights else None
        return self._readout(features), weights, state

    def _step(self, x: torch.Tensor, state: DecoderState, need_weights: bool):
        """One target position. x: (b, 1, e) embedded y_{t-1} -> readout features (b, 1, .),
        weights (b, 1, j) or None, new state."""
        c = self.config
        hidden = state.hidden
        feed = state.feed
        if c.attention == "bahdanau":
            s_prev = (hidden[0] if isinstance(hidden, tuple) else hidden)[-1]  # s_{i-1}: (b, d)
            context, w = self._attend(s_prev.unsqueeze(1), state, need_weights)  # (b, 1, d_enc)
            out, hidden = self.decoder(torch.cat([x, context], -1), hidden)  # s_i: (b, 1, d)
            features = torch.cat([out, context, x], -1)
        elif c.attention == "luong":
            out, hidden = self.decoder(torch.cat([x, feed.unsqueeze(1)], -1), hidden)
            context, w = self._attend(out, state, need_weights)
            features = torch.tanh(self.combine(torch.cat([context, out], -1)))  # h~_t (b, 1, d)
            feed = features.squeeze(1)
        else:  # simple
            out, hidden = self.decoder(torch.cat([x, feed.unsqueeze(1)], -1), hidden)
            context, w = self._attend(out, state, need_weights)
            features = torch.cat([out, context], -1)
            feed = context.squeeze(1)
        return features, w, replace(state, hidden=hidden, feed=feed, step=state.step + 1)

    def forward(
        self,
        source: torch.Tensor,
        lengths: torch.Tensor,
        target_in: torch.Tensor,
        return_weights: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher forcing. source: (b, j); lengths: (b,); target_in: (b, t) starting with BOS.
        Returns Seq2SeqOutput(logits (b, t, V), weights (b, t, j) or None)."""
        state = self.start(self.encode(source, lengths))
        logits, weights, _ = self._run(target_in, state, return_weights and self.score is not None)
        return Seq2SeqOutput(logits, weights)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState):
        """The decoding engine's step: tokens (b,) -> log-probabilities (b, V), new state."""
        logits, _, state = self._run(tokens.unsqueeze(1), state, False)
        return torch.log_softmax(logits[:, -1].float(), -1), state
