"""File IO shared by every layer: atomic writes (readers never see half a file) and file digests.

These live in the base package so that `reports` and `verify` write files without importing
`empirics` (imports point one way; tests/test_layering.py checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: Bounds on a JSON document read from a file a user may have edited: nesting depth and integer digits. The
#: suite's records nest about ten levels and hold counts and seeds; deeper nesting would exhaust Python's
#: recursion, longer integers overflow floats (10**400) or exceed int() (over 4,300 digits) in the readers.
MAX_JSON_DEPTH = 200
MAX_JSON_INT_DIGITS = 20
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (data provenance and model digests)."""
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
    """`atomic_write_bytes` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def json_depth(text: str | bytes) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings ignored), without parsing it."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    bare = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    steps = np.isin(bare, (ord("["), ord("{"))).astype(np.int64) - np.isin(bare, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer with {len(digits.lstrip('-'))} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(digits)


def parse_json(text: str | bytes) -> Any:
    """`json.loads` within `MAX_JSON_DEPTH` and `MAX_JSON_INT_DIGITS`: anything beyond them, like malformed JSON,
    raises `json.JSONDecodeError` (so every reader's one-line refusal of bad JSON covers it)."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise json.JSONDecodeError(f"nested {depth} levels deep (at most {MAX_JSON_DEPTH})", "", 0)
    try:
        return json.loads(text, parse_int=_bounded_int)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except (ValueError, RecursionError) as exc:
        raise json.JSONDecodeError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, "", 0) from None
