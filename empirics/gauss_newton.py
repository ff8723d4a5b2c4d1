"""Gauss-Newton influence through the Woodbury identity, computed from the empirical NTK only.

Setting (Koh & Liang 2017 with the Gauss-Newton Hessian). For per-example output Jacobians
`J_i` (c x P) of the trained network, residual gradients `r_i = dL_i / df` (c,) (cross-entropy:
softmax - one-hot; one-output MSE against +-1: f - y), and damping `lambda > 0`:

    H = (1/n) sum_i J_i^T J_i + lambda I  =  U^T U / n + lambda I,     U = [J_1; ...; J_n] (nc x P)
    g_i = J_i^T r_i                        (gradient of training point i's loss)
    influence[i, t] = (1/n) g_t^T H^-1 g_i

the first-order change of test loss t when training point i is removed (positive: removing i
raises the loss, so i is helpful; the sign convention of `empirics.influence`). Woodbury,
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
    """`dL/df` per example (n, c) for the suite's training losses (float64, `empirics.losses.loss_fn`), on the device
    of `out`: the labels `y` are moved there (they may be held on the CPU while the outputs come from a GPU model).

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
