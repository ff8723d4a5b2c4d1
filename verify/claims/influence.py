"""Does the influence the malleability claims use predict what retraining does? (the method the paper takes
from Zhang & Zhang 2022: NTK leave-one-out with the trained network's empirical kernel, no retraining)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from empirics.attribution.influence import ESTIMAND_LOSS, RetrainRecord
from empirics.intervals import wilson
from empirics.nets.protocols import GATE_TEXT
from empirics.vocab import PAPER_PAIR, model_name
from reports.text import fmt
from verify.claims import units
from verify.claims.base import HOLDS, NA, NOT, PARTLY, Claim, Outcome, PartlyAs, Results
from verify.claims.retrain_flip import FLIP_RETRAIN_UNITS, retrain_flip_verdict, set_units
from verify.multiplicity import rank_test, share_test, tests_of
from verify.presets import PresetSizes

MODELS = PAPER_PAIR.paper_order
#: The retrain check's units, one per paper model (resolved per condition like every empirical unit).
RETRAIN_UNITS = tuple(units.influence_retrain(m) for m in MODELS)


def retrain_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, dict[str, Any]]:
    """`ProtocolRetrainConfig` keyword arguments (without the protocol) for each network, sized by the preset."""
    small = p["n_train"] <= 100
    return {units.influence_retrain(m): {"model": m, "dataset": "mnist", "task": "10class",
                                       "n_train": 40 if small else 100, "n_test": 40 if small else 100,
                                       "width": p["mall_width"], "n_remove": 6 if small else 12, "data_dir": data_dir}
            for m in MODELS}


def control_unit_config(p: PresetSizes, data_dir: str | None) -> dict[str, Any]:
    """`ProtocolRetrainConfig` keyword arguments of the positive control (`units.INFLUENCE_CONTROL`): 2L-ReLU at the
    preset's malleability width, full-batch gradient descent on the squared loss, unit-norm MNIST inputs; twice as
    many removed points as the retrain check, so that its intervals can exclude a coin."""
    small = p["n_train"] <= 100
    return {"model": "relu", "dataset": "mnist", "task": "10class", "n_train": 40 if small else 100,
            "n_test": 40 if small else 100, "width": p["mall_width"], "n_remove": 8 if small else 24,
            "preprocess": "unit", "data_dir": data_dir}


RETRAIN_RULE = ("for each network, trained under the protocol on MNIST (10 classes), the predicted total influence "
                "of evenly spaced points against the actual change of the network's test loss after retraining from "
                "the same initialisation without the point; 95 % bootstrap interval of Spearman's rho over the "
                "removed points: holds if the interval lies above 0.5 for both networks; partly if it lies above 0 "
                "for both, or above 0.5 for one; does not hold otherwise; not measurable if a network fails the gate. "
                "The verdict judges the paper's estimand (kernel regression on one-hot targets, squared loss, against "
                "the network's squared error), the one every flip rate uses; the matched estimands (the initial "
                "function removed; Gauss-Newton influence on the training loss against the change of that loss) are "
                "reported beside it, not judged")


def estimands_text(r: RetrainRecord) -> str:
    """Spearman (interval) and sign agreement of each estimand against the loss it predicts (`ESTIMANDS`)."""
    loss = {"training": "training loss", "squared": "squared error"}
    parts = []
    for e in r.estimands:
        rho = e["spearman"]
        parts.append(f"{e['name']} (vs the {loss[ESTIMAND_LOSS[e['name']]]}) Spearman {fmt(rho['value'])} "
                     f"[{fmt(rho['ci'][0])}, {fmt(rho['ci'][1])}], signs {100 * e['sign_agreement']:.0f} %")
    return "; ".join(parts)


def _retrain_claim() -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        rs: dict[str, RetrainRecord] = {m: results[u] for m, u in zip(MODELS, RETRAIN_UNITS, strict=True)}
        cfg = rs["relu"].config
        protocol = (f"{rs['relu'].data.get('label', 'MNIST')}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, "
                    f"width {cfg['width']}, protocol {cfg['protocol']} (up to {cfg['epochs']} epochs), "
                    f"{cfg['n_remove']} points removed one at a time and the network retrained; influence = NTK "
                    f"leave-one-out with the trained network's empirical kernel, ridge_rel {cfg['ridge_rel']}")
        failed = [f"{model_name(m)}: {r.training['gate']['reason']}" for m, r in rs.items()
                  if not r.training["gate"]["passed"]]
        parts = [f"{model_name(m)}: Spearman {fmt(r.spearman['value'])} [{fmt(r.spearman['ci'][0])}, "
                 f"{fmt(r.spearman['ci'][1])}], Pearson {fmt(r.pearson['value'])} [{fmt(r.pearson['ci'][0])}, "
                 f"{fmt(r.pearson['ci'][1])}], signs agree {100 * r.sign_agreement:.0f} % (train/test acc "
                 f"{fmt(r.training['train_acc'])}/{fmt(r.training['test_acc'])})" for m, r in rs.items()]
        numbers = {m: {"spearman": r.spearman, "pearson": r.pearson, "sign_agreement": r.sign_agreement,
                       "estimands": {e["name"]: {k: e[k] for k in ("spearman", "pearson", "sign_agreement")}
                                     for e in r.estimands}}
                   for m, r in rs.items()}
        parts += [f"{model_name(m)} by estimand: {estimands_text(r)}" for m, r in rs.items() if r.estimands]
        if failed:
            return Outcome("not measurable: below the adequacy gate (" + "; ".join(failed) + "). " + "; ".join(parts),
                           NA, protocol, numbers, gate=GATE_TEXT)
        lows = [r.spearman["ci"][0] for r in rs.values()]
        verdict = HOLDS if min(lows) > 0.5 else PARTLY if min(lows) > 0 or max(lows) > 0.5 else NOT
        tests = tests_of(*(rank_test(f"{model_name(m)} Spearman vs {point:g}", r.spearman, len(r.points), point)
                           for m, r in rs.items() for point in (0.5, 0.0)))
        return Outcome("; ".join(parts), verdict, protocol, numbers, gate=GATE_TEXT,
                       condition=f"lower ends of the Spearman intervals {', '.join(fmt(v) for v in lows)} vs 0.5 and 0",
                       partly_as=PartlyAs.WEAK if verdict is PARTLY else None, tests=tests)

    return evaluate


CONTROL_RULE = ("positive control of the influence instrument, in the regime where the NTK theory behind it is exact "
                "in the wide limit: 2L-ReLU trained by full-batch gradient descent on the squared loss (protocol "
                "gd-mse) on unit-norm MNIST inputs; the predicted total influence (NTK leave-one-out with the trained "
                "network's empirical kernel) of evenly spaced points against the actual change of the network's "
                "squared test loss after retraining from the same initialisation without the point: holds if the 95 % "
                "bootstrap interval of Spearman's rho lies above 0 and the 95 % Wilson interval of the share of "
                "points whose predicted and actual changes have the same sign lies above 0.5; does not hold "
                "otherwise; not measurable if the network fails the gate. Fixed before its first run (D23)")


def control_outcome(r: RetrainRecord) -> Outcome:
    """The positive control's rule (`CONTROL_RULE`) on its retrain record."""
    cfg = r.config
    protocol = (f"{r.data.get('label', 'MNIST')}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, 2L-ReLU width "
                f"{cfg['width']}, protocol {cfg['protocol']} (up to {cfg['epochs']} steps), {cfg['preprocess']} "
                f"inputs, {cfg['n_remove']} points removed one at a time and the network retrained")
    n = len(r.points)
    sign = wilson(r.sign_agreement, n)
    rho = r.spearman
    numbers = {"spearman": rho, "pearson": r.pearson, "sign_agreement": r.sign_agreement, "sign_ci": list(sign),
               "n_points": n}
    ours = (f"Spearman {fmt(rho['value'])} [{fmt(rho['ci'][0])}, {fmt(rho['ci'][1])}], Pearson "
            f"{fmt(r.pearson['value'])} [{fmt(r.pearson['ci'][0])}, {fmt(r.pearson['ci'][1])}], signs agree "
            f"{100 * r.sign_agreement:.0f} % [{100 * sign[0]:.0f}, {100 * sign[1]:.0f}] of {n} points (train/test "
            f"acc {fmt(r.training['train_acc'])}/{fmt(r.training['test_acc'])})")
    if not r.training["gate"]["passed"]:
        return Outcome(f"not measurable: below the adequacy gate ({r.training['gate']['reason']}). {ours}", NA,
                       protocol, numbers, gate=GATE_TEXT)
    rho_ok, sign_ok = rho["ci"][0] > 0, sign[0] > 0.5
    tests = tests_of(rank_test("Spearman vs 0", rho, n, 0.0),
                     share_test("sign agreement vs 50 %", round(r.sign_agreement * n), n, 0.5, sign))
    return Outcome(ours, HOLDS if rho_ok and sign_ok else NOT, protocol, numbers, gate=GATE_TEXT,
                   condition=f"Spearman lower end {fmt(rho['ci'][0])} > 0: {'yes' if rho_ok else 'no'}; sign "
                             f"agreement lower end {100 * sign[0]:.0f} % > 50 %: {'yes' if sign_ok else 'no'}",
                   tests=tests)


VALIDITY_RULE = ("Influence validity (D23): the flip rates and rankings are NTK leave-one-out influence of the trained "
                 "network's kernel machine, the paper's method. A 'holds' stands only where that influence is "
                 "validated for the trained network in this claim's condition: the positive control "
                 "influence-control holds and influence-retrain holds under the same protocol and preprocessing (an "
                 "MNIST study; for CIFAR-10 rows the nearest check there is), or, for a flip-rate claim, the "
                 "retrain-based flip row flip-retrain-mnist holds in the same condition (D24). Otherwise 'holds' "
                 "becomes 'partly' "
                 "(holds for the kernel predictor; not validated for the trained network). If the positive control "
                 "does not hold, the instrument is broken and the claim is not measurable here. Other verdicts "
                 "stand: they judge the paper's own instrument.")


#: The flip-rate claims whose own data set and task have a retrain-based flip row besides MNIST 10 classes: the
#: validity rule reads that row where its units ran in the claim's condition, flip-retrain-mnist where they did not
#: (D25). Every other flip-rate claim reads flip-retrain-mnist.
OWN_FLIP_ROWS = {"flip-binary-mnist": ("mnist:binary", "flip-retrain-binary-mnist"),
                 "flip-cifar10": ("cifar10:10class", "flip-retrain-cifar10")}


def own_row_rule(claim_id: str) -> str:
    """The sentence the validity rule of flip-rate claim `claim_id` gains for its own data set's retrain-based flip
    row ('' for a claim without one)."""
    if claim_id not in OWN_FLIP_ROWS:
        return ""
    row = OWN_FLIP_ROWS[claim_id][1]
    return (f"For this claim the retrain-based flip row is {row}, its own data set's, where its units ran in the same "
            "condition (presets full and paper), and flip-retrain-mnist where they did not (D25).")


def influence_validity(results: Results, flip: bool = False, own: str | None = None) -> dict[str, Any]:
    """The checks `VALIDITY_RULE` reads, from `results` as one condition's claim sees them: the verdicts of the
    positive control, of the in-condition retrain check and (for a flip-rate claim, `flip`) of the retrain-based flip
    row, and whether the instrument counts as validated. `own`: the set (`DATASET:TASK`) of the claim's own
    retrain-based flip row, read instead of MNIST 10 classes' where its units are in `results` (then named under
    `flip_retrain_row`)."""
    control = results.get(units.INFLUENCE_CONTROL)
    c = control_outcome(control).verdict if isinstance(control, RetrainRecord) else NA
    regime = _retrain_claim()(results).verdict if all(isinstance(results.get(u), RetrainRecord)
                                                       for u in RETRAIN_UNITS) else NA
    out: dict[str, Any] = {"control": c.value, "in_condition": regime.value, "broken": c == NOT}
    by_retrain = False
    if flip:
        mine = retrain_flip_verdict(results, own) if own else None
        if mine is not None:
            out["flip_retrain_row"] = next(row for key, row in OWN_FLIP_ROWS.values() if key == own)
        out["flip_retrain"] = mine or retrain_flip_verdict(results) or NA.value
        by_retrain = out["flip_retrain"] == HOLDS.value
    return {**out, "validated": (c == HOLDS and regime == HOLDS) or by_retrain}


def validity_gated(out: Outcome, results: Results, flip: bool = False, own: str | None = None) -> Outcome:
    """`out` under `VALIDITY_RULE`: a 'holds' not validated becomes 'partly', any measured verdict becomes 'not
    measurable here' when the positive control fails; the checks go into its numbers and condition. `flip`: a
    flip-rate claim, which the retrain-based flip row can also validate (`own`: the set of its own data set's row,
    `influence_validity`)."""
    if out.verdict == NA:
        return out
    v = influence_validity(results, flip, own)
    row = f" {v['flip_retrain_row']}" if "flip_retrain_row" in v else ""
    retrain = f", retrain-based flip row{row} {v['flip_retrain']}" if flip else ""
    note = (f"influence validity: positive control {v['control']}, retrain check in this condition "
            f"{v['in_condition']}{retrain} -> {'validated' if v['validated'] else 'not validated'} for the trained "
            "network")
    numbers = {**out.numbers, "influence_validity": v}
    condition = f"{out.condition}; {note}" if out.condition else note
    if v["broken"]:
        return replace(out, verdict=NA, numbers=numbers, condition=condition,
                       ours=f"not measurable: the influence instrument failed its positive control. {out.ours}")
    if out.verdict == HOLDS and not v["validated"]:
        return replace(out, verdict=PARTLY, numbers=numbers, condition=condition, partly_as=PartlyAs.NOT_VALIDATED,
                       ours=f"holds for the kernel predictor; not validated for the trained network. {out.ours}")
    return replace(out, numbers=numbers, condition=condition)


def gated(claim: Claim) -> Claim:
    """`claim` judged under `VALIDITY_RULE`: its rule text extended, the retrain check of each condition (and, for a
    flip-rate claim, the retrain-based flip units of MNIST 10 classes, and those of its own data set as optional
    units, `OWN_FLIP_ROWS`) and the positive control added to its units."""
    flip = claim.id.startswith("flip-")
    checks = RETRAIN_UNITS + (FLIP_RETRAIN_UNITS if flip else ())
    own = OWN_FLIP_ROWS[claim.id][0] if flip and claim.id in OWN_FLIP_ROWS else None
    extra = own_row_rule(claim.id) if flip else ""

    def evaluate(results: Results) -> Outcome:
        return validity_gated(claim.evaluate(results), results, flip, own)

    return replace(claim, rule=f"{claim.rule} {VALIDITY_RULE}" + (f" {extra}" if extra else ""), evaluate=evaluate,
                   units=claim.units + tuple(u for u in checks if u not in claim.units),
                   fixed_units=claim.fixed_units + (units.INFLUENCE_CONTROL,),
                   optional_units=claim.optional_units + (set_units(own) if own else ()))


INFLUENCE_CLAIMS = [
    Claim("influence-retrain", "Method (Zhang & Zhang 2022)",
          "NTK leave-one-out influence with the trained network's kernel predicts what retraining without a point does",
          paper="used for every influence number, without a check against retraining", rule=RETRAIN_RULE,
          units=RETRAIN_UNITS, evaluate=_retrain_claim(), group="malleability",
          empirical=True),
    Claim("influence-control", "Method (positive control)",
          "In the lazy regime (gradient descent on the squared loss, unit-norm inputs) NTK leave-one-out influence "
          "predicts what retraining without a point does",
          paper="not in the paper: the check that the instrument works where its theory applies", rule=CONTROL_RULE,
          units=(units.INFLUENCE_CONTROL,), group="malleability",
          evaluate=lambda results: control_outcome(results[units.INFLUENCE_CONTROL])),
]
