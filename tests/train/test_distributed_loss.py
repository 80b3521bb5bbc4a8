"""Under torchrun the loop hands each task's `loss` the model wrapped in
`DistributedDataParallel`, which holds the model as `.module`, has none of its attributes or
methods, and synchronises gradients only for work run through its `forward`. Every task's loss
must therefore run on such a wrapper, give the bare model's loss, and run its differentiable
pass through the wrapper's forward (methods of the model inside only for work without gradient,
such as playing episodes before the update)."""

import copy

import pytest
import torch

from attnzoo.models.registry import MODELS
from tests.test_devices import built


class Wrapper(torch.nn.Module):
    """What a loss may use of DistributedDataParallel: `.module` and a call; it counts the
    calls made with gradients on."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        self.graded_calls = 0

    def forward(self, *args, **kwargs):
        self.graded_calls += torch.is_grad_enabled()
        return self.module(*args, **kwargs)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_loss_runs_through_a_distributed_wrapper(name):
    task, cpu_model, _ = built(name)
    if hasattr(cpu_model, "optimizer_groups"):
        pytest.skip("several optimisers: the loop trains it in one process only")
    bare, inside = copy.deepcopy(cpu_model).train(), copy.deepcopy(cpu_model).train()
    batch = task.batch(0, 2, "cpu")
    torch.manual_seed(0)
    want, _ = task.loss(bare, batch)
    wrapped = Wrapper(inside)
    torch.manual_seed(0)
    got, _ = task.loss(wrapped, batch)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert wrapped.graded_calls >= 1
