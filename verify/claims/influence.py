"""Does the influence the malleability claims use predict what retraining does? (the method the paper takes
from Zhang & Zhang 2022: NTK leave-one-out with the trained network's empirical kernel, no retraining)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from empirics.influence import RetrainRecord
from empirics.protocols import GATE_TEXT
from empirics.vocab import PAPER_MODELS, model_name
from reports.text import fmt
from verify.claims import units
from verify.claims.base import HOLDS, NA, NOT, PARTLY, Claim, Outcome, Results
from verify.presets import PresetSizes

MODELS = PAPER_MODELS


def retrain_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, dict[str, Any]]:
    """`ProtocolRetrainConfig` keyword arguments (without the protocol) for each network, sized by the preset."""
    small = p["n_train"] <= 100
    return {units.influence_retrain(m): {"model": m, "dataset": "mnist", "task": "10class",
                                       "n_train": 40 if small else 100, "n_test": 40 if small else 100,
                                       "width": p["mall_width"], "n_remove": 6 if small else 12, "data_dir": data_dir}
            for m in MODELS}


RETRAIN_RULE = ("for each network, trained under the protocol on MNIST (10 classes), the predicted total influence "
                "of evenly spaced points against the actual change of the network's test loss after retraining from "
                "the same initialisation without the point; 95 % bootstrap interval of Spearman's rho over the "
                "removed points: holds if the interval lies above 0.5 for both networks; partly if it lies above 0 "
                "for both, or above 0.5 for one; does not hold otherwise; not measurable if a network fails the gate")


def _retrain_claim() -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        rs: dict[str, RetrainRecord] = {m: results[units.influence_retrain(m)] for m in MODELS}
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
        numbers = {m: {"spearman": r.spearman, "pearson": r.pearson, "sign_agreement": r.sign_agreement}
                   for m, r in rs.items()}
        if failed:
            return Outcome("not measurable: below the adequacy gate (" + "; ".join(failed) + "). " + "; ".join(parts),
                           NA, protocol, numbers, gate=GATE_TEXT)
        lows = [r.spearman["ci"][0] for r in rs.values()]
        verdict = HOLDS if min(lows) > 0.5 else PARTLY if min(lows) > 0 or max(lows) > 0.5 else NOT
        return Outcome("; ".join(parts), verdict, protocol, numbers, gate=GATE_TEXT,
                       condition=f"lower ends of the Spearman intervals {', '.join(fmt(v) for v in lows)} vs 0.5 and 0")

    return evaluate


INFLUENCE_CLAIMS = [
    Claim("influence-retrain", "Method (Zhang & Zhang 2022)",
          "NTK leave-one-out influence with the trained network's kernel predicts what retraining without a point does",
          paper="used for every influence number, without a check against retraining", rule=RETRAIN_RULE,
          units=tuple(units.influence_retrain(m) for m in MODELS), evaluate=_retrain_claim(), group="malleability",
          empirical=True),
]
