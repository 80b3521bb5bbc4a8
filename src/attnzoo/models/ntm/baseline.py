"""The LSTM baseline of the NTM experiments (Graves et al. 2014, sec. 4: "an LSTM network
without external memory"), with the NTM's interface: real vectors in, logits out per step.

Note:
    Graves 2014 (Table 3) used three layers of 256 units (1.35M parameters on copy). The preset
    here keeps three layers but sizes them (54 units) to about the parameter count of the
    default NTM (on the copy task, 9 inputs and 8 outputs: NTM 62,680, LSTM 62,000), so the
    comparison is of memory, not of size; `tests/models/test_ntm.py` checks the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from attnzoo.core.checks import check_fields, check_sequences, check_size, fail


@dataclass(frozen=True)
class LSTMConfig:
    layers: int = 3
    hidden: int = 54

    def __post_init__(self):
        check_fields(self)
        for name in ("layers", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail("LSTMConfig", name, "a positive int", value)


def lstm(**overrides) -> LSTMConfig:
    """Three LSTM layers sized to the default NTM's parameter count (see the module Note)."""
    return replace(LSTMConfig(), **overrides)


class LSTMOutput(NamedTuple):
    logits: torch.Tensor  # (batch, T, output_size)


class LSTMBaseline(nn.Module):
    """A stack of LSTM layers and a linear readout: y_t = W_o h_t.

    Args:
        config: `LSTMConfig`.
        input_size, output_size: features of x_t and y_t.
    """

    def __init__(self, config: LSTMConfig, input_size: int, output_size: int):
        super().__init__()
        check_size("LSTMBaseline", "input_size", input_size)
        check_size("LSTMBaseline", "output_size", output_size)
        self.config = config
        self.lstm = nn.LSTM(input_size, config.hidden, config.layers, batch_first=True)
        self.output = nn.Linear(config.hidden, output_size)

    def forward(self, inputs: torch.Tensor, return_weights: bool = False) -> LSTMOutput:
        """inputs (batch, T, input_size) -> logits (batch, T, output_size); an LSTM has no
        weightings, so `return_weights` changes nothing."""
        check_sequences(
            "LSTMBaseline", "inputs", inputs, self.lstm.input_size, empty=False, like=self
        )
        hidden, _ = self.lstm(inputs)  # (b, T, hidden)
        return LSTMOutput(self.output(hidden))
