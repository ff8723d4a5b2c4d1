"""Regenerate the bundled sample (`empirics/data/sample_data/`) from real MNIST and CIFAR-10 files.

    python -m empirics.data.make_sample --data-dir ../shared/data

For each data set: the first 60 training and the first 20 test images of every class, in the
source's canonical order (see `empirics.data.datasets`), stored as uint8 in a compressed .npz with
fixed zip timestamps, so the same source files always give the same bytes. A JSON file records
the source files and their sha256, the source indices of every bundled image, and licence notes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from empirics.data import datasets as D
from ntkm.errors import UserInputError
from ntkm.io import atomic_write_text, sha256_file

PER_CLASS = {"train": 60, "test": 20}
LICENCES = {
    "mnist": "MNIST: Creative Commons Attribution-Share Alike 3.0 (Yann LeCun, Corinna Cortes, "
    "Christopher J.C. "
    "Burges). Derived from NIST Special Databases 1 and 3.",
    "cifar10": "CIFAR-10: Alex Krizhevsky, 'Learning Multiple Layers of Features from Tiny Images', 2009 "
    "(https://www.cs.toronto.edu/~kriz/cifar.html); cite the report when using the data; see its terms.",
}


def first_per_class(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Positions of the first `per_class` images of each class, in canonical order."""
    picks = [np.flatnonzero(labels == c)[:per_class] for c in range(10)]
    for c, p in enumerate(picks):
        if len(p) < per_class:
            raise UserInputError(f"class {c} has only {len(p)} images; a sample needs {per_class}")
    return np.sort(np.concatenate(picks))


def make_one(name: str, data_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Cut the sample of one data set, write its .npz, and return its JSON record."""
    src, searched = D.find_data(name, data_dir)
    if src is None:
        raise UserInputError(
            f"no {name} data in {data_dir} ({'; '.join(searched)}); point --data-dir at the real files"
        )
    opened = D._open(src)
    arrays: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {}
    formats: set[str] = set()
    for split, part in (("train", opened.train), ("test", opened.test)):
        sel = first_per_class(part.labels, PER_CLASS[split])
        pixels, info = part.fetch(sel)
        formats |= set(info.get("image_formats", []))
        arrays[f"x_{split}"] = pixels.astype(np.uint8)
        arrays[f"y_{split}"] = part.labels[sel].astype(np.uint8)
        arrays[f"{split}_source_index"] = sel.astype(np.int32)
        record[f"{split}_source_index"] = [int(i) for i in sel]
    jpeg = "JPEG" in formats
    npz = out_dir / f"{name}.npz"
    D.write_npz(npz, arrays)
    files = [{"name": f.name, "bytes": f.stat().st_size, "sha256": D.file_sha256(f)} for f in src.files]
    return {
        "npz": npz.name,
        "npz_sha256": sha256_file(npz),
        "npz_bytes": npz.stat().st_size,
        "source_kind": src.kind,
        "source_label": D.JPEG_LABEL if jpeg else D.LABELS[src.kind],
        "jpeg_reencoding": jpeg,
        "files": files,
        "canonical_order": opened.canonical_order,
        "selection": f"first {PER_CLASS['train']} train and first {PER_CLASS['test']} test images "
        "of each class "
        "in canonical order",
        "n_train": len(record["train_source_index"]),
        "n_test": len(record["test_source_index"]),
        "image_shape": list(D.IMAGE_SHAPES[name]),
        "decoder": _pillow_version() if formats else "none (raw arrays)",
        "licence": LICENCES[name],
        **record,
    }


def _dumps(doc: dict[str, Any]) -> str:
    """Indented JSON, but with lists of numbers on one line (the index lists are long)."""
    text = json.dumps(doc, indent=1)
    return (
        re.sub(
            r"\[[\d,\s]+\]",
            lambda m: "[" + ", ".join(m.group(0)[1:-1].split()).replace(",,", ",") + "]",
            text,
        )
        + "\n"
    )


def _pillow_version() -> str:
    import PIL

    return f"Pillow {PIL.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate empirics/data/sample_data from real data files.")
    parser.add_argument("--data-dir", type=Path, required=True, help="folder holding mnist/ and cifar10 files")
    parser.add_argument("--out", type=Path, default=D.SAMPLE_DIR, help="output folder (default: the package's)")
    args = parser.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": 1,
            "generated_by": "python -m empirics.data.make_sample --data-dir DIR",
            "datasets": {name: make_one(name, args.data_dir, args.out) for name in D.DATASETS},
        }
    except UserInputError as exc:
        sys.stderr.write(f"make_sample: error: {exc}\n")
        return 2
    atomic_write_text(args.out / D.SAMPLE_JSON, _dumps(doc))
    for path in args.out.iterdir():
        path.chmod(0o644)
    total = sum(v["npz_bytes"] for v in doc["datasets"].values())
    print(f"wrote {args.out} ({total} bytes of .npz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
