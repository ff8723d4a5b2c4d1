"""`verify ntk-distance`: NTK distance against width for 2L-ReLU and MLP-Attn (PAPER.md table 1)."""

from __future__ import annotations

import argparse
import sys

from empirics.distance import METRICS, DistanceConfig, run_ntk_distance
from empirics.models import MODEL_KINDS
from reports.text import mean_pm, text_table
from verify.commands._common import (
    add_centre_arg,
    add_data_args,
    add_run_args,
    centre_note,
    check_data_args,
    emit_json,
    seed_map,
)
from verify.presets import add_protocol_args, parse_choices, parse_int_list, preset, train_config_from_args

NAME = "ntk-distance"
HELP = "NTK distance vs width for 2L-ReLU and MLP-Attn on real data"
ORDER = 30


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_args(p, paths=True)
    add_run_args(p)
    add_protocol_args(p)
    p.add_argument("--model", default="relu,attn",
                   help="comma-separated: relu, attn (the paper's), softmax (softmax attention over the training "
                        "set, T = sqrt(d)), qkv (trainable single-head Q/K/V linearized attention, k = 64)")
    p.add_argument("--widths", default=None, help="comma-separated widths (default: the preset's)")
    p.add_argument("--n-train", type=int, default=None, help="training points (default: the preset's)")
    p.add_argument("--n-test", type=int, default=None, help="test points (default: the preset's)")
    p.add_argument("--parameterization", default="ntk", help="ntk (paper) or standard")
    p.add_argument("--attn-layers", type=int, default=1, help="stacked linearized attention layers k")
    p.add_argument("--attn-rank", type=int, default=None, help="keep the top-r singular directions in C")
    add_centre_arg(p)
    p.add_argument("--plot", default=None, metavar="FILE", help="write a PNG of distance vs width")


def config_from_args(args: argparse.Namespace) -> DistanceConfig:
    check_data_args(args, paths=True)
    pre = preset(args.preset)
    seeds = args.seeds if args.seeds is not None else len(pre["seeds"])
    if seeds < 1:
        from theory.errors import UserInputError

        raise UserInputError(f"--seeds must be >= 1, got {seeds}")
    return DistanceConfig(
        dataset=args.dataset, task=args.task, classes=args.classes,
        models=parse_choices(args.model, "model", MODEL_KINDS),
        widths=parse_int_list(args.widths, "--widths") if args.widths else tuple(pre["widths"]),
        seeds=tuple(range(seeds)),
        n_train=args.n_train if args.n_train is not None else pre["n_train"],
        n_test=args.n_test if args.n_test is not None else pre["n_test"],
        sample=args.sample,
        train=train_config_from_args(args, pre),
        parameterization=args.parameterization, attn_layers=args.attn_layers, attn_rank=args.attn_rank,
        attn_centre=args.centre,
        data_dir=args.data_dir, device=args.device,
    )


def summary_table(result: dict) -> str:
    rows = []
    for kind, res in result["models"].items():
        for w, pw in res["per_width"].items():
            rows.append([kind, w] + [mean_pm(pw[m]) for m in ("function_abs", "function_rel", "function_lin",
                                                                "kernel_drift", "kernel_distance",
                                                                "init_vs_analytic")]
                        + [mean_pm(pw["test_acc"])])
    out = [text_table(["model", "width", "||f_m-f_NTK||", "relative", "vs f_lin (rel)", "kernel drift", "Fort dist",
                       "Theta0 vs analytic", "test acc"], rows), ""]
    trows = []
    for kind, res in result["models"].items():
        for metric in METRICS:
            tr = res["trends"][metric]
            trows.append([kind, metric, tr["verdict"], tr["spearman"], tr["loglog_slope"],
                          f"{tr['seeds_agreeing']}/{tr['seeds']}"])
    out.append(text_table(["model", "metric", "trend vs width", "Spearman rho", "log-log slope", "seeds agree"],
                          trows))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_ntk_distance(cfg, seed_map=seed_map(args, "ntk-distance"))
    result["executor"] = args.executor
    result["preset"] = args.preset
    prov = result["data"]
    print(f"NTK distance vs width — {prov.get('label', cfg.dataset)}, task {cfg.task}, "
          f"n_train={cfg.n_train}, n_test={cfg.n_test}, seeds={len(cfg.seeds)}, "
          f"protocol {cfg.train.protocol} ({cfg.train.optimizer}, {cfg.train.epochs} epochs), loss {cfg.train.loss}, "
          f"{cfg.parameterization} parameterisation{centre_note(cfg.attn_centre)}",
          file=sys.stdout if args.json != "-" else sys.stderr)
    print(summary_table(result), file=sys.stdout if args.json != "-" else sys.stderr)
    if args.plot:
        from reports.figures import distance_vs_width

        distance_vs_width(result, args.plot)
    emit_json(args.json, result)
    return 0
