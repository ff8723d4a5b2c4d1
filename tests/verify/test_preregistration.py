"""The pre-registration digest and the deviations list: the parser reads docs/DEVIATIONS.md, the digest moves with
every registered text, and the report names the deviations where it used to say 'fixed before the run'."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from pathlib import Path

import pytest

import verify.claims
from ntkm.errors import UserInputError
from reports.claims_report import to_markdown
from reports.deviations import deviations_of, preregistration_markdown, rule_status
from verify import preregistration as pr

ROOT = Path(__file__).resolve().parents[2]

ENTRY = """```deviation
id: D9
date: 2026-12-02
commit: this
claims: flip-mnist,
  eps-robustness
what: a change
why: a reason
verdicts_moved: none known
```
"""


def test_the_repository_file_parses_and_names_only_known_claims():
    entries = pr.load_deviations()
    assert entries, "docs/DEVIATIONS.md holds no entry"
    assert [d.id for d in entries][:5] == ["D1", "D2", "D3", "D4", "D5"]
    d3 = next(d for d in entries if d.id == "D3")
    assert d3.commit == "83db447" and d3.touches("ntk-attn-mnist") and not d3.touches("flip-mnist")
    d4 = next(d for d in entries if d.id == "D4")
    assert d4.touches("flip-mnist", empirical=True) and not d4.touches("thm4.1")
    block = pr.preregistration("smoke")  # raises on an unknown claim id
    assert [d["id"] for d in block["deviations"]] == [d.id for d in entries]
    assert set(block["rules_sha256"]) == {c.id for c in verify.claims.all_claims()}


def test_entries_parse_with_continuations_and_prose_is_ignored():
    (d,) = pr.parse_deviations("# title\n\nsome prose: not a field\n\n" + ENTRY + "\nmore prose\n")
    assert d.claims == ("flip-mnist", "eps-robustness") and d.commit == "this" and d.after_run == ""
    assert d.touches("eps-robustness") and not d.touches("flip-cifar10")


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace("date: 2026-12-02", "date: yesterday"), "not YYYY-MM-DD"),
    (lambda t: t.replace("why: a reason\n", ""), "lacks why"),
    (lambda t: t.replace("commit: this", "commit: HEAD~1"), "not a hash"),
    (lambda t: t.replace("why: a reason", "why: a reason\nwho: me"), "unknown field 'who'"),
    (lambda t: t.replace("what: a change", "what: a change\nwhat: again"), "given twice"),
    (lambda t: t[:t.rindex("```")], "not closed"),
    (lambda t: t + "\n" + t, "used twice"),
])
def test_a_malformed_entry_is_one_line_naming_its_line(edit, problem):
    with pytest.raises(UserInputError, match=problem) as exc:
        pr.parse_deviations(edit(ENTRY), "DEV.md")
    assert str(exc.value).startswith("DEV.md:") and "\n" not in str(exc.value)


def test_an_unknown_claim_id_stops_the_digest(tmp_path):
    f = tmp_path / "DEVIATIONS.md"
    f.write_text(ENTRY.replace("flip-mnist,", "flip-mnsit,"))
    with pytest.raises(UserInputError, match="unknown claim flip-mnsit"):
        pr.preregistration("smoke", f)


def test_the_digest_moves_with_a_rule_text_the_gate_the_design_and_the_deviations(monkeypatch, tmp_path):
    f = tmp_path / "DEVIATIONS.md"
    f.write_text(ENTRY)
    base = pr.preregistration("smoke", f)
    assert base == pr.preregistration("smoke", f)  # deterministic
    claims = verify.claims.all_claims()
    edited = [dataclasses.replace(c, rule=c.rule + " (edited)") if c.id == "flip-mnist" else c for c in claims]
    monkeypatch.setattr(verify.claims, "all_claims", lambda: edited)
    moved = pr.preregistration("smoke", f)
    assert moved["sha256"] != base["sha256"]
    assert [k for k in base["rules_sha256"] if base["rules_sha256"][k] != moved["rules_sha256"][k]] == ["flip-mnist"]
    assert moved["parts_sha256"]["gate"] == base["parts_sha256"]["gate"]
    monkeypatch.undo()
    import empirics.nets.protocols

    monkeypatch.setattr(empirics.nets.protocols, "GATE_TEXT", empirics.nets.protocols.GATE_TEXT + ".")
    assert pr.preregistration("smoke", f)["parts_sha256"]["gate"] != base["parts_sha256"]["gate"]
    monkeypatch.undo()
    assert pr.preregistration("quick", f)["parts_sha256"]["design"] != base["parts_sha256"]["design"]
    f.write_text(ENTRY + ENTRY.replace("D9", "D10"))
    assert pr.preregistration("smoke", f)["sha256"] != base["sha256"]
    assert pr.preregistration("smoke", tmp_path / "absent.md")["deviations"] is None


def _smoke_record() -> dict:
    with gzip.open(ROOT / "tests" / "data" / "smoke-claims-43279c4.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


def test_the_report_names_deviations_instead_of_fixed_before_the_run(tmp_path):
    record = _smoke_record()
    old = to_markdown(copy.deepcopy(record))
    assert "Rule (fixed before the run)" not in old  # an old record makes no claim it cannot back
    assert "carries no pre-registration" in old
    f = tmp_path / "DEVIATIONS.md"
    f.write_text(ENTRY)
    record["preregistration"] = pr.preregistration("smoke", f)
    md = to_markdown(record)
    assert "Rule (changed after a recorded run: D9 (2026-12-02, this) (see Deviations)): " in md
    assert "**D9** (2026-12-02, commit this; claims: flip-mnist, eps-robustness): a change" in md
    other = next(c["id"] for c in record["claims"] if c["id"] not in ("flip-mnist", "eps-robustness"))
    assert rule_status(record, other) == "fixed before the first recorded run; no deviation recorded"
    record["preregistration"]["deviations"][0]["claims"] = ["empirical"]
    assert deviations_of(record, "ntk-attn-mnist") and not deviations_of(record, "thm4.1")
    assert [d["id"] for d in deviations_of(record, "eps-robustness")] == ["D9"]
    digest = record["preregistration"]["sha256"]
    assert preregistration_markdown(record)[2].startswith(f"Pre-registration sha256 `{digest}`")
