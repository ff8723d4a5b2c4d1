"""Stacking: k layers give G^(2k+1) only with a fixed context; true self-attention stacking gives G^(3^k)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import full_rank_wide, matrices
from tolerances import F64_ROUNDING

from ntkm.errors import UserInputError
from theory.checks import HOLDS_CORRECTED, check_stacking
from theory.conditioning import EPS, condition_numbers, kappa_power_exact, log10_kappa_power
from theory.gram import gram_power, stacked_attention, stacked_kernel, stacked_kernel_power
from theory.symbolic import stacked_kernel_is_gram_power, symbolic_matrix

pytestmark = pytest.mark.claim("stacking")


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", ["fixed", "self"])
def test_word_identity_any_size(k: int, mode: str) -> None:
    assert stacked_kernel_is_gram_power(k, mode)


def test_words_differ_for_self_stacking_beyond_one_layer() -> None:
    n, d = sp.symbols("n d", integer=True, positive=True)
    X = sp.MatrixSymbol("X", n, d)
    Y = X
    for _ in range(2):
        Y = Y * Y.T * Y
    assert (Y * Y.T).doit().args != (X, X.T) * 5
    assert (Y * Y.T).doit().args == (X, X.T) * 9


def test_symbolic_entries_two_layers() -> None:
    X = symbolic_matrix("x", 2, 2)
    G = X * X.T
    Yf = G * (G * X)
    assert (Yf * Yf.T - G**5).applyfunc(sp.expand) == sp.zeros(2)
    Y1 = X * X.T * X
    Ys = Y1 * Y1.T * Y1
    assert (Ys - G**4 * X).applyfunc(sp.expand) == sp.zeros(2)  # so Ys Ys^T = G^4 G G^4 = G^9
    at = {s: v for s, v in zip(sorted(X.free_symbols, key=str), (1, 2, 0, 1), strict=True)}
    assert (Ys * Ys.T).subs(at) != (G**5).subs(at)


def _unit(X: np.ndarray) -> np.ndarray:
    s1 = np.linalg.norm(X, 2)
    return X / s1 if s1 > 0 else X


@given(matrices(), st.integers(0, 3))
def test_fixed_stacking_float64(X: np.ndarray, k: int) -> None:
    X = _unit(X)
    K = stacked_kernel(X, k, "fixed")
    p = stacked_kernel_power(k, "fixed")
    assert np.linalg.norm(K - gram_power(X, p)) <= 50 * p * sum(X.shape) * EPS * max(1.0, np.linalg.norm(X) ** (2 * p))


@given(matrices(), st.integers(0, 2))
def test_self_stacking_float64(X: np.ndarray, k: int) -> None:
    X = _unit(X)
    K = stacked_kernel(X, k, "self")
    p = stacked_kernel_power(k, "self")
    assert np.linalg.norm(K - gram_power(X, p)) <= 50 * p * sum(X.shape) * EPS * max(1.0, np.linalg.norm(X) ** (2 * p))
    Y = stacked_attention(X, k, "self")
    assert np.allclose(Y, gram_power(X, (3**k - 1) / 2) @ X, atol=F64_ROUNDING)


def test_counterexample_self_stacking_is_not_g_to_2k_plus_1() -> None:
    X = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.0]])
    K = stacked_kernel(X, 2, "self")
    assert np.allclose(K, np.diag([1.0, 0.5**18]))
    assert not np.allclose(K, np.diag([1.0, 0.5**10]), rtol=0, atol=1e-8)


@given(full_rank_wide(max_n=4, max_log10_kappa=4.0), st.integers(1, 3))
def test_kappa_of_fixed_stack_in_log_space_matches_mpmath(X: np.ndarray, k: int) -> None:
    p = stacked_kernel_power(k, "fixed")
    log_pred = log10_kappa_power(condition_numbers(X)["kappa"], p)
    exact = kappa_power_exact(X, p)
    with mpmath.workdps(30):
        assert abs(log_pred - float(mpmath.log10(exact))) < 1e-9


def test_invalid_mode_and_depth() -> None:
    with pytest.raises(UserInputError):
        stacked_attention(np.ones((2, 2)), 1, "cross")
    with pytest.raises(UserInputError):
        stacked_kernel_power(-1)
    with pytest.raises(UserInputError):
        stacked_kernel_power(1, "other")


def test_check_reports_corrected() -> None:
    result = check_stacking(0)
    assert result.verdict == HOLDS_CORRECTED
    assert result.numbers["layers"][1]["self_rel_diff_vs_G^(2k+1)"] > 0.1
