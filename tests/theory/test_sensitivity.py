"""Prop 4.5: data-dependent sensitivity. Ill-posed (G x_j: n x n times d); corrected form verified."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import matrices
from tolerances import F64_ULPS

from ntkm.errors import UserInputError
from theory.checks import DOES_NOT_HOLD, HOLDS, ILL_POSED, check_prop45, prop45_verdict
from theory.conditioning import EPS
from theory.sensitivity import (
    attention_output_change,
    paper_quantity,
    paper_quantity_as_written,
    sensitivity_bound,
)
from theory.symbolic import symbolic_matrix

pytestmark = pytest.mark.claim("prop4.5")


def test_as_written_dimensions_do_not_match_sympy() -> None:
    X = symbolic_matrix("x", 3, 2)
    G = X * X.T
    with pytest.raises(sp.ShapeError):
        _ = G * X.row(0).T


def test_as_written_dimensions_do_not_match_numpy() -> None:
    X = np.random.default_rng(0).uniform(0, 1, (7, 5))
    with pytest.raises(ValueError):
        paper_quantity_as_written(X, 0, 0.1)


def test_symbolic_exact_change_of_other_points() -> None:
    """F'_i - F_i = (x_j . x_i) delta + (delta . x_i)(x_j + delta) for i != j, exactly."""
    X = symbolic_matrix("x", 3, 2)
    delta = sp.Matrix([[sp.Symbol("d0", real=True), sp.Symbol("d1", real=True)]])
    j = 0
    Xp = X.copy()
    Xp[j, :] = X.row(j) + delta
    F, Fp = X * (X.T * X), X * (Xp.T * Xp)
    for i in (1, 2):
        xi, xj = X.row(i), X.row(j)
        predicted = (xj * xi.T)[0, 0] * delta + (delta * xi.T)[0, 0] * (xj + delta)
        assert (Fp.row(i) - F.row(i) - predicted).applyfunc(sp.expand) == sp.zeros(1, 2)


def test_symbolic_bound_attained_exactly_on_nonnegative_integers() -> None:
    """Exact rational arithmetic: X >= 0 and delta = eps * 1 attain the corrected bound with equality."""
    X = sp.Matrix([[1, 0, 2], [3, 1, 0], [0, 2, 2], [1, 1, 1]])
    eps = sp.Rational(1, 10)
    j, n, d = 0, X.rows, X.cols
    Xp = X.copy()
    Xp[j, :] = X.row(j) + eps * sp.ones(1, d)
    dF = X * (Xp.T * Xp) - X * (X.T * X)
    S = sum(max(abs(v) for v in dF.row(i)) for i in range(n) if i != j)
    xj_inf = max(abs(v) for v in X.row(j))
    B = eps * sum(
        abs((X.row(i) * X.row(j).T)[0, 0]) + sum(abs(v) for v in X.row(i)) * (xj_inf + eps) for i in range(1, n)
    )
    assert S == B
    assert float(B) == pytest.approx(sensitivity_bound(np.array(X.tolist(), dtype=float), j, 0.1), rel=F64_ULPS)


def test_paper_quantity_read_as_gram_column_is_not_a_bound() -> None:
    """Counterexample: pixel data, delta = eps * 1: the change exceeds ||G e_j||_1 eps by about 3x."""
    X = np.random.default_rng(1).uniform(0, 1, (100, 20))
    eps = 0.01
    S = attention_output_change(X, 0, np.full(20, eps)).sum()
    assert S > 2 * paper_quantity(X, 0, eps)


def _rounding(X: np.ndarray, eps: float) -> float:
    """Rounding budget of the measured change: both F and F' carry ~ (n + d) eps ||X||_F^3 per entry."""
    n, d = X.shape
    scale = (np.linalg.norm(X) + eps * np.sqrt(d)) ** 3
    return 50 * n * (n + d) * EPS * scale


@given(matrices(max_n=12, max_d=8), st.floats(1e-3, 1.0), st.integers(0, 2**32 - 1))
def test_corrected_bound_holds_for_any_perturbation(X: np.ndarray, rel_eps: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, d = X.shape
    eps = rel_eps * max(np.max(np.abs(X)), 1e-300)
    j = int(rng.integers(n))
    for delta in (eps * rng.uniform(-1, 1, d), eps * rng.choice([-1.0, 1.0], d), np.full(d, eps)):
        S = attention_output_change(X, j, delta).sum()
        assert S <= sensitivity_bound(X, j, eps) * (1 + 1e-9) + _rounding(X, eps)


@given(matrices(max_n=12, max_d=8, kinds=("pixels",)), st.floats(1e-3, 0.5), st.integers(0, 11))
def test_corrected_bound_attained_for_pixel_data(X: np.ndarray, eps: float, j: int) -> None:
    j = j % X.shape[0]
    S = attention_output_change(X, j, np.full(X.shape[1], eps)).sum()
    B = sensitivity_bound(X, j, eps)
    assert abs(S - B) <= 1e-9 * B + _rounding(X, eps)


def test_bound_grows_linearly_with_n_unlike_raw_inputs() -> None:
    rng = np.random.default_rng(2)
    X = rng.uniform(0, 1, (800, 20))
    ratio = sensitivity_bound(X, 0, 0.01) / sensitivity_bound(X[:100], 0, 0.01)
    assert 6 < ratio < 10
    delta = np.full(20, 0.01)
    Xp = X.copy()
    Xp[0] += delta
    assert np.array_equal(np.delete(Xp - X, 0, axis=0), np.zeros((799, 20)))


def test_invalid_index_and_shapes_raise() -> None:
    X = np.ones((3, 2))
    with pytest.raises(UserInputError):
        sensitivity_bound(X, 3, 0.1)
    with pytest.raises(UserInputError):
        attention_output_change(X, 0, np.ones(3))
    with pytest.raises(UserInputError):
        sensitivity_bound(X, 0, -0.1)


def test_prop45_verdict_reaches_each_outcome() -> None:
    assert prop45_verdict(2.9, as_written_defined=False) == DOES_NOT_HOLD
    assert prop45_verdict(1.01, as_written_defined=True) == DOES_NOT_HOLD
    assert prop45_verdict(1.0, as_written_defined=False) == ILL_POSED
    assert prop45_verdict(0.5, as_written_defined=True) == HOLDS


def test_check_verdict_follows_its_evidence_with_verified_correction() -> None:
    result = check_prop45(0)
    nums = result.numbers
    assert nums["stated_reading_exceeded_by"] == max(nums["paper_quantity_underestimate_factor"])
    assert result.verdict == prop45_verdict(nums["stated_reading_exceeded_by"], nums["as_written_error"] == "no error")
    assert nums["corrected_bound_holds"]
    assert "verified" in result.detail and nums["corrected_bound"] in result.detail
