"""`verify landscape`: loss landscape and sharpness of 2L-ReLU and MLP-Attn (docs/PAPER.md, "Loss landscape")."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from empirics.experiments.landscape import LandscapeConfig, LandscapeJudgement, LandscapeRecord, run_landscape
from empirics.vocab import MODEL_KINDS
from ntkm.codec import decode
from ntkm.errors import UserInputError
from reports.text import mean_pm, text_table
from verify.commands._common import centre_note, check_data_args, emit_json, seed_map
from verify.commands.options import EXPERIMENT, PATH_DATA, Param, choices, options, seed_range, train_config, values
from verify.presets import preset

NAME = "landscape"
HELP = "loss landscape, Hessian sharpness and flatness of 2L-ReLU vs MLP-Attn"
DESCRIPTION = (
    "Train both networks, then measure the training loss along the init-to-trained line and on "
    "filter-normalised random slices, the top Hessian eigenvalue (Lanczos) and trace (Hutchinson), "
    "and scale-aware flatness; check the paper's claim that 2L-ReLU sits in a sharper minimum."
)
ORDER = 50


@dataclass(frozen=True)
class LandscapeOutputs:
    """`verify landscape`'s own option (not part of the experiment's config)."""

    plot: str | None = field(default=None, metadata={
        "help": "write PREFIX-lines.png (interpolation, 1-D slice) and PREFIX-contours.png (2-D slice)",
        "metavar": "PREFIX"})


PARAMS = options(
    LandscapeConfig,
    Param("models", parse=choices("model", MODEL_KINDS)),
    Param("width", preset="mall_width"),
    Param("n_train", preset="n_train"),
    Param("n_test", preset="n_test"),
    "parameterization", "attn_layers", "attn_rank", "attn_centre", "preprocess", "flat_step",
)
OPTIONS = (*EXPERIMENT, *PARAMS, *options(LandscapeOutputs, "plot"))


def config_from_args(args: argparse.Namespace) -> LandscapeConfig:
    check_data_args(args, paths=True)
    pre = preset(args.preset)
    seeds = seed_range(args, pre)
    for flag, value in (("--width", args.width), ("--n-train", args.n_train), ("--n-test", args.n_test)):
        if value is not None and value < 1:
            raise UserInputError(f"{flag} must be >= 1, got {value}")
    return LandscapeConfig(
        **values(PATH_DATA, args), seeds=seeds, **values(PARAMS, args, pre), train=train_config(args, pre),
        points=pre["landscape_points"], grid=pre["landscape_grid"], hessian_iters=pre["hessian_iters"],
        hutchinson_samples=pre["hutchinson_samples"], device=args.device,
    )


def summary_table(result: LandscapeRecord) -> str:
    """Per model: mean ± std over seeds of the sharpness and flatness numbers."""
    step = result.config.get("flat_step", 0.5)
    rows = []
    for kind, res in result.models.items():
        s = res.summary
        rows.append([kind, mean_pm(s["top_eigenvalue"]), mean_pm(s["trace"]), mean_pm(s["filter_increase"]),
                     mean_pm(s["sharpness_w2"]), mean_pm(s["sharpness_per_loss"]),
                     mean_pm(s["sharpness_per_input"]), mean_pm(s["train_loss"]), mean_pm(s["train_acc"]),
                     mean_pm(s["test_acc"])])
    return text_table(["model", "top eig", "trace", f"dL @ {step} (filter)", "eig*||W||^2", "eig/L",
                       "eig/||x~||^2", "train loss", "train acc", "test acc"], rows)


def verdict_text(v: LandscapeJudgement) -> str:
    lines = [f"Claim 'ReLU sharp, Attn flat': {v.verdict}"]
    if v.seeds is not None:
        counts = v.relu_sharper_seeds or {}
        lines.append("  relu sharper than attn (seeds of " + str(v.seeds) + "): "
                     + ", ".join(f"{k} {n}" for k, n in counts.items()))
    for m, iv in (v.intervals or {}).items():
        lines.append(f"  log(relu/attn) {m}: {iv['mean']:.3g} [{iv['ci'][0]:.3g}, {iv['ci'][1]:.3g}]"
                     + (" (judged)" if m in (v.criteria_above or ()) or m in ("filter_increase",
                                                                             "sharpness_per_input") else ""))
    if v.reason is not None:
        lines.append(f"  {v.reason}")
    lines += [f"  caveat: {c}" for c in v.caveats or []]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_landscape(cfg, seed_map=seed_map(args, "landscape"))
    record = {**result.to_dict(), "executor": args.executor, "preset": args.preset}
    out = sys.stdout if args.json != "-" else sys.stderr
    prov = result.data
    print(f"Loss landscape — {prov.get('label', cfg.dataset)}, task {cfg.task}, width {cfg.width}, "
          f"n_train={cfg.n_train}, seeds={len(cfg.seeds)}, protocol {cfg.train.protocol} ({cfg.train.optimizer}, "
          f"{'up to ' if cfg.train.plateau else ''}{cfg.train.epochs} epochs), "
          f"{cfg.parameterization} parameterisation; Hessian of the mean training loss w.r.t. W "
          f"(Lanczos {cfg.hessian_iters}, Hutchinson {cfg.hutchinson_samples}){centre_note(cfg.attn_centre)}", file=out)
    print(summary_table(result), file=out)
    print(verdict_text(result.verdict), file=out)
    print(f"wall time {result.wall_s:.1f} s", file=out)
    if args.plot:
        from reports.figures import landscape_contours, landscape_lines

        landscape_lines(decode(record), f"{args.plot}-lines.png")
        landscape_contours(decode(record), f"{args.plot}-contours.png")
    emit_json(args.json, record)
    return 0
