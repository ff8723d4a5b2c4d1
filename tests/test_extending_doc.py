"""`docs/EXTENDING.md` stays true: every file path and every `module.symbol` it names in backticks exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "EXTENDING.md"
PACKAGES = ("empirics", "verify", "reports", "theory", "ntkm")


def named_paths(text: str) -> list[str]:
    """Backticked repository paths (with a slash and a file suffix, or ending in a slash)."""
    return [t for t in re.findall(r"`([^`\s]+)`", text) if "/" in t and (re.search(r"\.\w+$", t) or t.endswith("/"))]


def named_symbols(text: str) -> list[str]:
    """Backticked dotted names rooted in one of the suite's packages (`empirics.nets.kinds.KINDS`)."""
    return [t for t in re.findall(r"`([A-Za-z_][\w.]*)`", text) if "." in t and t.split(".")[0] in PACKAGES]


def resolves(name: str) -> bool:
    """Whether `name` is a module, or an attribute chain of the longest importable module prefix."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_named_path_exists():
    text = DOC.read_text()
    paths = named_paths(text)
    assert len(paths) >= 20, paths  # the parser still finds the guide's paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/EXTENDING.md names paths that do not exist: {missing}"


def test_every_named_symbol_resolves():
    text = DOC.read_text()
    symbols = named_symbols(text)
    assert len(symbols) >= 20, symbols
    missing = [s for s in symbols if not resolves(s)]
    assert not missing, f"docs/EXTENDING.md names symbols that do not exist: {missing}"


def test_the_checker_fails_on_a_stale_name():
    assert not resolves("empirics.nets.kinds.NO_SUCH_TABLE") and not resolves("nosuchpackage.x")
    assert named_paths("see `verify/gone.py` and `x`") == ["verify/gone.py"]
