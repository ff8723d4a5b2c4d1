"""Analytic arc-cosine kernels and the infinite-width NTKs of 2L-ReLU and MLP-Attn (Thm 4.2).

The network is `f(x) = m^-1/2 sum_r a_r relu(w_r . x)` with fixed signs `a_r = +-1` and only the
first layer `W ~ N(0, I)` trained (NTK parameterisation). Its NTK is
`Theta(x, y) = <x, y> E_w[relu'(w.x) relu'(w.y)] = <x, y> (pi - theta) / (2 pi)`, `theta` the angle
between `x` and `y` (Thm 4.2, arc-cosine kernel of degree 0, Cho & Saul 2009). MLP-Attn applies the
same network to `normalise(C x)` (`theory.gram.attention_features`).

Conventions: `relu'(0) = 0` (as in torch), so a zero vector has kernel 0 with everything. Cosines
are clipped to [-1, 1] before `arccos`, so rounding never gives NaN; near `theta = 0` the angle is
then accurate to about `sqrt(eps)` (1e-8), and the kernels to about `1e-9`.
"""

from __future__ import annotations

import math

import numpy as np

from ntkm.errors import UserInputError
from theory._validate import as_matrix, positive_int
from theory.gram import attention_features


def _pair(X1: np.ndarray, X2: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    A = as_matrix(X1, "X1")
    B = A if X2 is None else as_matrix(X2, "X2")
    if A.shape[1] != B.shape[1]:
        raise UserInputError(f"X1 has {A.shape[1]} features and X2 has {B.shape[1]}; pass matching widths")
    return A, B


def angles(X1: np.ndarray, X2: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairwise angles `theta` (in [0, pi]), inner products and the mask of pairs with no zero vector.

    With `X2=None` (or `X2 is X1`) the diagonal angles are exactly 0 (a point with itself), not
    `arccos(1 - rounding)`.
    """
    A, B = _pair(X1, X2)
    inner = A @ B.T
    na = np.linalg.norm(A, axis=1)
    nb = np.linalg.norm(B, axis=1)
    denom = np.outer(na, nb)
    nonzero = denom > 0
    cos = np.zeros_like(inner)
    np.divide(inner, denom, out=cos, where=nonzero)
    theta = np.arccos(np.clip(cos, -1.0, 1.0))
    if X2 is None or X2 is X1:
        np.fill_diagonal(theta, 0.0)
    return theta, inner, nonzero


def arccos0(X1: np.ndarray, X2: np.ndarray | None = None) -> np.ndarray:
    """`E_w[relu'(w.x) relu'(w.y)] = (pi - theta) / (2 pi)`, `w ~ N(0, I)`; 0 if x or y is zero."""
    theta, _, nonzero = angles(X1, X2)
    return np.where(nonzero, (math.pi - theta) / (2 * math.pi), 0.0)


def arccos1(X1: np.ndarray, X2: np.ndarray | None = None) -> np.ndarray:
    """`E_w[relu(w.x) relu(w.y)] = |x||y| (sin t + (pi - t) cos t) / (2 pi)`, `w ~ N(0, I)`."""
    A, B = _pair(X1, X2)
    theta, _, _ = angles(A, None if X2 is None or X2 is X1 else B)
    norms = np.outer(np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1))
    return norms * (np.sin(theta) + (math.pi - theta) * np.cos(theta)) / (2 * math.pi)


def analytic_ntk_two_layer(X1: np.ndarray, X2: np.ndarray | None = None) -> np.ndarray:
    """Infinite-width NTK of 2L-ReLU with only W trained: `<x, y> (pi - theta) / (2 pi)` (Thm 4.2)."""
    theta, inner, nonzero = angles(X1, X2)
    return np.where(nonzero, inner * (math.pi - theta) / (2 * math.pi), 0.0)


def analytic_ntk_mlp_attn(
    X_train: np.ndarray,
    X1: np.ndarray,
    X2: np.ndarray | None = None,
    k: int = 1,
    rank: int | None = None,
    centre: bool = False,
) -> np.ndarray:
    """Infinite-width NTK of MLP-Attn (Thm 4.2): `analytic_ntk_two_layer` on `normalise(C^k x)`.

    `C = X_train^T X_train` (top-`rank` truncation if given); the same `C` serves training and
    test points, so every kernel entry depends on the whole training set. `centre`: the centred
    variant of `gram.attention_features`.
    """
    F1 = attention_features(X_train, X1, k=k, normalize=True, rank=rank, centre=centre)
    F2 = F1 if X2 is None else attention_features(X_train, X2, k=k, normalize=True, rank=rank, centre=centre)
    return analytic_ntk_two_layer(F1, F2)


def sample_first_layer(m: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Initial weights of the width-m network: `W ~ N(0, 1)` (m x d) and signs `a` in {-1, +1}^m."""
    m = positive_int(m, "m")
    d = positive_int(d, "d")
    W = rng.standard_normal((m, d))
    a = rng.choice(np.array([-1.0, 1.0]), size=m)
    return W, a


def empirical_ntk_two_layer(
    X1: np.ndarray, X2: np.ndarray | None, W: np.ndarray, a: np.ndarray | None = None
) -> np.ndarray:
    """Finite-width NTK of `f(x) = m^-1/2 a^T relu(W x)` w.r.t. W: `(1/m) (X1 X2^T) o (D1 diag(a^2) D2^T)`.

    `D[i, r] = relu'(w_r . x_i)` with `relu'(0) = 0`. Two matrix products instead of a Jacobian
    contraction; converges to `analytic_ntk_two_layer` at rate `m^-1/2` (Thm 4.2).
    """
    A, B = _pair(X1, X2)
    Wm = as_matrix(W, "W")
    if Wm.shape[1] != A.shape[1]:
        raise UserInputError(f"W has {Wm.shape[1]} columns but the inputs have {A.shape[1]}; pass W of shape (m, d)")
    m = Wm.shape[0]
    a2 = np.ones(m) if a is None else np.asarray(a, dtype=np.float64).reshape(m) ** 2
    D1 = (A @ Wm.T > 0).astype(np.float64)
    D2 = D1 if X2 is None else (B @ Wm.T > 0).astype(np.float64)
    return (A @ B.T) * ((D1 * a2) @ D2.T) / m


def softmax_attention_features(X_train: np.ndarray, X: np.ndarray, temperature: float) -> np.ndarray:
    """`normalise(softmax(x X_train^T / T) X_train)` per row of `X`: parameter-free softmax attention over the
    training set (the suite's `softmax` variant; `T -> inf` gives the normalised training mean for every x)."""
    Xtr = as_matrix(X_train, "X_train")
    Xq = as_matrix(X, "X")
    if Xq.shape[1] != Xtr.shape[1]:
        raise UserInputError(f"X has {Xq.shape[1]} features and X_train {Xtr.shape[1]}; pass matching widths")
    if not (math.isfinite(temperature) and temperature > 0):
        raise UserInputError(f"temperature must be a positive number (got {temperature})")
    s = Xq @ Xtr.T / temperature
    w = np.exp(s - s.max(axis=1, keepdims=True))
    h = (w / w.sum(axis=1, keepdims=True)) @ Xtr
    return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-300)


def analytic_ntk_softmax_attn(X_train: np.ndarray, X1: np.ndarray, X2: np.ndarray | None = None,
                     temperature: float = 1.0) -> np.ndarray:
    """Infinite-width NTK of the softmax-attention variant: attention has no parameters, so Thm 4.2 applies to its
    features, `analytic_ntk_two_layer(softmax_attention_features(...))`."""
    F1 = softmax_attention_features(X_train, X1, temperature)
    F2 = F1 if X2 is None else softmax_attention_features(X_train, X2, temperature)
    return analytic_ntk_two_layer(F1, F2)
