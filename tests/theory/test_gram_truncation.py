"""Truncation: top-r truncation shrinks kappa on the nonzero spectrum (not as n x n matrix, not with ridge)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import full_rank_wide, matrices
from tolerances import F64_ALGORITHM, F64_KAPPA, F64_SOLVE

from theory.checks import HOLDS_CORRECTED, check_truncation
from theory.conditioning import condition_numbers, kappa_of_gram, matrix_with_singular_values
from theory.gram import attention_features, gram, truncate

pytestmark = pytest.mark.claim("truncation")

s1, s2, s3, lam = sp.symbols("s1 s2 s3 lambda", positive=True)


def test_symbolic_restricted_kappa_shrinks() -> None:
    """X = diag(s1, s2, s3) (padded), s1 > s2 > s3: rank-2 truncation has kappa_eff = (s1/s2)^2 <= (s1/s3)^2."""
    X = sp.Matrix([[s1, 0, 0, 0], [0, s2, 0, 0], [0, 0, s3, 0]])
    X2 = sp.Matrix([[s1, 0, 0, 0], [0, s2, 0, 0], [0, 0, 0, 0]])
    eig_full = sorted((X * X.T).eigenvals(), key=str)
    eig_trunc = [e for e in (X2 * X2.T).eigenvals() if e != 0]
    assert set(eig_full) == {s1**2, s2**2, s3**2}
    assert set(eig_trunc) == {s1**2, s2**2}
    a = sp.Symbol("a", positive=True)
    gap = ((s1 / s3) ** 2 - (s1 / s2) ** 2).subs(s2, s3 + a)
    assert sp.simplify(gap - s1**2 * a * (a + 2 * s3) / ((s3 + a) ** 2 * s3**2)) == 0
    assert sp.factor(gap).is_positive


def test_symbolic_ridge_makes_truncation_worse() -> None:
    """With a ridge: kappa(G_r + lam I) - kappa(G + lam I) = (s1^2 + lam) s3^2 / (lam (s3^2 + lam)) > 0."""
    with_trunc = (s1**2 + lam) / lam
    without = (s1**2 + lam) / (s3**2 + lam)
    assert sp.simplify(with_trunc - without - (s1**2 + lam) * s3**2 / (lam * (s3**2 + lam))) == 0


@given(matrices(), st.integers(1, 7))
def test_restricted_kappa_is_ratio_of_singular_values(X: np.ndarray, r: int) -> None:
    s = np.linalg.svd(X, compute_uv=False)
    info_x = condition_numbers(X)
    r = min(r, info_x["rank"]) if info_x["rank"] else 1
    info = condition_numbers(truncate(X, r))
    if info_x["rank"] == 0:
        assert info["kappa_eff"] == math.inf
        return
    if s[r - 1] > 1e-6 * s[0]:
        assert info["rank"] == r
        assert info["kappa_eff"] == pytest.approx((s[0] / s[r - 1]) ** 2, rel=F64_KAPPA)
    assert info["kappa_eff"] <= info_x["kappa_eff"] * (1 + F64_KAPPA)
    if r < X.shape[0]:
        assert info["kappa"] == math.inf


@given(full_rank_wide(max_n=6, max_log10_kappa=8.0))
def test_monotone_in_r_and_ridge_increases(X: np.ndarray) -> None:
    n = X.shape[0]
    effs = [condition_numbers(truncate(X, r))["kappa_eff"] for r in range(1, n + 1)]
    assert all(a <= b * (1 + F64_SOLVE) for a, b in zip(effs, effs[1:], strict=False))
    assert effs[-1] == pytest.approx(condition_numbers(X)["kappa"], rel=F64_SOLVE)
    if n >= 2:
        s = np.linalg.svd(X, compute_uv=False)
        ridge = 1e-3 * s[0] ** 2
        full = kappa_of_gram(gram(X) + ridge * np.eye(n))
        trunc = kappa_of_gram(gram(truncate(X, n - 1)) + ridge * np.eye(n))
        assert trunc >= full * (1 - F64_SOLVE)
        assert trunc == pytest.approx((s[0] ** 2 + ridge) / ridge, rel=F64_KAPPA)


def test_truncated_attention_features_equal_features_of_truncated_data() -> None:
    rng = np.random.default_rng(4)
    X = matrix_with_singular_values(10, 6, np.logspace(0, -3, 6), rng)
    Q = rng.standard_normal((4, 6))
    for r in (1, 3, 5):
        assert np.allclose(attention_features(X, Q, rank=r), attention_features(truncate(X, r), Q), atol=F64_ALGORITHM)


def test_check_reports_corrected() -> None:
    result = check_truncation(0)
    assert result.verdict == HOLDS_CORRECTED
    assert result.numbers["by_rank"][0]["kappa_with_ridge"] > result.numbers["kappa_full_with_ridge"]
