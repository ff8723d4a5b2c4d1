"""Smoke test of the benchmark harness: tiny sizes, structure of the table and JSON, checks computed.

Speed is never asserted here (benchmarks/README.md): only that the runner produces a well-formed
record, that every timed row carries an agreement check from the same run, and that a failed check
turns a row into FAILED and the exit status non-zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("NTKM_PROGRESS", "0")


def test_quick_run_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.run import main

    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    code = main(["--quick", "--in-process", "--only", "ntk,influence,attacks,scaling", "--json", str(out),
                 "--markdown", str(md)])
    assert code == 0
    table = capsys.readouterr().out
    assert "GPU:" in table and "**Key ratios**" in table
    for section in ("### 1. Empirical NTK", "### 2. Influence", "### 3. Attacks", "### 4. Scaling"):
        assert section in table
    assert table.strip() in md.read_text()

    rec = json.loads(out.read_text())
    env = rec["environment"]
    for key in ("date_utc", "cpu", "cpu_count", "torch_threads", "load_average_start", "load_average_end",
                "versions", "device", "gpu"):
        assert key in env
    assert rec["exit_status"] == 0 and rec["headline"]
    rows = rec["rows"]
    benches = {r["bench"] for r in rows}
    assert {"closed form (ntk_two_layer)", "generic: jacrev + vmap (ntk_generic)",
            "generic: vjp/jvp NTK-vector products", "generic: autograd.grad loop, J J^T"} <= benches
    assert any(b.startswith("LOO brute force") for b in benches)
    assert any(b.startswith("CG inverse-HVP") for b in benches)
    assert any(b.startswith("one flip-rate evaluation") for b in benches)
    for r in rows:
        if r["timing"] is not None or r["extrapolated_s"] is not None:
            gated = [c for c in r["checks"] if c["gated"]]
            assert gated, f"timed row without an agreement check: {r['bench']} {r['case']}"
            assert all(c["passed"] for c in gated) and r["status"] != "FAILED"
            assert r["timing"] is None or r["timing"]["repeats"] >= 1
    closed = [r for r in rows if r["bench"] == "closed form (ntk_two_layer)"]
    assert all(r["checks"][0]["value"] < 1e-3 for r in closed)
    assert rec["data"]["ntk"]["headline"]["closed_s"] > 0


def test_failed_check_marks_row_and_exit_status() -> None:
    from benchmarks.harness import Check, Row, Timing, environment, exit_status, render_markdown

    ok = Row("s", "fast", "n=1", Timing([0.1, 0.2, 0.3]), checks=[Check("max rel diff", 1e-9, 1e-6)])
    bad = Row("s", "slow", "n=1", Timing([1.0]), checks=[Check("max rel diff", 0.5, 1e-6)])
    unchecked = Row("s", "other", "n=1", Timing([1.0]))
    assert ok.time_text().startswith("200.0 ms [100.0 ms-300.0 ms] x3")
    assert bad.final_status == "FAILED" and bad.time_text() == "FAILED"
    assert unchecked.time_text() == "no check: not shown"
    assert exit_status([ok]) == 0 and exit_status([ok, bad]) == 1
    env = environment()
    env["load_average_end"] = env["load_average_start"]
    text = render_markdown([ok, bad], env, ["a ratio"])
    assert "| slow | n=1 | FAILED |" in text and "a ratio" in text


def test_ntk_case_in_fresh_process_measures_memory(tmp_path: Path) -> None:
    import numpy as np

    from benchmarks.bench_ntk import run_case_subprocess

    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.random.default_rng(0).random((8, 784), dtype=np.float32))
    res = run_case_subprocess({"path": "generic", "kind": "relu", "n": 8, "m": 16, "dtype": "float32",
                               "device": "cpu", "inputs": str(inputs), "repeats": 2, "budget_s": 5.0}, timeout_s=120)
    assert [c["value"] <= c["threshold"] for c in res["checks"]] == [True, True]
    assert res["timing"]["repeats"] >= 1 and res["timing"]["median_s"] > 0
    if sys.platform.startswith("linux"):
        assert res["peak_bytes"] is not None and res["peak_bytes"] >= 0
