"""Retrain-based flip rates: does a small perturbation of the most influential training points flip the sign of
their *actual* effect on the trained network, as the NTK flip rate says it flips their kernel-predictor influence?

The NTK flip rate (`empirics.experiments.malleability`) keeps the trained network fixed and recomputes the leave-one-out
influence of its kernel machine on the perturbed training set. Here the influence is measured by retraining:

1. A reference network (seed `seeds[0]`) is trained under the protocol on the clean training set; its NTK
   leave-one-out influence selects the top-tau points by |total influence| (the paper's selection,
   `empirics.experiments.malleability.top_by_abs`), and the attack (PGD at eps, against the reference network's training
   loss, the clean MLP-Attn context) perturbs them. The random baseline replaces the attack by random signs times eps.
2. For every retrain seed s (its own initialisation and batch order), networks are trained on each training set
   (clean, attacked, random) in full and without each selected point. The **actual effect** of point i in seed s is
   the change of the network's summed test loss when i is removed, `a[i, s] = L_t(without i) - L_t(full)`, on the
   loss the network is trained with (cross-entropy; squared error under gd-mse), and also on the squared error to
   one-hot / +-1 targets, the loss of the NTK estimand (`squared`). Positive: i is helpful (the sign convention of
   `empirics.attribution.influence`).
3. **Flip**: a point's effect flips when the sign of its mean over seeds changes and the mean paired change
   `mean_s (a'[i, s] - a[i, s])` exceeds the seed noise, `t_(0.975, k(R-1)) * s_p / sqrt(R)`, with `s_p^2` the
   variance over seeds of the paired changes pooled over the k points (zero when the fit is deterministic, as for
   kernel regression; then every sign change counts). The **same-seed pair rate** is the share of (point, seed)
   pairs whose sign changes; the **seed-to-seed rate** is the share of (point, pair of seeds) whose clean effects
   have opposite signs: how often the sign changes with nothing but the seed.
4. **Null from disjoint seed halves** (`halves_null`, with four retrain seeds or more): the flip statistic of step 3
   between the clean effects of the first and of the second half of the seeds, nothing perturbed: how often "a flip
   beyond seed noise" appears when only the seed changes (issue 40 item 5).
5. Beside it, the NTK flip rate of the reference network on the same points and perturbations.

`fixed_context`: the ablation of MLP-Attn's attention context: every retrained network keeps the context of the clean
full training set (`retrain_model`), so a flip it shows comes from the weights' fit, not from the context the
perturbed or reduced set would rebuild.

`effect_flips` and `seed_flip_rate` take any (k, R) arrays of effects, so a fit whose leave-one-out is exact
(kernel regression) checks them against the closed form (tests).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from empirics.attribution.influence import RetrainSetting, Ridge, influence_scores
from empirics.intervals import wilson
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.losses import loss_fn, targets
from empirics.records import HasRunHeader
from ntkm.codec import Record, encode
from ntkm.errors import UserInputError

#: The perturbed training sets besides the clean one: the attack and its random-noise baseline.
SETS = ("attack", "random")


@dataclass(frozen=True)
class RetrainFlipConfig(RetrainSetting):
    """One retrain-based flip study (MNIST 10 classes by default; `seeds` are the retrain seeds, the first is the
    reference network's; the top `tau` by |influence| perturbed by `attack` at `eps`)."""

    tau: float = 0.1
    eps: float = 0.3
    attack: str = "pgd"
    attack_steps: int = 10
    seeds: tuple[int, ...] = (0, 1, 2)
    fixed_context: bool = False

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UserInputError(f"give distinct retrain seeds, got {self.seeds}")
        if not 0.0 < self.tau <= 1.0:
            raise UserInputError(f"tau must be in (0, 1], got {self.tau}")
        if self.n_train < 3 or self.n_test < 1:
            raise UserInputError("n_train must be >= 3 and n_test >= 1")


def noise_threshold(changes: np.ndarray, alpha: float = 0.05) -> float:
    """`t_(1 - alpha/2, k(R-1)) * s_p / sqrt(R)` for paired changes (k, R): how far a mean change over R seeds must
    lie from 0 to be more than seed noise (0 when R = 1 or the changes do not vary over seeds)."""
    k, r = changes.shape
    if r < 2:
        return 0.0
    s2 = float(np.mean(np.var(changes, axis=1, ddof=1)))
    return float(stats.t.ppf(1 - alpha / 2, k * (r - 1)) * np.sqrt(s2 / r)) if s2 > 0 else 0.0


def effect_flips(clean: np.ndarray, pert: np.ndarray, alpha: float = 0.05) -> dict[str, Any]:
    """Flips of actual effects (k points x R seeds, clean and perturbed): the flip rate beyond seed noise with its
    Wilson interval, the same-seed pair rate, and per point whether it flipped (module docstring, step 3)."""
    clean, pert = np.asarray(clean, dtype=np.float64), np.asarray(pert, dtype=np.float64)
    if clean.shape != pert.shape or clean.ndim != 2 or clean.shape[0] == 0:
        raise UserInputError(f"effects must be two arrays of the same shape (points, seeds), got {clean.shape} and "
                             f"{pert.shape}")
    k, r = clean.shape
    change = pert - clean
    thr = noise_threshold(change, alpha)
    mc, mp = clean.mean(axis=1), pert.mean(axis=1)
    flipped = (np.sign(mc) != np.sign(mp)) & (np.abs(change.mean(axis=1)) > thr)
    rate = float(flipped.mean())
    pair = float(np.mean(np.sign(clean) != np.sign(pert)))
    return {"flip_rate": rate, "flip_ci": list(wilson(rate, k)), "n_flipped": int(flipped.sum()), "n_points": k,
            "pair_flip_rate": pair, "pair_ci": list(wilson(pair, k * r)), "noise_threshold": thr,
            "flipped": flipped.tolist()}


def seed_flip_rate(clean: np.ndarray) -> dict[str, Any]:
    """Share of (point, pair of seeds) whose clean effects have opposite signs, with its Wilson interval over the
    pairs (nan with one seed)."""
    clean = np.asarray(clean, dtype=np.float64)
    k, r = clean.shape
    pairs = [(a, b) for a in range(r) for b in range(a + 1, r)]
    if not pairs:
        return {"rate": float("nan"), "ci": [float("nan"), float("nan")], "n_pairs": 0}
    s = np.sign(clean)
    rate = float(np.mean([s[:, a] != s[:, b] for a, b in pairs]))
    return {"rate": rate, "ci": list(wilson(rate, k * len(pairs))), "n_pairs": k * len(pairs)}


def halves_null(clean: np.ndarray, alpha: float = 0.05) -> dict[str, Any] | None:
    """`effect_flips` between the clean effects (k x R) of the first and of the second half of the seeds (R // 2
    each; an odd last seed is left out), column i of one half paired with column i of the other: the flip rate that
    seed noise alone gives. None with fewer than four seeds (a half needs two for its noise threshold)."""
    clean = np.asarray(clean, dtype=np.float64)
    h = clean.shape[1] // 2
    if h < 2:
        return None
    out = effect_flips(clean[:, :h], clean[:, h:2 * h], alpha)
    return {**out, "seeds_per_half": h}


def retrain_model(spec: Any, x_set: torch.Tensor, clean: torch.Tensor, fixed_context: bool, device: str) -> Any:
    """A network to retrain on `x_set` (a training set, perturbed or reduced): preprocessing statistics from the clean
    training set `clean`, and, with `fixed_context`, the attention context of the clean set as well (the ablation;
    a kind without a context ignores it)."""
    from empirics.nets.models import build_model

    net = build_model(spec, x_set, device=device, reference=clean)
    if fixed_context:
        net.set_context(clean)
    return net


def resolved_points(clean: np.ndarray, alpha: float = 0.05) -> int:
    """How many points' mean clean effect lies beyond its seed noise (`noise_threshold` of the effects themselves):
    points whose effect has a sign at all."""
    clean = np.asarray(clean, dtype=np.float64)
    return int(np.sum(np.abs(clean.mean(axis=1)) > noise_threshold(clean, alpha)))


@dataclass(frozen=True)
class RetrainFlipRecord(HasRunHeader, Record):
    """The result of `retrain_flip_study`: the reference network's gate, the selected points, the retrained effects
    (`effects[set][loss]`: k x R), the flip statistics per perturbation and loss, the seed-to-seed rate, and the NTK
    flip rate of the same points."""

    experiment: str
    config: dict[str, Any]
    model: str
    training: dict[str, Any]
    gates: list[dict[str, Any]]
    selected: list[int]
    effects: dict[str, Any]
    flips: dict[str, Any]
    seed_flips: dict[str, Any]
    resolved: dict[str, Any]
    ntk_flips: dict[str, Any]
    loss: str
    data: dict[str, Any]
    versions: dict[str, Any]
    device: dict[str, Any]
    wall_s: float
    null_halves: dict[str, Any] | None = None


def retrain_flip_study(cfg: RetrainFlipConfig) -> RetrainFlipRecord:
    """Retrain-based flip rates of one network kind under one protocol (module docstring)."""
    from empirics.common import dataset_tensors
    from empirics.data.datasets import DataRequest, load_dataset
    from empirics.experiments.malleability import compare, n_top, top_by_abs
    from empirics.nets.engine import train_many
    from empirics.nets.models import ModelSpec, build_model, input_channels
    from empirics.nets.protocols import adequacy, chance_accuracy, protocol_config
    from empirics.records import pick_device, run_header

    t0 = time.perf_counter()
    device = pick_device(cfg.device)
    ds = load_dataset(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test,
                      request=DataRequest(task=cfg.task, seed=cfg.data_seed, data_dir=cfg.data_dir))
    t = dataset_tensors(ds, device)
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    n = x.shape[0]
    chance = chance_accuracy(t.out_dim, t.out_dim)

    def spec(seed: int) -> ModelSpec:
        return ModelSpec(cfg.model, x.shape[1], cfg.width, t.out_dim, seed=seed, preprocess=cfg.preprocess,
                         channels=input_channels(ds))

    def tcfg(seed: int) -> Any:
        return protocol_config(cfg.protocol, cfg.epochs, seed=seed, dataset=cfg.dataset, preprocess=cfg.preprocess,
                               lr_power=cfg.lr_power)

    train_loss = loss_fn(t.out_dim, tcfg(0).loss)
    Yt = targets(yt, t.out_dim, torch.float64)

    def losses(net: torch.nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            out = net(xt)
            return float(train_loss(out, yt).double().sum()), float(((out.double() - Yt) ** 2).sum())

    ref = build_model(spec(cfg.seeds[0]), x, device=device)
    (ref_rec,) = train_many([(ref, x, y, tcfg(cfg.seeds[0]), xt, yt, f"flip-retrain {cfg.model} reference")])
    clean_infl = influence_scores(ref, (x, y), (xt, yt), Ridge(rel=cfg.ridge_rel))
    sel = top_by_abs(clean_infl.total, n_top(cfg.tau, n))
    sel_t = torch.as_tensor(sel, device=x.device)
    train_sets = {"clean": x}
    ntk: dict[str, Any] = {}
    for name in SETS:
        acfg = AttackConfig("random" if name == "random" else cfg.attack, cfg.eps, steps=cfg.attack_steps,
                            seed=1_000_003 + SETS.index(name))
        x_new = x.index_copy(0, sel_t, attack(ref, x[sel_t], y[sel_t], acfg, train_x=x, train_idx=sel_t))
        train_sets[name] = x_new
        new = influence_scores(ref, (x_new, y), (xt, yt), Ridge(clean_infl.ridge))
        m = compare(clean_infl, new, sel, keep_examples=False)
        ntk[name] = {"flip_rate": m["flip_rate"], "flip_ci": list(wilson(m["flip_rate"], len(sel))),
                     "pair_flip_rate": m["pair_flip_rate"]}

    keeps = [np.arange(n)] + [np.setdiff1d(np.arange(n), [i]) for i in sel]
    jobs, where = [], []
    for set_name, xs in train_sets.items():
        for s in cfg.seeds:
            for j, keep in enumerate(keeps):
                kt = torch.as_tensor(keep, device=x.device)
                net = retrain_model(spec(s), xs[kt], x, cfg.fixed_context, device)
                jobs.append((net, xs[kt], y[kt], tcfg(s), xt, yt, f"flip-retrain {cfg.model} {set_name}"))
                where.append((set_name, s, j))
    recs = train_many(jobs)
    k, r = len(sel), len(cfg.seeds)
    raw = {(sn, s, j): losses(job[0]) for (sn, s, j), job in zip(where, jobs, strict=True)}
    effects: dict[str, dict[str, list[list[float]]]] = {}
    for set_name in train_sets:
        for li, loss_name in enumerate(("training", "squared")):
            eff = np.array([[raw[(set_name, s, j + 1)][li] - raw[(set_name, s, 0)][li] for s in cfg.seeds]
                            for j in range(k)]).reshape(k, r)
            effects.setdefault(set_name, {})[loss_name] = eff.tolist()
    flips = {name: {loss_name: effect_flips(np.array(effects["clean"][loss_name]), np.array(effects[name][loss_name]))
                    for loss_name in ("training", "squared")} for name in SETS}
    gates = [{"set": sn, "seed": s, "removed": None if j == 0 else int(sel[j - 1]),
              **adequacy(rec, chance)} for (sn, s, j), rec in zip(where, recs, strict=True)]
    return RetrainFlipRecord.from_dict(encode({
        "experiment": "flip-retrain",
        "config": asdict(cfg),
        "model": cfg.model,
        "training": {"train_acc": ref_rec.final_train_acc, "test_acc": ref_rec.final_test_acc,
                     "epochs_run": ref_rec.epochs_run, "plateau_reached": ref_rec.plateau_reached,
                     "gate": adequacy(ref_rec, chance)},
        "gates": gates,
        "selected": sel.tolist(),
        "effects": effects,
        "flips": flips,
        "seed_flips": {ln: seed_flip_rate(np.array(effects["clean"][ln])) for ln in ("training", "squared")},
        "resolved": {ln: resolved_points(np.array(effects["clean"][ln])) for ln in ("training", "squared")},
        "ntk_flips": ntk,
        "loss": "cross-entropy" if tcfg(0).loss != "mse" and t.out_dim > 1 else "squared error",
        "data": ds.provenance,
        **run_header(device),
        "wall_s": time.perf_counter() - t0,
        "null_halves": halves_by_loss(effects["clean"]),
    }))


def halves_by_loss(clean: dict[str, Any]) -> dict[str, Any] | None:
    """`halves_null` of each loss's clean effects (None with fewer than four seeds)."""
    out = {ln: halves_null(np.array(m)) for ln, m in clean.items()}
    return None if any(v is None for v in out.values()) else out
