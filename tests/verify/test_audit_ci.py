"""`verify audit` in CI: `--fail-on` both ways (and its precedence over a missing PDF), the record's JSON schema
against real records, the Markdown summary, and `verify audit diff` on real records, on a record with itself,
and on bad files."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from small_audit import write_inputs
from tolerances import F64_ROUNDING

from empirics.intervals import wilson
from verify.audit.ci import DIFF_MOVED_EXIT, FAIL_ON_EXIT, diff_records, load_schema
from verify.audit.config import SCHEMA_VERSION
from verify.audit.record import record_errors
from verify.audit.risk import RISK_LEVELS
from verify.cli import main

TINY = ["--n", "40", "--n-test", "20", "--tau", "0.2", "--steps", "2", "--baseline-seeds", "2", "--no-reference",
        "--hessian-iters", "2", "--top-k", "3", "--lds-subsets", "3", "--refit-epochs", "1", "--refit-seeds", "2",
        "--outcome-targets", "4", "--attack", "fgsm,pgd"]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")


def _audit(folder: Path, name: str, model: str, train: str, test: str, extra: list[str]) -> tuple[int, Path]:
    out = folder / f"{name}.pdf"
    code = main(["audit", "--model", model, "--train", train, "--test", test, *TINY, "--out", str(out), "--json",
                 *extra])
    return code, out


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    """Two real audits: a trained CNN (with --summary and --fail-on medium) and the same CNN untrained."""
    import os

    os.environ["NTKM_PROGRESS"] = "0"
    d = tmp_path_factory.mktemp("audit-ci")
    write_inputs(d)
    code_a, out_a = _audit(d, "a", str(d / "cnn.ts"), str(d / "train.npz"), str(d / "test.npz"),
                           ["--summary", "--fail-on", "medium"])
    code_b, out_b = _audit(d, "b", str(d / "raw.ts"), str(d / "train.npz"), str(d / "test.npz"), [])
    assert code_b == 0
    return {"dir": d, "code_a": code_a, "a": out_a, "b": out_b,
            "rec_a": json.loads(out_a.with_suffix(".json").read_text()),
            "rec_b": json.loads(out_b.with_suffix(".json").read_text())}


# --- --fail-on ----------------------------------------------------------------------------------------------


def test_fail_on_exit_code_after_every_output_was_written(records):
    level = records["rec_a"]["risk"]["level"]
    assert records["code_a"] == (0 if level == "low" else FAIL_ON_EXIT)  # fails closed without a level
    out = records["a"]
    assert out.read_bytes()[:5] == b"%PDF-"
    assert out.with_suffix(".json").exists() and (out.parent / "a-summary.md").exists()


@pytest.mark.parametrize(("level", "fail_on", "expected"), [
    ("high", "high", FAIL_ON_EXIT), ("medium", "medium", FAIL_ON_EXIT), ("high", "medium", FAIL_ON_EXIT),
    ("medium", "high", 3), ("low", "medium", 3), ("not measurable", "medium", FAIL_ON_EXIT),
    ("not validated", "high", FAIL_ON_EXIT), ("not validated", None, 3)])
def test_fail_on_both_ways_and_over_a_missing_pdf(level, fail_on, expected, records, tmp_path, capsys, monkeypatch):
    import reports.render as render

    def no_pdf(path, html):
        raise render.PdfUnavailable("weasyprint missing")

    monkeypatch.setattr(render, "write_pdf", no_pdf)
    monkeypatch.setattr("reports.audit_report.render_report",
                        lambda result, realistic_reason: "<html>figures not drawn</html>")
    rec = copy.deepcopy(records["rec_a"])
    rec["risk"]["level"] = level
    saved = tmp_path / "rec.json"
    saved.write_text(json.dumps(rec))
    out = tmp_path / "r.pdf"
    code = main(["audit", "--render", str(saved), "--out", str(out), "--summary",
                 *(["--fail-on", fail_on] if fail_on else [])])
    err = capsys.readouterr().err
    assert code == expected
    assert out.with_suffix(".html").exists() and (tmp_path / "r-summary.md").exists()
    assert (f"reaches --fail-on {fail_on}" in err) == (expected == FAIL_ON_EXIT)


def test_untrained_model_is_not_measurable_and_the_trained_one_follows_the_validity_rule(records):
    """Real audits with real re-fits: the untrained CNN is at chance on the test points, so no level is issued; the
    trained copy passes the model gate and gets a level exactly when its influence validates."""
    untrained, trained = records["rec_b"]["risk"], records["rec_a"]["risk"]
    assert untrained["level"] == "not measurable" and not untrained["model_gate"]["passed"]
    assert "test accuracy" in untrained["reason"] and untrained["reason"] == untrained["model_gate"]["reason"]
    assert trained["model_gate"]["passed"], trained["model_gate"]
    val = records["rec_a"]["panels"]["validity"]
    assert val["repeats"] == 2 and val["ceiling"]["repeats"] == 2
    for s in val["lds"].values():
        assert np.isnan(s["fraction"]) or s["fraction"] == pytest.approx(s["value"] / val["ceiling"]["value"])
    assert (trained["level"] in RISK_LEVELS) == (val["verdict"] == "trustworthy")
    if trained["level"] == "not validated":
        assert "of the noise ceiling" in trained["reason"] or "not adequate" in val["reason"], trained["reason"]
    summary = (records["dir"] / "a-summary.md").read_text()
    assert str(trained["level"]).upper() in summary


def test_trained_audit_scores_the_libraries_beside_its_three_and_leads_with_one_of_its_own(records):
    """Issue 29: the validity panel of a real audit lists the audit's three estimators and the libraries' (scored on
    the same re-fits, against the same ceiling); the lead is the audit's own estimator or ensemble of one with the
    highest LDS (issue 43 item 4; the libraries never lead) and is what the flip rates ranked."""
    pytest.importorskip("kronfluence")
    pytest.importorskip("trak")
    rec = records["rec_a"]
    val = rec["panels"]["validity"]
    libs = [k for k, s in val["lds"].items() if s.get("library")]
    assert {"ntk", "gn", "ef"} <= set(val["lds"]) and len(libs) >= 1, val.get("unscored")
    assert np.isfinite(val["ceiling"]["value"])
    from verify.audit.ensemble import is_ensemble
    from verify.audit.estimators import ESTIMATORS

    eligible = {k: s["value"] for k, s in val["lds"].items()
                if (k in ESTIMATORS or is_ensemble(k)) and np.isfinite(s["value"])}
    assert val["lead"] in eligible and rec["models"]["user"]["estimator"] == val["lead"]
    assert eligible[val["lead"]] == max(eligible.values())
    assert rec["levers"] and all("ntk_influence" in it for it in rec["levers"])


def test_fail_on_rejects_an_unknown_level(records, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--render", str(records["a"].with_suffix(".json")), "--out", str(tmp_path / "r.pdf"),
              "--fail-on", "low"])
    assert exc.value.code == 2 and "--fail-on" in capsys.readouterr().err


# --- schema -------------------------------------------------------------------------------------------------


def test_real_records_match_the_schema(records):
    """Both real records validate as `AuditRecord` and, independently, against the committed JSON schema."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema())
    for rec in (records["rec_a"], records["rec_b"]):
        assert rec["schema_version"] == SCHEMA_VERSION
        assert record_errors(rec) == []
        assert [e.message for e in validator.iter_errors(rec)] == []


@pytest.mark.parametrize(("path", "value", "match"), [
    (("schema_version",), "1", "valid integer"),
    (("risk", "level"), "severe", "Input should be 'low'"),
    (("models", "user", "worst_flip_rate"), 1.5, "proportion must lie in"),
    (("data", "n_test"), "20", "valid integer"),
    (("levers",), {"index": 0}, "valid list"),
])
def test_the_schema_rejects_a_broken_record(path, value, match, records):
    import re

    rec = copy.deepcopy(records["rec_a"])
    node = rec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errs = record_errors(rec)
    assert errs and any(re.search(match, e) and e.startswith("$." + ".".join(path)) for e in errs), errs
    del rec["models"]
    assert "$.models: missing" in record_errors(rec)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(load_schema())


# --- summary ------------------------------------------------------------------------------------------------


def test_summary_states_the_records_findings(records):
    rec = records["rec_a"]
    md = (records["dir"] / "a-summary.md").read_text()
    assert md.startswith("<!-- verify audit summary -->\n### Malleability audit of `cnn.ts`")
    level = rec["risk"]["level"]
    assert (f"**{level.upper()}** risk" if level in RISK_LEVELS else f"risk **{level.upper()}**") in md
    if level not in RISK_LEVELS:
        assert f"{level.capitalize()}: {rec['risk']['reason']}." in md
    user = rec["models"]["user"]
    assert f"{100 * user['worst_flip_rate']:.1f} % ({user['worst_attack'].upper()}" in md
    lo, hi = stats.binomtest(round(user["worst_flip_rate"] * user["n_selected"]),
                             user["n_selected"]).proportion_ci(method="wilson")
    assert f"interval {100 * lo:.1f} % to {100 * hi:.1f} %" in md
    pan = rec["panels"]
    assert pan["validity"]["verdict"] in md
    best, lead = pan["validity"].get("best"), pan["validity"].get("lead") or "ntk"
    if best and best != lead and "fraction" in pan["validity"]["lds"][best]:  # the row names a best other than the lead
        assert f"best estimator against re-fits | {pan['validity']['lds'][best]['label']}: LDS" in md
    else:
        assert "best estimator against re-fits" not in md
    assert f"breaking budget | {pan['budget']['breaking_label']}" in md
    if "rankings" in pan["poison"]:
        po = pan["poison"]
        assert f"precision at {po['k']} | {100 * po['rankings'][po['headline']]['precision']:.1f} %" in md
    assert len(md.splitlines()) < 25


# --- diff ---------------------------------------------------------------------------------------------------


def test_wilson_interval_matches_scipy():
    for k, n in ((0, 5), (3, 10), (10, 10), (7, 20)):
        ref = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert wilson(k / n, n) == pytest.approx((ref.low, ref.high), abs=F64_ROUNDING)
        assert 0.0 <= wilson(k / n, n)[0] <= k / n <= wilson(k / n, n)[1] <= 1.0


def test_diff_of_a_record_with_itself_moves_nothing(records, capsys):
    path = str(records["a"].with_suffix(".json"))
    assert main(["audit", "diff", path, path]) == 0
    out = capsys.readouterr().out
    assert "nothing moved" in out and "MOVED " not in out


def test_diff_of_two_real_records(records, capsys):
    a, b = records["rec_a"], records["rec_b"]
    code = main(["audit", "diff", str(records["a"].with_suffix(".json")), str(records["b"].with_suffix(".json"))])
    out = capsys.readouterr().out
    d = diff_records(a, b)
    rows = {r["name"]: r for r in d["rows"]}
    n = a["data"]["n_test"]
    ia = stats.binomtest(round(a["models"]["user"]["test_acc"] * n), n).proportion_ci(method="wilson")
    ib = stats.binomtest(round(b["models"]["user"]["test_acc"] * n), n).proportion_ci(method="wilson")
    assert ia.low > ib.high  # the trained CNN beats the untrained one beyond both intervals
    assert rows["user: test accuracy"]["status"] == "moved"
    assert rows["risk level"]["status"] == ("moved" if a["risk"]["level"] != b["risk"]["level"] else "same")
    va = a["panels"]["validity"]["verdict"]
    if "validity" in b["panels"]:
        assert rows["validity verdict"]["status"] == ("moved" if va != b["panels"]["validity"]["verdict"] else "same")
    else:  # the untrained CNN is below the accuracy gate: no panel ran (issue 43)
        assert "validity" in b["panels"]["skipped"]["panels"] and rows["validity verdict"]["status"] != "same"
    assert code == DIFF_MOVED_EXIT and "MOVED" in out and "user: test accuracy" in out
    assert "model file: changed" in out


def _bad_files(d: Path, rec: dict) -> dict[str, tuple[Path, str]]:
    (d / "p.pkl").write_bytes(pickle.dumps({"experiment": "audit"}))
    (d / "claims.json").write_text(json.dumps({"experiment": "claims"}))
    old = copy.deepcopy(rec)
    del old["schema_version"]
    (d / "old.json").write_text(json.dumps(old))
    broken = copy.deepcopy(rec)
    broken["models"]["user"]["worst_flip_rate"] = "high"
    (d / "broken.json").write_text(json.dumps(broken))
    return {"pickle": (d / "p.pkl", "not a JSON file"), "claims": (d / "claims.json", "not an audit record"),
            "missing": (d / "none.json", "no such file"), "unversioned": (d / "old.json", "schema_version None"),
            "schema": (d / "broken.json", "does not match the audit schema"), "folder": (d, "is a folder, not a file")}


@pytest.mark.parametrize("case", ["pickle", "claims", "missing", "unversioned", "schema", "folder"])
def test_diff_of_a_bad_file_is_one_line_exit_2(case, records, tmp_path, capsys):
    bad, match = _bad_files(tmp_path, records["rec_a"])[case]
    code = main(["audit", "diff", str(records["a"].with_suffix(".json")), str(bad)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and match in lines[0] and "NEW" in lines[0], err


def test_diff_needs_exactly_two_files(records, capsys):
    assert main(["audit", "diff", str(records["a"].with_suffix(".json"))]) == 2
    assert "diff OLD.json NEW.json" in capsys.readouterr().err
    assert main(["audit", "frob", "x", "y"]) == 2
    assert "unknown action" in capsys.readouterr().err


def test_risk_levels_are_the_schemas():
    assert load_schema()["$defs"]["Risk"]["properties"]["level"]["enum"][:3] == list(RISK_LEVELS)
