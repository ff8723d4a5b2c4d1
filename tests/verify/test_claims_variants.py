"""The "beyond the paper" rows of the softmax and Q/K/V variants, driven by synthetic records and outcomes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fake_records import complete
from test_claims_malleability import STRONG, fake_record

from empirics.experiments.distance import KERNEL_PREDICTOR_ACC, DistanceRecord
from empirics.experiments.mall_stats import summarise
from empirics.experiments.malleability import MalleabilityConfig, MalleabilityRecord
from verify.claims import units
from verify.claims.base import HOLDS, NA, NOT, PARTLY, Outcome
from verify.claims.malleability import flip_outcome
from verify.claims.variants import (
    ATTENTION_VARIANTS,
    VARIANT_CLAIMS,
    _mc_check,
    compared,
    v2_qkv_outcome,
    variant_pair,
    variant_unit_configs,
)
from verify.presets import preset
from verify.runner import config_kwargs


def _ntk(verdict, ci=(0.1, 0.3)) -> Outcome:
    return Outcome("x", verdict, "p", {"slope_interval": {"ci": list(ci)}}, 3, "gate", "slope CI > 0")


def _flip(verdict) -> Outcome:
    return Outcome("y", verdict, "q", {}, 3, "gate", "difference above 0")


@pytest.mark.claim("v2-qkv")
@pytest.mark.parametrize("ntk, flip, expected", [
    (_ntk(HOLDS), _flip(HOLDS), HOLDS),
    (_ntk(NA), _flip(HOLDS), NA),
    (_ntk(HOLDS), _flip(NA), NA),
    (_ntk(NOT, (-0.4, -0.1)), _flip(HOLDS), NOT),
    (_ntk(HOLDS), _flip(NOT), NOT),
    (_ntk(PARTLY), _flip(HOLDS), PARTLY),
    (_ntk(NOT, (-0.2, 0.3)), _flip(PARTLY), PARTLY),
])
def test_v2_qkv_rule_reaches_each_outcome(ntk, flip, expected):
    assert v2_qkv_outcome(ntk, flip).verdict is expected


def _distance_record(predictor_se: float, kind: str = "monte-carlo") -> DistanceRecord:
    ref = {"kind": kind, "draws": 16, "width": 512, "rel_se_frobenius": 0.05, "predictor_se": predictor_se}
    per_width = {str(w): {"function_abs": {"mean": v}} for w, v in ((64, 10.0), (256, 20.0), (512, 30.0))}
    return complete(DistanceRecord, {"models": {"qkv": {"reference": [ref, {**ref, "predictor_se": predictor_se / 2}],
                                                        "per_width": per_width}}})


@pytest.mark.claim("ntk-qkv-mnist", "v2-qkv")
def test_a_coarse_monte_carlo_reference_makes_the_row_not_measurable():
    """2 x SE must be at most a tenth of the smallest distance (10): SE 0.4 passes, SE 0.6 does not."""
    assert _mc_check(_distance_record(0.4), "qkv")[0] is None
    why, txt = _mc_check(_distance_record(0.6), "qkv")
    assert why is not None and "too coarse" in why and "16 draws" in txt
    assert _mc_check(_distance_record(99.0, kind="analytic"), "qkv") == (None, "")


def _variant_record(kind: str, **kw: Any) -> MalleabilityRecord:
    """A (relu, `kind`) malleability record as its unit stores it: the runs of `fake_record` with attn renamed,
    summarised with the paper's pair (which it does not run), each network with its kernel predictors' accuracy."""
    rec = fake_record(STRONG, seed_baseline=False, **kw)
    runs = [{**r, "model": kind if r["model"] == "attn" else r["model"], "test_acc": 0.5 + 0.01 * r["seed"],
             **dict(zip(KERNEL_PREDICTOR_ACC, (0.7, 0.6), strict=True))} for r in rec.runs]
    config = {**rec.config, "models": ["relu", kind]}
    return replace(rec, config=config, runs=runs, summary=summarise(runs, MalleabilityConfig(**config_kwargs(config))))


def _relabelled_flip(res: MalleabilityRecord, kind: str) -> Outcome:
    """The route the (variant, relu) pair replaced (issue 28): the record relabelled as (relu, attn), its summary
    recomputed, the paper's flip rule, and the gate's text patched back to name the kind."""
    config = {**res.config, "models": ["attn" if m == kind else m for m in res.config["models"]]}
    runs = [{**r, "model": "attn" if r["model"] == kind else r["model"]} for r in res.runs]
    summary = summarise(runs, MalleabilityConfig(**config_kwargs(config)))
    out = flip_outcome(replace(res, config=config, runs=runs, summary=summary), "mnist", "10class")
    return replace(out, ours=out.ours.replace("attn seed", f"{kind} seed"))


@pytest.mark.claim("flip-softmax-mnist", "flip-qkv-mnist", "v2-qkv")
@pytest.mark.parametrize("kind", ATTENTION_VARIANTS)
@pytest.mark.parametrize("failing", [(), (("standard", "attn", 1), ("standard", "relu", 3))])
def test_variant_flip_row_judges_the_pair_as_the_relabelled_record_did(kind, failing):
    """The flip row of a variant compares (variant, relu) directly; its outcome (text, verdict, numbers, the gate's
    list of networks and the kernel predictors) equals that of the relabelling it replaced, measured or gated."""
    rec = _variant_record(kind, failing=failing)
    assert rec.summary.comparisons == []  # the stored summary: the paper's pair, not run by a variant unit
    row = next(c for c in VARIANT_CLAIMS if c.id == f"flip-{kind}-mnist")
    got = row.evaluate({units.malleability("mnist", kind): rec})
    assert got == _relabelled_flip(rec, kind)
    assert got.verdict is (NA if failing else PARTLY) and "Attn" in got.numbers["kernel_predictor_test_acc"]
    if failing:  # the text names the network by kind, the numbers by its role in the rule (as before)
        assert f"{kind} seed 1" in got.ours and got.numbers["gate_failures"][0].startswith("attn seed 1")
    else:
        pooled = compared(rec, variant_pair(kind)).summary.find("comparisons", attack="pooled")
        assert got.numbers["ratio_ci"] == pooled["ratio_ci"] and got.ours.startswith("pooled over FGSM/PGD/MIM: Attn")


@pytest.mark.claim("ntk-softmax-mnist", "flip-softmax-mnist", "ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv")
def test_variant_units_are_mnist_and_the_three_widest_widths():
    p = preset("quick")
    units = variant_unit_configs(p, None)
    for kind in ATTENTION_VARIANTS:
        kd, dist = units[f"ntk-distance:mnist:{kind}"]
        km, mall = units[f"malleability:mnist:{kind}"]
        assert (kd, km) == ("distance", "malleability")
        assert dist["widths"] == [32, 64, 128] and dist["models"] == ["relu", kind]
        assert mall["models"] == ["relu", kind] and mall["dataset"] == "mnist" and "attn_centre" not in mall
        # the flip unit measures the sweep's widest networks on the sweep's data (shared training)
        assert (mall["width"], mall["n_train"], mall["n_test"], mall["seeds"]) == (
            dist["widths"][-1], dist["n_train"], dist["n_test"], dist["seeds"])
    ids = {c.id for c in VARIANT_CLAIMS}
    assert {"ntk-softmax-mnist", "flip-softmax-mnist", "ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv"} <= ids
    assert all(c.group == "variants" and c.empirical for c in VARIANT_CLAIMS)


def test_every_variant_row_is_registered_under_its_literal_id():
    """Issue 28: `grep '"flip-softmax-mnist"'` finds the row; an id that does not name its kind is refused."""
    from pathlib import Path

    import verify.claims.variants as v

    source = Path(v.__file__).read_text()
    for c in v.VARIANT_CLAIMS:
        assert f'"{c.id}"' in source, c.id
    with pytest.raises(ValueError, match="flip-qkv-mnist"):
        v._variant_row("flip-softmax-mnist", "qkv")
