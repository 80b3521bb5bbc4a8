"""RNN sequence-to-sequence models with and without attention: one encoder, one small decoder
class per family, one output layer.

- "none" (`EncDecDecoder`): Sutskever 2014 / Cho 2014 encoder-decoder; the encoder's final
  state is the only context (the baseline of Bahdanau 2015, "RNNencdec").
- "bahdanau" (`BahdanauDecoder`): Bahdanau 2015 ("RNNsearch"): bidirectional encoder; at step
  i the additive score compares the previous decoder state s_{i-1} with every annotation h_j,
      c_i = sum_j softmax_j(v_a^T tanh(W_a s_{i-1} + U_a h_j)) h_j,
  and c_i enters the RNN: s_i = f(s_{i-1}, [E y_{i-1}; c_i]); a maxout readout
  (appendix A.2.2) predicts y_i from (s_i, c_i, E y_{i-1}).
- "luong" (`LuongDecoder`): Luong 2015 global attention: the attention comes after the RNN
  step: h_t = f(h_{t-1}, x_t), c_t = attend(h_t, H) with a score (dot, general, concat), the
  attentional state h~_t = tanh(W_c [c_t; h_t]) (eq. 5) predicts y_t (eq. 6), and with input
  feeding h~_{t-1} is concatenated to the next input (sec. 3.3).
- "luong-local" (`LuongLocalDecoder`): the same with local attention (sec. 3.2): local-m
  (p_t = t) or local-p (predicted p_t, Gaussian window) of half-width D = `window`.
- "simple" (`SimpleDecoder`): the SimpleRNN with attention of the usual lecture:
  s_t = tanh(A' [x'_t; s_{t-1}; c_{t-1}] + b), c_t = attend(s_t, H), y_t predicted from
  [s_t; c_t].

`Seq2SeqConfig.attention` names the family; `DECODERS` maps it to the decoder class, chosen
once in `Seq2Seq.__init__`. The config fields only some families read (`OPTIONS`) default to
None, "not given": a family's default where it applies, an error where it does not.

Note:
    The decoder RNN is one stack of `layers` cells (GRU by default, Bahdanau's gated unit, as
    PyTorch's `nn.GRU` computes it: the reset gate applied after the recurrent matrix,
    r * (U s + b), where Cho 2014 and Bahdanau 2015 apply it before, U (r * s)). The initial
    decoder state is tanh(W_s h_final) of the encoder's last states (Bahdanau appendix A.2.2
    uses the first backward state; the final states of both directions carry the same
    information here). The keys are prepared (projected) once per source sentence, not once
    per step.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, replace

import torch
from torch import nn

from attnzoo.core import LocalAttention, PreparedKey, attention, padding_mask, prepare_key, scores
from attnzoo.core.checks import (
    check_dropout,
    check_fields,
    check_integers,
    check_size,
    check_tokens,
    fail,
)
from attnzoo.core.normalisers import at_least_float32

CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
LOCAL = ("local-m", "local-p")  # Luong's local forms (sec. 3.2)

# Config fields that only some decoder families read, with their default where one does.
OPTIONS = {
    "score": "additive",  # one of scores.SCORES ("additive" is Luong's "concat")
    "attn_hidden": 128,  # d_hidden of the additive score
    "input_feeding": True,
    "local": "local-p",  # one of LOCAL
    "window": 4,  # D of local attention
}
# Options that one score only reads: field -> that score's name.
SCORE_OPTIONS = {"attn_hidden": "additive"}


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Encoder fields shared by every family, and the family's options (OPTIONS).

    An option left None takes its default where the family reads it (`option(name)`); given to
    a family that does not read it (`input_feeding` to Bahdanau, `window` to global attention,
    `attn_hidden` with a non-additive score) it is an error naming the field.
    """

    attention: str = "bahdanau"  # the decoder family: one of DECODERS
    # The family's options (see OPTIONS): None = not given.
    score: str | None = None
    local: str | None = None
    window: int | None = None
    input_feeding: bool | None = None
    cell: str = "gru"  # one of CELLS
    embed_dim: int = 64
    hidden: int = 128
    attn_hidden: int | None = None
    layers: int = 1
    bidirectional: bool = True
    dropout: float = 0.1

    def __post_init__(self):
        check_fields(self)
        for name, allowed in (("attention", DECODERS), ("cell", CELLS)):
            if getattr(self, name) not in allowed:
                fail("Seq2SeqConfig", name, f"one of {list(allowed)}", repr(getattr(self, name)))
        reads = DECODERS[self.attention].reads(self)
        for name in OPTIONS:
            value = getattr(self, name)
            if value is not None and name not in reads:
                fail(
                    "Seq2SeqConfig",
                    name,
                    f"unset (None): attention={self.attention!r}"
                    + (f" with score={self.option('score')!r}" if "score" in reads else "")
                    + f" reads only {sorted(reads)}",
                    repr(value),
                )
        for name, allowed in (("score", tuple(scores.SCORES)), ("local", LOCAL)):
            if getattr(self, name) not in (None, *allowed):
                fail("Seq2SeqConfig", name, f"one of {list(allowed)}", repr(getattr(self, name)))
        for name in ("window", "attn_hidden", "embed_dim", "hidden", "layers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                fail("Seq2SeqConfig", name, "a positive int", repr(value))
        check_dropout("Seq2SeqConfig", self.dropout)

    def option(self, name: str):
        """The family option `name` (a key of OPTIONS): as given, else its default."""
        value = getattr(self, name)
        return OPTIONS[name] if value is None else value


def bahdanau(**overrides) -> Seq2SeqConfig:
    """RNNsearch (Bahdanau 2015): BiGRU encoder, additive score, maxout readout."""
    return Seq2SeqConfig(**{"attention": "bahdanau", "score": "additive", **overrides})


def luong(**overrides) -> Seq2SeqConfig:
    """Luong 2015 global attention, general score, input feeding (their best single model used
    local-p with general; global-general is the simplest strong variant)."""
    base = dict(attention="luong", score="general", cell="lstm", bidirectional=False)
    return Seq2SeqConfig(**{**base, "input_feeding": True, **overrides})


def encdec(**overrides) -> Seq2SeqConfig:
    """RNNencdec (Cho 2014; Sutskever 2014 with a GRU): the baseline of Bahdanau 2015."""
    return Seq2SeqConfig(**{"attention": "none", **overrides})


def simple(**overrides) -> Seq2SeqConfig:
    """SimpleRNN + attention (the lecture model): plain tanh cells, general score."""
    return Seq2SeqConfig(**{"attention": "simple", "score": "general", "cell": "rnn", **overrides})


def upgrade(fields: dict) -> dict:
    """A config dict written before the decoder families were classes (it has
    `max_source_len`) -> today's fields; any other dict is returned as it is.

    The old layout wrote every field for every family and ignored those a family did not read;
    they become None here, which builds the same model. Luong with local-m / local-p becomes
    the "luong-local" family; `max_source_len` is dropped (the model takes it from the data).
    """
    if "max_source_len" not in fields:
        return fields
    fields = {k: v for k, v in fields.items() if k != "max_source_len"}
    if fields.get("attention") == "luong" and fields.get("local") in LOCAL:
        fields["attention"] = "luong-local"
    if fields.get("local") == "global":
        fields["local"] = None
    decoder = DECODERS[fields["attention"]]
    score = fields.get("score") if "score" in decoder.options else None
    reads = decoder.reads(Seq2SeqConfig(attention=fields["attention"], score=score))
    return {k: (v if k not in OPTIONS or k in reads else None) for k, v in fields.items()}


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
    feed: torch.Tensor  # (b, d_feed): h~_{t-1} (Luong), c_{t-1} (simple); d_feed 0 otherwise
    step: int
    memory: EncoderOutput
    keys: PreparedKey | None  # keys prepared once per sentence

    @property
    def batch_size(self) -> int:
        return self.memory.annotations.shape[0]

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
        if keys is not None:
            keys = keys.index_select(index)
        return DecoderState(hidden, self.feed.index_select(0, index), self.step, memory, keys)

    def advance(self, hidden, feed: torch.Tensor, steps: int) -> DecoderState:
        return replace(self, hidden=hidden, feed=feed, step=self.step + steps)


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor  # (b, t, vocab)
    weights: torch.Tensor | None  # (b, t, j) attention over source, None without attention


class Encoder(nn.Module):
    """`layers` RNN layers of one or two directions; annotations h_j = [h->_j; h<-_j].

    One single-layer RNN per layer and direction, run on padded batches: the backward
    direction reads each sentence reversed within its own length, so padding never enters a
    real state. This replaces `pack_padded_sequence`, whose CPU backward zero-fills a whole
    (tokens, gates) buffer at every time step (measured here: 2-3x the encoder's cost).
    """

    def __init__(self, c: Seq2SeqConfig):
        super().__init__()
        cell, dirs = CELLS[c.cell], 2 if c.bidirectional else 1
        self.hidden, self.d_enc = c.hidden, c.hidden * dirs
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            nn.ModuleList(
                cell(c.embed_dim if layer == 0 else self.d_enc, c.hidden, batch_first=True)
                for _ in range(dirs)
            )
            for layer in range(c.layers)
        )

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """x: (b, j, embed_dim) embedded source, padded; lengths: (b,) -> EncoderOutput."""
        b, j, _ = x.shape
        lengths = lengths.to(x.device)
        positions = torch.arange(j, device=x.device)[None, :]  # (1, j)
        last = (lengths - 1)[:, None]  # (b, 1)
        reverse = torch.where(positions <= last, last - positions, positions)  # (b, j)
        for layer, directions in enumerate(self.layers):
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
        mask = padding_mask(lengths, j)  # (b, 1, j)
        annotations = x * mask.transpose(1, 2)  # zero at padding
        d = self.hidden
        rows = torch.arange(b, device=x.device)
        final = annotations[rows, last.squeeze(1), :d]  # forward state at the end: (b, d)
        if len(self.layers[0]) == 2:
            final = torch.cat([final, annotations[:, 0, d:]], -1)  # backward state at 0
        return EncoderOutput(annotations, mask, lengths, final)


class Decoder(nn.Module, abc.ABC):
    """Base of the decoder families: the initial state from the encoder (W_s), the RNN, and
    `step` (subclasses) from the embedded previous target to readout features.

    Class attributes:
        options: the config fields of OPTIONS the family reads.
        feeds_back: whether a step's attention output enters the next step; when it does not,
            `step` takes all target positions at once (teacher forcing runs the RNN once).
    """

    options: tuple[str, ...] = ()
    feeds_back = True

    @classmethod
    def reads(cls, c: Seq2SeqConfig) -> set[str]:
        """The options of `c` this family reads (a score-only option with that score only)."""
        score = c.option("score")
        return {n for n in cls.options if n not in SCORE_OPTIONS or SCORE_OPTIONS[n] == score}

    def __init__(self, c: Seq2SeqConfig, d_enc: int, d_in: int):
        super().__init__()
        self.hidden, self.num_layers, self.lstm = c.hidden, c.layers, c.cell == "lstm"
        self.drop = nn.Dropout(c.dropout)
        self.bridge = nn.Linear(d_enc, c.layers * c.hidden)  # W_s
        self.rnn = CELLS[c.cell](
            d_in,
            c.hidden,
            num_layers=c.layers,
            batch_first=True,
            dropout=c.dropout if c.layers > 1 else 0.0,
        )
        self.d_feed = 0  # size of what a step feeds the next one besides the RNN state
        self.d_out = c.hidden  # size of the readout features

    def prepare_keys(self, memory: EncoderOutput) -> PreparedKey | None:
        return None

    def start(self, memory: EncoderOutput) -> DecoderState:
        b = memory.final.shape[0]
        h0 = torch.tanh(self.bridge(memory.final)).view(b, self.num_layers, self.hidden)
        h0 = h0.transpose(0, 1).contiguous()  # (layers, b, d)
        hidden = (h0, torch.zeros_like(h0)) if self.lstm else h0
        feed = memory.final.new_zeros(b, self.d_feed)
        return DecoderState(hidden, feed, 0, memory, self.prepare_keys(memory))

    @abc.abstractmethod
    def step(self, x: torch.Tensor, state: DecoderState, need_weights: bool):
        """x: (b, 1, e) embedded y_{t-1} (any t positions when not `feeds_back`) -> readout
        features (b, t, d_out), weights (b, t, j) or None, new state."""

    def run(self, x: torch.Tensor, state: DecoderState, need_weights: bool):
        """All target positions x: (b, t, e) -> features (b, t, d_out), weights, state."""
        if not self.feeds_back:
            return self.step(x, state, need_weights)
        features, weights = [], []
        for x_t in x.unbind(1):  # unbind: one gradient op, not one zero-fill a step
            f, w, state = self.step(x_t.unsqueeze(1), state, need_weights)
            features.append(f)
            weights.append(w)
        features = torch.cat(features, 1)  # (b, t, d_out)
        return features, torch.cat(weights, 1) if need_weights else None, state

    def readout(self, features: torch.Tensor) -> torch.Tensor:
        """Per-position features before the output layer. Nothing here feeds back into the
        recurrence, so it runs once on all positions, not once per step."""
        return features


class EncDecDecoder(Decoder):
    """Sutskever 2014 / Cho 2014: s_t = f(s_{t-1}, E y_{t-1}); no attention."""

    feeds_back = False

    def __init__(self, c: Seq2SeqConfig, d_enc: int, max_source_len: int | None):
        super().__init__(c, d_enc, c.embed_dim)

    def step(self, x, state, need_weights):
        features, hidden = self.rnn(x, state.hidden)  # (b, t, d)
        return features, None, state.advance(hidden, state.feed, x.shape[1])


class AttentionDecoder(Decoder):
    """A decoder with a score over the annotations, keys prepared once per sentence."""

    options = ("score", "attn_hidden")

    def __init__(self, c: Seq2SeqConfig, d_enc: int, d_in: int, max_source_len: int | None):
        super().__init__(c, d_enc, d_in)
        name = c.option("score")
        if name == "location" and max_source_len is None:
            fail("Seq2Seq", "max_source_len", "the longest source for score='location'", None)
        self.score = scores.make_score(
            name, c.hidden, d_enc, d_hidden=c.option("attn_hidden"), max_keys=max_source_len
        )

    def prepare_keys(self, memory):
        """Keys and values, cleared under the padding mask once per sentence."""
        a = memory.annotations
        return prepare_key(self.score, a, value=a, mask=memory.mask)

    def attend(self, query: torch.Tensor, state: DecoderState, need_weights: bool):
        """query: (b, t, d) -> context (b, t, d_enc), weights (b, t, j) or None."""
        keys = state.keys
        out = attention(
            query,
            keys,
            keys.value,
            score=self.score,
            mask=keys.mask,
            return_weights=need_weights,
        )
        return out.context, out.weights


class BahdanauDecoder(AttentionDecoder):
    """Bahdanau 2015: attend with s_{i-1}, feed c_i into the RNN, maxout readout."""

    def __init__(self, c: Seq2SeqConfig, d_enc: int, max_source_len: int | None):
        super().__init__(c, d_enc, c.embed_dim + d_enc, max_source_len)  # c_i enters the RNN
        # maxout readout (appendix A.2.2): 2l units pooled in pairs
        self.maxout = nn.Linear(c.hidden + d_enc + c.embed_dim, 2 * c.hidden)

    def step(self, x, state, need_weights):
        hidden = state.hidden
        s_prev = (hidden[0] if isinstance(hidden, tuple) else hidden)[-1]  # s_{i-1}: (b, d)
        context, w = self.attend(s_prev.unsqueeze(1), state, need_weights)  # (b, 1, d_enc)
        out, hidden = self.rnn(torch.cat([x, context], -1), hidden)  # s_i: (b, 1, d)
        features = torch.cat([out, context, x], -1)  # (b, 1, d + d_enc + e)
        return features, w, state.advance(hidden, state.feed, 1)

    def readout(self, features):
        t = self.maxout(self.drop(features))  # (b, t, 2d)
        # maxout: (b, t, d); the sizes given, not -1, which an empty batch cannot infer
        return t.unflatten(-1, (t.shape[-1] // 2, 2)).amax(-1)


class LuongDecoder(AttentionDecoder):
    """Luong 2015 global attention: h_t = f(h_{t-1}, [x_t; h~_{t-1}]), c_t = attend(h_t, H),
    h~_t = tanh(W_c [c_t; h_t]). Without input feeding nothing feeds back, so teacher forcing
    runs the RNN over all positions at once and attends for all of them in one call."""

    options = ("score", "attn_hidden", "input_feeding")

    def __init__(self, c: Seq2SeqConfig, d_enc: int, max_source_len: int | None):
        feeding = c.option("input_feeding")
        d_feed = c.hidden if feeding else 0  # h~_{t-1}
        super().__init__(c, d_enc, c.embed_dim + d_feed, max_source_len)
        self.input_feeding = self.feeds_back = feeding
        self.d_feed = d_feed
        self._add_local(c)  # its parameters are created between the score's and W_c
        self.combine = nn.Linear(d_enc + c.hidden, c.hidden, bias=False)  # W_c

    def _add_local(self, c: Seq2SeqConfig) -> None:
        """Global attention has nothing here; `LuongLocalDecoder` adds its window."""

    def step(self, x, state, need_weights):
        if self.input_feeding:
            x = torch.cat([x, state.feed.unsqueeze(1)], -1)  # (b, 1, e + d)
        out, hidden = self.rnn(x, state.hidden)  # h_t: (b, t, d)
        context, w = self.attend(out, state, need_weights)
        features = torch.tanh(self.combine(torch.cat([context, out], -1)))  # h~_t (b, t, d)
        feed = features.squeeze(1) if self.input_feeding else state.feed
        return features, w, state.advance(hidden, feed, x.shape[1])


class LuongLocalDecoder(LuongDecoder):
    """Luong 2015 local attention (sec. 3.2): local-m or local-p around p_t, half-width D."""

    options = (*LuongDecoder.options, "local", "window")

    def _add_local(self, c):
        predictive = c.option("local") == "local-p"
        self.local = LocalAttention(
            self.score, c.option("window"), d_query=c.hidden if predictive else None
        )

    def attend(self, query, state, need_weights):
        m = state.memory
        positions = None  # local-p predicts its centres; local-m's are the target positions
        if not self.local.predictive:
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
        return out.context, (out.weights if need_weights else None)


class SimpleDecoder(AttentionDecoder):
    """SimpleRNN + attention: s_t = f(s_{t-1}, [x_t; c_{t-1}]), c_t = attend(s_t, H)."""

    def __init__(self, c: Seq2SeqConfig, d_enc: int, max_source_len: int | None):
        super().__init__(c, d_enc, c.embed_dim + d_enc, max_source_len)  # c_{t-1}
        self.d_feed, self.d_out = d_enc, c.hidden + d_enc

    def step(self, x, state, need_weights):
        out, hidden = self.rnn(torch.cat([x, state.feed.unsqueeze(1)], -1), state.hidden)
        context, w = self.attend(out, state, need_weights)  # (b, 1, d_enc)
        features = torch.cat([out, context], -1)  # (b, 1, d + d_enc)
        return features, w, state.advance(hidden, context.squeeze(1), 1)


# The decoder families by name: the one place `Seq2SeqConfig.attention` is resolved.
DECODERS: dict[str, type[Decoder]] = {
    "none": EncDecDecoder,
    "bahdanau": BahdanauDecoder,
    "luong": LuongDecoder,
    "luong-local": LuongLocalDecoder,
    "simple": SimpleDecoder,
}

# Checkpoints written before the decoders were classes: old key prefix -> new.
_OLD_KEYS = (
    (r"encoder\.(\d+)\.", r"encoder.layers.\1."),
    (r"bridge\.", "decoder.bridge."),
    (r"decoder\.", "decoder.rnn."),
    (r"(score|local|combine)\.", r"decoder.\1."),
    (r"readout\.", "decoder.maxout."),
)


def _check_source(function: str, source: object, lengths: object, vocab: int) -> None:
    """source (b, j) integer ids below `vocab` and lengths (b,) integers in 1..j: a length
    past j or one length for the whole batch would read padding as words."""
    check_tokens(function, "source", source, 2, "(batch, source_len)", vocab)
    b, j = source.shape
    values = f"values in 1..source_len = {j}"
    check_integers(
        function, "lengths", lengths, (b,), 1, j, values=values, shape_note=", one per source"
    )


def _load_old_keys(module, state_dict, prefix, *args) -> None:
    """Rename the keys of a checkpoint in the old layout (a top-level `bridge`) in place."""
    if prefix + "bridge.weight" not in state_dict:
        return
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix) :]
        for old, new in _OLD_KEYS:
            if re.match(old, rest):
                state_dict[prefix + re.sub(old, new, rest, count=1)] = state_dict.pop(key)
                break


class Seq2Seq(nn.Module):
    """Encoder-decoder over token ids: `Encoder`, the family's decoder (`DECODERS`), and the
    output layer; see the module docstring for the families.

    Args:
        config: `Seq2SeqConfig`.
        source_vocab, target_vocab: vocabulary sizes (id 0 is padding).
        max_source_len: the longest source; the location score addresses that many positions
            (required for it, unused otherwise).
        max_target_len: unused (RNN decoders have no length limit).
    """

    def __init__(
        self,
        config: Seq2SeqConfig,
        source_vocab: int,
        target_vocab: int,
        max_source_len: int | None = None,
        max_target_len: int | None = None,
    ):
        super().__init__()
        for name, value in (("source_vocab", source_vocab), ("target_vocab", target_vocab)):
            check_size("Seq2Seq", name, value)
        for name, value in (("max_source_len", max_source_len), ("max_target_len", max_target_len)):
            check_size("Seq2Seq", name, value, optional=True)
        c = self.config = config
        # Creation order is the seed's contract: the same seed gives the same weights.
        self.source_embed = nn.Embedding(source_vocab, c.embed_dim, padding_idx=0)
        self.target_embed = nn.Embedding(target_vocab, c.embed_dim, padding_idx=0)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(c)
        self.decoder = DECODERS[c.attention](c, self.encoder.d_enc, max_source_len)
        self.output = nn.Linear(self.decoder.d_out, target_vocab)
        self.register_load_state_dict_pre_hook(_load_old_keys)

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """source: (b, j) ids, padded with 0; lengths: (b,) -> EncoderOutput."""
        _check_source("Seq2Seq.encode", source, lengths, self.source_embed.num_embeddings)
        return self._encode(source, lengths)

    def _encode(self, source: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        return self.encoder(self.drop(self.source_embed(source)), lengths)  # x: (b, j, e)

    def start(self, memory: EncoderOutput) -> DecoderState:
        return self.decoder.start(memory)

    def _decode(self, tokens: torch.Tensor, state: DecoderState, need_weights: bool):
        """Target inputs tokens (b, t) from `state` -> logits (b, t, V), weights, state."""
        x = self.drop(self.target_embed(tokens))  # (b, t, e)
        features, weights, state = self.decoder.run(x, state, need_weights)
        return self.output(self.drop(self.decoder.readout(features))), weights, state

    def forward(
        self,
        source: torch.Tensor,
        lengths: torch.Tensor,
        target_in: torch.Tensor,
        return_weights: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher forcing. source: (b, j); lengths: (b,); target_in: (b, t) starting with BOS.
        Returns Seq2SeqOutput(logits (b, t, V), weights (b, t, j) or None)."""
        _check_source("Seq2Seq", source, lengths, self.source_embed.num_embeddings)
        vocab = self.target_embed.num_embeddings
        batch = (source.shape[0], "'source'")
        check_tokens(
            *("Seq2Seq", "target_in", target_in, 2, "(batch, target_len)", vocab), batch=batch
        )
        state = self.start(self._encode(source, lengths))
        logits, weights, _ = self._decode(target_in, state, return_weights)
        return Seq2SeqOutput(logits, weights)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState):
        """The decoding engine's step: tokens (b,) -> log-probabilities (b, V), new state."""
        logits, _, state = self._decode(tokens.unsqueeze(1), state, False)
        return torch.log_softmax(at_least_float32(logits[:, -1]), -1), state
