"""Thm 4.2: the NTK of MLP-Attn (only W trained) is <x~, y~> (pi - theta) / (2 pi) (arc-cosine, degree 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import matrices
from tolerances import ANGLE, ANGLE_ABS, F64_ROUNDING, F64_ZERO

from theory.checks import HOLDS, check_thm42, ntk_convergence
from theory.gram import attention_features
from theory.kernels import (
    analytic_ntk_mlp_attn,
    analytic_ntk_two_layer,
    arccos0,
    arccos1,
    empirical_ntk_two_layer,
    sample_first_layer,
)

pytestmark = pytest.mark.claim("thm4.2")

theta = sp.Symbol("theta", positive=True)
phi, r = sp.symbols("phi r", real=True)


def _sympy_arccos(degree: int) -> sp.Expr:
    """E over w ~ N(0, I_2) for x = (1, 0), y = (cos t, sin t), in polar coordinates w = r (cos phi, sin phi).

    Both w.x > 0 and w.y > 0 exactly for phi in (t - pi/2, pi/2); the radial density is r e^(-r^2/2) / (2 pi).
    """
    radial = sp.integrate(r ** (2 * degree) * r * sp.exp(-(r**2) / 2) / (2 * sp.pi), (r, 0, sp.oo))
    angular = sp.integrate((sp.cos(phi) * sp.cos(phi - theta)) ** degree, (phi, theta - sp.pi / 2, sp.pi / 2))
    return sp.simplify(radial * angular)


def test_sympy_expectation_degree0_is_closed_form() -> None:
    assert sp.simplify(_sympy_arccos(0) - (sp.pi - theta) / (2 * sp.pi)) == 0


def test_sympy_expectation_degree1_is_closed_form() -> None:
    closed = (sp.sin(theta) + (sp.pi - theta) * sp.cos(theta)) / (2 * sp.pi)
    assert sp.simplify(_sympy_arccos(1) - closed) == 0


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, math.pi / 2, 2.5, math.pi])
def test_sympy_agrees_with_numpy(t: float) -> None:
    x = np.array([[1.0, 0.0]])
    y = np.array([[math.cos(t), math.sin(t)]])
    e0 = float(_sympy_arccos_cache[0].subs(theta, t))
    e1 = float(_sympy_arccos_cache[1].subs(theta, t))
    assert abs(arccos0(x, y)[0, 0] - e0) < ANGLE
    assert abs(arccos1(x, y)[0, 0] - e1) < ANGLE
    assert abs(analytic_ntk_two_layer(x, y)[0, 0] - math.cos(t) * e0) < ANGLE


_sympy_arccos_cache = {0: _sympy_arccos(0), 1: _sympy_arccos(1)}


def test_monte_carlo_matches_closed_forms() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 5))
    W = rng.standard_normal((200_000, 5))
    Z = X @ W.T
    mc0 = (Z > 0).astype(float) @ (Z > 0).T.astype(float) / W.shape[0]
    mc1 = np.maximum(Z, 0) @ np.maximum(Z, 0).T / W.shape[0]
    assert np.max(np.abs(mc0 - arccos0(X))) < 5 * 0.5 / math.sqrt(W.shape[0])
    se1 = 5 * np.outer(np.linalg.norm(X, axis=1), np.linalg.norm(X, axis=1)) / math.sqrt(W.shape[0])
    assert np.all(np.abs(mc1 - arccos1(X)) < se1)


@given(matrices())
def test_kernels_are_finite_symmetric_bounded(X: np.ndarray) -> None:
    K0, K1, N = arccos0(X), arccos1(X), analytic_ntk_two_layer(X)
    for K in (K0, K1, N):
        assert np.all(np.isfinite(K))
        assert np.allclose(K, K.T, rtol=F64_ROUNDING, atol=0)
    assert np.all((K0 >= 0) & (K0 <= 0.5))
    nz = np.linalg.norm(X, axis=1) > 0
    assert np.allclose(np.diag(K0)[nz], 0.5)
    assert np.all(np.diag(K0)[~nz] == 0)


@given(matrices(kinds=("gaussian", "pixels", "near_duplicate", "scaled_columns")))
def test_ntk_is_psd(X: np.ndarray) -> None:
    N = analytic_ntk_two_layer(X)
    lam = np.linalg.eigvalsh(N)
    assert lam[0] >= -1e-6 * max(lam[-1], 1e-300)


@given(matrices(kinds=("gaussian", "pixels")), st.floats(1e-3, 1e3))
def test_homogeneity(X: np.ndarray, c: float) -> None:
    """Scale-free angle, degree-2 kernels; to the documented sqrt(eps)-level angle accuracy."""
    assert np.allclose(arccos0(c * X), arccos0(X), atol=ANGLE_ABS)
    assert np.allclose(analytic_ntk_two_layer(c * X), c**2 * analytic_ntk_two_layer(X), rtol=ANGLE, atol=1e-300)
    assert np.allclose(arccos1(c * X), c**2 * arccos1(X), rtol=ANGLE, atol=1e-300)


def test_zero_vectors_and_antipodes() -> None:
    X = np.array([[0.0, 0.0], [1.0, 0.0], [-2.0, 0.0]])
    assert np.array_equal(arccos0(X)[0], np.zeros(3))
    assert arccos0(X)[1, 2] == 0.0 and arccos1(X)[1, 2] == pytest.approx(0.0, abs=F64_ZERO)
    assert not np.any(np.isnan(analytic_ntk_two_layer(X)))


def test_fast_empirical_ntk_equals_jacobian_contraction() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 3))
    W, a = sample_first_layer(37, 3, rng)
    m = W.shape[0]
    J = np.stack([(a[:, None] * ((W @ x) > 0)[:, None] * x[None, :]).ravel() / math.sqrt(m) for x in X])
    assert np.allclose(empirical_ntk_two_layer(X, None, W, a), J @ J.T, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_empirical_ntk_converges_at_rate_m_minus_half(seed: int) -> None:
    """Slope of the RMS error vs m in log-log; over 30 base seeds it lies in [-0.55, -0.39]."""
    res = ntk_convergence(widths=tuple(2**p for p in range(6, 14)), seeds=12, seed=seed)
    assert -0.7 <= res["slope"] <= -0.3
    assert res["rms_error"][-1] < res["rms_error"][0] / 5


def test_empirical_ntk_of_raw_inputs_converges() -> None:
    """2L-ReLU on raw Gaussian inputs: error at m = 16384 within 5 standard errors of the mean."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((6, 4))
    W, a = sample_first_layer(16384, 4, rng)
    err = np.abs(empirical_ntk_two_layer(X, None, W, a) - analytic_ntk_two_layer(X))
    sd = 0.5 * np.abs(X @ X.T) / math.sqrt(16384)
    assert np.all(err <= 5 * sd + 1e-12)


@given(matrices(kinds=("gaussian", "pixels")), st.integers(1, 2))
def test_analytic_ntk_mlp_attn_is_ntk_on_attention_features(X: np.ndarray, k: int) -> None:
    F = attention_features(X, X, k=k)
    assert np.allclose(analytic_ntk_mlp_attn(X, X, k=k), analytic_ntk_two_layer(F), atol=F64_ROUNDING)
    Q = X[::-1]
    assert np.allclose(analytic_ntk_mlp_attn(X, Q, X, k=k), analytic_ntk_two_layer(attention_features(X, Q, k=k), F),
                       atol=F64_ROUNDING)


def test_check_reports_holds() -> None:
    result = check_thm42(0)
    assert result.verdict == HOLDS
    assert -0.7 <= result.numbers["slope"] <= -0.3
