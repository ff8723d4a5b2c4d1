"""Numeric tolerances shared by the tests, named by what they allow for.

Import them in a test module with `from tolerances import F64_ROUNDING` (pytest puts `tests/` on the path
through `tests/conftest.py`). Pick the constant whose comment describes the error you are allowing for,
not the one whose size happens to make a test pass; a tolerance specific to one test stays inline with
its reason written next to it. Never loosen a constant to fix one test: give that test its own explained
literal instead. float64 machine epsilon is 2.2e-16, float32's 1.2e-7.
"""

from __future__ import annotations

# --- float64: the same quantity by the same arithmetic -----------------------------------------------------

# A value that is zero in exact arithmetic, computed from O(1) inputs: a few ulps of 1.
F64_ZERO = 1e-15
# A short chain of float64 operations against an exact (sympy/mpmath) value: tens of ulps.
F64_ULPS = 1e-14
# The same formula in another order (chunked, cached, symmetric vs cross path, another library's version of
# the same closed form) on O(1) values: sums of up to ~1e4 terms stay within ~1e-12.
F64_ROUNDING = 1e-12

# --- float64: one quantity by two different algorithms ---------------------------------------------------

# Two algorithms on well-conditioned inputs (closed-form vs torch.func Jacobians, Lanczos vs eigvalsh,
# Hessian-vector product vs the explicit Hessian, an SVD truncation at full rank vs none): different
# operation order and cancellation, two digits of margin over F64_ROUNDING.
F64_ALGORITHM = 1e-10
# Normalised attention features (unit rows of X (X^T X)^k) by two routes (shifted or rescaled data, the
# model's torch path vs numpy): the k Gram factors are multiplied before the rows are normalised, so digits
# are lost first; absolute on unit rows.
F64_FEATURES = 1e-9
# Through a linear solve, a refit or an eigen/singular value decomposition of a kernel (leave-one-out and
# Gauss-Newton influence against refitting or explicit Jacobians): the error grows like kappa(K) * eps.
F64_SOLVE = 1e-8
# A condition number (relative) or its log10 (absolute) against an independent computation (eigvalsh vs SVD,
# LAPACK vs mpmath at 50+ digits): the smallest eigenvalue is known only to about kappa * eps, kappa up to
# ~1e8 on these inputs.
F64_KAPPA = 1e-6
# A formula's log10 value against the formula written out, or a value against 10**log10: log10 values up
# to ~300 carry an absolute error of ~300 * eps, and 10** turns it into ln(10) times that relative.
F64_LOG10 = 1e-9

# --- float64: kernels built on an angle (arc-cosine kernels, Thm 4.2) -----------------------------------

# The angle from arccos of a cosine near 0 or pi is known only to about sqrt(eps) = 1.5e-8: absolute.
ANGLE_ABS = 1e-8
# Kernel values of O(1) or scaled copies built on that angle: relative (or absolute for O(1) values).
ANGLE = 1e-7

# --- float32 ---------------------------------------------------------------------------------------------

# float32 values of O(1) through two code paths (a saved, loaded or scripted copy, an input reshaped or
# clamped to an eps-ball): a few float32 roundings.
F32_ROUNDING = 1e-6
# float32 sums in another order (a blocked kernel, x^T x formed by another kernel), relative.
F32_REORDER = 1e-5
# A float32 result accumulated over thousands of terms or many training steps against a reference by
# another route (float64, or another graph): float32 keeps ~7 digits and loses some in the accumulation.
F32_ACCUMULATED = 1e-4

# --- iterative methods -----------------------------------------------------------------------------------

# Power iteration's top eigenvalue (relative) and Lanczos' reported residual: convergence depends on the
# spectral gap, not on rounding.
ITERATIVE = 1e-6

# --- Monte Carlo -----------------------------------------------------------------------------------------

# A bootstrap standard deviation from 4000 replicates against its formula: the estimate's own relative
# standard error is about 1/sqrt(2 * 4000) = 1.1%, so 6% is over five standard errors.
MC_SD_REL = 0.06
# Percentile-interval endpoints against mean +- 1.96 sd on proportions: the normal approximation's error
# plus Monte Carlo noise, absolute on a rate in [0, 1].
MC_CI_ABS = 0.02
