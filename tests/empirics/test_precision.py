"""Float32 arithmetic on CUDA is pinned to IEEE at every entry point and recorded (`empirics.precision`): torch's
CUDA convolutions default to TF32, which would make a CUDA audit compute something the CPU does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from empirics.precision import MODES, float32_math, float32_scope, set_float32_math
from empirics.records import DeviceInfo, device_info, pick_device

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_flags():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_modes_set_torchs_flags_and_are_read_back() -> None:
    for mode, tf32 in MODES.items():
        set_float32_math(mode)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        assert float32_math() == {"matmul": mode, "convolution": mode}
    with pytest.raises(ValueError, match="unknown float32 mode 'bf16'; choose one of ieee, tf32"):
        set_float32_math("bf16")


def test_a_scope_restores_the_modes_it_found() -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's own defaults
    with float32_scope("tf32"):
        assert float32_math() == {"matmul": "tf32", "convolution": "tf32"}
    assert float32_math() == {"matmul": "ieee", "convolution": "tf32"}


def test_picking_a_device_pins_ieee_float32() -> None:
    set_float32_math("tf32")
    assert pick_device("cpu") == "cpu"
    assert float32_math() == {"matmul": "ieee", "convolution": "ieee"}


def test_a_claims_worker_pins_ieee_float32() -> None:
    """`verify claims --jobs N` workers are fresh processes: their initialiser pins the mode (torch's default
    would leave CUDA convolutions in TF32)."""
    code = ("import json, torch; torch.backends.cudnn.allow_tf32 = True; torch.backends.cuda.matmul.allow_tf32 = True;"
            " from verify.executors import _worker_init; _worker_init(1);"
            " from empirics.precision import float32_math; print(json.dumps(float32_math()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"matmul": "ieee", "convolution": "ieee"}


def test_the_device_record_says_the_mode_where_cuda_is(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "float32_math" not in device_info() or torch.cuda.is_available()  # a CPU record is unchanged
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "a CUDA device")
    set_float32_math("ieee")
    info = device_info()
    assert info["float32_math"] == {"matmul": "ieee", "convolution": "ieee"}
    assert DeviceInfo.model_validate({**info, "used": "cuda"}).float32_math == info["float32_math"]
