"""The premise measurements (Thm 4.7's kappa(G)^3 against the NTKs; binary vs 10-class kappa) against
independent computations: mpmath for kappa(G)^3 and eigenvalues, numpy formulas for the kernels."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from tolerances import F64_KAPPA, F64_ROUNDING

from empirics.data.datasets import DataRequest, load_dataset
from empirics.experiments.premise import (
    OUT_DIM,
    BinaryKappaRecord,
    PremiseRecord,
    binary_kappa_unit,
    premise_row,
    premise_unit,
)
from empirics.nets.models import ModelSpec, build_model
from ntkm import codec
from theory.conditioning import condition_numbers, kappa_power_exact, kernel_spectrum, matrix_with_singular_values

pytestmark = pytest.mark.claim("thm4.7-premise")


def _mp_kappa(K: np.ndarray) -> float:
    """kappa of a symmetric PD matrix from mpmath eigenvalues at 50 digits (independent of LAPACK)."""
    with mpmath.workdps(50):
        lam = mpmath.eigsy(mpmath.matrix(K.tolist()), eigvals_only=True)
        vals = sorted(float(lam[i]) for i in range(lam.rows))
    return vals[-1] / vals[0]


def _ntk_by_hand(F: np.ndarray) -> np.ndarray:
    """<x, y> (pi - angle) / (2 pi), written out directly (Thm 4.2)."""
    norms = np.linalg.norm(F, axis=1)
    cos = np.clip((F @ F.T) / np.outer(norms, norms), -1.0, 1.0)
    theta = np.arccos(cos)
    np.fill_diagonal(theta, 0.0)
    return (F @ F.T) * (np.pi - theta) / (2 * np.pi)


def test_kernel_spectrum_matches_mpmath_and_flags_unresolved() -> None:
    rng = np.random.default_rng(0)
    X = matrix_with_singular_values(8, 8, np.logspace(0, -5, 8), rng)
    K = X @ X.T
    spec = kernel_spectrum(K)
    assert spec["resolved"]
    assert abs(math.log10(spec["kappa"]) - math.log10(_mp_kappa(K))) < 1e-3
    low = np.outer(np.ones(5), np.ones(5))
    spec = kernel_spectrum(low)
    assert not spec["resolved"] and math.isinf(spec["kappa"]) and math.isinf(spec["log10_kappa"])


def test_premise_row_against_independent_computations() -> None:
    rng = np.random.default_rng(1)
    X = rng.uniform(0.0, 1.0, (6, 10))
    row = premise_row(X, widths=(64,), seed=3)
    with mpmath.workdps(80):
        exact = float(mpmath.log10(kappa_power_exact(X, 3)))
    assert abs(row["log10_kappa_G_cubed"] - exact) < F64_KAPPA
    assert abs(row["kappa_G"] - _mp_kappa(X @ X.T)) / row["kappa_G"] < F64_KAPPA
    C = X.T @ X
    F = X @ C
    F /= np.linalg.norm(F, axis=1, keepdims=True)
    assert math.isclose(row["ntk"]["attn"]["analytic"]["kappa"], _mp_kappa(_ntk_by_hand(F)), rel_tol=F64_KAPPA)
    assert math.isclose(row["ntk"]["relu"]["analytic"]["kappa"], _mp_kappa(_ntk_by_hand(X)), rel_tol=1e-8)
    assert math.isclose(row["attn_features"]["kappa"], _mp_kappa(F @ F.T), rel_tol=1e-4)
    for kind, feats in (("relu", X), ("attn", F)):
        model = build_model(ModelSpec(kind, 10, 64, OUT_DIM, seed=3), torch.from_numpy(X), dtype=torch.float64)
        W = model.W.detach().numpy()
        D = (feats @ W.T > 0).astype(np.float64)
        K = (feats @ feats.T) * (D @ D.T) / 64
        (emp,) = row["ntk"][kind]["empirical"]
        assert emp["width"] == 64
        assert math.isclose(emp["kappa"], _mp_kappa(K), rel_tol=F64_KAPPA)


@pytest.mark.claim("binary-cifar-kappa")
def test_units_on_real_data_record_sizes_they_cannot_load() -> None:
    rec = premise_unit(["mnist"], [8, 10**7], [16], "first", 0, None)
    assert PremiseRecord.from_dict(codec.loads(codec.dumps(rec))) == rec
    assert [r["n"] for r in rec.rows] == [8] and rec.missing[0]["n"] == 10**7
    X = load_dataset("mnist", n_train=8, n_test=1, request=DataRequest(sample="first")).x_train
    assert math.isclose(rec.rows[0]["kappa_G"], condition_numbers(X)["kappa"], rel_tol=F64_ROUNDING)
    rec = binary_kappa_unit(["mnist"], [10], [0, 1], "balanced", None)
    assert BinaryKappaRecord.from_dict(codec.loads(codec.dumps(rec))) == rec
    assert len(rec.rows) == 2 and not rec.missing
    r = rec.rows[1]
    X = load_dataset("mnist", n_train=10, n_test=1,
                     request=DataRequest(task="binary", sample="balanced", seed=1)).x_train
    assert math.isclose(r["binary"]["kappa"], condition_numbers(X)["kappa"], rel_tol=F64_ROUNDING)
    assert r["binary"]["classes"] == ["3", "8"]
    assert len(r["10class"]["classes"]) == 10
