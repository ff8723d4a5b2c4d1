"""The influence positive control and the validity rule every influence-based claim is judged under (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest
from fake_records import complete
from test_claims_malleability import LEVEL_, PAPERLIKE, fake_record, flat

from empirics.attribution.influence import RetrainRecord
from empirics.experiments.retrain_flip import RetrainFlipRecord
from empirics.intervals import wilson
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
        # its deciding tests (issue 40 item 6): each rejects exactly where the rule's interval excludes its point
        rho, sign = out.tests
        assert rho["rejected"] == (rec.spearman["ci"][0] > 0) and sign["rejected"] == (out.numbers["sign_ci"][0] > 0.5)
        assert (expected == HOLDS) == (rho["rejected"] and sign["rejected"])


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
                 noise_only: bool = False, dataset: str = "mnist", task: str = "10class") -> RetrainFlipRecord:
    """A retrain-based flip record whose statistics are computed from synthetic effects (k points x 3 seeds): clean
    effects about +1 (or pure noise about 0), the first `attack_flips` (`random_flips`) turned to about -1."""
    from empirics.experiments.retrain_flip import effect_flips, resolved_points, seed_flip_rate

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
        "config": {"dataset": dataset, "task": task, "n_train": 100, "n_test": 100, "width": 512,
                   "protocol": "width-consistent", "epochs": 1000,
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


# ---- the rows of binary MNIST and CIFAR-10 (D25) -------------------------------------------------------------

#: Claim id -> (data set, task) of each retrain-based flip row besides MNIST 10 classes.
NEW_ROWS = {"flip-retrain-binary-mnist": ("mnist", "binary"), "flip-retrain-cifar10": ("cifar10", "10class")}
#: Flip rates each flip claim's own rule judges 'holds' (a ratio inside the paper's range for that table).
HOLDING = {"flip-binary-mnist": flat((0.4, 0.1), (0.1, 0.02)), "flip-cifar10": flat((0.5, 0.1), (0.08, 0.02))}
CASES = [((9, 0, {}), (0, 0, {}), HOLDS), ((9, 0, {}), (9, 0, {}), PARTLY), ((0, 0, {}), (9, 0, {}), NOT),
         ((1, 1, {}), (1, 0, {}), INCONCLUSIVE), ((9, 0, {"passed": False}), (0, 0, {}), NA),
         ((0, 0, {"noise_only": True}), (0, 0, {}), NA)]


def _set_results(dataset: str, task: str, attn: tuple, relu: tuple, condition: str = "proper+unit") -> dict:
    """One condition's results of the retrain-based flip row of (dataset, task): (attack flips, random flips,
    options) per network."""
    return {f"{units.flip_retrain(m, dataset, task)}@{condition}": _flip_record(m, a, r, dataset=dataset, task=task,
                                                                                 **kw)
            for m, (a, r, kw) in (("attn", attn), ("relu", relu))}


@pytest.mark.claim("flip-retrain-binary-mnist", "flip-retrain-cifar10")
@pytest.mark.parametrize("claim_id", list(NEW_ROWS))
@pytest.mark.parametrize(("attn", "relu", "expected"), CASES)
def test_the_new_retrain_flip_rows_reach_each_verdict_on_their_own_units(claim_id, attn, relu, expected):
    claim = {c.id: c for c in all_claims()}[claim_id]
    ds, task = NEW_ROWS[claim_id]
    assert claim.units == tuple(units.flip_retrain(m, ds, task) for m in ("relu", "attn"))
    out = evaluate_claim(claim, _set_results(ds, task, attn, relu), "proper", "unit")
    assert out.verdict == expected
    assert out.protocol.startswith({"binary": "MNIST 3-vs-8", "10class": "CIFAR-10 10 classes"}[task])
    # the rule is flip-retrain-mnist's on the row's own data set, fixed before its first run
    assert ("MNIST 3-vs-8 (binary)" if task == "binary" else "CIFAR-10 (10 classes)") in claim.rule
    assert "(D24; this data set's row: D25)" in claim.rule
    # MNIST 10 classes' units do not stand in for the row's own
    assert evaluate_claim(claim, _set_results("mnist", "10class", attn, relu), "proper", "unit").verdict == NA


@pytest.mark.claim("flip-retrain-mnist")
def test_the_mnist_row_keeps_its_units_and_rule():
    from verify.claims.retrain_flip import FLIP_RETRAIN_RULE

    claim = {c.id: c for c in all_claims()}["flip-retrain-mnist"]
    assert claim.units == ("flip-retrain:relu", "flip-retrain:attn") and claim.rule.startswith(FLIP_RETRAIN_RULE)
    assert "MNIST (10 classes)" in claim.rule and FLIP_RETRAIN_RULE.endswith("(D24)")


@pytest.mark.claim("flip-retrain-binary-mnist", "flip-retrain-cifar10", "flip-cifar10", "flip-binary-mnist")
def test_a_row_the_preset_does_not_run_says_so_and_its_flip_claim_reads_the_mnist_row():
    from verify.claims import claim_row
    from verify.claims.base import not_run
    from verify.experiments import not_run_units, units_for

    skipped = not_run_units("quick")
    companions = {units.FLIP_RETRAIN_CONTROL, units.at(units.flip_retrain_fixed(), "proper", "unit")}  # issue 40 item 5
    assert set(skipped) - companions == {f"{units.flip_retrain(m, ds, task)}@proper+unit"
                                         for ds, task in NEW_ROWS.values() for m in ("relu", "attn")}
    assert not set(skipped) & set(units_for("quick"))
    claims = {c.id: c for c in all_claims()}
    results = {**{u: not_run(why) for u, why in skipped.items()},
               **_with_flips(_results(PAPERLIKE, -0.5, _retrain(0.2, sign=20 / 24)), _flip_record("attn", 9),
                             _flip_record("relu", 0))}
    for claim_id in NEW_ROWS:
        row = claim_row(claims[claim_id], results, ("unit",), ("proper",))
        assert row["verdict"] == NA.value
        assert row["ours"].startswith("not measurable here: not run at preset quick (runs at full, paper and gpu; "
                                      "about ")
        assert row["ours"].endswith(" min of one core here by the cost model)")
    # the flip claims whose own row was not run read flip-retrain-mnist, as before the per-data-set rows (D25)
    results["malleability:mnist:binary@proper+unit"] = fake_record(HOLDING["flip-binary-mnist"], task="binary")
    out = evaluate_claim(claims["flip-binary-mnist"], results, "proper", "unit")
    assert out.verdict == HOLDS and out.numbers["influence_validity"]["flip_retrain"] == "holds"
    assert "flip_retrain_row" not in out.numbers["influence_validity"]
    assert "retrain-based flip row holds" in out.condition


@pytest.mark.claim("flip-cifar10", "flip-binary-mnist", "flip-mnist", "flip-retrain-cifar10",
                   "flip-retrain-binary-mnist")
@pytest.mark.parametrize(("claim_id", "own"), [("flip-cifar10", ("cifar10", "10class")),
                                               ("flip-binary-mnist", ("mnist", "binary"))])
def test_the_validity_gate_reads_the_claims_own_data_sets_row_where_it_ran(claim_id, own):
    claims = {c.id: c for c in all_claims()}
    claim = claims[claim_id]
    ds, task = own
    row_id = {"cifar10": "flip-retrain-cifar10", "mnist": "flip-retrain-binary-mnist"}[ds]
    assert claim.optional_units == tuple(units.flip_retrain(m, ds, task) for m in ("relu", "attn"))
    assert VALIDITY_RULE in claim.rule and f"the retrain-based flip row is {row_id}, its own data set's" in claim.rule
    mall = {"flip-cifar10": "malleability:cifar10:10class", "flip-binary-mnist": "malleability:mnist:binary"}
    base = _results(PAPERLIKE, -0.5, _retrain(0.2, sign=20 / 24))  # the leave-one-out check fails here
    base[f"{mall[claim_id]}@proper+unit"] = fake_record(HOLDING[claim_id], dataset=ds, task=task)
    mnist_holds = _with_flips(base, _flip_record("attn", 9), _flip_record("relu", 0))
    # only MNIST 10 classes' row ran (quick): read as before
    before = evaluate_claim(claim, mnist_holds, "proper", "unit")
    assert before.verdict == HOLDS and "flip_retrain_row" not in before.numbers["influence_validity"]
    # its own row ran and is inconclusive: it, not MNIST's holding row, decides
    own_inconclusive = {**mnist_holds, **_set_results(ds, task, (1, 1, {}), (1, 0, {}))}
    out = evaluate_claim(claim, own_inconclusive, "proper", "unit")
    v = out.numbers["influence_validity"]
    assert out.verdict == PARTLY and v["flip_retrain"] == "inconclusive" and v["flip_retrain_row"] == row_id
    assert f"retrain-based flip row {row_id} inconclusive" in out.condition
    # its own row holds while MNIST's does not: validated by its own
    mnist_not = _with_flips(base, _flip_record("attn", 1, 1), _flip_record("relu", 1))
    out = evaluate_claim(claim, {**mnist_not, **_set_results(ds, task, (9, 0, {}), (0, 0, {}))}, "proper", "unit")
    assert out.verdict == HOLDS and out.numbers["influence_validity"]["flip_retrain_row"] == row_id
    # a row of another condition is not this condition's
    other = {**mnist_not, **_set_results(ds, task, (9, 0, {}), (0, 0, {}), condition="proper")}
    assert evaluate_claim(claim, other, "proper", "unit").verdict == PARTLY
    # the other flip claims never read it
    flip_mnist = {**mnist_not, **_set_results(ds, task, (9, 0, {}), (0, 0, {}))}
    assert evaluate_claim(claims["flip-mnist"], flip_mnist, "proper", "unit").verdict == PARTLY
    assert not claims["flip-mnist"].optional_units and not claims["flip-binary-cifar10"].optional_units
    assert not claims["flip-centred-mnist"].optional_units
    for other in ("flip-mnist", "flip-binary-cifar10", "flip-centred-mnist", "spearman-rankings"):
        assert claims[other].rule.endswith(VALIDITY_RULE)  # their rule texts are as before D25
