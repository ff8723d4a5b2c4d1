"""Learning-rate pilot of the width-consistent protocol (`empirics.protocols`), on TRAINING LOSS ONLY.

For each data set and each candidate base rate `lr_16` (the Adam rate at m = 16; the protocol uses
`lr_16 * sqrt(16 / m)` at every width), train both models at the narrowest and a wide width under each input
preprocessing the claims use (1 seed, n as at the quick preset, up to the quick maximum of epochs with the
plateau stop) and record the final training loss relative to the loss of chance prediction, ln(classes). The
chosen rate is the candidate whose worst ratio over the (preprocessing, model, width) cells is smallest (ties:
the smaller rate): too high a rate kills the narrow network's ReLUs, too low a rate leaves the wide one short of
a plateau, and both show in the training loss. A cell whose loss stays above half the chance loss under every
candidate (MLP-Attn on raw pixels, whose features are almost collinear; narrow networks that die whatever the
rate) is reported and left out of the worst case: no rate fixes it, so it cannot tell the candidates apart. No
test-set number is used.

The first pass divided by the loss at initialisation instead; with standardised inputs that loss is 25-72 for
2L-ReLU (outputs of size sqrt(d)), so a narrow network that died at chance scored as well as one that learnt.
Its choice is recorded beside the one used (`chosen_by_initial_loss_ratio`), not used.

    nice -n 5 python scripts/pilot_lr.py --out results/pilot-lr.json --jobs 2

The output JSON (config, date, git commit, every run, the choice) is what `empirics.protocols.PROPER_LR16`
cites; tests/empirics/test_protocols.py checks that the two agree.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from empirics.common import dataset_tensors
from empirics.losses import loss_fn
from empirics.models import ModelSpec, build_model
from empirics.protocols import LR_REF_WIDTH, PROPER, protocol_config
from empirics.train import effective_lr, train
from empirics.userdata import load_data
from ntkm.errors import UserInputError
from verify.presets import n_train_for, parse_int_list, preset

CANDIDATES = (1e-2, 2e-2, 4e-2)
WIDTHS = (16, 512)
MODELS = ("relu", "attn")
DATASETS = ("mnist", "cifar10")
PREPROCESSINGS = ("raw", "channel")
#: A cell "learns" under a candidate when its final/initial training-loss ratio is below this.
LEARNS = 0.5


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "empirics", "scripts"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted" if dirty else "")


def pilot_run(ds: Any, t: Any, pre: str, kind: str, width: int, lr16: float, epochs: int,
              seed: int) -> dict[str, Any]:
    """Train one network at base rate `lr16` and return its training-loss numbers."""
    from empirics.models import input_channels  # the input-preprocessing layer (issue 23 item 1)

    spec = ModelSpec(kind, ds.d, width, t.out_dim, seed=seed, preprocess=pre, channels=input_channels(ds))
    cfg = replace(protocol_config(PROPER, epochs, seed=seed), lr=lr16)
    model = build_model(spec, t.x_train)
    with torch.no_grad():
        loss0 = float(loss_fn(t.out_dim, cfg.loss)(model(t.x_train), t.y_train).mean())
    rec = train(model, t.x_train, t.y_train, cfg, label=f"pilot {kind} m={width} lr16={lr16:g}")
    return {"preprocess": pre, "model": kind, "width": width, "chance_loss": math.log(t.out_dim),
            "lr16": lr16, "lr": effective_lr(cfg, width), "initial_train_loss": loss0,
            "final_train_loss": rec.final_train_loss, "loss_ratio": rec.final_train_loss / loss0,
            "loss_vs_chance": rec.final_train_loss / math.log(t.out_dim),
            "final_train_acc": rec.final_train_acc, "epochs_run": rec.epochs_run,
            "plateau_reached": rec.plateau_reached, "wall_s": rec.wall_s}


def _dataset_runs(job: tuple[str, str, int, str | None, int | None, tuple[int, ...], int | None]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every pilot run of one data set (one process of `--jobs`)."""
    ds_name, preset_name, seed, data_dir, epochs, widths, n_train = job
    torch.set_num_threads(int(os.environ.get("NTKM_THREADS", "1")))
    p = preset(preset_name)
    ds = load_data(ds_name, n_train=n_train or n_train_for(p, ds_name), n_test=p["n_test"], seed=seed,
                   data_dir=data_dir)
    t = dataset_tensors(ds)
    runs = [pilot_run(ds, t, pre, kind, w, lr, epochs or p["epochs"], seed)
            for lr in CANDIDATES for pre in PREPROCESSINGS for kind in MODELS for w in widths]
    return {"n_train": int(ds.x_train.shape[0]), "data": ds.provenance.get("label", ds_name)}, runs


def choose(runs: list[dict[str, Any]], key: str = "loss_vs_chance") -> dict[str, Any]:
    """The candidate with the smallest worst-case `key` over the cells that learn under some candidate (ties: the
    smaller rate), every candidate's score, and the cells left out."""
    def cell(r: dict[str, Any]) -> tuple[str, str, int]:
        return r["preprocess"], r["model"], r["width"]

    learns = {cell(r) for r in runs if r[key] < LEARNS}
    rates = sorted({r["lr16"] for r in runs})
    scores = {lr: max((r[key] for r in runs if r["lr16"] == lr and cell(r) in learns), default=float("inf"))
              for lr in rates}
    best = min(scores, key=lambda lr: (scores[lr], lr))
    left_out = sorted({cell(r) for r in runs} - learns)
    return {"chosen_lr16": best, "worst_loss_ratio": {f"{lr:g}": s for lr, s in scores.items()},
            "cells_left_out": ["/".join(map(str, c)) for c in left_out]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/pilot-lr.json")
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="processes (one data set each)")
    ap.add_argument("--epochs", type=int, default=None, help="maximum epochs (default: the preset's)")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="the narrow and the wide width")
    ap.add_argument("--n-train", type=int, default=None, help="training points (default: the preset's per data set)")
    args = ap.parse_args(argv)
    try:
        p = preset(args.preset)
        widths = parse_int_list(args.widths, "--widths", minimum=LR_REF_WIDTH)
        if (args.epochs is not None and args.epochs < 1) or (args.n_train is not None and args.n_train < 10):
            raise UserInputError(f"--epochs must be >= 1 and --n-train >= 10, got {args.epochs}, {args.n_train}")
    except UserInputError as e:
        print(f"pilot_lr: {e}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {
        "what": "learning-rate pilot of the width-consistent protocol, training loss only (scripts/pilot_lr.py)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git_commit": _commit(),
        "config": {"preset": args.preset, "seed": args.seed, "widths": list(widths), "models": list(MODELS),
                   "candidates_lr16": list(CANDIDATES), "lr_ref_width": LR_REF_WIDTH,
                   "max_epochs": args.epochs or p["epochs"],
                   "schedule": f"lr16 * sqrt({LR_REF_WIDTH} / m)", "optimizer": "adam, no weight decay, batch 128",
                   "preprocessings": list(PREPROCESSINGS),
                   "rule": f"smallest worst-case final training loss / ln(classes) over the (preprocessing, model, "
                           f"width) cells where it is < {LEARNS} under some candidate; ties: the smaller rate"},
        "datasets": {}}
    jobs = [(ds_name, args.preset, args.seed, args.data_dir, args.epochs, widths, args.n_train) for ds_name in DATASETS]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
            parts = pool.map(_dataset_runs, jobs)
    else:
        parts = [_dataset_runs(job) for job in jobs]
    for ds_name, (info, runs) in zip(DATASETS, parts, strict=True):
        out["datasets"][ds_name] = {**info, "runs": runs, **choose(runs),
                                    "chosen_by_initial_loss_ratio": choose(runs, "loss_ratio")["chosen_lr16"]}
        print(f"{ds_name}: chosen lr16 {out['datasets'][ds_name]['chosen_lr16']:g}; worst loss ratio per candidate "
              f"{out['datasets'][ds_name]['worst_loss_ratio']}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(out, f, indent=1)
    os.replace(f.name, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
