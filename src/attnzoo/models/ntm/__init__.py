"""The Neural Turing Machine (Graves et al. 2014) and its LSTM baseline."""

from attnzoo.models.ntm.baseline import LSTMBaseline, LSTMConfig, LSTMOutput, lstm
from attnzoo.models.ntm.ntm import NTM, NTMConfig, NTMOutput, ntm

__all__ = [
    "NTM",
    "LSTMBaseline",
    "LSTMConfig",
    "LSTMOutput",
    "NTMConfig",
    "NTMOutput",
    "lstm",
    "ntm",
]
