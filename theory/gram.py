"""Gram matrices and parameter-free linearized attention (arXiv:2603.13085, Sec. 4, Thm 4.1).

Linearized attention over the whole training set maps the data matrix `X` (n x d) to
`G X = X X^T X` with `G = X X^T`; one point `x` (training or test) is mapped to `C x` with
`C = X^T X` (d x d). Its induced kernel on the training set is `(G X)(G X)^T = G^3` (Thm 4.1).

Stacking k layers has two readings, which the paper does not distinguish:

- ``mode="fixed"``: every layer attends with the *original* scores `G` (keys and values of the
  original input): `X -> G^k X`, kernel `G^(2k+1)` (the paper's "stacking" claim);
- ``mode="self"``: every layer is true self-attention on the previous layer's output `Y`:
  `Y -> Y Y^T Y`, so `Y_k = G^((3^k - 1)/2) X` and the kernel is `G^(3^k)`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ntkm.errors import UserInputError
from theory._validate import as_matrix, positive_int

StackMode = Literal["fixed", "self"]


def gram(X: np.ndarray) -> np.ndarray:
    """Gram matrix `G = X X^T` (n x n) of the rows of `X`."""
    A = as_matrix(X)
    return A @ A.T


def linearized_attention(X: np.ndarray, k: int = 1, context: np.ndarray | None = None) -> np.ndarray:
    """k fixed-context linearized attention layers: rows `x -> C^k x`, `C = context^T context`.

    With `context=None` the context is `X` itself and the result is `G^k X` (`G X = X X^T X` for
    k = 1). With a context (the training set), each row of `X` (a query, e.g. a test point)
    attends over the context: this is the paper's per-point map `x -> C x`, unnormalised.
    """
    Q = as_matrix(X)
    k = positive_int(k, "k", minimum=0)
    ctx = Q if context is None else as_matrix(context, "context")
    if ctx.shape[1] != Q.shape[1]:
        raise UserInputError(
            f"context has {ctx.shape[1]} columns but X has {Q.shape[1]}; pass a context with the same features"
        )
    if context is None:
        Y = Q
        for _ in range(k):
            Y = Q @ (Q.T @ Y)
        return Y
    C = ctx.T @ ctx
    Y = Q
    for _ in range(k):
        Y = Y @ C
    return Y


def stacked_attention(X: np.ndarray, k: int, mode: StackMode = "fixed") -> np.ndarray:
    """Output of k stacked linearized attention layers on `X` (see the module docstring for modes).

    ``"fixed"``: `G^k X` (kernel `G^(2k+1)`); ``"self"``: `Y -> Y Y^T Y` each layer (kernel
    `G^(3^k)`). Values grow like `||X||^(3^k)` in ``"self"`` mode: rescale `X` first for large k.
    """
    A = as_matrix(X)
    k = positive_int(k, "k", minimum=0)
    if mode == "fixed":
        return linearized_attention(A, k)
    if mode == "self":
        Y = A
        for _ in range(k):
            Y = Y @ (Y.T @ Y)
        return Y
    raise UserInputError(f"mode={mode!r} is unknown; pass mode='fixed' or mode='self'")


def stacked_kernel(X: np.ndarray, k: int, mode: StackMode = "fixed") -> np.ndarray:
    """Kernel `Y Y^T` induced on the rows of `X` by k stacked layers (`G^(2k+1)` or `G^(3^k)`)."""
    Y = stacked_attention(X, k, mode)
    return Y @ Y.T


def stacked_kernel_power(k: int, mode: StackMode = "fixed") -> int:
    """Power p with kernel = `G^p` after k layers: `2k+1` (fixed context) or `3^k` (self)."""
    k = positive_int(k, "k", minimum=0)
    if mode == "fixed":
        return 2 * k + 1
    if mode == "self":
        return 3**k
    raise UserInputError(f"mode={mode!r} is unknown; pass mode='fixed' or mode='self'")


def gram_power(X: np.ndarray, p: float) -> np.ndarray:
    """`G^p` for `G = X X^T`, from the SVD of `X` (`U diag(s^(2p)) U^T`), never by repeated products.

    Accurate to about `eps * ||G||^p` in norm. Use for moderate p; values overflow like `s_1^(2p)`.
    """
    A = as_matrix(X)
    U, s, _ = np.linalg.svd(A, full_matrices=False)
    return (U * s ** (2.0 * p)) @ U.T


def truncate(X: np.ndarray, r: int) -> np.ndarray:
    """Best rank-r approximation of `X` (Eckart-Young): `U_r diag(s_1..s_r) V_r^T`.

    `r >= min(n, d)` returns a copy of `X` (nothing to drop). Used by the paper's truncation remedy.
    """
    A = as_matrix(X)
    r = positive_int(r, "r", minimum=1)
    if r >= min(A.shape):
        return A.copy()
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    return (U[:, :r] * s[:r]) @ Vt[:r]


def _largest_eigenvalue(C: np.ndarray) -> float:
    """Largest eigenvalue of a symmetric PSD matrix (Lanczos for large d; deterministic start)."""
    d = C.shape[0]
    if d <= 256:
        return float(np.linalg.eigvalsh(C)[-1])
    from scipy.sparse.linalg import eigsh

    v0 = np.random.default_rng(0).standard_normal(d)
    return float(eigsh(C, k=1, which="LA", v0=v0, tol=1e-8, return_eigenvectors=False)[0])


def attention_features(
    X_train: np.ndarray,
    X: np.ndarray,
    k: int = 1,
    normalize: bool = True,
    rank: int | None = None,
    centre: bool = False,
) -> np.ndarray:
    """The paper's input map of MLP-Attn: each row `x` of `X` goes to `C^k x`, `C = X_train^T X_train`.

    `rank`: use the top-`rank` truncation of `X_train` (`C_r = V_r S_r^2 V_r^T`; the truncation remedy).
    `centre`: the suite's centred variant (not the paper's model): subtract the training mean `mu` from
    the context and from every query, `x -> C_c^k (x - mu)` with `C_c = (X_train - mu)^T (X_train - mu)`.
    Without it, `C x` is dominated by the direction of the mean pixel image, so all features nearly align.
    `normalize`: l2-normalise each row, as the paper does before the MLP. Normalisation is scale-free,
    so `C` is then rescaled to unit norm first (no overflow for large k). A row whose output is at
    rounding level (`||C^k x|| <= max(n, d) * eps * ||C||^k ||x||`, e.g. `x` orthogonal to the span
    of the training rows, or `x = 0`) is returned as zeros rather than as normalised rounding noise.
    """
    T = as_matrix(X_train, "X_train")
    Q = as_matrix(X, "X")
    k = positive_int(k, "k", minimum=0)
    if T.shape[1] != Q.shape[1]:
        raise UserInputError(f"X has {Q.shape[1]} features but X_train has {T.shape[1]}; pass matching widths")
    if rank is not None:
        rank = positive_int(rank, "rank", minimum=1)
    if centre:
        mu = T.mean(axis=0)
        T, Q = T - mu, Q - mu
    if rank is None:
        C = T.T @ T
        scale = _largest_eigenvalue(C) if normalize else 1.0
        if scale > 0:
            C = C / scale
        Y = Q
        for _ in range(k):
            Y = Y @ C
    else:
        _, s, Vt = np.linalg.svd(T, full_matrices=False)
        s, Vt = s[:rank], Vt[:rank]
        if normalize and s[0] > 0:
            s = s / s[0]
        Y = ((Q @ Vt.T) * s ** (2 * k)) @ Vt if k > 0 else Q.copy()
    if not normalize:
        return Y
    norms = np.linalg.norm(Y, axis=1)
    floor = max(T.shape) * np.finfo(np.float64).eps * np.linalg.norm(Q, axis=1)
    keep = norms > floor
    out = np.zeros_like(Y)
    out[keep] = Y[keep] / norms[keep, None]
    return out
