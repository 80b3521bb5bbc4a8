"""Training throughput (target tokens/s) of attnzoo's Bahdanau model against the same model
written plainly, the way the PyTorch seq2seq tutorial writes it: a decoder loop that recomputes
the key projection U_a h at every step, broadcasts tanh(W_a s + U_a h), and applies the readout
and output layer inside the loop.

Both models hold identical weights (the plain one is loaded from ours and checked to give the
same logits), run on the same batches, and are timed interleaved in one process.

    python benchmarks/bench_seq2seq_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, median, print_table, time_interleaved, write_json
from attnzoo.models.seq2seq import Seq2Seq, bahdanau

RESULTS = Path(__file__).parent / "results" / "seq2seq_throughput.json"


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


def make_batch(b, j, t, v_src, v_tgt, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(j // 2, j + 1, (b,), generator=g)
    lengths[0] = j
    source = torch.randint(4, v_src, (b, j), generator=g)
    source[torch.arange(j)[None] >= lengths[:, None]] = 0
    target = torch.randint(4, v_tgt, (b, t + 1), generator=g)
    return source, lengths, target[:, :-1], target[:, 1:]


def measure(name, b, j, t, v_src, v_tgt, hidden, repeats):
    torch.manual_seed(0)
    ours = Seq2Seq(bahdanau(hidden=hidden, attn_hidden=hidden, embed_dim=hidden // 2), v_src, v_tgt)
    plain = PlainBahdanau(ours)
    source, lengths, target_in, target_out = make_batch(b, j, t, v_src, v_tgt, 0)
    ours.eval()
    with torch.no_grad():  # same weights, same function
        torch.testing.assert_close(
            plain(source, lengths, target_in),
            ours(source, lengths, target_in).logits,
            rtol=1e-4,
            atol=1e-5,
        )
    ours.train()
    opt = torch.optim.AdamW([*ours.parameters(), *plain.encoder.parameters()], lr=1e-4)

    def step(model, logits_of):
        def run():
            loss = F.cross_entropy(logits_of(model).reshape(-1, v_tgt), target_out.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return run

    times = time_interleaved(
        {
            "attnzoo": step(ours, lambda m: m(source, lengths, target_in).logits),
            "plain": step(plain, lambda m: m(source, lengths, target_in)),
        },
        repeats=repeats,
        warmup=2,
    )
    tokens = b * t
    row = {
        "config": name,
        "batch": b,
        "source_len": j,
        "target_len": t,
        "hidden": hidden,
        "target_vocab": v_tgt,
    }
    for impl, ts in times.items():
        row[f"{impl}_ms"] = median(ts) * 1e3
        row[f"{impl}_tokens_per_s"] = tokens / median(ts)
    row["speedup"] = row["plain_ms"] / row["attnzoo_ms"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    configs = [
        ("dates-sized", 64, 30, 11, 60, 20, 128),
        ("kjv2web-sized", 64, 45, 50, 8000, 8000, 256),
    ]
    if args.quick:
        configs = [("quick", 4, 9, 5, 20, 15, 16)]
    rows = [measure(*c, repeats=3 if args.quick else 15) for c in configs]
    target = 2.0
    payload = {
        "machine": machine_info(),
        "rows": rows,
        "targets": [
            {
                "name": f"training tokens/s vs plain ({r['config']})",
                "value": r["speedup"],
                "target": f">= {target}x",
                "met": r["speedup"] >= target,
            }
            for r in rows
        ],
    }
    write_json(args.out, payload)
    print_table(
        "seq2seq training throughput (target tokens/s)",
        ["config", "attnzoo tok/s", "plain tok/s", "speedup"],
        [
            [r["config"], r["attnzoo_tokens_per_s"], r["plain_tokens_per_s"], r["speedup"]]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
