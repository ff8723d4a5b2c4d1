"""Real-data loading: MNIST IDX, CIFAR-10 python batches and image folders, subsets, provenance,
the bundled sample, and the refusal of malicious pickles.

Real files come from `../shared/data` (present in CI); tests that need them skip with a reason
when the folder is absent. CIFAR-10 python batches are not available there, so they are written
here in the original format (including a Python-2 style pickle as the published files are).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from empirics.data import cifar, idx
from empirics.data import datasets as D
from empirics.data.download import MNIST_CONTENT, _fetch, verify_checksum
from ntkm.errors import UserInputError
from ntkm.io import sha256_file

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
HEX64 = 64


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED / "mnist").is_dir():
        pytest.skip(f"real data folder {SHARED} is absent (CI provides it at ../shared/data)")
    return SHARED.resolve()


@pytest.fixture(scope="session")
def mnist_raw(shared_data: Path) -> dict[str, np.ndarray]:
    """The real MNIST arrays read independently of the loader (gzip + numpy)."""
    out = {}
    for key, stem in idx.MNIST_FILES.items():
        data = gzip.decompress((shared_data / "mnist" / f"{stem}.gz").read_bytes())
        header = 16 if "images" in key else 8
        arr = np.frombuffer(data, dtype=np.uint8, offset=header)
        out[key] = arr.reshape(-1, 784) if "images" in key else arr
    return out


@pytest.fixture(autouse=True)
def _isolated_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees a user's $NTKM_DATA_DIR or cache; ./data is the test's own tmp folder."""
    monkeypatch.delenv(D.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _idx_bytes(arr: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in arr.shape) + arr.tobytes()


def _write_tiny_mnist(folder: Path, n_train: int = 30, n_test: int = 20, gz: bool = True) -> dict[str, np.ndarray]:
    """Synthetic but well-formed MNIST IDX files (labels cycle 0..9)."""
    rng = np.random.default_rng(1)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": (np.arange(n_train) % 10).astype(np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": (np.arange(n_test) % 10).astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for key, stem in idx.MNIST_FILES.items():
        data = _idx_bytes(arrays[key], idx.IMAGES_MAGIC if "images" in key else idx.LABELS_MAGIC)
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / stem).write_bytes(data)
    return arrays


# --- MNIST ------------------------------------------------------------------------------------------


def test_real_mnist_first_matches_idx(shared_data: Path, mnist_raw: dict[str, np.ndarray]) -> None:
    ds = D.load_dataset("mnist", n_train=200, n_test=50,
                        request=D.DataRequest(sample="first", data_dir=shared_data, source="full"))
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_train.shape == (200, 784) and ds.x_test.shape == (50, 784) and ds.d == 784
    assert ds.image_shape == (1, 28, 28) and ds.num_classes == 10 and ds.classes == [str(i) for i in range(10)]
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0 and ds.x_train.max() == 1.0
    np.testing.assert_array_equal(np.rint(ds.x_train * 255).astype(np.uint8), mnist_raw["train_images"][:200])
    np.testing.assert_array_equal(ds.y_train, mnist_raw["train_labels"][:200])
    np.testing.assert_array_equal(ds.y_test, mnist_raw["test_labels"][:50])
    prov = ds.provenance
    assert prov["source"] == "idx" and prov["jpeg_reencoding"] is False
    assert prov["published_checksums"] == "all files match the published checksums"
    for rec in prov["files"]:
        assert rec["sha256"] == sha256_file(rec["path"]) and len(rec["sha256"]) == HEX64
    assert prov["train_indices_sha256"] == D.index_digest(np.arange(200))
    assert prov["test_indices_sha256"] == D.index_digest(np.arange(50))


def test_full_mnist_available(shared_data: Path) -> None:
    ds = D.load_dataset("mnist", n_train=60000, n_test=10000,
                        request=D.DataRequest(sample="first", data_dir=shared_data))
    assert (ds.n_train, ds.n_test) == (60000, 10000)
    with pytest.raises(UserInputError, match="60000"):
        D.load_dataset("mnist", n_train=60001, n_test=1, request=D.DataRequest(sample="first", data_dir=shared_data))


def test_gzip_and_raw_idx_identical(shared_data: Path, tmp_path: Path) -> None:
    raw_dir = tmp_path / "raw" / "mnist"
    raw_dir.mkdir(parents=True)
    for stem in idx.MNIST_FILES.values():
        (raw_dir / stem).write_bytes(gzip.decompress((shared_data / "mnist" / f"{stem}.gz").read_bytes()))
    a = D.load_dataset("mnist", n_train=300, n_test=100, request=D.DataRequest(seed=3, data_dir=shared_data))
    b = D.load_dataset("mnist", n_train=300, n_test=100, request=D.DataRequest(seed=3, data_dir=tmp_path / "raw"))
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert [f["content_sha256"] for f in a.provenance["files"]] == [f["content_sha256"] for f in b.provenance["files"]]
    assert b.provenance["published_checksums"] == "all files match the published checksums"
    assert a.provenance["train_indices_sha256"] == b.provenance["train_indices_sha256"]


def test_idx_roundtrip_and_corruption(tmp_path: Path) -> None:
    arrays = _write_tiny_mnist(tmp_path / "mnist")
    ds = D.load_dataset("mnist", n_train=30, n_test=20, request=D.DataRequest(sample="first", data_dir=tmp_path))
    np.testing.assert_array_equal(ds.x_train, arrays["train_images"].reshape(30, -1).astype(np.float32) / 255)
    assert ds.provenance["published_checksums"] == "some files differ from the published checksums"

    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    good = images.read_bytes()
    images.write_bytes(good[: len(good) // 2])
    with pytest.raises(UserInputError, match="corrupt or truncated gzip"):
        D.load_dataset("mnist", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))

    raw = gzip.decompress(good)
    images.write_bytes(gzip.compress(raw[:-100], mtime=0))
    with pytest.raises(UserInputError, match="truncated or corrupt"):
        D.load_dataset("mnist", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))

    images.write_bytes(gzip.compress(struct.pack(">I", 2049) + raw[4:], mtime=0))
    with pytest.raises(UserInputError, match="magic number 2049, expected 2051"):
        D.load_dataset("mnist", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))

    images.write_bytes(b"\x00\x00")
    with pytest.raises(UserInputError, match="truncated"):
        idx.read_idx_images(images)


def test_idx_count_mismatch(tmp_path: Path) -> None:
    _write_tiny_mnist(tmp_path / "mnist")
    labels = np.zeros(29, dtype=np.uint8)
    (tmp_path / "mnist" / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(labels, 2049)))
    with pytest.raises(UserInputError, match="disagree"):
        D.load_dataset("mnist", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))


# --- CIFAR-10 python batches ----------------------------------------------------------------------


def _py2_pickle(obj: object) -> bytes:
    """A protocol-2 pickle as Python 2's cPickle wrote the CIFAR-10 batches: str as BINSTRING,
    arrays through numpy.core.multiarray._reconstruct (the module path of that time)."""
    out = bytearray(b"\x80\x02")

    def s(b: bytes) -> None:
        out.extend((b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b))

    def emit(o: object) -> None:
        if isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                emit(v)
            out.extend(b"e")
        elif isinstance(o, bool):
            out.extend(b"\x88" if o else b"\x89")
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, (bytes, str)):
            s(o if isinstance(o, bytes) else o.encode("latin1"))
        elif isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85")
            s(b"b")
            out.extend(b"\x87R(K\x01")
            for dim in o.shape:
                out.extend(b"J" + struct.pack("<i", dim))
            out.extend(b"\x86" if o.ndim == 2 else b"\x85")
            out.extend(b"cnumpy\ndtype\n")
            s(b"u1")
            out.extend(b"K\x00K\x01\x87R(K\x03")
            s(b"|")
            out.extend(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
            s(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    out.extend(b".")
    return bytes(out)


def _write_cifar_batches(folder: Path, per_batch: int = 20, style: str = "py2") -> dict[str, np.ndarray]:
    """Five training batches and a test batch in the published layout, plus batches.meta."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for name in [*cifar.TRAIN_BATCHES, cifar.TEST_BATCH]:
        x = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, per_batch)]
        if style == "py2":
            batch = {
                "batch_label": f"training batch of {name}",
                "labels": y,
                "data": x,
                "filenames": [f"img_{i}.png" for i in range(per_batch)],
            }
            (folder / name).write_bytes(_py2_pickle(batch))
        else:
            batch3 = {
                b"batch_label": name.encode(),
                b"labels": y,
                b"data": x,
                b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)],
            }
            (folder / name).write_bytes(pickle.dumps(batch3, protocol=4))
        xs.append(x)
        ys.append(np.array(y))
    meta = {"num_cases_per_batch": per_batch, "label_names": list(cifar.CIFAR10_CLASSES), "num_vis": 3072}
    if style == "py2":
        (folder / cifar.META).write_bytes(_py2_pickle(meta))
    else:
        meta3 = {
            b"num_cases_per_batch": per_batch,
            b"num_vis": 3072,
            b"label_names": [c.encode() for c in cifar.CIFAR10_CLASSES],
        }
        (folder / cifar.META).write_bytes(pickle.dumps(meta3, protocol=4))
    return {
        "x_train": np.concatenate(xs[:5]),
        "y_train": np.concatenate(ys[:5]),
        "x_test": xs[5],
        "y_test": ys[5],
    }


@pytest.mark.parametrize("style", ["py2", "py3"])
def test_cifar_python_batches(tmp_path: Path, style: str) -> None:
    exp = _write_cifar_batches(tmp_path / "cifar-10-batches-py", style=style)
    ds = D.load_dataset("cifar10", n_train=100, n_test=20, request=D.DataRequest(sample="first", data_dir=tmp_path))
    np.testing.assert_array_equal(ds.x_train, exp["x_train"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_train, exp["y_train"])
    np.testing.assert_array_equal(ds.x_test, exp["x_test"].astype(np.float32) / 255)
    assert ds.image_shape == (3, 32, 32) and ds.d == 3072
    prov = ds.provenance
    assert prov["source"] == "cifar-python" and prov["jpeg_reencoding"] is False
    assert prov["label"] == D.LABELS["cifar-python"]
    assert len(prov["files"]) == 7 and all(len(f["sha256"]) == HEX64 for f in prov["files"])
    assert prov["published_checksums"] == "some files differ from the published checksums"


def test_cifar_python_tarball_equals_folder(tmp_path: Path) -> None:
    exp = _write_cifar_batches(tmp_path / "src" / "cifar-10-batches-py")
    root = tmp_path / "tarred"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tf:
        tf.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    ds = D.load_dataset("cifar10", n_train=100, n_test=20, request=D.DataRequest(sample="first", data_dir=root))
    assert ds.provenance["source"] == "cifar-python"
    assert ds.provenance["files"][0]["name"] == "cifar-10-python.tar.gz"
    np.testing.assert_array_equal(ds.x_train, exp["x_train"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_test, exp["y_test"])


def test_cifar_batch_format_checks(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar_batches(folder)
    bad = {b"data": np.zeros((3, 100), dtype=np.uint8), b"labels": [0, 1, 2]}
    (folder / "data_batch_2").write_bytes(pickle.dumps(bad))
    with pytest.raises(UserInputError, match="not a uint8 array"):
        D.load_dataset("cifar10", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))
    (folder / "data_batch_2").write_bytes(b"\x80\x02}q\x00(U\x04data")
    with pytest.raises(UserInputError, match="corrupt or truncated"):
        D.load_dataset("cifar10", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))
    (folder / "data_batch_2").unlink()
    with pytest.raises(UserInputError, match="lacks data_batch_2"):
        D.load_dataset("cifar10", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))


class _Evil:
    """Unpickling this runs a shell command (the attack a crafted data file would carry)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class _EvilEval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return eval, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.mark.parametrize("payload", [_Evil, _EvilEval])
def test_malicious_pickle_is_refused(tmp_path: Path, payload: type) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar_batches(folder)
    marker = tmp_path / "pwned"
    evil = {b"data": payload(marker), b"labels": [0]}
    (folder / "data_batch_1").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(UserInputError, match="refused for safety"):
        D.load_dataset("cifar10", n_train=5, n_test=5, request=D.DataRequest(data_dir=tmp_path))
    assert not marker.exists()
    with open(folder / "data_batch_1", "rb") as f:
        with pytest.raises(pickle.UnpicklingError, match="refused global"):
            cifar.SafeUnpickler(f).load()
    assert not marker.exists()
    pickle.loads((folder / "data_batch_1").read_bytes())  # plain pickle runs it: the payload is live
    assert marker.exists()


# --- image folders --------------------------------------------------------------------------------


def _write_image_tree(root: Path, n_train: int = 12, n_test: int = 3, fmt: str = "PNG") -> dict[str, list]:
    """Per split, per class: a list of (file name, uint8 CHW pixels) in natural name order."""
    rng = np.random.default_rng(3)
    ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
    out: dict[str, list] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        out[split] = []
        for cls in cifar.CIFAR10_CLASSES:
            d = root / split / cls
            d.mkdir(parents=True, exist_ok=True)
            items = []
            for i in range(n):
                hwc = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                path = d / f"{i}.{ext}"
                Image.fromarray(hwc).save(path, format=fmt, **({"quality": 75} if fmt == "JPEG" else {}))
                with Image.open(path) as im:
                    decoded = np.asarray(im.convert("RGB"))
                items.append(decoded.transpose(2, 0, 1).reshape(-1))
            out[split].append(items)
    return out


def _round_robin(per_class: list[list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for k in range(max(len(c) for c in per_class)):
        for label, items in enumerate(per_class):
            if k < len(items):
                xs.append(items[k])
                ys.append(label)
    return np.stack(xs), np.array(ys)


def test_image_tree_and_tarball(tmp_path: Path) -> None:
    tree = tmp_path / "data" / "cifar10-jpeg"
    exp = _write_image_tree(tree)
    x_exp, y_exp = _round_robin(exp["train"])
    a = D.load_dataset("cifar10", n_train=120, n_test=30,
                       request=D.DataRequest(sample="first", data_dir=tmp_path / "data"))
    assert a.provenance["source"] == "image-folder" and a.provenance["jpeg_reencoding"] is False
    assert a.provenance["canonical_order"].startswith("round-robin")
    assert len(a.provenance["train_selected_files_manifest_sha256"]) == HEX64
    np.testing.assert_array_equal(a.x_train, x_exp.astype(np.float32) / 255)
    np.testing.assert_array_equal(a.y_train, y_exp)
    np.testing.assert_array_equal(a.y_train[:10], np.arange(10))  # "first" is spread over classes

    tar_root = tmp_path / "tarred" / "cifar10-jpeg"
    tar_root.mkdir(parents=True)
    with tarfile.open(tar_root / "images.tar.gz", "w:gz") as tf:
        tf.add(tree, arcname="prefix")
    b = D.load_dataset("cifar10", n_train=120, n_test=30,
                       request=D.DataRequest(sample="first", data_dir=tmp_path / "tarred"))
    assert b.provenance["source"] == "image-tarball"
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))


def test_jpeg_tree_is_labelled(tmp_path: Path) -> None:
    exp = _write_image_tree(tmp_path / "cifar10-jpeg", n_train=2, n_test=1, fmt="JPEG")
    ds = D.load_dataset("cifar10", n_train=20, n_test=10, request=D.DataRequest(sample="first", data_dir=tmp_path))
    assert ds.provenance["jpeg_reencoding"] is True and ds.provenance["label"] == D.JPEG_LABEL
    x_exp, _ = _round_robin(exp["train"])
    np.testing.assert_array_equal(ds.x_train, x_exp.astype(np.float32) / 255)


def test_image_tree_wrong_size_and_missing_class(tmp_path: Path) -> None:
    _write_image_tree(tmp_path / "cifar10-jpeg", n_train=1, n_test=1)
    Image.new("RGB", (28, 28)).save(tmp_path / "cifar10-jpeg" / "train" / "airplane" / "0.png")
    with pytest.raises(UserInputError, match="must be 32x32"):
        D.load_dataset("cifar10", n_train=10, n_test=10, request=D.DataRequest(sample="first", data_dir=tmp_path))
    for p in (tmp_path / "cifar10-jpeg" / "test" / "truck").iterdir():
        p.unlink()
    with pytest.raises(UserInputError, match="lacks the classes"):
        D.load_dataset("cifar10", n_train=10, n_test=10, request=D.DataRequest(data_dir=tmp_path))


def test_shared_cifar_jpeg_copy(shared_data: Path) -> None:
    ds = D.load_dataset("cifar10", n_train=50, n_test=20, request=D.DataRequest(data_dir=shared_data, source="full"))
    prov = ds.provenance
    assert prov["source"] == "image-tarball" and prov["jpeg_reencoding"] is True
    assert prov["label"] == D.JPEG_LABEL == "CIFAR-10, JPEG re-encoding (quality ~75; not the original pixels)"
    assert prov["files"][0]["sha256"] == sha256_file(shared_data / "cifar10-jpeg" / "cifar10-jpeg.tar.gz")
    assert ds.x_train.shape == (50, 3072) and 0 <= ds.x_train.min() and ds.x_train.max() <= 1
    assert np.bincount(ds.y_train).tolist() == [5] * 10


# --- subsets --------------------------------------------------------------------------------------


def test_balanced_subsets(shared_data: Path) -> None:
    a = D.load_dataset("mnist", n_train=203, n_test=40, request=D.DataRequest(seed=5, data_dir=shared_data))
    counts = np.bincount(a.y_train, minlength=10)
    assert counts.tolist() == [21, 21, 21] + [20] * 7
    assert np.bincount(a.y_test).tolist() == [4] * 10
    b = D.load_dataset("mnist", n_train=203, n_test=40, request=D.DataRequest(seed=5, data_dir=shared_data))
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.provenance["train_indices_sha256"] == b.provenance["train_indices_sha256"]
    c = D.load_dataset("mnist", n_train=203, n_test=40, request=D.DataRequest(seed=6, data_dir=shared_data))
    assert c.provenance["train_indices_sha256"] != a.provenance["train_indices_sha256"]


def test_select_indices_nested_and_sorted() -> None:
    labels = np.arange(1000) % 10
    small = D.select_indices(labels, tuple(range(10)), 50, "balanced", 3, "train")
    big = D.select_indices(labels, tuple(range(10)), 200, "balanced", 3, "train")
    assert set(small) <= set(big) and np.all(np.diff(big) > 0)
    first = D.select_indices(labels, (3, 8), 6, "first", 0, "train")
    assert first.tolist() == [3, 8, 13, 18, 23, 28]
    with pytest.raises(UserInputError, match="only 1000"):
        D.select_indices(labels, tuple(range(10)), 1001, "first", 0, "train")
    skewed = np.array([0] * 5 + [1] * 100)
    with pytest.raises(UserInputError, match="needs 10 images of class 0 but only 5"):
        D.select_indices(skewed, (0, 1), 20, "balanced", 0, "train")


def test_binary_tasks(shared_data: Path, mnist_raw: dict[str, np.ndarray]) -> None:
    ds = D.load_dataset("mnist", n_train=100, n_test=30,
                        request=D.DataRequest(task="binary", sample="first", data_dir=shared_data))
    assert set(np.unique(ds.y_train)) == {0, 1} and ds.classes == ["3", "8"] and ds.num_classes == 2
    orig = mnist_raw["train_labels"]
    pos = np.flatnonzero((orig == 3) | (orig == 8))[:100]
    np.testing.assert_array_equal(ds.y_train, (orig[pos] == 8).astype(np.int64))
    np.testing.assert_array_equal(np.rint(ds.x_train * 255).astype(np.uint8), mnist_raw["train_images"][pos])
    cf = D.load_dataset("cifar10", n_train=40, n_test=10, request=D.DataRequest(task="binary", source="bundled"))
    assert cf.classes == ["airplane", "automobile"] and np.bincount(cf.y_train).tolist() == [20, 20]


def test_bad_arguments(tmp_path: Path) -> None:
    for kwargs, pattern in [
        ({"name": "svhn"}, "valid values: mnist, cifar10"),
        ({"task": "5class"}, "valid values: 10class, binary"),
        ({"sample": "random"}, "valid values: first, balanced"),
        ({"source": "web"}, "valid values: auto, full, bundled"),
        ({"n_train": 0}, "n_train must be a positive integer"),
        ({"n_test": -3}, "n_test must be a positive integer"),
        ({"seed": -1}, "seed must be a non-negative"),
        ({"data_dir": tmp_path / "nope"}, "is not a folder"),
    ]:
        args = {"name": "mnist", "n_train": 10, "n_test": 10, **kwargs}
        name = args.pop("name")
        sizes = {k: args.pop(k) for k in ("n_train", "n_test")}
        with pytest.raises(UserInputError, match=pattern):
            D.load_dataset(name, **sizes, request=D.DataRequest(**args))


# --- locating data, bundled sample ----------------------------------------------------------------


def test_nothing_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    with pytest.raises(UserInputError) as err:
        D.load_dataset("mnist", n_train=10, n_test=10, request=D.DataRequest(data_dir=empty))
    msg = str(err.value)
    assert "\n" not in msg and str(empty) in msg
    assert "--data-dir" in msg and "NTKM_DATA_DIR" in msg and "verify data download" in msg
    with pytest.raises(UserInputError, match="no usable mnist data"):
        D.load_dataset("mnist", n_train=10, n_test=10, request=D.DataRequest(source="full"))
    ds = D.load_dataset("mnist", n_train=10, n_test=10)
    assert ds.provenance["source"] == "bundled-sample" and "searched" in ds.provenance["note"]


def test_search_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_dir, cwd = tmp_path / "env", tmp_path / "work"
    _write_tiny_mnist(env_dir / "mnist")
    _write_tiny_mnist(cwd / "data" / "MNIST" / "raw", gz=False)
    monkeypatch.chdir(cwd)
    src, _ = D.find_data("mnist")
    assert src is not None and src.found_by == "./data" and src.path.name == "raw"
    monkeypatch.setenv(D.ENV_VAR, str(env_dir))
    src, _ = D.find_data("mnist")
    assert src is not None and src.found_by == f"${D.ENV_VAR}"
    src, searched = D.find_data("cifar10")
    assert src is None or src.found_by == "../shared/data"
    assert any(str(env_dir) in s for s in searched)


def test_bundled_sample(shared_data: Path, mnist_raw: dict[str, np.ndarray]) -> None:
    info = D.sample_info()["datasets"]
    m = D.load_dataset("mnist", n_train=600, n_test=200, request=D.DataRequest(sample="first", source="bundled"))
    assert m.provenance["source"] == "bundled-sample" and m.provenance["jpeg_reencoding"] is False
    assert m.provenance["files"][0]["sha256"] == info["mnist"]["npz_sha256"]
    src_idx = np.array(info["mnist"]["train_source_index"])
    np.testing.assert_array_equal(np.rint(m.x_train * 255).astype(np.uint8), mnist_raw["train_images"][src_idx])
    np.testing.assert_array_equal(m.y_train, mnist_raw["train_labels"][src_idx])
    test_idx = np.array(info["mnist"]["test_source_index"])
    np.testing.assert_array_equal(np.rint(m.x_test * 255).astype(np.uint8), mnist_raw["test_images"][test_idx])
    assert np.bincount(m.y_train).tolist() == [60] * 10
    assert m.provenance["train_indices_sha256"] == D.index_digest(src_idx)

    c = D.load_dataset("cifar10", n_train=600, n_test=200, request=D.DataRequest(sample="first", source="bundled"))
    assert c.provenance["jpeg_reencoding"] is True and D.JPEG_LABEL in c.provenance["label"]
    assert info["cifar10"]["train_source_index"] == list(range(600))
    full = D.load_dataset("cifar10", n_train=600, n_test=200,
                          request=D.DataRequest(sample="first", data_dir=shared_data))
    assert np.abs(c.x_train - full.x_train).max() <= 2 / 255  # same JPEG decoded (exact with the same Pillow)
    np.testing.assert_array_equal(c.y_train, full.y_train)
    assert c.provenance["train_indices_sha256"] == full.provenance["train_indices_sha256"]


def test_bundled_sample_limits() -> None:
    b = D.load_dataset("mnist", n_train=120, n_test=40, request=D.DataRequest(task="binary", source="bundled"))
    assert (b.n_train, b.n_test) == (120, 40) and b.classes == ["3", "8"]
    with pytest.raises(UserInputError, match="bundled mnist sample holds only 120 train images"):
        D.load_dataset("mnist", n_train=121, n_test=10, request=D.DataRequest(task="binary", source="bundled"))
    with pytest.raises(UserInputError, match="only 600 train images.*verify data download"):
        D.load_dataset("cifar10", n_train=1000, n_test=10, request=D.DataRequest(source="bundled"))
    s = D.load_dataset("mnist", n_train=25, n_test=7,
                       request=D.DataRequest(sample="balanced", seed=2, source="bundled"))
    assert (s.n_train, s.n_test) == (25, 7)


def test_make_sample_is_reproducible(shared_data: Path, tmp_path: Path) -> None:
    from empirics.data.make_sample import make_one

    rec = make_one("mnist", shared_data, tmp_path)
    assert rec["npz_sha256"] == D.sample_info()["datasets"]["mnist"]["npz_sha256"]
    assert sha256_file(tmp_path / "mnist.npz") == sha256_file(D.SAMPLE_DIR / "mnist.npz")
    total = sum((D.SAMPLE_DIR / f).stat().st_size for f in ("mnist.npz", "cifar10.npz"))
    assert total < 3_000_000
    assert (D.SAMPLE_DIR / "LICENSE.md").is_file()


def test_preprocess() -> None:
    x = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 4.0]])
    np.testing.assert_array_equal(D.preprocess(x, "raw"), x)
    np.testing.assert_allclose(D.preprocess(x, "center").mean(axis=0), 0)
    z = D.preprocess(x, "standardize")
    np.testing.assert_allclose(z[:, [0, 2]].std(axis=0), 1)
    assert np.all(z[:, 1] == 0)
    with pytest.raises(UserInputError, match="valid values: raw, center, standardize"):
        D.preprocess(x, "whiten")


# --- downloader checksums -------------------------------------------------------------------------


def test_verify_checksum(tmp_path: Path) -> None:
    f = tmp_path / "blob.bin"
    f.write_bytes(b"hello world")
    sha = hashlib.sha256(b"hello world").hexdigest()
    got = verify_checksum(f, {"sha256": sha, "md5": hashlib.md5(b"hello world").hexdigest(), "bytes": "11"})
    assert got["sha256"] == sha
    with pytest.raises(UserInputError, match="checksum mismatch .* sha256"):
        verify_checksum(f, {"sha256": "0" * 64})
    gz = tmp_path / "blob.gz"
    gz.write_bytes(gzip.compress(b"hello world"))
    verify_checksum(gz, {"sha256": sha}, content=True)
    with pytest.raises(UserInputError, match="cannot read"):
        verify_checksum(tmp_path / "missing", {"sha256": sha})


def test_fetch_verifies_before_keeping(shared_data: Path, tmp_path: Path) -> None:
    """The download path on a local file:// URL: kept when the content checksum matches, else removed."""
    src = shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz"
    target = tmp_path / src.name
    want = {"sha256": MNIST_CONTENT["t10k-labels-idx1-ubyte"]["sha256"]}
    _fetch([src.as_uri()], target, want, True, quiet=True)
    assert target.read_bytes() == src.read_bytes()
    bad_target = tmp_path / "other" / src.name
    bad_target.parent.mkdir()
    with pytest.raises(UserInputError, match="could not download"):
        _fetch([src.as_uri()], bad_target, {"sha256": "0" * 64}, True, quiet=True)
    assert list(bad_target.parent.iterdir()) == []


def test_write_npz_deterministic(tmp_path: Path) -> None:
    arrays = {"a": np.arange(5, dtype=np.uint8), "b": np.eye(3)}
    D.write_npz(tmp_path / "x.npz", arrays)
    D.write_npz(tmp_path / "y.npz", arrays)
    assert (tmp_path / "x.npz").read_bytes() == (tmp_path / "y.npz").read_bytes()
    with np.load(tmp_path / "x.npz") as z:
        np.testing.assert_array_equal(z["b"], np.eye(3))


def test_sample_json_is_valid() -> None:
    doc = json.loads((D.SAMPLE_DIR / D.SAMPLE_JSON).read_text())
    for name, rec in doc["datasets"].items():
        assert rec["n_train"] == 600 and rec["n_test"] == 200 and len(rec["train_source_index"]) == 600
        assert all(len(f["sha256"]) == HEX64 for f in rec["files"])
        assert "licence" in rec and name in D.DATASETS
        with np.load(D.SAMPLE_DIR / rec["npz"]) as z:
            assert z["x_train"].dtype == np.uint8
            np.testing.assert_array_equal(z["train_source_index"], rec["train_source_index"])


def test_image_decode_rejects_garbage() -> None:
    with pytest.raises(UserInputError, match="not a readable image"):
        cifar.decode_image(b"not an image", "x.jpg")
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(buf, format="PNG")
    px, fmt = cifar.decode_image(buf.getvalue(), "red.png")
    assert fmt == "PNG" and px[:1024].min() == 255 and px[1024:].max() == 0  # channel-major C,H,W


def test_verify_data_info(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verify.cli import main

    assert main(["data", "info", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "found: MNIST" in out and D.JPEG_LABEL in out and "bundled sample: 600 train" in out
    assert main(["data", "download"]) == 2
    assert "needs --dataset" in capsys.readouterr().err


def _provenance(**after: dict) -> D.DataProvenance:
    return D.DataProvenance(dataset="d", task="10class", source="npz", label="L", jpeg_reencoding=False, location="/x",
                            files=[], canonical_order="o", sample="first", seed=0, n_train=2, n_test=1,
                            classes=["a", "b"], train_indices_sha256="t", test_indices_sha256="u", after=after)


def test_data_provenance_puts_each_loaders_keys_after_their_anchor() -> None:
    core = [f.name for f in dataclasses.fields(D.DataProvenance) if f.name != "after"]
    assert list(_provenance().to_dict()) == core
    keys = list(_provenance(source={"s1": 1, "s2": 2}, pixels={"p": 3}).to_dict())
    assert keys == [*core[:3], "s1", "s2", *core[3:], "p"]
    with pytest.raises(ValueError, match="not one of its keys"):
        _provenance(nowhere={"k": 1})
    with pytest.raises(ValueError, match="repeats its keys"):
        _provenance(files={"seed": 1})


def test_every_loader_writes_one_provenance_record(tmp_path: Path) -> None:
    """The bundled sample, a data set found on disk and a user data set all record `DataProvenance`: its keys in its
    field order, with what only that loader knows in between."""
    from empirics.data.userdata import load_user_dataset

    _write_cifar_batches(tmp_path / "cifar-10-batches-py")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "u.npz", x_train=rng.random((8, 4)), y_train=np.arange(8) % 2, x_test=rng.random((4, 4)),
             y_test=np.arange(4) % 2)
    core = [f.name for f in dataclasses.fields(D.DataProvenance) if f.name != "after"]
    for ds in (D.load_dataset("mnist", n_train=20, n_test=10, request=D.DataRequest(source="bundled")),
               D.load_dataset("cifar10", n_train=20, n_test=10, request=D.DataRequest(data_dir=tmp_path)),
               load_user_dataset(tmp_path / "u.npz", n_train=8, n_test=4)):
        assert [k for k in ds.provenance if k in core] == core, ds.provenance["source"]
        assert ds.provenance["train_indices_sha256"] and ds.provenance["n_train"] == ds.n_train
