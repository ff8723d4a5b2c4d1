"""Render claims.json as claims.md, claims.html and claims.pdf (figures from the stored results).

Reads only the record `verify claims` wrote, so `verify report claims.json` re-renders a report
without recomputing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ntkm.io import atomic_write_text
from reports import figures
from reports.deviations import preregistration_markdown, rule_status
from reports.render import PdfUnavailable, image_data_uri, render_html, write_html, write_pdf
from reports.text import fmt, markdown_table

VERDICT_CLASS = {"holds": "v-holds", "partly": "v-partly", "does not hold": "v-not", "underdetermined": "v-under",
                 "inconclusive": "v-incon", "not measurable here": "v-na"}
GROUP_TITLES = {
    "theory": "Theorems (symbolic and randomized checks)",
    "numbers": "Condition numbers on real data",
    "ntk": "NTK distance against width",
    "malleability": "Influence malleability (flip rates)",
    "landscape": "Loss landscape",
    "variants": "Beyond the paper: named variants of its model (never replacing it)",
}


@dataclass
class Written:
    """Paths written; `pdf_ok` is False when the PDF could not be made (the HTML still was)."""

    paths: list[Path] = field(default_factory=list)
    pdf_ok: bool = True
    pdf_error: str = ""

    def __iter__(self):
        return iter(self.paths)


def make_figures(record: dict[str, Any], folder: Path) -> list[dict[str, str]]:
    """PNG figures for the report: (title, path, caption); the empirical ones once per training protocol."""
    res = record.get("results", {})
    out: list[dict[str, str]] = []
    protocols = list(record.get("protocols", {})) or [""]
    kap = {ds: res[f"kappa:{ds}"] for ds in ("mnist", "cifar10") if res.get(f"kappa:{ds}", {}).get("rows")}
    if kap:
        from theory.paper import PAPER_KAPPA

        p = figures.kappa_vs_n(kap, folder / "kappa_vs_n.png", PAPER_KAPPA)
        out.append({"title": "Condition number of G against n", "path": str(p),
                    "caption": "kappa(G) is infinite once n exceeds the rank (n > d, or always-zero pixels); "
                               "kappa_d uses the rank-min(n, d) truncation. Dotted: the paper's values."})
    for proto in protocols:
        at = f"@{proto}" if proto else ""
        tag = f" — {proto} protocol" if proto else ""
        for ds in ("mnist", "cifar10"):
            r = res.get(f"ntk-distance:{ds}{at}")
            if r and "models" in r:
                p = figures.distance_vs_width(r, folder / f"ntk_distance_{ds}_{proto}.png")
                out.append({"title": f"NTK distance vs width — {r['data'].get('label', ds)}{tag}", "path": str(p),
                            "caption": "mean ± std over seeds (each seed its own data subset), at every width "
                                       "including widths whose networks failed the adequacy gate; legend: log-log "
                                       "slope over all widths with its 95 % t interval over seeds (the claim "
                                       "rows use only the widths that pass the gate, so their slopes can differ). "
                                       "Left: ||f_m - f_NTK|| on test "
                                       "points (unnormalised); middle: centred kernel drift; right: centred Θ_0 vs "
                                       "analytic NTK."})
        mall = {k: res[k + at] for k in ("malleability:mnist:10class", "malleability:cifar10:10class",
                                         "malleability:mnist:binary", "malleability:cifar10:binary")
                if res.get(k + at, {}).get("summary")}
        if mall:
            p = figures.flip_rate_bars(mall, folder / f"flip_rates_{proto}.png")
            out.append({"title": f"Influence flip rates (transformed intervention){tag}", "path": str(p),
                        "caption": "fraction of the top-tau training points whose NTK-LOO influence changes sign when "
                                   "they are replaced by their adversarial versions; hatched: random sign noise of "
                                   "the same eps (the baseline); error bars: 95 % t intervals over seeds (each seed "
                                   "the mean over its points)."})
        for ds in ("mnist", "cifar10"):
            r = res.get(f"landscape:{ds}{at}")
            if r and "models" in r:
                label = r["data"].get("label", ds)
                p = figures.landscape_lines(r, folder / f"landscape_lines_{ds}_{proto}.png")
                out.append({"title": f"Loss landscape, 1-D — {label}{tag}", "path": str(p),
                            "caption": "left: loss from initialisation (alpha 0) to the trained weights (alpha 1); "
                                       "right: slice along a filter-normalised random direction; mean over seeds."})
    return out


def _runs_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trained-network record of a unit result (distance, malleability or landscape)."""
    if "runs" in result:
        return list(result["runs"])
    return [r for m in result.get("models", {}).values() for r in m.get("runs", [])]


def _span(vals: list[float], digits: int = 2) -> str:
    """'mean [min-max]' of the finite numbers among `vals` ("-" when there are none)."""
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return "-"
    mean = sum(vals) / len(vals)
    return f"{mean:.{digits}f}" + (f" [{min(vals):.{digits}f}–{max(vals):.{digits}f}]" if len(vals) > 1 else "")


def _gd_mse_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gd-mse networks an NTK-distance sweep trains beside each network (`gd_*` fields), as runs of their own."""
    keys = ("train_acc", "test_acc", "train_loss", "epochs_run", "plateau_reached", "gate")
    return [{"model": r.get("model", "?"), "training": "gd-mse", **{k: r.get(f"gd_{k}") for k in keys},
             **{k: r[k] for k in KERNEL_ACC if k in r}} for r in runs if "gd_gate" in r]


#: Test accuracy of kernel regression with the analytic and with the empirical (initial) NTK, where a unit records it.
KERNEL_ACC = ("ntk_predictor_test_acc", "empirical_ntk_predictor_test_acc")
#: Test accuracy of kernel regression with the trained network's own empirical NTK (malleability and landscape runs).
TRAINED_KERNEL_ACC = "trained_ntk_predictor_test_acc"


def _kernel_acc(rs: list[dict[str, Any]]) -> str:
    """'analytic / empirical' kernel-regression test accuracy of a row's runs ("-" where not recorded)."""
    a, e = (_span([r.get(k) for r in rs]) for k in KERNEL_ACC)
    return "-" if a == e == "-" else f"{a} / {e}"


def training_table(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (unit, protocol, model, training): accuracies, loss, epochs, plateau and gate counts, the kernel
    predictors' test accuracy and, for adversarial training, the robust training accuracy the gate reads."""
    out = []
    for name, res in record.get("results", {}).items():
        if "@" not in name or "unavailable" in res:
            continue
        unit, protocol = name.split("@", 1)
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in _runs_of(res) + _gd_mse_runs(_runs_of(res)):
            if r.get("gate"):
                groups.setdefault((r.get("model", "?"), r.get("training", "standard")), []).append(r)
        for (model, training), rs in groups.items():
            out.append({"unit": unit, "protocol": protocol, "model": model + ("" if training == "standard" else
                                                                              f" ({training})"),
                        "n": len(rs), "train_acc": _span([r.get("train_acc") for r in rs]),
                        "test_acc": _span([r.get("test_acc") for r in rs]),
                        "loss": _span([r.get("train_loss") for r in rs], 3),
                        "epochs": _span([r.get("epochs_run") for r in rs], 0),
                        "plateau": f"{sum(bool(r.get('plateau_reached')) for r in rs)}/{len(rs)}",
                        "kernel_acc": _kernel_acc(rs),
                        "trained_kernel_acc": _span([r.get(TRAINED_KERNEL_ACC) for r in rs]),
                        "robust_acc": _span([r["gate"].get("robust_train_acc") for r in rs]),
                        "passed": sum(bool(r["gate"].get("passed")) for r in rs)})
    return out


#: Claims judged at one fixed condition of their own (they train networks, but not per protocol x preprocessing).
FIXED_CONDITION = {"influence-control": "gd-mse, unit inputs"}


def theory_summary(record: dict[str, Any]) -> dict[str, int]:
    """Verdict counts of the claims that train nothing."""
    rows = [c for c in record["claims"] if not c.get("empirical") and c["id"] not in FIXED_CONDITION]
    out: dict[str, int] = {}
    for c in rows:
        out[c["verdict"]] = out.get(c["verdict"], 0) + 1
    return out


def instrument_line(record: dict[str, Any]) -> str:
    """What the flip rates measure and whether the run validated that for the trained networks (the two influence
    checks' headline verdicts), for the report's first page; empty where the run judged neither."""
    by_id = {c["id"]: c for c in record["claims"]}
    if "influence-control" not in by_id and "influence-retrain" not in by_id:
        return ""
    parts = [f"{i} {by_id[i]['verdict']}" for i in ("influence-control", "influence-retrain", "flip-retrain-mnist")
             if i in by_id]
    return ("The flip rates and influence rankings are NTK leave-one-out influence of each trained network's kernel "
            "machine (the paper's method), not retraining; an influence-based claim holds only where the positive "
            "control and the retrain check of its condition both hold (a flip-rate claim also where the "
            "retrain-based flip row flip-retrain-mnist, which measures flips by retraining, holds), else it is "
            f"'partly' (holds for the kernel predictor). This run: {', '.join(parts)}.")


def _counts(s: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in s.items() if n) or "none"


def to_markdown(record: dict[str, Any]) -> str:
    lines = [f"# {record['title']}", "",
             f"Preset `{record['preset']}`, generated {record['generated']}, code version "
             f"`{record['code_version']}` (git {record.get('git', {}).get('commit') or 'unknown'}"
             f"{', uncommitted changes' if record.get('git', {}).get('dirty') else ''}), {fmt(record['wall_s'])} s.",
             "", "## Bottom line", "",
             markdown_table(["claim", "paper", "ours (headline; full text below)", "verdict", "seed stability",
                             "multiplicity (Holm within the claim; BH across claims)"],
                            [[b["id"], b["paper"], b["ours"], f"**{b['verdict']}**", b["stability"],
                              b["multiplicity"]] for b in bottom_line(record)]), "",
             f"**{len(record['claims'])} claims.** Theory and data: {_counts(theory_summary(record))}. Empirical, "
             + "; ".join(f"{p}: {_counts(s)}" for p, s in _by_condition_summary(record).items())
             + ".", ""]
    instrument = instrument_line(record)
    if instrument:
        lines += [instrument, ""]
    for name, p in record.get("protocols", {}).items():
        lines.append(f"- protocol **{name}**: {p['description']} ({p['train']['epochs']} epochs"
                     f"{' at most' if p['train'].get('plateau') else ''})")
    lines += [f"- {record.get('gate', '')}", "", "## Verdict matrix", ""]
    names = condition_names(record)
    matrix = [[c["id"], *(label(_outcomes(c)[n]) for n in names), _agreement(c), stability_cell(c)]
              if c.get("empirical")
              else [c["id"], label(c), *([f"({FIXED_CONDITION.get(c['id'], 'no training')})"] * (len(names) - 1)),
                    "-", stability_cell(c)] for c in record["claims"]]
    lines += [markdown_table(["claim", *(_condition_label(n) for n in names), "robust", "seed stability"], matrix), ""]
    if record.get("stability"):
        lines += [f"Seed stability ({record['stability']['method']}).", ""]
    training = training_table(record)
    if training:
        lines += ["## Training behind the empirical numbers", "",
                  markdown_table(["unit", "protocol", "model", "networks", "train acc", "test acc", "final loss",
                                  "epochs", "plateau", "kernel predictor test acc (analytic / empirical NTK at init)",
                                  "kernel predictor test acc (trained network's NTK)", "robust train acc",
                                  "gate passed"],
                                 [[t["unit"], t["protocol"], t["model"], t["n"], t["train_acc"], t["test_acc"],
                                   t["loss"], t["epochs"], t["plateau"], t["kernel_acc"], t["trained_kernel_acc"],
                                   t["robust_acc"], f"{t['passed']}/{t['n']}"] for t in training]),
                  ""]
    for group, title in GROUP_TITLES.items():
        rows = [c for c in record["claims"] if c["group"] == group]
        if not rows:
            continue
        table = []
        for c in rows:
            paper = c["paper"] + (f" (v2: {c['v2']})" if c["v2"] else "")
            if c.get("empirical"):
                for pname, o in _outcomes(c).items():
                    table.append([c["id"], c["statement"], paper, f"{pname}: {o['ours']}",
                                  "-" if o["seeds"] is None else o["seeds"],
                                  f"**{label(o)}** ({pname})" + _fragile(c)])
            else:
                table.append([c["id"], c["statement"], paper, c["ours"], "-" if c["seeds"] is None else c["seeds"],
                              f"**{label(c)}**" + _fragile(c)])
        lines += [f"## {title}", "", markdown_table(["id", "claim", "paper", "ours", "seeds", "verdict"], table), ""]
    lines += ["## Protocols and verdict rules", ""]
    for c in record["claims"]:
        if c.get("empirical"):
            proto = " / ".join(f"{p}: {o['protocol']}" for p, o in c["by_protocol"].items())
            cond = " / ".join(f"{p}: {o['condition']}" for p, o in c["by_protocol"].items() if o.get("condition"))
        else:
            proto, cond = c["protocol"], c.get("condition", "")
        lines += [f"- **{c['id']}** — protocol: {proto}. Rule ({rule_status(record, c['id'])}): {c['rule']}."
                  + (f" Gate: {c['gate']}." if c.get("gate") else "")
                  + (f" Deciding condition: {cond}." if cond else "")]
    lines += ["", *preregistration_markdown(record), "## Provenance", "", provenance_markdown(record), ""]
    return "\n".join(lines)


def _outcomes(claim: dict[str, Any]) -> dict[str, Any]:
    """An empirical claim's outcomes per condition (protocol x preprocessing; records before the axis: per protocol)."""
    return claim.get("by_condition") or claim["by_protocol"]


def condition_names(record: dict[str, Any]) -> list[str]:
    """The conditions of the record's empirical claims, in order ('paper', 'proper', 'paper+channel', ...)."""
    return next((list(_outcomes(c)) for c in record["claims"] if c.get("empirical")), ["paper", "proper"])


#: The claims protocols' labels (`verify.claims.base.CLAIMS_PROTOCOLS`, which reports may not import; a test checks
#: they agree).
CONDITION_LABELS = {"paper": "paper protocol", "proper": "proper training",
                    "proper-quarter": "proper training, lr exponent 1/4"}


def _condition_label(name: str) -> str:
    protocol, _, pre = name.partition("+")
    return CONDITION_LABELS.get(protocol, protocol) + f", {pre or 'raw'}"


def stability_cell(claim: dict[str, Any]) -> str:
    """The seed stability of a claim's headline verdict (`verify.stability`): 'fragile' or 'stable' with the
    bootstrap agreement and the seeds whose leave-one-out changes it; the reason where it is not computable; '-' in
    records written before it."""
    st = claim.get("stability")
    if not st:
        return "-"
    if not st.get("computable"):
        return st.get("reason", "not computable")
    loo = st.get("loo_changes") or []
    return (f"{'**fragile**' if st['fragile'] else 'stable'}: {st['bootstrap_agreement']:.2f} of "
            f"{st['resamples']} seed resamples agree" + (f"; leave-one-out changes it at {len(loo)} seed(s) ("
                                                          + ", ".join(f"{x['axis']} {x['seed']}: {x['verdict']}"
                                                                      for x in loo) + ")" if loo else ""))


def label(outcome: dict[str, Any]) -> str:
    """A row's or condition's verdict as printed: with the named condition of a "partly" or the axis of an
    "underdetermined" where the rule names one (`verify.claims.base.verdict_label`); the bare verdict in records
    written before labels."""
    return outcome.get("label") or outcome["verdict"]


#: Characters of "ours" the bottom-line table shows (its first clause, the full text in the claims tables).
HEADLINE_CHARS = 110


def _headline(ours: str, tests: list[dict[str, Any]] | None = None) -> str:
    """The bottom line's number: the first deciding test's estimate and interval where the rule records them (the
    number the verdict rests on, e.g. the NTK distance's slope, not the distances), else the first clause of "ours"."""
    shown = next((t for t in tests or [] if t.get("interval") and t.get("estimate") is not None), None)
    if shown is not None:
        lo, hi = shown["interval"]
        return f"{shown['name']}: {fmt(shown['estimate'])} [{fmt(lo)}, {fmt(hi)}] (vs {shown['point']:g})"
    first = ours.split("; ")[0]
    return first if len(first) <= HEADLINE_CHARS else first[:HEADLINE_CHARS - 1].rstrip() + "…"


def multiplicity_cell(claim: dict[str, Any]) -> str:
    """Holm and Benjamini-Hochberg beside the unadjusted verdict, as the run wrote it (`verify.multiplicity.cell`);
    '-' where nothing is adjusted or in records written before it."""
    return (claim.get("multiplicity") or {}).get("text") or "-"


def bottom_line(record: dict[str, Any]) -> list[dict[str, str]]:
    """The report's first table (issue 40 item 7), a line per claim: the paper's value, our headline number (the
    deciding test's estimate and interval, else the first clause of "ours"), the verdict as labelled with its
    stability flag, and the multiplicity-adjusted reading."""
    out = []
    for c in record["claims"]:
        st = c.get("stability") or {}
        stab = ("fragile" if st.get("fragile") else f"stable ({st['bootstrap_agreement']:.2f})"
                if st.get("computable") else "-")
        out.append({"id": c["id"], "paper": c["paper"], "ours": _headline(c["ours"], c.get("tests")),
                    "verdict": label(c),
                    "vclass": c["verdict"], "stability": stab, "multiplicity": multiplicity_cell(c)})
    return out


def _fragile(claim: dict[str, Any]) -> str:
    """' fragile' beside a verdict whose seed stability says so (`verify.stability`), else ''."""
    st = claim.get("stability") or {}
    return " fragile" if st.get("fragile") else ""


def _agreement(claim: dict[str, Any]) -> str:
    """'yes' (every condition agrees, none unmeasurable), 'no', the preprocessing and schedule splits it names, or '-'
    when the run judged one condition (nothing was compared)."""
    if len(_outcomes(claim)) < 2:
        return "-"
    if claim["robust"]:
        return "yes"
    split = claim.get("preprocessing_split") or {}
    schedule = claim.get("schedule_split") or {}
    return ("no" + "".join(f"; underdetermined (preprocessing) under {p}: "
                           + ", ".join(f"{pre} {v}" for pre, v in per.items()) for p, per in split.items())
            + "".join(f"; underdetermined (schedule) under {c}: " + ", ".join(f"{lab} {v}" for lab, v in per.items())
                      for c, per in schedule.items()))


def _by_condition_summary(record: dict[str, Any]) -> dict[str, Any]:
    return record.get("summary_by_condition") or {f"{p} protocol": s
                                                  for p, s in record.get("summary_by_protocol", {}).items()}


def data_provenance(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per distinct data set used by any unit."""
    seen: dict[str, dict[str, Any]] = {}
    for name, res in record.get("results", {}).items():
        prov = res.get("data")
        if not prov and res.get("rows"):
            prov = res["rows"][0].get("provenance")
        if isinstance(prov, dict):
            key = f"{prov.get('label')}|{prov.get('task')}|{prov.get('train_indices_digest', prov.get('n_train'))}"
            seen.setdefault(key, {"units": [], **prov})["units"].append(name)
    return list(seen.values())


def provenance_markdown(record: dict[str, Any]) -> str:
    out = [f"- versions: {', '.join(f'{k} {v}' for k, v in record['versions'].items())}",
           f"- device: {record['device'].get('platform')}, CUDA {record['device'].get('cuda')}, "
           f"torch threads {record['device'].get('torch_threads')}"]
    for p in data_provenance(record):
        out.append(f"- data: {p.get('label')} ({p.get('source_kind', p.get('source', ''))}), task {p.get('task')}, "
                   f"used by {', '.join(p['units'])}")
    for name, u in record.get("units", {}).items():
        out.append(f"- unit {name}: {fmt(u.get('wall_s'))} s{' (cached)' if u.get('cached') else ''}")
    return "\n".join(out)


def render_all(record: dict[str, Any], out: Path, pdf: bool = True) -> Written:
    """Write claims.md, claims.html and (unless `pdf=False`) claims.pdf into `out`."""
    out = Path(out)
    written = Written()
    atomic_write_text(out / "claims.md", to_markdown(record))
    written.paths.append(out / "claims.md")
    figs = make_figures(record, out / "figures")
    for f in figs:
        f["uri"] = image_data_uri(f["path"])
    html = render_html("claims.html", {
        "r": record, "groups": GROUP_TITLES, "figs": figs, "vclass": VERDICT_CLASS,
        "provenance": data_provenance(record), "training": training_table(record),
        "theory_summary": theory_summary(record),
        "instrument": instrument_line(record),
        "fixed_condition": FIXED_CONDITION,
        "rule_status": {c["id"]: rule_status(record, c["id"]) for c in record["claims"]},
        "conditions": [(n, _condition_label(n)) for n in condition_names(record)],
        "agreement": {c["id"]: _agreement(c) for c in record["claims"] if c.get("empirical")},
        "stability": {c["id"]: stability_cell(c).replace("**", "") for c in record["claims"]},
        "bottom_line": bottom_line(record),
    })
    written.paths.append(write_html(out / "claims.html", html))
    if pdf:
        try:
            written.paths.append(write_pdf(out / "claims.pdf", html))
        except PdfUnavailable as exc:
            written.pdf_ok, written.pdf_error = False, str(exc)
            import sys

            sys.stderr.write(f"verify: PDF not written: {exc}\n")
    return written
