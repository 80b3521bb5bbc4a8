"""attnzoo.core: attention primitives, tensors in and out.

Dimension legend (used in every shape comment of the package): b = batch, h = heads,
i = query position (query_len), j = key position (key_len), d = features (d_model, d_head,
d_hidden). Shapes are batch-first; masks are boolean, True = may attend.
"""

from attnzoo.core import scores
from attnzoo.core.additive import additive_attention, additive_logits
from attnzoo.core.attention import attention, prepare_key
from attnzoo.core.hard import (
    GaussianPolicy,
    GaussianSample,
    MovingAverageBaseline,
    ReinforceLoss,
    gaussian_log_prob,
    gaussian_sample,
    hybrid_loss,
    lambda_returns,
    reinforce_loss,
    rewards_to_go,
)
from attnzoo.core.local import LocalAttention
from attnzoo.core.masks import causal_mask, combine_masks, padding_mask, window_mask
from attnzoo.core.mha import CacheError, KVCache, MultiHeadAttention
from attnzoo.core.normalisers import (
    HardSample,
    gumbel_softmax_st,
    hard_argmax,
    masked_softmax,
    sample_hard,
)
from attnzoo.core.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from attnzoo.core.types import AttentionOutput, PreparedKey

__all__ = [
    "AttentionOutput",
    "CacheError",
    "GaussianPolicy",
    "GaussianSample",
    "HardSample",
    "KVCache",
    "LearnedPositionalEmbedding",
    "LocalAttention",
    "MovingAverageBaseline",
    "MultiHeadAttention",
    "PreparedKey",
    "ReinforceLoss",
    "SinusoidalPositionalEncoding",
    "additive_attention",
    "additive_logits",
    "attention",
    "causal_mask",
    "combine_masks",
    "gaussian_log_prob",
    "gaussian_sample",
    "gumbel_softmax_st",
    "hard_argmax",
    "hybrid_loss",
    "lambda_returns",
    "masked_softmax",
    "padding_mask",
    "prepare_key",
    "reinforce_loss",
    "rewards_to_go",
    "sample_hard",
    "scores",
    "sinusoidal_encoding",
    "window_mask",
]
