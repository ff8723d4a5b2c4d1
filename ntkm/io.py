"""File IO shared by every layer: atomic writes (readers never see half a file) and file digests.

These live in the base package so that `reports` and `verify` write files without importing
`empirics` (imports point one way; tests/test_layering.py checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: Bounds on a JSON document read from a file a user may have edited: nesting depth and integer digits. The
#: suite's records nest about ten levels and hold counts and seeds; deeper nesting would exhaust Python's
#: recursion, longer integers overflow floats (10**400) or exceed int() (over 4,300 digits) in the readers.
MAX_JSON_DEPTH = 200
MAX_JSON_INT_DIGITS = 20
#: The largest JSON file a reader takes (bytes): far above any record the suite writes (a paper-preset cache entry
#: is a few MB), far below what would exhaust memory when parsed (Python's objects take ~10x the text).
MAX_JSON_BYTES = 512 << 20


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


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def read_regular(path: str | Path, limit: int = MAX_JSON_BYTES, what: str = "") -> bytes:
    """The bytes of the regular file at `path`, refused in one line (`UserInputError`) when it is a named pipe,
    device, socket or folder (reading those would block or never end) or larger than `limit` bytes; the type
    and size are checked before a byte is read. `what` (an option name, "cache entry") prefixes the message.
    `OSError` when it cannot be opened or read."""
    from ntkm.errors import UserInputError

    p = Path(path)
    name = f"{what} {p}".strip()
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"{name} is {_file_kind(st.st_mode)}, not a regular file (reading it could block "
                             "forever); remove it, or give a regular file")
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # the file opened, not the one stat saw (it may have been swapped since)
        if not stat.S_ISREG(st.st_mode):
            raise UserInputError(f"{name} is {_file_kind(st.st_mode)}, not a regular file; it is refused")
        if st.st_size > limit:
            raise UserInputError(f"{name} holds {st.st_size / 2**20:.0f} MiB, more than the {limit / 2**20:.0f} MiB "
                                 "a record of this suite can be; give the file the suite wrote")
        parts = [f.read(st.st_size + 1)]  # the size stat saw; more only if the file grows meanwhile
        total = len(parts[0])
        while total <= limit and len(parts[-1]) > 0 and total > st.st_size:
            parts.append(f.read(1 << 20))
            total += len(parts[-1])
        data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > limit:
        raise UserInputError(f"{name} grew beyond {limit / 2**20:.0f} MiB while being read; it is refused")
    return data


def _escaped(data: np.ndarray) -> np.ndarray:
    """Per byte: whether an odd run of backslashes directly precedes it (linear time, no pattern matching)."""
    idx = np.arange(data.size)
    plain = np.where(data != ord("\\"), idx, -1)
    last_plain = np.maximum.accumulate(plain)  # the last byte that is not a backslash, up to and including i
    before = np.concatenate(([-1], last_plain[:-1]))
    run = idx - 1 - before  # backslashes directly before byte i
    return run % 2 == 1


def json_depth(text: str | bytes) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings ignored), without parsing it.

    Linear in the text (vectorised: escaped quotes, then string membership by quote parity); no regular
    expression, so no backtracking on hostile text (an unterminated string of 100,000 escaped quotes).
    """
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size == 0:
        return 0
    quote = (data == ord('"')) & ~_escaped(data)
    inside = (np.cumsum(quote) - quote) % 2 == 1  # an odd number of quotes before it: within a string
    opens = np.isin(data, (ord("["), ord("{"))) & ~inside
    closes = np.isin(data, (ord("]"), ord("}"))) & ~inside
    steps = opens.astype(np.int64) - closes
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
