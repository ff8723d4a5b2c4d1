"""Budget curves of the audit: flip rate and the kernel predictor's outcome against eps and against k.

For each budget on a grid (eps in pixel units; k = how many of the top-|influence| training points are
perturbed) the attack (`curve_attack`, PGD by default) and random signs of the same size
(`baseline_seeds` seeds) are applied, the kernel rows of the perturbed points recomputed, and influence
recomputed (the flip-rate protocol of `verify.audit.measure`). Each point of a curve records the attack's flip
rate, the noise ceiling at that budget (noise mean + 2 std over seeds), the excess of the attack over
the ceiling, and an outcome without re-fitting: the change of the kernel predictor's test accuracy
(attack and noise). The re-fitted outcome is measured at the default budget (`verify.audit.outcome`).

**Breaking budget** (rule fixed before any measurement): the smallest eps on the grid at which the
attack's flip rate exceeds the noise ceiling at that eps *and* its flip count is significantly larger
than the noise's (one-sided Fisher exact test of attack flips among the k points against the noise flips
pooled over seeds, p < 0.05: one flip among 100 points against none is not yet a break); "not reached"
when it never happens.

**Realistic default budget**: eps = 8/255 (`REALISTIC_EPS`). It changes each 8-bit pixel by at most 8
grey levels, is the L-infinity budget of the RobustBench CIFAR-10 and ImageNet leaderboards and a common
budget of clean-label poisoning studies, and leaves an altered example looking like the original; eps =
0.3 (the paper's budget, the MNIST robustness convention) turns an example into visible noise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from empirics.attribution.influence import InfluenceResult
from empirics.experiments.malleability import n_top, top_by_abs
from empirics.progress import log
from reports.text import eps_label

if TYPE_CHECKING:  # verify.audit.config imports this module (REALISTIC_EPS)
    from verify.audit.config import AuditConfig

REALISTIC_EPS = 8 / 255
REALISTIC_REASON = ("8/255 changes each 8-bit pixel by at most 8 grey levels: the L-infinity budget of the "
                    "RobustBench CIFAR-10 / ImageNet leaderboards and a common budget of clean-label poisoning "
                    "studies, small enough that an altered example still looks like the original (the paper's "
                    "0.3 turns an image into visible noise)")
EPS_GRID = (1 / 255, 2 / 255, 4 / 255, 8 / 255, 16 / 255, 32 / 255, 0.3)
TAU_GRID = (0.01, 0.02, 0.05, 0.1, 0.2)
BREAKING_RULE = ("breaking budget: the smallest eps on the grid at which the attack's flip rate exceeds the noise "
                 "ceiling (random signs of the same eps: mean + 2 std over seeds) at that eps and its flip count is "
                 "significantly above the noise's (one-sided Fisher exact test against the pooled noise flips, "
                 "p < 0.05)")

#: probe(selected indices, attack name, eps, seed) -> (flip-rate metrics, influence after the perturbation)
Probe = Callable[[np.ndarray, str, float, int], tuple[dict[str, Any], InfluenceResult]]


def _point(probe: Probe, sel: np.ndarray, attack: str, eps: float, seeds: list[int],
           clean_acc: float) -> dict[str, Any]:
    m, _ = probe(sel, attack, eps, seeds[0])
    noise = [probe(sel, "random", eps, s)[0] for s in seeds[1:]]
    flips = np.array([b["flip_rate"] for b in noise])
    ceiling = float(flips.mean() + 2 * flips.std(ddof=1)) if flips.size > 1 else float(flips.mean())
    acc_noise = np.array([b["kernel_test_acc"] for b in noise])
    k = len(sel)
    a, b = round(m["flip_rate"] * k), round(float(flips.sum()) * k)
    p = float(stats.fisher_exact([[a, k - a], [b, k * len(noise) - b]], alternative="greater").pvalue)
    return {"eps": float(eps), "eps_label": eps_label(eps), "k": int(len(sel)),
            "flip_rate": float(m["flip_rate"]), "rho_all": float(m["rho_all"]),
            "noise_flip_rates": flips.tolist(), "noise_mean": float(flips.mean()), "noise_ceiling": ceiling,
            "excess": float(m["flip_rate"] - ceiling), "p_above_noise": p,
            "breaks": bool(m["flip_rate"] > ceiling and p < 0.05),
            "kernel_acc_change": float(m["kernel_test_acc"] - clean_acc),
            "kernel_acc_change_noise": float(acc_noise.mean() - clean_acc),
            "kernel_acc_change_noise_std": float(acc_noise.std(ddof=1)) if acc_noise.size > 1 else 0.0}


def budget_curves(probe: Probe, clean: InfluenceResult, cfg: AuditConfig, eps_grid: tuple[float, ...] = EPS_GRID,
                  tau_grid: tuple[float, ...] = TAU_GRID) -> dict[str, Any]:
    """Flip rate, noise ceiling and kernel-predictor outcome against eps (at `cfg.tau`) and against k (at `cfg.eps`),
    for the attack `cfg.curve_attack` against `cfg.baseline_seeds` seeds of random noise."""
    tau, eps, attack, seed, baseline_seeds = cfg.tau, cfg.eps, cfg.curve_attack, cfg.seed, cfg.baseline_seeds
    n = clean.n_train
    seeds = [seed + 7919 * j for j in range(baseline_seeds + 1)]
    sel = top_by_abs(clean.total, n_top(tau, n))
    log(f"audit: budget curve over eps ({len(eps_grid)} values, {attack.upper()} + {baseline_seeds} noise seeds)")
    by_eps = [_point(probe, sel, attack, e, seeds, clean.test_acc) for e in sorted(set(eps_grid))]
    ks = sorted({n_top(t, n) for t in tau_grid})
    log(f"audit: budget curve over k ({len(ks)} values at eps {eps_label(eps)})")
    by_k = [_point(probe, top_by_abs(clean.total, k), attack, eps, seeds, clean.test_acc) for k in ks]
    breaking = next((p for p in by_eps if p["breaks"]), None)
    return {"attack": attack, "tau": tau, "eps": eps, "by_eps": by_eps, "by_k": by_k,
            "breaking_eps": breaking["eps"] if breaking else None,
            "breaking_label": breaking["eps_label"] if breaking else f"not reached up to {eps_label(max(eps_grid))}",
            "rule": BREAKING_RULE, "realistic_eps": REALISTIC_EPS, "realistic_label": eps_label(REALISTIC_EPS),
            "realistic_reason": REALISTIC_REASON}
