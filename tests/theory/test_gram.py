"""Thm 4.1: linearized attention X -> G X induces the kernel (GX)(GX)^T = G^3 (transitive similarity)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from theory_strategies import matrices, normwise_tol
from tolerances import F64_ALGORITHM, F64_FEATURES, F64_ROUNDING

from theory.checks import HOLDS, check_thm41
from theory.gram import attention_features, gram, gram_power, linearized_attention, truncate
from theory.symbolic import symbolic_matrix, thm41_residual, thm41_sum_residual

pytestmark = pytest.mark.claim("thm4.1")


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (2, 2)])
def test_symbolic_kernel_is_g_cubed(shape: tuple[int, int]) -> None:
    assert thm41_residual(*shape).is_zero_matrix


def test_symbolic_sum_formula() -> None:
    assert thm41_sum_residual(2, 3).is_zero_matrix
    assert thm41_sum_residual(3, 2).is_zero_matrix


def test_symbolic_sum_formula_written_out_for_one_entry() -> None:
    X = symbolic_matrix("x", 2, 2)
    x = [X.row(0), X.row(1)]
    G = X * X.T
    K = (G * X) * (G * X).T
    dot = lambda a, b: (x[a] * x[b].T)[0, 0]  # noqa: E731
    s = sum(dot(0, k) * dot(k, l) * dot(l, 1) for k in range(2) for l in range(2))
    assert sp.expand(K[0, 1] - s) == 0


def test_symbolic_negative_control() -> None:
    X = symbolic_matrix("x", 2, 3)
    G = X * X.T
    assert not ((G * X) * (G * X).T - G**2).applyfunc(sp.expand).is_zero_matrix


def test_word_identity_any_size() -> None:
    n, d = sp.symbols("n d", integer=True, positive=True)
    X = sp.MatrixSymbol("X", n, d)
    G = X * X.T
    assert ((G * X) * (G * X).T).doit().args == (X, X.T) * 3


def test_sympy_agrees_with_numpy_exactly_on_integers() -> None:
    rng = np.random.default_rng(3)
    Xi = rng.integers(-5, 6, (3, 4))
    Xs = sp.Matrix(Xi.tolist())
    Gs = Xs * Xs.T
    exact = np.array((Gs**3).tolist(), dtype=np.int64)
    F = linearized_attention(Xi.astype(float))
    assert np.array_equal(F @ F.T, exact.astype(float))


@given(matrices())
def test_kernel_equals_g_cubed_float64(X: np.ndarray) -> None:
    F = linearized_attention(X)
    G = gram(X)
    assert np.linalg.norm(F @ F.T - G @ G @ G) <= normwise_tol(X)
    assert np.linalg.norm(F @ F.T - gram_power(X, 3)) <= normwise_tol(X)


@given(matrices(), matrices())
def test_context_form_is_per_point_map(X: np.ndarray, Q: np.ndarray) -> None:
    Q = np.resize(Q, (Q.shape[0], X.shape[1]))
    out = linearized_attention(Q, context=X)
    ref = Q @ (X.T @ X)
    scale = np.linalg.norm(Q) * np.linalg.norm(X) ** 2
    assert np.linalg.norm(out - ref) <= 50 * sum(X.shape) * np.finfo(float).eps * scale


@given(matrices(kinds=("gaussian", "pixels", "conditioned", "near_duplicate")))
def test_normalised_kernel_is_cosine_normalised_g_cubed(X: np.ndarray) -> None:
    """With the paper's l2 normalisation the kernel is D^-1/2 G^3 D^-1/2, D = diag(G^3)."""
    Fn = attention_features(X, X)
    G3 = gram_power(X, 3)
    d = np.sqrt(np.clip(np.diag(G3), 0, None))
    keep = np.linalg.norm(Fn, axis=1) > 0
    ref = G3[np.ix_(keep, keep)] / np.outer(d[keep], d[keep])
    assert np.allclose((Fn @ Fn.T)[np.ix_(keep, keep)], ref, atol=1e-6)


@given(matrices(), st.integers(1, 3))
def test_attention_features_rows_are_unit_or_zero(X: np.ndarray, k: int) -> None:
    F = attention_features(X, X, k=k)
    norms = np.linalg.norm(F, axis=1)
    assert np.all(np.isfinite(F))
    assert np.all((np.abs(norms - 1) < F64_ROUNDING) | (norms == 0))


def test_attention_features_zero_and_orthogonal_rows_give_zeros() -> None:
    X_train = np.array([[1.0, 2.0, 0.0], [3.0, -1.0, 0.0]])
    Q = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    F = attention_features(X_train, Q)
    assert np.array_equal(F[0], np.zeros(3)) and np.array_equal(F[1], np.zeros(3))
    C = X_train.T @ X_train
    assert np.allclose(F[2], C[0] / np.linalg.norm(C[0]))


@given(matrices(kinds=("gaussian", "pixels")), st.floats(1e-3, 1e3), st.integers(1, 4))
def test_attention_features_scale_free_and_power(X: np.ndarray, c: float, k: int) -> None:
    F = attention_features(X, X, k=k)
    assert np.allclose(attention_features(c * X, X, k=k), F, atol=F64_FEATURES)
    raw = attention_features(X, X, k=k, normalize=False)
    assert np.allclose(raw, X @ np.linalg.matrix_power(X.T @ X, k), rtol=F64_FEATURES,
                       atol=F64_FEATURES * np.abs(raw).max())


@given(matrices(), st.integers(1, 6))
def test_truncate_is_best_rank_r(X: np.ndarray, r: int) -> None:
    Xr = truncate(X, r)
    s = np.linalg.svd(X, compute_uv=False)
    err = np.linalg.norm(X - Xr, 2)
    expected = s[r] if r < s.size else 0.0
    assert abs(err - expected) <= 1e3 * np.finfo(float).eps * s[0]


def test_check_reports_holds() -> None:
    result = check_thm41(0)
    assert result.verdict == HOLDS
    assert result.numbers["float64_rel_diff"] <= result.numbers["float64_tol"]


def test_attention_features_lanczos_path_for_wide_data() -> None:
    """d > 256 rescales C by its Lanczos top eigenvalue; the normalised features are unchanged."""
    rng = np.random.default_rng(11)
    X = rng.uniform(0, 1, (40, 300))
    Q = rng.uniform(0, 1, (5, 300))
    raw = Q @ (X.T @ X) @ (X.T @ X)
    expected = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.allclose(attention_features(X, Q, k=2), expected, atol=F64_ROUNDING)
    assert np.allclose(attention_features(X, Q, k=2, rank=40), expected, atol=F64_ALGORITHM)
