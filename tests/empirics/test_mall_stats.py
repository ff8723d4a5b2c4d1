"""The interval machinery of `empirics.mall_stats`, checked against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tolerances import MC_CI_ABS, MC_SD_REL

from empirics.mall_stats import hierarchical_bootstrap, percentile_ci, ratio_ci, ratio_values, t_interval


def _bernoulli_seeds(rates: list[float], points: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [(rng.random(points) < p).astype(float)[:, None] for p in rates]


def test_bootstrap_spread_matches_the_two_level_variance_formula():
    """Replicate = mean over S drawn seeds of a resampled point mean, so its variance is
    (1/S) * [ (1/S) sum_s (m_s - m)^2 + (1/S) sum_s sigma_s^2 / P ] (population variances)."""
    rng = np.random.default_rng(3)
    seeds = _bernoulli_seeds([0.2, 0.3, 0.5], 50, rng)
    est, reps = hierarchical_bootstrap({"a": seeds}, n_boot=4000, seed=11)
    means = np.array([s.mean() for s in seeds])
    var_pts = np.array([s.var() for s in seeds]) / 50
    n_seeds = len(seeds)
    want = math.sqrt((np.mean((means - means.mean()) ** 2) + var_pts.mean()) / n_seeds)
    got = float(reps["a"][:, 0].std())
    assert est["a"][0] == pytest.approx(means.mean())
    assert got == pytest.approx(want, rel=MC_SD_REL)
    ci = percentile_ci(est["a"][0], reps["a"][:, 0])
    assert ci["lo"] == pytest.approx(means.mean() - 1.96 * want, abs=MC_CI_ABS)
    assert ci["hi"] == pytest.approx(means.mean() + 1.96 * want, abs=MC_CI_ABS)


def test_constant_points_give_a_degenerate_interval_and_paired_columns_cancel():
    same = [np.full((10, 1), 0.4)] * 3
    est, reps = hierarchical_bootstrap({"a": same}, n_boot=200)
    ci = percentile_ci(est["a"][0], reps["a"][:, 0])
    assert ci["lo"] == ci["hi"] == pytest.approx(0.4)
    flips = np.random.default_rng(0).random((20, 1)) < 0.5
    twin = [np.hstack([flips, flips]).astype(float)] * 2  # attack column equal to the noise column, per point
    _, reps = hierarchical_bootstrap({"a": twin}, n_boot=200)
    assert np.all(reps["a"][:, 1] - reps["a"][:, 0] == 0)


def test_seed_draw_is_shared_between_groups():
    """Two groups with identical data give identical replicates of their seed level (same seed draw)."""
    seeds = [np.full((5, 1), v) for v in (0.0, 1.0, 0.5)]
    _, reps = hierarchical_bootstrap({"a": seeds, "b": seeds}, n_boot=300)
    assert np.allclose(reps["a"], reps["b"])


def test_interval_covers_the_true_rate_on_simulated_bernoulli_data():
    """Coverage of the true flip rate over 200 simulated experiments (3 seeds x 50 points)."""
    rng = np.random.default_rng(7)
    hits = 0
    for k in range(200):
        est, reps = hierarchical_bootstrap({"a": _bernoulli_seeds([0.3] * 3, 50, rng)}, n_boot=400, seed=k)
        ci = percentile_ci(est["a"][0], reps["a"][:, 0])
        hits += ci["lo"] <= 0.3 <= ci["hi"]
    assert hits / 200 >= 0.92


@pytest.mark.claim("curated-removal", "spearman-rankings")
def test_t_interval_by_hand():
    ci = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2 df) * sd 1 / sqrt(3)
    assert ci["value"] == 2.0 and ci["lo"] == pytest.approx(2 - half) and ci["hi"] == pytest.approx(2 + half)
    one = t_interval([0.5])
    assert one["lo"] == -math.inf and one["hi"] == math.inf


@pytest.mark.claim("ratio-6-9x", "flip-binary-cifar10")
def test_ratio_conventions():
    r = ratio_values(np.array([0.4, 0.4, -0.1, 0.0]), np.array([0.1, 0.0, -0.2, 0.0]))
    assert r[0] == pytest.approx(4.0) and r[1] == math.inf and r[2] == -math.inf and r[3] == -math.inf
    ci = ratio_ci(0.4, 0.1, np.array([0.4] * 99 + [0.4]), np.array([0.1] * 99 + [0.0]))
    assert ci["value"] == pytest.approx(4.0) and ci["lo"] == pytest.approx(4.0)


def test_groups_must_share_their_seeds():
    with pytest.raises(ValueError):
        hierarchical_bootstrap({"a": [np.zeros((3, 1))], "b": [np.zeros((3, 1))] * 2})
