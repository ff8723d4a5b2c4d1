"""Exact symbolic statements of the paper's algebraic claims (sympy), used by checks and tests.

Two kinds of proof: entrywise identities on small explicit symbolic matrices (every entry a free
symbol), and word identities on `MatrixSymbol`s of symbolic size n x d, which prove a claim for all
sizes because they only use associativity and `(AB)^T = B^T A^T`.
"""

from __future__ import annotations

import sympy as sp

from theory.gram import StackMode, stacked_kernel_power


def symbolic_matrix(name: str, n: int, d: int) -> sp.Matrix:
    """An n x d matrix whose entries are independent real symbols `name_i_j`."""
    return sp.Matrix(n, d, lambda i, j: sp.Symbol(f"{name}_{i}_{j}", real=True))


def thm41_residual(n: int, d: int) -> sp.Matrix:
    """`(G X)(G X)^T - G^3` for a symbolic n x d `X`, expanded (Thm 4.1: the zero matrix)."""
    X = symbolic_matrix("x", n, d)
    G = X * X.T
    return ((G * X) * (G * X).T - G**3).applyfunc(sp.expand)


def thm41_sum_residual(n: int, d: int) -> sp.Matrix:
    """`K_ij - sum_{k,l} (x_i.x_k)(x_k.x_l)(x_l.x_j)` with `K = (GX)(GX)^T`, expanded (Thm 4.1)."""
    X = symbolic_matrix("x", n, d)
    G = X * X.T
    K = (G * X) * (G * X).T
    rows = [X.row(i) for i in range(n)]

    def dot(a: int, b: int) -> sp.Expr:
        return (rows[a] * rows[b].T)[0, 0]

    S = sp.Matrix(n, n, lambda i, j: sum(dot(i, k) * dot(k, l) * dot(l, j) for k in range(n) for l in range(n)))
    return (K - S).applyfunc(sp.expand)


def _word(expr: sp.MatrixExpr) -> tuple[sp.Basic, ...]:
    e = expr.doit()
    return tuple(e.args) if isinstance(e, sp.MatMul) else (e,)


def stacked_kernel_is_gram_power(k: int, mode: StackMode = "fixed") -> bool:
    """True iff the kernel of k stacked layers is the word `(X X^T)^p`, p = 2k+1 or 3^k, for any n, d."""
    n, d = sp.symbols("n d", integer=True, positive=True)
    X = sp.MatrixSymbol("X", n, d)
    G = X * X.T
    Y: sp.MatrixExpr = X
    for _ in range(k):
        Y = G * Y if mode == "fixed" else Y * Y.T * Y
    p = stacked_kernel_power(k, mode)
    return _word(Y * Y.T) == _word(sp.MatMul(*([X, X.T] * p)))


def loo_residual(n: int) -> sp.Matrix:
    """Closed-form LOO minus refit for symbolic K (n x n, symmetric), ridge, Y, test row k(x).

    Entry i is `f(x) - (k^T M[:, i]) alpha_i / M_ii - f_-i(x)` simplified (krr.py: zero).
    """
    lam = sp.Symbol("lambda", positive=True)
    K = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"K_{min(i, j)}_{max(i, j)}", real=True))
    Y = sp.Matrix(n, 1, lambda i, _: sp.Symbol(f"y_{i}", real=True))
    kx = sp.Matrix(1, n, lambda _, j: sp.Symbol(f"k_{j}", real=True))
    A = K + lam * sp.eye(n)
    M = A.inv()
    alpha = M * Y
    f = (kx * alpha)[0, 0]
    out = []
    for i in range(n):
        keep = [j for j in range(n) if j != i]
        refit = (kx.extract([0], keep) * A.extract(keep, keep).inv() * Y.extract(keep, [0]))[0, 0]
        closed = f - (kx * M[:, i])[0, 0] * alpha[i] / M[i, i]
        out.append(sp.simplify(sp.together(closed - refit)))
    return sp.Matrix(out)
