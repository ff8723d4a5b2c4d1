"""NTK distance against width (docs/PAPER.md, "NTK distance vs width").

The paper does not define its distance. We measure four, each on the same runs:

- `function_abs`: `||f_m(X_test) - f_NTK(X_test)||_F` over test points and outputs, where `f_NTK` is
  kernel ridge regression with the analytic infinite-width NTK (Thm 4.2) on the training targets
  (one-hot or +-1) and ridge `n * weight_decay` (the ridge that L2 weight decay on the mean loss
  corresponds to in the linearised model). Unnormalised, like the paper's numbers.
- `function_rel`: the same divided by `||f_NTK(X_test)||_F`.
- `function_lin`: `||f_m(X_test) - f_lin(X_test)||_F / ||f_lin(X_test)||_F` with the predictor matched to the
  network's own initial function, `f_lin = f_0 + K_inf(., X) (K_inf + ridge I)^-1 (Y - f_0(X))`. In NTK
  parameterisation `f_0` is an O(1) random function at every width, so `f_NTK` above keeps a width-
  independent gap from any finite network; `f_lin` removes it (Lee et al. 2019; exact limit for MSE
  and gradient flow, an approximation for cross-entropy and Adam).
- `gd_function_change` (co-primary with `function_abs` in the claims): the estimand matched to NTK theory. A
  second network of the same spec is trained under the `gd-mse` protocol (full-batch gradient descent on half
  the squared error, step `eta = n / lambda_max(Theta_0)`, to a plateau), where the NTK limit is exact (Jacot et
  al. 2018; Lee et al. 2019), and its function change on the test points `f_T - f_0` is compared with the
  linearised network's change after the same number `T` of steps with the analytic kernel,
  `K(., X) K^-1 (I - (I - eta K / n)^T) (Y - f_0(X))`:
  `||(f_T - f_0) - delta_lin||_F / ||delta_lin||_F`, which goes to 0 with width when the network trains in
  the kernel regime. Removing `f_0` (instead of an antisymmetric initialisation, which would change the
  networks) keeps the same models and takes the random initial function out of the comparison; matching
  `T` removes the dependence on when the plateau stop ended training. `gd_*` fields hold that network's
  training and gate.
- `kernel_drift`: `||Theta_T - Theta_0||_F / ||Theta_0||_F` on the training set (Lee et al. 2019:
  about `m^-1/2` for wide ReLU nets trained by gradient descent).
- `kernel_distance`: Fort et al. (2020), `1 - <Theta_0, Theta_T>_F / (||Theta_0||_F ||Theta_T||_F)`.
- `init_vs_analytic`: `||Theta_0 - Theta_inf||_F / ||Theta_inf||_F` (the empirical kernel at
  initialisation against the analytic kernel; about `m^-1/2` by Thm 4.2).
- `ntk_predictor_test_acc`, `empirical_ntk_predictor_test_acc`: test accuracy of kernel regression (same
  ridge) with the analytic kernel and with the network's own empirical kernel at initialisation (each trained
  network of the malleability and landscape units records the first and, with its trained kernel, the
  `trained_ntk_predictor_test_acc`: `kernel_predictor_accuracy`).
- `kernel_drift_centred`, `init_vs_analytic_centred`: the same two on doubly centred kernels `H K H`
  (`H = I - 11^T/n`). The Frobenius norm of MLP-Attn's kernel is dominated by its near-constant mode
  (attention features are almost collinear on raw pixels), which hides what happens in the directions
  that separate the classes; centring removes that mode.

Kernels are the per-output ("mean") empirical NTK, computed in float64 with the closed form. The reference
kernel is analytic (Thm 4.2 on each model's features: raw, linearized or softmax attention) except for the
trainable-attention variant `qkv`, where it is the Monte Carlo mean kernel at initialisation
(`empirics.kernels.mc_reference`, `reference_draws` draws at `reference_width`), recorded with its standard error
and the jackknife standard error of the predictor `f_NTK` it gives.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from scipy import stats

from empirics import fieldhelp as H
from empirics.attribution.influence import model_kernels
from empirics.common import (
    NetworkRequest,
    SeedMap,
    Tensors,
    as_float64,
    experiment_data,
    local_map,
    spread,
    subset_provenance,
    train_network,
    train_networks,
    train_seeds_together,
)
from empirics.intervals import LEVEL, loglog_slope, t_interval
from empirics.kernels.mc_reference import mc_reference_kernel, predictor_jackknife_se
from empirics.kernels.ntk import empirical_ntk
from empirics.nets.kinds import ANALYTIC, KINDS, MONTE_CARLO
from empirics.nets.losses import targets
from empirics.nets.models import ModelSpec, SuiteNet, TwoLayerNet, build_model, input_channels, preprocessed_inputs
from empirics.nets.train import TrainConfig
from empirics.records import HasRunHeader, run_header
from empirics.vocab import NOT_MEASURABLE
from ntkm import tables
from ntkm.codec import Record, encode, stable_hash
from theory import kernels, krr

#: The gd-mse estimand (module docstring), co-primary in the NTK-distance claims.
GD_METRIC = "gd_function_change"
METRICS = ("function_abs", "function_rel", "function_lin", "kernel_drift", "kernel_distance", "init_vs_analytic",
           "kernel_drift_centred", "init_vs_analytic_centred", GD_METRIC)


@dataclass(frozen=True)
class DistanceConfig:
    """One NTK-distance experiment; the fields with `H.shared` are the data and architecture block every experiment
    config declares alike (`empirics.fieldhelp.ExperimentFields`)."""

    dataset: str = H.shared("dataset")
    task: str = H.shared("task")
    classes: tuple[str, ...] | None = H.shared("classes")
    models: tuple[str, ...] = H.shared("models")
    widths: tuple[int, ...] = H.helped((16, 64, 256, 1024, 4096), "comma-separated widths")
    seeds: tuple[int, ...] = H.shared("seeds")
    n_train: int = H.shared("n_train")
    n_test: int = H.shared("n_test")
    sample: str = H.shared("sample")
    data_seed: int = H.shared("data_seed")
    per_seed_data: bool = H.shared("per_seed_data")
    train: TrainConfig = H.shared("train")
    parameterization: str = H.shared("parameterization")
    attn_layers: int = H.shared("attn_layers")
    attn_rank: int | None = H.shared("attn_rank")
    attn_centre: bool = H.shared("attn_centre")
    preprocess: str = H.shared("preprocess")
    reference_draws: int = 16
    reference_width: int = 512
    gd_mse: bool = H.helped(True, "also train each network under gd-mse for the gd_function_change estimand")
    data_dir: str | None = H.shared("data_dir")
    data_source: str = H.shared("data_source")
    device: str = H.shared("device")


def _frob(a: torch.Tensor) -> float:
    return float(torch.linalg.norm(a))


def _safe_ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def double_centre(k: torch.Tensor) -> torch.Tensor:
    """`H K H` with `H = I - 11^T/n`: the kernel without its constant mode (rows and columns sum to 0)."""
    k = k - k.mean(dim=0, keepdim=True)
    return k - k.mean(dim=1, keepdim=True)


def _at_init(m64: SuiteNet, init_W: torch.Tensor, x_train: torch.Tensor) -> SuiteNet:
    """The float64 network at its initialisation: `W` reset for a `TwoLayerNet` (its only parameter), a fresh build
    from the spec (same seed, same draw, built like the trained copy and then cast) for the trainable-attention
    variant."""
    if isinstance(m64, TwoLayerNet):
        m0 = copy.deepcopy(m64)
        with torch.no_grad():
            m0.W.copy_(init_W.to(m0.W))
        return m0
    return build_model(m64.spec, x_train, dtype=x_train.dtype, device=str(x_train.device)).double()


def one_run(net: NetworkRequest, k_inf_tt: np.ndarray, f_ntk: np.ndarray, k_inf_st: np.ndarray,
            y_train: np.ndarray, ridge: float) -> dict[str, Any]:
    """Train one network (`net`: its spec, data, training and device) and measure every distance (float64
    kernels)."""
    spec, t = net.spec, net.data
    tr = train_network(spec, t, net.cfg, net.device, net.label)
    m64 = as_float64(tr.model)
    x = t.x_train.double()
    m0 = _at_init(m64, tr.init_W, t.x_train)
    theta_t = empirical_ntk(m64, x)
    n = x.shape[0]
    theta_0s = empirical_ntk(m0, torch.cat([x, t.x_test.double()]), x)  # train and test rows, train columns
    theta_0 = theta_0s[:n]
    k_inf = torch.as_tensor(k_inf_tt, dtype=torch.float64, device=theta_0.device)
    with torch.no_grad():
        f_m = m64(t.x_test.double()).cpu().numpy()
    diff = float(np.linalg.norm(f_m - f_ntk))
    with torch.no_grad():
        f0_train, f0_test = m0(x).cpu().numpy(), m0(t.x_test.double()).cpu().numpy()
    f_lin = f0_test + krr.krr_predict(k_inf_st, krr.krr_fit(k_inf_tt, y_train - f0_train, ridge))
    norms = _frob(theta_0) * _frob(theta_t)
    cos = float((theta_0 * theta_t).sum()) / norms if norms > 0 else float("nan")
    c_0, c_t, c_inf = double_centre(theta_0), double_centre(theta_t), double_centre(k_inf)
    return {
        "width": spec.width,
        "seed": spec.seed,
        "function_abs": diff,
        "function_rel": diff / max(float(np.linalg.norm(f_ntk)), 1e-300),
        "function_lin": float(np.linalg.norm(f_m - f_lin)) / max(float(np.linalg.norm(f_lin)), 1e-300),
        "kernel_drift": _safe_ratio(_frob(theta_t - theta_0), _frob(theta_0)),
        "kernel_distance": 1.0 - cos,
        "init_vs_analytic": _frob(theta_0 - k_inf) / _frob(k_inf),
        "kernel_drift_centred": _safe_ratio(_frob(c_t - c_0), _frob(c_0)),
        "init_vs_analytic_centred": _safe_ratio(_frob(c_0 - c_inf), _frob(c_inf)),
        "empirical_ntk_predictor_test_acc": _acc(krr.krr_predict(theta_0s[n:].cpu().numpy(), krr.krr_fit(
            theta_0.cpu().numpy(), y_train, ridge)), t.y_test.cpu().numpy()),
        "model": spec.kind,
        **{k: v for k, v in tr.training_summary().items() if k != "curve"},
    }


def linearised_change(k_tt: np.ndarray, k_st: np.ndarray, residual: np.ndarray, steps: int, eta: float) -> np.ndarray:
    """Test-output change of the linearised network after `steps` full-batch gradient-descent steps of size `eta`
    on the mean over the n training points of half the squared error, from training residual `residual = Y - f_0(X)`:
    `K_st K^-1 (I - (I - eta K / n)^steps) residual`, through the eigendecomposition of `K` (a zero eigenvalue
    contributes its limit `eta * steps / n`)."""
    n = k_tt.shape[0]
    lam, u = np.linalg.eigh(np.asarray(k_tt, np.float64))
    h = eta / n
    pos = lam > 1e-12 * max(float(lam.max()), 1e-300)
    g = np.where(pos, (1.0 - (1.0 - h * lam) ** steps) / np.where(pos, lam, 1.0), h * steps)
    r = np.asarray(residual, np.float64).reshape(n, -1)
    return np.asarray(k_st, np.float64) @ (u @ (g[:, None] * (u.T @ r)))


def gd_mse_run(net: NetworkRequest, k_tt: np.ndarray, k_st: np.ndarray, y_train: np.ndarray) -> dict[str, Any]:
    """Train `net.spec` on `net.data` under the gd-mse protocol (at most `net.cfg.epochs` steps, its seed; `net.label`
    is not used) and measure `gd_function_change` (module docstring) with its training record and gate as `gd_*`
    fields."""
    from empirics.nets.protocols import GD_MSE, protocol_config

    spec, t, cfg = net.spec, net.data, net.cfg
    tr = train_network(spec, t, protocol_config(GD_MSE, cfg.epochs, seed=cfg.seed), net.device,
                       label=f"{spec.kind} m={spec.width} gd-mse")
    m64 = as_float64(tr.model)
    m0 = _at_init(m64, tr.init_W, t.x_train)
    with torch.no_grad():
        x, xt = t.x_train.double(), t.x_test.double()
        change = (m64(xt) - m0(xt)).cpu().numpy()
        residual = y_train.reshape(x.shape[0], -1) - m0(x).cpu().numpy()
    pred = linearised_change(k_tt, k_st, residual, tr.record.epochs_run, tr.record.lr)
    s = tr.training_summary()
    return {GD_METRIC: float(np.linalg.norm(change - pred)) / max(float(np.linalg.norm(pred)), 1e-300),
            **{f"gd_{k}": s[k] for k in ("train_acc", "test_acc", "train_loss", "epochs_run", "plateau_reached",
                                          "lr", "gate")}}


#: The gd-mse fields of a run without the gd-mse training (`DistanceConfig.gd_mse` off, or the `qkv` variant, whose
#: step size has no closed form here).
GD_ABSENT: dict[str, Any] = {GD_METRIC: float("nan")}


def trend(widths: list[int], values: list[float]) -> dict[str, Any]:
    """Direction of `values` against width: Spearman rho, log-log slope and a one-word verdict.

    Rule (fixed before any run): "decreasing" if every step down or rho <= -0.8; "increasing" if
    every step up or rho >= 0.8; otherwise "non-monotone".
    """
    w = np.asarray(widths, float)
    v = np.asarray(values, float)
    ok = np.isfinite(v)
    w, v = w[ok], v[ok]
    if v.size < 2:
        return {"verdict": NOT_MEASURABLE, "spearman": float("nan"), "loglog_slope": float("nan")}
    rho = float(stats.spearmanr(w, v).statistic) if v.size > 2 else float(np.sign(v[-1] - v[0]))
    pos = v > 0
    slope = float(np.polyfit(np.log(w[pos]), np.log(v[pos]), 1)[0]) if pos.sum() >= 2 else float("nan")
    steps = np.diff(v)
    if np.all(steps < 0) or rho <= -0.8:
        verdict = "decreasing"
    elif np.all(steps > 0) or rho >= 0.8:
        verdict = "increasing"
    else:
        verdict = "non-monotone"
    return {"verdict": verdict, "spearman": rho, "loglog_slope": slope}


def _seed_table(widths: list[int], runs: list[dict[str, Any]], metric: str, seeds: list[int]) -> np.ndarray:
    return np.array([[next((r[metric] for r in runs if r["seed"] == s and r["width"] == wd), np.nan)
                      for wd in widths] for s in seeds], float)


def slope_interval(widths: list[int], runs: list[dict[str, Any]], metric: str, level: float = LEVEL,
                   minus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Log-log slope of `metric` against width: the mean over seeds of each seed's own slope, with a Student-t
    interval over seeds (`empirics.intervals.t_interval`).

    Each seed is one cluster (its own data subset and initialisations at every width), so its least-squares
    slope of log `metric` against log width is one replicate. With `minus` (another model's runs on the same
    seeds) the statistic is the per-seed difference of the two slopes (paired by seed). `per_seed` keeps the
    per-seed values, so the interval can be recomputed from the record.
    """
    seeds = sorted({r["seed"] for r in runs})
    a = _seed_table(widths, runs, metric, seeds)
    b = _seed_table(widths, minus, metric, seeds) if minus is not None else None
    per_seed = [loglog_slope(widths, a[i]) - (loglog_slope(widths, b[i]) if b is not None else 0.0)
                for i in range(len(seeds))]
    ci = t_interval(per_seed, level)
    return {"slope": ci["value"], "ci": [ci["lo"], ci["hi"]], "level": level, "seeds": len(seeds),
            "per_seed": per_seed, "seed_ids": seeds,
            "method": "Student-t interval over seeds of the per-seed least-squares slope of log metric vs log width"
                      + (", difference of two models paired by seed" if b is not None else "")}


def predictor_ridge(k_tt: np.ndarray, n: int, weight_decay: float) -> float:
    """Ridge of the NTK predictor: `n * weight_decay` (what L2 decay on the mean loss corresponds to in the
    linearised model) or, without decay, `1e-3 * trace(K)/n` (a small relative ridge, as for influence)."""
    return n * weight_decay if weight_decay > 0 else 1e-3 * float(np.trace(k_tt)) / n


def reference_kernels(cfg: DistanceConfig, spec: ModelSpec, x_tr: np.ndarray, x_te: np.ndarray, t: Tensors,
                      seed: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """Infinite-width reference kernels (train x train, test x train) of `spec`'s model and the Monte Carlo
    estimate behind them (None where the closed form of Thm 4.2 applies)."""
    if KINDS[spec.kind].reference == MONTE_CARLO:
        mc = mc_reference_kernel(spec, t.x_train, torch.cat([t.x_train, t.x_test]), cfg.reference_draws,
                                 cfg.reference_width, seed)
        k, n = mc.mean, x_tr.shape[0]
        return k[:n, :n], k[n:, :n], mc
    return *analytic_kernels(spec, x_tr, x_te), None


def analytic_features(spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The input map of `spec`'s model in Thm 4.2 (raw inputs, linearized attention with `spec`'s options, or softmax
    attention; the context from the training rows `x_tr`) on the rows `x` of preprocessed inputs. Only for kinds
    with an analytic reference (`empirics.nets.kinds`); any other is an error, never another kind's kernel."""
    return KINDS[spec.kind].strategy.analytic(spec, x_tr, x)


def analytic_kernels(spec: ModelSpec, x_tr: np.ndarray, x_te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The analytic infinite-width NTK of `spec`'s model (`analytic_features`), train x train and test x train, on
    preprocessed inputs. Not for `qkv` (no closed form: `reference_kernels` estimates it)."""
    f_tr, f_te = analytic_features(spec, x_tr, x_tr), analytic_features(spec, x_tr, x_te)
    return kernels.analytic_ntk_two_layer(f_tr, f_tr), kernels.analytic_ntk_two_layer(f_te, f_tr)


#: The kernel predictors' test accuracies `kernel_predictor_accuracy` records on each trained network of the
#: malleability and landscape units (the NTK-distance runs record the first, and the empirical kernel at
#: initialisation as `empirical_ntk_predictor_test_acc`).
KERNEL_PREDICTOR_ACC = ("ntk_predictor_test_acc", "trained_ntk_predictor_test_acc")


#: Analytic-predictor accuracies computed in this process, by data subset (`Tensors.key`), feature map and decay:
#: the networks of one subset (standard and adversarial training, the malleability and landscape units, every width)
#: share one, which for CIFAR-10's attention features (a 3072 x 3072 context) is most of the cost.
_ANALYTIC_ACC: dict[str, float] = {}


def kernel_predictor_accuracy(model: SuiteNet, t: Tensors, weight_decay: float,
                              trained: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """Test accuracy of kernel regression on the network's own training subset and targets (one-hot / +-1), with
    the ridge rule of the NTK-distance predictor (`predictor_ridge` of the kernel fitted): `ntk_predictor_test_acc`
    with the analytic NTK of the model (`analytic_features` of train and test rows in one pass, one context; NaN
    for `qkv`, which has none) and `trained_ntk_predictor_test_acc` with the trained network's own empirical NTK,
    `trained` (train x train, test x train) where the caller has it, else
    `empirics.attribution.influence.model_kernels`. Beside the network's accuracy it says how much of it a kernel
    machine reaches. NaN where the kernel is zero (a dead network: no ridge from its trace) or not finite."""
    y_t = targets(t.y_train, t.out_dim, torch.float64).cpu().numpy()
    y_test = t.y_test.cpu().numpy()
    n = y_t.shape[0]

    def acc(k_tt: np.ndarray, k_st: np.ndarray) -> float:
        ridge = predictor_ridge(k_tt, n, weight_decay)
        if not (ridge > 0 and np.isfinite(k_tt).all() and np.isfinite(k_st).all()):
            return float("nan")  # e.g. a network whose ReLUs all died: its kernel is 0, there is no predictor
        alpha = krr.krr_fit(k_tt, y_t, ridge)
        return _acc(krr.krr_predict(k_st, alpha), y_test)

    spec = model.spec
    key = stable_hash({"data": t.key, "weight_decay": weight_decay, "spec": {
        k: v for k, v in spec.to_dict().items() if k not in ("width", "seed", "parameterization")}}) if t.key else ""
    analytic = _ANALYTIC_ACC.get(key, float("nan"))
    if KINDS[spec.kind].reference == ANALYTIC and key not in _ANALYTIC_ACC:
        x_tr, x_te = preprocessed_inputs(spec, t.x_train.cpu().numpy(), t.x_test.cpu().numpy())
        f = analytic_features(spec, x_tr, np.concatenate([x_tr, x_te]))
        k = kernels.analytic_ntk_two_layer(f, f[:n])
        analytic = acc(k[:n], k[n:])
        if key:
            _ANALYTIC_ACC[key] = analytic
    k_tt, k_st = trained if trained is not None else model_kernels(model, t.x_train, t.x_test)
    return dict(zip(KERNEL_PREDICTOR_ACC, (analytic, acc(k_tt, k_st)), strict=True))


def base_spec(cfg: DistanceConfig, ds: Any, t: Tensors, kind: str, seed: int) -> ModelSpec:
    """`kind`'s network on seed `seed`'s data, at width 1 (each run of the sweep sets its own width)."""
    return ModelSpec(kind, ds.d, 1, t.out_dim, cfg.parameterization, cfg.attn_layers, cfg.attn_rank, seed,
                     cfg.attn_centre, preprocess=cfg.preprocess, channels=input_channels(ds))


def distance_networks(cfg: DistanceConfig, ds: Any, t: Tensors, device: str, seed: int) -> list[NetworkRequest]:
    """The networks `one_run` trains for seed `seed`: every model at every width."""
    return [NetworkRequest(replace(base_spec(cfg, ds, t, kind, seed), width=width), t, replace(cfg.train, seed=seed),
                           device) for kind in cfg.models for width in cfg.widths]


def _seed_networks(cfg: DistanceConfig, dataset: Any | None, seed: int) -> list[NetworkRequest]:
    ds, t, device = experiment_data(cfg, dataset, seed)
    return distance_networks(cfg, ds, t, device, seed)


def distance_seed(cfg: DistanceConfig, dataset: Any | None, seed: int) -> dict[str, Any]:
    """One seed of the width sweep: its data subset, the analytic-NTK predictor on it, and every width's run (its
    networks trained together by the batched engine, or found trained by `run_ntk_distance`)."""
    ds, t, device = experiment_data(cfg, dataset, seed)
    train_networks(distance_networks(cfg, ds, t, device, seed))
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in cfg.models}
    norms: dict[str, float] = {}
    refs: dict[str, dict[str, Any]] = {}
    ridges: list[float] = []
    y_t = targets(t.y_train, t.out_dim, torch.float64).cpu().numpy()
    for kind in cfg.models:
        spec0 = base_spec(cfg, ds, t, kind, seed)
        x_tr, x_te = preprocessed_inputs(spec0, ds.x_train, ds.x_test)  # the analytic kernels see what the net sees
        k_tt, k_st, mc = reference_kernels(cfg, spec0, x_tr, x_te, t, seed)
        ridge = predictor_ridge(k_tt, ds.x_train.shape[0], cfg.train.weight_decay)
        ridges.append(ridge)
        f_ntk = krr.krr_predict(k_st, krr.krr_fit(k_tt, y_t, ridge))
        norms[kind] = float(np.linalg.norm(f_ntk))
        refs[kind] = {"kind": "analytic", "estimand": "Thm 4.2 closed form on the model's features"} if mc is None \
            else {**mc.summary(), "predictor_se": predictor_jackknife_se(mc, x_tr.shape[0], y_t, ridge),
                  "predictor_norm": norms[kind]}
        for width in cfg.widths:
            net = NetworkRequest(replace(spec0, width=width), t, replace(cfg.train, seed=seed), device)
            twin = cfg.gd_mse and not KINDS[kind].trains_attention
            gd = gd_mse_run(net, k_tt, k_st, y_t) if twin else GD_ABSENT
            runs[kind].append({**one_run(net, k_tt, f_ntk, k_st, y_t, ridge),
                               "ntk_predictor_test_acc": _acc(f_ntk, ds.y_test), **gd})
    return {"seed": seed, "runs": runs, "norms": norms, "refs": refs, "ridges": ridges, "provenance": ds.provenance,
            "device": device}


@dataclass(frozen=True)
class Trend(Record):
    """Direction of one metric against width (`trend` of the seed means), how many seeds agree with it, and the
    seed-level t interval of its log-log slope (`slope_interval`)."""

    verdict: str
    spearman: float
    loglog_slope: float
    seeds_agreeing: int
    seeds: int
    slope_interval: dict[str, Any]


@dataclass(frozen=True)
class DistanceModel(Record):
    """One model's block of a distance record: its runs (one dict per width and seed, `one_run`), the spread over
    seeds (`empirics.common.spread`) of every metric per width (keyed by the width as a string), the trends, the
    reference kernel of each seed and the NTK predictor's norm and test accuracy."""

    runs: list[dict[str, Any]]
    per_width: dict[str, dict[str, dict[str, Any]]]
    trends: dict[str, Trend]
    reference: list[dict[str, Any]]
    ntk_predictor_norm: float
    ntk_predictor_test_acc: dict[str, Any]

    def spread(self, width: int, metric: str) -> dict[str, Any]:
        """The spread over seeds of `metric` at `width` (`ntkm.tables.at_width`, the one reader of the table)."""
        return tables.at_width(self.per_width, width, metric)

    def mean(self, width: int, metric: str) -> float:
        """The mean over seeds of `metric` at `width`."""
        return self.spread(width, metric)["mean"]

    def widths(self) -> list[int]:
        """The widths of the sweep, ascending."""
        return tables.widths(self.per_width)


@dataclass(frozen=True)
class DistanceRecord(HasRunHeader, Record):
    """The result of `run_ntk_distance`, stored as the unit cache's payload and in claims.json."""

    models: dict[str, DistanceModel]
    experiment: str
    config: dict[str, Any]
    ridge: float
    ridge_rule: str
    parameterization: str
    data: dict[str, Any]
    versions: dict[str, Any]
    device: dict[str, Any]
    wall_s: float


def run_ntk_distance(cfg: DistanceConfig, dataset: Any | None = None,
                     seed_map: SeedMap = local_map) -> DistanceRecord:
    """The width sweep: a record with per-run values, spreads, trends and slope intervals (its values as the cache
    reads them back: lists, not tuples).

    With `per_seed_data` every seed draws its own data subset; the analytic-NTK predictor is fitted on
    that seed's subset. `seed_map` runs the seeds (`distance_seed`), here or elsewhere; here, the networks of
    every seed are first trained together (`empirics.common.train_seeds_together`).
    """
    t0 = time.perf_counter()
    train_seeds_together(seed_map, cfg.seeds, partial(_seed_networks, cfg, dataset))
    parts = seed_map(partial(distance_seed, cfg, dataset), cfg.seeds)
    runs = {kind: [r for part in parts for r in part["runs"][kind]] for kind in cfg.models}
    norms = {kind: [part["norms"][kind] for part in parts] for kind in cfg.models}
    ridges = [r for part in parts for r in part["ridges"]]
    device = parts[-1]["device"]
    results: dict[str, Any] = {"models": {}}
    for kind in cfg.models:
        rk = runs[kind]
        per_width: dict[str, Any] = {}
        for width in cfg.widths:
            rs = [r for r in rk if r["width"] == width]
            per_width[str(width)] = {k: spread([r[k] for r in rs])
                                     for k in METRICS + ("train_acc", "test_acc", "epochs_run", "rel_weight_change")}
        trends = {}
        for metric in METRICS:
            means = [tables.at_width(per_width, w, metric)["mean"] for w in cfg.widths]
            tr = trend(list(cfg.widths), means)
            seed_verdicts = [trend(list(cfg.widths), [r[metric] for r in rk if r["seed"] == s])["verdict"]
                             for s in cfg.seeds]
            tr["seeds_agreeing"] = sum(v == tr["verdict"] for v in seed_verdicts)
            tr["seeds"] = len(cfg.seeds)
            tr["slope_interval"] = slope_interval(list(cfg.widths), rk, metric)
            trends[metric] = tr
        results["models"][kind] = {"runs": rk, "per_width": per_width, "trends": trends,
                                   "reference": [part["refs"][kind] for part in parts],
                                   "ntk_predictor_norm": float(np.mean(norms[kind])),
                                   "ntk_predictor_test_acc": spread([r["ntk_predictor_test_acc"] for r in rk])}
    results.update({
        "experiment": "ntk-distance",
        "config": asdict(cfg),
        "ridge": float(np.mean(ridges)),
        "ridge_rule": "n * weight_decay" if cfg.train.weight_decay > 0 else "1e-3 * trace(K_inf) / n",
        "parameterization": cfg.parameterization,
        "data": subset_provenance({part["seed"]: part["provenance"] for part in parts}),
        **run_header(device),
        "wall_s": time.perf_counter() - t0,
    })
    return DistanceRecord.from_dict(encode(results))


def _acc(f: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of a predictor's outputs (one-hot argmax, or the sign of one output)."""
    pred = (f[:, 0] > 0).astype(int) if f.shape[1] == 1 else f.argmax(axis=1)
    return float(np.mean(pred == np.asarray(y)))
