"""SNAIL and prototypical networks (`attnzoo.models.snail`, `attnzoo.models.protonet`): each
block against a float64 loop written here, causality, and what few-shot code gets wrong: the
query's label never enters its input, no episode changes another's prediction in eval mode,
relabelling the support relabels the prediction; shapes, bad input named, any device, and
overfitting a tiny batch."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnzoo.models.protonet import ProtoNet, protonet
from attnzoo.models.snail import (
    HEAD_INITS,
    MATCHING_SCALE,
    QK_INITS,
    SNAIL,
    AttentionBlock,
    DenseBlock,
    SnailConfig,
    TCBlock,
    snail,
)

SIZE = (28, 28)


def tiny_snail(ways=3, shots=2, head_init="pytorch", **changes) -> SNAIL:
    """PyTorch's start of the class scores by default: every block then reaches them (under
    "matching" only the first attention block does until training moves them)."""
    config = snail(
        embed_dim=8, filters=6, keys=(5, 7, 9), values=(4, 3, 5), head_init=head_init, **changes
    )
    return SNAIL(config, SIZE, 1, ways, shots)


def tiny_protonet(ways=3, shots=2) -> ProtoNet:
    return ProtoNet(protonet(embed_dim=8), SIZE, 1, ways, shots)


def episode(batch=2, ways=3, shots=2, queries=2, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    support = torch.rand(batch, ways * shots, 1, *SIZE, generator=g, dtype=dtype)
    labels = torch.stack(
        [torch.arange(ways).repeat_interleave(shots)[torch.randperm(ways * shots, generator=g)]
         for _ in range(batch)]
    )  # fmt: skip
    query = torch.rand(batch, queries, 1, *SIZE, generator=g, dtype=dtype)
    return support, labels, query


# 1. Blocks against float64 loops ---------------------------------------------------------------


def test_attention_block_is_causal_scaled_dot_attention():
    torch.manual_seed(0)
    block = AttentionBlock(7, 5, 3).double()
    x = torch.randn(2, 9, 7, dtype=torch.float64)
    with torch.no_grad():
        out, weights = block(x, return_weights=True)
    q, k, v = (t.detach() for t in (block.query(x), block.key(x), block.value(x)))
    expected = torch.zeros(2, 9, 3, dtype=torch.float64)
    loop_weights = torch.zeros(2, 9, 9, dtype=torch.float64)
    for b in range(2):
        for i in range(9):
            logits = torch.tensor([float(q[b, i] @ k[b, j]) / math.sqrt(5) for j in range(i + 1)])
            w = torch.softmax(logits.double(), 0)
            loop_weights[b, i, : i + 1] = w
            expected[b, i] = sum(w[j] * v[b, j] for j in range(i + 1))
    torch.testing.assert_close(out, torch.cat([x, expected], -1))
    torch.testing.assert_close(weights, loop_weights)


@pytest.mark.parametrize(("dilation", "support"), [(2, None), (4, None), (2, 3), (4, 3), (2, 1)])
def test_dense_block_is_a_gated_causal_dilated_convolution(dilation, support):
    # with `support` n, positions n.. are queries: each reads position n - R, as at position n
    torch.manual_seed(0)
    block = DenseBlock(4, dilation, 3).double()
    x = torch.randn(2, 7, 4, dtype=torch.float64)
    w, bias = block.conv.weight, block.conv.bias  # (2 D, C, 2), (2 D,)
    expected = torch.zeros(2, 7, 3, dtype=torch.float64)
    for t in range(7):
        at = t if support is None else min(t, support)
        past = x[:, at - dilation] if at >= dilation else torch.zeros(2, 4, dtype=torch.float64)
        pre = past @ w[:, :, 0].T + x[:, t] @ w[:, :, 1].T + bias  # (b, 2 D)
        expected[:, t] = torch.tanh(pre[:, :3]) * torch.sigmoid(pre[:, 3:])
    torch.testing.assert_close(block(x, support), torch.cat([x, expected], -1))
    conv = torch.nn.functional.conv1d(
        torch.nn.functional.pad(x.transpose(1, 2), (dilation, 0)), w, bias, dilation=dilation
    )  # PyTorch's causal convolution agrees where no query is involved
    f, g = conv.transpose(1, 2).chunk(2, -1)
    end = 7 if support is None else support + 1
    torch.testing.assert_close(expected[:, :end], (torch.tanh(f) * torch.sigmoid(g))[:, :end])


@pytest.mark.parametrize(
    ("length", "dilations"), [(6, [2, 4, 8]), (21, [2, 4, 8, 16, 32]), (2, [2])]
)
def test_tc_block_dilations_follow_the_appendix(length, dilations):
    block = TCBlock(4, length, 3)
    assert [b.dilation for b in block.blocks] == dilations
    assert block.out_channels == 4 + 3 * len(dilations)


def test_blocks_gradcheck():
    torch.manual_seed(0)
    attn, dense = AttentionBlock(3, 2, 2).double(), DenseBlock(3, 2, 2).double()
    x = torch.randn(1, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attn(t)[0], (x,))
    assert torch.autograd.gradcheck(dense, (x,))
    assert torch.autograd.gradcheck(lambda t: dense(t, 2), (x,))


@pytest.mark.parametrize("qk_init", QK_INITS)
def test_similarity_init_makes_an_identical_earlier_position_the_most_attended(qk_init):
    # an earlier position equal to the last one gets the last row's largest weight at the
    # start: always with "similarity", by chance (one in five) with "independent"
    hits = 0
    for seed in range(20):
        torch.manual_seed(seed)
        block = AttentionBlock(64, 64, 8, qk_init).double()
        x = torch.randn(1, 6, 64, dtype=torch.float64)
        x[0, -1] = x[0, 2]
        with torch.no_grad():
            weights = block(x, return_weights=True)[1][0, -1, :-1]  # the earlier positions
        hits += int(weights.argmax()) == 2
    assert hits == 20 if qk_init == "similarity" else hits < 15


@pytest.mark.parametrize("head_init", HEAD_INITS)
def test_the_matching_head_starts_as_a_matching_network_on_the_first_block(head_init):
    """Under "matching" the initial log-probabilities are log_softmax(10 x the first block's
    attention mass on each label), the mass recomputed here in float64 from the block's query
    and key maps (the query attends to the support and itself); under "pytorch" they are not."""
    torch.manual_seed(0)
    ways, shots, queries = 3, 2, 4
    model = tiny_snail(ways, shots, head_init).double().eval()
    support, labels, query = episode(2, ways, shots, queries, dtype=torch.float64)
    with torch.no_grad():
        got = model(support, labels, query).log_probs  # (b, q, N)
        n = ways * shots
        one_hot = torch.nn.functional.one_hot(labels, ways).double()  # (b, n, N)
        xs = torch.cat([model.embed(support), one_hot], -1)  # (b, n, E + N)
        xq = torch.cat([model.embed(query), torch.zeros(2, queries, ways).double()], -1)
        block = model.attend[0]
        wq, bq, wk, bk = block.query.weight, block.query.bias, block.key.weight, block.key.bias
        expected = torch.empty_like(got)
        for b in range(2):
            for j in range(queries):
                q = wq @ xq[b, j] + bq
                keys = torch.cat([xs[b], xq[b, j : j + 1]]) @ wk.T + bk  # (n + 1, K)
                w = torch.softmax(keys @ q / math.sqrt(q.numel()), 0)
                mass = w[:n] @ one_hot[b]  # (N,): the weight on each label's instances
                expected[b, j] = torch.log_softmax(MATCHING_SCALE * mass, 0)
    if head_init == "matching":
        torch.testing.assert_close(got, expected)
    else:
        assert not torch.allclose(got, expected)


def test_the_preset_is_the_papers_omniglot_configuration():
    config = snail()
    assert (config.keys, config.values, config.filters) == ((64, 256, 512), (32, 128, 256), 128)
    model = SNAIL(config, SIZE, 1, 5, 1)
    assert model.embed.size == 64 and model.length == 6
    assert len(model.attend) == 3 and len(model.tc) == 2


# 2. The sequence -----------------------------------------------------------------------------


def test_causal_no_position_sees_a_later_one():
    torch.manual_seed(0)
    model = tiny_snail().double().eval()
    x = torch.randn(2, model.length, model.embed.size + model.ways, dtype=torch.float64)
    base, _ = model.sequence(x)
    for t in range(model.length):
        changed = x.clone()
        changed[:, t] += torch.randn_like(changed[:, t])
        out, _ = model.sequence(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=0)
        assert not torch.allclose(out[:, t], base[:, t])


@settings(max_examples=12, deadline=None)
@given(
    ways=st.integers(2, 4),
    shots=st.integers(1, 3),
    queries=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_queries_share_one_support_pass_as_if_each_had_its_own_sequence(ways, shots, queries, seed):
    """An episode's queries, scored in one pass over the support, get the log-probabilities,
    attention weights and parameter gradients of one sequence per query (float64, eval mode:
    batch norm from its running statistics)."""
    torch.manual_seed(seed)
    model = tiny_snail(ways, shots).double().eval()
    support, labels, query = episode(2, ways, shots, queries, dtype=torch.float64)
    cotangent = torch.randn(2, queries, ways, dtype=torch.float64)

    def run(q: torch.Tensor, c: torch.Tensor):
        model.zero_grad()
        out = model(support, labels, q, return_weights=True)
        (out.log_probs * c).sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    packed, packed_grads = run(query, cotangent)
    alone = [run(query[:, j : j + 1], cotangent[:, j : j + 1]) for j in range(queries)]
    torch.testing.assert_close(packed.log_probs, torch.cat([o.log_probs for o, _ in alone], 1))
    for k, (name, w) in enumerate(packed.attention):
        assert name == alone[0][0].attention[k][0]
        torch.testing.assert_close(w, torch.cat([o.attention[k][1] for o, _ in alone], 1))
    for p, *gs in zip(packed_grads, *(g for _, g in alone), strict=True):
        torch.testing.assert_close(p, sum(gs))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("make", [tiny_snail, tiny_protonet])
def test_a_broken_query_image_breaks_its_own_prediction_and_no_other(make, bad):
    """A NaN or Inf pixel in one query makes that query's log-probabilities non-finite, not a
    plausible number, and leaves every other query unchanged, its episode's siblings (which
    share the support pass) included; one in the support breaks its whole episode alone."""
    model = make().eval()
    support, labels, query = episode(batch=3, queries=3)
    with torch.no_grad():
        clean = model(support, labels, query).log_probs  # (b, q, N)
        broken_query, broken_support = query.clone(), support.clone()
        broken_query[1, 0, 0, 5, 5] = bad
        broken_support[1, 2, 0, 5, 5] = bad
        out = model(support, labels, broken_query).log_probs
        whole = model(broken_support, labels, query).log_probs
    assert not out[1, 0].isfinite().any()
    others = torch.ones(3, 3, dtype=torch.bool)
    others[1, 0] = False
    assert torch.equal(out[others], clean[others])
    assert not whole[1].isfinite().any()
    assert torch.equal(whole[[0, 2]], clean[[0, 2]])


def test_the_query_label_never_enters_its_input(monkeypatch):
    """The sequence holds each support example's one-hot label and zeros at the query."""
    model = tiny_snail().eval()
    seen = []
    original = model.sequence
    monkeypatch.setattr(model, "sequence", lambda *a: seen.append(a) or original(*a))
    support, labels, query = episode()
    with torch.no_grad():
        model(support, labels, query)
    ((x, _, n),) = seen  # x (b, n + q, E + N): the support, then the queries
    assert n == labels.shape[1] and x.shape[1] == n + query.shape[1]
    start, end = model.label_channels
    one_hot = torch.nn.functional.one_hot(labels, model.ways).float()  # (b, n, N)
    torch.testing.assert_close(x[:, :n, start:end], one_hot)
    assert x[:, n:, start:end].abs().sum() == 0


@pytest.mark.parametrize("make", [tiny_snail, tiny_protonet])
def test_other_episodes_do_not_change_a_prediction_in_eval_mode(make):
    torch.manual_seed(0)
    model = make()
    support, labels, query = episode(batch=3)
    other_support, _, other_query = episode(batch=3)
    mixed_support = torch.cat([support[:1], other_support[1:] * 3 + 1])
    mixed_query = torch.cat([query[:1], other_query[1:] * 3 + 1])
    model.train()  # a few steps so the batch-norm statistics are not the initial ones
    for _ in range(2):
        model(support, labels, query)
    with torch.no_grad():
        train_a = model(support, labels, query).log_probs
        train_b = model(mixed_support, labels, mixed_query).log_probs
        model.eval()
        eval_a = model(support, labels, query).log_probs
        eval_b = model(mixed_support, labels, mixed_query).log_probs
    torch.testing.assert_close(eval_a[0], eval_b[0], rtol=0, atol=1e-6)
    # the test can fail: in training mode batch norm shares the batch's statistics
    assert not torch.allclose(train_a[0], train_b[0], atol=1e-4)


def _relabelled_snail(model: SNAIL, perm: torch.Tensor) -> SNAIL:
    """A copy whose weights read label perm[k] where the model reads label k and write class
    perm[k] where it writes class k: the label's one-hot columns of every layer of the
    sequence (the one-hot stays at the same channels of every dense input) and the output's
    rows, permuted."""
    twin = copy.deepcopy(model)
    start, end = model.label_channels
    with torch.no_grad():
        for module in [*twin.attend.modules(), *twin.tc.modules(), twin.out]:
            if isinstance(module, nn.Linear | nn.Conv1d) and module.weight.shape[1] >= end:
                w = module.weight
                w[:, start:end] = w[:, start:end][:, torch.argsort(perm)].clone()
        twin.out.weight[perm] = model.out.weight.clone()
        twin.out.bias[perm] = model.out.bias.clone()
    return twin


@pytest.mark.parametrize("make", [tiny_snail, tiny_protonet])
def test_permuting_the_support_labels_permutes_the_prediction(make):
    torch.manual_seed(0)
    model = make().double().eval()
    support, labels, query = episode(dtype=torch.float64)
    perm = torch.tensor([2, 0, 1])  # label k becomes perm[k]
    with torch.no_grad():
        base = model(support, labels, query).log_probs  # (b, q, N)
        other = model if isinstance(model, ProtoNet) else _relabelled_snail(model, perm)
        moved = other(support, perm[labels], query).log_probs
        assert not torch.allclose(moved, base)  # the prediction follows the labels...
        torch.testing.assert_close(moved[..., perm], base)  # ...exactly


def test_protonet_is_a_softmax_over_negative_squared_distances_to_class_means():
    """Snell 2017 eq. 1-2: c_k = (1 / |S_k|) sum f(x_i) over class k's support, p(y = k | x) =
    softmax_k(-||f(x) - c_k||^2); by loops in float64 from the model's own embedding (eval mode:
    each image embedded on its own), over shuffled support labels."""
    torch.manual_seed(0)
    ways, shots, queries = 3, 2, 4
    model = tiny_protonet(ways, shots).double().eval()
    support, labels, query = episode(2, ways, shots, queries, dtype=torch.float64)
    with torch.no_grad():
        got = model(support, labels, query).log_probs  # (b, q, N)
        fs, fq = model.embed(support), model.embed(query)  # (b, n, E), (b, q, E)
    want = torch.empty_like(got)
    for b in range(2):
        members = [[i for i in range(ways * shots) if labels[b, i] == k] for k in range(ways)]
        prototypes = [sum(fs[b, i] for i in m) / len(m) for m in members]
        for j in range(queries):
            x = fq[b, j]
            d = [sum(float(u - c) ** 2 for u, c in zip(x, p, strict=True)) for p in prototypes]
            top = max(-x for x in d)
            norm = top + math.log(sum(math.exp(-x - top) for x in d))
            want[b, j] = torch.tensor([-x - norm for x in d], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# 3. Shapes, options, devices, bad input --------------------------------------------------------


def matching_snail() -> SNAIL:
    return tiny_snail(head_init="matching")


@pytest.mark.parametrize("make", [tiny_snail, matching_snail, tiny_protonet])
def test_shapes_weights_and_overfitting_a_tiny_batch(make):
    torch.manual_seed(0)
    model = make()
    support, labels, query = episode(batch=4, queries=3)
    truth = torch.randint(3, (4, 3), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        out = model(support, labels, query)
        loss = -out.log_probs.gather(-1, truth.unsqueeze(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert out.log_probs.shape == (4, 3, 3) and out.attention == []
    assert loss.item() < 0.1
    out = model.eval()(support, labels, query, return_weights=True)
    for _, w in out.attention:
        assert w.shape[:3] == (4, 3, 1)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    if isinstance(model, SNAIL):
        assert len(out.attention) == 3 and out.attention[0][1].shape[-2:] == (7, 7)


def test_a_two_block_snail_and_another_embedding_depth():
    model = SNAIL(
        SnailConfig(embed_dim=4, embed_blocks=2, filters=3, keys=(4, 4), values=(2, 2)),
        SIZE,
        1,
        2,
        1,
    )
    assert model.embed.size == 4 * 7 * 7 and len(model.tc) == 1
    support, labels, query = episode(ways=2, shots=1, queries=1)
    assert model(support, labels, query).log_probs.shape == (2, 1, 2)


@pytest.mark.parametrize("make", [tiny_snail, matching_snail, tiny_protonet])
def test_runs_on_the_device(make, device):
    model = make().to(device)
    support, labels, query = (t.to(device) for t in episode())
    out = model(support, labels, query, return_weights=True)
    assert out.log_probs.device.type == device.type and out.log_probs.shape == (2, 2, 3)
    out.log_probs.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == device.type for p in model.parameters())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: snail(keys=(4,), values=(2, 2)), "SnailConfig: argument 'values'"),
        (lambda: snail(filters=0), "SnailConfig: argument 'filters'"),
        (lambda: snail(keys=()), "SnailConfig: argument 'keys'"),
        (lambda: protonet(embed_dim=0), "ProtoNetConfig: argument 'embed_dim'"),
        (lambda: SNAIL(snail(), SIZE, 1, 0, 1), "'ways'"),
        (lambda: snail(qk_init="tied"), "SnailConfig: argument 'qk_init'"),
        (lambda: snail(head_init="zero"), "SnailConfig: argument 'head_init'"),
        (lambda: tiny_snail(ways=5, head_init="matching"), "SNAIL: argument 'config.values'"),
        (lambda: AttentionBlock(3, 2, 2, "tied"), "AttentionBlock: argument 'qk_init'"),
        (lambda: SNAIL(snail(embed_blocks=6), SIZE, 1, 2, 1), "'image_size'"),
        (lambda: tiny_snail()(*episode(ways=2)), "'support'"),
        (
            lambda: tiny_protonet()(episode()[0], episode()[1][:, :3], episode()[2]),
            "'support_labels'",
        ),
        (lambda: tiny_snail()(episode()[0], episode()[1], torch.rand(2, 1, 1, 27, 28)), "'query'"),
        # labels past the ways (one_hot's bare error) or negative
        (
            lambda: tiny_snail()(episode()[0], episode()[1] + 5, episode()[2]),
            r"'support_labels' expected class indices in \[0, 3\)",
        ),
        (
            lambda: tiny_protonet()(episode()[0], episode()[1] - 1, episode()[2]),
            r"'support_labels' expected class indices in \[0, 3\), got -1 to 1",
        ),
        # a label with no example: its prototype would be the zero vector
        (
            lambda: tiny_protonet()(episode()[0], episode()[1].clamp(max=1), episode()[2]),
            r"'support_labels' expected every label 0..2 in each episode's support, got episode 0",
        ),
    ],
)
def test_bad_values_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: tiny_snail()(episode()[0], episode()[1].float(), episode()[2]),
            "'support_labels' expected an integer tensor",
        ),
        (
            lambda: tiny_protonet()((episode()[0] * 255).byte(), episode()[1], episode()[2]),
            "'support' expected a floating-point",
        ),
        (
            lambda: tiny_snail()(episode()[0], episode()[1], episode()[2].double().long()),
            "'query' expected a floating-point",
        ),
    ],
)
def test_bad_dtypes_are_named(make, message):
    with pytest.raises(TypeError, match=message):
        make()


@pytest.mark.parametrize("make", [tiny_snail, tiny_protonet], ids=["snail", "protonet"])
def test_an_episode_of_another_dtype_is_named(make):
    """float64 images into a float32 model: torch's own 'same dtype' error, named now."""
    support, labels, query = episode(dtype=torch.float64)
    with pytest.raises(TypeError, match="argument 'support' expected dtype torch.float32"):
        make()(support, labels, query)
