"""An independent float64 reference of every `attnzoo.models.seq2seq` family, one sentence at a
time in plain loops over the papers' equations (Bahdanau 2015 sec. 3.1 and A.2; Luong 2015 eqs.
5-10; Cho 2014 for the model without attention), reading only the module's weights. PyTorch's
cell equations (its GRU applies the reset gate after the recurrent matrix, as the model
docstring says), its gate order and the bidirectional encoder's final states as the model
documents them."""

from __future__ import annotations

import math

import torch

F64 = dict(dtype=torch.float64)


def cell(kind, rnn, layer, x, h, c):
    """One step of PyTorch's `kind` cell from layer `layer` of `rnn`'s weights."""
    w_i, w_h = getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"weight_hh_l{layer}")
    b_i, b_h = getattr(rnn, f"bias_ih_l{layer}"), getattr(rnn, f"bias_hh_l{layer}")
    n = h.shape[0]
    if kind == "rnn":
        return torch.tanh(w_i @ x + b_i + w_h @ h + b_h), c
    if kind == "lstm":
        z = w_i @ x + b_i + w_h @ h + b_h
        i, f, g, o = z[:n].sigmoid(), z[n : 2 * n].sigmoid(), z[2 * n : 3 * n].tanh(), z[3 * n :]
        c = f * c + i * g
        return o.sigmoid() * torch.tanh(c), c
    gi, gh = w_i @ x + b_i, w_h @ h + b_h  # GRU
    r, u = (gi[:n] + gh[:n]).sigmoid(), (gi[n : 2 * n] + gh[n : 2 * n]).sigmoid()
    candidate = torch.tanh(gi[2 * n :] + r * gh[2 * n :])
    return (1 - u) * candidate + u * h, c


def encode(model, source, length):
    """Annotations h_1..h_L of one sentence (no padding read) and the final states."""
    config, hidden = model.config, model.config.hidden
    xs = [model.source_embed.weight[source[t]] for t in range(length)]
    for directions in model.encoder.layers:
        outs = []
        for d, rnn in enumerate(directions):
            h, c, out = torch.zeros(hidden, **F64), torch.zeros(hidden, **F64), [None] * length
            for t in range(length) if d == 0 else range(length - 1, -1, -1):
                h, c = cell(config.cell, rnn, 0, xs[t], h, c)
                out[t] = h
            outs.append(out)
        xs = [torch.cat([out[t] for out in outs]) for t in range(length)]
    final = torch.cat([outs[0][length - 1], *([outs[1][0]] if len(outs) == 2 else [])])
    return xs, final


def score(module, name, q, keys):
    if name == "additive":
        w_q, w_k = module.query_proj.weight, module.key_proj.weight
        return torch.stack([module.v @ torch.tanh(w_q @ q + w_k @ k) for k in keys])
    if name == "general":
        return torch.stack([q @ module.weight @ k for k in keys])
    if name == "dot":
        return torch.stack([q @ k for k in keys])
    if name == "scaled_dot":
        return torch.stack([q @ k / math.sqrt(q.shape[0]) for k in keys])
    if name == "cosine":
        unit = [x / x.norm().clamp_min(1e-8) for x in (q, *keys)]
        return torch.stack([unit[0] @ k for k in unit[1:]])
    if name == "location":
        return (module.proj.weight @ q + module.proj.bias)[: len(keys)]
    raise ValueError(name)


def stack_step(config, rnn, s, cs, x):
    """One step of the decoder's stack of cells from input x; updates the states in place."""
    for layer in range(config.layers):
        s[layer], cs[layer] = cell(config.cell, rnn, layer, x, s[layer], cs[layer])
        x = s[layer]
    return x


def attend(config, decoder, name, query, annotations, t):
    """The weights over one sentence's annotations: softmax of the scores, or Luong's local
    window (eq. 9, S the sentence's length; local-m p_t = t) and Gaussian (eq. 10)."""
    e = score(decoder.score, name, query, annotations)
    if config.attention != "luong-local":
        return torch.softmax(e, 0)
    length, window = len(annotations), config.option("window")
    if config.option("local") == "local-p":
        w_p, v_p = decoder.local.w_p.weight, decoder.local.v_p.weight[0]
        p = length * torch.sigmoid(v_p @ torch.tanh(w_p @ query))
    else:
        p = torch.tensor(float(t), **F64)
    inside = torch.tensor([abs(j - float(p)) <= window for j in range(length)])
    a = torch.zeros(length, **F64)
    if inside.any():
        a[inside] = torch.softmax(e[inside], 0)
    if config.option("local") == "local-p":
        a = a * torch.exp(-((torch.arange(length) - p) ** 2) / (2 * (window / 2) ** 2))
    return a


def logits(model, source, lengths, target_in):
    """(batch, steps, vocab) logits, sentence by sentence."""
    config, decoder, hidden = model.config, model.decoder, model.config.hidden
    batch, steps = target_in.shape
    out = torch.zeros(batch, steps, model.output.out_features, **F64)
    name = config.option("score") if config.attention != "none" else None
    for b in range(batch):
        length = int(lengths[b])
        annotations, final = encode(model, source[b], length)
        start = torch.tanh(decoder.bridge.weight @ final + decoder.bridge.bias)
        s = list(start.view(config.layers, hidden))
        cs = [torch.zeros(hidden, **F64) for _ in range(config.layers)]
        feed = torch.zeros(len(annotations[0]) if config.attention == "simple" else hidden, **F64)
        for t in range(steps):
            y = model.target_embed.weight[target_in[b, t]]
            if config.attention == "none":
                features = stack_step(config, decoder.rnn, s, cs, y)
            elif config.attention == "bahdanau":  # e_ij from s_{i-1}; s_i = f(s_{i-1}, y, c_i)
                a = attend(config, decoder, name, s[-1], annotations, t)
                context = sum(a[j] * annotations[j] for j in range(length))
                s_i = stack_step(config, decoder.rnn, s, cs, torch.cat([y, context]))
                readout = decoder.maxout.weight @ torch.cat([s_i, context, y]) + decoder.maxout.bias
                features = readout.view(-1, 2).max(-1).values  # maxout
            elif config.attention in ("luong", "luong-local"):
                x = torch.cat([y, feed]) if config.option("input_feeding") else y
                h_t = stack_step(config, decoder.rnn, s, cs, x)
                a = attend(config, decoder, name, h_t, annotations, t)
                context = sum(a[j] * annotations[j] for j in range(length))
                features = torch.tanh(decoder.combine.weight @ torch.cat([context, h_t]))  # eq. 5
                feed = features
            else:  # simple: s_t from [y; c_{t-1}], then c_t; the output reads [s_t; c_t]
                s_t = stack_step(config, decoder.rnn, s, cs, torch.cat([y, feed]))
                a = attend(config, decoder, name, s_t, annotations, t)
                context = sum(a[j] * annotations[j] for j in range(length))
                feed = context
                features = torch.cat([s_t, context])
            out[b, t] = model.output.weight @ features + model.output.bias
    return out
