"""`verify kappa`: condition numbers of G = X X^T on real training images, and the width bounds.

This module parses the options and prints the table; the sweep itself (load n images, kappa(G),
kappa_d(G), kappa_eff, kappa(G)^3 and Thm 4.7's v1 / v2 width bounds) is `empirics.experiments.kappa.kappa_rows`,
which `verify claims` runs too.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from empirics.data.datasets import PREPROCESSING, SOURCES, DataRequest
from empirics.experiments.kappa import kappa_rows
from empirics.records import library_versions
from ntkm.errors import UserInputError
from verify.commands._common import check_data_args, emit_json
from verify.commands.options import JSON, data_options, options
from verify.presets import parse_int_list

NAME = "kappa"
HELP = "condition numbers kappa(G), kappa_d(G), kappa(G)^3 and width bounds on real data"
ORDER = 20

DEFINITIONS = {
    "G": "X X^T, X = the n training images as rows (after --preprocess)",
    "kappa": "lambda_1 / lambda_n of G; inf when rank(X) < n (always for n > d)",
    "kappa_d": "lambda_1 / lambda_min(n,d) of G (rank-min(n,d) truncation, paper v2); inf when rank < min(n,d)",
    "kappa_eff": "lambda_1 / lambda_rank of G (the nonzero spectrum only); finite unless X = 0",
    "kappa_cubed": "kappa(G^3) = kappa(G)^3 (Thm 4.7), computed as 3 log10 kappa",
    "rank": "number of singular values of X above max(n, d) * eps * sigma_1",
    "bound_v1": "m = kappa^6 / eps^2 (Thm 4.7 v1, constant 1)",
    "bound_v2": "m = kappa_d^6 * n * ln(n) (Thm 4.7 v2, constant 1)",
    "raw": "pixels in [0, 1] as loaded",
    "center": "subtract the per-pixel mean of the n images (G then has rank <= n - 1, so kappa = inf; see kappa_eff)",
    "standardize": "center, then divide by the per-pixel std of the n images (constant pixels stay 0)",
    "channel": "subtract the per-channel mean, divide by the per-channel std of the n images (the networks' "
               "--preprocess channel)",
    "unit": "channel, then each image scaled to unit Euclidean norm (the networks' --preprocess unit)",
}


@dataclass(frozen=True)
class KappaOptions:
    """`verify kappa`'s own options (the data options are the shared `DataOptions`)."""

    n: str = field(default="100,500", metadata={
        "help": "comma-separated numbers of training images (default: %(default)s)"})
    preprocess: str = field(default="raw", metadata={
        "help": "raw (pixels in [0,1]), center or standardize (per pixel), channel or unit (per colour channel; "
                "unit also scales each image to norm 1)"})
    eps: float = field(default=0.1, metadata={
        "help": "accuracy eps in the v1 bound kappa^6/eps^2 (default %(default)s)"})
    seed: int = field(default=0, metadata={"help": "seed of the balanced subset (default %(default)s)"})
    source: str = field(default="auto", metadata={"help": "auto (files, else bundled sample), full or bundled"})


OPTIONS = (*data_options(), *options(KappaOptions, "n", "preprocess", "eps", "seed", "source"), JSON)


def _num(log10: float) -> str:
    """A positive number from its log10: plain below 1e6, `10^x` above, `inf` when infinite."""
    if math.isinf(log10):
        return "inf"
    if log10 < 6:
        return f"{10.0**log10:.4g}"
    return f"10^{log10:.2f}"


def _provenance_line(prov: dict[str, Any]) -> str:
    files = ", ".join(f"{f['name']} sha256 {f['sha256'][:12]}" for f in prov.get("files", []))
    return (
        f"data: {prov['label']} [{prov['source']}] at {prov['location']}"
        + (f" ({files})" if files else "")
        + f"; sample={prov['sample']} seed={prov['seed']} task={prov['task']}"
    )


def render(record: dict[str, Any]) -> str:
    from reports.text import text_table

    rows = [
        [
            r["n"],
            r["d"],
            r["rank"],
            _num(r["log10_kappa"]),
            _num(r["log10_kappa_d"]),
            _num(r["log10_kappa_eff"]),
            _num(r["log10_kappa_cubed"]),
            _num(r["bound_v1"].log10_value),
            _num(r["bound_v2"].log10_value),
            f"{r['seconds']:.1f}s",
        ]
        for r in record["rows"]
    ]
    head = [
        "n",
        "d",
        "rank",
        "kappa(G)",
        "kappa_d(G)",
        "kappa_eff",
        "kappa(G)^3",
        f"v1 m>=k^6/eps^2 (eps={record['eps']:g})",
        "v2 m>=kd^6 n ln n",
        "time",
    ]
    prov = {_provenance_line(r["provenance"]) for r in record["rows"]}
    lines = [
        f"kappa of G = X X^T, {record['dataset']} ({record['task']}), {record['sample']} n images, "
        f"preprocess={record['preprocess']}",
        text_table(head, rows),
        "",
    ]
    lines += sorted(prov)
    if any(r["provenance"].get("note") for r in record["rows"]):
        lines.append("note: no data files found; this is the bundled sample (see `verify data info`)")
    lines.append("kappa = inf: G is singular (rank < n); kappa_eff is lambda_1/lambda_rank. Bounds use constant 1.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_data_args(args)
    if args.preprocess not in PREPROCESSING:
        raise UserInputError(f"unknown --preprocess '{args.preprocess}'; choose {', '.join(PREPROCESSING)}")
    if args.source not in SOURCES:
        raise UserInputError(f"unknown --source '{args.source}'; choose {', '.join(SOURCES)}")
    ns = parse_int_list(args.n, "--n", minimum=2)
    if not (math.isfinite(args.eps) and args.eps > 0):
        raise UserInputError(f"--eps must be a positive number, got {args.eps}")
    if args.seed < 0:
        raise UserInputError(f"--seed must be >= 0, got {args.seed}")
    rows = kappa_rows(
        args.dataset,
        ns,
        request=DataRequest(
            task=args.task,
            sample=args.sample,
            seed=args.seed,
            data_dir=args.data_dir,
            source=args.source,
        ),
        preprocess=args.preprocess,
        eps=args.eps,
    )
    record = {
        "command": "kappa",
        "dataset": args.dataset,
        "task": args.task,
        "sample": args.sample,
        "preprocess": args.preprocess,
        "eps": args.eps,
        "seed": args.seed,
        "definitions": {k: v for k, v in DEFINITIONS.items() if k not in PREPROCESSING or k == args.preprocess},
        "rows": rows,
        "library_versions": library_versions(),
    }
    if args.json == "-":
        emit_json("-", record)
        return 0
    sys.stdout.write(render(record) + "\n")
    emit_json(args.json, record)
    return 0
