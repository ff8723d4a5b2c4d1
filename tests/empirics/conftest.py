"""Fixtures for the torch-side tests: small real MNIST / CIFAR-10 subsets."""

from __future__ import annotations

import pytest
import torch

from empirics.data.datasets import DataRequest, load_dataset


@pytest.fixture(scope="session")
def mnist_small():
    """120 real MNIST training images and 40 test images (bundled sample when the full data is absent)."""
    return load_dataset("mnist", n_train=120, n_test=40, request=DataRequest(sample="balanced", seed=0))


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.set_num_threads(2)
