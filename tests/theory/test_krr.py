"""Closed-form leave-one-out of kernel ridge regression (the paper's influence, no retraining)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import matrices

from ntkm.errors import UserInputError
from theory.checks import HOLDS, check_loo
from theory.conditioning import EPS
from theory.gram import gram_power
from theory.kernels import analytic_ntk_two_layer
from theory.krr import krr_fit, krr_predict, loo_brute_force, loo_influence, loo_predictions, loo_residuals
from theory.symbolic import loo_residual

pytestmark = pytest.mark.claim("loo")


@pytest.mark.parametrize("n", [2, 3])
def test_symbolic_closed_form_equals_refit(n: int) -> None:
    assert loo_residual(n) == sp.zeros(n, 1)


def test_symbolic_training_residual() -> None:
    """y_i - f_-i(x_i) = alpha_i / M_ii for symbolic K (n = 2) and ridge."""
    a, b, c, lam, y0, y1 = sp.symbols("a b c lambda y0 y1", real=True)
    A = sp.Matrix([[a, b], [b, c]]) + lam * sp.eye(2)
    M = A.inv()
    alpha = M * sp.Matrix([y0, y1])
    f_minus_0 = b * y1 / (c + lam)
    assert sp.simplify(y0 - f_minus_0 - alpha[0] / M[0, 0]) == 0


def _kernel_problem(X: np.ndarray, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    if kind == "ntk":
        K = analytic_ntk_two_layer(X)
        Kt = analytic_ntk_two_layer(rng.standard_normal((3, X.shape[1])) * np.abs(X).max(), X)
    else:
        K = gram_power(X, 3)
        Q = rng.standard_normal((3, X.shape[1]))
        Kt = (Q @ X.T) @ gram_power(X, 2)
    scale = max(float(np.linalg.eigvalsh(K)[-1]), 1e-300)
    return K, Kt, rng.standard_normal((X.shape[0], 2)), scale


@given(
    matrices(max_n=9, max_d=5, kinds=("gaussian", "pixels", "near_duplicate", "rank_deficient", "conditioned")),
    st.sampled_from(["ntk", "attention"]),
    st.floats(-8.0, 0.0),
    st.integers(0, 2**32 - 1),
)
def test_closed_form_equals_brute_force(X: np.ndarray, kind: str, log10_ridge: float, seed: int) -> None:
    """Tolerance from conditioning: both sides solve with K + ridge I; errors scale with its condition."""
    if X.shape[0] < 2:
        return
    K, Kt, Y, scale = _kernel_problem(X, kind, seed)
    ridge = 10.0**log10_ridge * scale
    lam = np.linalg.eigvalsh(K)
    cond = (lam[-1] + ridge) / (max(lam[0], 0.0) + ridge)
    closed = loo_predictions(K, Y, ridge, Kt)
    brute = loo_brute_force(K, Y, ridge, Kt)
    assert closed.shape == (X.shape[0], 3, 2)
    terms = np.max(np.abs(Kt)) * np.abs(krr_fit(K, Y, ridge)).sum()
    assert np.max(np.abs(closed - brute)) <= 100 * X.shape[0] * cond * EPS * terms


def test_negative_control_wrong_formula_is_detected() -> None:
    """Dropping the correction term (no-LOO predictions) is far outside the tolerance used above."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((8, 3))
    K, Kt = analytic_ntk_two_layer(X), analytic_ntk_two_layer(X[:3] + 0.3, X)
    Y = rng.standard_normal((8, 2))
    full = krr_predict(Kt, krr_fit(K, Y, 0.05))
    brute = loo_brute_force(K, Y, 0.05, Kt)
    assert np.max(np.abs(full[None] - brute)) > 1e3 * np.max(np.abs(loo_predictions(K, Y, 0.05, Kt) - brute))


def test_against_mpmath_refit_ill_conditioned() -> None:
    """kappa(K + ridge I) ~ 1e8: both float64 routes agree with an exact mpmath refit to ~cond * eps."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (6, 4))
    K = gram_power(X, 3)
    ridge = 1e-8 * np.linalg.eigvalsh(K)[-1]
    Kt = K[:2]
    Y = rng.standard_normal(6)
    closed = loo_predictions(K, Y, ridge, Kt)[:, :, 0]
    with mpmath.workdps(60):
        exact = np.zeros((6, 2))
        for i in range(6):
            keep = [j for j in range(6) if j != i]
            A = mpmath.matrix([[K[a, b] + (ridge if a == b else 0) for b in keep] for a in keep])
            alpha = mpmath.lu_solve(A, mpmath.matrix([Y[j] for j in keep]))
            for t in range(2):
                exact[i, t] = float(sum(Kt[t, keep[q]] * alpha[q] for q in range(5)))
    cond = np.linalg.cond(K + ridge * np.eye(6))
    tol = 100 * cond * EPS * np.abs(exact).max()
    assert np.max(np.abs(closed - exact)) <= tol
    assert np.max(np.abs(loo_brute_force(K, Y, ridge, Kt)[:, :, 0] - exact)) <= tol


@given(matrices(max_n=8, max_d=5, kinds=("gaussian", "pixels")), st.integers(0, 2**32 - 1))
def test_training_residuals_and_fit(X: np.ndarray, seed: int) -> None:
    if X.shape[0] < 2:
        return
    rng = np.random.default_rng(seed)
    K = analytic_ntk_two_layer(X)
    ridge = 0.1 * max(float(np.trace(K)), 1e-12)
    Y = rng.standard_normal(X.shape[0])
    alpha = krr_fit(K, Y, ridge)
    assert alpha.shape == Y.shape
    assert np.allclose((K + ridge * np.eye(len(Y))) @ alpha, Y, atol=1e-10 * np.abs(Y).max())
    brute = loo_brute_force(K, Y, ridge, K)[:, :, 0]
    assert np.allclose(loo_residuals(K, Y, ridge), Y - np.diag(brute), atol=1e-9 * np.abs(Y).max())
    assert np.allclose(krr_predict(K, alpha), K @ alpha)


def test_influence_is_loss_difference() -> None:
    rng = np.random.default_rng(8)
    X = rng.standard_normal((10, 3))
    K, Kt = analytic_ntk_two_layer(X), analytic_ntk_two_layer(X[:4] + 0.1, X)
    Y, Yt = rng.standard_normal((10, 2)), rng.standard_normal((4, 2))
    infl = loo_influence(K, Y, 0.1, Kt, Yt)
    loo = loo_brute_force(K, Y, 0.1, Kt)
    full = krr_predict(Kt, krr_fit(K, Y, 0.1))
    expected = ((loo - Yt) ** 2).sum(-1) - ((full - Yt) ** 2).sum(-1)[None]
    assert infl.shape == (10, 4) and np.allclose(infl, expected, atol=1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda: krr_fit(np.array([[1.0, 2.0], [0.0, 1.0]]), np.ones(2), 0.1),
        lambda: krr_fit(np.eye(2), np.ones(2), -1.0),
        lambda: krr_fit(np.zeros((2, 2)), np.ones(2), 0.0),
        lambda: krr_fit(np.eye(2), np.ones(3), 0.1),
        lambda: krr_fit(np.ones((2, 3)), np.ones(2), 0.1),
        lambda: loo_predictions(np.eye(2), np.ones(2), 0.1, np.ones((1, 3))),
        lambda: loo_brute_force(np.eye(1), np.ones(1), 0.1, np.ones((1, 1))),
    ],
)
def test_invalid_inputs_raise(call) -> None:
    with pytest.raises(UserInputError):
        call()


def test_check_reports_holds() -> None:
    result = check_loo(0)
    assert result.verdict == HOLDS
