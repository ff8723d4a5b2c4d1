"""Download MNIST and CIFAR-10 with checksum verification (for users online; tests never download).

Checksums are the published ones: for MNIST those of the *uncompressed* IDX files (so a mirror
that re-gzips the files still verifies), for CIFAR-10 those of `cifar-10-python.tar.gz` and of
the batches inside it (the values torchvision checks). A download goes to a temporary file and is
renamed into place only after its checksum matches.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from ntkm.errors import UserInputError

#: Uncompressed content of the four MNIST files (md5s are the published ones; sha256 computed from them).
MNIST_CONTENT = {
    "train-images-idx3-ubyte": {
        "md5": "6bbc9ace898e44ae57da46a324031adb",
        "sha256": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "bytes": "47040016",
    },
    "train-labels-idx1-ubyte": {
        "md5": "a25bea736e30d166cdddb491f175f624",
        "sha256": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "bytes": "60008",
    },
    "t10k-images-idx3-ubyte": {
        "md5": "2646ac647ad5339dbf082846283269ea",
        "sha256": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "bytes": "7840016",
    },
    "t10k-labels-idx1-ubyte": {
        "md5": "27ae3e4e09519cfbb04c329615203637",
        "sha256": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        "bytes": "10008",
    },
}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_CHECKSUMS = {
    "sha256": "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
    "md5": "c58f30108f718f92721af3b95e74349a",
    "bytes": "170498071",
}
CIFAR10_URLS = ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",)
#: md5 of each file in cifar-10-batches-py/ (published with the data set; torchvision checks them).
CIFAR10_BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}


def _digest(chunks: Iterable[bytes], algorithms: Iterable[str]) -> tuple[dict[str, str], int]:
    hashes = {a: hashlib.new(a) for a in algorithms}
    size = 0
    for block in chunks:
        size += len(block)
        for h in hashes.values():
            h.update(block)
    return {a: h.hexdigest() for a, h in hashes.items()}, size


def file_checksums(path: str | Path, algorithms: Iterable[str] = ("sha256",), content: bool = False) -> dict[str, str]:
    """Hex digests of a file (or, with `content=True`, of its gzip-decompressed content), plus `bytes`."""
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            gz = content and raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if gz else raw
            digests, size = _digest(iter(lambda: f.read(1 << 20), b""), algorithms)
    except (OSError, EOFError) as exc:
        raise UserInputError(f"cannot read {path} to check it ({exc}); delete it and download again") from None
    return {**digests, "bytes": str(size)}


def verify_checksum(path: str | Path, expected: dict[str, str], content: bool = False) -> dict[str, str]:
    """Check a file against expected digests (`sha256`, `md5`, and/or `bytes`); returns the computed ones.

    With `content=True` a gzip file is checked on its decompressed content. Raises `UserInputError`
    naming the file, the expected and the actual value when anything differs.
    """
    algorithms = [a for a in expected if a != "bytes"]
    if not algorithms and "bytes" not in expected:
        raise ValueError("no checksum given")
    got = file_checksums(path, algorithms, content=content)
    for key, want in expected.items():
        if got[key].lower() != str(want).lower():
            raise UserInputError(
                f"checksum mismatch for {path}: {key} is {got[key]}, expected {want}; "
                "the file is corrupt or not the published one, delete it and download again"
            )
    return got


def _fetch(urls: Iterable[str], target: Path, verify: dict[str, str], content: bool, quiet: bool) -> None:
    """Try each URL in turn; the first download whose checksum matches is moved to `target`."""
    errors = []
    for url in urls:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        try:
            if not quiet:
                sys.stderr.write(f"downloading {url}\n")
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
                shutil.copyfileobj(resp, out, 1 << 20)
            verify_checksum(tmp, verify, content=content)
            os.replace(tmp, target)
            return
        except (urllib.error.URLError, OSError, UserInputError) as exc:
            errors.append(f"{url}: {exc}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise UserInputError(
        f"could not download {target.name} ({'; '.join(errors)}); check the network, or fetch the file "
        f"yourself into {target.parent} and rerun"
    )


def download(dataset: str, dest: str | Path, quiet: bool = False) -> list[Path]:
    """Download `mnist` (four IDX .gz files into dest/mnist/) or `cifar10` (dest/cifar-10-python.tar.gz).

    Files already present with the right checksum are kept. Returns the verified files.
    """
    dest = Path(dest).expanduser()
    if dataset == "mnist":
        folder = dest / "mnist"
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for stem, sums in MNIST_CONTENT.items():
            target = folder / f"{stem}.gz"
            want = {"sha256": sums["sha256"]}
            try:
                verify_checksum(target, want, content=True)
            except UserInputError:
                _fetch([m + target.name for m in MNIST_MIRRORS], target, want, True, quiet)
            out.append(target)
        return out
    if dataset == "cifar10":
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / CIFAR10_ARCHIVE
        want = {"sha256": CIFAR10_ARCHIVE_CHECKSUMS["sha256"]}
        try:
            verify_checksum(target, want)
        except UserInputError:
            _fetch(CIFAR10_URLS, target, want, False, quiet)
        return [target]
    raise UserInputError(f"unknown dataset {dataset!r}; valid values: mnist, cifar10")
