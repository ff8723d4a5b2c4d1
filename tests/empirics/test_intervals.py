"""The seed-level interval methods of `empirics.intervals`, checked against independent computations (their
coverage: tests/benchmarks/test_coverage.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from empirics.intervals import difference, fieller, loglog_slope, t_interval, tost_ratio


def test_t_interval_by_hand_and_per_seed_values_kept():
    ci = t_interval([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert ci["value"] == 2.0 and ci["lo"] == pytest.approx(2 - half) and ci["hi"] == pytest.approx(2 + half)
    assert ci["per_seed"] == [1.0, 2.0, 3.0] and ci["n"] == 3
    one = t_interval([0.5])
    assert one["lo"] == -math.inf and one["hi"] == math.inf
    assert difference([3.0, 5.0], [1.0, 2.0])["per_seed"] == [2.0, 3.0]


def test_fieller_bounds_are_where_the_linearised_t_statistic_hits_the_quantile():
    """At each bound r, the t statistic of the per-seed values num - r den equals the Student quantile: the
    definition of Fieller's interval, computed here without the quadratic."""
    rng = np.random.default_rng(4)
    num, den = 0.4 + 0.05 * rng.standard_normal(10), 0.1 + 0.02 * rng.standard_normal(10)
    ci = fieller(num, den)
    assert ci["bounded"] and ci["lo"] < ci["value"] < ci["hi"]
    q = stats.t.ppf(0.975, 9)
    for r in (ci["lo"], ci["hi"]):
        d = num - r * den
        assert abs(d.mean() / (d.std(ddof=1) / math.sqrt(10))) == pytest.approx(q, rel=1e-9)


def test_fieller_is_unbounded_when_the_denominator_may_be_zero_and_a_point_without_variance():
    ci = fieller([0.3, 0.5, 0.4, 0.6], [0.1, -0.1, 0.05, -0.02])
    assert not ci["bounded"] and ci["lo"] == -math.inf and ci["hi"] == math.inf
    point = fieller([0.4] * 5, [0.1] * 5)
    assert point["lo"] == pytest.approx(4.0) and point["hi"] == pytest.approx(4.0)


def test_tost_agrees_with_the_90_percent_fieller_interval():
    """Equivalence at 0.05 per side <=> the 90 % Fieller interval lies inside the margin (same linearisation)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        num = 0.3 + rng.normal(0, rng.uniform(0.01, 0.1), 10)
        den = 0.3 + rng.normal(0, 0.05, 10)
        ci = fieller(num, den, level=0.90)
        inside = ci["bounded"] and ci["lo"] > 0.67 and ci["hi"] < 1.5
        tost = tost_ratio(num, den, 0.67, 1.5)
        assert tost["equivalent"] == inside and tost["ci"] == [ci["lo"], ci["hi"]] and tost["ci_level"] == 0.90


def test_tost_one_sided_p_values_are_scipys_t_tests_with_n_minus_1_df():
    """Each side is scipy's one-sample t test of the linearised per-seed values (df n - 1, not a normal quantile)."""
    rng = np.random.default_rng(6)
    for n in (3, 10, 25):
        num, den = 0.3 + 0.08 * rng.standard_normal(n), 0.25 + 0.05 * rng.standard_normal(n)
        tost = tost_ratio(num, den, 0.67, 1.5)
        assert tost["p_lower"] == pytest.approx(stats.ttest_1samp(num - 0.67 * den, 0, alternative="greater").pvalue)
        assert tost["p_upper"] == pytest.approx(stats.ttest_1samp(num - 1.5 * den, 0, alternative="less").pvalue)
        assert tost["p"] == max(tost["p_lower"], tost["p_upper"])


def test_tost_size_on_the_margin_by_brute_force():
    """With normal seed values and the truth on the upper margin, the upper test rejects alpha of the time; the
    TOST as a whole, which also needs the lower test to reject, at most that (20,000 draws, MC sd 0.0015)."""
    rng = np.random.default_rng(8)
    den = 0.2 + 0.03 * rng.standard_normal((20_000, 10))
    num = 1.5 * 0.2 + 0.04 * rng.standard_normal((20_000, 10))
    recs = [tost_ratio(a, b, 0.67, 1.5) for a, b in zip(num, den, strict=True)]
    upper = np.mean([r["p_upper"] < 0.05 for r in recs])
    both = np.mean([r["equivalent"] for r in recs])
    assert abs(upper - 0.05) < 0.005 and both <= upper


def test_loglog_slope_of_a_power_law():
    assert loglog_slope([16, 64, 256], [2 * w ** -0.5 for w in (16, 64, 256)]) == pytest.approx(-0.5)
    assert math.isnan(loglog_slope([16, 64], [1.0, -1.0]))
