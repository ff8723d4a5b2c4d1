"""`verify.audit.sharpness.hessian_subset`: the sharpness subsample rule (all points for small models, a seeded
subsample of HESSIAN_VALUES / parameters for large ones, `--hessian-points` when given)."""

from __future__ import annotations

import numpy as np

from verify.audit.sharpness import HESSIAN_MIN_POINTS, HESSIAN_VALUES, hessian_subset


def test_small_models_keep_every_point():
    assert np.array_equal(hessian_subset(1000, 1_068_810, None, 0), np.arange(1000))


def test_large_models_get_a_seeded_sorted_subsample_of_the_stated_size():
    sub = hessian_subset(1000, 11_173_962, None, 3)
    assert len(sub) == HESSIAN_VALUES // 11_173_962 == 107
    assert np.all(np.diff(sub) > 0) and sub.max() < 1000
    assert np.array_equal(sub, hessian_subset(1000, 11_173_962, None, 3))
    assert not np.array_equal(sub, hessian_subset(1000, 11_173_962, None, 4))
    assert len(hessian_subset(1000, 10**12, None, 0)) == HESSIAN_MIN_POINTS


def test_explicit_points_win_and_never_exceed_the_training_set():
    assert len(hessian_subset(500, 10**9, 250, 0)) == 250
    assert np.array_equal(hessian_subset(50, 10**9, 80, 0), np.arange(50))
