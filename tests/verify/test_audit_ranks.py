"""The validity panel's fast bootstrap (`verify.audit.ranks`) against ranking every resampled matrix anew with scipy's
`rankdata`: the same ranks, the same Spearman correlations, the same LDS and agreement draws, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from verify.audit.lds import _draws_fast, _draws_generic, score_estimators
from verify.audit.ranks import ranked, weighted_nanmean, weighted_ranks, weighted_spearman


def _expanded_spearman(a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Spearman per column of the resampled rows, by rankdata of the expanded matrices."""
    ra, rb = stats.rankdata(a[rows], axis=0), stats.rankdata(b[rows], axis=0)
    return np.array([stats.pearsonr(ra[:, c], rb[:, c]).statistic if ra[:, c].std() and rb[:, c].std() else np.nan
                     for c in range(a.shape[1])])


@pytest.mark.parametrize("ties", [False, True])
def test_weighted_ranks_are_the_ranks_of_the_expanded_resample(ties):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(17, 5))
    if ties:
        a = np.round(a)
    rows = rng.integers(0, 17, 17)
    w = np.bincount(rows, minlength=17).astype(float)
    r = weighted_ranks(ranked(a), w)
    np.testing.assert_allclose(r[rows], stats.rankdata(a[rows], axis=0), atol=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_weighted_spearman_is_the_spearman_of_the_expanded_resample(ties):
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(23, 6)), rng.normal(size=(23, 6))
    a[:, 0] = 1.0  # a constant column: NaN both ways
    if ties:
        a, b = np.round(a), np.round(2 * b)
    rows = rng.integers(0, 23, 23)
    w = np.bincount(rows, minlength=23).astype(float)
    got = weighted_spearman(weighted_ranks(ranked(a), w), weighted_ranks(ranked(b), w), w)
    np.testing.assert_allclose(got, _expanded_spearman(a, b, rows), atol=1e-12, equal_nan=True)


def test_weighted_nanmean_counts_a_column_as_often_as_it_was_drawn():
    vals = np.array([[0.2, np.nan, 0.8], [0.4, 0.1, np.nan]])
    v = np.array([2.0, 1.0, 3.0])
    expanded = [0.2, 0.2, 0.8, 0.8, 0.8, 0.4, 0.4, 0.1]
    assert weighted_nanmean(vals, v) == pytest.approx(np.mean(expanded))
    assert np.isnan(weighted_nanmean(np.full((1, 3), np.nan), v))


@pytest.mark.parametrize("repeats,ties", [(2, False), (3, True), (1, False)])
def test_fast_draws_equal_the_generic_draws(repeats, ties):
    rng = np.random.default_rng(repeats)
    m, t = 30, 11
    sig = rng.normal(size=(m, t))
    reps = np.stack([sig + rng.normal(size=(m, t)) * 1.5 for _ in range(repeats)])
    preds = {f"e{i}": sig + rng.normal(size=(m, t)) * (1 + i) for i in range(3)}
    if ties:
        reps, preds = np.round(reps), {k: np.round(p) for k, p in preds.items()}
        preds["constant"] = np.ones((m, t))
    fast = _draws_fast(preds, reps, 40, np.random.default_rng(7))
    slow = _draws_generic(preds, reps, 40, np.random.default_rng(7))
    for name in preds:
        np.testing.assert_allclose(fast[0][name], slow[0][name], atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(fast[1], slow[1], atol=1e-12, equal_nan=True)


def test_a_non_finite_value_takes_the_generic_path_and_scores_the_same_where_finite():
    rng = np.random.default_rng(4)
    sig = rng.normal(size=(20, 6))
    reps = np.stack([sig + rng.normal(size=sig.shape) for _ in range(2)])
    clean = {"e": sig + rng.normal(size=sig.shape)}
    scores, _ = score_estimators(clean, reps, n_boot=30)
    broken = {"e": clean["e"].copy()}
    broken["e"][3, 2] = np.nan
    scores_nan, _ = score_estimators(broken, reps, n_boot=30)
    assert np.isfinite(scores["e"]["lo"]) and np.isfinite(scores_nan["e"]["value"])
