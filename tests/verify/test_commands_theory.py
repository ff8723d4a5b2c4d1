"""`verify theory`: every claim gets a verdict, JSON output, exit codes."""

from __future__ import annotations

import json

import pytest

import theory.checks as checks
from verify.cli import main

pytestmark = [pytest.mark.claim(claim_id) for claim_id in checks.CHECKS]


def test_json_to_stdout_has_a_verdict_for_every_claim(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["theory", "--json", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    verdicts = {c["claim_id"]: c["verdict"] for c in record["checks"]}
    assert set(verdicts) == set(checks.CHECKS)
    assert all(v in checks.VERDICTS for v in verdicts.values())
    assert record["library_versions"]["numpy"]
    assert record["seed"] == 0
    for c in record["checks"]:
        assert c["statement"] and c["method"] and c["detail"]


def test_table_and_json_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "theory.json"
    assert main(["theory", "--json", str(out), "--seed", "3"]) == 0
    table = capsys.readouterr().out
    for claim_id in checks.CHECKS:
        assert claim_id in table
    record = json.loads(out.read_text())
    assert record["seed"] == 3 and len(record["checks"]) == len(checks.CHECKS)
    assert not list(out.parent.glob(".*.tmp"))


def test_crashed_check_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def boom(seed: int = 0) -> checks.CheckResult:
        """Deliberately broken check."""
        raise RuntimeError("boom")

    monkeypatch.setattr(checks, "CHECKS", {"thm4.1": boom, "thm4.7-width": checks.check_thm47_width})
    assert main(["theory"]) == 1
    captured = capsys.readouterr()
    assert checks.CRASHED in captured.out and "boom" in captured.out
    assert "thm4.1" in captured.err


def test_bad_seed_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["theory", "--seed", "x"])
    assert exc.value.code == 2
