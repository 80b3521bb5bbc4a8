"""Prototypical networks (Snell, Swersky & Zemel 2017, arXiv:1703.05175, sec. 2), the baseline
of SNAIL's few-shot experiments ("fewshot" interface, `attnzoo.tasks.glyphs`).

Each class's prototype is the mean embedding of its support examples,
`c_k = 1/|S_k| sum_{x in S_k} f(x)` (eq. 1); a query's class probabilities are a softmax over
the negative squared Euclidean distances to the prototypes,
`p(y = k | x) = softmax_k(-||f(x) - c_k||^2)` (eq. 2). The embedding f is SNAIL's
(`attnzoo.models.snail.ConvEmbedding`: 4 blocks of 64 filters on Omniglot, sec. 3.1).

The softmax over prototypes is attention from the query to the classes; it is returned as the
model's one attention kind for the explorer.

Note:
    The paper trains with more ways than it tests (60-way episodes on Omniglot); here both
    models train on the episodes the task gives (the same for both sides of a comparison).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.core.checks import check_fields, check_image_size, check_size, fail
from attnzoo.core.normalisers import at_least_float32
from attnzoo.models.snail import ConvEmbedding, FewShotOutput, check_episode


@dataclass(frozen=True)
class ProtoNetConfig:
    """Attributes:
    embed_dim: filters of each embedding block.
    embed_blocks: embedding blocks (conv, batch norm, ReLU, 2 x 2 max pool).
    """

    embed_dim: int = 64
    embed_blocks: int = 4

    def __post_init__(self):
        check_fields(self)
        for name in ("embed_dim", "embed_blocks"):
            check_size("ProtoNetConfig", name, getattr(self, name))


def protonet(**overrides) -> ProtoNetConfig:
    """Snell 2017, sec. 3.1: the 4-block, 64-filter embedding."""
    return replace(ProtoNetConfig(), **overrides)


class ProtoNet(nn.Module):
    """Prototypical network classifier (module docstring)."""

    def __init__(
        self,
        config: ProtoNetConfig,
        image_size: tuple[int, int],
        channels: int,
        ways: int,
        shots: int,
    ):
        super().__init__()
        for name, value in (("channels", channels), ("ways", ways), ("shots", shots)):
            check_size("ProtoNet", name, value)
        self.ways, self.shots = ways, shots
        self.image_size, self.channels = check_image_size("ProtoNet", image_size), channels
        self.embed = ConvEmbedding(channels, config.embed_dim, config.embed_blocks, image_size)

    def forward(
        self,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        query: torch.Tensor,
        return_weights: bool = False,
    ) -> FewShotOutput:
        """support (b, N K, c, H, W), support_labels (b, N K), query (b, q, c, H, W) ->
        log_probs (b, q, N)."""
        n = self.ways * self.shots
        check_episode(
            *("ProtoNet", support, support_labels, query, self.channels, self.image_size),
            *(n, self.ways, self),
        )
        one_hot = F.one_hot(support_labels, self.ways)  # (b, n, N)
        counts = one_hot.sum(1)  # (b, N)
        # a class without an example would have the zero vector as its prototype
        if support_labels.device.type != "meta" and not bool(counts.all()):
            episode, label = (counts == 0).nonzero()[0].tolist()
            wanted = f"every label 0..{self.ways - 1} in each episode's support"
            fail("ProtoNet", "support_labels", wanted, f"episode {episode} without {label}")
        q = query.shape[1]
        embedded = self.embed(torch.cat([support, query], 1))  # (b, n + q, E)
        support_x, query_x = embedded.split([n, q], 1)
        one_hot = one_hot.to(support_x.dtype)
        prototypes = one_hot.transpose(1, 2) @ support_x / counts.unsqueeze(-1)  # (b, N, E)
        distances = (query_x.unsqueeze(2) - prototypes.unsqueeze(1)).pow(2).sum(-1)  # (b, q, N)
        log_probs = torch.log_softmax(-at_least_float32(distances), -1)
        named = []
        if return_weights:
            named.append(("query -> prototypes", log_probs.exp().unsqueeze(2).unsqueeze(3)))
        return FewShotOutput(log_probs, named)
