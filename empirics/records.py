"""Run records: library versions, device and git state (file IO is in `ntkm.io`, JSON in `ntkm.codec`).

Every result the suite writes carries these fields so that a number can be traced to the
config, seeds, data and software that produced it. `run_header` builds the header every run record repeats (the
library versions and the device), `RunHeader` is its one typed form: the audit record's model extends it
(`verify.audit.record`) and the claims records read theirs through `HasRunHeader.header`.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour affects results."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("numpy", "scipy", "sympy", "mpmath", "torch", "jinja2", "weasyprint", "matplotlib"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    try:
        out["suite"] = md.version("ntk-malleability-suite")
    except md.PackageNotFoundError:
        out["suite"] = "source tree"
    return out


def device_info() -> dict[str, Any]:
    """Which device torch computes on, and the CPU thread count."""
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        from empirics.precision import float32_math

        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["float32_math"] = float32_math()
    return info


def pick_device(requested: str | None = None) -> str:
    """CUDA when present (or asked for), CPU otherwise; float32 arithmetic pinned to IEEE on it
    (`empirics.precision`: torch's CUDA convolutions would otherwise round their products to TF32)."""
    import torch

    from empirics.precision import set_float32_math

    set_float32_math()
    if requested and requested != "auto":
        if requested.startswith("cuda") and not torch.cuda.is_available():
            from ntkm.errors import UserInputError

            raise UserInputError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def git_state() -> dict[str, Any]:
    """The git commit of the code that ran and whether the work tree had uncommitted changes (recorded
    beside every claims run; None where the code does not run from a git checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(dirty) if commit else None}


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far, GiB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


class DeviceInfo(BaseModel):
    """Where a run computed (`device_info`, plus `used`: the device it ran on); further keys are kept."""

    model_config = ConfigDict(extra="allow", strict=True)

    platform: str
    machine: str
    cpu_count: int | None = None
    torch_threads: int | None = None
    cuda: bool
    cuda_device: str | None = None
    #: CUDA's float32 mode of matrix products and convolutions (`empirics.precision`); absent without CUDA.
    float32_math: dict[str, str] | None = None
    used: str | None = None


class RunHeader(BaseModel):
    """The header every run record repeats: the library versions and the device (`run_header`)."""

    model_config = ConfigDict(extra="allow", strict=True)

    versions: dict[str, str]
    device: DeviceInfo


def run_header(device: str) -> dict[str, Any]:
    """The header fields of a run record that ran on `device`, as stored (`RunHeader` is their typed form)."""
    return {"versions": library_versions(), "device": {**device_info(), "used": device}}


class HasRunHeader:
    """Mixin of the claims records (dataclasses with `versions` and `device` fields): their header, typed."""

    versions: dict[str, Any]
    device: dict[str, Any]

    @property
    def header(self) -> RunHeader:
        """This record's `versions` and `device` as a `RunHeader`."""
        return RunHeader.model_validate({"versions": self.versions, "device": self.device})
