"""attnzoo.keras layers inside keras.Models: `model.fit` trains them (loss falls, the layer's
own weights move), `model.save` / `keras.models.load_model` round-trip them (same outputs),
`get_config` / `from_config`; the mask convention; errors for bad arguments; the import
guard."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

keras = pytest.importorskip(
    "keras", reason="Keras 3 is not installed: pip install 'attnzoo[keras]'"
)

import attnzoo.keras as ak  # noqa: E402

B, TQ, TV, D = 16, 5, 9, 4


def _list_model(layer):
    query = keras.Input((TQ, D))
    value = keras.Input((TV, D))
    context = layer([query, value], use_causal_mask=False)
    return keras.Model([query, value], keras.layers.Dense(1)(context))


def _mha_model(layer):
    x = keras.Input((TQ, D))
    return keras.Model(x, keras.layers.Dense(1)(layer(x, x, use_causal_mask=True)))


LAYERS = {
    "Attention": (lambda: ak.Attention(use_scale=True), _list_model),
    "Attention(concat)": (lambda: ak.Attention(score_mode="concat", dropout=0.1), _list_model),
    "AdditiveAttention": (lambda: ak.AdditiveAttention(), _list_model),
    "BahdanauAttention": (lambda: ak.BahdanauAttention(8), _list_model),
    "LuongAttention(general)": (lambda: ak.LuongAttention("general"), _list_model),
    "LuongAttention(location)": (lambda: ak.LuongAttention("location", max_keys=TV), _list_model),
    "MultiHeadAttention": (lambda: ak.MultiHeadAttention(2, 3, dropout=0.1), _mha_model),
    # an output size other than the query's: a load that lost it builds another shape
    "MultiHeadAttention(value_dim, output_shape)": (
        lambda: ak.MultiHeadAttention(2, 3, value_dim=5, output_shape=6),
        _mha_model,
    ),
}


def _data(model):
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(B, *i.shape[1:])).astype("float32") for i in model.inputs]
    # a target the attention must compute: the mean of the value (or input) features
    y = x[-1].mean(-1, keepdims=True)[:, :TQ].astype("float32")
    return (x if len(x) > 1 else x[0]), y


@pytest.mark.parametrize("name", list(LAYERS))
def test_fit_and_save_round_trip(name, tmp_path):
    keras.utils.set_random_seed(0)
    make, build = LAYERS[name]
    layer = make()
    model = build(layer)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    x, y = _data(model)
    before = [w.numpy().copy() for w in layer.weights]
    history = model.fit(x, y, epochs=8, batch_size=8, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    if before:  # the attention layer's own weights were trained, not only the Dense head
        assert any(
            not np.allclose(a, w.numpy()) for a, w in zip(before, layer.weights, strict=True)
        )

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    inner = [la for la in loaded.layers if type(la) is type(layer)]
    assert len(inner) == 1 and inner[0].get_config() == layer.get_config()
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), 1e-6, 1e-6
    )


@pytest.mark.parametrize("name", list(LAYERS))
def test_config_round_trip(name):
    layer = LAYERS[name][0]()
    config = layer.get_config()
    again = type(layer).from_config(config)
    assert again.get_config() == config
    # every constructor argument is in the config (one left out is lost on a reload: the
    # comparison above compares the loss with itself)
    arguments = inspect.signature(type(layer).__init__).parameters
    missing = [a for a in arguments if a not in ("self", "kwargs") and a not in config]
    assert not missing
    registered = keras.saving.get_registered_object(f"attnzoo>{type(layer).__name__}")
    assert registered is type(layer)


def test_mask_convention():
    """One place for the mapping: a Keras mask says True (or non-zero) = keep; for keys that
    is attnzoo's True = may attend, unchanged (unlike torch's key_padding_mask, True = ignore);
    a masked query gets a zero output row."""
    like = torch.zeros(1)
    keep = torch.tensor([[True, False, True]])
    assert torch.equal(ak.keras_mask(keep, like), keep)
    assert torch.equal(ak.keras_mask(torch.tensor([[1.0, 0.0, 2.0]]), like), keep)
    assert torch.equal(ak.keras_mask(np.array([[1, 0, 1]]), like), keep)
    assert ak.keras_mask(None, like) is None

    q, v = torch.randn(1, 2, 3), torch.randn(1, 3, 3)
    out, w = ak.Attention()(
        [q, v], mask=[torch.tensor([[True, False]]), keep], return_attention_scores=True
    )
    assert (w[0, :, 1] == 0).all() and (w[0, :, [0, 2]] > 0).all()  # key 1 ignored
    assert (out[0, 1] == 0).all() and (out[0, 0] != 0).all()  # query 1 zeroed
    mha = ak.MultiHeadAttention(1, 3)
    _, w = mha(q, v, attention_mask=keep[:, None, :].expand(1, 2, 3), return_attention_scores=True)
    assert (w[0, 0, :, 1] == 0).all() and (w[0, 0, :, [0, 2]] > 0).all()


def test_step_query():
    """A 2-D query is one decoder step: output (batch, d_value), weights (batch, key_len)."""
    layer = ak.BahdanauAttention(6)
    out, w = layer([torch.randn(2, 4), torch.randn(2, 7, 5)], return_attention_scores=True)
    assert out.shape == (2, 5) and w.shape == (2, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[:, 4:] = False  # the source's padding, as a decoder step passes it
    _, w = layer([torch.randn(2, 4), torch.randn(2, 7, 5)], mask=[None, keep],
                 return_attention_scores=True)  # fmt: skip
    assert (w[:, 4:] == 0).all() and (w[:, :4] > 0).all()
    # causal has no meaning without the step's position: it attended key 0 alone
    for layer in (ak.Attention(), ak.AdditiveAttention(), ak.BahdanauAttention(6)):
        with pytest.raises(ValueError, match="'use_causal_mask' expected False for a one-step"):
            layer([torch.randn(2, 5), torch.randn(2, 7, 5)], use_causal_mask=True)


def test_the_output_mask_is_the_querys_and_symbolic_shapes_follow_the_inputs():
    """With query_len != key_len: the output carries the query's Keras mask (not the value's)
    and the symbolic scores are (batch, [heads,] query_len, key_len)."""
    rng = np.random.default_rng(0)
    q, v = rng.normal(size=(2, 3, D)), rng.normal(size=(2, 5, D))
    q[0, -1], v[1, -2:] = 0, 0
    q, v = q.astype("float32"), v.astype("float32")
    masking = keras.layers.Masking(0.0)
    out = ak.Attention()([masking(torch.tensor(q)), masking(torch.tensor(v))])
    assert torch.equal(out._keras_mask, torch.tensor(q).ne(0).any(-1))
    query, value = keras.Input((TQ, D)), keras.Input((TV, D))
    _, w = ak.MultiHeadAttention(2, 3)(query, value, return_attention_scores=True)
    assert tuple(w.shape) == (None, 2, TQ, TV)
    _, w = ak.Attention()([query, value], return_attention_scores=True)
    assert tuple(w.shape) == (None, TQ, TV)


def test_unknown_feature_sizes_build_where_no_weight_needs_them():
    """keras.Input((None, None)): a score without feature-sized weights builds, as Keras's
    Attention does (int(None) raised a bare TypeError); one with them names the input."""
    query, value = keras.Input((None, None)), keras.Input((None, None))
    for layer in (ak.Attention(), ak.Attention(score_mode="concat"), ak.LuongAttention("dot")):
        assert tuple(layer([query, value]).shape) == (None, None, None)
    for layer in (ak.AdditiveAttention(), ak.BahdanauAttention(4), ak.LuongAttention()):
        with pytest.raises(ValueError, match="argument 'inputs' expected a known last dim"):
            layer([query, value])


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: ak.Attention(score_mode="cosine"), "score_mode"),
        (lambda: ak.Attention(dropout=1.0), "dropout"),
        (lambda: ak.AdditiveAttention(dropout=-0.1), "dropout"),
        (lambda: ak.BahdanauAttention(0), "units"),
        (lambda: ak.LuongAttention("concat"), "score"),
        (lambda: ak.LuongAttention("location"), "max_keys"),
        (lambda: ak.MultiHeadAttention(0, 4), "num_heads"),
        (lambda: ak.MultiHeadAttention(2, 4, value_dim=-1), "value_dim"),
        (lambda: ak.MultiHeadAttention(2, 4, dropout=2), "dropout"),
    ],
)
def test_constructor_errors(make, argument):
    with pytest.raises(ValueError, match=f"argument '{argument}' expected"):
        make()


def test_call_errors():
    q = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="argument 'inputs' expected a list"):
        ak.Attention()(q)
    with pytest.raises(ValueError, match="argument 'inputs' expected a list"):
        ak.Attention()([q, q, q, q])
    with pytest.raises(ValueError, match="argument 'mask' expected a list"):
        ak.Attention()([q, q], mask=[None])
    with pytest.raises(ValueError, match="key features == query features"):
        ak.AdditiveAttention()([q, torch.randn(2, 5, 3)])
    with pytest.raises(ValueError, match="argument 'key' expected key_len <= max_keys"):
        ak.LuongAttention("location", max_keys=4)([q, torch.randn(2, 5, 4)])
    with pytest.raises(ValueError, match="argument 'query' expected a 3-D input"):
        ak.MultiHeadAttention(2, 2)(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    # (batch, heads, len, d): its value mask was read with the heads as the query axis
    four = torch.randn(2, 3, 3, 4)
    with pytest.raises(ValueError, match=r"'inputs\[0\] \(query\)' expected a \(batch, query"):
        ak.Attention()([four, four], mask=[None, torch.ones(2, 3, 3, dtype=torch.bool)])
    with pytest.raises(ValueError, match=r"'inputs\[1\] \(value\)' expected a \(batch, key_"):
        ak.AdditiveAttention()([q, four])
    layer = ak.Attention()
    layer([q, q])  # built on 3-D inputs: a later call is checked too
    with pytest.raises(ValueError, match=r"'inputs\[0\] \(query\)' expected a \(batch, query"):
        layer([four, four])
    with pytest.raises(ValueError, match="argument 'attention_mask' expected"):
        ak.MultiHeadAttention(2, 2)(q, q, attention_mask=torch.ones(1, 1, 1, 3, 3, dtype=bool))
    built = ak.MultiHeadAttention(2, 2)
    built(q, q)  # built for 4 features
    with pytest.raises(ValueError, match="argument 'query' expected a \\(batch, length, 4\\)"):
        built(torch.randn(2, 3, 6), q)
    with pytest.raises(TypeError, match="argument 'value' expected a floating-point"):
        built(q, q.long())
    # query, key and value that do not agree: named before any projection
    with pytest.raises(ValueError, match=r"argument 'key' expected \(batch, key_len\) = \(2, 5\)"):
        built(q, torch.randn(2, 5, 4), torch.randn(2, 6, 4), value_mask=torch.ones(2, 5) > 0)
    with pytest.raises(ValueError, match="argument 'value' expected batch size 2"):
        built(q, torch.randn(3, 5, 4))
    # masks of another length: Keras's own shapes, named (they failed inside torch)
    v, short = torch.randn(2, 5, 4), torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"'mask\[0\] \(query_mask\)' expected shape \(2, 3\)"):
        ak.Attention()([q, v], mask=[short, None])
    with pytest.raises(ValueError, match=r"'mask\[1\] \(value_mask\)' expected shape \(2, 5\)"):
        ak.Attention()([q, v], mask=[None, short])
    for name in ("query_mask", "value_mask", "key_mask"):
        with pytest.raises(ValueError, match=f"argument '{name}' expected shape"):
            built(q, v, **{name: torch.ones(2, 7, dtype=torch.bool)})
    with pytest.raises(
        ValueError,
        match=r"'attention_mask' expected .* \(batch, query_len, key_len\) = \(2, 3, 5\)",
    ):
        built(q, v, attention_mask=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="argument 'layer' expected a keras.layers.Multi"):
        ak.MultiHeadAttention.from_keras(keras.layers.Attention())
    with pytest.raises(ValueError, match="argument 'layer' expected a built layer"):
        ak.MultiHeadAttention.from_keras(keras.layers.MultiHeadAttention(2, 2))


@pytest.mark.parametrize(
    "option",
    [dict(kernel_regularizer="l2"), dict(activity_regularizer="l1"),
     dict(bias_constraint=keras.constraints.NonNeg())],
)  # fmt: skip
def test_from_keras_refuses_what_it_would_drop_and_keeps_a_frozen_layer_frozen(option):
    """A regularizer or constraint was dropped without a word (training then differs: no
    weight penalty), and a frozen layer came back trainable."""
    q, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    theirs = keras.layers.MultiHeadAttention(2, 3, **option)
    theirs(q, v)
    with pytest.raises(ValueError, match="expected no use_gate, .*regularizer or constraint"):
        ak.MultiHeadAttention.from_keras(theirs)
    frozen = keras.layers.MultiHeadAttention(2, 3, trainable=False)
    frozen(q, v)
    ours = ak.MultiHeadAttention.from_keras(frozen)
    assert not ours.trainable and not ours.trainable_weights


GUARD = """
import os, sys
sys.modules["keras"] = None  # as if Keras were not installed
try:
    import attnzoo.keras
except ImportError as error:
    print("MISSING:", error)
del sys.modules["keras"]
sys.modules.pop("attnzoo.keras", None)
import keras  # on the torch backend (KERAS_BACKEND=torch); then as if it ran on jax
keras.backend.backend = lambda: "jax"
try:
    import attnzoo.keras
except ImportError as error:
    print("BACKEND:", error)
"""


def test_import_guard_names_the_install_command_and_the_backend():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KERAS_BACKEND": "torch"}
    done = subprocess.run(
        [sys.executable, "-c", GUARD], capture_output=True, text=True, env=env, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(("MISSING", "BACKEND"))]
    assert [line.split(":")[0] for line in lines] == ["MISSING", "BACKEND"], done.stderr[-2000:]
    for line in lines:
        assert "pip install 'attnzoo[keras]'" in line and "KERAS_BACKEND=torch" in line
    assert "'jax' backend" in lines[1]


def _embedded_model(make_layer, mha: bool):
    """Token ids -> Embedding(mask_zero=True) -> attention: Keras hands the padding mask to
    the layer (0 = padding)."""
    ids = keras.Input((TV,), dtype="int32")
    x = keras.layers.Embedding(11, D, mask_zero=True)(ids)
    y = make_layer()(x, x) if mha else make_layer()([x, x])
    return keras.Model(ids, y)


@pytest.mark.parametrize(
    "theirs, ours, mha",
    [
        (lambda: keras.layers.Attention(use_scale=True), lambda: ak.Attention(use_scale=True), 0),
        (keras.layers.AdditiveAttention, ak.AdditiveAttention, 0),
        (lambda: keras.layers.MultiHeadAttention(2, 3), lambda: ak.MultiHeadAttention(2, 3), 1),
    ],
)
def test_padding_masks_from_an_embedding(theirs, ours, mha):
    """The same model with Keras's layer and with attnzoo's, on the same weights: the same
    outputs on padded sequences, for every query Keras and attnzoo agree on (kept ones; see
    the module Note of attnzoo.keras.layers for fully masked rows)."""
    model_k, model_a = _embedded_model(theirs, mha), _embedded_model(ours, mha)
    model_a.set_weights(model_k.get_weights())
    ids = np.random.default_rng(0).integers(1, 11, size=(3, TV))
    ids[0, 6:] = 0
    ids[2, 3:] = 0
    keep = ids != 0
    got, expected = model_a.predict(ids, verbose=0), model_k.predict(ids, verbose=0)
    np.testing.assert_allclose(got[keep], expected[keep], 1e-5, 1e-5)
    if not mha:  # Keras's list layers zero the masked queries' rows, as attnzoo's do
        assert (got[~keep] == 0).all() and (expected[~keep] == 0).all()


def test_dropout_only_in_training():
    q, v = torch.randn(2, 5, 4), torch.randn(2, 9, 4)
    for layer in (ak.Attention(dropout=0.5), ak.AdditiveAttention(dropout=0.5)):
        assert torch.equal(layer([q, v]), layer([q, v], training=False))
        assert not torch.equal(layer([q, v], training=True), layer([q, v]))
    mha = ak.MultiHeadAttention(2, 3, dropout=0.5)
    assert torch.equal(mha(q, v), mha(q, v, training=False))
    assert not torch.equal(mha(q, v, training=True), mha(q, v))


def test_the_docs_python_blocks_run_as_written():
    """docs/keras.md's Python blocks, in order in one namespace, as a reader pastes them;
    those that say they are fragments (of a tutorial's own layers) are left out. Undefined
    names (q, v, theirs, x, memory, m) made the first ones fail as written."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "keras.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    runnable = [b for b in blocks if not b.startswith("# a fragment")]
    assert runnable and len(runnable) < len(blocks)
    namespace: dict = {}
    for block in runnable:
        exec(compile(block, "docs/keras.md", "exec"), namespace)
