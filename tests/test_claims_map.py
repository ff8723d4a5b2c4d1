"""docs/CLAIMS.md (scripts/claims_map.py) is current, and its marker scan finds what pytest would select."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("claims_map", ROOT / "scripts" / "claims_map.py")
cm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cm)


def test_docs_claims_map_is_current():
    assert cm.main(["--check"]) == 0, "docs/CLAIMS.md is out of date: run python scripts/claims_map.py"


def test_every_registered_claim_has_a_section_with_registry_and_units():
    from verify.claims import all_claims

    text = (ROOT / "docs" / "CLAIMS.md").read_text(encoding="utf-8")
    for c in all_claims():
        section = text.split(f"## {c.id}\n", 1)[1].split("\n## ", 1)[0]
        assert "verify/claims/" in section and "- **unit** `" in section, c.id
        assert "(not a unit of this preset)" not in section, c.id


def test_marker_scan_reads_module_and_decorator_marks(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import pytest\npytestmark = pytest.mark.claim('loo')\n\ndef test_x():\n    pass\n")
    (tmp_path / "test_b.py").write_text(
        "import pytest\n\n@pytest.mark.slow\n@pytest.mark.claim('flip-mnist', 'ratio-6-9x')\ndef test_y():\n"
        "    pass\n\ndef test_z():\n    pass\n")
    cm.ROOT = tmp_path
    try:
        found = cm.marked_tests(tmp_path)
    finally:
        cm.ROOT = ROOT
    assert found == {"loo": ["test_a.py (every test)"], "flip-mnist": ["test_b.py::test_y"],
                     "ratio-6-9x": ["test_b.py::test_y"]}
