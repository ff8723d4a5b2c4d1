"""The "beyond the paper" rows of the softmax and Q/K/V variants, driven by synthetic records and outcomes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_records import complete
from test_claims_malleability import STRONG, fake_record

from empirics.distance import DistanceRecord
from verify.claims.base import HOLDS, NA, NOT, PARTLY, Outcome
from verify.claims.variants import (
    ATTENTION_VARIANTS,
    VARIANT_CLAIMS,
    _mc_check,
    as_attn,
    v2_qkv_outcome,
    variant_unit_configs,
)
from verify.presets import preset


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


@pytest.mark.claim("flip-softmax-mnist", "flip-qkv-mnist", "v2-qkv")
def test_variant_flip_row_reads_the_variant_as_attn():
    """A (relu, softmax) record relabelled for the paper's flip rule gives the same numbers as the same record
    built with the label attn."""
    as_attn_rec = fake_record(STRONG)
    runs = [{**r, "model": "softmax" if r["model"] == "attn" else r["model"]} for r in as_attn_rec.runs]
    renamed = replace(as_attn_rec, config={**as_attn_rec.config, "models": ["relu", "softmax"]}, runs=runs)
    back = as_attn(renamed, "softmax")
    assert back.summary.to_dict() == as_attn_rec.summary.to_dict()
    assert {r["model"] for r in back.runs} == {"relu", "attn"}


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
