"""Multiplicity and power (issue 40 item 6), each against an independent computation: Holm and Benjamini-Hochberg
against statsmodels, each interval's p-value against the interval itself (p < 0.05 exactly where the 95 % interval
excludes the point), the equivalence test's power against its two limits."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from empirics.intervals import fieller, t_interval
from verify.multiplicity import ALPHA, across_claims, cell, holm, interval_p, point_test, tost_power, within_claim


@pytest.mark.parametrize("seed", range(5))
def test_holm_and_bh_equal_statsmodels(seed: int):
    p = list(np.random.default_rng(seed).uniform(0, 0.2, size=7))
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-12)
    rows = [{"id": f"c{i}", "empirical": True, "verdict": "holds",
             "tests": [{"name": "t", "point": 0.0, "rejected": True, "p": pi}]} for i, pi in enumerate(p)]
    got = across_claims(rows)
    want = multipletests(p, method="fdr_bh")[1]
    assert [got[f"c{i}"]["bh_q"] for i in range(len(p))] == pytest.approx(list(want), abs=1e-12)
    assert all(got[f"c{i}"]["text"] == cell(got[f"c{i}"]) for i in range(len(p)))


@pytest.mark.parametrize("seed", range(20))
def test_an_intervals_p_rejects_exactly_where_it_excludes_the_point(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(rng.uniform(-1, 1), 1.0, size=8)
    den = rng.uniform(0.2, 0.4, size=8)
    num = den * rng.uniform(0.5, 2.0) + rng.normal(0, 0.05, size=8)
    for ci, point in ((t_interval(list(x)), 0.0), (fieller(list(num), list(den)), 1.0)):
        t = point_test("x", ci, point)
        assert t is not None and t["point"] == point
        if abs(t["p"] - ALPHA) > 1e-9:
            assert t["rejected"] == (t["p"] < ALPHA), (ci, t)
    assert np.isnan(interval_p({"lo": 0.1, "hi": 0.2}, 0.0))  # no per-seed values: no p, never invented


def test_holm_can_undo_a_verdict_that_rests_on_two_marginal_intervals():
    block = within_claim([{"name": "a", "point": 0.0, "rejected": True, "p": 0.03},
                          {"name": "b", "point": 0.0, "rejected": True, "p": 0.04}])
    assert block is not None and block["survives_holm"] is False and block["claim_p"] == pytest.approx(0.06)
    assert "does not survive" in cell(block)
    assert within_claim([]) is None and cell(None) == "-"


def test_rows_with_nothing_to_adjust_are_left_out():
    rows = [{"id": "a", "empirical": True, "verdict": "inconclusive",
             "tests": [{"name": "t", "point": 0.0, "rejected": False, "p": 0.4}]},
            {"id": "b", "empirical": False, "verdict": "holds", "tests": []}]
    assert across_claims(rows) == {}


def test_tost_power_at_its_limits():
    rng = np.random.default_rng(0)
    den = rng.normal(0.3, 0.01, 10)
    tight = den + rng.normal(0, 0.002, 10)
    loose = den + rng.normal(0, 0.3, 10)
    assert tost_power(tight, den, (0.8, 1.25), draws=200) > 0.95
    assert tost_power(loose, den, (0.8, 1.25), draws=200) < 0.3
    assert np.isnan(tost_power([0.3], [0.3], (0.8, 1.25)))


def test_vectorised_tost_power_equals_tost_ratio_draw_by_draw():
    """The power's vectorised test is `empirics.intervals.tost_ratio`, draw for draw (the same simulated runs)."""
    from empirics.intervals import tost_ratio

    rng = np.random.default_rng(4)
    den = rng.normal(0.3, 0.05, 8)
    num = den * 1.1 + rng.normal(0, 0.04, 8)
    cov = np.cov(np.vstack([num, den]))
    sims = np.random.default_rng(0).multivariate_normal([den.mean(), den.mean()], cov, size=(300, 8), method="svd")
    loop = np.mean([tost_ratio(s[:, 0], s[:, 1], 0.8, 1.25)["equivalent"] for s in sims])
    assert tost_power(num, den, (0.8, 1.25), draws=300) == pytest.approx(loop, abs=1e-12)


def test_the_t_p_value_is_scipys_one_sample_t_test():
    from scipy import stats

    x = list(np.random.default_rng(7).normal(0.3, 1.0, 9))
    assert interval_p(t_interval(x), 0.1) == pytest.approx(stats.ttest_1samp(x, 0.1).pvalue, rel=1e-12)


def test_the_spearman_test_holds_its_level_at_the_null_point():
    """`rank_test`'s Fisher-z p-value (the influence rows' deciding tests) is calibrated: 3,000 samples of 30 points
    whose population Spearman correlation is exactly 0.5 (bivariate normal, Pearson 2 sin(pi/12)) reject 0.5 at the 5 %
    level about 5 % of the time, and a true correlation of 0.8 is rejected far more often."""
    from scipy import stats as st

    from verify.multiplicity import rank_test

    rng = np.random.default_rng(0)

    def rejections(spearman: float) -> float:
        r = 2 * np.sin(np.pi * spearman / 6)
        cov = [[1.0, r], [r, 1.0]]
        hits = 0
        for _ in range(3000):
            x = rng.multivariate_normal([0, 0], cov, size=30)
            rho = float(st.spearmanr(x[:, 0], x[:, 1]).statistic)
            hits += rank_test("x", {"value": rho, "ci": [rho, rho]}, 30, 0.5)["p"] < 0.05
        return hits / 3000

    assert 0.03 < rejections(0.5) < 0.07
    assert rejections(0.8) > 0.5


def test_the_share_test_is_the_exact_binomial_test_and_reads_its_interval():
    from scipy import stats as st

    from empirics.intervals import wilson
    from verify.multiplicity import rank_test, share_test

    t = share_test("signs", 17, 20, 0.5, wilson(17 / 20, 20))
    assert t["rejected"] and t["p"] == pytest.approx(st.binomtest(17, 20, 0.5).pvalue)
    assert not share_test("signs", 10, 20, 0.5, wilson(0.5, 20))["rejected"]
    assert share_test("none", 0, 0, 0.5, (0.0, 1.0)) is None
    assert rank_test("few", {"value": 0.9, "ci": [0.5, 1.0]}, 4, 0.0) is None


def test_the_bottom_line_shows_the_number_the_verdict_rests_on():
    """The report's first table shows the first deciding test's estimate and interval (a slope, not the distances),
    and the first clause of "ours" for a rule without tests; a test keeps its interval's ends and estimate."""
    from reports.claims_report import bottom_line

    iv = t_interval([-0.12, -0.14, -0.10, -0.13])
    slope = point_test("function distance slope", iv, 0.0)
    assert slope["interval"] == [iv["lo"], iv["hi"]] and slope["estimate"] == pytest.approx(-0.1225)
    assert iv["hi"] < 0
    claims = [{"id": "a", "paper": "-", "ours": "m=16: 285, m=64: 207; more", "verdict": "holds", "label": "holds",
               "tests": [slope]},
              {"id": "b", "paper": "-", "ours": "exact; more", "verdict": "holds", "label": "holds", "tests": []}]
    rows = bottom_line({"claims": claims})
    assert rows[0]["ours"].startswith("function distance slope: -0.12") and "(vs 0)" in rows[0]["ours"]
    assert rows[1]["ours"] == "exact"
