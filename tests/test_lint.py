"""The code base stays ruff-clean (configuration in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    proc = subprocess.run(["ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_imports_point_one_way():
    """theory never imports torch or the other packages (DESIGN.md: theory <- empirics <- verify -> reports)."""
    code = "import sys, theory.gram, theory.kernels, theory.krr, theory.conditioning, theory.bounds; " \
           "print(any(m.split('.')[0] in ('torch', 'empirics', 'verify', 'reports') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
