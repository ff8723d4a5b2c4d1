"""Run records (`empirics.records`): the versions, device and git state stored beside every result."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from empirics.records import device_info, git_state, library_versions, pick_device
from ntkm.errors import UserInputError


def test_library_versions_name_the_installed_libraries():
    v = library_versions()
    assert v["numpy"] == np.__version__ and v["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert {"python", "scipy", "sympy", "mpmath", "suite"} <= set(v)


def test_device_info_and_pick_device():
    info = device_info()
    assert info["cpu_count"] == os.cpu_count() and info["cuda"] == torch.cuda.is_available()
    assert pick_device("cpu") == "cpu"
    assert pick_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError, match="no CUDA device"):
            pick_device("cuda")


def test_git_state_of_this_checkout():
    g = git_state()
    assert set(g) == {"commit", "dirty"}
    assert g["commit"] is None or (len(g["commit"]) == 40 and isinstance(g["dirty"], bool))
