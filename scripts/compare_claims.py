"""Compare two claims.json files, ignoring what may legitimately differ between runs of the same code.

Used to show that a refactor changed no number and no verdict: run `verify claims --preset smoke` before and after,
then

    python scripts/compare_claims.py tests/data/smoke-claims-43279c4.json.gz NEW/claims.json

Ignored: run metadata (time of generation, code version, git state, library versions, device, executor) and every
wall-clock timing (keys ending in `wall_s`, `seconds`, `timings`). Everything else, including every float, must be
equal (floats to a relative 1e-12). Exit 0 when identical, 1 with the differing paths listed.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

IGNORED_KEYS = frozenset({"generated", "created", "code_version", "git", "versions", "device", "executor",
                          "result_sha256"})
IGNORED_SUFFIXES = ("wall_s", "seconds", "timings")
REL_TOL = 1e-12


def load(path: str | Path) -> Any:
    """A claims.json, plain or gzipped."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or key.endswith(IGNORED_SUFFIXES)


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Paths where `old` and `new` differ (ignoring the keys above)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            if _ignored(k):
                continue
            if k not in old or k not in new:
                out.append(f"{path}/{k}: only in {'new' if k not in old else 'old'}")
                continue
            out += differences(old[k], new[k], f"{path}/{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: length {len(old)} != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(old, float) or isinstance(new, float):
        if isinstance(old, (int, float)) and isinstance(new, (int, float)):
            a, b = float(old), float(new)
            if (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0):
                return []
        return [f"{path}: {old!r} != {new!r}"]
    return [] if old == new else [f"{path}: {old!r} != {new!r}"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python scripts/compare_claims.py OLD_CLAIMS.json[.gz] NEW_CLAIMS.json[.gz]\n")
        return 2
    try:
        old, new = load(args[0]), load(args[1])
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"compare_claims: cannot read {exc}; pass two claims.json files\n")
        return 2
    diffs = differences(old, new)
    if not diffs:
        n = len(old.get("claims", [])) if isinstance(old, dict) else 0
        print(f"identical apart from run metadata and timings ({n} claims)")
        return 0
    print(f"{len(diffs)} differences:")
    for d in diffs[:200]:
        print(f"  {d}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
