"""`verify landscape`: loss landscape and sharpness of 2L-ReLU and MLP-Attn (PAPER.md, "Loss landscape")."""

from __future__ import annotations

import argparse
import sys

from empirics.landscape import LandscapeConfig, run_landscape
from empirics.models import MODEL_KINDS
from reports.text import mean_pm, text_table
from theory.errors import UserInputError
from verify.commands._common import (
    add_centre_arg,
    add_data_args,
    add_run_args,
    centre_note,
    check_data_args,
    emit_json,
    seed_map,
)
from verify.presets import add_protocol_args, parse_choices, preset, train_config_from_args

NAME = "landscape"
HELP = "loss landscape, Hessian sharpness and flatness of 2L-ReLU vs MLP-Attn"
DESCRIPTION = (
    "Train both networks, then measure the training loss along the init-to-trained line and on "
    "filter-normalised random slices, the top Hessian eigenvalue (Lanczos) and trace (Hutchinson), "
    "and scale-aware flatness; check the paper's claim that 2L-ReLU sits in a sharper minimum."
)
ORDER = 50


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_args(p, paths=True)
    add_run_args(p)
    add_protocol_args(p)
    p.add_argument("--model", default="relu,attn", help="comma-separated: relu, attn")
    p.add_argument("--width", type=int, default=None,
                   help="hidden width m (default: the preset's mall_width)")
    p.add_argument("--n-train", type=int, default=None, help="training points (default: the preset's)")
    p.add_argument("--n-test", type=int, default=None, help="test points (default: the preset's)")
    p.add_argument("--parameterization", default="ntk", help="ntk (paper) or standard")
    p.add_argument("--attn-layers", type=int, default=1, help="stacked linearized attention layers k")
    p.add_argument("--attn-rank", type=int, default=None, help="keep the top-r singular directions in C")
    add_centre_arg(p)
    p.add_argument("--flat-step", type=float, default=0.5,
                   help="relative filter-normalised step of the flatness number (default: %(default)s)")
    p.add_argument("--plot", default=None, metavar="PREFIX",
                   help="write PREFIX-lines.png (interpolation, 1-D slice) and PREFIX-contours.png "
                   "(2-D slice)")


def config_from_args(args: argparse.Namespace) -> LandscapeConfig:
    check_data_args(args, paths=True)
    pre = preset(args.preset)
    seeds = args.seeds if args.seeds is not None else len(pre["seeds"])
    if seeds < 1:
        raise UserInputError(f"--seeds must be >= 1, got {seeds}")
    for flag, value in (("--width", args.width), ("--n-train", args.n_train), ("--n-test", args.n_test)):
        if value is not None and value < 1:
            raise UserInputError(f"{flag} must be >= 1, got {value}")
    return LandscapeConfig(
        dataset=args.dataset, task=args.task, classes=args.classes,
        models=parse_choices(args.model, "model", MODEL_KINDS),
        width=args.width if args.width is not None else pre["mall_width"],
        seeds=tuple(range(seeds)),
        n_train=args.n_train if args.n_train is not None else pre["n_train"],
        n_test=args.n_test if args.n_test is not None else pre["n_test"],
        sample=args.sample,
        train=train_config_from_args(args, pre),
        parameterization=args.parameterization, attn_layers=args.attn_layers, attn_rank=args.attn_rank,
        attn_centre=args.centre,
        points=pre["landscape_points"], grid=pre["landscape_grid"], hessian_iters=pre["hessian_iters"],
        hutchinson_samples=pre["hutchinson_samples"], flat_step=args.flat_step,
        data_dir=args.data_dir, device=args.device,
    )


def summary_table(result: dict) -> str:
    """Per model: mean ± std over seeds of the sharpness and flatness numbers."""
    step = result.get("config", {}).get("flat_step", 0.5)
    rows = []
    for kind, res in result["models"].items():
        s = res["summary"]
        rows.append([kind, mean_pm(s["top_eigenvalue"]), mean_pm(s["trace"]), mean_pm(s["filter_increase"]),
                     mean_pm(s["sharpness_w2"]), mean_pm(s["sharpness_per_loss"]),
                     mean_pm(s["sharpness_per_input"]), mean_pm(s["train_loss"]), mean_pm(s["train_acc"]),
                     mean_pm(s["test_acc"])])
    return text_table(["model", "top eig", "trace", f"dL @ {step} (filter)", "eig*||W||^2", "eig/L",
                       "eig/||x~||^2", "train loss", "train acc", "test acc"], rows)


def verdict_text(v: dict) -> str:
    lines = [f"Claim 'ReLU sharp, Attn flat': {v['verdict']}"]
    if "seeds" in v:
        counts = v.get("relu_sharper_seeds", {})
        lines.append("  relu sharper than attn (seeds of " + str(v["seeds"]) + "): "
                     + ", ".join(f"{k} {n}" for k, n in counts.items()))
    for m, iv in v.get("intervals", {}).items():
        lines.append(f"  log(relu/attn) {m}: {iv['mean']:.3g} [{iv['ci'][0]:.3g}, {iv['ci'][1]:.3g}]"
                     + (" (judged)" if m in v.get("criteria_above", ()) or m in ("filter_increase",
                                                                                "sharpness_per_input") else ""))
    if "reason" in v:
        lines.append(f"  {v['reason']}")
    lines += [f"  caveat: {c}" for c in v.get("caveats", [])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_landscape(cfg, seed_map=seed_map(args, "landscape"))
    result["executor"] = args.executor
    result["preset"] = args.preset
    out = sys.stdout if args.json != "-" else sys.stderr
    prov = result["data"]
    print(f"Loss landscape — {prov.get('label', cfg.dataset)}, task {cfg.task}, width {cfg.width}, "
          f"n_train={cfg.n_train}, seeds={len(cfg.seeds)}, protocol {cfg.train.protocol} ({cfg.train.optimizer}, "
          f"{'up to ' if cfg.train.plateau else ''}{cfg.train.epochs} epochs), "
          f"{cfg.parameterization} parameterisation; Hessian of the mean training loss w.r.t. W "
          f"(Lanczos {cfg.hessian_iters}, Hutchinson {cfg.hutchinson_samples}){centre_note(cfg.attn_centre)}", file=out)
    print(summary_table(result), file=out)
    print(verdict_text(result["verdict"]), file=out)
    print(f"wall time {result['wall_s']:.1f} s", file=out)
    if args.plot:
        from reports.figures import landscape_contours, landscape_lines

        landscape_lines(result, f"{args.plot}-lines.png")
        landscape_contours(result, f"{args.plot}-contours.png")
    emit_json(args.json, result)
    return 0
