"""The influence positive control and the validity rule every influence-based claim is judged under (issue 26)."""

from __future__ import annotations

import pytest
from fake_records import complete
from test_claims_malleability import LEVEL_, PAPERLIKE, fake_record

from empirics.influence import RetrainRecord
from empirics.intervals import wilson
from verify.claims import all_claims, claim_units, evaluate_claim, units
from verify.claims.base import HOLDS, NA, NOT, PARTLY
from verify.claims.influence import VALIDITY_RULE, control_outcome


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
    return {"malleability:mnist:10class@proper+unit": fake_record(flip),
            "influence-retrain:relu@proper+unit": _retrain(retrain_lo),
            "influence-retrain:attn@proper+unit": _retrain(retrain_lo),
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
