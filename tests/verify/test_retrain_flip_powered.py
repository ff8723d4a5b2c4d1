"""The powered retrain-based flip study (issue 40 item 5): its design chosen by the power simulation, its seed-halves
null as a third baseline, its gd-mse positive control and the fixed-context ablation beside the row."""

from __future__ import annotations

import numpy as np
import pytest
from fake_records import complete
from test_power import exact_power

from empirics.experiments.malleability import n_top
from empirics.experiments.retrain_flip import (
    RetrainFlipRecord,
    effect_flips,
    halves_by_loss,
    resolved_points,
    seed_flip_rate,
)
from ntkm.errors import UserInputError
from verify.claims import all_claims, claim_units, evaluate_claim, units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, PartlyAs
from verify.claims.retrain_flip import (
    DESIGNS,
    POWERED_SEEDS,
    design,
    flip_control_outcome,
    flip_retrain_outcome,
    flip_retrain_unit_configs,
)
from verify.experiments import not_run_units, units_for
from verify.power import TARGET
from verify.presets import PRESETS, preset

LOSSES = ("training", "squared")


def _rec(model: str, attack_flips: int, k: int = 20, seeds: int = 4, halves_split: int = 0, ntk_attack: float = 0.5,
         ntk_random: float = 0.1, protocol: str = "width-consistent", passed: bool = True,
         fixed: bool = False) -> RetrainFlipRecord:
    """A retrain-based flip record computed from synthetic effects (k points x `seeds` seeds): clean effects about +1,
    the first `attack_flips` turned to about -1 under the attack, none under random signs; the first `halves_split`
    points' clean effects of the second half of the seeds negated (a seed-halves null of that many flips)."""
    rng = np.random.default_rng(attack_flips * 31 + halves_split + 7 * seeds)
    clean = 1.0 + 0.05 * rng.normal(size=(k, seeds))
    clean[:halves_split, seeds // 2:] *= -1
    sets = {"clean": clean}
    for name, j in (("attack", attack_flips), ("random", 0)):
        e = clean + 0.05 * rng.normal(size=(k, seeds))
        e[:j] = -np.abs(e[:j]) - 1.0
        sets[name] = e
    gate = {"passed": passed, "reason": "passed" if passed else "no plateau after 10 epochs"}
    effects = {n: {ln: e.tolist() for ln in LOSSES} for n, e in sets.items()}
    return complete(RetrainFlipRecord, {
        "model": model, "loss": "cross-entropy", "selected": list(range(k)),
        "config": {"dataset": "mnist", "task": "10class", "n_train": 500, "n_test": 200, "width": 512,
                   "protocol": protocol, "epochs": 1000, "preprocess": "unit", "tau": k / 500, "attack": "pgd",
                   "attack_steps": 10, "eps": 0.3, "seeds": list(range(seeds)), "fixed_context": fixed},
        "training": {"train_acc": 1.0, "test_acc": 0.7, "gate": gate},
        "gates": [{"set": "clean", "seed": 1, **gate}],
        "effects": effects,
        "flips": {n: {ln: effect_flips(clean, sets[n]) for ln in LOSSES} for n in ("attack", "random")},
        "seed_flips": {ln: seed_flip_rate(clean) for ln in LOSSES},
        "resolved": {ln: resolved_points(clean) for ln in LOSSES},
        "null_halves": halves_by_loss(effects["clean"]),
        "ntk_flips": {"attack": {"flip_rate": ntk_attack, "flip_ci": [0.0, 1.0], "pair_flip_rate": ntk_attack},
                      "random": {"flip_rate": ntk_random, "flip_ci": [0.0, 1.0], "pair_flip_rate": ntk_random}},
    })


# ---- the design ---------------------------------------------------------------------------------------------------

def test_the_powered_design_is_the_one_the_power_simulation_chooses():
    for name in ("powered", "paper", "gpu"):
        assert design(PRESETS[name]).powered, name
    cfg = flip_retrain_unit_configs(PRESETS["powered"], None)[units.flip_retrain("attn")]
    k = n_top(cfg["tau"], cfg["n_train"])
    assert cfg["n_train"] == 500 and len(cfg["seeds"]) == POWERED_SEEDS
    assert exact_power(k, k * POWERED_SEEDS * (POWERED_SEEDS - 1) // 2) >= TARGET - 0.01  # independent of the draws
    small = flip_retrain_unit_configs(PRESETS["quick"], None)[units.flip_retrain("attn")]
    assert not design(PRESETS["quick"]).powered and (small["n_train"], small["tau"], small["seeds"]) == (100, 0.1,
                                                                                                       [0, 1, 2])


def test_an_unknown_design_is_a_one_line_error():
    with pytest.raises(UserInputError, match="unknown retrain-based flip design 'huge'; use one of small, powered"):
        design({**preset("quick"), "retrain_flip_design": "huge"})
    assert set(DESIGNS) == {"small", "powered"}


def test_the_companions_run_where_the_design_is_powered_and_say_where_they_run_elsewhere():
    full = units_for("powered")
    control = full[units.FLIP_RETRAIN_CONTROL].config
    assert control["train"]["protocol"] == "gd-mse" and control["preprocess"] == "unit" and control["model"] == "attn"
    assert full[units.at(units.flip_retrain_fixed(), "proper", "unit")].config["fixed_context"] is True
    assert units.FLIP_RETRAIN_CONTROL not in units_for("quick")
    skipped = not_run_units("quick")
    assert "runs at powered, paper, gpu" in skipped[units.FLIP_RETRAIN_CONTROL]
    assert units.at(units.flip_retrain_fixed(), "proper", "unit") in skipped
    for name in ("gpu", "powered"):
        assert units.FLIP_RETRAIN_CONTROL not in not_run_units(name) and units.FLIP_RETRAIN_CONTROL in units_for(name)
    assert "it runs the powered retrain-based flip study" in not_run_units("powered")["influence-control"]
    row = next(c for c in all_claims() if c.id == "flip-retrain-mnist")
    assert units.FLIP_RETRAIN_CONTROL in claim_units(row, ("unit",), ("proper",))


# ---- the rules ----------------------------------------------------------------------------------------------------

def test_the_seed_halves_null_is_a_third_baseline():
    from dataclasses import replace

    relu = _rec("relu", 0)
    assert flip_retrain_outcome({"attn": _rec("attn", 18), "relu": relu}).verdict == HOLDS
    # the same attack flips, but seed noise alone makes 10 of 20 points "flip" between the two halves of the seeds
    noisy = _rec("attn", 18, halves_split=10)
    lo = noisy.flips["attack"]["training"]["flip_ci"][0]
    assert noisy.null_halves["training"]["flip_rate"] > lo > noisy.seed_flips["training"]["rate"]
    out = flip_retrain_outcome({"attn": noisy, "relu": relu})
    assert out.verdict == INCONCLUSIVE and "seed-halves null 50 %" in out.ours
    assert flip_retrain_outcome({"attn": replace(noisy, null_halves=None), "relu": relu}).verdict == HOLDS


@pytest.mark.claim("flip-retrain-mnist")
@pytest.mark.parametrize(("rec", "expected"), [
    (_rec("attn", 10, ntk_attack=0.5, protocol="gd-mse"), HOLDS),   # Wilson [0.30, 0.70] holds the NTK's 0.5
    (_rec("attn", 10, ntk_attack=0.9, protocol="gd-mse"), NOT),     # the NTK's 0.9 outside the retrain interval
    (_rec("attn", 1, halves_split=4, ntk_attack=0.05, ntk_random=0.0, protocol="gd-mse"), NOT),  # not above the null
    (_rec("attn", 10, ntk_attack=0.1, protocol="gd-mse"), NA),      # the NTK finds nothing to recover
    (_rec("attn", 10, protocol="gd-mse", passed=False), NA),
])
def test_the_positive_control_reaches_each_verdict(rec, expected):
    assert flip_control_outcome(rec).verdict == expected


@pytest.mark.claim("flip-retrain-mnist")
def test_the_row_acts_on_its_positive_control_and_reports_the_ablation_beside():
    rs = {"attn": _rec("attn", 18), "relu": _rec("relu", 0)}
    good, bad = _rec("attn", 10, protocol="gd-mse"), _rec("attn", 10, ntk_attack=0.9, protocol="gd-mse")
    unmeasured = _rec("attn", 10, ntk_attack=0.1, protocol="gd-mse")
    fixed = _rec("attn", 2, fixed=True)
    held = flip_retrain_outcome(rs, good, fixed)
    assert held.verdict == HOLDS and "positive control (MLP-Attn, gd-mse, unit inputs) holds" in held.ours
    assert "context held fixed" in held.ours and held.numbers["ablation_fixed_context"]["flips"]
    broken = flip_retrain_outcome(rs, bad)
    assert broken.verdict == NA and "failed its positive control" in broken.ours
    weak = flip_retrain_outcome(rs, unmeasured)
    assert weak.verdict == PARTLY and weak.partly_as == PartlyAs.NOT_VALIDATED
    assert flip_retrain_outcome(rs).verdict == HOLDS  # no control in the run (small design): the rule as before


@pytest.mark.claim("flip-retrain-mnist")
def test_the_registry_row_reads_its_companions_where_the_run_has_them():
    row = next(c for c in all_claims() if c.id == "flip-retrain-mnist")
    results = {"flip-retrain:attn@proper+unit": _rec("attn", 18), "flip-retrain:relu@proper+unit": _rec("relu", 0),
               units.FLIP_RETRAIN_CONTROL: _rec("attn", 10, ntk_attack=0.9, protocol="gd-mse"),
               units.at(units.flip_retrain_fixed(), "proper", "unit"): _rec("attn", 2, fixed=True)}
    out = evaluate_claim(row, results, "proper", "unit")
    assert out.verdict == NA and "context held fixed" in out.ours
    binary = next(c for c in all_claims() if c.id == "flip-retrain-binary-mnist")
    assert units.flip_retrain_fixed() not in binary.optional_units


def test_a_seed_resample_recomputes_the_seed_halves_null():
    from verify.stability import resample_retrain_flip

    rec = _rec("attn", 10, seeds=6, halves_split=8).to_dict()
    again = resample_retrain_flip(rec, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5])
    assert again["null_halves"]["training"]["flip_rate"] == rec["null_halves"]["training"]["flip_rate"]
    swapped = resample_retrain_flip(rec, [0, 3, 1, 4, 2, 5], [0, 1, 2, 3, 4, 5])  # each half now mixes both
    assert swapped["null_halves"]["training"]["flip_rate"] < rec["null_halves"]["training"]["flip_rate"]


@pytest.mark.claim("flip-retrain-mnist")
def test_the_positive_control_unit_runs_under_gd_mse_and_is_judged():
    """The control unit of the powered preset, shrunk (n = 30, 4 retrain seeds, 5 epochs), through the unit function
    the runner calls: it trains under gd-mse on unit-norm inputs and its rule gives a verdict from what it measured."""
    from verify.experiments import retrain_flip_unit

    unit = units_for("powered")[units.FLIP_RETRAIN_CONTROL]
    cfg = {**unit.config, "n_train": 30, "n_test": 20, "width": 32, "tau": 0.1, "seeds": [0, 1, 2, 3],
           "attack_steps": 2, "train": {**unit.config["train"], "epochs": 5}}
    train = cfg.pop("train")
    rec = retrain_flip_unit(train, **cfg)
    assert rec.config["protocol"] == "gd-mse" and rec.config["preprocess"] == "unit" and rec.model == "attn"
    assert rec.loss == "squared error" and rec.null_halves["training"]["seeds_per_half"] == 2
    out = flip_control_outcome(rec)
    assert out.verdict in (HOLDS, NOT, NA) and "MLP-Attn: attack flips" in out.ours
