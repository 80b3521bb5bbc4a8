"""attnzoo's attention as Keras 3 layers (torch backend only).

Drop-ins for Keras's own layers, computing what they compute through attnzoo's core:
`Attention`, `AdditiveAttention`, `MultiHeadAttention`; and the layers Keras lacks:
`BahdanauAttention` (the paper's W_a and U_a projections) and `LuongAttention` (general, dot,
location scores). Every layer serialises with `get_config`/`from_config` and saves in the
`.keras` format (registered under the package name "attnzoo").

Keras must run on the torch backend (set `KERAS_BACKEND=torch` before keras is first
imported): the layers are `torch.nn.Module`s whose weights are torch Parameters, and they call
attnzoo's torch kernels directly.
"""

from __future__ import annotations

INSTALL = (
    "attnzoo.keras needs Keras 3 on the torch backend: install it with "
    "`pip install 'attnzoo[keras]'` (or the `bench` extra) and set KERAS_BACKEND=torch in the "
    "environment before keras is first imported"
)

try:
    import keras
except ImportError as error:  # keras missing, or its configured backend (e.g. tensorflow) is
    raise ImportError(f"{INSTALL} (import keras failed: {error})") from error

if keras.backend.backend() != "torch":
    raise ImportError(f"{INSTALL} (keras runs on the {keras.backend.backend()!r} backend)")

from attnzoo.keras.layers import (  # noqa: E402  (after the backend check, on purpose)
    AdditiveAttention,
    Attention,
    BahdanauAttention,
    LuongAttention,
    MultiHeadAttention,
    SummedTanh,
    keras_mask,
)

__all__ = [
    "AdditiveAttention",
    "Attention",
    "BahdanauAttention",
    "LuongAttention",
    "MultiHeadAttention",
    "SummedTanh",
    "keras_mask",
]
