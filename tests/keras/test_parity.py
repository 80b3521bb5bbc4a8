"""attnzoo.keras against Keras's own layers on copied weights (1e-5), and against hand-written
references where Keras has no such layer (the TF NMT tutorial's Bahdanau layer, Luong's
scores). Odd sizes, query_len != key_len, masks and causal masks."""

import pytest
import torch

keras = pytest.importorskip(
    "keras", reason="Keras 3 is not installed: pip install 'attnzoo[keras]'"
)

import attnzoo  # noqa: E402
import attnzoo.core.additive as additive_kernel  # noqa: E402
import attnzoo.keras as ak  # noqa: E402

B, TQ, TV, D, DV = 3, 7, 17, 5, 6
TOL = {"rtol": 1e-5, "atol": 1e-5}


def test_backend_is_torch():
    assert keras.backend.backend() == "torch"


def _masks(causal: bool):
    """Keras masks (True = keep): some masked queries and keys; every query keeps at least one
    key, also under the causal mask (key 0 always kept), where the layers agree (see the
    module's Note for rows with none)."""
    query_mask = torch.rand(B, TQ) > 0.3
    value_mask = torch.rand(B, TV) > 0.4
    value_mask[:, 0] = True
    return query_mask, value_mask


@pytest.fixture(params=["one block", "blockwise"])
def blocks(request, monkeypatch):
    """The additive kernel's two paths: one broadcast block, or many blocks with the
    recomputing backward (a tiny block budget forces it at these sizes)."""
    if request.param == "blockwise":
        monkeypatch.setattr(additive_kernel, "BLOCK_ELEMENTS", 4 * TV * D)
    return request.param


def _inputs(dq=D, dk=D, dv=DV):
    q = torch.randn(B, TQ, dq, requires_grad=True)
    v = torch.randn(B, TV, dv, requires_grad=True)
    k = torch.randn(B, TV, dk, requires_grad=True)
    return q, v, k


def _grads(out, tensors):
    g = torch.randn_like(out)
    return torch.autograd.grad((out * g).sum(), tensors)


def _compare(theirs, ours, inputs, causal, masked, weights_too=True):
    """Outputs, scores and input gradients of two list-input layers, with the same masks."""
    mask = list(_masks(causal)) if masked else None
    kw = {"mask": mask, "use_causal_mask": causal}
    expected = theirs(inputs, **kw)
    got = ours(inputs, **kw)
    torch.testing.assert_close(got, expected, **TOL)
    params = [w.value for w in ours.trainable_weights]
    their_params = [w.value for w in theirs.trainable_weights]
    for a, b in zip(
        _grads_with(got, [*inputs, *params]),
        _grads_with(expected, [*inputs, *their_params]),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TOL)
    if weights_too:
        out, w = ours(inputs, return_attention_scores=True, **kw)
        out_k, w_k = theirs(inputs, return_attention_scores=True, **kw)
        torch.testing.assert_close(out, out_k, **TOL)
        torch.testing.assert_close(w, w_k, **TOL)


def _grads_with(out, tensors):
    torch.manual_seed(1)  # the same output gradient for both layers
    return _grads(out, tensors)


@pytest.mark.parametrize("use_scale", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_dot_parity(use_scale, causal):
    _attention_parity(use_scale, "dot", causal)


@pytest.mark.parametrize("use_scale", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_concat_parity(use_scale, causal, blocks):
    _attention_parity(use_scale, "concat", causal)


def _attention_parity(use_scale, score_mode, causal):
    theirs = keras.layers.Attention(use_scale=use_scale, score_mode=score_mode)
    ours = ak.Attention(use_scale=use_scale, score_mode=score_mode)
    inputs = list(_inputs())
    theirs(inputs)
    ours(inputs)
    weights = [torch.tensor(0.7), torch.tensor(1.3)][: len(theirs.get_weights())]
    theirs.set_weights([w.numpy() for w in weights])  # not the initial ones: a scale that acts
    ours.set_weights(theirs.get_weights())
    _compare(theirs, ours, inputs, causal, masked=True)
    _compare(theirs, ours, [inputs[0], inputs[2]], causal, masked=False)  # key = value


@pytest.mark.parametrize("use_scale", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_additive_attention_parity(use_scale, causal, blocks):
    theirs = keras.layers.AdditiveAttention(use_scale=use_scale)
    ours = ak.AdditiveAttention(use_scale=use_scale)
    inputs = list(_inputs())
    theirs(inputs)
    ours(inputs)
    ours.set_weights(theirs.get_weights())
    _compare(theirs, ours, inputs, causal, masked=True)
    _compare(theirs, ours, inputs, causal, masked=False)


def test_additive_attention_fused_path_is_taken(monkeypatch):
    """Without weights and dropout the layer runs the fused kernel (never the (b, i, j, d)
    broadcast), which is what its memory depends on."""
    calls = []
    fused = attnzoo.scores._additive_attention  # what scores.Additive.fused calls
    monkeypatch.setattr(
        attnzoo.scores, "_additive_attention", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )
    layer = ak.AdditiveAttention()
    layer(list(_inputs()))
    assert calls


def test_additive_attention_propagates_an_infinite_query():
    """tanh saturates an infinite query feature into finite logits: the context is made
    non-finite instead (scores.Additive's rule, which SummedTanh inherits)."""
    query, value, key = (t.detach() for t in _inputs())
    query[0, 1, 0] = float("inf")
    out = ak.AdditiveAttention()([query, value, key])
    assert not torch.isfinite(out[0, 1]).any()
    assert torch.isfinite(out[1]).all()


def test_summed_tanh_names_a_wrong_size():
    score = ak.SummedTanh(torch.ones(4))
    with pytest.raises(ValueError, match="'key' expected last dimension 4"):
        score.prepare_key(torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="'query' expected last dimension 4"):
        score.prepare_query(torch.ones(1, 2, 3))


def _keras_mha(**kwargs):
    return keras.layers.MultiHeadAttention(**kwargs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
def test_mha_parity_cross(causal, use_bias):
    theirs = _keras_mha(num_heads=3, key_dim=4, value_dim=5, use_bias=use_bias)
    q, v, k = _inputs(6, 9, 8)
    theirs(q, v, k)
    ours = ak.MultiHeadAttention.from_keras(theirs)
    attention_mask = torch.rand(B, TQ, TV) > 0.3
    attention_mask[..., 0] = True
    for mask in (None, attention_mask):
        expected = theirs(q, v, k, attention_mask=mask, use_causal_mask=causal)
        got = ours(q, v, k, attention_mask=mask, use_causal_mask=causal)
        torch.testing.assert_close(got, expected, **TOL)
        params = [w.value for w in ours.trainable_weights]
        their_params = [w.value for w in theirs.trainable_weights]
        for a, b in zip(
            _grads_with(got, [q, v, k, *params]),
            _grads_with(expected, [q, v, k, *their_params]),
            strict=True,
        ):
            torch.testing.assert_close(a, b, **TOL)
        got, w = ours(
            q, v, k, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
        )
        expected, w_k = theirs(
            q, v, k, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
        )
        torch.testing.assert_close(got, expected, **TOL)
        torch.testing.assert_close(w, w_k, **TOL)


@pytest.mark.parametrize(
    "shape",
    [(TQ, TV), (B, TQ, TV), (B, 1, 1, TV), (B, 1, TQ, TV), (B, 3, TQ, TV), (1, TQ, TV)],
    ids=["2d", "3d", "padding-4d", "shared-4d", "per-head", "one-for-all"],
)
def test_mha_attention_masks_of_every_keras_shape(shape):
    """Keras broadcasts an attention mask whose dims are each that size or 1: a (query_len,
    key_len) mask was refused with an error naming the core's 'mask' (not attention_mask),
    and a tutorial's (batch, 1, 1, key_len) padding mask was refused outright."""
    theirs = _keras_mha(num_heads=3, key_dim=4)
    q, v, k = _inputs(6, 8, 8)
    theirs(q, v, k)
    ours = ak.MultiHeadAttention.from_keras(theirs)
    mask = torch.rand(shape) > 0.3
    mask[..., 0] = True
    for causal in (False, True):
        expected = theirs(q, v, k, attention_mask=mask, use_causal_mask=causal)
        got = ours(q, v, k, attention_mask=mask, use_causal_mask=causal)
        torch.testing.assert_close(got, expected, **TOL)


def test_mha_attention_mask_of_another_head_count_names_it():
    ours = ak.MultiHeadAttention(num_heads=2, key_dim=4)
    q, v, k = _inputs(6, 8, 8)
    with pytest.raises(ValueError, match="'attention_mask' expected .* each dim that size or 1"):
        ours(q, v, k, attention_mask=torch.ones(B, 3, TQ, TV, dtype=torch.bool))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_mha_padding_garbage_reaches_no_output_or_gradient(garbage):
    """Keras's own layer projects the padded memory rows (a NaN there made its output and its
    kernels' gradients non-finite when tried); ours clears them first: the output and every
    gradient equal the clean ones."""
    layer = ak.MultiHeadAttention(num_heads=2, key_dim=4)
    q, memory = torch.randn(B, TQ, D), torch.randn(B, TV, D)
    value_mask = torch.ones(B, TV, dtype=torch.bool)
    value_mask[1, 5:] = False
    layer(q, memory)  # builds the weights

    def run(memory):
        leaves = [q.clone().requires_grad_(), memory.clone().requires_grad_()]
        out = layer(*leaves, value_mask=value_mask)
        return out, _grads_with(out, [*leaves, *(w.value for w in layer.trainable_weights)])

    clean, clean_grads = run(memory)
    dirty = memory.clone()
    dirty[1, 5:] = garbage
    out, grads = run(dirty)
    assert torch.equal(out, clean)
    for got, want in zip(grads, clean_grads, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("causal", [False, True])
def test_mha_parity_self_attention_and_set_weights(causal):
    """Self-attention takes the fused projection; set_weights takes Keras's list as it is."""
    theirs = _keras_mha(num_heads=2, key_dim=3, output_shape=(2, 5))
    x = torch.randn(B, TV, 7)
    theirs(x, x)
    ours = ak.MultiHeadAttention(num_heads=2, key_dim=3, output_shape=(2, 5))
    ours(x, x)
    ours.set_weights(theirs.get_weights())
    expected = theirs(x, x, use_causal_mask=causal)
    got = ours(x, x, use_causal_mask=causal)
    assert got.shape == (B, TV, 2, 5)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(ours(x, x, x, use_causal_mask=causal), expected, **TOL)


def test_mha_keras_masks_of_the_inputs():
    """Keras masks attached to the inputs (Masking / Embedding(mask_zero=True)) are read as
    Keras reads them. Rows of masked queries: zero context in both with scores requested (Keras's
    softmax path); on Keras's default SDPA path they differ (module Note), so only kept rows
    are compared there."""
    theirs = _keras_mha(num_heads=2, key_dim=4)
    x = torch.randn(B, TQ, 6)
    memory = torch.randn(B, TV, 6)
    x[0, -2:] = 0.0  # masked queries
    memory[1, 5:] = 0.0  # masked keys
    masking = keras.layers.Masking(0.0)

    def masked():  # fresh tensors each call: Keras's layer removes the masks of its inputs
        return masking(x), masking(memory)

    theirs(*masked())
    ours = ak.MultiHeadAttention.from_keras(theirs)
    expected, w_k = theirs(*masked(), return_attention_scores=True)
    got, w = ours(*masked(), return_attention_scores=True)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(w, w_k, **TOL)
    assert (w[1, :, :, 5:] == 0).all() and (w[0, :, -2:] == 0).all()
    assert (w[1, :, :, :5] > 0).all() and (w[0, :, :-2] > 0).all()
    keep = torch.ones(B, TQ, dtype=torch.bool)
    keep[0, -2:] = False
    torch.testing.assert_close(ours(*masked())[keep], theirs(*masked())[keep], **TOL)
    out = ours(*masked())
    assert torch.equal(out._keras_mask, keep)  # the output carries the query's mask


def _tutorial_bahdanau(units):
    """The hand-written layer of the TF NMT tutorial (query (batch, hidden), values
    (batch, len, hidden)), in Keras 3 ops."""

    class BahdanauAttention(keras.layers.Layer):
        def __init__(self, units):
            super().__init__()
            self.W1 = keras.layers.Dense(units)
            self.W2 = keras.layers.Dense(units)
            self.V = keras.layers.Dense(1)

        def call(self, query, values):
            query_with_time_axis = keras.ops.expand_dims(query, 1)
            score = self.V(keras.ops.tanh(self.W1(query_with_time_axis) + self.W2(values)))
            attention_weights = keras.ops.softmax(score, axis=1)
            context_vector = keras.ops.sum(attention_weights * values, axis=1)
            return context_vector, attention_weights

    return BahdanauAttention(units)


def test_bahdanau_parity_with_the_tutorial_layer(blocks):
    """The tutorial's W1, W2 and V as BahdanauAttention's weights (docs/keras.md's mapping):
    query_proj_weight = W1.kernel^T, query_proj_bias = W1.bias + W2.bias, key_proj_weight =
    W2.kernel^T, v = V.kernel[:, 0] (V's bias shifts every logit alike)."""
    tutorial = _tutorial_bahdanau(10)
    query, values = torch.randn(B, D), torch.randn(B, TV, DV)
    tutorial(query, values)
    for dense in (tutorial.W1, tutorial.W2, tutorial.V):
        dense.bias.assign(torch.randn(dense.bias.shape))
    ours = ak.BahdanauAttention(10)
    ours([query, values])
    names = [w.name for w in ours.weights]
    assert names == ["v", "query_proj_weight", "query_proj_bias", "key_proj_weight"]
    w1, w2, v = tutorial.W1, tutorial.W2, tutorial.V
    ours.set_weights(
        [
            v.kernel.value[:, 0].detach(),
            w1.kernel.value.T.detach(),
            (w1.bias.value + w2.bias.value).detach(),
            w2.kernel.value.T.detach(),
        ]
    )
    expected, expected_w = tutorial(query, values)
    got, w = ours([query, values], return_attention_scores=True)
    assert got.shape == (B, DV) and w.shape == (B, TV)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(w, expected_w[..., 0], **TOL)
    torch.testing.assert_close(ours([query, values]), expected, **TOL)  # the fused kernel


def _reference(logits, value, value_mask, causal, query_mask):
    """softmax(logits | masks) @ value, and Keras's zeroed rows of masked queries."""
    allowed = value_mask[:, None, :].expand_as(logits)
    if causal:
        allowed = allowed & torch.ones(TQ, TV, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    return (weights @ value) * query_mask[..., None], weights


@pytest.mark.parametrize("score", ak.LuongAttention.SCORES)
@pytest.mark.parametrize("causal", [False, True])
def test_luong_scores(score, causal):
    layer = ak.LuongAttention(score, max_keys=TV + 3)
    q, v, k = (t.detach() for t in _inputs())
    query_mask, value_mask = _masks(causal)
    got, w = layer(
        [q, v, k],
        mask=[query_mask, value_mask],
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    weights = {x.name: x.value.detach() for x in layer.weights}
    if score == "dot":
        logits = q @ k.transpose(1, 2)
    elif score == "general":
        logits = q @ weights["weight"] @ k.transpose(1, 2)  # h_t^T W_a h_s
    else:
        logits = (q @ weights["proj_weight"].T + weights["proj_bias"])[..., :TV]  # W_a h_t
    expected, expected_w = _reference(logits, v, value_mask, causal, query_mask)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(w, expected_w, **TOL)


def test_luong_dot_is_keras_attention():
    q, v, k = (t.detach() for t in _inputs())
    expected = keras.layers.Attention()([q, v, k], use_causal_mask=True)
    got = ak.LuongAttention("dot")([q, v, k], use_causal_mask=True)
    torch.testing.assert_close(got, expected, **TOL)


def test_core_attention_is_what_runs():
    """The drop-in computes attnzoo.attention's numbers (same masks, same zero rows)."""
    q, v, k = (t.detach() for t in _inputs())
    query_mask, value_mask = _masks(False)
    got = ak.Attention()([q, v, k], mask=[query_mask, value_mask])
    out = attnzoo.attention(q, k, v, score="dot", mask=value_mask[:, None, :]).context
    torch.testing.assert_close(got, out * query_mask[..., None], **TOL)


def _hand_written_mha(d_model, num_heads):
    """The Transformer tutorial's layer: Dense wq/wk/wv/dense, split_heads, mask 1 = hide."""

    class HandWrittenMHA(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.num_heads, self.depth = num_heads, d_model // num_heads
            self.wq, self.wk, self.wv = (keras.layers.Dense(d_model) for _ in range(3))
            self.dense = keras.layers.Dense(d_model)

        def split_heads(self, x):
            x = keras.ops.reshape(x, (keras.ops.shape(x)[0], -1, self.num_heads, self.depth))
            return keras.ops.transpose(x, (0, 2, 1, 3))

        def call(self, v, k, q, mask):
            q, k, v = (
                self.split_heads(f(x)) for f, x in ((self.wq, q), (self.wk, k), (self.wv, v))
            )
            logits = keras.ops.matmul(q, keras.ops.transpose(k, (0, 1, 3, 2)))
            logits = logits / keras.ops.sqrt(keras.ops.cast(self.depth, "float32"))
            weights = keras.ops.softmax(logits + mask * -1e9, axis=-1)
            out = keras.ops.transpose(keras.ops.matmul(weights, v), (0, 2, 1, 3))
            return self.dense(keras.ops.reshape(out, (keras.ops.shape(out)[0], -1, d_model)))

    return HandWrittenMHA()


def test_mha_from_the_hand_written_layer():
    """docs/keras.md's mapping of the tutorial's four Dense kernels, and of its mask."""
    d_model, h = 12, 3
    hand = _hand_written_mha(d_model, h)
    q, kv = torch.randn(B, TQ, d_model), torch.randn(B, TV, d_model)
    tutorial_mask = (torch.rand(B, 1, TQ, TV) > 0.7).float()  # 1 = hide
    tutorial_mask[..., 0] = 0.0
    expected = hand(kv, kv, q, tutorial_mask)
    mine = ak.MultiHeadAttention(num_heads=h, key_dim=d_model // h)
    mine(q, kv)
    mine.set_weights(
        [
            *(
                a
                for dense in (hand.wq, hand.wk, hand.wv)
                for a in (
                    dense.kernel.numpy().reshape(d_model, h, -1),
                    dense.bias.numpy().reshape(h, -1),
                )
            ),
            hand.dense.kernel.numpy().reshape(h, -1, d_model),
            hand.dense.bias.numpy(),
        ]
    )
    got = mine(q, kv, kv, attention_mask=1 - tutorial_mask)
    torch.testing.assert_close(got, expected, **TOL)
