"""`verify audit`: how much could a few altered training examples change what a model relies on?

Pipeline (every number lands in one JSON-ready record; nothing is written until all succeeded):

1. Load the model safely (`verify.modelio`) and the training / test data; bind the model to the data's
   input shape; validate labels against the model's outputs.
2. For the user's model, and for the paper's two reference networks (2L-ReLU and MLP-Attn, width
   `ref_width`, trained by the suite on the same data, `--no-reference` skips them), measure:
   - the empirical NTK ("mean" reduction) on the training subset and test set: the suite's closed
     form for its own networks, `empirics.audit_ntk` (exact, memory-bounded) for any other model, or
     its random projection to k dimensions when the Jacobians do not fit memory or `projection_dim` asks
     (`verify.audit_projection`: the choice, and the error against the exact kernel on a subsample);
   - NTK leave-one-out influence of each training point on the test loss (`empirics.influence`),
     and Gauss-Newton influence on the same kernel via Woodbury (`empirics.gauss_newton`), with
     their Spearman rank correlation;
   - the flip-rate protocol (`empirics.malleability`: top tau by |influence|, attack them at eps,
     recompute the kernel, count total-influence sign flips, Spearman rho): for a user model the
     kernel rows and columns of the perturbed points are recomputed; for the suite's networks the
     whole kernel (MLP-Attn's context C changes with every training point). The random-noise
     baseline (random signs times eps on the same points) is run with `baseline_seeds` seeds;
   - kernel-regime diagnostics: kappa of the data Gram matrix and of the empirical NTK, the v1 / v2
     width bounds of Thm 4.7, the model's width (its widest layer) and parameter count;
   - sharpness: the top Hessian eigenvalue of the mean training loss (cross-entropy, or MSE on +-1
     for one output), by power iteration on Hessian-vector products (`empirics.landscape`).
3. The risk level (`risk_level`), the lever examples (the top-|influence| training points, with
   which attacks flipped them), and the report (`reports/templates/audit.html`).
4. The panels (`--skip` leaves any out): budget curves (`verify.audit_budget`); and, re-fitting the user's
   model (`verify.audit_refit`: warm start from the saved weights, or the user's `--train-fn`), the
   validity panel (`verify.audit_validity`), the outcome table and the planted-poison self-test
   (`verify.audit_outcome`). The references are trained with the width-consistent protocol to a plateau
   and judged by the adequacy gate (`empirics.protocols`); one below the gate is left out of the scale.

Risk rule (fixed before any measurement; `risk_level`): let F be the model's worst-case flip rate
(maximum over the attacks run), B the random-noise flip rates over seeds, R and A the worst-case
flip rates of the 2L-ReLU and MLP-Attn references (without references: R = 5 %, A = 20 %, rounded
from the paper's reported 3-4 % and 19-35 % for 10 classes at eps = 0.3).

    noise ceiling  N = mean(B) + 2 std(B)
    low            F <= max(N, R)       indistinguishable from random noise, or no more malleable
                                        than the kernel-regime 2L-ReLU reference
    high           F >= max(A, N, R)    as malleable as the MLP-Attn reference (and above noise)
    medium         otherwise
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from empirics.attacks import ATTACKS, AttackConfig, attack
from empirics.audit_ntk import PROJECTION_KINDS, JacobianFeatures, ModelJacobian, ProjectedJacobian, Projection
from empirics.common import Tensors, train_network
from empirics.gauss_newton import gn_influence_mean, loss_residuals
from empirics.influence import RIDGE_REL_DEFAULT, InfluenceResult, influence_from_kernels, model_kernels
from empirics.landscape import power_iteration, scale_aware
from empirics.malleability import compare, n_top, top_by_abs
from empirics.models import ModelSpec, TwoLayerNet
from empirics.progress import log
from empirics.protocols import GATE_TEXT, PROPER, protocol_config
from empirics.records import device_info, library_versions
from empirics.train import loss_fn, predict_labels, targets
from theory.bounds import relu_width_bound, width_bound_v1, width_bound_v2
from theory.conditioning import condition_numbers
from theory.errors import UserInputError
from theory.paper import PAPER_AUDIT_REFERENCE
from verify.audit_budget import REALISTIC_EPS, REALISTIC_REASON, budget_curves, eps_label
from verify.audit_outcome import outcome_curves, outcome_panel, poison_panel
from verify.audit_projection import choose_projection, projection_error
from verify.audit_refit import RefitConfig, Refitter, load_train_fn
from verify.audit_validity import validity_panel
from verify.modelio import (
    FlatInput,
    LoadedModel,
    Split,
    bind_input,
    check_labels,
    check_varied,
    fx_graph_for,
    load_model,
    load_split,
    parse_shape,
    probe_batches,
    sniff_format,
)

AUDIT_ATTACKS = ("fgsm", "pgd", "mim")
RISK_LEVELS = ("low", "medium", "high")
NOT_MEASURABLE = "not measurable"
REF_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
PANELS = ("budget", "poison", "validity", "outcome")
#: Version of the audit record's structure (`verify/schemas/audit.schema.json`); raised on a breaking change.
SCHEMA_VERSION = 1
#: First line of the Markdown summary (`--summary`): marks the file as an audit output (and a CI comment to update).
SUMMARY_MARKER = "<!-- verify audit summary -->"


@dataclass(frozen=True)
class AuditConfig:
    """Settings of one audit (the CLI's options; every one is printed in the report's appendix)."""

    model: str
    train: str
    test: str | None = None
    spec: str | None = None
    input_shape: str | None = None
    eps: float = REALISTIC_EPS
    tau: float = 0.1
    attacks: tuple[str, ...] = AUDIT_ATTACKS
    n: int = 1000
    n_test: int = 200
    steps: int = 10
    baseline_seeds: int = 3
    reference: bool = True
    ref_width: int = 512
    ref_epochs: int = 1000
    top_k: int = 12
    seed: int = 0
    hessian_iters: int = 20
    bound_eps: float = 0.1
    ridge_rel: float = RIDGE_REL_DEFAULT
    max_memory_gb: float = 2.0
    data_dir: str | None = None
    panels: tuple[str, ...] = PANELS
    refit_epochs: int = 5
    refit_lr: float = 1e-3
    refit_batch: int = 64
    train_fn: str | None = None
    lds_subsets: int = 24
    lds_fraction: float = 0.1
    refit_seeds: int = 3
    outcome_targets: int = 20
    target_test: int | None = None
    poison_fraction: float = 0.05
    curve_attack: str = "pgd"
    projection_dim: int | None = None
    projection_kind: str = "gaussian"

    def refit_config(self) -> RefitConfig:
        return RefitConfig(self.refit_epochs, self.refit_lr, self.refit_batch, self.train_fn)

    def __post_init__(self) -> None:
        if not self.attacks:
            raise UserInputError("--attack needs at least one of fgsm, pgd, mim")
        for a in self.attacks:
            if a not in AUDIT_ATTACKS:
                raise UserInputError(f"unknown attack '{a}'; choose from {', '.join(AUDIT_ATTACKS)} (random noise "
                                     "is always run as the baseline)")
        checks = [
            (0.0 < self.eps <= 1.0, f"--eps must be in (0, 1] (pixel units), got {self.eps}"),
            (0.0 < self.tau <= 1.0, f"--tau must be in (0, 1] (a fraction of the training set), got {self.tau}"),
            (self.n >= 2, f"--n must be >= 2, got {self.n}"),
            (self.n_test >= 1, f"--n-test must be >= 1, got {self.n_test}"),
            (self.steps >= 1, f"--steps must be >= 1, got {self.steps}"),
            (self.baseline_seeds >= 2,
             f"--baseline-seeds must be >= 2 (a spread needs two), got {self.baseline_seeds}"),
            (self.ref_width >= 1 and self.ref_epochs >= 0, "--ref-width must be >= 1 and --ref-epochs >= 0"),
            (self.top_k >= 1, f"--top-k must be >= 1, got {self.top_k}"),
            (self.hessian_iters >= 1, f"--hessian-iters must be >= 1, got {self.hessian_iters}"),
            (self.bound_eps > 0, f"--bound-eps must be > 0, got {self.bound_eps}"),
            (self.max_memory_gb > 0, f"--max-memory-gb must be > 0, got {self.max_memory_gb}"),
            (set(self.panels) <= set(PANELS), f"--skip takes panels from {', '.join(PANELS)}"),
            (self.lds_subsets >= 3, f"--lds-subsets must be >= 3, got {self.lds_subsets}"),
            (0.0 < self.lds_fraction < 1.0, f"--lds-fraction must be in (0, 1), got {self.lds_fraction}"),
            (self.refit_seeds >= 2, f"--refit-seeds must be >= 2 (an interval needs two), got {self.refit_seeds}"),
            (self.outcome_targets >= 1, f"--outcome-targets must be >= 1, got {self.outcome_targets}"),
            (self.target_test is None or 0 <= self.target_test < self.n_test,
             f"--target-test must be an index into the {self.n_test} test points, got {self.target_test}"),
            (0.0 < self.poison_fraction <= 0.5, f"--poison-fraction must be in (0, 0.5], got {self.poison_fraction}"),
            (self.curve_attack in AUDIT_ATTACKS, f"--curve-attack must be one of {', '.join(AUDIT_ATTACKS)}"),
            (self.projection_dim is None or self.projection_dim >= 0,
             f"--projection-dim must be >= 0 (0: the exact kernel), got {self.projection_dim}"),
            (self.projection_kind in PROJECTION_KINDS, f"--projection must be one of {', '.join(PROJECTION_KINDS)}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserInputError(msg)
        parse_shape(self.input_shape)
        self.refit_config()


# --- kernels ---------------------------------------------------------------------------------------


class SuiteKernels:
    """Kernels of the suite's own networks: closed form, recomputed whole on modified data."""

    method = "closed form (empirics.ntk.ntk_two_layer), float64"

    def __init__(self, model: TwoLayerNet):
        self.model = model

    def clean(self, x: torch.Tensor, xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return model_kernels(self.model, x, xt)

    def perturbed(self, x_new: torch.Tensor, sel: np.ndarray, K: np.ndarray, Kst: np.ndarray,
                  xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return model_kernels(self.model, x_new, xt)


class GenericKernels:
    """Kernels of any model from per-example Jacobians; on modified data only the rows and columns of
    the modified points are recomputed (a user model has no training-set context)."""

    def __init__(self, jac: ModelJacobian | ProjectedJacobian, max_bytes: int):
        self.jac = jac
        self.max_bytes = max_bytes
        self._train: JacobianFeatures | None = None
        self._test: JacobianFeatures | None = None

    @property
    def method(self) -> str:
        if isinstance(self.jac, ProjectedJacobian):
            return f"{self.jac.method}, float64 kernel"
        return f"{self.jac.method}; exact, {self.jac.dtype} Jacobians, float64 kernel"

    def clean(self, x: torch.Tensor, xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        per = self.jac.bytes_per_example()
        if per * (len(x) + len(xt)) <= self.max_bytes:
            self._train = self.jac.features(x, label="jacobians (train)")
            self._test = self.jac.features(xt, label="jacobians (test)")
            return self.jac.gram(self._train, self._train).numpy(), self.jac.gram(self._test, self._train).numpy()
        log(f"audit: Jacobians of all points need {per * (len(x) + len(xt)) / 2**30:.1f} GiB > the memory budget; "
            "assembling the kernel in blocks (slower)")
        return (self.jac.kernel(x, max_bytes=self.max_bytes).numpy(),
                self.jac.kernel(xt, x, max_bytes=self.max_bytes).numpy())

    def perturbed(self, x_new: torch.Tensor, sel: np.ndarray, K: np.ndarray, Kst: np.ndarray,
                  xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        s = torch.as_tensor(sel)
        if self._train is not None and self._test is not None:
            fp = self.jac.features(x_new[s], label="jacobians (perturbed)")
            rows = self.jac.gram(fp, self._train).numpy()
            rows[:, sel] = self.jac.gram(fp, fp).numpy()
            cols = self.jac.gram(self._test, fp).numpy()
        else:
            rows = self.jac.kernel(x_new[s], x_new, max_bytes=self.max_bytes).numpy()
            cols = self.jac.kernel(xt, x_new[s], max_bytes=self.max_bytes).numpy()
        K2, Kst2 = K.copy(), Kst.copy()
        K2[sel, :] = rows
        K2[:, sel] = rows.T
        Kst2[:, sel] = cols
        return K2, Kst2


# --- measurements --------------------------------------------------------------------------------


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def ntk_spectrum(K: np.ndarray) -> dict[str, Any]:
    """Eigenvalues (descending) and condition number of a kernel matrix; kappa is inf when lambda_min <= 0."""
    ev = np.linalg.eigvalsh((K + K.T) / 2)[::-1]
    top, bottom = float(ev[0]), float(ev[-1])
    tol = max(K.shape) * np.finfo(np.float64).eps * abs(top)
    kappa = top / bottom if bottom > tol else math.inf
    return {"lambda_max": top, "lambda_min": bottom, "kappa": kappa,
            "log10_kappa": math.log10(kappa) if math.isfinite(kappa) and kappa > 0 else math.inf,
            "rank": int(np.sum(ev > tol)), "eigenvalues": ev.tolist()}


def _flat_grad(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
               create_graph: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    with torch.enable_grad():
        out = model(x)
        loss = loss_fn(out.shape[1])(out, y).mean()
        grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True))
    return loss, grads


def top_hessian(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, iters: int, seed: int,
                finite_differences: bool = False) -> dict[str, Any]:
    """Top Hessian eigenvalue of the mean training loss w.r.t. all trained parameters (power iteration on
    Hessian-vector products), with the scale-aware normalisations of `empirics.landscape.scale_aware`.

    Products come from double backward; where an operation has no second derivative (e.g. PyTorch's CPU
    flash attention) they come from central differences of gradients, `(g(t + h v) - g(t - h v)) / 2h`
    with `h = 1e-3 max(1, ||theta||)` (also when `finite_differences`), and `hvp` says which.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = [p.numel() for p in params]
    shapes = [p.shape for p in params]
    like = torch.zeros(sum(sizes), dtype=params[0].dtype)
    t0 = time.perf_counter()

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [c.reshape(s) for c, s in zip(torch.split(v, sizes), shapes, strict=True)]

    try:
        if finite_differences:
            raise RuntimeError("asked for")
        loss, grads = _flat_grad(model, params, x, y, create_graph=True)
        if not any(g.requires_grad for g in grads):
            raise RuntimeError("the gradient does not depend on the parameters")

        def hvp(v: torch.Tensor) -> torch.Tensor:
            hs = torch.autograd.grad(grads, params, grad_outputs=split(v), retain_graph=True, allow_unused=True)
            return torch.cat([torch.zeros(n, dtype=v.dtype) if h is None else h.reshape(-1)
                              for h, n in zip(hs, sizes, strict=True)])

        hvp(like)
        how = "double backward"
    except RuntimeError as exc:
        reason = str(exc).splitlines()[0][:160]
        loss, _ = _flat_grad(model, params, x, y)
        with torch.no_grad():
            h = 1e-3 * max(1.0, float(torch.sqrt(sum((p.double() ** 2).sum() for p in params))))

        def hvp(v: torch.Tensor) -> torch.Tensor:
            parts = split(v)
            with torch.no_grad():
                for p, d in zip(params, parts, strict=True):
                    p.add_(d, alpha=h)
            try:
                _, gp = _flat_grad(model, params, x, y)
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.sub_(d, alpha=2 * h)
                _, gm = _flat_grad(model, params, x, y)
            finally:
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.add_(d, alpha=h)
            return torch.cat([((a - b) / (2 * h)).reshape(-1) for a, b in zip(gp, gm, strict=True)])

        how = f"central differences of gradients (no double backward: {reason})"
    try:
        res = power_iteration(hvp, like, iters, seed, tol=1e-4)
    except RuntimeError as exc:
        return {"value": float("nan"), "error": str(exc).splitlines()[0][:200], "wall_s": time.perf_counter() - t0}
    w2 = float(sum((p.detach().double() ** 2).sum() for p in params))
    f2 = float((x.double() ** 2).sum(dim=1).mean())
    lv = float(loss.detach())
    res.update(scale_aware(res["value"], lv, w2, f2))
    res.update({"loss": lv, "weight_norm2": w2, "hvp": how, "wall_s": time.perf_counter() - t0})
    return res


def _seed(base: int, name: str, k: int = 0) -> int:
    return 1_000_003 * base + 10_007 * ATTACKS.index(name) + k


def measure_network(label: str, model: FlatInput, provider: SuiteKernels | GenericKernels, t: Tensors,
                    cfg: AuditConfig, n_params: int, width: int) -> dict[str, Any]:
    """Every audit measurement for one network (see the module docstring)."""
    times: dict[str, float] = {}
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    c = t.out_dim
    tic = time.perf_counter()
    log(f"audit: {label}: empirical NTK ({len(x)} training + {len(xt)} test points)")
    K, Kst = provider.clean(x, xt)
    times["kernel"] = time.perf_counter() - tic
    tic = time.perf_counter()
    Y = targets(y, c, torch.float64).numpy()
    Yt = targets(yt, c, torch.float64).numpy()
    clean = influence_from_kernels(K, Kst, Y, Yt, yt.numpy(), ridge=None, ridge_rel=cfg.ridge_rel)
    lam = clean.ridge
    with torch.no_grad():
        out_tr, out_te = model(x), model(xt)
    gn_per_test = gn_influence_mean(K, Kst, loss_residuals(out_tr, y), loss_residuals(out_te, yt), lam)
    gn = gn_per_test.sum(axis=1)
    times["influence"] = time.perf_counter() - tic
    n = len(x)
    k = n_top(cfg.tau, n)
    sel = top_by_abs(clean.total, k)

    def probe(chosen: np.ndarray, name: str, eps: float, seed: int) -> tuple[dict[str, Any], InfluenceResult,
                                                                        torch.Tensor]:
        ct = torch.as_tensor(chosen)
        x_adv = attack(model, x[ct], y[ct], AttackConfig(name, eps, steps=cfg.steps, seed=seed))
        x_new = x.index_copy(0, ct, x_adv)
        K2, Kst2 = provider.perturbed(x_new, chosen, K, Kst, xt)
        new = influence_from_kernels(K2, Kst2, Y, Yt, yt.numpy(), ridge=lam)
        m = compare(clean, new, chosen)
        m["max_abs_perturbation"] = float((x_new - x).abs().max())
        return m, new, x_adv

    def trial(name: str, seed: int) -> tuple[dict[str, Any], InfluenceResult, torch.Tensor]:
        return probe(sel, name, cfg.eps, seed)

    tic = time.perf_counter()
    attacks: dict[str, Any] = {}
    adv_pixels: dict[str, torch.Tensor] = {}
    for name in cfg.attacks:
        log(f"audit: {label}: {name.upper()} on the top {k} points, eps={eps_label(cfg.eps)}")
        m, new, x_adv = trial(name, _seed(cfg.seed, name))
        m["new_total"] = new.total.tolist()
        attacks[name] = m
        adv_pixels[name] = x_adv
    times["attacks"] = time.perf_counter() - tic
    tic = time.perf_counter()
    log(f"audit: {label}: random-noise baseline ({cfg.baseline_seeds} seeds)")
    base = [trial("random", _seed(cfg.seed, "random", s))[0] for s in range(cfg.baseline_seeds)]
    flips = np.array([b["flip_rate"] for b in base])
    times["baseline"] = time.perf_counter() - tic
    tic = time.perf_counter()
    log(f"audit: {label}: sharpness ({cfg.hessian_iters} Hessian-vector products)")
    sharp = top_hessian(model, x, y, cfg.hessian_iters, cfg.seed)
    times["sharpness"] = time.perf_counter() - tic
    worst = max(cfg.attacks, key=lambda a: attacks[a]["flip_rate"])
    with torch.no_grad():
        acc_tr = float((predict_labels(out_tr) == y).double().mean())
        acc_te = float((predict_labels(out_te) == yt).double().mean())
    return {
        "label": label, "parameters": int(n_params), "width": int(width), "kernel_method": provider.method,
        "train_acc": acc_tr, "test_acc": acc_te,
        "kernel_test_acc": clean.test_acc, "kernel_test_loss": clean.test_loss, "ridge": lam,
        "influence_total": clean.total.tolist(), "gn_total": gn.tolist(),
        "rho_ntk_gn": _spearman(clean.total, gn),
        "sign_agreement_ntk_gn": float(np.mean(np.sign(clean.total) == np.sign(gn))),
        "positive_fraction": float(np.mean(clean.total > 0)),
        "selected": sel.tolist(), "n_selected": int(k),
        "attacks": attacks,
        "adversarial_pixels": {a: v.numpy() for a, v in adv_pixels.items()},
        "baseline": {"flip_rates": flips.tolist(), "mean": float(flips.mean()), "std": float(flips.std(ddof=1)),
                     "rho_all": [b["rho_all"] for b in base],
                     "rho_all_mean": float(np.nanmean([b["rho_all"] for b in base]))},
        "worst_attack": worst, "worst_flip_rate": float(attacks[worst]["flip_rate"]),
        "worst_rho_all": float(attacks[worst]["rho_all"]),
        "ntk": ntk_spectrum(K),
        "sharpness": sharp,
        "timings": times,
        "_context": {"probe": lambda c, a, e, s: probe(c, a, e, s)[:2], "clean": clean,
                     "gn_per_test": gn_per_test},
    }


# --- risk ------------------------------------------------------------------------------------------


def risk_level(flip: float, baseline: list[float], relu_flip: float | None, attn_flip: float | None) -> dict[str, Any]:
    """low / medium / high from the worst-case flip rate (the rule in the module docstring).

    A reference given as None did not pass the adequacy gate and is left out of the scale: without R the
    low ceiling is the noise ceiling alone; without A there is no "high" (the top of the scale is unknown).
    """
    b = np.asarray(baseline, dtype=float)
    noise = float(b.mean() + 2 * (b.std(ddof=1) if b.size > 1 else 0.0)) if b.size else math.nan
    r_eff = 0.0 if relu_flip is None else relu_flip
    low_ceiling = max(noise, r_eff)
    high_floor = math.inf if attn_flip is None else max(attn_flip, low_ceiling)
    level = "low" if flip <= low_ceiling else "high" if flip >= high_floor else "medium"
    reason = ""
    if not all(math.isfinite(v) for v in (flip, noise, r_eff)) or (attn_flip is not None
                                                                   and not math.isfinite(attn_flip)):
        level = NOT_MEASURABLE
        reason = ("a flip rate could not be computed (NaN): influence is undefined for these data, e.g. constant "
                  "or duplicated inputs or a kernel without signal")
    left_out = [name for name, v in (("2L-ReLU", relu_flip), ("MLP-Attn", attn_flip)) if v is None]
    return {"level": level, "reason": reason, "flip_rate": flip, "noise_ceiling": noise, "low_ceiling": low_ceiling,
            "high_floor": high_floor, "relu_reference": math.nan if relu_flip is None else relu_flip,
            "attn_reference": math.nan if attn_flip is None else attn_flip, "left_out": left_out,
            "references_separate": bool(attn_flip is not None and attn_flip > low_ceiling),
            "rule": "low if F <= max(N, R); high if F >= max(A, N, R); medium otherwise (F: worst-case flip "
                    "rate over the attacks; N: random-noise mean + 2 std; R, A: 2L-ReLU and MLP-Attn worst-case "
                    "flip rates; a reference below the adequacy gate is left out: without R the low ceiling is N, "
                    "without A there is no high)"}


ADVICE = {
    NOT_MEASURABLE: [
        "No risk level can be given for these data: check that the training inputs vary (not all-zero or constant "
        "images, not one example repeated) and that the model's outputs depend on them, then re-run the audit.",
    ],
    "low": [
        "No action is needed beyond ordinary data hygiene: the influence ranking of your training data is no "
        "easier to flip than random noise of the same size can, or than the kernel-regime 2L-ReLU reference.",
        "Re-run the audit after retraining, after changing the architecture, or when new training data arrives.",
    ],
    "medium": [
        "Review the lever examples below: check their provenance and labels; they are where an altered example "
        "would move the model's reliance most.",
        "Protect the training pipeline where it is cheapest: checksums on data files, restricted write access, "
        "deduplication and label audits for the examples with the largest influence.",
        "Re-audit with a larger --n and more --baseline-seeds before drawing firm conclusions.",
    ],
    "high": [
        "Treat the training data as an attack surface: a few altered examples can reorder which examples the "
        "model relies on, about as easily as for the paper's MLP-Attn reference.",
        "Verify the provenance of the lever examples first, and screen new training data (influence-based "
        "filtering, duplicate and outlier checks) before retraining.",
        "Compare with an architecture closer to the kernel regime (no linearized attention, wider layers): the "
        "paper ties malleability to attention's ill-conditioned Gram kernel (kappa^3).",
        "Do not assume adversarial training fixes this: the paper reports that it raises flip rates, while this "
        "suite's own runs (verify claims) saw it lower them slightly at small scale; re-audit after any change.",
    ],
}


def _levers(user: dict[str, Any], split: Split, cfg: AuditConfig) -> list[dict[str, Any]]:
    """The top-k training points by |NTK influence|, with the attacks that flipped their sign."""
    total = np.asarray(user["influence_total"])
    gn = np.asarray(user["gn_total"])
    sel = list(user["selected"])
    order = sorted(sel, key=lambda i: (-abs(total[i]), i))[: cfg.top_k]
    out = []
    for i in order:
        pos = sel.index(i)
        flipped = [a for a in cfg.attacks if user["attacks"][a]["examples"][pos]["flipped"]]
        after = {a: user["attacks"][a]["examples"][pos]["new"] for a in cfg.attacks}
        worst = user["worst_attack"]
        out.append({"index": int(i), "label": int(split.y[i]),
                    "class": split.classes[int(split.y[i])] if split.classes and split.y[i] < len(split.classes)
                    else str(int(split.y[i])),
                    "influence": float(total[i]), "gn_influence": float(gn[i]),
                    "role": "helpful" if total[i] > 0 else "harmful", "flipped_by": flipped,
                    "influence_after": after,
                    "pixels": split.x[i].round(4).tolist(),
                    "perturbed_pixels": np.asarray(user["adversarial_pixels"][worst][pos]).round(4).tolist()})
    return out


def _diagnostics(x: np.ndarray, cfg: AuditConfig, models: dict[str, Any]) -> dict[str, Any]:
    cn = condition_numbers(x.astype(np.float64))
    k1, src1 = (cn["kappa"], "kappa") if math.isfinite(cn["kappa"]) else (cn["kappa_eff"], "kappa_eff")
    k2, src2 = (cn["kappa_d"], "kappa_d") if math.isfinite(cn["kappa_d"]) else (cn["kappa_eff"], "kappa_eff")
    v1 = width_bound_v1(k1, cfg.bound_eps)
    v2 = width_bound_v2(k2, x.shape[0])
    relu = relu_width_bound(cfg.bound_eps)
    rows = []
    for key, m in models.items():
        rows.append({"model": key, "label": m["label"], "width": m["width"], "parameters": m["parameters"],
                     "log10_width": math.log10(max(1, m["width"])),
                     "kappa_ntk": m["ntk"]["kappa"], "log10_kappa_ntk": m["ntk"]["log10_kappa"]})
    return {"data_gram": {k: cn[k] for k in ("n", "d", "rank", "kappa", "kappa_d", "kappa_eff", "log10_kappa",
                                             "log10_kappa_d", "log10_kappa_eff")},
            "bound_eps": cfg.bound_eps, "v1_kappa": src1, "v2_kappa": src2,
            "v1": asdict(v1), "v2": asdict(v2), "relu": asdict(relu), "models": rows}


# --- pipeline --------------------------------------------------------------------------------------


@dataclass
class _Stage:
    times: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Any, *args: Any, **kw: Any) -> Any:
        tic = time.perf_counter()
        out = fn(*args, **kw)
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - tic
        return out


def _has_test_split(source: str) -> bool:
    """False only for a .npz without x_test / y_test (every other source has a test split or fails later)."""
    p = Path(source).expanduser()
    if not p.is_file() or sniff_format(p) not in ("npz", "zip"):
        return True
    try:
        with np.load(p, allow_pickle=False) as z:
            return "x_test" in z.files and "y_test" in z.files
    except (ValueError, OSError):
        return True


def load_inputs(cfg: AuditConfig) -> tuple[LoadedModel, Split, Split]:
    """The model and the two data splits, validated against each other (one-line errors)."""
    loaded = load_model(cfg.model, cfg.spec)
    if cfg.test is None and not _has_test_split(cfg.train):
        raise UserInputError(f"--test is required: {cfg.train} holds no x_test / y_test arrays")
    train = load_split(cfg.train, "train", cfg.n, cfg.seed, cfg.data_dir)
    test = load_split(cfg.test or cfg.train, "test", cfg.n_test, cfg.seed, cfg.data_dir)
    if len(train.x) < 2:
        raise UserInputError(f"--train has {len(train.x)} example; the audit needs at least 2")
    if train.x.shape[1] != test.x.shape[1]:
        raise UserInputError(f"training inputs have {train.x.shape[1]} values per example but test inputs have "
                             f"{test.x.shape[1]}")
    check_varied(train, "--train")
    return loaded, train, test


def _panels(cfg: AuditConfig, st: _Stage, ctx: dict[str, Any], t: Tensors, model: FlatInput,
            refit_net: torch.nn.Module, fit_module: torch.nn.Module, provider: SuiteKernels | GenericKernels,
            loaded: LoadedModel, input_shape: tuple[int, ...], out_dim: int, max_bytes: int,
            user: dict[str, Any]) -> dict[str, Any]:
    """The budget curves and the panels that re-fit the model (validity, outcome, planted poison)."""
    out: dict[str, Any] = {"run": [p for p in PANELS if p in cfg.panels]}
    clean: InfluenceResult = ctx["clean"]
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    if "budget" in cfg.panels:
        out["budget"] = st.run("budget curves", budget_curves, ctx["probe"], clean, cfg.tau, cfg.eps,
                               cfg.curve_attack, cfg.seed, cfg.baseline_seeds)
    refit_panels = [p for p in ("validity", "outcome", "poison") if p in cfg.panels]
    if not refit_panels:
        return out
    rcfg = cfg.refit_config()
    refit = Refitter.for_module(fit_module, refit_net, rcfg, out_dim, input_shape)
    log(f"audit: control re-fit ({rcfg.describe()})")
    ctrl = st.run("re-fits", refit.control, x, y, cfg.seed, {"train": x, "test": xt})
    from verify.audit_refit import refit_adequacy

    gate = refit_adequacy(rcfg.kind, ctrl, y.numpy(), yt.numpy(), user["train_acc"], user["test_acc"], out_dim)
    out["refit"] = {"kind": rcfg.kind, "description": rcfg.describe(), "control": gate,
                    "user_code": bool(rcfg.train_fn)}
    if not gate["passed"]:
        for p in refit_panels:
            out[p] = {"verdict": NOT_MEASURABLE, "reason": f"the control re-fit is not adequate ({gate['reason']})"}
        return out
    if "validity" in cfg.panels:
        out["validity"] = st.run("validity", validity_panel, refit, x, y, xt, yt, clean.per_test, ctx["gn_per_test"],
                                 (user["train_acc"], user["test_acc"]), cfg.tau, cfg.lds_subsets, cfg.lds_fraction,
                                 cfg.refit_seeds - 1, cfg.seed, cfg.target_test, out_dim)
    if "budget" in cfg.panels and "outcome" in cfg.panels:
        bud = out["budget"]
        out["budget"]["refit"] = st.run("outcome", outcome_curves, refit, model, x, y, xt, yt, clean.per_test,
                                        clean.total, bud["by_eps"][0]["k"], cfg.eps,
                                        tuple(p["eps"] for p in bud["by_eps"]), [p["k"] for p in bud["by_k"]],
                                        cfg.curve_attack, cfg.steps, cfg.seed, cfg.outcome_targets, out_dim)
    if "outcome" in cfg.panels:
        out["outcome"] = st.run("outcome", outcome_panel, refit, model, x, y, xt, yt, clean.per_test,
                                np.asarray(user["selected"]), user["worst_attack"], cfg.eps, cfg.steps,
                                cfg.refit_seeds, cfg.seed, cfg.outcome_targets, out_dim)
    if "poison" in cfg.panels:
        if rcfg.train_fn:
            proj = provider.jac.projection if isinstance(provider, GenericKernels) and isinstance(
                provider.jac, ProjectedJacobian) else None

            def kernels(net: torch.nn.Module) -> GenericKernels:
                jac = ModelJacobian(net, input_shape)
                return GenericKernels(jac if proj is None else _projected(jac, proj, max_bytes), max_bytes)
        elif isinstance(provider, SuiteKernels):
            def kernels(net: torch.nn.Module) -> SuiteKernels:
                return SuiteKernels(loaded.module)
        else:
            def kernels(net: torch.nn.Module) -> GenericKernels:
                return GenericKernels(provider.jac, max_bytes)
        out["poison"] = st.run("planted poison", poison_panel, refit, model, x, y, xt, yt, kernels,
                               cfg.poison_fraction, cfg.eps, cfg.steps, cfg.seed, out_dim, cfg.ridge_rel)
    out["refit"]["count"] = refit.count
    out["refit"]["seconds"] = refit.seconds
    return out


def _projected(jac: ModelJacobian, proj: Projection, max_bytes: int) -> ProjectedJacobian:
    """A projected kernel within the memory budget: a quarter for a batch's exact Jacobians, half for R."""
    return ProjectedJacobian(jac, proj, batch_bytes=max(1, max_bytes // 4), cache_bytes=max_bytes // 2)


def run_audit(cfg: AuditConfig) -> dict[str, Any]:
    """Run every measurement and return the JSON-ready audit record (writes nothing)."""
    t0 = time.perf_counter()
    st = _Stage()
    log(f"audit: loading {cfg.model} and the data")
    loaded, train, test = st.run("load", load_inputs, cfg)
    if cfg.train_fn and set(cfg.panels) & {"validity", "outcome", "poison"}:
        log(f"audit: importing your train function {cfg.train_fn} (this runs your code)")
        load_train_fn(cfg.train_fn)
    image_shape = train.image_shape or test.image_shape
    model, input_shape, out_dim = st.run("bind", bind_input, loaded, train.x, image_shape,
                                         parse_shape(cfg.input_shape))
    check_labels(train, out_dim, "--train")
    check_labels(test, out_dim, "--test")
    st.run("bind", probe_batches, model, {"training": train.x, "test": test.x},
           (n_top(cfg.tau, len(train.x)), 1, cfg.refit_batch), out_dim)
    if image_shape is None and len(input_shape) == 3:
        image_shape = input_shape
    t = Tensors(torch.as_tensor(train.x), torch.as_tensor(train.y), torch.as_tensor(test.x),
                torch.as_tensor(test.y), out_dim)
    max_bytes = int(cfg.max_memory_gb * 2**30)
    if loaded.is_suite:
        provider: SuiteKernels | GenericKernels = SuiteKernels(loaded.module)
        fit_module: torch.nn.Module = loaded.module
        refit_net: torch.nn.Module = model
    else:
        graph = st.run("bind", fx_graph_for, loaded, model, train.x)
        jac = ModelJacobian(model if graph is None else graph, input_shape, graph=graph,
                            static_batch=loaded.static_batch if graph is not None else None)
        proj, proj_reason = choose_projection(jac, len(train.x) + len(test.x), cfg.projection_dim,
                                              cfg.projection_kind, cfg.seed, max_bytes)
        log(f"audit: kernel {proj_reason}")
        provider = GenericKernels(jac if proj is None else _projected(jac, proj, max_bytes), max_bytes)
        fit_module = loaded.module if graph is None else graph
        refit_net = model if graph is None else FlatInput(graph, input_shape, loaded.static_batch)
    models: dict[str, Any] = {}
    models["user"] = st.run("your model", measure_network, "your model", model, provider, t, cfg,
                            loaded.n_params, loaded.widest_layer())
    projection: dict[str, Any] | None = None
    if isinstance(provider, GenericKernels) and isinstance(provider.jac, ProjectedJacobian):
        p = provider.jac.projection
        Y, Yt = targets(t.y_train, out_dim, torch.float64).numpy(), targets(t.y_test, out_dim, torch.float64).numpy()
        err = st.run("projection error", projection_error, provider.jac.jac, provider.jac, t.x_train, t.x_test, Y, Yt,
                     t.y_test.numpy(), cfg.seed, cfg.ridge_rel, max_bytes)
        projection = {"dim": p.dim, "kind": p.kind, "seed": p.seed, "reason": proj_reason, "error": err}
    elif isinstance(provider, GenericKernels):
        projection = {"dim": 0, "kind": "exact", "reason": proj_reason}
    if cfg.reference:
        for kind in ("relu", "attn"):
            label = f"{REF_LABELS[kind]} (m={cfg.ref_width})"
            log(f"audit: training the {label} reference ({PROPER} protocol, at most {cfg.ref_epochs} epochs)")
            spec = ModelSpec(kind, t.x_train.shape[1], cfg.ref_width, out_dim, seed=cfg.seed)
            tcfg = protocol_config(PROPER, cfg.ref_epochs, seed=cfg.seed)
            tr = st.run(f"train {kind}", train_network, spec, t, tcfg, label=f"training {REF_LABELS[kind]}")
            tr.model.eval()
            ref = st.run(kind, measure_network, label, FlatInput(tr.model, (spec.d,)), SuiteKernels(tr.model), t,
                         cfg, tr.model.W.numel(), cfg.ref_width)
            ref["training"] = {"protocol": PROPER, "max_epochs": cfg.ref_epochs, "epochs_run": tr.record.epochs_run,
                               "final_train_loss": tr.record.final_train_loss, "optimizer": "adam",
                               "lr": tr.record.lr, "weight_decay": 0.0, "batch_size": tcfg.batch_size,
                               "plateau_reached": tr.record.plateau_reached}
            ref["gate"] = tr.gate
            ref.pop("_context", None)
            models[kind] = ref
    user = models["user"]
    ctx = user.pop("_context")
    ref_flip: dict[str, float | None] = {}
    for k in ("relu", "attn"):
        if k not in models:
            ref_flip[k] = PAPER_AUDIT_REFERENCE[k]
        else:
            ref_flip[k] = models[k]["worst_flip_rate"] if models[k]["gate"]["passed"] else None
    risk = risk_level(user["worst_flip_rate"], user["baseline"]["flip_rates"], ref_flip["relu"], ref_flip["attn"])
    if cfg.reference:
        risk["references"] = "trained on this data with the width-consistent protocol"
        if risk["left_out"]:
            risk["references"] += (f"; {' and '.join(risk['left_out'])} did not pass the adequacy gate and "
                                   f"{'is' if len(risk['left_out']) == 1 else 'are'} left out of the scale")
    else:
        risk["references"] = "paper-reported values (no references trained)"
        if abs(cfg.eps - 0.3) > 1e-9:
            risk["references"] += (f"; the paper measured them at eps 0.3, not at the eps {eps_label(cfg.eps)} "
                                   "used here")
    risk["advice"] = ADVICE[risk["level"]]
    risk["gate"] = GATE_TEXT
    panels = _panels(cfg, st, ctx, t, model, refit_net, fit_module, provider, loaded, input_shape, out_dim, max_bytes,
                     user)
    levers = _levers(user, train, cfg)
    for m in models.values():
        m.pop("adversarial_pixels", None)
    diag = _diagnostics(train.x, cfg, models)
    desc = loaded.describe()
    desc.update({"input_shape": list(input_shape), "outputs": out_dim, "kernel_method": provider.method})
    if projection is not None:
        desc["projection"] = projection
    return {
        "experiment": "audit",
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(cfg),
        "model": desc,
        "data": {"train": train.provenance, "test": test.provenance, "n_train": int(len(train.x)),
                 "n_test": int(len(test.x)), "d": int(train.x.shape[1]),
                 "image_shape": list(image_shape) if image_shape else None,
                 "classes": train.classes, "task": "binary (one output, MSE on +-1)" if out_dim == 1
                 else f"{out_dim} classes (cross-entropy)"},
        "models": models,
        "risk": risk,
        "levers": levers,
        "panels": panels,
        "diagnostics": diag,
        "definitions": DEFINITIONS,
        "versions": library_versions(),
        "device": device_info(),
        "timings": {**st.times, "total": time.perf_counter() - t0},
    }


DEFINITIONS = {
    "influence": "NTK leave-one-out influence of a training point on the test loss: the change of the summed "
                 "squared test error of kernel ridge regression with the model's empirical NTK when the point is "
                 "removed (exact, no retraining). Positive: the point helps; negative: it hurts.",
    "gn_influence": "Gauss-Newton influence: (1/n) g_test^T H^-1 g_i with H = J^T J / n + lambda I, computed "
                    "through the same kernel by Woodbury; uses the network's own loss gradients.",
    "flip_rate": "Of the top tau training points by |influence|, the fraction whose influence changes sign "
                 "(helpful <-> harmful) after each is perturbed within +-eps per pixel and the kernel recomputed.",
    "rho": "Spearman rank correlation of all training points' influences before and after the perturbation: "
           "1 means the ranking of what the model relies on is unchanged; lower is more malleable.",
    "baseline": "The same protocol with random signs times eps instead of an attack: what any perturbation of "
                "that size does. An attack flip rate inside this band is not evidence of malleability.",
    "kappa_data": "Condition number of the training Gram matrix G = X X^T (infinite when n > d: G is singular).",
    "kappa_ntk": "Condition number of the model's empirical NTK on the training subset: large values mean the "
                 "kernel predictor, and so influence, is sensitive to small changes of the data.",
    "width_bounds": "Thm 4.7: MLP-Attn needs width m = kappa^6 / eps^2 (v1) or kappa_d^6 n ln n (v2) to behave "
                    "like its NTK; 2L-ReLU needs 1 / eps^2. Constants are set to 1.",
    "sharpness": "Largest eigenvalue of the Hessian of the mean training loss (power iteration); "
                 "sharpness_w2 = lambda_max ||theta||^2 is comparable across parameterisations.",
    "re_fit": "Fitting the model again on an altered training set (warm start from the saved weights, or your "
              "--train-fn from scratch), compared with a control re-fit of the unaltered set with the same seed.",
    "lds": "Linear datamodeling score: Spearman correlation, over random subsets of the training set, between the "
           "predicted change of a test point's loss (sum of the left-out points' influences) and the actual change "
           "after re-fitting, averaged over test points.",
    "breaking_budget": "The smallest eps at which the attack's flip rate exceeds the random-noise ceiling of the same "
                       "eps, significantly (Fisher exact test).",
    "self_influence": "A training point's squared leave-one-out error under kernel ridge regression with the NTK: "
                      "large for points the rest of the data contradict, such as flipped labels.",
}


# --- report ----------------------------------------------------------------------------------------

#: Exit code when the PDF cannot be made (weasyprint or its system libraries missing); HTML is written.
PDF_UNAVAILABLE_EXIT = 3


def _flat_rows(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as (dotted key, text) rows for the appendix tables."""
    rows: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            rows += _flat_rows(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            rows += _flat_rows(v, f"{prefix}[{i}]")
    else:
        text = ", ".join(str(v) for v in obj) if isinstance(obj, (list, tuple)) else str(obj)
        rows.append((prefix, text))
    return rows


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def report_context(result: dict[str, Any], figures: dict[str, str]) -> dict[str, Any]:
    """Everything the template shows, as formatted values (reads the record, computes nothing new)."""
    cfg = result["config"]
    models = result["models"]
    user = models["user"]
    risk = result["risk"]
    worst = user["worst_attack"].upper()
    k = user["n_selected"]
    b = user["baseline"]
    summary = [
        f"Perturbing the {k} training examples with the largest influence ({_pct(cfg['tau'])} of "
        f"{result['data']['n_train']}) by at most ±{eps_label(cfg['eps'])} per pixel flipped the sign of the "
        "influence of "
        f"{_pct(user['worst_flip_rate'])} of them (worst attack: {worst}); random noise of the same size flips "
        f"{_pct(b['mean'])} ± {_pct(b['std'])}.",
    ]
    if "relu" in models and "attn" in models:
        summary.append("On the same data the paper's reference networks flip "
                       f"{_pct(models['relu']['worst_flip_rate'])} (2L-ReLU) and "
                       f"{_pct(models['attn']['worst_flip_rate'])} (MLP-Attn).")
    else:
        summary.append(f"No reference networks were trained (--no-reference); the paper-reported scale "
                       f"{_pct(risk['relu_reference'])} (2L-ReLU) and {_pct(risk['attn_reference'])} (MLP-Attn) "
                       "is used.")
    summary.append(f"After the {worst} perturbation the ranking of all training points by influence keeps a Spearman "
                   f"correlation of {user['worst_rho_all']:.2f} with the original (1 = unchanged).")
    panels = result.get("panels", {})
    if risk.get("left_out"):
        summary.append(f"{' and '.join(risk['left_out'])}: the reference trained on your data did not pass the "
                       "adequacy gate (it did not learn), so it is marked in the table and left out of the risk scale.")
    val = panels.get("validity", {})
    if val.get("verdict"):
        summary.append(f"Influence is {str(val['verdict']).upper()} for this model when checked against re-fitting it "
                       f"({val.get('reason', '')}).")
        if val["verdict"] != "trustworthy":
            summary.append("So the flip rates above describe how malleable the kernel predictor's ranking is; they are "
                           "not a validated prediction of what re-fitting your model on altered data would do.")
    bud = panels.get("budget", {})
    if bud.get("by_eps"):
        summary.append(f"Breaking budget (the attack first exceeds random noise): {bud['breaking_label']}.")
    note = projection_note(result["model"].get("projection"))
    if note:
        summary.append(note)
    key_rows, sharp_rows = [], []
    for key, m in models.items():
        gate = m.get("gate")
        key_rows.append({"key": key, "label": m["label"], "flip": m["worst_flip_rate"],
                         "worst": m["worst_attack"].upper(), "noise": m["baseline"]["mean"],
                         "noise_std": m["baseline"]["std"], "rho": m["worst_rho_all"], "acc": m["test_acc"],
                         "train_acc": m.get("train_acc"), "gate": gate,
                         "excluded": bool(gate and not gate["passed"]),
                         "kappa": m["ntk"]["kappa"], "rho_gn": m["rho_ntk_gn"], "sharp": m["sharpness"]["value"]})
        s = m["sharpness"]
        sharp_rows.append({"label": m["label"], "value": s["value"],
                           "fd": str(s.get("hvp", "")).startswith("central"), "w2": s.get("sharpness_w2"),
                           "per_loss": s.get("sharpness_per_loss"), "loss": s.get("loss"),
                           "residual": s.get("residual"), "error": s.get("error")})
    model = result["model"]
    model_rows = [(k2, v) for k2, v in _flat_rows({kk: vv for kk, vv in model.items() if kk != "spec"})]
    if model.get("spec"):
        model_rows += _flat_rows(model["spec"], "spec")
    env = {"created": result["created"], "versions": result["versions"], "device": result["device"],
           "timings (s)": {k2: f"{v:.1f}" for k2, v in result["timings"].items()}}
    refs = ("The 2L-ReLU and MLP-Attn references are the paper's two networks trained by the suite on the same data "
            f"(width {cfg['ref_width']}, the width-consistent protocol: Adam without weight decay to a plateau of the "
            f"training loss, at most {cfg['ref_epochs']} epochs). A reference below the adequacy gate is marked "
            "'below gate' and left out of the risk scale." if cfg["reference"]
            else "No references were trained (--no-reference).")
    return {
        "model_name": Path(model["path"]).name, "model": model, "data": result["data"], "created": result["created"],
        "risk": risk, "summary": summary, "key_rows": key_rows, "sharp_rows": sharp_rows, "cfg": cfg,
        "n_selected": k, "references_note": refs, "levers": result["levers"], "user": user,
        "worst_label": worst, "attack_names": [a.upper() for a in cfg["attacks"]], "diag": result["diagnostics"],
        "definitions": result["definitions"], "fig": figures, "model_rows": model_rows,
        "data_rows": _flat_rows({"train": result["data"]["train"], "test": result["data"]["test"],
                                 "image_shape": result["data"]["image_shape"], "task": result["data"]["task"]}),
        "settings_rows": _flat_rows(cfg), "env_rows": _flat_rows(env),
        "panels": panels, "eps_label": eps_label(cfg["eps"]), "realistic_reason": REALISTIC_REASON,
        "outcome_rows": _outcome_rows(panels.get("outcome", {})),
        "projection_note": note,
    }


def projection_note(proj: dict[str, Any] | None) -> str:
    """One sentence on a projected kernel and its measured error (empty for the exact kernel)."""
    if not proj or not proj.get("dim"):
        return ""
    e = proj.get("error", {})
    return (f"Your model's kernel is a random projection of its per-example gradients to k = {proj['dim']} dimensions "
            f"({proj['kind']}, seed {proj['seed']}; {proj['reason']}). Against the exact kernel on {e.get('n')} "
            f"training and {e.get('n_test')} test points its entries differ by "
            f"{_pct(e.get('kernel_rel_error', math.nan))} (train) and "
            f"{_pct(e.get('test_kernel_rel_error', math.nan))} (test-train), relative Frobenius error, "
            f"and it ranks influence with Spearman rho {e.get('influence_spearman', math.nan):.2f} against the exact "
            "ranking: read every influence-based number with that in mind.")


OUTCOME_LABELS = {"acc_change": "test accuracy change", "target_flip": "targeted predictions changed",
                  "target_loss_change": "targeted mean loss change"}


def _outcome_rows(panel: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcome table's rows: each metric for the levers, random points and their difference."""
    return [{"label": OUTCOME_LABELS.get(k, k), "pct": k != "target_loss_change", **v}
            for k, v in panel.get("rows", {}).items()]


def from_json(obj: Any) -> Any:
    """An audit record read back from JSON: the strings "nan", "inf", "-inf" become floats again."""
    if isinstance(obj, dict):
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    if isinstance(obj, str) and obj in ("nan", "inf", "-inf"):
        return float(obj)
    return obj


def load_record(path: str | Path) -> dict[str, Any]:
    """A saved audit JSON (`--json`), ready to render again without recomputing anything."""
    import json

    p = Path(path).expanduser()
    try:
        rec = from_json(json.loads(p.read_text()))
    except FileNotFoundError:
        raise UserInputError(f"--render {p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError, IsADirectoryError) as exc:
        raise UserInputError(f"--render {p} is not a JSON file ({str(exc).splitlines()[0]})") from None
    if not isinstance(rec, dict) or rec.get("experiment") != "audit":
        raise UserInputError(f"--render {p} is not an audit record (written by verify audit --json)")
    return rec


_RECORD_SHAPE: dict[str, type | tuple[type, ...]] = {
    "config": dict, "model": dict, "data": dict, "models": dict, "risk": dict, "levers": list,
    "diagnostics": dict, "definitions": dict, "versions": dict, "device": dict, "timings": dict, "created": str,
}
_NUMBER = (int, float)


def check_record(rec: dict[str, Any], where: str, option: str = "--render") -> None:
    """Refuse (one line) a saved audit record whose structure this version cannot draw."""
    bad = [k for k, t in _RECORD_SHAPE.items() if not isinstance(rec.get(k), t)]
    user = rec.get("models", {}).get("user") if isinstance(rec.get("models"), dict) else None
    if not bad and not isinstance(user, dict):
        bad = ["models.user"]
    if not bad:
        need = {"worst_flip_rate": _NUMBER, "worst_attack": str, "baseline": dict, "n_selected": int}
        bad = [f"models.user.{k}" for k, t in need.items() if not isinstance(user.get(k), t)]
        risk = rec["risk"]
        if not bad and risk.get("level") not in (*RISK_LEVELS, NOT_MEASURABLE):
            bad = ["risk.level"]
        if not bad and not all(isinstance(risk.get(k), _NUMBER) for k in ("relu_reference", "attn_reference")):
            bad = ["risk.relu_reference / risk.attn_reference"]
    if bad:
        raise UserInputError(f"{option} {where} is not an audit record this version can draw (missing or malformed: "
                             f"{', '.join(bad[:4])}); rerun the audit with --json")


def render_report(result: dict[str, Any]) -> str:
    """The audit report as one self-contained HTML string (figures embedded)."""
    import tempfile

    from reports.audit_figures import all_figures
    from reports.render import image_data_uri, render_html

    with tempfile.TemporaryDirectory() as tmp:
        figs = {k: image_data_uri(p) for k, p in all_figures(result, tmp).items()}
    return render_html("audit.html", report_context(result, figs))


def output_members(out: Path) -> tuple[str, str, str, str]:
    """The files of one audit's output set: the PDF and the HTML, JSON and Markdown summary beside it."""
    return out.name, out.with_suffix(".html").name, out.with_suffix(".json").name, summary_name(out)


def summary_name(out: Path) -> str:
    """The Markdown summary's file name beside the PDF (`--summary`): `<stem>-summary.md`."""
    return f"{out.stem}-summary.md"


def earlier_audit_file(path: Path) -> bool:
    """Whether an existing file is an earlier audit's output (so it may be removed as stale): a PDF, the
    audit HTML, or an audit JSON record; anything else with that name is left alone."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if path.suffix == ".pdf":
        return head.startswith(b"%PDF")
    if path.suffix == ".html":
        return b"Training-data malleability audit" in head
    if path.suffix == ".md":
        return head.startswith(SUMMARY_MARKER.encode())
    return b'"experiment": "audit"' in head


def write_outputs(result: dict[str, Any], out: str | Path, html: bool = False, json_out: bool = False,
                  summary: bool = False) -> int:
    """Render everything, stage the PDF (and HTML / JSON) as one output set, then swap it in.

    `summary` adds the Markdown summary for a pull-request comment (`verify.audit_ci.summary_markdown`).
    Returns 0, or `PDF_UNAVAILABLE_EXIT` (3) when weasyprint cannot run: the HTML is then written anyway.
    A stale member of the set (e.g. last run's PDF when this run could make none) is removed, so the
    files beside each other always come from the same run.
    """
    from empirics.records import atomic_write_text, write_json
    from reports.render import PdfUnavailable, write_pdf
    from verify.outputs import output_set

    out = Path(out).expanduser().absolute()
    from verify.audit_ci import summary_markdown

    pdf_name, html_name, json_name, md_name = output_members(out)
    problem, pdf_ok = "", True
    with output_set(out.parent, output_members(out), owned=earlier_audit_file) as staged:
        page = render_report(result)
        try:
            write_pdf(staged.path(pdf_name), page)
        except PdfUnavailable as exc:
            pdf_ok, problem = False, str(exc)
        if json_out:
            write_json(staged.path(json_name), result)
        if html or not pdf_ok:
            atomic_write_text(staged.path(html_name), page)
        if summary:
            atomic_write_text(staged.path(md_name), summary_markdown(result))
    if not pdf_ok:
        sys.stderr.write(f"verify audit: no PDF: {problem} ({out.with_suffix('.html')})\n")
        return PDF_UNAVAILABLE_EXIT
    return 0
