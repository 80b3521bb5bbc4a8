"""Transformer throughput: attnzoo's Transformer against `torch.nn.Transformer` and
x-transformers' `XTransformer` at one configuration, and cached against uncached decoding.

1. Training target tokens/s (forward, cross-entropy, backward, AdamW step) at d_model 256,
   4 heads, 3 + 3 layers, d_ff 1024, batch 32, source and target length 64, one vocabulary,
   fp32, sources padded to random lengths. attnzoo's model is loaded from the
   nn.Transformer's weights (`Transformer.from_torch`) and checked to give the same loss, so
   those two compute one function; x-transformers has the same sizes and its own defaults
   otherwise (GELU feed-forward, no q/k/v biases, learned positions). The target rows use
   dropout 0 (the only setting where attnzoo and nn.Transformer compute one function: each
   library puts dropout in different places); a dropout 0.1 row, each library at its own
   placement, is reported beside them.
2. attnzoo under `torch.autocast("cpu", dtype=torch.bfloat16)` against nn.Transformer fp32.
3. Greedy decoding of 128 tokens with key/value caches against recomputing the prefix at every
   step, batch 1 and 32, same model, identical tokens checked.

Every comparison is timed interleaved in one process (benchmarks/_common.py).

    python benchmarks/bench_transformer.py [--quick] [--threads N] [--out PATH]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, median, print_table, time_interleaved, write_json
from attnzoo.core import sinusoidal_encoding
from attnzoo.decoding import greedy
from attnzoo.models.transformer import Transformer

RESULTS = Path(__file__).parent / "results" / "transformer.json"

FULL = dict(d_model=256, heads=4, layers=3, d_ff=1024, batch=32, length=64, vocab=1000)
QUICK = dict(d_model=32, heads=4, layers=1, d_ff=64, batch=4, length=8, vocab=50)


class TorchSeq2Seq(nn.Module):
    """nn.Transformer with embeddings scaled by sqrt(d_model), sinusoidal positions and a
    pre-softmax projection: the same model as attnzoo's (sec. 3.4, 3.5)."""

    def __init__(self, c: dict, dropout: float):
        super().__init__()
        d, v = c["d_model"], c["vocab"]
        self.d = d
        self.transformer = nn.Transformer(
            d,
            c["heads"],
            c["layers"],
            c["layers"],
            c["d_ff"],
            dropout=dropout,
            batch_first=True,
        )
        self.source_embed, self.target_embed = nn.Embedding(v, d), nn.Embedding(v, d)
        self.output = nn.Linear(d, v)
        self.drop = nn.Dropout(dropout)

    def embed(self, emb: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        pe = sinusoidal_encoding(ids.shape[1], self.d, device=ids.device)  # (t, d)
        return self.drop(emb(ids) * math.sqrt(self.d) + pe)

    def forward(self, source, lengths, target_in):
        positions = torch.arange(source.shape[1], device=source.device)  # (j,)
        pad = positions[None, :] >= lengths[:, None]  # (b, j), True = ignore
        t = target_in.shape[1]
        hidden = self.transformer(
            self.embed(self.source_embed, source),
            self.embed(self.target_embed, target_in),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(t, device=source.device),
            tgt_is_causal=True,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
        )
        return self.output(hidden)  # (b, t, V)


def make_batch(c: dict, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, n, v = c["batch"], c["length"], c["vocab"]
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g)
    lengths[0] = n
    source = torch.randint(4, v, (b, n), generator=g)
    source[torch.arange(n)[None] >= lengths[:, None]] = 0
    target = torch.randint(4, v, (b, n + 1), generator=g)
    return source, lengths, target  # target[:, :-1] in, target[:, 1:] out


def build_models(c: dict, dropout: float):
    torch.manual_seed(0)
    plain = TorchSeq2Seq(c, dropout)
    ours = Transformer.from_torch(
        plain.transformer, plain.source_embed, plain.target_embed, plain.output
    )
    models = {"attnzoo": ours, "torch": plain}
    try:
        from x_transformers import XTransformer
    except ImportError:  # optional: `pip install x-transformers`
        return models, "x_transformers not installed"
    models["x_transformers"] = XTransformer(
        dim=c["d_model"],
        enc_num_tokens=c["vocab"],
        enc_depth=c["layers"],
        enc_heads=c["heads"],
        enc_attn_dim_head=c["d_model"] // c["heads"],
        enc_max_seq_len=c["length"],
        enc_pre_norm=False,
        enc_attn_flash=True,
        enc_attn_dropout=dropout,
        enc_ff_dropout=dropout,
        enc_ff_mult=c["d_ff"] // c["d_model"],
        dec_num_tokens=c["vocab"],
        dec_depth=c["layers"],
        dec_heads=c["heads"],
        dec_attn_dim_head=c["d_model"] // c["heads"],
        dec_max_seq_len=c["length"] + 1,
        dec_pre_norm=False,
        dec_attn_flash=True,
        dec_attn_dropout=dropout,
        dec_ff_dropout=dropout,
        dec_ff_mult=c["d_ff"] // c["d_model"],
        ignore_index=0,
    )
    return models, None


def training(c: dict, dropout: float, repeats: int) -> tuple[dict, str | None]:
    """Median training-step time of each implementation (and attnzoo in bf16 autocast)."""
    models, missing = build_models(c, dropout)
    source, lengths, target = make_batch(c)
    target_in, target_out = target[:, :-1], target[:, 1:]
    v = c["vocab"]

    def loss_of(name, model):
        if name == "x_transformers":
            mask = (
                torch.arange(source.shape[1], device=source.device)[None] < lengths[:, None]
            )  # True = real
            return model(source, target, mask=mask)
        logits = model(source, lengths, target_in)
        logits = logits.logits if name == "attnzoo" else logits
        return F.cross_entropy(logits.reshape(-1, v).float(), target_out.reshape(-1))

    with torch.no_grad():  # attnzoo and nn.Transformer: one function, same weights
        models["attnzoo"].eval()
        models["torch"].eval()
        a, b = loss_of("attnzoo", models["attnzoo"]), loss_of("torch", models["torch"])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        loss_difference = float((a - b).abs())

    def step(name, model, optimizer, bf16=False):
        model.train()

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_of(name, model)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        return run

    fns = {}
    for name, model in models.items():
        fns[name] = step(name, model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    if dropout == 0.0:
        fns["attnzoo_bf16"] = step(
            "attnzoo",
            models["attnzoo"],
            torch.optim.AdamW(models["attnzoo"].parameters(), lr=1e-4),
            bf16=True,
        )
    times = time_interleaved(fns, repeats=repeats, warmup=2)
    tokens = c["batch"] * c["length"]
    row = {"dropout": dropout, **{k: c[k] for k in FULL}, "loss_difference": loss_difference}
    for name, ts in times.items():
        row[f"{name}_ms"] = median(ts) * 1e3
        row[f"{name}_tokens_per_s"] = tokens / median(ts)
    return row, missing


def decoding(c: dict, batch: int, steps: int, repeats: int) -> dict:
    """Greedy decoding of `steps` tokens with and without key/value caches."""
    models, _ = build_models(c, 0.0)
    model = models["attnzoo"].eval()
    source, lengths, _ = make_batch({**c, "batch": batch}, seed=1)
    with torch.no_grad():
        memory = model.encode(source, lengths)
    # eos=-1 never matches, so both run exactly `steps` steps
    kwargs = dict(bos=1, eos=-1, max_len=steps, device=torch.device("cpu"))

    def run(cache):
        return lambda: greedy(model.decode_step, model.start(memory, cache=cache), batch, **kwargs)

    cached, uncached = run(True)(), run(False)()
    identical = bool(torch.equal(cached, uncached))
    times = time_interleaved({"cached": run(True), "uncached": run(False)}, repeats=repeats)
    cached_s, uncached_s = median(times["cached"]), median(times["uncached"])
    return {
        "batch": batch,
        "steps": steps,
        "cached_ms": cached_s * 1e3,
        "uncached_ms": uncached_s * 1e3,
        "speedup": uncached_s / cached_s,
        "identical_tokens": identical,
    }


def target(name: str, value: float | None, wanted: float) -> dict:
    return {
        "name": name,
        "value": value,
        "target": f">= {wanted}x",
        "met": None if value is None else value >= wanted,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=0, help="0: 7 (training), 3 (decoding)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    c = QUICK if args.quick else FULL
    steps = 8 if args.quick else 128
    train_repeats = args.repeats or (2 if args.quick else 7)
    decode_repeats = args.repeats or (2 if args.quick else 3)

    train_rows, missing = [], None
    for dropout in (0.0, 0.1):
        row, missing = training(c, dropout, train_repeats)
        train_rows.append(row)
    decode_rows = [decoding(c, b, steps, decode_repeats) for b in (1, 32)]

    fp32 = train_rows[0]
    xt = fp32.get("x_transformers_tokens_per_s")
    base = fp32["torch_tokens_per_s"]
    ours = fp32["attnzoo_tokens_per_s"]
    bf16 = fp32["attnzoo_bf16_tokens_per_s"]
    targets = [
        target("training tokens/s vs nn.Transformer (fp32)", ours / base, 1.0),
        target("training tokens/s vs x-transformers (fp32)", xt and ours / xt, 1.0),
        target("bf16 autocast training tokens/s vs nn.Transformer fp32", bf16 / base, 2.0),
        target("cached vs uncached greedy decoding, batch 1", decode_rows[0]["speedup"], 4.0),
        target("cached vs uncached greedy decoding, batch 32", decode_rows[1]["speedup"], 15.0),
    ]
    payload = {
        "machine": machine_info(quick=args.quick, x_transformers=missing or "installed"),
        "config": c,
        "rows": [{"kind": "training", **r} for r in train_rows]
        + [{"kind": "decoding", **r} for r in decode_rows],
        "targets": targets,
    }
    write_json(args.out, payload)
    names = ["attnzoo", "torch", "x_transformers", "attnzoo_bf16"]
    print_table(
        "Transformer training, target tokens/s",
        ["dropout", *names],
        [[r["dropout"], *(r.get(f"{n}_tokens_per_s") for n in names)] for r in train_rows],
    )
    print_table(
        f"greedy decoding, {steps} tokens",
        ["batch", "cached ms", "uncached ms", "speedup", "identical"],
        [
            [r["batch"], r["cached_ms"], r["uncached_ms"], r["speedup"], r["identical_tokens"]]
            for r in decode_rows
        ],
    )
    print_table(
        "targets",
        ["target", "value", "wanted", "met"],
        [[t["name"], t["value"], t["target"], t["met"]] for t in targets],
    )


if __name__ == "__main__":
    main()
