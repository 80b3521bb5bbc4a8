"""The Neural Turing Machine (Graves et al. 2014): a controller network that reads and writes
an external memory matrix through differentiable, attention-like weightings (sec. 2-3).

At step t the controller reads [x_t; r_{t-1}] (the input and the previous read vectors), its
output h_t emits every head's parameters through one linear map, each head addresses the
memory (`addressing.address`), the read heads read, the write heads erase and add, and the
output is y_t = W_o [h_t; r_t] (logits; the bit tasks apply a sigmoid in their loss).

Note:
    - Heads address and read the memory before this step's write (M_{t-1}); all heads are
      addressed in one batched call. Graves 2014 does not fix the order.
    - The memory starts at the constant 1e-6 (`memory_init="constant"`; Collier & Beel 2018,
      "Implementing Neural Turing Machines", found it converges fastest), or at a small learned
      matrix (`"learned"`). The paper does not give its initialisation.
    - Every head's previous weighting w_0 is one-hot on row 0, so location-based addressing
      can start from a definite row even when the constant memory makes content addressing
      uniform; the read vectors r_0 are learned (Collier & Beel 2018 learn both).
    - The feedforward controller is one tanh layer (the paper does not name its nonlinearity).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from attnzoo.core.checks import check_fields, check_sequences, check_size, fail
from attnzoo.models.ntm import addressing


class LSTMController(nn.LSTMCell):
    """(h_t, c_t) = LSTM([x_t; r_{t-1}], (h_{t-1}, c_{t-1})); returns h_t and the state."""

    def forward(self, x: torch.Tensor, state):
        h, c = super().forward(x, state)  # (b, controller_size) each
        return h, (h, c)


class FeedforwardController(nn.Linear):
    """h_t = tanh(W [x_t; r_{t-1}] + b); no state of its own (the state passes through)."""

    def forward(self, x: torch.Tensor, state):
        return torch.tanh(super().forward(x)), state  # (b, controller_size)


# The controllers by name: the one place `NTMConfig.controller` is resolved.
CONTROLLERS = {"lstm": LSTMController, "feedforward": FeedforwardController}
MEMORY_INITS = ("constant", "learned")
CONSTANT_MEMORY = 1e-6


@dataclass(frozen=True)
class NTMConfig:
    """Sizes of the NTM; the defaults are Graves 2014's copy-task NTM (sec. 4, Table 2: LSTM
    controller of 100 units, one read and one write head, a 128 x 20 memory, shifts -1..1).

    Attributes:
        controller: "lstm" or "feedforward".
        controller_size: hidden units of the controller.
        memory_rows, memory_cols: N and M.
        read_heads, write_heads: the number of each kind of head.
        shifts: allowed shift offsets, odd: 3 means -1, 0, +1.
        memory_init: "constant" (1e-6) or "learned".
    """

    controller: str = "lstm"
    controller_size: int = 100
    memory_rows: int = 128
    memory_cols: int = 20
    read_heads: int = 1
    write_heads: int = 1
    shifts: int = 3
    memory_init: str = "constant"

    def __post_init__(self):
        check_fields(self)
        for name, allowed in (("controller", CONTROLLERS), ("memory_init", MEMORY_INITS)):
            if getattr(self, name) not in allowed:
                fail("NTMConfig", name, f"one of {list(allowed)}", repr(getattr(self, name)))
        for name in ("controller_size", "memory_rows", "memory_cols", "read_heads", "write_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail("NTMConfig", name, "a positive int", value)
        if (
            isinstance(self.shifts, bool)
            or not isinstance(self.shifts, int)
            or self.shifts <= 0
            or self.shifts % 2 == 0
        ):
            fail("NTMConfig", "shifts", "an odd positive int (3: offsets -1, 0, 1)", self.shifts)
        if self.shifts > self.memory_rows:
            fail("NTMConfig", "shifts", f"at most memory_rows = {self.memory_rows}", self.shifts)


def ntm(**overrides) -> NTMConfig:
    """Graves 2014's NTM with an LSTM controller (sec. 4, Table 2)."""
    return replace(NTMConfig(), **overrides)


class NTMOutput(NamedTuple):
    """logits (batch, T, output_size); with `return_weights`: read_weights (batch, T,
    read_heads, N), write_weights (batch, T, write_heads, N), reads (batch, T, read_heads, M),
    adds and erases (batch, T, write_heads, M), memory (batch, T, N, M) after each step."""

    logits: torch.Tensor
    read_weights: torch.Tensor | None = None
    write_weights: torch.Tensor | None = None
    reads: torch.Tensor | None = None
    adds: torch.Tensor | None = None
    erases: torch.Tensor | None = None
    memory: torch.Tensor | None = None


class NTM(nn.Module):
    """Neural Turing Machine over real-valued input vectors (see the module docstring).

    Args:
        config: `NTMConfig`.
        input_size: features of x_t.
        output_size: features of y_t.
    """

    def __init__(self, config: NTMConfig, input_size: int, output_size: int):
        super().__init__()
        check_size("NTM", "input_size", input_size)
        self.input_size = input_size
        check_size("NTM", "output_size", output_size)
        c = self.config = config
        n, m, s = c.memory_rows, c.memory_cols, c.shifts
        self.heads = c.read_heads + c.write_heads
        in_size = input_size + c.read_heads * m
        self.controller = CONTROLLERS[c.controller](in_size, c.controller_size)
        # per head: key (M), beta, g, shift (S), gamma; per write head also erase and add (M)
        self.split = [self.heads * m, self.heads, self.heads, self.heads * s, self.heads]
        self.split += [c.write_heads * m, c.write_heads * m]
        self.head_params = nn.Linear(c.controller_size, sum(self.split))
        self.output = nn.Linear(c.controller_size + c.read_heads * m, output_size)
        self.initial_reads = nn.Parameter(torch.randn(c.read_heads, m) * 0.01)
        if c.memory_init == "learned":
            self.initial_memory = nn.Parameter(torch.randn(n, m) * 0.01)
        else:
            self.register_buffer("initial_memory", torch.full((n, m), CONSTANT_MEMORY))
        w0 = torch.zeros(self.heads, n)
        w0[:, 0] = 1.0
        self.register_buffer("initial_weights", w0)

    def _apply(self, fn, recurse=True):
        """As any module's, then the constant initial memory made again in its new dtype:
        converted by `.double()`, it held 1e-6 rounded to float32."""
        super()._apply(fn, recurse)
        if self.config.memory_init != "learned":
            self.initial_memory = torch.full_like(self.initial_memory, CONSTANT_MEMORY)
        return self

    def forward(self, inputs: torch.Tensor, return_weights: bool = False) -> NTMOutput:
        """inputs (batch, T, input_size) -> `NTMOutput`; the step loop runs over T."""
        check_sequences("NTM", "inputs", inputs, self.input_size, empty=False, like=self)
        c = self.config
        b, steps, _ = inputs.shape
        r, w, m, s = c.read_heads, c.write_heads, c.memory_cols, c.shifts
        memory = self.initial_memory.to(inputs.dtype).expand(b, -1, -1)  # (b, n, m)
        weights = self.initial_weights.to(inputs.dtype).expand(b, -1, -1)  # (b, heads, n)
        reads = self.initial_reads.to(inputs.dtype).expand(b, -1, -1).reshape(b, r * m)
        zeros = inputs.new_zeros(b, c.controller_size)
        state = (zeros, zeros)
        hiddens, all_reads, record = [], [], []
        for t in range(steps):
            x = torch.cat([inputs[:, t], reads], dim=-1)  # (b, input_size + r m)
            h, state = self.controller(x, state)  # h: (b, controller_size)
            key, beta, gate, shift, gamma, erase, add = self.head_params(h).split(self.split, -1)
            head = addressing.squash_head(
                key.view(b, self.heads, m),
                beta,
                gate,
                shift.view(b, self.heads, s),
                gamma,
            )
            weights = addressing.address(memory, head, weights)  # (b, heads, n)
            read_w, write_w = weights[:, :r], weights[:, r:]
            read = addressing.read(memory, read_w)  # (b, r, m)
            erase = torch.sigmoid(erase).view(b, w, m)
            add = torch.tanh(add).view(b, w, m)
            memory = addressing.write(memory, write_w, erase, add)  # (b, n, m)
            reads = read.reshape(b, r * m)
            hiddens.append(h)
            all_reads.append(reads)
            if return_weights:
                record.append((read_w, write_w, read, add, erase, memory))
        features = torch.cat([torch.stack(hiddens, 1), torch.stack(all_reads, 1)], -1)
        logits = self.output(features)  # (b, T, output_size)
        if not return_weights:
            return NTMOutput(logits)
        stacked = [torch.stack(parts, 1) for parts in zip(*record, strict=True)]
        return NTMOutput(logits, *stacked)  # each (b, T, ...)
