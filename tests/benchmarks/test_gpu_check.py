"""The prepared device check (`benchmarks.gpu_check`) on the CPU at smoke sizes, so that it cannot rot between the
rare sessions that are lent a GPU: every section runs and writes its record, a resumed run keeps finished sections,
a tiny budget skips sections instead of overrunning, and the claims comparison sees a planted difference. Every run
here sees only the device image's packages (`benchmarks.device_image`: what the lent machine lacks, weasyprint, ray
and the attribution libraries among them, is absent; pydantic is carried), so a dependency the image lacks fails
in CI, not in a lent session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import device_image, gpu_check

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 400, block: str = "") -> subprocess.CompletedProcess:
    """The device check on the CPU with the device image's packages alone (and the modules in `block` absent too)."""
    env = {**os.environ, **device_image.device_image_env()}
    env[device_image.BLOCK_ENV] += block
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--smoke", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_smoke_run_on_the_cpu_writes_every_section_and_resumes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    res = _run("--resume", str(state), "--pack", str(tmp_path / "state.tar.gz"))
    assert res.returncode == 0, res.stderr[-3000:]
    rec = json.loads((state / "gpu-check.json").read_text())
    status = {k: v["status"] for k, v in rec["sections"].items()}
    assert status == {"environment": "ok", "engine": "ok", "primitives": "ok", "agreement": "ok", "quick": "ok",
                      "refit_stack": "ok", "audit": "ok", "gpu_preset": "skipped: --smoke"}, status
    eng = rec["sections"]["engine"]["result"]
    assert eng["agreement"]["passed"], eng["agreement"]
    row = eng["rows"][0]
    assert row["sweep"]["networks"] == 2 * 2 * 2 and row["sweep"]["epoch_s"] > 0
    floor = row["sweep"]["floor"]  # the roofline of the stacks it trained, at the rates this run measured
    assert row["gemm_flop_s"] > 0 and row["bandwidth_b_s"] > 0 and floor["default"]["gemm_s"] > 0
    assert floor["fused_adam"]["floor_s"] <= floor["default"]["floor_s"]
    assert floor["default"]["measured_s"] == row["sweep"]["epoch_s"]
    variants = row["sweep"]["variants"]  # fused Adam timed and compared with the default engine; TF32 is CUDA-only
    assert variants["fused_adam"]["epoch_s"] > 0
    assert 0 < variants["fused_adam"]["max_rel_weight_difference_to_default"] <= gpu_check.FLOAT32_TOLERANCE
    assert variants["tf32"]["status"] == variants["fused_adam+tf32"]["status"] == "skipped: TF32 is a CUDA mode"
    graphs = variants["graphs"]  # off CUDA the epoch program runs uncaptured: bit-equal to the default engine
    assert graphs["status"] == "ok" and graphs["captured"] is False
    assert graphs["max_rel_weight_difference_to_default"] == 0.0
    consts = rec["sections"]["primitives"]["result"]["constants"]
    assert all(consts[k] >= 0 for k in ("step", "flop", "kernel", "solve", "eig"))
    agr = rec["sections"]["agreement"]["result"]["comparison"]
    assert agr["claims_compared"] == 2 and not agr["verdicts_differ"] and agr["numbers_compared"] > 100
    assert rec["sections"]["quick"]["result"]["finished"]
    stack = rec["sections"]["refit_stack"]["result"]  # the stacked re-fits ran stacked and equal the loop's
    assert stack["stacked"] and stack["agree"] and stack["on_s_per_refit"] > 0 and stack["off_s_per_refit"] > 0
    audit = rec["sections"]["audit"]["result"]
    assert audit["finished"] and audit["device_used"] == "cpu" and audit["refit_path"]["one_at_a_time_refits"] > 0
    assert (state / "gpu-check.md").read_text().startswith("# Device check on cpu")
    # a second run keeps every finished section and says so
    again = _run("--resume", str(state), "--sections", "engine,agreement", timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "engine: kept from the previous run" in again.stderr
    # the packed state unpacks into a fresh folder, where a resumed run keeps the same sections
    fresh = tmp_path / "fresh"
    third = _run("--resume", str(fresh), "--unpack", str(tmp_path / "state.tar.gz"), "--sections", "engine",
                 timeout=120)
    assert third.returncode == 0 and "engine: kept from the previous run" in third.stderr


def test_a_tiny_budget_skips_sections_and_still_writes_the_record(tmp_path: Path) -> None:
    res = _run("--resume", str(tmp_path), "--budget-s", "21", "--sections", "environment,engine,agreement",
               timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rec = json.loads((tmp_path / "gpu-check.json").read_text())
    assert rec["sections"]["environment"]["status"] == "ok"
    assert rec["sections"]["engine"]["status"].startswith("skipped: budget")
    assert rec["sections"]["agreement"]["status"].startswith("skipped: budget")


def test_sections_run_in_the_order_given_and_primitives_reuse_an_earlier_engine(tmp_path: Path) -> None:
    """`--sections` is the run order (a lent session measures first what is still missing); primitives read the engine
    section an earlier run kept, and say when and at which code it was measured; the log lines carry elapsed time."""
    first = _run("--resume", str(tmp_path), "--sections", "engine", timeout=200)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _run("--resume", str(tmp_path), "--sections", "primitives,environment", timeout=200)
    assert again.returncode == 0, again.stderr[-2000:]
    starts = [ln for ln in again.stderr.splitlines() if ": start (" in ln]
    assert [ln.split("] ")[1].split(":")[0] for ln in starts] == ["primitives", "environment"]
    assert all(ln.startswith("[gpu_check +") for ln in starts)
    rec = json.loads((tmp_path / "gpu-check.json").read_text())
    prim = rec["sections"]["primitives"]["result"]
    engine_at = rec["sections"]["engine"]["measured_at"]
    assert prim["engine_measured_at"] == engine_at and engine_at["code_version"] in prim["source"]


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    res = _run("--resume", str(tmp_path), "--sections", "engine,nonsense", timeout=60)
    assert res.returncode == 2 and "--sections" in res.stderr and "Traceback" not in res.stderr


def test_without_the_carried_wheels_it_stops_at_once_and_says_how_to_carry_them(tmp_path: Path) -> None:
    res = _run("--resume", str(tmp_path), timeout=60, block=",pydantic")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "cannot import pydantic" in line and "benchmarks.device_image" in line
    assert not (tmp_path / "gpu-check.json").exists()


def test_compare_claims_sees_a_changed_verdict_and_a_changed_number() -> None:
    a = {"claims": [{"id": "x", "verdict": "holds"}, {"id": "y", "verdict": "partly"}],
         "results": {"u": {"rows": [{"flip": 0.5, "wall_s": 3.0}], "n": 10}}}
    b = json.loads(json.dumps(a))
    assert gpu_check.compare_claims(a, b)["numbers_beyond_tolerance"] == 0
    b["claims"][1]["verdict"] = "holds"
    b["results"]["u"]["rows"][0]["flip"] = 0.5 * (1 + 2 * gpu_check.FLOAT32_TOLERANCE)
    b["results"]["u"]["rows"][0]["wall_s"] = 9.0  # timings are not measurements
    c = gpu_check.compare_claims(a, b)
    assert c["verdicts_differ"] == {"y": ["partly", "holds"]} and c["verdicts_equal"] == 1
    assert c["numbers_beyond_tolerance"] == 1 and c["units"]["u"]["numbers"] == 2


def test_pack_keeps_only_json_and_unpack_stays_inside(tmp_path: Path) -> None:
    state = tmp_path / "s"
    (state / "cache").mkdir(parents=True)
    (state / "cache" / "unit.json").write_text("{}")
    (state / "run.log").write_text("log")
    gpu_check.pack(state, tmp_path / "p.tar.gz")
    out = tmp_path / "o"
    out.mkdir()
    gpu_check.unpack(tmp_path / "p.tar.gz", out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == ["cache/unit.json"]


def test_sections_of_an_older_record_are_stamped_with_its_environment() -> None:
    env = {"git_commit": "abc", "code_version": "v1", "date_utc": "then"}
    sections = {"environment": {"status": "ok", "result": env}, "engine": {"status": "ok", "result": {}},
                "quick": {"status": "skipped: budget"},
                "agreement": {"status": "ok", "measured_at": {"code_version": "v0"}}}
    gpu_check._stamp_unstamped(sections)
    assert sections["engine"]["measured_at"]["code_version"] == "v1"
    assert "measured_at" not in sections["quick"] and sections["agreement"]["measured_at"] == {"code_version": "v0"}


def test_an_audit_the_budget_ended_runs_first_next_time() -> None:
    """The audit restarts from nothing, so behind the claims sections it would be ended at the same point in every
    lent session; the claims sections continue from their caches and keep their place."""
    wanted = ["environment", "primitives", "quick", "audit", "engine"]
    ended = {"audit": {"status": "ok", "result": {"finished": False, "ended_by_budget": "SIGTERM"}},
             "quick": {"status": "ok", "result": {"finished": False, "ended_by_budget": "SIGTERM"}}}
    assert gpu_check.run_order(wanted, ended) == ["audit", "environment", "primitives", "quick", "engine"]
    finished = {"audit": {"status": "ok", "result": {"finished": True}}}
    assert gpu_check.run_order(wanted, finished) == wanted
    assert gpu_check.run_order(wanted, {}) == wanted
    assert gpu_check.run_order(["quick", "quick"], {}) == ["quick"]


def test_the_gpu_audit_of_the_resnet_is_the_audits_defaults_but_the_refit_rate() -> None:
    """On CUDA the ResNet-18 audit drops the 2-core cost compromises (1-epoch re-fits, which did not agree); the
    CPU keeps the tables' recipe and the smoke run its CNN."""
    from benchmarks.audit_tables import FULL, SMOKE_AUDIT
    from verify.audit.config import AuditConfig

    gpu = gpu_check.audit_recipe("cuda", smoke=False)
    assert gpu.name == "resnet18" and gpu.audit == {"refit_lr": 1e-4}
    assert AuditConfig.__dataclass_fields__["refit_lr"].default != 1e-4  # the one option it sets is not a default
    assert (gpu.n, gpu.n_test, gpu.epochs) == (FULL["resnet18"].n, FULL["resnet18"].n_test, FULL["resnet18"].epochs)
    assert gpu.finetune_epochs > 0 and gpu.key() != FULL["resnet18"].key()  # its low-rate epochs make another model
    assert gpu_check.audit_recipe("cpu", smoke=False) == FULL["resnet18"] and FULL["resnet18"].finetune_epochs == 0
    smoke = gpu_check.audit_recipe("cuda", smoke=True)
    assert smoke.name == "cnn" and smoke.audit == SMOKE_AUDIT
