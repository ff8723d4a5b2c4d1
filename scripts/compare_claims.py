"""Compare two claims.json files, ignoring what may legitimately differ between runs of the same code.

Used to show that a refactor changed no number and no verdict: run `verify claims --preset smoke` (or `quick`,
with `--only`) before and after, then

    python scripts/compare_claims.py tests/data/smoke-claims-43279c4.json.gz NEW/claims.json

Ignored: run metadata (time of generation, code version, git state, library versions, the machine, the executor),
the data files' locations (`location`, `path`: another clone reads the same files, their checksums are compared)
and every wall-clock timing (keys ending in `wall_s`, `seconds`, `timings`). The machine and library descriptions
(`device`, `versions`, `git`, `executor`) are ignored where they are objects; a unit's configured `device` (a
string, part of its cache key) is compared. Everything else, including every float, must be equal: floats to a
relative 1e-12 (same commit, same machine: the numbers are bit for bit the same), or to `--tolerance REL`.

Across machines the numbers may differ in their last bits (another BLAS, another CPU), and training amplifies
such differences; the verdicts must agree. `--verdicts` compares only the verdicts (every `verdict` field, the
headline and each protocol's or condition's): a claim that either record flags as a knife edge
(`reproducibility.knife_edge`, `verify.reproducibility`: its verdict moves under float noise of the stated
tolerance) is listed but does not fail the comparison.

Exit 0 when identical, 1 with the differing paths listed, 2 on unreadable input.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

#: Ignored wherever they occur (timestamps, code versions, the digest of a result's exact bits and timings, and
#: where the data files lie on this machine: a clone elsewhere reads the same files, whose checksums are compared).
IGNORED_KEYS = frozenset({"generated", "created", "code_version", "result_sha256", "location", "path"})
#: Ignored where their value is an object: descriptions of the machine, the libraries, the checkout, the executor.
IGNORED_OBJECTS = frozenset({"git", "versions", "device", "executor"})
IGNORED_SUFFIXES = ("wall_s", "seconds", "timings")
REL_TOL = 1e-12


def load(path: str | Path) -> Any:
    """A claims.json, plain or gzipped."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _ignored(key: str, old: Any, new: Any) -> bool:
    if key in IGNORED_KEYS or key.endswith(IGNORED_SUFFIXES):
        return True
    return key in IGNORED_OBJECTS and isinstance(old, (dict, type(None))) and isinstance(new, (dict, type(None)))


def differences(old: Any, new: Any, path: str = "", rel_tol: float = REL_TOL) -> list[str]:
    """Paths where `old` and `new` differ (ignoring the keys above; floats to `rel_tol`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            if _ignored(k, old.get(k), new.get(k)):
                continue
            if k not in old or k not in new:
                out.append(f"{path}/{k}: only in {'new' if k not in old else 'old'}")
                continue
            out += differences(old[k], new[k], f"{path}/{k}", rel_tol)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: length {len(old)} != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True))
                for d in differences(a, b, f"{path}[{i}]", rel_tol)]
    if isinstance(old, float) or isinstance(new, float):
        if isinstance(old, (int, float)) and isinstance(new, (int, float)):
            a, b = float(old), float(new)
            if (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0):
                return []
        return [f"{path}: {old!r} != {new!r}"]
    return [] if old == new else [f"{path}: {old!r} != {new!r}"]


def _verdicts(row: dict[str, Any], path: str = "") -> dict[str, str]:
    """Every verdict in a claims row, by where it sits ('verdict', 'by_protocol/proper/verdict', ...)."""
    out: dict[str, str] = {}
    for k, v in row.items():
        if k == "verdict" and isinstance(v, str):
            out[path + k] = v
        elif isinstance(v, dict):
            out.update(_verdicts(v, f"{path}{k}/"))
    return out


def _knife_edges(record: Any) -> set[str]:
    rep = record.get("reproducibility") if isinstance(record, dict) else None
    return {k["claim"] for k in (rep or {}).get("knife_edge") or []}


def verdict_differences(old: Any, new: Any) -> tuple[list[str], list[str]]:
    """The verdicts that differ between two claims records, as (failing, knife-edge) lines: a claim either record
    flags as a knife edge is not a failure."""
    rows = [{r["id"]: r for r in rec.get("claims", [])} if isinstance(rec, dict) else {} for rec in (old, new)]
    edges = _knife_edges(old) | _knife_edges(new)
    failing, knife = [], []
    for cid in sorted(set(rows[0]) | set(rows[1])):
        if cid not in rows[0] or cid not in rows[1]:
            failing.append(f"{cid}: only in {'new' if cid not in rows[0] else 'old'}")
            continue
        a, b = _verdicts(rows[0][cid]), _verdicts(rows[1][cid])
        for where in sorted(set(a) | set(b)):
            if a.get(where) != b.get(where):
                line = f"{cid} {where}: {a.get(where)!r} != {b.get(where)!r}"
                (knife if cid in edges else failing).append(line + (" (knife edge)" if cid in edges else ""))
    return failing, knife


USAGE = ("usage: python scripts/compare_claims.py [--tolerance REL | --verdicts] OLD_CLAIMS.json[.gz] "
         "NEW_CLAIMS.json[.gz]\n")


def _options(args: list[str]) -> tuple[list[str], float, bool] | str:
    """(files, relative tolerance, verdicts only), or the problem with the arguments."""
    files, tol, verdicts_only = [], REL_TOL, False
    it = iter(args)
    for a in it:
        if a == "--verdicts":
            verdicts_only = True
        elif a == "--tolerance" or a.startswith("--tolerance="):
            v = a.partition("=")[2] if "=" in a else next(it, "")
            try:
                tol = float(v)
            except ValueError:
                return f"--tolerance needs a number (a relative tolerance such as 1e-6), got {v!r}"
            if not (math.isfinite(tol) and tol >= 0):
                return f"--tolerance must be a finite number >= 0, got {v!r}"
        elif a.startswith("--"):
            return f"unknown option {a}"
        else:
            files.append(a)
    if len(files) != 2:
        return "pass two claims.json files"
    return files, tol, verdicts_only


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    opts = _options(args)
    if isinstance(opts, str):
        sys.stderr.write(f"compare_claims: {opts}\n{USAGE}")
        return 2
    files, tol, verdicts_only = opts
    try:
        old, new = load(files[0]), load(files[1])
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"compare_claims: cannot read {exc}; pass two claims.json files\n")
        return 2
    n = len(old.get("claims", [])) if isinstance(old, dict) else 0
    if verdicts_only:
        failing, knife = verdict_differences(old, new)
        for line in knife:
            print(f"  {line}")
        if failing:
            print(f"{len(failing)} verdicts differ:")
            for d in failing[:200]:
                print(f"  {d}")
            return 1
        print(f"every verdict agrees ({n} claims{f'; {len(knife)} knife-edge difference(s)' if knife else ''})")
        return 0
    diffs = differences(old, new, rel_tol=tol)
    if not diffs:
        print(f"identical apart from run metadata and timings ({n} claims"
              + (f", floats to a relative {tol:g}" if tol != REL_TOL else "") + ")")
        return 0
    print(f"{len(diffs)} differences:")
    for d in diffs[:200]:
        print(f"  {d}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
