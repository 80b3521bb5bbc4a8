import pytest
import torch
import torch.nn.functional as F

from attnzoo.decoding import greedy
from attnzoo.models.seq2seq import Seq2Seq, Seq2SeqConfig

V_SRC, V_TGT = 13, 11


def batch(b=3, j=7, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([j, j - 2, 1][:b])
    source = torch.randint(4, V_SRC, (b, j), generator=g)
    source[torch.arange(j)[None] >= lengths[:, None]] = 0
    target = torch.randint(4, V_TGT, (b, t), generator=g)
    target_in = torch.cat([torch.ones(b, 1, dtype=torch.long), target[:, :-1]], 1)
    return source, lengths, target_in, target


VARIANTS = [
    dict(attention="none"),
    dict(attention="bahdanau", score="additive"),
    dict(attention="bahdanau", score="general", cell="lstm"),
    dict(attention="luong", score="dot", bidirectional=False),
    dict(attention="luong", score="scaled_dot", bidirectional=False, input_feeding=False),
    dict(attention="luong", score="general", cell="lstm"),
    dict(attention="luong", score="additive", input_feeding=False),
    dict(attention="luong", score="location"),
    dict(attention="luong", score="general", local="local-m", window=2),
    dict(attention="luong", score="general", local="local-p", window=2, cell="rnn"),
    dict(attention="simple", score="general", cell="rnn"),
    dict(attention="bahdanau", layers=2),
]


def make(**kw):
    config = Seq2SeqConfig(
        embed_dim=8, hidden=12, attn_hidden=10, dropout=0.0, max_source_len=9, **kw
    )
    return Seq2Seq(config, V_SRC, V_TGT)


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(map(str, kw.values())))
def test_every_variant_shapes_gradients_and_step_consistency(kw):
    torch.manual_seed(0)
    model = make(**kw).eval()
    source, lengths, target_in, _ = batch()
    out = model(source, lengths, target_in, return_weights=True)
    assert out.logits.shape == (3, 5, V_TGT)
    if kw["attention"] == "none":
        assert out.weights is None
    else:
        assert out.weights.shape == (3, 5, 7)
        # padded source positions get no weight
        assert (out.weights[1, :, 5:] == 0).all() and (out.weights[2, :, 1:] == 0).all()
        sums = out.weights.sum(-1)
        if kw.get("local") is None:
            torch.testing.assert_close(sums, torch.ones(3, 5))
        elif kw.get("local") == "local-m":  # p_t = t may leave a short source's window empty
            assert ((sums - 1).abs() < 1e-5).logical_or(sums == 0).all()
        else:  # local-p: Gaussian-reweighted, not renormalised (Luong eq. 10)
            assert (sums <= 1 + 1e-6).all()
    # decoding one token at a time gives the teacher-forced logits
    state = model.start(model.encode(source, lengths))
    steps = []
    for t in range(5):
        log_probs, state = model.decode_step(target_in[:, t], state)
        steps.append(log_probs)
    torch.testing.assert_close(
        torch.stack(steps, 1), torch.log_softmax(out.logits, -1), rtol=1e-4, atol=1e-5
    )
    model.train()
    model(source, lengths, target_in).logits.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("attention", ["none", "bahdanau", "luong", "simple"])
def test_overfits_one_tiny_batch(attention):
    torch.manual_seed(0)
    model = make(attention=attention, score="general")
    source, lengths, target_in, target = batch(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(150):
        loss = F.cross_entropy(
            model(source, lengths, target_in).logits.reshape(-1, V_TGT), target.reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (model(source, lengths, target_in).logits.argmax(-1) == target).all()


def test_keys_prepared_once_per_sentence():
    model = make(attention="bahdanau").eval()
    source, lengths, target_in, _ = batch()
    calls = []
    original = model.score.key_proj.forward
    model.score.key_proj.forward = lambda x: calls.append(1) or original(x)
    model(source, lengths, target_in)
    assert len(calls) == 1


def test_greedy_decode_runs_and_stops():
    model = make(attention="bahdanau").eval()
    source, lengths, _, _ = batch()
    state = model.start(model.encode(source, lengths))
    out = greedy(model.decode_step, state, 3, bos=1, eos=2, max_len=6, device=torch.device("cpu"))
    assert out.shape[0] == 3 and out.shape[1] <= 6


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        (dict(attention="bogus"), "'attention'"),
        (dict(cell="lstmx"), "'cell'"),
        (dict(attention="bahdanau", local="local-m"), "'local'"),
    ],
)
def test_config_errors(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        Seq2SeqConfig(**kw)


def test_dot_score_needs_matching_sizes():
    with pytest.raises(ValueError, match="'score'.*d_query \\(12\\) != d_key \\(24\\)"):
        make(attention="luong", score="dot", bidirectional=True)


def test_variants_cover_every_option():
    seen = {k: {kw.get(k) for kw in VARIANTS} for k in ("attention", "score", "local", "cell")}
    assert {"none", "bahdanau", "luong", "simple"} <= seen["attention"]
    assert {"additive", "dot", "scaled_dot", "general", "location"} <= seen["score"]
    assert {"local-m", "local-p"} <= seen["local"]
    assert {"rnn", "lstm"} <= seen["cell"]
