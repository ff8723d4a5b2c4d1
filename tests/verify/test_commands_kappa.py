"""`verify kappa` on real MNIST: agreement with an independent numpy computation, n > d, bad input."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tolerances import F64_KAPPA

from verify.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / ".." / "shared" / "data"


@pytest.fixture(scope="module")
def shared_data() -> Path:
    if not (SHARED / "mnist").is_dir():
        pytest.skip(f"real data folder {SHARED} is absent (CI provides it at ../shared/data)")
    return SHARED.resolve()


def _first_mnist(shared: Path, n: int) -> np.ndarray:
    data = gzip.decompress((shared / "mnist" / "train-images-idx3-ubyte.gz").read_bytes())
    return np.frombuffer(data, dtype=np.uint8, offset=16)[: n * 784].reshape(n, 784) / 255.0


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _num(v: float | str) -> float:
    return float(v)  # "inf" as stored, or inf as `ntkm.codec` reads it back: float() takes either


@pytest.mark.claim("kappa-mnist")
def test_kappa_agrees_with_eigvalsh(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = _run_json(
        capsys,
        [
            "kappa",
            "--dataset",
            "mnist",
            "--n",
            "100",
            "--sample",
            "first",
            "--data-dir",
            str(shared_data),
            "--json",
            "-",
        ],
    )
    row = rec["rows"][0]
    X = _first_mnist(shared_data, 100)
    lam = np.linalg.eigvalsh(X @ X.T)
    kappa = lam[-1] / lam[0]
    assert row["n"] == 100 and row["d"] == 784 and row["rank"] == 100
    assert abs(row["kappa"] - kappa) / kappa < F64_KAPPA
    assert abs(row["kappa_d"] - kappa) / kappa < F64_KAPPA
    assert abs(row["log10_kappa_cubed"] - 3 * math.log10(kappa)) < F64_KAPPA
    assert abs(row["bound_v1"]["log10_value"] - (6 * math.log10(kappa) - 2 * math.log10(0.1))) < F64_KAPPA
    assert abs(row["bound_v2"]["log10_value"] - math.log10(kappa**6 * 100 * math.log(100))) < F64_KAPPA
    prov = row["provenance"]
    assert prov["source"] == "idx" and prov["sample"] == "first" and len(prov["files"]) == 4
    assert rec["library_versions"]["numpy"] == np.__version__
    assert rec["preprocess"] == "raw" and "kappa" in rec["definitions"]


@pytest.mark.claim("kappa-mnist")
def test_kappa_n_above_d(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """n = 1000 > d = 784: G is singular, so kappa = inf (not NaN, not an error); kappa_eff is finite.

    MNIST has pixels that are 0 in every image, so rank(X) < d as well and kappa_d (the
    rank-min(n, d) truncation) is inf too; kappa_eff = lambda_1 / lambda_rank stays finite."""
    rec = _run_json(
        capsys,
        [
            "kappa",
            "--dataset",
            "mnist",
            "--n",
            "1000",
            "--sample",
            "first",
            "--data-dir",
            str(shared_data),
            "--json",
            "-",
        ],
    )
    row = rec["rows"][0]
    values = [_num(row[k]) for k in ("kappa", "kappa_d", "kappa_eff", "log10_kappa", "log10_kappa_cubed")]
    assert not any(math.isnan(v) for v in values)
    assert math.isinf(_num(row["kappa"])) and row["rank"] < 784
    assert math.isfinite(_num(row["kappa_eff"])) and _num(row["kappa_eff"]) > 1
    X = _first_mnist(shared_data, 1000)
    s = np.linalg.svd(X, compute_uv=False)
    assert row["rank"] == int(np.sum(s > 1000 * np.finfo(float).eps * s[0]))
    kd = _num(row["kappa_d"])
    assert math.isinf(kd) or abs(kd - (s[0] / s[783]) ** 2) / kd < F64_KAPPA


def test_kappa_human_output(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "kappa",
                "--dataset",
                "mnist",
                "--n",
                "50,60",
                "--preprocess",
                "center",
                "--data-dir",
                str(shared_data),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "kappa(G)^3" in out and "data: MNIST" in out and "sample=balanced" in out
    assert out.count("\n50 ") == 1 or " 50 " in out


@pytest.mark.claim("kappa-cifar10")
def test_kappa_bundled_cifar_is_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    rec = _run_json(capsys, ["kappa", "--dataset", "cifar10", "--n", "20", "--source", "bundled", "--json", "-"])
    prov = rec["rows"][0]["provenance"]
    assert prov["source"] == "bundled-sample" and prov["jpeg_reencoding"] is True


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--dataset", "svhn"], "unknown dataset"),
        (["--n", "0"], "--n must be integers >= 2"),
        (["--n", "10,abc"], "comma-separated integers"),
        (["--eps", "0"], "--eps must be a positive number"),
        (["--preprocess", "whiten"], "unknown --preprocess"),
        (["--data-dir", "/nonexistent/ntkm"], "is not a folder"),
        (["--n", "700", "--source", "bundled"], "bundled mnist sample holds only 600"),
    ],
)
def test_kappa_bad_input(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kappa", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_kappa_bad_input_subprocess() -> None:
    """End to end through the console entry: exit code 2, one stderr line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "verify", "kappa", "--dataset", "mnist", "--n", "-5"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "CI": "true"},
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
