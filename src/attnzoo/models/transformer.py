"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need").

Encoder (sec. 3.1): N identical layers, each multi-head self-attention over the source (padding
masked) and a position-wise feed-forward network (sec. 3.3), each sub-layer wrapped as
    LayerNorm(x + Dropout(Sublayer(x)))                                   (sec. 3.1, 5.4)
Decoder: N layers of masked (causal) self-attention, cross-attention to the encoder output
(queries from the decoder, keys and values from the memory, sec. 3.2.3), and the FFN.
Inputs are token embeddings scaled by sqrt(d_model) plus positional encodings (sec. 3.4, 3.5);
the decoder output goes through a linear map and softmax, whose weight may be the target
embedding matrix (sec. 3.4).

Every attention is `attnzoo.core.MultiHeadAttention` with the scaled dot-product score
(sec. 3.2.1): softmax(Q K^T / sqrt(d_k)) V. `TransformerLM` is the decoder alone (no
cross-attention), a language model.

Note:
    - Embeddings are initialised N(0, d_model^-0.5) so that the sqrt(d_model)-scaled embedding
      has unit variance, the scale of the positional encoding; the paper does not give its
      initialisation. Linear weights are Xavier-uniform, as in `torch.nn.Transformer`, with
      the fused [W_q; W_k; W_v] of each attention initialised per (d_model, d_model) block, as
      three separate layers would be (bound sqrt(6 / (2 d_model))). `torch.nn.Transformer`
      draws its fused `in_proj_weight` with the bound of the whole (3 d_model, d_model) matrix,
      sqrt(6 / (4 d_model)); per block keeps the distribution this model always had.
    - The source and target vocabularies are separate here, so `tie_embeddings` shares the
      target embedding with the pre-softmax projection only (the paper also shares the source
      embedding, over one joint BPE vocabulary).
    - Dropout is where sec. 5.4 puts it: on every sub-layer output before the residual sum, and
      on the sums of embeddings and positional encodings. No dropout on attention weights or
      inside the FFN (later tensor2tensor settings; `torch.nn.Transformer` has both).
    - `pre_norm=True` is the later x + Sublayer(LayerNorm(x)) (Wang et al. 2019, Xiong et al.
      2020), with a final LayerNorm after each stack (always: the residual stream is never
      normalised otherwise). `final_norm=True` adds that LayerNorm to a post-LN stack too, as
      `torch.nn.Transformer` has it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core import (
    KVCache,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    padding_mask,
    sinusoidal_encoding,
)
from attnzoo.core.checks import check_dropout, check_fields, check_integers, check_tokens, fail
from attnzoo.core.mha import StackedLinear
from attnzoo.core.normalisers import at_least_float32

POSITIONS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 128
    heads: int = 4
    layers_enc: int = 2
    layers_dec: int = 2
    d_ff: int = 512
    dropout: float = 0.1  # P_drop of sec. 5.4
    pre_norm: bool = False  # False: post-LN, as the paper
    final_norm: bool = False  # LayerNorm after each stack also when post-LN (pre-LN: always)
    positions: str = "sinusoidal"  # sinusoidal | learned
    tie_embeddings: bool = True  # target embedding = pre-softmax weight (sec. 3.4)
    layer_norm_eps: float = 1e-5  # epsilon of every LayerNorm (torch's default)

    def __post_init__(self):
        check_fields(self)
        for name in ("d_model", "heads", "layers_enc", "layers_dec", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail("TransformerConfig", name, "a positive int", value)
        if self.d_model % self.heads:
            fail(
                "TransformerConfig",
                "heads",
                f"a divisor of d_model = {self.d_model}",
                self.heads,
            )
        if self.positions not in POSITIONS:
            fail(
                "TransformerConfig", "positions", f"one of {list(POSITIONS)}", repr(self.positions)
            )
        check_dropout("TransformerConfig", self.dropout)
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < math.inf:
            fail("TransformerConfig", "layer_norm_eps", "a positive finite float", eps)

    @property
    def use_final_norm(self) -> bool:
        return self.pre_norm or self.final_norm

    def unread(self) -> dict[str, str]:
        """The fields these settings never read -> why (`rundir.unread_keys`): final_norm
        under pre-LN, which always has the final LayerNorm."""
        return {"final_norm": "pre_norm=True always has it"} if self.pre_norm else {}


def upgrade(fields: dict) -> dict:
    """A config dict written when the position sizes were config fields -> today's fields (the
    model takes them from the task: `Transformer(config, ..., max_source_len, max_target_len)`).
    """
    return {k: v for k, v in fields.items() if k not in ("max_source_len", "max_target_len")}


def tiny(**overrides) -> TransformerConfig:
    """A CPU-sized Transformer for the built-in tasks: d_model 128, 4 heads, 2 + 2 layers,
    d_ff 512 (the paper's ratios d_ff = 4 d_model and d_head = 32 ... 64 kept)."""
    return replace(TransformerConfig(), **overrides)


def base(**overrides) -> TransformerConfig:
    """Transformer base (Vaswani 2017, Table 3): N = 6, d_model = 512, d_ff = 2048, h = 8,
    P_drop = 0.1, shared embeddings."""
    config = TransformerConfig(
        d_model=512, heads=8, layers_enc=6, layers_dec=6, d_ff=2048, dropout=0.1
    )
    return replace(config, **overrides)


# -- building blocks ---------------------------------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (sec. 3.3). x: (batch, len, d_model)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.inner = nn.Linear(d_model, d_ff)  # W_1, b_1
        self.outer = nn.Linear(d_ff, d_model)  # W_2, b_2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


class Residual(nn.Module):
    """One sub-layer connection: LayerNorm(x + Dropout(Sublayer(x))) (sec. 3.1, 5.4), or with
    pre_norm x + Dropout(Sublayer(LayerNorm(x))). Call `input(x)` for the sub-layer's input,
    then `add(x, sublayer_output)`."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre_norm else x

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + (self.drop(y) if self.drop.p > 0 else y)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    """Self-attention + FFN, each in a `Residual` (sec. 3.1)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attention = MultiHeadAttention(c.d_model, c.heads, "scaled_dot")
        self.feed_forward = FeedForward(c.d_model, c.d_ff)
        self.attention_residual = Residual(c.d_model, c.dropout, c.pre_norm, c.layer_norm_eps)
        self.ffn_residual = Residual(c.d_model, c.dropout, c.pre_norm, c.layer_norm_eps)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (batch, source_len, d_model); mask: (batch, 1, source_len) or None.
        Returns x (batch, source_len, d_model), weights (batch, heads, source_len, source_len)
        or None."""
        r = self.attention_residual
        out = self.self_attention(r.input(x), mask=mask, return_weights=need_weights)
        x = r.add(x, out.context)
        r = self.ffn_residual
        return r.add(x, self.feed_forward(r.input(x))), out.weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory (absent with `cross=False`, for a
    decoder-only language model) and FFN, each in a `Residual` (sec. 3.1)."""

    def __init__(self, c: TransformerConfig, cross: bool = True):
        super().__init__()
        self.self_attention = MultiHeadAttention(c.d_model, c.heads, "scaled_dot")
        self.self_residual = Residual(c.d_model, c.dropout, c.pre_norm, c.layer_norm_eps)
        self.cross_attention = (
            MultiHeadAttention(c.d_model, c.heads, "scaled_dot") if cross else None
        )
        self.cross_residual = (
            Residual(c.d_model, c.dropout, c.pre_norm, c.layer_norm_eps) if cross else None
        )
        self.feed_forward = FeedForward(c.d_model, c.d_ff)
        self.ffn_residual = Residual(c.d_model, c.dropout, c.pre_norm, c.layer_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        *,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        need_weights: bool = False,
    ):
        """x: (batch, target_len, d_model); memory: (batch, source_len, d_model); memory_mask:
        (batch, 1, source_len) or None. With caches, x holds only the new positions.
        Returns x (batch, target_len, d_model), self weights (batch, heads, target_len,
        cached + target_len) and cross weights (batch, heads, target_len, source_len), or
        None for each when not requested."""
        r = self.self_residual
        out = self.self_attention(
            r.input(x), causal=True, cache=self_cache, return_weights=need_weights
        )
        x = r.add(x, out.context)
        cross_weights = None
        if self.cross_attention is not None:
            r = self.cross_residual
            cross = self.cross_attention(
                r.input(x),
                memory,
                mask=memory_mask,
                cache=cross_cache,
                return_weights=need_weights,
            )
            x = r.add(x, cross.context)
            cross_weights = cross.weights
        r = self.ffn_residual
        return r.add(x, self.feed_forward(r.input(x))), out.weights, cross_weights


class Embedder(nn.Module):
    """Dropout(E[tokens] * sqrt(d_model) + PE) (sec. 3.4, 3.5, 5.4).
    tokens: (batch, len) -> (batch, len, d_model)."""

    def __init__(self, vocab: int, c: TransformerConfig, max_len: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, c.d_model, padding_idx=0)
        nn.init.normal_(self.embedding.weight, std=c.d_model**-0.5)
        with torch.no_grad():
            self.embedding.weight[0].zero_()
        self.scale = math.sqrt(c.d_model)
        if c.positions == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model)
            # positions < max_len encoded once: decoding adds one row per step
            table = sinusoidal_encoding(max_len, c.d_model)  # (max_len, d_model)
        else:
            self.positions, table = LearnedPositionalEmbedding(max_len, c.d_model), None
        self.register_buffer("table", table, persistent=False)
        self.drop = nn.Dropout(c.dropout)

    def _apply(self, fn, recurse=True):
        """`.to()`, `.double()`, `.cuda()`... as for any module, then the table computed again in
        its new dtype and device: converted, it would hold the float32 rounding of the sinusoids
        (a float64 model's positions off by ~3e-8 below max_len, exact past it)."""
        super()._apply(fn, recurse)
        if self.table is not None:
            length, d_model = self.table.shape
            self.table = sinusoidal_encoding(
                length, d_model, device=self.table.device, dtype=self.table.dtype
            )
        return self

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.embedding(tokens) * self.scale  # (b, len, d_model)
        end = offset + tokens.shape[-1]
        if self.table is not None and end <= self.table.shape[0]:
            x = x + self.table[offset:end].to(x.dtype)
        else:
            x = self.positions(x, offset)
        return self.drop(x) if self.drop.p > 0 else x


def _init_linear(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases; a `StackedLinear` (the fused in-projection) per
    block, each with its own fan-in and fan-out (see the module Note)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            blocks = m.block_views() if isinstance(m, StackedLinear) else [(m.weight, m.bias)]
            for weight, _ in blocks:
                nn.init.xavier_uniform_(weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _check_sizes(function: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            fail(function, name, "a positive int", value)


def _torch_layers(function: str, module: nn.Transformer) -> list[tuple[str, nn.Module]]:
    """(name, layer) for every layer of a torch.nn.Transformer, which must be the standard
    classes (a subclass may compute something else)."""
    stacks = (
        ("encoder", module.encoder, nn.TransformerEncoder, nn.TransformerEncoderLayer),
        ("decoder", module.decoder, nn.TransformerDecoder, nn.TransformerDecoderLayer),
    )
    layers = []
    for stack_name, stack, stack_type, layer_type in stacks:
        if type(stack) is not stack_type:
            fail(
                function,
                "module",
                f"a standard {stack_type.__name__} as {stack_name}",
                f"custom {type(stack).__name__}",
            )
        for k, layer in enumerate(stack.layers):
            if type(layer) is not layer_type:
                fail(
                    function,
                    "module",
                    f"standard {layer_type.__name__}s",
                    f"custom {type(layer).__name__} at {stack_name}.layers.{k}",
                )
            layers.append((f"{stack_name}.layers.{k}", layer))
    for stack_name, stack in (("encoder", module.encoder), ("decoder", module.decoder)):
        if stack.norm is not None:
            layers.append((f"{stack_name}.norm", stack.norm))
    return layers


def _one_setting_per_stack(
    function: str, layers: list[tuple[str, nn.Module]], d_model: int, heads: int
) -> dict:
    """The settings every layer must share (our config has one value for all of them):
    norm_first, dim_feedforward, dropout, layer_norm_eps; and those we have no other value
    for: activation=relu, bias=True, affine LayerNorms of size d_model, `heads` heads."""
    seen: dict[str, dict] = {}

    def same(setting: str, where: str, value) -> None:
        seen.setdefault(setting, {}).setdefault(value, where)
        if len(seen[setting]) > 1:
            values = ", ".join(f"{v!r} in {w}" for v, w in seen[setting].items())
            fail(function, "module", f"one {setting} in every layer", values)

    for where, layer in layers:
        if isinstance(layer, nn.LayerNorm):
            norms = [("", layer)]
        else:
            norms = [(f".{n}", m) for n, m in layer.named_children() if n.startswith("norm")]
            activation = layer.activation
            if not (activation is F.relu or type(activation) is nn.ReLU):
                got = getattr(activation, "__name__", type(activation).__name__)
                fail(function, "module", f"activation='relu' (sec. 3.3) in {where}", got)
            linears = [layer.linear1, layer.linear2]
            attentions = [m for m in layer.children() if isinstance(m, nn.MultiheadAttention)]
            if any(m.bias is None for m in linears) or any(
                a.in_proj_bias is None or a.out_proj.bias is None for a in attentions
            ):
                fail(function, "module", f"bias=True in {where}", "bias=False")
            for attention in attentions:
                if attention.num_heads != heads or attention.embed_dim != d_model:
                    fail(
                        function,
                        "module",
                        f"attention with nhead={heads}, d_model={d_model} in {where}",
                        f"nhead={attention.num_heads}, d_model={attention.embed_dim}",
                    )
                if attention.kdim != d_model or attention.vdim != d_model:
                    fail(
                        function,
                        "module",
                        f"kdim = vdim = d_model = {d_model} in {where}",
                        f"kdim={attention.kdim}, vdim={attention.vdim}",
                    )
                same("dropout", where, attention.dropout)
            same("norm_first", where, layer.norm_first)
            same("dim_feedforward", where, layer.linear1.out_features)
            for n, m in layer.named_children():
                if isinstance(m, nn.Dropout):
                    same("dropout", f"{where}.{n}", m.p)
        for suffix, norm in norms:
            if type(norm) is not nn.LayerNorm:
                fail(function, "module", f"nn.LayerNorm in {where}{suffix}", type(norm).__name__)
            if norm.weight is None or norm.bias is None or norm.normalized_shape != (d_model,):
                fail(
                    function,
                    "module",
                    f"affine LayerNorms of size {d_model} with bias in {where}{suffix}",
                    f"normalized_shape={norm.normalized_shape}, weight "
                    f"{'absent' if norm.weight is None else 'present'}, bias "
                    f"{'absent' if norm.bias is None else 'present'}",
                )
            same("layer_norm_eps", f"{where}{suffix}", norm.eps)
    return {setting: next(iter(values)) for setting, values in seen.items()}


# -- outputs and decoding state ----------------------------------------------------------------


@dataclass
class TransformerMemory:
    """The encoder's output."""

    states: torch.Tensor  # (b, j, d_model)
    mask: torch.Tensor  # (b, 1, j) True = real source token
    attend_mask: torch.Tensor | None  # `mask`, or None when no row is padded (faster path)
    weights: tuple[torch.Tensor, ...] | None = None  # per layer (b, h, j, j), when requested


class DecoderStates(NamedTuple):
    hidden: torch.Tensor  # (b, t, d_model), before the vocabulary projection
    self_weights: tuple[torch.Tensor, ...] | None  # per layer (b, h, t, t)
    cross_weights: tuple[torch.Tensor, ...] | None  # per layer (b, h, t, j)


@dataclass
class TransformerOutput:
    logits: torch.Tensor  # (b, t, vocab)
    weights: torch.Tensor | None  # (b, t, j): last layer's cross-attention, mean over heads
    encoder_weights: tuple[torch.Tensor, ...] | None = None  # per layer (b, h, j, j)
    decoder_weights: tuple[torch.Tensor, ...] | None = None  # per layer (b, h, t, t)
    cross_weights: tuple[torch.Tensor, ...] | None = None  # per layer (b, h, t, j)


def _reorder_cache(cache: KVCache, index: torch.Tensor, masks=None) -> KVCache:
    """A reordered copy (beam search keeps the old state): the same owner and kind, so the
    cache still refuses another module (`CacheError`). `masks`: `KVCache.reorder`'s."""
    new = replace(cache)
    new.reorder(index, masks=masks)
    return new


@dataclass
class TransformerState:
    """Incremental decoding state. With caches (the default), each decoder layer keeps a
    self-attention `KVCache` that grows by one position per step and a cross-attention
    `KVCache` that projects the memory once and is then static. Without caches
    (`start(memory, cache=False)`), `prefix` keeps the tokens fed so far and every step
    recomputes the whole prefix (the reference that caching must match).

    `decode_step` extends the caches in place: keep using the state it returns (a state
    stepped from before is refused; to step from one twice, copy it first with
    `reorder(torch.arange(batch))`).
    """

    memory: torch.Tensor  # (b, j, d_model)
    memory_mask: torch.Tensor | None  # (b, 1, j)
    step: int = 0
    self_caches: list[KVCache] | None = None
    cross_caches: list[KVCache] | None = None
    prefix: torch.Tensor | None = None  # (b, step) without caches

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def reorder(self, index: torch.Tensor) -> TransformerState:
        """Keep batch rows `index` (beam search): a new state, self unchanged. The cross
        caches learn that the reordered mask is the one their memory is cleared under."""
        mask = self.memory_mask
        kept = None if mask is None else mask.index_select(0, index)
        masks = None if mask is None else (mask, kept)
        return TransformerState(
            self.memory.index_select(0, index),
            kept,
            self.step,
            None
            if self.self_caches is None
            else [_reorder_cache(c, index) for c in self.self_caches],
            None
            if self.cross_caches is None
            else [_reorder_cache(c, index, masks) for c in self.cross_caches],
            None if self.prefix is None else self.prefix.index_select(0, index),
        )


# -- the model ---------------------------------------------------------------------------------


class Transformer(nn.Module):
    """The encoder-decoder Transformer over token ids (Vaswani 2017, sec. 3, Figure 1).

        p(y_t | y_<t, x) = softmax(W_o Decoder(Embed(y_<t), Encoder(Embed(x))))

    Args:
        config: `TransformerConfig`.
        source_vocab, target_vocab: vocabulary sizes (id 0 is padding).
        max_source_len, max_target_len: the longest source and target (decoded output
            included): the sizes of the learned position tables, and of the precomputed
            sinusoidal ones (longer inputs compute their sinusoidal encoding).
    """

    # what `forward(...).weights` is, for a figure of it (the task's alignment.png)
    alignment_note = "last layer's cross-attention, mean over heads"

    def __init__(
        self,
        config: TransformerConfig,
        source_vocab: int,
        target_vocab: int,
        max_source_len: int,
        max_target_len: int,
    ):
        super().__init__()
        _check_sizes(
            "Transformer",
            source_vocab=source_vocab,
            target_vocab=target_vocab,
            max_source_len=max_source_len,
            max_target_len=max_target_len,
        )
        c = self.config = config
        self.source_embed = Embedder(source_vocab, c, max_source_len)
        self.target_embed = Embedder(target_vocab, c, max_target_len)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.layers_enc))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers_dec))
        self.encoder_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.use_final_norm else None
        )
        self.decoder_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.use_final_norm else None
        )
        self.output = nn.Linear(c.d_model, target_vocab)
        _init_linear(self)
        if c.tie_embeddings:
            self.output.weight = self.target_embed.embedding.weight

    # -- encoder -------------------------------------------------------------------------------

    def encode(
        self, source: torch.Tensor, lengths: torch.Tensor, *, return_weights: bool = False
    ) -> TransformerMemory:
        """source: (b, j) ids padded with 0; lengths: (b,) real tokens per row.
        Returns TransformerMemory(states (b, j, d_model), mask (b, 1, j), ...)."""
        vocab = self.source_embed.embedding.num_embeddings
        check_tokens("Transformer.encode", "source", source, 2, "(batch, source_len)", vocab)
        b, j = source.shape
        # a length of 0 would leave a row nothing to attend (zeros that read as a source)
        values = f"values in 1..source_len = {j}"
        check_integers(
            *("Transformer.encode", "lengths", lengths, (b,), 1, j),
            values=values,
            shape_note=", one per source",
        )
        lengths = lengths.to(source.device)
        mask = padding_mask(lengths, j)  # (b, 1, j)
        # No padding: no mask (the faster path). The meta device has no values to look at.
        unpadded = source.device.type != "meta" and bool((lengths >= j).all())
        attend_mask = None if unpadded else mask
        x = self.source_embed(source)  # (b, j, d_model)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, attend_mask, return_weights)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return TransformerMemory(x, mask, attend_mask, tuple(weights) if return_weights else None)

    # -- decoder -------------------------------------------------------------------------------

    def decode(
        self, target_in: torch.Tensor, memory: TransformerMemory, *, return_weights: bool = False
    ) -> DecoderStates:
        """Teacher-forced decoder. target_in: (b, t) ids starting with BOS.
        Returns DecoderStates(hidden (b, t, d_model) before the vocabulary projection,
        per-layer self and cross weights when requested)."""
        vocab = self.target_embed.embedding.num_embeddings
        batch = (memory.states.shape[0], "the memory")
        check_tokens(
            *("Transformer.decode", "target_in", target_in, 2, "(batch, target_len)", vocab),
            batch=batch,
        )
        x = self.target_embed(target_in)  # (b, t, d_model)
        self_weights, cross_weights = [], []
        for layer in self.decoder:
            x, ws, wc = layer(x, memory.states, memory.attend_mask, need_weights=return_weights)
            self_weights.append(ws)
            cross_weights.append(wc)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if not return_weights:
            return DecoderStates(x, None, None)
        return DecoderStates(x, tuple(self_weights), tuple(cross_weights))

    def forward(
        self,
        source: torch.Tensor,
        lengths: torch.Tensor,
        target_in: torch.Tensor,
        return_weights: bool = False,
    ) -> TransformerOutput:
        """Teacher forcing. source: (b, j); lengths: (b,); target_in: (b, t) starting with BOS.
        Returns TransformerOutput(logits (b, t, V), weights (b, t, j) or None, and with
        `return_weights` the per-head maps of every layer)."""
        memory = self.encode(source, lengths, return_weights=return_weights)
        if return_weights and memory.attend_mask is None:
            memory.attend_mask = memory.mask  # same result; keeps padded keys visibly at 0
        hidden, self_w, cross_w = self.decode(target_in, memory, return_weights=return_weights)
        logits = self.output(hidden)  # (b, t, V)
        if not return_weights:
            return TransformerOutput(logits, None)
        alignment = cross_w[-1].mean(1)  # last layer, mean over heads: (b, t, j)
        return TransformerOutput(logits, alignment, memory.weights, self_w, cross_w)

    def start(self, memory: TransformerMemory, *, cache: bool = True) -> TransformerState:
        """The decoding state before the first target token: empty per-layer caches, or with
        `cache=False` an empty prefix (recompute everything at every step)."""
        state = TransformerState(memory.states, memory.attend_mask)
        if cache:
            state.self_caches = [KVCache() for _ in self.decoder]
            state.cross_caches = [KVCache() for _ in self.decoder]
        else:
            b = memory.states.shape[0]
            state.prefix = torch.zeros(b, 0, dtype=torch.long, device=memory.states.device)
        return state

    def decode_step(
        self, tokens: torch.Tensor, state: TransformerState
    ) -> tuple[torch.Tensor, TransformerState]:
        """The decoding engine's step: tokens (b,) -> log-probabilities (b, V), new state."""
        check_tokens("Transformer.decode_step", "tokens", tokens, 1, "(batch,)")
        _check_current("Transformer.decode_step", state.self_caches or [], state.step)
        if state.prefix is not None:
            prefix = torch.cat([state.prefix, tokens[:, None]], 1)  # (b, step + 1)
            memory = TransformerMemory(state.memory, state.memory_mask, state.memory_mask)
            hidden = self.decode(prefix, memory).hidden[:, -1]  # (b, d_model)
            new = replace(state, step=state.step + 1, prefix=prefix)
        else:
            x = self.target_embed(tokens[:, None], state.step)  # (b, 1, d_model)
            for layer, self_cache, cross_cache in zip(
                self.decoder, state.self_caches, state.cross_caches, strict=True
            ):
                x, _, _ = layer(
                    x,
                    state.memory,
                    state.memory_mask,
                    self_cache=self_cache,
                    cross_cache=cross_cache,
                )
            if self.decoder_norm is not None:
                x = self.decoder_norm(x)
            hidden = x[:, -1]  # (b, d_model)
            new = replace(state, step=state.step + 1)
        logits = self.output(hidden)  # (b, V)
        return torch.log_softmax(at_least_float32(logits), -1), new

    # -- PyTorch parity ----------------------------------------------------------------------

    @classmethod
    def from_torch(
        cls,
        module: nn.Transformer,
        source_embedding: nn.Embedding,
        target_embedding: nn.Embedding,
        output: nn.Linear | None = None,
        *,
        positions: str = "sinusoidal",
        max_source_len: int = 256,
        max_target_len: int = 256,
    ) -> Transformer:
        """Build one with the weights of a `torch.nn.Transformer` (ReLU, biases on) and its
        input embeddings; `output` is the pre-softmax linear map (None: tied to
        `target_embedding`); `max_source_len` and `max_target_len` as in the constructor.

        Given sources embedded as `source_embedding(x) * sqrt(d_model) + PE`, and the same for
        targets, the module gives the same encoder and decoder outputs as ours, in eval mode
        (ours has no dropout on attention weights or inside the FFN; the module's dropout
        probability becomes P_drop). The final LayerNorms torch.nn.Transformer puts after each
        stack become `final_norm=True`.

        Every layer of both stacks is checked, not the first only. Copied: sizes, head count,
        norm_first, dropout, the LayerNorms' eps (set on the built LayerNorms: the config has
        no field for it), all weights. `batch_first` does not matter (ours is batch-first).
        Refused, naming the setting: custom encoder, decoder or layer classes, an activation
        other than ReLU, norm_first, d_ff, heads, eps or dropout differing between layers,
        bias=False, LayerNorms without affine parameters, attention that
        `MultiHeadAttention.from_torch` refuses.
        """
        name = "Transformer.from_torch"
        if not isinstance(module, nn.Transformer):
            fail(name, "module", "a torch.nn.Transformer", type(module).__name__, TypeError)
        d_model = module.d_model
        layers = _torch_layers(name, module)
        enc_layers, dec_layers = module.encoder.layers, module.decoder.layers
        first = enc_layers[0]
        settings = _one_setting_per_stack(name, layers, d_model, module.nhead)
        if (module.encoder.norm is None) != (module.decoder.norm is None):
            fail(name, "module", "final norms on both stacks or neither", "only one")
        if first.norm_first and module.encoder.norm is None:
            fail(name, "module", "final norms after pre-LN stacks", "none")
        for argument, emb in (
            ("source_embedding", source_embedding),
            ("target_embedding", target_embedding),
        ):
            if not isinstance(emb, nn.Embedding) or emb.embedding_dim != d_model:
                got = getattr(emb, "embedding_dim", type(emb).__name__)
                fail(name, argument, f"an nn.Embedding of dimension {d_model}", got)
        if output is not None and (
            not isinstance(output, nn.Linear)
            or output.in_features != d_model
            or output.out_features != target_embedding.num_embeddings
        ):
            got = (
                f"in_features={output.in_features}, out_features={output.out_features}"
                if isinstance(output, nn.Linear)
                else type(output).__name__
            )
            fail(
                name,
                "output",
                f"an nn.Linear({d_model}, {target_embedding.num_embeddings}) or None",
                got,
            )
        config = TransformerConfig(
            d_model=d_model,
            heads=module.nhead,
            layers_enc=len(enc_layers),
            layers_dec=len(dec_layers),
            d_ff=settings["dim_feedforward"],
            dropout=settings["dropout"],
            pre_norm=settings["norm_first"],
            final_norm=module.encoder.norm is not None,
            positions=positions,
            tie_embeddings=output is None,
            layer_norm_eps=settings["layer_norm_eps"],
        )
        weight = module.encoder.layers[0].linear1.weight
        new = cls(
            config,
            source_embedding.num_embeddings,
            target_embedding.num_embeddings,
            max_source_len,
            max_target_len,
        )
        new = new.to(device=weight.device, dtype=weight.dtype)

        def load_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
            ours.load_state_dict(MultiHeadAttention.from_torch(theirs).state_dict())

        def load_ffn(ours: FeedForward, layer) -> None:
            ours.inner.load_state_dict(layer.linear1.state_dict())
            ours.outer.load_state_dict(layer.linear2.state_dict())

        with torch.no_grad():
            new.source_embed.embedding.weight.copy_(source_embedding.weight)
            new.target_embed.embedding.weight.copy_(target_embedding.weight)
            for ours, theirs in zip(new.encoder, enc_layers, strict=True):
                load_attention(ours.self_attention, theirs.self_attn)
                load_ffn(ours.feed_forward, theirs)
                ours.attention_residual.norm.load_state_dict(theirs.norm1.state_dict())
                ours.ffn_residual.norm.load_state_dict(theirs.norm2.state_dict())
            for ours, theirs in zip(new.decoder, dec_layers, strict=True):
                load_attention(ours.self_attention, theirs.self_attn)
                load_attention(ours.cross_attention, theirs.multihead_attn)
                load_ffn(ours.feed_forward, theirs)
                ours.self_residual.norm.load_state_dict(theirs.norm1.state_dict())
                ours.cross_residual.norm.load_state_dict(theirs.norm2.state_dict())
                ours.ffn_residual.norm.load_state_dict(theirs.norm3.state_dict())
            if module.encoder.norm is not None:
                new.encoder_norm.load_state_dict(module.encoder.norm.state_dict())
                new.decoder_norm.load_state_dict(module.decoder.norm.state_dict())
            if output is not None:
                new.output.weight.copy_(output.weight)
                if output.bias is not None:
                    new.output.bias.copy_(output.bias)
                else:
                    new.output.bias.zero_()
        return new


# -- decoder-only language model ---------------------------------------------------------------


@dataclass
class LMOutput:
    logits: torch.Tensor  # (b, t, vocab)
    weights: tuple[torch.Tensor, ...] | None = None  # per layer (b, h, t, t), when requested


@dataclass
class LMState:
    """Per-layer self-attention caches of a `TransformerLM`; `reorder` serves beam search."""

    caches: list[KVCache]
    step: int = 0

    @property
    def batch_size(self) -> int | None:
        """None before the first token: empty caches fit any batch."""
        return next((c.key.shape[0] for c in self.caches if c.key is not None), None)

    def reorder(self, index: torch.Tensor) -> LMState:
        return LMState([_reorder_cache(c, index) for c in self.caches], self.step)


def _check_current(function: str, caches: list[KVCache], step: int) -> None:
    """A state's self-attention caches hold its `step` positions. `decode_step` grows them in
    place, so a state it was given is left behind holding one position more: stepping from it
    again would attend to that extra position and read the wrong one's position encoding
    (log-probabilities off by ~0.4 in a tiny model, without a word)."""
    for cache in caches:
        held = 0 if cache.key is None else cache.key.shape[-2]
        if held != step:
            expected = f"a state whose caches hold its {step} positions (step from the state "
            expected += "decode_step returned last; to branch, copy one with reorder first)"
            fail(function, "state", expected, f"caches holding {held} (stepped from before)")


class TransformerLM(nn.Module):
    """The Transformer's decoder alone as a language model: the decoder layers of sec. 3.1
    without cross-attention (the decoder-only form of Liu et al. 2018 and GPT, Radford 2018).

        p(x_t | x_<t) = softmax(W_o Decoder(Embed(x_<t)))

    Uses `config.layers_dec` layers; `layers_enc` is unused.

    Args:
        config: `TransformerConfig`.
        vocab: vocabulary size (id 0 is padding).
        max_len: the longest sequence (decoded tokens included): the size of the learned
            position table, and of the precomputed sinusoidal one.
    """

    def __init__(self, config: TransformerConfig, vocab: int, max_len: int):
        super().__init__()
        _check_sizes("TransformerLM", vocab=vocab, max_len=max_len)
        c = self.config = config
        self.embed = Embedder(vocab, c, max_len)
        self.layers = nn.ModuleList(DecoderLayer(c, cross=False) for _ in range(c.layers_dec))
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.use_final_norm else None
        self.output = nn.Linear(c.d_model, vocab)
        _init_linear(self)
        if c.tie_embeddings:
            self.output.weight = self.embed.embedding.weight

    def _run(self, x, caches, need_weights):
        weights = []
        for layer, cache in zip(self.layers, caches, strict=True):
            x, w, _ = layer(x, self_cache=cache, need_weights=need_weights)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return self.output(x), weights  # (b, t, V)

    def forward(self, tokens: torch.Tensor, return_weights: bool = False) -> LMOutput:
        """tokens: (b, t) ids -> LMOutput(logits (b, t, V), per-layer causal self-attention
        weights (b, h, t, t) when requested). logits[:, i] predicts tokens[:, i + 1]."""
        vocab = self.embed.embedding.num_embeddings
        check_tokens("TransformerLM", "tokens", tokens, 2, "(batch, len)", vocab)
        logits, weights = self._run(self.embed(tokens), [None] * len(self.layers), return_weights)
        return LMOutput(logits, tuple(weights) if return_weights else None)

    def start(self) -> LMState:
        """Empty caches, before the first token."""
        return LMState([KVCache() for _ in self.layers])

    def decode_step(self, tokens: torch.Tensor, state: LMState) -> tuple[torch.Tensor, LMState]:
        """The decoding engine's step: tokens (b,) -> log-probabilities (b, V), new state."""
        check_tokens("TransformerLM.decode_step", "tokens", tokens, 1, "(batch,)")
        _check_current("TransformerLM.decode_step", state.caches, state.step)
        x = self.embed(tokens[:, None], state.step)  # (b, 1, d_model)
        logits, _ = self._run(x, state.caches, False)
        log_probs = torch.log_softmax(at_least_float32(logits[:, -1]), -1)  # (b, V)
        return log_probs, replace(state, step=state.step + 1)
