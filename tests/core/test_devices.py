"""Every attention path of the core, forward and backward, on every device of the `device`
fixture (cpu, meta, and cuda where present).

On `meta` no values exist: a tensor the library made on the default device instead of its
inputs' fails the call, without a GPU. These tests check shapes and devices; the value tests
of the other files cover the numbers on cpu.
"""

import pytest
import torch

from attnzoo import (
    KVCache,
    LearnedPositionalEmbedding,
    LocalAttention,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    attention,
    causal_mask,
    combine_masks,
    gumbel_softmax_st,
    hard_argmax,
    masked_softmax,
    padding_mask,
    prepare_key,
    sample_hard,
    scores,
    sinusoidal_encoding,
    window_mask,
)
from attnzoo.core import additive
from attnzoo.core.masks import geometry_mask

GEOMETRIES = {
    "none": {},
    "padding": {"padding": True},
    "causal": {"causal": True},
    "window": {"window": 2},
    "causal+window": {"causal": True, "window": 2},
}


def leaves(*shapes, device):
    return [torch.randn(*shape, device=device, requires_grad=True) for shape in shapes]


def on(tensor, device, shape=None) -> None:
    """`tensor` lives on `device` (any index of its type) and has `shape`."""
    assert tensor.device.type == device.type, tensor.device
    if shape is not None:
        assert tuple(tensor.shape) == tuple(shape)


def padding(lengths, key_len, device):
    return padding_mask(torch.tensor(lengths, device=device), key_len)  # (batch, 1, key_len)


def geometry_kwargs(geometry, lengths, key_len, device):
    kwargs = {k: v for k, v in GEOMETRIES[geometry].items() if k != "padding"}
    if GEOMETRIES[geometry].get("padding"):
        kwargs["mask"] = padding(lengths, key_len, device)
    return kwargs


def backward_reaches(inputs, device, outputs) -> None:
    """sum(outputs).backward(); every input's gradient (where the path uses it) is on
    `device` with the input's shape."""
    sum(o.sum() for o in outputs if o is not None).backward()
    for t in inputs:
        if t.grad is not None:
            on(t.grad, device, t.shape)


@pytest.mark.parametrize("name", list(scores.SCORES))
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("return_weights", [False, True])
def test_every_score_and_geometry(device, name, geometry, return_weights):
    b, i, j = 2, 5, 7
    score = scores.make_score(name, 6, 6, d_hidden=5, max_keys=j).to(device)
    q, k, v = leaves((b, i, 6), (b, j, 6), (b, j, 4), device=device)
    out = attention(
        q,
        k,
        v,
        score=score,
        return_weights=return_weights,
        **geometry_kwargs(geometry, [7, 4], j, device),
    )
    on(out.context, device, (b, i, 4))
    if return_weights:
        on(out.weights, device, (b, i, j))
    else:
        assert out.weights is None
    backward_reaches([q, k, v, *score.parameters()], device, [out.context, out.weights])
    assert q.grad is not None and v.grad is not None


@pytest.mark.parametrize("name", ["scaled_dot", "general", "additive"])
def test_heads_and_dropout(device, name):
    """4-D (batch, heads, len, d) inputs with dropout: SDPA's own dropout for dot-family
    scores, the plain path's for additive."""
    b, h, i, j = 2, 3, 4, 6
    score = scores.make_score(name, 8, 8, d_hidden=5).to(device)
    q, k, v = leaves((b, h, i, 8), (b, h, j, 8), (b, h, j, 4), device=device)
    mask = padding([6, 2], j, device).unsqueeze(1)  # (b, 1, 1, j)
    out = attention(q, k, v, score=score, mask=mask, causal=True, dropout=0.3)
    on(out.context, device, (b, h, i, 4))
    backward_reaches([q, k, v, *score.parameters()], device, [out.context])


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("return_weights", [False, True])
def test_additive_blockwise_kernel(device, geometry, return_weights):
    """Sizes above BLOCK_ELEMENTS, so the blockwise kernels run (several blocks, a short
    last one): the fused one without weights, the logits one with."""
    b, i, j, hidden = 2, 96, 128, 192
    assert b * i * j * hidden > additive.BLOCK_ELEMENTS
    score = scores.make_score("additive", 6, 6, d_hidden=hidden).to(device)
    q, k, v = leaves((b, i, 6), (b, j, 6), (b, j, 4), device=device)
    kwargs = geometry_kwargs(geometry, [128, 50], j, device)
    out = attention(q, k, v, score=score, return_weights=return_weights, **kwargs)
    on(out.context, device, (b, i, 4))
    backward_reaches([q, k, v, *score.parameters()], device, [out.context, out.weights])
    assert score.v.grad is not None


@pytest.mark.parametrize("name", ["general", "additive"])
def test_prepared_key_reused_across_steps(device, name):
    score = scores.make_score(name, 6, 6, d_hidden=5).to(device)
    k, v = leaves((2, 9, 6), (2, 9, 4), device=device)
    prepared = prepare_key(score, k)
    on(prepared.tensor, device)
    mask = padding([9, 3], 9, device)
    steps = [
        attention(q, prepared, v, score=score, mask=mask).context
        for q in leaves((2, 1, 6), (2, 1, 6), (2, 1, 6), device=device)
    ]
    for step in steps:
        on(step, device, (2, 1, 4))
    backward_reaches([k, v], device, steps)
    assert k.grad is not None


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_multi_head_self_and_cross(device, score):
    mha = MultiHeadAttention(8, 2, score=score).to(device)
    x, memory = leaves((2, 5, 8), (2, 6, 8), device=device)
    mask = padding([6, 3], 6, device)
    self_out = mha(x, causal=True, window=2, return_weights=True)
    cross_out = mha(x, memory, mask=mask, return_weights=True)
    on(self_out.context, device, (2, 5, 8))
    on(self_out.weights, device, (2, 2, 5, 5))
    on(cross_out.context, device, (2, 5, 8))
    on(cross_out.weights, device, (2, 2, 5, 6))
    outputs = [self_out.context, self_out.weights, cross_out.context]
    backward_reaches([x, memory, *mha.parameters()], device, outputs)


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
@pytest.mark.parametrize(
    ("causal", "window"), [(True, None), (False, 2), (True, 2)], ids=["causal", "window", "both"]
)
def test_multi_head_kv_cache_over_incremental_steps(device, score, causal, window):
    """A prefix of 3 positions, then 3 single steps, then 2 at once: the cache offsets the
    geometry at every call."""
    mha = MultiHeadAttention(8, 2, score=score).to(device)
    (x,) = leaves((2, 8, 8), device=device)
    cache = KVCache()
    outputs = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 6), (6, 8)]:
        out = mha(x[:, start:stop], causal=causal, window=window, cache=cache)
        on(out.context, device, (2, stop - start, 8))
        outputs.append(out.context)
        assert cache.length == stop
    on(cache.key, device, (2, 2, 8, 4))
    cache.reorder(torch.tensor([1, 0], device=device))
    on(cache.value, device, (2, 2, 8, 4))
    backward_reaches([x, *mha.parameters()], device, outputs)


def test_multi_head_cross_attention_cache(device):
    mha = MultiHeadAttention(8, 2).to(device)
    x, memory = leaves((2, 1, 8), (2, 6, 8), device=device)
    cache = KVCache()
    outputs = [mha(x, memory, mask=padding([6, 2], 6, device), cache=cache).context]
    outputs.append(mha(x, memory, cache=cache).context)
    assert cache.static and cache.length == 6
    for out in outputs:
        on(out, device, (2, 1, 8))
    backward_reaches([x, memory, *mha.parameters()], device, outputs)


@pytest.mark.parametrize("predictive", [False, True], ids=["local-m", "local-p"])
def test_local_attention(device, predictive):
    local = LocalAttention(scores.Dot(), window=2, d_query=6 if predictive else None)
    local = local.to(device)
    q, k, v = leaves((2, 5, 6), (2, 9, 6), (2, 9, 4), device=device)
    kwargs = {"lengths": torch.tensor([9, 6], device=device)} if predictive else {}
    out = local(q, k, v, mask=padding([9, 6], 9, device), **kwargs)
    on(out.context, device, (2, 5, 4))
    on(out.weights, device, (2, 5, 9))
    outputs = [out.context]
    if not predictive:  # a decoding step at a given position
        step = local(q[:, 4:5], k, v, positions=torch.tensor([4], device=device))
        on(step.context, device, (2, 1, 4))
        outputs.append(step.context)
    backward_reaches([q, k, v, *local.parameters()], device, outputs)
    if predictive:
        assert local.w_p.weight.grad is not None


def test_mask_helpers(device):
    on(padding([3, 1], 4, device), device, (2, 1, 4))
    on(causal_mask(3, 5, offset=1, device=device), device, (3, 5))
    on(window_mask(3, 5, 1, device=device), device, (3, 5))
    centers = torch.tensor([[0.5, 2.0, 3.5]], device=device)
    on(window_mask(3, 5, 1, centers=centers), device, (1, 3, 5))
    on(geometry_mask(3, 5, causal=True, window=1, offset=2, device=device), device, (3, 5))
    both = combine_masks(padding([3, 1], 5, device), causal_mask(3, 5, device=device))
    on(both, device, (2, 3, 5))
    logits = torch.randn(2, 3, 5, device=device)
    on(masked_softmax(logits, both), device, (2, 3, 5))


def test_padding_mask_default_length_reads_values(device):
    """Without max_len, padding_mask reads lengths.max(): a value, which meta lacks, so there
    it asks for max_len by name."""
    lengths = torch.tensor([3, 1], device=device)
    if device.type == "meta":
        with pytest.raises(ValueError, match="'max_len'.*meta"):
            padding_mask(lengths)
    else:
        on(padding_mask(lengths), device, (2, 1, 3))


def test_positional_encodings(device):
    (x,) = leaves((2, 5, 6), device=device)
    on(sinusoidal_encoding(5, 6, offset=2, device=device), device, (5, 6))
    learned = LearnedPositionalEmbedding(8, 6).to(device)
    outputs = [SinusoidalPositionalEncoding(6)(x, offset=1), learned(x, offset=3)]
    for out in outputs:
        on(out, device, (2, 5, 6))
    backward_reaches([x, *learned.parameters()], device, outputs)
    assert learned.embedding.weight.grad is not None


def test_hard_attention(device):
    (logits,) = leaves((2, 3, 5), device=device)
    mask = padding([5, 2], 5, device)
    hard = hard_argmax(logits, mask)
    for t in hard:
        on(t, device)
    on(hard.weights, device, (2, 3, 5))
    straight = gumbel_softmax_st(logits, mask, tau=0.5)
    on(straight, device, (2, 3, 5))
    sampled = sample_hard(logits, mask)  # multinomial: supported on meta in this torch
    on(sampled.weights, device, (2, 3, 5))
    on(sampled.log_prob, device, (2, 3))
    backward_reaches([logits], device, [hard.log_prob, straight, sampled.log_prob])
    assert logits.grad is not None
