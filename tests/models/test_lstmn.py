"""LSTMN, SimpleRNN + self-attention and LSTM language models (attnzoo.models.lstmn).

The references below are plain float64 loops over batch rows, time steps and tape slots,
written from the equations of Cheng et al. 2016 (eq. 4-7) and the lecture, reading the
modules' weights and nothing else of the code under test."""

import math

import pytest
import torch
from torch.func import functional_call

from attnzoo.models.lstmn import (
    LSTMLM,
    LSTMNLM,
    RecurrentLMConfig,
    SimpleSelfAttentionLM,
)

ODD = RecurrentLMConfig(embed_dim=7, hidden=17, attn_hidden=5)
V = 23
ATTENTION_MODELS = (LSTMNLM, SimpleSelfAttentionLM)
ALL_MODELS = (*ATTENTION_MODELS, LSTMLM)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def matvec(w: torch.Tensor, x: list[float]) -> list[float]:
    return [sum(w[r, c].item() * x[c] for c in range(len(x))) for r in range(w.shape[0])]


def softmax(a: list[float]) -> list[float]:
    top = max(a)
    e = [math.exp(x - top) for x in a]
    return [x / sum(e) for x in e]


def reference_lstmn(model: LSTMNLM, tokens: torch.Tensor):
    """(logits (b, t, V), weights per row and step) by a plain float64 loop."""
    e, h = model.config.embed_dim, model.config.hidden
    wq = model.score.query_proj.weight.double()  # (A, E + H): [W_x, W_h~]
    w_x, w_ht = wq[:, :e], wq[:, e:]
    w_h = model.score.key_proj.weight.double()
    v = model.score.v.double().tolist()
    gw, gb = model.gates.weight.double(), model.gates.bias.double().tolist()
    ow, ob = model.output.weight.double(), model.output.bias.double().tolist()
    logits, weights = [], []
    for row in tokens.tolist():
        hs, cs = [[0.0] * h], [[0.0] * h]  # the tapes, h_0 = c_0 = 0
        h_tilde = [0.0] * h
        out_row, w_row = [], []
        for token in row:
            x = model.embed.weight[token].double().tolist()
            query = [a + b for a, b in zip(matvec(w_x, x), matvec(w_ht, h_tilde), strict=True)]
            scores = []
            for h_i in hs:
                key = matvec(w_h, h_i)
                scores.append(sum(v[k] * math.tanh(key[k] + query[k]) for k in range(len(v))))
            s = softmax(scores)
            h_tilde = [sum(s[i] * hs[i][d] for i in range(len(hs))) for d in range(h)]
            c_tilde = [sum(s[i] * cs[i][d] for i in range(len(cs))) for d in range(h)]
            pre = [a + b for a, b in zip(matvec(gw, h_tilde + x), gb, strict=True)]
            i_g = [sigmoid(z) for z in pre[:h]]
            f_g = [sigmoid(z) for z in pre[h : 2 * h]]
            o_g = [sigmoid(z) for z in pre[2 * h : 3 * h]]
            hat = [math.tanh(z) for z in pre[3 * h :]]
            c = [f_g[d] * c_tilde[d] + i_g[d] * hat[d] for d in range(h)]
            h_t = [o_g[d] * math.tanh(c[d]) for d in range(h)]
            hs.append(h_t)
            cs.append(c)
            out_row.append([a + b for a, b in zip(matvec(ow, h_t), ob, strict=True)])
            w_row.append(s)
        logits.append(out_row)
        weights.append(w_row)
    return torch.tensor(logits, dtype=torch.float64), weights


def reference_simple(model: SimpleSelfAttentionLM, tokens: torch.Tensor):
    """The lecture's SimpleRNN + self-attention, float64 loop: (logits, weights)."""
    h = model.config.hidden
    a_w, a_b = model.cell.weight.double(), model.cell.bias.double().tolist()
    w_q = model.score.query_proj.weight.double()
    w_k = model.score.key_proj.weight.double()
    v = model.score.v.double().tolist()
    ow, ob = model.output.weight.double(), model.output.bias.double().tolist()
    logits, weights = [], []
    for row in tokens.tolist():
        c, hs, out_row, w_row = [0.0] * h, [], [], []
        for token in row:
            x = model.embed.weight[token].double().tolist()
            h_t = [math.tanh(z + b) for z, b in zip(matvec(a_w, x + c), a_b, strict=True)]
            hs.append(h_t)
            q = matvec(w_q, h_t)
            scores = []
            for h_i in hs:
                key = matvec(w_k, h_i)
                scores.append(sum(v[k] * math.tanh(key[k] + q[k]) for k in range(len(v))))
            alpha = softmax(scores)
            c = [sum(alpha[i] * hs[i][d] for i in range(len(hs))) for d in range(h)]
            out_row.append([a + b for a, b in zip(matvec(ow, c), ob, strict=True)])
            w_row.append(alpha)
        logits.append(out_row)
        weights.append(w_row)
    return torch.tensor(logits, dtype=torch.float64), weights


REFERENCES = {LSTMNLM: reference_lstmn, SimpleSelfAttentionLM: reference_simple}


@pytest.mark.parametrize("cls", ATTENTION_MODELS)
def test_matches_a_float64_loop_reference_at_odd_sizes(cls):
    model = cls(ODD, V, 9).double().eval()
    tokens = torch.randint(1, V, (3, 7))
    out = model(tokens, return_weights=True)
    logits, weights = REFERENCES[cls](model, tokens)
    torch.testing.assert_close(out.logits, logits, rtol=1e-10, atol=1e-10)
    square = out.weights[0][:, 0]  # (b, t, t)
    for b, rows in enumerate(weights):
        for t, row in enumerate(rows):
            expected = torch.zeros(7, dtype=torch.float64)
            expected[: len(row)] = torch.tensor(row, dtype=torch.float64)
            torch.testing.assert_close(square[b, t], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_gradcheck_at_small_size(cls):
    model = cls(RecurrentLMConfig(embed_dim=3, hidden=4, attn_hidden=3), 7, 5).double()
    tokens = torch.tensor([[1, 4, 2, 6], [3, 3, 5, 1]])
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}

    def f(*values):
        return functional_call(model, dict(zip(names, values, strict=True)), (tokens,)).logits

    assert torch.autograd.gradcheck(f, tuple(params.values()), eps=1e-6, atol=1e-6)


def test_projects_each_hidden_state_once():
    """W_h h_i is computed when h_i is written: t + 1 rows per sequence (h_0 .. h_t), never
    the whole tape again at a later step."""
    model = LSTMNLM(ODD, V, 20)
    rows = []
    model.score.key_proj.register_forward_hook(lambda m, inputs, out: rows.append(inputs[0]))
    model(torch.randint(1, V, (2, 11)))
    assert len(rows) == 12 and all(r.shape == (2, 1, ODD.hidden) for r in rows)


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_causal_no_future_token_changes_an_earlier_output(cls):
    model = cls(ODD, V, 12).double().eval()
    tokens = torch.randint(1, V, (2, 9))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 3) % (V - 1) + 1
    a, b = model(tokens).logits, model(changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("cls", ATTENTION_MODELS)
@pytest.mark.parametrize("side", ["left", "right", "inside"])
def test_padding_never_reaches_an_output(cls, side):
    """Padded positions hold a token whose embedding is NaN: the outputs at the real positions
    are those of the sequence alone, bit for bit up to rounding."""
    model = cls(ODD, V, 16).double().eval()
    with torch.no_grad():
        model.embed.weight[V - 1] = float("nan")
    real = torch.randint(1, V - 1, (1, 6))
    pad = torch.full((1, 3), V - 1)
    padded = {
        "left": torch.cat([pad, real], 1),
        "right": torch.cat([real, pad], 1),
        "inside": torch.cat([real[:, :2], pad, real[:, 2:]], 1),
    }[side]
    mask = padded != V - 1
    out = model(padded, mask=mask, return_weights=True)
    alone = model(real).logits
    torch.testing.assert_close(
        out.logits[mask[..., None].expand_as(out.logits)].view(1, 6, V), alone
    )
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.weights[0]).all()


def test_lstm_takes_right_padding_and_refuses_a_gap():
    model = LSTMLM(ODD, V, 16).double().eval()
    tokens = torch.randint(1, V, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    out = model(tokens, mask=mask).logits
    torch.testing.assert_close(out[1, :4], model(tokens[1:, :4]).logits[0])
    mask[0, 0] = False
    with pytest.raises(ValueError, match="'mask'.*right padding"):
        model(tokens, mask=mask)


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_bad_inputs_name_the_argument(cls):
    model = cls(ODD, V, 8)
    with pytest.raises(TypeError, match="'tokens'"):
        model(torch.rand(2, 3))
    with pytest.raises(ValueError, match="'tokens'"):
        model(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="'mask'"):
        model(torch.ones(2, 3, dtype=torch.long), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="'hidden'"):
        RecurrentLMConfig(hidden=0)
    with pytest.raises(ValueError, match="'vocab'"):
        cls(ODD, 0, 8)


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_runs_on_the_meta_device(cls):
    model = cls(ODD, V, 8).to("meta")
    tokens = torch.ones(3, 5, dtype=torch.long, device="meta")
    out = model(tokens, return_weights=True, mask=torch.ones(3, 5, dtype=torch.bool, device="meta"))
    assert out.logits.device.type == "meta" and out.logits.shape == (3, 5, V)
    if out.weights is not None:
        assert out.weights[0].shape == (3, 1, 5, 5) and out.weights[0].device.type == "meta"
    out.logits.sum().backward()
