"""Predicted NTK influence against actual retraining of a wide 2L-ReLU network (empirics.attribution.influence).

Runs `empirics.attribution.influence.retrain_study` at a larger size than the unit test and prints the
correlations; `--json FILE` keeps the full record (per-point predicted and actual values).

    python benchmarks/retrain_study.py --width 4096 --n-train 100 --n-remove 20 --steps 300
"""

from __future__ import annotations

import argparse
import sys

from empirics.attribution.influence import RetrainConfig, retrain_study
from ntkm.codec import write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--task", default="binary")
    p.add_argument("--n-train", type=int, default=100)
    p.add_argument("--n-test", type=int, default=100)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--n-remove", type=int, default=20)
    p.add_argument("--pool", type=int, default=2, help="average-pool images by this factor per side")
    p.add_argument("--ridge", type=float, default=None, help="absolute ridge (default: n / (lr * steps))")
    p.add_argument("--uncentered", action="store_true", help="keep the network's output at initialisation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    cfg = RetrainConfig(dataset=a.dataset, task=a.task, n_train=a.n_train, n_test=a.n_test, width=a.width,
                        steps=a.steps, n_remove=a.n_remove, pool=a.pool, ridge=a.ridge,
                        centered=not a.uncentered, seed=a.seed)
    r = retrain_study(cfg)
    print(f"{cfg.dataset} {cfg.task}, n={cfg.n_train}, n_test={cfg.n_test}, d={r['d']}, m={cfg.width}, "
          f"GD {cfg.steps} steps lr={r['lr']:.3g}, ridge={r['ridge']:.3g}, centred={cfg.centered}")
    print(f"removed points: {len(r['points'])}; Pearson {r['pearson']:.3f}, Spearman {r['spearman']:.3f}, "
          f"sign agreement {r['sign_agreement']:.2f}; kernel vs network outputs (relative) "
          f"{r['kernel_vs_network_rel']:.3f}; wall {r['wall_s']:.1f}s")
    if a.json:
        write_json(a.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
