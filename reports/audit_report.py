"""The `verify audit` report: the template's context from an audit record, and the rendered HTML page.

Works on plain data only (the record as `verify.audit.pipeline.run_audit` returns it or `--json` saved it, and the texts
passed in), so a saved record renders again without recomputing anything.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from reports.render import image_data_uri, render_html
from reports.text import eps_label

#: The record's keys of the paper's two reference networks, (treated, control): `verify.audit` writes them from
#: `empirics.vocab.PAPER_PAIR` (reports reads plain records and imports no experiment code).
REFERENCE_KEYS = ("attn", "relu")


def _flat_rows(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as (dotted key, text) rows for the appendix tables."""
    rows: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            rows += _flat_rows(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            rows += _flat_rows(v, f"{prefix}[{i}]")
    else:
        text = ", ".join(str(v) for v in obj) if isinstance(obj, (list, tuple)) else str(obj)
        rows.append((prefix, text))
    return rows


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def report_context(result: dict[str, Any], figures: dict[str, str], realistic_reason: str) -> dict[str, Any]:
    """Everything the template shows, as formatted values (reads the record, computes nothing new);
    `realistic_reason` says why the default budget is realistic (`verify.audit.budget.REALISTIC_REASON`)."""
    cfg = result["config"]
    models = result["models"]
    user = models["user"]
    risk = result["risk"]
    worst = user["worst_attack"].upper()
    k = user["n_selected"]
    b = user["baseline"]
    summary = [
        f"Perturbing the {k} training examples with the largest influence ({_pct(cfg['tau'])} of "
        f"{result['data']['n_train']}) by at most ±{eps_label(cfg['eps'])} per pixel flipped the sign of the "
        f"influence ({user.get('estimator_label', 'NTK leave-one-out')}) of "
        f"{_pct(user['worst_flip_rate'])} of them (worst attack: {worst}); random noise of the same size flips "
        f"{_pct(b['mean'])} ± {_pct(b['std'])}.",
    ]
    treated, control = REFERENCE_KEYS
    if control in models and treated in models:
        summary.append("On the same data, ranked by the same estimator, the paper's reference networks flip "
                       f"{_pct(models[control]['worst_flip_rate'])} (2L-ReLU) and "
                       f"{_pct(models[treated]['worst_flip_rate'])} (MLP-Attn).")
    else:
        summary.append(f"No reference networks were trained (--no-reference); the paper-reported scale "
                       f"{_pct(risk['relu_reference'])} (2L-ReLU) and {_pct(risk['attn_reference'])} (MLP-Attn) "
                       "is used.")
    summary.append(f"After the {worst} perturbation the ranking of all training points by influence keeps a Spearman "
                   f"correlation of {user['worst_rho_all']:.2f} with the original (1 = unchanged).")
    panels = result.get("panels", {})
    if risk.get("left_out"):
        summary.append(f"{' and '.join(risk['left_out'])}: the reference trained on your data did not pass the "
                       "adequacy gate (it did not learn), so it is marked in the table and left out of the risk scale.")
    val = panels.get("validity", {})
    if val.get("verdict"):
        edge = not (val.get("stability") or {}).get("stable", True)
        summary.append(f"Influence is {str(val['verdict']).upper()}{' (ON A KNIFE-EDGE)' if edge else ''} for this "
                       f"model when checked against re-fitting it ({val.get('reason', '')}).")
        if val["verdict"] != "trustworthy" or edge:
            summary.append(f"So the flip rates above describe how malleable the ranking by "
                           f"{user.get('estimator_label', 'NTK leave-one-out')} influence is; they are not a validated "
                           "prediction of what re-fitting your model on altered data would do.")
    bud = panels.get("budget", {})
    if bud.get("by_eps"):
        summary.append(f"Breaking budget (the attack first exceeds random noise): {bud['breaking_label']}.")
    note = projection_note(result["model"].get("projection"))
    if note:
        summary.append(note)
    key_rows, sharp_rows = [], []
    for key, m in models.items():
        gate = m.get("gate")
        key_rows.append({"key": key, "label": m["label"], "flip": m["worst_flip_rate"],
                         "worst": m["worst_attack"].upper(), "noise": m["baseline"]["mean"],
                         "noise_std": m["baseline"]["std"], "rho": m["worst_rho_all"], "acc": m["test_acc"],
                         "train_acc": m.get("train_acc"), "gate": gate,
                         "excluded": bool(gate and not gate["passed"]),
                         "kappa": m["ntk"]["kappa"], "rho_gn": m["rho_ntk_gn"], "sharp": m["sharpness"]["value"]})
        s = m["sharpness"]
        sharp_rows.append({"label": m["label"], "value": s["value"],
                           "fd": str(s.get("hvp", "")).startswith("central"), "w2": s.get("sharpness_w2"),
                           "per_loss": s.get("sharpness_per_loss"), "loss": s.get("loss"),
                           "residual": s.get("residual"), "error": s.get("error")})
    model = result["model"]
    model_rows = [(k2, v) for k2, v in _flat_rows({kk: vv for kk, vv in model.items() if kk != "spec"})]
    if model.get("spec"):
        model_rows += _flat_rows(model["spec"], "spec")
    code = result.get("code") or {}
    env = {"created": result["created"], "code (git commit)": (
               f"{code['commit']}{' with uncommitted changes' if code.get('dirty') else ''}" if code.get("commit")
               else "not recorded (not run from a git checkout, or a record before 2026-12-06)"),
           "versions": result["versions"], "device": result["device"],
           "timings (s)": {k2: f"{v:.1f}" for k2, v in result["timings"].items()}}
    refs = ("The 2L-ReLU and MLP-Attn references are the paper's two networks trained by the suite on the same data "
            f"(width {cfg['ref_width']}, the width-consistent protocol: Adam without weight decay to a plateau of the "
            f"training loss, at most {cfg['ref_epochs']} epochs). A reference below the adequacy gate is marked "
            "'below gate' and left out of the risk scale." if cfg["reference"]
            else "No references were trained (--no-reference).")
    return {
        "model_name": Path(model["path"]).name, "model": model, "data": result["data"], "created": result["created"],
        "risk": risk, "summary": summary, "key_rows": key_rows, "sharp_rows": sharp_rows, "cfg": cfg,
        "n_selected": k, "references_note": refs, "levers": result["levers"], "user": user,
        "result_lever_classes": result.get("lever_classes") or [],
        "worst_label": worst, "attack_names": [a.upper() for a in cfg["attacks"]], "diag": result["diagnostics"],
        "definitions": result["definitions"], "fig": figures, "model_rows": model_rows,
        "data_rows": _flat_rows({"train": result["data"]["train"], "test": result["data"]["test"],
                                 "image_shape": result["data"]["image_shape"], "task": result["data"]["task"]}),
        "settings_rows": _flat_rows(cfg), "env_rows": _flat_rows(env),
        "panels": panels, "eps_label": eps_label(cfg["eps"]), "realistic_reason": realistic_reason,
        "outcome_rows": _outcome_rows(panels.get("outcome", {})),
        "projection_note": note,
        "lds_rows": lds_rows(panels.get("validity", {})),
        "wiring_note": wiring_note(panels.get("validity", {})),
    }


def lds_rows(val: dict[str, Any]) -> list[dict[str, Any]]:
    """The validity panel's estimators, the best first (the record's `best`), then in the record's order; then the
    library estimators that were not scored (`unscored`: status and why)."""
    scores = val.get("lds") or {}
    best = val.get("best")
    order = ([best] if best in scores else []) + [k for k in scores if k != best]
    rows = [{"label": k, **scores[k], "lead": k == val.get("lead")} for k in order]
    return rows + [{"label": k, **r, "unscored": True} for k, r in (val.get("unscored") or {}).items()]


def wiring_note(val: dict[str, Any]) -> str:
    """One sentence on the kronfluence wiring check (a positive control), empty when kronfluence did not run."""
    rows = [*(val.get("lds") or {}).values(), *(val.get("unscored") or {}).values()]
    w = next((r["wiring"] for r in rows if r.get("wiring")), None)
    if not w:
        return ""
    return (f"Wiring check: kronfluence's identity-preconditioned scores against autograd's per-example gradient dot "
            f"products on {w['train_points']} x {w['test_points']} points differ by at most {w['max_rel_diff']:.1e} "
            f"(relative; {'passed' if w['passed'] else 'FAILED'} at {w['tolerance']:g}).")


def projection_note(proj: dict[str, Any] | None) -> str:
    """One sentence on a projected kernel and its measured error (empty for the exact kernel)."""
    if not proj or not proj.get("dim"):
        return ""
    e = proj.get("error", {})
    if proj.get("structure") == "kronecker":
        what = (f"a Kronecker-structured random projection of its per-example gradients (weights projected to a "
                f"target of {proj['dim']} dimensions, biases and batch-norm scales exact: {proj.get('width')} features "
                f"per output; {proj['kind']}, seed {proj['seed']}; {proj['reason']}){_allocation_note(proj)}")
    else:
        what = (f"a random projection of its per-example gradients to k = {proj['dim']} dimensions "
                f"({proj['kind']}, seed {proj['seed']}; {proj['reason']})")
    return (f"Your model's kernel is {what}. Against the exact kernel on {e.get('n')} "
            f"training and {e.get('n_test')} test points its entries differ by "
            f"{_pct(e.get('kernel_rel_error', math.nan))} (train) and "
            f"{_pct(e.get('test_kernel_rel_error', math.nan))} (test-train), relative Frobenius error, "
            f"and it ranks influence with Spearman rho {e.get('influence_spearman', math.nan):.2f} against the exact "
            "ranking: read every influence-based number with that in mind.")


def _allocation_note(proj: dict[str, Any]) -> str:
    """How the Kronecker projection shared its dimensions: by the pilot's measured shares, or equally."""
    pilot = proj.get("pilot")
    if proj.get("allocation_rule") != "share" or not pilot:
        return ", the target shared equally among the projected weights"
    rows = [a for a in proj.get("allocation", []) if not a["exact"]]
    exact = sum((a["exact_out"] if a["exact_out"] < a["d_out"] else 0) + (a["exact_in"] if a["exact_in"] < a["d_in"]
                else 0) for a in rows)
    return (f", the target allocated by each weight's measured share of the kernel on a pilot of {pilot['points']} "
            f"points with {exact} leading gradient directions kept exactly ({pilot['seconds']:.0f} s)")


OUTCOME_LABELS = {"acc_change": "test accuracy change", "target_flip": "targeted predictions changed",
                  "target_loss_change": "targeted mean loss change"}


def _outcome_rows(panel: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcome table's rows: each metric for the levers, random points and their difference."""
    return [{"label": OUTCOME_LABELS.get(k, k), "pct": k != "target_loss_change", **v}
            for k, v in panel.get("rows", {}).items()]


def render_report(result: dict[str, Any], realistic_reason: str) -> str:
    """The audit report as one self-contained HTML string (figures embedded; `realistic_reason` as in
    `report_context`)."""
    from reports.audit_figures import all_figures

    with tempfile.TemporaryDirectory() as tmp:
        figs = {k: image_data_uri(p) for k, p in all_figures(result, tmp).items()}
    return render_html("audit.html", report_context(result, figs, realistic_reason))
