"""The cost model of experiment units: what a unit computes, counted from its config, and its estimated seconds.

One model, two sources of primitive costs. `networks` lists every network a unit trains (model, data set, n,
width, epochs, a cost factor and the network's identity) and `unit_seconds` adds up its training epochs, its
kernel work (`kernel_work`: empirical NTKs, Cholesky solves, eigendecompositions) and its landscape passes,
each priced by a `Primitives` object. `benchmarks.scale` prices them with primitives it measures at the paper's
sizes; `verify claims` (`--plan`, and the local executor's longest-first order) with `CALIBRATED`, an analytic
model whose constants were fitted to the measured unit times of a quick run (`fit`, reported by
`python -m benchmarks.costs`).

A process remembers the networks it trained (`empirics.common.train_network`), so a unit whose networks an
earlier unit of the same process trained costs only its measurements. `plan` estimates in run order with that
memo, `groups` keeps the units that share networks together (the local executor runs a group in one worker), and
`makespan` is the wall time of groups taken longest first by `jobs` workers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from empirics.nets.kinds import KINDS

#: Input dimension per data set.
D = {"mnist": 784, "cifar10": 3072}
#: The models a unit trains when its config does not name them (the experiments' default).
MODELS = ("relu", "attn")
#: The training batch of both claims protocols.
BATCH = 128
#: Classes of the output layer (a binary task has fewer; the difference is below the model's resolution).
OUT = 10
#: `empirics.experiments.malleability.OTHER_INIT`: the seed offset of the seed baseline's second network.
OTHER_INIT = 10_000


class Network(NamedTuple):
    """One network a unit trains: `epochs` at most, each costing `factor` plain epochs (PGD adversarial training:
    its steps + 1); `regime` is "full" when every epoch runs (the paper protocol, adversarial training) and
    "plateau" when training may stop at a plateau before `epochs`; `key` identifies it for the process's memo of
    trained networks (None: never shared)."""

    kind: str
    dataset: str
    n: int
    m: int
    epochs: int
    factor: float
    regime: str
    key: tuple[Any, ...] | None


class Primitives(Protocol):
    """Seconds of the primitives a unit is made of."""

    def epoch_s(self, kind: str, d: int, n: int, m: int, regime: str) -> float:
        """One training epoch (batch 128) of `kind` at input dimension d, n points, width m; under the "plateau"
        regime, the expected cost of one epoch of the maximum (a model may price it as a full epoch: an upper
        bound)."""

    def kernel(self, d: int, n: int, m: int) -> float:
        """One empirical NTK of n points at width m."""

    def solve_at(self, n: int) -> float:
        """One float64 Cholesky solve of an n x n kernel."""

    def eig(self, n: int) -> float:
        """One symmetric eigendecomposition of an n x n matrix."""

    def unit(self) -> float:
        """A unit's fixed cost (imports, data loading, records)."""


def _regime(cfg: Mapping[str, Any]) -> str:
    """How a unit's standard training runs: every epoch (the paper protocol) or until a plateau."""
    return "full" if cfg.get("train", {}).get("protocol", "paper") == "paper" else "plateau"


@dataclass(frozen=True)
class NetId:
    """Which network of a unit: its model kind, training points `n`, width `m` and seed."""

    kind: str
    n: int
    m: int
    seed: int


def _net_key(cfg: Mapping[str, Any], net: NetId, epochs: int, adv: bool) -> tuple[Any, ...]:
    """What makes two units' networks the same training: data subset, model (the attention options only for the
    attention models), width, seed, training config."""
    tr = cfg.get("train", {})
    kind = net.kind
    model = (kind, bool(cfg.get("attn_centre", False))) if KINDS[kind].has_context else (kind,)
    return (cfg.get("dataset", "mnist"), cfg.get("task", "10class"), net.n, cfg.get("n_test"), cfg.get("preprocess"),
            net.seed, *model, net.m, tr.get("protocol"), epochs, adv, cfg.get("device"))


def distance_default(name: str, fallback: Any) -> Any:
    """The default of an NTK-distance config field that a unit's config leaves out (`fallback` without it)."""
    import dataclasses

    from empirics.experiments.distance import DistanceConfig

    field = {f.name: f for f in dataclasses.fields(DistanceConfig)}.get(name)
    return fallback if field is None or field.default is dataclasses.MISSING else field.default


def networks(name: str, cfg: Mapping[str, Any]) -> list[Network]:
    """Every network unit `name` trains (from its config `cfg`)."""
    tr = cfg.get("train", {})
    epochs = int(tr.get("epochs", 0))
    regime = _regime(cfg)
    seeds = list(cfg.get("seeds", [0]))
    models = cfg.get("models", MODELS)
    ds = cfg.get("dataset", "mnist")

    def net(ident: NetId, ep: int = epochs, factor: float = 1.0, adv: bool = False,
            protocol: str | None = None) -> Network:
        key = _net_key({**cfg, "train": {**tr, "protocol": protocol or tr.get("protocol")}}, ident, ep, adv)
        return Network(ident.kind, ds, ident.n, ident.m, ep, factor, "full" if adv or protocol else regime, key)

    if name.startswith("ntk-distance"):
        nets = [net(NetId(k, cfg["n_train"], w, s)) for s in seeds for k in models for w in cfg["widths"]]
        if cfg.get("gd_mse", distance_default("gd_mse", False)):  # the gd-mse twin of each network with fixed features
            nets += [net(NetId(k, cfg["n_train"], w, s), protocol="gd-mse") for s in seeds for k in models
                     if not KINDS[k].trains_attention for w in cfg["widths"]]
        return nets
    if name.startswith("malleability") or name.startswith("landscape"):
        n, m = cfg["n_train"], cfg["width"]
        nets = [net(NetId(k, n, m, s)) for s in seeds for k in models]
        if cfg.get("seed_baseline"):
            nets += [net(NetId(k, n, m, s + OTHER_INIT)) for s in seeds for k in models]
        if cfg.get("adv_train"):
            adv_epochs = min(epochs, cfg.get("adv_max_epochs") or epochs)
            factor = cfg.get("adv_steps", 7) + 1.0
            nets += [net(NetId(k, n, m, s), adv_epochs, factor, adv=True) for s in seeds for k in models]
        return nets
    if name.startswith(("influence-retrain", "influence-control")):  # one study: `verify.experiments.retrain_unit`
        one = Network(cfg["model"], ds, cfg["n_train"], cfg["width"], epochs, 1.0, regime, None)
        return [one] * (cfg.get("n_remove", 12) + 1)
    if name.startswith("flip-retrain"):  # `verify.experiments.retrain_flip_unit`: 3 training sets x seeds x (k + 1)
        one = Network(cfg["model"], ds, cfg["n_train"], cfg["width"], epochs, 1.0, regime, None)
        k = max(1, round(cfg.get("tau", 0.1) * cfg["n_train"]))
        return [one] * (1 + 3 * len(seeds) * (k + 1))
    return []


def landscape_passes(cfg: Mapping[str, Any]) -> float:
    """One landscape's work in training epochs, per network: a full-batch loss evaluation (interpolation points,
    the 2-D grid) is a forward pass, about a third of an epoch (forward, backward, update); a Hessian-vector
    product (Lanczos iterations, Hutchinson samples) is a forward and two backward passes, about one epoch."""
    return (cfg.get("points", 21) + cfg.get("grid", 11) ** 2) / 3 + cfg.get("hessian_iters", 20) \
        + cfg.get("hutchinson_samples", 10)


def kernel_work(name: str, cfg: Mapping[str, Any], prim: Primitives) -> float:
    """Seconds of kernel, solve and eigen work a unit does besides training (each malleability measurement
    recomputes the kernel once per attack, the noise baseline, intervention and eps)."""
    d = D.get(cfg.get("dataset", "mnist"), 784)
    seeds = len(cfg.get("seeds", [0]))
    models = len(cfg.get("models", MODELS))
    if name.startswith("ntk-distance"):
        n = cfg["n_train"]
        return sum(seeds * models * (2 * prim.kernel(d, n, w) + prim.solve_at(n)) for w in cfg["widths"])
    if name.startswith("malleability"):
        n = cfg["n_train"] + cfg["n_test"]
        per = (len(cfg.get("attacks", [])) + 1) * len(cfg.get("interventions", ["transformed"]))
        per *= 1 + len(cfg.get("eps_sweep", []))
        trainings = 2 if cfg.get("adv_train") else 1
        return seeds * models * trainings * (per + 1) * (prim.kernel(d, n, cfg["width"]) + prim.solve_at(n))
    if name.startswith(("influence-retrain", "influence-control")):  # one study: `verify.experiments.retrain_unit`
        n = cfg["n_train"] + cfg["n_test"]
        return prim.kernel(784, n, cfg["width"]) + prim.solve_at(n)
    if name.startswith("flip-retrain"):  # the clean kernel and one per perturbed set, at the data set's d
        n = cfg["n_train"] + cfg["n_test"]
        return 3 * (prim.kernel(d, n, cfg["width"]) + prim.solve_at(n))
    if name.startswith("kappa") or name.startswith("premise"):
        return sum(prim.eig(n) for n in cfg.get("ns", cfg.get("premise_ns", [])))
    return 0.0


@dataclass(frozen=True)
class UnitCost:
    """A unit's estimated seconds: training (networks not already trained in its process) and everything else."""

    train_s: float
    other_s: float
    networks: int
    reused: int

    @property
    def total_s(self) -> float:
        return self.train_s + self.other_s


def unit_seconds(name: str, cfg: Mapping[str, Any], prim: Primitives,
                 trained: set[tuple[Any, ...]] | None = None) -> UnitCost:
    """The estimated cost of one unit; the keys of the networks it trains are added to `trained`, and those
    already there (trained by an earlier unit in the same process) cost nothing. Under primitives that train
    stacked (`stacked` true: a GPU, `empirics.nets.engine.train_many` padded), the networks of a unit that share a data
    set, n, epochs and regime train as one stack: they pay the per-step cost (`fixed_s`) once and their
    arithmetic each."""
    train_s, reused = 0.0, 0
    nets = networks(name, cfg)
    stacks: dict[tuple[Any, ...], float] = {}
    for net in nets:
        if trained is not None and net.key is not None:
            if net.key in trained:
                reused += 1
                continue
            trained.add(net.key)
        d = D.get(net.dataset, 784)
        epochs = net.epochs * net.factor
        epoch = prim.epoch_s(net.kind, d, net.n, net.m, net.regime)
        if getattr(prim, "stacked", False):
            stack = (net.dataset, net.n, net.epochs, net.factor, net.regime)
            fixed = prim.fixed_s(net.kind, net.n, net.regime)  # type: ignore[attr-defined]
            epoch -= fixed if stack in stacks else 0.0
            stacks[stack] = fixed
        train_s += epochs * epoch
    other = kernel_work(name, cfg, prim) + prim.unit()
    if name.startswith("landscape"):
        d = D.get(cfg.get("dataset", "mnist"), 784)
        other += sum(len(cfg.get("seeds", [0])) * landscape_passes(cfg)
                     * prim.epoch_s(kind, d, cfg["n_train"], cfg["width"], "full")
                     for kind in cfg.get("models", MODELS))
    return UnitCost(train_s, other, len(nets), reused)


# ---- the calibrated analytic primitives ----------------------------------------------------------------------

#: The constants of `Analytic`, each the seconds of one unit of its feature.
CONSTANT_NAMES = ("step", "flop", "step_plateau_relu", "flop_plateau_relu", "step_plateau_attn", "flop_plateau_attn",
                  "flop_fullbatch_relu", "flop_fullbatch_attn", "kernel", "solve", "eig", "unit")


def _family(kind: str) -> str:
    """The constants a kind's training is priced with: the plain head's (`relu`) or an attention model's (`attn`)."""
    return "attn" if KINDS[kind].has_context else "relu"


def flops(kind: str, d: int, n: int, m: int) -> tuple[float, float]:
    """Multiply-adds of a forward pass per example and per batch: the hidden layer and the head; MLP-Attn's
    context product per example (d x d, or through the n training inputs where that is cheaper,
    `empirics.nets.context_product`); softmax attention over the n training inputs per example; the trained QKV
    attention's projections per example and its k x k mixing matrix through the d x d context per batch."""
    per_example = d * m + m * OUT
    per_batch = 0.0
    extra_example, extra_batch = KINDS[kind].strategy.macs(d, n)
    return per_example + extra_example, per_batch + extra_batch


@dataclass(frozen=True)
class Analytic:
    """Primitives as linear functions of `CONSTANT_NAMES`: an epoch costs `step` per batch plus `flop` per
    multiply-add (`flops`); a plateau-stopped epoch has its own constants for ReLU and for the attention models
    (which absorb the fraction of the maximum epochs each runs), and a plateau-stopped full-batch one (n at most a
    batch: the retrain studies, whose networks run many more of their maximum epochs, e.g. MLP-Attn 700 of 1,000
    at n = 100) one constant per multiply-add for each; a kernel n^2 (d + m), a solve and an eigendecomposition
    n^3. A constant missing from `c` counts 0 (a calibration made before it existed)."""

    c: Mapping[str, float]
    #: Whether the networks of a unit train as one stack (`unit_seconds`): the GPU prices.
    stacked: bool = False
    #: Where the constants come from (shown by `--plan`).
    source: str = ""

    def fixed_s(self, kind: str, n: int, regime: str) -> float:
        """The part of an epoch that does not grow with the arithmetic: the per-step (launch) cost, which a stack of
        networks pays once."""
        steps = math.ceil(n / BATCH)
        if regime != "full" and steps == 1:
            return 0.0
        return steps * self.c["step" if regime == "full" else f"step_plateau_{_family(kind)}"]

    def epoch_s(self, kind: str, d: int, n: int, m: int, regime: str) -> float:
        steps = math.ceil(n / BATCH)
        per_example, per_batch = flops(kind, d, n, m)
        if regime != "full" and steps == 1:
            return (n * per_example + per_batch) * self.c.get(f"flop_fullbatch_{_family(kind)}", 0.0)
        suffix = "" if regime == "full" else f"_plateau_{_family(kind)}"
        return steps * self.c[f"step{suffix}"] + (n * per_example + steps * per_batch) * self.c[f"flop{suffix}"]

    def kernel(self, d: int, n: int, m: int) -> float:
        return n * n * (d + m) * self.c["kernel"]

    def solve_at(self, n: int) -> float:
        return n**3 * self.c["solve"]

    def eig(self, n: int) -> float:
        return n**3 * self.c["eig"]

    def unit(self) -> float:
        return self.c["unit"]


#: Where `CALIBRATED`'s constants come from (README: how well they predict).
CALIBRATION_SOURCE = ("fitted by `python -m benchmarks.costs results/claims-quick.json --include-cached`: the 27 units "
                      "of run R10 (quick at 2d6ed76, 10 seeds, proper+unit, --jobs 2 on 2 cores)")
CALIBRATED = Analytic({
    "step": 0.0,
    "flop": 7.02e-11,
    "step_plateau_relu": 0.0,
    "flop_plateau_relu": 4.22e-11,
    "step_plateau_attn": 8.84e-05,
    "flop_plateau_attn": 0.0,
    "flop_fullbatch_relu": 1.22e-11,
    "flop_fullbatch_attn": 5.79e-11,
    "kernel": 7.52e-11,
    "solve": 1.34e-10,
    "eig": 0.0,
    "unit": 0.756,
}, source=CALIBRATION_SOURCE)

#: A float64 leave-one-out solve on one GPU (`empirics.attribution.influence.kernel_influence` with a device:
#: Cholesky n^3/3, its inverse ~2n^3/3 and the leave-one-out products, about 2 n^3 flops), modelled at 10% of an
#: H200's 67 TFLOP/s float64 peak (cuSOLVER's factorisations reach a fraction of it at n of a few thousand): seconds
#: per n^3. Not measured: `benchmarks.gpu_check` measures it (its primitives' `solve`, beside `solve_host`).
GPU_SOLVE_MODELLED = 2.0 / 6.7e12
#: The H200's prices before the device check measured them (`benchmarks.gpu_check` writes the measured ones to
#: `results/gpu-check.json`, which `gpu_prices` prefers): from issue 39's H200 figures, an optimiser step ~1 ms
#: whatever the width (launch-bound: an epoch of 40 steps at n = 5,000 took 0.037-0.052 s at every width), float32
#: products at ~60 TFLOP/s (a step's three products per forward multiply-add: 1e-13 s), float64 kernels at ~30
#: TFLOP/s, the influence solves on the device (`GPU_SOLVE_MODELLED`) and the eigendecompositions on the host's CPU
#: as on this one.
GPU_MODELLED_SOURCE = ("modelled from issue 39's H200 figures (1 ms per step, 60 TFLOP/s float32) and a float64 "
                       "solve at 10% of the H200's peak; not measured here")
GPU_MODELLED = Analytic({
    "step": 1e-3, "flop": 1e-13, "step_plateau_relu": 1e-3, "flop_plateau_relu": 1e-13, "step_plateau_attn": 1e-3,
    "flop_plateau_attn": 1e-13, "flop_fullbatch_relu": 1e-13, "flop_fullbatch_attn": 1e-13, "kernel": 1e-13,
    "solve": GPU_SOLVE_MODELLED, "eig": CALIBRATED.c["eig"], "unit": 2.0,
}, stacked=True, source=GPU_MODELLED_SOURCE)
#: Where the device check's record lives once a GPU was lent (committed by the session that ran it).
GPU_RECORD = "results/gpu-check.json"
#: The primitives key that marks a record whose `solve` is the device's: a device check older than the influence
#: solves on the GPU (b178554) priced `solve` on the host and has no `solve_host`.
DEVICE_SOLVE_MARK = "solve_host"


def gpu_prices(root: Any = None) -> Analytic:
    """The GPU's prices: the constants the device check measured (`GPU_RECORD`, its primitives section), else
    `GPU_MODELLED`. A record that cannot be read or lacks a constant falls back to the modelled prices. A record
    that measured the host's solve (no `DEVICE_SOLVE_MARK`: from before the solves ran on the GPU) keeps its other
    constants and takes the modelled device solve, and its source says so: the code it would price solves there."""
    import json
    from pathlib import Path

    path = Path(root or Path(__file__).resolve().parents[1]) / GPU_RECORD
    try:
        rec = json.loads(path.read_text())
        sec = rec["sections"]["primitives"]
        c = sec["result"]["constants"]
        if sec.get("status") == "ok" and all(isinstance(c.get(k), (int, float)) for k in CONSTANT_NAMES):
            env = rec["sections"].get("environment", {}).get("result", {})
            consts = {k: float(c[k]) for k in CONSTANT_NAMES}
            source = (f"measured by benchmarks.gpu_check on {env.get('gpu', 'a GPU')}, {env.get('date_utc', '?')}, "
                      f"code version {env.get('code_version', '?')} ({GPU_RECORD})")
            if DEVICE_SOLVE_MARK not in c:
                consts["solve"] = GPU_SOLVE_MODELLED
                source += ("; the influence solve modelled (that record timed it on the host, before the solves "
                           "ran on the GPU), not measured")
            return Analytic(consts, stacked=True, source=source)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return GPU_MODELLED


def prices_for(device: str | None) -> Analytic:
    """The cost model's prices for a run on `device`: the GPU's for cuda, else the 2-core CPU calibration."""
    return gpu_prices() if str(device or "").startswith("cuda") else CALIBRATED



def plan(units: Sequence[tuple[str, Mapping[str, Any]]], prim: Primitives = CALIBRATED) -> dict[str, UnitCost]:
    """Estimated cost of every (name, config), in this order in one process (networks trained by an earlier unit
    are reused)."""
    trained: set[tuple[Any, ...]] = set()
    return {name: unit_seconds(name, cfg, prim, trained) for name, cfg in units}


def groups(units: Sequence[tuple[str, Mapping[str, Any]]]) -> list[list[str]]:
    """The units that share a trained network, transitively, as groups (each in the given order; groups in the
    order of their first unit): run in one process, a group trains each network once."""
    parent = list(range(len(units)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[Any, ...], int] = {}
    for i, (name, cfg) in enumerate(units):
        for net in networks(name, cfg):
            if net.key is None:
                continue
            j = owner.setdefault(net.key, i)
            parent[find(i)] = find(j)
    out: dict[int, list[str]] = {}
    for i, (name, _) in enumerate(units):
        out.setdefault(find(i), []).append(name)
    return list(out.values())


def longest_first(units: Sequence[tuple[str, Mapping[str, Any]]],
                  prim: Primitives = CALIBRATED) -> list[tuple[list[str], float]]:
    """The groups of `units` with their estimated seconds, longest first (ties by first name: one order for every
    run)."""
    cfgs = dict(units)
    out = []
    for g in groups(units):
        cost = plan([(n, cfgs[n]) for n in g], prim)
        out.append((g, sum(c.total_s for c in cost.values())))
    return sorted(out, key=lambda gc: (-gc[1], gc[0][0]))


#: Seconds of one part of a GPU preset: the device check's default budget (`benchmarks.gpu_check --budget-s`), what
#: one lent session of about 15 minutes, start-up included, runs.
PART_S = 480.0


def parts(grouped: Sequence[tuple[list[str], float]], budget_s: float = PART_S) -> list[tuple[list[str], float]]:
    """`grouped` (groups of units with their seconds, in run order) cut into consecutive parts of at most
    `budget_s` each: a run cut at a part's end keeps its finished units cached, and the next part continues with
    `--resume`. A group longer than `budget_s` is a part of its own (it cannot finish in one; its part says so by
    its seconds)."""
    out: list[tuple[list[str], float]] = []
    for names, sec in grouped:
        if out and out[-1][1] + sec <= budget_s:
            out[-1] = (out[-1][0] + list(names), out[-1][1] + sec)
        else:
            out.append((list(names), sec))
    return out


def makespan(seconds: Iterable[float], jobs: int) -> float:
    """Wall time of tasks taken in this order by `jobs` workers, each taking the next task when it is free."""
    free = [0.0] * max(1, jobs)
    for s in seconds:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


# ---- calibration ---------------------------------------------------------------------------------------------

def features(units: Sequence[tuple[str, Mapping[str, Any]]]) -> list[list[float]]:
    """Per unit (in run order, one process), its estimated seconds under each constant alone set to 1: the model is
    linear in its constants, so these are the columns of the fit."""
    cols = []
    for cname in CONSTANT_NAMES:
        basis = Analytic({k: 1.0 if k == cname else 0.0 for k in CONSTANT_NAMES})
        cols.append([c.total_s for c in plan(units, basis).values()])
    return [list(row) for row in zip(*cols, strict=True)]


def fit(units: Sequence[tuple[str, Mapping[str, Any]]], wall_s: Sequence[float]) -> dict[str, float]:
    """Non-negative constants minimising the squared relative error of the estimates against measured seconds."""
    import numpy as np
    from scipy.optimize import nnls

    x = np.asarray(features(units), dtype=float)
    y = np.asarray(wall_s, dtype=float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    return {k: float(v) for k, v in zip(CONSTANT_NAMES, coef / scale, strict=True)}


def agreement(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """How well estimates predict: Spearman rank correlation, and the median and range of measured / estimated."""
    import numpy as np
    from scipy.stats import spearmanr

    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    r = m / np.where(p > 0, p, np.nan)
    return {"spearman": float(spearmanr(p, m).statistic), "median_ratio": float(np.nanmedian(r)),
            "ratio_p10": float(np.nanpercentile(r, 10)), "ratio_p90": float(np.nanpercentile(r, 90)),
            "total_ratio": float(m.sum() / p.sum()), "units": int(len(m))}
