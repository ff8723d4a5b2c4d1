"""Float32 arithmetic on CUDA: IEEE float32 unless a benchmark asks for TF32 (a named axis, pinned and recorded).

torch computes float32 convolutions on CUDA in TF32 by default (`torch.backends.cudnn.allow_tf32` is True: products
rounded to a 10-bit mantissa), while its float32 matrix products are IEEE. So a convolutional model audited with
`--device cuda` would be trained, re-fitted and differentiated with ~1e-3 relative error where the CPU rounds to
~6e-8: a free choice, made by a library default, that can move an audit's numbers away from the CPU's. Every entry
point that resolves a device (`empirics.records.pick_device`) pins IEEE float32 for products and convolutions, and
`float32_math()` is recorded beside the device (`empirics.records.device_info`, on a machine with CUDA).

TF32 (`MODES["tf32"]`) is offered only to the device check (`benchmarks.gpu_check`'s engine variants), which times
it and measures how far it moves the trained weights; the claims and the audit do not take it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: Float32 arithmetic modes by name: whether CUDA products and convolutions may use TF32.
MODES: dict[str, bool] = {"ieee": False, "tf32": True}
#: The mode every entry point pins.
DEFAULT_MODE = "ieee"


def _mode(tf32: bool) -> str:
    return next(name for name, flag in MODES.items() if flag is tf32)


def set_float32_math(mode: str = DEFAULT_MODE) -> None:
    """Pin CUDA's float32 products and convolutions to `mode` (a key of `MODES`; a one-line error otherwise).
    Harmless on a machine without CUDA (the flags only steer CUDA kernels)."""
    if mode not in MODES:
        raise ValueError(f"unknown float32 mode {mode!r}; choose one of {', '.join(MODES)}")
    torch.backends.cuda.matmul.allow_tf32 = MODES[mode]
    torch.backends.cudnn.allow_tf32 = MODES[mode]


def float32_math() -> dict[str, str]:
    """The float32 mode of CUDA's matrix products and of its convolutions now."""
    return {"matmul": _mode(bool(torch.backends.cuda.matmul.allow_tf32)),
            "convolution": _mode(bool(torch.backends.cudnn.allow_tf32))}


@contextmanager
def float32_scope(mode: str) -> Iterator[None]:
    """Run a block in float32 mode `mode`, then restore the modes that were set."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    set_float32_math(mode)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
