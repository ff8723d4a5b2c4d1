"""The paper preset at scale: what each `verify claims --preset paper` unit costs on this machine.

    python -m benchmarks.scale                       # CPU: measured primitives, per-unit estimates (~3 min)
    python -m benchmarks.scale --device cuda         # the same on a GPU, after a CPU/GPU agreement check
    python -m benchmarks.scale --json runs/scale.json --markdown runs/scale.md

Running every paper unit takes days on a 2-core CPU, so this measures the primitives a unit is made of at
the paper's sizes and adds them up per unit from the unit's own config (`verify.experiments.units_for`):

- a training epoch of each network (model, data set width d, n, width m), timed with the suite's own
  `empirics.nets.train.train` on inputs of the right shape (the cost depends only on the shapes) as the
  difference of a longer (2 to 51 epochs, about 5 s) and a 1-epoch call after a warm-up, per extra epoch; an
  adversarial-training epoch counts as
  `adv_steps + 1` epochs;
- an empirical NTK of `n` points (closed form, float64) per width, and a float64 Cholesky solve of the
  training kernel (what influence and the NTK predictor cost);
- the eigendecomposition behind kappa (`numpy.linalg.eigvalsh`), scaled as n^3 from one measured size.

A unit's estimate is its networks x epochs x epoch time plus its kernel work, counted from its config by the
suite's one cost model (`verify.costs`: each malleability measurement recomputes the kernel once per attack,
the noise baseline, intervention and eps; a landscape evaluates the loss at its interpolation points, its
grid, and its Hessian products), priced here with the primitives measured on this machine. Epochs
are the maximum: the plateau-trained protocol usually stops earlier, so the proper protocol's estimate is
an upper bound. `--validate` runs one whole paper unit (`influence-retrain:relu@paper`) and prints its
measured time beside its estimate, so the model is checked against a real unit on this machine.

With `--device cuda`, the agreement check first runs one small NTK-distance unit on the CPU and on the GPU
and compares every measured distance (float32 training, so to a relative 1e-2); the row fails otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import environment, sync_device
from verify.costs import D, networks, unit_seconds


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def epoch_seconds(kind: str, d: int, n: int, m: int, device: str) -> float:
    """Seconds per training epoch of `kind` at (d, n, m), with the suite's trainer and the paper protocol's
    batch of 128 (the plateau-trained protocol uses the same optimiser and batch; its plateau check adds one
    forward pass every 5 epochs, a few per cent)."""
    from empirics.nets.models import ModelSpec, build_model
    from empirics.nets.protocols import PAPER, protocol_config
    from empirics.nets.train import train

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=gen).to(device)
    y = torch.randint(0, 10, (n,), generator=gen).to(device)
    def call(epochs: int) -> float:
        model = build_model(ModelSpec(kind, d, m, 10, seed=0), x, device=device)
        sync_device(device)
        t0 = time.perf_counter()
        train(model, x, y, protocol_config(PAPER, epochs), (x[:200], y[:200]))
        sync_device(device)
        return time.perf_counter() - t0

    call(1)  # warm-up
    one = call(1)
    many = 2 if one > 2.0 else min(51, max(2, int(5.0 / max(one, 1e-3))))  # about 5 s of epochs, at least 2
    return max((call(many) - one) / (many - 1), 1e-6)  # the difference removes a call's setup and final evaluation


def ntk_seconds(d: int, n: int, m: int, device: str) -> float:
    """One closed-form empirical NTK of n points in float64 (2L-ReLU; MLP-Attn adds a d x d product)."""
    from empirics.kernels.ntk import empirical_ntk
    from empirics.nets.models import ModelSpec, build_model

    x = torch.rand(n, d, dtype=torch.float64, device=device)
    model = build_model(ModelSpec("relu", d, m, 10, seed=0), x, dtype=torch.float64, device=device)
    empirical_ntk(model, x[:64])
    sync_device(device)
    t0 = time.perf_counter()
    empirical_ntk(model, x)
    sync_device(device)
    return time.perf_counter() - t0


def solve_seconds(n: int) -> float:
    """A float64 Cholesky solve of an n x n kernel (numpy, as influence and the NTK predictor do)."""
    import scipy.linalg as sla

    a = np.random.default_rng(0).standard_normal((n, 64))
    k = a @ a.T + n * np.eye(n)
    t0 = time.perf_counter()
    sla.cho_solve(sla.cho_factor(k), np.ones((n, 10)))
    return time.perf_counter() - t0


def eig_seconds_per_n3(n: int = 1500) -> float:
    a = np.random.default_rng(0).standard_normal((n, n))
    t0 = time.perf_counter()
    np.linalg.eigvalsh(a @ a.T)
    return (time.perf_counter() - t0) / n**3


@dataclass
class Primitives:
    """Measured costs: epoch seconds per (model, d, n, m), NTK seconds per (d, m) at `n_ref` points,
    Cholesky solve seconds per n, and the eigendecomposition's seconds per n^3."""

    epoch: dict[tuple[str, int, int, int], float]
    ntk: dict[tuple[int, int], float]  # (d, m) -> seconds at n_ref
    n_ref: int
    solve: dict[int, float]
    eig_per_n3: float

    def epoch_s(self, kind: str, d: int, n: int, m: int, regime: str) -> float:
        """The measured epoch (a plateau-stopped one priced as a full epoch: an upper bound)."""
        return self.epoch[(kind, d, n, m)]

    def kernel(self, d: int, n: int, m: int) -> float:
        """An NTK of n points at width m: measured at (d, m) and n_ref points, scaled as n^2."""
        return self.ntk[(d, m)] * (n / self.n_ref) ** 2

    def solve_at(self, n: int) -> float:
        ref = max(self.solve)
        return self.solve[ref] * (n / ref) ** 3

    def eig(self, n: int) -> float:
        return self.eig_per_n3 * n**3

    def unit(self) -> float:
        return 0.0


def estimate_units(prim: Primitives, device: str) -> list[dict[str, Any]]:
    """Estimated seconds of every paper-preset unit, training and kernel work apart."""
    from verify.experiments import units_for

    rows = []
    for name, unit in units_for("paper").items():
        cost = unit_seconds(name, unit.config, prim)  # every network counted, as if each unit ran alone
        rows.append({"unit": name, "train_s": cost.train_s, "other_s": cost.other_s, "total_s": cost.total_s,
                     "device": device})
    return rows


def needed_epochs() -> set[tuple[str, int, int, int]]:
    """(model, d, n, m) of every network the paper preset trains."""
    from verify.experiments import units_for

    return {(net.kind, D[net.dataset], net.n, net.m) for name, unit in units_for("paper").items()
            for net in networks(name, unit.config)}


def measure_primitives(device: str) -> Primitives:
    keys = sorted(needed_epochs(), key=lambda k: (k[1], k[3], k[0], k[2]))
    epoch = {}
    for key in keys:
        kind, d, n, m = key
        epoch[key] = epoch_seconds(kind, d, n, m, device)
        _log(f"epoch {kind:<4} d={d:<5} n={n:<5} m={m:<5} {epoch[key]:8.3f} s")
    n_ref = 2000
    ntk = {}
    for d in sorted(D.values()):
        for m in sorted({k[3] for k in keys}):
            ntk[(d, m)] = ntk_seconds(d, n_ref, m, device)
    _log(f"ntk at n={n_ref}: " + ", ".join(f"d={d} m={m}: {s:.2f}s" for (d, m), s in sorted(ntk.items())))
    solve = {n: solve_seconds(n) for n in (2000, 4000)}
    return Primitives(epoch, ntk, n_ref, solve, eig_seconds_per_n3())


def agreement(device: str) -> dict[str, Any]:
    """One small NTK-distance unit on the CPU and on `device`: every distance within a relative 1e-2."""
    from empirics.experiments.distance import METRICS, DistanceConfig, run_ntk_distance
    from empirics.nets.protocols import PROPER, protocol_config

    cfg = dict(widths=(16, 64, 256), seeds=(0,), n_train=200, n_test=100, train=protocol_config(PROPER, 50))
    cpu = run_ntk_distance(DistanceConfig(**cfg, device="cpu"))
    gpu = run_ntk_distance(DistanceConfig(**cfg, device=device))
    worst = 0.0
    for kind in cpu.models:
        for a, b in zip(cpu.models[kind].runs, gpu.models[kind].runs, strict=True):
            for metric in METRICS:
                worst = max(worst, abs(a[metric] - b[metric]) / max(abs(a[metric]), 1e-12))
    return {"max_rel_difference": worst, "tolerance": 1e-2, "passed": worst <= 1e-2,
            "cpu_wall_s": cpu.wall_s, "device_wall_s": gpu.wall_s}


def validate(prim: Primitives, device: str) -> dict[str, Any]:
    """Run the whole `influence-retrain:relu@paper` unit and compare with its estimate."""
    from verify.experiments import units_for

    unit = units_for("paper", device=device if device != "cpu" else None)["influence-retrain:relu@paper"]
    t0 = time.perf_counter()
    unit.fn(**unit.config)
    measured = time.perf_counter() - t0
    est = next(r for r in estimate_units(prim, device) if r["unit"] == "influence-retrain:relu@paper")
    return {"unit": unit.name, "measured_s": measured, "estimated_s": est["total_s"],
            "ratio": measured / est["total_s"] if est["total_s"] else float("nan")}


def _h(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def markdown(rec: dict[str, Any]) -> str:
    env = rec["environment"]
    lines = [f"Paper preset on {rec['device']} ({env['cpu']}, {env['cpu_count']} cores, torch threads "
             f"{env['torch_threads']}), {env['date_utc']}; estimates from measured primitives (see "
             "benchmarks/scale.py), proper protocol at its maximum epochs (an upper bound).", ""]
    if rec.get("agreement"):
        a = rec["agreement"]
        lines += [f"CPU/GPU agreement (NTK-distance unit, n=200, widths 16-256): max relative difference "
                  f"{a['max_rel_difference']:.2e} (tolerance {a['tolerance']:g}): "
                  f"{'passed' if a['passed'] else 'FAILED'}",
                  ""]
    if rec.get("validation"):
        v = rec["validation"]
        lines += [f"Check of the model: `{v['unit']}` measured {_h(v['measured_s'])}, estimated "
                  f"{_h(v['estimated_s'])} (measured / estimated {v['ratio']:.2f}).", ""]
    lines += ["| unit | training | kernels, solves, landscape | total |", "|---|---|---|---|"]
    for r in sorted(rec["units"], key=lambda r: -r["total_s"]):
        lines.append(f"| {r['unit']} | {_h(r['train_s'])} | {_h(r['other_s'])} | {_h(r['total_s'])} |")
    tot = sum(r["total_s"] for r in rec["units"])
    lines += ["", f"Total, one unit after another: {_h(tot)}; the largest unit alone: "
              f"{_h(max(r['total_s'] for r in rec['units']))} (the least a cluster with one unit per worker needs)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--validate", action="store_true", help="also run influence-retrain:relu@paper in full")
    ap.add_argument("--json", default=None, help="write the record here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, as `verify` uses by default (NTKM_THREADS); for numpy's BLAS set "
                    "OPENBLAS_NUM_THREADS / OMP_NUM_THREADS before starting (default: %(default)s)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("benchmarks.scale: error: --device cuda but no CUDA device is visible; use --device cpu", file=sys.stderr)
        return 2
    rec: dict[str, Any] = {"device": args.device, "environment": environment()}
    if args.device.startswith("cuda"):
        rec["agreement"] = agreement(args.device)
        _log(f"agreement: {rec['agreement']}")
    t0 = time.perf_counter()
    prim = measure_primitives(args.device)
    rec["primitives"] = {"epoch_s": {"/".join(map(str, k)): v for k, v in prim.epoch.items()},
                         "ntk_s_at_n": {f"{d}/{m}": v for (d, m), v in prim.ntk.items()}, "ntk_n": prim.n_ref,
                         "solve_s": prim.solve, "eig_s_per_n3": prim.eig_per_n3,
                         "wall_s": time.perf_counter() - t0}
    rec["units"] = estimate_units(prim, args.device)
    if args.validate:
        rec["validation"] = validate(prim, args.device)
    text = markdown(rec)
    print(text)
    if args.json:
        from ntkm.codec import write_json

        write_json(args.json, rec)
    if args.markdown:
        Path(args.markdown).write_text(text)
    ok = rec.get("agreement", {}).get("passed", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
