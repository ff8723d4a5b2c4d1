"""Validity panel of the audit: does the influence predict what re-fitting the model really does?

Every "actual" number is a re-fit (`verify.audit_refit`) minus the control re-fit with the same seed.

- **Linear datamodeling score (LDS**, Park et al. 2023, TRAK): `subsets` random subsets, each leaving out
  a fraction `fraction` of the training points; for each the model is fitted again. Predicted change of
  test point t's loss: the sum of the left-out points' influences on t (NTK leave-one-out, and
  Gauss-Newton); actual: the re-fitted model's loss of t minus the control's. LDS is the Spearman
  correlation over subsets, averaged over test points; its 95 % interval is a bootstrap that resamples
  subsets and test points together.
- **Removal of the top levers**: the k most helpful training points (largest total NTK influence) left
  out and the model fitted again, against k random points; predicted and actual change of the mean test
  loss. The re-fit noise is the spread (std) of the mean test loss over control re-fits with different seeds.
- **Brittleness** (Ilyas et al. 2022): for one test prediction (a correctly predicted test point of
  median margin, or the one asked for), the smallest k on a doubling grid such that leaving out its k
  top-ranked supporters (largest influence on that point) and re-fitting changes the predicted label;
  the same k of random points is left out with several seeds (how often that flips it too).

The **re-fit noise** is the standard deviation of the mean test loss over the smallest changes a re-fit
can see: control re-fits with other seeds, and re-fits that each leave out one random point (a fit that
is chaotic in its data, e.g. one whose initialisation depends on them, shows up here even when it
ignores the seed).

**Verdict** (rule fixed before any measurement, `VALIDITY_RULE`): not measurable when the control re-fit
is not adequate; **trustworthy** when the lower end of the NTK influence's LDS interval is above
`LDS_MIN` and removing the top levers raises the re-fitted test loss by more than removing as many random
points plus twice the re-fit noise; **fragile** when the upper end of the LDS interval is below `LDS_MIN`,
or the top-lever removal does not pass that test; inconclusive otherwise (the removal test passes but the
LDS interval straddles `LDS_MIN`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats

from empirics.progress import log
from verify.audit_refit import Refitter, labels_of, per_example_loss, refit_adequacy

LDS_MIN = 0.2
TRUSTWORTHY, FRAGILE, INCONCLUSIVE, NOT_MEASURABLE = "trustworthy", "fragile", "inconclusive", "not measurable"
VALIDITY_RULE = (f"trustworthy if the lower end of the LDS 95 % interval (NTK influence) is above {LDS_MIN:g} and "
                 "removing the top levers raises the re-fitted test loss by more than removing as many random points "
                 f"plus 2 x the re-fit noise; fragile if the upper end of the LDS interval is below {LDS_MIN:g} or the "
                 "top-lever removal fails that test; inconclusive otherwise; not measurable if the control re-fit "
                 "is not adequate")


def _col_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each column of a with the same column of b (rows: subsets); NaN if constant."""
    ra, rb = stats.rankdata(a, axis=0), stats.rankdata(b, axis=0)
    ra, rb = ra - ra.mean(axis=0), rb - rb.mean(axis=0)
    den = np.sqrt((ra**2).sum(axis=0) * (rb**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(axis=0) / np.where(den > 0, den, 1.0), np.nan)


def lds(pred: np.ndarray, actual: np.ndarray, n_boot: int = 400, seed: int = 0) -> dict[str, Any]:
    """LDS of predicted vs actual changes (subsets x test points) with a bootstrap over both."""
    per = _col_spearman(pred, actual)
    value = float(np.nanmean(per)) if np.isfinite(per).any() else float("nan")
    rng = np.random.default_rng(seed)
    m, t = pred.shape
    reps = []
    for _ in range(n_boot):
        i, j = rng.integers(0, m, m), rng.integers(0, t, t)
        r = _col_spearman(pred[i][:, j], actual[i][:, j])
        if np.isfinite(r).any():
            reps.append(float(np.nanmean(r)))
    lo, hi = (np.quantile(reps, [0.025, 0.975]) if reps else (np.nan, np.nan))
    total = stats.spearmanr(pred.sum(axis=1), actual.sum(axis=1)).statistic if m > 2 else np.nan
    return {"value": value, "lo": float(lo), "hi": float(hi), "per_test_finite": int(np.isfinite(per).sum()),
            "total_spearman": float(total)}


def _median_margin_point(out: np.ndarray, yt: np.ndarray) -> int | None:
    """A correctly predicted test point of median margin (None when none is correct)."""
    pred = labels_of(out)
    ok = np.flatnonzero(pred == yt)
    if not ok.size:
        return None
    if out.shape[1] == 1:
        margin = np.abs(out[ok, 0])
    else:
        o = out[ok].copy()
        true = o[np.arange(len(ok)), yt[ok]]
        o[np.arange(len(ok)), yt[ok]] = -np.inf
        margin = true - o.max(axis=1)
    return int(ok[np.argsort(margin, kind="stable")[len(ok) // 2]])


def validity_panel(refit: Refitter, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor,
                   ntk_per_test: np.ndarray, gn_per_test: np.ndarray, saved_acc: tuple[float, float], tau: float,
                   subsets: int, fraction: float, noise_seeds: int, seed: int, target: int | None,
                   out_dim: int) -> dict[str, Any]:
    """LDS, top-lever removal, brittleness and the verdict (see the module docstring)."""
    n, t = len(x), len(xt)
    y_np, yt_np = y.numpy(), yt.numpy()
    ev = {"train": x, "test": xt}
    ctrl = refit.control(x, y, seed, ev)
    gate = refit_adequacy(refit.cfg.kind, ctrl, y_np, yt_np, saved_acc[0], saved_acc[1], out_dim)
    base_loss = per_example_loss(ctrl["test"], yt_np, out_dim)
    noise_means = [float(base_loss.mean())]
    for s in range(1, noise_seeds + 1):
        noise_means.append(float(per_example_loss(refit.control(x, y, seed + s, ev)["test"], yt_np, out_dim).mean()))
    rng = np.random.default_rng(seed + 104729)
    for i in rng.choice(n, noise_seeds, replace=False):
        keep = torch.as_tensor(np.delete(np.arange(n), i))
        out = refit.outputs(x[keep], y[keep], seed, {"test": xt})["test"]
        noise_means.append(float(per_example_loss(out, yt_np, out_dim).mean()))
    noise_sd = float(np.std(noise_means, ddof=1))
    r = max(1, min(n - 1, round(fraction * n)))
    log(f"audit: validity: {subsets} re-fits leaving out {r} random points each")
    removed, actual = [], np.zeros((subsets, t))
    for m in range(subsets):
        rem = rng.choice(n, r, replace=False)
        keep = torch.as_tensor(np.setdiff1d(np.arange(n), rem))
        out = refit.outputs(x[keep], y[keep], seed, {"test": xt})["test"]
        actual[m] = per_example_loss(out, yt_np, out_dim) - base_loss
        removed.append(rem)
    scores = {}
    for name, infl in (("ntk", ntk_per_test), ("gn", gn_per_test)):
        pred = np.stack([infl[rem].sum(axis=0) for rem in removed])
        scores[name] = lds(pred, actual, seed=seed)
    total = ntk_per_test.sum(axis=1)
    k = max(1, min(n - 1, round(tau * n)))
    order = np.argsort(-total, kind="stable")
    log(f"audit: validity: leaving out the top {k} levers and {k} random points")
    removal = {}
    for arm, rem in (("top", order[:k]), ("random", rng.choice(n, k, replace=False))):
        keep = torch.as_tensor(np.setdiff1d(np.arange(n), rem))
        out = refit.outputs(x[keep], y[keep], seed, {"test": xt})["test"]
        removal[arm] = {"k": int(k), "predicted": float(ntk_per_test[rem].sum() / t),
                        "actual": float(per_example_loss(out, yt_np, out_dim).mean() - base_loss.mean())}
    beyond = removal["top"]["actual"] > removal["random"]["actual"] + 2 * noise_sd
    brittle = _brittleness(refit, x, y, xt, yt_np, ntk_per_test, ctrl["test"], seed, target, noise_seeds)
    s = scores["ntk"]
    if not gate["passed"]:
        verdict, why = NOT_MEASURABLE, f"the control re-fit is not adequate ({gate['reason']})"
    elif s["lo"] > LDS_MIN and beyond:
        verdict, why = TRUSTWORTHY, (f"LDS {s['value']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}] above {LDS_MIN:g} and "
                                     "removing the top levers raises the test loss beyond random removal and noise")
    elif s["hi"] < LDS_MIN or not beyond:
        parts = []
        if s["hi"] < LDS_MIN:
            parts.append(f"LDS {s['value']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}] below {LDS_MIN:g}")
        if not beyond:
            parts.append("removing the top levers raises the re-fitted test loss no more than removing random points "
                         "plus 2 x the re-fit noise")
        verdict, why = FRAGILE, "; ".join(parts)
    else:
        verdict, why = INCONCLUSIVE, (f"LDS {s['value']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}] straddles {LDS_MIN:g}, "
                                      "although removing the top levers raises the test loss beyond random removal")
    gn = scores["gn"]
    if verdict in (FRAGILE, INCONCLUSIVE) and gn["lo"] > LDS_MIN:
        why += f"; the Gauss-Newton estimate does better (LDS {gn['value']:.2f} [{gn['lo']:.2f}, {gn['hi']:.2f}])"
    return {"refit": refit.cfg.describe(), "refit_kind": refit.cfg.kind, "control": gate,
            "subsets": subsets, "fraction": fraction, "left_out": int(r), "lds": scores,
            "noise": {"refits": len(noise_means), "mean_test_loss": noise_means, "sd": noise_sd},
            "signal_sd": float(actual.mean(axis=1).std(ddof=1)) if subsets > 1 else float("nan"),
            "scatter": {"predicted": np.stack([ntk_per_test[rem].sum() / t for rem in removed]).tolist(),
                        "actual": actual.mean(axis=1).tolist()},
            "removal": removal, "removal_beyond_noise": bool(beyond), "brittleness": brittle,
            "verdict": verdict, "reason": why, "rule": VALIDITY_RULE, "lds_min": LDS_MIN}


def _brittleness(refit: Refitter, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: np.ndarray,
                 per_test: np.ndarray, ctrl_test: np.ndarray, seed: int, target: int | None,
                 random_seeds: int) -> dict[str, Any]:
    n = len(x)
    j = target if target is not None else _median_margin_point(ctrl_test, yt)
    if j is None:
        return {"target": None, "reason": "no test point is predicted correctly by the control re-fit"}
    base = int(labels_of(ctrl_test[j:j + 1])[0])
    order = np.argsort(-per_test[:, j], kind="stable")
    grid = [k for k in (2**p for p in range(20)) if k <= max(1, n // 4)]
    log(f"audit: brittleness of test point {j}: up to {len(grid)} re-fits")
    found, tried = None, []
    for k in grid:
        keep = torch.as_tensor(np.sort(order[k:]))
        out = refit.outputs(x[keep], y[keep], seed, {"t": xt[j:j + 1]})["t"]
        flipped = int(labels_of(out)[0]) != base
        tried.append({"k": int(k), "flipped": bool(flipped)})
        if flipped:
            found = k
            break
    k_rand = found or grid[-1]
    rng = np.random.default_rng(seed + 15485863)
    rand = []
    for _ in range(random_seeds):
        rem = rng.choice(n, k_rand, replace=False)
        keep = torch.as_tensor(np.setdiff1d(np.arange(n), rem))
        out = refit.outputs(x[keep], y[keep], seed, {"t": xt[j:j + 1]})["t"]
        rand.append(int(labels_of(out)[0]) != base)
    return {"target": int(j), "label": int(yt[j]), "predicted": base, "k": found, "tried": tried,
            "max_k": int(grid[-1]), "random_k": int(k_rand), "random_flip_fraction": float(np.mean(rand)),
            "random_trials": len(rand)}
