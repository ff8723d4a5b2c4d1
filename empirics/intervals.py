"""Interval helpers shared by the suite: the Wilson score interval of a proportion (`wilson`)."""

from __future__ import annotations

import math

from scipy import stats

LEVEL = 0.95


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
