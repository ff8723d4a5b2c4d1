"""`verify claims --jobs N`: units in N worker processes against the same units one after another in one process.

The same smoke units give the same claims.json (every claim exactly, every number within 1e-9: the workers run the same
code with the same BLAS and torch threads); a SIGINT to a two-worker run after a unit finished exits 130 with
one line and keeps the finished units cached, and `--resume` computes only the others; bad `--jobs` values are
one-line errors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from claims_json import claims_of, same

from ntkm.errors import UserInputError
from verify.cli import main
from verify.executors import WORKER_BYTES, ExecutorConfig, default_jobs, run_units
from verify.runner import Cache, Unit

ROOT = Path(__file__).resolve().parents[2]
#: Smoke units of every kind that trains (NTK distance, malleability, landscape, the centred variant) and the
#: theory and kappa units, under both protocols; the centred NTK-distance and the malleability units share
#: nothing, the two protocols' units neither, so two workers have work from the start.
ONLY = "thm4.2,kappa-mnist,ntk-relu-mnist,flip-binary-mnist,landscape-mnist,ntk-attn-centred-mnist"


def value_unit(a: int) -> dict:
    """A unit that returns its input (module level: a spawned worker imports it by name)."""
    return {"value": a}


def missing_data_unit(a: int) -> dict:
    raise UserInputError("data folder /nowhere has no MNIST; run 'verify data download'")


def _exit_code(argv: list[str]) -> int:
    """`verify` run in this process; an argparse error exits (SystemExit) rather than returning."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
def test_two_workers_give_the_sequential_claims(tmp_path: Path):
    seq, par = tmp_path / "seq", tmp_path / "par"
    assert main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(seq), "--no-pdf", "--jobs", "1"]) == 0
    assert main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(par), "--no-pdf", "--jobs", "2"]) == 0
    # Every verdict, text and integer exactly; floats within 1e-9 relative: in the full suite the sequential run shares
    # the pytest process, whose BLAS state earlier tests have touched, and float64 reductions then differ from a fresh
    # worker's in the last bits (seen: 16504.374698367523 vs ...545). Alone, the two runs are bit-identical.
    assert same(claims_of(par), claims_of(seq), rel=1e-9) == []
    rec = json.loads((par / "claims.json").read_text())
    assert rec["executor"]["jobs"] == 2 and not any(u["cached"] for u in rec["units"].values())
    entries = sorted(json.loads(p.read_text())["unit"] for p in (par / "cache").glob("*.json"))
    assert entries == sorted(rec["units"])  # every unit cached exactly once


@pytest.mark.slow
def test_sigint_to_a_two_worker_run_keeps_finished_units_and_resume_computes_the_rest(tmp_path: Path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NTKM_PROGRESS": "1"}
    argv = [sys.executable, "-m", "verify", "claims", "--preset", "smoke", "--only", ONLY, "--out", str(out),
            "--no-pdf", "--jobs", "2"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    progress = []
    for line in proc.stderr:
        progress.append(line)
        if line.startswith("[done]"):
            break
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(progress) + rest
    assert "Traceback" not in rest
    last = [ln for ln in rest.splitlines() if ln.strip()][-1]
    assert "interrupted (SIGINT)" in last and "--resume" in last, rest
    assert sum("interrupted" in ln for ln in rest.splitlines()) == 1
    assert not (out / "claims.json").exists()
    finished = {json.loads(p.read_text())["unit"] for p in (out / "cache").glob("*.json")}
    assert finished  # at least the unit whose [done] line was read
    assert main(["claims", "--preset", "smoke", "--only", ONLY, "--out", str(out), "--no-pdf", "--resume",
                 "--jobs", "2"]) == 0
    units = json.loads((out / "claims.json").read_text())["units"]
    assert {n for n, u in units.items() if u["cached"]} == finished
    assert len(finished) < len(units)  # the interrupt came before the end: the rest were computed now


@pytest.mark.parametrize("value, needle", [("0", "--jobs must be a whole number >= 1"),
                                           ("-1", "--jobs must be a whole number >= 1"),
                                           ("x", "invalid int value")])
def test_bad_jobs_is_one_line(value: str, needle: str, tmp_path: Path, capsys):
    rc = _exit_code(["claims", "--preset", "smoke", "--only", "thm4.1", "--out", str(tmp_path / "o"), "--jobs", value])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and needle in line and "--jobs" in line, line
    assert not (tmp_path / "o").exists()


def test_jobs_is_for_the_local_executor(tmp_path: Path, capsys):
    rc = main(["claims", "--only", "thm4.1", "--out", str(tmp_path / "o"), "--executor", "ray", "--jobs", "2"])
    assert rc == 2 and "--jobs is for the local executor" in _one_line(capsys.readouterr().err)


def test_default_jobs_is_the_usable_cores_within_memory(monkeypatch):
    import verify.executors as ex

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(ex, "_available_memory", lambda: 64 * WORKER_BYTES)
    assert default_jobs() == cores and default_jobs(threads=cores) == 1
    monkeypatch.setattr(ex, "_available_memory", lambda: 1.5 * WORKER_BYTES)
    assert default_jobs() == 1
    monkeypatch.setattr(ex, "_available_memory", lambda: None)
    assert default_jobs() == cores


def test_a_units_bad_input_in_a_worker_stops_the_run_with_its_one_line_error(tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    units = [Unit("good", {"a": 1}, value_unit), Unit("bad", {"a": 2}, missing_data_unit),
             Unit("good2", {"a": 3}, value_unit)]
    with pytest.raises(UserInputError, match=r"^experiment bad: data folder /nowhere has no MNIST.*nothing was cached"):
        run_units(units, cache, lambda _: None, ExecutorConfig(jobs=2))
    assert cache.get(units[1]) is None
    # the good units that finished are cached; a rerun without the bad unit computes only what is missing
    done = {u.name for u in (units[0], units[2]) if cache.get(u) is not None}
    ran = run_units([units[0], units[2]], cache, lambda _: None, ExecutorConfig(jobs=2))
    assert {n for n, (_, cached) in ran.items() if cached} == done
    assert [r.payload["value"] for r, _ in ran.values()] == [1, 3]
