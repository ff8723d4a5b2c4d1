"""Condition numbers of Gram matrices and their powers (arXiv:2603.13085, Thm 4.7).

Everything in float64 is computed from the singular values of `X`, never from `G = X X^T`:
the SVD of `X` resolves `s_i` to about `eps * s_1`, so the eigenvalue `s_i^2` of `G` keeps its
relative accuracy while `s_1 / s_i << 1 / eps`, i.e. `kappa(G)` is reliable up to ~1e30, where
`eigvalsh(G)` (absolute error `eps * ||G||`) fails beyond ~1e15. Powers are taken in log space:
`kappa(G^p) = kappa(G)^p` is never formed as a float64 matrix. `kappa_power_exact` forms `G^p`
in mpmath at high precision, as the reference the tests and checks compare against.

Rank tolerance: a singular value counts as nonzero when `s_i > rtol * s_1`, with default
`rtol = max(n, d) * eps` (numpy's `matrix_rank` default). `G` is singular when `rank < n`,
always the case for `n > d`; its condition number is then `math.inf` (reported, not an error).
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np

from ntkm.errors import UserInputError
from theory._validate import as_matrix, positive_float

EPS = float(np.finfo(np.float64).eps)


def singular_values(X: np.ndarray) -> np.ndarray:
    """Singular values of `X`, descending (min(n, d) of them)."""
    return np.linalg.svd(as_matrix(X), compute_uv=False)


def default_rtol(n: int, d: int) -> float:
    """Default relative rank tolerance on singular values: `max(n, d) * eps` (numpy's choice)."""
    return max(n, d) * EPS


def eigenvalues_of_gram(X: np.ndarray) -> np.ndarray:
    """The n eigenvalues of `G = X X^T`, descending, as squared singular values of `X`.

    Never negative; the last `n - min(n, d)` are exactly zero. No rank thresholding is applied.
    """
    A = as_matrix(X)
    n = A.shape[0]
    out = np.zeros(n)
    s = np.linalg.svd(A, compute_uv=False)
    out[: s.size] = s**2
    return out


def _ratio_sq(s1: float, sj: float) -> tuple[float, float]:
    """`(s1/sj)^2` and its log10, inf when `sj == 0`."""
    if sj <= 0:
        return math.inf, math.inf
    log10 = 2.0 * (math.log10(s1) - math.log10(sj))
    try:
        value = (s1 / sj) ** 2
    except OverflowError:
        value = math.inf
    return value, log10


def condition_numbers(X: np.ndarray, rtol: float | None = None) -> dict[str, Any]:
    """Condition numbers of `G = X X^T` from the singular values of `X`.

    Keys: n, d, rank, rtol, sigma_max, sigma_min (the min(n, d)-th singular value),
    kappa (`lambda_1 / lambda_n`, `math.inf` when `rank < n`), kappa_d (`lambda_1 / lambda_m`,
    m = min(n, d): the rank-min(n, d) truncation of v2's width bound; inf when `rank < m`),
    kappa_eff (`lambda_1 / lambda_rank`: the condition number restricted to the nonzero spectrum,
    inf only for X = 0), and `log10_` versions of the three (computed in log space).
    Raises `UserInputError` for empty or non-finite `X` or a bad `rtol`.
    """
    A = as_matrix(X)
    n, d = A.shape
    rtol = default_rtol(n, d) if rtol is None else positive_float(rtol, "rtol", allow_zero=True)
    s = np.linalg.svd(A, compute_uv=False)
    s1 = float(s[0])
    m = min(n, d)
    rank = int(np.count_nonzero(s > rtol * s1)) if s1 > 0 else 0
    out: dict[str, Any] = {
        "n": n,
        "d": d,
        "rank": rank,
        "rtol": rtol,
        "sigma_max": s1,
        "sigma_min": float(s[m - 1]),
    }
    for key, ok, j in (("kappa", rank >= n, n), ("kappa_d", rank >= m, m), ("kappa_eff", rank >= 1, rank)):
        value, log10 = _ratio_sq(s1, float(s[j - 1])) if ok and s1 > 0 else (math.inf, math.inf)
        out[key] = value
        out[f"log10_{key}"] = log10
    return out


def matrix_with_singular_values(n: int, d: int, s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random `X = U diag(s) V^T` (n x d) with Haar-orthonormal U, V and the given singular values.

    `len(s)` must be <= min(n, d); the matrix then has rank `len(s)` up to rounding. For tests
    and checks that need a prescribed condition number.
    """
    sv = np.asarray(s, dtype=np.float64).reshape(-1)
    if sv.size > min(n, d) or sv.size == 0:
        raise UserInputError(f"{sv.size} singular values do not fit a {n} x {d} matrix; pass 1..{min(n, d)}")
    U, _ = np.linalg.qr(rng.standard_normal((n, sv.size)))
    V, _ = np.linalg.qr(rng.standard_normal((d, sv.size)))
    return (U * sv) @ V.T


def kappa_of_gram(G: np.ndarray, rtol: float | None = None) -> float:
    """Condition number of a given symmetric PSD matrix `G` from `eigvalsh` (inf if singular).

    Less accurate than `condition_numbers(X)` (absolute eigenvalue error ~ `eps * ||G||`); use it
    only when `X` is not available, or to show how naive float64 fails.
    """
    M = as_matrix(G, "G")
    if M.shape[0] != M.shape[1]:
        raise UserInputError(f"G has shape {M.shape}; pass a square (n x n) Gram matrix")
    lam = np.linalg.eigvalsh((M + M.T) / 2)
    top = float(lam[-1])
    rtol = M.shape[0] * EPS if rtol is None else positive_float(rtol, "rtol", allow_zero=True)
    if top <= 0 or float(lam[0]) <= rtol * top:
        return math.inf
    return top / float(lam[0])


def log10_kappa_power(kappa: float, p: float) -> float:
    """`log10(kappa^p) = p * log10(kappa)` (Thm 4.7: `kappa(G^p) = kappa(G)^p`); inf stays inf."""
    kappa = positive_float(kappa, "kappa", allow_inf=True)
    p = positive_float(p, "p", allow_zero=True)
    if kappa < 1:
        raise UserInputError(f"kappa={kappa} is below 1; a condition number is >= 1")
    if math.isinf(kappa):
        return math.inf if p > 0 else 0.0
    return p * math.log10(kappa)


def kappa_power(kappa: float, p: float) -> float:
    """`kappa^p` as a float, `math.inf` when it overflows float64 (use the log10 form then)."""
    if log10_kappa_power(kappa, p) > 308:
        return math.inf
    try:
        return float(kappa) ** float(p)
    except OverflowError:
        return math.inf


def _auto_dps(X: np.ndarray, p: int) -> int:
    """Decimal digits to resolve `kappa(G^p)` with ~30 correct digits."""
    info = condition_numbers(X)
    log10k = info["log10_kappa"]
    if math.isinf(log10k):
        log10k = 2 * 17.0
    return int(math.ceil(p * log10k)) + 40


def exact_gram_eigenvalues(X: np.ndarray, p: int = 1, dps: int | None = None) -> list[mpmath.mpf]:
    """Eigenvalues of `G^p` (descending) with `G = X X^T` and `G^p` formed in mpmath at `dps` digits.

    The float64 entries of `X` are converted exactly; `G` is exact once `dps >= 40`.
    """
    A = as_matrix(X)
    p = int(p)
    if p < 1:
        raise UserInputError(f"p={p} is too small; pass an integer power p >= 1")
    dps = _auto_dps(A, p) if dps is None else max(int(dps), 40)
    with mpmath.workdps(dps):
        M = mpmath.matrix(A.tolist())
        G = M * M.T
        Gp = G**p
        Gp = (Gp + Gp.T) / 2
        lam = mpmath.eigsy(Gp, eigvals_only=True)
        return sorted((lam[i] for i in range(lam.rows)), reverse=True)


def kappa_power_exact(X: np.ndarray, p: int = 1, dps: int | None = None) -> mpmath.mpf:
    """`kappa(G^p)` with `G^p` formed explicitly in mpmath (the reference for Thm 4.7's identity).

    `dps` defaults to `ceil(p * log10 kappa(G)) + 40` digits. Returns `mpmath.inf` when `G` is
    singular in float64 terms (`rank < n`, see `condition_numbers`): its exact power is singular too.
    The value carries `dps` digits, but arithmetic on it rounds to mpmath's global precision (15
    digits by default): do further arithmetic inside `mpmath.workdps(dps)`.
    """
    A = as_matrix(X)
    if condition_numbers(A)["rank"] < A.shape[0]:
        return mpmath.inf
    dps = _auto_dps(A, int(p)) if dps is None else max(int(dps), 40)
    lam = exact_gram_eigenvalues(A, p, dps)
    with mpmath.workdps(dps):
        if lam[-1] <= 0:
            return mpmath.inf
        return lam[0] / lam[-1]


def kernel_spectrum(K: np.ndarray) -> dict[str, Any]:
    """Extreme eigenvalues and condition number of a symmetric PSD kernel matrix `K` (n x n).

    For kernels that are not Gram matrices of a known `X` (an NTK, Thm 4.2), so the eigenvalues come
    from `eigvalsh` (absolute error ~ `eps * ||K||`). Keys: n, lambda_max, lambda_min, kappa,
    log10_kappa, resolved. `resolved` is False when `lambda_min <= n * eps * lambda_max`: float64 then
    cannot tell `lambda_min` from zero, and kappa is reported as `math.inf`.
    """
    M = as_matrix(K, "K")
    n = M.shape[0]
    if n != M.shape[1]:
        raise UserInputError(f"K has shape {M.shape}; pass a square (n x n) kernel matrix")
    lam = np.linalg.eigvalsh((M + M.T) / 2)
    top, low = float(lam[-1]), float(lam[0])
    resolved = top > 0 and low > n * EPS * top
    kappa = top / low if resolved else math.inf
    return {"n": n, "lambda_max": top, "lambda_min": low, "kappa": kappa,
            "log10_kappa": math.log10(kappa) if resolved else math.inf, "resolved": resolved}
