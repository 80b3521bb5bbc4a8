import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnzoo import KVCache, MultiHeadAttention, scores
from attnzoo.core import scores as scores_module
from attnzoo.core.mha import CacheError
from tests.core.reference import ref_attention, ref_logits
from tests.core.test_attention import geometric
from tests.core.test_scores import params_of


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_from_torch_parity_with_key_padding(bias, cross):
    torch_mha = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(torch_mha).eval()
    x = torch.randn(3, 7, 16)
    memory = torch.randn(3, 17, 16) if cross else x
    key_len = memory.shape[1]
    lengths = torch.tensor([key_len, 3, 1])
    pad = torch.arange(key_len)[None] >= lengths[:, None]  # torch: True = ignore
    expected, expected_w = torch_mha(
        x, memory, memory, key_padding_mask=pad, average_attn_weights=False
    )
    got = ours(x, memory if cross else None, mask=~pad[:, None, :], return_weights=True)
    torch.testing.assert_close(got.context, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.weights, expected_w, rtol=1e-5, atol=1e-6)
    fast = ours(x, memory if cross else None, mask=~pad[:, None, :])  # SDPA path
    torch.testing.assert_close(fast.context, expected, rtol=1e-5, atol=1e-5)


def test_from_torch_parity_causal_separate_kdim():
    torch_mha = nn.MultiheadAttention(8, 2, kdim=5, vdim=5, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(torch_mha).eval()
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 6, 5)
    expected, _ = torch_mha(x, memory, memory)
    torch.testing.assert_close(ours(x, memory).context, expected, rtol=1e-5, atol=1e-5)
    torch_self = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours_self = MultiHeadAttention.from_torch(torch_self)
    y = torch.randn(2, 9, 8)
    causal = nn.Transformer.generate_square_subsequent_mask(9)
    expected, _ = torch_self(y, y, y, attn_mask=causal)
    torch.testing.assert_close(ours_self(y, causal=True).context, expected, rtol=1e-5, atol=1e-5)


def test_matches_float64_reference_per_head_mask():
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    mask = torch.rand(2, 3, 5, 5) > 0.3
    out = mha(x, mask=mask, return_weights=True)
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = mha.in_proj.block_views()
    q = (x @ w_q.T + b_q).view(2, 5, 3, 4).transpose(1, 2)  # (b, h, i, d_head)
    k = (x @ w_k.T + b_k).view(2, 5, 3, 4).transpose(1, 2)  # (b, h, j, d_head)
    v = (x @ w_v.T + b_v).view(2, 5, 3, 4).transpose(1, 2)  # (b, h, j, d_head)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / 2.0
    ctx, w = ref_attention(logits, v, mask)
    expected = ctx.transpose(1, 2).reshape(2, 5, 12) @ mha.out_proj.weight.T + mha.out_proj.bias
    torch.testing.assert_close(out.context, expected)
    torch.testing.assert_close(out.weights, w)


# every score but location, whose logits are one per key position (it needs max_keys, which
# MultiHeadAttention refuses to guess): from the registry, so a new score is covered
MHA_SCORES = [name for name in scores_module.SCORES if name != "location"]


@pytest.mark.parametrize("score", MHA_SCORES)
def test_every_score_runs_self_and_cross_with_gradients(score):
    mha = MultiHeadAttention(8, 2, score=score)
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    cross = mha(x, memory, mask=torch.tensor([True] * 4 + [False])[None, None])
    assert cross.context.shape == (2, 3, 8)
    self_ = mha(x, causal=True, return_weights=True)
    assert self_.weights.shape == (2, 2, 3, 3)
    (cross.context.sum() + (self_.context * torch.randn(2, 3, 8)).sum()).backward()
    # self- and cross-attention together use every parameter: projections, output, score
    for name, p in mha.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_incremental_cache_equals_full_causal(score):
    mha = MultiHeadAttention(8, 2, score=score).eval()
    x = torch.randn(2, 6, 8)
    full = mha(x, causal=True).context
    cache = KVCache()
    steps = [mha(x[:, t : t + 1], causal=True, cache=cache).context for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    # several new positions at once after a prefix: the causal offset is the cache length
    cache = KVCache()
    first = mha(x[:, :2], causal=True, cache=cache).context
    rest = mha(x[:, 2:], causal=True, cache=cache).context
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 6


def test_incremental_cache_with_window_equals_full():
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 7, 8)
    full = mha(x, causal=True, window=2).context
    cache = KVCache()
    first = mha(x[:, :3], causal=True, window=2, cache=cache).context
    steps = [mha(x[:, t : t + 1], causal=True, window=2, cache=cache).context for t in range(3, 7)]
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_one_step_at_a_time_with_a_window_equals_float64_reference(window, causal):
    """Decoding one position at a time through a self-attention cache with a window, with
    or without causal (a step has no later keys to exclude): step t attends keys j <= t with
    |j - t| <= window, the cache length its offset. Without causal the offset was dropped:
    step t got the window of position 0 (off by 0.3 from step 2). Against a float64 einsum
    reference of the heads, and the full pass with causal and the window."""
    mha = MultiHeadAttention(8, 2).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    cache = KVCache()
    steps = [
        mha(x[:, t : t + 1], causal=causal, window=window, cache=cache).context for t in range(7)
    ]
    q, k, v = ((x @ w.T + b).view(2, 7, 2, 4).transpose(1, 2) for w, b in mha.in_proj.block_views())
    ctx, _ = ref_attention(ref_logits("scaled_dot", q, k), v, geometric(7, 7, True, window))
    expected = ctx.transpose(1, 2).reshape(2, 7, 8) @ mha.out_proj.weight.T + mha.out_proj.bias
    torch.testing.assert_close(torch.cat(steps, 1), expected)
    full = mha(x, causal=True, window=window).context
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_cross_attention_cache_projects_memory_once_and_reorders():
    mha = MultiHeadAttention(8, 2).eval()
    memory, x = torch.randn(3, 5, 8), torch.randn(3, 1, 8)
    cache = KVCache()
    a = mha(x, memory, cache=cache).context
    assert cache.static and cache.length == 5
    b = mha(x, memory * 0, cache=cache).context  # memory ignored once cached
    torch.testing.assert_close(a, b)
    cache.reorder(torch.tensor([2, 2, 0]))
    c = mha(x[[2, 2, 0]], memory, cache=cache).context
    torch.testing.assert_close(c, a[[2, 2, 0]])
    # a memory of another length is another memory: refused, not answered from the cache
    with pytest.raises(CacheError, match="cross cache of the memory's 7 positions, got one of 5"):
        mha(x, torch.randn(3, 7, 8), cache=cache)


def test_dropout_only_in_training():
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 5, 8)
    mha.eval()
    torch.testing.assert_close(mha(x).context, mha(x).context)
    mha.train()
    assert not torch.allclose(mha(x).context, mha(x).context)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(d_model=10, num_heads=3), "'num_heads'.*divisor of d_model=10.*3"),
        (dict(d_model=8, num_heads=2, dropout=-0.1), "'dropout'"),
    ],
)
def test_constructor_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(**kwargs)


def test_call_errors():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="'query'.*d_model = 8.*7"):
        mha(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match="'memory'.*batch size 2.*3"):
        mha(torch.randn(2, 3, 8), torch.randn(3, 3, 8))
    with pytest.raises(TypeError, match="'mask'.*torch.bool"):
        mha(torch.randn(2, 3, 8), mask=torch.ones(2, 3, 3))
    with pytest.raises(TypeError, match="'module'"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))


def test_score_module_instance_is_used_per_head():
    """The given General(d_head, d_head) computes every head's logits q_h W k_h^T: with W = I
    the weights are those of the dot score with the same projections, with W = 0 uniform."""
    s = scores.General(4, 4)
    mha = MultiHeadAttention(8, 2, score=s)
    dot = MultiHeadAttention(8, 2, score="dot")
    dot.load_state_dict({k: v for k, v in mha.state_dict().items() if not k.startswith("score.")})
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        s.weight.copy_(torch.eye(4))
        torch.testing.assert_close(
            mha(x, return_weights=True).weights, dot(x, return_weights=True).weights
        )
        s.weight.zero_()
        uniform = mha(x, return_weights=True).weights
    torch.testing.assert_close(uniform, torch.full((2, 2, 5, 5), 1 / 5))


def test_a_mask_without_its_batch_dim_is_refused():
    """nn.MultiheadAttention's key_padding_mask is (batch, key_len): passed as `mask` with
    batch == query_len it lined up as (query_len, key_len), another mask, silently."""
    mha = MultiHeadAttention(16, 2)
    x, padding = torch.randn(5, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match=r"'mask' expected rank 3 \(batch, query_len, key_len\)"):
        mha(x, mask=padding)
    mha(x, mask=padding.unsqueeze(1))  # (batch, 1, key_len): padding, per row


def test_bad_mask_is_refused_in_the_callers_shape_before_the_cache_grows():
    mha = MultiHeadAttention(16, 2)
    cache = KVCache()
    mha(torch.randn(2, 3, 16), causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"'mask'.*\(2, 1, 4\).*\(2, 1, 5\)"):
        mha(torch.randn(2, 1, 16), mask=torch.ones(2, 1, 5, dtype=torch.bool), cache=cache)
    assert cache.length == 3


@pytest.mark.parametrize("grad", [False, True])
def test_incremental_cache_grows_past_its_capacity(grad):
    """40 one-token steps: without autograd the cache's buffers fill and grow (16, then
    doubled); with it, the steps' graph stays intact and gives the full pass's gradients."""
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 40, 8, requires_grad=grad)
    full = mha(x, causal=True).context
    cache = KVCache()
    with torch.set_grad_enabled(grad):
        steps = torch.cat(
            [mha(x[:, t : t + 1], causal=True, cache=cache).context for t in range(40)], 1
        )
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    if grad:
        (expected,) = torch.autograd.grad(full.square().sum(), x)
        (got,) = torch.autograd.grad(steps.square().sum(), x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_cache_copies_extended_apart_never_share_positions():
    """Beam search copies a state and extends each copy with its own token: neither may see
    the other's key or value, nor change a view given out before."""
    mha = MultiHeadAttention(8, 2).eval()
    x, other = torch.randn(2, 5, 8), torch.randn(2, 1, 8)

    def fresh(*chunks):
        # The same chunks on a cache of its own: a matrix product over 3 rows and one over 5
        # may round differently, so the reference repeats the calls and only sharing can differ.
        cache = KVCache()
        for chunk in chunks:
            mha(chunk, causal=True, cache=cache)
        return cache

    with torch.no_grad():
        a = KVCache()
        mha(x[:, :3], causal=True, cache=a)
        mha(x[:, 3:4], causal=True, cache=a)  # now on buffers with spare capacity
        b = dataclasses.replace(a)
        view, saved = a.key, a.key.clone()
        mha(x[:, 4:5], causal=True, cache=a)
        mha(other, causal=True, cache=b)
        for cache, last in ((a, x[:, 4:5]), (b, other)):
            expected = fresh(x[:, :3], x[:, 3:4], last)
            assert torch.equal(cache.key, expected.key)
            assert torch.equal(cache.value, expected.value)
        assert torch.equal(view, saved)


def test_cross_cache_clears_again_under_another_or_changed_mask():
    """The cached memory was cleared under the first call's mask: a later call with another
    mask, or with that mask changed in place, must not let a position it excludes through."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x = torch.randn(2, 5, 8), torch.randn(2, 1, 8)
    memory[0, 4] = float("nan")
    mask = torch.ones(2, 1, 5, dtype=torch.bool)
    with torch.no_grad():
        cache = KVCache()
        first = mha(x, memory, mask=mask, cache=cache).context
        assert first[0].isnan().all() and first[1].isfinite().all()  # position 4 attended
        pad = mask.clone()
        pad[0, :, 4] = False
        expected = mha(x, memory, mask=pad).context
        assert expected.isfinite().all()
        torch.testing.assert_close(mha(x, memory, mask=pad, cache=cache).context, expected)
        mask[0, :, 4] = False  # the same mask object, changed in place
        torch.testing.assert_close(mha(x, memory, mask=mask, cache=cache).context, expected)


@pytest.mark.parametrize("first", [{"window": 1}, {"causal": True}])
def test_a_cross_cache_filled_under_causal_or_window_keeps_every_memory_row(first):
    """A call with fewer queries than memory rows reaches only some of them under causal or a
    window; the cache it fills still serves later calls, which reach the others: they were
    cleared before the projection and stored so (a later step attended zeros). The filling
    call itself still keeps the rows it does not reach out of its outputs."""
    mha = MultiHeadAttention(16, 4).eval()
    memory, x = torch.randn(2, 8, 16), torch.randn(2, 1, 16)
    memory[:, 5] = float("nan")  # a row the filling call does not reach
    with torch.no_grad():
        cache = KVCache()
        filled = mha(x, memory, cache=cache, **first).context
        torch.testing.assert_close(filled, mha(x, memory, **first).context)
        assert filled.isfinite().all()
        # a later call of the same kind on the cache does not reach row 5 either
        again = torch.randn(2, 1, 16)
        torch.testing.assert_close(
            mha(again, memory, cache=cache, **first).context, mha(again, memory, **first).context
        )
        memory[:, 5] = torch.randn(2, 16)
        later, wide = torch.randn(2, 6, 16), {"window": 1} if "window" in first else {}
        cache = KVCache()
        mha(x, memory, cache=cache, **first)
        for flags in ({}, wide):
            expected = mha(later, memory, **flags).context
            torch.testing.assert_close(mha(later, memory, cache=cache, **flags).context, expected)


def test_cross_cache_keeps_its_padding_out_when_the_mask_widens_in_place():
    """The cache read which keys its mask excluded from the mask object itself at every later
    call: widened in place, it let the cleared padding (zeros, projected) be attended."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x, mask = _padded_memory_and_mask()
    with torch.no_grad():
        cache = KVCache()
        first = mha(x, memory, mask=mask, cache=cache).context
        mask[:] = True  # widened in place: the padding now "allowed"
        again = mha(x, memory, mask=mask, cache=cache).context
    torch.testing.assert_close(again, first)


def _padded_memory_and_mask():
    memory, x = torch.randn(3, 5, 8), torch.randn(3, 1, 8)
    mask = torch.arange(5) < torch.tensor([[5], [3], [2]])  # lengths 5, 3, 2
    mask = mask[:, None, :]  # (3, 1, 5)
    memory[~mask.squeeze(1)] = float("nan")  # padding garbage
    return memory, x, mask


def _counting_clears(monkeypatch) -> list:
    """The calls of the fused path's `clear_unattended` (a static cache's keys and values)."""
    calls = []
    original = scores_module.clear_unattended

    def counted(*args):
        calls.append(args[0])
        return original(*args)

    monkeypatch.setattr(scores_module, "clear_unattended", counted)
    return calls


@pytest.mark.parametrize("told", [True, False])
def test_reordered_cross_cache_told_the_reordered_mask_skips_clearing(told, monkeypatch):
    """Beam search reorders the cache and the mask alike: told `(mask, kept)`, the cache skips
    clearing its keys and values under `kept` at the next call; not told, it clears them.
    Either way the context is the uncached one of the reordered rows."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x, mask = _padded_memory_and_mask()
    index = torch.tensor([2, 2, 0, 1])
    with torch.no_grad():
        expected = mha(x[index], memory[index], mask=mask[index]).context
        assert expected.isfinite().all()
        cache = KVCache()
        mha(x, memory, mask=mask, cache=cache)
        kept = mask.index_select(0, index)
        cache.reorder(index, masks=(mask, kept) if told else None)
        calls = _counting_clears(monkeypatch)
        got = mha(x[index], memory[index], mask=kept, cache=cache).context
    torch.testing.assert_close(got, expected)
    assert len(calls) == (0 if told else 1)


@pytest.mark.parametrize("shape", [(7,), (1, 1, 7)], ids=["key_len", "broadcast"])
def test_a_cross_cache_filled_under_a_mask_without_a_batch_dim_reorders(shape):
    """A cache filled under a (key_len,) or (1, 1, key_len) mask kept a record of the cleared
    keys without a batch dim: reorder() indexed it as one and raised a bare IndexError."""
    mha = MultiHeadAttention(8, 2).eval()
    torch.manual_seed(0)
    x, memory = torch.randn(3, 1, 8), torch.randn(3, 7, 8)
    mask = (torch.arange(7) < 5).view(shape)
    index = torch.tensor([2, 2, 0, 1])
    with torch.no_grad():
        expected = mha(x[index], memory[index], mask=mask).context
        cache = KVCache()
        mha(x, memory, mask=mask, cache=cache)
        cache.reorder(index)
        got = mha(x[index], memory[index], cache=cache).context
    torch.testing.assert_close(got, expected)


def test_a_cross_cache_reordered_without_masks_keeps_its_padding_out():
    """Reordered without `masks`, the cache forgot which keys its memory was cleared under: a
    later call without a mask attended the cleared padding (zeros, projected)."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x, mask = _padded_memory_and_mask()
    index = torch.tensor([2, 2, 0, 1])
    with torch.no_grad():
        expected = mha(x[index], memory[index], mask=mask[index]).context
        cache = KVCache()
        mha(x, memory, mask=mask, cache=cache)
        cache.reorder(index)
        got = mha(x[index], memory[index], cache=cache).context
    torch.testing.assert_close(got, expected)


def test_reordered_cross_cache_told_another_mask_still_clears(monkeypatch):
    """`masks` naming a mask the cache was not cleared under is ignored: a position the new
    mask excludes (NaN in the memory) does not reach the output."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x, mask = _padded_memory_and_mask()
    everything = torch.ones_like(mask)
    index = torch.tensor([1, 2])  # the rows with padding
    with torch.no_grad():
        expected = mha(x[index], memory[index], mask=mask[index]).context
        cache = KVCache()
        first = mha(x, memory, mask=everything, cache=cache).context  # cleared under none
        assert first[index].isnan().all()
        kept = mask.index_select(0, index)
        cache.reorder(index, masks=(mask, kept))  # not the mask it was cleared under
        calls = _counting_clears(monkeypatch)
        got = mha(x[index], memory[index], mask=kept, cache=cache).context
    assert got.isfinite().all() and len(calls) == 1
    torch.testing.assert_close(got, expected)


def test_reorder_refuses_a_kept_mask_of_the_wrong_shape():
    mha = MultiHeadAttention(8, 2).eval()
    memory, x, mask = _padded_memory_and_mask()
    cache = KVCache()
    with torch.no_grad():
        mha(x, memory, mask=mask, cache=cache)
    with pytest.raises(CacheError, match=r"'masks'.*shape \(2, 1, 5\).*\(3, 1, 5\)"):
        cache.reorder(torch.tensor([0, 1]), masks=(mask, mask))


def test_cached_cross_attention_under_inference_mode():
    """An inference tensor has no version counter: a mask made under `torch.inference_mode`
    still gives the uncached result, step after step."""
    mha = MultiHeadAttention(8, 2).eval()
    memory, x = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    with torch.inference_mode():
        mask = torch.arange(5) < torch.tensor([[5], [2]])  # (2, 5): lengths 5 and 2
        mask = mask[:, None, :]
        expected = mha(x, memory, mask=mask).context
        cache = KVCache()
        steps = [mha(x[:, t : t + 1], memory, mask=mask, cache=cache).context for t in range(3)]
    torch.testing.assert_close(torch.cat(steps, 1), expected)


@pytest.mark.parametrize("modes", [("inference", "no_grad"), ("no_grad", "inference")])
def test_self_attention_cache_across_inference_mode_and_no_grad(modes):
    """Three steps in one mode, three in the other: the cache's buffers made under
    `torch.inference_mode` cannot be written outside it, and the steps still give the full
    pass's context."""
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        full = mha(x, causal=True).context
    cache, steps = KVCache(), []
    for t in range(6):
        inference = modes[t // 3] == "inference"
        with torch.inference_mode() if inference else torch.no_grad():
            steps.append(mha(x[:, t : t + 1], causal=True, cache=cache).context.clone())
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_self_attention_cache_reordered_then_extended():
    """Beam search: a reordered copy (rows repeated and dropped) extended by a step equals a
    cache built from the reordered inputs, and the cache it was copied from is unchanged."""
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 6, 8)
    rows = torch.tensor([2, 2, 0])
    with torch.no_grad():
        cache = KVCache()
        for t in range(5):
            mha(x[:, t : t + 1], causal=True, cache=cache)
        saved = cache.key.clone(), cache.value.clone()
        copy = dataclasses.replace(cache)
        copy.reorder(rows)
        got = mha(x[rows, 5:6], causal=True, cache=copy).context
        fresh = KVCache()
        expected = mha(x[rows], causal=True, cache=fresh).context[:, -1:]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(copy.key, fresh.key, rtol=1e-5, atol=1e-6)
    assert torch.equal(cache.key, saved[0]) and torch.equal(cache.value, saved[1])


SCORE_NAMES = list(scores.SCORES)  # the code's registry


def mha_of(name: str, **options) -> MultiHeadAttention:
    """d_model 8, 2 heads, the score `name` built for 4-wide heads and up to 16 keys."""
    return MultiHeadAttention(8, 2, score=scores.make_score(name, 4, 4, max_keys=16), **options)


@pytest.mark.parametrize("name", SCORE_NAMES)
def test_gradcheck_self_cross_and_cached(name):
    """Cross-attention under padding with a row masked in every head, causal
    self-attention, and the same causal self-attention through a cache in two calls."""
    torch.manual_seed(0)
    mha = mha_of(name).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, False, True], [True, False, True, True, True]])
    mask = mask[:, None, None].expand(2, 2, 3, 5).clone()
    mask[1, :, 2] = False  # example 1, query 2: nothing to attend in any head

    def cached(x):
        cache = KVCache()
        first = mha(x[:, :2], causal=True, cache=cache).context
        return torch.cat([first, mha(x[:, 2:], causal=True, cache=cache).context], 1)

    assert torch.autograd.gradcheck(lambda x, m: mha(x, m, mask=mask).context, (x, memory))
    assert torch.autograd.gradcheck(lambda x: mha(x, causal=True).context, (x,))
    assert torch.autograd.gradcheck(cached, (x,))


@pytest.mark.parametrize("name", SCORE_NAMES)
@pytest.mark.parametrize("return_weights", [False, True])
def test_a_row_masked_in_every_head_gives_the_output_bias_and_finite_gradients(
    name, return_weights
):
    mha = mha_of(name)
    x = torch.randn(2, 3, 8, requires_grad=True)
    memory = torch.randn(2, 5, 8, requires_grad=True)
    mask = torch.ones(2, 2, 3, 5, dtype=torch.bool)
    mask[1, :, 2] = False
    out = mha(x, memory, mask=mask, return_weights=return_weights)
    assert torch.equal(out.context[1, 2], mha.out_proj.bias)  # out_proj of a zero context
    if return_weights:
        assert (out.weights[1, :, 2] == 0).all()
        torch.testing.assert_close(out.weights.sum(-1)[0], torch.ones(2, 3))
    (out.context * torch.randn(2, 3, 8)).sum().backward()
    for t in (x, memory, *mha.parameters()):
        assert t.grad is None or torch.isfinite(t.grad).all()


@pytest.mark.parametrize("name", SCORE_NAMES)
@pytest.mark.parametrize("window", [None, 2])
def test_incremental_cache_under_padding_equals_full_for_every_score(name, window):
    """One position at a time through a self-attention cache, under a padding mask (key 0
    of example 1 padded: its query 0 attends to nothing), equals the full causal pass."""
    mha = mha_of(name).eval()
    x = torch.randn(2, 6, 8)
    pad = torch.tensor([[True] * 6, [False, True, True, False, True, True]])[:, None]
    geometry = dict(causal=True, window=window, return_weights=True)
    full = mha(x, mask=pad, **geometry)
    cache = KVCache()
    steps = [
        mha(x[:, t : t + 1], mask=pad[..., : t + 1], cache=cache, **geometry) for t in range(6)
    ]
    context = torch.cat([s.context for s in steps], 1)
    torch.testing.assert_close(context, full.context, rtol=1e-5, atol=1e-5)
    for t, s in enumerate(steps):  # each step's weights: over the t + 1 keys so far
        torch.testing.assert_close(s.weights[..., 0, :], full.weights[..., t, : t + 1])


@pytest.mark.parametrize("name", SCORE_NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True], ids=["padding", "per-head"])
def test_cross_and_causal_attention_equal_float64_reference(name, causal, per_head):
    """Per head: project, score by the papers' formulas (tests/core/reference.py), a loop
    softmax over the allowed keys, concatenate, project out; d_memory != d_model, 7 queries
    over 17 keys, padding and causality (MHA was checked in float64 only for scaled_dot
    self-attention). Per head: a (b, h, i, j) mask that lets memory row 3 be attended by
    head 0 only, and padded row 12 of example 1 by head 0 only: the memory is cleared where
    no head attends (cleared where some head did not, head 0 attended zeros)."""
    torch.manual_seed(1)
    score = scores.make_score(name, 4, 4, max_keys=17)
    mha = MultiHeadAttention(8, 2, score=score, d_memory=5).double()
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    memory = torch.randn(3, 17, 5, dtype=torch.float64)
    pad = (torch.arange(17)[None] < torch.tensor([17, 9, 1])[:, None])[:, None]  # (3, 1, 17)
    mask = pad
    if per_head:
        mask = pad[:, None].expand(3, 2, 7, 17).clone()  # (b, h, i, j)
        mask[:, 1, :, 3] = False
        mask[1, 0, :, 12] = True

    def heads(t, proj):
        return (t @ proj.weight.T + proj.bias).view(3, -1, 2, 4).transpose(1, 2)

    q, k, v = heads(x, mha.q_proj), heads(memory, mha.k_proj), heads(memory, mha.v_proj)
    allowed = (mask if per_head else pad[:, None]) & geometric(7, 17, causal, None)
    ctx, w = ref_attention(ref_logits(name, q, k, params_of(mha.score)), v, allowed)
    expected = ctx.transpose(1, 2).reshape(3, 7, 8) @ mha.out_proj.weight.T + mha.out_proj.bias
    out = mha(x, memory, mask=mask, causal=causal, return_weights=True)
    torch.testing.assert_close(out.context, expected)
    torch.testing.assert_close(out.weights, w)
    out = mha(x, memory, mask=mask, causal=causal)  # the fused kernels, without weights
    torch.testing.assert_close(out.context, expected)


@settings(deadline=None, max_examples=30)
@given(
    name=st.sampled_from(SCORE_NAMES),
    i=st.integers(1, 9),
    j=st.integers(1, 9),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 3)),
    seed=st.integers(0, 2**16),
)
def test_weights_sum_to_one_and_masked_weights_are_zero(name, i, j, causal, window, seed):
    """Per head: each query's weights sum to 1 over what it may attend (0 where nothing),
    masked and out-of-geometry weights exactly 0, with and without weights the same context."""
    torch.manual_seed(seed)
    mha = mha_of(name, d_memory=5).eval()
    g = torch.Generator().manual_seed(seed)
    x, memory = torch.randn(2, i, 8, generator=g), torch.randn(2, j, 5, generator=g)
    mask = torch.rand(2, 2, i, j, generator=g) > 0.3
    out = mha(x, memory, mask=mask, causal=causal, window=window, return_weights=True)
    allowed = mask & geometric(i, j, causal, window)
    assert (out.weights[~allowed] == 0).all()
    torch.testing.assert_close(out.weights.sum(-1), allowed.any(-1).float())
    plain = mha(x, memory, mask=mask, causal=causal, window=window).context
    torch.testing.assert_close(plain, out.context, rtol=1e-4, atol=1e-5)
