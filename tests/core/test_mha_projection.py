"""MultiHeadAttention's in-projection: one fused [W_q; W_k; W_v] parameter when d_memory ==
d_model, its initialisation, and loading state dicts of the earlier layout (separate q_proj,
k_proj, v_proj layers)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo import MultiHeadAttention
from attnzoo.core.mha import StackedLinear


class OldLayoutMHA(nn.Module):
    """The layout before the fusion, written out independently: separate q, k, v and output
    projections and SDPA, in the creation order of the old module."""

    def __init__(self, d_model: int, heads: int, bias: bool = True):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, memory=None, causal=False):
        memory = x if memory is None else memory
        b, i, d = x.shape

        def split(y):
            return y.view(b, y.shape[1], self.heads, d // self.heads).transpose(
                1, 2
            )  # (b, h, t, d_head)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(memory)), split(self.v_proj(memory))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (b, h, i, d_head)
        return self.out_proj(context.transpose(1, 2).reshape(b, i, d))  # (b, i, d_model)


def test_fused_layout_when_memory_has_model_size():
    mha = MultiHeadAttention(8, 2)
    assert isinstance(mha.in_proj, StackedLinear) and mha.in_proj.weight.shape == (24, 8)
    assert set(mha.state_dict()) == {
        "in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias",
    }  # fmt: skip
    assert set(MultiHeadAttention(8, 2, bias=False).state_dict()) == {
        "in_proj.weight", "out_proj.weight",
    }  # fmt: skip
    separate = MultiHeadAttention(8, 2, d_memory=5)
    assert separate.in_proj is None and separate.k_proj.weight.shape == (8, 5)
    assert {k.split(".")[0] for k in separate.state_dict()} == {
        "q_proj", "k_proj", "v_proj", "out_proj",
    }  # fmt: skip


@pytest.mark.parametrize("bias", [True, False])
def test_same_seed_gives_the_old_initial_weights(bias):
    torch.manual_seed(7)
    old = OldLayoutMHA(16, 4, bias=bias)
    torch.manual_seed(7)
    new = MultiHeadAttention(16, 4, bias=bias)
    stacked = torch.cat([old.q_proj.weight, old.k_proj.weight, old.v_proj.weight])
    assert torch.equal(new.in_proj.weight, stacked)
    assert torch.equal(new.out_proj.weight, old.out_proj.weight)
    if bias:
        assert torch.equal(
            new.in_proj.bias, torch.cat([old.q_proj.bias, old.k_proj.bias, old.v_proj.bias])
        )


@pytest.mark.parametrize("bias", [True, False])
def test_old_layout_state_dict_loads_and_gives_the_same_outputs(bias):
    torch.manual_seed(1)
    old = OldLayoutMHA(16, 4, bias=bias).eval()
    torch.manual_seed(2)  # different initial weights: every loaded tensor matters
    new = MultiHeadAttention(16, 4, bias=bias).eval()
    state = old.state_dict()
    result = new.load_state_dict(state)  # strict
    assert not result.missing_keys and not result.unexpected_keys
    assert "q_proj.weight" in state  # the caller's dict is left as it was
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(new(x).context, old(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(new(x, causal=True).context, old(x, causal=True))
        torch.testing.assert_close(new(x, memory).context, old(x, memory), rtol=1e-5, atol=1e-5)


def test_old_layout_loads_inside_a_parent_module():
    """Checkpoints of models hold MHA state dicts under a prefix."""
    torch.manual_seed(1)
    old = nn.ModuleDict({"attention": OldLayoutMHA(8, 2)})
    new = nn.ModuleDict({"attention": MultiHeadAttention(8, 2)})
    new.load_state_dict(old.state_dict())
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        torch.testing.assert_close(new["attention"](x).context, old["attention"](x))


def test_cross_attention_uses_the_query_rows_and_the_key_value_rows():
    mha = MultiHeadAttention(8, 2).double()
    x, memory = torch.randn(2, 3, 8).double(), torch.randn(2, 6, 8).double()
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = mha.in_proj.block_views()
    old = OldLayoutMHA(8, 2).double()
    with torch.no_grad():
        for layer, w, b in ((old.q_proj, w_q, b_q), (old.k_proj, w_k, b_k), (old.v_proj, w_v, b_v)):
            layer.weight.copy_(w)
            layer.bias.copy_(b)
        old.out_proj.load_state_dict(mha.out_proj.state_dict())
    torch.testing.assert_close(mha(x, memory).context, old(x, memory))
    mha(x, memory).context.sum().backward()
    grad = mha.in_proj.weight.grad  # query rows and key/value rows all receive gradients
    assert all(g.abs().sum() > 0 for g in grad.split(8))


def test_in_place_edits_through_data_are_seen():
    """No cached copy of the weights: an edit through `.data` (no version bump) counts."""
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    with torch.no_grad():
        before = mha(x).context
        mha.in_proj.weight.data[:8].add_(1.0)  # W_q only
        after = mha(x).context
    assert not torch.allclose(before, after)
    fresh = MultiHeadAttention(8, 2).eval()
    fresh.load_state_dict(mha.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(after, fresh(x).context)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grad", [True, False])
def test_self_attention_projects_without_concatenating_weights(grad):
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with torch.set_grad_enabled(grad), _CountOps() as counter:
        mha(x)
    assert "cat" not in counter.ops
    assert counter.ops.count("addmm") + counter.ops.count("linear") + counter.ops.count("mm") == 2


def test_self_attention_needs_memory_of_model_size():
    mha = MultiHeadAttention(8, 2, d_memory=5)
    with pytest.raises(ValueError, match="'memory' expected a memory tensor.*d_memory = 5"):
        mha(torch.randn(2, 3, 8))


def test_stacked_linear_initialises_each_block_as_its_own_linear():
    torch.manual_seed(3)
    layers = [nn.Linear(6, 4) for _ in range(2)]
    torch.manual_seed(3)
    stacked = StackedLinear(6, 4, 2)
    assert stacked.weight.shape == (8, 6)
    assert torch.equal(stacked.weight, torch.cat([layer.weight for layer in layers]))
    assert torch.equal(stacked.bias, torch.cat([layer.bias for layer in layers]))
    assert [w.shape for w, _ in stacked.block_views()] == [(4, 6), (4, 6)]
