"""Outcome-level malleability and the planted-poison self-test of the audit (both re-fit the model).

**Outcome** (`outcome_panel`): the top-k levers (the flip-rate protocol's selection) are perturbed by the
attack at eps and the model is fitted again; as the baseline, k random training points are perturbed the
same way. Against the control re-fit of each seed: the change of test accuracy, and for the *targeted*
test predictions (the `targets` test points on which the levers' influence is largest in total) the
fraction whose predicted label changes and the change of their mean loss. Intervals (95 %, `outcome_rows`)
that stay where the quantity can lie: the fraction of targeted predictions changed is a proportion, with the
Wilson score interval of the changes pooled over seeds x targeted points (inside [0, 1]; it treats each as one
trial); a change of test accuracy and every paired difference levers - random are t-intervals over seeds clipped
to [-1, 1], where such a change lies; the change of the targeted loss is a plain t-interval over seeds. Rule: the
levers move an outcome beyond random points when the interval of the difference excludes zero. The re-fitted
outcome along the budget curves (`outcome_curves`) has the same intervals at every point, from the same seeds.

**Planted poison** (`poison_panel`): a fraction of the training points is altered, half by a label flip
(a random other class) and half by an eps-bounded perturbation (PGD against the saved model at the
point's own label, the label kept); the model is fitted again on the poisoned set and the audit's
kernel and influence computed on that model. Reported: precision at k (k = the number planted) of the
audit's rankings: the NTK self-influence (each point's squared leave-one-out error under kernel ridge
regression with the re-fitted model's NTK: the self-test's headline), the most harmful by NTK influence
on the test loss, the levers (largest |NTK influence|) and the most harmful by Gauss-Newton influence;
of the simple baseline "largest training loss"; the chance level k / n; and the recall of each kind of
poison within the top k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import torch
from torch import nn

from empirics.attribution.gauss_newton import gn_influence_mean, loss_residuals
from empirics.attribution.influence import Ridge, influence_from_kernels
from empirics.intervals import t_interval, wilson
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.losses import targets
from empirics.progress import log
from empirics.vocab import NOT_MEASURABLE
from verify.audit.config import AuditConfig
from verify.audit.refit import RefitInputs, RefitJob, labels_of, per_example_loss

OUTCOME_RULE = ("the levers move an outcome beyond random points when the 95 % t-interval over seeds of the paired "
                "difference (levers - random) excludes zero")
WILSON_METHOD = "Wilson score interval of the changed predictions pooled over seeds x targeted points"
CLIPPED_METHOD = "t-interval over seeds, clipped to [-1, 1] (where a change of accuracy or proportion lies)"


def _clipped(iv: dict[str, Any]) -> dict[str, Any]:
    return {**iv, "lo": max(-1.0, iv["lo"]), "hi": min(1.0, iv["hi"]), "method": CLIPPED_METHOD}


def _proportion(values: list[float], targets_per_seed: int) -> dict[str, Any]:
    """A fraction of targeted predictions changed, per seed, as one proportion over seeds x targets (Wilson)."""
    iv = t_interval(values)
    lo, hi = wilson(iv["value"], targets_per_seed * iv["n"])
    return {**iv, "lo": lo, "hi": hi, "method": WILSON_METHOD, "trials": targets_per_seed * iv["n"]}


def outcome_rows(per_seed: dict[str, list[dict[str, float]]], n_targets: int) -> dict[str, dict[str, Any]]:
    """Each outcome metric for the levers, the random points and their paired difference, with the intervals of
    the module docstring (each inside the range its quantity can take), and whether the levers move it beyond random."""
    rows = {}
    for key in ("acc_change", "target_flip", "target_loss_change"):
        lev = [m[key] for m in per_seed["levers"]]
        ran = [m[key] for m in per_seed["random"]]
        diff = t_interval([a - b for a, b in zip(lev, ran, strict=True)])
        if key == "target_flip":
            arms = {"levers": _proportion(lev, n_targets), "random": _proportion(ran, n_targets)}
        elif key == "acc_change":
            arms = {"levers": _clipped(t_interval(lev)), "random": _clipped(t_interval(ran))}
        else:
            arms = {"levers": t_interval(lev), "random": t_interval(ran)}
        if key != "target_loss_change":
            diff = _clipped(diff)
        rows[key] = {**arms, "difference": diff, "beyond_random": bool(diff["lo"] > 0 or diff["hi"] < 0)}
    return rows


def _arm_metrics(out: np.ndarray, ctrl: np.ndarray, yt: np.ndarray, tgt: np.ndarray, out_dim: int) -> dict[str, float]:
    lab, lab0 = labels_of(out), labels_of(ctrl)
    return {"acc_change": float(np.mean(lab == yt) - np.mean(lab0 == yt)),
            "target_flip": float(np.mean(lab[tgt] != lab0[tgt])),
            "target_loss_change": float(per_example_loss(out[tgt], yt[tgt], out_dim).mean()
                                        - per_example_loss(ctrl[tgt], yt[tgt], out_dim).mean())}


class NotMeasurable(Exception):
    """A re-fit whose outcome has no value: the re-fitted model's outputs, or their loss, are NaN or infinite."""


def _finite_metrics(out: np.ndarray, ctrl: np.ndarray, yt: np.ndarray, tgt: np.ndarray, out_dim: int,
                    where: str) -> dict[str, float]:
    """`_arm_metrics`, or `NotMeasurable` naming why when the outputs or a metric are not finite."""
    if not (np.isfinite(out).all() and np.isfinite(ctrl).all()):
        raise NotMeasurable(f"the re-fitted model's test outputs are NaN or infinite ({where}): the model diverges "
                            "when its training data are altered, so the change of its outcome has no value")
    metrics = _arm_metrics(out, ctrl, yt, tgt, out_dim)
    bad = [k for k, v in metrics.items() if not np.isfinite(v)]
    if bad:
        raise NotMeasurable(f"the re-fitted model's {', '.join(bad)} is NaN or infinite ({where}: its loss "
                            "overflows), so the change of its outcome has no value")
    return metrics


def outcome_panel(inp: RefitInputs, per_test: np.ndarray, sel: np.ndarray, attack_name: str,
                  cfg: AuditConfig) -> dict[str, Any]:
    """Change of test accuracy and of the targeted predictions after re-fitting on the levers `sel` perturbed by
    `attack_name` at `cfg.eps` (`per_test`: influence, training x test points), with `cfg.refit_seeds` seeds."""
    refit, model, t = inp.refit, inp.model, inp.t
    x, y, xt, yt, out_dim = t.x_train, t.y_train, t.x_test, t.y_test, t.out_dim
    eps, steps, seeds, seed, n_targets = cfg.eps, cfg.steps, cfg.refit_seeds, cfg.seed, cfg.outcome_targets
    n, k = len(x), len(sel)
    rng = np.random.default_rng(seed + 7)
    rand = np.sort(rng.choice(n, k, replace=False))
    weight = np.abs(per_test[sel]).sum(axis=0)
    tgt = np.argsort(-weight, kind="stable")[:max(1, min(n_targets, len(xt)))]
    yt_np = yt.cpu().numpy()
    alt = {}
    for arm, idx in (("levers", sel), ("random", rand)):
        it = torch.as_tensor(idx, device=x.device)
        x_adv = attack(model, x[it], y[it], AttackConfig(attack_name, eps, steps=steps, seed=seed + 31))
        alt[arm] = x.index_copy(0, it, x_adv)
    log(f"audit: outcome: {seeds} seeds x (control, levers, random) re-fits at eps {eps:g}")
    per_seed: dict[str, list[dict[str, float]]] = {"levers": [], "random": []}
    ctrls = refit.controls(x, y, [seed + s for s in range(seeds)], {"train": x, "test": xt})
    arms = [(s, arm) for s in range(seeds) for arm in ("levers", "random")]
    outs = refit.outputs_many([RefitJob(alt[arm], y, seed + s, {"test": xt}) for s, arm in arms])
    try:
        for (s, arm), res in zip(arms, outs, strict=True):
            per_seed[arm].append(_finite_metrics(res["test"], ctrls[s]["test"], yt_np, tgt, out_dim,
                                                 f"{arm}, seed {seed + s}"))
    except NotMeasurable as exc:
        return {"verdict": NOT_MEASURABLE, "reason": str(exc), "attack": attack_name, "eps": eps, "k": int(k)}
    rows = outcome_rows(per_seed, len(tgt))
    return {"attack": attack_name, "eps": eps, "k": int(k), "seeds": seeds, "targets": tgt.tolist(),
            "n_targets": int(len(tgt)), "random_points": rand.tolist(), "per_seed": per_seed, "rows": rows,
            "rule": OUTCOME_RULE}


def loo_error(K: np.ndarray, Y: np.ndarray, ridge: float) -> np.ndarray:
    """Squared leave-one-out error of each training point under kernel ridge regression (its NTK self-influence):
    `||alpha_i / M_ii||^2` with `M = (K + ridge I)^-1`, `alpha = M Y` (exact, no refitting)."""
    n = K.shape[0]
    factor = scipy.linalg.cho_factor((K + K.T) / 2 + ridge * np.eye(n), lower=True, check_finite=False)
    M = scipy.linalg.cho_solve(factor, np.eye(n), check_finite=False)
    alpha = M @ Y
    return np.sum((alpha / np.diag(M)[:, None]) ** 2, axis=1)


@dataclass(frozen=True)
class CurveGrid:
    """The budgets of the re-fitted budget curves: the top `k` levers at each eps of `eps`, and each k of `ks` at the
    audit's eps."""

    k: int
    eps: tuple[float, ...]
    ks: tuple[int, ...]

    @classmethod
    def of(cls, budget: dict[str, Any]) -> CurveGrid:
        """The grid of a budget-curves record (`verify.audit.budget.budget_curves`)."""
        return cls(budget["by_eps"][0]["k"], tuple(p["eps"] for p in budget["by_eps"]),
                   tuple(p["k"] for p in budget["by_k"]))


def outcome_curves(inp: RefitInputs, per_test: np.ndarray, total: np.ndarray, grid: CurveGrid,
                   cfg: AuditConfig) -> dict[str, Any]:
    """The re-fitted outcome along the budget curves: for each eps of the grid (top k levers by `total`) and each k
    (at `cfg.eps`), the levers and as many random points perturbed by `cfg.curve_attack`, re-fitted with
    `cfg.refit_seeds` seeds (seed, seed + 1, ...), each compared with the control of its seed; per point the mean of
    each metric (`levers`, `random`) and its interval (`rows`, as the outcome table's)."""
    refit, model, t = inp.refit, inp.model, inp.t
    x, y, xt, yt, out_dim = t.x_train, t.y_train, t.x_test, t.y_test, t.out_dim
    k, eps, eps_grid, k_grid = grid.k, cfg.eps, grid.eps, grid.ks
    attack_name, steps, seed, seeds = cfg.curve_attack, cfg.steps, cfg.seed, cfg.refit_seeds
    n_targets = cfg.outcome_targets
    n = len(x)
    rng = np.random.default_rng(seed + 11)
    order = np.lexsort((np.arange(n), -np.abs(total)))
    ctrls = [c["test"] for c in refit.controls(x, y, [seed + s for s in range(seeds)], {"train": x, "test": xt})]
    yt_np = yt.cpu().numpy()

    def altered(kk: int, e: float) -> tuple[int, float, np.ndarray, list[RefitJob]]:
        """A point's targets and its re-fits (each arm's altered set with every seed)."""
        sel = np.sort(order[:kk])
        rand = np.sort(rng.choice(n, kk, replace=False))
        tgt = np.argsort(-np.abs(per_test[sel]).sum(axis=0), kind="stable")[:max(1, min(n_targets, len(xt)))]
        jobs = []
        for idx in (sel, rand):
            it = torch.as_tensor(idx, device=x.device)
            x_adv = attack(model, x[it], y[it], AttackConfig(attack_name, e, steps=steps, seed=seed + 31))
            x_alt = x.index_copy(0, it, x_adv)
            jobs += [RefitJob(x_alt, y, seed + s, {"test": xt}) for s in range(seeds)]
        return kk, e, tgt, jobs

    def point(kk: int, e: float, tgt: np.ndarray, outs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        per_seed: dict[str, list[dict[str, float]]] = {"levers": [], "random": []}
        for a, arm in enumerate(("levers", "random")):
            for s, ctrl in enumerate(ctrls):
                per_seed[arm].append(_finite_metrics(outs[a * seeds + s]["test"], ctrl, yt_np, tgt, out_dim,
                                                     f"{arm}, eps {e:g}, k {kk}, seed {seed + s}"))
        rows = outcome_rows(per_seed, len(tgt))
        return {"eps": float(e), "k": int(kk), "seeds": seeds, "n_targets": int(len(tgt)), "rows": rows,
                **{arm: {key: r[arm]["value"] for key, r in rows.items()} for arm in ("levers", "random")}}

    log(f"audit: re-fitted outcome along the budget curves ({2 * seeds * (len(eps_grid) + len(k_grid))} re-fits)")
    points = [altered(k, e) for e in eps_grid] + [altered(kk, eps) for kk in k_grid]
    outs = refit.outputs_many([job for *_, jobs in points for job in jobs])  # every point's re-fits together
    per_point = 2 * seeds
    try:
        rows = [point(kk, e, tgt, outs[i * per_point:(i + 1) * per_point]) for i, (kk, e, tgt, _) in enumerate(points)]
        return {"by_eps": rows[:len(eps_grid)], "by_k": rows[len(eps_grid):], "seed": seed, "seeds": seeds}
    except NotMeasurable as exc:
        return {"verdict": NOT_MEASURABLE, "reason": str(exc), "seed": seed, "seeds": seeds}


def _precision(order: np.ndarray, planted: np.ndarray, kinds: dict[str, np.ndarray], k: int) -> dict[str, Any]:
    top = set(order[:k].tolist())
    out: dict[str, Any] = {"precision": len(top & set(planted.tolist())) / k}
    for name, idx in kinds.items():
        out[f"recall_{name}"] = len(top & set(idx.tolist())) / max(1, len(idx))
    return out


def poison_panel(inp: RefitInputs, kernels: Callable[[nn.Module], Any], cfg: AuditConfig) -> dict[str, Any]:
    """Plant label flips and eps-bounded perturbations (`cfg.poison_fraction` of the training points, `cfg.eps`),
    re-fit, and ask whether the audit's rankings find them.

    `kernels(net)` returns a kernel provider (`clean(x, xt) -> (K, K_test_train)`) for a re-fitted network.
    """
    refit, model, t = inp.refit, inp.model, inp.t
    x, y, xt, yt, out_dim = t.x_train, t.y_train, t.x_test, t.y_test, t.out_dim
    fraction, eps, steps, seed, ridge_rel = cfg.poison_fraction, cfg.eps, cfg.steps, cfg.seed, cfg.ridge_rel
    n = len(x)
    classes = max(2, out_dim)
    rng = np.random.default_rng(seed + 2)
    k = max(2, min(n // 2, round(fraction * n)))
    planted = np.sort(rng.choice(n, k, replace=False))
    flips, perturbed = planted[: k // 2], planted[k // 2:]
    yp = y.clone()
    flipped = (y.cpu().numpy()[flips] + rng.integers(1, classes, len(flips))) % classes  # drawn on the CPU
    yp[torch.as_tensor(flips, device=yp.device)] = torch.as_tensor(flipped, device=yp.device)
    xp = x.clone()
    ip = torch.as_tensor(perturbed, device=x.device)
    xp[ip] = attack(model, x[ip], y[ip], AttackConfig("pgd", eps, steps=steps, seed=seed + 3))
    log(f"audit: planted poison: {len(flips)} label flips + {len(perturbed)} perturbations (eps {eps:g}), re-fit")
    with refit.fitted(xp, yp, seed) as net:
        K, Kst = kernels(net).clean(xp, xt)
        with torch.no_grad():
            out_tr, out_te = net(xp), net(xt)
    Yp = targets(yp, out_dim, torch.float64).cpu().numpy()
    inf = influence_from_kernels((K, Kst), Yp, targets(yt, out_dim, torch.float64).cpu().numpy(), yt.cpu().numpy(),
                                 reg=Ridge(rel=ridge_rel))
    self_inf = loo_error(K, Yp, inf.ridge)
    gn = gn_influence_mean(K, Kst, loss_residuals(out_tr, yp), loss_residuals(out_te, yt), inf.ridge).sum(axis=1)
    loss = per_example_loss(out_tr.double().cpu().numpy(), yp.cpu().numpy(), out_dim)
    idx = np.arange(n)
    orders = {
        "self_influence_ntk": np.lexsort((idx, -self_inf)),
        "harmful_ntk": np.lexsort((idx, inf.total)),
        "levers_abs_ntk": np.lexsort((idx, -np.abs(inf.total))),
        "harmful_gn": np.lexsort((idx, gn)),
        "training_loss": np.lexsort((idx, -loss)),
    }
    kinds = {"label_flip": flips, "perturbation": perturbed}
    rank = {name: _precision(o, planted, kinds, k) for name, o in orders.items()}
    head = rank["self_influence_ntk"]["precision"]
    base = rank["training_loss"]["precision"]
    chance = k / n
    verdict = ("finds planted poison better than the training-loss baseline" if head > base else
               "finds planted poison above chance, but no better than ranking by training loss" if head > chance else
               "does not find planted poison above chance")
    return {"planted": planted.tolist(), "label_flips": flips.tolist(), "perturbations": perturbed.tolist(),
            "k": int(k), "fraction": fraction, "eps": eps, "chance": chance, "rankings": rank,
            "headline": "self_influence_ntk", "verdict": verdict,
            "refit_train_acc_on_poisoned": float(np.mean(labels_of(out_tr.double().cpu().numpy()) == yp.cpu().numpy()))}
