"""MLP-Attn's context product through the training inputs, `(h X^T) X`, against the d x d `C` (empirics.nets.models).

    python -m benchmarks.context --json runs/context.json      # ~1 min on a quiet 2-core machine
    python -m benchmarks.context --dataset cifar10 --n 250

The adversarial units' cost: MLP-Attn (width `--width`) on a real subset of `--n` training points of the bundled
data; the same network once with its factor (`TwoLayerNet` where `factor_is_cheaper(n, d)`) and once as loaded
from its state dict (no factor: the d x d `C`). Timed in the same process, the paths alternating, best of
`--repeats`: the features of the training set; the PGD attack (`empirics.nets.attacks.attack`, `TrainConfig`'s
eps and steps) on a batch of 128; one epoch of PGD adversarial training (`empirics.nets.train.train`, from the same
initial weights). Agreement in the same run: max |difference| of the features, of the attack's output (a sign step flips
where a gradient entry is ~0, so also how many entries differ) and the relative difference of the trained weights.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness import environment
from empirics.common import dataset_tensors
from empirics.data.datasets import DataRequest, load_dataset
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.context_product import context_product_macs, factor_is_cheaper
from empirics.nets.models import ModelSpec, TwoLayerNet
from empirics.nets.train import TrainConfig, train

BATCH = 128


def _best_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, Any]]:
    """Best wall time (and the last output) of each path, the paths alternating within every repeat so that a
    change of the shared machine's load reaches both."""
    best: dict[str, tuple[float, Any]] = {k: (float("inf"), None) for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            out = fn()
            best[k] = (min(best[k][0], time.perf_counter() - t0), out)
    return best


def _one_epoch(model: TwoLayerNet, t: Any, cfg: TrainConfig) -> TwoLayerNet:
    """A copy of `model` after `cfg`'s (one-epoch, adversarial) training; `model` keeps its initial weights."""
    net = copy.deepcopy(model)
    train(net, t.x_train, t.y_train, cfg)
    return net


def run(dataset: str, n: int, width: int, repeats: int) -> dict[str, Any]:
    t = dataset_tensors(load_dataset(dataset, n_train=n, n_test=8, request=DataRequest(sample="balanced", seed=0)))
    d = t.x_train.shape[1]
    factored = TwoLayerNet(ModelSpec("attn", d, width, t.out_dim, seed=0), t.x_train)
    dense = TwoLayerNet(factored.spec, torch.ones(1, d))
    dense.load_state_dict(factored.state_dict())  # the factor is not saved: this one multiplies by C
    xb, yb = t.x_train[:BATCH], t.y_train[:BATCH]
    tc = TrainConfig(epochs=1, adv_train=True, seed=0)
    acfg = AttackConfig("pgd", tc.adv_eps, steps=tc.adv_steps, seed=7)
    models = {"factor": factored, "dense": dense}

    def features(m: TwoLayerNet) -> torch.Tensor:
        with torch.no_grad():
            return m.features(t.x_train)

    steps = {"features_s": features, "attack_s": lambda m: attack(m, xb, yb, acfg),
             "adv_epoch_s": lambda m: _one_epoch(m, t, tc)}
    rows: dict[str, dict[str, float]] = {k: {} for k in models}
    outs: dict[str, dict[str, Any]] = {k: {} for k in models}
    for step, fn in steps.items():
        timed = _best_interleaved({k: (lambda m=m, fn=fn: fn(m)) for k, m in models.items()}, repeats)
        for k, (sec, out) in timed.items():
            rows[k][step], outs[k][step] = sec, out
    a, b = outs["factor"], outs["dense"]
    wa, wb = a["adv_epoch_s"].W.detach(), b["adv_epoch_s"].W.detach()
    agreement = {"features_max_abs_diff": float((a["features_s"] - b["features_s"]).abs().max()),
                 "attack_max_abs_diff": float((a["attack_s"] - b["attack_s"]).abs().max()),
                 "attack_entries_differing": int((a["attack_s"] != b["attack_s"]).sum()),
                 "attack_entries": a["attack_s"].numel(),
                 "trained_W_max_rel_diff": float((wa - wb).abs().max() / wb.abs().max())}
    ratios = {k: rows["dense"][k] / rows["factor"][k] for k in rows["dense"]}
    return {"dataset": dataset, "n": n, "d": d, "width": width, "batch": BATCH, "adv_steps": tc.adv_steps,
            "adv_eps": tc.adv_eps, "factor_used": factored.context_factor.numel() > 0,
            "factor_is_cheaper": factor_is_cheaper(n, d),
            "context_macs_per_row": {"factor": context_product_macs(n, d), "dense": d * d},
            "paths": rows, "speedup_dense_over_factor": ratios, "agreement": agreement}


def markdown(rec: dict[str, Any]) -> str:
    p, r, a = rec["paths"], rec["speedup_dense_over_factor"], rec["agreement"]
    lines = [f"Context product, MLP-Attn on {rec['dataset']} (n = {rec['n']}, d = {rec['d']}, m = {rec['width']}), "
             f"factor used: {rec['factor_used']}; multiply-adds per row {rec['context_macs_per_row']['factor']} vs "
             f"{rec['context_macs_per_row']['dense']}; torch threads {rec['threads']}, best of {rec['repeats']}.", "",
             "| step | factor s | d x d s | d x d / factor |", "|---|---|---|---|"]
    for k, label in (("features_s", "features of the training set"),
                     ("attack_s", f"PGD ({rec['adv_steps']} steps) on {rec['batch']}"),
                     ("adv_epoch_s", "one PGD adversarial-training epoch")):
        lines.append(f"| {label} | {p['factor'][k]:.3f} | {p['dense'][k]:.3f} | {r[k]:.2f}x |")
    lines += ["", f"Agreement: features max |diff| {a['features_max_abs_diff']:.1e}; attack output max |diff| "
                  f"{a['attack_max_abs_diff']:.1e} ({a['attack_entries_differing']} of {a['attack_entries']} entries "
                  "differ); "
                  f"trained W max rel diff {a['trained_W_max_rel_diff']:.1e}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.context", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="cifar10", choices=("mnist", "cifar10"), help="(default: %(default)s)")
    ap.add_argument("--n", type=int, default=500, help="training points (default: %(default)s)")
    ap.add_argument("--width", type=int, default=512, help="hidden width (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timings per step, the best kept (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s, as verify uses)")
    ap.add_argument("--json", default=None, help="write the record here")
    args = ap.parse_args(argv)
    if min(args.n, args.width, args.repeats, args.threads) < 1 or args.n < BATCH:
        print(f"benchmarks.context: error: --n must be >= {BATCH} and --width, --repeats, --threads >= 1",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    rec = {**run(args.dataset, args.n, args.width, args.repeats), "threads": torch.get_num_threads(),
           "repeats": args.repeats, "environment": environment()}
    print(markdown(rec))
    if args.json:
        from ntkm.codec import write_json

        write_json(args.json, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
