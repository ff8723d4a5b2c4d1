"""Calibrate and check the units' cost model (`verify.costs`) against the measured unit times of a claims run.

    python -m benchmarks.costs results/claims-quick.json --include-cached [--json FILE]

Fits the analytic model's constants to the run's `units[name]["wall_s"]` (the units in the run's order, one
process, so networks an earlier unit trained are reused), and reports how well they predict: Spearman rank
correlation and the median (10th-90th percentile) of measured / estimated, for the stored constants
(`verify.costs.CALIBRATED`), for the fit on every unit, and leave-one-out (each unit predicted by a fit without
it). Cached units (no time measured) are left out.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ntkm.codec import read_json, write_json
from verify import costs


def _units(record: dict[str, Any],
           include_cached: bool = False) -> tuple[list[tuple[str, dict[str, Any]]], list[float]]:
    """(name, config) in run order and measured seconds of every unit the run computed (`include_cached`: also the
    cached ones, with the time stored by the run that computed them)."""
    rows = [(name, u) for name, u in record["units"].items() if include_cached or not u.get("cached")]
    return [(name, u["config"]) for name, u in rows], [float(u["wall_s"]) for _, u in rows]


def leave_one_out(units: list[tuple[str, dict[str, Any]]], wall: list[float]) -> list[float]:
    """Each unit's estimate from constants fitted to the others (its run-order context kept)."""
    out = []
    feats = costs.features(units)
    for i in range(len(units)):
        keep = [j for j in range(len(units)) if j != i]
        c = costs.fit([units[j] for j in keep], [wall[j] for j in keep])
        out.append(sum(f * c[k] for f, k in zip(feats[i], costs.CONSTANT_NAMES, strict=True)))
    return out


def report(record: dict[str, Any], include_cached: bool = False) -> dict[str, Any]:
    units, wall = _units(record, include_cached)
    fitted = costs.fit(units, wall)
    est = {"stored": [c.total_s for c in costs.plan(units).values()],
           "fitted": [c.total_s for c in costs.plan(units, costs.Analytic(fitted)).values()],
           "leave_one_out": leave_one_out(units, wall)}
    return {"source": {"code_version": record.get("code_version"), "git": (record.get("git") or {}).get("commit"),
                       "preset": record.get("preset")},
            "constants_fitted": fitted, "constants_stored": dict(costs.CALIBRATED.c),
            "agreement": {k: costs.agreement(v, wall) for k, v in est.items()},
            "units": [{"unit": n, "measured_s": w, **{f"{k}_s": v[i] for k, v in est.items()}}
                      for i, ((n, _), w) in enumerate(zip(units, wall, strict=True))]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("claims_json", help="a claims.json whose units were computed (not cached)")
    ap.add_argument("--json", default=None, help="write the record here")
    ap.add_argument("--include-cached", action="store_true",
                    help="also fit cached units, at the time stored by the run that computed them (a --resume "
                         "re-render of a run on the same machine keeps those times)")
    args = ap.parse_args(argv)
    record = read_json(args.claims_json)
    if not _units(record, args.include_cached)[0]:
        print(f"benchmarks.costs: {args.claims_json} has no unit computed by its run (all cached, e.g. a --resume "
              "re-render); give the claims.json of a run that computed its units, or --include-cached", file=sys.stderr)
        return 2
    rec = report(record, args.include_cached)
    print("constants (s per unit of feature): " + ", ".join(f"{k}={v:.3g}" for k, v in rec["constants_fitted"].items()))
    for k, a in rec["agreement"].items():
        print(f"{k:<14} Spearman {a['spearman']:.3f}, measured/estimated median {a['median_ratio']:.2f} "
              f"(10-90 %: {a['ratio_p10']:.2f}-{a['ratio_p90']:.2f}), total {a['total_ratio']:.2f}, {a['units']} units")
    for u in sorted(rec["units"], key=lambda u: -u["measured_s"]):
        print(f"  {u['unit']:<40} measured {u['measured_s']:7.1f} s  fitted {u['fitted_s']:7.1f} s  "
              f"leave-one-out {u['leave_one_out_s']:7.1f} s")
    if args.json:
        write_json(args.json, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
