"""`verify claims --plan`: the units a run computes (checked against a real run's units), cached ones marked as
cached with --resume, seeds and sizes from the units' configs, valid JSON, and nothing trained or removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verify.cli import main
from verify.experiments import units_for
from verify.plan import _ranges
from verify.presets import preset

#: Claims whose units are quick to compute (the theory checks, kappa on MNIST).
CHEAP = "thm4.1,kappa-mnist"


def _plan(capsys, *argv: str) -> dict:
    assert main(["claims", "--preset", "smoke", "--plan", "--json", "-", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> Path:
    """A real run of the cheap claims (their units cached in out/cache)."""
    out = tmp_path_factory.mktemp("ran")
    assert main(["claims", "--preset", "smoke", "--only", CHEAP, "--out", str(out), "--no-pdf", "--jobs", "1"]) == 0
    return out


def test_plan_lists_the_units_a_run_computes(computed: Path, capsys):
    ran = json.loads((computed / "claims.json").read_text())["units"]
    plan = _plan(capsys, "--only", CHEAP, "--out", str(computed / "elsewhere"))
    assert [r["unit"] for r in plan["units"]] == list(ran)
    assert not any(r["cached"] for r in plan["units"]) and plan["to_compute"] == len(ran)


def test_resume_shows_cached_units_as_cached_and_the_rest_with_an_estimate(computed: Path, capsys):
    before = sorted(p.name for p in (computed / "cache").iterdir())
    plan = _plan(capsys, "--only", f"{CHEAP},ntk-relu-mnist", "--out", str(computed), "--resume", "--jobs", "2")
    ran = set(json.loads((computed / "claims.json").read_text())["units"])
    rows = {r["unit"]: r for r in plan["units"]}
    assert {n for n, r in rows.items() if r["cached"]} == ran
    rest = [r for n, r in rows.items() if n not in ran]
    assert rest and all(r["estimated_s"] > 0 and r["networks"] > 0 for r in rest)
    assert plan["jobs"] == 2 and plan["cached"] == len(ran) and plan["to_compute"] == len(rest)
    assert plan["estimated_wall_s"] <= plan["estimated_total_s"] + 1e-9
    smoke = units_for("smoke")
    for r in rest:  # the plan's sizes are the units' own configs
        cfg = smoke[r["unit"]].config
        assert r["config"]["seeds"] == cfg["seeds"] and r["config"]["widths"] == cfg["widths"]
        assert r["config"]["epochs"] == cfg["train"]["epochs"] and r["config"]["protocol"] == cfg["train"]["protocol"]
        assert r["claims"] == ["ntk-relu-mnist"]
    assert sorted(p.name for p in (computed / "cache").iterdir()) == before  # nothing trained, nothing removed
    # without --resume the run would recompute everything: nothing is shown as cached, and the cache stays
    assert not any(r["cached"] for r in _plan(capsys, "--only", CHEAP, "--out", str(computed))["units"])
    assert sorted(p.name for p in (computed / "cache").iterdir()) == before


def test_plan_table_and_json_file(tmp_path: Path, capsys):
    target = tmp_path / "plan.json"
    out = tmp_path / "out"
    assert main(["claims", "--preset", "smoke", "--plan", "--only", "ntk-relu-mnist", "--out", str(out), "--json",
                 str(target), "--jobs", "1"]) == 0
    table = capsys.readouterr().out
    plan = json.loads(target.read_text())
    assert [r["unit"] for r in plan["units"]] == [ln.split()[0] for ln in table.splitlines()[1:-1]]
    seeds = units_for("smoke")["ntk-distance:mnist@paper"].config["seeds"]
    row = next(ln for ln in table.splitlines() if ln.startswith("ntk-distance:mnist@paper "))
    assert row.split()[1:3] == [str(len(seeds)), _ranges(seeds)]
    assert "wall with --jobs 1" in table.splitlines()[-1] and plan["estimated_wall_s"] == plan["estimated_total_s"]
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))


def test_json_without_plan_is_one_line(tmp_path: Path, capsys):
    rc = main(["claims", "--preset", "smoke", "--only", "thm4.1", "--out", str(tmp_path / "o"), "--json",
               str(tmp_path / "p.json")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "add --plan" in err[0]
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("values, text", [([0, 1, 2], "0-2"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"),
                                          ([], "")])
def test_seed_ranges(values, text):
    assert _ranges(values) == text


@pytest.mark.claim("flip-retrain-binary-mnist", "flip-retrain-cifar10")
def test_quick_plans_no_new_retrain_flip_unit_and_names_the_rows_it_does_not_run(capsys):
    """The retrain-based flip rows of binary MNIST and CIFAR-10 (D25) add no unit to quick (its half-hour budget):
    its plan computes MNIST 10 classes' two units as before and lists the others as not run, with the reason their
    rows give; full computes all of them, each with an estimate (CIFAR-10's inputs are 4x wider: dearer)."""
    assert main(["claims", "--preset", "quick", "--plan", "--json", "-", "--jobs", "2"]) == 0
    quick = json.loads(capsys.readouterr().out)
    flips = [r["unit"] for r in quick["units"] if r["unit"].startswith("flip-retrain")]
    assert flips == ["flip-retrain:relu@proper+unit", "flip-retrain:attn@proper+unit"]
    assert [r["unit"] for r in quick["units"]] == [u for u in units_for("quick") if u in {r["unit"] for r in
                                                                                          quick["units"]}]
    rows = sorted(f"flip-retrain:{s}:{m}@proper+unit" for s in ("mnist:binary", "cifar10:10class")
                  for m in ("relu", "attn"))
    companions = ["flip-retrain-control", "flip-retrain-fixed:attn@proper+unit"]  # the powered design's (item 5)
    assert sorted(quick["not_run"]) == sorted(rows + companions)
    assert all(quick["not_run"][u].startswith("not run at preset quick (runs at full, paper and gpu; about ")
               for u in rows)
    assert all("runs at powered, paper, gpu" in quick["not_run"][u] for u in companions)
    assert main(["claims", "--preset", "full", "--plan", "--only", "flip-retrain-mnist,flip-retrain-binary-mnist,"
                 "flip-retrain-cifar10", "--json", "-"]) == 0
    full = json.loads(capsys.readouterr().out)
    est = {r["unit"]: r["estimated_s"] for r in full["units"]}
    conds = len(preset("full")["protocols"]) * len(preset("full")["preprocessings"])  # 3 x 2 (with the schedule axis)
    assert len(est) == 3 * 2 * conds and all(s > 0 for s in est.values())
    assert all(u.startswith(("flip-retrain-control", "flip-retrain-fixed:")) for u in full.get("not_run", {}))
    for cond in ("paper", "proper+unit"):
        assert est[f"flip-retrain:cifar10:10class:attn@{cond}"] > est[f"flip-retrain:attn@{cond}"]
        assert est[f"flip-retrain:mnist:binary:attn@{cond}"] == pytest.approx(est[f"flip-retrain:attn@{cond}"],
                                                                              rel=0.05)


def test_a_gpu_plan_shows_every_width_and_its_parts(capsys):
    """Priced for a GPU, the plan cuts the run into parts of one lent session each (`verify.costs.parts`), in its
    JSON and its table, and the table shows a sweep's every width (it once cut them at 14 characters)."""
    assert main(["claims", "--preset", "gpu", "--plan", "--device", "cuda", "--json", "-"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["cost_model"]["stacked"] and plan["part_budget_s"] > 0
    in_parts = [u for p in plan["parts"] for u in p["units"]]
    assert sorted(in_parts) == sorted(r["unit"] for r in plan["units"] if not r["cached"])
    assert sum(p["estimated_s"] for p in plan["parts"]) == pytest.approx(plan["estimated_total_s"])
    assert all(p["fits"] == (p["estimated_s"] <= plan["part_budget_s"]) for p in plan["parts"])
    assert main(["claims", "--preset", "gpu", "--plan", "--device", "cuda"]) == 0
    table = capsys.readouterr().out
    sweep = next(r for r in plan["units"] if r["unit"].startswith("ntk-distance"))
    line = next(ln for ln in table.splitlines() if ln.startswith(sweep["unit"] + " "))
    assert ",".join(str(w) for w in sweep["config"]["widths"]) in line
    assert f"In {len(plan['parts'])} part(s)" in table
