"""Hypothesis strategies for the theory tests: data matrices of every awkward kind.

A drawn matrix is generated from a drawn seed (fast, shrinkable through the kind and shape) and
is one of: gaussian, pixels (uniform [0, 1] with always-zero columns, as MNIST), scaled columns
(column scales over 8 decades), near-duplicate rows, rank-deficient (n > d), low rank, or
prescribed condition number (n <= d, kappa(G) up to 1e12).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from theory.conditioning import EPS, matrix_with_singular_values

KINDS = (
    "gaussian",
    "pixels",
    "scaled_columns",
    "near_duplicate",
    "rank_deficient",
    "low_rank",
    "conditioned",
)


def make_matrix(kind: str, n: int, d: int, seed: int, log10_kappa: float = 6.0) -> np.ndarray:
    """One n x d matrix of the given kind (shapes are adjusted where a kind needs it)."""
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.standard_normal((n, d))
    if kind == "pixels":
        X = rng.uniform(0.0, 1.0, (n, d))
        X[:, rng.random(d) < 0.3] = 0.0
        if not X.any():
            X[0, 0] = 1.0
        return X
    if kind == "scaled_columns":
        return rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-4, 4, d)
    if kind == "near_duplicate":
        base = rng.standard_normal(d)
        return base + 10.0 ** rng.uniform(-7, -3) * rng.standard_normal((n, d))
    if kind == "rank_deficient":
        return rng.standard_normal((d + 1 + n, d))
    if kind == "low_rank":
        r = max(1, min(n, d) - 1)
        return rng.standard_normal((n, r)) @ rng.standard_normal((r, d))
    if kind == "conditioned":
        n, d = min(n, d), max(n, d)
        s = np.logspace(0, -0.5 * log10_kappa, n) if n > 1 else np.ones(1)
        return matrix_with_singular_values(n, d, s, rng) * 10.0 ** rng.uniform(-3, 3)
    raise ValueError(kind)


@st.composite
def matrices(draw: st.DrawFn, max_n: int = 7, max_d: int = 7, kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """A data matrix of a drawn kind and shape (see the module docstring)."""
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    seed = draw(st.integers(0, 2**32 - 1))
    log10_kappa = draw(st.floats(0.0, 12.0))
    return make_matrix(kind, n, d, seed, log10_kappa)


@st.composite
def full_rank_wide(draw: st.DrawFn, max_n: int = 6, max_log10_kappa: float = 12.0) -> np.ndarray:
    """n <= d with prescribed kappa(G) in [1, 10^max_log10_kappa]: G is nonsingular."""
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(n, n + 4))
    seed = draw(st.integers(0, 2**32 - 1))
    log10_kappa = draw(st.floats(0.0, max_log10_kappa))
    return make_matrix("conditioned", n, d, seed, log10_kappa)


def normwise_tol(X: np.ndarray, power: int = 3, const: float = 20.0) -> float:
    """Rounding budget of a product of `power` Gram factors: `const * (n + d) * eps * ||X||_F^(2 power)`."""
    n, d = X.shape
    return const * power * (n + d) * EPS * float(np.linalg.norm(X)) ** (2 * power)
