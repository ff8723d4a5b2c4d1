"""`verify audit` in a CI pipeline: the `--fail-on` gate, the record's JSON schema and the check that a saved
record is one this version can draw (`check_record`, also used by `--render`), a Markdown summary for a
pull-request comment, and `verify audit diff OLD.json NEW.json` (what moved beyond its interval).

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
from verify.audit.risk import ALL_LEVELS, RISK_LEVELS

FAIL_ON_EXIT = 4
DIFF_MOVED_EXIT = 5
FAIL_LEVELS = ("medium", "high")


def schema_path() -> Path:
    """The JSON Schema of the audit record (packaged with `verify`)."""
    return Path(__file__).parents[1] / "schemas" / "audit.schema.json"


def load_schema() -> dict[str, Any]:
    return json.loads(schema_path().read_text())


def reaches(level: str, threshold: str | None) -> bool:
    """Whether a risk level reaches the `--fail-on` threshold. "not measurable" and "not validated" reach every
    threshold: a gate that cannot read a level fails closed, so an unchecked model never passes as low."""
    if threshold is None:
        return False
    if level not in RISK_LEVELS:
        return True
    return RISK_LEVELS.index(level) >= RISK_LEVELS.index(threshold)


# --- schema check (jsonschema, Draft 2020-12) -------------------------------------------------------------------


def _message(err: Any) -> str:
    """One error of the validator as a line naming where in the record it is (`$.risk.level: ...`)."""
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    kind, want, got = err.validator, err.validator_value, err.instance
    if kind == "required":
        missing = [k for k in want if isinstance(got, dict) and k not in got]
        return "; ".join(f"{where}: missing '{k}'" for k in missing) or f"{where}: {err.message}"
    if kind == "type":
        names = [want] if isinstance(want, str) else list(want)
        return f"{where}: expected {' or '.join(names)}, got {type(got).__name__}"
    if kind == "const":
        return f"{where}: expected {want!r}, got {got!r}"
    if kind == "enum":
        return f"{where}: {got!r} is not one of {want}"
    if kind in ("anyOf", "oneOf"):
        return f"{where}: matches none of the allowed forms"
    return f"{where}: {err.message}"


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Where `value` breaks `schema` (empty when it conforms), by the jsonschema library's Draft 2020-12 validator
    (the schema itself is checked first: a malformed schema is a `jsonschema.SchemaError`, never a silent pass)."""
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema)
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    return [_message(e) for e in errors]


_RECORD_SHAPE: dict[str, type | tuple[type, ...]] = {
    "config": dict, "model": dict, "data": dict, "models": dict, "risk": dict, "levers": list,
    "diagnostics": dict, "definitions": dict, "versions": dict, "device": dict, "timings": dict, "created": str,
}
_NUMBER = (int, float)


def check_record(rec: dict[str, Any], where: str, option: str = "--render") -> None:
    """Refuse (one line) a saved audit record whose structure this version cannot draw."""
    bad = [k for k, t in _RECORD_SHAPE.items() if not isinstance(rec.get(k), t)]
    user = rec.get("models", {}).get("user") if isinstance(rec.get("models"), dict) else None
    if not bad and not isinstance(user, dict):
        bad = ["models.user"]
    if not bad:
        need = {"worst_flip_rate": _NUMBER, "worst_attack": str, "baseline": dict, "n_selected": int}
        bad = [f"models.user.{k}" for k, t in need.items() if not isinstance(user.get(k), t)]
        risk = rec["risk"]
        if not bad and risk.get("level") not in ALL_LEVELS:
            bad = ["risk.level"]
        if not bad and not all(isinstance(risk.get(k), _NUMBER) for k in ("relu_reference", "attn_reference")):
            bad = ["risk.relu_reference / risk.attn_reference"]
    if bad:
        raise UserInputError(f"{option} {where} is not an audit record this version can draw (missing or malformed: "
                             f"{', '.join(bad[:4])}); rerun the audit with --json")


def read_record(path: str | Path, what: str, schema: bool = True) -> dict[str, Any]:
    """An audit record from a JSON file (the one reader of saved audits), one-line errors naming the fix; `what`
    names the option in them. `schema=True` (`diff`, `check`) also requires this version's schema_version and
    schema; `--render` passes False, so a record of an earlier version is drawn wherever it has what the report
    draws (`check_record`, checked either way). Only JSON is parsed: nothing in the file can run code."""
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
    errs = schema_errors(raw, load_schema()) if schema else []
    if errs:
        raise UserInputError(f"{what} {p} does not match the audit schema ({errs[0]}"
                             f"{f' and {len(errs) - 1} more' if len(errs) > 1 else ''}); rerun the audit with --json")
    rec = decode(raw)
    check_record(rec, str(p), what)
    return rec


# --- Markdown summary --------------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return "n/a" if not isinstance(v, (int, float)) or not math.isfinite(v) else f"{100 * v:.1f} %"


def summary_markdown(rec: dict[str, Any]) -> str:
    """A short Markdown summary of an audit record for a pull-request comment."""
    risk, models, user = rec["risk"], rec["models"], rec["models"]["user"]
    k = user["n_selected"]
    lo, hi = wilson(user["worst_flip_rate"], k)
    name = Path(str(rec["model"].get("path", "model"))).name
    rows = [("worst-case flip rate", f"{_pct(user['worst_flip_rate'])} ({user['worst_attack'].upper()}; 95 % "
             f"interval {_pct(lo)} to {_pct(hi)}, {k} attacked points)"),
            ("random noise of the same size", f"{_pct(user['baseline']['mean'])} ± {_pct(user['baseline']['std'])}")]
    treated, control = PAPER_PAIR
    for key in (control, treated):
        if key in models:
            m = models[key]
            gate = "" if m.get("gate", {}).get("passed", True) else ", below the adequacy gate: left out"
            rows.append((f"{m['label']} reference", f"{_pct(m['worst_flip_rate'])} (test accuracy "
                         f"{m['test_acc']:.2f}{gate})"))
    if control not in models:
        rows.append(("references", f"paper-reported {_pct(risk['relu_reference'])} (2L-ReLU) / "
                     f"{_pct(risk['attn_reference'])} (MLP-Attn)"))
    rows.append(("your model's test accuracy", f"{user['test_acc']:.2f}"))
    panels = rec.get("panels", {})
    val = panels.get("validity", {})
    if val.get("verdict"):
        lead = val.get("lead", "ntk")
        lds = val.get("lds", {}).get(lead)
        ceil = val.get("ceiling", {})
        of_ceiling = (f"; {lds['fraction']:.2f} [{lds['fraction_lo']:.2f}, {lds['fraction_hi']:.2f}] of the noise "
                      f"ceiling {ceil['value']:.2f}") if lds and "fraction" in lds and ceil else ""
        extra = (f" ({lds.get('label', lead)}, the lead estimator: LDS {lds['value']:.2f} [{lds['lo']:.2f}, "
                 f"{lds['hi']:.2f}]{of_ceiling})") if lds else ""
        rows.append(("influence against re-fits", f"{val['verdict']}{extra}"))
        best = val.get("lds", {}).get(val.get("best"))
        if best and val.get("best") != lead and "fraction" in best:
            rows.append(("best estimator against re-fits", f"{best.get('label', val['best'])}: LDS {best['value']:.2f} "
                         f"[{best['lo']:.2f}, {best['hi']:.2f}]; {best['fraction']:.2f} [{best['fraction_lo']:.2f}, "
                         f"{best['fraction_hi']:.2f}] of the ceiling"))
    dense = [c for c in rec.get("lever_classes", []) if c.get("beyond_chance") and c["over"] > 1]
    if rec.get("lever_classes"):
        rows.append(("where the levers lie", "; ".join(
            f"class {c['class']}: {c['levers']} of {k} levers, {c['over']:.1f}x its share of the data (Holm p "
            f"{c['p_holm']:.2g})" for c in dense) or "no class holds more of the levers than chance would give"))
    bud = panels.get("budget", {})
    if bud.get("breaking_label"):
        rows.append(("breaking budget", str(bud["breaking_label"])))
    po = panels.get("poison", {})
    if po.get("rankings"):
        rows.append((f"planted-poison precision at {po['k']}",
                     f"{_pct(po['rankings'][po['headline']]['precision'])} (chance {_pct(po['chance'])})"))
    elif po.get("verdict"):
        rows.append(("planted-poison self-test", str(po["verdict"])))
    proj = rec["model"].get("projection")
    if isinstance(proj, dict) and proj.get("dim"):
        err = proj.get("error", {})
        rows.append(("kernel", f"projected to k = {proj['dim']} ({proj['kind']}); kernel relative error "
                     f"{err.get('kernel_rel_error', float('nan')):.3f}, influence rank correlation "
                     f"{err.get('influence_spearman', float('nan')):.3f} on {err.get('n', 0)} points"))
    cfg = rec["config"]
    head = (f"**{str(risk['level']).upper()}** risk" if risk["level"] in RISK_LEVELS
            else f"risk **{str(risk['level']).upper()}**")
    lines = [SUMMARY_MARKER, f"### Malleability audit of `{name}`: {head}", "",
             "| | |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    lines += ["", f"Rule: {risk['rule']}.", ""]
    if risk.get("reason"):
        lines += [f"{str(risk['level']).capitalize()}: {risk['reason']}.", ""]
    advice = rec["risk"].get("advice") or []
    if advice:
        lines += [f"Next step: {advice[0]}", ""]
    lines.append(f"<sub>verify audit, schema {rec.get('schema_version', '?')}, {rec['created']}; "
                 f"{rec['data']['n_train']} training / {rec['data']['n_test']} test points, eps {cfg['eps']:.4g}, "
                 f"tau {cfg['tau']:g}, seed {cfg['seed']}; model sha256 {str(rec['model'].get('sha256', ''))[:12]}"
                 "</sub>")
    return "\n".join(lines) + "\n"


# --- diff ---------------------------------------------------------------------------------------------------


def _quantities(rec: dict[str, Any]) -> dict[str, tuple[Any, float, float] | str]:
    """Compared quantities by name: (value, lo, hi) for numbers, a string for categories."""
    q: dict[str, tuple[Any, float, float] | str] = {"risk level": str(rec["risk"]["level"])}
    n_test = int(rec["data"]["n_test"])
    for key, m in rec["models"].items():
        k = int(m["n_selected"])
        for a, res in m.get("attacks", {}).items():
            q[f"{key}: {a.upper()} flip rate"] = (res["flip_rate"], *wilson(res["flip_rate"], k))
        q[f"{key}: worst-case flip rate"] = (m["worst_flip_rate"], *wilson(m["worst_flip_rate"], k))
        if isinstance(m.get("test_acc"), (int, float)):
            q[f"{key}: test accuracy"] = (m["test_acc"], *wilson(m["test_acc"], n_test))
    panels = rec.get("panels", {})
    val = panels.get("validity", {})
    if val.get("verdict"):
        q["validity verdict"] = str(val["verdict"])
        lead = val.get("lead", "ntk")
        lds = val.get("lds", {}).get(lead)
        if isinstance(lds, dict):
            q["validity: LDS (NTK influence)" if lead == "ntk" else
              f"validity: LDS ({lds.get('label', lead)}, the lead estimator)"] = (lds["value"], lds["lo"], lds["hi"])
    bud = panels.get("budget", {})
    if bud.get("breaking_label"):
        q["breaking budget"] = str(bud["breaking_label"])
    po = panels.get("poison", {})
    if po.get("rankings"):
        prec = po["rankings"][po["headline"]]["precision"]
        q[f"poison precision at k ({po['headline']})"] = (prec, *wilson(prec, int(po["k"])))
    elif po.get("verdict") == NOT_MEASURABLE:
        q["poison self-test"] = NOT_MEASURABLE
    return q


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def diff_records(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Every compared quantity of two audit records and whether it moved (the rule in the module docstring)."""
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
                if old["config"].get(k) != new["config"].get(k)]
    same_model = old["model"].get("sha256") == new["model"].get("sha256")
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
