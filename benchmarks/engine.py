"""The batched training engine against the per-network loop, on the quick preset's trainings.

    python -m benchmarks.engine --json runs/engine.json          # ~5 min on a quiet 2-core machine
    python -m benchmarks.engine --epochs 4 --seeds 3             # a short look

The set: both models (2L-ReLU, MLP-Attn) at every width of `verify.presets` quick, under the paper and the
width-consistent protocols, on MNIST (n = 500) and CIFAR-10 (n = 250) subsets of the bundled sample drawn by the
project's loader, one subset and one initialisation per seed (10 seeds by default, as the quick preset's units
train them). Each network trains `--epochs` epochs (a representative window of the preset's 500-1000: the cost of
an epoch does not change along a training, so the ratio of the two paths does not depend on the window; both
paths check the loss every 5 epochs as the protocols do). The same jobs go through `[train_job(job) for job in
jobs]` and through `empirics.nets.engine.train_many(jobs)`, per data set and width, in the same process.

Reported per data set and width and in total: wall time of each path, the speed-up, agreement (the largest
|W_engine - W_loop| relative to max |W_loop|, and whether every record's epochs, accuracies and plateau flags are
equal), the engine's achieved GFLOP/s (the products of `empirics.nets.engine.gemm_flops`, loss checks not counted), and
the GEMM rate measured here for the step's shapes (`torch.mm` of a 128 x d batch with the m x d weights, and the
backward product), so the fraction of the GEMM rate the engine reaches is a ratio of two numbers from this run.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any

import torch

from benchmarks.harness import environment
from empirics.common import dataset_tensors
from empirics.data.datasets import DataRequest, load_dataset
from empirics.nets.engine import gemm_flops, train_many
from empirics.nets.models import ModelSpec, TwoLayerNet
from empirics.nets.protocols import PAPER, PROPER, protocol_config
from empirics.nets.train import train_job
from verify.presets import PRESETS, n_train_for

DATASETS = ("mnist", "cifar10")
MODELS = ("relu", "attn")
PROTOCOLS = (PAPER, PROPER)
BATCH = 128
#: The difference of the weights in Frobenius norm, relative to their norm, that the fused-Adam engine is compared
#: with (reported, not required): fused Adam rounds differently (~1 float32 ulp per step), and a training amplifies
#: that (measured 2e-4 on CIFAR-10 m = 16 after 11 epochs; tests/empirics/test_engine.py bounds a shorter MNIST run).
FUSED_TOLERANCE = 1e-4


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def jobs_for(dataset: str, width: int, seeds: int, epochs: int, data: dict[int, Any]) -> list[tuple]:
    """Every training of one data set and width: models x protocols x seeds (each seed its own subset)."""
    jobs = []
    for s in range(seeds):
        t = data[s]
        for kind in MODELS:
            for proto in PROTOCOLS:
                model = TwoLayerNet(ModelSpec(kind, t.x_train.shape[1], width, t.out_dim, seed=s), t.x_train)
                cfg = protocol_config(proto, epochs, seed=s)
                jobs.append((model, t.x_train, t.y_train, cfg, t.x_test, t.y_test, f"{kind} m={width} seed {s}"))
    return jobs


def gemm_rate(n: int, d: int, m: int, repeats: int = 5) -> float:
    """GFLOP/s of the step's two large products (`x W^T` and `g^T x`, 128 x d batch) with plain `torch.mm`."""
    x, w, g = torch.randn(n, d), torch.randn(m, d), torch.randn(n, m)
    reps = max(3, int(2e8 / (4.0 * n * m * d)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(x, w.T)
            torch.mm(g.T, x)
        best = min(best, time.perf_counter() - t0)
    return 4.0 * n * m * d * reps / best / 1e9


def compare(loop_jobs: list[tuple], engine_jobs: list[tuple], loop: list, engine: list) -> dict[str, Any]:
    """Largest relative weight difference (entrywise, against the largest weight; and in Frobenius norm) and whether
    every record agrees."""
    dw, dn, same = 0.0, 0.0, True
    for ja, jb, a, b in zip(loop_jobs, engine_jobs, loop, engine, strict=True):
        wa, wb = ja[0].W.detach(), jb[0].W.detach()
        dw = max(dw, float((wa - wb).abs().max() / wa.abs().max()))
        dn = max(dn, float((wa - wb).norm() / wa.norm()))
        same &= (a.epochs_run, a.plateau_reached, a.epochs, a.train_acc, a.test_acc, a.final_train_acc,
                 a.final_test_acc) == (b.epochs_run, b.plateau_reached, b.epochs, b.train_acc, b.test_acc,
                                       b.final_train_acc, b.final_test_acc)
    return {"max_rel_weight_diff": dw, "max_rel_norm_diff": dn, "records_equal": bool(same)}


def _both(jobs: list[tuple]) -> dict[str, Any]:
    """The jobs through the loop and (on copies) through the engine and the engine with fused Adam, timed in turn."""
    ours = [(copy.deepcopy(j[0]), *j[1:]) for j in jobs]
    fused_jobs = [(copy.deepcopy(j[0]), *j[1:]) for j in jobs]
    t0 = time.perf_counter()
    loop = [train_job(j) for j in jobs]
    t1 = time.perf_counter()
    engine = train_many(ours)
    t2 = time.perf_counter()
    fused = train_many(fused_jobs, fused_adam=True)
    t3 = time.perf_counter()
    return {"jobs": jobs, "ours": ours, "loop": loop, "engine": engine, "loop_s": t1 - t0, "engine_s": t2 - t1,
            "fused_jobs": fused_jobs, "fused": fused, "fused_s": t3 - t2}


def run(seeds: int, epochs: int, widths: tuple[int, ...]) -> dict[str, Any]:
    p = PRESETS["quick"]
    rows = []
    for dataset in DATASETS:
        n = n_train_for(p, dataset)
        data = {s: dataset_tensors(load_dataset(dataset, n_train=n, n_test=p["n_test"],
                                                request=DataRequest(sample="balanced", seed=s)))
                for s in range(seeds)}
        d = data[0].x_train.shape[1]
        for width in widths:
            train_job(jobs_for(dataset, width, 1, 1, data)[0])  # warm-up, not timed
            short, long = (_both(jobs_for(dataset, width, seeds, e, data)) for e in (1, 1 + epochs))
            loop_s, engine_s, fused_s = (long[k] - short[k] for k in ("loop_s", "engine_s", "fused_s"))
            flops = epochs * len(long["jobs"]) * gemm_flops(1, n, BATCH, width, d, data[0].out_dim)
            rate = gemm_rate(BATCH, d, width)
            row = {"dataset": dataset, "n": n, "d": d, "width": width, "networks": len(long["jobs"]), "epochs": epochs,
                   "loop_s": loop_s, "engine_s": engine_s, "speedup": loop_s / engine_s,
                   "window_loop_s": long["loop_s"], "window_engine_s": long["engine_s"],
                   "engine_gflops": flops / engine_s / 1e9, "loop_gflops": flops / loop_s / 1e9, "gemm_gflops": rate,
                   **compare(long["jobs"], long["ours"], long["loop"], long["engine"]),
                   "fused_s": fused_s, "fused_speedup": loop_s / fused_s, "fused_gflops": flops / fused_s / 1e9,
                   **{f"fused_{k}": v for k, v in
                      compare(long["jobs"], long["fused_jobs"], long["loop"], long["fused"]).items()}}
            row["engine_fraction_of_gemm"] = row["engine_gflops"] / rate
            row["fused_fraction_of_gemm"] = row["fused_gflops"] / rate
            rows.append(row)
            _log(f"{dataset} m={width}: {epochs} epochs: loop {loop_s:.1f}s, engine {engine_s:.1f}s "
                 f"({row['speedup']:.2f}x), {row['engine_gflops']:.1f} GFLOP/s of {rate:.1f} "
                 f"({100 * row['engine_fraction_of_gemm']:.0f} %), max rel dW {row['max_rel_weight_diff']:.1e}, "
                 f"records equal: {row['records_equal']}; fused Adam {fused_s:.1f}s ({row['fused_speedup']:.2f}x, "
                 f"{100 * row['fused_fraction_of_gemm']:.0f} % of GEMM, "
                 f"max rel dW {row['fused_max_rel_weight_diff']:.1e})")
    loop_s, engine_s, fused_s = (sum(r[k] for r in rows) for k in ("loop_s", "engine_s", "fused_s"))
    return {"rows": rows, "total": {"loop_s": loop_s, "engine_s": engine_s, "speedup": loop_s / engine_s,
                                    "fused_s": fused_s, "fused_speedup": loop_s / fused_s,
                                    "fused_max_rel_weight_diff": max(r["fused_max_rel_weight_diff"] for r in rows),
                                    "fused_max_rel_norm_diff": max(r["fused_max_rel_norm_diff"] for r in rows),
                                    "fused_agrees": all(r["fused_max_rel_norm_diff"] <= FUSED_TOLERANCE
                                                        for r in rows),
                                    "networks": sum(r["networks"] for r in rows),
                                    "max_rel_weight_diff": max(r["max_rel_weight_diff"] for r in rows),
                                    "records_equal": all(r["records_equal"] for r in rows)}}


def markdown(rec: dict[str, Any]) -> str:
    lines = [f"Engine vs per-network loop: {rec['seeds']} seeds x {len(MODELS)} models x {len(PROTOCOLS)} protocols "
             f"per data set and width, {rec['epochs']} epochs each (the time of 1 + {rec['epochs']} epochs minus "
             "that of 1 epoch, per path), "
             f"torch threads {rec['threads']}.", "",
             "| data | width | nets | loop s | engine s | speed-up | engine GFLOP/s | GEMM GFLOP/s | of GEMM | "
             "max rel dW | records equal | fused-Adam s | speed-up | of GEMM | max rel dW |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        lines.append(f"| {r['dataset']} | {r['width']} | {r['networks']} | {r['loop_s']:.1f} | {r['engine_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['engine_gflops']:.1f} | {r['gemm_gflops']:.1f} | "
                     f"{100 * r['engine_fraction_of_gemm']:.0f} % | {r['max_rel_weight_diff']:.1e} | "
                     f"{r['records_equal']} | {r['fused_s']:.1f} | {r['fused_speedup']:.2f}x | "
                     f"{100 * r['fused_fraction_of_gemm']:.0f} % | {r['fused_max_rel_weight_diff']:.1e} |")
    t = rec["total"]
    w_loop, w_engine = (sum(r[k] for r in rec["rows"]) for k in ("window_loop_s", "window_engine_s"))
    lines += ["", f"Windows with the once-per-network costs: loop {w_loop:.1f} s, engine {w_engine:.1f} s "
                  f"({w_loop / w_engine:.2f}x).",
              "", f"Total: loop {t['loop_s']:.1f} s, engine {t['engine_s']:.1f} s, speed-up {t['speedup']:.2f}x over "
                  f"{t['networks']} networks; max rel dW {t['max_rel_weight_diff']:.1e}; records equal: "
                  f"{t['records_equal']}.",
              "", f"Engine with fused Adam (an option, not what the claims train with): {t['fused_s']:.1f} s, "
                  f"speed-up {t['fused_speedup']:.2f}x over the loop; max rel dW {t['fused_max_rel_weight_diff']:.1e} "
                  f"entrywise, {t['fused_max_rel_norm_diff']:.1e} in norm (within {FUSED_TOLERANCE:g}: "
                  f"{t['fused_agrees']}; not an equal computation: its rounding is amplified along a training, so it "
                  "is reported, not required)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per unit (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs timed per network (default: %(default)s)")
    ap.add_argument("--widths", default=None, help="comma-separated widths (default: the quick preset's)")
    ap.add_argument("--json", default=None, help="write the record here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s, as verify uses)")
    args = ap.parse_args(argv)
    try:
        widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else PRESETS["quick"]["widths"]
    except ValueError:
        print(f"benchmarks.engine: error: --widths must be comma-separated integers (got {args.widths!r})",
              file=sys.stderr)
        return 2
    if args.seeds < 1 or args.epochs < 1 or any(w < 1 for w in widths):
        print("benchmarks.engine: error: --seeds, --epochs and every width must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    rec: dict[str, Any] = {"seeds": args.seeds, "epochs": args.epochs, "threads": torch.get_num_threads(),
                           "environment": environment(), **run(args.seeds, args.epochs, widths)}
    print(markdown(rec))
    if args.json:
        from ntkm.codec import write_json

        write_json(args.json, rec)
    return 0 if rec["total"]["records_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
