"""Under torchrun each rank's training loss draws noise of its own (`tasks.base.sampling_seed`):
seeded from the step alone, every rank drew the same glimpse locations, tours or pulls for
its rows, so global rows 2k and 2k + 1 shared one draw."""

import pytest
import torch
from tests.test_devices import tiny_config

from attnzoo import runs
from attnzoo.tasks.base import MissingDataDependency, sampling_seed

SAMPLING = [
    ("ram", "mnist", []),
    ("dram", "multi_mnist", []),
    ("show-attend-tell-hard", "digit_captions", []),
    ("snail-bandit", "bandits", []),
    ("pointer-net", "tsp", ["task.objective=reinforce", "task.n_min=5", "task.n_max=5"]),
]


@pytest.mark.parametrize(("model_name", "task_name", "sets"), SAMPLING)
def test_each_rank_samples_its_own_noise(model_name, task_name, sets):
    try:
        task, model = runs.build(runs.apply_overrides(tiny_config(model_name, task_name), sets))
    except MissingDataDependency as err:
        pytest.skip(str(err))
    batch = task.batch(3, 16, "cpu", 0, 2)
    assert batch.rank == 0 and task.batch(3, 16, "cpu", 1, 2).rank == 1

    def loss(rank: int) -> float:
        torch.manual_seed(0)  # (dropout, if any, alike)
        return float(task.loss(model, batch._replace(rank=rank))[0])

    assert loss(0) == loss(0)  # the same rows and noise: the same loss
    assert loss(1) != loss(0)  # the same rows, the other rank's noise


def test_rank_0_keeps_the_one_process_seed():
    """A one-process run draws what it drew before ranks had streams of their own."""
    assert sampling_seed(12345, 0) == 12345
    seeds = {sampling_seed(base, rank) % 2**32 for base in range(100) for rank in range(8)}
    assert len(seeds) == 800  # distinct in the bits the CPU generator reads
