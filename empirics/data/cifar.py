"""Readers for CIFAR-10: the original python batches and image-folder trees or tarballs.

The python batches are pickles. Unpickling can run arbitrary code, so they are read with a
restricted unpickler that resolves only the few numpy globals a batch needs and refuses every
other one (a crafted file cannot call `os.system`). Tarballs are streamed once and never
extracted to disk. Images are decoded with Pillow, only those selected.
"""

from __future__ import annotations

import io
import pickle
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from ntkm.errors import UserInputError

CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
CIFAR_SIDE = 32
CIFAR_D = 3 * CIFAR_SIDE * CIFAR_SIDE
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
META = "batches.meta"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
_MAX_MEMBER_BYTES = 64 << 20


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """The only globals a CIFAR batch may reference: numpy array/dtype reconstruction."""
    from numpy._core import multiarray, numeric

    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = multiarray._reconstruct
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(mod, "_frombuffer")] = numeric._frombuffer
    allowed[("_codecs", "encode")] = __import__("codecs").encode
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy reconstruction helpers; anything else is refused."""

    _ALLOWED = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name}: a CIFAR-10 batch only needs numpy arrays"
            ) from None


def safe_load(fileobj: IO[bytes], where: str) -> dict[str, Any]:
    """Unpickle a CIFAR batch or meta file safely; keys come back as `str`."""
    try:
        obj = SafeUnpickler(fileobj, encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise UserInputError(
            f"{where} is not a plain CIFAR-10 batch ({exc}); it was refused for safety, "
            "get a fresh copy of cifar-10-python.tar.gz"
        ) from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as exc:
        raise UserInputError(
            f"{where} is corrupt or truncated ({type(exc).__name__}); get a fresh copy of cifar-10-python.tar.gz"
        ) from None
    if not isinstance(obj, dict):
        raise UserInputError(f"{where} does not hold a dict as CIFAR-10 batches do; it is not a CIFAR-10 file")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def parse_batch(batch: dict[str, Any], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 pixels (N, 3072) in C,H,W order, int64 labels (N,)) from an unpickled batch."""
    data, labels = batch.get("data"), batch.get("labels", batch.get("fine_labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_D:
        raise UserInputError(f"{where}: 'data' is not a uint8 array of shape (N, {CIFAR_D}); file is corrupt")
    try:
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise UserInputError(f"{where}: 'labels' is not a list of integers; file is corrupt") from None
    if y.shape[0] != data.shape[0] or (y.size and (y.min() < 0 or y.max() > 9)):
        raise UserInputError(f"{where}: labels do not match the images (count or range 0..9); file is corrupt")
    return np.ascontiguousarray(data), y


def parse_meta(meta: dict[str, Any], where: str) -> list[str]:
    """Class names from batches.meta; they must be the ten CIFAR-10 classes."""
    names = [n.decode("latin1") if isinstance(n, bytes) else str(n) for n in meta.get("label_names", [])]
    if names != CIFAR10_CLASSES:
        raise UserInputError(
            f"{where}: label_names {names[:10]} are not the CIFAR-10 classes; is this CIFAR-100 or a corrupt file?"
        )
    return names


@dataclass
class CifarArrays:
    """The full CIFAR-10 train and test splits as uint8 arrays, with the files they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    files: list[Path]


def _assemble(parts: dict[str, dict[str, Any]], where: str) -> tuple[np.ndarray, ...]:
    missing = [n for n in [*TRAIN_BATCHES, TEST_BATCH, META] if n not in parts]
    if missing:
        raise UserInputError(f"{where} lacks {', '.join(missing)}; get a complete cifar-10-python.tar.gz")
    parse_meta(parts[META], f"{where}/{META}")
    train = [parse_batch(parts[n], f"{where}/{n}") for n in TRAIN_BATCHES]
    xt, yt = parse_batch(parts[TEST_BATCH], f"{where}/{TEST_BATCH}")
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), xt, yt


def read_cifar_python_dir(folder: str | Path) -> CifarArrays:
    """Read `cifar-10-batches-py/` (data_batch_1..5, test_batch, batches.meta)."""
    folder = Path(folder)
    parts: dict[str, dict[str, Any]] = {}
    files = []
    for name in [*TRAIN_BATCHES, TEST_BATCH, META]:
        p = folder / name
        if p.is_file():
            with open(p, "rb") as f:
                parts[name] = safe_load(f, str(p))
            files.append(p)
    x, y, xt, yt = _assemble(parts, str(folder))
    return CifarArrays(x, y, xt, yt, list(CIFAR10_CLASSES), files)


def _stream_tar(path: Path, want: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(member name, contents) of the wanted regular files, in one streaming pass, never touching disk."""
    try:
        with tarfile.open(path, mode="r|*") as tf:
            for member in tf:
                if not member.isfile() or member.size > _MAX_MEMBER_BYTES or not want(member.name):
                    continue
                fobj = tf.extractfile(member)
                if fobj is not None:
                    yield member.name, fobj.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UserInputError(f"tarball {path} is corrupt or truncated ({exc}); download it again") from None


class _NotPlainUstar(Exception):
    """The tarball uses a feature the fast parser does not handle (pax or GNU long names)."""


def _parse_ustar(data: bytes, want: Callable[[str], bool]) -> list[tuple[str, bytes]]:
    """Members of an in-memory ustar archive (regular files only); about 10x faster than `tarfile`
    on 60,000 tiny images. Raises `_NotPlainUstar` for anything unusual, so the caller can fall back."""
    out: list[tuple[str, bytes]] = []
    pos, end = 0, len(data)
    while pos + 512 <= end:
        head = data[pos : pos + 512]
        if not any(head):
            return out
        if head[257:262] != b"ustar":
            raise _NotPlainUstar
        try:
            size = int(head[124:136].rstrip(b"\0 ").decode("ascii") or "0", 8)
            name = head[0:100].split(b"\0", 1)[0].decode("utf-8")
            prefix = head[345:500].split(b"\0", 1)[0].decode("utf-8")
        except (UnicodeDecodeError, ValueError):
            raise _NotPlainUstar from None
        kind = head[156:157]
        start = pos + 512
        if start + size > end:
            raise UserInputError("tarball is truncated (a member runs past the end); download it again")
        full = f"{prefix}/{name}" if prefix else name
        if kind in (b"0", b"\0", b"7"):
            if size <= _MAX_MEMBER_BYTES and want(full):
                out.append((full, data[start : start + size]))
        elif kind not in (b"1", b"2", b"3", b"4", b"5", b"6"):
            raise _NotPlainUstar
        pos = start + -(-size // 512) * 512
    return out


def _decompress(raw: bytes, path: Path) -> bytes:
    import bz2
    import gzip
    import lzma

    try:
        if raw[:2] == b"\x1f\x8b":
            return gzip.decompress(raw)
        if raw[:3] == b"BZh":
            return bz2.decompress(raw)
        if raw[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(raw)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        raise UserInputError(f"tarball {path} is corrupt or truncated ({exc}); download it again") from None
    return raw


def _read_tar_members(path: Path, want: Callable[[str], bool]) -> list[tuple[str, bytes]]:
    """All wanted members of a (compressed) tarball, read in one pass into memory."""
    data = _decompress(path.read_bytes(), path)
    try:
        try:
            return _parse_ustar(data, want)
        except UserInputError as exc:
            raise UserInputError(f"{path}: {exc}") from None
    except _NotPlainUstar:
        return list(_stream_tar(path, want))


def first_image_name(path: str | Path) -> str:
    """Name of the first image file in a tarball ('' if none); reads only up to that member."""
    for name, _ in _stream_tar(Path(path), lambda n: n.lower().endswith(IMAGE_EXTENSIONS)):
        return name
    return ""


def read_cifar_python_tarball(path: str | Path) -> CifarArrays:
    """Read `cifar-10-python.tar.gz` without extracting it (one streaming pass)."""
    path = Path(path)
    wanted = {*TRAIN_BATCHES, TEST_BATCH, META}
    parts: dict[str, dict[str, Any]] = {}
    for name, blob in _stream_tar(path, lambda n: n.rsplit("/", 1)[-1] in wanted):
        parts[name.rsplit("/", 1)[-1]] = safe_load(io.BytesIO(blob), f"{path}:{name}")
    x, y, xt, yt = _assemble(parts, str(path))
    return CifarArrays(x, y, xt, yt, list(CIFAR10_CLASSES), [path])


# --- image folders -------------------------------------------------------------------------------


def natural_key(name: str) -> list[Any]:
    """Sort key that orders '9.jpg' before '10.jpg' (digits compared as numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def round_robin(per_class: list[list[Any]]) -> list[tuple[int, Any]]:
    """Interleave classes: first item of class 0, of class 1, ..., then the second items, and so on.

    This is the canonical order of an image folder, so that "the first n" images are spread over
    all classes instead of being n airplanes. Exhausted classes are skipped.
    """
    out: list[tuple[int, Any]] = []
    for k in range(max((len(c) for c in per_class), default=0)):
        for label, items in enumerate(per_class):
            if k < len(items):
                out.append((label, items[k]))
    return out


@dataclass
class ImageSplit:
    """One split of an image folder in canonical order: labels, and how to read each image."""

    labels: np.ndarray
    names: list[str]
    read: Callable[[int], bytes]


@dataclass
class ImageFolder:
    """Train and test splits of an image-folder tree or tarball, plus the files it came from."""

    train: ImageSplit
    test: ImageSplit
    classes: list[str]
    files: list[Path] = field(default_factory=list)


def _split_of(parts: list[str], classes: list[str]) -> tuple[str, int] | None:
    """('train'|'test', label) for a path ending in <split>/<class>/<file.ext>, else None."""
    if len(parts) < 3 or not parts[-1].lower().endswith(IMAGE_EXTENSIONS) or parts[-1].startswith("."):
        return None
    split, cls = parts[-3], parts[-2]
    if split not in ("train", "test") or cls not in classes:
        return None
    return split, classes.index(cls)


def _build_split(entries: list[tuple[int, str]], n_classes: int, read: Callable[[str], bytes]) -> ImageSplit:
    per_class: list[list[str]] = [[] for _ in range(n_classes)]
    for label, name in entries:
        per_class[label].append(name)
    for items in per_class:
        items.sort(key=lambda s: natural_key(s.rsplit("/", 1)[-1]))
    order = round_robin(per_class)
    names = [n for _, n in order]
    return ImageSplit(np.array([lab for lab, _ in order], dtype=np.int64), names, lambda i: read(names[i]))


def _check_complete(found: dict[str, list[tuple[int, str]]], classes: list[str], where: Path) -> None:
    for split in ("train", "test"):
        labels = {lab for lab, _ in found[split]}
        if not labels:
            raise UserInputError(
                f"{where} holds no {split}/<class>/<image> files for classes {classes}; "
                "expected an image-folder tree train/<class>/*.jpg and test/<class>/*.jpg"
            )
        if len(labels) != len(classes):
            missing = [classes[i] for i in range(len(classes)) if i not in labels]
            raise UserInputError(f"{where}: {split}/ lacks the classes {missing}; the image folder is incomplete")


def read_image_tree(root: str | Path, classes: list[str] = CIFAR10_CLASSES) -> ImageFolder:
    """Index an image-folder tree `root/{train,test}/<class>/*` (files are read only when selected)."""
    root = Path(root)
    found: dict[str, list[tuple[int, str]]] = {"train": [], "test": []}
    for split in ("train", "test"):
        for label, cls in enumerate(classes):
            d = root / split / cls
            if d.is_dir():
                found[split].extend(
                    (label, f"{split}/{cls}/{p.name}")
                    for p in d.iterdir()
                    if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")
                )
    _check_complete(found, classes, root)

    def read(rel: str) -> bytes:
        return (root / rel).read_bytes()

    n = len(classes)
    return ImageFolder(_build_split(found["train"], n, read), _build_split(found["test"], n, read), list(classes))


def read_image_tarball(path: str | Path, classes: list[str] = CIFAR10_CLASSES) -> ImageFolder:
    """Index an image-folder tarball in one streaming pass, keeping the (small) encoded files in memory."""
    path = Path(path)
    found: dict[str, list[tuple[int, str]]] = {"train": [], "test": []}
    blobs: dict[str, bytes] = {}
    for name, blob in _read_tar_members(path, lambda n: _split_of(n.split("/"), classes) is not None):
        hit = _split_of(name.split("/"), classes)
        if hit is not None:
            found[hit[0]].append((hit[1], name))
            blobs[name] = blob
    _check_complete(found, classes, path)
    n = len(classes)
    return ImageFolder(
        _build_split(found["train"], n, blobs.__getitem__),
        _build_split(found["test"], n, blobs.__getitem__),
        list(classes),
        [path],
    )


def decode_image(blob: bytes, where: str, side: int = CIFAR_SIDE) -> tuple[np.ndarray, str]:
    """(uint8 pixels (3*side*side,) in C,H,W order, Pillow format name) of one encoded RGB image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(blob)) as im:
            fmt, size = str(im.format), im.size
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8) if size == (side, side) else None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise UserInputError(f"{where} is not a readable image ({exc}); the image folder is corrupt") from None
    if arr is None:
        raise UserInputError(f"{where} is {size[0]}x{size[1]}; CIFAR-10 images must be {side}x{side}")
    return np.ascontiguousarray(arr.transpose(2, 0, 1)).reshape(-1), fmt
