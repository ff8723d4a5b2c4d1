"""A data set given as a PATH (`empirics.data.userdata`): IDX folders, image folders, CIFAR-style batches and
.npz files built here from the bundled sample, read back and checked against the arrays they were
built from; class-balanced and "first n" subsets; binary tasks by `--classes`; provenance; refusal of
pickles that would run code; and `verify malleability | ntk-distance | landscape --dataset PATH` end
to end at toy sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tolerances import F32_ROUNDING

from empirics.data import cifar
from empirics.data import datasets as D
from empirics.data.userdata import load_data, load_split, load_user_dataset
from ntkm.errors import UserInputError
from verify.cli import main

CLASSES3 = ["cat", "dog", "ship"]
PER_CLASS = {"train": 6, "test": 3}
TOY = ["--preset", "smoke", "--seeds", "1", "--n-train", "12", "--n-test", "6", "--epochs", "2"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sample() -> dict[str, dict[str, np.ndarray]]:
    """The bundled sample's uint8 arrays (MNIST and CIFAR-10), read straight from its .npz files."""
    out = {}
    for name in D.DATASETS:
        with np.load(D.SAMPLE_DIR / D.sample_info()["datasets"][name]["npz"], allow_pickle=False) as z:
            out[name] = {k: z[k] for k in z.files}
    return out


@pytest.fixture(scope="module")
def idx_folder(sample, tmp_path_factory) -> Path:
    """The bundled MNIST sample as the four raw IDX files."""
    d = tmp_path_factory.mktemp("idx")
    a = sample["mnist"]
    for stem, split in (("train", "train"), ("t10k", "test")):
        x, y = a[f"x_{split}"], a[f"y_{split}"]
        (d / f"{stem}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, len(x), 28, 28) + x.tobytes())
        (d / f"{stem}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, len(y)) + y.tobytes())
    return d


@pytest.fixture(scope="module")
def image_folder(sample, tmp_path_factory) -> tuple[Path, dict[str, dict[str, list[np.ndarray]]]]:
    """Three CIFAR-10 classes of the bundled sample as lossless PNGs `split/<class>/<i>.png`, and the
    (3, 32, 32) uint8 images written, per split and class in file-number order."""
    root = tmp_path_factory.mktemp("imgs")
    a = sample["cifar10"]
    written: dict[str, dict[str, list[np.ndarray]]] = {}
    for split, k in PER_CLASS.items():
        written[split] = {}
        for c in CLASSES3:
            label = cifar.CIFAR10_CLASSES.index(c)
            rows = a[f"x_{split}"][a[f"y_{split}"] == label][:k].reshape(-1, 3, 32, 32)
            (root / split / c).mkdir(parents=True)
            for i, img in enumerate(rows):
                Image.fromarray(img.transpose(1, 2, 0)).save(root / split / c / f"{i}.png")
            written[split][c] = list(rows)
    return root, written


def test_idx_folder_reads_the_arrays_it_was_built_from(idx_folder, sample):
    ds = load_user_dataset(idx_folder, n_train=50, n_test=20, request=D.DataRequest(sample="first"))
    a = sample["mnist"]
    np.testing.assert_array_equal(ds.x_train, a["x_train"][:50].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_test, a["y_test"][:20])
    assert ds.image_shape == (1, 28, 28) and ds.classes == [str(i) for i in range(10)] and ds.num_classes == 10
    prov = ds.provenance
    assert prov["user_data"] is True and "user-supplied" in prov["note"] and prov["source"] == "idx"
    assert {f["name"]: f["sha256"] for f in prov["files"]} == {p.name: _sha(p) for p in idx_folder.iterdir()}
    assert prov["train_indices_sha256"] == hashlib.sha256(np.arange(50, dtype="<i8").tobytes()).hexdigest()


def test_balanced_subset_is_the_one_of_the_same_images_as_a_built_in(idx_folder):
    """The IDX folder holds the bundled sample in its order, so a seeded balanced subset must pick the
    same images as the bundled-sample loader does."""
    ds = load_user_dataset(idx_folder, n_train=40, n_test=20, request=D.DataRequest(seed=3))
    ref = D.load_dataset("mnist", n_train=40, n_test=20, request=D.DataRequest(seed=3, source="bundled"))
    np.testing.assert_array_equal(ds.x_train, ref.x_train)
    np.testing.assert_array_equal(ds.y_train, ref.y_train)
    np.testing.assert_array_equal(ds.x_test, ref.x_test)
    assert np.bincount(ds.y_train).tolist() == [4] * 10
    other = load_user_dataset(idx_folder, n_train=40, n_test=20, request=D.DataRequest(seed=4))
    assert other.provenance["train_indices_sha256"] != ds.provenance["train_indices_sha256"]


def test_image_folder_round_robin_first_n_and_manifest(image_folder):
    root, written = image_folder
    ds = load_user_dataset(root, n_train=9, n_test=6, request=D.DataRequest(sample="first"))
    expect = [written["train"][c][i] for i in range(3) for c in CLASSES3]
    np.testing.assert_array_equal(ds.x_train, np.stack(expect).reshape(9, -1).astype(np.float32) / 255)
    assert ds.y_train.tolist() == [0, 1, 2] * 3 and ds.classes == CLASSES3 and ds.image_shape == (3, 32, 32)
    names = [f"train/{c}/{i}.png" for i in range(3) for c in CLASSES3]
    manifest = "".join(f"{n}\t{_sha(root / n)}\n" for n in names)
    prov = ds.provenance
    assert prov["train_selected_files_manifest_sha256"] == hashlib.sha256(manifest.encode()).hexdigest()
    assert prov["all_classes"] == CLASSES3 and prov["user_data"] is True


def test_binary_task_by_names_or_indices(image_folder):
    root, written = image_folder
    by_name = load_user_dataset(root, n_train=6, n_test=4, classes=("ship", "cat"),
                                request=D.DataRequest(task="binary", sample="first"))
    assert by_name.classes == ["ship", "cat"] and by_name.provenance["class_labels"] == [2, 0]
    # canonical order interleaves cat, ship; ship is label 0 of the task, cat label 1
    assert by_name.y_train.tolist() == [1, 0] * 3
    np.testing.assert_array_equal(by_name.x_train[1], written["train"]["ship"][0].reshape(-1) / np.float32(255))
    by_index = load_user_dataset(root, n_train=6, n_test=4, classes=("2", "0"),
                                 request=D.DataRequest(task="binary", sample="first"))
    np.testing.assert_array_equal(by_index.x_train, by_name.x_train)
    balanced = load_user_dataset(root, n_train=6, n_test=4, classes=("cat", "dog"),
                                 request=D.DataRequest(task="binary", seed=1))
    assert np.bincount(balanced.y_train).tolist() == [3, 3]


def test_audit_and_experiments_read_one_image_folder_alike(image_folder):
    """The audit's `load_split` and the experiments' loader share the reader: same images, same order."""
    root, _ = image_folder
    split = load_split(str(root), "test", None)
    ds = load_user_dataset(root, n_train=3, n_test=9, request=D.DataRequest(sample="first"))
    np.testing.assert_array_equal(split.x, ds.x_test)
    np.testing.assert_array_equal(split.y, ds.y_test)


def test_npz_with_four_arrays(tmp_path: Path):
    rng = np.random.default_rng(0)
    x_tr, x_te = rng.random((20, 5, 5, 3)), rng.random((8, 5, 5, 3))
    y_tr, y_te = np.arange(20) % 4, np.arange(8) % 4
    np.savez(tmp_path / "d.npz", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    ds = load_user_dataset(tmp_path / "d.npz", n_train=20, n_test=8, request=D.DataRequest(sample="first"))
    np.testing.assert_allclose(ds.x_train[3], x_tr[3].transpose(2, 0, 1).reshape(-1), rtol=F32_ROUNDING)
    assert ds.image_shape == (3, 5, 5) and ds.num_classes == 4 and ds.provenance["files"][0]["sha256"] == _sha(
        tmp_path / "d.npz")


def _cifar_style(folder: Path, a: dict[str, np.ndarray]) -> None:
    """The bundled CIFAR-10 sample as five data batches, a test batch and batches.meta (pickle protocol 2)."""
    folder.mkdir(parents=True)
    for i, part in enumerate(np.array_split(np.arange(len(a["x_train"])), 5)):
        batch = {b"data": a["x_train"][part], b"labels": [int(v) for v in a["y_train"][part]]}
        (folder / f"data_batch_{i + 1}").write_bytes(pickle.dumps(batch, protocol=2))
    test = {b"data": a["x_test"], b"labels": [int(v) for v in a["y_test"]]}
    (folder / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
    meta = {b"label_names": [c.encode() for c in cifar.CIFAR10_CLASSES]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


def test_cifar_style_batches(tmp_path: Path, sample):
    a = sample["cifar10"]
    _cifar_style(tmp_path / "batches", a)
    ds = load_user_dataset(tmp_path / "batches", n_train=30, n_test=10, classes=("airplane", "truck"),
                           request=D.DataRequest(sample="first", task="binary"))
    keep = np.flatnonzero(np.isin(a["y_train"], [0, 9]))[:30]
    np.testing.assert_array_equal(ds.x_train, a["x_train"][keep].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_train, (a["y_train"][keep] == 9).astype(np.int64))
    assert len(ds.provenance["files"]) == 7


class _Payload:
    """Unpickling this would run `touch MARKER` (the attack a crafted batch would carry)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_batch_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path, sample, capsys):
    _cifar_style(tmp_path / "batches", sample["cifar10"])
    marker = tmp_path / "pwned"
    evil = pickle.dumps({b"data": _Payload(marker), b"labels": [0]}, protocol=2)
    (tmp_path / "batches" / "data_batch_3").write_bytes(evil)
    with pytest.raises(UserInputError, match="refused for safety"):
        load_user_dataset(tmp_path / "batches", n_train=10, n_test=5)
    code = main(["malleability", "--dataset", str(tmp_path / "batches"), *TOY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "refused for safety" in err and "\n" not in err and "Traceback" not in err
    assert not marker.exists()
    pickle.loads(evil)  # a plain unpickler runs it: the payload is live, so the refusal above is real
    assert marker.exists()


@pytest.mark.parametrize("make, args, match", [
    (lambda r: r / "nope", [], "no such file or folder"),
    (lambda r: r / "empty", [], "neither MNIST IDX files.*x_train, y_train, x_test, y_test"),
    (lambda r: r / "not_data.txt", [], "must be a NumPy .npz with arrays x_train"),
    (lambda r: r / "imgs", ["--task", "binary"], r"needs --classes A,B naming two of its classes \(cat, dog, ship\)"),
    (lambda r: r / "imgs", ["--task", "binary", "--classes", "cat,cow"], "'cow' is neither a class"),
    (lambda r: r / "imgs", ["--task", "binary", "--classes", "cat,dog,ship"], "exactly two"),
    (lambda r: r / "imgs", ["--classes", "cat,dog"], "add --task binary"),
    (lambda r: r / "imgs", ["--data-dir", "."], "leave it out"),
    (lambda r: "mnist", ["--task", "binary", "--classes", "1,7"], "for a data set given as PATH"),
    (lambda r: r / "train_only", [], "holds no test/<class>/<image> files"),
    (lambda r: r / "idx_train_only", [], "lacks the test files"),
    (lambda r: r / "single.npz", [], r"one split \(x, y\) and no test split; save arrays x_train, y_train, x_test"),
])
def test_bad_user_data_is_one_line(tmp_path: Path, image_folder, idx_folder, make, args, match, capsys):
    root, _ = image_folder
    (tmp_path / "imgs").symlink_to(root)
    (tmp_path / "train_only" / "train").mkdir(parents=True)
    (tmp_path / "train_only" / "train" / "cat").symlink_to(root / "train" / "cat")
    (tmp_path / "idx_train_only").mkdir()
    for p in idx_folder.glob("train-*"):
        (tmp_path / "idx_train_only" / p.name).symlink_to(p)
    np.savez(tmp_path / "single.npz", x=np.zeros((4, 3)), y=np.zeros(4))
    (tmp_path / "empty").mkdir()
    (tmp_path / "not_data.txt").write_text("hello")
    code = main(["malleability", "--dataset", str(make(tmp_path)), *args, *TOY])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err
    assert re.search(match, err), err


def test_built_in_data_sets_keep_their_binary_pair():
    ds = load_data("mnist", n_train=20, n_test=10, request=D.DataRequest(task="binary", source="bundled"))
    assert ds.classes == ["3", "8"]


def _run(tmp_path: Path, name: str, argv: list[str]) -> dict:
    out = tmp_path / f"{name}.json"
    assert main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_malleability_on_an_idx_folder(tmp_path: Path, idx_folder):
    rec = _run(tmp_path, "m", ["malleability", "--dataset", str(idx_folder), "--model", "relu", "--attack", "fgsm",
                               "--intervention", "transformed", "--width", "16", *TOY])
    prov = rec["data"]
    assert rec["config"]["dataset"] == str(idx_folder) and prov["user_data"] is True
    assert {f["name"]: f["sha256"] for f in prov["files"]} == {p.name: _sha(p) for p in idx_folder.iterdir()}
    ref = load_user_dataset(idx_folder, n_train=12, n_test=6, request=D.DataRequest(seed=0))
    assert prov["train_indices_sha256"] == ref.provenance["train_indices_sha256"]
    assert rec["runs"] and prov["classes"] == [str(i) for i in range(10)]


def test_malleability_on_an_image_folder_binary(tmp_path: Path, image_folder):
    root, _ = image_folder
    rec = _run(tmp_path, "m", ["malleability", "--dataset", str(root), "--task", "binary", "--classes", "dog,ship",
                               "--model", "relu", "--attack", "fgsm", "--intervention", "transformed",
                               "--width", "16", *TOY])
    prov = rec["data"]
    assert rec["config"]["classes"] == ["dog", "ship"] and prov["classes"] == ["dog", "ship"]
    assert prov["source"] == "image-folder" and prov["user_data"] is True
    assert len(prov["train_selected_files_manifest_sha256"]) == 64


def test_ntk_distance_and_landscape_take_a_path(tmp_path: Path, image_folder):
    root, _ = image_folder
    nd = _run(tmp_path, "nd", ["ntk-distance", "--dataset", str(root), "--model", "relu", "--widths", "8,16", *TOY])
    assert nd["data"]["source"] == "image-folder" and nd["data"]["all_classes"] == CLASSES3
    land = _run(tmp_path, "land", ["landscape", "--dataset", str(root), "--model", "relu", "--width", "8", *TOY])
    assert land["data"]["user_data"] is True and land["config"]["dataset"] == str(root)


def test_provenance_is_the_same_whichever_spelling_found_the_files(idx_folder, tmp_path: Path):
    """The opened-data cache is keyed by resolved paths; the per-file content digests must be looked up the same way,
    or a second spelling of the same folder (a symlink, `..`) loses them within one process."""
    from empirics.data.datasets import load_dataset

    root = idx_folder.parent if idx_folder.name == "mnist" else idx_folder
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    recs = [load_dataset("mnist", n_train=20, n_test=10,
                         request=D.DataRequest(seed=0, data_dir=d, source="full")).provenance
            for d in (root, link, root / ".." / root.name)]
    digests = [[f.get("content_sha256") for f in r["files"]] for r in recs]
    assert all(d == digests[0] for d in digests) and all(digests[0])
    assert len({r["published_checksums"] for r in recs}) == 1
