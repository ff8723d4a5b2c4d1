"""Reader for the IDX format of MNIST (gzip-compressed or raw).

Checks the magic number, the declared dimensions and the payload size, so that a corrupt or
truncated download becomes a one-line `UserInputError` instead of garbage pixels.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from ntkm.errors import UserInputError
from ntkm.io import read_regular

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
_GZIP_MAGIC = b"\x1f\x8b"

#: The four MNIST files, by role, without the optional ".gz".
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx_bytes(path: str | Path) -> bytes:
    """The uncompressed bytes of an IDX file; gzip is detected from the content, not the name."""
    path = Path(path)
    try:
        raw = read_regular(path, limit=1 << 40, what="IDX file")  # a named pipe: one line, never a hang
    except OSError as exc:
        raise UserInputError(f"cannot read IDX file {path}: {exc.strerror}; check the path and permissions") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserInputError(
                f"IDX file {path} is a corrupt or truncated gzip ({exc}); delete it and download it again"
            ) from None
    return raw


def _parse(path: Path, data: bytes, magic: int, ndim: int) -> np.ndarray:
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserInputError(
            f"IDX file {path} is truncated ({len(data)} bytes, header needs {header}); download it again"
        )
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise UserInputError(
            f"IDX file {path} has magic number {got}, expected {magic}; it is not the right MNIST file or it is corrupt"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise UserInputError(
            f"IDX file {path} holds {len(data)} bytes but its header {dims} needs {expected}; "
            "it is truncated or corrupt, download it again"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_images(path: str | Path, data: bytes | None = None) -> np.ndarray:
    """uint8 array (count, rows, cols) from an idx3 image file (magic 2051).

    `data` may hold the file's uncompressed bytes when the caller already read them."""
    return _parse(Path(path), read_idx_bytes(path) if data is None else data, IMAGES_MAGIC, 3)


def read_idx_labels(path: str | Path, data: bytes | None = None) -> np.ndarray:
    """uint8 array (count,) from an idx1 label file (magic 2049); labels must be 0..9."""
    labels = _parse(Path(path), read_idx_bytes(path) if data is None else data, LABELS_MAGIC, 1)
    if labels.size and int(labels.max()) > 9:
        raise UserInputError(f"IDX label file {path} holds label {int(labels.max())} > 9; it is corrupt")
    return labels


def find_idx_file(folder: Path, stem: str) -> Path | None:
    """`stem` or `stem.gz` in `folder` (also the `stem.idx3-ubyte` spelling some mirrors use)."""
    for name in (f"{stem}.gz", stem, stem.replace("-idx", ".idx")):
        p = folder / name
        if p.is_file():
            return p
    return None
