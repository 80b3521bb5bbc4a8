"""Transformer throughput: attnzoo's Transformer against `torch.nn.Transformer` and
x-transformers' `XTransformer` at one configuration, and cached against uncached decoding.

1. Training target tokens/s (forward, cross-entropy, backward, AdamW step) at FULL's sizes,
   fp32, sources padded to random lengths. attnzoo's model is loaded from the nn.Transformer's
   weights (`Transformer.from_torch`) and checked to give the same loss; x-transformers has the
   same sizes and its own defaults otherwise (GELU, no q/k/v biases, learned positions). The
   target experiment uses dropout 0, where attnzoo and nn.Transformer compute one function;
   dropout 0.1, each library at its own placement, is reported beside it.
   The wrapper's embeddings start N(0, d_model^-0.5) as attnzoo's own do: at nn.Embedding's
   N(0, 1), scaled by sqrt(d_model) = 16, the first layer's softmax saturated and its backward
   filled with subnormal floats, which made the fp32 q/k/v matrix products ~3x slower (16 ms
   against 5.5 ms, profiled) and put x-transformers (its own init) 9% ahead.
2. attnzoo under `torch.autocast("cpu", dtype=torch.bfloat16)` against nn.Transformer fp32,
   on a CPU with bf16 matrix units (flag amx_bf16 or avx512_bf16); elsewhere bf16 is emulated
   (measured 0.30x fp32 on an AVX-512 CPU without them) and the row says it was not measured.
3. Greedy decoding with key/value caches against recomputing the prefix at every step, batch 1
   and 32, same model, identical tokens checked.

    python benchmarks/bench_transformer.py [--budget smoke]    # results/transformer.json
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import _common as C
from _common import Bench, Experiment, Table, drive, targets
from attnzoo.core import sinusoidal_encoding
from attnzoo.decoding import greedy
from attnzoo.models.transformer import Transformer

FULL = dict(d_model=256, heads=4, layers=3, d_ff=1024, batch=32, length=64, vocab=1000)
SMOKE = dict(d_model=32, heads=4, layers=1, d_ff=64, batch=4, length=8, vocab=50)
METHOD = {
    "ms": "per-step milliseconds over the repeats (median, quartiles, range); the "
    "implementations of one experiment timed in one worker process, interleaved round by round",
    "tokens_per_s": "batch * target length / median step time",
    "vs_*": "attnzoo's tokens/s over the other's (its time over attnzoo's), per round",
    "speedup": "uncached decoding time over cached, per round",
}


class TorchSeq2Seq(nn.Module):
    """nn.Transformer with embeddings scaled by sqrt(d_model), sinusoidal positions and a
    pre-softmax projection: the same model as attnzoo's (sec. 3.4, 3.5)."""

    def __init__(self, c: dict, dropout: float):
        super().__init__()
        d, v = c["d_model"], c["vocab"]
        self.d = d
        layers = (c["layers"], c["layers"], c["d_ff"])
        self.transformer = nn.Transformer(d, c["heads"], *layers, dropout, batch_first=True)
        self.source_embed, self.target_embed = nn.Embedding(v, d), nn.Embedding(v, d)
        for emb in (self.source_embed, self.target_embed):  # attnzoo's init (see the top)
            nn.init.normal_(emb.weight, std=d**-0.5)
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
    d, heads, layers = c["d_model"], c["heads"], c["layers"]
    side = dict(depth=layers, heads=heads, attn_dim_head=d // heads, pre_norm=False)
    side |= dict(attn_flash=True, attn_dropout=dropout, ff_dropout=dropout, ff_mult=c["d_ff"] // d)
    side |= dict(num_tokens=c["vocab"])
    lengths = {"enc_max_seq_len": c["length"], "dec_max_seq_len": c["length"] + 1}
    sides = {f"{prefix}_{k}": v for prefix in ("enc", "dec") for k, v in side.items()}
    models["x_transformers"] = XTransformer(dim=d, **sides, **lengths, ignore_index=0)
    return models, None


def experiments(budget: str) -> list[Experiment]:
    c, full = (FULL, True) if budget == "full" else (SMOKE, False)
    train = {"kind": "training", **c, "repeats": 7 if full else 2}
    decode = {"kind": "decoding", **c, "steps": 128 if full else 8, "repeats": 3 if full else 2}
    return [
        Experiment("training-dropout0", "training", {**train, "dropout": 0.0}),
        Experiment("training-dropout0.1", "training", {**train, "dropout": 0.1}),
        Experiment("training-bf16", "autocast", {**train, "dropout": 0.0, "bf16": True}),
        *(
            Experiment(f"decoding-batch{b}", "decoding", {**decode, "decode_batch": b})
            for b in (1, 32)
        ),
    ]


BF16_UNITS = ("amx_bf16", "avx512_bf16")


def training(c: dict) -> dict:
    """Training-step times of each implementation in fp32; with `bf16`, attnzoo under bf16
    autocast against nn.Transformer in fp32."""
    if c.get("bf16") and not C.cpu_flags() & set(BF16_UNITS):
        return {"not_measured": f"none of the bf16 matrix units {BF16_UNITS} in the CPU flags"}
    models, missing = build_models(c, c["dropout"])
    n, v = c["length"], c["vocab"]
    source, lengths, target = C.padded_batch(c["batch"], n, n, v, v)
    target_in, target_out = target[:, :-1], target[:, 1:]

    def loss_of(name, model):
        if name == "x_transformers":
            mask = torch.arange(source.shape[1])[None] < lengths[:, None]  # True = real
            return model(source, target, mask=mask)
        logits = model(source, lengths, target_in)
        logits = logits.logits if name == "attnzoo" else logits
        return F.cross_entropy(logits.reshape(-1, c["vocab"]).float(), target_out.reshape(-1))

    with torch.no_grad():  # attnzoo and nn.Transformer: one function, same weights
        a, b = (loss_of(n, models[n].eval()) for n in ("attnzoo", "torch"))
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    def step(name, model, bf16=False):
        def loss():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                return loss_of(name, model)

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return lambda: (model.train(), C.optimizer_step(loss, optimizer))[1]

    if c.get("bf16"):
        builders = {"torch": step("torch", models["torch"])}
        builders["attnzoo_bf16"] = step("attnzoo", models["attnzoo"], bf16=True)
    else:
        builders = {name: step(name, model) for name, model in models.items()}
    impls = C.time_steps(builders, repeats=c["repeats"], warmup=2)
    for impl in impls.values():
        impl["tokens_per_s"] = c["batch"] * c["length"] / impl["ms"]["median"] * 1e3
    times = {name: impl["times_ms"] for name, impl in impls.items()}
    if c.get("bf16"):
        ratios = {"bf16_vs_torch": C.per_round(times["torch"], times["attnzoo_bf16"])}
    else:
        others = [n for n in times if n != "attnzoo"]
        ratios = {f"vs_{n}": C.per_round(times[n], times["attnzoo"]) for n in others}
    return {
        "impls": impls,
        **ratios,
        "loss_difference": float((a - b).abs()),
        **({"x_transformers": missing} if missing else {}),
    }


def decoding(c: dict) -> dict:
    """Greedy decoding of `steps` tokens with and without key/value caches."""
    model = build_models(c, 0.0)[0]["attnzoo"].eval()
    batch, n, v = c["decode_batch"], c["length"], c["vocab"]
    source, lengths, _ = C.padded_batch(batch, n, n, v, v, seed=1)
    with torch.no_grad():
        memory = model.encode(source, lengths)
    # eos=-1 never matches, so both run exactly `steps` steps
    kwargs = dict(bos=1, eos=-1, max_len=c["steps"], device=torch.device("cpu"))

    def run(cache):
        return lambda: greedy(model.decode_step, model.start(memory, cache=cache), batch, **kwargs)

    identical = torch.equal(run(True)(), run(False)())
    impls = C.time_steps(
        {"cached": lambda: run(True), "uncached": lambda: run(False)},
        repeats=c["repeats"],
        warmup=0,
        reference={"cached": "uncached"},
    )
    speedup = impls["cached"].pop("ratio")
    return {"impls": impls, "speedup": speedup, "identical_tokens": float(identical)}


def worker(params: dict, ctx) -> dict:
    return (training if params["kind"] == "training" else decoding)(params)


T0 = "training-dropout0"
TARGETS = targets(
    "docs/transformer.md's targets before the one driver",
    ("training tokens/s vs nn.Transformer (fp32)", T0, "vs_torch.median", ">=", 1.0),
    ("training tokens/s vs x-transformers (fp32)", T0, "vs_x_transformers.median", ">=", 1.0),
    ("bf16 autocast training tokens/s vs nn.Transformer fp32", "training-bf16",
     "bf16_vs_torch.median", ">=", 2.0),
    *((f"cached vs uncached greedy decoding, batch {b}", f"decoding-batch{b}", "speedup.median",
       ">=", wanted) for b, wanted in ((1, 4.0), (32, 15.0))),
)  # fmt: skip
TRAINING = [("dropout", "params.dropout"), ("attnzoo tokens/s", "impls.attnzoo.tokens_per_s", 0)]
TRAINING += [("nn.Transformer tokens/s", "impls.torch.tokens_per_s", 0)]
TRAINING += [("x-transformers tokens/s", "impls.x_transformers.tokens_per_s", 0)]
TRAINING += [("attnzoo / nn.Transformer: median (per-round range)", "vs_torch", 3, "range")]
TRAINING += [("attnzoo / x-transformers", "vs_x_transformers", 3, "range")]
TRAINING += [("loss difference", "loss_difference", 2, "", True)]
AUTOCAST = [("attnzoo bf16 tokens/s", "impls.attnzoo_bf16.tokens_per_s", 0)]
AUTOCAST += [("nn.Transformer fp32 tokens/s", "impls.torch.tokens_per_s", 0)]
AUTOCAST += [("bf16 / fp32: median (per-round range)", "bf16_vs_torch", 2, "range")]
AUTOCAST += [("not measured", "not_measured")]
DECODING = [("batch", "params.decode_batch"), ("tokens", "params.steps")]
DECODING += [("cached ms", "impls.cached.ms.median", 1)]
DECODING += [("uncached ms", "impls.uncached.ms.median", 1)]
DECODING += [("speedup: median (per-round range)", "speedup", 2, "range")]
DECODING += [("identical tokens (1 = yes)", "identical_tokens", 0)]
TABLES = [Table("training", TRAINING, ["training"]), Table("autocast", AUTOCAST, ["autocast"])]
TABLES += [Table("decoding", DECODING, ["decoding"])]
BENCH = Bench("transformer", __file__, experiments, worker, TARGETS, TABLES, threads=1,
              jobs={"full": 1, "smoke": 2}, method=METHOD)  # fmt: skip

if __name__ == "__main__":
    drive(BENCH)
