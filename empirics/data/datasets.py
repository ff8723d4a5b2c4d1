"""Real MNIST and CIFAR-10 subsets, found on disk or taken from the bundled sample, with provenance.

`load_dataset` returns flattened float32 images in [0, 1] (channel-major C,H,W order) and int64
labels, for the 10-class task or the paper's binary tasks (MNIST 3-vs-8, CIFAR-10
airplane-vs-automobile), in a "first n" or a seeded class-balanced subset. Every dataset carries a
provenance dict: which files (with sha256), which source kind, which subset (digest of indices),
and, for the JPEG copy of CIFAR-10, a label saying the pixels are not the original ones. A data set
given as a PATH instead of a name is read by `empirics.data.userdata` (the front-end the experiments and the
audit share), which uses the subsets, digests and pixel scaling defined here.

Where the data is looked for, in order (the first location holding a usable copy wins):

1. the request's `data_dir` (`DataRequest`, `--data-dir`); if given, only there, and nothing usable is an error;
2. the folder in the environment variable `NTKM_DATA_DIR`;
3. `./data` and `../shared/data`, relative to the working directory;
4. the user cache, `$XDG_CACHE_HOME/ntk-malleability-suite/data` (default `~/.cache/...`),
   which is where `verify data download` puts files.

Inside a location: MNIST as `mnist/` (or `MNIST/raw/`, or the folder itself) holding the four
IDX files, gzip or raw; CIFAR-10 as `cifar-10-batches-py/` or `cifar-10-python.tar.gz` (in the
folder itself or in `cifar10/`), or an image folder `cifar10-jpeg/` or `cifar10/` (a tree
`train/<class>/*.jpg`, `test/<class>/*.jpg`, or a tarball of that tree). The original python
batches are preferred over an image folder. With `source="auto"` and nothing found anywhere, the
bundled sample (600 train + 200 test images per data set, cut from the real files) is used;
`source="bundled"` forces it, `source="full"` forbids it.

Canonical order ("first n"):

- IDX files and CIFAR python batches: the order in the files (data_batch_1..5 concatenated).
- Image folders: within a class, files sorted by name with numbers compared numerically; classes
  are then interleaved round-robin (image 0 of airplane, of automobile, ..., of truck, then image 1
  of each, ...), so the first n images cover all classes instead of being n airplanes.
- Bundled sample: the source's canonical order restricted to the bundled images. MNIST's
  bundled images are the first 60 (train) / 20 (test) of each class in the original files, so
  "first n" of the sample is *not* the first n of the full file; for the CIFAR-10 JPEG copy it is
  (its round-robin order puts those 600 images first). The sample holds 60 train / 20 test images
  per class, so binary tasks get at most 120 train and 40 test images from it.

The round-robin order of an image folder is not the order of the original python batches, so
"first n" on the JPEG copy and on the original CIFAR-10 are different images. Nothing decoded is
cached on disk: MNIST loads in well under a second and only the selected JPEGs are decoded.

Binary tasks keep only the two classes (in canonical order) and relabel them 0/1. "balanced"
draws n // k images per class (k = 2 or 10); the remainder goes one each to the lowest labels.
Within a class the draw is the prefix of a permutation seeded by (seed, split, class), so a
balanced subset of n images is contained in the one of n' > n images with the same seed. The
selected indices are returned in canonical order. Index digests in the provenance refer to
positions in the full original split (also for the bundled sample), so equal digests mean equal
images.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from empirics.data import cifar, idx
from empirics.data.download import (
    CIFAR10_ARCHIVE,
    CIFAR10_ARCHIVE_CHECKSUMS,
    CIFAR10_BATCH_MD5,
    MNIST_CONTENT,
    file_checksums,
)
from empirics.vocab import DATASETS
from ntkm.errors import UserInputError

TASKS = ("10class", "binary")
SAMPLES = ("first", "balanced")
SOURCES = ("auto", "full", "bundled")
PREPROCESSING = ("raw", "center", "standardize", "channel", "unit")
#: The networks' fixed input layer (`empirics.nets.models.ModelSpec.preprocess`, README "Input preprocessing").
INPUT_PREPROCESSINGS = ("raw", "channel", "unit")
ENV_VAR = "NTKM_DATA_DIR"
JPEG_LABEL = "CIFAR-10, JPEG re-encoding (quality ~75; not the original pixels)"
MNIST_CLASSES = [str(i) for i in range(10)]
#: Original labels kept by the binary task, in the order of their new labels 0, 1.
BINARY_CLASSES = {"mnist": (3, 8), "cifar10": (0, 1)}
IMAGE_SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
SAMPLE_DIR = Path(__file__).resolve().parent / "sample_data"
SAMPLE_JSON = "sample_data.json"
LABELS = {
    "idx": "MNIST (LeCun, Cortes, Burges), original IDX files",
    "cifar-python": "CIFAR-10 (Krizhevsky 2009), original python batches",
    "image-folder": "CIFAR-10, image folder",
    "image-tarball": "CIFAR-10, image-folder tarball",
}
HOW_TO_GET = (
    "pass --data-dir pointing at a folder holding mnist/ IDX files or CIFAR-10 batches "
    "(cifar-10-batches-py/ or cifar-10-python.tar.gz), set NTKM_DATA_DIR, "
    "or run `verify data download --dataset {name} --dest DIR`"
)


@dataclass(frozen=True)
class DataProvenance:
    """Where a data subset came from: the record every loader writes (a built-in data set found on disk, the bundled
    sample, a user data set by `empirics.data.userdata`), defined once. `to_dict()` is what a `Dataset` carries as its
    `provenance` and what records and claims.json store.

    The typed fields are the keys every loader writes. What only one loader knows (the checksums against the
    published ones, the sample's licence, a user data set's class names, ...) goes in `after`, by the typed key
    it follows in the stored dict, so each loader's stored key order stays as it was (records keep insertion
    order)."""

    dataset: str
    task: str
    source: str
    label: str
    jpeg_reencoding: bool
    location: str
    files: list[dict[str, Any]]
    canonical_order: str
    sample: str
    seed: int
    n_train: int
    n_test: int
    classes: list[str]
    train_indices_sha256: str
    test_indices_sha256: str
    index_space: str = "positions in the full original split, canonical order"
    pixels: str = "uint8 / 255 -> float32 in [0, 1], flattened C,H,W"
    after: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        core = [f.name for f in fields(self) if f.name != "after"]
        for anchor, extra in self.after.items():
            if anchor not in core:
                raise ValueError(f"DataProvenance.after: {anchor!r} is not one of its keys")
            clash = set(extra) & set(core)
            if clash:
                raise ValueError(f"DataProvenance.after[{anchor!r}] repeats its keys {sorted(clash)}")

    def to_dict(self) -> dict[str, Any]:
        """The stored dict: the typed keys in field order, each followed by what `after` puts there."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "after":
                out[f.name] = getattr(self, f.name)
                out.update(self.after.get(f.name, {}))
        return out


@dataclass(frozen=True)
class DataRequest:
    """How a subset is drawn and where a built-in data set is looked for: everything a loader takes but the sizes."""

    task: str = "10class"
    sample: str = "balanced"
    seed: int = 0
    data_dir: str | Path | None = None
    source: str = "auto"


@dataclass
class Dataset:
    """A train/test subset of MNIST, CIFAR-10 or a user data set: flattened float32 pixels in [0, 1], int64 labels."""

    name: str
    task: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, ...]
    classes: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])

    @property
    def d(self) -> int:
        return int(self.x_train.shape[1])


@dataclass
class DataSource:
    """Where a copy of a data set was found: its kind, the path and the files it will read."""

    dataset: str
    kind: str
    path: Path
    files: list[Path]
    found_by: str

    @property
    def jpeg_reencoding(self) -> bool:
        """An image folder of CIFAR-10 made of JPEG files is the re-encoded copy, not the original."""
        if self.kind == "image-tarball":
            return cifar.first_image_name(self.path).lower().endswith((".jpg", ".jpeg"))
        return self.kind == "image-folder" and _tree_has_jpeg(self.path)

    def describe(self) -> str:
        label = JPEG_LABEL if self.jpeg_reencoding else LABELS[self.kind]
        return f"{label}: {self.path} ({self.kind}, found via {self.found_by})"


def _tree_has_jpeg(root: Path) -> bool:
    folder = root / "train" / cifar.CIFAR10_CLASSES[0]
    return folder.is_dir() and any(p.suffix.lower() in (".jpg", ".jpeg") for p in folder.iterdir())


# --- locating data --------------------------------------------------------------------------------


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ntk-malleability-suite` (default `~/.cache/ntk-malleability-suite`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ntk-malleability-suite"


def default_download_dir() -> Path:
    """The data folder inside the user cache, searched last and used by `verify data download`."""
    return user_cache_dir() / "data"


def search_roots(data_dir: str | Path | None = None) -> list[tuple[Path, str]]:
    """The folders searched, in order, each with the reason it is searched."""
    if data_dir is not None:
        return [(Path(data_dir).expanduser(), "--data-dir")]
    roots: list[tuple[Path, str]] = []
    env = os.environ.get(ENV_VAR)
    if env:
        roots.append((Path(env).expanduser(), f"${ENV_VAR}"))
    roots.append((Path.cwd() / "data", "./data"))
    roots.append((Path.cwd().parent / "shared" / "data", "../shared/data"))
    roots.append((default_download_dir(), "user cache"))
    return roots


def _mnist_in(folder: Path) -> list[Path] | None:
    files = [idx.find_idx_file(folder, stem) for stem in idx.MNIST_FILES.values()]
    return None if any(f is None for f in files) else [f for f in files if f is not None]


def _cifar_candidates(root: Path) -> list[tuple[str, Path]]:
    """(kind, path) of the places a CIFAR-10 copy may sit in `root`, best first."""
    out: list[tuple[str, Path]] = []
    for base in (root, root / "cifar10", root / "CIFAR10"):
        for folder in (base / "cifar-10-batches-py", base):
            if (folder / "data_batch_1").is_file():
                out.append(("cifar-python", folder))
        if (base / CIFAR10_ARCHIVE).is_file():
            out.append(("cifar-python", base / CIFAR10_ARCHIVE))
    first_class = cifar.CIFAR10_CLASSES[0]
    for folder in (root / "cifar10-jpeg", root / "cifar10", root):
        if (folder / "train" / first_class).is_dir() and (folder / "test" / first_class).is_dir():
            out.append(("image-folder", folder))
        elif folder.is_dir() and folder != root:
            tars = sorted(
                p
                for p in folder.iterdir()
                if p.name.endswith((".tar.gz", ".tgz", ".tar")) and p.name != CIFAR10_ARCHIVE
            )
            out.extend(("image-tarball", p) for p in tars)
    if (root / "cifar10-jpeg.tar.gz").is_file():
        out.append(("image-tarball", root / "cifar10-jpeg.tar.gz"))
    return out


def find_data(name: str, data_dir: str | Path | None = None) -> tuple[DataSource | None, list[str]]:
    """The first usable copy of data set `name`, and the places searched (as human-readable lines).

    Only the presence and names of files are checked here; contents are checked when loaded.
    """
    name = check_choice("dataset", name, DATASETS)
    searched: list[str] = []
    for root, why in search_roots(data_dir):
        if not root.is_dir():
            searched.append(f"{root} ({why}; no such folder)")
            continue
        if name == "mnist":
            for folder in (root / "mnist", root / "MNIST" / "raw", root):
                files = _mnist_in(folder) if folder.is_dir() else None
                if files:
                    return DataSource(name, "idx", folder, files, why), searched
        else:
            for kind, path in _cifar_candidates(root):
                files = [path] if path.is_file() else []
                if kind == "cifar-python" and path.is_dir():
                    names = [*cifar.TRAIN_BATCHES, cifar.TEST_BATCH, cifar.META]
                    files = [path / b for b in names if (path / b).is_file()]
                return DataSource(name, kind, path, files, why), searched
        searched.append(f"{root} ({why}; no {name} files)")
    return None, searched


# --- hashing and opening sources --------------------------------------------------------------------

_HASHES: dict[tuple[str, int, int], dict[str, str]] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    p = path.resolve()
    st = p.stat()
    return str(p), st.st_mtime_ns, st.st_size


def file_digests(path: str | Path) -> dict[str, str]:
    """sha256 and md5 of a file, computed once per process for a given path, mtime and size."""
    key = _file_key(Path(path))
    if key not in _HASHES:
        _HASHES[key] = {k: v for k, v in file_checksums(key[0], ("sha256", "md5")).items() if k != "bytes"}
    return _HASHES[key]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file (memoised, see `file_digests`)."""
    return file_digests(path)["sha256"]


def _published(path: Path, content_sha256: str | None = None) -> bool | None:
    """Whether a file matches the checksum published for it (None: nothing published for this name)."""
    name = path.name
    if content_sha256 is not None:
        stem = name[:-3] if name.endswith(".gz") else name
        known = MNIST_CONTENT.get(stem)
        return None if known is None else known["sha256"] == content_sha256
    if name == CIFAR10_ARCHIVE:
        return file_sha256(path) == CIFAR10_ARCHIVE_CHECKSUMS["sha256"]
    if name in CIFAR10_BATCH_MD5:
        return file_digests(path)["md5"] == CIFAR10_BATCH_MD5[name]
    return None


def _file_record(path: Path, content_sha256: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "path": str(path),
        "name": path.name,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
    }
    if content_sha256 is not None:
        rec["content_sha256"] = content_sha256
    rec["matches_published_checksum"] = _published(path, content_sha256)
    return rec


Fetch = Callable[[np.ndarray], tuple[np.ndarray, dict[str, Any]]]


@dataclass
class _Split:
    """One split in canonical order: all labels, and a reader of the pixels at given positions."""

    labels: np.ndarray
    fetch: Fetch


@dataclass
class _Opened:
    train: _Split
    test: _Split
    canonical_order: str
    content_sha256: dict[str, str] = field(default_factory=dict)


def _array_split(x: np.ndarray, y: np.ndarray) -> _Split:
    return _Split(np.asarray(y, dtype=np.int64), lambda sel: (x[sel], {}))


def _image_split(split: cifar.ImageSplit, where: str, hash_files: bool) -> _Split:
    def fetch(sel: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        out = np.empty((len(sel), cifar.CIFAR_D), dtype=np.uint8)
        formats: set[str] = set()
        manifest = hashlib.sha256()
        for row, i in enumerate(sel):
            blob = split.read(int(i))
            out[row], fmt = cifar.decode_image(blob, f"{where}:{split.names[int(i)]}")
            formats.add(fmt)
            if hash_files:
                manifest.update(f"{split.names[int(i)]}\t{hashlib.sha256(blob).hexdigest()}\n".encode())
        info: dict[str, Any] = {"image_formats": sorted(formats)}
        if hash_files:
            info["selected_files_manifest_sha256"] = manifest.hexdigest()
        return out, info

    return _Split(split.labels, fetch)


_ROUND_ROBIN = "round-robin over classes; within a class files sorted by name (numbers compared numerically)"
_OPEN_CACHE: OrderedDict[tuple[Any, ...], _Opened] = OrderedDict()


def _open(src: DataSource) -> _Opened:
    """Read a source's labels (and arrays, where the format stores them together); cached per process."""
    if src.kind == "image-folder":
        tree = cifar.read_image_tree(src.path)
        return _Opened(
            _image_split(tree.train, str(src.path), True),
            _image_split(tree.test, str(src.path), True),
            _ROUND_ROBIN,
        )
    key = (src.kind, *((str(f.resolve()), f.stat().st_mtime_ns, f.stat().st_size) for f in src.files))
    if key in _OPEN_CACHE:
        _OPEN_CACHE.move_to_end(key)
        return _OPEN_CACHE[key]
    if src.kind == "idx":
        raw = [idx.read_idx_bytes(f) for f in src.files]
        content: dict[str, str] = {  # keyed by the resolved path, like the cache: a file found by another spelling
            str(f.resolve()): hashlib.sha256(b).hexdigest() for f, b in zip(src.files, raw, strict=True)}
        xtr, ytr, xte, yte = (
            idx.read_idx_images(src.files[0], raw[0]),
            idx.read_idx_labels(src.files[1], raw[1]),
            idx.read_idx_images(src.files[2], raw[2]),
            idx.read_idx_labels(src.files[3], raw[3]),
        )
        del raw
        for xs, ys, split in ((xtr, ytr, "train"), (xte, yte, "t10k")):
            if xs.shape[0] != ys.shape[0] or xs.shape[1:] != (28, 28):
                raise UserInputError(
                    f"MNIST {split} files in {src.path} disagree: {xs.shape[0]} images of {xs.shape[1:]} "
                    f"but {ys.shape[0]} labels; download them again"
                )
        opened = _Opened(
            _array_split(xtr.reshape(len(xtr), -1), ytr),
            _array_split(xte.reshape(len(xte), -1), yte),
            "file order",
            content,
        )
    elif src.kind == "cifar-python":
        arr = cifar.read_cifar_python_tarball(src.path) if src.path.is_file() else cifar.read_cifar_python_dir(src.path)
        opened = _Opened(
            _array_split(arr.x_train, arr.y_train),
            _array_split(arr.x_test, arr.y_test),
            "file order (data_batch_1..5, then test_batch)",
        )
    elif src.kind == "image-tarball":
        tree = cifar.read_image_tarball(src.path)
        opened = _Opened(
            _image_split(tree.train, str(src.path), False),
            _image_split(tree.test, str(src.path), False),
            _ROUND_ROBIN,
        )
    else:
        raise ValueError(f"unknown source kind {src.kind}")
    _OPEN_CACHE[key] = opened
    while len(_OPEN_CACHE) > 2:
        _OPEN_CACHE.popitem(last=False)
    return opened


# --- subsets ----------------------------------------------------------------------------------------


def check_choice(what: str, value: str, valid: tuple[str, ...]) -> str:
    """`value` if it is one of `valid`, else a one-line error listing them."""
    if value not in valid:
        raise UserInputError(f"unknown {what} {value!r}; valid values: {', '.join(valid)}")
    return value


def select_indices(labels: np.ndarray, keep: tuple[int, ...], n: int, sample: str, seed: int, split: str) -> np.ndarray:
    """Positions (into `labels`, canonical order) of a `first` or seeded `balanced` subset of size n.

    `keep` lists the labels the task uses. Raises `UserInputError` when too few images exist.
    """
    labels = np.asarray(labels)
    pool = np.flatnonzero(np.isin(labels, keep))
    if n > len(pool):
        raise UserInputError(f"n_{split}={n} asked, but only {len(pool)} {split} images of this task are available")
    if sample == "first":
        return pool[:n]
    base, rem = divmod(n, len(keep))
    parts = []
    for j, c in enumerate(keep):
        want = base + (1 if j < rem else 0)
        of_class = np.flatnonzero(labels == c)
        if want > len(of_class):
            raise UserInputError(
                f"a balanced {split} subset of {n} needs {want} images of class {c} but only "
                f"{len(of_class)} exist; ask for fewer or use sample='first'"
            )
        rng = np.random.default_rng([seed, 0 if split == "train" else 1, int(c)])
        parts.append(of_class[rng.permutation(len(of_class))[:want]])
    return np.sort(np.concatenate(parts))


def index_digest(indices: np.ndarray) -> str:
    """sha256 of the indices as little-endian int64 (names a subset without storing it)."""
    return hashlib.sha256(np.asarray(indices, dtype="<i8").tobytes()).hexdigest()


def _task_labels(name: str, task: str) -> tuple[tuple[int, ...], list[str]]:
    names = MNIST_CLASSES if name == "mnist" else cifar.CIFAR10_CLASSES
    keep = BINARY_CLASSES[name] if task == "binary" else tuple(range(10))
    return keep, [names[c] for c in keep]


def relabel(y: np.ndarray, keep: tuple[int, ...]) -> np.ndarray:
    """Labels `keep[j]` -> j (int64); every label in `y` must be one of `keep`."""
    y = np.asarray(y, dtype=np.int64)
    lut = np.full(max(max(keep), int(y.max(initial=0))) + 1, -1, dtype=np.int64)
    lut[list(keep)] = np.arange(len(keep))
    return lut[y]


def to_unit(x: np.ndarray, where: str = "the data") -> np.ndarray:
    """Inputs as float32 in [0, 1]: uint8 pixels are divided by 255; other numbers must already lie in
    [0, 1] (attacks use eps in pixel units and clip to [0, 1]). Anything else is a one-line error."""
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x, dtype=np.float32) / np.float32(255.0)
    if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
        raise UserInputError(f"{where}: inputs have dtype {x.dtype}; give floats in [0, 1] or uint8 pixels")
    xf = x.astype(np.float32)
    bad = ~np.isfinite(xf)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise UserInputError(f"{where}: inputs contain NaN or Inf (first in example {row}); clean the data")
    lo, hi = float(xf.min()), float(xf.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise UserInputError(f"{where}: inputs range over [{lo:.3g}, {hi:.3g}] but must lie in [0, 1] (eps is in "
                             "pixel units and attacks clip to [0, 1]); scale the data and move any normalisation "
                             "into the model")
    return np.clip(xf, 0.0, 1.0)


# --- bundled sample -----------------------------------------------------------------------------------


def sample_info() -> dict[str, Any]:
    """The bundled sample's JSON record (sources, checksums, indices, licences)."""
    path = SAMPLE_DIR / SAMPLE_JSON
    if not path.is_file():
        raise UserInputError(
            f"the bundled sample is missing ({path}); reinstall the package or run "
            "`python -m empirics.data.make_sample --data-dir DIR`"
        )
    return json.loads(path.read_text())


def _read_sample(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any], Path]:
    info = sample_info()["datasets"][name]
    path = SAMPLE_DIR / info["npz"]
    if not path.is_file() or file_sha256(path) != info["npz_sha256"]:
        raise UserInputError(
            f"the bundled sample {path} is missing or altered (sha256 mismatch); reinstall the package"
        )
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}, info, path


# --- public API ---------------------------------------------------------------------------------------


def load_dataset(name: str, *, n_train: int, n_test: int, request: DataRequest | None = None) -> Dataset:
    """Load a train/test subset of MNIST or CIFAR-10 (see the module docstring for every choice; `request`: the
    task, subset rule, seed and where to look, None for `DataRequest()`'s defaults)."""
    request = DataRequest() if request is None else request
    name = check_choice("dataset", name, DATASETS)
    task = check_choice("task", request.task, TASKS)
    sample = check_choice("sample", request.sample, SAMPLES)
    source = check_choice("source", request.source, SOURCES)
    seed, data_dir = request.seed, request.data_dir
    for what, n in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise UserInputError(f"{what} must be a positive integer (got {n!r})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserInputError(f"seed must be a non-negative integer (got {seed!r})")
    n_train, n_test = int(n_train), int(n_test)
    request = DataRequest(task, sample, int(seed), data_dir, source)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise UserInputError(f"--data-dir {data_dir} is not a folder; {HOW_TO_GET.format(name=name)}")

    if source == "bundled":
        return _load_bundled(name, request, n_train, n_test, searched=None)
    src, searched = find_data(name, data_dir)
    if src is None:
        where = "; ".join(searched)
        if data_dir is not None or source == "full":
            raise UserInputError(f"no usable {name} data found (looked in {where}); {HOW_TO_GET.format(name=name)}")
        return _load_bundled(name, request, n_train, n_test, searched=searched)
    return _load_source(src, request, n_train, n_test)


def _load_source(src: DataSource, request: DataRequest, n_train: int, n_test: int) -> Dataset:
    name = src.dataset
    task, sample, seed = request.task, request.sample, request.seed
    keep, classes = _task_labels(name, task)
    opened = _open(src)
    out: dict[str, Any] = {}
    fetch_info: dict[str, Any] = {}
    for split, part, n in (("train", opened.train, n_train), ("test", opened.test, n_test)):
        try:
            sel = select_indices(part.labels, keep, n, sample, seed, split)
        except UserInputError as exc:
            raise UserInputError(f"{exc} in {name} ({task}) at {src.path}") from None
        pixels, info = part.fetch(sel)
        out[f"x_{split}"] = to_unit(pixels)
        out[f"y_{split}"] = relabel(part.labels[sel], keep)
        out[f"{split}_indices_sha256"] = index_digest(sel)
        fetch_info.update({f"{split}_{k}": v for k, v in info.items()})
    formats = set(fetch_info.get("train_image_formats", [])) | set(fetch_info.get("test_image_formats", []))
    jpeg = src.kind in ("image-folder", "image-tarball") and "JPEG" in formats
    files = [_file_record(f, opened.content_sha256.get(str(f.resolve()))) for f in src.files]
    published = [f["matches_published_checksum"] for f in files]
    provenance = DataProvenance(
        dataset=name, task=task, source=src.kind, label=JPEG_LABEL if jpeg else LABELS[src.kind],
        jpeg_reencoding=jpeg, location=str(src.path), files=files, canonical_order=opened.canonical_order,
        sample=sample, seed=seed, n_train=n_train, n_test=n_test, classes=classes,
        train_indices_sha256=out["train_indices_sha256"], test_indices_sha256=out["test_indices_sha256"],
        after={"location": {"found_by": src.found_by},
               "files": {"published_checksums": _published_summary(published),
                         **{k: v for k, v in fetch_info.items() if not k.endswith("image_formats")}},
               "pixels": {"image_formats": sorted(formats)} if formats else {}})
    return _dataset(name, task, out, classes, provenance.to_dict())


def _published_summary(flags: list[bool | None]) -> str:
    if flags and all(f is True for f in flags):
        return "all files match the published checksums"
    if any(f is False for f in flags):
        return "some files differ from the published checksums"
    return "no published checksums for these files"


def _load_bundled(name: str, request: DataRequest, n_train: int, n_test: int, searched: list[str] | None) -> Dataset:
    """The subset `request` draws from the bundled sample (`searched`: the places looked in first, None when the
    sample was asked for)."""
    task, sample, seed = request.task, request.sample, request.seed
    arrays, info, path = _read_sample(name)
    keep, classes = _task_labels(name, task)
    out: dict[str, Any] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        labels = arrays[f"y_{split}"].astype(np.int64)
        available = int(np.isin(labels, keep).sum())
        if n > available:
            raise UserInputError(
                f"the bundled {name} sample holds only {available} {split} images for the {task} task "
                f"(n_{split}={n} asked); get the full data: {HOW_TO_GET.format(name=name)}"
            )
        sel = select_indices(labels, keep, n, sample, seed, split)
        out[f"x_{split}"] = to_unit(arrays[f"x_{split}"][sel])
        out[f"y_{split}"] = relabel(labels[sel], keep)
        out[f"{split}_indices_sha256"] = index_digest(arrays[f"{split}_source_index"][sel])
    tail: dict[str, Any] = {"licence": info["licence"]}
    if searched is not None:
        tail["note"] = "no full copy found, so the bundled sample was used; searched: " + "; ".join(searched)
    provenance = DataProvenance(
        dataset=name, task=task, source="bundled-sample",
        label=f"bundled sample of {JPEG_LABEL if info['jpeg_reencoding'] else info['source_label']}",
        jpeg_reencoding=bool(info["jpeg_reencoding"]), location=str(path), files=[_file_record(path)],
        canonical_order="source's canonical order restricted to the bundled images", sample=sample, seed=seed,
        n_train=n_train, n_test=n_test, classes=classes, train_indices_sha256=out["train_indices_sha256"],
        test_indices_sha256=out["test_indices_sha256"],
        after={"files": {"derived_from": {"source": info["source_kind"], "files": info["files"]}}, "pixels": tail})
    return _dataset(name, task, out, classes, provenance.to_dict())


def _dataset(name: str, task: str, out: dict[str, np.ndarray], classes: list[str],
             provenance: dict[str, Any]) -> Dataset:
    """A `Dataset` from the selected train/test arrays in `out`."""
    return Dataset(name, task, out["x_train"], out["y_train"], out["x_test"], out["y_test"],
                   IMAGE_SHAPES[name], classes, provenance)


def input_statistics(reference: np.ndarray, channels: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel standardisation of flattened C,H,W inputs as one shift and one scale per coordinate: the mean
    and standard deviation over every pixel of a channel in `reference` (a constant channel gets scale 1)."""
    ref = np.asarray(reference, dtype=np.float64)
    n, d = ref.shape
    if channels < 1 or d % channels:
        raise UserInputError(f"{channels} channels do not divide the input dimension {d}")
    per = ref.reshape(n, channels, d // channels)
    mu, sd = per.mean(axis=(0, 2)), per.std(axis=(0, 2))
    return np.repeat(mu, d // channels), np.repeat(np.where(sd > 0, sd, 1.0), d // channels)


def preprocess(x: np.ndarray, mode: str, reference: np.ndarray | None = None, channels: int = 1) -> np.ndarray:
    """`raw` (as is), `center` (subtract the per-pixel mean), `standardize` (also divide by the
    per-pixel std; constant pixels stay 0), `channel` (per-channel standardisation, `input_statistics`)
    or `unit` (`channel`, then each row scaled to unit Euclidean norm). Statistics come from `reference`
    (default: `x` itself), so test data can be transformed with training statistics. Returns float64.
    `channel` and `unit` are the networks' input layer (`empirics.nets.models.apply_preprocess`) in numpy."""
    mode = check_choice("preprocessing", mode, PREPROCESSING)
    x = np.asarray(x, dtype=np.float64)
    if mode == "raw":
        return x
    ref = x if reference is None else np.asarray(reference, dtype=np.float64)
    if mode in ("channel", "unit"):
        shift, scale = input_statistics(ref, channels)
        h = (x - shift) / scale
        return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-30) if mode == "unit" else h
    mu = ref.mean(axis=0)
    if mode == "center":
        return x - mu
    sd = ref.std(axis=0)
    return (x - mu) / np.where(sd > 0, sd, 1.0)


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """A compressed .npz with fixed zip timestamps, so the same arrays give the same bytes."""
    from ntkm.io import atomic_write_bytes

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue(), compresslevel=9)
    atomic_write_bytes(path, buf.getvalue())
