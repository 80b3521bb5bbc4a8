"""attnzoo: every classic attention mechanism as a composable, tested PyTorch module, and every
classic attention model trained end to end on built-in data."""

from attnzoo.core import *  # noqa: F403
from attnzoo.core import __all__ as _core_all

__version__ = "0.1.0"
__all__ = [*_core_all, "__version__"]
