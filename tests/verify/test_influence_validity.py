"""The influence positive control and the validity rule every influence-based claim is judged under (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest
from fake_records import complete
from test_claims_malleability import LEVEL_, PAPERLIKE, fake_record

from empirics.influence import RetrainRecord
from empirics.intervals import wilson
from empirics.retrain_flip import RetrainFlipRecord
from verify.claims import all_claims, claim_units, evaluate_claim, units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY
from verify.claims.influence import VALIDITY_RULE, control_outcome
from verify.claims.retrain_flip import flip_retrain_outcome


def _retrain(lo: float, sign: float = 0.5, n: int = 24, passed: bool = True) -> RetrainRecord:
    ci = {"value": lo + 0.1, "ci": [lo, min(1.0, lo + 0.3)]}
    cfg = {"n_train": 100, "n_test": 100, "width": 512, "protocol": "gd-mse", "epochs": 10, "n_remove": n,
           "ridge_rel": 1e-3, "preprocess": "unit"}
    return complete(RetrainRecord, {
        "config": cfg, "data": {"label": "x"}, "spearman": ci, "pearson": ci, "sign_agreement": sign,
        "points": [{"index": i, "predicted": 0.0, "actual": 0.0} for i in range(n)],
        "training": {"train_acc": 0.9, "test_acc": 0.8,
                     "gate": {"passed": passed, "reason": "passed" if passed else "no plateau after 10 epochs"}}})


@pytest.mark.claim("influence-control")
@pytest.mark.parametrize(("rec", "expected"), [
    (_retrain(0.2, sign=20 / 24), HOLDS),        # Wilson interval of 20/24 is [0.64, 0.93]
    (_retrain(0.2, sign=15 / 24), NOT),          # 15/24: [0.43, 0.79] contains a coin
    (_retrain(-0.1, sign=20 / 24), NOT),         # the rank correlation's interval reaches 0
    (_retrain(0.2, sign=20 / 24, passed=False), NA),
])
def test_control_rule_reaches_each_verdict(rec, expected):
    out = control_outcome(rec)
    assert out.verdict == expected
    if expected != NA:
        assert out.numbers["sign_ci"] == list(wilson(rec.sign_agreement, 24))


def _results(flip, retrain_lo: float, control: RetrainRecord) -> dict:
    """One condition's results with the retrain-based flip row inconclusive (it validates nothing)."""
    return {"malleability:mnist:10class@proper+unit": fake_record(flip),
            "influence-retrain:relu@proper+unit": _retrain(retrain_lo),
            "influence-retrain:attn@proper+unit": _retrain(retrain_lo),
            "flip-retrain:attn@proper+unit": _flip_record("attn", 1, 1),
            "flip-retrain:relu@proper+unit": _flip_record("relu", 1),
            units.INFLUENCE_CONTROL: control}


@pytest.mark.claim("flip-mnist", "influence-control", "influence-retrain")
def test_a_holds_stands_only_where_the_instrument_is_validated():
    claim = {c.id: c for c in all_claims()}["flip-mnist"]
    good = _retrain(0.2, sign=20 / 24)
    validated = evaluate_claim(claim, _results(PAPERLIKE, 0.6, good), "proper", "unit")
    assert validated.verdict == HOLDS and validated.numbers["influence_validity"]["validated"]
    unvalidated = evaluate_claim(claim, _results(PAPERLIKE, -0.5, good), "proper", "unit")
    assert unvalidated.verdict == PARTLY and unvalidated.ours.startswith("holds for the kernel predictor")
    assert "not validated" in unvalidated.condition
    broken = evaluate_claim(claim, _results(PAPERLIKE, 0.6, _retrain(-0.3, sign=0.4)), "proper", "unit")
    assert broken.verdict == NA and "failed its positive control" in broken.ours
    no_control = evaluate_claim(claim, _results(PAPERLIKE, 0.6, _retrain(0.2, sign=0.9, passed=False)), "proper",
                                "unit")
    assert no_control.verdict == PARTLY  # a control below the gate validates nothing
    refuted = evaluate_claim(claim, _results(LEVEL_, -0.5, good), "proper", "unit")
    assert refuted.verdict == NOT  # judged on the paper's own instrument: stands


def test_every_influence_based_claim_is_gated_and_needs_the_control_once():
    claims = {c.id: c for c in all_claims()}
    gated = {i for i, c in claims.items() if VALIDITY_RULE in c.rule}
    assert {"flip-mnist", "flip-cifar10", "ratio-6-9x", "flip-binary-cifar10", "spearman-rankings", "curated-removal",
            "adv-attn-mnist", "flip-centred-mnist", "flip-softmax-mnist", "flip-qkv-mnist"} <= gated
    assert not gated & {"influence-retrain", "influence-control", "ntk-relu-mnist", "landscape-mnist", "thm4.2"}
    need = claim_units(claims["flip-mnist"], ("raw", "unit"), ("paper", "proper"))
    assert need.count(units.INFLUENCE_CONTROL) == 1
    assert "influence-retrain:attn@paper" in need and "influence-retrain:relu@proper+unit" in need


def test_the_report_says_what_the_flip_rates_measure_and_keeps_the_control_out_of_the_theory_count():
    from reports.claims_report import instrument_line, theory_summary

    record = {"claims": [{"id": "thm4.1", "empirical": False, "verdict": "holds"},
                         {"id": "influence-control", "empirical": False, "verdict": "holds"},
                         {"id": "influence-retrain", "empirical": True, "verdict": "does not hold"}]}
    assert theory_summary(record) == {"holds": 1}
    line = instrument_line(record)
    assert "kernel machine" in line and "influence-control holds, influence-retrain does not hold" in line
    assert instrument_line({"claims": record["claims"][:1]}) == ""


def _flip_record(model: str, attack_flips: int, random_flips: int = 0, k: int = 10, passed: bool = True,
                 noise_only: bool = False) -> RetrainFlipRecord:
    """A retrain-based flip record whose statistics are computed from synthetic effects (k points x 3 seeds): clean
    effects about +1 (or pure noise about 0), the first `attack_flips` (`random_flips`) turned to about -1."""
    from empirics.retrain_flip import effect_flips, resolved_points, seed_flip_rate

    rng = np.random.default_rng(attack_flips * 31 + random_flips)
    clean = 0.05 * rng.normal(size=(k, 3))
    clean = clean - clean.mean(axis=1, keepdims=True) if noise_only else 1.0 + clean
    sets = {"clean": clean}
    for name, j in (("attack", attack_flips), ("random", random_flips)):
        e = clean + 0.05 * rng.normal(size=(k, 3))
        e[:j] = -e[:j]
        sets[name] = e
    flips = {name: {loss: effect_flips(clean, sets[name]) for loss in ("training", "squared")}
             for name in ("attack", "random")}
    gate = {"passed": passed, "reason": "passed" if passed else "no plateau after 10 epochs"}
    return complete(RetrainFlipRecord, {
        "model": model, "loss": "cross-entropy", "selected": list(range(k)),
        "config": {"n_train": 100, "n_test": 100, "width": 512, "protocol": "width-consistent", "epochs": 1000,
                   "preprocess": "unit", "tau": 0.1, "attack": "pgd", "attack_steps": 10, "eps": 0.3,
                   "seeds": [0, 1, 2]},
        "training": {"train_acc": 1.0, "test_acc": 0.7, "gate": gate},
        "gates": [{"set": "clean", "seed": 1, **gate}],
        "effects": {n: {"training": e.tolist(), "squared": e.tolist()} for n, e in sets.items()},
        "flips": flips, "seed_flips": {loss: seed_flip_rate(clean) for loss in ("training", "squared")},
        "resolved": {loss: resolved_points(clean) for loss in ("training", "squared")},
        "ntk_flips": {n: {"flip_rate": 0.5, "flip_ci": [0.2, 0.8], "pair_flip_rate": 0.5}
                      for n in ("attack", "random")},
    })


@pytest.mark.claim("flip-retrain-mnist")
@pytest.mark.parametrize(("attn", "relu", "expected"), [
    (_flip_record("attn", 9), _flip_record("relu", 0), HOLDS),          # Wilson [0.60, 0.98] above 0 and above ReLU
    (_flip_record("attn", 9), _flip_record("relu", 9), PARTLY),         # beats noise, not ReLU
    (_flip_record("attn", 0), _flip_record("relu", 9), NOT),            # upper end 0.28 below ReLU's 0.9
    (_flip_record("attn", 1, 1), _flip_record("relu", 1), INCONCLUSIVE),  # [0.02, 0.40] straddles noise's 0.1
    (_flip_record("attn", 9, passed=False), _flip_record("relu", 0), NA),
    (_flip_record("attn", 0, noise_only=True), _flip_record("relu", 0), NA),  # no clean effect has a sign
])
def test_retrain_flip_rule_reaches_each_verdict(attn, relu, expected):
    out = flip_retrain_outcome({"relu": relu, "attn": attn})
    assert out.verdict == expected
    assert ("MLP-Attn: attack flips" in out.ours) and ("NTK flip rate of the same points" in out.ours)


def _with_flips(results: dict, attn: RetrainFlipRecord, relu: RetrainFlipRecord) -> dict:
    return {**results, "flip-retrain:attn@proper+unit": attn, "flip-retrain:relu@proper+unit": relu}


@pytest.mark.claim("flip-mnist", "flip-retrain-mnist")
def test_a_retrain_based_flip_row_that_holds_validates_the_flip_claims_only():
    claims = {c.id: c for c in all_claims()}
    good = _retrain(0.2, sign=20 / 24)
    base = _results(PAPERLIKE, -0.5, good)  # the leave-one-out check fails in this condition
    held = _with_flips(base, _flip_record("attn", 9), _flip_record("relu", 0))
    out = evaluate_claim(claims["flip-mnist"], held, "proper", "unit")
    assert out.verdict == HOLDS and out.numbers["influence_validity"]["flip_retrain"] == "holds"
    unresolved = _with_flips(base, _flip_record("attn", 1, 1), _flip_record("relu", 1))
    assert evaluate_claim(claims["flip-mnist"], unresolved, "proper", "unit").verdict == PARTLY
    assert "flip-retrain:attn" in claims["flip-mnist"].units
    assert "flip-retrain:attn" not in claims["spearman-rankings"].units
