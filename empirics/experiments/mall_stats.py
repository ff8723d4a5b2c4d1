"""Statistics of the malleability runs: flip rates, excess over noise, ratios of two kinds, each with a 95 % interval.

Reads the per-run records of `empirics.experiments.malleability.run_malleability` (one per model, seed and training).

Intervals (`empirics.intervals`; seeds are the unit of replication, each its own data subset):

- Every quantity is first reduced to one value per seed: a flip rate is the mean over that seed's selected
  points; the **excess over noise** of an attack is paired per point (the attack and the random-sign
  baseline perturb the same points), so a seed's excess is `mean(flipped_attack - flipped_random)`.
- Means, differences (between models, or standard and adversarial training, paired by seed: same seed =
  same data subset) and per-network scalars (Spearman rho, the curated test-loss change): a Student-t
  interval over seeds (`t_interval`).
- Ratios (of flip rates or of excesses, treated/control: the paper's Attn/ReLU by default): Fieller's interval
  from the paired per-seed values (`fieller`); unbounded (-inf, inf) where the denominator is not significantly
  different from 0.

The comparisons (differences, ratios, the ratio table, rho differences) are of one (treated, control) pair of
kinds (`Pair`): the paper's (attn, relu) unless `summarise` is given another, e.g. (softmax, relu) for a variant.

Every interval record keeps its per-seed values (`per_seed`, or `per_seed_num` / `per_seed_den` for a
ratio), so it can be recomputed from claims.json. `benchmarks.coverage` measures the coverage of each
method at the quick preset's sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from empirics.common import spread
from empirics.intervals import FIELLER_METHOD, LEVEL, T_METHOD, difference, fieller, t_interval
from empirics.nets.kinds import kind
from empirics.vocab import PAPER_ATTACKS, PAPER_PAIR, Attack, model_name
from ntkm.codec import Record, encode, optional
from theory.paper import PAPER_ADV, PAPER_FLIP

if TYPE_CHECKING:
    from empirics.experiments.malleability import MalleabilityConfig

INTERVENTIONS = ("transformed", "curated", "adversarial")
BASELINE = Attack.RANDOM.value
POOLED = "pooled"

METHOD = (f"{T_METHOD}, of per-seed flip rates (the mean over a seed's selected points); excess over noise paired "
          f"per point; ratios: {FIELLER_METHOD}")
SEED_METHOD = T_METHOD

#: The two kinds a comparison reads, (treated, control): differences are treated - control, ratios treated / control.
Pair = tuple[str, str]


@dataclass(frozen=True)
class FlipSetting:
    """One setting of the flip-rate tables: how the networks were trained, the intervention and its eps."""

    training: str
    intervention: str
    eps: float


def paper_ratio_range(dataset: str, task: str) -> tuple[float, float] | None:
    """Smallest and largest Attn/ReLU flip-rate ratio over the paper's three attacks."""
    p = PAPER_FLIP.get((dataset, task))
    if p is None:
        return None
    r = [p["attn"][a] / p["relu"][a] for a in PAPER_ATTACKS]
    return min(r), max(r)


def seed_means(per_seed: list[np.ndarray]) -> np.ndarray:
    """`(seeds, K)`: the mean over points of each seed's `(points, K)` flip matrix."""
    return np.array([np.asarray(a, float).reshape(len(a), -1).mean(axis=0) for a in per_seed])


def pooled(means: np.ndarray, n_attacks: int) -> np.ndarray:
    """Per seed, the flip rate pooled over the attacks: the mean over columns 1..`n_attacks` (column 0 is the
    noise) of the per-seed means `(seeds, K)`. The one definition of "pooled" that the flip tables, the
    adversarial-training rows and so every rule reading them use."""
    return means[:, 1:n_attacks + 1].mean(axis=1)


def _l(v: np.ndarray) -> list[float]:
    return [float(x) for x in v]


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
    naming its setting (training, intervention, eps, model, attack) and its intervals (`t_interval`,
    `fieller`, each with its per-seed values); `find` picks one. `adv_train` is present only when adversarial
    training ran."""

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


def summarise(runs: list[dict[str, Any]], cfg: MalleabilityConfig, pair: Pair = PAPER_PAIR) -> MallSummary:
    """Spreads over seeds, flip rates, excess over noise, the differences and ratios of `pair` (treated, control),
    the seed-to-seed baseline, curated removal and adversarial training, each with its 95 % interval (its values
    as the cache reads them back). Without both kinds of `pair` among `cfg.models` there are no comparison or ratio
    rows; a kind that is not registered, or a pair of one kind twice, is an error."""
    treated, control = (kind(m).name for m in pair)
    if treated == control:
        raise ValueError(f"a comparison needs two different kinds, got ({treated}, {control})")
    trainings = ["standard"] + (["adversarial"] if cfg.adv_train else [])
    attacks = tuple(cfg.attacks)
    out: dict[str, Any] = {
        "bootstrap": {"method": METHOD, "seed_level_method": SEED_METHOD, "ratio_method": FIELLER_METHOD,
                      "level": LEVEL},
        "rows": [], "pooled": [], "comparisons": [], "ratios": [], "curated": [], "curated_diff": [],
        "seed_baseline": [],
    }
    compared = (treated, control) if treated in cfg.models and control in cfg.models else None
    for training in trainings:
        for intervention in ("transformed", "adversarial"):
            if intervention not in cfg.interventions:
                continue
            for eps in cfg.eps_values:
                _flip_block(out, runs, cfg, FlipSetting(training, intervention, eps), compared)
        if "curated" in cfg.interventions:
            _curated_block(out, runs, cfg, training)
    if cfg.seed_baseline:
        for model in cfg.models:
            by = _runs_by_seed(runs, "standard", model)
            have = [by[s] for s in sorted(by) if "seed_baseline" in by[s]]
            if not have:
                continue
            mats = [np.array(r["seed_baseline"]["flipped"], float)[:, None] for r in have]
            out["seed_baseline"].append({
                "model": model, "flip_ci": t_interval(_l(seed_means(mats)[:, 0])),
                "rho_all_ci": t_interval([r["seed_baseline"]["rho_all"] for r in have]), **_counts(mats)})
    if cfg.adv_train:
        out["adv_train"] = _adv_block(runs, cfg, attacks)
    return MallSummary.from_dict(encode(out))


def _flip_block(out: dict[str, Any], runs: list[dict[str, Any]], cfg: MalleabilityConfig, setting: FlipSetting,
                pair: Pair | None) -> None:
    """Rows (per model and attack of `cfg.attacks`), pooled rows (per model) and the comparisons of `pair` (treated,
    control; none when None) at one setting."""
    training, intervention, eps = setting.training, setting.intervention, setting.eps
    attacks = tuple(cfg.attacks)
    by = {m: _runs_by_seed(runs, training, m) for m in cfg.models}
    seeds = _common_seeds(by)
    if not seeds:
        return
    with_seed = training == "standard" and all("seed_baseline" in by[m][s] for m in cfg.models for s in seeds)
    mats = {m: [_flip_matrix(by[m][s], intervention, eps, attacks, with_seed) for s in seeds] for m in cfg.models}
    paper = PAPER_FLIP.get((cfg.dataset, cfg.task), {})
    headline = eps == 0.3 and intervention == "transformed" and training == "standard"
    where = {"training": training, "intervention": intervention, "eps": eps}
    na = len(attacks)
    derived: dict[str, dict[str, np.ndarray]] = {}
    rho: dict[str, list[float]] = {}
    for m in cfg.models:
        e = seed_means(mats[m])
        runs_m = [by[m][s] for s in seeds]

        def vals(a: str, key: str, runs_m: list[dict[str, Any]] = runs_m) -> list[float]:
            return [_measurement(x, intervention, a, eps)[key] for x in runs_m]

        d = {"noise": e[:, 0]}
        for j, a in enumerate(attacks, start=1):
            d[f"flip:{a}"] = e[:, j]
            d[f"excess:{a}"] = e[:, j] - e[:, 0]
        pe = pooled(e, na)
        d[f"flip:{POOLED}"] = pe
        d[f"excess:{POOLED}"] = pe - e[:, 0]
        derived[m] = d
        base = {k: vals(BASELINE, k) for k in ("flip_rate", "rho_all", "rho_top")}
        for j, a in enumerate(attacks, start=1):
            v = {k: vals(a, k) for k in ("flip_rate", "rho_all", "rho_top", "pair_flip_rate")}
            row = {**where, "model": m, "attack": a, "per_seed_flip_rate": v["flip_rate"],
                   **{k: spread(x) for k, x in v.items()},
                   **{f"baseline_{k}": spread(x) for k, x in base.items()},
                   "flip_ci": t_interval(_l(d[f"flip:{a}"])), "baseline_ci": t_interval(_l(d["noise"])),
                   "excess_ci": t_interval(_l(d[f"excess:{a}"])),
                   "rho_all_ci": t_interval(v["rho_all"]),
                   "rho_drop_ci": difference(base["rho_all"], v["rho_all"]),
                   "paper_flip_pct": paper.get(m, {}).get(a) if headline else None, **_counts(mats[m])}
            if with_seed:
                row["excess_over_seed_ci"] = t_interval(_l(e[:, j] - e[:, -1]))
            out["rows"].append(row)
        rho_att = [float(np.mean([_measurement(x, intervention, a, eps)["rho_all"] for a in attacks]))
                   for x in runs_m]
        rho[m] = rho_att
        pooled_row = {**where, "model": m, "attacks": list(attacks), "flip_ci": t_interval(_l(pe)),
                      "baseline_ci": t_interval(_l(d["noise"])), "excess_ci": t_interval(_l(d[f"excess:{POOLED}"])),
                      "per_seed_rho_all": rho_att, "per_seed_baseline_rho_all": base["rho_all"],
                      "rho_all_ci": t_interval(rho_att), "baseline_rho_all_ci": t_interval(base["rho_all"]),
                      "rho_drop_ci": difference(base["rho_all"], rho_att), "seeds": list(seeds), **_counts(mats[m])}
        if with_seed:
            pooled_row["seed_baseline_ci"] = t_interval(_l(e[:, -1]))
            pooled_row["excess_over_seed_ci"] = t_interval(_l(pe - e[:, -1]))
        out["pooled"].append(pooled_row)
    if pair is None:
        return
    t, c = pair
    for a in (*attacks, POOLED):
        ft, fc = _l(derived[t][f"flip:{a}"]), _l(derived[c][f"flip:{a}"])
        xt, xc = _l(derived[t][f"excess:{a}"]), _l(derived[c][f"excess:{a}"])
        if a == POOLED:
            rho_d = [x - y for x, y in zip(rho[t], rho[c], strict=True)]
        else:
            rho_d = [_measurement(by[t][s], intervention, a, eps)["rho_all"]
                     - _measurement(by[c][s], intervention, a, eps)["rho_all"] for s in seeds]
        out["comparisons"].append({
            **where, "attack": a, "flip_diff_ci": difference(ft, fc), "excess_diff_ci": difference(xt, xc),
            "ratio_ci": fieller(ft, fc), "ratio_excess_ci": fieller(xt, xc), "rho_all_diff_ci": t_interval(rho_d),
            "noise_ratio_ci": fieller(_l(derived[t]["noise"]), _l(derived[c]["noise"])),
            "n_seeds": len(seeds), "seeds": list(seeds)})
    for a in (*attacks, BASELINE):
        out["ratios"].append({**where, "attack": a, **ratio(
            [_measurement(by[t][s], intervention, a, eps)["flip_rate"] for s in seeds],
            [_measurement(by[c][s], intervention, a, eps)["flip_rate"] for s in seeds], pair)})


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
        means = {t: seed_means(mats[t]) for t in by}
        for j, a in [(j, a) for j, a in enumerate(attacks, start=1)] + [(0, POOLED)]:
            f = {t: _l(means[t][:, j] if j else pooled(means[t], na)) for t in by}
            x = {t: [v - n for v, n in zip(f[t], means[t][:, 0], strict=True)] for t in by}
            row: dict[str, Any] = {
                "model": model, "attack": a,
                "standard_ci": t_interval(f["standard"]), "adversarial_ci": t_interval(f["adversarial"]),
                "standard_excess_ci": t_interval(x["standard"]),
                "adversarial_excess_ci": t_interval(x["adversarial"]),
                "rise_ci": difference(f["adversarial"], f["standard"]),
                "rise_excess_ci": difference(x["adversarial"], x["standard"]),
                "paper_pct": PAPER_ADV.get((cfg.dataset, model)) if a == "pgd" and cfg.task == "10class" else None,
                "n_seeds": len(seeds), "seeds": list(seeds),
                "n_points": {t: [int(len(m)) for m in mats[t]] for t in mats}}
            if a != POOLED:
                for t in by:
                    row[t] = spread([_measurement(by[t][s], "transformed", a, eps)["flip_rate"] for s in seeds])
                    row[f"{t}_rho_all"] = spread([_measurement(by[t][s], "transformed", a, eps)["rho_all"]
                                                  for s in seeds])
            out.append(row)
    return out


def ratio(treated: list[float], control: list[float], pair: Pair = PAPER_PAIR) -> dict[str, Any]:
    """Flip-rate ratio treated/control (the kinds of `pair`): of the seed means, and per seed (None where the
    control flipped nothing); the means are keyed by kind (`attn_mean`, `relu_mean` for the paper's pair)."""
    mt = float(np.mean(treated)) if treated else float("nan")
    mc = float(np.mean(control)) if control else float("nan")
    per_seed = [a / r if r > 0 else None for a, r in zip(treated, control, strict=True)]
    defined = [v for v in per_seed if v is not None]
    return {
        "ratio": mt / mc if mc > 0 else None,
        "per_seed": per_seed,
        "per_seed_min": min(defined) if defined else None,
        "per_seed_max": max(defined) if defined else None,
        f"{pair[0]}_mean": mt, f"{pair[1]}_mean": mc,
        "note": "" if mc > 0 else f"undefined: {model_name(pair[1])} flipped no point (ratio of zero)",
    }
