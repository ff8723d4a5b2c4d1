"""Learning-rate pilot of the width-consistent protocol (`empirics.nets.protocols`), on TRAINING DATA ONLY.

The protocol's Adam rate at width m is `lr16 * (16 / m) ** power`. For each data set, each candidate
(lr16, power) and each input preprocessing asked for, train both models at every width of the preset's sweep
(seeds 0..S-1, each its own data subset, n as the preset's claims use it, up to the preset's maximum epochs with
the plateau stop; the networks go through `empirics.nets.engine.train_many`, which equals `train`). A cell (model,
width) is *adequate on training* under a candidate when every seed reaches the plateau and the gate's training
accuracy (chance + 0.5 (1 - chance)). The chosen candidate has the most adequate cells; ties go to the smallest
worst-case final training loss / ln(classes) over the cells, then to the smaller rate. No test-set number is
used (test accuracy is not even computed).

History: the first pilot (D2 in docs/DEVIATIONS.md) fixed power = 1/2 and chose lr16 on a cut-down run (n = 100,
m = 16 and 256, 200 epochs); at quick sizes it left CIFAR-10 MLP-Attn at m = 512 (lr 0.007) without a plateau in
1,000 epochs (run R5), so the power joined the candidates and the pilot now runs at the preset's own sizes (D18).

    PYTHONPATH=. python scripts/pilot_lr.py --out results/pilot-lr.json --jobs 2

The output JSON (config, date, git commit, every run, the choice) is what `empirics.nets.protocols.PROPER_LR`
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
from empirics.data.datasets import DataRequest
from empirics.data.userdata import load_data
from empirics.nets.engine import train_many
from empirics.nets.losses import loss_fn
from empirics.nets.models import ModelSpec, build_model, input_channels
from empirics.nets.protocols import GATE_TRAIN, LR_REF_WIDTH, PROPER, chance_accuracy, protocol_config
from empirics.nets.train import effective_lr
from empirics.vocab import MODEL_KINDS
from ntkm.errors import UserInputError
from verify.presets import n_train_for, parse_choices, parse_float_list, parse_int_list, preset

#: Candidate (lr16, power) pairs: the rate at m = 16 and the exponent of its decrease with width.
POWERS = (0.25, 0.5)
CANDIDATES = tuple((lr, pw) for pw in POWERS for lr in (2e-2, 4e-2, 8e-2))
MODELS = ("relu", "attn")
DATASETS = ("mnist", "cifar10")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "empirics", "scripts"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted" if dirty else "")


#: (data set, model, preset, widths, preprocessings, seeds, epochs, data dir, candidates) of one process.
Job = tuple[str, str, str, tuple[int, ...], tuple[str, ...], int, int | None, str | None,
            tuple[tuple[float, float], ...]]


def _job_runs(job: Job) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every pilot network of one (data set, model) (one process of `--jobs`), trained through the engine."""
    ds_name, kind, preset_name, widths, pres, n_seeds, epochs, data_dir, candidates = job
    torch.set_num_threads(int(os.environ.get("NTKM_THREADS", "1")))
    p = preset(preset_name)
    max_epochs = epochs or p["epochs"]
    jobs, meta, info = [], [], {}
    for seed in range(n_seeds):
        ds = load_data(ds_name, n_train=n_train_for(p, ds_name), n_test=1,
                       request=DataRequest(seed=seed, data_dir=data_dir))
        t = dataset_tensors(ds)
        info = {"n_train": int(ds.x_train.shape[0]), "data": ds.provenance.get("label", ds_name)}
        for pre in pres:
            for lr16, power in candidates:
                for w in widths:
                    spec = ModelSpec(kind, ds.d, w, t.out_dim, seed=seed, preprocess=pre, channels=input_channels(ds))
                    cfg = replace(protocol_config(PROPER, max_epochs, seed=seed), lr=lr16, lr_width_power=power)
                    model = build_model(spec, t.x_train)
                    with torch.no_grad():
                        loss0 = float(loss_fn(t.out_dim, cfg.loss)(model(t.x_train), t.y_train).mean())
                    jobs.append((model, t.x_train, t.y_train, cfg, None, None, f"pilot {ds_name} {kind} m={w}"))
                    meta.append({"seed": seed, "preprocess": pre, "model": kind, "width": w, "lr16": lr16,
                                 "power": power, "lr": effective_lr(cfg, w), "chance_loss": math.log(t.out_dim),
                                 "chance_acc": chance_accuracy(t.out_dim, t.out_dim), "initial_train_loss": loss0})
    runs = []
    for m, rec in zip(meta, train_many(jobs, label=f"pilot {ds_name} {kind}"), strict=True):
        runs.append({**m, "final_train_loss": rec.final_train_loss,
                     "loss_vs_chance": rec.final_train_loss / m["chance_loss"],
                     "final_train_acc": rec.final_train_acc, "epochs_run": rec.epochs_run,
                     "plateau_reached": rec.plateau_reached, "wall_s": rec.wall_s})
    return info, runs


def adequate_on_training(r: dict[str, Any]) -> bool:
    """The gate's training half: a plateau and train accuracy >= chance + GATE_TRAIN (1 - chance)."""
    return bool(r["plateau_reached"]) and r["final_train_acc"] >= r["chance_acc"] + GATE_TRAIN * (1 - r["chance_acc"])


def choose(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate with the most cells (preprocess, model, width) adequate on training in every seed; ties: the
    smallest worst-case final training loss / ln(classes) over the cells that some candidate makes adequate (a cell
    no candidate makes adequate, such as MLP-Attn at m = 16, cannot tell the candidates apart), then the smaller
    rate."""
    def cell(r: dict[str, Any]) -> tuple[str, str, int]:
        return r["preprocess"], r["model"], r["width"]

    cands = sorted({(r["lr16"], r["power"]) for r in runs})
    cells = sorted({cell(r) for r in runs})
    ok = {cand: [c for c in cells if all(adequate_on_training(r) for r in runs
                                         if cell(r) == c and (r["lr16"], r["power"]) == cand)] for cand in cands}
    informative = {c for cand in cands for c in ok[cand]}
    scores: dict[tuple[float, float], dict[str, Any]] = {}
    for cand in cands:
        rs = [r for r in runs if (r["lr16"], r["power"]) == cand]
        scores[cand] = {"adequate_cells": len(ok[cand]), "cells": len(cells),
                        "failing": ["/".join(map(str, c)) for c in cells if c not in ok[cand]],
                        "worst_loss_vs_chance": max((r["loss_vs_chance"] for r in rs if cell(r) in informative),
                                                    default=float("inf")),
                        "epochs_run_total": sum(r.get("epochs_run", 0) for r in rs)}
    best = min(scores, key=lambda c: (-scores[c]["adequate_cells"], scores[c]["worst_loss_vs_chance"], c[0]))
    return {"chosen": {"lr16": best[0], "power": best[1]},
            "cells_left_out_of_the_tie_break": ["/".join(map(str, c)) for c in cells if c not in informative],
            "scores": [{"lr16": c[0], "power": c[1], **v} for c, v in scores.items()]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/pilot-lr.json")
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--seeds", type=int, default=2, help="seeds 0..S-1, each its own data subset")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="processes (one (data set, model) each)")
    ap.add_argument("--epochs", type=int, default=None, help="maximum epochs (default: the preset's)")
    ap.add_argument("--widths", default=None, help="widths (default: the preset's sweep)")
    ap.add_argument("--preprocess", default=None, help="comma-separated preprocessings (default: the preset's)")
    ap.add_argument("--lr16", default=None, help="comma-separated rates at m = 16, each with every power "
                    f"{', '.join(map(str, POWERS))} (default: {', '.join(sorted({f'{a:g}' for a, _ in CANDIDATES}))})")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model kinds (default: relu,attn)")
    args = ap.parse_args(argv)
    try:
        p = preset(args.preset)
        widths = parse_int_list(args.widths, "--widths", minimum=1) if args.widths else tuple(p["widths"])
        pres = tuple(args.preprocess.split(",")) if args.preprocess else tuple(p["preprocessings"])
        candidates = CANDIDATES
        if args.lr16:
            rates = parse_float_list(args.lr16, "--lr16", lo=1e-6, hi=1.0)
            candidates = tuple((lr, pw) for pw in POWERS for lr in sorted(set(rates)))
        models = parse_choices(args.models, "--models", MODEL_KINDS)
        if (args.epochs is not None and args.epochs < 1) or args.seeds < 1:
            raise UserInputError(f"--epochs and --seeds must be >= 1, got {args.epochs}, {args.seeds}")
    except UserInputError as e:
        print(f"pilot_lr: {e}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {
        "what": "learning-rate pilot of the width-consistent protocol, training data only (scripts/pilot_lr.py)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git_commit": _commit(),
        "config": {"preset": args.preset, "seeds": list(range(args.seeds)), "widths": list(widths),
                   "models": list(models), "candidates": [{"lr16": a, "power": b} for a, b in candidates],
                   "lr_ref_width": LR_REF_WIDTH, "max_epochs": args.epochs or p["epochs"],
                   "schedule": f"lr16 * ({LR_REF_WIDTH} / m) ** power", "optimizer": "adam, no weight decay, batch 128",
                   "preprocessings": list(pres),
                   "rule": "most (preprocess, model, width) cells adequate on training (plateau and train accuracy "
                           f">= chance + {GATE_TRAIN:g}(1 - chance)) in every seed; ties: smallest worst-case final "
                           "training loss / ln(classes) over the cells some candidate makes adequate, then the smaller "
                           "lr16"},
        "datasets": {}}
    jobs = [(ds_name, kind, args.preset, widths, pres, args.seeds, args.epochs, args.data_dir, candidates)
            for ds_name in DATASETS for kind in models]
    jobs.sort(key=lambda j: j[0] != "cifar10")  # the longest first
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
            parts = pool.map(_job_runs, jobs, chunksize=1)
    else:
        parts = [_job_runs(job) for job in jobs]
    for ds_name in DATASETS:
        runs = [r for job, (_, rs) in zip(jobs, parts, strict=True) if job[0] == ds_name for r in rs]
        info = next(i for job, (i, _) in zip(jobs, parts, strict=True) if job[0] == ds_name)
        out["datasets"][ds_name] = {**info, "runs": runs, **choose(runs)}
        c = out["datasets"][ds_name]["chosen"]
        print(f"{ds_name}: chosen lr16 {c['lr16']:g}, power {c['power']:g}; "
              + "; ".join(f"({s['lr16']:g}, {s['power']:g}): {s['adequate_cells']}/{s['cells']} cells, worst "
                          f"{s['worst_loss_vs_chance']:.3f}" for s in out["datasets"][ds_name]["scores"]))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(out, f, indent=1)
    os.replace(f.name, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
