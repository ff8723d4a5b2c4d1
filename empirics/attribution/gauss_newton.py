"""Gauss-Newton influence through the Woodbury identity, computed from the empirical NTK only.

Setting (Koh & Liang 2017 with the Gauss-Newton Hessian). For per-example output Jacobians
`J_i` (c x P) of the trained network, residual gradients `r_i = dL_i / df` (c,) (cross-entropy:
softmax - one-hot; one-output MSE against +-1: f - y), and damping `lambda > 0`:

    H = (1/n) sum_i J_i^T J_i + lambda I  =  U^T U / n + lambda I,     U = [J_1; ...; J_n] (nc x P)
    g_i = J_i^T r_i                        (gradient of training point i's loss)
    influence[i, t] = (1/n) g_t^T H^-1 g_i

the first-order change of test loss t when training point i is removed (positive: removing i
raises the loss, so i is helpful; the sign convention of `empirics.attribution.influence`). Woodbury,
`H^-1 = (1/lambda) (I - U^T (n lambda I + U U^T)^-1 U)`, needs only kernel blocks
`Theta(a, b) = J_a J_b^T` (c x c):

    g_t^T H^-1 g_i = (1/lambda) [ r_t^T Theta(t, i) r_i - w_t^T (n lambda I + Theta)^-1 v_i ],
    v_i = Theta(:, i) r_i,  w_t = Theta(:, t) r_t       (Theta: the (nc x nc) training kernel)

(`gn_influence_full`). With the per-output ("mean") kernel `K` and `Theta = K (x) I_c` (no
coupling between outputs, as for the paper's networks in expectation) this collapses to

    influence[i, t] = (r_i . r_t) [(K + rho I)^-1 K(X_train, x_t)]_i,    rho = n lambda

(`gn_influence_mean`): the same `(K + rho I)^-1` as the NTK leave-one-out formula, so the audit
uses `rho` = the leave-one-out ridge. `gn_influence_explicit` forms `H` (P x P) and solves with it:
the reference the Woodbury forms are tested against.

**Empirical Fisher** (`ef_influence`): the same influence with `H = G^T G / n + lambda I`, G = [g_1; ...; g_n]
(n x P) the per-example loss gradients. Its dual needs only the gradients' Gram matrix `S = G G^T`
(`S_ij = r_i^T Theta(i, j) r_j`, `S_ij = K_ij (r_i . r_j)` in the mean form, `ef_grams_mean`): by Woodbury,
`(1/n) g_t^T H^-1 g_i = [(S + rho I)^-1 S(X_train, x_t)]_i` with rho = n lambda, exact and n-dimensional;
`ef_influence_explicit` is its P x P reference.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from ntkm.errors import UserInputError


def loss_residuals_torch(out: torch.Tensor, y: torch.Tensor, loss: str = "auto") -> torch.Tensor:
    """`dL/df` per example (n, c) for the suite's training losses (float64, `empirics.nets.losses.loss_fn`), on the
    device of `out`: the labels `y` are moved there (they may be held on the CPU while the outputs come from a GPU
    model).

    c > 1: cross-entropy, `softmax(f) - onehot(y)` (`loss="mse"`: `0.5 ||f - onehot(y)||^2`, i.e. `f - onehot(y)`);
    c = 1: `0.5 (f - (2y - 1))^2`, i.e. `f - (2y - 1)`.
    """
    f = out.detach().to(torch.float64)
    y = y.to(f.device)
    if f.shape[1] == 1:
        return (f[:, 0] - (2.0 * y.to(torch.float64) - 1.0))[:, None]
    if loss == "mse":
        return f - torch.nn.functional.one_hot(y, f.shape[1]).to(torch.float64)
    p = torch.softmax(f, dim=1)
    return p - torch.nn.functional.one_hot(y, f.shape[1]).to(torch.float64)


def loss_residuals(out: torch.Tensor, y: torch.Tensor, loss: str = "auto") -> np.ndarray:
    """`loss_residuals_torch` as a numpy array (the residuals cross to the CPU here, for the numpy solves)."""
    return loss_residuals_torch(out, y, loss).cpu().numpy()


def _check(n: int, r_train: np.ndarray, r_test: np.ndarray, damping: float) -> None:
    if r_train.shape[0] != n:
        raise UserInputError(f"{r_train.shape[0]} training residuals for a kernel of {n} points")
    if r_train.shape[1] != r_test.shape[1]:
        raise UserInputError(f"residual widths differ: train {r_train.shape[1]}, test {r_test.shape[1]}")
    if not np.isfinite(damping) or damping <= 0:
        raise UserInputError(f"Gauss-Newton damping must be finite and > 0, got {damping}")


def _solve(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    A = (A + A.T) / 2
    try:
        return scipy.linalg.cho_solve(scipy.linalg.cho_factor(A, lower=True, check_finite=False), B,
                                      check_finite=False)
    except np.linalg.LinAlgError:
        return np.linalg.solve(A, B)


def gn_influence_full(theta_train: np.ndarray, theta_test_train: np.ndarray, r_train: np.ndarray,
                      r_test: np.ndarray, damping: float) -> np.ndarray:
    """Exact Gauss-Newton influence (n, t) from full kernels `Theta[a, b, :, :] = J_a J_b^T`.

    `theta_train` (n, n, c, c), `theta_test_train` (t, n, c, c), residuals (n, c) and (t, c).
    """
    th = np.asarray(theta_train, dtype=np.float64)
    tt = np.asarray(theta_test_train, dtype=np.float64)
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    n, c = th.shape[0], th.shape[2]
    _check(n, r, rt, damping)
    flat = th.transpose(0, 2, 1, 3).reshape(n * c, n * c)
    v = np.einsum("jiab,ib->jai", th, r).reshape(n * c, n)
    w = np.einsum("tjba,tb->jat", tt, rt).reshape(n * c, -1)
    s = np.einsum("ta,tiab,ib->it", rt, tt, r)
    solved = _solve(flat + n * damping * np.eye(n * c), v)
    return (s - solved.T @ w) / (n * damping)


def gn_influence_mean(K: np.ndarray, K_test_train: np.ndarray, r_train: np.ndarray, r_test: np.ndarray,
                      ridge: float) -> np.ndarray:
    """Gauss-Newton influence (n, t) with `Theta = K (x) I_c`; `ridge = n * damping` on `K`."""
    K = np.asarray(K, dtype=np.float64)
    Kt = np.asarray(K_test_train, dtype=np.float64)
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    n = K.shape[0]
    _check(n, r, rt, ridge)
    if Kt.shape != (rt.shape[0], n):
        raise UserInputError(f"K_test_train has shape {Kt.shape}, expected ({rt.shape[0]}, {n})")
    proj = _solve(K + ridge * np.eye(n), Kt.T)
    return (r @ rt.T) * proj


def gn_influence_explicit(J_train: np.ndarray, J_test: np.ndarray, r_train: np.ndarray, r_test: np.ndarray,
                          damping: float) -> np.ndarray:
    """Reference: form `H = U^T U / n + damping I` (P x P) and solve. Jacobians (n, c, P), (t, c, P)."""
    J = np.asarray(J_train, dtype=np.float64)
    Jt = np.asarray(J_test, dtype=np.float64)
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    n, _, p = J.shape
    _check(n, r, rt, damping)
    u = J.reshape(-1, p)
    h = u.T @ u / n + damping * np.eye(p)
    g = np.einsum("icp,ic->pi", J, r)
    gt = np.einsum("tcp,tc->pt", Jt, rt)
    return g.T @ np.linalg.solve(h, gt) / n


def ef_grams_mean(K: np.ndarray, K_test_train: np.ndarray, r_train: np.ndarray,
                  r_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The loss gradients' Gram matrices (n, n) and (t, n) with `Theta = K (x) I_c`: `K_ij (r_i . r_j)`."""
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    return np.asarray(K, dtype=np.float64) * (r @ r.T), np.asarray(K_test_train, dtype=np.float64) * (rt @ r.T)


def ef_influence(S: np.ndarray, S_test_train: np.ndarray, ridge: float) -> np.ndarray:
    """Empirical-Fisher influence (n, t) from the gradients' Gram matrices; `ridge = n * damping` on `S`."""
    S = np.asarray(S, dtype=np.float64)
    St = np.asarray(S_test_train, dtype=np.float64)
    n = S.shape[0]
    if S.shape != (n, n) or St.ndim != 2 or St.shape[1] != n:
        raise UserInputError(f"gradient Gram matrices of shapes {S.shape} and {St.shape} do not match")
    if not ridge > 0:
        raise UserInputError(f"the ridge must be > 0, got {ridge}")
    return _solve(S + ridge * np.eye(n), St.T)


def ef_influence_explicit(J_train: np.ndarray, J_test: np.ndarray, r_train: np.ndarray, r_test: np.ndarray,
                          damping: float) -> np.ndarray:
    """Reference: form `H = G^T G / n + damping I` (P x P) from the gradients `g_i = J_i^T r_i` and solve."""
    J, Jt = np.asarray(J_train, dtype=np.float64), np.asarray(J_test, dtype=np.float64)
    g = np.einsum("icp,ic->ip", J, np.asarray(r_train, dtype=np.float64))
    gt = np.einsum("tcp,tc->tp", Jt, np.asarray(r_test, dtype=np.float64))
    n, p = g.shape
    h = g.T @ g / n + damping * np.eye(p)
    return g @ np.linalg.solve(h, gt.T) / n


#: Largest dual dimension n c of the exact generalised Gauss-Newton solve (`ggn_influence_mean`): an (n c)^2 float64
#: matrix (512 MiB at this size) and its Cholesky factorisation (seconds on 2 cores); above it the estimator says so.
GGN_MAX_DIM = 8192


def output_hessians(r_train: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Each training point's Hessian of its loss in the outputs (n, c, c): cross-entropy (c > 1) `diag(p) - p p^T`
    with `p = r + Y` (the residual plus the one-hot target is the softmax); one output, `0.5 (f - y)^2`: 1."""
    r, Y = np.asarray(r_train, dtype=np.float64), np.asarray(Y, dtype=np.float64)
    n, c = r.shape
    if c == 1:
        return np.ones((n, 1, 1))
    p = r + Y
    return np.einsum("ia,ab->iab", p, np.eye(c)) - p[:, :, None] * p[:, None, :]


def _sqrt_psd(h: np.ndarray) -> np.ndarray:
    """Symmetric square roots of a stack of PSD matrices (n, c, c); rounding below 0 is clipped."""
    e, v = np.linalg.eigh((h + h.transpose(0, 2, 1)) / 2)
    return (v * np.sqrt(np.clip(e, 0.0, None))[:, None, :]) @ v.transpose(0, 2, 1)


def ggn_dual_kernel(K: np.ndarray, hessians: np.ndarray) -> np.ndarray:
    """`M = B^1/2 (K (x) I_c) B^1/2` (n c x n c): the curvature of the generalised Gauss-Newton Hessian in the dual,
    `M[(j, a), (k, b)] = K_jk (B_j^1/2 B_k^1/2)[a, b]`, built one block row at a time."""
    K = np.asarray(K, dtype=np.float64)
    bh = _sqrt_psd(np.asarray(hessians, dtype=np.float64))
    n, c = bh.shape[0], bh.shape[1]
    m = np.empty((n, c, n, c))
    for j in range(n):
        m[j] = (K[j][:, None, None] * (bh[j][None] @ bh)).transpose(1, 0, 2)
    return m.reshape(n * c, n * c)


def ggn_influence_mean(K: np.ndarray, K_test_train: np.ndarray, r_train: np.ndarray, r_test: np.ndarray,
                       hessians: np.ndarray, ridge: float) -> np.ndarray:
    """Influence (n, t) with the generalised Gauss-Newton Hessian `H = (1/n) sum_i J_i^T B_i J_i + lambda I` (`B_i`
    the loss's Hessian in the outputs, `output_hessians`; for cross-entropy the softmax's, which `gn_influence_mean`
    leaves out) and `Theta = K (x) I_c`, exact in the dual through Woodbury with `U = B^1/2 J`; `ridge = n lambda`:

        influence[i, t] = [K_ti (r_i . r_t) - v_i^T (M + ridge I)^-1 w_t] / ridge,
        v_i = B^1/2 (K[:, i] (x) r_i),  w_t = B^1/2 (K[:, t] (x) r_t),  M = `ggn_dual_kernel`.

    For a model linear in its parameters this is the textbook influence function (Koh & Liang 2017) with the exact
    Hessian of the regularised loss. `ggn_influence_explicit` is its P x P reference."""
    K = np.asarray(K, dtype=np.float64)
    Kt = np.asarray(K_test_train, dtype=np.float64)
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    n, c = r.shape
    _check(n, r, rt, ridge)
    if n * c > GGN_MAX_DIM:
        raise UserInputError(f"the exact generalised Gauss-Newton solve needs an {n * c} x {n * c} matrix (n c > "
                             f"{GGN_MAX_DIM}); use fewer training points (--n) or another estimator")
    bh = _sqrt_psd(np.asarray(hessians, dtype=np.float64))
    m = ggn_dual_kernel(K, hessians)
    v = np.einsum("ji,jab,ib->jai", K, bh, r).reshape(n * c, n)
    w = np.einsum("tj,jab,tb->jat", Kt, bh, rt).reshape(n * c, -1)
    s = Kt.T * (r @ rt.T)
    return (s - _solve(m + ridge * np.eye(n * c), v).T @ w) / ridge


def ggn_ridge(K: np.ndarray, hessians: np.ndarray, ridge_rel: float) -> float:
    """The absolute ridge of `ggn_influence_mean`: `ridge_rel` times the mean diagonal of its dual kernel `M` (the
    rule of the NTK leave-one-out ridge, `empirics.attribution.influence.resolve_ridge`, on the curvature the solve
    inverts)."""
    bh = _sqrt_psd(np.asarray(hessians, dtype=np.float64))
    diag = np.einsum("j,jab,jba->", np.diag(np.asarray(K, dtype=np.float64)), bh, bh)
    return max(float(ridge_rel * diag / (bh.shape[0] * bh.shape[1])), 1e-12)


def ggn_influence_explicit(J_train: np.ndarray, J_test: np.ndarray, r_train: np.ndarray, r_test: np.ndarray,
                           hessians: np.ndarray, damping: float) -> np.ndarray:
    """Reference: form `H = (1/n) sum_i J_i^T B_i J_i + damping I` (P x P) and solve. Jacobians (n, c, P), (t, c, P)."""
    J, Jt = np.asarray(J_train, dtype=np.float64), np.asarray(J_test, dtype=np.float64)
    r, rt = np.asarray(r_train, dtype=np.float64), np.asarray(r_test, dtype=np.float64)
    n, _, p = J.shape
    _check(n, r, rt, damping)
    h = np.einsum("iap,iab,ibq->pq", J, np.asarray(hessians, dtype=np.float64), J) / n + damping * np.eye(p)
    g = np.einsum("icp,ic->pi", J, r)
    gt = np.einsum("tcp,tc->pt", Jt, rt)
    return g.T @ np.linalg.solve(h, gt) / n
