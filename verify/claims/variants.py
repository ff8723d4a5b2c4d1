"""Beyond the paper: named variants of the paper's model, judged by the paper's own rules.

`centred`: MLP-Attn with a mean-removed attention context, `x~ = normalise(C_c (x - mu))` (`--centre`).
The paper's uncentred `C x` is dominated by the mean image (mean pairwise cosine of MLP-Attn's MNIST
features about 0.99), so its features nearly align; the variant asks how much of the paper's NTK and
malleability results that alignment explains. The variant never replaces the paper's model: its rows
sit in their own group, and 2L-ReLU (which has no context) is trained exactly as in the paper-model
units, so the contrast isolates the centring.

`softmax` and `qkv`: the same head on softmax attention over the training set (`x~ = normalise(softmax(x X^T / T)
X)`, T = sqrt(d), or 1/sqrt(d) on unit-norm inputs, parameter-free) and on trainable single-head linearized
attention (`x~ = normalise(x Q K^T C V)`, Q, K, V of width 64 at standard Gaussian initialisation, trained with W;
`empirics.nets.models`). To keep `verify claims` within its time budget they run on MNIST only, at three widths below
the preset's widest (`variant_widths`), and their flip rates are measured on the widest of those networks. Their flip
rows judge the pair (variant, relu) (`compared`) by the paper's flip rule, whose "Attn" is then the variant. The `qkv`
NTK reference has no closed form: it is the Monte Carlo mean kernel at initialisation (`empirics.kernels.mc_reference`),
and its rows are not measurable when that estimate's error could move the distances (`MC_RULE`). """

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from empirics.experiments.distance import DistanceRecord
from empirics.experiments.mall_stats import Pair, summarise
from empirics.experiments.malleability import MalleabilityConfig, MalleabilityRecord
from empirics.nets.kinds import KINDS, MONTE_CARLO
from empirics.vocab import PAPER_ATTACKS, Model
from reports.text import fmt
from verify.claims import units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, Claim, Outcome, Results, Verdict
from verify.claims.malleability import FLIP_RULE, flip_outcome
from verify.claims.ntk import NTK_RULE, ntk_claim
from verify.presets import PresetSizes, n_train_for
from verify.runner import config_kwargs

CENTRED_DISTANCE = units.ntk_distance("mnist", "centred")
CENTRED_FLIP = units.malleability("mnist", "centred")
VARIANT_NOTE = "variant, not the paper's model: MLP-Attn with its attention context and queries centred"


def variant_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, tuple[str, dict[str, Any]]]:
    """(experiment kind, config keyword arguments) of every variant unit, sized by the preset (the training
    config is added per protocol by `verify.experiments`)."""
    distance = {"dataset": "mnist", "widths": list(p["widths"]), "seeds": list(p["seeds"]),
                "n_train": n_train_for(p, "mnist"), "n_test": p["n_test"], "data_dir": data_dir, "attn_centre": True,
                **({} if p.get("ntk_gd_mse", True) else {"gd_mse": False})}
    flip = {"dataset": "mnist", "task": "10class", "width": p["mall_width"], "n_test": p["mall_n_test"],
            "n_train": n_train_for(p, "mnist", "mall_n_train"), "seeds": list(p["seeds"]),
            "attack_steps": p["attack_steps"], "eps": 0.3, "tau": 0.1, "attacks": list(PAPER_ATTACKS),
            "interventions": ["transformed"], "data_dir": data_dir, "attn_centre": True}
    out = {CENTRED_DISTANCE: ("distance", distance), CENTRED_FLIP: ("malleability", flip)}
    widths = variant_widths(p)
    for kind in ATTENTION_VARIANTS:
        out[units.ntk_distance("mnist", kind)] = (
            "distance", {**{k: v for k, v in distance.items() if k != "attn_centre"}, "widths": widths,
                         "models": ["relu", kind]})
        out[units.malleability("mnist", kind)] = (
            "malleability", {**{k: v for k, v in flip.items() if k != "attn_centre"}, "n_train": distance["n_train"],
                             "n_test": p["n_test"], "width": widths[-1], "models": ["relu", kind]})
    return out


def variant_widths(p: PresetSizes) -> list[int]:
    """Widths of the softmax / qkv sweeps: a sixteenth, an eighth and a quarter of the preset's widest width (three,
    as the NTK rule needs; at quick, 32, 64 and 128, sized so that the variant units add about 4 minutes to
    `verify claims --preset quick` on a 2-core CPU).
    The flip units use the widest of them on the sweep's data, so that in one `verify claims` process they reuse
    the sweep's trained networks (`empirics.common.train_network`) instead of training more."""
    top = max(p["widths"])
    return [max(1, top // 16), max(1, top // 8), max(1, top // 4)]


#: The attention variants beyond the paper's linearization, and their names in the table.
ATTENTION_VARIANTS = ("softmax", "qkv")
VARIANT_NAMES = {"softmax": "softmax attention (T = sqrt(d), 1/sqrt(d) on unit-norm inputs; parameter-free)",
                 "qkv": "trainable single-head Q/K/V linearized attention (k = 64, standard Gaussian initialisation)"}

MC_RULE = ("where the NTK reference is a Monte Carlo estimate (qkv), the rule is applied only if the estimate is "
           "precise enough: 2 x the jackknife standard error of the predictor f_NTK (over the Monte Carlo draws, the "
           "largest over seeds) must be at most a tenth of the smallest mean ||f_m - f_NTK|| over widths; otherwise "
           "not measurable here (the reference's error could move the distances)")


def _mc_check(res: DistanceRecord, kind: str) -> tuple[str | None, str]:
    """Why a Monte Carlo reference is too coarse for the rule (None if precise enough or analytic), and its text."""
    block = res.models[kind]
    refs = [r for r in block.reference if r.get("kind") == "monte-carlo"]
    if not refs:
        return None, ""
    se = max(float(r["predictor_se"]) for r in refs)
    smallest = min(float(block.mean(w, "function_abs")) for w in block.widths())
    txt = (f"Monte Carlo reference ({refs[0]['draws']} draws at m={refs[0]['width']}): relative standard error of the "
           f"kernel {fmt(max(r['rel_se_frobenius'] for r in refs))}, jackknife SE of f_NTK {fmt(se)} vs smallest "
           f"mean distance {fmt(smallest)}")
    return (None if 2 * se <= 0.1 * smallest else "the Monte Carlo reference is too coarse: " + txt), txt


def _variant_ntk(kind: str) -> Callable[[Results], Outcome]:
    unit = units.ntk_distance("mnist", kind)
    base = ntk_claim("mnist", kind, "rises", unit)

    def evaluate(results: Results) -> Outcome:
        out = base(results)
        why, txt = _mc_check(results[unit], kind)
        if not txt:
            return out
        protocol = out.protocol.replace("KRR with the analytic NTK", "KRR with the Monte Carlo mean NTK at init")
        if why is not None and out.verdict is not NA:
            return replace(out, ours=f"not measurable: {why}", verdict=NA, protocol=protocol, condition=MC_RULE)
        return replace(out, ours=f"{out.ours}; {txt}", protocol=protocol)

    return evaluate


def variant_pair(kind: str) -> Pair:
    """The comparison of a variant row: the variant (treated) against 2L-ReLU (control)."""
    return kind, Model.RELU.value


def compared(res: MalleabilityRecord, pair: Pair) -> MalleabilityRecord:
    """`res` with its summary recomputed to compare `pair`: a unit's stored summary compares the paper's pair only
    (`empirics.experiments.mall_stats.summarise`), which a variant unit, of (relu, variant), does not run."""
    cfg = MalleabilityConfig(**config_kwargs(res.config))
    return replace(res, summary=summarise(res.runs, cfg, pair))


def _variant_flip(kind: str) -> Callable[[Results], Outcome]:
    pair = variant_pair(kind)

    def evaluate(results: Results) -> Outcome:
        return flip_outcome(compared(results[units.malleability("mnist", kind)], pair), "mnist", "10class", pair)

    return evaluate


V2_QKV_RULE = ("v2's extension to trainable Q/K/V attention at standard initialisation, read as: the qkv variant, "
               "like the paper's MLP-Attn, does not approach its NTK with width and is more malleable than 2L-ReLU. "
               "Holds if both ntk-qkv-mnist and flip-qkv-mnist hold; not measurable here if either is; does not hold "
               "if the qkv distance falls with width (slope interval below 0: it enters the kernel regime) or "
               "flip-qkv-mnist does not hold; inconclusive if either row is inconclusive; partly otherwise (one row "
               "holds partly, by its own named condition)")


def v2_qkv_outcome(ntk: Outcome, flip: Outcome) -> Outcome:
    """The v2 trainable-Q/K/V row from the two qkv rows under one protocol (`V2_QKV_RULE`)."""
    protocol = f"the ntk-qkv-mnist and flip-qkv-mnist rows ({ntk.protocol})"
    parts = f"NTK distance: {ntk.verdict} ({ntk.condition or ntk.ours}); flip rate: {flip.verdict} ({flip.condition})"
    if NA in (ntk.verdict, flip.verdict):
        return Outcome(f"not measurable: {parts}", NA, protocol, gate=ntk.gate, condition=V2_QKV_RULE)
    ci = (ntk.numbers.get("slope_interval") or {}).get("ci") or [float("nan")] * 2
    falls = float(ci[1]) < 0
    verdict: Verdict = (HOLDS if ntk.verdict is HOLDS and flip.verdict is HOLDS
                        else NOT if falls or flip.verdict is NOT
                        else INCONCLUSIVE if INCONCLUSIVE in (ntk.verdict, flip.verdict) else PARTLY)
    return Outcome(parts, verdict, protocol, {"ntk": ntk.verdict.value, "flip": flip.verdict.value,
                                              "slope_ci": ci}, ntk.seeds, ntk.gate,
                   f"distance slope interval below 0: {'yes' if falls else 'no'}; "
                   f"both rows hold: {'yes' if verdict is HOLDS else 'no'}",
                   partly_as=(ntk.partly_as or flip.partly_as) if verdict is PARTLY else None)


def _v2_qkv(results: Results) -> Outcome:
    return v2_qkv_outcome(_variant_ntk("qkv")(results), _variant_flip("qkv")(results))


def _centred_flip(results: Results) -> Any:
    return flip_outcome(results[CENTRED_FLIP], "mnist", "10class")


VARIANT_CLAIMS = [
    Claim("ntk-attn-centred-mnist", "Variant of Table (NTK distance)",
          "MLP-Attn with a centred context on MNIST: NTK distance rises with width (the paper's claim for its "
          "uncentred model, asked of the variant)",
          paper=f"not in the paper ({VARIANT_NOTE}); the paper's model: 10.3 (m=16), 33.3 (1024), 43.4 (4096)",
          rule=NTK_RULE, units=(CENTRED_DISTANCE,), evaluate=ntk_claim("mnist", "attn", "rises", CENTRED_DISTANCE),
          group="variants", empirical=True),
    Claim("flip-centred-mnist", "Variant of Table (flip rate, 10 classes)",
          "MNIST: MLP-Attn with a centred context flips influence signs far more often than 2L-ReLU",
          paper=f"not in the paper ({VARIANT_NOTE}); the paper's model: see flip-mnist", rule=FLIP_RULE,
          units=(CENTRED_FLIP,), evaluate=_centred_flip, group="variants", empirical=True),
]


def _variant_row(cid: str, kind: str) -> Claim:
    """The NTK-distance (`ntk-KIND-mnist`) or flip-rate (`flip-KIND-mnist`) row of attention variant `kind`; the id
    is written out where the row is registered, so that a search for it finds the row."""
    name, note = VARIANT_NAMES[kind], f"not in the paper (variant: {VARIANT_NAMES[kind]})"
    if cid == f"ntk-{kind}-mnist":
        return Claim(cid, "Variant of Table (NTK distance)",
                     f"MNIST, {name}: NTK distance rises with width (the paper's claim for MLP-Attn, asked of the "
                     "variant)", paper=f"{note}; the paper's MLP-Attn: 10.3 (m=16), 33.3 (1024), 43.4 (4096)",
                     rule=NTK_RULE + (f"; {MC_RULE}" if KINDS[kind].reference == MONTE_CARLO else ""),
                     units=(units.ntk_distance("mnist", kind),), evaluate=_variant_ntk(kind), group="variants",
                     empirical=True)
    if cid == f"flip-{kind}-mnist":
        return Claim(cid, "Variant of Table (flip rate, 10 classes)",
                     f"MNIST: {name} flips influence signs far more often than 2L-ReLU ('Attn' in the rule is the "
                     "variant)", paper=f"{note}; the paper's MLP-Attn: see flip-mnist", rule=FLIP_RULE,
                     units=(units.malleability("mnist", kind),), evaluate=_variant_flip(kind), group="variants",
                     empirical=True)
    raise ValueError(f"{cid}: a row of variant {kind} is ntk-{kind}-mnist or flip-{kind}-mnist")


VARIANT_CLAIMS += [
    _variant_row("ntk-softmax-mnist", "softmax"),
    _variant_row("flip-softmax-mnist", "softmax"),
    _variant_row("ntk-qkv-mnist", "qkv"),
    _variant_row("flip-qkv-mnist", "qkv"),
]
VARIANT_CLAIMS.append(
    Claim("v2-qkv", "v2 (trainable Q/K/V)",
          "v2: the argument extends to trainable Q/K/V attention at standard initialisation (it cannot enter the "
          "kernel regime at practical width and stays more malleable than 2L-ReLU)",
          paper="not in v1", rule=V2_QKV_RULE + f"; {MC_RULE}",
          units=(units.ntk_distance("mnist", "qkv"), units.malleability("mnist", "qkv")), evaluate=_v2_qkv,
          group="variants", empirical=True,
          v2="the argument is said to extend to trainable Q/K/V attention at standard initialisation (no measurement "
             "given)"))
