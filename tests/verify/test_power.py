"""The retrain-based flip rule's power by simulation (issue 40 item 5), against the exact binomial computation, and
the design the simulation picks."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from empirics.intervals import wilson
from verify.power import GRID, P_ATTACK, P_BASELINE, TARGET, design_points, flip_power


def exact_power(points: int, pairs: int, p: float = P_ATTACK, b: float = P_BASELINE) -> float:
    """Sum over attack counts x of P(x) times P(all three baselines below the Wilson lower end at x), the baselines
    independent binomials: P(R / n < L) = binom.cdf(ceil(L n) - 1, n, b)."""
    total = 0.0
    for x in range(points + 1):
        low = wilson(x / points, points)[0]
        below = [stats.binom.cdf(math.ceil(low * n - 1e-12) - 1, n, b) for n in (points, pairs, points)]
        total += stats.binom.pmf(x, points, p) * below[0] * below[1] * below[2]
    return total


@pytest.mark.parametrize("points, pairs", [(10, 30), (30, 90), (50, 2250), (80, 3600)])
def test_simulated_power_equals_the_exact_binomial_sum(points: int, pairs: int):
    assert flip_power(points, seed_pairs=pairs) == pytest.approx(exact_power(points, pairs), abs=0.012)


def test_the_design_is_the_smallest_grid_size_that_reaches_the_target():
    k = design_points(retrain_seeds=10)
    assert k is not None and exact_power(k, k * 45) >= TARGET - 0.01
    before = GRID[GRID.index(k) - 1]
    assert exact_power(before, before * 45) < TARGET
    # quick's retrain row (10 points, 3 seeds) cannot reach 'holds' at this effect except by luck
    assert flip_power(10, seed_pairs=30) < 0.25
