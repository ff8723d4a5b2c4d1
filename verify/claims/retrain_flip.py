"""Retrain-based flip rates (`empirics.retrain_flip`): does the attack flip what the trained network actually relies
on, measured by retraining, rather than what its kernel machine's leave-one-out formula says? The rule is fixed here
before the first run (D24)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from empirics.protocols import GATE_TEXT
from empirics.retrain_flip import RetrainFlipRecord
from empirics.vocab import PAPER_MODELS, model_name
from verify.claims import units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, Claim, Outcome, Results
from verify.presets import PresetSizes

MODELS = PAPER_MODELS
#: The retrain-based flip units, one per paper model (resolved per condition like every empirical unit).
FLIP_RETRAIN_UNITS = tuple(units.flip_retrain(m) for m in MODELS)


def flip_retrain_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, dict[str, Any]]:
    """`RetrainFlipConfig` keyword arguments (without the protocol) for each network: MNIST 10 classes, n = 100 (below
    the batch of 128, so the protocols train full-batch), the top 10 % by |influence|, PGD at eps 0.3, the preset's
    malleability width and its retrain seeds (`retrain_seeds`, 3 unless the preset says otherwise)."""
    small = p["n_train"] <= 100
    return {units.flip_retrain(m): {"model": m, "dataset": "mnist", "task": "10class", "n_train": 40 if small else 100,
                                    "n_test": 40 if small else 100, "width": p["mall_width"], "tau": 0.1, "eps": 0.3,
                                    "attack": "pgd", "attack_steps": p["attack_steps"],
                                    "seeds": list(range(p.get("retrain_seeds", 3))), "data_dir": data_dir}
            for m in MODELS}


FLIP_RETRAIN_RULE = (
    "for each network trained under the protocol on MNIST (10 classes): the top 10 % of the training points by "
    "|NTK influence| of a reference network (the paper's selection) are perturbed by PGD at eps 0.3 against it, "
    "and, as the baseline, by random signs of the same eps; each point's actual effect (the change of the summed "
    "test loss the network is trained with when the point is removed) is measured by retraining, in full and "
    "without the point, on the clean and on each perturbed training set, under every retrain seed; flip rate = "
    "share of the points whose mean effect changes sign by more than the seed noise (t quantile times the pooled "
    "seed-to-seed sd of the paired changes over sqrt(seeds)), with its 95 % Wilson interval; seed-to-seed rate = "
    "share of (point, pair of seeds) whose clean effects have opposite signs. Holds if MLP-Attn's attack flip rate "
    "has its lower end above both its random-noise flip rate and its seed-to-seed rate and above 2L-ReLU's attack "
    "flip rate; partly if it lies above its two baselines but not above 2L-ReLU's rate; does not hold if its upper "
    "end lies below the larger of its two baselines or below 2L-ReLU's rate; inconclusive otherwise; not "
    "measurable if any network (reference or retrained) fails the gate or no selected point of MLP-Attn has a "
    "clean effect beyond its seed noise. Fixed before its first run (D24)")


def _pct(ci: list[float]) -> str:
    return f"[{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"


def _network_text(r: RetrainFlipRecord) -> str:
    a, b = r.flips["attack"]["training"], r.flips["random"]["training"]
    s = r.seed_flips["training"]
    sq = r.flips["attack"]["squared"]
    return (f"{model_name(r.model)}: attack flips {a['n_flipped']}/{a['n_points']} = {100 * a['flip_rate']:.0f} % "
            f"{_pct(a['flip_ci'])}, random {100 * b['flip_rate']:.0f} % {_pct(b['flip_ci'])}, seed-to-seed "
            f"{100 * s['rate']:.0f} % {_pct(s['ci'])}; same-seed pairs {100 * a['pair_flip_rate']:.0f} % vs random "
            f"{100 * b['pair_flip_rate']:.0f} %; on the squared error {100 * sq['flip_rate']:.0f} %; NTK flip rate of "
            f"the same points {100 * r.ntk_flips['attack']['flip_rate']:.0f} % (random "
            f"{100 * r.ntk_flips['random']['flip_rate']:.0f} %); {r.resolved['training']}/{a['n_points']} clean "
            f"effects beyond seed noise (train/test acc {r.training['train_acc']:.2f}/{r.training['test_acc']:.2f})")


def _gate_failures(r: RetrainFlipRecord) -> str:
    """'' when the reference and every retrained network pass the gate; else how many failed and the first reason."""
    nets = [{"set": "reference", "seed": r.config["seeds"][0], "removed": None, **r.training["gate"]}, *r.gates]
    bad = [g for g in nets if not g["passed"]]
    if not bad:
        return ""
    g = bad[0]
    what = f"{g['set']} seed {g['seed']}" + (f" without point {g['removed']}" if g.get("removed") is not None else "")
    return f"{model_name(r.model)}: {len(bad)} of {len(nets)} networks, first {what}: {g['reason']}"


def flip_retrain_outcome(rs: dict[str, RetrainFlipRecord]) -> Outcome:
    """`FLIP_RETRAIN_RULE` on the two networks' records (keyed by model kind)."""
    cfg = rs["attn"].config
    protocol = (f"MNIST 10 classes, n_train={cfg['n_train']}, n_test={cfg['n_test']}, width {cfg['width']}, protocol "
                f"{cfg['protocol']} (up to {cfg['epochs']} epochs), {cfg['preprocess']} inputs, top {cfg['tau']:g} by "
                f"|influence| perturbed by {cfg['attack'].upper()} ({cfg['attack_steps']} steps, eps {cfg['eps']:g}); "
                f"{len(cfg['seeds'])} retrain seeds; effects on the test {rs['attn'].loss}")
    numbers = {m: {"flips": r.flips, "seed_flips": r.seed_flips, "ntk_flips": r.ntk_flips, "resolved": r.resolved}
               for m, r in rs.items()}
    ours = "; ".join(_network_text(r) for r in rs.values())
    failed = [_gate_failures(r) for r in rs.values()]
    if any(failed):
        return Outcome(f"not measurable: below the adequacy gate ({'; '.join(f for f in failed if f)}). {ours}", NA,
                       protocol, numbers, gate=GATE_TEXT)
    attn, relu = rs["attn"], rs["relu"]
    if attn.resolved["training"] == 0:
        return Outcome(f"not measurable: no selected point's clean effect lies beyond the seed noise. {ours}", NA,
                       protocol, numbers, gate=GATE_TEXT)
    a = attn.flips["attack"]["training"]
    baseline = max(attn.flips["random"]["training"]["flip_rate"], attn.seed_flips["training"]["rate"])
    relu_rate = relu.flips["attack"]["training"]["flip_rate"]
    lo, hi = a["flip_ci"]
    beats = lo > baseline
    if beats and lo > relu_rate:
        verdict = HOLDS
    elif beats:
        verdict = PARTLY
    elif hi < baseline or hi < relu_rate:
        verdict = NOT
    else:
        verdict = INCONCLUSIVE
    return Outcome(ours, verdict, protocol, numbers, gate=GATE_TEXT,
                   condition=f"MLP-Attn attack flip rate {_pct(a['flip_ci'])} vs its larger baseline "
                             f"{100 * baseline:.0f} % and 2L-ReLU's {100 * relu_rate:.0f} %")


def _evaluate() -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        return flip_retrain_outcome({m: results[u] for m, u in zip(MODELS, FLIP_RETRAIN_UNITS, strict=True)})

    return evaluate


def retrain_flip_verdict(results: Results) -> str | None:
    """The retrain-based flip row's verdict in one condition's results (None when its units did not run there)."""
    if not all(isinstance(results.get(u), RetrainFlipRecord) for u in FLIP_RETRAIN_UNITS):
        return None
    return _evaluate()(results).verdict.value


RETRAIN_FLIP_CLAIMS = [
    Claim("flip-retrain-mnist", "Method (retrain-based flip rate)",
          "A small adversarial perturbation of the most influential training points flips the sign of their actual "
          "effect on the retrained MLP-Attn network more often than noise and than for 2L-ReLU",
          paper="the paper's flip rates are NTK leave-one-out influence of a kernel machine; not measured by "
                "retraining", rule=FLIP_RETRAIN_RULE, units=FLIP_RETRAIN_UNITS, evaluate=_evaluate(),
          group="malleability", empirical=True),
]
