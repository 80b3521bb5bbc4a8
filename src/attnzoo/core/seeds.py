"""Seeds of random streams per process: one place for the training loop (dropout) and the
tasks (sampling noise), so that the ranks of a torchrun job draw streams of their own."""

from __future__ import annotations


def sampling_seed(base: int, rank: int) -> int:
    """The seed of a training step's random stream (a task's `loss`: glimpse locations,
    sampled tours, pulls; the loop's dropout) on process `rank` of a torchrun job: `base`
    itself on rank 0, so a one-process run draws what it always drew, and a stream of its own
    on every other rank (seeded alike, two ranks drew the same noise for their rows: global
    rows 2k and 2k + 1 shared one draw, half the draws of a one-process run lost)."""
    return base + rank * _RANK_STRIDE


# odd, and each multiple by a rank below 8 at least 3.8e8 from 0 mod 2**32: ranks' seeds differ
# in the low 32 bits the CPU generator reads for any base below that
_RANK_STRIDE = 2654435761
