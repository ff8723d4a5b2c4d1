"""What the claims report says about pre-registration: each rule's status (unchanged since before the first
recorded run, or changed after one, naming the deviations of `docs/DEVIATIONS.md`), the deviations list and the
claims whose verdict sits on a knife edge (`verify.reproducibility`). Reads only the claims.json record."""

from __future__ import annotations

from typing import Any


def deviations_of(record: dict[str, Any], claim_id: str) -> list[dict[str, Any]]:
    """The deviations recorded in `record` that touched claim `claim_id`'s rule or design (`all`: every claim,
    `empirical`: every claim judged on trained networks; `verify.preregistration`)."""
    entries = (record.get("preregistration") or {}).get("deviations") or []
    empirical = any(c.get("empirical") for c in record.get("claims", []) if c.get("id") == claim_id)
    return [d for d in entries
            if "all" in d["claims"] or claim_id in d["claims"] or (empirical and "empirical" in d["claims"])]


def _short(d: dict[str, Any]) -> str:
    return f"{d['id']} ({d['date']}, {d['commit']})"


def rule_status(record: dict[str, Any], claim_id: str) -> str:
    """How the report labels claim `claim_id`'s rule: 'fixed before the run' only where no deviation touched it
    and the record carries a pre-registration; otherwise which deviations changed it, or that nothing is known."""
    if "preregistration" not in record:
        return "as recorded; this record carries no pre-registration digest or deviations list"
    if (record["preregistration"] or {}).get("deviations") is None:
        return "deviations list unavailable (no docs/DEVIATIONS.md in this installation)"
    devs = deviations_of(record, claim_id)
    if not devs:
        return "fixed before the first recorded run; no deviation recorded"
    return "changed after a recorded run: " + "; ".join(_short(d) for d in devs) + " (see Deviations)"


def knife_edge_of(record: dict[str, Any], claim_id: str) -> list[dict[str, Any]]:
    """The knife-edge entries of `record` for claim `claim_id` (where its verdict moved under float noise)."""
    return [k for k in (record.get("reproducibility") or {}).get("knife_edge") or [] if k["claim"] == claim_id]


def preregistration_markdown(record: dict[str, Any]) -> list[str]:
    """The report's "Pre-registration and deviations" section as Markdown lines (empty for older records)."""
    pre = record.get("preregistration")
    if not pre:
        return []
    lines = ["## Pre-registration and deviations", "",
             f"Pre-registration sha256 `{pre['sha256']}` ({pre['method']}).", ""]
    devs = pre.get("deviations")
    if devs is None:
        lines += ["Deviations: unavailable (no docs/DEVIATIONS.md in this installation).", ""]
    else:
        lines += [f"Deviations: {len(devs)} change(s) made after a recorded run (docs/DEVIATIONS.md).", ""]
        for d in devs:
            lines.append(f"- **{d['id']}** ({d['date']}, commit {d['commit']}; claims: {', '.join(d['claims'])}): "
                         f"{d['what']} Why: {d['why']} Verdicts moved: {d['verdicts_moved']}"
                         + (f" After: {d['after_run']}." if d.get("after_run") else ""))
        lines.append("")
    rep = record.get("reproducibility")
    if rep:
        edges = rep.get("knife_edge") or []
        lines += [f"Float-noise check ({rep['method']}): "
                  + ("no verdict moved." if not edges else "knife edge — " + "; ".join(
                      f"{k['claim']} ({k['where']}: {' / '.join(k['verdicts'])})" for k in edges) + "."), ""]
    return lines
