"""`verify malleability`: influence flip rate of 2L-ReLU and MLP-Attn under adversarial perturbation.

Prints the paper-shaped table (flip rate per model and attack, the Attn/ReLU ratio, Spearman rho and
the random-noise baseline), the other interventions, the optional eps sweep and adversarial-training
comparison, and a one-line verdict. The protocol is documented in `empirics.malleability`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from empirics.influence import RIDGE_REL_DEFAULT
from empirics.malleability import INTERVENTIONS, MALL_ATTACKS, MalleabilityConfig, run_malleability
from empirics.models import MODEL_KINDS
from empirics.train import TrainConfig
from reports.text import mean_pm, text_table
from theory.errors import UserInputError
from theory.paper import PAPER_ADV
from verify.commands._common import add_data_args, add_run_args, check_data_args, emit_json
from verify.presets import parse_choices, parse_float_list, preset

NAME = "malleability"
HELP = "influence flip rate under adversarial perturbation (2L-ReLU vs MLP-Attn)"
ORDER = 40


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_args(p)
    add_run_args(p)
    p.add_argument("--model", default="relu,attn", help="comma-separated: relu, attn")
    p.add_argument("--attack", default="fgsm,pgd,mim", help="comma-separated: fgsm, pgd, mim "
                   "(random noise of the same eps always runs as the baseline)")
    p.add_argument("--eps", default="0.3", help="L-infinity budget in pixel units, in [0, 1] (default: %(default)s)")
    p.add_argument("--tau", default="0.1", help="fraction of training points selected by |influence|, in (0, 1]")
    p.add_argument("--intervention", default=",".join(INTERVENTIONS),
                   help="comma-separated: transformed (headline), curated, adversarial")
    p.add_argument("--eps-sweep", default=None, help="more eps values, e.g. 0.1,0.2,0.3,0.5")
    p.add_argument("--attack-context", default="fixed",
                   help="MLP-Attn attacks see the clean context (fixed) or their own perturbation (recomputed)")
    p.add_argument("--adv-train", action="store_true",
                   help="also train with PGD (at --eps) and compare flip rates before and after")
    p.add_argument("--adv-steps", type=int, default=7, help="PGD steps inside adversarial training")
    p.add_argument("--attack-steps", type=int, default=None, help="PGD / MIM steps (default: the preset's)")
    p.add_argument("--width", type=int, default=None, help="hidden width m (default: the preset's)")
    p.add_argument("--n-train", type=int, default=None, help="training points (default: the preset's)")
    p.add_argument("--n-test", type=int, default=None, help="test points (default: the preset's)")
    p.add_argument("--epochs", type=int, default=None, help="Adam epochs (default: the preset's)")
    p.add_argument("--ridge", type=float, default=None, help="absolute KRR ridge (default: relative, below)")
    p.add_argument("--ridge-rel", type=float, default=RIDGE_REL_DEFAULT,
                   help="ridge = RIDGE_REL * trace(K_m) / n when --ridge is not given (default: %(default)s)")


def _one_float(text: str, what: str, lo: float, hi: float, lo_open: bool = False) -> float:
    try:
        v = float(text)
    except ValueError:
        hint = " (use --eps-sweep for several values)" if what == "--eps" and "," in text else ""
        raise UserInputError(f"{what} must be a number, got '{text}'{hint}") from None
    if not (lo < v <= hi if lo_open else lo <= v <= hi):
        raise UserInputError(f"{what} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {text}")
    return v


def config_from_args(args: argparse.Namespace) -> MalleabilityConfig:
    check_data_args(args)
    pre = preset(args.preset)
    seeds = args.seeds if args.seeds is not None else len(pre["seeds"])
    if seeds < 1:
        raise UserInputError(f"--seeds must be >= 1, got {seeds}")
    return MalleabilityConfig(
        dataset=args.dataset, task=args.task,
        models=parse_choices(args.model, "model", MODEL_KINDS),
        attacks=parse_choices(args.attack, "attack", MALL_ATTACKS),
        eps=_one_float(args.eps, "--eps", 0.0, 1.0),
        eps_sweep=parse_float_list(args.eps_sweep, "--eps-sweep") if args.eps_sweep else (),
        tau=_one_float(args.tau, "--tau", 0.0, 1.0, lo_open=True),
        seeds=tuple(range(seeds)),
        interventions=parse_choices(args.intervention, "intervention", INTERVENTIONS),
        width=args.width if args.width is not None else pre["mall_width"],
        n_train=args.n_train if args.n_train is not None else pre["mall_n_train"],
        n_test=args.n_test if args.n_test is not None else pre["mall_n_test"],
        sample=args.sample,
        train=TrainConfig(epochs=args.epochs if args.epochs is not None else pre["epochs"]),
        adv_train=args.adv_train, adv_steps=args.adv_steps,
        attack_steps=args.attack_steps if args.attack_steps is not None else pre["attack_steps"],
        attack_context=args.attack_context, ridge=args.ridge, ridge_rel=args.ridge_rel,
        data_dir=args.data_dir, device=args.device,
    )


MODEL_LABEL = {"relu": "2L-ReLU", "attn": "MLP-Attn"}


def _pct(s: dict[str, Any] | None) -> str:
    return mean_pm(s, digits=3, scale=100.0, unit="%")


def _ratio_txt(v: float | None) -> str:
    return "undefined" if v is None else f"{v:.2f}x"


def flip_table(summary: dict[str, Any], training: str, intervention: str, eps: float) -> str:
    rows = []
    for r in summary["rows"]:
        if r["training"] == training and r["intervention"] == intervention and r["eps"] == eps:
            paper = r.get("paper_flip_pct")
            rows.append([MODEL_LABEL.get(r["model"], r["model"]), r["attack"].upper(), _pct(r["flip_rate"]),
                         "-" if paper is None else f"{paper:g}%", _pct(r["baseline_flip_rate"]),
                         mean_pm(r["rho_all"]), mean_pm(r["baseline_rho_all"]), mean_pm(r["rho_top"]),
                         _pct(r["pair_flip_rate"])])
    return text_table(["model", "attack", "flip rate", "paper", "random baseline", "rho (all)", "baseline rho",
                       "rho (top)", "pair flips"], rows)


def ratio_table(summary: dict[str, Any], training: str, intervention: str, eps: float,
                paper: dict[str, dict[str, float]] | None) -> str:
    rows = []
    for q in summary["ratios"]:
        if q["training"] == training and q["intervention"] == intervention and q["eps"] == eps:
            per = ", ".join("undef" if v is None else f"{v:.1f}" for v in q["per_seed"])
            p = "-"
            if paper and q["attack"] in paper.get("relu", {}) and eps == 0.3 and intervention == "transformed":
                p = f"{paper['attn'][q['attack']] / paper['relu'][q['attack']]:.1f}x"
            rows.append([q["attack"].upper(), _ratio_txt(q["ratio"]), per, p, q["note"]])
    return text_table(["attack", "Attn/ReLU flip ratio", "per seed", "paper", "note"], rows)


def _sweep_cell(row: dict[str, Any]) -> str:
    f, b = row["flip_rate"], row["baseline_flip_rate"]
    return f"{100 * f['mean']:.0f}±{100 * f['std']:.0f}% (rand {100 * b['mean']:.0f}%)"


def summary_table(result: dict[str, Any]) -> str:
    """Every table of the result, as plain text (the terminal output without the verdict)."""
    cfg = result["config"]
    s = result["summary"]
    eps0 = result["eps_values"][0]
    paper = result["paper"]["flip_pct"]
    trainings = ["standard"] + (["adversarial"] if cfg["adv_train"] else [])
    out = []
    for training in trainings:
        tag = "" if training == "standard" else " — adversarially trained networks"
        if "transformed" in cfg["interventions"]:
            out += [f"Transformed (top points replaced by their perturbed versions), eps={eps0:g}{tag}",
                    flip_table(s, training, "transformed", eps0), ""]
            if s["ratios"]:
                out += [ratio_table(s, training, "transformed", eps0, paper if training == "standard" else None), ""]
        if "adversarial" in cfg["interventions"]:
            out += [f"Adversarial (all training points perturbed; flips counted on the clean top set), "
                    f"eps={eps0:g}{tag}", flip_table(s, training, "adversarial", eps0), ""]
            if s["ratios"]:
                out += [ratio_table(s, training, "adversarial", eps0, None), ""]
        if "curated" in cfg["interventions"]:
            rows = [[MODEL_LABEL.get(c["model"], c["model"]), c["removal"], mean_pm(c["test_loss_change"]),
                     _pct(c["test_acc_change"]), mean_pm(c["rho_remaining"]), _pct(c["flip_rate_remaining"])]
                    for c in s["curated"] if c["training"] == training]
            out += [f"Curated (top points removed; random removal as baseline){tag}",
                    text_table(["model", "removed", "d test loss", "d test acc", "rho remaining",
                                "flips remaining"], rows), ""]
    if len(result["eps_values"]) > 1:
        sweep = sorted(result["eps_values"])
        for intervention in ("transformed", "adversarial"):
            if intervention not in cfg["interventions"]:
                continue
            rows = []
            for model in cfg["models"]:
                for a in cfg["attacks"]:
                    cells = {r["eps"]: r for r in s["rows"] if r["training"] == "standard" and r["model"] == model
                             and r["attack"] == a and r["intervention"] == intervention}
                    rows.append([MODEL_LABEL.get(model, model), a.upper()] + [_sweep_cell(cells[e]) for e in sweep])
            out += [f"Eps sweep, {intervention}: flip rate, mean ± std over seeds (random-noise baseline)",
                    text_table(["model", "attack"] + [f"eps={e:g}" for e in sweep], rows), ""]
    if s.get("adv_train"):
        rows = [[MODEL_LABEL.get(a["model"], a["model"]), a["attack"].upper(), _pct(a["standard"]),
                 _pct(a["adversarial"]), mean_pm(a["standard_rho_all"]), mean_pm(a["adversarial_rho_all"]),
                 "-" if a["paper_pct"] is None else f"{a['paper_pct'][0]:g}% -> {a['paper_pct'][1]:g}%"]
                for a in s["adv_train"]]
        out += [f"Adversarial training (PGD at eps={eps0:g}, {cfg['adv_steps']} steps): transformed flip rate, "
                "same seeds", text_table(["model", "attack", "standard", "adv. trained", "rho standard",
                                          "rho adv.", "paper"], rows), ""]
    return "\n".join(out).rstrip()


def adv_verdict(result: dict[str, Any]) -> str | None:
    """One line on adversarial training: does it raise each model's flip rate (pooled over attacks)?"""
    rows = result["summary"].get("adv_train")
    if not rows:
        return None
    parts = []
    for model in result["config"]["models"]:
        rs = [r for r in rows if r["model"] == model]
        before = sum(r["standard"]["mean"] for r in rs) / len(rs)
        after = sum(r["adversarial"]["mean"] for r in rs) / len(rs)
        parts.append(f"{MODEL_LABEL.get(model, model)} {100 * before:.1f}% -> {100 * after:.1f}% "
                     f"({'raises' if after > before else 'does not raise'})")
    line = "Adversarial training, flip rate pooled over attacks: " + "; ".join(parts)
    paper = [(m, PAPER_ADV.get((result["config"]["dataset"], m))) for m in ("relu", "attn")]
    if result["config"]["task"] == "10class" and all(p for _, p in paper):
        line += " (paper, PGD: " + ", ".join(f"{MODEL_LABEL[m]} {p[0]:g} -> {p[1]:g}%" for m, p in paper) + ")"
    return line


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_malleability(cfg)
    result["preset"] = args.preset
    stream = sys.stdout if args.json != "-" else sys.stderr
    prov = result["data"]
    ridge = f"ridge {cfg.ridge:g}" if cfg.ridge is not None else f"ridge {cfg.ridge_rel:g} x trace(K)/n"
    print(f"Influence malleability — {prov.get('label', cfg.dataset)}, task {cfg.task}, n_train={cfg.n_train}, "
          f"n_test={cfg.n_test}, width {cfg.width}, seeds={len(cfg.seeds)}, Adam {cfg.train.epochs} epochs; "
          f"top tau={cfg.tau:g} by |influence| ({result['n_selected']} points), attack steps {cfg.attack_steps}, "
          f"attn attack context {cfg.attack_context}, {ridge}; preset {args.preset}", file=stream)
    print(summary_table(result), file=stream)
    print("", file=stream)
    print("Verdict: " + result["summary"]["verdict"]["text"], file=stream)
    adv = adv_verdict(result)
    if adv:
        print(adv, file=stream)
    print(f"wall time {result['wall_s']:.0f}s", file=stream)
    emit_json(args.json, result)
    return 0
