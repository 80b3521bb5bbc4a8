"""NTM addressing, reading and writing (Graves et al. 2014, "Neural Turing Machines", sec. 3).

Every function is batched over (batch, heads) with no Python loop over either. Shapes use
b = batch, h = heads, n = memory rows (N), m = memory columns (M), s = allowed shifts.

Addressing of one head at step t (sec. 3.3, Fig. 2), from the head's emitted key k_t, key
strength beta_t, interpolation gate g_t, shift weighting s_t, sharpening gamma_t and its
previous weighting w_{t-1}:

    w^c_t(i) = softmax_i(beta_t K[k_t, M_t(i)])          content addressing (eq. 5-6),
    w^g_t    = g_t w^c_t + (1 - g_t) w_{t-1}             interpolation (eq. 7),
    w~_t(i)  = sum_j w^g_t(j) s_t(i - j)  (mod N)        circular convolution (eq. 8),
    w_t(i)   = w~_t(i)^gamma_t / sum_j w~_t(j)^gamma_t   sharpening (eq. 9).

Reading (eq. 2) and writing with erase then add (eq. 3-4):

    r_t = sum_i w_t(i) M_t(i),
    M~_t(i) = M_{t-1}(i) [1 - w_t(i) e_t],   M_t(i) = M~_t(i) + w_t(i) a_t.

Note:
    Sharpening is computed in log space, w_t = softmax(gamma_t log(w~_t + eps)): the same
    function as eq. 9 up to `eps`, but a weighting that underflows to exactly 0 gives finite
    gradients (d w^gamma / d gamma = w^gamma log w is 0 * -inf at w = 0 in eq. 9).
    With several write heads the erases multiply and the adds sum (sec. 3.2: "the order in
    which the adds are performed by multiple heads is irrelevant").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnzoo.core.checks import fail
from attnzoo.core.normalisers import masked_softmax
from attnzoo.core.scores import Cosine

SHARPEN_EPS = 1e-12
_COSINE = Cosine()


def content_addressing(memory: torch.Tensor, key: torch.Tensor, beta: torch.Tensor):
    """Eq. 5-6: w^c(i) = softmax_i(beta K[k, M(i)]) with the cosine similarity K.

    Args:
        memory: (batch, N, M); key: (batch, heads, M); beta: (batch, heads), >= 0.
    Returns:
        (batch, heads, N) weights; an all-zero memory gives the uniform weighting.
    """
    logits = _COSINE.logits(key, _COSINE.prepare_key(memory), beta)  # (b, h, n)
    return masked_softmax(logits)


def interpolate(content: torch.Tensor, previous: torch.Tensor, gate: torch.Tensor):
    """Eq. 7: w^g = g w^c + (1 - g) w_{t-1}; content, previous (batch, heads, N), gate
    (batch, heads) in [0, 1]."""
    g = gate.unsqueeze(-1)  # (b, h, 1)
    return g * content + (1 - g) * previous  # (b, h, n)


def shift_offsets(shifts: int) -> list[int]:
    """The allowed integer offsets of `shifts` (odd) shift weights: -r..r with r = shifts // 2."""
    if isinstance(shifts, bool) or not isinstance(shifts, int) or shifts < 1 or shifts % 2 == 0:
        fail("shift_offsets", "shifts", "an odd positive int (offsets -r..r)", shifts)
    r = shifts // 2
    return list(range(-r, r + 1))


def circular_shift(weights: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Eq. 8: w~(i) = sum_j w(j) s(i - j), indices modulo N.

    Args:
        weights: (batch, heads, N).
        shift: (batch, heads, S), S odd; shift[..., k] weighs the offset k - S // 2, so the
            offset +1 moves weight from row j to row j + 1 (mod N).
    Returns:
        (batch, heads, N).
    """
    n, s = weights.shape[-1], shift.shape[-1]
    r = s // 2
    if s % 2 == 0 or r > n:
        fail(
            "circular_shift", "shift", f"an odd number of offsets at most 2 N + 1 = {2 * n + 1}", s
        )
    if r == 0:
        return weights * shift
    padded = torch.cat([weights[..., n - r :], weights, weights[..., :r]], dim=-1)  # (b, h, n+2r)
    # windows[..., i, k] = w(i - r + k) = w(i - o) for the offset o = r - k
    windows = padded.unfold(-1, s, 1)  # (b, h, n, s)
    return (windows @ shift.flip(-1).unsqueeze(-1)).squeeze(-1)  # (b, h, n)


def sharpen(weights: torch.Tensor, gamma: torch.Tensor, eps: float = SHARPEN_EPS):
    """Eq. 9: w(i) = w~(i)^gamma / sum_j w~(j)^gamma, as softmax(gamma log(w~ + eps)).

    Args:
        weights: (batch, heads, N), >= 0; gamma: (batch, heads), >= 1.
    """
    return masked_softmax(gamma.unsqueeze(-1) * torch.log(weights + eps))  # (b, h, n)


class HeadParameters(NamedTuple):
    """One step's squashed head outputs (sec. 3.3): key (batch, heads, M), beta >= 0, gate in
    [0, 1] and gamma >= 1 (batch, heads), shift (batch, heads, S) summing to 1."""

    key: torch.Tensor
    beta: torch.Tensor
    gate: torch.Tensor
    shift: torch.Tensor
    gamma: torch.Tensor


def squash_head(key, beta, gate, shift, gamma) -> HeadParameters:
    """Raw controller outputs -> valid head parameters: the key as emitted (unsquashed),
    beta = softplus, g = sigmoid, s = softmax over the offsets, gamma = 1 + softplus."""
    return HeadParameters(
        key,
        F.softplus(beta),
        torch.sigmoid(gate),
        masked_softmax(shift),
        1 + F.softplus(gamma),
    )


def address(memory: torch.Tensor, head: HeadParameters, previous: torch.Tensor) -> torch.Tensor:
    """Sec. 3.3, Fig. 2: content -> interpolation -> shift -> sharpening.

    Args:
        memory: (batch, N, M); head: squashed `HeadParameters`; previous: (batch, heads, N).
    Returns:
        w_t (batch, heads, N): each row >= 0 and sums to 1.
    """
    w = content_addressing(memory, head.key, head.beta)  # (b, h, n)
    w = interpolate(w, previous, head.gate)  # (b, h, n)
    w = circular_shift(w, head.shift)  # (b, h, n)
    return sharpen(w, head.gamma)  # (b, h, n)


def read(memory: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Eq. 2: r = sum_i w(i) M(i); memory (batch, N, M), weights (batch, heads, N) ->
    (batch, heads, M)."""
    return weights @ memory  # (b, h, m)


def write(
    memory: torch.Tensor, weights: torch.Tensor, erase: torch.Tensor, add: torch.Tensor
) -> torch.Tensor:
    """Eq. 3-4 for every write head at once: erase then add.

    Args:
        memory: (batch, N, M); weights: (batch, heads, N); erase: (batch, heads, M) in [0, 1];
        add: (batch, heads, M).
    Returns:
        the new memory (batch, N, M).
    """
    if weights.shape[1] == 1:
        w, e, a = weights[:, 0, :, None], erase[:, 0, None, :], add[:, 0, None, :]
        return memory * (1 - w * e) + w * a  # (b, n, m)
    keep = (1 - weights.unsqueeze(-1) * erase.unsqueeze(-2)).prod(dim=1)  # (b, n, m)
    return memory * keep + weights.transpose(1, 2) @ add  # (b, n, m)
