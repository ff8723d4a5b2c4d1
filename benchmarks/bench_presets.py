"""End-to-end wall times: `verify claims --preset smoke` (and quick behind a flag), and the audit.

Each command runs once in a fresh subprocess into a temporary folder (a repeat would double a
minutes-long run; the spread of these numbers is the machine's, see the load average). The check is
the command's own success: exit status 0 and a claims record listing every claim. The audit time comes
from `benchmarks/bench_audit.py` (another benchmark script of the suite) run the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Check, Row, Timing

SECTION = "6. Presets end to end (one run each, fresh process)"


def _env() -> dict[str, str]:
    return {**os.environ, "NTKM_PROGRESS": "0", "MPLBACKEND": "Agg"}


def bench_claims(preset: str, timeout_s: float = 3600.0, log: Any = print) -> Row:
    """Wall time of `verify claims --preset PRESET --out TMP` (PDF included when the renderer works)."""
    log(f"  verify claims --preset {preset}")
    with tempfile.TemporaryDirectory(prefix=f"bench-claims-{preset}-") as tmp:
        cmd = [sys.executable, "-m", "verify", "claims", "--preset", preset, "--out", tmp]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=_env())
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = -1, f"timed out after {timeout_s:g} s"
        wall = time.perf_counter() - t0
        n_claims, summary = 0, ""
        rec = Path(tmp) / "claims.json"
        if rec.exists():
            d = json.loads(rec.read_text())
            n_claims = len(d.get("claims", []))
            verdicts: dict[str, int] = {}
            for c in d.get("claims", []):
                v = c.get("verdict")
                v = v.get("status", str(v)) if isinstance(v, dict) else str(v)
                verdicts[v] = verdicts.get(v, 0) + 1
            summary = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
            pdf = "PDF written" if any(Path(tmp).glob("*.pdf")) else "no PDF (renderer unavailable)"
        else:
            pdf = ""
    note = f"exit {code}; {pdf}" + ("" if code == 0 else f"; stderr: {err.strip()[-300:]}")
    return Row(SECTION, f"verify claims --preset {preset}", "subprocess, temporary --out folder",
               Timing([wall], "none (a fresh process is the user's experience)"),
               value=f"{n_claims} claims ({summary})",
               checks=[Check("exit status", float(abs(code)), 0.0), Check("claims in the record", float(n_claims),
                                                                           1.0, ">=")],
               note=note, data={"wall_s": wall, "exit": code, "claims": n_claims})


def bench_audit(formats: str = "export", timeout_s: float = 1200.0, log: Any = print) -> Row:
    """Wall time of `python benchmarks/bench_audit.py --formats FORMATS` and its own stage table."""
    script = ROOT / "benchmarks" / "bench_audit.py"
    if not script.exists():
        return Row(SECTION, "verify audit (benchmarks/bench_audit.py)", "-", status="skipped: script absent")
    log(f"  benchmarks/bench_audit.py --formats {formats}")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(script), "--formats", formats], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout_s, env=_env())
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        code, out, err = -1, "", f"timed out after {timeout_s:g} s"
    wall = time.perf_counter() - t0
    stages: list[dict[str, str]] = []
    lines = [ln for ln in out.splitlines() if " | " in ln]
    if lines:
        head = [h.strip() for h in lines[0].split("|")]
        for ln in lines[1:]:
            cells = [c.strip() for c in ln.split("|")]
            if len(cells) == len(head):
                stages.append(dict(zip(head, cells, strict=True)))
    per = "; ".join(f"{s.get('format')}: total {s.get('total s')} s (kernel {s.get('kernel s')} s, "
                    f"{s.get('kernel path')})" for s in stages)
    note = f"exit {code}; includes training the script's MLP; " + (per or f"stderr: {err.strip()[-300:]}")
    return Row(SECTION, "verify audit, 1.07M-parameter MLP (benchmarks/bench_audit.py)",
               f"n=1000, formats {formats}, subprocess", Timing([wall], "none"),
               checks=[Check("exit status", float(abs(code)), 0.0)], note=note,
               data={"wall_s": wall, "exit": code, "stages": stages})

