"""The adaptive validity panel (issue 43 item 3) on synthetic LDS draws with a known answer: it stops at the pilot
on a clear case, spends its budget on a straddling one and then says 'inconclusive' with what would settle it, and it
never adds re-fits where the re-fits do not agree (no ceiling)."""

from __future__ import annotations

import numpy as np
import pytest

from verify.audit.validity import (
    BUDGET,
    CLEARS,
    CONTINUE,
    FRACTION_MIN,
    INCONCLUSIVE,
    MISSES,
    NO_CEILING,
    _verdict,
    adaptive_lds,
    adaptive_step,
    settle_text,
)

N, T, REPEATS, LEFT_OUT = 200, 30, 2, 20


def _world(signal_sd: float, noise_sd: float, est_noise: float, seed: int = 0):
    """Per-point effects on each test point (the truth), an estimator = truth + its own error, and a `batch` that
    re-fits k random subsets: each repeat's change is the removed points' summed truth plus re-fit noise."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(0, signal_sd, (N, T))
    est = truth + rng.normal(0, est_noise, (N, T))
    calls = []

    def batch(k: int):
        calls.append(k)
        removed = [rng.choice(N, LEFT_OUT, replace=False) for _ in range(k)]
        ch = np.stack([np.stack([truth[r].sum(axis=0) + rng.normal(0, noise_sd, T) for r in removed])
                       for _ in range(REPEATS)])
        return removed, ch

    return batch, {"ntk": est, "gn": -est, "ef": rng.normal(0, 1, (N, T))}, calls


def test_the_step_rule():
    assert adaptive_step(0.6, 0.9, 0.8, 24, 48) == CLEARS
    assert adaptive_step(0.1, 0.4, 0.8, 24, 48) == MISSES
    assert adaptive_step(0.3, 0.7, 0.8, 24, 48) == CONTINUE
    assert adaptive_step(0.3, 0.7, 0.8, 48, 48) == BUDGET
    assert adaptive_step(float("nan"), float("nan"), 0.0, 24, 48) == NO_CEILING


def test_a_clear_case_stops_at_the_pilot():
    batch, est, calls = _world(signal_sd=1.0, noise_sd=0.5, est_noise=0.2)
    removed, reps, scores, ceiling, lead, ad = adaptive_lds(batch, est, 24, 96, seed=0)
    assert calls == [24] and ad["stopped"] == CLEARS and len(removed) == 24 and reps.shape == (REPEATS, 24, T)
    assert lead == "ntk" and scores["ntk"]["fraction_lo"] >= FRACTION_MIN and ad["to_settle"] is None


def test_a_straddling_case_spends_its_budget_and_is_inconclusive():
    batch, est, calls = _world(signal_sd=1.0, noise_sd=4.0, est_noise=2.2, seed=3)
    removed, reps, scores, ceiling, lead, ad = adaptive_lds(batch, est, 6, 24, seed=0,
                                                            seconds=lambda: 12.0)
    s = scores[lead]
    assert calls == [6, 6, 12] and len(removed) == 24 and [r["subsets"] for r in ad["rounds"]] == [6, 12, 24]
    assert ad["stopped"] == BUDGET and s["fraction_lo"] < FRACTION_MIN <= s["fraction_hi"], s
    verdict, why = _verdict({"passed": True}, scores, ceiling, (True, lead))
    assert verdict == INCONCLUSIVE
    text = settle_text(ad)
    assert "24 subsets re-fitted (6 pilot, budget 24): budget spent" in text
    more = ad["to_settle"]
    assert more["subsets"] > 24 and more["extra_refits"] == (more["subsets"] - 24) * REPEATS
    assert more["seconds"] == pytest.approx(more["extra_refits"] * 12.0 / (24 * REPEATS))
    assert f"--lds-max-subsets {more['subsets']}" in text


def test_refits_that_do_not_agree_add_nothing():
    rng = np.random.default_rng(1)
    calls = []

    def batch(k: int):
        calls.append(k)
        return [rng.choice(N, LEFT_OUT, replace=False) for _ in range(k)], rng.normal(0, 1, (REPEATS, k, T))

    est = {"ntk": rng.normal(0, 1, (N, T)), "gn": rng.normal(0, 1, (N, T)), "ef": rng.normal(0, 1, (N, T))}
    *_, ad = adaptive_lds(batch, est, 12, 96, seed=0)
    assert calls == [12] and ad["stopped"] in (NO_CEILING, MISSES)
