"""The claims' conditions, training protocol x input preprocessing: unit names (raw keeps the names of before the
axis), one unit per condition with the preprocessing in its config, and the verdict per condition, with the
"underdetermined (preprocessing)" headline when raw and channel give different measured verdicts."""

from __future__ import annotations

from empirics.nets.protocols import proper_lr
from verify.claims import PROTOCOLS, Claim, Outcome, Verdict, claim_row, claim_units, conditions, units
from verify.claims.base import CLAIMS_PROTOCOLS, HOLDS, NA, NOT, PARTLY, PREPROCESSINGS, claims_protocol
from verify.experiments import units_for
from verify.presets import PRESET_NAMES, preset


def test_condition_names_keep_raw_as_before():
    assert units.condition("proper") == units.condition("proper", "raw") == "proper"
    assert units.condition("paper", "channel") == "paper+channel"
    assert units.at("landscape:mnist", "proper", "raw") == "landscape:mnist@proper"
    assert units.at("landscape:mnist", "proper", "channel") == "landscape:mnist@proper+channel"
    assert conditions(("raw", "channel")) == [("paper", "raw"), ("paper", "channel"), ("proper", "raw"),
                                              ("proper", "channel")]


def test_one_unit_per_condition_with_the_preprocessing_in_its_config():
    for name in PRESET_NAMES:  # raw first (the headline and `by_protocol` are raw's), only what the claims know
        pres = preset(name)["preprocessings"]
        assert ("raw" not in pres or pres[0] == "raw") and set(pres) <= set(PREPROCESSINGS), name
        assert set(preset(name)["protocols"]) <= set(CLAIMS_PROTOCOLS) and preset(name)["protocols"], name
        assert any(claims_protocol(p).varies is None for p in preset(name)["protocols"]), name  # a headline
    assert preset("smoke")["preprocessings"] == ("raw",)
    both = [n for n in PRESET_NAMES if {"raw", "unit"} <= set(preset(n)["preprocessings"])]
    assert both  # the issue: every empirical claim is also run on standardised inputs
    made = units_for(both[0])
    raw = [n for n in made if n.endswith("@proper")]
    assert raw
    for name in raw:
        twin = made[name.replace("@proper", "@proper+unit")]
        assert "preprocess" not in made[name].config  # the raw unit's config (its cache key) is as before
        # the twin differs by its preprocessing and, through it, the piloted rate of the width-consistent protocol
        cfg = made[name].config
        ds = cfg.get("dataset")
        assert twin.config == {**cfg, "preprocess": "unit",
                               "train": {**cfg["train"], "lr": proper_lr(ds, "unit")[0]}}
        assert cfg["train"]["lr"] == proper_lr(ds, "raw")[0]
    assert not any("+" in n for n in units_for("smoke"))


def test_a_preset_with_one_condition_makes_only_its_units():
    """quick judges proper training on standardised unit-norm inputs only (docs/DEVIATIONS.md D17, D19): no unit of
    another condition is made, every trained unit is unit-preprocessed, and a claim's units are that condition's."""
    p = preset("quick")
    made = units_for("quick")
    trained = [n for n in made if "@" in n]
    assert trained and all(n.endswith("@proper+unit") for n in trained)
    assert all(made[n].config["preprocess"] == "unit" for n in trained)
    claim = _claim()
    assert claim_units(claim, p["preprocessings"], p["protocols"]) == ("u@proper+unit",)
    row = claim_row(claim, {"u@proper+unit": {"v": NOT.value}}, p["preprocessings"], p["protocols"])
    assert row["verdict"] == NOT.value and list(row["by_condition"]) == ["proper+unit"]
    assert list(row["by_protocol"]) == ["proper"] and not row["preprocessing_split"]
    assert not claim_row(claim, {"u@proper+unit": {"v": HOLDS.value}}, p["preprocessings"], p["protocols"])["robust"]


def test_a_one_condition_run_writes_its_report(tmp_path, monkeypatch, capsys):
    """A preset with one condition (as quick) runs end to end: report, summary lines and verdict matrix name only
    its condition (the HTML template once named both protocols and failed on such a record)."""
    import json

    from verify import presets
    from verify.cli import main

    one = {**presets.PRESETS["smoke"], "protocols": ("proper",), "preprocessings": ("raw",)}
    monkeypatch.setitem(presets.PRESETS, "smoke", one)
    out = tmp_path / "out"
    assert main(["claims", "--preset", "smoke", "--only", "thm4.2,landscape-mnist", "--out", str(out), "--no-pdf",
                 "--jobs", "1"]) == 0
    rec = json.loads((out / "claims.json").read_text())
    row = next(c for c in rec["claims"] if c["id"] == "landscape-mnist")
    assert list(row["by_condition"]) == ["proper"] and not row["robust"]
    assert list(rec["protocols"]) == ["proper"] and "paper" not in rec["summary_by_protocol"]
    html = (out / "claims.html").read_text()
    assert "<b>proper</b>" in html and "judged twice" not in html
    assert "| landscape-mnist | " in (out / "claims.md").read_text()
    from reports.claims_report import _agreement

    assert _agreement(row) == "-"  # one condition: nothing compared, neither 'yes' nor 'no'
    assert "landscape-mnist" in capsys.readouterr().out



def _claim() -> Claim:
    """A synthetic empirical claim whose rule reads the verdict its unit's record names."""
    def evaluate(results):
        r = results["u"]
        return Outcome(f"measured {r['v']}", Verdict(r["v"]), "synthetic", seeds=3)

    return Claim("synthetic", "-", "a statement", "-", "the record's verdict", ("u",), evaluate, group="ntk",
                 empirical=True)


def _results(paper_raw: str, paper_channel: str, proper_raw: str, proper_channel: str) -> dict:
    v = {("paper", "raw"): paper_raw, ("paper", "channel"): paper_channel, ("proper", "raw"): proper_raw,
         ("proper", "channel"): proper_channel}
    return {units.at("u", p, pre): {"v": verdict.value} for (p, pre), verdict in v.items()}


def test_verdicts_per_condition_and_underdetermined_by_preprocessing():
    claim = _claim()
    assert claim_units(claim, ("raw", "channel")) == ("u@paper", "u@paper+channel", "u@proper", "u@proper+channel")
    row = claim_row(claim, _results(HOLDS, HOLDS, HOLDS, NOT), ("raw", "channel"))
    assert {k: o["verdict"] for k, o in row["by_condition"].items()} == {
        "paper": "holds", "paper+channel": "holds", "proper": "holds", "proper+channel": "does not hold"}
    assert row["by_protocol"]["proper"]["verdict"] == "holds"  # the raw-pixel outcome, as before the axis
    assert row["verdict"] == "underdetermined"
    assert "preprocessing" in row["ours"] and "raw: holds" in row["ours"] and "channel: does not hold" in row["ours"]
    assert row["preprocessing_split"] == {"proper": {"raw": "holds", "channel": "does not hold"}}
    assert not row["robust"]


def test_a_split_under_the_paper_protocol_only_keeps_the_headline():
    row = claim_row(_claim(), _results(HOLDS, NOT, HOLDS, HOLDS), ("raw", "channel"))
    assert row["verdict"] == "holds" and list(row["preprocessing_split"]) == ["paper"] and not row["robust"]


def test_not_measurable_under_one_preprocessing_is_no_split():
    row = claim_row(_claim(), _results(NA, HOLDS, NA, HOLDS), ("raw", "channel"))
    assert row["preprocessing_split"] == {} and row["verdict"] == "not measurable here" and not row["robust"]
    assert row["by_condition"]["proper+channel"]["verdict"] == "holds"


def test_agreement_everywhere_is_robust_and_raw_only_is_as_before():
    row = claim_row(_claim(), _results(HOLDS, HOLDS, HOLDS, HOLDS), ("raw", "channel"))
    assert row["robust"] and row["verdict"] == "holds" and row["preprocessing_split"] == {}
    only_raw = claim_row(_claim(), _results(HOLDS, NOT, HOLDS, NOT))
    assert list(only_raw["by_condition"]) == list(PROTOCOLS) and only_raw["robust"]
    missing = claim_row(_claim(), {"u@paper": {"v": "holds"}, "u@proper": {"v": "holds"}}, ("raw", "channel"))
    assert missing["by_condition"]["proper+channel"]["verdict"] == "not measurable here"
    assert "u@proper+channel was not run" in missing["by_condition"]["proper+channel"]["protocol"]


def _schedule_results(half: Verdict, quarter: Verdict) -> dict:
    return {units.at("u", "proper", "unit"): {"v": half.value}, units.at("u", "proper-quarter", "unit"):
            {"v": quarter.value}}


def test_the_schedule_axis_makes_underdetermined_where_the_exponents_disagree():
    """Issue 40 item 3: the headline stays proper training at exponent 1/2; where exponent 1/4 gives another measured
    verdict it is "underdetermined (schedule)" naming both; agreement is robust; 'not measurable' is no split."""
    p = preset("schedule")
    pres, protos = p["preprocessings"], p["protocols"]
    split = claim_row(_claim(), _schedule_results(HOLDS, NOT), pres, protos)
    assert split["verdict"] == "underdetermined" and split["label"] == "underdetermined (schedule)"
    assert "lr exponent 1/4: does not hold" in split["ours"] and "proper training: holds" in split["ours"]
    assert list(split["schedule_split"]) == ["proper+unit"] and list(split["by_protocol"]) == list(protos)
    same = claim_row(_claim(), _schedule_results(PARTLY, PARTLY), pres, protos)
    assert same["verdict"] == PARTLY.value and same["robust"] and not same["schedule_split"]
    na = claim_row(_claim(), _schedule_results(HOLDS, NA), pres, protos)
    assert na["verdict"] == HOLDS.value and not na["schedule_split"] and not na["robust"]
    assert claim_row(_claim(), _schedule_results(NOT, HOLDS), pres, ("proper",))["verdict"] == NOT.value


def test_schedule_units_train_at_their_exponent_and_the_rest_is_quick():
    made, quick = units_for("schedule"), units_for("quick")
    quarter = {n: u for n, u in made.items() if "@proper-quarter" in n}
    assert quarter and set(made) - set(quarter) == set(quick)
    assert all(made[n].config == quick[n].config for n in quick)  # exponent 1/2: quick's units, quick's cache keys
    for name, unit in quarter.items():
        twin = quick[name.replace("@proper-quarter", "@proper")]
        assert unit.config["train"]["lr_width_power"] == 0.25 and twin.config["train"]["lr_width_power"] == 0.5
        assert {**unit.config, "train": twin.config["train"]} == twin.config  # nothing else differs


def test_an_unknown_claims_protocol_is_one_line():
    import pytest

    from ntkm.errors import UserInputError

    with pytest.raises(UserInputError, match="proper-quarter"):
        claims_protocol("proper-tenth")


def test_the_reports_label_every_claims_protocol_as_the_registry_does():
    from reports.claims_report import CONDITION_LABELS

    assert CONDITION_LABELS == {name: c.label for name, c in CLAIMS_PROTOCOLS.items()}


def test_a_schedule_run_trains_each_exponent_and_records_both(tmp_path, monkeypatch):
    """The schedule axis end to end at smoke sizes: the retrain study (which rebuilds its training config from the
    protocol's name) trains at exponent 1/4 under `proper-quarter` and at 1/2 under `proper`, and the record has both
    conditions, the schedule split field and the protocol's description."""
    import json

    from verify import presets
    from verify.cli import main

    both = {**presets.PRESETS["smoke"], "protocols": ("proper", "proper-quarter")}
    monkeypatch.setitem(presets.PRESETS, "smoke", both)
    out = tmp_path / "out"
    assert main(["claims", "--preset", "smoke", "--only", "influence-retrain", "--out", str(out), "--no-pdf",
                 "--jobs", "1"]) == 0
    rec = json.loads((out / "claims.json").read_text())
    row = next(c for c in rec["claims"] if c["id"] == "influence-retrain")
    assert list(row["by_condition"]) == ["proper", "proper-quarter"] and "schedule_split" in row
    assert "lr exponent 0.25" in rec["protocols"]["proper-quarter"]["description"]
    # the study's own config: the primary schedule needs no exponent (its record as before the axis), the variant 1/4
    for cond, power in (("proper", "null"), ("proper-quarter", "0.25")):
        assert f'"lr_power": {power}' in json.dumps(rec["results"][f"influence-retrain:relu@{cond}"]), cond

