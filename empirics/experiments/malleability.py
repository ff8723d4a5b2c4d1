"""Influence malleability: how often a small perturbation of training data flips influence signs.

Protocol (docs/PAPER.md, "Influence malleability"; choices the paper leaves open are fixed here):

1. Train each network once per seed (Adam, the preset's epochs; `adv_train` adds a PGD-trained copy
   with the same seed). Every attack and eps value reuses that trained network.
2. Clean influence: NTK leave-one-out influence with the trained network's empirical kernel
   (`empirics.attribution.influence`: KRR on one-hot / +-1 targets, squared loss, ridge
   `ridge_rel * trace(K_m) / n` unless an absolute ridge is given; the ridge found on the clean data
   is kept for every recomputation, since it is a property of the predictor, not of the data).
   Influence of i is summed over the test set; positive = helpful.
3. Selection: the top `tau` fraction of training points by **absolute** total influence
   (`k = max(1, round(tau * n))`), i.e. the points the predictor relies on most, in either direction.
4. Perturbation: an L-infinity attack (FGSM / PGD / MIM, `empirics.nets.attacks`) at eps in pixel units,
   maximising the trained network's loss at the example's own label, clipped to [0, 1]. For MLP-Attn
   the attack sees the clean context (`attack_context="fixed"`) or the context rebuilt with its own
   perturbation (`"recomputed"`). **Baseline**: random signs times eps on the same points ("random").
5. Recompute the trained network's kernel on the modified training set. For MLP-Attn this rebuilds
   `C` from the modified training set, so the features of every training and test point change.
   Recompute influence (same ridge, same test set, same targets).

Interventions:

- `transformed` (the headline): replace the selected points by their perturbed versions. Reported:
  **flip rate** = fraction of the selected points whose total-influence sign flips; Spearman rho
  between old and new total influence over **all** training points (`rho_all`, the headline rho,
  "rankings" in the paper's sense) and over the selected points only (`rho_top`); `pair_flip_rate`
  = fraction of (selected point, test point) pairs whose per-test influence sign flips.
- `curated`: remove the selected points. Reported: change in the kernel predictor's test loss and
  accuracy, Spearman rho and sign-flip fraction of the remaining points' influences. Baseline:
  removing the same number of random points. Attacks play no part.
- `adversarial`: perturb *all* training points with the attack; flip rate over the clean top-tau
  set and rho over all points. Baseline: random signs on all points.

Per-example records (index, old influence, new influence, flipped) are kept for every selected point. Every
trained network also records the test accuracy of kernel regression with the analytic NTK of its model and with
its own trained kernel, on its training subset (`empirics.experiments.distance.kernel_predictor_accuracy`: the
NTK-distance predictor's ridge rule, not the influence ridge above).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from empirics import fieldhelp as H
from empirics.attribution.influence import RIDGE_REL_DEFAULT, InfluenceResult, Ridge, influence_scores, model_kernels
from empirics.common import (
    NetworkRequest,
    SeedMap,
    Tensors,
    experiment_data,
    local_map,
    subset_provenance,
    train_network,
    train_networks,
    train_seeds_together,
)
from empirics.experiments.distance import kernel_predictor_accuracy
from empirics.experiments.mall_stats import BASELINE, INTERVENTIONS, MallSummary, paper_ratio_range, summarise
from empirics.intervals import spearman
from empirics.nets.attacks import CONTEXT_MODES, AttackConfig, attack
from empirics.nets.kinds import KINDS, kinds_where
from empirics.nets.models import ModelSpec, TwoLayerNet, input_channels
from empirics.nets.train import TrainConfig
from empirics.progress import log
from empirics.records import HasRunHeader, run_header
from empirics.vocab import MODEL_KINDS, PAPER_ATTACKS
from ntkm.codec import Record, encode
from ntkm.errors import UserInputError
from theory.paper import PAPER_FLIP


@dataclass(frozen=True)
class MalleabilityConfig:
    """One malleability experiment. `eps` is the headline value; `eps_sweep` adds more values.

    `adv_steps` is the number of PGD steps inside adversarial training (at `eps`); `attack_steps`
    those of PGD and MIM when measuring (step size 2.5 eps / steps, MIM momentum 1.0). The fields with `H.shared`
    are the data and architecture block every experiment config declares alike
    (`empirics.fieldhelp.ExperimentFields`).
    """

    dataset: str = H.shared("dataset")
    task: str = H.shared("task")
    classes: tuple[str, ...] | None = H.shared("classes")
    models: tuple[str, ...] = H.shared("models")
    attacks: tuple[str, ...] = H.helped(PAPER_ATTACKS, "comma-separated: fgsm, pgd, mim (random noise of the same eps "
                                        "always runs as the baseline)", flag="--attack")
    eps: float = H.helped(0.3, "L-infinity budget in pixel units, in [0, 1] (default: %(default)s)")
    eps_sweep: tuple[float, ...] = H.helped((), "more eps values, e.g. 0.1,0.2,0.3,0.5")
    tau: float = H.helped(0.1, "fraction of training points selected by |influence|, in (0, 1]")
    seeds: tuple[int, ...] = H.shared("seeds")
    interventions: tuple[str, ...] = H.helped(INTERVENTIONS, "comma-separated: transformed (headline), curated, "
                                              "adversarial", flag="--intervention")
    width: int = H.shared("width")
    n_train: int = H.shared("n_train")
    n_test: int = H.shared("n_test")
    sample: str = H.shared("sample")
    data_seed: int = H.shared("data_seed")
    per_seed_data: bool = H.shared("per_seed_data")
    train: TrainConfig = H.shared("train")
    seed_baseline: bool = False
    adv_train: bool = H.helped(False, "also train with PGD (at --eps) and compare flip rates before and after")
    adv_max_epochs: int | None = None
    adv_steps: int = H.helped(7, "PGD steps inside adversarial training")
    attack_steps: int = H.helped(10, "PGD / MIM steps")
    attack_context: str = H.helped("fixed", "MLP-Attn attacks see the clean context (fixed) or their own "
                                   "perturbation (recomputed)")
    ridge: float | None = H.helped(None, "absolute KRR ridge (default: relative, below)")
    ridge_rel: float = H.helped(RIDGE_REL_DEFAULT, "ridge = RIDGE_REL * trace(K_m) / n when --ridge is not given "
                                "(default: %(default)s)")
    parameterization: str = H.shared("parameterization")
    attn_layers: int = H.shared("attn_layers")
    attn_rank: int | None = H.shared("attn_rank")
    attn_centre: bool = H.shared("attn_centre")
    preprocess: str = H.shared("preprocess")
    data_dir: str | None = H.shared("data_dir")
    data_source: str = H.shared("data_source")
    device: str = H.shared("device")

    def __post_init__(self) -> None:
        for a in self.attacks:
            if a not in PAPER_ATTACKS:
                raise UserInputError(f"unknown attack '{a}'; choose from {', '.join(PAPER_ATTACKS)} "
                                     "(random noise is always run as the baseline)")
        for m in self.models:
            if m not in MODEL_KINDS:
                raise UserInputError(f"unknown model '{m}'; choose from {', '.join(MODEL_KINDS)}")
        for i in self.interventions:
            if i not in INTERVENTIONS:
                raise UserInputError(f"unknown intervention '{i}'; choose from {', '.join(INTERVENTIONS)}")
        if not self.attacks or not self.models or not self.interventions or not self.seeds:
            raise UserInputError("give at least one attack, model, intervention and seed")
        for e in (self.eps, *self.eps_sweep):
            if not (isinstance(e, (int, float)) and 0.0 <= e <= 1.0):
                raise UserInputError(f"eps must be in [0, 1] (pixel units), got {e}")
        if not (isinstance(self.tau, (int, float)) and 0.0 < self.tau <= 1.0):
            raise UserInputError(f"tau must be in (0, 1] (a fraction of the training set), got {self.tau}")
        if self.attack_context not in CONTEXT_MODES:
            raise UserInputError(f"unknown attack context '{self.attack_context}'; choose fixed or recomputed")
        unsupported = [m for m in self.models if KINDS[m].has_context and not KINDS[m].recomputed_context]
        if self.attack_context == "recomputed" and unsupported:
            raise UserInputError(f"--attack-context recomputed is implemented for "
                                 f"{', '.join(kinds_where(recomputed_context=True))} only; use --attack-context fixed "
                                 f"with models {', '.join(unsupported)} (their kernels are still rebuilt after the "
                                 "attack)")
        if self.n_train < 2 or self.n_test < 1 or self.width < 1:
            raise UserInputError("n_train must be >= 2, n_test >= 1 and width >= 1")
        if self.attack_steps < 1 or self.adv_steps < 1:
            raise UserInputError("attack_steps and adv_steps must be >= 1")

    @property
    def eps_values(self) -> tuple[float, ...]:
        """The headline eps first, then the sweep values not equal to it, in the order given."""
        out = [float(self.eps)]
        for e in self.eps_sweep:
            if float(e) not in out:
                out.append(float(e))
        return tuple(out)

    def n_selected(self) -> int:
        return n_top(self.tau, self.n_train)


def n_top(tau: float, n: int) -> int:
    """How many points the top-tau selection takes: `max(1, round(tau * n))`, at most n."""
    return max(1, min(n, int(round(tau * n))))


def top_by_abs(total: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` largest |total| (ties broken by index), sorted ascending."""
    order = np.lexsort((np.arange(len(total)), -np.abs(total)))
    return np.sort(order[:k])


def compare(old: InfluenceResult, new: InfluenceResult, sel: np.ndarray,
            keep_examples: bool = True) -> dict[str, Any]:
    """Flip rate over `sel`, Spearman rho over all points and over `sel`, pair flip rate, records.

    `old` and `new` index the same training points (the transformed and adversarial interventions).
    """
    o, n = old.total, new.total
    flipped = np.sign(o[sel]) != np.sign(n[sel])
    pair = np.sign(old.per_test[sel]) != np.sign(new.per_test[sel])
    out: dict[str, Any] = {
        "flip_rate": float(flipped.mean()),
        "rho_all": spearman(o, n),
        "rho_top": spearman(o[sel], n[sel]),
        "pair_flip_rate": float(pair.mean()),
        "n_selected": int(len(sel)),
        "kernel_test_loss": new.test_loss,
        "kernel_test_acc": new.test_acc,
    }
    if keep_examples:
        out["examples"] = [{"index": int(i), "old": float(o[i]), "new": float(n[i]), "flipped": bool(f)}
                           for i, f in zip(sel, flipped, strict=True)]
    return out


def _attack_cfg(name: str, eps: float, cfg: MalleabilityConfig, seed: int) -> AttackConfig:
    return AttackConfig(name, eps, steps=cfg.attack_steps, seed=seed, context=cfg.attack_context)


def _attack_seed(seed: int, eps_idx: int, name: str, intervention: str) -> int:
    code = (BASELINE,) + PAPER_ATTACKS
    return 1_000_003 * seed + 10_007 * eps_idx + 101 * code.index(name) + INTERVENTIONS.index(intervention)


def measure_model(model: TwoLayerNet, t: Tensors, cfg: MalleabilityConfig, seed: int) -> dict[str, Any]:
    """Every intervention, attack (plus the random baseline) and eps for one trained network."""
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    kernels = model_kernels(model, x, xt)
    clean = influence_scores(model, (x, y), (xt, yt), Ridge(cfg.ridge, cfg.ridge_rel), kernels=kernels)
    t0 = time.perf_counter()
    predictors = kernel_predictor_accuracy(model, t, cfg.train.weight_decay, trained=kernels)
    lam = clean.ridge
    n = x.shape[0]
    k = n_top(cfg.tau, n)
    sel = top_by_abs(clean.total, k)
    sel_t = torch.as_tensor(sel, device=x.device)
    everyone = torch.arange(n, device=x.device)
    res: dict[str, Any] = {
        "ridge": lam, "selected": sel.tolist(), "n_selected": k,
        "clean": {"kernel_test_loss": clean.test_loss, "kernel_test_acc": clean.test_acc,
                  "positive_fraction": float(np.mean(clean.total > 0)),
                  "selected_positive_fraction": float(np.mean(clean.total[sel] > 0))},
        "measurements": [],
        **predictors, "kernel_predictor_wall_s": time.perf_counter() - t0,
    }
    names = (BASELINE,) + tuple(cfg.attacks)
    for e_idx, eps in enumerate(cfg.eps_values):
        for intervention in ("transformed", "adversarial"):
            if intervention not in cfg.interventions:
                continue
            idx_t = sel_t if intervention == "transformed" else everyone
            for name in names:
                acfg = _attack_cfg(name, eps, cfg, _attack_seed(seed, e_idx, name, intervention))
                x_adv = attack(model, x[idx_t], y[idx_t], acfg, train_x=x, train_idx=idx_t)
                x_new = x.index_copy(0, idx_t, x_adv)
                new = influence_scores(model, (x_new, y), (xt, yt), Ridge(lam))
                m = compare(clean, new, sel)
                m.update({"intervention": intervention, "attack": name, "eps": eps,
                          "max_abs_perturbation": float((x_new - x).abs().max())})
                res["measurements"].append(m)
    if "curated" in cfg.interventions:
        rng = np.random.default_rng(seed + 7_777)
        for name, removed in (("removal", sel), (BASELINE, np.sort(rng.choice(n, size=k, replace=False)))):
            keep = np.setdiff1d(np.arange(n), removed)
            kt = torch.as_tensor(keep, device=x.device)
            new = influence_scores(model, (x[kt], y[kt]), (xt, yt), Ridge(lam))
            res["measurements"].append({
                "intervention": "curated", "attack": name, "eps": None, "removed": removed.tolist(),
                "kernel_test_loss": new.test_loss, "kernel_test_acc": new.test_acc,
                "test_loss_change": new.test_loss - clean.test_loss,
                "test_acc_change": round(new.test_acc - clean.test_acc, 12),
                "rho_remaining": spearman(clean.total[keep], new.total),
                "flip_rate_remaining": float(np.mean(np.sign(clean.total[keep]) != np.sign(new.total))),
            })
    return res


def seed_baseline(model: TwoLayerNet, other: TwoLayerNet, t: Tensors, cfg: MalleabilityConfig) -> dict[str, Any]:
    """Influence signs that differ between two trainings that differ only in the initialisation seed.

    No perturbation at all: the fraction of `model`'s top-tau points (by |total influence|) whose
    total-influence sign differs under `other`, with the same ridge rule. This is how unstable the
    signs are anyway; a flip rate is only informative above it.
    """
    reg = Ridge(cfg.ridge, cfg.ridge_rel)
    a = influence_scores(model, (t.x_train, t.y_train), (t.x_test, t.y_test), reg)
    b = influence_scores(other, (t.x_train, t.y_train), (t.x_test, t.y_test), reg)
    sel = top_by_abs(a.total, n_top(cfg.tau, t.x_train.shape[0]))
    flipped = np.sign(a.total[sel]) != np.sign(b.total[sel])
    return {"flip_rate": float(flipped.mean()), "flipped": flipped.tolist(), "rho_all": spearman(a.total, b.total)}


#: Offset of the initialisation seed of the second network in the seed-to-seed baseline.
OTHER_INIT = 10_000


def network_config(cfg: MalleabilityConfig, ds: Any, t: Tensors, kind: str, seed: int,
                   adv: bool) -> tuple[ModelSpec, TrainConfig]:
    """The network `kind` of seed `seed` and its training (PGD adversarial training when `adv`)."""
    spec = ModelSpec(kind, ds.d, cfg.width, t.out_dim, cfg.parameterization, cfg.attn_layers,
                     cfg.attn_rank, seed, cfg.attn_centre,
                     preprocess=cfg.preprocess, channels=input_channels(ds))
    epochs = cfg.train.epochs if not adv or cfg.adv_max_epochs is None else min(
        cfg.train.epochs, cfg.adv_max_epochs)
    tcfg = replace(cfg.train, seed=seed, adv_train=adv, adv_eps=cfg.eps_values[0],
                   adv_steps=cfg.adv_steps, epochs=epochs)
    return spec, tcfg


def malleability_networks(cfg: MalleabilityConfig, ds: Any, t: Tensors, device: str,
                          seed: int) -> list[NetworkRequest]:
    """Every network seed `seed` trains: each model (standard, and adversarially when asked) and the second
    initialisation of the seed-to-seed baseline."""
    out = []
    for adv in (False, True) if cfg.adv_train else (False,):
        for kind in cfg.models:
            spec, tcfg = network_config(cfg, ds, t, kind, seed, adv)
            out.append(NetworkRequest(spec, t, tcfg, device))
            if cfg.seed_baseline and not adv:
                o_seed = seed + OTHER_INIT
                out.append(NetworkRequest(replace(spec, seed=o_seed), t, replace(tcfg, seed=o_seed), device))
    return out


def _seed_networks(cfg: MalleabilityConfig, dataset: Any | None, seed: int) -> list[NetworkRequest]:
    ds, t, device = experiment_data(cfg, dataset, seed)
    return malleability_networks(cfg, ds, t, device, seed)


def malleability_seed(cfg: MalleabilityConfig, dataset: Any | None, seed: int) -> dict[str, Any]:
    """One seed of the experiment: its data subset, and every model trained (standard, and adversarially when
    asked; the networks trained together by the batched engine, or found trained by `run_malleability`) and
    measured on it."""
    trainings = [("standard", False)] + ([("adversarial", True)] if cfg.adv_train else [])
    ds, t, device = experiment_data(cfg, dataset, seed)
    train_networks(malleability_networks(cfg, ds, t, device, seed))
    runs: list[dict[str, Any]] = []
    for training, adv in trainings:
        for kind in cfg.models:
            spec, tcfg = network_config(cfg, ds, t, kind, seed, adv)
            t1 = time.perf_counter()
            tr = train_network(spec, t, tcfg, device, label=f"{kind} seed {seed} {training}")
            t2 = time.perf_counter()
            res = measure_model(tr.model, t, cfg, seed)
            res.update({"training": training, "model": kind, "seed": seed, **tr.training_summary(),
                        "measure_wall_s": time.perf_counter() - t2})
            if cfg.seed_baseline and not adv:
                o_seed = seed + OTHER_INIT
                other = train_network(replace(spec, seed=o_seed), t, replace(tcfg, seed=o_seed), device,
                                      label=f"{kind} seed {seed} second init")
                res["seed_baseline"] = {**seed_baseline(tr.model, other.model, t, cfg),
                                        "other_init_seed": seed + OTHER_INIT, "other_gate": other.gate}
            runs.append(res)
            flips = [m["flip_rate"] for m in res["measurements"]
                     if m["intervention"] == "transformed" and m["eps"] == cfg.eps_values[0]]
            log(f"malleability {cfg.dataset} {kind} seed {seed} {training}: train/test acc "
                f"{tr.record.final_train_acc:.3f}/{tr.record.final_test_acc:.3f} after {tr.record.epochs_run} "
                f"epochs (gate: {tr.gate['reason']}), transformed flip rates "
                f"{', '.join(f'{100 * f:.0f}%' for f in flips)} "
                f"(train {t2 - t1:.0f}s, measure {time.perf_counter() - t2:.0f}s)")
    return {"seed": seed, "runs": runs, "provenance": ds.provenance, "device": device}


@dataclass(frozen=True)
class MalleabilityRecord(HasRunHeader, Record):
    """The result of `run_malleability`: its config, the per-run measurements (one dict per model, seed and
    training, each with its per-example records) and their statistics (`summary`)."""

    experiment: str
    config: dict[str, Any]
    eps_values: list[float]
    n_selected: int
    definitions: dict[str, str]
    paper: dict[str, Any]
    runs: list[dict[str, Any]]
    summary: MallSummary
    data: dict[str, Any]
    versions: dict[str, Any]
    device: dict[str, Any]
    wall_s: float


def run_malleability(cfg: MalleabilityConfig, dataset: Any | None = None,
                     seed_map: SeedMap = local_map) -> MalleabilityRecord:
    """The whole experiment: a record of the config, per-run measurements and summary (its values as the cache
    reads them back).

    With `per_seed_data` each seed draws its own training and test subset, so spreads and intervals
    over seeds are over data subsets and initialisations together. Here (`local_map`), the networks of every
    seed are trained together first (`empirics.common.train_seeds_together`). Every run records its training
    (accuracies, loss, plateau, curve) and the adequacy gate's decision.
    """
    t0 = time.perf_counter()
    train_seeds_together(seed_map, cfg.seeds, partial(_seed_networks, cfg, dataset))
    parts = seed_map(partial(malleability_seed, cfg, dataset), cfg.seeds)
    runs = [r for part in parts for r in part["runs"]]
    device = parts[-1]["device"]
    return MalleabilityRecord.from_dict(encode({
        "experiment": "malleability",
        "config": asdict(cfg),
        "eps_values": list(cfg.eps_values),
        "n_selected": cfg.n_selected(),
        "definitions": {
            "influence": "L(f_-i) - L(f), squared error summed over outputs and over the test set; "
                         "positive = the point helps",
            "kernel": "per-output empirical NTK of the trained network, float64; MLP-Attn context rebuilt "
                      "from the (modified) training set",
            "ridge": "absolute ridge if given, else ridge_rel * trace(K_m) / n on the clean data; kept fixed",
            "selection": "top tau fraction by absolute total influence",
            "flip_rate": "fraction of the selected points whose total-influence sign flips",
            "headline_rho": "rho_all: Spearman rho of old vs new total influence over all training points",
            "baseline": "random signs times eps on the same points",
            "seed_baseline": "fraction of the top points whose influence sign differs between two networks "
                             "trained identically except for the initialisation seed (no perturbation)",
        },
        "paper": {"flip_pct": PAPER_FLIP.get((cfg.dataset, cfg.task)),
                  "ratio_range": paper_ratio_range(cfg.dataset, cfg.task)},
        "runs": runs,
        "summary": summarise(runs, cfg),
        "data": subset_provenance({part["seed"]: part["provenance"] for part in parts}),
        **run_header(device),
        "wall_s": time.perf_counter() - t0,
    }))
