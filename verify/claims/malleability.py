"""Malleability claims: the flip-rate tables (10 classes and binary), the 6-9x ratio, adversarial
training, the robustness of the ranking over eps, curated removal, the adversarial intervention and the
Spearman rankings. Verdict rules are fixed here, before any run, and decide on 95 % intervals
(`empirics.experiments.mall_stats`), never on means alone.

Each rule is one function taking the unit's record; the claims registry and `verify malleability`
(`experiment_outcomes`) call the same functions. Every rule first applies the adequacy gate.

The rules compare the paper's pair (`empirics.vocab.PAPER_PAIR`: MLP-Attn, the treated, against 2L-ReLU, the
control); the flip rule takes any (treated, control) pair, so that a variant row judges (variant, relu) by the
same rule. The rules' texts and numbers name the two networks by their role, as the rule text does ('Attn' for the
treated, 'ReLU' for the control, whatever their kinds); only the gate's text names the failing networks by kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from empirics.experiments.mall_stats import METHOD, PAPER_PAIR, POOLED, SEED_METHOD, Pair, paper_ratio_range
from empirics.experiments.malleability import MalleabilityRecord
from empirics.intervals import ALPHA_TOST, TOST_METHOD, tost_ratio
from empirics.nets.protocols import GATE_TEXT
from empirics.vocab import DATASETS, PAPER_ATTACKS, dataset_label, model_name, model_short
from theory.paper import PAPER_ADV, PAPER_FLIP, PAPER_RATIO_V1, PAPER_RATIO_V2
from verify.claims import base as claim_base
from verify.claims import units
from verify.claims.base import (
    HOLDS,
    INCONCLUSIVE,
    NA,
    NOT,
    PARTLY,
    Claim,
    Outcome,
    PartlyAs,
    Results,
    Verdict,
    gated,
)
from verify.multiplicity import POWER_DRAWS, point_test, tests_of, tost_power
from verify.presets import PresetSizes, n_train_for

NO_GAP_BAND = (0.67, 1.5)
GATE_FIRST = "adequacy gate first (any network of the unit below it -> not measurable here). "
CI_NOTE = f"95 % intervals: {METHOD}; per-network scalars: {SEED_METHOD}"


def malleability_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `MalleabilityConfig` for every malleability unit, sized by the preset
    (the training config is added per protocol by `verify.experiments`)."""
    base = {"width": p["mall_width"], "n_test": p["mall_n_test"],
            "seeds": list(p["seeds"]), "attack_steps": p["attack_steps"], "eps": 0.3, "tau": 0.1,
            "data_dir": data_dir}
    adv_epochs = p.get("adv_max_epochs", 100)
    out: dict[str, dict[str, Any]] = {}
    for ds in DATASETS:
        base["n_train"] = n_train_for(p, ds, "mall_n_train")
        out[units.malleability(ds, "10class")] = {**base, "dataset": ds, "task": "10class",
                                                  "attacks": list(PAPER_ATTACKS),
                                                  "interventions": ["transformed", "curated", "adversarial"],
                                                  "seed_baseline": True}
        out[units.malleability(ds, "binary")] = {**base, "dataset": ds, "task": "binary",
                                                 "attacks": list(PAPER_ATTACKS), "interventions": ["transformed"]}
        out[units.malleability_adv(ds)] = {**base, "dataset": ds, "task": "10class", "attacks": ["pgd"],
                                         "interventions": ["transformed"], "adv_train": True,
                                         "adv_max_epochs": adv_epochs}
    out[units.malleability_eps("mnist")] = {**base, "n_train": n_train_for(p, "mnist", "mall_n_train"),
                                     "dataset": "mnist", "task": "10class", "attacks": ["pgd"],
                                     "interventions": ["transformed"], "eps_sweep": [0.1, 0.2, 0.3, 0.5]}
    return out


# ---- reading and printing intervals -------------------------------------------------------------

def _f(v: Any) -> float:
    """A number from a record as a float (None, a value that was never computed, as NaN)."""
    return float("nan") if v is None else float(v)


def above(ci: dict[str, Any], x: float = 0.0) -> bool:
    """The interval lies entirely above `x`."""
    return _f(ci["lo"]) > x


def below(ci: dict[str, Any], x: float = 0.0) -> bool:
    """The interval lies entirely below `x`."""
    return _f(ci["hi"]) < x


def overlaps(ci: dict[str, Any], lo: float, hi: float) -> bool:
    """The interval and [lo, hi] share a point."""
    return _f(ci["lo"]) <= hi and _f(ci["hi"]) >= lo


def inside(ci: dict[str, Any], lo: float, hi: float) -> bool:
    """The interval lies inside [lo, hi]."""
    return _f(ci["lo"]) >= lo and _f(ci["hi"]) <= hi


def _num(v: float, scale: float, digits: int) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v * scale:.{digits}f}"


def ci_txt(ci: dict[str, Any], scale: float = 100.0, unit: str = " pp", signed: bool = True, digits: int = 1) -> str:
    """'+14.0 pp [6.0, 22.0]' (the value, then the 95 % interval)."""
    v = _f(ci["value"])
    head = ("+" if signed and v > 0 else "") + _num(v, scale, digits)
    lo, hi = _f(ci["lo"]), _f(ci["hi"])
    return (f"{head}{unit if math.isfinite(v) else ''} {'(' if lo == float('-inf') else '['}{_num(lo, scale, digits)}, "
            f"{_num(hi, scale, digits)}{')' if hi == float('inf') else ']'}")


def pct_txt(ci: dict[str, Any]) -> str:
    return ci_txt(ci, unit=" %", signed=False)


def x_txt(ci: dict[str, Any]) -> str:
    return ci_txt(ci, scale=1.0, unit="x", signed=False, digits=2)


def rho_txt(ci: dict[str, Any], signed: bool = False) -> str:
    return ci_txt(ci, scale=1.0, unit="", signed=signed, digits=2)


def _protocol(res: MalleabilityRecord) -> str:
    c = res.config
    t = c["train"]
    wd = (f", weight decay {t['weight_decay']:g} ({t.get('decay', 'coupled')})" if t.get("weight_decay")
          else ", no weight decay")
    return (f"{res.data.get('label', c['dataset'])}, task {c['task']}, n_train={c['n_train']}, "
            f"n_test={c['n_test']}, width {c['width']}, {len(c['seeds'])} seeds (each its own data subset); "
            f"training protocol {t.get('protocol', 'custom')}: {t['optimizer']} lr {t['lr']:g}{wd}, "
            f"{'up to ' if t.get('plateau') else ''}{t['epochs']} epochs; top tau={c['tau']} by |NTK-LOO "
            f"influence| (empirical kernel, ridge_rel {c['ridge_rel']}), transformed by the attack (eps "
            f"{res.eps_values[0]:g}, {c['attack_steps']} steps); noise baseline: random signs of the same eps "
            f"on the same points; {CI_NOTE}")


def _gate_runs(res: MalleabilityRecord, model: str | None = None, training: str | None = "standard",
               names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The networks a rule reads, for the gate: those of `training` (None: every training) and `model`
    (None: both), adversarially trained ones labelled so, and the second initialisations of the seed
    baseline; each named by `names` (kind -> name; its kind where absent)."""
    out = []
    for r in res.runs:
        if (model is not None and r["model"] != model) or (training is not None and r["training"] != training):
            continue
        name = (names or {}).get(r["model"], r["model"])
        tag = "" if r["training"] == "standard" else f" ({r['training']}ly trained)"
        out.append({**r, "model": f"{name}{tag}"})
        sb = r.get("seed_baseline")
        if sb is not None:
            out.append({"model": f"{name} (second init)", "seed": r["seed"], "gate": sb.get("other_gate")})
    return out


def _gate(runs: list[dict[str, Any]], protocol: str) -> Outcome | None:
    return gated(runs, GATE_TEXT, protocol)


def _roles(pair: Pair) -> dict[str, str]:
    """Kind -> the kind of the paper's pair whose role it plays in a rule comparing `pair` (treated, control)."""
    return dict(zip(pair, PAPER_PAIR, strict=True))


def _names(pair: Pair) -> dict[str, str]:
    """Kind -> the name a rule's text gives it in `pair`: its role's ('Attn' for the treated, 'ReLU' for the
    control)."""
    return {m: model_short(role) for m, role in _roles(pair).items()}


def _opened(res: MalleabilityRecord, pair: Pair = PAPER_PAIR) -> tuple[str, Outcome | None]:
    """A single-record rule's protocol text and its gate outcome (None when every network passed): the text names
    the failing networks by kind, the numbers (`gate_failures`) by their role in `pair` (`_roles`), like the rule's
    other numbers."""
    protocol = _protocol(res)
    out = _gate(_gate_runs(res), protocol)
    if out is None:
        return protocol, None
    by_role = claim_base.gate_failures(_gate_runs(res, names=_roles(pair)))
    return protocol, replace(out, numbers={**out.numbers, "gate_failures": by_role})


@dataclass(frozen=True)
class Decision:
    """A rule's verdict with the condition that decided it, what a "partly" stands for and the deciding tests."""

    verdict: Verdict
    condition: str
    partly_as: PartlyAs | None = None
    tests: list[dict[str, Any]] | None = None


def _done(ours: str, decision: Decision, protocol: str, numbers: dict[str, Any], seeds: int | None) -> Outcome:
    """The rule's outcome behind the adequacy gate; `partly_as` is kept only for a "partly" verdict."""
    d = decision
    return Outcome(ours, d.verdict, protocol, numbers, seeds, GATE_TEXT, d.condition,
                   d.partly_as if d.verdict is PARTLY else None, tests=d.tests or [])


def _where(res: MalleabilityRecord, intervention: str = "transformed", eps: float | None = None,
           training: str = "standard") -> dict[str, Any]:
    return {"training": training, "intervention": intervention,
            "eps": res.eps_values[0] if eps is None else eps}


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def _needs_both(res: MalleabilityRecord, pair: Pair = PAPER_PAIR) -> str | None:
    treated, control = pair
    if not all(m in res.config["models"] for m in pair):
        return f"needs both models ({control} and {treated})"
    return None


def _seed_baseline_txt(res: MalleabilityRecord, pair: Pair = PAPER_PAIR) -> str:
    sb = res.summary.seed_baseline
    if not sb:
        return ""
    names = _names(pair)
    return "; seed-to-seed baseline (no perturbation, second initialisation) " + ", ".join(
        f"{names.get(b['model'], model_short(b['model']))} {pct_txt(b['flip_ci'])}" for b in sb)


def _per_attack_txt(res: MalleabilityRecord, where: dict[str, Any], attacks: list[str],
                    pair: Pair = PAPER_PAIR) -> str:
    parts = []
    for a in attacks:
        cells = []
        for m, name in _names(pair).items():
            r = res.summary.find("rows", **where, model=m, attack=a)
            cells.append(f"{name} {100 * _f(r['flip_ci']['value']):.1f} % (excess over noise "
                         f"{ci_txt(r['excess_ci'])})")
        parts.append(f"{a.upper()}: " + ", ".join(cells))
    return "; ".join(parts)


def _counts_txt(res: MalleabilityRecord, where: dict[str, Any], pair: Pair = PAPER_PAIR) -> str:
    p = res.summary.find("pooled", **where, model=pair[0])
    pts = sorted(set(p["n_points"])) if p else []
    return f"{p['n_seeds'] if p else 0} seeds x {'/'.join(str(n) for n in pts)} points"


# ---- shared judgements ----------------------------------------------------------------------------

def ratio_judgement(ci: dict[str, Any], paper: tuple[float, float] | None) -> tuple[Verdict, str]:
    """A ratio interval (Attn/ReLU) against 1 (no gap) and the paper's range: holds if above 1 and overlapping
    the range; partly (named: a gap, but not the paper's factor) if above 1 and outside it; inconclusive if it
    contains both 1 and a point of the range; does not hold otherwise (the factor excluded and no gap shown).
    Without a paper range: holds above 1, does not hold below, inconclusive across."""
    gap = above(ci, 1.0)
    hits = paper is None or overlaps(ci, *paper)
    if paper is None:
        return (HOLDS if gap else NOT if below(ci, 1.0) else INCONCLUSIVE), f"{x_txt(ci)} above 1: {_yes(gap)}"
    txt = f"{x_txt(ci)} above 1: {_yes(gap)}, overlaps {paper[0]:.1f}-{paper[1]:.1f}x: {_yes(hits)}"
    if gap:
        return (HOLDS, txt) if hits else (PARTLY, txt + " (a gap, but not the paper's factor)")
    return (INCONCLUSIVE, txt + " (contains both 1 and the paper's factor)") if hits else (NOT, txt)


def sign_judgement(ci: dict[str, Any], claimed_above: bool = True) -> Verdict:
    """An interval of a difference against 0 in the claimed direction: holds on the claimed side, does not hold
    on the other, inconclusive across 0."""
    yes, no = (above(ci), below(ci)) if claimed_above else (below(ci), above(ci))
    return HOLDS if yes else NOT if no else INCONCLUSIVE


COMBINE_RULE = ("Overall, from the per-data-set sub-verdicts (each shown in the row, a measured data set even when "
                "the other is not measurable): holds if both hold; does not hold if either does not hold and neither "
                "holds; partly if one holds and the other holds partly or does not hold, or both hold partly; not "
                "measurable here if either is not measurable (and neither does not hold); inconclusive otherwise")


def combine_datasets(sub: dict[str, Verdict]) -> Verdict:
    """`COMBINE_RULE` on the per-data-set sub-verdicts."""
    vs = list(sub.values())
    if all(v is HOLDS for v in vs):
        return HOLDS
    if NOT in vs and HOLDS not in vs:
        return NOT
    if (HOLDS in vs and all(v in (HOLDS, PARTLY, NOT) for v in vs)) or all(v is PARTLY for v in vs):
        return PARTLY
    return NA if NA in vs else INCONCLUSIVE


def combined_partly_as(sub: dict[str, Verdict], each: PartlyAs = PartlyAs.NOISE) -> PartlyAs:
    """What a combined "partly" stands for: the data sets disagree, or each holds partly (`each`, the per-data-set
    partial condition)."""
    return each if all(v is PARTLY for v in sub.values()) else PartlyAs.DATASETS_DISAGREE


# ---- flip rate: Attn more malleable (10 classes, binary MNIST) ------------------------------------

FLIP_RULE = (GATE_FIRST + "Transformed intervention at eps 0.3, standard training, pooled over FGSM/PGD/MIM. Judged "
             "on the paper's quantity, the ratio of RAW flip rates Attn/ReLU, with Fieller's 95 % interval from the "
             "per-seed rates, against 1 and the paper's range (min-max over the attacks of the paper's table), beside "
             "the same ratio for random-sign noise of the same eps on the same points (the noise ratio, Fieller): a "
             "network that flips more under any perturbation is not more malleable to attacks. Holds if the interval "
             "lies above 1, overlaps the paper's range, Attn's excess over noise (attack minus random-sign flips) has "
             "its interval above 0, and the attack-over-noise gap (the difference of excesses, Attn - ReLU, paired by "
             "seed) has its interval above 0; partly (factor excluded) if the interval lies above 1 but entirely "
             "outside the paper's range; partly (not beyond noise) if only an excess condition fails (Attn flips "
             "more, but not by more than noise makes it); inconclusive if the interval contains both 1 and a point of "
             "the paper's range; does not hold otherwise (the paper's factor excluded and no gap shown). The ratio of "
             "excesses over noise (Fieller) is reported beside it, not judged. " + CI_NOTE)


def flip_outcome(res: MalleabilityRecord, ds: str, task: str, pair: Pair = PAPER_PAIR) -> Outcome:
    """The flip rule (`FLIP_RULE`) on one malleability record whose summary compares `pair` (treated, control;
    `empirics.experiments.mall_stats.summarise`), against the paper's range for `ds` and `task`, the kernel predictors'
    test accuracy beside it. The treated network is the rule's 'Attn', the control its 'ReLU'."""
    return claim_base.with_kernel_predictor(_flip(res, ds, task, pair), _gate_runs(res), _names(pair))


def _flip(res: MalleabilityRecord, ds: str, task: str, pair: Pair) -> Outcome:
    protocol, na = _opened(res, pair)
    if na:
        return na
    why = _needs_both(res, pair)
    where = _where(res)
    cmp_ = res.summary.find("comparisons", **where, attack=POOLED)
    if why or cmp_ is None:
        return _done("-", Decision(NA, why or "needs the transformed intervention"), protocol, {}, None)
    pa, pr = (res.summary.find("pooled", **where, model=m) for m in pair)
    paper = paper_ratio_range(ds, task)
    raw, diff, ea, rx = cmp_["ratio_ci"], cmp_["excess_diff_ci"], pa["excess_ci"], cmp_["ratio_excess_ci"]
    noise = cmp_.get("noise_ratio_ci")
    verdict, ratio_cond = ratio_judgement(raw, paper)
    partly_as = PartlyAs.FACTOR_EXCLUDED
    beyond, gap = above(ea), above(diff)
    if verdict is HOLDS and not (beyond and gap):
        verdict, partly_as = PARTLY, PartlyAs.NOISE
    paper_txt = f"paper {paper[0]:.1f}-{paper[1]:.1f}x" if paper else "no paper value"
    attacks = list(res.config["attacks"])
    ours = (f"pooled over {'/'.join(a.upper() for a in attacks)}: Attn {pct_txt(pa['flip_ci'])}, ReLU "
            f"{pct_txt(pr['flip_ci'])}; ratio of flip rates {x_txt(raw)} ({paper_txt}); noise ratio (random signs, "
            f"same eps) {x_txt(noise) if noise else 'not recorded'}; secondary: ratio of "
            f"excesses over noise {x_txt(rx)}, excess Attn {ci_txt(ea)}, ReLU {ci_txt(pr['excess_ci'])}, difference "
            f"of excesses {ci_txt(diff)}; {_per_attack_txt(res, where, attacks, pair)}; noise flips Attn "
            f"{pct_txt(pa['baseline_ci'])}, ReLU {pct_txt(pr['baseline_ci'])}{_seed_baseline_txt(res, pair)}; "
            f"Spearman rho_all Attn {rho_txt(pa['rho_all_ci'])}, ReLU {rho_txt(pr['rho_all_ci'])}; "
            f"{_counts_txt(res, where, pair)}")
    condition = (f"ratio of flip rates {ratio_cond}; Attn excess {ci_txt(ea)} above 0: {_yes(beyond)}; "
                 f"attack-over-noise gap {ci_txt(diff)} above 0: {_yes(gap)}"
                 + (" (Attn flips more, but not by more than noise makes it)" if partly_as is PartlyAs.NOISE
                    and verdict is PARTLY else ""))
    numbers = {"ratio_ci": raw, "ratio_excess_ci": rx, "excess_diff_ci": diff, "attn_excess_ci": ea,
               "relu_excess_ci": pr["excess_ci"], "attn_flip_ci": pa["flip_ci"], "relu_flip_ci": pr["flip_ci"],
               "noise_ratio_ci": noise, "attn_beyond_noise": beyond, "gap_beyond_noise": gap,
               "ratio_above_one": above(raw, 1.0),
               "ratio_overlaps_paper": paper is None or overlaps(raw, *paper), "paper_range": paper}
    decision = Decision(verdict, condition, partly_as,
                        tests_of(point_test("ratio of flip rates vs 1", raw, 1.0),
                                 point_test("Attn excess over noise", ea, 0.0),
                                 point_test("attack-over-noise gap", diff, 0.0)))
    return _done(ours, decision, protocol, numbers, pa["n_seeds"])


def _flip_claim(ds: str, task: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        return flip_outcome(results[units.malleability(ds, task)], ds, task)

    return evaluate


# ---- the headline ratio ---------------------------------------------------------------------------

RATIO_RULE = (GATE_FIRST + "Ratio of RAW flip rates Attn/ReLU (the paper's quantity), pooled over FGSM/PGD/MIM (10 "
              "classes, transformed, eps 0.3), Fieller's 95 % interval from the per-seed rates, per data set. The "
              "claim is the factor, so it is judged on the factor: holds if the interval lies above 1 and overlaps "
              f"[{PAPER_RATIO_V1[0]:g}, {PAPER_RATIO_V1[1]:g}]; inconclusive if it overlaps that range but does not "
              "lie above 1; does not hold if it excludes the range (a gap of another size, where the interval lies "
              "above 1, is named in the row, not credited). The v2 range "
              f"[{PAPER_RATIO_V2[0]:g}, {PAPER_RATIO_V2[1]:g}] is judged the same way beside it; the noise ratio "
              "(random signs of the same eps, Fieller) and the ratio of excesses over noise are reported beside it. "
              + COMBINE_RULE + ". " + CI_NOTE)


def factor_judgement(ci: dict[str, Any], paper: tuple[float, float]) -> tuple[Verdict, str]:
    """A ratio interval against the paper's factor (`RATIO_RULE`): holds above 1 and overlapping the range,
    inconclusive overlapping it but not above 1, does not hold where the range is excluded."""
    gap, hits = above(ci, 1.0), overlaps(ci, *paper)
    txt = f"{x_txt(ci)} above 1: {_yes(gap)}, overlaps {paper[0]:g}-{paper[1]:g}x: {_yes(hits)}"
    if hits:
        return (HOLDS, txt) if gap else (INCONCLUSIVE, txt)
    return NOT, txt + (" (a gap, but the paper's factor excluded)" if gap else " (the paper's factor excluded)")


def _gated_datasets(results: Results) -> tuple[dict[str, MalleabilityRecord], str, dict[str, Outcome]]:
    """The two 10-class records, the protocol text, and per data set the gate's outcome where it failed."""
    recs = {ds: results[units.malleability(ds, "10class")] for ds in DATASETS}
    protocol = "the two 10-class units (see the flip rows), each gated on its own: " + _protocol(recs["mnist"])
    gates = {ds: o for ds, res in recs.items() if (o := _gate(_gate_runs(res), _protocol(res))) is not None}
    return recs, protocol, gates


def _sub_text(ds: str, v: Verdict, text: str) -> str:
    return f"{dataset_label(ds)} [{v.value}]: {text}"


def ratio_outcome(results: Results) -> Outcome:
    """The ratio rule (`RATIO_RULE`) on the two 10-class records, a sub-verdict per data set."""
    recs, protocol, gates = _gated_datasets(results)
    sub: dict[str, Verdict] = {}
    parts, conds, numbers = [], [], {}
    tests: list[dict[str, Any] | None] = []
    for ds, res in recs.items():
        c = res.summary.find("comparisons", **_where(res), attack=POOLED)
        if ds in gates or c is None:
            sub[ds] = NA
            why = gates[ds].ours if ds in gates else "needs both models, transformed intervention"
            parts.append(_sub_text(ds, NA, why))
            continue
        v1, cond = factor_judgement(c["ratio_ci"], PAPER_RATIO_V1)
        near = PAPER_RATIO_V1[0] if c["ratio_ci"]["hi"] < PAPER_RATIO_V1[0] else (
            PAPER_RATIO_V1[1] if c["ratio_ci"]["lo"] > PAPER_RATIO_V1[1] else 1.0)
        tests.append(point_test(f"{dataset_label(ds)} ratio vs {near:g}", c["ratio_ci"], near))
        v2, _ = factor_judgement(c["ratio_ci"], PAPER_RATIO_V2)
        noise = c.get("noise_ratio_ci")
        sub[ds] = v1
        numbers[ds] = {"ratio_ci": c["ratio_ci"], "ratio_excess_ci": c["ratio_excess_ci"], "noise_ratio_ci": noise,
                       "verdict": v1.value, "v2_verdict": v2.value}
        parts.append(_sub_text(ds, v1, f"ratio of flip rates {x_txt(c['ratio_ci'])} (noise ratio "
                                       f"{x_txt(noise) if noise else 'not recorded'}, ratio of excesses "
                                       f"{x_txt(c['ratio_excess_ci'])}); against the v2 range {PAPER_RATIO_V2[0]:g}-"
                                       f"{PAPER_RATIO_V2[1]:g}x: {v2.value}"))
        conds.append(f"{dataset_label(ds)} {cond}")
    verdict = combine_datasets(sub)
    numbers["sub_verdicts"] = {ds: v.value for ds, v in sub.items()}
    decision = Decision(verdict, "; ".join(conds) + f"; combined: {verdict.value}", combined_partly_as(sub),
                        tests_of(*tests))
    return _done("; ".join(parts), decision, protocol, numbers, len(recs["mnist"].config["seeds"]))


# ---- no gap (binary CIFAR-10) ---------------------------------------------------------------------

NO_GAP_RULE = (GATE_FIRST + "Ratio of RAW flip rates Attn/ReLU pooled over FGSM/PGD/MIM (transformed, eps 0.3), an "
               f"equivalence test with the margin [{NO_GAP_BAND[0]:g}, {NO_GAP_BAND[1]:g}] (fixed with the rule): "
               f"holds if both one-sided tests ({TOST_METHOD}) reject, i.e. the ratio is "
               "shown to lie inside the margin (no gap, as the paper reports); does not hold if the 95 % Fieller "
               "interval lies entirely outside the margin (a gap); inconclusive otherwise. The ratio of excesses over "
               "noise is reported beside it, and the equivalence test's power at the observed spread (were the true "
               "ratio 1). " + CI_NOTE)


def no_gap_outcome(res: MalleabilityRecord) -> Outcome:
    """The no-gap rule (`NO_GAP_RULE`) on one malleability record, the kernel predictors' test accuracy beside it."""
    return claim_base.with_kernel_predictor(_no_gap(res), _gate_runs(res))


def _no_gap(res: MalleabilityRecord) -> Outcome:
    protocol, na = _opened(res)
    if na:
        return na
    where = _where(res)
    c = res.summary.find("comparisons", **where, attack=POOLED)
    if _needs_both(res) or c is None:
        return _done("-", Decision(NA, "needs both models and the transformed intervention"), protocol, {}, None)
    raw, rx = c["ratio_ci"], c["ratio_excess_ci"]
    lo, hi = NO_GAP_BAND
    tost = tost_ratio(raw["per_seed_num"], raw["per_seed_den"], lo, hi)
    tost = {**tost, "power_at_observed_spread": tost_power(raw["per_seed_num"], raw["per_seed_den"], (lo, hi)),
            "power_method": f"{POWER_DRAWS} simulated runs of as many seeds, true ratio 1, the observed covariance"}
    outside = below(raw, lo) or above(raw, hi)
    verdict = HOLDS if tost["equivalent"] else NOT if outside else INCONCLUSIVE
    pa, pr = (res.summary.find("pooled", **where, model=m) for m in PAPER_PAIR)
    ours = (f"ratio of flip rates {x_txt(raw)} (TOST p = {tost['p']:.3g} for [{lo:g}, {hi:g}]); Attn "
            f"{pct_txt(pa['flip_ci'])}, ReLU {pct_txt(pr['flip_ci'])}; secondary: ratio of excesses {x_txt(rx)}, "
            f"pooled excess over noise Attn {ci_txt(pa['excess_ci'])}, ReLU {ci_txt(pr['excess_ci'])}; "
            f"{_per_attack_txt(res, where, list(res.config['attacks']))}; {_counts_txt(res, where)}")
    condition = (f"TOST for a ratio inside [{lo:g}, {hi:g}]: p = {tost['p']:.3g} (< {ALPHA_TOST:g}: "
                 f"{_yes(tost['equivalent'])}; its power at the observed spread, were the true ratio 1: "
                 f"{tost['power_at_observed_spread']:.2f}); Fieller interval {x_txt(raw)} entirely outside: "
                 f"{_yes(outside)}")
    decision = Decision(verdict, condition, tests=[{"name": f"TOST inside [{lo:g}, {hi:g}]", "point": None,
                                                    "p": tost["p"], "rejected": bool(tost["equivalent"])},
                                                   *tests_of(point_test("ratio vs the nearer end of the margin", raw,
                                                                        hi if raw["value"] > hi else lo))])
    return _done(ours, decision, protocol, {"ratio_ci": raw, "ratio_excess_ci": rx, "tost": tost}, pa["n_seeds"])


# ---- adversarial training -------------------------------------------------------------------------

ADV_RULE = (GATE_FIRST.replace("of the unit", "of this model (standard and adversarially trained)")
            + "PGD flip rate (transformed, eps 0.3) after PGD adversarial training minus after standard training, "
            "paired by seed (95 % t interval): holds if the interval of the rise lies above 0 and so does the "
            "interval of the rise of the excess over noise; partly, by name, if only the rise of the flip rate lies "
            "above 0 ('the rise is no more than noise's'); does not hold if the interval of the rise lies below 0; "
            "inconclusive if it contains 0. " + CI_NOTE)


def adv_outcome(res: MalleabilityRecord, model: str) -> Outcome:
    """The adversarial-training rule (`ADV_RULE`) for one model of an `adv_train` record, the kernel predictors'
    test accuracy of its standard and adversarially trained networks beside it."""
    return claim_base.with_kernel_predictor(_adv(res, model), [r for r in res.runs if r["model"] == model])


def _adv(res: MalleabilityRecord, model: str) -> Outcome:
    c = res.config
    protocol = (_protocol(res) + f"; adversarial training: PGD (eps {c['eps']}, {c['adv_steps']} steps) on every "
                f"batch, at most {c.get('adv_max_epochs') or c['train']['epochs']} epochs")
    na = _gate(_gate_runs(res, model, training=None), protocol)
    if na:
        return na
    row = res.summary.find("adv_train", model=model, attack="pgd")
    if row is None:
        return _done("-", Decision(NA, "needs adversarial training and the PGD attack"), protocol, {}, None)
    rise, rx = row["rise_ci"], row["rise_excess_ci"]
    verdict = (HOLDS if above(rx) else PARTLY) if above(rise) else NOT if below(rise) else INCONCLUSIVE
    ours = (f"PGD flip rate {pct_txt(row['standard_ci'])} -> {pct_txt(row['adversarial_ci'])}, rise "
            f"{ci_txt(rise)}; excess over noise {ci_txt(row['standard_excess_ci'])} -> "
            f"{ci_txt(row['adversarial_excess_ci'])}, rise {ci_txt(rx)}; {row['n_seeds']} seeds")
    condition = (f"rise {ci_txt(rise)} above 0: {_yes(above(rise))}, below 0: {_yes(below(rise))}; rise of the "
                 f"excess {ci_txt(rx)} above 0: {_yes(above(rx))}")
    decision = Decision(verdict, condition, PartlyAs.NOISE,
                        tests_of(point_test("rise of the flip rate", rise, 0.0),
                                 point_test("rise of the excess over noise", rx, 0.0)))
    return _done(ours, decision, protocol, {"rise_ci": rise, "rise_excess_ci": rx}, row["n_seeds"])


def _adv_claim(ds: str, model: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        return adv_outcome(results[units.malleability_adv(ds)], model)

    return evaluate


# ---- eps robustness -------------------------------------------------------------------------------

EPS_RULE = (GATE_FIRST + "At each eps of the sweep {0.1, 0.2, 0.3, 0.5} (MNIST, transformed, the attacks run: "
            "PGD in the claims unit), the 95 % t interval of (Attn excess over noise - ReLU excess over noise), "
            "paired by seed: holds if it lies above 0 at every eps; does not hold if it lies below 0 at some eps (the "
            "ranking reverses); partly, by name, if it lies above 0 at some eps and contains 0 at the others ('the "
            "ranking shown at some eps only'); inconclusive if it contains 0 at every eps. " + CI_NOTE)


def eps_outcome(res: MalleabilityRecord) -> Outcome:
    """The eps rule (`EPS_RULE`) on a record with an eps sweep."""
    protocol, na = _opened(res)
    if na:
        return na
    parts, wins, losses, cis = [], 0, 0, {}
    eps_values = sorted(res.eps_values)
    for eps in eps_values:
        c = res.summary.find("comparisons", **_where(res, eps=eps), attack=POOLED)
        if c is None:
            return _done("-", Decision(NA, "needs both models and the transformed intervention"), protocol, {}, None)
        ok = above(c["excess_diff_ci"])
        wins += ok
        losses += below(c["excess_diff_ci"])
        cis[str(eps)] = c["excess_diff_ci"]
        parts.append(f"eps {eps:g}: Attn - ReLU excess {ci_txt(c['excess_diff_ci'])}{'' if ok else ' (x)'}")
    verdict = (NOT if losses else HOLDS if wins == len(eps_values) else PARTLY if wins else INCONCLUSIVE)
    decision = Decision(verdict, f"difference interval above 0 at {wins} of {len(eps_values)} eps, below 0 "
                        f"at {losses}", PartlyAs.SOME_EPS,
                        tests_of(*(point_test(f"eps {e} excess difference", ci, 0.0) for e, ci in cis.items())))
    return _done("; ".join(parts), decision, protocol,
                 {"excess_diff_ci": cis, "eps_with_attn_higher": wins, "eps_with_attn_lower": losses},
                 len(res.config["seeds"]))


# ---- new rows: curated removal, adversarial intervention, Spearman rankings -----------------------

#: What a per-data-set judge returns: (its sub-verdict, numbers, text), or why it cannot judge.
Judged = tuple[Verdict, dict[str, Any], str] | str


def _two_datasets(results: Results, what: str, judge: Callable[[str, MalleabilityRecord], Judged]) -> Outcome:
    """A rule judged per data set on the two 10-class records (each gated on its own), combined by
    `COMBINE_RULE`; a measured data set keeps its sub-verdict when the other is not measurable."""
    recs, protocol, gates = _gated_datasets(results)
    protocol = protocol.replace("the two 10-class units", f"the two 10-class units, {what}", 1)
    sub: dict[str, Verdict] = {}
    parts, numbers = [], {}
    tests: list[dict[str, Any] | None] = []
    for ds, res in recs.items():
        got = gates[ds].ours if ds in gates else judge(ds, res)
        if isinstance(got, str):
            sub[ds] = NA
            parts.append(_sub_text(ds, NA, got))
            continue
        sub[ds] = got[0]
        numbers[ds] = {**got[1], "verdict": got[0].value}
        tests += [point_test(f"{dataset_label(ds)} {k.removesuffix('_ci').replace('_', ' ')}", ci, 0.0)
                  for k, ci in got[1].items() if k.endswith("_ci") and isinstance(ci, dict)]
        parts.append(_sub_text(ds, got[0], got[2]))
    verdict = combine_datasets(sub)
    numbers["sub_verdicts"] = {ds: v.value for ds, v in sub.items()}
    decision = Decision(verdict, ", ".join(f"{dataset_label(ds)} {v.value}" for ds, v in sub.items())
                        + f"; combined: {verdict.value}", combined_partly_as(sub), tests_of(*tests))
    return _done("; ".join(parts), decision, protocol, numbers, len(recs["mnist"].config["seeds"]))


CURATED_RULE = (GATE_FIRST + "Curated intervention, 10 classes, each data set and model: |change of the kernel "
                "predictor's test loss| after removing the top-tau points minus after removing as many random "
                "points, paired by seed (95 % t interval over seeds). Per data set: holds if the interval lies above "
                "0 for both models; partly, by name, if for one model only ('one model'); does not hold if for "
                "neither and it lies below 0 for at least one; inconclusive otherwise. " + COMBINE_RULE + ". "
                + CI_NOTE)


def _curated_judge(ds: str, res: MalleabilityRecord) -> Judged:
    ups, downs, parts, numbers = [], [], [], {}
    for m in PAPER_PAIR:
        d = res.summary.find("curated_diff", training="standard", model=m)
        top = res.summary.find("curated", training="standard", model=m, removal="top")
        rnd = res.summary.find("curated", training="standard", model=m, removal="random")
        if d is None or top is None or rnd is None:
            return f"needs the curated intervention for {m}"
        ci = d["abs_test_loss_change_diff_ci"]
        ups.append(above(ci))
        downs.append(below(ci))
        numbers[m] = ci
        parts.append(f"{model_short(m)}: test-loss change top {rho_txt(top['test_loss_change_ci'], True)} vs random "
                     f"{rho_txt(rnd['test_loss_change_ci'], True)}, |top| - |random| {rho_txt(ci, True)}; "
                     f"rho_remaining top {rho_txt(top['rho_remaining_ci'])} vs random "
                     f"{rho_txt(rnd['rho_remaining_ci'])}")
    verdict = (HOLDS if all(ups) else PARTLY if any(ups) else NOT if any(downs) else INCONCLUSIVE)
    return verdict, numbers, ", ".join(parts)


def curated_outcome(results: Results) -> Outcome:
    """The curated-removal rule (`CURATED_RULE`) on the two 10-class records."""
    return _two_datasets(results, "curated intervention", _curated_judge)


ADV_INT_RULE = (GATE_FIRST + "Adversarial intervention (PGD at eps 0.3 on all training points; flips counted on "
                "the clean top-tau set; noise: random signs on all points), 10 classes. Per data set, the 95 % t "
                "interval of (Attn excess over noise - ReLU excess), paired by seed: holds if it lies above 0 and "
                "Attn's excess interval lies above 0; partly, by name, if only the difference lies above 0 ('Attn's "
                "attack does not beat noise'); does not hold if the difference lies below 0; inconclusive if it "
                "contains 0. " + COMBINE_RULE + ". " + CI_NOTE)


def _adv_int_judge(ds: str, res: MalleabilityRecord) -> Judged:
    where = _where(res, "adversarial")
    c = res.summary.find("comparisons", **where, attack="pgd")
    ra, rr = (res.summary.find("rows", **where, model=m, attack="pgd") for m in PAPER_PAIR)
    if c is None or ra is None or rr is None:
        return "needs both models and the adversarial intervention with PGD"
    verdict = sign_judgement(c["excess_diff_ci"])
    if verdict is HOLDS and not above(ra["excess_ci"]):
        verdict = PARTLY
    text = (f"PGD: Attn {100 * _f(ra['flip_ci']['value']):.1f} % (excess over noise {ci_txt(ra['excess_ci'])}), "
            f"ReLU {100 * _f(rr['flip_ci']['value']):.1f} % (excess over noise {ci_txt(rr['excess_ci'])}), "
            f"difference {ci_txt(c['excess_diff_ci'])}")
    return verdict, {"excess_diff_ci": c["excess_diff_ci"], "attn_excess_ci": ra["excess_ci"],
                     "relu_excess_ci": rr["excess_ci"]}, text


def adversarial_intervention_outcome(results: Results) -> Outcome:
    """The adversarial-intervention rule (`ADV_INT_RULE`) on the two 10-class records."""
    return _two_datasets(results, "adversarial intervention", _adv_int_judge)


SPEARMAN_RULE = (GATE_FIRST + "Spearman rho_all between clean and attacked influence over all training points, "
                 "averaged over FGSM/PGD/MIM per network (10 classes, transformed, eps 0.3). Per data set, the 95 % t "
                 "interval over seeds of (Attn rho - ReLU rho), paired by seed: holds if it lies below 0 and Attn's "
                 "drop below its noise rho (noise rho - attack rho) has an interval above 0; partly, by name, if only "
                 "the difference lies below 0 ('Attn's drop is no more than noise's'); does not hold if the difference "
                 "lies above 0; inconclusive if it contains 0. " + COMBINE_RULE + ". " + CI_NOTE)


def _spearman_judge(ds: str, res: MalleabilityRecord) -> Judged:
    where = _where(res)
    c = res.summary.find("comparisons", **where, attack=POOLED)
    pa, pr = (res.summary.find("pooled", **where, model=m) for m in PAPER_PAIR)
    if c is None or pa is None or pr is None:
        return "needs both models and the transformed intervention"
    verdict = sign_judgement(c["rho_all_diff_ci"], claimed_above=False)
    if verdict is HOLDS and not above(pa["rho_drop_ci"]):
        verdict = PARTLY
    text = (f"rho_all Attn {rho_txt(pa['rho_all_ci'])} (noise {rho_txt(pa['baseline_rho_all_ci'])}, drop beyond "
            f"noise {rho_txt(pa['rho_drop_ci'], True)}), ReLU {rho_txt(pr['rho_all_ci'])} (noise "
            f"{rho_txt(pr['baseline_rho_all_ci'])}); Attn - ReLU {rho_txt(c['rho_all_diff_ci'], True)}")
    return verdict, {"rho_all_diff_ci": c["rho_all_diff_ci"], "attn_rho_drop_ci": pa["rho_drop_ci"]}, text


def spearman_outcome(results: Results) -> Outcome:
    """The Spearman-rankings rule (`SPEARMAN_RULE`) on the two 10-class records."""
    return _two_datasets(results, "transformed intervention", _spearman_judge)


# ---- the single-experiment command ----------------------------------------------------------------

def experiment_outcomes(result: MalleabilityRecord) -> list[tuple[str, Outcome]]:
    """The rules that apply to one `verify malleability` record, by name: the flip rule (the no-gap rule
    for binary CIFAR-10), adversarial training per model, and the eps rule when eps was swept."""
    c = result.config
    out: list[tuple[str, Outcome]] = []
    if "transformed" in c["interventions"]:
        if (c["dataset"], c["task"]) == ("cifar10", "binary"):
            out.append(("no gap", no_gap_outcome(result)))
        else:
            out.append(("Attn more malleable", flip_outcome(result, c["dataset"], c["task"])))
        if len(result.eps_values) > 1:
            out.append(("ranking over eps", eps_outcome(result)))
    if c.get("adv_train") and "pgd" in c["attacks"]:
        for m in c["models"]:
            out.append((f"adversarial training raises {model_short(m)}'s PGD flip rate", adv_outcome(result, m)))
    return out


def _paper_flip_text(ds: str, task: str) -> str:
    p = PAPER_FLIP[(ds, task)]
    relu, attn = (" / ".join(f"{p[m][a]:g}" for a in PAPER_ATTACKS) for m in ("relu", "attn"))
    return f"ReLU {relu} %, Attn {attn} % (FGSM / PGD / MIM)"


TEN = tuple(units.malleability(ds, "10class") for ds in DATASETS)


def _adv_entry(claim_id: str, ds: str, model: str) -> Claim:
    """The adversarial-training claim `claim_id` (written out at the call) for one data set and model."""
    before, after = PAPER_ADV[(ds, model)]
    return Claim(claim_id, "Table (adversarial training)",
                 f"{dataset_label(ds)}, {model_name(model)}: adversarial training raises the PGD "
                 "flip rate", paper=f"{before:g} % -> {after:g} %", rule=ADV_RULE, units=(units.malleability_adv(ds),),
                 evaluate=_adv_claim(ds, model), group="malleability", empirical=True)


MALLEABILITY_CLAIMS = [
    Claim("flip-mnist", "Table (flip rate, 10 classes)",
          "MNIST: MLP-Attn's influence signs flip far more often than 2L-ReLU's under FGSM/PGD/MIM",
          paper=_paper_flip_text("mnist", "10class"), rule=FLIP_RULE, units=(units.malleability("mnist", "10class"),),
          evaluate=_flip_claim("mnist", "10class"), group="malleability", empirical=True),
    Claim("flip-cifar10", "Table (flip rate, 10 classes)",
          "CIFAR-10: MLP-Attn's influence signs flip far more often than 2L-ReLU's under FGSM/PGD/MIM",
          paper=_paper_flip_text("cifar10", "10class"), rule=FLIP_RULE,
          units=(units.malleability("cifar10", "10class"),),
          evaluate=_flip_claim("cifar10", "10class"), group="malleability", empirical=True),
    Claim("ratio-6-9x", "Abstract / headline", "Attention is 6-9x more malleable than 2L-ReLU",
          paper=f"ratios {PAPER_RATIO_V1[0]:g}-{PAPER_RATIO_V1[1]:g}x",
          v2=f"{PAPER_RATIO_V2[0]:g}-{PAPER_RATIO_V2[1]:g}x",
          rule=RATIO_RULE, units=TEN, evaluate=ratio_outcome, group="malleability", empirical=True),
    Claim("flip-binary-mnist", "Table (flip rate, binary)", "MNIST 3-vs-8: MLP-Attn flips more often than 2L-ReLU",
          paper=_paper_flip_text("mnist", "binary"), rule=FLIP_RULE, units=(units.malleability("mnist", "binary"),),
          evaluate=_flip_claim("mnist", "binary"), group="malleability", empirical=True),
    Claim("flip-binary-cifar10", "Table (flip rate, binary)",
          "CIFAR-10 automobile-vs-airplane: no gap between the models (about 1x; lower kappa)",
          paper=_paper_flip_text("cifar10", "binary"), rule=NO_GAP_RULE,
          units=(units.malleability("cifar10", "binary"),),
          evaluate=lambda results: no_gap_outcome(results[units.malleability("cifar10", "binary")]),
          group="malleability", empirical=True),
    _adv_entry("adv-relu-mnist", "mnist", "relu"),
    _adv_entry("adv-attn-mnist", "mnist", "attn"),
    _adv_entry("adv-relu-cifar10", "cifar10", "relu"),
    _adv_entry("adv-attn-cifar10", "cifar10", "attn"),
    Claim("eps-robustness", "Sec. 5 (robustness)", "The ranking Attn > ReLU holds for eps in {0.1, 0.2, 0.3, 0.5}",
          paper="rankings are said to hold for eps in {0.1, 0.2, 0.3, 0.5}", rule=EPS_RULE,
          units=(units.malleability_eps("mnist"),),
          evaluate=lambda results: eps_outcome(results[units.malleability_eps("mnist")]), group="malleability",
          empirical=True),
    Claim("curated-removal", "Influence malleability (curated intervention)",
          "Removing the top-tau points by influence changes the kernel predictor's test loss more than removing "
          "as many random points", paper="curated intervention: remove the top points (no numbers given)",
          rule=CURATED_RULE, units=TEN, evaluate=curated_outcome, group="malleability", empirical=True),
    Claim("adversarial-intervention", "Influence malleability (adversarial intervention)",
          "PGD on all training data flips MLP-Attn's top influence signs more often than 2L-ReLU's",
          paper="adversarial intervention: PGD on all training data (no numbers given)", rule=ADV_INT_RULE,
          units=TEN, evaluate=adversarial_intervention_outcome, group="malleability", empirical=True),
    Claim("spearman-rankings", "Influence malleability (second metric)",
          "Attention's influence rankings are more disturbed: lower Spearman rho between original and perturbed "
          "influence rankings", paper="Spearman rho between original and perturbed influence rankings (lower = "
          "more malleable; no numbers given)", rule=SPEARMAN_RULE, units=TEN, evaluate=spearman_outcome,
          group="malleability", empirical=True),
]
