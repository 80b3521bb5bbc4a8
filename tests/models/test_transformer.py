import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import MultiHeadAttention
from attnzoo.core import CacheError, sinusoidal_encoding
from attnzoo.decoding import beam_search, greedy
from attnzoo.models.transformer import (
    POSITIONS,
    Transformer,
    TransformerConfig,
    TransformerLM,
    _init_linear,
    base,
    tiny,
)

V_SRC, V_TGT = 13, 11


def batch(b=3, j=7, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([j, j - 2, 1, j - 1][:b])
    source = torch.randint(4, V_SRC, (b, j), generator=g)
    source[torch.arange(j)[None] >= lengths[:, None]] = 0
    target = torch.randint(4, V_TGT, (b, t), generator=g)
    target_in = torch.cat([torch.ones(b, 1, dtype=torch.long), target[:, :-1]], 1)
    return source, lengths, target_in, target


@pytest.fixture(autouse=True)
def _one_thread():
    """These models are tiny: a second thread only adds synchronisation (10x slower on a
    loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL = dict(d_model=16, heads=2, layers_enc=2, layers_dec=2, d_ff=24, dropout=0.0)


def make(max_source_len=9, max_target_len=24, **kw):
    config = TransformerConfig(**{**SMALL, **kw})
    return Transformer(config, V_SRC, V_TGT, max_source_len, max_target_len)


VARIANTS = [
    dict(),
    dict(pre_norm=True),
    dict(positions="learned"),
    dict(tie_embeddings=False),
    dict(final_norm=True),
    dict(pre_norm=True, positions="learned", tie_embeddings=False),
    dict(layers_enc=1, layers_dec=3, heads=4),
]


# -- 1. parity with torch.nn.Transformer -------------------------------------------------------


def _randomise(module: nn.Module, seed: int) -> None:
    """Non-trivial biases and LayerNorm affine parameters, so every copied tensor matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_from_torch_matches_nn_transformer(norm_first):
    d, h = 32, 4
    ref = nn.Transformer(
        d, h, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=48, dropout=0.1,
        batch_first=True, norm_first=norm_first,
    )  # fmt: skip
    _randomise(ref, 1)
    src_emb, tgt_emb = nn.Embedding(V_SRC, d), nn.Embedding(V_TGT, d)
    out_proj = nn.Linear(d, V_TGT)
    ours = Transformer.from_torch(ref, src_emb, tgt_emb, out_proj).eval()
    ref.eval()
    assert ours.config.pre_norm == norm_first and ours.config.final_norm
    source, lengths, target_in, _ = batch(b=4, j=9, t=6)

    def embed(emb, ids):
        return emb(ids) * math.sqrt(d) + sinusoidal_encoding(ids.shape[1], d)

    pad = source == 0  # torch: True = ignore
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        ref_memory = ref.encoder(embed(src_emb, source), src_key_padding_mask=pad)
        ref_hidden = ref.decoder(
            embed(tgt_emb, target_in),
            ref_memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=pad,
        )
        memory = ours.encode(source, lengths)
        hidden = ours.decode(target_in, memory).hidden
        logits = ours(source, lengths, target_in).logits
    real = ~pad
    torch.testing.assert_close(memory.states[real], ref_memory[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, out_proj(ref_hidden), rtol=1e-5, atol=1e-5)


def test_from_torch_ties_output_when_no_projection_given():
    ref = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    ours = Transformer.from_torch(ref, nn.Embedding(V_SRC, 16), nn.Embedding(V_TGT, 16))
    assert ours.output.weight is ours.target_embed.embedding.weight


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(module=nn.Linear(2, 2)), "'module' expected a torch.nn.Transformer"),
        (dict(activation="gelu"), "'module' expected activation='relu'"),
        (dict(bias=False), "'module' expected bias=True"),
        (dict(source_embedding=nn.Embedding(V_SRC, 8)), "'source_embedding'.*dimension 16"),
    ],
)
def test_from_torch_errors(kwargs, pattern):
    module = kwargs.pop("module", None)
    src = kwargs.pop("source_embedding", nn.Embedding(V_SRC, 16))
    if module is None:
        module = nn.Transformer(16, 2, 1, 1, 32, batch_first=True, **kwargs)
    with pytest.raises((ValueError, TypeError), match=pattern):
        Transformer.from_torch(module, src, nn.Embedding(V_TGT, 16))


# -- 2. every option: shapes, weights, incremental decoding, gradients -------------------------


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_every_variant(kw):
    model = make(**kw).eval()
    c = model.config
    source, lengths, target_in, _ = batch()
    out = model(source, lengths, target_in, return_weights=True)
    assert out.logits.shape == (3, 5, V_TGT)
    assert out.weights.shape == (3, 5, 7)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 5))
    assert (out.weights[1, :, 5:] == 0).all() and (out.weights[2, :, 1:] == 0).all()
    assert [w.shape for w in out.encoder_weights] == [(3, c.heads, 7, 7)] * c.layers_enc
    assert [w.shape for w in out.decoder_weights] == [(3, c.heads, 5, 5)] * c.layers_dec
    assert [w.shape for w in out.cross_weights] == [(3, c.heads, 5, 7)] * c.layers_dec
    assert (out.decoder_weights[0].triu(1) == 0).all()  # causal
    torch.testing.assert_close(out.weights, out.cross_weights[-1].mean(1))
    # without weights: the fast path gives the same logits
    torch.testing.assert_close(model(source, lengths, target_in).logits, out.logits)
    assert (model.output.weight is model.target_embed.embedding.weight) == c.tie_embeddings
    assert (model.encoder_norm is not None) == (c.pre_norm or c.final_norm)
    # cached decoding one token at a time gives the teacher-forced log-probabilities
    state = model.start(model.encode(source, lengths))
    steps = []
    for t in range(5):
        log_probs, state = model.decode_step(target_in[:, t], state)
        steps.append(log_probs)
    assert state.self_caches[0].length == 5 and state.cross_caches[0].static
    torch.testing.assert_close(
        torch.stack(steps, 1), torch.log_softmax(out.logits, -1), rtol=1e-5, atol=1e-5
    )
    model.train()
    model(source, lengths, target_in).logits.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_variants_cover_every_option():
    """Every value of every choice field of the config, read from the code: a new option
    fails here until a variant runs it."""
    default = TransformerConfig()
    configs = [TransformerConfig(**{**SMALL, **kw}) for kw in VARIANTS]
    fields = dataclasses.fields(TransformerConfig)
    choices = {f.name: {False, True} for f in fields if isinstance(getattr(default, f.name), bool)}
    choices["positions"] = set(POSITIONS)
    assert choices.keys() >= {"pre_norm", "final_norm", "tie_embeddings", "positions"}
    for name, values in choices.items():
        assert {getattr(c, name) for c in configs} == values, name


@pytest.mark.parametrize("kw", [dict(), dict(pre_norm=True, positions="learned")])
def test_cached_search_gives_the_uncached_tokens(kw):
    """Greedy and beam search over KV caches pick the same tokens as recomputing the prefix."""
    torch.manual_seed(3)
    model = make(**kw).eval()
    source, lengths, _, _ = batch(b=4, j=8)
    memory = model.encode(source, lengths)
    common = dict(bos=1, eos=2, max_len=12, device=torch.device("cpu"))
    for search, extra in ((greedy, {}), (beam_search, dict(beam_size=3))):
        cached = search(model.decode_step, model.start(memory), 4, **common, **extra)
        uncached = search(model.decode_step, model.start(memory, cache=False), 4, **common, **extra)
        assert cached.shape[1] > 1
        assert torch.equal(cached, uncached)


def test_reorder_returns_a_new_state():
    model = make().eval()
    source, lengths, target_in, _ = batch()
    state = model.start(model.encode(source, lengths))
    _, state = model.decode_step(target_in[:, 0], state)
    index = torch.tensor([2, 2, 0])
    moved = state.reorder(index)
    assert moved.self_caches[0].key.shape[0] == 3 and moved.step == state.step
    torch.testing.assert_close(moved.self_caches[1].key, state.self_caches[1].key[index])
    torch.testing.assert_close(moved.cross_caches[0].value, state.cross_caches[0].value[index])
    torch.testing.assert_close(moved.memory_mask, state.memory_mask[index])


# -- 3. training and masks ---------------------------------------------------------------------


@pytest.mark.parametrize("pre_norm", [False, True])
def test_overfits_one_tiny_batch(pre_norm):
    model = make(pre_norm=pre_norm, d_model=32, heads=4, d_ff=64)
    source, lengths, target_in, target = batch(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        loss = F.cross_entropy(
            model(source, lengths, target_in).logits.reshape(-1, V_TGT), target.reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (model(source, lengths, target_in).logits.argmax(-1) == target).all()


def test_no_leak_from_future_targets_or_padded_sources():
    """d logits[:, t] / d (embedded inputs) is zero at target positions > t and at padded
    source positions, and non-zero where attention may look."""
    model = make(dropout=0.0).eval()
    source, lengths, target_in, _ = batch()
    kept = {}

    def keep(name):
        def hook(_, __, output):
            output.retain_grad()
            kept[name] = output

        return hook

    model.source_embed.register_forward_hook(keep("source"))
    model.target_embed.register_forward_hook(keep("target"))
    t = 2
    model(source, lengths, target_in).logits[:, t].sum().backward()
    g_target = kept["target"].grad.abs().sum(-1)  # (b, t)
    assert (g_target[:, t + 1 :] == 0).all() and (g_target[:, : t + 1] > 0).all()
    g_source = kept["source"].grad.abs().sum(-1)  # (b, j)
    real = torch.arange(source.shape[1])[None] < lengths[:, None]
    assert (g_source[~real] == 0).all() and (g_source[real] > 0).all()


def test_odd_sizes():
    model = Transformer(
        TransformerConfig(d_model=6, heads=3, layers_enc=1, layers_dec=1, d_ff=5, dropout=0.0),
        5,
        3,
        4,
        4,
    ).eval()
    source = torch.tensor([[4]])
    out = model(source, torch.tensor([1]), torch.tensor([[1]]), return_weights=True)
    assert out.logits.shape == (1, 1, 3) and out.weights.shape == (1, 1, 1)
    ids = greedy(model.decode_step, model.start(model.encode(source, torch.tensor([1]))), 1,
                 bos=1, eos=2, max_len=3, device=torch.device('cpu'))  # fmt: skip
    assert ids.shape[0] == 1 and 1 <= ids.shape[1] <= 3


def test_dropout_is_active_in_training_only():
    model = make(dropout=0.3)
    source, lengths, target_in, _ = batch()
    a, b = (model(source, lengths, target_in).logits for _ in range(2))
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(
        model(source, lengths, target_in).logits, model(source, lengths, target_in).logits
    )


# -- 4. configs and errors ---------------------------------------------------------------------


def test_presets_cite_the_paper_sizes():
    b = base()
    assert (b.d_model, b.heads, b.layers_enc, b.layers_dec, b.d_ff, b.dropout) == (
        512, 8, 6, 6, 2048, 0.1,
    )  # fmt: skip
    assert not b.pre_norm and b.positions == "sinusoidal"
    t = tiny(pre_norm=True)
    assert (t.d_model, t.heads, t.layers_enc, t.d_ff, t.pre_norm) == (128, 4, 2, 512, True)


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        (dict(heads=3), "'heads' expected a divisor of d_model = 128"),
        (dict(positions="rotary"), "'positions' expected one of"),
        (dict(dropout=1.0), "'dropout'"),
        (dict(layers_enc=0), "'layers_enc' expected a positive int"),
    ],
)
def test_config_errors(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        TransformerConfig(**kw)


def test_sizes_are_constructor_arguments():
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert not names & {"max_source_len", "max_target_len"}
    with pytest.raises(ValueError, match="'max_target_len' expected a positive int"):
        make(max_target_len=0)
    with pytest.raises(ValueError, match="'source_vocab' expected a positive int"):
        Transformer(TransformerConfig(**SMALL), 0, V_TGT, 9, 9)
    with pytest.raises(ValueError, match="'max_len' expected a positive int"):
        TransformerLM(TransformerConfig(**SMALL), V_TGT, 0)
    assert make(positions="learned", max_source_len=9).source_embed.positions.max_len == 9
    lm = TransformerLM(TransformerConfig(**{**SMALL, "positions": "learned"}), V_TGT, 7)
    assert lm.embed.positions.max_len == 7


def test_input_errors_name_the_argument():
    model = make().eval()
    source, lengths, target_in, _ = batch()
    with pytest.raises(ValueError, match="'source' expected a tensor of rank 2"):
        model.encode(source[0], lengths)
    with pytest.raises(ValueError, match=r"'lengths' expected shape \(3,\), one per source"):
        model.encode(source, lengths[:2])
    j = source.shape[1]
    # a row of length 0 would attend to nothing; one past source_len would read past it
    for bad in (0, j + 1):
        with pytest.raises(ValueError, match=rf"'lengths' expected values in 1..source_len = {j}"):
            model.encode(source, lengths.clone().fill_(bad))
    memory = model.encode(source, lengths)
    with pytest.raises(TypeError, match="'target_in' expected integer token ids"):
        model.decode(target_in.float(), memory)
    with pytest.raises(ValueError, match="'target_in' expected batch size 3 \\(that of the memory"):
        model.decode(target_in[:2], memory)
    with pytest.raises(ValueError, match="'target_in' expected .* at least one position"):
        model.decode(target_in[:, :0], memory)
    learned = make(positions="learned", max_target_len=4).eval()
    with pytest.raises(ValueError, match="max_len = 4"):
        learned(source, lengths, target_in)


def test_registry_presets_build_a_transformer():
    """The registry's presets build the model with the sizes the runs layer passes
    (`task.model_dims()`), here given directly."""
    from attnzoo.models.registry import MODELS

    assert MODELS["transformer"].config_class is TransformerConfig
    assert MODELS["transformer-base"].preset().d_model == 512
    config = MODELS["transformer"].preset(
        d_model=16, heads=2, d_ff=24, positions="learned", pre_norm=True
    )
    dims = dict(source_vocab=V_SRC, target_vocab=V_TGT, max_source_len=7, max_target_len=6)
    model = MODELS["transformer"].model_class(config, **dims)
    assert isinstance(model, Transformer) and model.config.pre_norm
    assert model.source_embed.positions.max_len == 7
    source, lengths, target_in, _ = batch(t=6)
    assert torch.isfinite(model(source, lengths, target_in).logits).all()


def test_init_is_xavier_per_projection_block():
    """The fused [W_q; W_k; W_v] gets the initial weights of three separate (d, d) layers
    under Xavier-uniform, drawn in the same order (the init before the fusion)."""
    mha = MultiHeadAttention(16, 2)
    torch.manual_seed(5)
    _init_linear(mha)
    separate = [nn.Linear(16, 16) for _ in range(4)]  # q, k, v, out
    torch.manual_seed(5)
    for layer in separate:
        nn.init.xavier_uniform_(layer.weight)
    expected = torch.cat([layer.weight for layer in separate[:3]])
    assert torch.equal(mha.in_proj.weight, expected)
    assert torch.equal(mha.out_proj.weight, separate[3].weight)
    assert (mha.in_proj.bias == 0).all()


# -- 5. the decoder-only language model --------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(), dict(pre_norm=True, positions="learned")])
def test_language_model_shapes_causality_and_caches(kw):
    model = TransformerLM(TransformerConfig(**{**SMALL, **kw}), V_TGT, 12).eval()
    tokens = torch.randint(1, V_TGT, (3, 6))
    out = model(tokens, return_weights=True)
    assert out.logits.shape == (3, 6, V_TGT)
    assert [w.shape for w in out.weights] == [(3, 2, 6, 6)] * 2
    assert all((w.triu(1) == 0).all() for w in out.weights)
    # changing a later token leaves earlier predictions unchanged
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] % (V_TGT - 1)) + 1
    torch.testing.assert_close(model(changed).logits[:, :4], out.logits[:, :4])
    state, steps = model.start(), []
    for t in range(6):
        log_probs, state = model.decode_step(tokens[:, t], state)
        steps.append(log_probs)
    torch.testing.assert_close(
        torch.stack(steps, 1), torch.log_softmax(out.logits, -1), rtol=1e-5, atol=1e-5
    )
    moved = state.reorder(torch.tensor([1, 1, 0]))
    assert moved.caches[0].key.shape[0] == 3 and moved.step == 6
    assert (
        greedy(
            model.decode_step, model.start(), 2, bos=1, eos=2, max_len=5, device=torch.device("cpu")
        ).shape[0]
        == 2
    )


def test_language_model_learns_a_repeating_sequence():
    model = TransformerLM(TransformerConfig(**{**SMALL, "d_model": 32, "d_ff": 64}), V_TGT, 12)
    tokens = torch.tensor([[1, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6]])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        logits = model(tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, V_TGT), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_sinusoidal_table_and_its_fallback_agree():
    """Positions past the precomputed table fall back to computing the encoding."""
    model = make(max_target_len=3).eval()
    tokens = torch.randint(1, V_TGT, (2, 6))
    inside = model.target_embed(tokens[:, :3])
    beyond = model.target_embed(tokens)  # 6 > max_target_len: computed, not looked up
    torch.testing.assert_close(inside, beyond[:, :3])
    assert "target_embed.table" not in model.state_dict()


def test_a_float64_model_looks_up_float64_positions():
    """The table is computed again in a model's new dtype: converted by `.double()` it held
    the float32 rounding of the sinusoids (off by ~3e-8 below max_target_len, exact past it),
    and a conversion back and forth (`.float().double()`) must not round it either."""
    model = make(max_target_len=8).float().double().eval()
    table = model.target_embed.table
    assert table.dtype == torch.float64
    assert torch.equal(table, sinusoidal_encoding(8, table.shape[1], dtype=torch.float64))
    tokens = torch.randint(1, V_TGT, (2, 9))
    inside, beyond = model.target_embed(tokens[:, :8]), model.target_embed(tokens)
    assert torch.equal(inside, beyond[:, :8])  # the look-up and the computation, bit for bit


# -- 6. any device: built on it, run on it (meta: shapes and devices without values) ----------


DEVICE_VARIANTS = [
    dict(),
    dict(pre_norm=True),
    dict(positions="learned"),
    dict(pre_norm=True, positions="learned"),
]


def _ids(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()) or "post-LN-sinusoidal"


@pytest.mark.parametrize("kw", DEVICE_VARIANTS, ids=_ids)
def test_transformer_on_any_device(device, kw):
    with device:
        model = make(**kw)
    assert {p.device.type for p in model.parameters()} == {device.type}
    source, lengths, target_in, _ = (t.to(device) for t in batch())
    out = model(source, lengths, target_in, return_weights=True)
    assert out.logits.device.type == device.type and out.logits.shape == (3, 5, V_TGT)
    assert out.weights.device.type == device.type and out.weights.shape == (3, 5, 7)
    model(source, lengths, target_in).logits.sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.device.type == device.type
    model.eval()
    memory = model.encode(source, lengths)
    assert memory.attend_mask is not None  # padded rows; on meta the mask is always kept
    for cache in (True, False):
        state = model.start(memory, cache=cache)
        for t in range(3):
            log_probs, state = model.decode_step(target_in[:, t], state)
            assert log_probs.device.type == device.type and log_probs.shape == (3, V_TGT)
        if cache:
            assert state.self_caches[0].length == 3
            assert state.self_caches[0].key.device.type == device.type
        moved = state.reorder(torch.tensor([2, 0, 1], device=device))
        assert moved.memory.device.type == device.type


@pytest.mark.parametrize("kw", DEVICE_VARIANTS, ids=_ids)
def test_language_model_on_any_device(device, kw):
    with device:
        model = TransformerLM(TransformerConfig(**{**SMALL, **kw}), V_TGT, 8)
    tokens = torch.randint(1, V_TGT, (2, 6)).to(device)
    out = model(tokens, return_weights=True)
    assert out.logits.device.type == device.type and out.logits.shape == (2, 6, V_TGT)
    assert all(w.device.type == device.type for w in out.weights)
    out.logits.sum().backward()
    assert all(p.grad.device.type == device.type for p in model.parameters())
    state = model.start()
    for t in range(3):
        log_probs, state = model.decode_step(tokens[:, t], state)
        assert log_probs.device.type == device.type and log_probs.shape == (2, V_TGT)
    assert state.caches[0].length == 3 and state.caches[0].key.device.type == device.type


# -- 7. checkpoints saved before the fused in-projection ----------------------------------------


def _old_layout(state: dict) -> dict:
    """A state dict as saved before the fusion: every `in_proj` split into the separate
    q_proj, k_proj and v_proj layers it replaced."""
    old = {}
    for key, value in state.items():
        prefix, _, field = key.rpartition("in_proj.")
        if not _:
            old[key] = value
            continue
        for name, part in zip("qkv", value.chunk(3), strict=True):
            old[f"{prefix}{name}_proj.{field}"] = part.clone()
    return old


def test_checkpoint_of_the_old_layout_loads_and_gives_the_same_outputs():
    torch.manual_seed(1)
    saved = make(pre_norm=True).eval()
    state = _old_layout(saved.state_dict())
    assert any(k.endswith("cross_attention.k_proj.weight") for k in state)
    assert not any("in_proj" in k for k in state)
    torch.manual_seed(2)
    model = make(pre_norm=True).eval()
    model.load_state_dict(state)  # strict
    source, lengths, target_in, _ = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            model(source, lengths, target_in).logits, saved(source, lengths, target_in).logits
        )


def test_a_reordered_decoding_state_keeps_its_caches_owned():
    """Beam search reorders the state into a copy: its caches still belong to their layers,
    so the first layer's cache given to the second layer's attention is refused."""
    model = make().eval()
    source, lengths, _, _ = batch()
    state = model.start(model.encode(source, lengths))
    _, state = model.decode_step(torch.ones(3, dtype=torch.long), state)
    moved = state.reorder(torch.tensor([2, 2, 0]))
    assert moved.self_caches[0].key.shape[0] == 3
    assert state.self_caches[0].key.shape[0] == 3  # the old state is left as it was
    x = torch.randn(3, 1, SMALL["d_model"])
    with pytest.raises(CacheError, match="'cache'"):
        model.decoder[1].self_attention(x, causal=True, cache=moved.self_caches[0])


@pytest.mark.parametrize("kind", ["translation", "language model"])
def test_a_state_stepped_from_before_is_refused_and_a_copy_branches(kind):
    """decode_step grows a state's caches in place: stepping from a state a second time would
    read the first step's extra position at the wrong place (different log-probabilities for
    the same token, without a word). It is refused, naming the argument; a copy made with
    reorder before the first step branches to exactly the first step's result."""
    if kind == "translation":
        model = make().eval()
        source, lengths, _, _ = batch()
        start = model.start(model.encode(source, lengths))
    else:
        model = TransformerLM(TransformerConfig(**SMALL), V_TGT, 12).eval()
        start = model.start()
    tokens = torch.tensor([1, 4, 5])
    _, state = model.decode_step(tokens, start)
    copy = state.reorder(torch.arange(3))
    first, _ = model.decode_step(tokens, state)
    with pytest.raises(ValueError, match="'state' expected a state whose caches hold its 1 "):
        model.decode_step(tokens, state)
    again, _ = model.decode_step(tokens, copy)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.parametrize("eps", [0, -1e-5, float("inf"), float("nan"), True])
def test_layer_norm_eps_must_be_positive_and_finite(eps):
    with pytest.raises(ValueError, match="'layer_norm_eps'"):
        TransformerConfig(layer_norm_eps=eps)


def test_layer_norm_eps_reaches_every_layer_norm():
    model = make(layer_norm_eps=1e-3, pre_norm=True)
    assert {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)} == {1e-3}


def test_decoding_states_know_their_batch():
    """The engine checks `batch` against the state's rows (beam search would otherwise decode
    a larger state's first rows); an LM's empty caches fit any batch."""
    model = make().eval()
    source, lengths, _, _ = batch()
    state = model.start(model.encode(source, lengths))
    assert state.batch_size == 3 and state.reorder(torch.tensor([1])).batch_size == 1
    with pytest.raises(ValueError, match=r"argument 'batch' expected the rows of 'state' \(3\)"):
        beam_search(model.decode_step, state, 1, bos=1, eos=2, max_len=3, device="cpu")
    lm = TransformerLM(TransformerConfig(**SMALL), V_TGT, 12).eval()
    state = lm.start()
    assert state.batch_size is None
    with torch.no_grad():
        _, state = lm.decode_step(torch.ones(2, dtype=torch.long), state)
    assert state.batch_size == 2
    with pytest.raises(ValueError, match=r"argument 'batch' expected the rows of 'state' \(2\)"):
        greedy(lm.decode_step, state, 4, bos=1, eos=2, max_len=3, device="cpu")
