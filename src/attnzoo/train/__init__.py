"""attnzoo.train: the one training loop, checkpoints and torch.distributed set-up."""

from attnzoo.train.checkpoint import latest_checkpoint, load_weights, save_checkpoint
from attnzoo.train.loop import TrainConfig, train

__all__ = ["TrainConfig", "latest_checkpoint", "load_weights", "save_checkpoint", "train"]
