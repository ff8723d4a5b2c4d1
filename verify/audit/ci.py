"""`verify audit` in a CI pipeline: the `--fail-on` gate, reading a saved record back (`read_record`, validated by
the typed record `verify.audit.record.AuditRecord`, whose generated JSON schema is committed), a Markdown summary
for a pull-request comment, and `verify audit diff OLD.json NEW.json` (what moved beyond its interval).

Exit codes of their own: `FAIL_ON_EXIT` (4) when the risk level reaches `--fail-on`, or no level could be issued
("not measurable", "not validated"), after every output was written; `DIFF_MOVED_EXIT` (5) when `verify audit
diff` finds a quantity that moved beyond its interval.

Diff rule (fixed before any comparison): a categorical quantity (risk level, validity verdict, breaking budget)
moved when its value differs; a numeric one moved when the 95 % intervals of the two records are disjoint.
Intervals: Wilson score intervals for proportions (flip rates on the k attacked points, test accuracies on the
test points, poison precision at k), the bootstrap interval the record holds for the LDS. A quantity present in
only one record, or NaN in one, is listed as not compared and never counts as moved.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from empirics.intervals import wilson
from empirics.vocab import NOT_MEASURABLE, PAPER_PAIR
from ntkm.codec import decode
from ntkm.errors import UserInputError
from ntkm.io import parse_json, read_regular
from verify.audit.config import SCHEMA_VERSION, SUMMARY_MARKER
from verify.audit.estimators import PAPER_ESTIMATOR
from verify.audit.record import SCHEMA_FILE, AuditRecord, Validity, parse_record, record_errors
from verify.audit.risk import RISK_LEVELS
from verify.audit.validity import level_note

FAIL_ON_EXIT = 4
DIFF_MOVED_EXIT = 5
FAIL_LEVELS = ("medium", "high")


def schema_path() -> Path:
    """The JSON Schema of the audit record (packaged with `verify`; generated from `verify.audit.record`)."""
    return SCHEMA_FILE


def load_schema() -> dict[str, Any]:
    """The committed JSON Schema of the audit record."""
    return json.loads(schema_path().read_text())


def reaches(level: str, threshold: str | None) -> bool:
    """Whether a risk level reaches the `--fail-on` threshold. "not measurable" and "not validated" reach every
    threshold: a gate that cannot read a level fails closed, so an unchecked model never passes as low."""
    if threshold is None:
        return False
    if level not in RISK_LEVELS:
        return True
    return RISK_LEVELS.index(level) >= RISK_LEVELS.index(threshold)


def read_record(path: str | Path, what: str, schema: bool = True) -> dict[str, Any]:
    """An audit record from a JSON file (the one reader of saved audits), one-line errors naming the fix; `what`
    names the option in them. Every record is validated by `verify.audit.record.AuditRecord` (fields a later
    version added are optional there, so an earlier record is read); `schema=True` (`diff`, `check`) also requires
    this version's schema_version, `--render` passes False, so a record of an earlier version is drawn wherever it
    has what the report draws. Only JSON is parsed: nothing in the file can run code."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserInputError(f"{what} {p} is a folder, not a file; give an audit record written by verify audit --json")
    if not p.exists():
        raise UserInputError(f"{what} {p}: no such file (give an audit record written by verify audit --json)")
    try:
        raw = parse_json(read_regular(p, what=what).decode("utf-8"))  # a named pipe or device: one line
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{what} {p} is not a JSON file ({str(exc).splitlines()[0]}); give an audit "
                             "record written by verify audit --json") from None
    if not isinstance(raw, dict) or raw.get("experiment") != "audit":
        raise UserInputError(f"{what} {p} is not an audit record (written by verify audit --json)")
    if schema and raw.get("schema_version") != SCHEMA_VERSION:
        raise UserInputError(f"{what} {p} has schema_version {raw.get('schema_version')!r}, this version reads "
                             f"{SCHEMA_VERSION}; rerun the audit with --json")
    errs = record_errors(raw)
    if errs:
        first = f"{errs[0]}{f' and {len(errs) - 1} more' if len(errs) > 1 else ''}"
        raise UserInputError(f"{what} {p} does not match the audit schema ({first}); rerun the audit with --json"
                             if schema else f"{what} {p} is not an audit record this version can draw (missing or "
                             f"malformed: {first}); rerun the audit with --json")
    return decode(raw)


# --- Markdown summary --------------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return "n/a" if not isinstance(v, (int, float)) or not math.isfinite(v) else f"{100 * v:.1f} %"


def summary_markdown(record: AuditRecord | dict[str, Any]) -> str:
    """A short Markdown summary of an audit record for a pull-request comment."""
    rec = parse_record(record)
    risk, models, user = rec.risk, rec.models, rec.user
    k = user.n_selected
    lo, hi = wilson(user.worst_flip_rate, k)
    name = Path(rec.model.path).name
    rows = [("worst-case flip rate", f"{_pct(user.worst_flip_rate)} ({user.worst_attack.upper()}; 95 % "
             f"interval {_pct(lo)} to {_pct(hi)}, {k} attacked points)"),
            ("random noise of the same size", f"{_pct(user.baseline.mean)} ± {_pct(user.baseline.std)}")]
    treated, control = PAPER_PAIR
    for key in (control, treated):
        if key in models:
            m = models[key]
            gate = "" if m.gate is None or m.gate.passed else ", below the adequacy gate: left out"
            rows.append((f"{m.label} reference", f"{_pct(m.worst_flip_rate)} (test accuracy {m.test_acc:.2f}{gate})"))
    if control not in models:
        rows.append(("references", f"paper-reported {_pct(risk.relu_reference)} (2L-ReLU) / "
                     f"{_pct(risk.attn_reference)} (MLP-Attn)"))
    rows.append(("your model's test accuracy", f"{user.test_acc:.2f}"))
    rows += _validity_rows(rec.panels.validity)
    if rec.lever_classes:
        dense = [c for c in rec.lever_classes if c.beyond_chance and c.over > 1]
        rows.append(("where the levers lie", "; ".join(
            f"class {c.class_}: {c.levers} of {k} levers, {c.over:.1f}x its share of the data (Holm p "
            f"{c.p_holm:.2g})" for c in dense) or "no class holds more of the levers than chance would give"))
    bud, po = rec.panels.budget, rec.panels.poison
    if bud is not None and bud.breaking_label:
        rows.append(("breaking budget", bud.breaking_label))
    if po is not None and po.rankings:
        rows.append((f"planted-poison precision at {po.k}",
                     f"{_pct(po.rankings[po.headline].precision)} (chance {_pct(po.chance)})"))
    elif po is not None and po.verdict:
        rows.append(("planted-poison self-test", po.verdict))
    proj = rec.model.projection
    if proj is not None and proj.dim:
        err = proj.error or {}
        rows.append(("kernel", f"projected to k = {proj.dim} ({proj.kind}); kernel relative error "
                     f"{err.get('kernel_rel_error', float('nan')):.3f}, influence rank correlation "
                     f"{err.get('influence_spearman', float('nan')):.3f} on {err.get('n', 0)} points"))
    cfg = rec.config
    head = f"**{risk.level.upper()}** risk" if risk.level in RISK_LEVELS else f"risk **{risk.level.upper()}**"
    lines = [SUMMARY_MARKER, f"### Malleability audit of `{name}`: {head}", "",
             "| | |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    lines += ["", f"Rule: {risk.rule}.", ""]
    if risk.reason:
        lines += [f"{risk.level.capitalize()}: {risk.reason}.", ""]
    if risk.advice:
        lines += [f"Next step: {risk.advice[0]}", ""]
    version = "?" if rec.schema_version is None else rec.schema_version
    lines.append(f"<sub>verify audit, schema {version}, {rec.created}; "
                 f"{rec.data.n_train} training / {rec.data.n_test} test points, eps {cfg.eps:.4g}, "
                 f"tau {cfg.tau:g}, seed {cfg.seed}; model sha256 {rec.model.sha256[:12]}"
                 f"{_code_note(rec)}</sub>")
    return "\n".join(lines) + "\n"


def _code_note(rec: AuditRecord) -> str:
    """'; code abc1234' (the suite's git commit, '+' for uncommitted changes) where the record has it, else ''."""
    if rec.code is None or not rec.code.commit:
        return ""
    return f"; code {rec.code.commit[:10]}{'+' if rec.code.dirty else ''}"


def _validity_rows(val: Validity | None) -> list[tuple[str, str]]:
    """The summary's rows of the validity panel: the verdict with the lead estimator's LDS, and the best estimator
    where it is another one."""
    if val is None or not val.verdict:
        return []
    lead = val.lead or PAPER_ESTIMATOR
    lds, ceil = val.lds.get(lead), val.ceiling
    of_ceiling = (f"; {lds.fraction:.2f} [{lds.fraction_lo:.2f}, {lds.fraction_hi:.2f}]"
                  f"{level_note(lds.fraction_level)} of the noise ceiling {ceil.value:.2f}") \
        if lds and lds.fraction is not None and ceil else ""
    extra = (f" ({lds.label or lead}, the lead estimator: LDS {lds.value:.2f} [{lds.lo:.2f}, "
             f"{lds.hi:.2f}]{of_ceiling})") if lds else ""
    rows = [("influence against re-fits", f"{val.verdict}{extra}")]
    if val.stability is not None:
        rows.append(("stability of that verdict", val.stability.text))
    best = val.lds.get(val.best) if val.best is not None else None
    if best and val.best != lead and best.fraction is not None:
        rows.append(("best estimator against re-fits", f"{best.label or val.best}: LDS {best.value:.2f} "
                     f"[{best.lo:.2f}, {best.hi:.2f}]; {best.fraction:.2f} [{best.fraction_lo:.2f}, "
                     f"{best.fraction_hi:.2f}]{level_note(best.fraction_level)} of the ceiling"))
    return rows


# --- diff ---------------------------------------------------------------------------------------------------


def _quantities(rec: AuditRecord) -> dict[str, tuple[Any, float, float] | str]:
    """Compared quantities by name: (value, lo, hi) for numbers, a string for categories."""
    q: dict[str, tuple[Any, float, float] | str] = {"risk level": rec.risk.level}
    n_test = rec.data.n_test
    for key, m in rec.models.items():
        k = m.n_selected
        for a, res in m.attacks.items():
            q[f"{key}: {a.upper()} flip rate"] = (res.flip_rate, *wilson(res.flip_rate, k))
        q[f"{key}: worst-case flip rate"] = (m.worst_flip_rate, *wilson(m.worst_flip_rate, k))
        q[f"{key}: test accuracy"] = (m.test_acc, *wilson(m.test_acc, n_test))
    val = rec.panels.validity
    if val is not None and val.verdict:
        q["validity verdict"] = val.verdict
        if val.stability is not None:
            q["validity verdict's stability"] = val.stability.label
        lead = val.lead or PAPER_ESTIMATOR
        lds = val.lds.get(lead)
        if lds is not None:
            q["validity: LDS (NTK influence)" if lead == PAPER_ESTIMATOR else
              f"validity: LDS ({lds.label or lead}, the lead estimator)"] = (lds.value, lds.lo, lds.hi)
    bud, po = rec.panels.budget, rec.panels.poison
    if bud is not None and bud.breaking_label:
        q["breaking budget"] = bud.breaking_label
    if po is not None and po.rankings:
        prec = po.rankings[po.headline].precision
        q[f"poison precision at k ({po.headline})"] = (prec, *wilson(prec, po.k))
    elif po is not None and po.verdict == NOT_MEASURABLE:
        q["poison self-test"] = NOT_MEASURABLE
    return q


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def diff_records(old_record: AuditRecord | dict[str, Any], new_record: AuditRecord | dict[str, Any]) -> dict[str, Any]:
    """Every compared quantity of two audit records and whether it moved (the rule in the module docstring)."""
    old, new = parse_record(old_record, "OLD"), parse_record(new_record, "NEW")
    qo, qn = _quantities(old), _quantities(new)
    rows = []
    for name in list(qo) + [k for k in qn if k not in qo]:
        a, b = qo.get(name), qn.get(name)
        if a is None or b is None:
            rows.append({"name": name, "old": a, "new": b, "status": "not compared",
                         "why": f"only in {'OLD' if b is None else 'NEW'}"})
        elif isinstance(a, str) or isinstance(b, str):
            rows.append({"name": name, "old": a, "new": b, "status": "moved" if a != b else "same"})
        elif not (_finite(a[0]) and _finite(b[0])):
            rows.append({"name": name, "old": a, "new": b, "status": "not compared", "why": "NaN in a record"})
        else:
            disjoint = a[2] < b[1] or b[2] < a[1]
            rows.append({"name": name, "old": a, "new": b, "status": "moved" if disjoint else "within"})
    settings = [k for k in ("n", "n_test", "eps", "tau", "attacks", "seed", "ref_width", "panels")
                if getattr(old.config, k, None) != getattr(new.config, k, None)]
    same_model = old.model.sha256 == new.model.sha256
    return {"rows": rows, "moved": [r["name"] for r in rows if r["status"] == "moved"], "settings_differ": settings,
            "same_model": same_model}


def _show(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def diff_text(d: dict[str, Any], old: str, new: str) -> str:
    """`verify audit diff`'s report: moved quantities first, then the rest."""
    lines = [f"verify audit diff {old} -> {new}"]
    if d["settings_differ"]:
        lines.append(f"note: the audits ran with different settings ({', '.join(d['settings_differ'])}); moves may "
                     "come from the settings, not the model")
    lines.append(f"model file: {'the same' if d['same_model'] else 'changed'} (sha256)")
    width = max(len(r["name"]) for r in d["rows"])
    order = {"moved": 0, "within": 1, "same": 1, "not compared": 2}
    for r in sorted(d["rows"], key=lambda r: order[r["status"]]):
        tail = f" ({r['why']})" if r.get("why") else ""
        lines.append(f"  {r['status'].upper():<12} {r['name']:<{width}}  {_show(r['old'])} -> {_show(r['new'])}{tail}")
    n = len(d["moved"])
    lines.append(f"{n} quantit{'y' if n == 1 else 'ies'} moved beyond {'its' if n == 1 else 'their'} interval"
                 + (f" (exit {DIFF_MOVED_EXIT})" if n else "; nothing moved"))
    return "\n".join(lines) + "\n"
