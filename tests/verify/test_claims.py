"""`verify claims`: the smoke preset end to end, caching/resume, re-rendering, and the verdict rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_records import complete

from empirics.attribution.influence import RetrainRecord
from empirics.experiments.distance import DistanceRecord
from verify.claims import VERDICTS, all_claims, claim_row
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, PartlyAs
from verify.claims.ntk import _contrast_claim, ntk_claim
from verify.cli import main


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims")
    rc = main(["claims", "--preset", "smoke", "--out", str(out)])
    return rc, out


def test_smoke_writes_every_claim_with_a_verdict(smoke_run):
    rc, out = smoke_run
    assert rc == 0
    rec = json.loads((out / "claims.json").read_text())
    ids = [c["id"] for c in rec["claims"]]
    assert ids == [c.id for c in all_claims()]
    assert len(set(ids)) == len(ids)
    for c in rec["claims"]:
        assert c["verdict"] in VERDICTS, c
        assert c["paper"] and c["rule"] and c["protocol"]
        if c["verdict"] != "not measurable here":
            assert c["ours"] not in ("", "-"), c
    assert sum(rec["summary"].values()) == len(ids)
    assert rec["versions"]["torch"] and rec["code_version"]
    for name in ("claims.md", "claims.html", "claims.pdf"):
        assert (out / name).stat().st_size > 1000
    assert (out / "claims.pdf").read_bytes()[:5] == b"%PDF-"
    md = (out / "claims.md").read_text()
    assert "JPEG re-encoding" in md  # CIFAR-10 provenance names the JPEG copy
    # page 1 is the bottom line (issue 40 item 7): a line per claim before the summary, protocols and matrix
    assert md.index("## Bottom line") < md.index("## Verdict matrix") < md.index("## Protocols and verdict rules")
    bottom = md[md.index("## Bottom line"):md.index("## Verdict matrix")]
    assert all(f"| {c['id']} |" in bottom for c in rec["claims"])
    for c in rec["claims"]:  # every row carries its printed label and, where empirical, its multiplicity block key
        assert c["label"].startswith(c["verdict"]) and "multiplicity" in c
        assert c["verdict"] == "partly" or c["label"] == c["verdict"] or c["verdict"] == "underdetermined"
    assert rec["multiplicity"]["alpha"] == 0.05


def test_resume_recomputes_nothing(smoke_run, capsys):
    _, out = smoke_run
    rc = main(["claims", "--preset", "smoke", "--out", str(out), "--resume", "--no-pdf"])
    assert rc == 0
    rec = json.loads((out / "claims.json").read_text())
    assert rec["units"] and all(u["cached"] for u in rec["units"].values())
    assert "[run]" not in capsys.readouterr().err


def test_report_rerenders_from_json_alone(smoke_run, tmp_path):
    _, out = smoke_run
    rec_path = tmp_path / "claims.json"
    rec_path.write_text((out / "claims.json").read_text())
    assert main(["report", str(rec_path), "--no-pdf"]) == 0
    html = (tmp_path / "claims.html").read_text()
    assert "Appendix B" in html and "data:image/png;base64," in html


@pytest.mark.parametrize("argv, needle", [
    (["claims", "--only", "no-such-claim"], "unknown claim id"),
    (["claims", "--preset", "huge"], "unknown preset"),
    (["report", "/nonexistent/claims.json"], "does not exist"),
])
def test_bad_input_one_line(argv, needle, capsys, tmp_path):
    rc = main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "claims" else []))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o" / "claims.json").exists()


WIDTHS = [16, 64, 256, 1024]


def _block(kind: str, per_seed: dict[int, list[float]], secondary: list[float] | None = None,
           passed: bool = True, gd: dict[int, list[float]] | None = None, gd_passed: bool = True) -> dict:
    """A synthetic ntk-distance block with real slope intervals computed from the runs; the gd-mse estimand
    follows `per_seed` unless `gd` is given."""
    from empirics.experiments.distance import GD_METRIC, METRICS, slope_interval

    sec = secondary or [1.0] * len(WIDTHS)
    gd = gd or per_seed
    runs = []
    for s, vals in per_seed.items():
        for w, v, d, g in zip(WIDTHS, vals, sec, gd[s], strict=True):
            runs.append({"seed": s, "width": w, "model": kind, "function_abs": v, "function_lin": d * (1 + 0.01 * s),
                         "kernel_drift_centred": d * (1 + 0.02 * s), "train_acc": 0.9, "test_acc": 0.8,
                         "gate": {"passed": passed, "reason": "passed" if passed else "train acc 0.10 < 0.55"},
                         GD_METRIC: g, "gd_gate": {"passed": gd_passed,
                                                   "reason": "passed" if gd_passed else "no plateau after 9 epochs"}})
    per_width = {str(w): {m: {"mean": 1.0, "std": 0.0} for m in ("function_abs", "train_acc", "test_acc")}
                 for w in WIDTHS}
    trends = {m: {"slope_interval": slope_interval(WIDTHS, runs, m)}
              for m in METRICS if m in ("function_abs", "function_lin", "kernel_drift_centred")}
    return {"runs": runs, "per_width": per_width, "trends": trends}


def _distance(relu: dict, attn: dict) -> dict:
    cfg = {"n_train": 10, "n_test": 5, "widths": WIDTHS,
           "train": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "epochs": 1, "protocol": "x"}}
    return {"ntk-distance:mnist": complete(DistanceRecord, {
        "models": {"relu": relu, "attn": attn}, "config": cfg, "data": {"label": "x"}, "ridge": 0.01,
        "ridge_rule": "r"})}


DOWN = {0: [4, 3, 2, 1], 1: [4.2, 3.1, 2.2, 1.1], 2: [3.9, 2.8, 1.9, 0.9]}
UP = {s: list(reversed(v)) for s, v in DOWN.items()}
FLAT = {0: [2, 3, 2, 3], 1: [3, 2, 3, 2], 2: [2.5, 2.5, 2.4, 2.6]}


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-relu-cifar10", "ntk-attn-cifar10",
                   "ntk-attn-centred-mnist", "ntk-softmax-mnist", "ntk-qkv-mnist")
def test_ntk_rule_decides_on_the_slope_interval():
    falls = ntk_claim("mnist", "relu", "decreasing")
    rises = ntk_claim("mnist", "attn", "rises")
    assert falls(_distance(_block("relu", DOWN), _block("attn", UP))).verdict == HOLDS
    assert rises(_distance(_block("relu", DOWN), _block("attn", UP))).verdict == HOLDS
    assert falls(_distance(_block("relu", UP), _block("attn", UP))).verdict == NOT
    # a flat, noisy distance: the interval straddles 0, so no direction is shown either way
    out = falls(_distance(_block("relu", FLAT), _block("attn", UP)))
    assert out.verdict == INCONCLUSIVE and "slope CI < 0" in out.condition


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-relu-cifar10", "ntk-attn-cifar10",
                   "ntk-attn-centred-mnist", "ntk-softmax-mnist", "ntk-qkv-mnist")
def test_ntk_rule_needs_both_co_primary_estimands():
    """The paper's distance and the gd-mse estimand decide together: one on the claimed side is 'partly'; the gd-mse
    networks below the gate leave only the paper's distance, so at most 'partly', and say so."""
    falls = ntk_claim("mnist", "relu", "decreasing")
    attn = _block("attn", UP)
    assert falls(_distance(_block("relu", DOWN, gd=UP), attn)).verdict == PARTLY
    assert falls(_distance(_block("relu", UP, gd=DOWN), attn)).verdict == PARTLY
    assert falls(_distance(_block("relu", UP, gd=UP), attn)).verdict == NOT
    out = falls(_distance(_block("relu", DOWN, gd_passed=False), attn))
    assert out.verdict == PARTLY and "gd-mse function change not measurable" in out.ours
    assert out.numbers["co_primary_on_side"] == [True, False]
    no_gd = _block("relu", DOWN, gd=UP)
    for r in no_gd["runs"]:
        del r["gd_gate"], r["gd_function_change"]
    out = falls(_distance(no_gd, attn))
    # e.g. the qkv variant or a preset without gd-mse networks: no "holds" on one estimand (issue 40 item 2)
    assert out.verdict == PARTLY and out.partly_as is PartlyAs.ONE_ESTIMAND and "no gd-mse networks" in out.ours


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-relu-cifar10", "ntk-attn-cifar10",
                   "ntk-attn-centred-mnist", "ntk-softmax-mnist", "ntk-qkv-mnist")
def test_ntk_rule_gives_no_credit_from_a_metric_that_falls_for_both():
    falls_sec = [4.0, 2.0, 1.0, 0.5]
    rises_sec = list(reversed(falls_sec))
    relu_ok = _block("relu", FLAT, secondary=falls_sec)
    falls = ntk_claim("mnist", "relu", "decreasing")
    assert falls(_distance(relu_ok, _block("attn", UP, secondary=rises_sec))).verdict == PARTLY
    assert falls(_distance(relu_ok, _block("attn", UP, secondary=falls_sec))).verdict == INCONCLUSIVE


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-relu-cifar10", "ntk-attn-cifar10",
                   "ntk-attn-centred-mnist", "ntk-softmax-mnist", "ntk-qkv-mnist", "ntk-contrast-mnist",
                   "ntk-contrast-cifar10")
def test_gate_turns_a_verdict_into_not_measurable():
    falls = ntk_claim("mnist", "relu", "decreasing")
    out = falls(_distance(_block("relu", DOWN, passed=False), _block("attn", UP)))
    assert out.verdict == NA and "adequacy gate" in out.ours and out.gate
    assert _contrast_claim("mnist")(_distance(_block("relu", DOWN), _block("attn", UP, passed=False))).verdict == NA


@pytest.mark.claim("ntk-contrast-mnist", "ntk-contrast-cifar10")
def test_contrast_rule_outcomes():
    contrast = _contrast_claim("mnist")
    assert contrast(_distance(_block("relu", DOWN), _block("attn", UP))).verdict == HOLDS
    assert contrast(_distance(_block("relu", FLAT), _block("attn", UP))).verdict == PARTLY
    assert contrast(_distance(_block("relu", UP), _block("attn", DOWN))).verdict == NOT


STEEP = {s: [v ** 2 for v in vals] for s, vals in DOWN.items()}  # falls about twice as fast as DOWN


@pytest.mark.claim("ntk-contrast-mnist", "ntk-contrast-cifar10")
def test_contrast_with_attention_converging_is_not_holds():
    """'Does not converge' is not 'converges more slowly' (issue 40 item 2): attention whose own slope interval lies
    below 0 gives at most 'partly (converges more slowly)', although its slope exceeds ReLU's."""
    out = _contrast_claim("mnist")(_distance(_block("relu", STEEP), _block("attn", DOWN)))
    assert out.numbers["difference"]["ci"][0] > 0 and out.numbers["attn"]["ci"][1] < 0
    assert out.verdict == PARTLY and out.partly_as is PartlyAs.SLOWER and out.label == "partly (converges more slowly)"
    out = _contrast_claim("mnist")(_distance(_block("relu", FLAT), _block("attn", UP)))
    assert out.partly_as is PartlyAs.CONVERGENCE_NOT_SHOWN


@pytest.mark.claim("ntk-attn-mnist", "ntk-relu-mnist")
def test_a_secondary_metric_counts_against_as_well_as_for():
    """Side evidence counts in both directions: both co-primary estimands rise for MLP-Attn, but its centred kernel
    drift and init-matched distance fall with width, so 'partly (a secondary metric against)', never 'holds'."""
    rises = ntk_claim("mnist", "attn", "rises")
    out = rises(_distance(_block("relu", DOWN), _block("attn", UP, secondary=[4.0, 3.0, 2.0, 1.0])))
    assert out.numbers["co_primary_on_side"] == [True, True]
    assert set(out.numbers["secondary_against"]) == {"function_lin", "kernel_drift_centred"}
    assert out.verdict == PARTLY and out.partly_as is PartlyAs.SECONDARY_AGAINST and "against:" in out.ours
    assert rises(_distance(_block("relu", DOWN), _block("attn", UP, secondary=[1.0, 2.0, 3.0, 4.0]))).verdict == HOLDS


@pytest.mark.claim("ntk-relu-mnist")
def test_claim_row_marks_robust_only_when_both_protocols_agree():
    from verify.claims.ntk import NTK_CLAIMS

    claim = NTK_CLAIMS[0]
    both = {f"{k}@{p}": v for p in ("paper", "proper") for k, v in _distance(_block("relu", DOWN),
                                                                              _block("attn", UP)).items()}
    row = claim_row(claim, both)
    assert row["by_protocol"]["paper"]["verdict"] == row["by_protocol"]["proper"]["verdict"] == "holds"
    assert row["robust"] and row["verdict"] == "holds"
    mixed = dict(both)
    mixed["ntk-distance:mnist@paper"] = _distance(_block("relu", UP), _block("attn", UP))["ntk-distance:mnist"]
    row = claim_row(claim, mixed)
    assert row["by_protocol"]["paper"]["verdict"] == "does not hold" and not row["robust"]


def test_no_paper_value_in_ours_column(smoke_run):
    """'ours' is produced from measurements: it never equals the paper column verbatim."""
    _, out = smoke_run
    rec = json.loads(Path(out / "claims.json").read_text())
    for c in rec["claims"]:
        assert c["ours"] != c["paper"]


def _retrain(lo: float, passed: bool = True) -> RetrainRecord:
    ci = {"value": lo + 0.1, "ci": [lo, min(1.0, lo + 0.3)]}
    cfg = {"n_train": 10, "n_test": 5, "width": 8, "protocol": "x", "epochs": 1, "n_remove": 4, "ridge_rel": 1e-3}
    return complete(RetrainRecord, {
        "config": cfg, "data": {"label": "x"}, "spearman": ci, "pearson": ci, "sign_agreement": 0.5,
        "training": {"train_acc": 0.9, "test_acc": 0.8,
                     "gate": {"passed": passed, "reason": "passed" if passed else "no plateau after 1 epochs"}}})


@pytest.mark.claim("influence-retrain")
@pytest.mark.parametrize(("relu", "attn", "expected"), [
    (_retrain(0.6), _retrain(0.7), HOLDS),
    (_retrain(0.6), _retrain(0.1), PARTLY),
    (_retrain(0.2), _retrain(0.1), PARTLY),
    (_retrain(0.6), _retrain(-0.4), PARTLY),
    (_retrain(-0.2), _retrain(-0.4), NOT),
    (_retrain(0.6), _retrain(0.7, passed=False), NA),
])
def test_influence_retrain_rule_outcomes(relu, attn, expected):
    from verify.claims.influence import INFLUENCE_CLAIMS

    out = INFLUENCE_CLAIMS[0].evaluate({"influence-retrain:relu": relu, "influence-retrain:attn": attn})
    assert out.verdict == expected


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-relu-cifar10", "ntk-attn-cifar10",
                   "ntk-attn-centred-mnist", "ntk-softmax-mnist", "ntk-qkv-mnist")
def test_ntk_rule_drops_widths_below_the_gate_and_needs_three():
    falls = ntk_claim("mnist", "relu", "decreasing")
    narrow_fails = _block("relu", DOWN)
    for r in narrow_fails["runs"]:
        if r["width"] == 16 and r["seed"] == 0:
            r["gate"] = {"passed": False, "reason": "train acc 0.30 < 0.55"}
    out = falls(_distance(narrow_fails, _block("attn", UP)))
    assert out.verdict == HOLDS and out.numbers["widths_kept"] == [64, 256, 1024]
    assert "16" in out.ours and "dropped" in out.ours
    for r in narrow_fails["runs"]:
        if r["width"] == 1024:
            r["gate"] = {"passed": False, "reason": "no plateau after 1 epochs"}
    assert falls(_distance(narrow_fails, _block("attn", UP))).verdict == NA


@pytest.mark.claim("landscape-mnist", "landscape-cifar10")
def test_landscape_claim_is_underdetermined_when_the_normalisation_splits_it():
    """As measured ReLU is flatter ('does not hold'); per unit loss (it trained to a 4x lower loss) it is sharper
    ('holds'): the claim reads 'underdetermined (normalisation)' and names both (issue 40 item 2)."""
    from empirics.experiments.landscape import LandscapeRecord, landscape_verdict
    from verify.claims.landscape import LANDSCAPE_CLAIMS

    def run(seed: int, model: str, value: float, loss: float) -> dict:
        return {"seed": seed, "model": model, "top_eigenvalue": value, "filter_increase": value, "trace": value,
                "sharpness_per_input": value, "train_acc": 0.9, "test_acc": 0.8, "train_loss": loss,
                "interp_argmin_alpha": 1.0, "feature_norm2": 1.0,
                "interpolation": {"alpha": [0.0, 1.0, 1.5], "train": [2.0, loss, loss * 2]},
                "gate": {"passed": True, "reason": "passed"}}

    models = {"relu": {"runs": [run(s, "relu", v, 0.025) for s, v in enumerate((0.5, 0.4, 0.6))]},
              "attn": {"runs": [run(s, "attn", 1.0, 0.1) for s in range(3)]}}
    summary = {m: {"mean": 1.0, "std": 0.0} for m in ("filter_increase", "top_eigenvalue", "train_acc", "test_acc")}
    cfg = {"n_train": 10, "width": 16, "hessian_iters": 5, "hutchinson_samples": 2,
           "train": {"optimizer": "adam", "epochs": 1, "protocol": "x"}}
    rec = complete(LandscapeRecord, {
        "models": {k: {"runs": v["runs"], "summary": summary} for k, v in models.items()},
        "verdict": landscape_verdict({"models": models}).to_dict(), "config": cfg, "data": {"label": "x"}})
    out = LANDSCAPE_CLAIMS[0].evaluate({"landscape:mnist": rec})
    assert out.verdict.value == "underdetermined" and out.label == "underdetermined (normalisation)"
    assert out.numbers["by_normalisation"] == {"as measured": "does not hold", "per unit loss": "holds"}
