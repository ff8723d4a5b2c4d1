"""Malleability claims: the flip-rate tables (10 classes and binary), the 6-9x ratio, adversarial
training, and the robustness of the ranking over eps. Verdict rules are fixed here, before any run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reports.text import fmt
from theory.paper import PAPER_ADV, PAPER_FLIP, PAPER_RATIO_V1, PAPER_RATIO_V2
from verify.claims import HOLDS, NA, NOT, PARTLY, Claim, Outcome, Results

ATTACKS = ("fgsm", "pgd", "mim")
LABEL = {"mnist": "MNIST", "cifar10": "CIFAR-10"}


def malleability_unit_configs(p: dict[str, Any], data_dir: str | None) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `MalleabilityConfig` for every malleability unit, sized by the preset."""
    base = {"width": p["mall_width"], "n_train": p["mall_n_train"], "n_test": p["mall_n_test"],
            "seeds": list(p["seeds"]), "attack_steps": p["attack_steps"], "train": {"epochs": p["epochs"]},
            "eps": 0.3, "tau": 0.1, "data_dir": data_dir}
    out: dict[str, dict[str, Any]] = {}
    for ds in ("mnist", "cifar10"):
        out[f"malleability:{ds}:10class"] = {**base, "dataset": ds, "task": "10class", "attacks": list(ATTACKS),
                                             "interventions": ["transformed", "curated", "adversarial"]}
        out[f"malleability:{ds}:binary"] = {**base, "dataset": ds, "task": "binary", "attacks": list(ATTACKS),
                                            "interventions": ["transformed"]}
        out[f"malleability-adv:{ds}"] = {**base, "dataset": ds, "task": "10class", "attacks": ["pgd"],
                                         "interventions": ["transformed"], "adv_train": True}
    out["malleability-eps:mnist"] = {**base, "dataset": "mnist", "task": "10class", "attacks": ["pgd"],
                                     "interventions": ["transformed"], "eps_sweep": [0.1, 0.2, 0.3, 0.5]}
    return out


def _rows(res: dict[str, Any], training: str = "standard", eps: float = 0.3) -> dict[tuple[str, str], dict]:
    return {(r["model"], r["attack"]): r for r in res["summary"]["rows"]
            if r["training"] == training and r["intervention"] == "transformed" and r["eps"] == eps}


def _protocol(res: dict[str, Any]) -> str:
    c = res["config"]
    return (f"{res['data'].get('label', c['dataset'])}, task {c['task']}, n_train={c['n_train']}, "
            f"n_test={c['n_test']}, width {c['width']}, Adam {c['train']['epochs']} epochs; top tau={c['tau']} "
            f"by |NTK-LOO influence| (empirical kernel, ridge_rel {c['ridge_rel']}), transformed by the attack "
            f"(eps {c['eps']}, {c['attack_steps']} steps), kernel and attention context recomputed; baseline: "
            f"random signs of the same eps")


def _pct(s: dict[str, Any]) -> str:
    return f"{100 * s['mean']:.1f}±{100 * s['std']:.1f}%"


FLIP_RULE = ("for each attack, paired by seed: holds if MLP-Attn's flip rate exceeds 2L-ReLU's in every seed for "
             "every attack, Attn's attacks beat its random-noise baseline, and both models' means are within a "
             "factor 2 of the paper's; partly if the ordering holds in every seed for every attack but the values "
             "or the baseline condition do not; does not hold otherwise")


def _flip_claim(ds: str, task: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        res = results[f"malleability:{ds}:{task}"]
        rows = _rows(res)
        paper = PAPER_FLIP[(ds, task)]
        ordered, within2, beyond = True, True, True
        parts = []
        for a in ATTACKS:
            ra, rr = rows[("attn", a)], rows[("relu", a)]
            ordered &= all(x > y for x, y in zip(ra["per_seed_flip_rate"], rr["per_seed_flip_rate"], strict=True))
            for model, r in (("attn", ra), ("relu", rr)):
                target = paper[model][a] / 100
                within2 &= target / 2 <= r["flip_rate"]["mean"] <= 2 * target
            beyond &= ra["flip_rate"]["mean"] > ra["baseline_flip_rate"]["mean"]
            parts.append(f"{a.upper()}: ReLU {_pct(rr['flip_rate'])}, Attn {_pct(ra['flip_rate'])}")
        base = (f"random-noise baseline ReLU {_pct(rows[('relu', 'pgd')]['baseline_flip_rate'])}, Attn "
                f"{_pct(rows[('attn', 'pgd')]['baseline_flip_rate'])}")
        rho = (f"Spearman rho (PGD) ReLU {fmt(rows[('relu', 'pgd')]['rho_all']['mean'])}, Attn "
               f"{fmt(rows[('attn', 'pgd')]['rho_all']['mean'])}")
        verdict = HOLDS if ordered and within2 and beyond else PARTLY if ordered else NOT
        return Outcome("; ".join(parts) + f"; {base}; {rho}", verdict, _protocol(res),
                       {"ordered_every_seed": ordered, "within_2x_of_paper": within2, "attn_beyond_baseline": beyond},
                       len(res["config"]["seeds"]))

    return evaluate


def _pooled_ratio(res: dict[str, Any]) -> tuple[float | None, bool, list[float]]:
    """Attn/ReLU ratio of flip rates pooled over the attacks, whether Attn is higher in every seed, per-seed."""
    rows = _rows(res)
    attn = np.mean([rows[("attn", a)]["per_seed_flip_rate"] for a in ATTACKS], axis=0)
    relu = np.mean([rows[("relu", a)]["per_seed_flip_rate"] for a in ATTACKS], axis=0)
    per_seed = [float(x / y) if y > 0 else float("inf") for x, y in zip(attn, relu, strict=True)]
    r = float(attn.mean() / relu.mean()) if relu.mean() > 0 else None
    return r, bool(np.all(attn > relu)), per_seed


RATIO_RULE = (f"Attn/ReLU flip-rate ratio pooled over FGSM/PGD/MIM, per data set (10 classes): holds if both "
              f"ratios lie in [{PAPER_RATIO_V1[0]:g}, {PAPER_RATIO_V1[1]:g}] with Attn higher in every seed; partly "
              f"if Attn is higher in every seed on both but a ratio is outside; does not hold otherwise. The v2 "
              f"range [{PAPER_RATIO_V2[0]:g}, {PAPER_RATIO_V2[1]:g}] is checked the same way and reported")


def _ratio_claim(results: Results) -> Outcome:
    parts, in_v1, in_v2, gap = [], True, True, True
    for ds in ("mnist", "cifar10"):
        r, every, per_seed = _pooled_ratio(results[f"malleability:{ds}:10class"])
        parts.append(f"{LABEL[ds]} {fmt(r) if r is not None else 'undefined'}x (per seed "
                     f"{', '.join(fmt(v) for v in per_seed)})")
        ok = r is not None and every
        gap &= ok
        in_v1 &= ok and PAPER_RATIO_V1[0] <= r <= PAPER_RATIO_V1[1]
        in_v2 &= ok and PAPER_RATIO_V2[0] <= r <= PAPER_RATIO_V2[1]
    verdict = HOLDS if in_v1 else PARTLY if gap else NOT
    v2 = "within" if in_v2 else "outside"
    seeds = len(results["malleability:mnist:10class"]["config"]["seeds"])
    return Outcome("; ".join(parts) + f"; v2 range 2-9x: {v2}", verdict,
                   "pooled flip rates of the two 10-class units (see the flip rows)",
                   {"in_v1_range": in_v1, "in_v2_range": in_v2}, seeds)


NO_GAP_RULE = ("pooled Attn/ReLU ratio: holds if in [0.67, 1.5] (no gap, as the paper reports); partly if in "
               "[0.5, 2]; does not hold otherwise")


def _no_gap_claim(results: Results) -> Outcome:
    res = results["malleability:cifar10:binary"]
    r, _, per_seed = _pooled_ratio(res)
    rows = _rows(res)
    parts = [f"{a.upper()}: ReLU {_pct(rows[('relu', a)]['flip_rate'])}, Attn {_pct(rows[('attn', a)]['flip_rate'])}"
             for a in ATTACKS]
    if r is None:
        return Outcome("; ".join(parts) + "; ratio undefined (ReLU flips nothing)", NA, _protocol(res))
    verdict = HOLDS if 0.67 <= r <= 1.5 else PARTLY if 0.5 <= r <= 2 else NOT
    return Outcome("; ".join(parts) + f"; pooled ratio {fmt(r)}x (per seed {', '.join(fmt(v) for v in per_seed)})",
                   verdict, _protocol(res), {"ratio": r}, len(res["config"]["seeds"]))


ADV_RULE = ("PGD flip rate after PGD adversarial training vs after standard training (same seeds): holds if it "
            "rises by more than the larger seed standard deviation; partly if it rises by less; does not hold if "
            "it does not rise")


def _adv_claim(ds: str, model: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        res = results[f"malleability-adv:{ds}"]
        std = _rows(res, "standard")[(model, "pgd")]["flip_rate"]
        adv = _rows(res, "adversarial")[(model, "pgd")]["flip_rate"]
        rise = adv["mean"] - std["mean"]
        verdict = HOLDS if rise > max(std["std"], adv["std"]) else PARTLY if rise > 0 else NOT
        return Outcome(f"{_pct(std)} -> {_pct(adv)}", verdict, _protocol(res) + "; adversarial training: PGD "
                       f"(eps {res['config']['eps']}, {res['config']['adv_steps']} steps) on every batch",
                       {"standard": std, "adversarial": adv}, len(res["config"]["seeds"]))

    return evaluate


EPS_RULE = ("PGD flip rate at eps in {0.1, 0.2, 0.3, 0.5}, MNIST: holds if MLP-Attn's exceeds 2L-ReLU's in every "
            "seed at every eps; partly if at some eps; does not hold if at none")


def _eps_claim(results: Results) -> Outcome:
    res = results["malleability-eps:mnist"]
    parts, wins = [], 0
    eps_values = sorted(res["eps_values"])
    for eps in eps_values:
        rows = _rows(res, eps=eps)
        ra, rr = rows[("attn", "pgd")], rows[("relu", "pgd")]
        ok = all(x > y for x, y in zip(ra["per_seed_flip_rate"], rr["per_seed_flip_rate"], strict=True))
        wins += ok
        parts.append(f"eps {eps:g}: ReLU {_pct(rr['flip_rate'])}, Attn {_pct(ra['flip_rate'])}{'' if ok else ' (x)'}")
    verdict = HOLDS if wins == len(eps_values) else PARTLY if wins else NOT
    return Outcome("; ".join(parts), verdict, _protocol(res), {"eps_with_attn_higher": wins},
                   len(res["config"]["seeds"]))


def _paper_flip_text(ds: str, task: str) -> str:
    p = PAPER_FLIP[(ds, task)]
    relu, attn = (" / ".join(f"{p[m][a]:g}" for a in ATTACKS) for m in ("relu", "attn"))
    return f"ReLU {relu} %, Attn {attn} % (FGSM / PGD / MIM)"


MALLEABILITY_CLAIMS = [
    *[Claim(f"flip-{ds}", "Table (flip rate, 10 classes)",
            f"{LABEL[ds]}: MLP-Attn's influence signs flip far more often than 2L-ReLU's under FGSM/PGD/MIM",
            paper=_paper_flip_text(ds, "10class"), rule=FLIP_RULE, units=(f"malleability:{ds}:10class",),
            evaluate=_flip_claim(ds, "10class"), group="malleability") for ds in ("mnist", "cifar10")],
    Claim("ratio-6-9x", "Abstract / headline", "Attention is 6-9x more malleable than 2L-ReLU",
          paper=f"ratios {PAPER_RATIO_V1[0]:g}-{PAPER_RATIO_V1[1]:g}x",
          v2=f"{PAPER_RATIO_V2[0]:g}-{PAPER_RATIO_V2[1]:g}x",
          rule=RATIO_RULE, units=("malleability:mnist:10class", "malleability:cifar10:10class"),
          evaluate=_ratio_claim, group="malleability"),
    Claim("flip-binary-mnist", "Table (flip rate, binary)", "MNIST 3-vs-8: MLP-Attn flips more often than 2L-ReLU",
          paper=_paper_flip_text("mnist", "binary"), rule=FLIP_RULE, units=("malleability:mnist:binary",),
          evaluate=_flip_claim("mnist", "binary"), group="malleability"),
    Claim("flip-binary-cifar10", "Table (flip rate, binary)",
          "CIFAR-10 automobile-vs-airplane: no gap between the models (about 1x; lower kappa)",
          paper=_paper_flip_text("cifar10", "binary"), rule=NO_GAP_RULE, units=("malleability:cifar10:binary",),
          evaluate=_no_gap_claim, group="malleability"),
    *[Claim(f"adv-{model}-{ds}", "Table (adversarial training)",
            f"{LABEL[ds]}, {'2L-ReLU' if model == 'relu' else 'MLP-Attn'}: adversarial training raises the PGD "
            "flip rate", paper=f"{PAPER_ADV[(ds, model)][0]:g} % -> {PAPER_ADV[(ds, model)][1]:g} %",
            rule=ADV_RULE, units=(f"malleability-adv:{ds}",), evaluate=_adv_claim(ds, model), group="malleability")
      for ds in ("mnist", "cifar10") for model in ("relu", "attn")],
    Claim("eps-robustness", "Sec. 5 (robustness)", "The ranking Attn > ReLU holds for eps in {0.1, 0.2, 0.3, 0.5}",
          paper="ranking holds at every eps", rule=EPS_RULE, units=("malleability-eps:mnist",),
          evaluate=_eps_claim, group="malleability"),
]
