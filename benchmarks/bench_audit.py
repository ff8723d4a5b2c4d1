"""Time `verify audit` end to end on a ~1M-parameter model and 1,000 training points.

The model is a plain-PyTorch MLP 784-1024-256-10 (1,068,810 parameters) trained for a few epochs
outside the suite, saved as a torch.export program and as TorchScript; the data are 1,000 MNIST
training and 200 test images (the full IDX files when found, else the bundled 600-image sample
repeated with fresh noise, which changes nothing about the cost). Each format is audited with the
defaults (eps 0.3, tau 0.1, FGSM/PGD/MIM with 10 steps, 3 random-noise seeds, both references at
width 512 for 20 epochs) and a small table of stage timings is printed. Target: at most 3 minutes
per audit on a 2-core CPU.

    python benchmarks/bench_audit.py [--formats export,torchscript] [--n 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from empirics.datasets import load_dataset
from theory.errors import UserInputError
from verify.cli import main as verify_main


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def data(n: int, n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        ds = load_dataset("mnist", n_train=n, n_test=n_test, source="full")
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test, "MNIST (full IDX files)"
    except UserInputError:
        ds = load_dataset("mnist", n_train=600, n_test=min(n_test, 200), source="bundled")
        rng = np.random.default_rng(0)
        idx = rng.integers(0, 600, size=n)
        x = np.clip(ds.x_train[idx] + rng.normal(0, 0.02, (n, 784)).astype(np.float32), 0, 1)
        return x, ds.y_train[idx], ds.x_test, ds.y_test, "bundled MNIST sample, resampled with noise"


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 3) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 64):
            b = perm[i:i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def save(model: nn.Module, fmt: str, folder: Path) -> Path:
    example = torch.rand(4, 1, 28, 28)
    if fmt == "export":
        path = folder / "mlp.pt2"
        ep = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(ep, str(path))
    else:
        path = folder / "mlp.ts"
        torch.jit.script(model).save(str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="export,torchscript")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--keep", default=None, help="folder to keep the reports in (default: a temporary one)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    x, y, xt, yt, source = data(args.n, args.n_test)
    model = mlp()
    acc = train(model, torch.as_tensor(x).reshape(-1, 1, 28, 28), torch.as_tensor(y))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: MLP 784-1024-256-10, {n_params:,} parameters, train accuracy {acc:.3f}; data: {source}, "
          f"{len(x)} train / {len(xt)} test; torch threads {torch.get_num_threads()}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "train.npz", x=x.reshape(-1, 1, 28, 28), y=y)
        np.savez(folder / "test.npz", x=xt.reshape(-1, 1, 28, 28), y=yt)
        for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
            path = save(model, fmt, folder)
            out = folder / f"audit-{fmt}.pdf"
            t0 = time.perf_counter()
            code = verify_main(["audit", "--model", str(path), "--train", str(folder / "train.npz"), "--test",
                                str(folder / "test.npz"), "--n", str(args.n), "--n-test", str(args.n_test),
                                "--out", str(out), "--json"])
            wall = time.perf_counter() - t0
            rec = json.loads(out.with_suffix(".json").read_text())
            tm = rec["timings"]
            user = rec["models"]["user"]
            rows.append([fmt, code, rec["model"]["kernel_method"].split(";")[0], user["timings"]["kernel"],
                         tm.get("your model", 0.0), tm.get("train relu", 0.0) + tm.get("relu", 0.0)
                         + tm.get("train attn", 0.0) + tm.get("attn", 0.0), wall, rec["risk"]["level"],
                         user["worst_flip_rate"]])
    print()
    head = ["format", "exit", "kernel path", "kernel s", "your model s", "references s", "total s", "risk",
            "worst flip"]
    print(" | ".join(head))
    for r in rows:
        print(f"{r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.1f} | {r[7]} | "
              f"{100 * r[8]:.1f}%")
    return 0 if all(r[1] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
