"""The one prepared device check: everything the suite needs to know about a GPU, within a time budget.

    python -m benchmarks.gpu_check                                   # on a GPU: 480 s, runs/gpu-check/
    python -m benchmarks.gpu_check --budget-s 300 --resume runs/gpu-check --json results/gpu-check.json
    python -m benchmarks.gpu_check --device cpu --smoke              # the same script on a CPU, < 3 min (CI)

A GPU is lent to a session rarely and for about 15 minutes, start-up included, so this script is the whole of
what is run there: it stops itself within `--budget-s`, writes its JSON and Markdown after every section (a
killed run keeps what it had), and with `--resume DIR` skips the sections a previous run finished and continues
the claims runs from their caches (a section is kept only when it was measured with the same code version: theory/
and empirics/ unchanged). `--sections A,B,...` runs those sections in that order, so that a lent session measures first
what is still missing; the primitives section then prices with the engine section an earlier run kept (its record
says when and at which code that was measured). Every log line says how many seconds after the start it was written.
Sections, in the default order of what they are worth:

1. `environment`: device, driver, library versions, the code version (git commit; `NTKM_GIT_COMMIT` where the
   checkout has no `.git`, as on the device machine).
2. `engine`: the batched engine against the per-network loop on the device: one network's training epoch
   (`empirics.nets.train.train`) at every width of the paper (n = 5,000, MNIST's and CIFAR-10's input dimension), and
   the stacked epoch of the 100 networks of one NTK-distance sweep (2 models x 5 widths x 10 seeds,
   `empirics.nets.engine.train_many`) and of 100 networks at the widest width; the ratio of a stacked epoch to one
   network's epoch, networks x epochs per second, the achieved FLOP/s against a measured GEMM rate, and the
   agreement of the stack with the loop (weights, epochs) on a short training of the same networks; the sweep again
   with each of the engine's options (`ENGINE_VARIANTS`: CUDA graphs, fused Adam, TF32) and its distance from the
   default's weights; and each stacked epoch's floor (`benchmarks.roofline`: products at the GEMM rate plus the
   optimiser's traffic at the measured copy bandwidth), which says whether the 3x target is attainable at all.
3. `primitives`: the device's prices for the cost model (`verify.costs.Analytic` constants: seconds per
   optimiser step of a stack, per multiply-add, per kernel entry, per solve and eigendecomposition flop), fitted
   from the engine section and a timed empirical NTK; with them the paper and gpu presets' estimated time.
4. `agreement`: `verify claims --preset smoke` on the CPU and on the device: every claim's verdict and every
   number of every unit type (NTK distance, flips, landscape, retraining, ...) compared within float32 tolerance.
5. `quick`: `verify claims --preset quick --device DEVICE` end to end, its wall time and its verdicts beside the
   recorded CPU run (`results/claims-quick.json`); resumed from its cache when the budget ran out.
6. `refit_stack`: the audit's warm re-fits of the ResNet-18 (1,000 CIFAR-10 images, 8 re-fits of 900, one epoch)
   stacked (`torch.func.vmap`, `--refit-stack on`, a 32 GiB stack) against one at a time on the device, with the
   agreement of their test logits (`benchmarks.bench_refit_stack`): what `--refit-stack auto` (stack on CUDA) rests
   on. The audit below runs at the default `--max-memory-gb` (2 GiB), under which two stacked copies of this model do
   not fit, so it re-fits one at a time; this section says what stacking would change.
7. `audit`: `verify audit --device DEVICE` of the README's ResNet-18 (trained here on 1,000 CIFAR-10 images with
   the recipe of `benchmarks.audit_tables`; on CUDA with `RESNET_GPU_FINETUNE` epochs more at the re-fits' rate, so
   that the audit's control re-fit keeps its fit, and at the audit's default options but the re-fit rate,
   `RESNET_AUDIT_GPU`; no library peers: they are not installed on the device machine) with every panel: wall time,
   the re-fit path (stacked or not), the validity verdict and the risk level.
8. `gpu_preset`: as much of `verify claims --preset gpu` as the rest of the budget holds, cached (`--resume`).

`--smoke` shrinks every size so the script runs on a 2-core CPU in under 3 minutes (tested in CI, so it cannot
rot): the engine at n = 200, widths 16 and 64; agreement and end to end on a few smoke claims; no gpu preset.
Each section records its status ("ok", "failed: <error>", "skipped: <why>") and its wall time; a failed section
does not stop the others. Exit code 0 when every section that ran is ok, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import device_image
from benchmarks.harness import sync_device
from benchmarks.roofline import EpochShape, Rates, epoch_floor, optimiser_passes

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("environment", "engine", "primitives", "agreement", "quick", "refit_stack", "audit", "gpu_preset")
#: Seconds each section needs at least to start (below that it is skipped and says so); the claims runs use the rest.
MIN_SECONDS = {"environment": 0, "engine": 30, "primitives": 10, "agreement": 60, "quick": 60, "refit_stack": 30,
               "audit": 60, "gpu_preset": 60}
#: Sections that start again from nothing when resumed (the audit keeps no cache, while the claims runs continue from
#: theirs): one that the budget ended in the previous run goes first in the next (`run_order`).
RESTARTS = ("audit",)
#: Seconds kept back for writing the record and ending child processes.
RESERVE_S = 20.0
#: Relative tolerance of a CPU/GPU number: float32 training, different kernels and reduction orders.
FLOAT32_TOLERANCE = 1e-3
#: The smoke claims the CPU-only (`--smoke`) run compares and runs end to end: one NTK row, one flip row.
SMOKE_ONLY = "ntk-relu-mnist,flip-mnist"


#: When the process started: every log line says how long after it was written (where a lent session's minutes went).
_T0 = time.monotonic()


def _log(msg: str) -> None:
    print(f"[gpu_check +{time.monotonic() - _T0:.1f} s] {msg}", file=sys.stderr, flush=True)


class Skipped(Exception):
    """A section that does not apply to this run (its status says why)."""


class Budget:
    """Seconds left of the run's budget."""

    def __init__(self, total_s: float):
        self.total_s = total_s
        self.t0 = time.monotonic()

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.t0) - RESERVE_S


# ---- 1. environment -------------------------------------------------------------------------------------------

def environment_section(device: str) -> dict[str, Any]:
    from benchmarks.harness import environment
    from empirics.precision import float32_math

    env = environment()
    if os.environ.get("NTKM_GIT_COMMIT"):  # the device machine's copy may carry a stale .git: the caller knows better
        env["git_commit_of_checkout"] = env.get("git_commit")
        env["git_commit"] = os.environ["NTKM_GIT_COMMIT"]
    from verify.runner import code_version

    env["code_version"] = code_version()
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env["gpu_memory_gib"] = round(props.total_memory / (1 << 30), 1)
        env["cuda_version"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        env["float32_math"] = float32_math()
    return env


# ---- 2. engine ------------------------------------------------------------------------------------------------

def _epoch_seconds(run: Callable[[int], None], device: str, e1: int, e2: int) -> float:
    """Seconds per epoch: (time of e2 epochs - time of e1 epochs) / (e2 - e1), after a warm-up call (removes the
    fixed costs: building the features, the final evaluation)."""
    run(e1)
    times = {}
    for e in (e1, e2):
        sync_device(device)
        t0 = time.perf_counter()
        run(e)
        sync_device(device)
        times[e] = time.perf_counter() - t0
    return max((times[e2] - times[e1]) / (e2 - e1), 1e-9)


@dataclass(frozen=True)
class Sweep:
    """A grid of networks to train: every kind x width x seed."""

    kinds: tuple[str, ...]
    widths: tuple[int, ...]
    seeds: range

    @property
    def networks(self) -> int:
        return len(self.kinds) * len(self.widths) * len(self.seeds)


@dataclass(frozen=True)
class EngineSizes:
    """The engine section's sizes: `n` points, the widths, seeds per kind and width, the epochs (e1, e2) compared."""

    n: int
    widths: tuple[int, ...]
    seeds: int
    epochs: tuple[int, int]


def _jobs(sweep: Sweep, x: torch.Tensor, y: torch.Tensor, epochs: int, device: str) -> list[tuple]:
    """Training jobs of every network of `sweep` on (x, y). One network is initialised per kind and width and
    copied for the other seeds (on the device: drawing 100 CIFAR-10 networks of width 4,096 on the host took most of
    the first H200 runs' engine section); the cost of a step does not depend on the values."""
    from empirics.nets.models import ModelSpec, build_model
    from empirics.nets.protocols import PAPER, protocol_config

    cfg = protocol_config(PAPER, epochs)
    seeds = sweep.seeds
    jobs = []
    for k in sweep.kinds:
        for m in sweep.widths:
            first = build_model(ModelSpec(k, x.shape[1], m, 10, seed=0), x, device=device)
            jobs += [(first if s == seeds[0] else copy.deepcopy(first), x, y, cfg, None, None, f"{k} m={m} seed {s}")
                     for s in seeds]
    return jobs


#: Operators kept in a profile (largest self time on the device, on a CPU the host's).
PROFILE_TOP = 12


def _profile(run: Callable[[], None], device: str) -> dict[str, Any]:
    """`run()` under torch's profiler: the host's and the device's total self time and the operators that took most,
    with their calls (where a stacked epoch's time goes: launches, the optimiser's passes, the allocator, products)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    try:
        with profile(activities=acts) as prof:
            run()
            sync_device(device)
        events = prof.key_averages()
    except Exception as exc:  # a profiler that cannot run here (no CUPTI) must not lose the section's timings
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "top": []}

    def dev(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", 0.0)) / 1e3 if cuda else 0.0

    top = sorted(events, key=lambda e: dev(e) if cuda else e.self_cpu_time_total, reverse=True)[:PROFILE_TOP]
    return {"host_self_ms": sum(e.self_cpu_time_total for e in events) / 1e3,
            "device_self_ms": sum(dev(e) for e in events) if cuda else None,
            "top": [{"op": e.key, "calls": e.count, "self_device_ms": dev(e) if cuda else None,
                     "self_host_ms": e.self_cpu_time_total / 1e3} for e in top]}


def _stacked_epochs(build: Callable[[int], list[tuple]], device: str, epochs: int,
                    fused_adam: bool = False, capture: bool = False) -> tuple[dict[str, Any], list[tuple]]:
    """One `train_many` of the jobs `build(epochs)` returns, its epochs timed inside the engine (`on_epoch`, the
    device synchronised at each): per stack the median of its epoch-to-epoch intervals (epoch 1, which pays the
    stack's first launches, and the building and finishing of the stacks are left out; a median also leaves out a
    loss-check epoch), and their sum, the sweep's epoch. The building of the jobs and the whole training are timed
    too, so that a slow setup shows apart from the epochs. Also the trained jobs (their weights are compared across
    the engine's variants). `fused_adam`, `capture`: the engine's options of those names."""
    from empirics.nets.engine import train_many

    t0 = time.perf_counter()
    jobs = build(epochs)
    sync_device(device)
    t1 = time.perf_counter()
    marks: list[tuple[int, float]] = []

    def clock(epoch: int) -> None:
        sync_device(device)
        marks.append((epoch, time.perf_counter()))
    train_many(jobs, label="timed stack", on_epoch=clock, fused_adam=fused_adam, capture=capture)
    sync_device(device)
    t2 = time.perf_counter()
    stacks: list[list[float]] = []
    for (e0, s0), (e1, s1) in itertools.pairwise(marks):
        if e1 == e0 + 1:
            if e0 == 1 or not stacks:
                stacks.append([])
            stacks[-1].append(s1 - s0)
    medians = [float(np.median(iv)) for iv in stacks if iv]
    return {"epoch_s": sum(medians), "stack_epoch_s": medians, "build_s": t1 - t0, "train_s": t2 - t1,
            "epochs": epochs, "method": "median epoch inside the engine, summed over stacks"}, jobs


#: The engine's options the device check times beside its default on the sweep (issue 39's target: a stacked epoch
#: of the sweep's 100 networks at most 3x one network's): torch's fused Adam kernel (one pass over W, its gradient
#: and moments instead of about eight; `empirics.nets.engine._update_fused`) and TF32 products (CUDA only;
#: `empirics.precision`), alone and together. The claims train with neither; these say what each would buy and how
#: far it moves the trained weights, so that a later change of the default is made on a measurement. "graphs": each
#: epoch of a stack captured once as a CUDA graph and replayed (`train_many(..., capture=True)`; one launch per epoch
#: instead of ~25 per optimiser step; off the GPU the same program runs uncaptured, bit-equal to the default).
ENGINE_VARIANTS: dict[str, dict[str, Any]] = {
    "graphs": {"fused_adam": False, "float32": "ieee", "capture": True},
    "fused_adam": {"fused_adam": True, "float32": "ieee", "capture": False},
    "tf32": {"fused_adam": False, "float32": "tf32", "capture": False},
    "fused_adam+tf32": {"fused_adam": True, "float32": "tf32", "capture": False}}


def _max_rel_difference(jobs: list[tuple], reference: dict[int, torch.Tensor]) -> float:
    """The largest max |W - W_ref| / max |W_ref| over the networks `reference` keeps (index: trained W, host)."""
    worst = 0.0
    for i, w_ref in reference.items():
        w = jobs[i][0].W.detach().cpu()
        worst = max(worst, float((w - w_ref).abs().max() / w_ref.abs().max().clamp_min(1e-30)))
    return worst


def _engine_variants(build: Callable[[int], list[tuple]], device: str, epochs: int, one_epoch_s: float,
                     reference: dict[int, torch.Tensor], budget: Budget) -> dict[str, Any]:
    """Each of `ENGINE_VARIANTS` on the sweep `build` makes: its stacked epoch, its ratio to one network's epoch
    `one_epoch_s`, and how far its weights after `epochs` epochs are from the default engine's (`reference`)."""
    from empirics.precision import float32_scope

    out: dict[str, Any] = {}
    for name, opts in ENGINE_VARIANTS.items():
        if opts["float32"] != "ieee" and not device.startswith("cuda"):
            out[name] = {"status": "skipped: TF32 is a CUDA mode"}
            continue
        if budget.left() < 15:
            out[name] = {"status": "skipped: budget"}
            continue
        try:
            with float32_scope(opts["float32"]):
                timed, jobs = _stacked_epochs(build, device, epochs, fused_adam=opts["fused_adam"],
                                              capture=opts["capture"])
        except Exception as exc:  # noqa: BLE001 - a variant that fails is recorded, the section goes on
            out[name] = {**opts, "status": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}
            _log(f"engine variant {name} failed: {type(exc).__name__}: {exc}")
            continue
        out[name] = {**opts, "status": "ok", "epoch_s": timed["epoch_s"], "stack_epoch_s": timed["stack_epoch_s"],
                     "ratio_to_one_network": timed["epoch_s"] / one_epoch_s,
                     "max_rel_weight_difference_to_default": _max_rel_difference(jobs, reference),
                     **({"captured": device.startswith("cuda")} if opts["capture"] else {})}
        del jobs
        _log(f"engine variant {name}: {timed['epoch_s']:.3f} s per epoch, weights within "
             f"{out[name]['max_rel_weight_difference_to_default']:.1e} of the default engine's")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def _alloc_retries(device: str) -> int:
    """CUDA's caching allocator's retries so far (a retry frees every cached block and synchronises: a stacked epoch
    that triggers them is slowed by the allocator, not by its arithmetic); 0 elsewhere."""
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if device.startswith("cuda") else 0


def _gemm_rate(device: str, n: int, d: int, m: int) -> float:
    """FLOP/s of the step's largest product (n x d times d x m, float32) on this device."""
    a = torch.rand(n, d, device=device)
    b = torch.rand(d, m, device=device)
    reps = 3 if device == "cpu" else 20
    a @ b
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync_device(device)
    return 2.0 * n * d * m * reps / (time.perf_counter() - t0)


def _engine_row(device: str, d: int, sizes: EngineSizes, budget: Budget) -> dict[str, Any]:
    """One input dimension: one network's epoch per width; the stacked sweep and 100 networks at the widest width."""
    from empirics.nets.engine import gemm_flops, stack_plan, train_many
    from empirics.nets.train import train_job

    n, widths, seeds, epochs = sizes.n, sizes.widths, sizes.seeds, sizes.epochs
    gen = torch.Generator().manual_seed(d)
    x = torch.rand(n, d, generator=gen).to(device)
    y = torch.randint(0, 10, (n,), generator=gen).to(device)
    row: dict[str, Any] = {"d": d, "one_network_epoch_s": {}}
    for m in widths:
        def one(e: int, m: int = m) -> None:
            (job,) = _jobs(Sweep(("relu",), (m,), range(1)), x, y, e, device)
            train_job(job)
        row["one_network_epoch_s"][str(m)] = _epoch_seconds(one, device, *epochs)
    _log(f"d={d}: one network's epoch {row['one_network_epoch_s']}")
    sweeps = {"sweep": Sweep(("relu", "attn"), widths, range(seeds)),
              "widest": Sweep(("relu",), (widths[-1],), range(2 * len(widths) * seeds))}
    for name, sweep in sweeps.items():
        if budget.left() < 15:
            row[name] = {"status": "skipped: budget"}
            continue

        retries0 = _alloc_retries(device)
        def build(e: int, sweep: Sweep = sweep) -> list[tuple]:
            return _jobs(sweep, x, y, e, device)
        timed, trained = _stacked_epochs(build, device, epochs[1] + 2)
        # the first network of each model and width: the variants' weights are compared with these
        reference = {i: trained[i][0].W.detach().cpu() for i in range(0, len(trained), len(sweep.seeds))}
        shapes = [(len(c), max(trained[i][0].W.shape[0] for i in c)) for c in stack_plan(trained)]
        del trained
        epoch_s, stacks = timed["epoch_s"], len(timed["stack_epoch_s"])  # one median per stack trained
        _log(f"d={d} {name}: jobs built in {timed['build_s']:.2f} s, trained in {timed['train_s']:.2f} s; stacks' "
             f"median epochs {[round(t, 4) for t in timed['stack_epoch_s']]} s")
        jobs1 = _jobs(sweep, x, y, 1, device)
        prof = _profile(lambda jobs1=jobs1, name=name: train_many(jobs1, label=f"profile {name}"), device)
        nets = sweep.networks
        work = sum(gemm_flops(1, n, 128, m, d, 10) for _ in sweep.kinds for m in sweep.widths for _ in sweep.seeds)
        row[name] = {"networks": nets, "stacks": stacks, "epoch_s": epoch_s,
                     "timing": {k: v for k, v in timed.items() if k != "epoch_s"},
                     "ratio_to_one_network": epoch_s / row["one_network_epoch_s"][str(widths[-1])],
                     "network_epochs_per_s": nets / epoch_s, "achieved_flop_s": work / epoch_s,
                     "allocator_retries": _alloc_retries(device) - retries0 if device.startswith("cuda") else None,
                     "peak_memory_gib": (torch.cuda.max_memory_allocated() / (1 << 30)
                                         if device.startswith("cuda") else None),
                     "profile_one_epoch": prof, "stack_shapes": shapes}
        _log(f"d={d} {name}: {nets} networks in {stacks} stack(s), {epoch_s:.3f} s per epoch")
        if name == "sweep":
            row[name]["variants"] = _engine_variants(build, device, epochs[1] + 2,
                                                     row["one_network_epoch_s"][str(widths[-1])], reference, budget)
    row["gemm_flop_s"] = _gemm_rate(device, n, d, widths[-1])
    row["bandwidth_b_s"] = _bandwidth(device)
    one = row["one_network_epoch_s"][str(widths[-1])]
    for name in sweeps:
        if "achieved_flop_s" in row.get(name, {}):
            row[name]["fraction_of_gemm"] = row[name]["achieved_flop_s"] / row["gemm_flop_s"]
            fl = row[name]["floor"] = _floors(row[name]["stack_shapes"], EpochShape(n, 128, d, 10),
                                              Rates(row["gemm_flop_s"], row["bandwidth_b_s"]), one,
                                              padded=device.startswith("cuda"))
            _check_floor(fl["default"], row[name]["epoch_s"])
            fused = row[name].get("variants", {}).get("fused_adam", {})
            if "epoch_s" in fused:
                _check_floor(fl["fused_adam"], fused["epoch_s"])
    return row


#: Issue 39's target for a stacked epoch of a sweep's 100 networks, in epochs of one network at the widest width.
TARGET_RATIO = 3.0


def _bandwidth(device: str) -> float:
    """Bytes per second of a large device-to-device copy (read + write), the rate W-sized passes stream at."""
    a = torch.rand(1 << (26 if device.startswith("cuda") else 24), device=device)
    b = torch.empty_like(a)
    reps = 3 if device == "cpu" else 20
    b.copy_(a)
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    sync_device(device)
    return 2.0 * a.numel() * a.element_size() * reps / (time.perf_counter() - t0)


def _floors(shapes: list[tuple[int, int]], shape: EpochShape, rates: Rates, one_epoch_s: float,
            padded: bool) -> dict[str, Any]:
    """The roofline floor of the stacks `shapes` ((networks, padded width) each; `benchmarks.roofline`) with the
    default Adam step and with the fused kernel, each as a ratio to one network's epoch and whether it leaves the
    3x target attainable at IEEE float32 (a floor above it: no tuning of the engine meets it at these rates)."""
    from empirics.nets.protocols import PAPER, protocol_config

    cfg = protocol_config(PAPER, 1)
    out: dict[str, Any] = {"target_ratio": TARGET_RATIO}
    for name, fused in (("default", False), ("fused_adam", True)):
        f = epoch_floor(shapes, shape, rates, optimiser_passes(fused, padded, cfg.weight_decay, cfg.decay))
        out[name] = {**f, "ratio_to_one_network": f["floor_s"] / one_epoch_s,
                     "target_attainable": f["floor_s"] / one_epoch_s <= TARGET_RATIO}
    return out


def _check_floor(entry: dict[str, Any], epoch_s: float) -> None:
    """Whether the measured epoch `epoch_s` is at or above the floor of its own option (a measurement below it is
    wrong, or the model is: either way the record says so)."""
    entry["measured_s"] = epoch_s
    entry["measured_at_or_above_floor"] = epoch_s >= entry["floor_s"]


def engine_section(device: str, smoke: bool, budget: Budget) -> dict[str, Any]:
    n = 200 if smoke else 5000
    widths = (16, 64) if smoke else (16, 64, 256, 1024, 4096)
    seeds = 2 if smoke else 10
    out: dict[str, Any] = {"n": n, "widths": list(widths), "seeds": seeds, "batch": 128, "rows": []}
    for d in (784,) if smoke else (784, 3072):
        if budget.left() < 20:
            out["rows"].append({"d": d, "status": "skipped: budget"})
            continue
        out["rows"].append(_engine_row(device, d, EngineSizes(n, widths, seeds, (1, 2) if smoke else (1, 3)), budget))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    out["agreement"] = _engine_agreement(device, smoke)
    return out


def _engine_agreement(device: str, smoke: bool) -> dict[str, Any]:
    """The stack (`train_many`, padded on CUDA) against the loop (`train` on copies) on the device: a short
    training of networks of two widths and both models."""
    from empirics.nets.engine import train_many
    from empirics.nets.train import train_job

    n, d = (200, 784) if smoke else (1000, 784)
    gen = torch.Generator().manual_seed(7)
    x = torch.rand(n, d, generator=gen).to(device)
    y = torch.randint(0, 10, (n,), generator=gen).to(device)
    jobs = _jobs(Sweep(("relu", "attn"), (16, 256), range(3)), x, y, 3, device)
    loop_jobs = [(copy.deepcopy(j[0]), *j[1:]) for j in jobs]
    stack_recs = train_many(jobs)
    loop_recs = [train_job(j) for j in loop_jobs]
    worst = 0.0
    for a, b in zip(jobs, loop_jobs, strict=True):
        wa, wb = a[0].W.detach(), b[0].W.detach()
        worst = max(worst, float((wa - wb).abs().max() / wb.abs().max().clamp_min(1e-30)))
    same_epochs = all(r.epochs_run == s.epochs_run for r, s in zip(stack_recs, loop_recs, strict=True))
    return {"networks": len(jobs), "epochs": 3, "max_rel_weight_difference": worst, "tolerance": FLOAT32_TOLERANCE,
            "same_epochs": same_epochs, "passed": worst <= FLOAT32_TOLERANCE and same_epochs}


# ---- 3. primitives --------------------------------------------------------------------------------------------

def primitives_section(device: str, smoke: bool, engine: dict[str, Any] | None,
                       engine_at: dict[str, Any] | None = None) -> dict[str, Any]:
    """The device's prices (`verify.costs.Analytic` constants) from the engine section (this run's, or one an earlier
    run measured, `engine_at` saying when and at which code) and a timed NTK and solve; the presets' estimated time
    with them, the networks of a unit trained as one stack (`verify.costs.plan`)."""
    from benchmarks.scale import eig_seconds_per_n3, ntk_seconds, solve_seconds
    from empirics.nets.engine import flops_per_step
    from verify import costs
    from verify.experiments import not_run_units, units_for

    if not engine or not engine.get("rows"):
        raise RuntimeError("the engine section has no measurements to price the cost model with")
    row = next(r for r in reversed(engine["rows"]) if "sweep" in r and "epoch_s" in r.get("sweep", {}))
    n, d, widths = engine["n"], row["d"], engine["widths"]
    steps = -(-n // 128)
    step = row["one_network_epoch_s"][str(widths[0])] / steps  # the narrowest network: launch-bound
    big = row.get("widest", row["sweep"])
    macs = big["networks"] * steps * flops_per_step(128, widths[-1], d, 10) / 2
    flop = max((big["epoch_s"] - steps * step) / macs, 0.0)
    n_ref = 400 if smoke else 2000
    kernel = ntk_seconds(784, n_ref, widths[-1], device) / (n_ref**2 * (784 + widths[-1]))
    n_solve = 1000 if smoke else 4000
    host_solve = solve_seconds(n_solve) / n_solve**3
    # the influence solves run where the inputs are (`empirics.attribution.influence.solve_device`): on a GPU, price the
    # GPU's
    solve = _device_solve_seconds(n_solve, device) / n_solve**3 if device != "cpu" else host_solve
    constants = {"step": step, "flop": flop, "kernel": kernel, "solve": solve, "solve_host": host_solve,
                 "eig": eig_seconds_per_n3(500 if smoke else 1500), "unit": 2.0}
    for fam in ("relu", "attn"):
        constants.update({f"step_plateau_{fam}": step, f"flop_plateau_{fam}": flop, f"flop_fullbatch_{fam}": flop})
    prim = costs.Analytic(constants, stacked=True, source="this run")
    presets = {}
    for name in ("quick", "paper", "gpu"):
        try:
            units = units_for(name, device=device)
            skipped = not_run_units(name, device=device)
        except Exception as exc:  # a preset this code version does not define
            presets[name] = {"status": f"skipped: {exc}"}
            continue
        units = {k: v for k, v in units.items() if k not in skipped}
        est = costs.plan([(u, units[u].config) for u in sorted(units)], prim)
        presets[name] = {"units": len(est), "total_s": sum(c.total_s for c in est.values()),
                         "largest_unit_s": max(c.total_s for c in est.values())}
    at = engine_at or {}
    when = f", measured {at.get('date_utc')} at code version {at.get('code_version')}" if at else ""
    return {"constants": constants, "source": f"engine section (d={d}, n={n}{when}), an empirical NTK at n={n_ref} and "
                                              f"a leave-one-out solve at n={n_solve} on this device",
            "engine_measured_at": at or None, "presets": presets}


def _device_solve_seconds(n: int, device: str) -> float:
    """One leave-one-out solve of an n x n kernel on `device` (`empirics.attribution.influence.kernel_influence` with a
    device: float64 Cholesky and inverse in torch): the faster of two calls after a warm-up call of the same size
    (the first call at a size pays the solver's one-off workspace and setup, which a unit's many solves do not)."""
    from empirics.attribution.influence import kernel_influence

    a = np.random.default_rng(0).standard_normal((n, 64))
    k, y = a @ a.T, np.ones((n, 10))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        kernel_influence(k, y, float(n), k[:100], y[:100], torch.device(device))
        times.append(time.perf_counter() - t0)
    return min(times[1:])


# ---- 4.-6. claims runs ----------------------------------------------------------------------------------------

def _claims(args: list[str], out_dir: Path, timeout_s: float, log_path: Path) -> dict[str, Any]:
    """`verify claims ARGS --out OUT_DIR --resume --no-pdf` in a child process group, ended (SIGTERM, then SIGKILL)
    when `timeout_s` runs out; what it did: finished or not, wall time, units cached."""
    cmd = [sys.executable, "-m", "verify.cli", "claims", *args, "--out", str(out_dir), "--resume", "--no-pdf"]
    env = {**os.environ, "NTKM_PROGRESS": "1", "NTKM_PROGRESS_BARS": "0", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
            ended = None
        except subprocess.TimeoutExpired:
            ended = _end_group(proc)
            rc = proc.returncode
    wall = time.monotonic() - t0
    if rc != 0 and not ended:  # the command failed by itself: the section fails with its last line
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        raise RuntimeError(f"{' '.join(cmd[3:6])} exited {rc}: {lines[-1][:300] if lines else ''} (log: {log_path})")
    cache = out_dir / "cache"
    done = len(list(cache.glob("*.json"))) if cache.is_dir() else 0
    res: dict[str, Any] = {"command": " ".join(["verify", *cmd[3:]]), "exit_code": rc, "wall_s": wall,
                           "finished": rc == 0 and (out_dir / "claims.json").exists(), "units_cached": done}
    if ended:
        res["ended_by_budget"] = ended
    return res


def _end_group(proc: subprocess.Popen) -> str:
    """SIGTERM to the child's process group; SIGKILL after 15 s. Says how it ended."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    try:
        proc.wait(timeout=15)
        return f"SIGTERM at the budget, exited {proc.returncode} after {time.monotonic() - t0:.1f} s"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "SIGTERM at the budget did not end it within 15 s; SIGKILL"


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(path, value) of every finite or non-finite number in a JSON-like tree (booleans excluded)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield prefix, float(obj)


#: Result fields that are timings or provenance, not measurements (never compared).
_NOT_COMPARED = ("wall_s", "unit_wall_s", "seconds", "time", "pid", "elapsed")


def compare_claims(a: dict[str, Any], b: dict[str, Any], tol: float = FLOAT32_TOLERANCE) -> dict[str, Any]:
    """Two claims.json records: verdicts claim by claim, and every number of every unit's result."""
    va = {c["id"]: c["verdict"] for c in a.get("claims", [])}
    vb = {c["id"]: c["verdict"] for c in b.get("claims", [])}
    differ = sorted(k for k in va.keys() & vb.keys() if va[k] != vb[k])
    units: dict[str, Any] = {}
    for name in sorted(a.get("results", {}).keys() & b.get("results", {}).keys()):
        la = dict(_leaves(a["results"][name]))
        lb = dict(_leaves(b["results"][name]))
        keys = [k for k in la.keys() & lb.keys() if not any(t in k.rsplit(".", 1)[-1] for t in _NOT_COMPARED)]
        worst, beyond = 0.0, 0
        for k in keys:
            x, y = la[k], lb[k]
            if x == y or (x != x and y != y):
                continue
            rel = abs(x - y) / max(abs(x), abs(y), 1e-12)
            worst = max(worst, rel)
            beyond += rel > tol
        units[name] = {"numbers": len(keys), "beyond_tolerance": beyond, "max_rel_difference": worst}
    return {"claims_compared": len(va.keys() & vb.keys()), "verdicts_equal": len(va.keys() & vb.keys()) - len(differ),
            "verdicts_differ": {k: [va[k], vb[k]] for k in differ}, "tolerance": tol, "units": units,
            "numbers_beyond_tolerance": sum(u["beyond_tolerance"] for u in units.values()),
            "numbers_compared": sum(u["numbers"] for u in units.values())}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def agreement_section(device: str, smoke: bool, budget: Budget, state: Path, jobs: int) -> dict[str, Any]:
    only = ["--only", SMOKE_ONLY] if smoke else []
    runs = {}
    for dev in ("cpu", device) if device != "cpu" else ("cpu",):
        left = budget.left()
        if left < 20:
            runs[dev] = {"status": "skipped: budget"}
            continue
        runs[dev] = _claims(["--preset", "smoke", "--device", dev, "--jobs", str(jobs), *only],
                            state / f"smoke-{dev}", left, state / f"smoke-{dev}.log")
        _log(f"smoke on {dev}: {runs[dev]}")
    out: dict[str, Any] = {"runs": runs}
    a, b = _read(state / "smoke-cpu" / "claims.json"), _read(state / f"smoke-{device}" / "claims.json")
    if a is not None and b is not None:
        out["comparison"] = compare_claims(a, b)
        c = out["comparison"]
        out["passed"] = not c["verdicts_differ"]
        _log(f"agreement: {c['verdicts_equal']}/{c['claims_compared']} verdicts equal, "
             f"{c['numbers_beyond_tolerance']} of {c['numbers_compared']} numbers beyond {c['tolerance']:g}")
    else:
        out["passed"] = False
    return out


def quick_section(device: str, smoke: bool, budget: Budget, state: Path, jobs: int) -> dict[str, Any]:
    preset, only = ("smoke", ["--only", SMOKE_ONLY]) if smoke else ("quick", [])
    folder = state / f"{preset}-e2e-{device}"
    res = _claims(["--preset", preset, "--device", device, "--jobs", str(jobs), *only], folder, budget.left(),
                  state / f"{preset}-e2e-{device}.log")
    res["preset"] = preset
    prev = _read(state / "quick-walls.json") or {"wall_s": []}
    prev["wall_s"].append(res["wall_s"])
    (state / "quick-walls.json").write_text(json.dumps(prev))
    res["wall_s_all_sessions"] = sum(prev["wall_s"])
    new = _read(folder / "claims.json")
    ref = _read(ROOT / "results" / "claims-quick.json") if not smoke else None
    if new is not None:
        res["summary"] = new.get("summary")
        res["run_wall_s"] = new.get("wall_s")
        if ref is not None:
            res["against_cpu_record"] = {k: v for k, v in compare_claims(ref, new).items() if k != "units"}
    return res


def refit_stack_section(device: str, smoke: bool) -> dict[str, Any]:
    """Stacked against one-at-a-time warm re-fits (`benchmarks.bench_refit_stack`): the ResNet-18 of the audit
    section (smoke: the tables' CNN on 80 images)."""
    from benchmarks.bench_refit_stack import Sizes, measure

    if smoke:
        return measure("cnn", device, Sizes(k=3, keep=70, n=80, n_test=30))
    return measure("resnet18", device, Sizes(), stack_gb=32.0 if device.startswith("cuda") else 8.0)


def audit_recipe(device: str, smoke: bool) -> Any:
    """The model and audit options of the audit section: smoke, the tables' CNN on 80 images at the smoke options; on
    CUDA, the tables' ResNet-18 trained `RESNET_GPU_FINETUNE` epochs more at the re-fits' rate and audited at
    `RESNET_AUDIT_GPU` (the audit's defaults but the re-fit rate); on a CPU, the tables' own recipe and `RESNET_AUDIT`
    (their 2-core cost compromises)."""
    from benchmarks import audit_tables as at

    if smoke:
        cnn = at.FULL["cnn"]
        return at.Recipe(cnn.name, cnn.label, cnn.dataset, at.SMOKE_N, at.SMOKE_N_TEST, 10, at.SMOKE_AUDIT)
    full = at.FULL["resnet18"]
    if device.startswith("cuda"):
        return at.Recipe(full.name, full.label, full.dataset, full.n, full.n_test, full.epochs,
                         dict(at.RESNET_AUDIT_GPU), at.RESNET_GPU_FINETUNE)
    return full


def audit_section(device: str, smoke: bool, budget: Budget, state: Path) -> dict[str, Any]:
    """Train the audit tables' ResNet-18 (smoke: their CNN on 80 images) on `device`, export it, and audit it there
    with every panel in a child process ended at the budget."""
    from benchmarks.audit_tables import _CHILD, AUDIT_DONE, build, export_program, load_images
    from benchmarks.bench_audit import train as train_adam

    r = audit_recipe(device, smoke)
    folder = state / f"audit-{r.name}-{device}"
    folder.mkdir(parents=True, exist_ok=True)
    x, y, xt, yt, source = load_images(r)
    np.savez(folder / "train.npz", x=x, y=y)
    np.savez(folder / "test.npz", x=xt, y=yt)
    model = build(r.name).to(device)
    t0 = time.perf_counter()
    train_acc = train_adam(model, torch.as_tensor(x, device=device), torch.as_tensor(y, device=device).long(),
                           epochs=r.epochs, finetune_epochs=r.finetune_epochs)
    train_s = time.perf_counter() - t0
    model = model.cpu()
    export_program(model, torch.as_tensor(x[:4]), folder / "model.pt2")
    cfg = {"model": str(folder / "model.pt2"), "train": str(folder / "train.npz"), "test": str(folder / "test.npz"),
           "n": r.n, "n_test": r.n_test, **r.audit, "peers": [], "device": device}
    out = folder / "audit.pdf"
    log_path = state / f"audit-{r.name}-{device}.log"
    env = {**os.environ, "NTKM_THREADS": "2" if device == "cpu" else "4"}
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg), str(out)], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, ended = proc.wait(timeout=max(1.0, budget.left())), None
        except subprocess.TimeoutExpired:
            ended = _end_group(proc)
            rc = proc.returncode
    res: dict[str, Any] = {"model": r.label, "parameters": sum(p.numel() for p in model.parameters()),
                           "data": source, "n": r.n, "n_test": r.n_test, "train_epochs": r.epochs,
                           "finetune_epochs": r.finetune_epochs, "train_s": train_s, "train_accuracy": train_acc,
                           "options": cfg, "exit_code": rc,
                           "wall_s": time.monotonic() - t0, "finished": rc in AUDIT_DONE}
    if ended:  # where it had got to: the audit keeps no cache, so this is all a next session learns of the run
        res["ended_by_budget"] = ended
        res["log_tail"] = [ln[:200] for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-8:]
    rec = _read(out.with_suffix(".json")) if res["finished"] else None
    if rec is not None:
        panels = rec.get("panels", {})
        res.update(risk=rec.get("risk", {}).get("level"), device_used=rec.get("device", {}).get("used"),
                   refit_path=panels.get("refit", {}).get("path"),
                   validity=panels.get("validity", {}).get("verdict"), timings=rec.get("timings"))
    elif not ended:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        raise RuntimeError(f"the audit exited {rc}: {lines[-1][:300] if lines else ''} (log: {log_path})")
    return res


def gpu_preset_section(device: str, smoke: bool, budget: Budget, state: Path, jobs: int) -> dict[str, Any]:
    from verify.presets import PRESETS

    if smoke:
        raise Skipped("--smoke")
    if "gpu" not in PRESETS:
        raise Skipped("this code version defines no gpu preset")
    folder = state / f"gpu-{device}"
    res = _claims(["--preset", "gpu", "--device", device, "--jobs", str(jobs)], folder, budget.left(),
                  state / f"gpu-{device}.log")
    from verify.experiments import units_for

    res["units_total"] = len([u for u in units_for("gpu", device=device)])
    return res


# ---- the record -----------------------------------------------------------------------------------------------

def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 100 else f"{s:.3g} s"


def markdown(rec: dict[str, Any]) -> str:
    env = rec["sections"].get("environment", {}).get("result", {})
    lines = [f"# Device check on {rec['device']} ({env.get('gpu', '?')})", "",
             f"{env.get('date_utc', '?')}; commit {env.get('git_commit')}; torch "
             f"{env.get('versions', {}).get('torch', '?')}, CUDA {env.get('cuda_version', '-')}; budget "
             f"{rec['budget_s']:.0f} s{' (smoke sizes)' if rec['smoke'] else ''}.", "",
             "| section | status | wall |", "|---|---|---|"]
    for s in SECTIONS:
        sec = rec["sections"].get(s, {})
        lines.append(f"| {s} | {sec.get('status', 'not run')} | {_fmt_s(sec.get('wall_s'))} |")
    eng = rec["sections"].get("engine", {}).get("result")
    if eng:
        lines += ["", f"Engine, n = {eng['n']}, batch 128:", "",
                  "| d | one network's epoch (per width) | stacked sweep epoch (networks, stacks) | ratio | "
                  "100 at widest | ratio | fraction of GEMM |", "|---|---|---|---|---|---|---|"]
        for r in eng["rows"]:
            if "one_network_epoch_s" not in r:
                continue
            one = ", ".join(f"m={m}: {v * 1e3:.1f} ms" for m, v in r["one_network_epoch_s"].items())
            sw, wd = r.get("sweep", {}), r.get("widest", {})
            lines.append(f"| {r['d']} | {one} | {_fmt_s(sw.get('epoch_s'))} ({sw.get('networks')}, {sw.get('stacks')})"
                         f" | {sw.get('ratio_to_one_network', float('nan')):.2f} | {_fmt_s(wd.get('epoch_s'))} | "
                         f"{wd.get('ratio_to_one_network', float('nan')):.2f} | "
                         f"{wd.get('fraction_of_gemm', float('nan')):.2f} |")
        profiles = []
        for r in eng["rows"]:
            for name in ("sweep", "widest"):
                prof = r.get(name, {}).get("profile_one_epoch")
                if not prof or not prof.get("top"):
                    continue
                where = "device" if prof.get("device_self_ms") is not None else "host"
                total = prof.get(f"{where}_self_ms") or 0.0
                tops = ", ".join(f"{t['op']} {t[f'self_{where}_ms']:.1f} ms ({t['calls']} calls)"
                                 for t in prof["top"][:4])
                profiles.append(f"Profile of one epoch, d = {r['d']}, {name} ({where} self time {total:.1f} ms, "
                                f"allocator retries {r[name].get('allocator_retries')}): {tops}.")
        lines += ["", *profiles] if profiles else []
        floors = []
        for r in eng["rows"]:
            for name in ("sweep", "widest"):
                fl = r.get(name, {}).get("floor")
                if fl:
                    de, fu = fl["default"], fl["fused_adam"]
                    floors.append(
                        f"Floor of the {name} epoch, d = {r['d']} (products at {r['gemm_flop_s'] / 1e12:.1f} TFLOP/s, "
                        f"optimiser traffic at {r['bandwidth_b_s'] / 1e9:.0f} GB/s): default Adam "
                        f"{_fmt_s(de['floor_s'])} ({de['ratio_to_one_network']:.1f}x one network), fused "
                        f"{_fmt_s(fu['floor_s'])} ({fu['ratio_to_one_network']:.1f}x)"
                        + ("." if name != "sweep" else
                           f"; the {fl['target_ratio']:g}x target is "
                           f"{'within reach' if fu['target_attainable'] else 'below the floor even when fused'}"
                           " at IEEE float32.")
                        + ("" if de.get("measured_at_or_above_floor", True) else
                           " The measured default epoch is BELOW its floor: the measurement or the model is wrong."))
        lines += ["", *floors] if floors else []
        variants = []
        for r in eng["rows"]:
            for name, v in r.get("sweep", {}).get("variants", {}).items():
                ratio, diff = v.get("ratio_to_one_network"), v.get("max_rel_weight_difference_to_default")
                variants.append(f"| {r['d']} | {name} | {_fmt_s(v.get('epoch_s'))} | "
                                f"{'-' if ratio is None else f'{ratio:.2f}'} | {'-' if diff is None else f'{diff:.1e}'}"
                                f" | {v.get('status', 'ok')} |")
        if variants:
            lines += ["", "Engine options on the sweep (the claims use none of them):", "",
                      "| d | option | stacked sweep epoch | ratio | weights vs default (max rel.) | status |",
                      "|---|---|---|---|---|---|", *variants]
        ag = eng.get("agreement", {})
        lines += ["", f"Stack against loop on {rec['device']}: max relative weight difference "
                      f"{ag.get('max_rel_weight_difference', float('nan')):.2e}, same epochs {ag.get('same_epochs')}."]
    prim = rec["sections"].get("primitives", {}).get("result")
    if prim:
        lines += ["", "Cost model priced with this device (networks of a unit stacked): " + "; ".join(
            f"{k} {_fmt_s(v.get('total_s'))} ({v.get('units')} units, largest {_fmt_s(v.get('largest_unit_s'))})"
            for k, v in prim["presets"].items() if "total_s" in v)]
    agr = rec["sections"].get("agreement", {}).get("result", {}).get("comparison")
    if agr:
        lines += ["", f"Smoke preset, CPU against {rec['device']}: {agr['verdicts_equal']} of {agr['claims_compared']}"
                      f" verdicts equal; {agr['numbers_beyond_tolerance']} of {agr['numbers_compared']} numbers "
                      f"beyond a relative {agr['tolerance']:g}."]
    q = rec["sections"].get("quick", {}).get("result")
    if q:
        lines += ["", f"`{q['command']}`: {'finished' if q['finished'] else 'not finished'} in {_fmt_s(q['wall_s'])}"
                      f" ({q['units_cached']} units cached)."]
        cmp_ = q.get("against_cpu_record")
        if cmp_:
            lines.append(f"Verdicts against the recorded CPU run: {cmp_['verdicts_equal']} of "
                         f"{cmp_['claims_compared']} equal; differ: {cmp_['verdicts_differ'] or 'none'}.")
    rs = rec["sections"].get("refit_stack", {}).get("result")
    if rs:
        lines += ["", f"Audit re-fits of {rs['model']} on {rec['device']} ({rs['k']} warm re-fits of {rs['keep']} "
                      f"images, {rs['epochs']} epoch): one at a time {_fmt_s(rs['off_s_per_refit'])}, stacked "
                      f"{_fmt_s(rs['on_s_per_refit'])} per re-fit ({rs['speedup_stacked']:.2f}x, "
                      f"{'stacked' if rs['stacked'] else 'NOT stacked: ' + rs['stacked_path']['reason']}); test "
                      f"logits within {rs['max_rel_diff']:.1e} (relative)."]
    a = rec["sections"].get("audit", {}).get("result")
    if a:
        lines += ["", f"`verify audit --device {rec['device']}` of {a['model']} ({a['parameters']:,} parameters, "
                      f"{a['n']} training images, trained {a['train_epochs']} epochs in {_fmt_s(a['train_s'])}): "
                      f"{'finished' if a['finished'] else 'not finished'} in {_fmt_s(a['wall_s'])}; risk "
                      f"{a.get('risk')}, validity {a.get('validity')}, re-fits {a.get('refit_path')}."]
    g = rec["sections"].get("gpu_preset", {}).get("result")
    if g and "units_cached" in g:
        lines += ["", f"`{g['command']}`: {g['units_cached']} of {g.get('units_total')} units cached after "
                      f"{_fmt_s(g['wall_s'])}."]
    return "\n".join(lines) + "\n"


def _commit() -> str | None:
    from benchmarks.harness import _git_commit

    return _git_commit()


def _code_version() -> str:
    from verify.runner import code_version

    return code_version()


def _now() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def pack(state: Path, target: Path) -> None:
    """The state folder's JSON files (state, claims caches and records; no logs, no lock files) as a .tar.gz."""
    import tarfile

    tmp = target.with_name(f".{target.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(state.rglob("*.json")):
            tar.add(path, arcname=path.relative_to(state).as_posix())
    tmp.replace(target)


def unpack(archive: Path, state: Path) -> None:
    """A `pack` archive into `state`: regular files only, every path inside the folder (tarfile's 'data' filter)."""
    import tarfile

    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(state, filter="data")


def _write(rec: dict[str, Any], json_path: Path, md_path: Path) -> None:
    from ntkm.io import atomic_write_text

    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(rec, indent=1, default=str))
    atomic_write_text(md_path, markdown(rec))


def _stamp_unstamped(sections: dict[str, Any]) -> None:
    """Sections kept from a record older than the `measured_at` stamps: stamped with that record's environment (the
    run that measured them), so that a later section built on them says when and at which code they were measured."""
    env = sections.get("environment", {}).get("result", {})
    for name, sec in sections.items():
        if name != "environment" and sec.get("status") == "ok" and "measured_at" not in sec and env:
            sec["measured_at"] = {"git_commit": env.get("git_commit"), "code_version": env.get("code_version"),
                                  "date_utc": env.get("date_utc"), "from": "the environment of the run that kept it"}


def run_order(wanted: list[str], sections: dict[str, Any]) -> list[str]:
    """The sections to run, in the order given, except that a section of `RESTARTS` which the budget ended in the
    previous run (`sections`, the kept record) goes first: it restarts from nothing, so behind the other sections it
    would be ended again at the same point in every lent session and never finish."""
    def ended(name: str) -> bool:
        res = sections.get(name, {}).get("result") or {}
        return name in RESTARTS and bool(res.get("ended_by_budget")) and not res.get("finished")
    order = list(dict.fromkeys(wanted))
    return [s for s in order if ended(s)] + [s for s in order if not ended(s)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda (default when visible) or cpu")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop within this many seconds (default 480)")
    ap.add_argument("--json", default=None, help="the record (default: RESUME/gpu-check.json)")
    ap.add_argument("--resume", default="runs/gpu-check",
                    help="state folder: finished sections are kept, claims runs continue (default %(default)s)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU run in under 3 minutes)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes of the claims runs (default: "
                    "2 with --smoke, else min(8, cores))")
    ap.add_argument("--pack", default=None, metavar="FILE", help="at the end, write the state folder's caches "
                    "(claims caches, state.json; no logs) to FILE as .tar.gz, to carry to the next lent session")
    ap.add_argument("--unpack", default=None, metavar="FILE", help="first, unpack a --pack archive into an empty "
                    "state folder (a missing FILE is not an error: nothing to continue)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ", ".join(SECTIONS)
                    + ", run in the order given (default: all, in that order)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in wanted if s not in SECTIONS]
    if device not in ("cpu", "cuda") or bad or not args.budget_s > 0:
        print(f"benchmarks.gpu_check: error: --device must be cpu or cuda, --sections from {', '.join(SECTIONS)}, "
              "--budget-s > 0", file=sys.stderr)
        return 2
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu_check: error: --device cuda but no CUDA device is visible; use --device cpu",
              file=sys.stderr)
        return 2
    missing = device_image.missing_carried()
    if missing:
        print(f"benchmarks.gpu_check: error: cannot import {', '.join(missing)} (absent on the device image): "
              "run `python -m benchmarks.device_image wheels` where PyPI is reachable, carry .whl, and start with "
              "the command `python -m benchmarks.device_image command` prints", file=sys.stderr)
        return 2
    jobs = args.jobs or (2 if args.smoke else max(1, min(8, os.cpu_count() or 1)))
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)) if device == "cuda" else 1)
    from empirics.precision import set_float32_math

    set_float32_math()  # IEEE float32 on CUDA, as every entry point of the suite pins it (engine variants aside)
    state = Path(args.resume)
    state.mkdir(parents=True, exist_ok=True)
    if args.unpack and Path(args.unpack).is_file() and not any(state.iterdir()):
        unpack(Path(args.unpack), state)
    json_path = Path(args.json) if args.json else state / "gpu-check.json"
    md_path = json_path.with_suffix(".md")
    old = _read(state / "state.json") or {}
    rec: dict[str, Any] = {"device": device, "budget_s": args.budget_s, "smoke": args.smoke,
                           "sections": old.get("sections", {}) if old.get("smoke") == args.smoke else {}}
    _stamp_unstamped(rec["sections"])
    budget = Budget(args.budget_s)
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "environment": lambda: environment_section(device),
        "engine": lambda: engine_section(device, args.smoke, budget),
        "primitives": lambda: primitives_section(device, args.smoke, rec["sections"].get("engine", {}).get("result"),
                                                 rec["sections"].get("engine", {}).get(
                                                     "measured_at", {"code_version": "unknown (an earlier run)"})),
        "agreement": lambda: agreement_section(device, args.smoke, budget, state, jobs),
        "quick": lambda: quick_section(device, args.smoke, budget, state, jobs),
        "refit_stack": lambda: refit_stack_section(device, args.smoke),
        "audit": lambda: audit_section(device, args.smoke, budget, state),
        "gpu_preset": lambda: gpu_preset_section(device, args.smoke, budget, state, jobs),
    }
    order = run_order(wanted, rec["sections"])
    if order != list(dict.fromkeys(wanted)):
        _log(f"run order {','.join(order)}: the previous run's budget ended {order[0]}, which restarts from nothing")
    for name in order:
        prev = rec["sections"].get(name, {})
        done = prev.get("result", {})
        resumable = name in ("agreement", "quick", "audit", "gpu_preset") and not (done.get("finished")
                                                                                  or done.get("passed"))
        same_code = prev.get("measured_at", {}).get("code_version") == _code_version()
        if prev.get("status") == "ok" and name != "environment" and not resumable and same_code:
            _log(f"{name}: kept from the previous run")
            continue
        if budget.left() < MIN_SECONDS[name]:
            rec["sections"][name] = {"status": f"skipped: budget ({budget.left():.0f} s left)"}
            continue
        _log(f"{name}: start ({budget.left():.0f} s of budget left)")
        t0 = time.monotonic()
        try:
            result = runners[name]()
            rec["sections"][name] = {"status": "ok", "result": result}
        except Skipped as why:
            rec["sections"][name] = {"status": f"skipped: {why}"}
        except KeyboardInterrupt:
            rec["sections"][name] = {"status": "failed: interrupted"}
            _write(rec, json_path, md_path)
            raise
        except Exception as exc:  # a section's failure is a measurement: record it, go on with the next
            tb = traceback.format_exc().strip().splitlines()
            rec["sections"][name] = {"status": f"failed: {type(exc).__name__}: {str(exc)[:300]}",
                                     "traceback": tb[-12:]}
            _log(f"{name}: FAILED {type(exc).__name__}: {exc}")
        rec["sections"][name]["wall_s"] = time.monotonic() - t0
        rec["sections"][name]["measured_at"] = {"git_commit": os.environ.get("NTKM_GIT_COMMIT") or _commit(),
                                                "code_version": _code_version(), "date_utc": _now()}
        if device == "cuda":
            torch.cuda.empty_cache()
        (state / "state.json").write_text(json.dumps({"smoke": args.smoke, "sections": rec["sections"]},
                                                     default=str))
        _write(rec, json_path, md_path)
    rec["wall_s"] = time.monotonic() - budget.t0
    _write(rec, json_path, md_path)
    if args.pack:
        pack(state, Path(args.pack))
    print(markdown(rec))
    failed = [s for s, v in rec["sections"].items() if str(v.get("status", "")).startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
