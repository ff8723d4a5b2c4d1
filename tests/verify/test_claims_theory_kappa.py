"""The rules of `verify.claims.kappa` and `verify.claims.theory` (prop4.5), driven to each of their
outcomes on synthetic records. No test here pins the verdict of a real run."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from empirics.experiments.premise import BinaryKappaRecord, PremiseRecord
from theory.paper import PAPER_KAPPA
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, UNDERDETERMINED
from verify.claims.kappa import (
    KAPPA_CLAIMS,
    binary_kappa_tests,
    evaluate_binary_kappa,
    evaluate_premise,
    judge_binary_kappa,
    judge_kappa,
    judge_premise,
    kappa_extra_units,
)
from verify.claims.theory import THEORY_CLAIMS, evaluate_prop45
from verify.records import KappaRecord, TheoryRecord

CLAIMS = {c.id: c for c in KAPPA_CLAIMS + THEORY_CLAIMS}
JPEG_LABEL = "CIFAR-10, JPEG re-encoding (quality ~75; not the original pixels)"


# ---- kappa-mnist / kappa-cifar10 --------------------------------------------------------------

@pytest.mark.claim("kappa-mnist", "kappa-cifar10")
def test_kappa_rule_holds_only_when_every_n_is_within_2x() -> None:
    verdict, _, _, nums = judge_kappa([(32, 900.0), (64, 1500.0), (128, 2300.0)], 1200.0)
    assert verdict == HOLDS and nums["n_within_2x"] == [32, 64, 128]


@pytest.mark.claim("kappa-mnist", "kappa-cifar10")
def test_kappa_rule_not_when_paper_value_is_outside_the_range() -> None:
    below, note, cond, _ = judge_kappa([(32, 5000.0), (64, 9000.0)], 1200.0)
    assert below == NOT and "below" in note and "1.2e+03" in cond
    above, note, _, _ = judge_kappa([(32, 10.0), (64, 40.0)], 1200.0)
    assert above == NOT and "above" in note


@pytest.mark.claim("kappa-mnist", "kappa-cifar10")
def test_kappa_rule_underdetermined_states_the_interpolated_n() -> None:
    verdict, note, _, nums = judge_kappa([(1000, 1e5), (100, 1e3)], 1e4)
    assert verdict == UNDERDETERMINED
    assert nums["n_met"] == pytest.approx(10**2.5) and "n ~ 316" in note
    assert nums["kappa_range"] == [1e3, 1e5]


@pytest.mark.claim("kappa-mnist", "kappa-cifar10")
def test_kappa_rule_underdetermined_at_a_step_to_infinity_and_at_the_edges() -> None:
    verdict, note, _, nums = judge_kappa([(100, 1e3), (500, 1e7), (1000, "inf")], 1e9)
    assert verdict == UNDERDETERMINED and nums["n_met"] is None and "infinite" in note
    verdict, note, _, nums = judge_kappa([(32, 1500.0), (64, 1e5)], 1000.0)
    assert verdict == UNDERDETERMINED and nums["n_met"] == 32 and "smallest" in note


def _kappa(rows: list[dict[str, Any]], missing: list[dict[str, Any]]) -> KappaRecord:
    return KappaRecord.from_dict({"dataset": "x", "sample": "first", "preprocess": "raw", "rows": rows,
                                  "missing": missing})


def _kappa_record(ds: str, kappas: list[float], label: str) -> dict[str, KappaRecord]:
    rows = [{"n": n, "d": 3072, "rank": n, "kappa": "inf" if math.isinf(k) else k, "kappa_d": k,
             "provenance": {"label": label}} for n, k in zip((32, 64, 128), kappas, strict=True)]
    return {f"kappa:{ds}": _kappa(rows, [])}


@pytest.mark.claim("kappa-mnist", "kappa-cifar10")
def test_kappa_claims_reach_each_outcome_and_carry_the_jpeg_caveat() -> None:
    target = PAPER_KAPPA["cifar10"]
    claim = CLAIMS["kappa-cifar10"]
    cases = {HOLDS: [target, target, target], NOT: [10 * target, 20 * target, math.inf],
             UNDERDETERMINED: [target / 3, target, math.inf]}
    for want, kappas in cases.items():
        o = claim.evaluate(_kappa_record("cifar10", kappas, JPEG_LABEL))
        assert o.verdict == want, (want, o)
        assert "JPEG re-encoding" in o.ours and o.numbers["jpeg_caveat"] and o.condition
    o = CLAIMS["kappa-mnist"].evaluate(_kappa_record("mnist", [PAPER_KAPPA["mnist"]] * 3, "MNIST, original IDX"))
    assert o.verdict == HOLDS and "JPEG" not in o.ours and not o.numbers["jpeg_caveat"]
    assert claim.evaluate({"kappa:cifar10": _kappa([], [{"reason": "no data"}])}).verdict == NA


# ---- thm4.7-premise ---------------------------------------------------------------------------

def _spec(log10_kappa: float) -> dict[str, Any]:
    k = math.inf if math.isinf(log10_kappa) else 10.0**log10_kappa
    return {"kappa": k, "log10_kappa": log10_kappa, "lambda_min": 1e-3, "lambda_max": 1.0, "resolved": math.isfinite(k)}


def _premise_row(ds: str, n: int, log10_g3: float, log10_attn: float) -> dict[str, Any]:
    return {"dataset": ds, "n": n, "kappa_G": 10 ** (log10_g3 / 3), "log10_kappa_G_cubed": log10_g3,
            "lambda_min_G": 0.1, "attn_features": {"kappa": 10.0**log10_g3, "log10_kappa": log10_g3}, "seed": 0,
            "provenance_label": JPEG_LABEL if ds == "cifar10" else "MNIST",
            "ntk": {"attn": {"analytic": _spec(log10_attn), "empirical": [{"width": 256, **_spec(log10_attn + 1)}]},
                    "relu": {"analytic": _spec(2.0), "empirical": [{"width": 256, **_spec(2.2)}]}}}


@pytest.mark.claim("thm4.7-premise")
@pytest.mark.parametrize(("attn", "want"), [((9.5, 10.2), HOLDS), ((4.0, 5.0), NOT), ((9.5, 5.0), PARTLY),
                                             ((8.5, 8.5), PARTLY), ((math.inf, 4.0), PARTLY)])
def test_premise_rule_reaches_each_outcome(attn: tuple[float, float], want: Any) -> None:
    rows = [_premise_row("mnist", 32, 9.2, attn[0]), _premise_row("cifar10", 32, 10.2, attn[1])]
    verdict, gaps, condition = judge_premise(rows)
    assert verdict == want
    assert gaps[1] == pytest.approx(attn[1] - 10.2) and "[-1, 1]" in condition


@pytest.mark.claim("thm4.7-premise")
def test_premise_singular_gram_counts_as_far_below() -> None:
    verdict, gaps, _ = judge_premise([_premise_row("mnist", 1000, math.inf, 5.0)])
    assert verdict == NOT and gaps == [-math.inf]


@pytest.mark.claim("thm4.7-premise")
def test_premise_claim_reports_both_networks_from_a_json_record() -> None:
    rec = {"datasets": ["mnist", "cifar10"], "sample": "first", "widths": [256], "missing": [],
           "rows": [_premise_row("mnist", 32, 9.2, 4.1), _premise_row("cifar10", 64, 11.8, 5.2)]}
    results = json.loads(json.dumps({"premise:thm4.7": rec}, allow_nan=True).replace("Infinity", '"inf"'))
    o = evaluate_premise(_typed(results))
    assert o.verdict == NOT
    assert "MLP-Attn NTK" in o.ours and "2L-ReLU NTK" in o.ours and "JPEG" in o.ours
    row = o.numbers["rows"][0]
    assert row["attn_analytic_kappa"] == pytest.approx(10**4.1) and row["relu_empirical_kappa"] == {"256": 10**2.2}
    assert o.condition and o.protocol
    assert evaluate_premise({}).verdict == NA
    empty = _typed({"premise:thm4.7": {**rec, "rows": [], "missing": [{"reason": "x"}]}})
    assert evaluate_premise(empty).verdict == NA


# ---- binary-cifar-kappa -----------------------------------------------------------------------

#: Ten seeds (the quick preset's), binary / 10-class kappa ratios per seed: clearly lower, clearly higher, around 1.
LOWER = [0.5, 0.6, 0.7, 0.55, 0.65, 0.5, 0.6, 0.7, 0.55, 0.65]
HIGHER = [1 / q for q in LOWER]
AROUND = [0.5, 2.0, 0.7, 1.4, 0.6, 1.6, 0.9, 1.1, 0.5, 2.0]


@pytest.mark.claim("binary-cifar-kappa")
def test_binary_rule_reaches_each_outcome_at_ten_seeds() -> None:
    """Per n, a t interval of log(ratio) over seeds: below 0 at every n holds; above 0 somewhere and below nowhere
    does not hold (kappa higher for the binary subset in every cell is never 'partly'); both directions at
    different n is underdetermined; below at some n and undecided elsewhere is partly; undecided everywhere is
    inconclusive."""
    assert judge_binary_kappa({32: LOWER, 64: LOWER})[0] == HOLDS
    tests = binary_kappa_tests({32: LOWER, 64: AROUND})  # the deciding tests behind the multiplicity columns
    assert [t["rejected"] for t in tests] == [True, False] and tests[0]["p"] < 0.05 < tests[1]["p"]
    assert judge_binary_kappa({32: HIGHER, 64: HIGHER, 120: HIGHER})[0] == NOT
    assert judge_binary_kappa({32: AROUND, 64: HIGHER})[0] == NOT
    assert judge_binary_kappa({32: LOWER, 64: HIGHER})[0] == UNDERDETERMINED
    verdict, condition = judge_binary_kappa({32: LOWER, 64: AROUND})
    assert verdict == PARTLY and "lower (interval below 0) at n = [32]" in condition
    assert judge_binary_kappa({32: AROUND, 64: AROUND})[0] == INCONCLUSIVE
    assert judge_binary_kappa({32: [0.5], 64: [math.nan]})[0] == INCONCLUSIVE  # one seed bounds nothing


def _binary_record(cifar: list[tuple[float, float]]) -> dict[str, Any]:
    rows = []
    for i, (b, t) in enumerate(cifar):
        for ds, pair in (("cifar10", (b, t)), ("mnist", (1.0, 2.0))):
            rows.append({"dataset": ds, "n": 32 * (1 + i // 2), "seed": i % 2,
                         "binary": {"kappa": pair[0], "provenance_label": JPEG_LABEL},
                         "10class": {"kappa": pair[1], "provenance_label": JPEG_LABEL}})
    return {"kappa:binary": {"datasets": ["cifar10", "mnist"], "sample": "balanced", "seeds": [0, 1], "rows": rows,
                             "missing": []}}


def _typed(results: dict[str, Any]) -> dict[str, Any]:
    """Stored premise-unit dicts read back as their records, as the unit cache does."""
    kinds = {"premise:thm4.7": PremiseRecord, "kappa:binary": BinaryKappaRecord}
    return {k: kinds[k].from_dict(v) for k, v in results.items()}


@pytest.mark.claim("binary-cifar-kappa")
def test_binary_claim_states_ratios_and_what_it_tests() -> None:
    o = evaluate_binary_kappa(_typed(_binary_record([(1.0, 2.0), (1.0, 2.0), (3.0, 6.0), (2.0, 4.0)])))
    assert o.verdict == HOLDS and o.seeds == 2  # the same ratio in both seeds: a point interval below 0
    assert "premise of the explanation only" in o.ours and "MNIST 3 vs 8" in o.ours
    assert o.numbers["ratio_by_n"]["cifar10"]["32"] == [0.5, 0.5]
    higher = _typed(_binary_record([(3.0, 2.0), (6.0, 4.0), (7.0, 6.0), (14.0, 12.0)]))
    assert evaluate_binary_kappa(higher).verdict == NOT
    mixed = _typed(_binary_record([(1.0, 2.0), (5.0, 4.0), (1.0, 2.0), (1.0, 2.0)]))
    assert evaluate_binary_kappa(mixed).verdict == PARTLY
    empty = {"kappa:binary": {"datasets": ["cifar10"], "sample": "balanced", "seeds": [0], "rows": [],
                              "missing": [{"dataset": "cifar10", "reason": "no data"}]}}
    assert evaluate_binary_kappa(_typed(empty)).verdict == NA
    only_mnist = _binary_record([(1.0, 2.0)])
    only_mnist["kappa:binary"]["rows"] = [r for r in only_mnist["kappa:binary"]["rows"] if r["dataset"] == "mnist"]
    assert evaluate_binary_kappa(_typed(only_mnist)).verdict == NA


# ---- prop4.5 ----------------------------------------------------------------------------------

def _theory(*checks: dict[str, Any]) -> dict[str, TheoryRecord]:
    return {"theory": TheoryRecord.from_dict({"checks": [{"statement": "s", **c} for c in checks]})}


def _theory_record(verdict: str, **numbers: Any) -> dict[str, TheoryRecord]:
    return _theory({"claim_id": "prop4.5", "verdict": verdict, "detail": "d", "method": "m", "numbers": numbers})


@pytest.mark.claim("prop4.5")
def test_prop45_rule_reaches_each_outcome() -> None:
    common = {"corrected_bound": "B(X, j, eps)", "corrected_bound_holds": True, "max_ratio_random_delta": 0.4,
              "max_ratio_signed_data": 0.9}
    o = evaluate_prop45(_theory_record("does not hold as stated", stated_reading_exceeded_by=3.1,
                                       paper_quantity_underestimate_factor=[2.8, 3.1], **common))
    assert o.verdict == NOT and "exceeded 2.8-3.1x" in o.ours and "B(X, j, eps): verified" in o.ours
    assert "3.1" in o.condition
    o = evaluate_prop45(_theory_record("ill-posed as stated", stated_reading_exceeded_by=0.9, **common))
    assert o.verdict == PARTLY and "not exceeded" in o.ours
    assert evaluate_prop45(_theory_record("holds", stated_reading_exceeded_by=0.5, **common)).verdict == HOLDS
    assert evaluate_prop45(_theory_record("holds")).verdict == NA
    assert evaluate_prop45(_theory()).verdict == NA
    assert CLAIMS["prop4.5"].evaluate is evaluate_prop45


@pytest.mark.claim("stacking")
def test_other_theory_claims_keep_the_check_mapping() -> None:
    rec = _theory({"claim_id": "stacking", "verdict": "holds (corrected)", "detail": "x", "method": "m",
                   "numbers": {}})
    o = CLAIMS["stacking"].evaluate(rec)
    assert o.verdict == PARTLY and "holds (corrected)" in o.condition


# ---- units ------------------------------------------------------------------------------------

@pytest.mark.claim("thm4.7-premise", "binary-cifar-kappa")
def test_extra_units_have_json_ready_configs_and_module_level_functions() -> None:
    p = {"seeds": (0, 1), "premise_ns": (8,), "premise_widths": (16,), "binary_kappa_ns": (10,)}
    units = kappa_extra_units(p, None)
    assert set(units) == {"premise:thm4.7", "kappa:binary"}
    for name, unit in units.items():
        assert unit.name == name
        assert json.loads(json.dumps(unit.config)) == unit.config
        assert unit.fn.__module__ == "empirics.experiments.premise" and "<locals>" not in unit.fn.__qualname__
    assert units["premise:thm4.7"].config["ns"] == [8] and units["kappa:binary"].config["seeds"] == [0, 1]
    assert set(CLAIMS["thm4.7-premise"].units) | set(CLAIMS["binary-cifar-kappa"].units) == set(units)
    assert not CLAIMS["thm4.7-premise"].empirical and not CLAIMS["binary-cifar-kappa"].empirical
