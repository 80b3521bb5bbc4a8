import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One thread per test process: the models under test are small, and under load a second
# thread mostly waits (measured ~10x slower small-model tests with two threads when busy).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Devices every model and attention path runs on: PyTorch's `meta` device computes shapes and
# devices without values, so a tensor made on the default device instead of its inputs' fails
# here without a GPU; `cuda` joins where one exists.
DEVICES = ("cpu", "meta", *(("cuda",) if torch.cuda.is_available() else ()))


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)
