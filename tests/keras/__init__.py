"""Tests of attnzoo.keras. Keras picks its backend once, when first imported: the torch
backend is chosen here, before any test module of this package imports keras (pytest imports
a package's __init__ first). A process that imported keras earlier on another backend makes
`import attnzoo.keras` fail loudly rather than test the wrong thing."""

import os
import sys

if "keras" not in sys.modules:
    os.environ["KERAS_BACKEND"] = "torch"
    # Keras's torch backend moves every input to its default device (CUDA or MPS when there is
    # one); the tests compare with CPU references, so they pin it to the CPU.
    os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")
