"""The benchmark harness on synthetic records: rows, checks, Markdown, peer-row selection, compare.

Nothing here runs a benchmark or asserts a speed (benchmarks/README.md): every record, timing and
peer result below is made up, so the tests check only the logic that turns records into rows,
tables, exit statuses and regression reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tolerances import F64_SOLVE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def _env() -> dict[str, Any]:
    return {"date_utc": "2026-01-01 00:00:00 UTC", "cpu": "test cpu", "cpu_count": 2, "memory_gib": 1.0,
            "torch_threads": 1, "versions": {"torch": "x"}, "cuda": False, "gpu": "not present",
            "load_average_start": [0.1, 0.1, 0.1], "load_average_end": [0.2, 0.1, 0.1], "git_commit": "abc"}


def test_failed_check_marks_row_and_exit_status() -> None:
    from benchmarks.harness import Check, Row, Timing, exit_status, render_markdown

    ok = Row("s", "fast", "n=1", Timing([0.1, 0.2, 0.3]), checks=[Check("max rel diff", 1e-9, 1e-6)])
    bad = Row("s", "slow", "n=1", Timing([1.0]), checks=[Check("max rel diff", 0.5, 1e-6)])
    unchecked = Row("s", "other", "n=1", Timing([1.0]))
    assert ok.time_text().startswith("200.0 ms [100.0 ms-300.0 ms] x3")
    assert bad.final_status == "FAILED" and bad.time_text() == "FAILED"
    assert unchecked.time_text() == "no check: not shown"
    assert exit_status([ok]) == 0 and exit_status([ok, bad]) == 1
    text = render_markdown([ok, bad], _env(), ["a ratio"])
    assert "| slow | n=1 | FAILED |" in text and "a ratio" in text and "[0.2, 0.1, 0.1] at end" in text


def test_nan_check_fails_and_informational_check_never_fails() -> None:
    from benchmarks.harness import Check

    assert not Check("err", float("nan"), 1.0).passed
    assert Check("rho", float("nan")).passed and not Check("rho", 0.1).gated


def _row(bench: str, times: list[float], checks: list[dict[str, Any]] | None = None, case: str = "n=1"
         ) -> dict[str, Any]:
    from benchmarks.harness import Timing

    return {"bench": bench, "case": case, "timing": Timing(times).to_dict(), "checks": checks or [],
            "status": "measured", "extrapolated_s": None}


def _check(label: str, value: float, threshold: float | None = 1e-3, op: str = "<=") -> dict[str, Any]:
    from benchmarks.harness import Check

    return Check(label, value, threshold, op).to_dict()


def test_compare_flags_slower_beyond_spread_only() -> None:
    from benchmarks.compare import compare_rows

    old = [_row("a", [1.0, 1.1, 1.2]), _row("b", [1.0, 1.1, 1.2]), _row("c", [1.0]), _row("d", [2.0, 2.1])]
    new = [_row("a", [1.15, 1.2, 1.3]), _row("b", [1.5, 1.6, 1.7]), _row("c", [1.3]), _row("d", [0.5, 0.6])]
    found = {(f.kind, f.bench) for f in compare_rows(old, new)}
    assert ("slower", "b") in found and ("slower", "c") in found and ("faster", "d") in found
    assert not any(b == "a" for _, b in found)


def test_compare_flags_less_accurate() -> None:
    from benchmarks.compare import compare_rows

    old = [_row("e", [1.0], [_check("max rel diff", 1e-7)]), _row("f", [1.0], [_check("max rel diff", 1e-7)]),
           _row("g", [1.0], [_check("Spearman", 0.9, None)]), _row("h", [1.0], [_check("err", 1e-4)])]
    new = [_row("e", [1.0], [_check("max rel diff", 5e-7)]), _row("f", [1.0], [_check("max rel diff", 5e-6)]),
           _row("g", [1.0], [_check("Spearman", 0.5, None)]), _row("h", [1.0], [_check("err", 2e-3)])]
    found = {f.bench: f.detail for f in compare_rows(old, new) if f.kind == "less accurate"}
    assert set(found) == {"f", "g", "h"}
    assert "passed before, fails now" in found["h"]


def test_compare_files_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.run import main

    old = {"environment": _env(), "rows": [_row("a", [1.0, 1.0, 1.0])]}
    new = {"environment": _env(), "rows": [_row("a", [3.0, 3.0, 3.0]), _row("new row", [1.0])]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    code = main(["--compare", str(tmp_path / "old.json"), "--against", str(tmp_path / "new.json")])
    out = capsys.readouterr().out
    assert code == 1 and "| slower | a |" in out and "1 rows matched" in out
    code = main(["--compare", str(tmp_path / "old.json"), "--against", str(tmp_path / "old.json")])
    assert code == 0 and "No row got slower" in capsys.readouterr().out


def test_woodbury_and_topk_influence_agree_with_explicit_jacobians() -> None:
    from benchmarks.bench_peers import topk_if, woodbury_if

    rng = np.random.default_rng(0)
    n, nt, c, p = 6, 2, 3, 40
    J = rng.standard_normal((n + nt, c, p))
    Kfull = np.einsum("iap,jbp->ijab", J, J)
    r = rng.standard_normal((n + nt, c))
    rho = 0.7
    Jt = J[:n].reshape(n * c, p)
    H = 2.0 * Jt.T @ Jt
    g = 2.0 * np.einsum("iap,ia->ip", J, r)
    exact = g[:n] @ np.linalg.solve(H + rho * np.eye(p), g[n:].T)
    assert np.allclose(woodbury_if(Kfull, r[:n], r[n:], rho), exact, rtol=1e-9, atol=1e-9)
    assert np.allclose(topk_if(Kfull, r[:n], r[n:], rho, n * c), exact, rtol=F64_SOLVE, atol=F64_SOLVE)
    lam, V = np.linalg.eigh(H)
    Vk = V[:, -4:]
    trunc = (g[:n] @ Vk / (lam[-4:] + rho)) @ (g[n:] @ Vk).T
    assert np.allclose(topk_if(Kfull, r[:n], r[n:], rho, 4), trunc, rtol=F64_SOLVE, atol=F64_SOLVE)


def test_nt_rows_use_fastest_correct_configuration() -> None:
    from benchmarks.bench_peers import nt_rows
    from benchmarks.harness import Timing

    grid = [{"implementation": "STRUCTURED_DERIVATIVES", "layout": "x @ W, W (d, m)", "vmap_axes": 0,
             "times_s": [0.01], "max_rel_diff": 1e-7, "correct": True},
            {"implementation": "AUTO", "layout": "x @ W.T, W (m, d)", "vmap_axes": None, "error": "OOM",
             "correct": False}]
    nt = {"status": "ok", "grid": grid, "grid_n": 8, "grid_m": 16, "best": grid[0],
          "sizes": [{"n": 8, "m": 16, "times_s": [0.02, 0.03], "max_rel_diff": 2e-7},
                    {"n": 16, "m": 16, "error": "RESOURCE_EXHAUSTED"}]}
    ours = {"ntk/8/16": {"timing": Timing([0.01]), "f32_err": 1e-7}, "ntk/16/16": {"timing": Timing([0.01]),
                                                                                   "f32_err": 1e-7}}
    rows = nt_rows(nt, ours, {"neural-tangents": "0.6.5", "jax": "0.4.23"})
    assert rows[0].status == "info" and "1 of 2 configurations agree" in rows[0].value and "OOM" in rows[0].note
    assert rows[1].final_status == "measured" and rows[1].ratio == "suite 2.5x faster"
    assert "STRUCTURED_DERIVATIVES, x @ W, W (d, m), vmap_axes=0" in rows[1].case
    assert rows[2].status.startswith("skipped: RESOURCE_EXHAUSTED")


def test_dattri_rows_pick_fastest_agreeing_and_skip_disagreeing() -> None:
    from benchmarks.bench_peers import IFCase, PeersConfig, dattri_rows
    from benchmarks.harness import Timing

    def conf(method: str, it: int, t: float, err: float, gate: str = "exact IF") -> dict[str, Any]:
        return {"method": method, "max_iter": it, "times_s": [t], "max_rel_diff": err, "pearson_vs_full_if": 1.0,
                "gate": gate, "correct": err <= 1e-3}

    cfg = PeersConfig(if_cases=(IFCase("k", 10, 2),))
    res = {"status": "ok", "cases": {"k": {"configs": [
        conf("CG", 10, 0.5, 1e-2), conf("CG", 20, 1.0, 1e-4), conf("CG", 40, 2.0, 1e-6),
        conf("LiSSA", 400, 3.0, 2e-2), conf("Arnoldi", 100, 1.5, 1e-5, "exact top-5 IF")]}}}
    rows = dattri_rows(res, {"if/k": Timing([0.5])}, cfg, {"dattri": "0.3.0"})
    by = {r.bench: r for r in rows}
    assert by["dattri CG"].timing.median == 1.0 and "max_iter=20" in by["dattri CG"].case
    assert by["dattri LiSSA"].status.startswith("skipped: no configuration agreed")
    arnoldi = by["dattri Arnoldi"]
    assert "different estimand" in arnoldi.note and arnoldi.ratio == "none: different estimand"
    assert "same estimand" in by["dattri CG"].note


def test_kronfluence_row_is_labelled_a_different_estimand() -> None:
    from benchmarks.bench_peers import PeersConfig, kronfluence_row
    from benchmarks.harness import Timing

    cfg = PeersConfig(cnn_n=4, cnn_n_test=2)
    peer = {"status": "ok", "times_s": [1.0, 1.2], "fit_s": [0.8], "scores_s": [0.3], "finite": True, "shape": [2, 4],
            "spearman_vs_audit_loo": 0.1, "spearman_vs_audit_gn": 0.4, "peak_rss_gib": 0.5}
    ours = {"timing": Timing([2.0]), "n_params": 10, "method": "m", "kernel_s": 1.5, "influence_s": 0.5,
            "rho_loo_gn": 0.3}
    row = kronfluence_row(peer, ours, cfg, {"kronfluence": "1.0.1"})
    assert row.final_status == "measured" and row.ratio.endswith("(different estimands)")
    assert "DIFFERENT estimands" in row.note
    peer["shape"] = [4, 2]
    assert kronfluence_row(peer, ours, cfg, {}).final_status == "FAILED"


def test_share_table_sums_a_unit() -> None:
    from benchmarks.bench_stages import share_table

    data = {"presets": {"quick": {"epochs_measured": 2, "distance_unit_training_s": {"relu": 3.0}, "stages": {
        "relu": {"unit_s": {"training": 3.0, "kernel": 0.5, "influence": 0.25, "attacks": 0.25},
                 "floor_s": {"training": 1.0, "kernel": 0.1, "influence": 0.05, "attacks": 0.05}}}}}}
    text = share_table(data)
    assert "| quick | relu | training | 3.00 s (extrapolated from 2 epoch(s)) | 75% | 1.00 s | 3.0x |" in text
    assert "**4.00 s**" in text


def test_peers_script_imports_nothing_from_the_suite() -> None:
    src = (ROOT / "benchmarks" / "peers" / "run_peers.py").read_text()
    for pkg in ("empirics", "theory", "verify", "benchmarks"):
        assert f"from {pkg}" not in src and f"import {pkg}" not in src
    assert sys.version_info >= (3, 10)
