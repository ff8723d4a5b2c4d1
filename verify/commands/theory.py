"""`verify theory`: check every theoretical claim of arXiv:2603.13085 and print a verdict table.

Runs `theory.checks.run_all_checks` (sympy, float64, mpmath, seeded Monte Carlo; seconds on a CPU).
A verdict such as "does not hold as stated" is a result, not a failure: the exit code is 0 whenever
every check ran, and 1 only if a check crashed.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from empirics.records import library_versions
from ntkm.codec import dumps, encode
from theory.checks import CRASHED, CheckResult, run_all_checks
from verify.commands._common import emit_json
from verify.commands.options import JSON, options

NAME = "theory"
HELP = "check the paper's theorems (Thm 4.1, 4.2, 4.7, Prop 4.5, stacking, truncation, LOO)"
DESCRIPTION = (
    "Check each theoretical claim of arXiv:2603.13085 with exact (sympy), stable float64 and "
    "high-precision (mpmath) computations, and print claim, method, verdict and evidence."
)
ORDER = 10


@dataclass(frozen=True)
class TheoryOptions:
    """`verify theory`'s own option."""

    seed: int = field(default=0, metadata={"help": "seed of the random test matrices (default %(default)s)"})


OPTIONS = (JSON, *options(TheoryOptions, "seed"))


def _table(results: list[CheckResult]) -> str:
    """Aligned plain-text table: claim, statement, method, verdict, then the detail (unpadded)."""
    header = ("claim", "statement", "method", "verdict", "detail")
    rows = [(r.claim_id, r.statement, r.method, r.verdict, r.detail) for r in results]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]

    rule = "  ".join("-" * w for w in widths) + "  " + "-" * 6
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _record(results: list[CheckResult], seed: int, seconds: float) -> dict[str, Any]:
    return {
        "command": "verify theory",
        "paper": "arXiv:2603.13085",
        "seed": seed,
        "wall_s": seconds,
        "library_versions": library_versions(),
        "checks": encode(results),
    }


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    results = run_all_checks(seed=args.seed)
    record = _record(results, args.seed, time.perf_counter() - start)
    if args.json == "-":
        sys.stdout.write(dumps(record))
    else:
        print(_table(results))
        if args.json:
            emit_json(args.json, record)
            print(f"\nwrote {args.json}")
    crashed = [r.claim_id for r in results if r.verdict == CRASHED]
    if crashed:
        sys.stderr.write(f"verify theory: {len(crashed)} check(s) crashed: {', '.join(crashed)}\n")
        return 1
    return 0
