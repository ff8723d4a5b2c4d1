"""Regression guard: which rows of a benchmark record got slower or less accurate than an older one.

    python -m benchmarks --compare OLD.json                  # run, then compare the new record with OLD
    python -m benchmarks --compare OLD.json --against NEW.json   # compare two records, run nothing

Rows are matched by (bench, case). A row is **slower** when its fastest new repeat is slower than
the slowest old repeat (the spreads do not overlap) and its median grew by more than the noise
margin (10 %); single-run rows (no spread) are given a spread of +-`margin`.
A check is **less accurate** when it passed before and fails now, or, for an error check
(`<=`), when its value grew more than `error_factor` times (and above 1e-12, where rounding lives),
or, for a score check (`>=`) or an informational correlation, when it fell by more than `score_drop`
(5 % of its value, at least 0.05). Informational checks named as a difference or error count as errors.
The load averages of both runs are printed, because a busy machine slows everything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import fmt_num, fmt_time


@dataclass(frozen=True)
class Thresholds:
    """How far beyond the spread a change must go before it is reported."""

    margin: float = 0.10
    error_factor: float = 10.0
    error_floor: float = 1e-12
    score_drop: float = 0.05


@dataclass
class Finding:
    """One regression (or improvement) of one row."""

    kind: str
    bench: str
    case: str
    detail: str


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return str(row.get("bench", "")), str(row.get("case", ""))


def _is_error(check: dict[str, Any]) -> bool:
    """Whether larger is worse: gated `<=` checks, and informational ones named as a difference or error."""
    if check.get("threshold") is not None:
        return check.get("op", "<=") == "<="
    label = str(check.get("label", "")).lower()
    return any(w in label for w in ("diff", "err", "excess", "differing"))


def _interval(row: dict[str, Any], margin: float) -> tuple[float, float, float] | None:
    """(min, median, max) of a row's measured time; None for rows without a measured time."""
    t = row.get("timing")
    if not t or row.get("status") == "FAILED" or row.get("extrapolated_s") is not None:
        return None
    med = float(t["median_s"])
    lo, hi = float(t.get("min_s", med)), float(t.get("max_s", med))
    if int(t.get("repeats", 1)) <= 1:
        lo, hi = med * (1 - margin), med * (1 + margin)
    return lo, med, hi


def compare_rows(old: list[dict[str, Any]], new: list[dict[str, Any]], th: Thresholds = Thresholds()
                 ) -> list[Finding]:
    """Regressions and improvements of `new` against `old`, row by row."""
    before = {_key(r): r for r in old}
    out: list[Finding] = []
    for r in new:
        o = before.get(_key(r))
        if o is None:
            continue
        bench, case = _key(r)
        a, b = _interval(o, th.margin), _interval(r, th.margin)
        if a and b:
            if b[0] > a[2] and b[1] > a[1] * (1 + th.margin):
                out.append(Finding("slower", bench, case, f"{fmt_time(a[1])} [{fmt_time(a[0])}-{fmt_time(a[2])}] -> "
                                   f"{fmt_time(b[1])} [{fmt_time(b[0])}-{fmt_time(b[2])}] ({b[1] / a[1]:.2f}x)"))
            elif b[2] < a[0] and b[1] * (1 + th.margin) < a[1]:
                out.append(Finding("faster", bench, case, f"{fmt_time(a[1])} -> {fmt_time(b[1])} "
                                   f"({a[1] / b[1]:.2f}x faster)"))
        checks_old = {c["label"]: c for c in o.get("checks", [])}
        for c in r.get("checks", []):
            p = checks_old.get(c["label"])
            if p is None:
                continue
            v0, v1 = float(p["value"]), float(c["value"])
            worse = ""
            if p.get("passed", True) and not c.get("passed", True):
                worse = "passed before, fails now"
            elif not (math.isfinite(v0) and math.isfinite(v1)):
                worse = "" if math.isfinite(v0) == math.isfinite(v1) else "no longer finite"
            elif _is_error(c):
                if v1 > max(v0 * th.error_factor, th.error_floor):
                    worse = f"error grew {v1 / v0:.3g}x" if v0 > 0 else "error grew from 0"
            elif v0 - v1 > max(th.score_drop * abs(v0), th.score_drop):
                worse = "score fell"
            if worse:
                out.append(Finding("less accurate", bench, case,
                                   f"{c['label']}: {fmt_num(v0)} -> {fmt_num(v1)} ({worse})"))
    return out


def load_record(path: str | Path) -> dict[str, Any]:
    """A benchmark record written by `python -m benchmarks --json`."""
    rec = json.loads(Path(path).read_text())
    if "rows" not in rec:
        raise ValueError(f"{path} is not a benchmark record (no 'rows')")
    return rec


def render(old: dict[str, Any], new: dict[str, Any], findings: list[Finding], old_name: str, new_name: str) -> str:
    """The comparison as Markdown: both runs' load, then one line per finding."""
    def load(rec: dict[str, Any]) -> str:
        env = rec.get("environment", {})
        return (f"{env.get('date_utc', '?')}, commit {env.get('git_commit', '?')}, load average "
                f"{env.get('load_average_start')} -> {env.get('load_average_end')}")

    matched = len({_key(r) for r in old["rows"]} & {_key(r) for r in new["rows"]})
    lines = [f"Comparison: {old_name} ({load(old)}) against {new_name} ({load(new)}); {matched} rows matched.", ""]
    bad = [f for f in findings if f.kind != "faster"]
    good = [f for f in findings if f.kind == "faster"]
    if not bad:
        lines.append("No row got slower or less accurate beyond its spread.")
    else:
        lines += ["| change | benchmark | case | detail |", "|---|---|---|---|"]
        lines += [f"| {f.kind} | {f.bench} | {f.case} | {f.detail} |" for f in bad]
    if good:
        lines += ["", "Faster beyond the spread: " + "; ".join(f"{f.bench} ({f.case}): {f.detail}" for f in good)]
    return "\n".join(lines)


def compare_files(old_path: str | Path, new_path: str | Path, th: Thresholds = Thresholds()) -> tuple[str, int]:
    """Markdown report and exit status (1 when anything regressed) for two record files."""
    old, new = load_record(old_path), load_record(new_path)
    return compare_records(old, new, str(old_path), str(new_path), th)


def compare_records(old: dict[str, Any], new: dict[str, Any], old_name: str, new_name: str,
                    th: Thresholds = Thresholds()) -> tuple[str, int]:
    """Markdown report and exit status (1 when anything regressed) for two loaded records."""
    findings = compare_rows(old["rows"], new["rows"], th)
    return render(old, new, findings, old_name, new_name), int(any(f.kind != "faster" for f in findings))
