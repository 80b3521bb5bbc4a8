"""The Keras 3 layers of `attnzoo.keras` (torch backend).

On the torch backend a Keras layer is a `torch.nn.Module`, its inputs arrive as torch tensors
and `variable.value` is a torch Parameter, so each layer reads its variables at call time and
runs attnzoo's core on them: dot scores on `scaled_dot_product_attention`, additive scores on
the blockwise kernel (`attnzoo.core.additive`, memory O(length)).

Masks: Keras masks say True (or non-zero) = keep this position. For keys that is attnzoo's
True = may attend, so a value mask (batch, key_len) becomes the attention mask
(batch, 1, key_len) unchanged (`keras_mask`); a query mask (batch, query_len) zeroes the
output rows of masked queries, as Keras's layers do. (PyTorch's `key_padding_mask` is the
opposite, True = ignore.)

Note:
    Where Keras is inconsistent with itself or with attnzoo's contract, these layers follow
    attnzoo's: a query row with no allowed key gets a zero context (Keras's `Attention` and
    `AdditiveAttention` give the mean of the values there: they subtract 1e9 from masked
    scores, which in float32 rounds every score of the row to the same number; its
    `MultiHeadAttention` the mean of the values on its default SDPA path and zeros on its
    other path); returned attention scores are the weights before dropout (Keras's
    `Attention` returns them after); dropout draws from torch's generator, not from a Keras
    `SeedGenerator`.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

import keras
from attnzoo.core import attention, scores
from attnzoo.core.checks import check_sequences, fail
from attnzoo.core.masks import clear_unattended
from attnzoo.core.types import AttentionOutput

PACKAGE = "attnzoo"


# 1. Masks and checks -------------------------------------------------------------------------


def keras_mask(mask, like: torch.Tensor) -> torch.Tensor | None:
    """A Keras mask (True or non-zero = keep the position) as a bool tensor on `like`'s
    device, True = keep; None stays None. For keys, keep = attnzoo's "may attend"."""
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=like.device)
    return mask if mask.dtype == torch.bool else mask != 0


def _known(size) -> int | None:
    """A dimension of a Keras shape as an int, None where it is not known yet."""
    return None if size is None else int(size)


def _check_dropout(layer: str, dropout) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        fail(layer, "dropout", "a probability in [0, 1)", repr(dropout), TypeError)
    if not 0.0 <= dropout < 1.0:
        fail(layer, "dropout", "a probability in [0, 1)", dropout)
    return float(dropout)


def _check_positive_int(layer: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(layer, name, "a positive int", repr(value))
    return value


def _check_choice(layer: str, name: str, value, choices) -> str:
    if value not in choices:
        fail(layer, name, f"one of {list(choices)}", repr(value))
    return value


# 2. The additive score of Keras (and of Bahdanau on projected inputs) ------------------------


class SummedTanh(scores.Additive):
    """e_ij = sum_d v_d tanh(q_id + k_jd): Bahdanau's additive score v^T tanh(W_a s_i + U_a h_j)
    on inputs already projected, which is Keras's `AdditiveAttention` score
    `reduce_sum(scale * tanh(query + key))` with v = its `scale` (so d_hidden = d).

    `scores.Additive` with identity projections: its logits and its blockwise kernel (memory
    O(length), non-finite queries propagated) are this score's too.

    Args:
        v: (d,) tensor, the weight of each tanh unit (a Keras variable's value, read per call).
    """

    def __init__(self, v: torch.Tensor):
        scores.Score.__init__(self)  # no W_a, U_a: the inputs come projected
        self.v = v

    def _identity(self, argument: str, x: torch.Tensor) -> torch.Tensor:
        d = self.v.shape[-1]
        if x.shape[-1] != d:
            fail("SummedTanh", argument, f"last dimension {d} (that of v)", x.shape[-1])
        return x

    def prepare_key(self, key):
        return self._identity("key", key)

    def prepare_query(self, query):
        return self._identity("query", query)


# 3. The list-input layers (Keras's Attention protocol) ---------------------------------------


class _ListInputAttention(keras.layers.Layer, abc.ABC):
    """The call protocol of `keras.layers.Attention`: inputs `[query, value]` or
    `[query, value, key]`, `mask=[query_mask, value_mask]`; subclasses give `_attend`.

    query (batch, query_len, d_query), or (batch, d_query) for one decoder step; value
    (batch, key_len, d_value); key (batch, key_len, d_key), defaulting to value.
    Returns (batch, query_len, d_value) (or (batch, d_value)), and with
    `return_attention_scores=True` also the weights (batch, query_len, key_len) (or
    (batch, key_len)).
    """

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.dropout = _check_dropout(self._label(), dropout)
        self.seed = seed  # kept for Keras's signature; dropout uses torch's generator
        self.supports_masking = True

    def _label(self) -> str:
        return f"attnzoo.keras.{type(self).__name__}"

    def _shapes(self, inputs):
        """(query, value, key) of a list of 2 or 3 tensors or shapes."""
        if (
            not isinstance(inputs, (list, tuple))
            or not 2 <= len(inputs) <= 3
            or any(x is None or isinstance(x, int) for x in inputs)  # one shape, not a list
        ):
            got = f"{len(inputs)} items" if isinstance(inputs, list) else inputs
            fail(self._label(), "inputs", "a list [query, value] or [query, value, key]", got)
        query, value = inputs[0], inputs[1]
        return query, value, inputs[2] if len(inputs) == 3 else value

    def _check_ranks(self, query, value, key) -> None:
        """query (batch, query_len, d) or (batch, d), value and key (batch, key_len, d): the
        shapes (tuples) of the inputs. Others are refused: a 4-D (batch, heads, len, d) input
        ran, and its value mask was read with the heads as the query axis."""
        if len(query) not in (2, 3):
            wanted = "a (batch, query_len, d) or one-step (batch, d) query"
            fail(self._label(), "inputs[0] (query)", wanted, f"shape {tuple(query)}")
        for name, shape in (("inputs[1] (value)", value), ("inputs[2] (key)", key)):
            if len(shape) != 3:
                fail(self._label(), name, "a (batch, key_len, d) tensor", f"shape {tuple(shape)}")

    def build(self, input_shape):
        query, value, key = self._shapes(input_shape)
        self._check_ranks(tuple(query), tuple(value), tuple(key))
        self.build_weights(_known(query[-1]), _known(key[-1]))

    def build_weights(self, d_query: int | None, d_key: int | None) -> None:
        """Create the variables (none by default); a size is None where the input's last
        dimension is not known yet."""

    def call(
        self,
        inputs,
        mask=None,
        training=False,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        query, value, key = self._shapes(inputs)
        self._check_ranks(query.shape, value.shape, key.shape)
        if mask is not None and (not isinstance(mask, (list, tuple)) or not 2 <= len(mask) <= 3):
            fail(self._label(), "mask", "a list [query_mask, value_mask]", mask)
        query_mask = keras_mask(mask[0], query) if mask else None
        value_mask = keras_mask(mask[1], query) if mask else None
        _check_shape(self._label(), "mask[0] (query_mask)", query_mask, query.shape[:-1])
        _check_shape(self._label(), "mask[1] (value_mask)", value_mask, value.shape[:-1])
        step = query.dim() == 2  # one decoder step: (batch, d_query)
        if step and use_causal_mask:  # its position is not known: the causal diagonal from
            # the top left let it attend key 0 alone (Keras returns a (batch, batch, Tv) mess)
            wanted = "False for a one-step (batch, d_query) query (mask the keys past it)"
            fail(self._label(), "use_causal_mask", wanted, repr(use_causal_mask))
        if step:
            query = query.unsqueeze(1)  # (b, 1, d_query)
            query_mask = None if query_mask is None else query_mask.unsqueeze(1)
        out = self._attend(
            query,
            key,
            value,
            mask=None if value_mask is None else value_mask[:, None, :],  # (b, 1, j)
            causal=bool(use_causal_mask),
            dropout=self.dropout if training else 0.0,
            return_weights=bool(return_attention_scores),
        )
        context = out.context  # (b, i, d_value)
        if query_mask is not None:  # Keras zeroes the output rows of masked queries
            context = torch.where(query_mask[..., None], context, 0.0)
        if step:
            context = context.squeeze(1)  # (b, d_value)
        if not return_attention_scores:
            return context
        return context, out.weights.squeeze(1) if step else out.weights

    @abc.abstractmethod
    def _attend(self, query, key, value, **options) -> AttentionOutput:
        """The layer's attention of query over key and value (`attnzoo.attention`)."""

    def compute_mask(self, inputs, mask=None):
        if mask is None or mask[0] is None:
            return None
        return mask[0]

    def compute_output_shape(self, input_shape):
        query, value, _ = self._shapes(input_shape)
        return (*query[:-1], value[-1])

    def compute_output_spec(
        self, inputs, mask=None, training=None, return_attention_scores=False, use_causal_mask=False
    ):
        query, value, key = self._shapes(inputs)
        out = keras.KerasTensor((*query.shape[:-1], value.shape[-1]), dtype=self.compute_dtype)
        if not return_attention_scores:
            return out
        weights = (*query.shape[:-1], key.shape[-2])  # (b, [i,] j)
        return out, keras.KerasTensor(weights, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "seed": self.seed}


@keras.saving.register_keras_serializable(package=PACKAGE)
class Attention(_ListInputAttention):
    """Drop-in for `keras.layers.Attention` (Luong 2015's dot score), same weights, same
    outputs.

    score_mode "dot": logits = scale * q_i . k_j, scale a learned scalar (initial 1) when
    `use_scale`, else 1 (no 1/sqrt(d)); runs on SDPA. score_mode "concat":
    logits = w * sum_d tanh(scale * (q_id + k_jd)), w a learned scalar (initial 1); runs on the
    blockwise additive kernel.

    Args:
        use_scale: learn the scalar `scale`.
        score_mode: "dot" or "concat".
        dropout: on the weights, in training.
        seed: accepted for Keras's signature (dropout draws from torch's generator).
    """

    SCORE_MODES = ("dot", "concat")

    def __init__(self, use_scale=False, score_mode="dot", dropout=0.0, seed=None, **kwargs):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.use_scale = bool(use_scale)
        self.score_mode = _check_choice(self._label(), "score_mode", score_mode, self.SCORE_MODES)

    def build_weights(self, d_query, d_key):
        self.scale = self.concat_score_weight = None
        if self.use_scale:
            self.scale = self.add_weight(name="scale", shape=(), initializer="ones")
        if self.score_mode == "concat":
            self.concat_score_weight = self.add_weight(
                name="concat_score_weight", shape=(), initializer="ones"
            )

    def _attend(self, query, key, value, **options):
        scale = None if self.scale is None else self.scale.value
        if self.score_mode == "dot":
            q = query if scale is None else query * scale  # scale * (q . k) = (scale q) . k
            return attention(q, key, value, score="dot", **options)
        if scale is not None:
            query, key = query * scale, key * scale  # tanh(scale (q + k))
        v = self.concat_score_weight.value.expand(query.shape[-1])  # (d,)
        return attention(query, key, value, score=SummedTanh(v), **options)

    def get_config(self):
        return {**super().get_config(), "use_scale": self.use_scale, "score_mode": self.score_mode}


@keras.saving.register_keras_serializable(package=PACKAGE)
class AdditiveAttention(_ListInputAttention):
    """Drop-in for `keras.layers.AdditiveAttention`, same weights, same outputs:
    logits_ij = sum_d scale_d tanh(q_id + k_jd), `scale` (d,) learned (glorot-uniform) when
    `use_scale`, else ones.

    It is Bahdanau's score without the W_a and U_a projections (d_hidden = d); for the paper's
    layer see `BahdanauAttention`. Runs on the blockwise additive kernel: no
    (batch, query_len, key_len, d) tensor, forward or backward.

    Args:
        use_scale: learn the per-feature `scale`.
        dropout: on the weights, in training.
    """

    def __init__(self, use_scale=True, dropout=0.0, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        self.use_scale = bool(use_scale)

    def build_weights(self, d_query, d_key):
        if None not in (d_query, d_key) and d_query != d_key:
            fail(self._label(), "inputs", f"key features == query features ({d_query})", d_key)
        self.scale = None
        if self.use_scale:
            d_query = d_key if d_query is None else d_query
            if d_query is None:
                wanted = "a known last dimension of query or key (the size of `scale`)"
                fail(self._label(), "inputs", wanted, None)
            self.scale = self.add_weight(
                name="scale", shape=(d_query,), initializer="glorot_uniform"
            )

    def _attend(self, query, key, value, **options):
        v = query.new_ones(query.shape[-1]) if self.scale is None else self.scale.value  # (d,)
        return attention(query, key, value, score=SummedTanh(v), **options)

    def get_config(self):
        return {**super().get_config(), "use_scale": self.use_scale}


class _Attend(nn.Module):
    """attention() with one core score module: the module `torch.func.functional_call` runs
    with a layer's Keras variables in place of the score's own parameters."""

    def __init__(self, score: scores.Score):
        super().__init__()
        self.score = score

    def forward(self, query, key, value, options):
        return attention(query, key, value, score=self.score, **options)


class _CoreScoreAttention(_ListInputAttention):
    """A list-input layer over a core score module (`make_score`): its parameters become
    Keras variables of the same names ('.' -> '_'), shapes and initial values, and every call
    runs the score with the variables' current values (so saving, loading, `set_weights` and
    Keras's optimisers see only Keras variables)."""

    @abc.abstractmethod
    def make_score(self, d_query: int, d_key: int) -> scores.Score:
        """The core score this layer runs, for these feature sizes."""

    def sized(self) -> bool:
        """Whether the score's weights need the feature sizes (known when built)."""
        return True

    def build_weights(self, d_query, d_key):
        if None in (d_query, d_key) and self.sized():
            wanted = "a known last dimension of query and key (the sizes of the score's weights)"
            fail(self._label(), "inputs", wanted, f"{d_query} and {d_key}")
        score = self.make_score(d_query, d_key)
        # Held outside Keras's and torch's tracking: only the variables below are weights.
        object.__setattr__(self, "_runner", _Attend(score))
        names, variables = [], []
        for name, parameter in score.named_parameters():
            initial = parameter.detach().clone()
            variable = self.add_weight(
                name=name.replace(".", "_"),
                shape=tuple(parameter.shape),
                initializer=lambda shape, dtype=None, initial=initial: initial,
            )
            names.append(f"score.{name}")
            variables.append(variable)
        object.__setattr__(self, "_parameters_of_score", list(zip(names, variables, strict=True)))

    def _attend(self, query, key, value, **options):
        if not self._parameters_of_score:
            return self._runner(query, key, value, options)
        values = {name: variable.value for name, variable in self._parameters_of_score}
        return torch.func.functional_call(self._runner, values, (query, key, value, options))


@keras.saving.register_keras_serializable(package=PACKAGE)
class BahdanauAttention(_CoreScoreAttention):
    """Bahdanau 2015 (appendix A.1.2) as a Keras layer: e_ij = v_a^T tanh(W_a s_i + U_a h_j),
    attnzoo's `scores.Additive` on the blockwise kernel (memory O(length)).

    Keras's `AdditiveAttention` has neither W_a nor U_a; the TF NMT tutorial writes this layer
    by hand with three `Dense` layers (see docs/keras.md for the weight mapping).

    Args:
        units: d_hidden, the size of the tanh layer (Bahdanau's n').
        use_bias: a bias inside the tanh (the tutorial's W1 and W2 biases, summed).
        dropout: on the weights, in training.
    Weights, in `scores.Additive`'s parameter order: v (units,) (v_a), query_proj_weight
    (units, d_query) and query_proj_bias (units,) (W_a, torch's Linear layout),
    key_proj_weight (units, d_key) (U_a).
    """

    def __init__(self, units, use_bias=True, dropout=0.0, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        self.units = _check_positive_int(self._label(), "units", units)
        self.use_bias = bool(use_bias)

    def make_score(self, d_query, d_key):
        return scores.Additive(d_query, d_key, self.units, bias=self.use_bias)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "use_bias": self.use_bias}


@keras.saving.register_keras_serializable(package=PACKAGE)
class LuongAttention(_CoreScoreAttention):
    """Luong 2015 (sec. 3.1, eq. 8) global attention as a Keras layer, with the score built by
    `attnzoo.scores.make_score`: "dot" h_t^T h_s, "general" h_t^T W_a h_s, "location"
    softmax(W_a h_t) (one logit per source position; needs `max_keys`).

    Args:
        score: "dot", "general" or "location".
        max_keys: the longest key sequence "location" can address.
        dropout: on the weights, in training.
    Weights: as the core score's parameters ("general": weight (d_query, d_key); "location":
    proj_weight (max_keys, d_query), proj_bias (max_keys,)).
    Note:
        The layer returns the context c_t; Luong's attentional state
        tanh(W_c [c_t; h_t]) is the caller's Dense layer, as in Keras's own layers.
    """

    SCORES = ("dot", "general", "location")

    def __init__(self, score="general", max_keys=None, dropout=0.0, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        self.score = _check_choice(self._label(), "score", score, self.SCORES)
        if score == "location":
            _check_positive_int(self._label(), "max_keys", max_keys)
        self.max_keys = max_keys

    def sized(self):
        return self.score != "dot"

    def make_score(self, d_query, d_key):
        return scores.make_score(self.score, d_query, d_key, max_keys=self.max_keys)

    def get_config(self):
        return {**super().get_config(), "score": self.score, "max_keys": self.max_keys}


# 4. MultiHeadAttention -----------------------------------------------------------------------


@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadAttention(keras.layers.Layer):
    """Drop-in for `keras.layers.MultiHeadAttention` (Vaswani 2017, sec. 3.2.2) on 3-D inputs,
    with the same variables in the same order (so `set_weights(keras_layer.get_weights())`
    works; `from_keras` does it) and the same outputs:

        head_n = softmax(q W_n^Q (k W_n^K)^T / sqrt(key_dim)) v W_n^V,
        output = Concat(head_1, ..., head_N) W^O

    Self-attention (`query`, `value` and `key` the same tensor) projects with one matmul;
    attention runs on SDPA through `attnzoo.attention`, also with dropout.

    Args:
        num_heads: N.
        key_dim: features per head of query and key.
        value_dim: features per head of value (defaults to key_dim).
        dropout: on the attention weights, in training.
        use_bias: biases in the four projections.
        output_shape: the output's feature shape (an int or a tuple); defaults to the query's
            last dimension.
        kernel_initializer, bias_initializer: as Keras's (each projection gets its own copy).
        seed: accepted for Keras's signature (dropout draws from torch's generator).
    Weights: query_kernel (d_query, N, key_dim), query_bias (N, key_dim), key_kernel,
    key_bias, value_kernel (d_value, N, value_dim), value_bias, output_kernel
    (N, value_dim, *output_shape), output_bias (*output_shape).
    Note:
        Only 3-D inputs (batch, len, features): Keras's `attention_axes` over more axes,
        `use_gate` and `sliding_window` are not supported.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        label = "attnzoo.keras.MultiHeadAttention"
        self.num_heads = _check_positive_int(label, "num_heads", num_heads)
        self.key_dim = _check_positive_int(label, "key_dim", key_dim)
        self.value_dim = key_dim if value_dim is None else value_dim
        _check_positive_int(label, "value_dim", self.value_dim)
        self.dropout = _check_dropout(label, dropout)
        self.use_bias = bool(use_bias)
        if isinstance(output_shape, int):
            output_shape = (output_shape,)
        if output_shape is not None:
            output_shape = tuple(output_shape)
            for size in output_shape:
                _check_positive_int(label, "output_shape", size)
        self._output_shape = output_shape
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.supports_masking = True  # the output carries the query's mask

    def _initializer(self, initializer):
        """A fresh copy per projection, as Keras gives each of its sublayers."""
        return initializer.__class__.from_config(initializer.get_config())

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3:
                fail(
                    "attnzoo.keras.MultiHeadAttention",
                    name,
                    "a 3-D input (batch, len, features)",
                    f"shape {tuple(shape)}",
                )
        n = self.num_heads
        out = self._output_shape or (int(query_shape[-1]),)
        sizes = (
            ("query", (int(query_shape[-1]), n, self.key_dim), (n, self.key_dim)),
            ("key", (int(key_shape[-1]), n, self.key_dim), (n, self.key_dim)),
            ("value", (int(value_shape[-1]), n, self.value_dim), (n, self.value_dim)),
            ("output", (n, self.value_dim, *out), out),
        )
        for name, kernel, bias in sizes:  # Keras's order: kernel, bias per projection
            setattr(
                self,
                f"{name}_kernel",
                self.add_weight(
                    name=f"{name}_kernel",
                    shape=kernel,
                    initializer=self._initializer(self.kernel_initializer),
                ),
            )
            setattr(
                self,
                f"{name}_bias",
                self.add_weight(
                    name=f"{name}_bias",
                    shape=bias,
                    initializer=self._initializer(self.bias_initializer),
                )
                if self.use_bias
                else None,
            )

    def _linear(self, x, kernel, bias):
        """x (batch, len, d_in) @ kernel flattened to (d_in, out) + bias: (batch, len, out)."""
        b, t, d = x.shape
        weight = kernel.reshape(d, -1)  # (d_in, out)
        x2 = x.reshape(b * t, d)
        y = x2 @ weight if bias is None else torch.addmm(bias.reshape(-1), x2, weight)
        return y.view(b, t, -1)  # (b, t, out)

    @staticmethod
    def _heads(x, parts, n):
        """(batch, len, parts * n * d) -> parts x (batch, n, len, d), each contiguous (SDPA's
        fast kernel wants them so)."""
        b, t, _ = x.shape
        x = x.view(b, t, parts, n, -1)  # (b, t, parts, n, d)
        return x.permute(2, 0, 3, 1, 4).contiguous().unbind(0)  # parts x (b, n, t, d)

    def _project(self, query, value, key):
        n = self.num_heads
        var = {name: getattr(self, name) for name in ("query_bias", "key_bias", "value_bias")}
        bias = {k: None if v is None else v.value for k, v in var.items()}
        wq, wk, wv = self.query_kernel.value, self.key_kernel.value, self.value_kernel.value
        if query is value and key is value and self.key_dim == self.value_dim:
            d = query.shape[-1]
            weight = torch.cat([wq.reshape(d, -1), wk.reshape(d, -1), wv.reshape(d, -1)], 1)
            b = None
            if self.use_bias:
                b = torch.cat([bias["query_bias"], bias["key_bias"], bias["value_bias"]], 0)
            return self._heads(self._linear(query, weight, b), 3, n)  # 3 x (b, n, t, d_head)
        q = self._heads(self._linear(query, wq, bias["query_bias"]), 1, n)[0]  # (b, n, i, dk)
        k = self._heads(self._linear(key, wk, bias["key_bias"]), 1, n)[0]  # (b, n, j, dk)
        v = self._heads(self._linear(value, wv, bias["value_bias"]), 1, n)[0]  # (b, n, j, dv)
        return q, k, v

    def _mask(self, query, value, query_mask, value_mask, key_mask, attention_mask):
        """Keras's masks combined as Keras combines them, True = may attend:
        (batch, 1 | heads, query_len, key_len), or None."""
        label, (b, i), j = "attnzoo.keras.MultiHeadAttention", query.shape[:2], value.shape[1]
        allowed = keras_mask(query_mask, query)
        _check_shape(label, "query_mask", allowed, (b, i))
        if allowed is not None:
            allowed = allowed[:, :, None]  # (b, i, 1)
        for name, given in (("value_mask", value_mask), ("key_mask", key_mask)):
            keep = keras_mask(given, query)
            _check_shape(label, name, keep, (b, j))
            if keep is not None:
                keep = keep[:, None, :]  # (b, 1, j)
                allowed = keep if allowed is None else allowed & keep
        allowed = None if allowed is None else allowed.unsqueeze(1)  # (b, 1, i | 1, j | 1)
        attention_mask = keras_mask(attention_mask, query)
        if attention_mask is None:
            return allowed
        # Keras's shapes, each dim that size or 1 as Keras broadcasts them (a tutorial's
        # padding mask is (batch, 1, 1, key_len)); made (batch | 1, heads | 1, i | 1, j)
        shapes = {2: (i, j), 3: (b, i, j), 4: (b, self.num_heads, i, j)}
        wanted = shapes.get(attention_mask.dim())
        if wanted is None or any(
            s not in (1, w) for s, w in zip(attention_mask.shape, wanted, strict=True)
        ):
            fail(
                label,
                "attention_mask",
                f"(query_len, key_len) = ({i}, {j}), (batch, query_len, key_len) = ({b}, {i}, "
                f"{j}) or (batch, heads, query_len, key_len) = ({b}, {self.num_heads}, {i}, "
                f"{j}), each dim that size or 1",
                f"shape {tuple(attention_mask.shape)}",
            )
        if attention_mask.dim() == 2:
            attention_mask = attention_mask[None, None]  # (1, 1, i, j)
        elif attention_mask.dim() == 3:
            attention_mask = attention_mask[:, None]  # shared by the heads: (b, 1, i, j)
        return attention_mask if allowed is None else attention_mask & allowed

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        key = value if key is None else key
        for name, x in (("query", query), ("value", value), ("key", key)):
            # the features the layer was built for (the kernels' first dims)
            features = getattr(self, f"{name}_kernel").shape[0]
            check_sequences("attnzoo.keras.MultiHeadAttention", name, x, features)
        label = "attnzoo.keras.MultiHeadAttention"
        if value.shape[0] != query.shape[0]:
            fail(label, "value", f"batch size {query.shape[0]} (that of 'query')", value.shape[0])
        if key.shape[:2] != value.shape[:2]:
            wanted = f"(batch, key_len) = {tuple(value.shape[:2])}, those of 'value'"
            fail(label, "key", wanted, tuple(key.shape[:2]))
        mask = self._mask(query, value, query_mask, value_mask, key_mask, attention_mask)
        if mask is not None and not (query is value and key is value):
            # padding cleared before the projections, whose kernels' gradients read it
            rows = mask.any(1) if mask.dim() == 4 else mask  # (b, i, j) or (i, j)
            key, value = clear_unattended(rows, key, value)
        q, k, v = self._project(query, value, key)  # (b, n, len, d_head)
        out = attention(
            q,
            k,
            v,
            score="scaled_dot",  # 1/sqrt(key_dim), Keras's scale
            mask=mask,
            causal=bool(use_causal_mask),
            dropout=self.dropout if training else 0.0,
            return_weights=bool(return_attention_scores),
        )
        b, n, i, dv = out.context.shape
        context = out.context.transpose(1, 2).reshape(b, i, n * dv)  # (b, i, n dv)
        bias = None if self.output_bias is None else self.output_bias.value
        y = self._linear(context, self.output_kernel.value.reshape(n * dv, -1), bias)
        y = y.view(b, i, *self.output_kernel.shape[2:])  # (b, i, *output_shape)
        return (y, out.weights) if return_attention_scores else y

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        out = self._output_shape or (query_shape[-1],)
        return (*query_shape[:-1], *out)

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        shape = self.compute_output_shape(query.shape, value.shape)
        out = keras.KerasTensor(shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return out
        weights = (query.shape[0], self.num_heads, query.shape[1], value.shape[1])
        return out, keras.KerasTensor(weights, dtype=self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_shape": self._output_shape,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "seed": self.seed,
        }

    @classmethod
    def from_keras(cls, layer) -> MultiHeadAttention:
        """A layer with the configuration, weights and `trainable` flag of a built
        `keras.layers.MultiHeadAttention`, giving its outputs. Regularizers and constraints,
        which this layer does not have, are refused (dropped, training would quietly differ:
        no weight penalty, no constraint)."""
        label = "attnzoo.keras.MultiHeadAttention.from_keras"
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            fail(
                label, "layer", "a keras.layers.MultiHeadAttention", type(layer).__name__, TypeError
            )
        if not layer.built:
            fail(label, "layer", "a built layer (call it once)", "an unbuilt one")
        config = layer.get_config()
        options = ("use_gate", "sliding_window", *_PENALTIES)
        unsupported = {
            name: config.get(name) for name in options if config.get(name) not in (None, False)
        }
        if config.get("attention_axes") not in (None, (1,), [1]):
            unsupported["attention_axes"] = config["attention_axes"]
        if unsupported:
            wanted = "no use_gate, sliding_window, attention_axes, regularizer or constraint"
            fail(label, "layer", wanted, unsupported)
        by_path = {"/".join(w.path.split("/")[-2:]): w for w in layer.weights}
        kernels = {n: by_path[f"{n}/kernel"] for n in ("query", "key", "value")}
        new = cls(
            num_heads=config["num_heads"],
            key_dim=config["key_dim"],
            value_dim=config["value_dim"],
            dropout=config["dropout"],
            use_bias=config["use_bias"],
            output_shape=config["output_shape"],
            kernel_initializer=config["kernel_initializer"],
            bias_initializer=config["bias_initializer"],
            dtype=layer.dtype_policy,
            trainable=layer.trainable,  # a frozen layer stays frozen
        )
        new.build(*((None, None, kernels[n].shape[0]) for n in ("query", "value", "key")))
        names = [("query", "query"), ("key", "key"), ("value", "value")]
        names.append(("output", "attention_output"))
        for ours, theirs in names:
            getattr(new, f"{ours}_kernel").assign(by_path[f"{theirs}/kernel"].value)
            if new.use_bias:
                getattr(new, f"{ours}_bias").assign(by_path[f"{theirs}/bias"].value)
        return new


# keras.layers.MultiHeadAttention's options this layer does not have (`from_keras` refuses them)
_PENALTIES = (
    "kernel_regularizer",
    "bias_regularizer",
    "activity_regularizer",
    "kernel_constraint",
    "bias_constraint",
)


def _check_shape(label: str, argument: str, mask, shape) -> None:
    """A Keras mask of exactly `shape` (a different one would broadcast, or fail inside)."""
    if mask is not None and tuple(mask.shape) != tuple(shape):
        fail(label, argument, f"shape {tuple(shape)}", tuple(mask.shape))
