"""Training throughput (target tokens/s) of attnzoo's Bahdanau model against the same model
written plainly, the way the PyTorch seq2seq tutorial writes it: a decoder loop that recomputes
the key projection U_a h at every step, broadcasts tanh(W_a s + U_a h), and applies the readout
and output layer inside the loop.

Both models hold identical weights (the plain one is loaded from ours and checked to give the
same logits), run on the same batch, and are timed interleaved in one worker process (a step:
forward, cross-entropy, backward, AdamW). The speedup is per round: the plain step's time over
attnzoo's of the same round.

    python benchmarks/bench_seq2seq_throughput.py [--budget smoke]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import _common as C
from _common import Bench, Experiment, Table, drive, targets
from attnzoo.models.seq2seq import Seq2Seq, bahdanau

KEYS = ("batch", "source_len", "target_len", "source_vocab", "target_vocab", "hidden")
SIZES = {  # id -> KEYS
    "full": {
        "dates-sized": (64, 30, 11, 60, 20, 128),
        "kjv2web-sized": (64, 45, 50, 8000, 8000, 256),
    },
    "smoke": {"dates-sized": (4, 9, 5, 20, 15, 16), "kjv2web-sized": (4, 9, 6, 40, 40, 16)},
}
METHOD = {
    "ms": "per-step milliseconds over the repeats (median, quartiles, range), the two models "
    "timed in one worker process, interleaved round by round after 2 warm-up steps",
    "tokens_per_s": "batch * target length / median step time",
    "speedup": "the plain step's time over attnzoo's, per round: median and range",
}


class PlainBahdanau(nn.Module):
    """Tutorial-style RNNsearch with the same parameters as attnzoo's: a packed nn.GRU
    encoder (bidirectional), and a decoder loop that projects the keys, broadcasts the tanh and
    applies readout and output inside the loop."""

    def __init__(self, ours: Seq2Seq):
        super().__init__()
        self.m = ours  # embeddings, attention, decoder and readout are shared
        c = ours.config
        self.encoder = nn.GRU(c.embed_dim, c.hidden, batch_first=True, bidirectional=True)
        fwd, bwd = ours.encoder.layers[0]
        with torch.no_grad():
            for name, value in fwd.named_parameters():
                getattr(self.encoder, name).copy_(value)
                getattr(self.encoder, f"{name}_reverse").copy_(bwd.get_parameter(name))

    def forward(self, source, lengths, target_in):
        m, dec = self.m, self.m.decoder
        packed = pack_padded_sequence(
            m.drop(m.source_embed(source)), lengths, batch_first=True, enforce_sorted=False
        )
        out, final = self.encoder(packed)
        keys, _ = pad_packed_sequence(out, batch_first=True, total_length=source.shape[1])
        mask = (torch.arange(source.shape[1])[None] < lengths[:, None]).unsqueeze(1)
        s = torch.tanh(dec.bridge(torch.cat([final[0], final[1]], -1))).unsqueeze(0)
        x = m.drop(m.target_embed(target_in))
        logits = []
        for t in range(target_in.shape[1]):
            query = dec.score.query_proj(s[-1]).unsqueeze(1)  # (b, 1, a)
            e = torch.tanh(query.unsqueeze(2) + dec.score.key_proj(keys).unsqueeze(1)) @ dec.score.v
            e = e.masked_fill(~mask, float("-inf"))  # (b, 1, j)
            context = torch.bmm(torch.softmax(e, -1), keys)  # (b, 1, d_enc)
            out, s = dec.rnn(torch.cat([x[:, t : t + 1], context], -1), s)
            r = dec.maxout(m.drop(torch.cat([out, context, x[:, t : t + 1]], -1)))
            logits.append(m.output(m.drop(r.view(*r.shape[:-1], -1, 2).amax(-1))))
        return torch.cat(logits, 1)


def experiments(budget: str) -> list[Experiment]:
    repeats = 15 if budget == "full" else 2
    return [
        Experiment(name, "throughput", {**dict(zip(KEYS, sizes, strict=True)), "repeats": repeats})
        for name, sizes in SIZES[budget].items()
    ]


def worker(p: dict, ctx) -> dict:
    hidden, v_tgt = p["hidden"], p["target_vocab"]
    torch.manual_seed(0)
    config = bahdanau(hidden=hidden, attn_hidden=hidden, embed_dim=hidden // 2)
    ours = Seq2Seq(config, p["source_vocab"], v_tgt)
    plain = PlainBahdanau(ours)
    source, lengths, target = C.padded_batch(*(p[k] for k in KEYS[:5]))
    target_in, target_out = target[:, :-1], target[:, 1:]
    ours.eval()
    with torch.no_grad():  # same weights, same function
        logits = ours(source, lengths, target_in).logits
        torch.testing.assert_close(plain(source, lengths, target_in), logits, rtol=1e-4, atol=1e-5)
    ours.train()
    opt = torch.optim.AdamW([*ours.parameters(), *plain.encoder.parameters()], lr=1e-4)

    def step(logits_of):
        def loss():
            return F.cross_entropy(logits_of().reshape(-1, v_tgt), target_out.reshape(-1))

        return lambda: C.optimizer_step(loss, opt)

    builders = {
        "attnzoo": step(lambda: ours(source, lengths, target_in).logits),
        "plain": step(lambda: plain(source, lengths, target_in)),
    }
    impls = C.time_steps(builders, repeats=p["repeats"], warmup=2, reference={"attnzoo": "plain"})
    for impl in impls.values():
        impl["tokens_per_s"] = p["batch"] * p["target_len"] / impl["ms"]["median"] * 1e3
    return {"impls": impls, "speedup": impls["attnzoo"].pop("ratio")}


TARGETS = targets(
    "docs/seq2seq.md's target before the one driver",
    *((f"training tokens/s vs plain ({i})", i, "speedup.median", ">=", 2.0) for i in SIZES["full"]),
)
COLUMNS = [("config", "id"), ("batch", "params.batch"), ("source length", "params.source_len")]
COLUMNS += [("target length", "params.target_len"), ("hidden", "params.hidden")]
COLUMNS += [("target vocabulary", "params.target_vocab")]
COLUMNS += [("attnzoo tokens/s", "impls.attnzoo.tokens_per_s", 0)]
COLUMNS += [("plain tokens/s", "impls.plain.tokens_per_s", 0)]
COLUMNS += [("speedup: median (per-round range)", "speedup", 2, "range")]
BENCH = Bench("seq2seq_throughput", __file__, experiments, worker, TARGETS,
              [Table("throughput", COLUMNS, ["throughput"])], threads=2,
              jobs={"full": 1, "smoke": 2}, method=METHOD)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
