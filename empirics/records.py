"""Run records: library versions, device, JSON conversion and atomic file writes.

Every result the suite writes carries these fields so that a number can be traced to the
config, seeds, data and software that produced it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


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
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def pick_device(requested: str | None = None) -> str:
    """CUDA when present (or asked for), CPU otherwise."""
    import torch

    if requested and requested != "auto":
        if requested.startswith("cuda") and not torch.cuda.is_available():
            from theory.errors import UserInputError

            raise UserInputError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, numpy and torch values to plain JSON types (NaN/inf become strings)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return str(obj)
        return obj
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):
        return to_jsonable(obj.detach().cpu().tolist())
    return obj


def stable_hash(obj: Any, length: int = 16) -> str:
    """sha256 of the canonical JSON form of `obj` (used as cache keys and digests)."""
    text = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions of a new file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


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
