"""Data-dependent sensitivity of linearized attention (arXiv:2603.13085, Prop 4.5, corrected form).

As written, Prop 4.5 bounds the change by `||G x_j||_1 * eps`, which is undefined: `G` is n x n and
`x_j` is d-dimensional. The dimensionally consistent reading is `||G e_j||_1 = sum_i |x_i . x_j|`
(the j-th column of G). This module states and implements the form the suite checks:

Perturb training input `x_j -> x_j + delta`, `||delta||_inf <= eps`. The attention output of every
other training point `i != j` is `F_i = C x_i` with `C = X^T X`, and it changes by exactly

    F'_i - F_i = (x_j . x_i) delta + (delta . x_i) (x_j + delta),

so, by Hoelder (`|delta . x_i| <= eps ||x_i||_1`),

    S(delta) = sum_{i != j} ||F'_i - F_i||_inf
             <= eps * sum_{i != j} [ |G_ij| + ||x_i||_1 (||x_j||_inf + eps) ]  =: B(X, j, eps).

`B` grows linearly with n (each other point contributes), unlike a perturbation of the raw input,
which leaves every other point unchanged. Its first term, `eps (||G e_j||_1 - G_jj)`, is the paper's
quantity read as `G e_j`; the second term has the same order, so the paper's quantity alone is not an
upper bound. `B` is attained (equality) when `X >= 0` entrywise (pixels) and `delta = eps * 1`.
"""

from __future__ import annotations

import numpy as np

from ntkm.errors import UserInputError
from theory._validate import as_matrix, positive_float


def _index(X: np.ndarray, j: int) -> int:
    n = X.shape[0]
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= int(j) < n:
        raise UserInputError(f"j={j!r} is not a row index of X (n={n}); pass an integer in [0, {n - 1}]")
    return int(j)


def attention_output_change(X: np.ndarray, j: int, delta: np.ndarray) -> np.ndarray:
    """`||F'_i - F_i||_inf` for every i (entry j is 0: only the other points are measured).

    `F = X C` are the unnormalised attention outputs, recomputed exactly after `x_j += delta`.
    """
    A = as_matrix(X)
    j = _index(A, j)
    dl = np.asarray(delta, dtype=np.float64).reshape(-1)
    if dl.shape[0] != A.shape[1]:
        raise UserInputError(f"delta has {dl.shape[0]} entries but X has {A.shape[1]} columns; match them")
    Ap = A.copy()
    Ap[j] += dl
    change = np.max(np.abs(A @ (Ap.T @ Ap) - A @ (A.T @ A)), axis=1)
    change[j] = 0.0
    return change


def sensitivity_bound(X: np.ndarray, j: int, eps: float) -> float:
    """Corrected Prop 4.5: `B = eps * sum_{i != j} (|G_ij| + ||x_i||_1 (||x_j||_inf + eps))`."""
    A = as_matrix(X)
    j = _index(A, j)
    e = positive_float(eps, "eps", allow_zero=True)
    others = np.arange(A.shape[0]) != j
    g = np.abs(A[others] @ A[j])
    l1 = np.sum(np.abs(A[others]), axis=1)
    return float(e * np.sum(g + l1 * (np.max(np.abs(A[j])) + e)))


def paper_quantity(X: np.ndarray, j: int, eps: float) -> float:
    """Prop 4.5 read dimensionally correctly: `||G e_j||_1 * eps` (the j-th Gram column)."""
    A = as_matrix(X)
    j = _index(A, j)
    e = positive_float(eps, "eps", allow_zero=True)
    return float(e * np.sum(np.abs(A @ A[j])))


def paper_quantity_as_written(X: np.ndarray, j: int, eps: float) -> float:
    """Prop 4.5 literally: `||G x_j||_1 * eps`. Raises numpy's ValueError unless n == d."""
    A = as_matrix(X)
    j = _index(A, j)
    return float(eps * np.sum(np.abs(np.matmul(A @ A.T, A[j]))))
