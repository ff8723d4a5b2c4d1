"""The measurements `verify audit` makes on one network (`measure_network`), and the tools they use.

For the user's model and each reference network:
- the empirical NTK ("mean" reduction) on the training subset and test set: the suite's closed form for its
  own networks (`SuiteKernels`), `empirics.kernels.audit_ntk` (exact, memory-bounded) for any other model, or its
  random projection to k dimensions when the Jacobians do not fit memory or `projection_dim` asks
  (`GenericKernels`; the choice and its error in `verify.audit.projection`);
- NTK leave-one-out influence of each training point on the test loss (`empirics.attribution.influence`), and
  Gauss-Newton influence on the same kernel via Woodbury (`empirics.attribution.gauss_newton`), with their Spearman
  rank correlation;
- the flip-rate protocol (`empirics.experiments.malleability`: top tau by |influence|, attack them at eps, recompute
  the kernel, count total-influence sign flips, Spearman rho): for a user model the kernel rows and columns
  of the perturbed points are recomputed; for the suite's networks the whole kernel (MLP-Attn's context C
  changes with every training point). The random-noise baseline (random signs times eps on the same
  points) is run with `baseline_seeds` seeds;
- the spectrum and condition number of the empirical NTK (`ntk_spectrum`);
- sharpness: the top Hessian eigenvalue of the mean training loss (cross-entropy, or MSE on +-1 for one
  output), by power iteration on Hessian-vector products (`top_hessian`, `empirics.experiments.landscape`), on the
  points `hessian_subset` chooses (`verify.audit.sharpness`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from empirics.attribution.gauss_newton import loss_residuals
from empirics.attribution.influence import InfluenceResult, Ridge, influence_from_kernels, model_kernels
from empirics.common import Tensors
from empirics.experiments.malleability import compare, n_top, top_by_abs
from empirics.intervals import spearman
from empirics.kernels.audit_ntk import JacobianFeatures, ModelJacobian, ProjectedJacobian, Projection
from empirics.kernels.audit_structured import ProjectedStructured
from empirics.nets.attacks import ATTACKS, AttackConfig, attack
from empirics.nets.losses import predict_labels, targets
from empirics.nets.models import TwoLayerNet
from empirics.progress import log
from empirics.records import peak_rss_gib
from reports.text import eps_label
from verify.audit.config import AuditConfig
from verify.audit.estimators import ESTIMATORS, PAPER_ESTIMATOR, Scoring, kernel_estimator
from verify.audit.modelio import FlatInput
from verify.audit.projection import projected_kernel
from verify.audit.sharpness import HvpOptions, hessian_subset, top_hessian

# --- kernels ---------------------------------------------------------------------------------------


def model_jacobian(net: nn.Module, input_shape: tuple[int, ...], static_batch: int | None = None) -> ModelJacobian:
    """The Jacobian family of `net` as the audit binds the user's model: an FX graph (a re-fit of a graph-bound
    model) gets its factored linear layers, whose exact kernel needs no per-example Jacobians of those layers."""
    graph = net if isinstance(net, torch.fx.GraphModule) else None
    return ModelJacobian(net, input_shape, graph=graph, static_batch=static_batch)


@runtime_checkable
class KernelProvider(Protocol):
    """Where a network's empirical NTK comes from (issue 41: the audit asks the provider, never its class): the
    kernels on the clean data and on a training set with some points perturbed, how they were computed, the random
    projection behind them (None: exact), whether a perturbation recomputes the whole kernel (the suite's
    networks, whose training-set context moves every output), and the same kind of kernel for a re-fitted network."""

    @property
    def method(self) -> str: ...

    @property
    def projection(self) -> Projection | None: ...

    @property
    def recomputes_whole(self) -> bool: ...

    def clean(self, x: torch.Tensor, xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]: ...

    def perturbed(self, x_new: torch.Tensor, sel: np.ndarray, K: np.ndarray, Kst: np.ndarray,
                  xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]: ...

    def refreshed(self) -> KernelProvider:
        """A provider over the same module, without this one's cached Jacobians (the module re-fitted in place)."""
        ...

    def for_network(self, net: nn.Module, input_shape: tuple[int, ...]) -> KernelProvider:
        """The same kind of kernel for another network `net` (a re-fit built by the user's train function),
        projected alike."""
        ...


class SuiteKernels:
    """Kernels of the suite's own networks: closed form, recomputed whole on modified data."""

    method = "closed form (empirics.kernels.ntk.empirical_ntk), float64"
    projection = None
    recomputes_whole = True

    def __init__(self, model: TwoLayerNet, max_bytes: int = 1 << 30):
        self.model = model
        self.max_bytes = max_bytes

    def refreshed(self) -> SuiteKernels:
        return SuiteKernels(self.model, self.max_bytes)

    def for_network(self, net: nn.Module, input_shape: tuple[int, ...]) -> GenericKernels:
        return GenericKernels(model_jacobian(net, input_shape), self.max_bytes)

    def clean(self, x: torch.Tensor, xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return model_kernels(self.model, x, xt)

    def perturbed(self, x_new: torch.Tensor, sel: np.ndarray, K: np.ndarray, Kst: np.ndarray,
                  xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return model_kernels(self.model, x_new, xt)


#: The projected kernels (dense R of per-example Jacobians; Kronecker R of structured per-example gradients).
PROJECTED = (ProjectedJacobian, ProjectedStructured)


class GenericKernels:
    """Kernels of any model from per-example Jacobians; on modified data only the rows and columns of
    the modified points are recomputed (a user model has no training-set context)."""

    recomputes_whole = False

    def __init__(self, jac: ModelJacobian | ProjectedJacobian | ProjectedStructured, max_bytes: int):
        self.jac = jac
        self.max_bytes = max_bytes
        self._train: JacobianFeatures | None = None
        self._test: JacobianFeatures | None = None

    @property
    def projection(self) -> Projection | None:
        return self.jac.projection if isinstance(self.jac, PROJECTED) else None

    def refreshed(self) -> GenericKernels:
        return GenericKernels(self.jac, self.max_bytes)

    @property
    def holds_jacobians(self) -> bool:
        """Whether the clean data's Jacobian features are cached (`clean` found them within the memory budget), so
        that a perturbed set costs only its moved rows."""
        return self._train is not None and self._test is not None

    def for_network(self, net: nn.Module, input_shape: tuple[int, ...]) -> GenericKernels:
        jac = model_jacobian(net, input_shape)
        proj = self.projection
        return GenericKernels(jac if proj is None else projected_kernel(jac, None, proj, self.max_bytes),
                              self.max_bytes)

    @property
    def method(self) -> str:
        if self.projection is not None:
            return f"{self.jac.method}, float64 kernel"
        return f"{self.jac.method}; exact, {self.jac.dtype} Jacobians, float64 kernel"

    def clean(self, x: torch.Tensor, xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        per = self.jac.bytes_per_example()
        if per * (len(x) + len(xt)) <= self.max_bytes:
            self._train = self.jac.features(x, label="jacobians (train)")
            self._test = self.jac.features(xt, label="jacobians (test)")
            return (self.jac.gram(self._train, self._train).cpu().numpy(),
                    self.jac.gram(self._test, self._train).cpu().numpy())
        log(f"audit: Jacobians of all points need {per * (len(x) + len(xt)) / 2**30:.1f} GiB > the memory budget; "
            "assembling the kernel in blocks (slower)")
        return (self.jac.kernel(x, max_bytes=self.max_bytes).cpu().numpy(),
                self.jac.kernel(xt, x, max_bytes=self.max_bytes).cpu().numpy())

    def perturbed(self, x_new: torch.Tensor, sel: np.ndarray, K: np.ndarray, Kst: np.ndarray,
                  xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        s = torch.as_tensor(sel, device=x_new.device)
        if self.holds_jacobians:
            fp = self.jac.features(x_new[s], label="jacobians (perturbed)")
            rows = self.jac.gram(fp, self._train).cpu().numpy()
            rows[:, sel] = self.jac.gram(fp, fp).cpu().numpy()
            cols = self.jac.gram(self._test, fp).cpu().numpy()
        else:
            rows = self.jac.kernel(x_new[s], x_new, max_bytes=self.max_bytes).cpu().numpy()
            cols = self.jac.kernel(xt, x_new[s], max_bytes=self.max_bytes).cpu().numpy()
        K2, Kst2 = K.copy(), Kst.copy()
        K2[sel, :] = rows
        K2[:, sel] = rows.T
        Kst2[:, sel] = cols
        return K2, Kst2


# --- measurements --------------------------------------------------------------------------------


def ntk_spectrum(K: np.ndarray) -> dict[str, Any]:
    """Eigenvalues (descending) and condition number of a kernel matrix; kappa is inf when lambda_min <= 0."""
    ev = np.linalg.eigvalsh((K + K.T) / 2)[::-1]
    top, bottom = float(ev[0]), float(ev[-1])
    tol = max(K.shape) * np.finfo(np.float64).eps * abs(top)
    kappa = top / bottom if bottom > tol else math.inf
    return {"lambda_max": top, "lambda_min": bottom, "kappa": kappa,
            "log10_kappa": math.log10(kappa) if math.isfinite(kappa) and kappa > 0 else math.inf,
            "rank": int(np.sum(ev > tol)), "eigenvalues": ev.tolist()}


def _seed(base: int, name: str, k: int = 0) -> int:
    return 1_000_003 * base + 10_007 * ATTACKS.index(name) + k


#: `probe(chosen, attack, eps, seed)`: attack the training points `chosen` and return the comparison of influence
#: before and after (`empirics.experiments.malleability.compare`) with the influence on the perturbed set.
Probe = Callable[[np.ndarray, str, float, int], tuple[dict[str, Any], InfluenceResult]]


@dataclass(frozen=True)
class Estimated:
    """One network's kernel and its influence estimates on the clean data (`estimate_network`): the kernels, the
    targets, NTK leave-one-out influence (`clean`, whose predictions and losses every estimator's result shares), each
    estimator's per-test influence (training x test points, by estimator name), the loss residuals, each
    estimator's ridge and the audit's relative ridge, the model's accuracies, and the seconds and peak memory of each
    step."""

    K: np.ndarray
    Kst: np.ndarray
    Y: np.ndarray
    Yt: np.ndarray
    clean: InfluenceResult
    per_test: dict[str, np.ndarray]
    r_train: np.ndarray
    r_test: np.ndarray
    #: Each computed estimator's ridge on the clean data (kept on every perturbed set).
    ridges: dict[str, float]
    ridge_rel: float
    accuracy: tuple[float, float]
    seconds: dict[str, float]
    times: dict[str, float]
    peak: dict[str, float]
    #: The registered estimators not computed on this network, with why (e.g. a dual too large to solve exactly).
    skipped: dict[str, str] = field(default_factory=dict)

    def result(self, name: str) -> InfluenceResult:
        """The clean influence of estimator `name` (NTK leave-one-out's predictions and losses)."""
        kernel_estimator(name)
        per = self.per_test[name]
        if per is self.clean.per_test:  # the estimator's influence is NTK leave-one-out's own
            return self.clean
        return replace(self.clean, per_test=per, total=per.sum(axis=1))

    def perturbed(self, name: str, K2: np.ndarray, Kst2: np.ndarray, yt: np.ndarray,
                  r_train: Callable[[], np.ndarray]) -> InfluenceResult:
        """Estimator `name`'s influence on a perturbed training set with kernels `K2`, `Kst2` and, where the
        estimator needs them, the loss residuals `r_train()`, at the clean data's ridges."""
        estimator = kernel_estimator(name)
        new = influence_from_kernels((K2, Kst2), self.Y, self.Yt, yt, reg=Ridge(self.clean.ridge))
        residuals = r_train() if estimator.needs_residuals else None
        s = Scoring(K2, Kst2, self.Y, residuals, self.r_test, new, self.ridge_rel)
        return estimator.result(s, self.ridges[name])


class FlipAttribution(Protocol):
    """An estimator the flip rates may rank by that is not one network's (`verify.audit.ensemble.EnsembleLead`): its
    name and label, its clean influence, and its influence on a training set with the points `chosen` perturbed."""

    name: str

    @property
    def label(self) -> str: ...

    def clean(self, like: InfluenceResult) -> InfluenceResult: ...

    def perturbed(self, x_new: torch.Tensor, chosen: np.ndarray, x_adv: torch.Tensor, y_chosen: torch.Tensor,
                  xt: torch.Tensor, yt: np.ndarray) -> InfluenceResult: ...


@dataclass(frozen=True)
class NetworkContext:
    """What the budget curves and the re-fit panels need of one measured network beyond its JSON record: the
    probe that attacks any chosen points, the clean influence of the estimator the flip rates rank by
    (`estimator`), and the estimates it came from."""

    probe: Probe
    clean: InfluenceResult
    estimator: str
    estimated: Estimated


@dataclass(frozen=True)
class Network:
    """One network the audit measures: its label in the report, the model on flat inputs, its kernel provider, its
    parameter count and its width (widest layer)."""

    label: str
    model: FlatInput
    provider: KernelProvider
    n_params: int
    width: int


def estimate_network(net: Network, t: Tensors, cfg: AuditConfig) -> Estimated:
    """The empirical NTK of `net` on the data `t` and every registered estimator's influence from it
    (`verify.audit.estimators.ESTIMATORS`; one that cannot run here is in `skipped`, with why)."""
    label, model, provider = net.label, net.model, net.provider
    times: dict[str, float] = {}
    peak: dict[str, float] = {}
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    c = t.out_dim
    tic = time.perf_counter()
    log(f"audit: {label}: empirical NTK ({len(x)} training + {len(xt)} test points)")
    K, Kst = provider.clean(x, xt)
    times["kernel"] = time.perf_counter() - tic
    peak["kernel"] = peak_rss_gib()
    tic = time.perf_counter()
    Y = targets(y, c, torch.float64).cpu().numpy()
    Yt = targets(yt, c, torch.float64).cpu().numpy()
    clean = influence_from_kernels((K, Kst), Y, Yt, yt.cpu().numpy(), reg=Ridge(rel=cfg.ridge_rel))
    base_s = time.perf_counter() - tic
    tic_r = time.perf_counter()
    with torch.no_grad():
        out_tr, out_te = model(x), model(xt)
    r_tr, r_te = loss_residuals(out_tr, y), loss_residuals(out_te, yt)
    residual_s = time.perf_counter() - tic_r
    scoring = Scoring(K, Kst, Y, r_tr, r_te, clean, cfg.ridge_rel)
    per_test: dict[str, np.ndarray] = {}
    ridges: dict[str, float] = {}
    est_s: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name, estimator in ESTIMATORS.items():
        why = estimator.unavailable(len(x), c)
        if why is not None:
            skipped[name] = why
            continue
        tic_e = time.perf_counter()
        ridges[name] = estimator.ridge(scoring)
        per_test[name] = estimator.score(scoring, ridges[name])
        shared = residual_s if estimator.needs_residuals else base_s
        est_s[name] = times["kernel"] + shared + time.perf_counter() - tic_e
    times["influence"] = time.perf_counter() - tic
    peak["influence"] = peak_rss_gib()
    with torch.no_grad():
        acc = (float((predict_labels(out_tr) == y).double().mean()),
               float((predict_labels(out_te) == yt).double().mean()))
    return Estimated(K, Kst, Y, Yt, clean, per_test, r_tr, r_te, ridges, cfg.ridge_rel, acc, est_s, times, peak,
                     skipped)


def measure_network(net: Network, t: Tensors, cfg: AuditConfig, estimator: str = PAPER_ESTIMATOR,
                    est: Estimated | None = None,
                    attribution: FlipAttribution | None = None) -> tuple[dict[str, Any], NetworkContext]:
    """Every audit measurement for one network (see the module docstring) on the data `t`, the flip rates ranking by
    `estimator` (a registered estimator's name; the audit passes the one its validity panel found best) or, where
    given, by `attribution` (an ensemble the validity panel found best; `estimator` is then its name): its JSON-ready
    record, and the context the panels work from. `est`: the network's estimates when already made."""
    if attribution is None:
        kernel_estimator(estimator)
    elif attribution.name != estimator:
        raise ValueError(f"the flip rates rank by {estimator!r} but the attribution given is {attribution.name!r}")
    est = est if est is not None else estimate_network(net, t, cfg)
    label, model, provider, n_params, width = net.label, net.model, net.provider, net.n_params, net.width
    times, peak = dict(est.times), dict(est.peak)
    x, y, xt, yt = t.x_train, t.y_train, t.x_test, t.y_test
    yt_np = yt.cpu().numpy()
    ntk = est.clean
    clean = est.result(estimator) if attribution is None else attribution.clean(ntk)
    ranked_by = kernel_estimator(estimator).label if attribution is None else attribution.label
    gn = est.per_test["gn"].sum(axis=1)
    n = len(x)
    k = n_top(cfg.tau, n)
    sel = top_by_abs(clean.total, k)
    whole = provider.recomputes_whole

    def probe(chosen: np.ndarray, name: str, eps: float, seed: int) -> tuple[dict[str, Any], InfluenceResult,
                                                                        torch.Tensor]:
        ct = torch.as_tensor(chosen, device=x.device)
        x_adv = attack(model, x[ct], y[ct], AttackConfig(name, eps, steps=cfg.steps, seed=seed))
        x_new = x.index_copy(0, ct, x_adv)
        if attribution is not None:  # the ensemble's influence on the points the attack on this model moved
            new = attribution.perturbed(x_new, chosen, x_adv, y[ct], xt, yt_np)
            m = compare(clean, new, chosen)
            m["max_abs_perturbation"] = float((x_new - x).abs().max())
            return m, new, x_adv
        K2, Kst2 = provider.perturbed(x_new, chosen, est.K, est.Kst, xt)

        def residuals() -> np.ndarray:
            """The loss residuals on the perturbed set: all recomputed for the suite's networks (MLP-Attn's
            context moves every output), only the perturbed points' for a user model."""
            with torch.no_grad():
                if whole:
                    return loss_residuals(model(x_new), y)
                r2 = est.r_train.copy()
                r2[chosen] = loss_residuals(model(x_adv), y[ct])
                return r2

        new = est.perturbed(estimator, K2, Kst2, yt_np, residuals)
        m = compare(clean, new, chosen)
        m["max_abs_perturbation"] = float((x_new - x).abs().max())
        return m, new, x_adv

    def trial(name: str, seed: int) -> tuple[dict[str, Any], InfluenceResult, torch.Tensor]:
        return probe(sel, name, cfg.eps, seed)

    tic = time.perf_counter()
    attacks: dict[str, Any] = {}
    adv_pixels: dict[str, torch.Tensor] = {}
    for name in cfg.attacks:
        log(f"audit: {label}: {name.upper()} on the top {k} points by {ranked_by} influence, eps={eps_label(cfg.eps)}")
        m, new, x_adv = trial(name, _seed(cfg.seed, name))
        m["new_total"] = new.total.tolist()
        attacks[name] = m
        adv_pixels[name] = x_adv
    times["attacks"] = time.perf_counter() - tic
    peak["attacks"] = peak_rss_gib()
    tic = time.perf_counter()
    log(f"audit: {label}: random-noise baseline ({cfg.baseline_seeds} seeds)")
    base = [trial("random", _seed(cfg.seed, "random", s))[0] for s in range(cfg.baseline_seeds)]
    flips = np.array([b["flip_rate"] for b in base])
    times["baseline"] = time.perf_counter() - tic
    peak["baseline"] = peak_rss_gib()
    tic = time.perf_counter()
    hsub = hessian_subset(len(x), n_params, cfg.hessian_points, cfg.seed)
    log(f"audit: {label}: sharpness ({cfg.hessian_iters} Hessian-vector products on {len(hsub)} of {len(x)} points)")
    hs = torch.as_tensor(hsub, device=x.device)
    sharp = top_hessian(model, x[hs], y[hs], cfg.hessian_iters, cfg.seed,
                        HvpOptions(max_bytes=int(cfg.max_memory_gb * 2**30)))
    sharp["points"], sharp["of"] = len(hsub), len(x)
    times["sharpness"] = time.perf_counter() - tic
    peak["sharpness"] = peak_rss_gib()
    worst = max(cfg.attacks, key=lambda a: attacks[a]["flip_rate"])
    acc_tr, acc_te = est.accuracy
    record = {
        "label": label, "parameters": int(n_params), "width": int(width), "kernel_method": provider.method,
        "train_acc": acc_tr, "test_acc": acc_te,
        "kernel_test_acc": ntk.test_acc, "kernel_test_loss": ntk.test_loss, "ridge": ntk.ridge,
        "estimator": estimator, "estimator_label": ranked_by,
        "estimator_total": clean.total.tolist(),
        "influence_total": ntk.total.tolist(), "gn_total": gn.tolist(),
        "rho_ntk_gn": spearman(ntk.total, gn),
        "sign_agreement_ntk_gn": float(np.mean(np.sign(ntk.total) == np.sign(gn))),
        "positive_fraction": float(np.mean(clean.total > 0)),
        "selected": sel.tolist(), "n_selected": int(k),
        "attacks": attacks,
        "adversarial_pixels": {a: v.cpu().numpy() for a, v in adv_pixels.items()},
        "baseline": {"flip_rates": flips.tolist(), "mean": float(flips.mean()), "std": float(flips.std(ddof=1)),
                     "rho_all": [b["rho_all"] for b in base],
                     "rho_all_mean": float(np.nanmean([b["rho_all"] for b in base]))},
        "worst_attack": worst, "worst_flip_rate": float(attacks[worst]["flip_rate"]),
        "worst_rho_all": float(attacks[worst]["rho_all"]),
        "ntk": ntk_spectrum(est.K),
        "sharpness": sharp,
        "timings": times, "peak_rss_gib_after": peak,
    }
    return record, NetworkContext(lambda c, a, e, s: probe(c, a, e, s)[:2], clean, estimator, est)
