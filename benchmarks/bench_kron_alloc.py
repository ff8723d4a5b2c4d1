"""The Kronecker projection's dimension allocated by each weight's measured share of the kernel (issue 29, item 6),
against the equal split, at the same total feature count, on the CIFAR-10 ResNet-18 of `benchmarks.bench_audit_resnet`.

The model is built and trained as there (`ResNet18`, `train`: Adam, lr 1e-3, batch 64, `--train-epochs` epochs on
`--n` CIFAR-10 training images from `../shared/data`, seed 0) and exported with a dynamic batch dimension. The error
is measured as `verify.audit.projection.projection_error` measures it: the relative Frobenius error of the training
and test-train kernel entries against the exact kernel (`StructuredJacobian.kernel`) on its seeded subsample of 48
training and 24 test points (seed 0). Compared, at `--dim` (the audit's 8,192), for each of `--seeds` projection seeds:

- `equal`: the equal split of the projected weights (the rule before item 6);
- `share, no exact directions`: the allocation by the pilot's measured shares alone (`directions=0`);
- `share`: the allocation with each side's leading directions kept exactly (the default).

Each projection is calibrated on the `--n` training images (its pilot draws 24 of them, as the audit's first call
does); timed are the pilot and the features of `--time-points` training images (`per point` extrapolates to the
audit's 1,000 + 200), besides those of the 72 error points.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python -m benchmarks.bench_kron_alloc [--n 1000] [--train-epochs 4]
        [--dim 8192] [--seeds 3] [--time-points 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_audit_resnet import ResNet18, train
from empirics.data.datasets import load_dataset
from empirics.kernels.audit_ntk import Projection
from empirics.kernels.audit_structured import ProjectedStructured, StructuredJacobian
from empirics.records import git_state
from verify.audit.projection import ERROR_TEST, ERROR_TRAIN

CONFIGS = {"equal": {"allocation": "equal"}, "share, no exact directions": {"directions": 0}, "share": {}}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="training images (default: %(default)s)")
    ap.add_argument("--n-test", type=int, default=200, help="test images (default: %(default)s)")
    ap.add_argument("--train-epochs", type=int, default=4, help="epochs of training (default: %(default)s)")
    ap.add_argument("--dim", type=int, default=8192, help="projection dimension (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=3, help="projection seeds 0..N-1 (default: %(default)s)")
    ap.add_argument("--time-points", type=int, default=64, help="training images timed (default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the measurements as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("NTKM_THREADS", "1")))
    torch.manual_seed(0)
    ds = load_dataset("cifar10", n_train=args.n, n_test=args.n_test)
    x = torch.as_tensor(ds.x_train).reshape(-1, 3, 32, 32)
    y = torch.as_tensor(ds.y_train).long()
    xt = torch.as_tensor(ds.x_test).reshape(-1, 3, 32, 32)
    model = ResNet18()
    acc, per_epoch = train(model, x, y, args.train_epochs)
    print(f"ResNet-18 ({sum(p.numel() for p in model.parameters()):,} parameters), {args.train_epochs} epoch(s) on "
          f"{len(x)} CIFAR-10 images ({per_epoch:.0f} s each), train accuracy {acc:.3f}", file=sys.stderr)
    ep = torch.export.export(model.eval(), (x[:4],), dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))
    jac, why = StructuredJacobian.build(ep.module(), (3, 32, 32))
    if jac is None:
        sys.stderr.write(f"bench_kron_alloc: the structured path does not apply ({why})\n")
        return 1
    flat, flat_t = x.reshape(len(x), -1), xt.reshape(len(xt), -1)
    rng = np.random.default_rng(0 + 4099)  # projection_error's draw at --seed 0
    m, mt = min(len(x), ERROR_TRAIN), min(len(xt), ERROR_TEST)
    sub, subt = np.sort(rng.choice(len(x), m, replace=False)), np.sort(rng.choice(len(xt), mt, replace=False))
    both = torch.cat([flat[torch.as_tensor(sub)], flat_t[torch.as_tensor(subt)]])
    tic = time.perf_counter()
    exact = jac.kernel(both)
    t_exact = time.perf_counter() - tic
    print(f"exact kernel of {m} + {mt} points: {t_exact:.0f} s", file=sys.stderr)
    timed = flat[:args.time_points]
    rows: list[dict] = []
    for seed in range(args.seeds):
        for name, kw in CONFIGS.items():
            proj = ProjectedStructured(jac, Projection(args.dim, "gaussian", seed), progress=False, **kw)
            tic = time.perf_counter()
            proj.calibrate(flat)
            t_pilot = time.perf_counter() - tic
            tic = time.perf_counter()
            f = proj.features(both)
            t_err = time.perf_counter() - tic
            kp = proj.gram(f, f)
            tic = time.perf_counter()
            proj.features(timed)
            t_feat = time.perf_counter() - tic
            proj_feats = sum(p.k_out * p.k_in for p in proj.parts.values() if not p.exact)
            row = {"seed": seed, "config": name, "width": proj.width, "projected_features": proj_feats,
                   "budget": proj.budget, "train_error": _rel(kp[:m, :m], exact[:m, :m]),
                   "test_train_error": _rel(kp[m:, :m], exact[m:, :m]), "pilot_s": t_pilot,
                   "features_72_s": t_err, "features_per_point_s": t_feat / max(1, len(timed)),
                   "method": proj.method}
            if proj.pilot is not None:
                row["pilot"] = proj.pilot
                row["allocation"] = proj.allocation
            rows.append(row)
            print(f"seed {seed} {name:<27} error train {row['train_error']:.4f} test-train "
                  f"{row['test_train_error']:.4f}  width {proj.width} (projected {proj_feats} of {proj.budget})  "
                  f"pilot {t_pilot:.1f} s  features {row['features_per_point_s']:.3f} s/point", file=sys.stderr,
                  flush=True)
    n_all = args.n + args.n_test
    print(f"| {'ResNet-18, CIFAR-10, dim ' + str(args.dim):<28} | error train (mean, per seed) | error test-train "
          f"(mean) | pilot | features, {n_all} points |")
    print(f"|{'-' * 30}|---|---|---|---|")
    for name in CONFIGS:
        rs = [r for r in rows if r["config"] == name]
        per = ", ".join(f"{r['train_error']:.4f}" for r in rs)
        print(f"| {name:<28} | {np.mean([r['train_error'] for r in rs]):.4f} ({per}) | "
              f"{np.mean([r['test_train_error'] for r in rs]):.4f} | {np.mean([r['pilot_s'] for r in rs]):.1f} s | "
              f"{np.mean([r['features_per_point_s'] for r in rs]) * n_all:.0f} s |")
    share = next((r for r in rows if r["config"] == "share" and r["seed"] == 0), None)
    if share:
        print("\nallocation (seed 0, share): node, measured share, k_out x k_in, exact directions out / in")
        for a in share["allocation"]:
            print(f"  {a['node']:<12} {a['d_out']:>4} x {a['d_in']:<5} share {a['share']:.4f}  "
                  f"{a['k_out']:>4} x {a['k_in']:<4} exact {a['exact_out']} / {a['exact_in']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "config": vars(args), "git": git_state(),
                                               "exact_kernel_s": t_exact, "model_train_accuracy": acc,
                                               "seconds_per_epoch": per_epoch}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
