"""The per-seed reduction of `empirics.mall_stats` (seed means, pooling, the excess paired per point), checked
against direct computations; the interval methods themselves are tested in tests/empirics/test_intervals.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from empirics.mall_stats import pooled, ratio, seed_means, t_interval


def _bernoulli_seeds(rates: list[float], points: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [(rng.random((points, 3)) < p).astype(float) for p in rates]


@pytest.mark.claim("flip-mnist", "flip-cifar10")
def test_seed_means_weigh_every_seed_equally_whatever_its_points():
    rng = np.random.default_rng(3)
    seeds = [s[:n] for s, n in zip(_bernoulli_seeds([0.2, 0.3, 0.5], 50, rng), (50, 20, 7), strict=True)]
    m = seed_means(seeds)
    assert m.shape == (3, 3)
    for s, row in zip(seeds, m, strict=True):
        assert row == pytest.approx(s.mean(axis=0))
    ci = t_interval(list(m[:, 1]))
    assert ci["value"] == pytest.approx(np.mean([s[:, 1].mean() for s in seeds]))


@pytest.mark.claim("flip-mnist", "flip-cifar10")
def test_pooled_is_the_mean_over_the_attack_columns_and_the_excess_is_paired_per_point():
    noise = np.array([1, 0, 1, 0], float)
    mat = np.stack([noise, noise, 1 - noise], axis=1)  # attack 1 flips exactly the noise's points
    m = seed_means([mat, mat])
    assert pooled(m, 2) == pytest.approx([0.5, 0.5])
    assert (m[:, 1] - m[:, 0]) == pytest.approx([0.0, 0.0])
    assert np.mean(mat[:, 1] - mat[:, 0]) == m[0, 1] - m[0, 0]


def test_ratio_of_seed_means_and_per_seed():
    r = ratio([0.4, 0.2], [0.1, 0.0])
    assert r["ratio"] == pytest.approx(0.3 / 0.05) and r["per_seed"] == [pytest.approx(4.0), None]
    assert ratio([0.1], [0.0])["ratio"] is None and math.isnan(ratio([], [])["attn_mean"])
