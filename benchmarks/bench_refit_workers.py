"""The audit's CPU re-fits by path: threads, worker processes (`--refit-workers`) and channels-last layout.

On README step 1's CNN (`benchmarks.audit_tables`, untrained weights: a warm re-fit costs the same), `--k` warm re-fits
of `--keep` of 1,000 MNIST images (the validity panel's subsets: 5 epochs, batch 64, Adam lr 1e-3), each path timed
on the same jobs in this run (best of `--repeats`, after one warm-up job), beside two agreement checks: the workers'
outputs equal the one-thread re-fits of one process bit for bit, and the channels-last re-fits equal the default
layout's to float32 rounding (max relative difference of the test logits).

    python -m benchmarks.bench_refit_workers [--k 16] [--repeats 2] [--json results/refit-workers.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from benchmarks.audit_tables import FULL, build, load_images
from benchmarks.harness import environment, max_rel_diff
from verify.audit.modelio import FlatInput
from verify.audit.refit import RefitConfig, RefitJob, Refitter

#: Float32 rounding amplified by 75 Adam steps (the layouts sum in another order).
LAYOUT_TOLERANCE = 1e-2


def _jobs(k: int, keep: int) -> tuple[Refitter, list[RefitJob]]:
    r = FULL["cnn"]
    x, y, xt, _, _ = load_images(r)
    model = build("cnn").eval()
    shape = tuple(x.shape[1:])
    xf, yf = torch.as_tensor(x.reshape(len(x), -1)), torch.as_tensor(y).long()
    xtf = torch.as_tensor(xt.reshape(len(xt), -1))
    rng = np.random.default_rng(0)
    jobs = [RefitJob(xf, yf, s, {"test": xtf}, torch.as_tensor(np.sort(rng.choice(len(x), keep, replace=False))))
            for s in range(k)]
    return Refitter.for_module(model, FlatInput(model, shape), RefitConfig(), 10, shape), jobs


def _timed(refitter: Refitter, jobs: list[RefitJob], threads: int, workers: int, layout: bool,
           repeats: int) -> tuple[float, np.ndarray]:
    torch.set_num_threads(threads)
    refitter.workers = workers
    refitter._pool_off = None
    patch: Callable = (lambda self: [p for p in self.params if p.dim() == 4]) if layout else (lambda self: [])
    with mock.patch.object(Refitter, "_channels_last", patch):
        refitter.outputs_many(jobs[:1])  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = refitter.outputs_many(jobs)
            best = min(best, time.perf_counter() - t0)
    return best / len(jobs), np.stack([o["test"] for o in outs])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_refit_workers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=16, help="re-fits per timing (default %(default)s)")
    ap.add_argument("--keep", type=int, default=900, help="training points of each re-fit (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    refitter, jobs = _jobs(args.k, args.keep)
    paths = {"one process, 2 threads, default layout": (2, 1, False),
             "one process, 1 thread, default layout": (1, 1, False),
             "one process, 1 thread, channels-last": (1, 1, True),
             "2 workers of 1 thread, channels-last": (1, 2, True)}
    rows, outs = [], {}
    for name, (threads, workers, layout) in paths.items():
        per, outs[name] = _timed(refitter, jobs, threads, workers, layout, args.repeats)
        rows.append({"path": name, "threads": threads, "workers": workers, "channels_last": layout,
                     "seconds_per_refit": per})
        print(f"{name}: {per:.3f} s per re-fit", file=sys.stderr)
    base = rows[0]["seconds_per_refit"]
    for row in rows:
        row["speedup_vs_first"] = base / row["seconds_per_refit"]
    checks = {
        "workers_equal_one_process_bitwise": bool(np.array_equal(outs["2 workers of 1 thread, channels-last"],
                                                                 outs["one process, 1 thread, channels-last"])),
        "layout_max_rel_diff": max_rel_diff(outs["one process, 1 thread, channels-last"],
                                            outs["one process, 1 thread, default layout"]),
    }
    checks["layout_within_tolerance"] = checks["layout_max_rel_diff"] <= LAYOUT_TOLERANCE
    record = {"what": "the audit's CPU re-fits by path (benchmarks.bench_refit_workers)", "config": vars(args),
              "environment": environment(), "rows": rows, "checks": checks}
    for row in rows:
        print(f"| {row['path']} | {row['seconds_per_refit']:.3f} s | {row['speedup_vs_first']:.2f}x |")
    print(f"checks: {checks}")
    if args.json:
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        tmp.replace(args.json)
    return 0 if checks["workers_equal_one_process_bitwise"] and checks["layout_within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
