"""The data front-end for a data set given as a PATH: the experiments (`--dataset PATH`) and the audit
(`--train PATH`, `--test PATH`) read user data through the same readers.

Formats, found from the path's contents (not its name):

- a NumPy `.npz` file (read with `allow_pickle=False`): arrays `x_train`, `y_train`, `x_test`,
  `y_test` (the audit also takes `x`, `y`, one split per file);
- an IDX folder: the four MNIST-named files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
  `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`), gzip or raw;
- CIFAR-style python batches (`data_batch_1..5`, `test_batch`, `batches.meta`, in the folder or its
  `cifar-10-batches-py/`): pickles, read only with `empirics.data.cifar.SafeUnpickler`, which builds numpy
  arrays and refuses every other global, so a crafted batch cannot run code;
- an image folder `ROOT/train/<class>/*`, `ROOT/test/<class>/*` (classes: the sorted sub-folders of
  `train/`; every image of one size; grayscale when the first image read is).

Inputs become float32 in [0, 1] flattened C,H,W (`empirics.data.datasets.to_unit`: uint8 / 255; other
numbers must already lie in [0, 1]). Canonical order: file order (IDX, npz, batches), round-robin over
classes for an image folder (`empirics.data.cifar.round_robin`).

Subsets. An experiment (`load_data`, `load_user_dataset`) draws the same seeded class-balanced (or
"first n") subset as for MNIST and CIFAR-10 (`empirics.data.datasets.select_indices`); a binary task names
its two classes (`classes=("cat", "dog")`, names or indices into the sorted class list). A data set
without a test split is refused with a one-line error naming the files to add; nothing is split
off silently. The audit (`load_split`) keeps its own rule: `n` examples drawn uniformly (seeded)
from one split. Provenance records the files read with their sha256 (an image folder: a manifest of
the selected files' names and sha256), the digest of the selected indices, the class names and that
the data is the user's.
"""

from __future__ import annotations

import hashlib
import io
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from empirics.data import cifar, idx
from empirics.data.datasets import (
    DATASETS,
    SAMPLES,
    TASKS,
    DataProvenance,
    DataRequest,
    Dataset,
    check_choice,
    file_sha256,
    index_digest,
    load_dataset,
    relabel,
    select_indices,
    to_unit,
)
from ntkm.errors import UserInputError

USER_FORMATS = "an IDX folder, CIFAR-style python batches, an image folder train/<class>/*, test/<class>/*, or a .npz"
USER_NOTE = "user-supplied data set (not MNIST or CIFAR-10 as the paper used them); results are not the paper's"
NPZ_ARRAYS = "x_train, y_train, x_test, y_test"
PIXELS = "uint8 / 255 (or floats already in [0, 1]) -> float32 in [0, 1], flattened C,H,W"


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message (its type name when it has none), at most `limit` chars."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def sniff_format(path: str | Path) -> str:
    """The kind of file from its bytes: torchscript, export, safetensors, torch-zip, pickle, npz,
    json, zip or unknown (used for data files here and for model files by `verify.audit.modelio`)."""
    import stat

    p = Path(path)
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"{p} is a named pipe, device, socket or folder, not a regular file (reading it could "
                             "block forever); give a file")
    size = st.st_size
    with open(p, "rb") as f:
        head = f.read(16)
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(p) as zf:
                names = zf.namelist()
        except zipfile.BadZipFile:
            return "unknown"
        if any(n.endswith("/archive_format") or n == "archive_format" for n in names):
            return "export"
        if any("/code/" in n or n.endswith("/constants.pkl") for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            return "torch-zip"
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return "zip"
    if len(head) >= 9:
        n = int.from_bytes(head[:8], "little")
        if 2 <= n <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if head[:1] == b"\x80":
        return "pickle"
    if head.lstrip()[:1] == b"{":
        return "json"
    return "unknown"


# --- checks shared by every format -----------------------------------------------------------------


@dataclass
class Split:
    """One data split as the audit uses it: float32 (n, d) in [0, 1], int64 labels, provenance."""

    x: np.ndarray
    y: np.ndarray
    image_shape: tuple[int, ...] | None
    classes: list[str] | None
    provenance: dict[str, Any]


def _image_shape_of(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """Flatten per-example arrays to C,H,W order; (n, H, W) is one channel, (n, H, W, C) is moved."""
    if x.ndim == 2:
        return x, None
    if x.ndim == 3:
        return x.reshape(len(x), -1), (1, x.shape[1], x.shape[2])
    if x.ndim == 4:
        if x.shape[1] in (1, 3, 4):
            return x.reshape(len(x), -1), tuple(int(s) for s in x.shape[1:])
        if x.shape[3] in (1, 3, 4):
            return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).reshape(len(x), -1), (x.shape[3], x.shape[1],
                                                                                        x.shape[2])
    raise UserInputError(f"inputs of shape {x.shape} are not understood; give (n, d), (n, H, W), (n, C, H, W) "
                         "or (n, H, W, C)")


def _labels(y: np.ndarray, n: int, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise UserInputError(f"{where}: labels have shape {y.shape} for {n} inputs; give one integer label per "
                             "example")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or not np.all(y == np.round(y)):
            raise UserInputError(f"{where}: labels must be integers (class indices), found non-integer values")
    elif y.dtype.kind not in "iub":
        raise UserInputError(f"{where}: labels have dtype {y.dtype}; give integer class indices")
    return y.astype(np.int64)


def _split(x: np.ndarray, y: np.ndarray, where: str, prov: dict[str, Any],
           image_shape: tuple[int, ...] | None = None, classes: list[str] | None = None) -> Split:
    x = np.asarray(x)
    if x.ndim < 2:
        raise UserInputError(f"{where}: inputs have shape {x.shape}; give one row per example, (n, d) or "
                             "(n, C, H, W), not a single vector or scalar")
    if len(x) == 0:
        raise UserInputError(f"{where}: the set is empty (inputs of shape {x.shape}); give at least one example")
    flat, shape = _image_shape_of(x)
    return Split(to_unit(flat, where), _labels(y, len(x), where), image_shape or shape, classes, prov)


def check_labels(split: Split, out_dim: int, where: str) -> None:
    """Labels must index the model's outputs (0..c-1; 0/1 for a one-output model)."""
    hi = max(out_dim, 2) - 1
    bad = (split.y < 0) | (split.y > hi)
    if bad.any():
        v = int(split.y[np.argmax(bad)])
        raise UserInputError(f"{where}: label {v} is out of range for a model with {out_dim} output"
                             f"{'s' if out_dim > 1 else ''} (labels must be 0..{hi})")


def _file_prov(path: Path, kind: str) -> dict[str, Any]:
    return {"source": kind, "path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


# --- readers: one split of a user data set, in canonical order --------------------------------------

#: `read(sel)`: the raw inputs at positions `sel`, their image shape (None: flat rows), extra provenance.
Reader = Callable[[np.ndarray], tuple[np.ndarray, tuple[int, ...] | None, dict[str, Any]]]


@dataclass
class Part:
    """One split of a user data set: its format, location, labels, reader, files and class names."""

    kind: str
    location: Path
    labels: np.ndarray
    read: Reader
    files: list[Path]
    classes: list[str] | None
    order: str


def memory_bytes() -> int:
    """The memory this process may fill: the machine's available memory (Linux: MemAvailable), else its total."""
    import os

    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_npz_headers(z: Any, path: Path, limit: int | None = None) -> None:
    """Each member of an open .npz is a .npy array whose header's shape fits its data and the memory, checked
    from the header before any array is allocated (one-line `UserInputError`): a member that is no .npy (a bare
    pickle named x.npy), or whose header declares more bytes than the member holds (10**9 images over 4 KB) or
    than `limit` (default: the machine's available memory), is refused."""
    fmt = np.lib.format
    limit = memory_bytes() if limit is None else limit
    for info in z.zip.infolist():
        name = info.filename
        with z.zip.open(info) as f:
            magic = f.read(len(fmt.MAGIC_PREFIX))
            if magic != fmt.MAGIC_PREFIX:
                raise UserInputError(f"{path}: {name} is not a NumPy array (no .npy header; a pickle or other "
                                     "bytes?); save plain numeric arrays with np.savez")
            try:
                version = (f.read(1)[0], f.read(1)[0])
                read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape, _, dtype = read_header(f)
            except (ValueError, IndexError, OSError, EOFError) as exc:
                raise UserInputError(f"{path}: {name} has an unreadable .npy header ({first_line(exc)})") from None
            header = f.tell()
        if dtype.hasobject:
            continue  # np.load(allow_pickle=False) refuses it with its own message
        count = 1
        for dim in shape:
            count *= int(dim)
        declared = count * dtype.itemsize
        if declared > info.file_size - header:
            raise UserInputError(f"{path}: {name} declares shape {tuple(shape)} ({_gib(declared)}) but holds "
                                 f"{info.file_size - header} bytes of data; the file is damaged or not what it "
                                 "claims: export the arrays again")
        if declared > limit:
            raise UserInputError(f"{path}: {name} declares shape {tuple(shape)}, {_gib(declared)}, more than the "
                                 f"{_gib(limit)} of memory available; pass fewer examples (a smaller file)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 / 100 else f"{n} bytes"


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            check_npz_headers(z, path)
            return {k: z[k] for k in z.files}
    except UserInputError:
        raise
    except ValueError as exc:
        raise UserInputError(f"{path}: cannot read the arrays ({first_line(exc)}); object arrays are refused, "
                             "save plain numeric arrays with np.savez") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise UserInputError(f"{path} is not a readable .npz file ({first_line(exc)})") from None


def _npz_part(path: Path, split: str, where: str, single_ok: bool) -> tuple[Part, list[str]]:
    """The `split` arrays of a .npz (`x_<split>`, `y_<split>`; or `x`, `y` when `single_ok`), and their keys."""
    kind = sniff_format(path)
    if kind not in ("npz", "zip"):
        raise UserInputError(f"{where}: a data file must be a NumPy .npz with arrays "
                             f"{'x and y' if single_ok else NPZ_ARRAYS} (this is {kind})")
    arrays = _read_npz(path)
    keys = (f"x_{split}", f"y_{split}") if f"x_{split}" in arrays or not single_ok else ("x", "y")
    if keys[0] not in arrays or keys[1] not in arrays:
        if not single_ok:
            what = "one split (x, y) and no test split" if "x" in arrays else f"{sorted(arrays)}, no {split} split"
            raise UserInputError(f"{where}: the .npz holds {what}; save arrays x_train, y_train, x_test, y_test "
                                 "(np.savez) to use it for an experiment")
        raise UserInputError(f"{where}: the .npz holds {sorted(arrays)}; it needs arrays 'x' and 'y' "
                             f"(or 'x_{split}' and 'y_{split}')")
    x, y = arrays[keys[0]], arrays[keys[1]]
    if x.ndim < 2:
        raise UserInputError(f"{where}: '{keys[0]}' has shape {x.shape}; give one row per example, (n, d) or "
                             "(n, C, H, W)")
    if np.asarray(y).ndim == 0:
        raise UserInputError(f"{where}: '{keys[1]}' is a single value; give one integer label per example, "
                             f"shape ({len(x)},)")
    if len(x) != len(y):
        raise UserInputError(f"{where}: {len(x)} inputs but {len(y)} labels")
    part = Part("npz", path, np.asarray(y), lambda sel: (x[sel] if len(x) else x, None, {}), [path], None,
                "file order")
    return part, list(keys)


def _idx_dir(folder: Path) -> dict[str, Path] | None:
    files = {role: idx.find_idx_file(folder, stem) for role, stem in idx.MNIST_FILES.items()}
    if files["train_images"] is None and files["test_images"] is None:
        return None
    return {k: v for k, v in files.items() if v is not None}


def _image_folder(root: Path) -> list[str] | None:
    train = root / "train"
    if not train.is_dir():
        return None
    classes = sorted(d.name for d in train.iterdir() if d.is_dir() and not d.name.startswith("."))
    return classes or None


def _decode_images(blobs: list[tuple[str, bytes]]) -> tuple[np.ndarray, tuple[int, ...]]:
    from PIL import Image, UnidentifiedImageError

    arrays, shape, mode = [], None, None
    for name, blob in blobs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(blob)) as im:
                    mode = mode or ("L" if im.mode in ("L", "1", "I;16", "I") else "RGB")
                    arr = np.asarray(im.convert(mode), dtype=np.uint8)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise UserInputError(f"{name} declares more pixels than an image PIL decodes safely ({first_line(exc)}); "
                                 "it was not decoded: remove it or resize it") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise UserInputError(f"{name} is not a readable image ({first_line(exc)})") from None
        arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        if shape is None:
            shape = arr.shape
        elif arr.shape != shape:
            raise UserInputError(f"{name} has shape {arr.shape} but earlier images have {shape}; resize all images "
                                 "to one size")
        arrays.append(arr.reshape(-1))
    return np.stack(arrays), tuple(int(s) for s in shape)


def _image_reader(root: Path, part: cifar.ImageSplit) -> Reader:
    def read(sel: np.ndarray) -> tuple[np.ndarray, tuple[int, ...] | None, dict[str, Any]]:
        blobs = [(part.names[int(i)], part.read(int(i))) for i in sel]
        x, shape = _decode_images([(f"{root}/{name}", blob) for name, blob in blobs])
        names = hashlib.sha256("".join(f"{name}\n" for name, _ in blobs).encode()).hexdigest()
        files = hashlib.sha256("".join(f"{name}\t{hashlib.sha256(b).hexdigest()}\n" for name, b in blobs).encode())
        return x, shape, {"selected_names_sha256": names, "selected_files_manifest_sha256": files.hexdigest()}

    return read


def open_folder(path: Path, split: str, where: str, npz: str = "x and y") -> Part:
    """One split of the data in a folder: IDX files, CIFAR-style batches or an image folder (`npz`: the
    arrays the error for a folder holding none of them suggests)."""
    files = _idx_dir(path)
    if files is not None:
        img, lab = f"{split}_images", f"{split}_labels"
        if img not in files or lab not in files:
            raise UserInputError(f"{where}: the IDX folder lacks the {split} files "
                                 f"({idx.MNIST_FILES[img]}, {idx.MNIST_FILES[lab]})")
        x = idx.read_idx_images(files[img])
        y = idx.read_idx_labels(files[lab])
        if len(x) != len(y):
            raise UserInputError(f"{where}: {len(x)} images but {len(y)} labels in the IDX files")
        shape = (1, int(x.shape[1]), int(x.shape[2]))
        return Part("idx", path, y, lambda sel: (x[sel], shape, {}), [files[img], files[lab]], None, "file order")
    batches = path / "cifar-10-batches-py" if (path / "cifar-10-batches-py").is_dir() else path
    if (batches / "data_batch_1").is_file():
        arr = cifar.read_cifar_python_dir(batches)
        xc, yc = (arr.x_train, arr.y_train) if split == "train" else (arr.x_test, arr.y_test)
        return Part("cifar-python", batches, yc, lambda sel: (xc[sel], (3, cifar.CIFAR_SIDE, cifar.CIFAR_SIDE), {}),
                    list(arr.files), list(arr.classes), "file order (data_batch_1..5, then test_batch)")
    classes = _image_folder(path)
    if classes is not None:
        tree = cifar.read_image_tree(path, classes)
        part = tree.train if split == "train" else tree.test
        return Part("image-folder", path, part.labels, _image_reader(path, part), [], classes,
                    "round-robin over classes; within a class files sorted by name (numbers compared numerically)")
    raise UserInputError(f"{where}: the folder holds neither MNIST IDX files, CIFAR-10 batches nor an image folder "
                         f"train/<class>/*; give a .npz with arrays {npz}")


def _subset(n_avail: int, n: int | None, seed: int) -> np.ndarray:
    """The audit's subset: `n` of `n_avail` positions drawn uniformly (seeded), sorted; all when n is None."""
    if n is None or n >= n_avail:
        return np.arange(n_avail)
    rng = np.random.default_rng([seed, n_avail])
    return np.sort(rng.choice(n_avail, size=n, replace=False))


# --- the audit: one split --------------------------------------------------------------------------


def load_split(source: str, split: str, n: int | None, seed: int = 0, data_dir: str | None = None) -> Split:
    """One split ('train' or 'test') of `source`, subsampled to `n` examples (seeded, sorted)."""
    where = f"--{split} {source}"
    if source in DATASETS:
        kw = {"n_train": n or 1000, "n_test": 1} if split == "train" else {"n_train": 1, "n_test": n or 200}
        ds = load_dataset(source, **kw, request=DataRequest(task="10class", sample="balanced", seed=seed,
                                                          data_dir=data_dir))
        x, y = (ds.x_train, ds.y_train) if split == "train" else (ds.x_test, ds.y_test)
        prov = {"source": "built-in", "dataset": source, "split": split, **ds.provenance}
        return _split(x, y, where, prov, tuple(ds.image_shape), list(ds.classes))
    path = Path(source).expanduser().absolute()
    if not path.exists():
        raise UserInputError(f"{where}: no such file or folder, and not a built-in data set ({', '.join(DATASETS)})")
    if not (path.is_file() or path.is_dir()):
        raise UserInputError(f"{where} is a named pipe, device or socket, not a file or folder (reading it could "
                             "block forever); give a .npz file or a data folder")
    if path.is_file():
        part, keys = _npz_part(path, split, where, single_ok=True)
        sel = _subset(len(part.labels), n, seed)
        x, _, _ = part.read(sel)
        prov = {**_file_prov(path, "npz"), "arrays": keys, "split": split, "n_available": int(len(part.labels)),
                "indices_sha256": index_digest(sel)}
        return _split(x, part.labels[sel] if len(part.labels) else part.labels, where, prov)
    part = open_folder(path, split, where)
    sel = _subset(len(part.labels), n, seed)
    x, shape, extra = part.read(sel)
    prov: dict[str, Any] = {"source": part.kind, "path": str(part.location), "split": split}
    if part.kind == "image-folder":
        prov.update(classes=part.classes, n_available=int(len(part.labels)),
                    selected_names_sha256=extra["selected_names_sha256"])
    else:
        prov.update(n_available=int(len(part.labels)), files=[_file_prov(f, part.kind) for f in part.files])
    prov["indices_sha256"] = index_digest(sel)
    return _split(x, part.labels[sel], where, prov, shape, part.classes)


# --- the experiments: a train/test data set ----------------------------------------------------------


def resolve_path(text: str, flag: str = "--dataset") -> Path:
    """The absolute path of a user data set, checked to exist (a one-line error otherwise)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise UserInputError(f"{flag} {text}: no such file or folder, and not a built-in data set "
                             f"({', '.join(DATASETS)}); give {' or '.join(DATASETS)} or the path of {USER_FORMATS}")
    if not (path.is_file() or path.is_dir()):
        raise UserInputError(f"{flag} {text} is a named pipe, device or socket, not a file or folder; give the path "
                             f"of {USER_FORMATS}")
    return path.absolute()


def open_user_data(path: str | Path, flag: str = "--dataset") -> dict[str, Part]:
    """The train and test parts of a user data set (a one-line error when it has no test split)."""
    root = resolve_path(str(path), flag)
    where = f"{flag} {path}"
    if root.is_file():
        return {s: _npz_part(root, s, where, single_ok=False)[0] for s in ("train", "test")}
    return {s: open_folder(root, s, where, NPZ_ARRAYS) for s in ("train", "test")}


def _class_names(parts: dict[str, Part], where: str) -> tuple[list[int], list[str]]:
    """(labels, names) of the classes of the training split, sorted by label."""
    train = parts["train"]
    y = _labels(train.labels, len(train.labels), where)
    if y.size and int(y.min()) < 0:
        raise UserInputError(f"{where}: label {int(y.min())} is negative; labels must be class indices 0..c-1")
    labels = sorted(int(v) for v in np.unique(y))
    if train.classes is not None:
        return labels, [train.classes[v] for v in labels]
    return labels, [str(v) for v in labels]


def check_data_options(dataset: str, task: str, classes: tuple[str, ...] | None,
                       data_dir: str | Path | None = None) -> None:
    """Refuse options that cannot apply, before any data is read: `data_dir` is for mnist / cifar10;
    `classes` is for a binary task on a PATH and names two different classes."""
    if data_dir is not None and dataset not in DATASETS:
        raise UserInputError("--data-dir says where mnist and cifar10 are found; with --dataset PATH leave it out")
    if not classes:
        return
    if dataset in DATASETS:
        raise UserInputError(f"--classes is for a data set given as PATH; {dataset}'s binary task is the "
                             "paper's pair (MNIST 3-vs-8, CIFAR-10 airplane-vs-automobile); to pick other "
                             "classes pass the data folder itself as --dataset PATH")
    if task != "binary":
        raise UserInputError("--classes names the two classes of a binary task; add --task binary")
    if len(classes) != 2:
        raise UserInputError(f"--classes must name exactly two classes, got {len(classes)}: {','.join(classes)}")
    if classes[0] == classes[1]:
        raise UserInputError(f"--classes names the same class twice ({','.join(classes)}); give two different ones")


def pick_classes(names: list[str], labels: list[int], task: str, classes: tuple[str, ...] | None,
                 src: str) -> tuple[int, ...]:
    """The labels the task keeps: every class (10class), or the two that `classes` names (binary),
    each by name or by index into the sorted class list."""
    check_data_options(src, task, classes)
    if task != "binary":
        if len(labels) < 2:
            raise UserInputError(f"--dataset {src}: the training split holds only the class {names}; a "
                                 "classification data set needs at least two classes")
        return tuple(labels)
    if not classes:
        raise UserInputError(f"--task binary on {src} needs --classes A,B naming two of its "
                             f"classes ({', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")
    keep = []
    for c in classes:
        if c in names:
            keep.append(labels[names.index(c)])
        elif c.isascii() and c.isdigit() and int(c) < len(names):
            keep.append(labels[int(c)])
        else:
            raise UserInputError(f"--classes: '{c}' is neither a class of {src} nor an index "
                                 f"0..{len(names) - 1}; its classes are {', '.join(names[:12])}")
    if keep[0] == keep[1]:
        raise UserInputError(f"--classes names the same class twice ({','.join(classes)}); give two different ones")
    return tuple(keep)


def load_user_dataset(path: str | Path, *, n_train: int, n_test: int, request: DataRequest | None = None,
                      classes: tuple[str, ...] | None = None) -> Dataset:
    """A train/test subset of the user data set at `path` (see the module docstring), with provenance. `request`
    gives the task, subset rule and seed (None: `DataRequest()`'s defaults); its `data_dir` and `source` are for
    mnist / cifar10 and play no part here."""
    request = DataRequest() if request is None else request
    task = check_choice("task", request.task, TASKS)
    sample = check_choice("sample", request.sample, SAMPLES)
    seed = request.seed
    where = f"--dataset {path}"
    parts = open_user_data(path)
    labels, names = _class_names(parts, where)
    keep = pick_classes(names, labels, task, classes, str(path))
    kept_names = [names[labels.index(k)] for k in keep]
    out: dict[str, Any] = {}
    prov_files: dict[str, dict[str, Any]] = {}
    extras: dict[str, Any] = {}
    image_shape: tuple[int, ...] | None = None
    for split, n in (("train", n_train), ("test", n_test)):
        part = parts[split]
        y = _labels(part.labels, len(part.labels), where)
        try:
            sel = select_indices(y, keep, n, sample, seed, split)
        except UserInputError as exc:
            raise UserInputError(f"{exc} in {path} ({task}, classes {', '.join(kept_names)})") from None
        raw, shape, extra = part.read(sel)
        flat, found = _image_shape_of(np.asarray(raw))
        image_shape = image_shape or shape or found or (int(flat.shape[1]),)
        out[f"x_{split}"] = to_unit(flat, where)
        out[f"y_{split}"] = relabel(y[sel], keep)
        out[f"{split}_indices_sha256"] = index_digest(sel)
        extras[f"{split}_available"] = int(len(y))
        if "selected_files_manifest_sha256" in extra:
            extras[f"{split}_selected_files_manifest_sha256"] = extra["selected_files_manifest_sha256"]
        for f in part.files:
            prov_files[str(f)] = {"path": str(f), "name": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)}
    kind, location = parts["train"].kind, parts["train"].location
    provenance = DataProvenance(
        dataset=str(path), task=task, source=kind, label=f"user data ({kind}): {location}", jpeg_reencoding=False,
        location=str(location), files=list(prov_files.values()), canonical_order=parts["train"].order,
        sample=sample, seed=seed, n_train=n_train, n_test=n_test, classes=kept_names,
        train_indices_sha256=out["train_indices_sha256"], test_indices_sha256=out["test_indices_sha256"],
        index_space="positions in the full split, canonical order", pixels=PIXELS,
        after={"source": {"user_data": True, "note": USER_NOTE},
               "files": {**({"files_note": "an image folder's files are recorded as train_/test_selected_files_"
                                           "manifest_sha256: the sha256 of one line 'name<TAB>sha256' per selected "
                                           "file"} if kind == "image-folder" else {}),
                         **extras},
               "classes": {"class_labels": list(keep), "all_classes": names},
               "index_space": {"image_shape": list(image_shape or ())}})
    return Dataset(str(path), task, out["x_train"], out["y_train"], out["x_test"], out["y_test"],
                   tuple(image_shape or ()), kept_names, provenance.to_dict())


def load_data(dataset: str, *, n_train: int, n_test: int, request: DataRequest | None = None,
              classes: tuple[str, ...] | None = None) -> Dataset:
    """The experiments' front-end: `mnist` / `cifar10` (`empirics.data.datasets.load_dataset`) or a PATH
    (`load_user_dataset`), drawn as `request` says (None: `DataRequest()`'s defaults). `classes` picks the two
    classes of a binary task on a PATH; MNIST and CIFAR-10 keep the paper's pairs (3-vs-8, airplane-vs-automobile)."""
    request = DataRequest() if request is None else request
    check_data_options(dataset, request.task, classes, request.data_dir)
    if dataset in DATASETS:
        return load_dataset(dataset, n_train=n_train, n_test=n_test, request=request)
    return load_user_dataset(dataset, n_train=n_train, n_test=n_test, request=request, classes=classes)
