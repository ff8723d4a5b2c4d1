"""Kernel ridge regression and its closed-form leave-one-out (the paper's influence; Zhang & Zhang 2022).

With `A = K + ridge I` and `M = A^-1`, `alpha = M Y` and `f(x) = k(x)^T alpha`. Removing training
point i and refitting gives exactly

    f_-i(x) = f(x) - (k(x)^T M[:, i]) alpha[i] / M[i, i].

Derivation (checked symbolically in tests/theory): by the block-inverse (Schur complement) formula,
`(A_{-i,-i})^-1 = M_{-i,-i} - M_{-i,i} M_{i,-i} / M_ii`; applying it to `Y_{-i}` and using
`alpha_{-i} = M_{-i,-i} Y_{-i} + M_{-i,i} Y_i`, `alpha_i = M_{i,-i} Y_{-i} + M_ii Y_i` gives the
refitted coefficients `alpha_{-i} - M_{-i,i} alpha_i / M_ii`, i.e. `beta = alpha - M[:, i] alpha_i / M_ii`
with `beta_i = 0`, so `f_-i(x) = k(x)^T beta`: the docs/DESIGN.md form is correct as written.
At a training point this is the classical `y_i - f_-i(x_i) = alpha_i / M_ii`.

Solves use a Cholesky factorisation of `K + ridge I` (never `inv`); `M` is formed by Cholesky solves
only where the leave-one-out formula needs its columns.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ntkm.errors import UserInputError
from theory._validate import as_matrix, as_targets, positive_float


def _kernel(K: np.ndarray) -> np.ndarray:
    A = as_matrix(K, "K")
    if A.shape[0] != A.shape[1]:
        raise UserInputError(f"K has shape {A.shape}; pass the square (n x n) training kernel")
    scale = float(np.max(np.abs(A)))
    if np.max(np.abs(A - A.T)) > 1e-10 * max(scale, 1e-300):
        raise UserInputError("K is not symmetric; pass a kernel matrix (symmetrise it with (K + K.T) / 2)")
    return (A + A.T) / 2


def _factor(K: np.ndarray, ridge: float) -> tuple[np.ndarray, bool]:
    ridge = positive_float(ridge, "ridge", allow_zero=True)
    A = K + ridge * np.eye(K.shape[0])
    try:
        return scipy.linalg.cho_factor(A, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise UserInputError(
            f"K + ridge*I is not positive definite (ridge={ridge}); pass a PSD kernel and a larger ridge"
        ) from None


def _test_kernel(K_test_train: np.ndarray, n: int) -> np.ndarray:
    Kt = as_matrix(K_test_train, "K_test_train")
    if Kt.shape[1] != n:
        raise UserInputError(
            f"K_test_train has {Kt.shape[1]} columns but there are {n} training points; pass shape (n_test, {n})"
        )
    return Kt


def krr_fit(K: np.ndarray, Y: np.ndarray, ridge: float) -> np.ndarray:
    """Coefficients `alpha = (K + ridge I)^-1 Y` (float64, Cholesky); same shape as `Y`."""
    A = _kernel(K)
    T = as_targets(Y, A.shape[0])
    return scipy.linalg.cho_solve(_factor(A, ridge), T, check_finite=False)


def krr_predict(K_test_train: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Predictions `K_test_train @ alpha` (n_test x c, or n_test for 1-D alpha)."""
    al = np.asarray(alpha, dtype=np.float64)
    Kt = _test_kernel(K_test_train, al.shape[0])
    return Kt @ al


def _as_2d(Y: np.ndarray) -> np.ndarray:
    return Y[:, None] if Y.ndim == 1 else Y


def loo_predictions(K: np.ndarray, Y: np.ndarray, ridge: float, K_test_train: np.ndarray) -> np.ndarray:
    """Exact leave-one-out predictions, shape (n_train, n_test, c): entry [i] is `f_-i` on the test set.

    Closed form `f_-i(x) = f(x) - (k(x)^T M[:, i]) alpha[i] / M[i, i]`, `M = (K + ridge I)^-1`
    (see the module docstring); no refitting. 1-D `Y` gives c = 1.
    """
    A = _kernel(K)
    n = A.shape[0]
    T = _as_2d(as_targets(Y, n))
    Kt = _test_kernel(K_test_train, n)
    factor = _factor(A, ridge)
    M = scipy.linalg.cho_solve(factor, np.eye(n), check_finite=False)
    M = (M + M.T) / 2
    alpha = M @ T
    F = Kt @ alpha
    P = Kt @ M
    coef = alpha / np.diag(M)[:, None]
    return F[None, :, :] - P.T[:, :, None] * coef[:, None, :]


def loo_residuals(K: np.ndarray, Y: np.ndarray, ridge: float) -> np.ndarray:
    """Training leave-one-out residuals `y_i - f_-i(x_i) = alpha_i / M_ii` (shape of `Y`)."""
    A = _kernel(K)
    n = A.shape[0]
    T = as_targets(Y, n)
    factor = _factor(A, ridge)
    M = scipy.linalg.cho_solve(factor, np.eye(n), check_finite=False)
    alpha = scipy.linalg.cho_solve(factor, T, check_finite=False)
    diag = np.diag(M)
    return alpha / (diag if T.ndim == 1 else diag[:, None])


def loo_brute_force(K: np.ndarray, Y: np.ndarray, ridge: float, K_test_train: np.ndarray) -> np.ndarray:
    """Reference for `loo_predictions`: refit n times without point i. Shape (n_train, n_test, c)."""
    A = _kernel(K)
    n = A.shape[0]
    if n < 2:
        raise UserInputError("leave-one-out needs at least 2 training points; pass a larger K")
    T = _as_2d(as_targets(Y, n))
    Kt = _test_kernel(K_test_train, n)
    out = np.empty((n, Kt.shape[0], T.shape[1]))
    for i in range(n):
        keep = np.arange(n) != i
        alpha = krr_fit(A[np.ix_(keep, keep)], T[keep], ridge)
        out[i] = Kt[:, keep] @ alpha
    return out


def loo_influence(
    K: np.ndarray, Y: np.ndarray, ridge: float, K_test_train: np.ndarray, Y_test: np.ndarray
) -> np.ndarray:
    """Influence of training point i on test point t under squared loss: `L(f_-i) - L(f)`, (n_train, n_test).

    Positive: removing i raises the test loss, so i is helpful; negative: harmful.
    """
    A = _kernel(K)
    n = A.shape[0]
    Kt = _test_kernel(K_test_train, n)
    Yt = _as_2d(as_targets(Y_test, Kt.shape[0], "Y_test"))
    loo = loo_predictions(A, Y, ridge, Kt)
    full = Kt @ _as_2d(krr_fit(A, Y, ridge))
    base = np.sum((full - Yt) ** 2, axis=1)
    return np.sum((loo - Yt[None]) ** 2, axis=2) - base[None, :]
