"""What the audit's kernel costs on a ResNet-18-sized model: measured per example, extrapolated to a full audit.

The model is the CIFAR-10 ResNet-18 (11,173,962 parameters: 3x3 stem, four stages of two basic blocks,
batch norm in evaluation mode, global average pooling, a linear head), written in plain torch and left at
its initialisation (the cost of a Jacobian does not depend on the weights). Inputs are random 3x32x32
images (the cost does not depend on the pixels either). Measured, on one torch thread: the exact per-example
Jacobian rows (`empirics.audit_ntk.ModelJacobian`, one example at a time), their projection to k dimensions
(`ProjectedJacobian`) with R regenerated and with R cached, and the peak resident memory. Printed: those
times and the extrapolated cost of the kernels of one audit (n training + n_test test points), exact in
blocks under --max-memory-gb and projected. This is not the full audit; the issue's target, the whole audit
of 1,000 CIFAR-10 images within 10 minutes on 2 cores, is far from these numbers.

    python benchmarks/bench_audit_resnet.py [--examples 3] [--k 512] [--n 1000] [--n-test 200]
        [--max-memory-gb 2]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch
from torch import nn

from empirics.audit_ntk import ModelJacobian, ProjectedJacobian, Projection


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


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=3, help="examples measured (default: %(default)s)")
    ap.add_argument("--k", type=int, default=512, help="projection dimension (default: %(default)s)")
    ap.add_argument("--n", type=int, default=1000, help="training points extrapolated to (default: %(default)s)")
    ap.add_argument("--n-test", type=int, default=200, help="test points extrapolated to (default: %(default)s)")
    ap.add_argument("--max-memory-gb", type=float, default=2.0, help="the audit's memory budget (default: 2)")
    args = ap.parse_args(argv)
    if args.examples < 1 or args.k < 1 or args.n < 2 or args.n_test < 1 or args.max_memory_gb <= 0:
        sys.stderr.write("bench_audit_resnet: --examples, --k, --n, --n-test and --max-memory-gb must be positive\n")
        return 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNet18().eval()
    jac = ModelJacobian(model, (3, 32, 32), progress=False)
    per = jac.bytes_per_example()
    x = torch.rand(args.examples, 3 * 32 * 32, generator=torch.Generator().manual_seed(0))
    tic = time.perf_counter()
    feats = jac.features(x)
    t_jac = (time.perf_counter() - tic) / args.examples
    budget = int(args.max_memory_gb * 2**30)
    del feats
    proj = ProjectedJacobian(jac, Projection(args.k, "gaussian", 0), batch_bytes=per * args.examples, cache_bytes=0)
    tic = time.perf_counter()
    proj.features(x)
    t_regen = max(0.0, time.perf_counter() - tic - args.examples * t_jac)
    batch = max(1, (budget // 4) // per)
    pts = args.n + args.n_test
    chunk = max(1, budget // (2 * per))
    blocks = -(-args.n // chunk)
    exact_blocks = (args.n * blocks + args.n_test * blocks) * t_jac
    projected = pts * t_jac + -(-pts // batch) * t_regen
    rows = [
        ("parameters", f"{jac.n_params:,}"),
        ("Jacobian method", jac.method),
        ("exact Jacobian rows per example", f"{per / 2**20:.0f} MiB, {t_jac:.2f} s"),
        (f"projecting a batch of {args.examples} to k = {args.k}, R regenerated", f"{t_regen:.1f} s"),
        (f"R cached ({jac.n_params:,} x {args.k} float32)", f"{jac.n_params * args.k * 4 / 2**30:.1f} GiB "
         f"({'fits' if jac.n_params * args.k * 4 <= budget // 2 else 'does not fit'} half of the budget)"),
        (f"exact kernel of {pts} points, all Jacobians held", f"{pts * per / 2**30:.0f} GiB"),
        (f"exact kernel in blocks of {chunk} under {args.max_memory_gb:g} GiB (extrapolated)",
         f"{exact_blocks / 3600:.1f} h (Jacobians recomputed {blocks}x)"),
        (f"projected kernel, batches of {batch}, R regenerated per batch (extrapolated)", f"{projected / 3600:.1f} h"),
        ("peak resident memory of this run", f"{_peak_gib():.1f} GiB"),
    ]
    width = max(len(a) for a, _ in rows)
    print(f"| {'ResNet-18 (CIFAR-10 input), one torch thread':<{width}} | |")
    print(f"|{'-' * (width + 2)}|---|")
    for a, b in rows:
        print(f"| {a:<{width}} | {b} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
