"""`verify ntk-distance`: NTK distance against width for 2L-ReLU and MLP-Attn (docs/PAPER.md table 1)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from empirics.experiments.distance import METRICS, DistanceConfig, DistanceRecord, run_ntk_distance
from empirics.vocab import MODEL_KINDS
from ntkm.codec import decode
from reports.text import mean_pm, text_table
from verify.commands._common import centre_note, check_data_args, emit_json, seed_map
from verify.commands.options import (
    EXPERIMENT,
    PATH_DATA,
    Param,
    choices,
    options,
    seed_range,
    train_config,
    values,
)
from verify.presets import parse_int_list, preset

NAME = "ntk-distance"
HELP = "NTK distance vs width for 2L-ReLU and MLP-Attn on real data"
ORDER = 30


@dataclass(frozen=True)
class DistanceOutputs:
    """`verify ntk-distance`'s own option (not part of the experiment's config)."""

    plot: str | None = field(default=None, metadata={"help": "write a PNG of distance vs width", "metavar": "FILE"})


PARAMS = options(
    DistanceConfig,
    Param("models", parse=choices("model", MODEL_KINDS)),
    Param("widths", preset="widths", parse=lambda text: parse_int_list(text, "--widths")),
    Param("n_train", preset="n_train"),
    Param("n_test", preset="n_test"),
    "parameterization", "attn_layers", "attn_rank", "attn_centre", "preprocess",
)
OPTIONS = (*EXPERIMENT, *PARAMS, *options(DistanceOutputs, "plot"))


def config_from_args(args: argparse.Namespace) -> DistanceConfig:
    check_data_args(args, paths=True)
    pre = preset(args.preset)
    return DistanceConfig(**values(PATH_DATA, args), seeds=seed_range(args, pre), **values(PARAMS, args, pre),
                          train=train_config(args, pre), device=args.device)


def summary_table(result: DistanceRecord) -> str:
    rows = []
    for kind, res in result.models.items():
        for w, pw in res.per_width.items():
            rows.append([kind, w] + [mean_pm(pw[m]) for m in ("function_abs", "function_rel", "function_lin",
                                                                "kernel_drift", "kernel_distance",
                                                                "init_vs_analytic")]
                        + [mean_pm(pw["test_acc"])])
    out = [text_table(["model", "width", "||f_m-f_NTK||", "relative", "vs f_lin (rel)", "kernel drift", "Fort dist",
                       "Theta0 vs analytic", "test acc"], rows), ""]
    trows = []
    for kind, res in result.models.items():
        for metric in METRICS:
            tr = res.trends[metric]
            trows.append([kind, metric, tr.verdict, tr.spearman, tr.loglog_slope, f"{tr.seeds_agreeing}/{tr.seeds}"])
    out.append(text_table(["model", "metric", "trend vs width", "Spearman rho", "log-log slope", "seeds agree"],
                          trows))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = run_ntk_distance(cfg, seed_map=seed_map(args, "ntk-distance"))
    record = {**result.to_dict(), "executor": args.executor, "preset": args.preset}
    prov = result.data
    print(f"NTK distance vs width — {prov.get('label', cfg.dataset)}, task {cfg.task}, "
          f"n_train={cfg.n_train}, n_test={cfg.n_test}, seeds={len(cfg.seeds)}, "
          f"protocol {cfg.train.protocol} ({cfg.train.optimizer}, {cfg.train.epochs} epochs), loss {cfg.train.loss}, "
          f"{cfg.parameterization} parameterisation{centre_note(cfg.attn_centre)}",
          file=sys.stdout if args.json != "-" else sys.stderr)
    print(summary_table(result), file=sys.stdout if args.json != "-" else sys.stderr)
    if args.plot:
        from reports.figures import distance_vs_width

        distance_vs_width(decode(record), args.plot)
    emit_json(args.json, record)
    return 0
