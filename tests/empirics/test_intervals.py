"""The seed-level interval methods of `empirics.intervals`, checked against independent computations (their
coverage: tests/benchmarks/test_coverage.py)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from empirics.intervals import difference, fieller, loglog_slope, spearman, t_interval, tost_ratio


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


def _plain_p(num: np.ndarray, den: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    return (stats.ttest_1samp(num - lo * den, 0, alternative="greater").pvalue,
            stats.ttest_1samp(num - hi * den, 0, alternative="less").pvalue)


def test_tost_interval_is_the_90_percent_fieller_interval_of_the_plain_tests():
    """The plain linearised t tests (scipy) at 0.05 per side declare equivalence <=> the reported 90 % Fieller
    interval lies inside the margin; the corrected decision differs in a few cases (4 % of 2,000 such draws), and
    only where its p value is near 0.05."""
    rng = np.random.default_rng(5)
    differ = 0
    for _ in range(200):
        num = 0.3 + rng.normal(0, rng.uniform(0.01, 0.1), 10)
        den = 0.3 + rng.normal(0, 0.05, 10)
        ci = fieller(num, den, level=0.90)
        inside = ci["bounded"] and ci["lo"] > 0.67 and ci["hi"] < 1.5
        assert (max(_plain_p(num, den, 0.67, 1.5)) < 0.05) == inside
        tost = tost_ratio(num, den, 0.67, 1.5)
        assert tost["ci"] == [ci["lo"], ci["hi"]] and tost["ci_level"] == 0.90
        if tost["equivalent"] != inside:
            differ += 1
            assert 0.01 < tost["p"] < 0.25, tost["p"]
    assert differ <= 20


def test_tost_one_sided_p_values_are_scipys_t_tests_where_the_seeds_have_no_skew():
    """The corrected statistic is the plain t (df n - 1, scipy's one-sample test) for per-seed values with no sample
    skew: pairs mirrored about their mean make every linear combination num - c * den symmetric."""
    rng = np.random.default_rng(6)
    for n in (4, 10, 24):
        half_n, half_d = 0.08 * rng.standard_normal(n // 2), 0.05 * rng.standard_normal(n // 2)
        num, den = 0.3 + np.r_[half_n, -half_n], 0.25 + np.r_[half_d, -half_d]
        tost = tost_ratio(num, den, 0.67, 1.5)
        p_lo, p_hi = _plain_p(num, den, 0.67, 1.5)
        assert tost["p_lower"] == pytest.approx(p_lo) and tost["p_upper"] == pytest.approx(p_hi)
        assert tost["p"] == max(tost["p_lower"], tost["p_upper"]) and tost["method"] == "tost-hall-johnson"


def test_tost_skew_correction_points_the_right_way():
    """Right-skewed values of num - lo * den (a J-shaped flip rate): the plain t under-rejects 'mean > 0', so
    Johnson's p value is the smaller; mirrored values (left skew) the larger."""
    d = np.array([0.0, 0.0, 0.01, 0.01, 0.02, 0.02, 0.03, 0.05, 0.2, 0.35])
    den = np.full(d.size, 0.2)
    right = tost_ratio(d + 0.67 * den, den, 0.67, 1.5)
    left = tost_ratio(-d + 0.67 * den + 2 * d.mean(), den, 0.67, 1.5)
    plain = _plain_p(d + 0.67 * den, den, 0.67, 1.5)[0]
    assert right["p_lower"] < plain < left["p_lower"]


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


def test_spearman_agrees_with_scipy_and_is_nan_where_undefined():
    """The one Spearman helper (malleability, the audit): scipy's rho on ordinary data (ties included), NaN without
    a warning for a constant input or fewer than two points."""
    rng = np.random.default_rng(5)
    for _ in range(5):
        a, b = rng.standard_normal(40), rng.standard_normal(40)
        b[:10] = a[:10] * 3  # some agreement
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    ties = np.array([1.0, 1.0, 2.0, 3.0, 3.0])
    assert spearman(ties, np.arange(5.0)) == pytest.approx(stats.spearmanr(ties, np.arange(5.0)).statistic)
    assert spearman(np.arange(6.0), -np.arange(6.0)) == pytest.approx(-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(spearman(np.ones(5), np.arange(5.0)))
        assert math.isnan(spearman(np.arange(5.0), np.full(5, 2.0)))
        assert math.isnan(spearman(np.array([1.0]), np.array([2.0])))
