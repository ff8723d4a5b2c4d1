"""Time `verify audit` end to end, every panel included, on a ~1M-parameter model and 1,000 training points.

The model is a plain-PyTorch MLP 784-1024-256-10 (1,068,810 parameters) trained for a few epochs
outside the suite, saved as a torch.export program (and, with --formats, as TorchScript); the data are
1,000 MNIST training and 200 test images (the full IDX files when found, else the bundled 600-image
sample repeated with fresh noise, which changes nothing about the cost). Each format is audited with the
defaults: eps 8/255, tau 0.1, FGSM/PGD/MIM with 10 steps, 3 random-noise seeds, both references trained
with the width-consistent protocol to a plateau (width 512, at most 1000 epochs), the budget curves, the
validity panel (24 LDS re-fits, top-lever removal, brittleness), the outcome table (3 seeds) and the
planted-poison self-test, all re-fits warm-started (Adam, lr 1e-3, 5 epochs). Printed: the stage
timings and the panels' headline numbers. Target: at most 5 minutes per audit on a 2-core CPU.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_audit.py [--formats export,torchscript]
        [--n 1000] [--keep DIR] [--json FILE]

(torch runs one thread, `NTKM_THREADS`; the BLAS variables keep numpy's solves on one thread too, which
is steadier when other jobs share the cores.)
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

from empirics.data.datasets import DataRequest, load_dataset
from ntkm.errors import UserInputError
from verify.cli import main as verify_main


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def data(n: int, n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        ds = load_dataset("mnist", n_train=n, n_test=n_test, request=DataRequest(source="full"))
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test, "MNIST (full IDX files)"
    except UserInputError:
        ds = load_dataset("mnist", n_train=600, n_test=min(n_test, 200), request=DataRequest(source="bundled"))
        rng = np.random.default_rng(0)
        idx = rng.integers(0, 600, size=n)
        x = np.clip(ds.x_train[idx] + rng.normal(0, 0.02, (n, 784)).astype(np.float32), 0, 1)
        return x, ds.y_train[idx], ds.x_test, ds.y_test, "bundled MNIST sample, resampled with noise"


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 3, finetune_epochs: int = 0,
          finetune_lr: float = 1e-4) -> float:
    """Adam at lr 1e-3, batch 64, a seeded batch order, for `epochs`; then `finetune_epochs` more of the same
    optimiser at `finetune_lr` (a step schedule); the train accuracy of the model in evaluation mode."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(epochs + finetune_epochs):
        if epoch == epochs:
            for group in opt.param_groups:
                group["lr"] = finetune_lr
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
    ap.add_argument("--formats", default="export")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--keep", default=None, help="folder to keep the reports in (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
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
            rows.append(summary(fmt, code, wall, json.loads(out.with_suffix(".json").read_text())))
    print()
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for r in rows:
        print("| " + " | ".join(str(v) for v in r.values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


def _iv(d: dict) -> str:
    return f"{d['value']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"


def summary(fmt: str, code: int, wall: float, rec: dict) -> dict:
    """One row: stage timings and the panels' headline numbers of an audit record."""
    tm = rec["timings"]
    user = rec["models"]["user"]
    pan = rec.get("panels", {})
    val, poi, out, bud = (pan.get(k, {}) for k in ("validity", "poison", "outcome", "budget"))
    refs = sum(tm.get(k, 0.0) for k in ("train relu", "relu", "train attn", "attn"))
    gates = ", ".join(f"{k}: {m['test_acc']:.2f} {'ok' if m['gate']['passed'] else 'below gate'}"
                      for k, m in rec["models"].items() if "gate" in m)
    tf = out.get("rows", {}).get("target_flip", {})
    return {
        "format": fmt, "exit": code, "kernel path": rec["model"]["kernel_method"].split(";")[0],
        "total s": f"{wall:.1f}", "kernel s": f"{user['timings']['kernel']:.1f}",
        "your model s": f"{tm.get('your model', 0.0):.1f}", "references s": f"{refs:.1f}",
        "budget s": f"{tm.get('budget curves', 0.0):.1f}", "validity s": f"{tm.get('validity', 0.0):.1f}",
        "outcome s": f"{tm.get('outcome', 0.0):.1f}", "poison s": f"{tm.get('planted poison', 0.0):.1f}",
        "re-fits": pan.get("refit", {}).get("count", 0), "risk": rec["risk"]["level"],
        "worst flip": f"{100 * user['worst_flip_rate']:.1f}%", "references (test acc, gate)": gates,
        "breaking eps": bud.get("breaking_label", "-"), "validity": val.get("verdict", "-"),
        "LDS NTK": _iv(val["lds"]["ntk"]) if "lds" in val else "-",
        "LDS GN": _iv(val["lds"]["gn"]) if "lds" in val else "-",
        "poison P@k (self-inf / levers / train loss / chance)": (
            " / ".join(f"{poi['rankings'][k]['precision']:.2f}" for k in ("self_influence_ntk", "levers_abs_ntk",
                                                                          "training_loss")) + f" / {poi['chance']:.2f}"
            if "rankings" in poi else "-"),
        "targeted flips levers vs random": (f"{_iv(tf['levers'])} vs {_iv(tf['random'])}" if tf else "-"),
    }


if __name__ == "__main__":
    sys.exit(main())
