"""The audit's sharpness (`verify.audit.sharpness.top_hessian`) on a CIFAR-10 ResNet-18: peak memory and time with one
double-backward graph over every point (`max_bytes=None`) and with chunked Hessian-vector products within the audit's
memory budget (`max_bytes = --max-memory-gb GiB`; the graph is kept within half of it).

The model is `benchmarks.bench_audit_resnet.ResNet18` (11,173,962 parameters, float32), trained `--train-epochs`
epochs on the points (Adam, lr 1e-3, batch 64; 0: random initialisation), in evaluation mode, by default exported with
torch.export and reloaded the way the audit loads it (`verify.audit.modelio.load_model`, called on flat inputs through
`FlatInput`); `--eager` keeps the plain module. The points are `--n` CIFAR-10 training images from `../shared/data`
(107: the audit's sharpness subsample for this model on 1,000 images) or, with `--random`, uniform noise images.
Each mode runs in its own child process, so that each peak resident memory (`getrusage(RUSAGE_SELF).ru_maxrss`) is
its own; printed per mode: the peak before `top_hessian` (model and data), the peak after it, wall time, products
taken, chunks, and the eigenvalue (the two agree within the power iteration's tolerance, 1e-4 relative per step).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python -m benchmarks.bench_sharpness_memory [--n 107] [--iters 20]
        [--max-memory-gb 2] [--train-epochs 1] [--eager] [--random] [--modes none,budget] [--json FILE]
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

import torch

from verify.audit.config import AuditConfig


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _rss_gib() -> float:
    """Resident memory now (Linux `/proc/self/statm`; the peak where that is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return _peak_gib()
    return pages * resource.getpagesize() / 2**30


def prepare(args: argparse.Namespace, folder: Path) -> None:
    """The model (trained, exported, saved) and the points, written to `folder` for the children."""
    from benchmarks.bench_audit_resnet import ResNet18, train

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.random:
        gen = torch.Generator().manual_seed(args.seed)
        x, y = torch.rand(args.n, 3, 32, 32, generator=gen), torch.randint(0, 10, (args.n,), generator=gen)
    else:
        from empirics.data.datasets import DataRequest, load_dataset

        ds = load_dataset("cifar10", n_train=args.n, n_test=10, request=DataRequest(seed=args.seed))
        x, y = torch.as_tensor(ds.x_train).reshape(-1, 3, 32, 32).float(), torch.as_tensor(ds.y_train).long()
    model = ResNet18()
    acc, _ = train(model, x, y, args.train_epochs)
    model.eval()
    torch.save({"x": x, "y": y, "state": model.state_dict(), "train_acc": acc}, folder / "points.pt")
    ep = torch.export.export(model, (x[:4],), dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))
    torch.export.save(ep, str(folder / "resnet18.pt2"))


def _load(args: argparse.Namespace, folder: Path) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model as the audit calls it (on flat inputs) and the points, from `prepare`'s files."""
    from benchmarks.bench_audit_resnet import ResNet18
    from verify.audit.modelio import FlatInput, load_model

    saved = torch.load(folder / "points.pt", weights_only=True)
    x, y = saved["x"], saved["y"]
    if args.eager:
        model = ResNet18()
        model.load_state_dict(saved["state"])
        return FlatInput(model.eval(), (3, 32, 32)), x.reshape(len(x), -1), y
    loaded = load_model(folder / "resnet18.pt2")
    return FlatInput(loaded.module, (3, 32, 32), loaded.static_batch), x.reshape(len(x), -1), y


def child(args: argparse.Namespace) -> dict:
    from verify.audit.sharpness import HvpOptions, top_hessian

    torch.set_num_threads(1)
    model, x, y = _load(args, Path(args.folder))
    before, rss = _peak_gib(), _rss_gib()
    max_bytes = None if args.child == "none" else int(args.max_memory_gb * 2**30)
    tic = time.perf_counter()
    r = top_hessian(model, x, y, args.iters, args.seed, HvpOptions(max_bytes=max_bytes))
    wall = time.perf_counter() - tic
    return {"mode": args.child, "max_bytes": max_bytes, "peak_before_gib": before, "rss_before_gib": rss,
            "peak_gib": _peak_gib(), "wall_s": wall, "value": r["value"], "iters": r["iters"],
            "residual": r["residual"], "chunks": r["chunks"], "points_per_chunk": r["points_per_chunk"],
            "graph_mib_per_point": (r.get("graph_bytes_per_point") or float("nan")) / 2**20,
            "loss": r["loss"], "hvp": r["hvp"], "parameters": sum(p.numel() for p in model.parameters())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=107, help="points (default: %(default)s)")
    ap.add_argument("--iters", type=int, default=AuditConfig.hessian_iters,
                    help="power-iteration products at most (default: the audit's, %(default)s)")
    ap.add_argument("--max-memory-gb", type=float, default=AuditConfig.max_memory_gb,
                    help="the audit's memory budget (default: %(default)s)")
    ap.add_argument("--train-epochs", type=int, default=1, help="epochs of training first (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="the plain module, not the exported program")
    ap.add_argument("--random", action="store_true", help="noise images instead of CIFAR-10")
    ap.add_argument("--modes", default="none,budget", help="none (one graph), budget (max_bytes); comma-separated")
    ap.add_argument("--json", default=None, help="also write the measurements as JSON")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "prepare":
        prepare(args, Path(args.folder))
        return 0
    if args.child:
        print(json.dumps(child(args)))
        return 0
    own = [f"--n={args.n}", f"--iters={args.iters}", f"--max-memory-gb={args.max_memory_gb}",
           f"--train-epochs={args.train_epochs}", f"--seed={args.seed}",
           *(["--eager"] if args.eager else []), *(["--random"] if args.random else [])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, "-m", "benchmarks.bench_sharpness_memory", *own, "--folder", tmp]
        subprocess.run([*base, "--child", "prepare"], check=True)
        for mode in args.modes.split(","):
            out = subprocess.run([*base, "--child", mode], check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{mode:>6}: peak {r['peak_gib']:.2f} GiB, {r['peak_gib'] - r['rss_before_gib']:.2f} GiB above the "
                  f"{r['rss_before_gib']:.2f} GiB resident before (model and data; peak before "
                  f"{r['peak_before_gib']:.2f}); {r['wall_s']:.0f} s, {r['iters']} products, {r['chunks']} chunk(s) "
                  f"of {r['points_per_chunk']}, lambda_max {r['value']:.6g} (residual {r['residual']:.2g}), "
                  f"loss {r['loss']:.4f}, graph {r['graph_mib_per_point']:.2f} MiB/point saved", flush=True)
    if len(rows) == 2:
        a, b = rows
        print(f"eigenvalues differ by {abs(a['value'] - b['value']) / abs(a['value']):.2g} (relative); time x"
              f"{b['wall_s'] / a['wall_s']:.2f}, peak {b['peak_gib'] - a['peak_gib']:+.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": {k: v for k, v in vars(args).items() if k != "child"},
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
