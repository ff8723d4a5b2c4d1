"""scripts/compare_claims.py: what the refactor-equivalence check ignores and what it catches."""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare_claims", ROOT / "scripts" / "compare_claims.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)

RECORD = {"generated": "2026-12-01", "code_version": "abc", "wall_s": 3.0,
          "claims": [{"id": "a", "verdict": "holds", "value": 0.125, "runs": [{"train_wall_s": 1.0, "acc": 0.5}]}]}


def test_timings_and_metadata_are_ignored():
    new = copy.deepcopy(RECORD)
    new.update(generated="2027-01-01", code_version="def", wall_s=9.0)
    new["claims"][0]["runs"][0]["train_wall_s"] = 7.0
    assert cc.differences(RECORD, new) == []


def test_a_data_files_location_is_ignored_but_its_checksum_is_not():
    """Two clones read the same files from different folders: the paths may differ, the checksums may not."""
    old = {"data": {"location": "/a/shared/mnist", "files": [{"path": "/a/shared/mnist/x.gz", "sha256": "00"}]}}
    new = copy.deepcopy(old)
    new["data"]["location"], new["data"]["files"][0]["path"] = "/b/shared/mnist", "/b/shared/mnist/x.gz"
    assert cc.differences(old, new) == []
    new["data"]["files"][0]["sha256"] = "01"
    assert cc.differences(old, new) == ["/data/files[0]/sha256: '00' != '01'"]


def test_a_changed_number_or_verdict_is_caught():
    new = copy.deepcopy(RECORD)
    new["claims"][0]["value"] = 0.125 * (1 + 1e-9)
    new["claims"][0]["runs"][0]["acc"] = 0.75
    assert cc.differences(RECORD, new) == ["/claims[0]/runs[0]/acc: 0.5 != 0.75", "/claims[0]/value: 0.125 != "
                                           f"{0.125 * (1 + 1e-9)!r}"]
    new = copy.deepcopy(RECORD)
    new["claims"][0]["verdict"] = "does not hold"
    del new["claims"][0]["runs"]
    assert len(cc.differences(RECORD, new)) == 2


def test_the_command_reads_gzip_and_exits_nonzero_on_a_difference(tmp_path, capsys):
    old = tmp_path / "old.json.gz"
    with gzip.open(old, "wt", encoding="utf-8") as fh:
        json.dump(RECORD, fh)
    same = tmp_path / "same.json"
    same.write_text(json.dumps(RECORD))
    assert cc.main([str(old), str(same)]) == 0
    other = copy.deepcopy(RECORD)
    other["claims"][0]["value"] = float("nan")
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(other))
    assert cc.main([str(old), str(changed)]) == 1
    assert cc.main([str(old), str(tmp_path / "missing.json")]) == 2
    assert "pass two claims.json files" in capsys.readouterr().err


def test_the_stored_baseline_is_a_smoke_claims_record():
    base = cc.load(ROOT / "tests" / "data" / "smoke-claims-43279c4.json.gz")
    assert base["preset"] == "smoke" and len(base["claims"]) >= 26


def test_machine_descriptions_are_ignored_but_a_units_configured_device_is_not():
    old = {**copy.deepcopy(RECORD), "device": {"platform": "a"}, "units": {"u": {"config": {"device": "cpu"}}}}
    new = copy.deepcopy(old)
    new["device"] = {"platform": "b", "cuda": True}
    assert cc.differences(old, new) == []
    new["units"]["u"]["config"]["device"] = "cuda"
    assert cc.differences(old, new) == ["/units/u/config/device: 'cpu' != 'cuda'"]


def test_tolerance_admits_float_noise_and_verdicts_mode_reads_only_verdicts(tmp_path, capsys):
    old = {**copy.deepcopy(RECORD), "claims": [
        {"id": "a", "verdict": "holds", "value": 0.125, "by_protocol": {"proper": {"verdict": "holds"}}},
        {"id": "b", "verdict": "partly", "value": 1.0}]}
    noisy = copy.deepcopy(old)
    noisy["claims"][0]["value"] *= 1 + 1e-7
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    paths[0].write_text(json.dumps(old))
    paths[1].write_text(json.dumps(noisy))
    files = [str(p) for p in paths]
    assert cc.main(files) == 1
    assert cc.main(["--tolerance", "1e-6", *files]) == 0
    assert cc.main(["--tolerance=1e-8", *files]) == 1
    moved = copy.deepcopy(noisy)
    moved["claims"][0]["by_protocol"]["proper"]["verdict"] = "does not hold"
    moved["claims"][1]["value"] = 3.0
    paths[1].write_text(json.dumps(moved))
    capsys.readouterr()
    assert cc.main(["--verdicts", *files]) == 1
    assert "a by_protocol/proper/verdict: 'holds' != 'does not hold'" in capsys.readouterr().out
    moved["reproducibility"] = {"knife_edge": [{"claim": "a", "where": "by_protocol/proper", "verdicts": []}]}
    paths[1].write_text(json.dumps(moved))
    assert cc.main(["--verdicts", *files]) == 0
    assert "(knife edge)" in capsys.readouterr().out
    assert cc.main(["--tolerance", "much", *files]) == 2
    assert cc.main(["--frobnicate", *files]) == 2
    assert "unknown option --frobnicate" in capsys.readouterr().err
