"""Width bounds for entering the NTK regime (arXiv:2603.13085, Thm 4.7, v1 and v2).

v1: `m = Omega(kappa(G)^6 / eps^2)` for MLP-Attn against `Omega(1 / eps^2)` for 2L-ReLU.
v2: `m = Omega(kappa_d(G)^6 n log n)`, `kappa_d` the condition number of the rank-min(n, d)
truncation of G. These are the formulas with the hidden constant set to 1; values are computed in
log space (`log10_value` is finite for finite positive inputs even when `value` overflows to inf).
`log` in v2 is the natural logarithm (the paper does not say; a base change is a constant factor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ntkm.errors import UserInputError
from theory._validate import positive_float, positive_int


@dataclass(frozen=True)
class WidthBound:
    """One evaluated width bound: which formula, its inputs, its value and log10 value."""

    name: str
    formula: str
    inputs: dict[str, Any] = field(default_factory=dict)
    value: float = math.inf
    log10_value: float = math.inf


def _from_log10(log10: float) -> float:
    return math.inf if log10 > 308.25 else 10.0**log10


def _kappa(kappa: float, name: str) -> float:
    k = positive_float(kappa, name, allow_inf=True)
    if k < 1:
        raise UserInputError(f"{name}={k} is below 1; a condition number is >= 1")
    return k


def width_bound_v1(kappa: float, eps: float) -> WidthBound:
    """Thm 4.7 (v1): `m = kappa^6 / eps^2` (constant 1). `kappa >= 1` (inf allowed), `eps > 0`."""
    k = _kappa(kappa, "kappa")
    e = positive_float(eps, "eps")
    log10 = 6 * math.log10(k) - 2 * math.log10(e) if math.isfinite(k) else math.inf
    return WidthBound("v1", "m = kappa^6 / eps^2", {"kappa": k, "eps": e}, _from_log10(log10), log10)


def width_bound_v2(kappa_d: float, n: int) -> WidthBound:
    """Thm 4.7 (v2): `m = kappa_d^6 * n * ln(n)` (constant 1). `kappa_d >= 1` (inf allowed), `n >= 2`."""
    k = _kappa(kappa_d, "kappa_d")
    n = positive_int(n, "n", minimum=2)
    log10 = 6 * math.log10(k) + math.log10(n) + math.log10(math.log(n)) if math.isfinite(k) else math.inf
    return WidthBound("v2", "m = kappa_d^6 * n * ln(n)", {"kappa_d": k, "n": n}, _from_log10(log10), log10)


def relu_width_bound(eps: float) -> WidthBound:
    """Thm 4.7's comparison for 2L-ReLU: `m = 1 / eps^2` (constant 1), `eps > 0`."""
    e = positive_float(eps, "eps")
    log10 = -2 * math.log10(e)
    return WidthBound("relu", "m = 1 / eps^2", {"eps": e}, _from_log10(log10), log10)


def eps_for_width_v1(kappa: float, m: float) -> float:
    """The `eps` at which v1's bound equals `m`: `eps = kappa^3 / sqrt(m)` (log space)."""
    k = _kappa(kappa, "kappa")
    mm = positive_float(m, "m")
    if not math.isfinite(k):
        return math.inf
    return _from_log10(3 * math.log10(k) - 0.5 * math.log10(mm))
