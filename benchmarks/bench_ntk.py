"""Empirical NTK benchmarks: the closed form against three generic paths, a GEMM floor and memory.

Paths (all give the per-output "mean" kernel of the paper's networks, d = 784, 10 outputs):

- `closed`: `empirics.kernels.ntk.empirical_ntk(..., implementation="closed_form")`, two matrix products
  (docs/DESIGN.md, "Fast paths that matter").
- `generic`: `empirics.kernels.ntk.empirical_ntk(..., implementation="torch_func")`, per-example Jacobians with
  `torch.func.jacrev` + `vmap`, chunked to 1 GiB of Jacobians.
- `vjp`: `benchmarks.ntk_paths.empirical_ntk_vjp_jvp`, NTK-vector products (vmapped vjp then jvp), chunked.
- `loop`: `benchmarks.ntk_paths.empirical_ntk_autograd_loop`, one `torch.autograd.grad` per example and output.

`empirical_ntk` returns float64; a float32 case computes in float32 and its timing includes the exact conversion
of the (n, n) result (under 2 % of the closed form's time at n = 1000).

Each measured case runs in a fresh Python process (`python -m benchmarks.bench_ntk --case JSON`) so
that its peak resident memory (VmHWM from /proc/self/status, minus the RSS once inputs and model are
built, before the warm-up) is its own: tracemalloc does not see torch's CPU allocations. A slow path
is measured at a small probe n, then at growing n (probe x 4, x 16, ... and the target sizes) while
the time predicted from the last measurement (t proportional to n^2) fits the cap; larger targets are
extrapolated from the largest measured n and marked so. Every measured case checks, in the same
process after its timing, (1) the algorithm in float64 on its first few points against the other
side (a slow path against the closed form, the closed form against `torch_func`; tolerance 1e-9)
and (2) its float32 kernel at full size (see `agreement`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.harness import (
    ROOT,
    Check,
    Row,
    Timing,
    TimingPolicy,
    fit_exponent,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    log_slope_text,
    max_rel_diff,
    proc_status_kib,
    sync_device,
    time_call,
)
from benchmarks.ntk_paths import (
    ChunkMemory,
    closed_form_flops,
    generic_flops,
    generic_peak_bytes,
    largest_n,
    loop_jacobian_bytes,
)

SECTION = "1. Empirical NTK (2L-ReLU unless noted; d = 784, 10 outputs, float32)"
SCALING = "4. Scaling"
SLOW_PATHS = ("generic", "vjp", "loop")
PATH_LABEL = {
    "closed": "closed form (empirical_ntk closed_form)",
    "generic": "generic: jacrev + vmap (empirical_ntk torch_func)",
    "vjp": "generic: vjp/jvp NTK-vector products",
    "loop": "generic: autograd.grad loop, J J^T",
}
MAX_BYTES = 1 << 30
D_IN, OUT = 784, 10


@dataclass
class NtkConfig:
    """Sizes and limits of the NTK benchmarks."""

    ns: tuple[int, ...] = (250, 500, 1000)
    ms: tuple[int, ...] = (256, 1024, 4096)
    probe_n: int = 32
    cap_s: float = 30.0
    slow_budget_s: float = 15.0
    slow_repeats: int = 3
    loop_max_bytes: float = 4 * (1 << 30)
    repeats: int = 5
    headline: tuple[int, int] = (500, 1024)
    attn: bool = True
    float64_case: bool = True
    in_process: bool = False
    devices: tuple[str, ...] = ("cpu",)
    gemm_size: int = 2048
    memory_limit_gib: float = 24.0
    inputs: str = ""
    case_timeout_s: float = 900.0
    threads: int | None = None


# ------------------------------------------------------------------------------------------------
# One case (runs in a fresh process)


def _path_fn(path: str, model: Any) -> Callable[[Any], Any]:
    """The kernel function of one path ("closed", "generic", "vjp", "loop") for `model`, "mean" reduction."""
    from benchmarks.ntk_paths import empirical_ntk_autograd_loop, empirical_ntk_vjp_jvp
    from empirics.kernels.ntk import JacobianOptions, empirical_ntk

    fns: dict[str, Callable[[Any], Any]] = {
        "closed": lambda xx: empirical_ntk(model, xx, implementation="closed_form"),
        "generic": lambda xx: empirical_ntk(model, xx, implementation="torch_func",
                                            options=JacobianOptions(max_bytes=MAX_BYTES)),
        "vjp": lambda xx: empirical_ntk_vjp_jvp(model, xx, max_bytes=MAX_BYTES),
        "loop": lambda xx: empirical_ntk_autograd_loop(model, xx),
    }
    return fns[path]


def agreement(path: str, model: Any, x: Any, K: Any, check_n: int) -> list[dict[str, Any]]:
    """The checks of one case, computed after its timing (so they do not count in time or peak memory).

    1. Algorithmic agreement, strict: the two sides in float64 on the first `check_n` points (a slow
       path against the closed form; the closed form against `torch_func`), tolerance 1e-9.
    2. The timed (float32) kernel at full size against the closed form: against float32 for a slow
       path (tolerance 1e-2: a float32 contraction over c m d terms loses about that much, see
       benchmarks/README.md), against float64 for the closed form itself (tolerance 1e-4).
    """
    import copy

    import torch

    from empirics.kernels.ntk import empirical_ntk

    k = min(x.shape[0], check_n)
    m64 = copy.deepcopy(model).double()
    x64 = x[:k].double()
    ref64 = empirical_ntk(m64, x64, implementation="closed_form")
    other = _path_fn("generic" if path == "closed" else path, m64)(x64)
    against = "torch_func" if path == "closed" else "closed form"
    out = [{"label": f"float64 max rel diff vs {against} (first {k} points)",
            "value": max_rel_diff(other.cpu().numpy(), ref64.cpu().numpy()), "threshold": 1e-9}]
    if x.dtype == torch.float64:
        return out
    if path == "closed":
        full = empirical_ntk(copy.deepcopy(model).double(), x.double(), implementation="closed_form")
        out.append({"label": "float32 max rel diff vs float64 closed form", "threshold": 1e-4,
                    "value": max_rel_diff(K.cpu().numpy(), full.cpu().numpy())})
    else:
        ref = empirical_ntk(model, x, implementation="closed_form")
        out.append({"label": "float32 max rel diff vs closed form, same n", "threshold": 1e-2,
                    "value": max_rel_diff(K.cpu().numpy(), ref.cpu().numpy())})
    return out


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Time one (path, kind, n, m, dtype, device) case; peak memory and the agreement checks included."""
    import torch

    from empirics.nets.models import ModelSpec, build_model

    path, kind, n, m = spec["path"], spec["kind"], int(spec["n"]), int(spec["m"])
    device = spec.get("device", "cpu")
    dtype = torch.float64 if spec.get("dtype") == "float64" else torch.float32
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    x_all = np.load(spec["inputs"])["x"]
    x = torch.as_tensor(x_all[:n], dtype=dtype, device=device)
    model = build_model(ModelSpec(kind, x.shape[1], m, OUT, seed=0), x, dtype=dtype, device=device)
    fn = _path_fn(path, model)
    holder: dict[str, Any] = {}

    def timed() -> None:
        holder["K"] = fn(x)

    if path == "closed":
        warm, note = (lambda: fn(x)), "1 untimed run at the same size"
    else:
        warm, note = (lambda: fn(x[:4])), "1 untimed run at n=4"
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    rss0 = proc_status_kib("VmRSS")
    warm()
    sync_device(device)
    policy = TimingPolicy(int(spec.get("repeats", 5)), warmup=0, max_total_s=float(spec["budget_s"]))
    timing = time_call(timed, policy, sync=lambda: sync_device(device), warmup_note=note)
    hwm = proc_status_kib("VmHWM")
    peak = None
    if device.startswith("cuda"):
        peak = float(torch.cuda.max_memory_allocated())
    elif rss0 is not None and hwm is not None:
        peak = float(max(0, hwm - rss0) * 1024)
    checks = agreement(path, model, x, holder["K"], int(spec.get("check_n", 8)))
    return {"spec": spec, "timing": timing.to_dict(), "peak_bytes": peak, "baseline_rss_bytes": (rss0 or 0) * 1024,
            "checks": checks, "threads": torch.get_num_threads()}


def run_case_subprocess(spec: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
    """`run_case` in a fresh interpreter (so VmHWM is this case's own); raises on failure."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_ntk", "--case", json.dumps(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"NTK case {spec['path']} n={spec['n']} m={spec['m']} failed "
                           f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------------
# GEMM floor


def gemm_rates(size: int, devices: tuple[str, ...], repeats: int = 5) -> tuple[list[Row], dict[str, float]]:
    """float32 / float64 square GEMM rate (the machine's matrix-multiply floor), checked against numpy."""
    import torch

    rows, rates = [], {}
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((size, size)), rng.standard_normal((size, size))
    ref = a_np @ b_np
    for dt_name, dt, tol in (("float32", torch.float32, 1e-4), ("float64", torch.float64, 1e-12)):
        gpu_txt = ""
        for device in devices:
            a = torch.as_tensor(a_np, dtype=dt, device=device)
            b = torch.as_tensor(b_np, dtype=dt, device=device)
            out: dict[str, Any] = {}

            def mm(a: torch.Tensor = a, b: torch.Tensor = b, out: dict[str, Any] = out) -> None:
                out["c"] = a @ b

            t = time_call(mm, TimingPolicy(repeats, warmup=1, max_total_s=10.0), sync=lambda d=device: sync_device(d))
            rate = 2.0 * size**3 / t.median / 1e9
            diff = max_rel_diff(out["c"].cpu().numpy(), ref)
            if device == "cpu":
                rates[dt_name] = rate
                rows.append(Row(SECTION, f"GEMM floor, {dt_name}", f"{size}x{size} @ {size}x{size}", t,
                                value=f"{rate:.1f} GFLOP/s", checks=[Check("max rel diff vs numpy", diff, tol)],
                                note="torch matmul; the rate the closed form is compared with"))
            else:
                rates[f"{dt_name}_{device}"] = rate
                gpu_txt = f"{fmt_time(t.median)} ({rate:.0f} GFLOP/s)"
        if gpu_txt:
            rows[-1].gpu = gpu_txt
    return rows, rates


# ------------------------------------------------------------------------------------------------
# Orchestration


@dataclass
class _Measured:
    n: int
    result: dict[str, Any]

    @property
    def t(self) -> float:
        return float(np.median(self.result["timing"]["times_s"]))


@dataclass(frozen=True)
class NtkCase:
    """Which kernel one case computes: the path, the network (`kind`, width `m`), n points, the dtype and device."""

    path: str
    kind: str
    n: int
    m: int
    dtype: str = "float32"
    device: str = "cpu"


def _spec(cfg: NtkConfig, case: NtkCase) -> dict[str, Any]:
    """A case for `run_case`: the closed form gets `repeats` within `cap_s`, slow paths fewer and less time."""
    fast = case.path == "closed"
    m = case.m
    return {**asdict(case), "inputs": cfg.inputs,
            "repeats": cfg.repeats if fast else cfg.slow_repeats, "budget_s": cfg.cap_s if fast else cfg.slow_budget_s,
            "check_n": 16 if m <= 256 else 8 if m <= 1024 else 4, "threads": cfg.threads}


def _run(cfg: NtkConfig, spec: dict[str, Any]) -> dict[str, Any]:
    if cfg.in_process or spec["device"] != "cpu":
        res = run_case(spec)
        res["memory_kind"] = "device max allocated" if spec["device"] != "cpu" else "in-process estimate"
        return res
    res = run_case_subprocess(spec, cfg.case_timeout_s)
    res["memory_kind"] = "peak RSS"
    return res


def _estimate_bytes(path: str, n: int, m: int, itemsize: int = 4) -> float:
    if path == "closed":
        return float(itemsize * (n * D_IN + m * D_IN + 2 * n * m + 3 * n * n))
    if path == "generic":
        return generic_peak_bytes(n, m, D_IN, OUT, itemsize, ChunkMemory(MAX_BYTES))
    if path == "loop":
        return loop_jacobian_bytes(n, m, D_IN, OUT, itemsize)
    return float(MAX_BYTES + n * n * OUT * OUT * itemsize)


def _memory_text(path: str, res: dict[str, Any]) -> str:
    n, m = int(res["spec"]["n"]), int(res["spec"]["m"])
    if res.get("memory_kind") == "peak RSS" and res.get("peak_bytes") is not None:
        return f"{fmt_bytes(res['peak_bytes'])} (RSS)"
    if res.get("memory_kind") == "device max allocated" and res.get("peak_bytes") is not None:
        return f"{fmt_bytes(res['peak_bytes'])} (device)"
    return f"~{fmt_bytes(_estimate_bytes(path, n, m))} (est. from tensor sizes)"


def _checks(res: dict[str, Any], at: str = "") -> list[Check]:
    return [Check(c["label"] + at, float(c["value"]), c["threshold"]) for c in res["checks"]]


def _ladder(cfg: NtkConfig, path: str, kind: str, m: int, targets: tuple[int, ...]) -> dict[int, _Measured]:
    """Measure the probe n, then climb (probe x 4^k and the targets) while the predicted time fits the cap.

    Prediction: t ~ n^2 from the last measured n. The loop path also stops where its Jacobian would
    exceed `loop_max_bytes`.
    """
    measured: dict[int, _Measured] = {}
    probe = min(cfg.probe_n, min(targets))
    if path == "loop" and loop_jacobian_bytes(probe, m, D_IN) > cfg.loop_max_bytes:
        return measured
    measured[probe] = _Measured(probe, _run(cfg, _spec(cfg, NtkCase(path, kind, probe, m))))
    base = measured[probe]
    steps = {s for s in (probe * 4**k for k in range(1, 8))
             if s < max(targets) and all(not (t / 1.5 <= s <= t * 1.5) for t in targets)}
    for n in sorted(set(targets) | steps):
        if n <= base.n:
            continue
        if path == "loop" and loop_jacobian_bytes(n, m, D_IN) > cfg.loop_max_bytes:
            break
        if base.t * (n / base.n) ** 2 > cfg.cap_s:
            break
        measured[n] = _Measured(n, _run(cfg, _spec(cfg, NtkCase(path, kind, n, m))))
        base = measured[n]
    return measured


def _case(n: int, m: int, kind: str = "relu", dtype: str = "float32") -> str:
    extra = ("" if kind == "relu" else ", MLP-Attn") + ("" if dtype == "float32" else f", {dtype}")
    return f"n={n}, m={m}{extra}"


def bench_ntk(cfg: NtkConfig, log: Any = print) -> tuple[list[Row], dict[str, Any]]:
    """All NTK rows plus the data needed for the key ratios and the scaling section."""
    rows, gemm = gemm_rates(cfg.gemm_size, cfg.devices)
    data: dict[str, Any] = {"gemm_gflops": gemm, "closed": {}, "slow": {}}
    gpu = [d for d in cfg.devices if d != "cpu"]
    closed: dict[tuple[str, int, int, str], dict[str, Any]] = {}
    cases = [("relu", n, m, "float32") for m in cfg.ms for n in cfg.ns]
    hn, hm = cfg.headline
    if cfg.attn:
        cases.append(("attn", hn, hm, "float32"))
    if cfg.float64_case:
        cases.append(("relu", max(cfg.ns), max(cfg.ms), "float64"))
    for kind, n, m, dtype in cases:
        log(f"  ntk closed {kind} n={n} m={m} {dtype}")
        res = _run(cfg, _spec(cfg, NtkCase("closed", kind, n, m, dtype)))
        closed[(kind, n, m, dtype)] = res
        t = Timing.from_dict(res["timing"])
        flops = closed_form_flops(n, m, D_IN, OUT, attn=kind == "attn")
        rate = flops / t.median / 1e9
        frac = rate / gemm[dtype]
        row = Row(SECTION, PATH_LABEL["closed"], _case(n, m, kind, dtype), t,
                  value=f"{rate:.1f} GFLOP/s = {100 * frac:.0f}% of GEMM {dtype}",
                  checks=_checks(res), memory=_memory_text("closed", res),
                  data={"gflops": rate, "fraction_of_gemm": frac, "flops": flops,
                        "peak_bytes": res.get("peak_bytes")})
        for device in gpu:
            g = run_case(_spec(cfg, NtkCase("closed", kind, n, m, dtype, device)))
            row.gpu = fmt_time(Timing.from_dict(g["timing"]).median)
        rows.append(row)
        data["closed"][f"{kind}/{n}/{m}/{dtype}"] = {"median_s": t.median, "gflops": rate, "fraction_of_gemm": frac,
                                                     "peak_bytes": res.get("peak_bytes")}

    slow_runs: dict[tuple[str, str, int], dict[int, _Measured]] = {}
    plan = [(p, "relu", m, cfg.ns) for p in SLOW_PATHS for m in cfg.ms]
    if cfg.attn:
        plan.append(("generic", "attn", hm, (hn,)))
    for path, kind, m, targets in plan:
        log(f"  ntk {path} {kind} m={m}")
        measured = _ladder(cfg, path, kind, m, targets)
        slow_runs[(path, kind, m)] = measured
        for n in sorted(set(targets) | set(measured)):
            ref = closed.get((kind, n, m, "float32"))
            rows.append(_slow_row(cfg, NtkCase(path, kind, n, m), measured, ref))
            if gpu and n in measured:
                g = run_case(_spec(cfg, NtkCase(path, kind, n, m, "float32", gpu[0])))
                rows[-1].gpu = fmt_time(Timing.from_dict(g["timing"]).median)
            data["slow"][f"{path}/{kind}/{n}/{m}"] = rows[-1].data
    data["headline"] = _headline(closed, slow_runs, rows, cfg)
    return rows, {**data, "_slow_runs": slow_runs, "_closed": closed}


def _slow_row(cfg: NtkConfig, which: NtkCase, measured: dict[int, _Measured], ref: dict[str, Any] | None) -> Row:
    """The row of a slow path's case (its float32 kernel): measured, extrapolated from the largest measured n, or
    skipped for memory; `ref` is the closed form's result at the same case, where measured."""
    path, kind, n, m = which.path, which.kind, which.n, which.m
    label = PATH_LABEL[path]
    case = _case(n, m, kind)
    if n not in cfg.ns:
        case += " (probe)" if n == min(measured) else " (step)"
    t_closed = Timing.from_dict(ref["timing"]).median if ref else None
    if n in measured:
        res = measured[n].result
        t = Timing.from_dict(res["timing"])
        ratio = fmt_ratio(t.median / t_closed) + " slower than closed" if t_closed else ""
        return Row(SECTION, label, case, t, ratio=ratio, checks=_checks(res), memory=_memory_text(path, res),
                   data={"median_s": t.median, "measured": True, "peak_bytes": res.get("peak_bytes"),
                         "ratio_to_closed": t.median / t_closed if t_closed else None})
    if not measured:
        need = loop_jacobian_bytes(n, m, D_IN)
        return Row(SECTION, label, case, status="skipped: memory",
                   note=f"J would need {fmt_bytes(need)} > {fmt_bytes(cfg.loop_max_bytes)} limit",
                   data={"measured": False})
    base = measured[max(measured)]
    t_est = base.t * (n / base.n) ** 2
    reason = "time cap" if path != "loop" or loop_jacobian_bytes(n, m, D_IN) <= cfg.loop_max_bytes else \
        f"memory: J needs {fmt_bytes(loop_jacobian_bytes(n, m, D_IN))}"
    ratio = fmt_ratio(t_est / t_closed) + " slower than closed (est.)" if t_closed else ""
    base_peak = base.result.get("peak_bytes") if base.result.get("memory_kind") == "peak RSS" else None
    mem = (f"~{fmt_bytes(base_peak + _estimate_bytes(path, n, m) - _estimate_bytes(path, base.n, m))} "
           f"(est.: RSS at n={base.n} + model)" if base_peak is not None
           else f"~{fmt_bytes(_estimate_bytes(path, n, m))} (est. from tensor sizes)")
    return Row(SECTION, label, case, ratio=ratio, checks=_checks(base.result, at=f" @n={base.n}"),
               memory=mem, status="extrapolated",
               extrapolated_s=t_est,
               note=f"{reason}; t ~ n^2 from measured n={base.n} ({fmt_time(base.t)}); cap {cfg.cap_s:g} s",
               data={"median_s": t_est, "measured": False, "base_n": base.n,
                     "ratio_to_closed": t_est / t_closed if t_closed else None})


def _headline(closed: dict, slow_runs: dict, rows: list[Row], cfg: NtkConfig) -> dict[str, Any]:
    hn, hm = cfg.headline
    ref = closed.get(("relu", hn, hm, "float32"))
    out: dict[str, Any] = {"n": hn, "m": hm}
    if ref is None:
        return out
    t_closed = Timing.from_dict(ref["timing"]).median
    out["closed_s"] = t_closed
    out["flop_ratio"] = generic_flops(hn, hm, D_IN, OUT) / closed_form_flops(hn, hm, D_IN, OUT)
    for r in rows:
        if r.section == SECTION and r.case == _case(hn, hm) and r.bench != PATH_LABEL["closed"]:
            path = next(p for p, lab in PATH_LABEL.items() if lab == r.bench)
            out[path] = {"seconds": r.data.get("median_s"), "measured": r.data.get("measured"),
                         "ratio": r.data.get("ratio_to_closed"), "status": r.final_status,
                         "base_n": r.data.get("base_n")}
    return out


def scaling_rows(cfg: NtkConfig, data: dict[str, Any]) -> list[Row]:
    """Fitted time exponents of the NTK paths against n and m, and the largest n in the memory limit."""
    rows: list[Row] = []
    closed = data["_closed"]
    slow = data["_slow_runs"]
    mid_m = cfg.headline[1] if cfg.headline[1] in cfg.ms else cfg.ms[len(cfg.ms) // 2]
    big_n = max(cfg.ns)
    ts_n = [Timing.from_dict(closed[("relu", n, mid_m, "float32")]["timing"]).median for n in cfg.ns]
    ts_m = [Timing.from_dict(closed[("relu", big_n, m, "float32")]["timing"]).median for m in cfg.ms]

    def cost_n(n: float) -> float:
        return closed_form_flops(int(n), mid_m, D_IN)

    def cost_m(m: float) -> float:
        return closed_form_flops(big_n, int(m), D_IN)

    rows.append(Row(SCALING, "NTK closed form: time vs n", f"m={mid_m}, n={','.join(map(str, cfg.ns))}",
                    value=f"exponent {fit_exponent(list(cfg.ns), ts_n):.2f}",
                    ratio=f"theory {log_slope_text(cost_n, cfg.ns)}", status="info",
                    note="theory: local slope of 2n^2(d+m) + 2nmd over the same range"))
    rows.append(Row(SCALING, "NTK closed form: time vs m", f"n={big_n}, m={','.join(map(str, cfg.ms))}",
                    value=f"exponent {fit_exponent(list(cfg.ms), ts_m):.2f}",
                    ratio=f"theory {log_slope_text(cost_m, cfg.ms)}", status="info",
                    note="theory: local slope of 2n^2(d+m) + 2nmd over the same range"))
    for path in SLOW_PATHS:
        probe_ts = {m: slow[(path, "relu", m)][min(slow[(path, "relu", m)])]
                    for m in cfg.ms if slow.get((path, "relu", m))}
        same_n = {m: v for m, v in probe_ts.items() if v.n == min(v.n for v in probe_ts.values())}
        if len(same_n) >= 2:
            n0 = next(iter(same_n.values())).n
            ms = sorted(same_n)
            e = fit_exponent(ms, [same_n[m].t for m in ms])
            note = "measured probes"
            if path == "generic":
                note += ("; torch_func's chunk shrinks as m grows (1 GiB / (2 c m d x 4 B) examples), so it "
                         "recomputes more Jacobians per kernel block and grows faster than m")
            rows.append(Row(SCALING, f"NTK {PATH_LABEL[path]}: time vs m", f"n={n0}, m={','.join(map(str, ms))}",
                            value=f"exponent {e:.2f}", ratio="theory 1 (2 c m d n^2)", status="info", note=note))
        pts = [(mm, slow[(path, "relu", mm)]) for mm in cfg.ms if len(slow.get((path, "relu", mm), {})) >= 2]
        for mm, meas in pts:
            ns = sorted(meas)
            e = fit_exponent(ns, [meas[n].t for n in ns])
            rows.append(Row(SCALING, f"NTK {PATH_LABEL[path]}: time vs n", f"m={mm}, n={','.join(map(str, ns))}",
                            value=f"exponent {e:.2f}", ratio="theory 2 (2 c m d n^2)", status="info",
                            note="measured points only"))
    rows += _memory_limit_rows(cfg, data)
    return rows


def _memory_limit_rows(cfg: NtkConfig, data: dict[str, Any]) -> list[Row]:
    """Largest n within the memory limit for the generic path (chunked) and the loop (materialised J)."""
    rows: list[Row] = []
    limit = cfg.memory_limit_gib * (1 << 30)
    slow = data["_slow_runs"]
    copies, base_rss = 2.0, 0.0
    calib = ""
    for m in sorted(cfg.ms, reverse=True):
        meas = slow.get(("generic", "relu", m), {})
        if not meas:
            continue
        big = meas[max(meas)]
        peak, base = big.result.get("peak_bytes"), big.result.get("baseline_rss_bytes", 0.0)
        if big.result.get("memory_kind") == "peak RSS" and peak:
            jac_one = generic_peak_bytes(big.n, m, D_IN, OUT, 4, ChunkMemory(MAX_BYTES, 0.0, 1.0)) - \
                generic_peak_bytes(big.n, m, D_IN, OUT, 4, ChunkMemory(MAX_BYTES, 0.0, 0.0))
            copies = max(1.0, peak / jac_one) if jac_one > 0 else 2.0
            base_rss = float(base)
            calib = (f"calibrated on measured peak RSS at n={big.n}, m={m}: {fmt_bytes(peak)} = "
                     f"{copies:.2f} x the two 1 GiB-budget Jacobian chunks; process baseline {fmt_bytes(base_rss)}")
        break
    if not calib:
        calib = "uncalibrated (no peak RSS measured): 2 Jacobian-chunk copies assumed"
    chunks = ChunkMemory(MAX_BYTES, base_rss, copies)
    for m in cfg.ms:
        def peak_generic(n: int, m: int = m) -> float:
            return generic_peak_bytes(n, m, D_IN, OUT, 4, chunks)

        def peak_loop(n: int, m: int = m) -> float:
            return base_rss + loop_jacobian_bytes(n, m, D_IN)

        n_gen = largest_n(limit, peak_generic)
        n_loop = largest_n(limit, peak_loop)
        meas = slow.get(("generic", "relu", m), {})
        t_txt = ""
        est_s = None
        if meas:
            b = meas[max(meas)]
            est_s = b.t * (n_gen / b.n) ** 2
            t_txt = f"; generic would take ~{fmt_time(est_s)} there (t ~ n^2 from n={b.n})"
        rows.append(Row(SCALING, f"largest n in {cfg.memory_limit_gib:g} GiB (memory model)", f"m={m}, float32",
                        value=f"generic (1 GiB chunks): n = {n_gen:,}; autograd loop (all of J): n = {n_loop:,}",
                        status="info",
                        note="n^2 kernel + inputs + Jacobian chunks (torch_func sizes 2 chunks to max_bytes=1 GiB); "
                             f"loop: n c m d floats; {calib}{t_txt}",
                        data={"n_generic": n_gen, "n_loop": n_loop, "copies": copies, "est_s": est_s}))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point of the per-case subprocess: `python -m benchmarks.bench_ntk --case JSON`."""
    import argparse

    p = argparse.ArgumentParser(description="run one NTK benchmark case and print a JSON line")
    p.add_argument("--case", required=True, help="JSON case spec (see run_case)")
    a = p.parse_args(argv)
    print(json.dumps(run_case(json.loads(a.case))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
