"""Independent float64 references, written as plainly as possible (einsum and loops), for the
tests to compare the library against. Nothing here imports attnzoo's kernels."""

import math

import torch


def ref_logits(name, q, k, params=None):
    """(..., i, d) x (..., j, d) -> (..., i, j) in float64, by the papers' formulas."""
    q, k = q.double(), k.double()
    if name == "dot":
        return torch.einsum("...id,...jd->...ij", q, k)
    if name == "scaled_dot":
        return torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if name == "general":
        return torch.einsum("...id,de,...je->...ij", q, params["weight"].double(), k)
    if name == "cosine":
        beta = params.get("beta", 1.0) if params else 1.0
        if isinstance(beta, torch.Tensor):  # per query: (..., i)
            beta = beta.double()[..., None]
        qn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        kn = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        return beta * torch.einsum("...id,...jd->...ij", qn, kn)
    if name == "additive":
        wq, wk, v = (params[n].double() for n in ("wq", "wk", "v"))
        a = torch.einsum("...id,hd->...ih", q, wq)
        if params.get("bq") is not None:  # Additive(bias=True): inside the tanh, query side
            a = a + params["bq"].double()
        b = torch.einsum("...jd,hd->...jh", k, wk)
        out = torch.zeros(*a.shape[:-1], b.shape[-2], dtype=torch.float64)
        for j in range(b.shape[-2]):  # a loop over keys, unlike the library's blocks
            out[..., j] = torch.tanh(a + b[..., j : j + 1, :]) @ v
        return out
    if name == "location":
        w, bias = params["weight"].double(), params["bias"].double()
        return (torch.einsum("...id,md->...im", q, w) + bias)[..., : k.shape[-2]]
    raise ValueError(name)


def ref_attention(logits, value, mask=None):
    """Loop over rows: softmax over allowed keys, zero for a row with none."""
    logits, value = logits.double(), value.double()
    if mask is not None:
        mask = mask.expand(logits.shape)
    weights = logits.new_zeros(logits.shape)  # contiguous, whatever the logits' strides
    flat_l = logits.reshape(-1, logits.shape[-1])
    flat_w = weights.view(-1, logits.shape[-1])
    flat_m = None if mask is None else mask.reshape(-1, logits.shape[-1])
    for r in range(flat_l.shape[0]):
        allowed = torch.ones(flat_l.shape[1], dtype=torch.bool) if flat_m is None else flat_m[r]
        if allowed.any():
            e = torch.exp(flat_l[r][allowed] - flat_l[r][allowed].max())
            flat_w[r][allowed] = e / e.sum()
    return weights @ value, weights
