"""`verify audit` of a ResNet-18-sized model on 1,000 CIFAR-10 images: time and peak memory, beside the exact path's
extrapolated cost.

The model is the CIFAR-10 ResNet-18 (11,173,962 parameters: 3x3 stem, four stages of two basic blocks, batch norm,
global average pooling, a linear head) written in plain torch, trained for `--train-epochs` epochs (Adam, lr 1e-3,
batch 64) on the audited images and saved as a torch.export program with a dynamic batch dimension. The data are
`--n` training and `--n-test` test images of CIFAR-10 from `../shared/data` (a JPEG re-encoding of CIFAR-10, labelled
as such in the record's provenance), written as .npz files the audit reads like any user's data.

The audit runs in a child process (`verify audit`'s pipeline with `--json`, its defaults: eps 8/255, tau 0.1,
FGSM/PGD/MIM with 10 steps, 3 noise seeds, both references trained to a plateau, the projection chosen
automatically, its error measured against the exact kernel on a subsample), with the panels that re-fit an
11M-parameter network and the budget curves skipped (`--skip budget,validity,outcome,poison`; their cost is
extrapolated below from measured parts). Printed: the audit's wall time, its peak resident memory (the child's, from
`getrusage`), its stage timings, the projection and its measured error, and, beside them, the extrapolated cost of

- the exact kernel under the same memory budget (`empirics.kernels.audit_ntk.ModelJacobian`, one example's Jacobian at a
  time, measured on `--exact-examples` images, blocks recomputed as `GenericKernels` does);
- the skipped panels: the budget curves' 48 probes (from the measured attack and noise probes) and the re-fit panels'
  72 warm-start re-fits of 5 epochs (from the measured training epoch).

    python -m benchmarks.bench_audit_resnet [--n 1000] [--n-test 200] [--train-epochs 4] [--keep DIR] [--json FILE]

Target (issue 16): the audit within 10 minutes on 2 cores.

This benchmark skips the re-fit panels and the budget curves and extrapolates their cost. The audit of this
ResNet-18 with every panel really run (budget curves, validity, outcome, poison, the references and two of the
attribution libraries' estimators; the model trained until the warm-start control keeps its fit, re-fit settings
chosen for 2 cores) is `benchmarks/audit_tables.py` (`python -m benchmarks.audit_tables --models resnet18`), which
also produces the README's tables for the MLP and the CNN.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.bench_audit import train as train_mlp_style
from empirics.data.datasets import load_dataset
from empirics.kernels.audit_ntk import JacobianOptions, ModelJacobian
from empirics.records import git_state
from verify.audit.budget import EPS_GRID, TAU_GRID
from verify.audit.config import PANELS

SKIPPED = "budget,validity,outcome,poison"
#: The child process: `verify audit`'s pipeline (config, run, outputs) with the options above and every other default.
_CHILD = ("import json, sys; from verify.audit.pipeline import run_audit; "
          "from verify.audit.files import write_outputs; from verify.audit.config import AuditConfig; "
          "c = json.loads(sys.argv[1]); c['panels'] = tuple(c['panels']); "
          "sys.exit(write_outputs(run_audit(AuditConfig(**c)), sys.argv[2], json_out=True))")
#: Re-fits of the validity, outcome and poison panels at the audit's defaults (24 LDS subsets x 2 seeds, top-lever
#: removal and brittleness, 3-seed outcome table, poison self-test; counted by benchmarks/bench_audit.py).
REFITS = 72
REFIT_EPOCHS = 5


class Block(nn.Module):
    """A basic residual block (two 3x3 convolutions with batch norm, projection shortcut when needed)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c_out)
        self.short = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs and 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, c_in = [], 64
        for c_out, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
            blocks.append(Block(c_in, c_out, stride))
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int) -> tuple[float, float]:
    """`benchmarks.bench_audit.train` (Adam, lr 1e-3, batch 64), timed; returns (train accuracy, seconds per epoch).
    Batch norm trains in training mode; the accuracy is the evaluation-mode model's."""
    tic = time.perf_counter()
    model.train()
    acc = train_mlp_style(model, x, y, epochs=epochs) if epochs > 0 else float("nan")
    model.eval()
    if epochs == 0:
        with torch.no_grad():
            acc = float(torch.cat([model(x[i:i + 256]).argmax(1) for i in range(0, len(x), 256)]).eq(y).float().mean())
    return acc, (time.perf_counter() - tic) / max(1, epochs)


def exact_cost(model: nn.Module, x: torch.Tensor, n: int, n_test: int, max_gb: float, examples: int) -> dict:
    """The exact kernel path's cost, extrapolated from `examples` measured per-example Jacobians."""
    jac = ModelJacobian(model, (3, 32, 32), options=JacobianOptions(progress=False))
    per = jac.bytes_per_example()
    tic = time.perf_counter()
    jac.features(x[:examples])
    t_jac = (time.perf_counter() - tic) / examples
    budget = int(max_gb * 2**30)
    chunk = max(1, budget // (2 * per))
    blocks = -(-n // chunk)
    seconds = (n * blocks + n_test * blocks) * t_jac
    return {"per_example_mib": per / 2**20, "per_example_s": t_jac, "all_jacobians_gib": (n + n_test) * per / 2**30,
            "chunk": chunk, "recomputed": blocks, "extrapolated_s": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="training images (default: %(default)s)")
    ap.add_argument("--n-test", type=int, default=200, help="test images (default: %(default)s)")
    ap.add_argument("--train-epochs", type=int, default=4, help="epochs of training before the audit (default: 4)")
    ap.add_argument("--exact-examples", type=int, default=2, help="Jacobians timed for the exact path (default: 2)")
    ap.add_argument("--max-memory-gb", type=float, default=2.0, help="the audit's memory budget (default: 2)")
    ap.add_argument("--keep", default=None, help="folder to keep the model, data and report in")
    ap.add_argument("--json", default=None, help="also write the measurements as JSON")
    args = ap.parse_args(argv)
    if min(args.n, args.n_test, args.exact_examples) < 1 or args.train_epochs < 0 or args.max_memory_gb <= 0:
        sys.stderr.write("bench_audit_resnet: --n, --n-test, --exact-examples must be >= 1, --train-epochs >= 0 "
                         "and --max-memory-gb > 0\n")
        return 2
    torch.manual_seed(0)
    ds = load_dataset("cifar10", n_train=args.n, n_test=args.n_test)
    x = torch.as_tensor(ds.x_train).reshape(-1, 3, 32, 32)
    y = torch.as_tensor(ds.y_train).long()
    model = ResNet18()
    acc, per_epoch = train(model, x, y, args.train_epochs)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: ResNet-18, {n_params:,} parameters, {args.train_epochs} epoch(s) of training ({per_epoch:.0f} s "
          f"each), train accuracy {acc:.3f}; data: CIFAR-10 ({ds.provenance.get('source', 'cifar10')}), "
          f"{len(x)} train / {len(ds.x_test)} test", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "train.npz", x=ds.x_train.reshape(-1, 3, 32, 32), y=ds.y_train)
        np.savez(folder / "test.npz", x=ds.x_test.reshape(-1, 3, 32, 32), y=ds.y_test)
        path = folder / "resnet18.pt2"
        ep = torch.export.export(model, (x[:4],), dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))
        torch.export.save(ep, str(path))
        out = folder / "audit-resnet18.pdf"
        cfg = {"model": str(path), "train": str(folder / "train.npz"), "test": str(folder / "test.npz"),
               "n": args.n, "n_test": args.n_test, "max_memory_gb": args.max_memory_gb,
               "panels": [p for p in PANELS if p not in SKIPPED.split(",")]}
        cmd = [sys.executable, "-c", _CHILD, json.dumps(cfg), str(out)]
        tic = time.perf_counter()
        code = subprocess.run(cmd, check=False).returncode
        wall = time.perf_counter() - tic
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        if code not in (0, 3, 4):
            sys.stderr.write(f"bench_audit_resnet: the audit exited {code}\n")
            return 1
        rec = json.loads(out.with_suffix(".json").read_text())
    exact = exact_cost(model.eval(), x.reshape(len(x), -1), args.n, args.n_test, args.max_memory_gb,
                       args.exact_examples)
    row = summary(rec, wall, peak, exact, per_epoch, n_params)
    width = max(len(a) for a in row)
    print(f"| {'ResNet-18 on CIFAR-10, 2 cores':<{width}} | |")
    print(f"|{'-' * (width + 2)}|---|")
    for a, b in row.items():
        print(f"| {a:<{width}} | {b} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": row, "git": git_state(), "config": vars(args),
                                               "data": rec["data"], "model_train_accuracy": acc,
                                               "created": rec["created"], "timings": rec["timings"],
                                               "exact": exact, "memory": rec.get("memory"),
                                               "user_timings": rec["models"]["user"]["timings"],
                                               "projection": rec["model"].get("projection"),
                                               "versions": rec["versions"]}, indent=1))
    return 0


def _min(s: float) -> str:
    return f"{s:.0f} s ({s / 60:.1f} min)" if s < 3600 else f"{s / 3600:.1f} h"


def summary(rec: dict, wall: float, peak: float, exact: dict, per_epoch: float, n_params: int) -> dict[str, str]:
    """The printed rows: measured audit, projection error, and the extrapolated exact and skipped parts."""
    user = rec["models"]["user"]
    ut = user["timings"]
    tm = rec["timings"]
    proj = rec["model"].get("projection") or {}
    err = proj.get("error", {})
    n_attacks = len(rec["config"]["attacks"])
    noise_probe = ut["baseline"] / max(1, rec["config"]["baseline_seeds"])
    attack_probe = max(noise_probe, (ut["attacks"] - noise_probe) / max(1, n_attacks - 1))
    probes_attack = len(EPS_GRID) + len(TAU_GRID)
    probes_noise = probes_attack * rec["config"]["baseline_seeds"]
    budget = probes_attack * attack_probe + probes_noise * noise_probe
    refits = REFITS * REFIT_EPOCHS * per_epoch
    refs = sum(tm.get(k, 0.0) for k in ("train relu", "relu", "train attn", "attn"))
    return {
        "parameters": f"{n_params:,}",
        "kernel path": rec["model"]["kernel_method"],
        "audit wall time (child process, panels skipped: " + SKIPPED + ")": _min(wall),
        "peak resident memory of the audit": f"{peak:.2f} GiB",
        "  peak after each stage of your model": ", ".join(
            f"{k} {v:.2f}" for k, v in user.get("peak_rss_gib_after", {}).items()) + " GiB",
        "  peak after each stage of the audit": ", ".join(
            f"{k} {v:.2f}" for k, v in rec.get("memory", {}).get("peak_rss_gib_after_stage", {}).items()) + " GiB",
        "  your model: kernel (train + test)": _min(ut["kernel"]),
        "  your model: FGSM/PGD/MIM on the top 10% + kernel rows": _min(ut["attacks"]),
        "  your model: noise baseline (3 seeds)": _min(ut["baseline"]),
        "  your model: sharpness": f"{_min(ut['sharpness'])} on {user['sharpness'].get('points', '?')} of "
                                   f"{user['sharpness'].get('of', '?')} points",
        "  projection error check (exact on a subsample)": _min(tm.get("projection error", 0.0)),
        "  references (2L-ReLU, MLP-Attn: train + measure)": _min(refs),
        "projection": f"{proj.get('structure', '?')}, target {proj.get('dim')}, {proj.get('width', '?')} features "
                      "per output",
        "projection error (kernel entries, train / test-train)": (
            f"{err.get('kernel_rel_error', float('nan')):.3f} / {err.get('test_kernel_rel_error', float('nan')):.3f}"
            f" on {err.get('n', '?')} + {err.get('n_test', '?')} points"),
        "influence rank correlation, projected vs exact": f"{err.get('influence_spearman', float('nan')):.3f}",
        "risk level": rec["risk"]["level"],
        "exact kernel path (extrapolated)": (
            f"{_min(exact['extrapolated_s'])}: {exact['per_example_mib']:.0f} MiB and {exact['per_example_s']:.2f} s "
            f"per example Jacobian, all {rec['data']['n_train'] + rec['data']['n_test']} need "
            f"{exact['all_jacobians_gib']:.0f} GiB, so blocks of {exact['chunk']} recomputed {exact['recomputed']}x"),
        "skipped: budget curves (extrapolated)": (
            f"{_min(budget)} ({probes_attack} attack probes of about {attack_probe:.0f} s, {probes_noise} noise probes "
            f"of about {noise_probe:.0f} s)"),
        "skipped: re-fit panels (extrapolated)": (
            f"{_min(refits)} ({REFITS} warm-start re-fits x {REFIT_EPOCHS} epochs x {per_epoch:.0f} s per epoch)"
            if per_epoch > 0 else "not measured (--train-epochs 0 times no epoch)"),
    }


if __name__ == "__main__":
    sys.exit(main())
