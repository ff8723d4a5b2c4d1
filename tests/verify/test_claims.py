"""`verify claims`: the smoke preset end to end, caching/resume, re-rendering, and the verdict rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verify.claims import HOLDS, NOT, PARTLY, VERDICTS, _ntk_claim, all_claims
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


def _fake_distance(values_by_seed: dict[int, list[float]], drift: list[float]) -> dict:
    widths = [16, 256, 4096]
    runs = [{"seed": s, "width": w, "function_abs": v, "kernel_drift": d}
            for s, vals in values_by_seed.items() for w, v, d in zip(widths, vals, drift, strict=True)]
    import numpy as np

    from empirics.distance import trend

    means = [float(np.mean([values_by_seed[s][i] for s in values_by_seed])) for i in range(3)]
    per_width = {str(w): {"function_abs": {"mean": m, "std": 0.0}} for w, m in zip(widths, means, strict=True)}
    trends = {"function_abs": {**trend(widths, means), "seeds_agreeing": 0, "seeds": len(values_by_seed)},
              "kernel_drift": trend(widths, drift)}
    block = {"runs": runs, "per_width": per_width, "trends": trends}
    cfg = {"n_train": 10, "n_test": 5, "train": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 1e-3, "epochs": 1}}
    return {"ntk-distance:mnist": {"models": {"relu": block}, "config": cfg, "data": {"label": "x"}, "ridge": 0.01}}


def test_ntk_rule_verdicts():
    evaluate = _ntk_claim("mnist", "relu", "decreasing")
    down = _fake_distance({0: [3, 2, 1], 1: [3, 2.5, 1], 2: [4, 2, 1]}, [0.5, 0.1, 0.01])
    assert evaluate(down).verdict == HOLDS
    up_but_drift_down = _fake_distance({0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 3]}, [0.5, 0.1, 0.01])
    assert evaluate(up_but_drift_down).verdict == PARTLY
    up = _fake_distance({0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 3]}, [0.01, 0.1, 0.5])
    assert evaluate(up).verdict == NOT
    rises = _ntk_claim("mnist", "relu", "rises")
    assert rises(up).verdict == HOLDS


def test_no_paper_value_in_ours_column(smoke_run):
    """'ours' is produced from measurements: it never equals the paper column verbatim."""
    _, out = smoke_run
    rec = json.loads(Path(out / "claims.json").read_text())
    for c in rec["claims"]:
        assert c["ours"] != c["paper"]
