"""`verify kappa`: condition numbers of G = X X^T on real training images, and the width bounds.

For each n the first (or a seeded class-balanced) n training images are loaded, preprocessed,
and `theory.conditioning.condition_numbers` computes kappa(G), kappa_d(G) and kappa_eff from the
singular values of X in float64. kappa(G^3) = kappa(G)^3 (Thm 4.7) is reported in log space, and
Thm 4.7's v1 (`kappa^6 / eps^2`) and v2 (`kappa_d^6 n ln n`) width bounds with constant 1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from empirics.datasets import PREPROCESSING, SOURCES, load_dataset, preprocess
from empirics.records import library_versions
from theory.bounds import width_bound_v1, width_bound_v2
from theory.conditioning import condition_numbers, log10_kappa_power
from theory.errors import UserInputError
from verify.commands._common import add_data_args, check_data_args, emit_json, json_target
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
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_args(p)
    p.add_argument("--n", default="100,500", help="comma-separated numbers of training images (default: %(default)s)")
    p.add_argument("--preprocess", default="raw", help="raw (pixels in [0,1]), center or standardize (per pixel)")
    p.add_argument("--eps", type=float, default=0.1, help="accuracy eps in the v1 bound kappa^6/eps^2 (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the balanced subset (default 0)")
    p.add_argument("--source", default="auto", help="auto (files, else bundled sample), full or bundled")
    p.add_argument("--json", default=None, metavar="FILE", type=json_target,
                   help="write the record as JSON ('-' = stdout)")


def kappa_rows(
    dataset: str,
    ns: tuple[int, ...],
    *,
    task: str = "10class",
    sample: str = "balanced",
    preprocessing: str = "raw",
    eps: float = 0.1,
    seed: int = 0,
    data_dir: str | None = None,
    source: str = "auto",
) -> list[dict[str, Any]]:
    """One record per n: condition numbers, kappa^3 (log10), both width bounds and data provenance."""
    rows = []
    for n in ns:
        t0 = time.perf_counter()
        ds = load_dataset(
            dataset,
            n_train=n,
            n_test=1,
            task=task,
            sample=sample,
            seed=seed,
            data_dir=data_dir,
            source=source,
        )
        cn = condition_numbers(preprocess(ds.x_train, preprocessing))
        log10_k3 = log10_kappa_power(cn["kappa"], 3)
        rows.append(
            {
                **{
                    k: cn[k]
                    for k in (
                        "n",
                        "d",
                        "rank",
                        "kappa",
                        "kappa_d",
                        "kappa_eff",
                        "log10_kappa",
                        "log10_kappa_d",
                        "log10_kappa_eff",
                        "sigma_max",
                        "sigma_min",
                    )
                },
                "kappa_cubed": math.inf if log10_k3 > 308 else 10.0**log10_k3,
                "log10_kappa_cubed": log10_k3,
                "bound_v1": width_bound_v1(cn["kappa"], eps),
                "bound_v2": width_bound_v2(cn["kappa_d"], n),
                "provenance": ds.provenance,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
    return rows


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
        task=args.task,
        sample=args.sample,
        preprocessing=args.preprocess,
        eps=args.eps,
        seed=args.seed,
        data_dir=args.data_dir,
        source=args.source,
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
