"""Comparing two `verify claims` runs' claims.json: every claim and unit result, run-dependent fields left out."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Run-dependent fields of a unit's result (timings, the machine, the digest of the exact bits, the code version of
#: whatever was checked out at the time), left out of the comparison.
VOLATILE = {"wall_s", "unit_wall_s", "device", "measure_wall_s", "train_wall_s", "seconds", "elapsed_s",
            "result_sha256", "code_version"}


def same(a: Any, b: Any, rel: float = 0.0, path: str = "") -> list[str]:
    """Where two JSON values differ (floats compared to `rel`, NaN equal to NaN, everything else exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in same(a[k], b[k], rel, f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in same(x, y, rel, f"{path}/{i}")]
    if isinstance(a, float) and isinstance(b, float):
        ok = math.isclose(a, b, rel_tol=rel, abs_tol=1e-12 if rel else 0.0) or (a != a and b != b)
        return [] if ok else [f"{path}: {a} {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def strip(v: Any) -> Any:
    """`v` without the `VOLATILE` fields (and any `*_wall_s`), at every depth."""
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in VOLATILE and not k.endswith("_wall_s")}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def claims_of(out: Path) -> dict[str, Any]:
    """The comparable part of `out/claims.json`: the claims, the unit results and the unit names."""
    rec = json.loads((out / "claims.json").read_text())
    return {"claims": strip(rec["claims"]), "results": strip(rec["results"]), "units": sorted(rec["units"])}
