"""Scoring an influence estimator against re-fits: the LDS, the noise ceiling and their bootstrap intervals.

The definitions are the validity panel's (`verify.audit.validity`, whose docstring states them and the verdict's
rule): the LDS of an estimator is the Spearman correlation (over subsets) of its predicted and the re-fits' actual
changes of each test point's loss, averaged over test points; the noise ceiling is what a perfect predictor would
reach against the mean of the repeats; every interval is a bootstrap over subsets and test points together. Here
are the computations, the bar and the looks of the adaptive panel, and `interval_verdict`, the rule's reading of one
fraction-of-ceiling interval (shared by the panel and its stability check, `verify.audit.verdict_stability`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from verify.audit.ranks import ranked, weighted_nanmean, weighted_ranks, weighted_spearman

#: The bar of validation, fixed before any measurement: the lower end of the 95 % interval of an estimator's LDS as a
#: fraction of the noise ceiling must reach it (half of what a perfect predictor of the re-fits could reach).
FRACTION_MIN = 0.5
#: The error the verdict allows in all: its interval misses the truth at most this often over all of a panel's looks.
DECISION_ERROR = 0.05


def planned_looks(pilot: int, budget: int) -> int:
    """How many times the adaptive panel (`adaptive_lds`) can look at its interval: the pilot, then after each round
    that adds as many subsets again, up to `budget` subsets (1 for a panel that does not adapt)."""
    looks, size = 1, pilot
    while size < budget:
        size += min(size, budget - size)
        looks += 1
    return looks


def decision_level(looks: int) -> float:
    """The level of the fraction-of-ceiling interval the verdict reads at each of `looks` planned looks: Bonferroni
    over the looks, so that stopping at the first interval that clears or misses the bar errs at most
    `DECISION_ERROR` of the time in all (a panel that adds subsets until its interval leaves the bar would, at 95 %
    per look, stop on noise more often than 5 %). 95 % for a panel that does not adapt."""
    return 1.0 - DECISION_ERROR / max(1, looks)


def widen(looks: int) -> float:
    """The factor from the 95 % interval to the `decision_level(looks)` one: the ratio of the normal quantiles, each
    side of the bias-shifted percentile interval stretched by it about the point (a percentile at 1 - 0.05 / (2K)
    would need thousands of bootstrap resamples to be stable; the stretch keeps the interval's asymmetry)."""
    return float(stats.norm.ppf(1 - DECISION_ERROR / (2 * max(1, looks))) / stats.norm.ppf(1 - DECISION_ERROR / 2))


TRUSTWORTHY, FRAGILE, INCONCLUSIVE = "trustworthy", "fragile", "inconclusive"

def _col_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each column of a with the same column of b (rows: subsets); NaN if constant."""
    ra, rb = stats.rankdata(a, axis=0), stats.rankdata(b, axis=0)
    ra, rb = ra - ra.mean(axis=0), rb - rb.mean(axis=0)
    den = np.sqrt((ra**2).sum(axis=0) * (rb**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(axis=0) / np.where(den > 0, den, 1.0), np.nan)


def ceiling_from_agreement(r1: float, k: int) -> float:
    """The highest LDS a perfect predictor can reach against the mean of `k` repeated re-fits whose single re-fits
    agree with each other at rank correlation `r1` (per test point, over subsets).

    Classical test theory: two noisy measurements of the same signal correlate at their reliability r1; the mean of
    k of them has reliability k r1 / (1 + (k - 1) r1) (Spearman-Brown), and nothing correlates with a noisy target
    more than the square root of its reliability. 0 when the re-fits do not agree at all (r1 <= 0)."""
    if not np.isfinite(r1):
        return float("nan")
    if r1 <= 0:
        return 0.0
    return float(np.sqrt(k * r1 / (1 + (k - 1) * r1)))


def _agreement(reps: np.ndarray) -> float:
    """Mean over test points and over pairs of repeats of the Spearman correlation (over subsets) between two
    repeats' actual changes (reps: repeats x subsets x test points); NaN with fewer than two repeats."""
    k = len(reps)
    if k < 2:
        return float("nan")
    per = np.stack([_col_spearman(reps[a], reps[b]) for a in range(k) for b in range(a + 1, k)])
    return float(np.nanmean(per)) if np.isfinite(per).any() else float("nan")


def _lds_value(pred: np.ndarray, actual: np.ndarray) -> float:
    per = _col_spearman(pred, actual)
    return float(np.nanmean(per)) if np.isfinite(per).any() else float("nan")


def _draws_generic(preds: dict[str, np.ndarray], reps: np.ndarray, n_boot: int,
                   rng: np.random.Generator) -> tuple[dict[str, list[float]], list[float]]:
    """The bootstrap of `score_estimators` by ranking every resampled matrix anew: each estimator's LDS per draw and
    the repeats' agreement per draw (the reference of `_draws_fast`, and its stand-in where a value is not finite)."""
    target = reps.mean(axis=0)
    _, m, t = reps.shape
    boot: dict[str, list[float]] = {name: [] for name in preds}
    agree = []
    for _ in range(n_boot):
        i, j = rng.integers(0, m, m), rng.integers(0, t, t)
        agree.append(_agreement(reps[:, i][:, :, j]))
        for name, pred in preds.items():
            boot[name].append(_lds_value(pred[i][:, j], target[i][:, j]))
    return boot, agree


def _draws_fast(preds: dict[str, np.ndarray], reps: np.ndarray, n_boot: int,
                rng: np.random.Generator) -> tuple[dict[str, list[float]], list[float]]:
    """The same draws as `_draws_generic` (the same generator calls), each resample's ranks taken from one sort per
    matrix (`verify.audit.ranks`): a drawn row is weighted by how often it was drawn, a drawn column likewise."""
    target = reps.mean(axis=0)
    k, m, t = reps.shape
    r_target, r_reps = ranked(target), [ranked(r) for r in reps]
    r_preds = {name: ranked(pred) for name, pred in preds.items()}
    boot: dict[str, list[float]] = {name: [] for name in preds}
    agree = []
    for _ in range(n_boot):
        i, j = rng.integers(0, m, m), rng.integers(0, t, t)
        w, v = np.bincount(i, minlength=m).astype(float), np.bincount(j, minlength=t).astype(float)
        if k >= 2:
            rr = [weighted_ranks(r, w) for r in r_reps]
            pairs = np.stack([weighted_spearman(rr[a], rr[b], w) for a in range(k) for b in range(a + 1, k)])
            agree.append(weighted_nanmean(pairs, v))
        else:
            agree.append(float("nan"))
        rt = weighted_ranks(r_target, w)
        for name, r in r_preds.items():
            boot[name].append(weighted_nanmean(weighted_spearman(weighted_ranks(r, w), rt, w), v))
    return boot, agree


def draws(preds: dict[str, np.ndarray], reps: np.ndarray, n_boot: int,
          rng: np.random.Generator) -> tuple[dict[str, list[float]], list[float]]:
    """`n_boot` bootstrap draws of each estimator's LDS and of the repeats' agreement: `_draws_fast` where every value
    is finite, else `_draws_generic` (the same numbers where both run)."""
    finite = np.isfinite(reps).all() and all(np.isfinite(p).all() for p in preds.values())
    return (_draws_fast if finite else _draws_generic)(preds, reps, n_boot, rng)


def subsets_for(half: float, gap: float, sizes: tuple[int, int], extra_z: float = 0.0) -> int:
    """The subsets at which an interval end would sit `gap` from its point estimate: the 95 % half-width `half` at
    `sizes[0]` subsets falls like 1 / sqrt(subsets) (the bootstrap's scaling) and is widened for the looks a panel
    with that budget and the pilot `sizes[1]` plans (`widen`), plus `extra_z` 95 % half-widths of margin. The budget
    sets the looks and the looks the width, so it is iterated to the fixed point."""
    subsets, pilot = sizes
    need = subsets
    for _ in range(20):
        again = max(subsets, int(np.ceil(subsets * (half * (widen(planned_looks(pilot, need)) + extra_z) / gap) ** 2)))
        if again == need:
            break
        need = again
    return need


def rerun_cost(need: int, subsets: int, repeats: int, last: dict[str, Any]) -> dict[str, Any]:
    """The extra re-fits of a rerun with `need` subsets after `subsets` (each re-fitted `repeats` times) and their
    time at the seconds per re-fit of the adaptive panel's `last` round."""
    extra = max(0, need - subsets) * repeats
    return {"subsets": need, "extra_refits": extra, "seconds": extra * last["seconds"] / max(last["refits"], 1)}


def score_estimators(preds: dict[str, np.ndarray], reps: np.ndarray, n_boot: int = 400,
                     seed: int = 0, looks: int = 1) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each estimator's LDS against the mean of the repeated re-fits, and the noise ceiling from their agreement.

    `preds` maps an estimator's name to its predicted changes (subsets x test points); `reps` holds the actual
    changes of each repeat (repeats x subsets x test points). Every interval is a 95 % bootstrap that resamples
    subsets and test points together, the same resamples for every estimator and the ceiling, its percentiles
    shifted by the bootstrap's bias; the fraction of the ceiling (LDS / ceiling) is bootstrapped as a ratio. With one
    repeat there is no ceiling (NaN). The fraction's interval, which the verdict reads, is at the level
    `decision_level(looks)` for a panel that may look `looks` times (`widen`). The draws are ranked by
    `_draws_fast` where every value is finite, else by `_draws_generic` (the same numbers)."""
    target = reps.mean(axis=0)
    k, m, t = reps.shape
    rng = np.random.default_rng(seed)
    boot, agree = draws(preds, reps, n_boot, rng)
    ceil = [ceiling_from_agreement(r1, k) for r1 in agree]
    frac = {name: [v / c if c > 0 else np.nan for v, c in zip(vals, ceil, strict=True)]
            for name, vals in boot.items()}

    def q(vals: list[float], point: float) -> tuple[float, float]:
        """The percentile interval shifted by the bootstrap's bias (resampled subsets repeat, and the ties pull
        every rank correlation down)."""
        a = np.asarray(vals, dtype=float)
        a = a[np.isfinite(a)]
        if not a.size or not np.isfinite(point):
            return (np.nan, np.nan)
        shift = point - float(a.mean())
        return (float(np.quantile(a, 0.025)) + shift, float(np.quantile(a, 0.975)) + shift)

    r1 = _agreement(reps)
    c = ceiling_from_agreement(r1, k)
    a_lo, a_hi = q(agree, r1)
    c_lo, c_hi = q(ceil, c)
    ceiling = {"repeats": int(k), "agreement": r1, "agreement_lo": a_lo, "agreement_hi": a_hi,
               "value": c, "lo": max(0.0, c_lo) if np.isfinite(c_lo) else c_lo, "hi": c_hi}
    scores = {}
    for name, pred in preds.items():
        value = _lds_value(pred, target)
        fraction = value / c if c > 0 else float("nan")
        lo, hi = q(boot[name], value)
        f_lo, f_hi = q(frac[name], fraction)
        w = widen(looks)
        f_lo, f_hi = fraction - (fraction - f_lo) * w, fraction + (f_hi - fraction) * w
        total = stats.spearmanr(pred.sum(axis=1), target.sum(axis=1)).statistic if m > 2 else np.nan
        scores[name] = {"value": value, "lo": lo, "hi": hi,
                        "per_test_finite": int(np.isfinite(_col_spearman(pred, target)).sum()),
                        "total_spearman": float(total), "fraction": fraction,
                        "fraction_lo": f_lo, "fraction_hi": f_hi, "fraction_level": decision_level(looks),
                        "validated": bool(np.isfinite(f_lo) and f_lo >= FRACTION_MIN)}
    return scores, ceiling


def lds(pred: np.ndarray, actual: np.ndarray, n_boot: int = 400, seed: int = 0) -> dict[str, Any]:
    """LDS of predicted vs actual changes (subsets x test points) with a bootstrap over both (one repeat)."""
    return score_estimators({"x": pred}, actual[None], n_boot, seed)[0]["x"]


def interval_verdict(f_lo: float, f_hi: float, ceiling: float, beyond: bool) -> str:
    """The validity rule's verdict from the lead's fraction-of-ceiling interval [f_lo, f_hi], the ceiling and whether
    removing its top levers beat random removal and noise (`beyond`): trustworthy, fragile or inconclusive (the
    control re-fit's gate and non-finite values, which make it not measurable, are checked before)."""
    if not (np.isfinite(ceiling) and ceiling > 0):
        return INCONCLUSIVE
    if f_lo >= FRACTION_MIN and beyond:
        return TRUSTWORTHY
    if f_hi < FRACTION_MIN or not beyond:
        return FRAGILE
    return INCONCLUSIVE
