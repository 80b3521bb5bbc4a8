"""SNAIL: a Simple Neural Attentive meta-Learner (Mishra, Rohaninejad, Chen & Abbeel 2017,
arXiv:1707.03141, sec. 3 and appendix B), for N-way K-shot classification ("fewshot"
interface, `attnzoo.tasks.glyphs`).

An episode is one sequence: the N K support examples, each its embedding beside its label's
one-hot, then the query, its embedding beside zeros (its label is never an input). Temporal
convolution (TC) blocks and causal attention blocks, interleaved, read the sequence; a 1 x 1
convolution at the query's position gives the N class scores.

- Embedding (the few-shot papers' Omniglot network, Vinyals 2016): 4 blocks of 3 x 3
  convolution with 64 filters, batch norm, ReLU, 2 x 2 max pooling: 28 x 28 -> 64 numbers.
- `DenseBlock(R, D)`: `x -> concat(x, tanh(conv_f(x)) * sigmoid(conv_g(x)))`, the convolutions
  causal, kernel 2, dilation R, D filters (appendix B).
- `TCBlock(T, D)`: DenseBlocks of dilation 2^i for i = 1 .. ceil(log2 T).
- `AttentionBlock(K, V)`: `x -> concat(x, softmax(Q K^T / sqrt(K)) V)`, causal, queries and
  keys of size K and values of size V by linear maps of x, through core `attention()`.
- Omniglot (appendix B): AttentionBlock(64, 32), TCBlock(T, 128), AttentionBlock(256, 128),
  TCBlock(T, 128), AttentionBlock(512, 256), then the 1 x 1 convolution to N.

Note:
    The appendix's dilations start at 2 (i = 1), so the convolutions never see an odd offset;
    kept as written (the attention blocks reach every earlier position). Several queries of an
    episode (`queries > 1`) are scored as if each were its own episode with the same support;
    they share one pass over the support (`SNAIL.sequence`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.attention import attention
from attnzoo.core.checks import (
    check_fields,
    check_floating,
    check_image_size,
    check_labels,
    check_like_module,
    check_size,
    fail,
)
from attnzoo.core.normalisers import at_least_float32
from attnzoo.models.image_baselines import pool_then_relu


class FewShotOutput(NamedTuple):
    log_probs: torch.Tensor  # (batch, queries, ways)
    # (name, weights (batch, queries, heads, rows, columns)) per attention kind; [] without
    attention: list


def check_episode(
    owner: str, support, support_labels, query, channels, image_size, n_support, ways, model=None
):
    """Fail naming the first argument whose dtype, shape or labels do not fit the model."""
    side = (channels, *image_size)
    check_floating(owner, "support", support)
    check_floating(owner, "query", query)
    check_like_module(owner, "support", support, model)
    check_like_module(owner, "query", query, model)
    if support.dim() != 5 or tuple(support.shape[1:]) != (n_support, *side):
        wanted = f"(batch, {n_support}, {', '.join(map(str, side))})"
        fail(owner, "support", wanted, tuple(support.shape))
    check_labels(owner, "support_labels", support_labels, ways, support.shape[:2])
    if query.dim() != 5 or query.shape[0] != support.shape[0] or tuple(query.shape[2:]) != side:
        wanted = f"({support.shape[0]}, queries, {', '.join(map(str, side))})"
        fail(owner, "query", wanted, tuple(query.shape))


QK_INITS = ("independent", "similarity")  # AttentionBlock's starts of its query and key maps
HEAD_INITS = ("pytorch", "matching")  # SNAIL's starts of its class scores (SnailConfig)
MATCHING_SCALE = 10.0  # "matching": class scores = this x the first block's mass per label


@dataclass(frozen=True)
class SnailConfig:
    """Attributes:
    embed_dim: filters of each embedding block (its output size: 28 x 28 pools to 1 x 1).
    embed_blocks: embedding blocks (conv, batch norm, ReLU, 2 x 2 max pool).
    filters: D of every TC block.
    keys: K of each attention block; a TC block sits between consecutive attention blocks.
    values: V of each attention block.
    qk_init: how each attention block's query and key maps start (`AttentionBlock`); the
        paper does not say, "similarity" is this library's choice (docs/snail.md measures it
        against "independent").
    head_init: how the class scores start. "matching": the first attention block's first N
        value channels start as copies of the label one-hot (`v_c = onehot_c`, nothing else
        read) and the output layer starts reading those N channels alone, as
        `MATCHING_SCALE` x the identity, every other weight and bias zero: at the start the
        query's score for label c is `MATCHING_SCALE` x the first block's attention mass on
        the support instances labelled c, a matching network (Vinyals 2016) on the first
        block's query and key maps, from which everything trains as usual. "pytorch" keeps
        PyTorch's initialisation of both maps, under which the class scores start unrelated
        to the support labels and the loss sits at log N until the network finds them (at
        20 ways, through a whole matched run; docs/snail.md measures the two).
        The first block's value size must be at least N for "matching".
    """

    embed_dim: int = 64
    embed_blocks: int = 4
    filters: int = 128
    keys: tuple[int, ...] = (64, 256, 512)
    values: tuple[int, ...] = (32, 128, 256)
    qk_init: str = "similarity"
    head_init: str = "matching"

    def __post_init__(self):
        check_fields(self)
        for name in ("embed_dim", "embed_blocks", "filters"):
            check_size("SnailConfig", name, getattr(self, name))
        if self.qk_init not in QK_INITS:
            fail("SnailConfig", "qk_init", f"one of {QK_INITS}", repr(self.qk_init))
        if self.head_init not in HEAD_INITS:
            fail("SnailConfig", "head_init", f"one of {HEAD_INITS}", repr(self.head_init))
        for name in ("keys", "values"):
            value = getattr(self, name)
            if (
                not isinstance(value, tuple | list)
                or not value
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
            ):
                fail("SnailConfig", name, "a non-empty tuple of positive ints", repr(value))
        if len(self.keys) != len(self.values):
            fail("SnailConfig", "values", f"{len(self.keys)} sizes, one per key size", self.values)


def snail(**overrides) -> SnailConfig:
    """Mishra 2017, appendix B, Omniglot."""
    return replace(SnailConfig(), **overrides)


class ConvEmbedding(nn.Module):
    """`blocks` x (3 x 3 conv of `dim` filters, batch norm, ReLU, 2 x 2 max pool), flattened:
    the embedding of SNAIL, prototypical and matching networks on Omniglot. The ReLU runs
    after the pool (`image_baselines.pool_then_relu`): the same function, on a quarter of
    the values."""

    def __init__(self, channels: int, dim: int, blocks: int, image_size: tuple[int, int]):
        super().__init__()
        layers: list[nn.Module] = []
        for k in range(blocks):
            layers += [
                nn.Conv2d(channels if k == 0 else dim, dim, 3, padding=1),
                nn.BatchNorm2d(dim),
                *pool_then_relu(),
            ]
        # channels-last weights put the convolutions and pools on oneDNN's NHWC kernels: the
        # embedding's forward + backward of 672 glyphs (one thread) 3965 -> 2657 ms here
        self.net = nn.Sequential(*layers).to(memory_format=torch.channels_last)
        height, width = image_size
        for _ in range(blocks):
            height, width = height // 2, width // 2
        if height < 1 or width < 1:
            fail("ConvEmbedding", "image_size", f"at least {2**blocks} a side", image_size)
        self.size = dim * height * width

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (..., channels, H, W) -> (..., size)."""
        lead = images.shape[:-3]
        out = self.net(images.flatten(0, -4))  # (n, dim, h, w)
        return out.flatten(1).view(*lead, self.size)  # (..., size)


class DenseBlock(nn.Module):
    """x (b, T, C) -> concat(x, tanh(conv_f x) * sigmoid(conv_g x)) (b, T, C + D): causal
    convolutions of kernel 2 and dilation R (each position read beside the one R before it,
    zeros before the start).

    With `support` = n, positions n.. are queries that each follow the first n positions
    alone (`SNAIL.sequence`): every query reads itself and position n - R, as it would at
    position n of its own sequence."""

    def __init__(self, channels: int, dilation: int, filters: int):
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(channels, 2 * filters, kernel_size=2, dilation=dilation)

    def forward(self, x: torch.Tensor, support: int | None = None) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        if support is not None:
            positions = positions.clamp(max=support)
        earlier = F.pad(x, (0, 0, self.dilation, 0))[:, positions]  # (b, T, C): x[t - R]
        w = self.conv.weight  # (2 D, C, 2): tap 0 reads t - R, tap 1 reads t
        f, g = (F.linear(earlier, w[..., 0], self.conv.bias) + F.linear(x, w[..., 1])).chunk(2, -1)
        return torch.cat([x, torch.tanh(f) * torch.sigmoid(g)], -1)


class TCBlock(nn.Module):
    """DenseBlocks of dilation 2^i, i = 1 .. ceil(log2 T): (b, T, C) -> (b, T, C + n D)."""

    def __init__(self, channels: int, length: int, filters: int):
        super().__init__()
        count = max(1, math.ceil(math.log2(length)))
        self.blocks = nn.ModuleList(
            DenseBlock(channels + i * filters, 2 ** (i + 1), filters) for i in range(count)
        )
        self.out_channels = channels + count * filters

    def forward(self, x: torch.Tensor, support: int | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, support)
        return x


class AttentionBlock(nn.Module):
    """x (b, T, C) -> concat(x, causal softmax(q k^T / sqrt(K)) v) (b, T, C + V), with q, k of
    size K and v of size V linear maps of x; also the weights (b, T, T).

    `qk_init`: "independent" keeps PyTorch's initialisation of the two maps; "similarity"
    starts the key map as a copy of the query map, its weights drawn from N(0, 1 / C) and its
    bias zero, so that at the start `q_i . k_j = (W x_i) . (W x_j)` scores similar positions
    highest (the weights then train apart as usual). In the spirit of Trockman & Kolter 2023's
    mimetic initialisation (`W_q W_k^T` near a multiple of the identity); it shortens the
    plateau a sequence meta-learner sits on at `log N` before its attention learns to match
    the query with the support (docs/snail.md)."""

    def __init__(self, channels: int, key_size: int, value_size: int, qk_init: str = "independent"):
        super().__init__()
        if qk_init not in QK_INITS:
            fail("AttentionBlock", "qk_init", f"one of {QK_INITS}", repr(qk_init))
        self.query = nn.Linear(channels, key_size)
        self.key = nn.Linear(channels, key_size)
        self.value = nn.Linear(channels, value_size)
        self.out_channels = channels + value_size
        if qk_init == "similarity":
            with torch.no_grad():
                nn.init.normal_(self.query.weight, std=channels**-0.5)
                self.key.weight.copy_(self.query.weight)
                self.query.bias.zero_()
                self.key.bias.zero_()

    def forward(self, x: torch.Tensor, return_weights: bool = False, support: int | None = None):
        """With `support` = n, positions n.. are queries that each attend to the first n
        positions and itself alone (`SNAIL.sequence`): their own attention over their own keys,
        not a mask over the others', so that nothing a sibling query holds, not even a NaN
        (0 * NaN in a masked weighted sum), reaches a query."""
        q, k, v = self.query(x), self.key(x), self.value(x)  # (b, T, K), (b, T, K), (b, T, V)
        b, t = x.shape[:2]
        if support is None or t <= support + 1:
            out = attention(q, k, v, score="scaled_dot", causal=True, return_weights=return_weights)
            return torch.cat([x, out.context], -1), out.weights  # (b, T, C + V), (b, T, T)
        n, m = support, t - support  # m queries
        kw = dict(score="scaled_dot", return_weights=return_weights)
        head = attention(q[:, :n], k[:, :n], v[:, :n], causal=True, **kw)  # the support
        # each query's own keys and values (b, m, n + 1, .): the support's, then its own
        own = [torch.cat([z[:, None, :n].expand(-1, m, -1, -1), z[:, n:, None]], 2) for z in (k, v)]
        tail = attention(q[:, n:, None], *own, **kw)  # (b, m, 1, V)
        context = torch.cat([head.context, tail.context[:, :, 0]], 1)  # (b, T, V)
        weights = None
        if return_weights:  # (b, T, T): the support's causal rows, then each query's row
            w = tail.weights[:, :, 0]  # (b, m, n + 1): the support, then the query itself
            upper = torch.cat([head.weights, head.weights.new_zeros(b, n, m)], -1)
            weights = torch.cat(
                [upper, torch.cat([w[..., :n], torch.diag_embed(w[..., n])], -1)], 1
            )
        return torch.cat([x, context], -1), weights


class SNAIL(nn.Module):
    """The SNAIL classifier of the module docstring."""

    def __init__(
        self,
        config: SnailConfig,
        image_size: tuple[int, int],
        channels: int,
        ways: int,
        shots: int,
    ):
        super().__init__()
        for name, value in (("channels", channels), ("ways", ways), ("shots", shots)):
            check_size("SNAIL", name, value)
        if config.head_init == "matching" and config.values[0] < ways:
            wanted = f"a first value size of at least ways = {ways} for head_init 'matching'"
            fail("SNAIL", "config.values", wanted, config.values)
        self.config, self.ways, self.shots = config, ways, shots
        self.image_size, self.channels = check_image_size("SNAIL", image_size), channels
        self.embed = ConvEmbedding(channels, config.embed_dim, config.embed_blocks, image_size)
        self.length = ways * shots + 1  # T
        width = self.embed.size + ways
        self.label_channels = (self.embed.size, width)  # where the one-hot sits in every input
        self.attend = nn.ModuleList()
        self.tc = nn.ModuleList()
        for k, (key, value) in enumerate(zip(config.keys, config.values, strict=True)):
            if k > 0:
                self.tc.append(TCBlock(width, self.length, config.filters))
                width = self.tc[-1].out_channels
            self.attend.append(AttentionBlock(width, key, value, config.qk_init))
            width = self.attend[-1].out_channels
        self.out = nn.Linear(width, ways)  # the 1 x 1 convolution
        if config.head_init == "matching":
            self._start_matching()

    @torch.no_grad()
    def _start_matching(self):
        """`SnailConfig.head_init` "matching": value channel c of the first attention block
        reads label c alone, and the class scores read those channels alone."""
        ways, (lo, hi) = self.ways, self.label_channels
        value = self.attend[0].value
        value.weight[:ways] = 0
        value.bias[:ways] = 0
        eye = torch.eye(ways, dtype=value.weight.dtype, device=value.weight.device)
        value.weight[:ways, lo:hi] = eye
        self.out.weight.zero_()
        self.out.bias.zero_()
        self.out.weight[:, hi : hi + ways] = MATCHING_SCALE * eye  # block 1's first N outputs

    def sequence(self, x: torch.Tensor, return_weights: bool = False, support: int | None = None):
        """x (b, T, embed + ways) -> class logits at every position (b, T, ways) and each
        attention block's weights (b, T, T) (None unless asked).

        With `support` = n, positions n.. are queries that each see the first n positions and
        themselves only, as if each were the last position of its own sequence: what a causal
        model computes for the support does not depend on what follows it, so the queries of
        an episode share one pass over its support instead of one pass each."""
        weights = []
        for k, block in enumerate(self.attend):
            if k > 0:
                x = self.tc[k - 1](x, support)
            x, w = block(x, return_weights, support)
            weights.append(w)
        return self.out(x), weights

    def forward(
        self,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        query: torch.Tensor,
        return_weights: bool = False,
    ) -> FewShotOutput:
        """support (b, N K, c, H, W), support_labels (b, N K), query (b, q, c, H, W) ->
        log_probs (b, q, N); each query is scored as the last position of its own sequence
        after the support (`sequence`'s `support`)."""
        n = self.ways * self.shots
        check_episode(
            *("SNAIL", support, support_labels, query, self.channels, self.image_size),
            *(n, self.ways, self),
        )
        b, q = query.shape[:2]
        embedded = self.embed(torch.cat([support, query], 1))  # (b, n + q, E)
        labels = F.one_hot(support_labels, self.ways).to(embedded.dtype)  # (b, n, N)
        labels = torch.cat([labels, labels.new_zeros(b, q, self.ways)], 1)  # no query label
        logits, weights = self.sequence(torch.cat([embedded, labels], -1), return_weights, n)
        log_probs = torch.log_softmax(at_least_float32(logits[:, n:]), -1)  # (b, q, N)
        named = []
        if return_weights:
            for k, w in enumerate(weights):  # (b, n + q, n + q) -> each query's (n + 1, n + 1)
                own = w.new_zeros(b, q, n + 1, n + 1)
                own[:, :, :n, :n] = w[:, None, :n, :n]
                own[:, :, n, :n] = w[:, n:, :n]
                own[:, :, n, n] = w[:, n:, n:].diagonal(dim1=-2, dim2=-1)
                named.append((f"attention block {k + 1} (causal)", own.unsqueeze(2)))
        return FewShotOutput(log_probs, named)


# Bandits (sec. 5.3) -----------------------------------------------------------------------------


class PolicyOutput(NamedTuple):
    logits: torch.Tensor  # (batch, steps, arms): the arm to pull at each step
    value: torch.Tensor  # (batch, steps): the expected rewards to go (the baseline)
    attention: list  # (name, weights (batch, heads, steps, steps)) per attention block, or []


@dataclass(frozen=True)
class SnailPolicyConfig:
    """The bandit agent (Mishra 2017, appendix C, as read here: TCBlock(T, 32), TCBlock(T, 32),
    AttentionBlock(32, 32), then a policy and a value head; not confirmed from a copy here).

    Attributes:
    filters: D of each TC block.
    layers: TC blocks before the attention block.
    key_size: K of the attention block.
    value_size: V of the attention block.
    detach_value: the value head reads the blocks' features detached, so its squared error
        trains the head alone and the blocks learn from the policy's terms only (as RAM's
        baseline, `attnzoo.models.ram`); False shares them between the two heads.
    """

    filters: int = 32
    layers: int = 2
    key_size: int = 32
    value_size: int = 32
    detach_value: bool = False

    def __post_init__(self):
        check_fields(self)
        for name in ("filters", "layers", "key_size", "value_size"):
            check_size("SnailPolicyConfig", name, getattr(self, name))
        if not isinstance(self.detach_value, bool):
            fail("SnailPolicyConfig", "detach_value", "a bool", repr(self.detach_value))


def snail_bandit(**overrides) -> SnailPolicyConfig:
    """Mishra 2017, appendix C (see the class docstring)."""
    return replace(SnailPolicyConfig(), **overrides)


@dataclass
class PolicyTape:
    """What `SnailPolicy.step` keeps of an episode: every block's outputs at the steps so far
    (x (b, K, width), the inputs first, each block's channels after its inputs') and the
    attention block's keys and values (kv (b, K, key + value))."""

    x: torch.Tensor
    kv: torch.Tensor
    t: int = 0


class SnailPolicy(nn.Module):
    """SNAIL as a recurrent policy over a bandit episode ("bandit" interface,
    `attnzoo.tasks.bandits`): inputs (b, t, inputs) -> logits (b, t, arms), value (b, t);
    `inputs` channels a step (default arms + 2, the paper's arm and reward and a start flag)."""

    def __init__(self, config: SnailPolicyConfig, arms: int, pulls: int, inputs: int | None = None):
        super().__init__()
        check_size("SnailPolicy", "arms", arms)
        check_size("SnailPolicy", "pulls", pulls)
        self.width = arms + 2 if inputs is None else inputs
        check_size("SnailPolicy", "inputs", self.width)
        self.arms, self.pulls = arms, pulls
        self.detach_value = config.detach_value
        width = self.width
        self.tc = nn.ModuleList()
        for _ in range(config.layers):
            self.tc.append(TCBlock(width, pulls, config.filters))
            width = self.tc[-1].out_channels
        self.attend = AttentionBlock(width, config.key_size, config.value_size)
        width = self.attend.out_channels
        self.policy = nn.Linear(width, arms)
        self.value = nn.Linear(width, 1)

    def forward(self, inputs: torch.Tensor, return_weights: bool = False) -> PolicyOutput:
        self._check_inputs(inputs, "(batch, steps, {})")
        if inputs.shape[1] > self.pulls:  # its TC blocks are sized for `pulls` (step refuses)
            wanted = f"at most pulls = {self.pulls} steps (the episode it was built for)"
            fail("SnailPolicy", "inputs", wanted, inputs.shape[1])
        x = inputs
        for block in self.tc:
            x = block(x)  # (b, t, C)
        x, w = self.attend(x, return_weights)  # (b, t, C + V)
        named = [("attention block (causal)", w.unsqueeze(1))] if return_weights else []
        value = self.value(x.detach() if self.detach_value else x).squeeze(-1)
        return PolicyOutput(self.policy(x), value, named)

    def _check_inputs(self, inputs: torch.Tensor, shape: str):
        check_floating("SnailPolicy", "inputs", inputs)
        check_like_module("SnailPolicy", "inputs", inputs, self)
        if inputs.dim() != shape.count(",") + 1 or inputs.shape[-1] != self.width:
            fail("SnailPolicy", "inputs", shape.format(self.width), tuple(inputs.shape))

    def start(self, inputs: torch.Tensor) -> PolicyTape:
        """An empty tape for `step` over a batch like `inputs` (b, width): its device, dtype
        and batch size."""
        self._check_inputs(inputs, "(batch, {})")
        b, width = inputs.shape[0], self.attend.out_channels
        kv = self.attend.key.out_features + self.attend.value.out_features
        return PolicyTape(
            inputs.new_zeros(b, self.pulls, width), inputs.new_zeros(b, self.pulls, kv)
        )

    @torch.no_grad()
    def step(self, tape: PolicyTape, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One more position of an episode, without gradient: `inputs` (b, width) at step
        `tape.t` -> (logits (b, arms), value (b,)), equal to `forward`'s outputs at that step
        on all the inputs so far (tested). Each block computes only the new position: a dense
        block reads its inputs at t and t - R from the tape, the attention block's key and
        value of t are stored once and its query at t attends to the stored 0 .. t. A rollout
        of K pulls costs K positions, not the K (K + 1) / 2 of calling `forward` on every
        prefix."""
        self._check_inputs(inputs, "(batch, {})")
        t, x = tape.t, tape.x
        if inputs.shape[0] != x.shape[0]:  # (one row would broadcast over the tape's batch)
            fail(
                "SnailPolicy.step",
                "inputs",
                f"batch size {x.shape[0]} (the tape's)",
                inputs.shape[0],
            )
        if t >= self.pulls:
            fail("SnailPolicy.step", "tape", f"fewer than {self.pulls} steps taken", t)
        x[:, t, : inputs.shape[1]] = inputs
        width = inputs.shape[1]
        for block in (b for tc in self.tc for b in tc.blocks):
            w, bias = block.conv.weight, block.conv.bias  # (2 D, C, 2), (2 D,)
            h = F.linear(x[:, t, :width], w[..., 1], bias)  # (b, 2 D)
            if t >= block.dilation:
                h = h + F.linear(x[:, t - block.dilation, :width], w[..., 0])
            f, g = h.chunk(2, -1)
            x[:, t, width : width + f.shape[1]] = torch.tanh(f) * torch.sigmoid(g)
            width += f.shape[1]
        att, keys = self.attend, self.attend.key.out_features
        tape.kv[:, t, :keys] = att.key(x[:, t, :width])
        tape.kv[:, t, keys:] = att.value(x[:, t, :width])
        out = attention(
            att.query(x[:, t : t + 1, :width]),  # (b, 1, K)
            tape.kv[:, : t + 1, :keys],  # (b, t + 1, K)
            tape.kv[:, : t + 1, keys:],  # (b, t + 1, V)
            score="scaled_dot",
        )
        x[:, t, width:] = out.context[:, 0]
        tape.t = t + 1
        return self.policy(x[:, t]), self.value(x[:, t]).squeeze(-1)
