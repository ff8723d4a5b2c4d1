"""`verify malleability`: influence flip rate of 2L-ReLU and MLP-Attn under adversarial perturbation.

Prints the paper-shaped table (flip rate per model and attack, the random-noise baseline, the excess over
noise, Attn - ReLU differences and ratios, Spearman rho), the other interventions, the seed-to-seed
baseline, the optional eps sweep and adversarial-training comparison, each figure with its 95 % interval
(`empirics.experiments.mall_stats`), and one verdict line per applicable rule of `verify.claims.malleability` (the
same functions `verify claims` uses). The protocol is documented in `empirics.experiments.malleability`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from empirics.experiments.mall_stats import POOLED, MallSummary
from empirics.experiments.malleability import INTERVENTIONS, MalleabilityConfig, MalleabilityRecord, run_malleability
from empirics.vocab import MODEL_KINDS, PAPER_ATTACKS, model_name
from ntkm.errors import UserInputError
from reports.text import mean_pm, text_table
from verify.claims.base import Outcome
from verify.claims.malleability import ci_txt, experiment_outcomes, pct_txt, rho_txt, x_txt
from verify.commands._common import centre_note, check_data_args, emit_json, seed_map
from verify.commands.options import EXPERIMENT, PATH_DATA, Param, choices, options, seed_range, train_config, values
from verify.presets import parse_float_list, preset

NAME = "malleability"
HELP = "influence flip rate under adversarial perturbation (2L-ReLU vs MLP-Attn)"
ORDER = 40


def _one_float(text: str, what: str, lo: float, hi: float, lo_open: bool = False) -> float:
    try:
        v = float(text)
    except ValueError:
        hint = " (use --eps-sweep for several values)" if what == "--eps" and "," in text else ""
        raise UserInputError(f"{what} must be a number, got '{text}'{hint}") from None
    if not (lo < v <= hi if lo_open else lo <= v <= hi):
        raise UserInputError(f"{what} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {text}")
    return v


PARAMS = options(
    MalleabilityConfig,
    Param("models", parse=choices("model", MODEL_KINDS)),
    Param("attacks", parse=choices("attack", PAPER_ATTACKS)),
    Param("eps", text=True, parse=lambda text: _one_float(text, "--eps", 0.0, 1.0)),
    Param("tau", text=True, parse=lambda text: _one_float(text, "--tau", 0.0, 1.0, lo_open=True)),
    Param("interventions", parse=choices("intervention", INTERVENTIONS)),
    Param("eps_sweep", parse=lambda text: parse_float_list(text, "--eps-sweep") if text else ()),
    "attack_context", "adv_train", "adv_steps",
    Param("attack_steps", preset="attack_steps"),
    Param("width", preset="mall_width"),
    "attn_centre", "preprocess",
    Param("n_train", preset="mall_n_train"),
    Param("n_test", preset="mall_n_test"),
    "ridge", "ridge_rel",
)
OPTIONS = (*EXPERIMENT, *PARAMS)


def config_from_args(args: argparse.Namespace) -> MalleabilityConfig:
    check_data_args(args, paths=True)
    pre = preset(args.preset)
    return MalleabilityConfig(**values(PATH_DATA, args), seeds=seed_range(args, pre), **values(PARAMS, args, pre),
                              train=train_config(args, pre), device=args.device)


def flip_table(summary: MallSummary, training: str, intervention: str, eps: float) -> str:
    """Flip rate, noise flip rate and excess over noise per model and attack, each with its 95 % interval."""
    rows = []
    for r in summary.rows:
        if r["training"] == training and r["intervention"] == intervention and r["eps"] == eps:
            paper = r.get("paper_flip_pct")
            rows.append([model_name(r["model"]), r["attack"].upper(), pct_txt(r["flip_ci"]),
                         "-" if paper is None else f"{paper:g}%", pct_txt(r["baseline_ci"]), ci_txt(r["excess_ci"]),
                         rho_txt(r["rho_all_ci"]), mean_pm(r["baseline_rho_all"]), mean_pm(r["rho_top"]),
                         mean_pm(r["pair_flip_rate"], digits=3, scale=100.0, unit="%")])
    for r in summary.pooled:
        if r["training"] == training and r["intervention"] == intervention and r["eps"] == eps:
            rows.append([model_name(r["model"]), "pooled", pct_txt(r["flip_ci"]), "-",
                         pct_txt(r["baseline_ci"]), ci_txt(r["excess_ci"]), rho_txt(r["rho_all_ci"]),
                         rho_txt(r["baseline_rho_all_ci"]), "-", "-"])
    return text_table(["model", "attack", "flip rate [95% CI]", "paper", "random noise", "excess over noise",
                       "rho (all)", "noise rho", "rho (top)", "pair flips"], rows)


def ratio_table(summary: MallSummary, training: str, intervention: str, eps: float,
                paper: dict[str, dict[str, float]] | None) -> str:
    """Attn - ReLU excess over noise, ratio of excesses and plain ratio, with intervals."""
    rows = []
    for q in summary.comparisons:
        if q["training"] == training and q["intervention"] == intervention and q["eps"] == eps:
            p = "-"
            if (paper and q["attack"] in paper.get("relu", {}) and eps == 0.3 and intervention == "transformed"
                    and training == "standard"):
                p = f"{paper['attn'][q['attack']] / paper['relu'][q['attack']]:.1f}x"
            rows.append([q["attack"].upper() if q["attack"] != POOLED else "pooled", ci_txt(q["excess_diff_ci"]),
                         x_txt(q["ratio_excess_ci"]), x_txt(q["ratio_ci"]), p])
    return text_table(["attack", "Attn - ReLU excess", "ratio of excesses", "plain Attn/ReLU ratio", "paper"], rows)


def _sweep_cell(row: dict[str, Any]) -> str:
    return f"{100 * float(row['flip_ci']['value']):.0f}% (excess {ci_txt(row['excess_ci'], digits=0)})"


def summary_table(result: MalleabilityRecord) -> str:
    """Every table of the result, as plain text (the terminal output without the verdict)."""
    cfg = result.config
    s = result.summary
    eps0 = result.eps_values[0]
    paper = result.paper["flip_pct"]
    trainings = ["standard"] + (["adversarial"] if cfg["adv_train"] else [])
    out = []
    for training in trainings:
        tag = "" if training == "standard" else " — adversarially trained networks"
        if "transformed" in cfg["interventions"]:
            out += [f"Transformed (top points replaced by their perturbed versions), eps={eps0:g}{tag}",
                    flip_table(s, training, "transformed", eps0), ""]
            if s.comparisons:
                out += [ratio_table(s, training, "transformed", eps0, paper), ""]
        if "adversarial" in cfg["interventions"]:
            out += [f"Adversarial (all training points perturbed; flips counted on the clean top set), "
                    f"eps={eps0:g}{tag}", flip_table(s, training, "adversarial", eps0), ""]
            if s.comparisons:
                out += [ratio_table(s, training, "adversarial", eps0, None), ""]
        if "curated" in cfg["interventions"]:
            rows = [[model_name(c["model"]), c["removal"], rho_txt(c["test_loss_change_ci"], True),
                     ci_txt(c["test_acc_change_ci"]), rho_txt(c["rho_remaining_ci"]),
                     pct_txt(c["flip_rate_remaining_ci"])]
                    for c in s.curated if c["training"] == training]
            rows += [[model_name(d["model"]), "|top| - |random|",
                      rho_txt(d["abs_test_loss_change_diff_ci"], True), "-", rho_txt(d["rho_remaining_diff_ci"], True),
                      "-"] for d in s.curated_diff if d["training"] == training]
            out += [f"Curated (top points removed; random removal as baseline; t intervals over seeds){tag}",
                    text_table(["model", "removed", "d test loss", "d test acc", "rho remaining",
                                "flips remaining"], rows), ""]
    if s.seed_baseline:
        rows = [[model_name(b["model"]), pct_txt(b["flip_ci"]), rho_txt(b["rho_all_ci"])]
                for b in s.seed_baseline]
        out += ["Seed-to-seed baseline (no perturbation; a second network differing only in its initialisation)",
                text_table(["model", "top points with a different sign", "rho (all)"], rows), ""]
    if len(result.eps_values) > 1:
        sweep = sorted(result.eps_values)
        for intervention in ("transformed", "adversarial"):
            if intervention not in cfg["interventions"]:
                continue
            rows = []
            for model in cfg["models"]:
                for a in cfg["attacks"]:
                    cells = {r["eps"]: r for r in s.rows if r["training"] == "standard" and r["model"] == model
                             and r["attack"] == a and r["intervention"] == intervention}
                    rows.append([model_name(model), a.upper()] + [_sweep_cell(cells[e]) for e in sweep])
            out += [f"Eps sweep, {intervention}: flip rate (excess over noise, 95% CI, pp)",
                    text_table(["model", "attack"] + [f"eps={e:g}" for e in sweep], rows), ""]
    if s.adv_train:
        rows = [[model_name(a["model"]), a["attack"].upper() if a["attack"] != POOLED else "pooled",
                 pct_txt(a["standard_ci"]), pct_txt(a["adversarial_ci"]), ci_txt(a["rise_ci"]),
                 ci_txt(a["rise_excess_ci"]),
                 "-" if a["paper_pct"] is None else f"{a['paper_pct'][0]:g}% -> {a['paper_pct'][1]:g}%"]
                for a in s.adv_train]
        out += [f"Adversarial training (PGD at eps={eps0:g}, {cfg['adv_steps']} steps): transformed flip rate, "
                "paired by seed", text_table(["model", "attack", "standard", "adv. trained", "rise",
                                              "rise of excess over noise", "paper"], rows), ""]
    b = s.bootstrap
    out.append(f"Intervals: 95 %, {b['method']}; per-network scalars (rho, curated): {b['seed_level_method']}.")
    return "\n".join(out).rstrip()


def verdict_lines(outcomes: list[tuple[str, Outcome]]) -> list[str]:
    """One line per rule that applies (`experiment_outcomes`: the same rule functions as `verify claims`)."""
    return [f"Verdict: {name}: {o.verdict.value} — {o.ours}" + (f" [{o.condition}]" if o.condition else "")
            for name, o in outcomes]


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_malleability(cfg, seed_map=seed_map(args, "malleability"))
    stream = sys.stdout if args.json != "-" else sys.stderr
    prov = result.data
    ridge = f"ridge {cfg.ridge:g}" if cfg.ridge is not None else f"ridge {cfg.ridge_rel:g} x trace(K)/n"
    print(f"Influence malleability — {prov.get('label', cfg.dataset)}, task {cfg.task}, n_train={cfg.n_train}, "
          f"n_test={cfg.n_test}, width {cfg.width}, seeds={len(cfg.seeds)}, protocol {cfg.train.protocol} "
          f"({cfg.train.epochs} epochs"
          f"{' at most' if cfg.train.plateau else ''}); "
          f"top tau={cfg.tau:g} by |influence| ({result.n_selected} points), attack steps {cfg.attack_steps}, "
          f"attn attack context {cfg.attack_context}, {ridge}{centre_note(cfg.attn_centre)}; preset {args.preset}",
          file=stream)
    print(summary_table(result), file=stream)
    print("", file=stream)
    outcomes = experiment_outcomes(result)
    for line in verdict_lines(outcomes):
        print(line, file=stream)
    verdicts = [{"rule": name, "verdict": o.verdict.value, "ours": o.ours, "condition": o.condition,
                 "gate": o.gate} for name, o in outcomes]
    print(f"wall time {result.wall_s:.0f}s", file=stream)
    emit_json(args.json, {**result.to_dict(), "executor": args.executor, "preset": args.preset, "verdicts": verdicts})
    return 0
