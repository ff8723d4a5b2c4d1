"""Thm 4.7 (first part): kappa(G^3) = kappa(G)^3, and condition numbers computed stably."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import full_rank_wide, matrices
from tolerances import F64_LOG10, F64_ROUNDING, F64_ULPS

from theory.checks import HOLDS, check_thm47_kappa
from theory.conditioning import (
    EPS,
    condition_numbers,
    eigenvalues_of_gram,
    exact_gram_eigenvalues,
    kappa_of_gram,
    kappa_power,
    kappa_power_exact,
    log10_kappa_power,
    matrix_with_singular_values,
)
from theory.gram import gram

pytestmark = pytest.mark.claim("thm4.7-kappa")


def test_symbolic_general_2x2_spd() -> None:
    """Every eigenpair (lam, v) of a symbolic symmetric 2x2 G is an eigenpair (lam^3, v) of G^3."""
    a, b, c = sp.symbols("a b c", real=True)
    G = sp.Matrix([[a, b], [b, c]])
    pairs = G.eigenvects()
    assert sum(mult for _, mult, _ in pairs) == 2
    for lam, _, vecs in pairs:
        for v in vecs:
            assert sp.simplify((G**3 - lam**3 * sp.eye(2)) * v) == sp.zeros(2, 1)


def test_symbolic_rotated_diagonal() -> None:
    """G = Q diag(l1, l2) Q^T gives G^3 = Q diag(l1^3, l2^3) Q^T, so kappa(G^3) = (l1/l2)^3."""
    t = sp.Symbol("t", real=True)
    l1, l2 = sp.symbols("l1 l2", positive=True)
    Q = sp.Matrix([[sp.cos(t), -sp.sin(t)], [sp.sin(t), sp.cos(t)]])
    G = Q * sp.diag(l1, l2) * Q.T
    assert (G**3 - Q * sp.diag(l1**3, l2**3) * Q.T).applyfunc(sp.trigsimp).applyfunc(sp.expand) == sp.zeros(2)


def test_symbolic_exact_integer_gram() -> None:
    X = sp.Matrix([[2, 1, 0], [1, 3, 1]])
    G = X * X.T
    lam = sorted(G.eigenvals(), key=lambda e: float(e))
    lam3 = sorted((G**3).eigenvals(), key=lambda e: float(e))
    kappa = lam[-1] / lam[0]
    kappa3 = lam3[-1] / lam3[0]
    assert sp.simplify(kappa3 - kappa**3) == 0
    assert float(kappa) == pytest.approx(condition_numbers(np.array(X.tolist(), dtype=float))["kappa"], rel=F64_ULPS)


@given(matrices())
def test_eigenvalues_of_gram_shape_sign_and_accuracy(X: np.ndarray) -> None:
    """Relative error of lambda_i grows only like sqrt(lambda_1 / lambda_i): SVD of X, not eigvalsh(G)."""
    lam = eigenvalues_of_gram(X)
    n, d = X.shape
    assert lam.shape == (n,) and np.all(lam >= 0) and np.all(np.diff(lam) <= 0)
    assert np.all(lam[min(n, d) :] == 0)
    if n > 7:
        return
    exact = [float(v) for v in exact_gram_eigenvalues(X, dps=50)]
    for i in range(min(n, d)):
        if exact[i] > 1e-20 * exact[0]:
            tol = 50 * max(n, d) * EPS * math.sqrt(exact[0] / exact[i])
            assert abs(lam[i] - exact[i]) <= tol * exact[i] + 1e-300


@given(full_rank_wide())
def test_log_space_power_matches_mpmath(X: np.ndarray) -> None:
    """3 log10 kappa(G) from the float64 SVD equals log10 kappa(G^3) with G^3 formed in mpmath."""
    info = condition_numbers(X)
    n, d = X.shape
    exact = kappa_power_exact(X, 3)
    tol = 3 * 50 * max(n, d) * EPS * (1 + math.sqrt(info["kappa"]))
    assert abs(log10_kappa_power(info["kappa"], 3) - float(mpmath.log10(exact))) <= tol / math.log(10) + 1e-13


@given(full_rank_wide(max_n=4), st.integers(1, 5))
def test_mpmath_identity_kappa_of_power(X: np.ndarray, p: int) -> None:
    """In mpmath both sides are computed independently: kappa(G^p) from G^p, kappa(G)^p from G."""
    dps = 60 + int(p * condition_numbers(X)["log10_kappa"])
    lhs = kappa_power_exact(X, p)
    k1 = kappa_power_exact(X, 1, dps=dps)
    with mpmath.workdps(dps):  # arithmetic outside workdps would round to mpmath's global 53 bits
        assert abs(lhs - k1**p) / lhs < mpmath.mpf("1e-25")


def test_float64_cannot_form_g_cubed_but_log_space_can() -> None:
    """kappa(G) = 1e8: naive cond(G@G@G) saturates near 1/eps, the log-space value is 24 decades."""
    X = matrix_with_singular_values(5, 9, np.logspace(0, -4, 5), np.random.default_rng(7))
    G = gram(X)
    naive = np.linalg.cond(G @ G @ G)
    exact = float(mpmath.log10(kappa_power_exact(X, 3)))
    logspace = log10_kappa_power(condition_numbers(X)["kappa"], 3)
    assert abs(logspace - exact) < 1e-7
    assert math.log10(naive) < 21 < exact
    assert kappa_power(condition_numbers(X)["kappa"], 3) == pytest.approx(10**exact, rel=1e-7)


@given(full_rank_wide(max_log10_kappa=8.0))
def test_kappa_of_gram_agrees_for_moderate_kappa(X: np.ndarray) -> None:
    info = condition_numbers(X)
    assert kappa_of_gram(gram(X)) == pytest.approx(info["kappa"], rel=1e3 * EPS * info["kappa"] + 1e-12)


@given(matrices())
def test_condition_numbers_consistency(X: np.ndarray) -> None:
    info = condition_numbers(X)
    n, d = X.shape
    assert info["rank"] <= min(n, d)
    if n > d:
        assert info["kappa"] == math.inf and info["log10_kappa"] == math.inf
    if info["rank"] == n:
        assert math.isfinite(info["kappa"]) and info["kappa"] >= 1
        assert info["kappa"] == info["kappa_d"] == info["kappa_eff"]
    if info["rank"] >= 1:
        assert 1 <= info["kappa_eff"] <= info["kappa_d"] <= info["kappa"]
        assert math.isfinite(info["log10_kappa_eff"])
    for key in ("kappa", "kappa_d", "kappa_eff"):
        if math.isfinite(info[key]):
            assert info[f"log10_{key}"] == pytest.approx(math.log10(info[key]), abs=F64_ROUNDING)


def test_rank_deficient_and_zero_matrices() -> None:
    rng = np.random.default_rng(0)
    tall = condition_numbers(rng.standard_normal((12, 5)))
    assert tall["rank"] == 5 and tall["kappa"] == math.inf and math.isfinite(tall["kappa_d"])
    dup = rng.standard_normal((3, 6))
    dup[2] = dup[0]
    assert condition_numbers(dup)["kappa"] == math.inf
    zero = condition_numbers(np.zeros((3, 2)))
    assert zero["rank"] == 0 and zero["kappa_eff"] == math.inf
    assert kappa_power_exact(rng.standard_normal((6, 3)), 3) == mpmath.inf


def test_rtol_controls_rank() -> None:
    X = matrix_with_singular_values(3, 5, np.array([1.0, 1e-3, 1e-9]), np.random.default_rng(1))
    assert condition_numbers(X)["rank"] == 3
    assert condition_numbers(X, rtol=1e-6)["rank"] == 2
    assert condition_numbers(X, rtol=1e-6)["kappa"] == math.inf


@given(st.floats(1.0, 1e300), st.floats(0.0, 50.0))
def test_kappa_power_log_space(kappa: float, p: float) -> None:
    log10 = log10_kappa_power(kappa, p)
    assert math.isfinite(log10)
    value = kappa_power(kappa, p)
    if log10 < 300:
        assert value == pytest.approx(10**log10, rel=F64_LOG10)
    elif log10 > 309:
        assert value == math.inf
    assert kappa_power(math.inf, 3) == math.inf and log10_kappa_power(math.inf, 3) == math.inf


def test_check_reports_holds() -> None:
    result = check_thm47_kappa(0)
    assert result.verdict == HOLDS
    big = result.numbers["cases"][-1]
    assert big["log10_kappa_G3_logspace"] == pytest.approx(big["log10_kappa_G3_mpmath"], abs=1e-8)
