"""Statistics of the malleability runs: flip rates, excess over noise, Attn/ReLU ratios, each with a 95 % interval.

Reads the per-run records of `empirics.malleability.run_malleability` (one per model, seed and training).

Intervals (fixed before any run):

- **Per-point quantities** (flip rates, excess over noise, their differences and ratios) use a
  hierarchical percentile bootstrap: the seeds are resampled with replacement, then the selected points
  within each drawn seed. Networks of the same seed share the seed draw (same seed = same data subset),
  so differences and ratios between models, or between standard and adversarial training, are paired
  by seed; their points are resampled independently (each network selects its own top points).
  **Excess over noise** of an attack is paired per point: the attack and the random-sign baseline
  perturb the same points, so each point contributes `flipped_attack - flipped_random`.
- **Per-network scalars** (Spearman rho, the curated test-loss change) have only the seed as a source
  of variation: a Student-t interval over seeds (of the paired per-seed difference where two things are
  compared). With one seed it is unbounded.

With 2-3 seeds the seed level is coarse; every record carries its number of seeds and points.
Infinite bounds appear where a ratio's denominator can reach zero (see `ratio_values`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from empirics.common import spread
from empirics.vocab import PAPER_ATTACKS, Attack
from ntkm.codec import Record, encode, optional
from theory.paper import PAPER_ADV, PAPER_FLIP

if TYPE_CHECKING:
    from empirics.malleability import MalleabilityConfig

INTERVENTIONS = ("transformed", "curated", "adversarial")
BASELINE = Attack.RANDOM.value
#: Bootstrap settings: resamples, generator seed, level.
N_BOOT = 2000
BOOT_SEED = 20_260_313
LEVEL = 0.95
POOLED = "pooled"

METHOD = (f"hierarchical percentile bootstrap, {N_BOOT} resamples (numpy default_rng({BOOT_SEED})): seeds "
          "resampled with replacement, then the selected points within each drawn seed; models (or trainings) "
          "of one seed share the seed draw; excess over noise paired per point")
SEED_METHOD = "Student-t interval over seeds (of the paired per-seed difference where two things are compared)"


def paper_ratio_range(dataset: str, task: str) -> tuple[float, float] | None:
    """Smallest and largest Attn/ReLU flip-rate ratio over the paper's three attacks."""
    p = PAPER_FLIP.get((dataset, task))
    if p is None:
        return None
    r = [p["attn"][a] / p["relu"][a] for a in PAPER_ATTACKS]
    return min(r), max(r)


# ---- interval machinery --------------------------------------------------------------------------

def hierarchical_bootstrap(groups: dict[str, list[np.ndarray]], n_boot: int = N_BOOT,
                           seed: int = BOOT_SEED) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Point estimates `(K,)` and bootstrap replicates `(n_boot, K)` of the mean over seeds of the mean
    over points, per group.

    `groups[g][s]` is a `(points, K)` array for seed slot `s`; the slots are the same seeds in every
    group and share one seed draw per replicate. Within a drawn slot the points are resampled (all K
    columns with the same draw, which pairs the columns per point), independently per group and per draw.
    """
    rng = np.random.default_rng(seed)
    sizes = {len(v) for v in groups.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError("every group needs the same, non-zero number of seeds")
    n_seeds = sizes.pop()
    slots = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    est, reps = {}, {}
    for g, per_seed in groups.items():
        arrs = [np.asarray(a, float).reshape(len(a), -1) for a in per_seed]
        k = arrs[0].shape[1]
        out = np.empty((n_boot, n_seeds, k))
        for s, arr in enumerate(arrs):
            mask = slots == s
            count = int(mask.sum())
            if count:
                draw = rng.integers(0, len(arr), size=(count, len(arr)))
                out[mask] = arr[draw].mean(axis=1)
        est[g] = np.mean([a.mean(axis=0) for a in arrs], axis=0)
        reps[g] = out.mean(axis=1)
    return est, reps


def percentile_ci(value: float, reps: np.ndarray, level: float = LEVEL) -> dict[str, Any]:
    """`{"value", "lo", "hi", "method": "bootstrap"}`: the percentile interval of `reps` (may hold +-inf)."""
    q = [(1 - level) / 2, (1 + level) / 2]
    r = np.asarray(reps, float)
    lo, hi = np.quantile(r, q, method="inverted_cdf") if np.isinf(r).any() else np.quantile(r, q)
    return {"value": float(value), "lo": float(lo), "hi": float(hi), "method": "bootstrap"}


def t_interval(values: list[float], level: float = LEVEL) -> dict[str, Any]:
    """`{"value", "lo", "hi", "method": "t", "n"}`: mean +- t * sd / sqrt(n) over the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], float)
    if v.size == 0:
        return {"value": float("nan"), "lo": float("-inf"), "hi": float("inf"), "method": "t", "n": 0}
    m = float(v.mean())
    if v.size == 1:
        return {"value": m, "lo": float("-inf"), "hi": float("inf"), "method": "t", "n": 1}
    half = float(stats.t.ppf((1 + level) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return {"value": m, "lo": m - half, "hi": m + half, "method": "t", "n": int(v.size)}


def ratio_values(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """num / den where den > 0; +inf where den <= 0 < num (only the numerator is positive); -inf where
    both are <= 0 (neither is positive: no gap in the numerator's favour)."""
    n, d = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(d > 0, n / np.where(d > 0, d, 1.0), np.where(n > 0, np.inf, -np.inf))
    return out


def ratio_ci(num_est: float, den_est: float, num: np.ndarray, den: np.ndarray) -> dict[str, Any]:
    """Interval of a ratio from paired replicates, with `ratio_values`' conventions."""
    return percentile_ci(float(ratio_values(num_est, den_est)), ratio_values(num, den))


def pooled(est: np.ndarray, reps: np.ndarray, n_attacks: int) -> tuple[float, np.ndarray]:
    """The flip rate pooled over the attacks: the mean over columns 1..`n_attacks` (column 0 is the noise) of
    the estimates `(K,)` and of the replicates `(n_boot, K)`. The one definition of "pooled" that the flip
    tables, the adversarial-training rows and so every rule reading them use."""
    cols = slice(1, n_attacks + 1)
    return est[cols].mean(), reps[:, cols].mean(axis=1)


# ---- reading the runs ----------------------------------------------------------------------------

def _measurement(run: dict[str, Any], intervention: str, attack: str, eps: float | None) -> dict[str, Any] | None:
    for m in run["measurements"]:
        if m["intervention"] == intervention and m["attack"] == attack and m["eps"] == eps:
            return m
    return None


def _runs_by_seed(runs: list[dict[str, Any]], training: str, model: str) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in runs if r["training"] == training and r["model"] == model}


def _flip_matrix(run: dict[str, Any], intervention: str, eps: float, attacks: tuple[str, ...],
                 with_seed: bool) -> np.ndarray:
    """`(points, columns)`: flipped (0/1) per selected point for the noise, each attack, and optionally
    the seed-to-seed baseline, in that column order."""
    cols, order = [], None
    for a in (BASELINE, *attacks):
        m = _measurement(run, intervention, a, eps)
        if m is None:
            raise ValueError(f"run {run['model']} seed {run['seed']} lacks {intervention} {a} at eps {eps}")
        idx = [e["index"] for e in m["examples"]]
        if order is not None and idx != order:
            raise ValueError("the examples of one run must list the same points for every attack")
        order = idx
        cols.append([float(e["flipped"]) for e in m["examples"]])
    if with_seed:
        cols.append([float(f) for f in run["seed_baseline"]["flipped"]])
    return np.array(cols, float).T


def _common_seeds(by: dict[str, dict[int, dict[str, Any]]]) -> list[int]:
    sets = [set(v) for v in by.values()]
    return sorted(set.intersection(*sets)) if sets else []


def _counts(matrices: list[np.ndarray]) -> dict[str, Any]:
    return {"n_seeds": len(matrices), "n_points": [int(len(m)) for m in matrices]}


# ---- the summary ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MallSummary(Record):
    """The statistics of one malleability experiment (`summarise`), one list of rows per table. Each row is a dict
    naming its setting (training, intervention, eps, model, attack) and its intervals (`percentile_ci`,
    `t_interval`); `find` picks one. `adv_train` is present only when adversarial training ran."""

    bootstrap: dict[str, Any]
    rows: list[dict[str, Any]]
    pooled: list[dict[str, Any]]
    comparisons: list[dict[str, Any]]
    ratios: list[dict[str, Any]]
    curated: list[dict[str, Any]]
    curated_diff: list[dict[str, Any]]
    seed_baseline: list[dict[str, Any]]
    adv_train: list[dict[str, Any]] | None = optional()

    def find(self, block: str, **where: Any) -> dict[str, Any] | None:
        """The first row of table `block` whose fields equal `where` (None when absent)."""
        for r in getattr(self, block) or []:
            if all(r.get(k) == v for k, v in where.items()):
                return r
        return None


def summarise(runs: list[dict[str, Any]], cfg: MalleabilityConfig) -> MallSummary:
    """Spreads over seeds, flip rates, excess over noise, Attn/ReLU differences and ratios, the
    seed-to-seed baseline, curated removal and adversarial training, each with its 95 % interval (its values
    as the cache reads them back)."""
    trainings = ["standard"] + (["adversarial"] if cfg.adv_train else [])
    attacks = tuple(cfg.attacks)
    out: dict[str, Any] = {
        "bootstrap": {"method": METHOD, "seed_level_method": SEED_METHOD, "n_boot": N_BOOT, "seed": BOOT_SEED,
                      "level": LEVEL},
        "rows": [], "pooled": [], "comparisons": [], "ratios": [], "curated": [], "curated_diff": [],
        "seed_baseline": [],
    }
    both = "relu" in cfg.models and "attn" in cfg.models
    for training in trainings:
        for intervention in ("transformed", "adversarial"):
            if intervention not in cfg.interventions:
                continue
            for eps in cfg.eps_values:
                _flip_block(out, runs, cfg, training, intervention, eps, attacks, both)
        if "curated" in cfg.interventions:
            _curated_block(out, runs, cfg, training)
    if cfg.seed_baseline:
        for model in cfg.models:
            by = _runs_by_seed(runs, "standard", model)
            have = [by[s] for s in sorted(by) if "seed_baseline" in by[s]]
            if not have:
                continue
            mats = [np.array(r["seed_baseline"]["flipped"], float)[:, None] for r in have]
            est, reps = hierarchical_bootstrap({model: mats})
            out["seed_baseline"].append({
                "model": model, "flip_ci": percentile_ci(est[model][0], reps[model][:, 0]),
                "rho_all_ci": t_interval([r["seed_baseline"]["rho_all"] for r in have]), **_counts(mats)})
    if cfg.adv_train:
        out["adv_train"] = _adv_block(runs, cfg, attacks)
    return MallSummary.from_dict(encode(out))


def _flip_block(out: dict[str, Any], runs: list[dict[str, Any]], cfg: MalleabilityConfig, training: str,
                intervention: str, eps: float, attacks: tuple[str, ...], both: bool) -> None:
    """Rows (per model and attack), pooled rows (per model) and Attn/ReLU comparisons at one setting."""
    by = {m: _runs_by_seed(runs, training, m) for m in cfg.models}
    seeds = _common_seeds(by)
    if not seeds:
        return
    with_seed = training == "standard" and all("seed_baseline" in by[m][s] for m in cfg.models for s in seeds)
    mats = {m: [_flip_matrix(by[m][s], intervention, eps, attacks, with_seed) for s in seeds] for m in cfg.models}
    est, reps = hierarchical_bootstrap(mats)
    paper = PAPER_FLIP.get((cfg.dataset, cfg.task), {})
    headline = eps == 0.3 and intervention == "transformed" and training == "standard"
    where = {"training": training, "intervention": intervention, "eps": eps}
    na = len(attacks)
    derived: dict[str, dict[str, tuple[float, np.ndarray]]] = {}
    rho: dict[str, list[float]] = {}
    for m in cfg.models:
        e, r = est[m], reps[m]
        runs_m = [by[m][s] for s in seeds]

        def vals(a: str, key: str, runs_m: list[dict[str, Any]] = runs_m) -> list[float]:
            return [_measurement(x, intervention, a, eps)[key] for x in runs_m]

        d = {"noise": (e[0], r[:, 0])}
        for j, a in enumerate(attacks, start=1):
            d[f"flip:{a}"] = (e[j], r[:, j])
            d[f"excess:{a}"] = (e[j] - e[0], r[:, j] - r[:, 0])
        pe, pr = pooled(e, r, na)
        d[f"flip:{POOLED}"] = (pe, pr)
        d[f"excess:{POOLED}"] = (pe - e[0], pr - r[:, 0])
        derived[m] = d
        base = {k: vals(BASELINE, k) for k in ("flip_rate", "rho_all", "rho_top")}
        for j, a in enumerate(attacks, start=1):
            v = {k: vals(a, k) for k in ("flip_rate", "rho_all", "rho_top", "pair_flip_rate")}
            row = {**where, "model": m, "attack": a, "per_seed_flip_rate": v["flip_rate"],
                   **{k: spread(x) for k, x in v.items()},
                   **{f"baseline_{k}": spread(x) for k, x in base.items()},
                   "flip_ci": percentile_ci(*d[f"flip:{a}"]), "baseline_ci": percentile_ci(*d["noise"]),
                   "excess_ci": percentile_ci(*d[f"excess:{a}"]),
                   "rho_all_ci": t_interval(v["rho_all"]),
                   "rho_drop_ci": t_interval([b - x for b, x in zip(base["rho_all"], v["rho_all"], strict=True)]),
                   "paper_flip_pct": paper.get(m, {}).get(a) if headline else None, **_counts(mats[m])}
            if with_seed:
                row["excess_over_seed_ci"] = percentile_ci(e[j] - e[-1], r[:, j] - r[:, -1])
            out["rows"].append(row)
        rho_att = [float(np.mean([_measurement(x, intervention, a, eps)["rho_all"] for a in attacks]))
                   for x in runs_m]
        rho[m] = rho_att
        pooled_row = {**where, "model": m, "attacks": list(attacks), "flip_ci": percentile_ci(*d[f"flip:{POOLED}"]),
                      "baseline_ci": percentile_ci(*d["noise"]), "excess_ci": percentile_ci(*d[f"excess:{POOLED}"]),
                      "per_seed_rho_all": rho_att, "per_seed_baseline_rho_all": base["rho_all"],
                      "rho_all_ci": t_interval(rho_att), "baseline_rho_all_ci": t_interval(base["rho_all"]),
                      "rho_drop_ci": t_interval([b - x for b, x in zip(base["rho_all"], rho_att, strict=True)]),
                      **_counts(mats[m])}
        if with_seed:
            pooled_row["seed_baseline_ci"] = percentile_ci(e[-1], r[:, -1])
            pooled_row["excess_over_seed_ci"] = percentile_ci(pe - e[-1], pr - r[:, -1])
        out["pooled"].append(pooled_row)
    if not both:
        return
    for a in (*attacks, POOLED):
        (fa, fa_r), (fr, fr_r) = derived["attn"][f"flip:{a}"], derived["relu"][f"flip:{a}"]
        (xa, xa_r), (xr, xr_r) = derived["attn"][f"excess:{a}"], derived["relu"][f"excess:{a}"]
        if a == POOLED:
            rho_d = [x - y for x, y in zip(rho["attn"], rho["relu"], strict=True)]
        else:
            rho_d = [_measurement(by["attn"][s], intervention, a, eps)["rho_all"]
                     - _measurement(by["relu"][s], intervention, a, eps)["rho_all"] for s in seeds]
        out["comparisons"].append({
            **where, "attack": a, "flip_diff_ci": percentile_ci(fa - fr, fa_r - fr_r),
            "excess_diff_ci": percentile_ci(xa - xr, xa_r - xr_r), "ratio_ci": ratio_ci(fa, fr, fa_r, fr_r),
            "ratio_excess_ci": ratio_ci(xa, xr, xa_r, xr_r), "rho_all_diff_ci": t_interval(rho_d),
            "n_seeds": len(seeds)})
    for a in (*attacks, BASELINE):
        out["ratios"].append({**where, "attack": a, **ratio(
            [_measurement(by["attn"][s], intervention, a, eps)["flip_rate"] for s in seeds],
            [_measurement(by["relu"][s], intervention, a, eps)["flip_rate"] for s in seeds])})


CURATED_KEYS = ("test_loss_change", "test_acc_change", "rho_remaining", "flip_rate_remaining")


def _curated_block(out: dict[str, Any], runs: list[dict[str, Any]], cfg: MalleabilityConfig, training: str) -> None:
    """Curated removal per model: top vs random removal, each over seeds, and their paired difference."""
    for model in cfg.models:
        by = _runs_by_seed(runs, training, model)
        seeds = sorted(by)
        per = {name: [_measurement(by[s], "curated", name, None) for s in seeds] for name in ("removal", BASELINE)}
        if not seeds or any(m is None for ms in per.values() for m in ms):
            continue
        for name, ms in per.items():
            out["curated"].append({
                "training": training, "model": model, "removal": "top" if name == "removal" else "random",
                **{k: spread([m[k] for m in ms]) for k in CURATED_KEYS},
                **{f"{k}_ci": t_interval([m[k] for m in ms]) for k in CURATED_KEYS}, "n_seeds": len(seeds)})
        top, rnd = per["removal"], per[BASELINE]
        out["curated_diff"].append({
            "training": training, "model": model,
            "abs_test_loss_change_diff_ci": t_interval([abs(t["test_loss_change"]) - abs(r["test_loss_change"])
                                                        for t, r in zip(top, rnd, strict=True)]),
            "test_loss_change_diff_ci": t_interval([t["test_loss_change"] - r["test_loss_change"]
                                                    for t, r in zip(top, rnd, strict=True)]),
            "rho_remaining_diff_ci": t_interval([t["rho_remaining"] - r["rho_remaining"]
                                                 for t, r in zip(top, rnd, strict=True)]),
            "n_seeds": len(seeds)})


def _adv_block(runs: list[dict[str, Any]], cfg: MalleabilityConfig, attacks: tuple[str, ...]) -> list[dict[str, Any]]:
    """Flip rate and excess over noise after standard vs adversarial training (transformed, headline eps),
    per model and attack and pooled; the rise is paired by seed."""
    eps = cfg.eps_values[0]
    out = []
    na = len(attacks)
    for model in cfg.models:
        by = {t: _runs_by_seed(runs, t, model) for t in ("standard", "adversarial")}
        seeds = _common_seeds(by)
        if not seeds:
            continue
        mats = {t: [_flip_matrix(by[t][s], "transformed", eps, attacks, False) for s in seeds] for t in by}
        est, reps = hierarchical_bootstrap(mats)
        for j, a in [(j, a) for j, a in enumerate(attacks, start=1)] + [(0, POOLED)]:
            f = {t: (est[t][j:j + 1].mean(), reps[t][:, j:j + 1].mean(axis=1)) if j else pooled(est[t], reps[t], na)
                 for t in by}
            x = {t: (f[t][0] - est[t][0], f[t][1] - reps[t][:, 0]) for t in by}
            row: dict[str, Any] = {
                "model": model, "attack": a,
                "standard_ci": percentile_ci(*f["standard"]), "adversarial_ci": percentile_ci(*f["adversarial"]),
                "standard_excess_ci": percentile_ci(*x["standard"]),
                "adversarial_excess_ci": percentile_ci(*x["adversarial"]),
                "rise_ci": percentile_ci(f["adversarial"][0] - f["standard"][0],
                                         f["adversarial"][1] - f["standard"][1]),
                "rise_excess_ci": percentile_ci(x["adversarial"][0] - x["standard"][0],
                                                x["adversarial"][1] - x["standard"][1]),
                "paper_pct": PAPER_ADV.get((cfg.dataset, model)) if a == "pgd" and cfg.task == "10class" else None,
                "n_seeds": len(seeds), "n_points": {t: [int(len(m)) for m in mats[t]] for t in mats}}
            if a != POOLED:
                for t in by:
                    row[t] = spread([_measurement(by[t][s], "transformed", a, eps)["flip_rate"] for s in seeds])
                    row[f"{t}_rho_all"] = spread([_measurement(by[t][s], "transformed", a, eps)["rho_all"]
                                                  for s in seeds])
            out.append(row)
    return out


def ratio(attn: list[float], relu: list[float]) -> dict[str, Any]:
    """Attn/ReLU flip-rate ratio: of the seed means, and per seed (None where ReLU flipped nothing)."""
    ma = float(np.mean(attn)) if attn else float("nan")
    mr = float(np.mean(relu)) if relu else float("nan")
    per_seed = [a / r if r > 0 else None for a, r in zip(attn, relu, strict=True)]
    defined = [v for v in per_seed if v is not None]
    return {
        "ratio": ma / mr if mr > 0 else None,
        "per_seed": per_seed,
        "per_seed_min": min(defined) if defined else None,
        "per_seed_max": max(defined) if defined else None,
        "attn_mean": ma, "relu_mean": mr,
        "note": "" if mr > 0 else "undefined: 2L-ReLU flipped no point (ratio of zero)",
    }
