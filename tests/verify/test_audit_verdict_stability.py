"""The stability of the validity verdict (`verify.audit.verdict_stability`) on synthetic worlds with a known answer:
a verdict far from the bar is stable, one whose interval end sits on the bar is a knife-edge, the flag predicts how
often a fresh run of the same world (new subsets, new test points, new re-fit noise) changes the verdict, and a
trustworthy knife-edge issues no risk level."""

from __future__ import annotations

import numpy as np
import pytest

from verify.audit.lds import FRACTION_MIN, FRAGILE, INCONCLUSIVE, TRUSTWORTHY, interval_verdict, score_estimators
from verify.audit.risk import NOT_VALIDATED, RISK_LEVELS, assess_risk
from verify.audit.verdict_stability import (
    KNIFE_EDGE,
    STABLE,
    STABLE_AGREEMENT,
    resample_verdicts,
    to_stabilise,
    verdict_stability,
)

SUBSETS, TESTS, N, LEFT_OUT, POOL = 40, 15, 150, 15, 300


def _population(est_noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each training point's true effect on each of a pool of test points, and an estimator = truth + its error."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(0, 1, (N, POOL))
    return truth, truth + rng.normal(0, est_noise, (N, POOL))


def _run(truth: np.ndarray, est: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One audit's draw: test points from the pool, random subsets, two repeats with re-fit noise: (pred, reps)."""
    rng = np.random.default_rng(seed)
    cols = rng.choice(POOL, TESTS, replace=False)
    removed = [rng.choice(N, LEFT_OUT, replace=False) for _ in range(SUBSETS)]
    reps = np.stack([np.stack([truth[r][:, cols].sum(axis=0) + rng.normal(0, np.sqrt(LEFT_OUT), TESTS)
                               for r in removed]) for _ in range(2)])
    return np.stack([est[r][:, cols].sum(axis=0) for r in removed]), reps


def _scored(pred: np.ndarray, reps: np.ndarray, n_boot: int = 200) -> tuple[dict, float, str]:
    scores, ceiling = score_estimators({"x": pred}, reps, n_boot=n_boot)
    s = scores["x"]
    return s, ceiling["value"], interval_verdict(s["fraction_lo"], s["fraction_hi"], ceiling["value"], True)


def test_a_verdict_far_from_the_bar_is_stable():
    pred, reps = _run(*_population(0.4), seed=1)
    s, c, verdict = _scored(pred, reps, 400)
    assert verdict == TRUSTWORTHY and s["fraction_lo"] > FRACTION_MIN + 0.1, s
    st = verdict_stability(pred, reps, s, c, (verdict, True), (1, 0))
    assert st["label"] == STABLE and st["stable"] and st["agreement"] >= 0.95, st
    assert [r["verdict"] for r in st["reruns"]] == [TRUSTWORTHY] * len(st["reruns"])
    assert st["text"].startswith("stable: ")


def test_a_verdict_whose_interval_end_sits_on_the_bar_is_a_knife_edge():
    """Of many draws of a world near the bar, the one whose lower end is closest to it: about half of the resamples
    read otherwise, so it is a knife-edge whatever its verdict."""
    truth, est = _population(1.1, seed=11)
    runs = [_run(truth, est, seed) for seed in range(30)]
    scored = [_scored(*r, 400) for r in runs]
    k = int(np.argmin([abs(s["fraction_lo"] - FRACTION_MIN) for s, _, _ in scored]))
    (s, c, verdict), (pred, reps) = scored[k], runs[k]
    assert abs(s["fraction_lo"] - FRACTION_MIN) < 0.02, s
    st = verdict_stability(pred, reps, s, c, (verdict, True), (1, 0))
    assert st["label"] == KNIFE_EDGE and not st["stable"] and 0.2 < st["agreement"] < STABLE_AGREEMENT, st
    assert sum(st["resample_verdicts"].values()) == st["resamples"]
    assert set(st["resample_verdicts"]) >= {TRUSTWORTHY, INCONCLUSIVE}


def test_the_flag_predicts_how_often_a_fresh_run_changes_the_verdict():
    """The positive control of the instrument: over worlds around the bar, draws flagged knife-edge are ones that a
    fresh run of their world (new subsets, test points and noise) contradicts more often than draws called stable.
    Truth per draw: the share of the world's runs that give its verdict."""
    stable, flagged = [], []
    for est_noise, seed in ((0.9, 9), (1.1, 11), (1.3, 13), (2.4, 24)):
        truth, est = _population(est_noise, seed)
        runs = [_run(truth, est, 1000 + k) for k in range(40)]
        out = []
        for pred, reps in runs:
            s, _, verdict = _scored(pred, reps)
            agreement = np.mean([v == verdict for v in resample_verdicts(pred, reps, s, True, n=300)])
            out.append((verdict, agreement))
        verdicts = [v for v, _ in out]
        for verdict, agreement in out:
            (stable if agreement >= STABLE_AGREEMENT else flagged).append(verdicts.count(verdict) / len(verdicts))
    assert len(stable) >= 20 and len(flagged) >= 20, (len(stable), len(flagged))
    assert np.mean(stable) - np.mean(flagged) >= 0.1, (np.mean(stable), np.mean(flagged))


def test_to_stabilise_asks_for_more_subsets_and_says_what_they_cost():
    score = {"fraction": 0.56, "fraction_lo": 0.5003, "fraction_hi": 0.64}
    more = to_stabilise(score, (1047, 24, 7), 2, {"seconds": 600.0, "refits": 1000}, TRUSTWORTHY)
    assert more["subsets"] > 1047 and more["extra_refits"] == (more["subsets"] - 1047) * 2
    assert more["seconds"] == pytest.approx(more["extra_refits"] * 0.6)
    assert to_stabilise(score, (1047, 24, 7), 2, {"seconds": 1.0, "refits": 1}, INCONCLUSIVE) is None
    further = to_stabilise({**score, "fraction": 0.6}, (1047, 24, 7), 2, {"seconds": 1.0, "refits": 1}, TRUSTWORTHY)
    assert further["subsets"] < more["subsets"]  # a point further from the bar needs fewer


def _validity(stable: bool) -> dict:
    return {"verdict": TRUSTWORTHY, "lead": "ef", "reason": "r",
            "stability": {"stable": stable, "label": STABLE if stable else KNIFE_EDGE,
                          "text": ("stable" if stable else "knife-edge") + ": 52% of 1000 resamples give it",
                          "detail": "52% of 1000 resamples give it"},
            "adaptive": {"to_stabilise": None if stable else {"subsets": 2400, "extra_refits": 2706,
                                                              "seconds": 1800.0}}}


def test_a_trustworthy_knife_edge_issues_no_risk_level():
    user = {"user": {"worst_flip_rate": 0.25, "baseline": {"flip_rates": [0.0, 0.01, 0.0]}}}
    issued = assess_risk(user, False, 0.3, None, _validity(True))
    assert issued["level"] in RISK_LEVELS
    edge = assess_risk(user, False, 0.3, None, _validity(False))
    assert edge["level"] == NOT_VALIDATED and edge["unvalidated_level"] == issued["level"]
    assert "knife-edge" in edge["reason"] and "52% of 1000 resamples" in edge["reason"]
    assert "--lds-max-subsets 2400" in edge["next_step"]


def test_a_failed_removal_test_decides_every_resample_and_the_text_says_how_the_interval_alone_reads():
    truth, est = _population(1.1, seed=11)
    pred, reps = _run(truth, est, seed=3)
    s, c, _ = _scored(pred, reps, 400)
    st = verdict_stability(pred, reps, s, c, (FRAGILE, False), (1, 0))
    assert st["agreement"] == 1.0 and st["resample_verdicts"] == {FRAGILE: st["resamples"]}
    alone = st["interval_alone"]
    assert alone["verdict"] == interval_verdict(s["fraction_lo"], s["fraction_hi"], c, True)
    assert alone["agreement"] == np.mean([v == alone["verdict"] for v in resample_verdicts(pred, reps, s, True)])
    assert "failed lever-removal test" in st["text"] and f"{alone['agreement']:.0%} of them would" in st["text"]
