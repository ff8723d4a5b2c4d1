"""Seed-level intervals and tests: the one home of every interval method the claims' rules use.

Seeds are the unit of replication (each its own data subset and initialisations), so every interval is
computed from one value per seed, and every interval record keeps those values (`per_seed`) so that it
can be recomputed from claims.json:

- `t_interval`: Student-t interval of the mean over seeds (of a paired per-seed difference where two
  things are compared). Exact for normal seed values; `benchmarks.coverage` measures it at the quick
  preset's sizes on flip rates (binomial within a seed, beta between seeds) and slopes.
- `fieller`: Fieller's interval for a ratio of two seed means from paired per-seed values (exact for
  bivariate normal seed values). Where the denominator is not significantly different from 0 the exact
  confidence set is unbounded; it is reported as the whole line (-inf, inf).
- `tost_ratio`: two one-sided tests that the ratio of two seed means lies inside a margin [lo, hi] (equivalence); by
  linearisation, ratio > lo is `mean(num - lo * den) > 0`, each tested at `ALPHA_TOST` with a skewness-corrected t
  (Hall's 1992 monotone form of Johnson's 1978 statistic; n - 1 degrees of freedom). The plain t test is
  conservative there: per-seed flip rates near 0 with a large between-seed spread are skewed, and the skew of
  `num-lo*den` points away from the rejection region (`benchmarks.coverage` measured 1 - size 0.97 at a between-seed
  sd of 0.15; the corrected test 0.950-0.956, docs/DEVIATIONS.md D20). The corrected statistic equals the plain t
  where the per-seed values have no sample skew. Its reported interval is Fieller's at 1 - 2 * ALPHA_TOST (90 %),
  the plain tests'; the decision is the corrected tests', so the two can differ at the edge of the margin. Each
  one-sided test has size ALPHA_TOST on its margin; the pair (an intersection-union test) rejects less often than
  that where the other one-sided test lacks power, i.e. where the interval is about as wide as the margin:
  conservative by construction, not a loss of coverage (`benchmarks.coverage` measures both).

Nothing here resamples: with 10 seeds a percentile bootstrap under-covers, and with 3 it is close to the
range of the per-seed values (coverage 0.75).

Beside them, `spearman` is the one Spearman rank correlation of two score vectors that the experiments and the
audit report (NaN where it is undefined, instead of scipy's warning).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

LEVEL = 0.95
#: Size of each one-sided test of `tost_ratio` (equivalence at 1 - 2 * ALPHA_TOST confidence).
ALPHA_TOST = 0.05

T_METHOD = "Student-t interval over seeds (of the paired per-seed difference where two things are compared)"
FIELLER_METHOD = ("Fieller's interval for a ratio of seed means from paired per-seed values (unbounded, reported as "
                  "(-inf, inf), where the denominator's mean is not significantly different from 0)")
TOST_METHOD = (f"two one-sided tests over seeds (each at {ALPHA_TOST:g}, Hall-Johnson skewness-corrected t) that "
               "the ratio of seed means lies inside the margin, by linearisation: mean(num - lo * den) > 0 and "
               "mean(num - hi * den) < 0")


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([x for x in values if x is not None and math.isfinite(x)], float)


def _tq(n: int, level: float) -> float:
    return float(stats.t.ppf((1 + level) / 2, n - 1))


def t_interval(values: Sequence[float | None], level: float = LEVEL) -> dict[str, Any]:
    """`{"value", "lo", "hi", "method": "t", "n", "per_seed"}`: mean +- t * sd / sqrt(n) over the finite values
    (unbounded with fewer than two)."""
    v = _finite(values)
    per_seed = [None if x is None else float(x) for x in values]
    if v.size == 0:
        return {"value": float("nan"), "lo": float("-inf"), "hi": float("inf"), "method": "t", "n": 0,
                "per_seed": per_seed}
    m = float(v.mean())
    if v.size == 1:
        return {"value": m, "lo": float("-inf"), "hi": float("inf"), "method": "t", "n": 1, "per_seed": per_seed}
    half = _tq(v.size, level) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return {"value": m, "lo": m - half, "hi": m + half, "method": "t", "n": int(v.size), "per_seed": per_seed}


def difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """`t_interval` of the paired per-seed difference a - b."""
    return t_interval([x - y for x, y in zip(a, b, strict=True)], level)


def fieller(num: Sequence[float], den: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """Fieller's interval of mean(num) / mean(den) from paired per-seed values.

    Solves `(a - r b)^2 <= t^2 (s_aa - 2 r s_ab + r^2 s_bb)` for r (a, b the seed means, s their estimated
    (co)variances of the mean, t the Student quantile with n - 1 degrees of freedom). Bounded when
    `b^2 > t^2 s_bb`; otherwise the set is unbounded and reported as its hull (-inf, inf) (`bounded`: False),
    with `excluded` = (r1, r2) where the exact set is the two rays outside (r1, r2).
    """
    x, y = np.asarray(num, float), np.asarray(den, float)
    if x.shape != y.shape:
        raise ValueError("fieller needs paired per-seed values (equal lengths)")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = int(x.size)
    out: dict[str, Any] = {"method": "fieller", "n": n, "per_seed_num": [float(v) for v in num],
                           "per_seed_den": [float(v) for v in den]}
    if n == 0:
        return {**out, "value": float("nan"), "lo": float("-inf"), "hi": float("inf"), "bounded": False}
    a, b = float(x.mean()), float(y.mean())
    value = a / b if b != 0 else (math.copysign(math.inf, a) if a != 0 else math.nan)
    if n < 2:
        return {**out, "value": value, "lo": float("-inf"), "hi": float("inf"), "bounded": False}
    cov = np.cov(x, y, ddof=1) / n
    t2 = _tq(n, level) ** 2
    qa, qb, qc = b * b - t2 * cov[1, 1], a * b - t2 * cov[0, 1], a * a - t2 * cov[0, 0]
    disc = qb * qb - qa * qc
    if qa <= 0:
        gap = sorted(((qb - math.sqrt(disc)) / qa, (qb + math.sqrt(disc)) / qa)) if qa < 0 and disc > 0 else None
        return {**out, "value": value, "lo": float("-inf"), "hi": float("inf"), "bounded": False, "excluded": gap}
    root = math.sqrt(max(disc, 0.0))
    return {**out, "value": value, "lo": (qb - root) / qa, "hi": (qb + root) / qa, "bounded": True}


def _one_sided_p(d: np.ndarray, greater: bool) -> float:
    """p value of the skewness-corrected one-sided t test that mean(d) > 0 (`greater`) or < 0. The statistic is
    Hall's (1992) monotone form of Johnson's (1978) skewness-corrected t: t + a t^2 + a^2 t^3 / 3 + g / (6 sqrt(n))
    with g = k3 / s^3 (k3 the unbiased third cumulant) and a = g / (3 sqrt(n)); Johnson's own t + g (1 + 2 t^2) /
    (6 sqrt(n)) is not monotone in t and turns a clear rejection into none at large |t|. With n = 2 the plain t."""
    if d.size < 2:
        return 1.0
    m = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0:
        return 0.0 if (m > 0 if greater else m < 0) else 1.0
    n = d.size
    tstat = m / (sd / math.sqrt(n))
    if n >= 3:
        g = n / ((n - 1) * (n - 2)) * float(((d - m) ** 3).sum()) / sd ** 3
        a = g / (3 * math.sqrt(n))
        tstat = tstat + a * tstat ** 2 + a * a * tstat ** 3 / 3 + g / (6 * math.sqrt(n))
    return float(stats.t.sf(tstat, n - 1) if greater else stats.t.cdf(tstat, n - 1))


def tost_ratio(num: Sequence[float], den: Sequence[float], lo: float, hi: float,
               alpha: float = ALPHA_TOST) -> dict[str, Any]:
    """Equivalence test that mean(num) / mean(den) lies inside [lo, hi] (den > 0): `equivalent` when both
    one-sided tests (skewness-corrected t) reject at `alpha`; `p` is the larger of their p values;
    `ci` is Fieller's interval at `ci_level` = 1 - 2 alpha, the plain t tests' (inside the margin exactly when
    those declare equivalence; the correction can move the decision at the edge)."""
    x, y = np.asarray(num, float), np.asarray(den, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    base = {"margin": [lo, hi], "alpha": alpha, "method": "tost-hall-johnson", "n": int(x.size),
            "ci_level": 1 - 2 * alpha}
    if x.size < 2:
        return {"equivalent": False, "p": 1.0, "p_lower": 1.0, "p_upper": 1.0, **base,
                "ci": [float("-inf"), float("inf")]}
    p_lo = _one_sided_p(x - lo * y, True)
    p_hi = _one_sided_p(x - hi * y, False)
    p = max(p_lo, p_hi)
    ci = fieller(x, y, 1 - 2 * alpha)
    return {"equivalent": bool(p < alpha), "p": p, "p_lower": p_lo, "p_upper": p_hi, **base, "ci": [ci["lo"], ci["hi"]]}


def loglog_slope(widths: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(width) over the finite positive values (NaN with < 2)."""
    w, v = np.log(np.asarray(widths, float)), np.asarray(values, float)
    ok = np.isfinite(v) & (v > 0)
    return float(np.polyfit(w[ok], np.log(v[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of `a` and `b` (same length); NaN with fewer than two points or where either is
    constant (undefined there; scipy would warn and return NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def wilson(p: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion p observed on n trials, inside [0, 1] (unlike p +- z sqrt(p(1-p)/n),
    which runs below 0 or above 1 for few trials or p near 0 or 1); (-inf, inf) when n <= 0 or p is not finite."""
    if n <= 0 or not math.isfinite(p):
        return (-math.inf, math.inf)
    z = float(stats.norm.ppf((1 + level) / 2))
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))  # p inside despite rounding
