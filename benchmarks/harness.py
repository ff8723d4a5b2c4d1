"""The benchmark harness: timing with warm-up and repeats, agreement checks, rows, environment, Markdown.

Rules the harness enforces:

- Warm-up runs are never timed; each timed number is the median over repeats, with min and max.
- A row's speed is printed only when every gated check of that row passed in the same run; a failed
  check turns the row into `FAILED` (and the runner's exit status non-zero).
- Ratios are formed from numbers measured (or extrapolated, and then marked so) in the same run.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Timing:
    """Wall times of the timed repeats (warm-up excluded) and how the warm-up was done."""

    times_s: list[float]
    warmup: str = "1 run at the same size"

    @property
    def median(self) -> float:
        return float(np.median(self.times_s))

    @property
    def min(self) -> float:
        return float(np.min(self.times_s))

    @property
    def max(self) -> float:
        return float(np.max(self.times_s))

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    def to_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max, "repeats": self.repeats,
                "times_s": list(self.times_s), "warmup": self.warmup}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Timing:
        return Timing(list(d["times_s"]), d.get("warmup", ""))


@dataclass(frozen=True)
class TimingPolicy:
    """How a call is timed: `warmup` untimed calls, then up to `repeats` timed ones within `max_total_s`."""

    repeats: int = 5
    warmup: int = 1
    max_total_s: float = 20.0


#: Five repeats after one warm-up, within 20 s.
DEFAULT_TIMING = TimingPolicy()


def time_call(fn: Callable[[], Any], policy: TimingPolicy = DEFAULT_TIMING, sync: Callable[[], None] | None = None,
              warmup_fn: Callable[[], Any] | None = None, warmup_note: str | None = None) -> Timing:
    """Time `fn`: `policy.warmup` untimed calls (of `warmup_fn` when given), then up to `policy.repeats` timed calls.

    Another repeat is started only while the time spent so far plus one more repeat stays within
    `policy.max_total_s`, so slow cases get fewer repeats (at least one). `sync` (e.g. CUDA synchronise) is
    called before each clock read.
    """
    repeats, warmup, max_total_s = policy.repeats, policy.warmup, policy.max_total_s
    sync = sync or (lambda: None)
    for _ in range(warmup):
        (warmup_fn or fn)()
    sync()
    times: list[float] = []
    while len(times) < max(1, repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) + times[-1] > max_total_s:
            break
    note = warmup_note or (f"{warmup} untimed run(s) at the same size" if warmup else "none")
    return Timing(times, note)


def time_result(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 1, max_total_s: float = 20.0,
                **kwargs: Any) -> tuple[Timing, Any]:
    """`time_call` of `fn(*args, **kwargs)`, also returning the last call's result."""
    out: list[Any] = []
    t = time_call(lambda: out.append(fn(*args, **kwargs)), TimingPolicy(repeats, warmup, max_total_s))
    return t, out[-1]


@dataclass
class Check:
    """An agreement or validity check computed in the same run.

    `op` is "<=" or ">=" against `threshold`; `threshold=None` makes the check informational (it is
    reported but cannot fail).
    """

    label: str
    value: float
    threshold: float | None = None
    op: str = "<="

    @property
    def gated(self) -> bool:
        return self.threshold is not None

    @property
    def passed(self) -> bool:
        if self.threshold is None:
            return True
        if not math.isfinite(self.value):
            return False
        return self.value <= self.threshold if self.op == "<=" else self.value >= self.threshold

    def render(self) -> str:
        if self.threshold is None:
            return f"{self.label} {fmt_num(self.value)}"
        mark = "ok" if self.passed else "FAILED"
        return f"{self.label} {fmt_num(self.value)} {self.op} {fmt_num(self.threshold)} {mark}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "gated": self.gated}


@dataclass
class Row:
    """One line of the results table.

    status: "measured", "extrapolated" (time predicted from a measured smaller case, see `note`),
    "info" (a derived number, no timing of its own) or "skipped: <reason>". A failed gated check
    overrides the status with "FAILED".
    """

    section: str
    bench: str
    case: str
    timing: Timing | None = None
    value: str = ""
    ratio: str = ""
    checks: list[Check] = field(default_factory=list)
    memory: str = ""
    status: str = "measured"
    note: str = ""
    gpu: str = ""
    extrapolated_s: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(not c.passed for c in self.checks)

    @property
    def final_status(self) -> str:
        return "FAILED" if self.failed else self.status

    def time_text(self) -> str:
        """The time cell: blank when failed or unchecked, marked when extrapolated."""
        if self.failed:
            return "FAILED"
        if self.extrapolated_s is not None:
            return f"~{fmt_time(self.extrapolated_s)} (extrapolated)"
        if self.timing is None:
            return ""
        if not any(c.gated for c in self.checks):
            return "no check: not shown"
        t = self.timing
        if t.repeats == 1:
            return f"{fmt_time(t.median)} (1 run)"
        return f"{fmt_time(t.median)} [{fmt_time(t.min)}-{fmt_time(t.max)}] x{t.repeats}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "section": self.section, "bench": self.bench, "case": self.case,
            "timing": self.timing.to_dict() if self.timing else None,
            "value": self.value, "ratio": self.ratio, "checks": [c.to_dict() for c in self.checks],
            "memory": self.memory, "status": self.final_status, "note": self.note, "gpu": self.gpu,
            "extrapolated_s": self.extrapolated_s, "time_text": self.time_text(), "data": self.data,
        }


def fmt_num(x: float | None) -> str:
    """Compact number: 3 significant digits, scientific outside [1e-3, 1e5)."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    ax = abs(x)
    if ax != 0 and (ax < 1e-3 or ax >= 1e5):
        return f"{x:.2e}"
    return f"{x:.3g}"


def fmt_time(s: float) -> str:
    """Seconds in a readable unit."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def fmt_bytes(b: float) -> str:
    """Bytes in binary units (KiB, MiB, GiB)."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_ratio(r: float) -> str:
    """A ratio as `12.3x` or `1,234x`."""
    return f"{r:,.0f}x" if r >= 100 else f"{r:.3g}x"


def speedup(slow_s: float, fast_s: float, fast: str, slow: str) -> str:
    """'FAST Nx faster' when `fast_s` < `slow_s`, else 'SLOW Nx faster' (ratios are never printed below 1)."""
    if fast_s <= slow_s:
        return f"{fast} {fmt_ratio(slow_s / fast_s)} faster"
    return f"{slow} {fmt_ratio(fast_s / slow_s)} faster"


def sync_device(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so that a clock read after it is honest."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def max_rel_diff(a: Any, b: Any) -> float:
    """`max |a - b| / max |b|` (b is the reference)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a - b)) / scale) if scale > 0 else float(np.max(np.abs(a - b)))


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x (needs two or more distinct x)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(lx, ly, 1)[0])


def log_slope_text(cost: Callable[[float], float], xs: tuple[int, ...] | list[int]) -> str:
    """Local exponent of a cost model between the smallest and largest x, as text."""
    a, b = float(min(xs)), float(max(xs))
    return f"{math.log(cost(b) / cost(a)) / math.log(b / a):.2f}"


def proc_status_kib(key: str) -> int | None:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM); None where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the platform has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Machine, software and load: recorded with every benchmark run."""
    import torch

    from empirics.records import device_info, library_versions

    mem_kib = None
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem_kib / (1 << 20), 1) if mem_kib else None,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "blas": next((ln.strip() for ln in torch.__config__.parallel_info().splitlines()
                      if "Math Kernel" in ln or "OpenBLAS" in ln), "see torch.__config__.show()"),
        "load_average_start": load_average(),
        "blas_threads_env": {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                            "MKL_NUM_THREADS")},
        "versions": library_versions(),
        "device": device_info(),
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "not present on this machine",
        "git_commit": _git_commit(),
    }
    return info


def render_markdown(rows: list[Row], env: dict[str, Any], headline: list[str], wall_s: float | None = None) -> str:
    """The results as Markdown: a header (machine, load, GPU), the key ratios, one table per section."""
    gpu = bool(env.get("cuda"))
    load = env.get("load_average_start")
    load_end = env.get("load_average_end")
    lines = [
        f"Benchmarks run {env['date_utc']} on {env['cpu']} ({env['cpu_count']} cores, {env['memory_gib']} GiB), "
        f"torch {env['versions'].get('torch')} with {env['torch_threads']} threads; load average (1, 5, 15 min) "
        f"{load} at start, {load_end} at end"
        + (f"; total wall time {fmt_time(wall_s)}" if wall_s is not None else "") + ".",
        "",
        f"GPU: {env['gpu']}." if gpu else "GPU: not present on this machine.",
        "",
    ]
    by_section = env.get("load_average_by_section") or {}
    if by_section:
        parts = [f"{k.split('.')[0]}: {v[0] if v else '?'}" for k, v in by_section.items()]
        lines += ["1-min load average before each section (section: load): " + ", ".join(parts) + ".", ""]
    if headline:
        lines += ["**Key ratios** (same run):", ""] + [f"- {h}" for h in headline] + [""]
    sections: list[str] = []
    for r in rows:
        if r.section not in sections:
            sections.append(r.section)
    head = ["Benchmark", "Case", "Time: median [min-max] x repeats", "Ratio", "Agreement / check", "Peak memory"]
    if gpu:
        head.append("GPU time")
    head += ["Status", "Note"]
    for s in sections:
        lines += [f"### {s}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r.section == s):
            cells = [r.bench, r.case, r.time_text() or r.value, r.ratio,
                     "; ".join(c.render() for c in r.checks), r.memory]
            if r.value and r.time_text():
                cells[2] = f"{r.time_text()}; {r.value}"
            if gpu:
                cells.append(r.gpu)
            cells += [r.final_status, r.note]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def exit_status(rows: list[Row]) -> int:
    """0 when every gated check passed, 1 otherwise."""
    return 1 if any(r.failed for r in rows) else 0
