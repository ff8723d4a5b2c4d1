"""Input checks shared by the `theory` modules: bad input raises `UserInputError`, one line."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ntkm.errors import UserInputError


def as_matrix(X: object, name: str = "X") -> np.ndarray:
    """`X` as a finite, non-empty, 2-D float64 array (a copy only when a conversion is needed)."""
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UserInputError(f"{name} is not a numeric array ({exc}); pass a 2-D array of numbers") from None
    if A.ndim != 2:
        raise UserInputError(f"{name} has {A.ndim} dimensions; pass a 2-D array (rows are data points)")
    if A.size == 0:
        raise UserInputError(f"{name} is empty (shape {A.shape}); pass at least one row and one column")
    if not np.all(np.isfinite(A)):
        raise UserInputError(f"{name} contains NaN or inf; remove or impute those entries first")
    return A


def as_targets(Y: object, n: int, name: str = "Y") -> np.ndarray:
    """`Y` as a finite float64 array with `n` rows, shape (n,) or (n, c)."""
    try:
        A = np.asarray(Y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UserInputError(f"{name} is not a numeric array ({exc}); pass shape (n,) or (n, c)") from None
    if A.ndim not in (1, 2) or A.shape[0] != n:
        raise UserInputError(f"{name} has shape {A.shape} but the kernel has {n} rows; pass shape ({n},) or ({n}, c)")
    if not np.all(np.isfinite(A)):
        raise UserInputError(f"{name} contains NaN or inf; remove those entries first")
    return A


def positive_int(value: object, name: str, minimum: int = 1) -> int:
    """`value` as an int >= `minimum` (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserInputError(f"{name}={value!r} is not an integer; pass an integer >= {minimum}")
    if int(value) < minimum:
        raise UserInputError(f"{name}={value} is too small; pass an integer >= {minimum}")
    return int(value)


def positive_float(value: object, name: str, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """`value` as a float > 0 (or >= 0 with `allow_zero`); inf only with `allow_inf`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserInputError(f"{name}={value!r} is not a real number; pass a positive number")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise UserInputError(f"{name}={v} is not finite; pass a finite positive number")
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise UserInputError(f"{name}={v} is out of range; pass a number {bound}")
    return v
