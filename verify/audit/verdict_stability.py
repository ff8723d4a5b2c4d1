"""Does the validity verdict survive a rerun and a resample? (`verdict_stability`)

The validity verdict reads one end of an interval against a bar (`verify.audit.lds.interval_verdict`). An end that
sits on the bar is decided by the draw: the audit's own bootstrap, or which subsets and test points happened to be
drawn. `verify claims` flags such a verdict 'fragile' by re-running its rule on seed resamples (`verify.stability`);
this is the audit's counterpart, on the lead estimator's LDS (rule fixed on 2026-12-06, after the CNN audit at 1,047
subsets was announced trustworthy with a lower end 0.0003 above the bar, and logged here as a rule change after a
run):

- **rerun**: the panel's scoring (`verify.audit.lds.score_estimators`, the same re-fits, the same number of bootstrap
  draws and looks) with `RERUN_SEEDS` other bootstrap seeds; the verdict each gives. A rerun of the audit itself with
  the same seed is deterministic, so this is the variation a rerun of its statistics can show.
- **resample**: `RESAMPLES` bootstrap resamples of the subsets and test points together (the draws of the panel's
  interval, generator seed `SEED`); in each, the rule applied to the resampled fraction of the ceiling with the
  interval's half-widths held at the full sample's. Re-scoring each resample with a bootstrap of its own (a double
  bootstrap) would cost `RESAMPLES` times the panel's scoring and overstate the widths: a resample holds about 63 %
  distinct subsets, and on a synthetic world its intervals came out a third wider than the full sample's (half-width
  0.121 against 0.092). A resample whose re-fits give no ceiling reads inconclusive. The share of resamples that give
  the verdict is its **agreement**; tests/verify/test_audit_verdict_stability.py checks that it predicts what it is
  for: on synthetic worlds around the bar, fresh runs (new subsets, test points and noise) contradict the verdicts it
  flags more often than those it calls stable.

The lever-removal test (one pair of re-fits, top against random) is held fixed in both: there is nothing to resample.
A verdict is a **knife-edge** when a rerun changes it or its agreement is below `STABLE_AGREEMENT` (the claims'
`FRAGILE_AGREEMENT`), else **stable**. A trustworthy knife-edge issues no risk level (`verify.audit.risk`: a verdict
a single draw decides is flagged, not announced), and `to_stabilise` states the subsets at which it would be stable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from verify.audit.lds import (
    FRACTION_MIN,
    FRAGILE,
    TRUSTWORTHY,
    ceiling_from_agreement,
    draws,
    interval_verdict,
    rerun_cost,
    score_estimators,
    subsets_for,
    widen,
)
from verify.stability import FRAGILE_AGREEMENT

#: A verdict is stable when at least this share of resamples give it (the claims' seed-stability bar) ...
STABLE_AGREEMENT = FRAGILE_AGREEMENT
#: ... and each of this many reruns of the scoring with other bootstrap seeds gives it too.
RERUN_SEEDS = 5
#: Resamples of the subsets and test points, and the seed of their generator.
RESAMPLES = 1000
SEED = 20_261_206
STABLE, KNIFE_EDGE = "stable", "knife-edge"
STABILITY_RULE = (f"the validity verdict re-read on {RERUN_SEEDS} reruns of the panel's scoring with other bootstrap "
                  f"seeds and on {RESAMPLES} resamples of the subsets and test points (numpy default_rng({SEED}); "
                  "the interval's half-widths held, the lever-removal test held); a knife-edge when a rerun "
                  f"changes it or fewer than {STABLE_AGREEMENT:g} of the resamples give it, else stable")


def resampled_intervals(pred: np.ndarray, reps: np.ndarray, score: dict[str, Any], n: int = RESAMPLES,
                        seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lead's fraction-of-ceiling interval in each of `n` resamples of the subsets and test points: the resampled
    fraction (shifted by the resamples' mean bias, as the panel's interval is) with the half-widths of the panel's
    interval `score` (the lead's entry of `score_estimators`) about it; (lower ends, upper ends, ceilings), NaN ends
    where a resample has no ceiling."""
    k = reps.shape[0]
    rng = np.random.default_rng(seed)
    boot, agree = draws({"lead": pred}, reps, n, rng)
    ceil = np.array([ceiling_from_agreement(a, k) for a in agree])
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(ceil > 0, np.asarray(boot["lead"]) / np.where(ceil > 0, ceil, 1.0), np.nan)
    f, lo, hi = score["fraction"], score["fraction_lo"], score["fraction_hi"]
    ok = np.isfinite(frac)
    centred = frac + (f - float(frac[ok].mean()) if ok.any() else 0.0)
    return centred - (f - lo), centred + (hi - f), ceil


def resample_verdicts(pred: np.ndarray, reps: np.ndarray, score: dict[str, Any], beyond: bool,
                      n: int = RESAMPLES, seed: int = SEED) -> list[str]:
    """The verdict in each of `n` resamples (`resampled_intervals`), the lever-removal test's outcome `beyond` held."""
    lows, highs, ceil = resampled_intervals(pred, reps, score, n, seed)
    return [interval_verdict(a, b, c, beyond) for a, b, c in zip(lows, highs, ceil, strict=True)]


def rerun_verdicts(pred: np.ndarray, reps: np.ndarray, beyond: bool, looks: int,
                   seeds: list[int]) -> list[dict[str, Any]]:
    """The verdict of the panel's scoring of the lead with each of `seeds` as the bootstrap's seed."""
    out = []
    for s in seeds:
        scores, ceiling = score_estimators({"lead": pred}, reps, seed=s, looks=looks)
        sc = scores["lead"]
        out.append({"seed": int(s), "fraction_lo": sc["fraction_lo"], "fraction_hi": sc["fraction_hi"],
                    "verdict": interval_verdict(sc["fraction_lo"], sc["fraction_hi"], ceiling["value"], beyond)})
    return out


def verdict_stability(pred: np.ndarray, reps: np.ndarray, score: dict[str, Any], ceiling: float,
                      verdict_in: tuple[str, bool], looks_seed: tuple[int, int]) -> dict[str, Any]:
    """The stability of `verdict` (`verdict_in` = (verdict, whether the lever removal beat random and noise)) of the
    lead estimator's predictions `pred` against the re-fits `reps`, whose panel scored it `score` against `ceiling`
    with `looks` planned looks and bootstrap seed `seed` (`looks_seed`): the module docstring's rule."""
    verdict, beyond = verdict_in
    looks, seed = looks_seed
    reruns = rerun_verdicts(pred, reps, beyond, looks, [seed + 1 + i for i in range(RERUN_SEEDS)])
    lows, highs, ceil = resampled_intervals(pred, reps, score)
    resampled = [interval_verdict(a, b, c, beyond) for a, b, c in zip(lows, highs, ceil, strict=True)]
    agreement = float(np.mean([v == verdict for v in resampled]))
    changed = [r for r in reruns if r["verdict"] != verdict]
    stable = not changed and agreement >= STABLE_AGREEMENT
    counts = {v: resampled.count(v) for v in sorted(set(resampled))}
    parts = [f"{agreement:.0%} of {len(resampled)} resamples of the subsets and test points give it"]
    interval_alone = None
    if not beyond:  # the failed removal test decides every resample: say how the interval alone would read
        own = interval_verdict(score["fraction_lo"], score["fraction_hi"], ceiling, True)
        interval_alone = {"verdict": own, "agreement": float(np.mean(
            [interval_verdict(a, b, c, True) == own for a, b, c in zip(lows, highs, ceil, strict=True)]))}
        parts[0] += (f" (the failed lever-removal test, one pair of re-fits held in each, decides it; on the interval "
                     f"alone, {own}, {interval_alone['agreement']:.0%} of them would)")
    if changed:
        parts.append(f"{len(changed)} of {len(reruns)} reruns of the scoring with another bootstrap seed read "
                     + ", ".join(sorted({r['verdict'] for r in changed})))
    detail = "; ".join(parts)
    text = f"{KNIFE_EDGE if not stable else STABLE}: {detail}"
    return {"label": STABLE if stable else KNIFE_EDGE, "stable": bool(stable), "agreement": agreement,
            "detail": detail,
            "resamples": len(resampled), "resample_verdicts": counts, "interval_alone": interval_alone,
            "reruns": reruns,
            "ceiling": float(ceiling), "text": text, "rule": STABILITY_RULE}


def to_stabilise(score: dict[str, Any], sizes: tuple[int, int, int], repeats: int, last: dict[str, Any],
                 verdict: str) -> dict[str, Any] | None:
    """Where a trustworthy or fragile verdict read from the interval is a knife-edge: the subsets at which its end
    would sit far enough from the bar that `STABLE_AGREEMENT` of resamples keep it (the point estimate held, the 95 %
    half-width falling like 1 / sqrt(subsets), widened for the looks of a panel with that budget, plus the normal
    quantile of the agreement bar), the extra re-fits and their time at this run's seconds per re-fit (`last`: the
    adaptive panel's last round). `sizes` = (subsets re-fitted, the pilot, the looks this run planned)."""
    subsets, pilot, looks = sizes
    lo, hi, value = score.get("fraction_lo", np.nan), score.get("fraction_hi", np.nan), score.get("fraction", np.nan)
    if verdict not in (TRUSTWORTHY, FRAGILE) or not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(value)):
        return None
    gap = value - FRACTION_MIN if verdict == TRUSTWORTHY else FRACTION_MIN - value
    if gap <= 0:
        return None
    half = (hi - lo) / 2 / widen(looks)
    extra_z = float(stats.norm.ppf(STABLE_AGREEMENT) / stats.norm.ppf(0.975))
    return {**rerun_cost(subsets_for(half, gap, (subsets, pilot), extra_z), subsets, repeats, last),
            "method": "interval half-width ~ 1/sqrt(subsets) from this run's interval, widened for the looks of a "
                      f"panel with that budget, plus the normal quantile of {STABLE_AGREEMENT:g}; the point estimate "
                      "held; seconds at this run's mean time per LDS re-fit"}
