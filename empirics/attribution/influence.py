"""NTK leave-one-out influence with the trained network's empirical kernel (docs/PAPER.md, "Influence
malleability").

Definitions (fixed here; the paper leaves them open):

- Kernel: `K_m`, the per-output ("mean" reduction) empirical NTK of the *trained* network, computed in
  float64 with the closed form of `empirics.kernels.ntk`. For MLP-Attn the attention context `C` is rebuilt
  in float64 from the training inputs passed in (so clean and perturbed training sets are treated the
  same way, and a perturbed training set changes the features of every train and test point).
- Predictor: kernel ridge regression with `K_m` on the training targets (one-hot for 10 classes, +-1
  for the binary tasks, `empirics.nets.losses.targets`): `f(x) = k(x)^T (K_m + lambda I)^-1 Y`.
- Ridge `lambda`: by default relative, `lambda = ridge_rel * trace(K_m) / n` with `ridge_rel = 1e-3`,
  i.e. 0.1 % of the average kernel diagonal. A relative ridge is scale-free: 2L-ReLU kernels on raw
  pixels have diagonals of order `||x||^2` (tens to hundreds) while MLP-Attn features are unit
  vectors (diagonal about 1/2), so one absolute value (e.g. `n * weight_decay`) would regularise the
  two models very differently and bias the comparison. An absolute `ridge` can be passed instead.
- Loss: squared error summed over outputs, `L_t(f) = sum_c (f_c(x_t) - y_tc)^2` (no factor 1/2), the
  loss of the kernel predictor that the leave-one-out formula is exact for.
- Influence and its sign: `influence[i, t] = L_t(f_-i) - L_t(f)`, where `f_-i` is the kernel predictor
  refitted without training point i, from the closed form `f_-i(x) = f(x) - (k(x)^T M[:, i]) alpha_i / M_ii`
  (`M = (K_m + lambda I)^-1`, no retraining; see `theory.krr`). **Positive: removing i raises the test
  loss, so i is helpful; negative: i is harmful.** The total influence of i is the sum over the test
  set, `total[i] = sum_t influence[i, t]` (the aggregate the flip rate uses).

Writing `r_t = f(x_t) - y_t` and `d_it = P[t, i] alpha_i / M_ii` with `P = K_test_train M`, the
influence is `-2 <r_t, d_it> + ||d_it||^2`, evaluated for all (i, t) at once without forming the
(n_train, n_test, c) array of leave-one-out predictions.

`retrain_study` checks the whole construction against what it approximates: it retrains a wide
2L-ReLU network from the same initialisation without each of several training points and compares
the actual change of the network's test loss with the predicted influence.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import torch
from scipy import stats
from torch import nn

from empirics.kernels.ntk import empirical_ntk
from empirics.nets.losses import loss_fn, predict_labels, targets
from empirics.nets.protocols import PROPER
from empirics.records import HasRunHeader
from ntkm.codec import Record, encode
from ntkm.errors import UserInputError

RIDGE_REL_DEFAULT = 1e-3
RIDGE_FLOOR = 1e-12
#: One split of a data set as (inputs, labels): how `influence_scores` takes its training and test sets.
LabelledSplit = tuple[torch.Tensor, torch.Tensor]


@dataclass
class InfluenceResult:
    """Influence of every training point on every test point, and what it was computed from.

    per_test: (n_train, n_test) `L_t(f_-i) - L_t(f)`; total: (n_train,) its sum over the test set.
    predictions: (n_test, c) kernel-predictor outputs; test_loss: mean over test points of `L_t(f)`;
    test_acc: accuracy of the kernel predictor's labels.
    """

    per_test: np.ndarray
    total: np.ndarray
    ridge: float
    predictions: np.ndarray
    test_loss: float
    test_acc: float

    @property
    def n_train(self) -> int:
        return int(self.per_test.shape[0])


def resolve_ridge(K: np.ndarray, ridge: float | None = None, ridge_rel: float = RIDGE_REL_DEFAULT) -> float:
    """The absolute ridge: `ridge` if given, else `ridge_rel * trace(K) / n`."""
    if ridge is not None:
        if not np.isfinite(ridge) or ridge < 0:
            raise UserInputError(f"ridge must be a finite number >= 0, got {ridge}")
        return float(ridge)
    if not np.isfinite(ridge_rel) or ridge_rel <= 0:
        raise UserInputError(f"relative ridge must be a finite number > 0, got {ridge_rel}")
    # floor: a network whose ReLUs all died has K = 0; its influences are then all 0 (no sign to flip)
    return max(float(ridge_rel * np.trace(K) / K.shape[0]), RIDGE_FLOOR)


@dataclass(frozen=True)
class Ridge:
    """The ridge of a kernel solve: `value` (absolute) when given, else `rel * trace(K) / n` (`resolve_ridge`)."""

    value: float | None = None
    rel: float = RIDGE_REL_DEFAULT

    def resolve(self, K: np.ndarray) -> float:
        """The absolute ridge for training kernel `K`."""
        return resolve_ridge(K, self.value, self.rel)


def _as_2d(Y: np.ndarray) -> np.ndarray:
    Y = np.asarray(Y, dtype=np.float64)
    return Y[:, None] if Y.ndim == 1 else Y


def kernel_influence(K: np.ndarray, Y: np.ndarray, ridge: float, K_test_train: np.ndarray,
                     Y_test: np.ndarray, device: torch.device | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form leave-one-out influence `L_t(f_-i) - L_t(f)`, shape (n_train, n_test), and `f(X_test)`.

    `K` (n, n) is the training kernel, `Y` (n, c) or (n,) the training targets, `K_test_train`
    (n_test, n), `Y_test` the test targets. Float64, Cholesky of `K + ridge I`: with scipy on the host, or, with
    `device`, in torch on that device (the same formulas, equal to float64 rounding; on a GPU the n^3 inverse takes
    milliseconds where the host took seconds at n = 6,000).
    """
    K = np.asarray(K, dtype=np.float64)
    Kt = np.asarray(K_test_train, dtype=np.float64)
    Y2, Yt = _as_2d(Y), _as_2d(Y_test)
    n = K.shape[0]
    if K.shape != (n, n) or Kt.shape[1] != n or Y2.shape[0] != n or Yt.shape[0] != Kt.shape[0]:
        raise UserInputError(f"inconsistent shapes K {K.shape}, K_test_train {Kt.shape}, Y {Y2.shape}, "
                             f"Y_test {Yt.shape}; pass (n, n), (n_test, n), (n, c), (n_test, c)")
    not_pd = UserInputError(f"K + ridge*I is not positive definite (ridge={ridge:.3g}); use a larger ridge")
    if device is not None:
        Kd, Ktd, Y2d, Ytd = (torch.as_tensor(a, device=device) for a in (K, Kt, Y2, Yt))
        L, info = torch.linalg.cholesky_ex((Kd + Kd.T) / 2 + ridge * torch.eye(n, dtype=Kd.dtype, device=device))
        if int(info) != 0:
            raise not_pd
        M = torch.cholesky_inverse(L)
        per_test, F = _loo(M, Y2d, Ktd, Ytd, torch.diagonal(M))
        return per_test.cpu().numpy(), F.cpu().numpy()
    A = (K + K.T) / 2 + ridge * np.eye(n)
    try:
        factor = scipy.linalg.cho_factor(A, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise not_pd from None
    M = scipy.linalg.cho_solve(factor, np.eye(n), check_finite=False)
    return _loo(M, Y2, Kt, Yt, np.diag(M))


def _loo(M: Any, Y: Any, Kt: Any, Yt: Any, diag: Any) -> tuple[Any, Any]:
    """The leave-one-out influence and test predictions from `M = (K + ridge I)^-1` (numpy or torch alike)."""
    M = (M + M.T) / 2
    alpha = M @ Y
    F = Kt @ alpha
    R = F - Yt
    P = Kt @ M
    coef = alpha / diag[:, None]
    per_test = -2.0 * P.T * (coef @ R.T) + P.T**2 * (coef**2).sum(1)[:, None]
    return per_test, F


def influence_from_kernels(kernels: tuple[np.ndarray, np.ndarray], Y: np.ndarray, Y_test: np.ndarray,
                           y_test_labels: np.ndarray | None = None, reg: Ridge = Ridge(),
                           device: torch.device | None = None) -> InfluenceResult:
    """`InfluenceResult` from precomputed kernels `(K, K_test_train)` and targets (see the module docstring), with
    the ridge `reg`; `device`: where the solve runs (`kernel_influence`; None: scipy on the host)."""
    K, K_test_train = kernels
    lam = reg.resolve(K)
    per_test, F = kernel_influence(K, Y, lam, K_test_train, Y_test, device)
    Yt = _as_2d(Y_test)
    loss = float(np.mean(np.sum((F - Yt) ** 2, axis=1)))
    acc = float("nan")
    if y_test_labels is not None:
        pred = predict_labels(torch.as_tensor(F)).numpy()
        acc = float(np.mean(pred == np.asarray(y_test_labels)))
    return InfluenceResult(per_test, per_test.sum(axis=1), lam, F, loss, acc)


def output_dim(model: nn.Module, x: torch.Tensor) -> int:
    """Number of network outputs (from the spec of a `TwoLayerNet`, else one forward pass)."""
    spec = getattr(model, "spec", None)
    if spec is not None and hasattr(spec, "out_dim"):
        return int(spec.out_dim)
    with torch.no_grad():
        return int(model(x[:1]).shape[1])


def model_kernels(model: nn.Module, x_train: torch.Tensor,
                  x_test: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Float64 empirical NTKs `K_m(X_train, X_train)` and `K_m(X_test, X_train)` ("mean" reduction).

    For MLP-Attn the context is rebuilt from `x_train` on a float64 copy (the caller's model is not
    touched), so every feature, train and test, reflects the training set passed in. Both blocks come
    from one kernel over the joint set, so features are computed once.
    """
    m64 = copy.deepcopy(model).double()
    xtr = x_train.detach().to(dtype=torch.float64)
    xte = x_test.detach().to(dtype=torch.float64)
    if hasattr(m64, "set_context"):
        m64.set_context(xtr)
    n = xtr.shape[0]
    joint = empirical_ntk(m64, torch.cat([xtr, xte]), None, "mean").cpu().numpy()
    return joint[:n, :n].copy(), joint[n:, :n].copy()


def influence_scores(model: nn.Module, train: LabelledSplit, test: LabelledSplit, reg: Ridge = Ridge(),
                     kernels: tuple[np.ndarray, np.ndarray] | None = None) -> InfluenceResult:
    """NTK leave-one-out influence of each training point on each test point (and summed); `train` and `test` are
    (inputs, labels).

    The kernel is the trained network's empirical NTK (float64; `kernels`, `model_kernels(model, x_train, x_test)`,
    where the caller has computed it already); targets are one-hot or +-1 as in training. `reg.value` is an absolute
    ridge; when None it is `reg.rel * trace(K_m) / n`. The solve runs where the training inputs are when that is a
    GPU (`solve_device`), else with scipy on the host (so every CPU result is unchanged).
    """
    (x_train, y_train), (x_test, y_test) = train, test
    out_dim = output_dim(model, x_train)
    K, Kst = kernels if kernels is not None else model_kernels(model, x_train, x_test)
    Y = targets(y_train.cpu(), out_dim, torch.float64).numpy()
    Yt = targets(y_test.cpu(), out_dim, torch.float64).numpy()
    return influence_from_kernels((K, Kst), Y, Yt, y_test.cpu().numpy(), reg, solve_device(x_train))


def solve_device(x: torch.Tensor) -> torch.device | None:
    """Where the kernel solves for inputs `x` run: their device when it is a GPU (float64 Cholesky there), None
    (scipy on the host) for CPU tensors."""
    return x.device if x.device.type == "cuda" else None


# --------------------------------------------------------------------------------------------------
# Predicted influence against actual retraining


@dataclass(frozen=True)
class RetrainConfig:
    """Sizes of the retraining study (binary task: one output, MSE against +-1, as in training).

    The network is a wide 2L-ReLU trained by full-batch gradient descent without weight decay, close
    to the linear (lazy) regime; `centered` subtracts the output at initialisation so that the
    network starts at f = 0 like the kernel predictor. `ridge=None` matches the ridge to the
    training time, `lambda = n / (lr * steps)` (gradient flow on the mean loss for time `lr * steps`
    filters eigen-directions of `K/n` like a ridge of that size). `pool` average-pools images by
    that factor per side before training (1 keeps full resolution). All leave-one-out networks are
    trained at once as one batched computation (`dtype` float32 by default: the runs share every
    operation but the removed point, so rounding does not decorrelate them). Removed points are
    `n_remove` training points at evenly spaced ranks of the predicted total influence, so that both
    signs and the whole range are covered.
    """

    dataset: str = "mnist"
    task: str = "binary"
    n_train: int = 80
    n_test: int = 100
    width: int = 4096
    steps: int = 400
    lr: float | None = None
    n_remove: int = 20
    centered: bool = True
    ridge: float | None = None
    pool: int = 2
    dtype: str = "float32"
    seed: int = 0
    data_seed: int = 0
    data_dir: str | None = None


def _pool(x: np.ndarray, shape: tuple[int, ...], k: int) -> np.ndarray:
    if k == 1:
        return x
    c, h, w = shape
    hh, ww = h // k, w // k
    img = x.reshape(-1, c, h, w)[:, :, : hh * k, : ww * k]
    return img.reshape(-1, c, hh, k, ww, k).mean(axis=(3, 5)).reshape(x.shape[0], -1)


def _gd_batched(W: torch.Tensor, A: torch.Tensor, train: tuple[torch.Tensor, torch.Tensor], keep: torch.Tensor,
                lr: float, steps: int) -> torch.Tensor:
    """Full-batch GD for B networks at once, each on the mean of `(f - y)^2 / 2` over its own points.

    `W` (B, m, d) are the initial first-layer weights, `A` (m, c) the fixed output layer, `train` the (inputs x,
    targets y) of all n training points, `keep` (B, n) a 0/1 mask of the training points each network sees.
    Returns the trained weights.
    """
    x, y = train
    W = W.clone().requires_grad_(True)
    weight = (keep / keep.sum(dim=1, keepdim=True))[:, :, None]
    scale = A.shape[0] ** -0.5
    for _ in range(steps):
        h = (x @ W.reshape(-1, W.shape[2]).T).reshape(x.shape[0], W.shape[0], -1).transpose(0, 1)
        out = torch.relu(h) @ A * scale
        (grad,) = torch.autograd.grad(0.5 * (weight * (out - y) ** 2).sum(), W)
        with torch.no_grad():
            W -= lr * grad
    return W.detach()


def retrain_study(cfg: RetrainConfig) -> dict[str, Any]:
    """Compare predicted NTK influence with the actual change of test loss after retraining.

    Returns per-point predicted and actual values, Pearson and Spearman correlations, the fraction
    of points where the signs agree, and the kernel predictor's agreement with the network.
    """
    from empirics.data.datasets import DataRequest, load_dataset
    from empirics.nets.models import ModelSpec, build_model
    from empirics.records import library_versions

    t0 = time.perf_counter()
    ds = load_dataset(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test,
                      request=DataRequest(task=cfg.task, seed=cfg.data_seed, data_dir=cfg.data_dir))
    out_dim = 1 if cfg.task == "binary" else ds.num_classes
    dt = torch.float64 if cfg.dtype == "float64" else torch.float32
    xtr = torch.as_tensor(_pool(ds.x_train, ds.image_shape, cfg.pool), dtype=dt)
    xte = torch.as_tensor(_pool(ds.x_test, ds.image_shape, cfg.pool), dtype=dt)
    ytr, yte = torch.as_tensor(ds.y_train), torch.as_tensor(ds.y_test)
    Y, Yt = targets(ytr, out_dim, dt), targets(yte, out_dim, dt)
    n = xtr.shape[0]
    spec = ModelSpec("relu", xtr.shape[1], cfg.width, out_dim, seed=cfg.seed)
    net = build_model(spec, dtype=dt)
    W0, A = net.W.detach().clone(), net.A
    k0 = empirical_ntk(copy.deepcopy(net).double(), xtr.double(), None, "mean").numpy()
    lr = cfg.lr if cfg.lr is not None else float(n / np.linalg.eigvalsh(k0)[-1])
    ridge = cfg.ridge if cfg.ridge is not None else n / (lr * cfg.steps)
    with torch.no_grad():
        f0_tr, f0_te = (net(xtr), net(xte)) if cfg.centered else (0.0, 0.0)

    def fit(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Test outputs (centred: minus f at initialisation) and weights of networks trained on each row
        of `keep`."""
        W = _gd_batched(W0.expand(keep.shape[0], -1, -1), A, (xtr, Y + f0_tr), keep.to(dt), lr, cfg.steps)
        with torch.no_grad():
            return torch.relu(xte @ W.transpose(1, 2)) @ A * cfg.width**-0.5 - f0_te, W

    def test_loss(f: torch.Tensor) -> np.ndarray:
        return ((f - Yt) ** 2).sum(dim=(1, 2)).double().numpy()

    f_full, W_full = fit(torch.ones(1, n, device=xtr.device))
    with torch.no_grad():
        net.W.copy_(W_full[0])
    infl = influence_scores(net, (xtr, ytr), (xte, yte), Ridge(ridge))
    loss_full = float(test_loss(f_full)[0])
    order = np.argsort(infl.total)
    picks = order[np.unique(np.linspace(0, n - 1, min(cfg.n_remove, n)).round().astype(int))]
    keep = torch.ones(len(picks), n, device=xtr.device)
    keep[torch.arange(len(picks), device=keep.device), torch.as_tensor(picks, device=keep.device)] = 0.0
    f_loo, _ = fit(keep)
    act = test_loss(f_loo) - loss_full
    pred = infl.total[picks]
    points = [{"index": int(i), "predicted": float(p), "actual": float(a)}
              for i, p, a in zip(picks, pred, act, strict=True)]
    f_net = f_full[0].double().numpy()
    return {
        "experiment": "influence-retrain-study",
        "config": asdict(cfg),
        "lr": lr,
        "ridge": ridge,
        "d": int(xtr.shape[1]),
        "pearson": float(stats.pearsonr(pred, act).statistic),
        "spearman": float(stats.spearmanr(pred, act).statistic),
        "sign_agreement": float(np.mean(np.sign(pred) == np.sign(act))),
        "kernel_vs_network_rel": float(np.linalg.norm(infl.predictions - f_net) / np.linalg.norm(f_net)),
        "network_test_loss": loss_full / len(yte),
        "kernel_test_loss": infl.test_loss,
        "points": points,
        "data": ds.provenance,
        "versions": library_versions(),
        "wall_s": time.perf_counter() - t0,
    }


@dataclass(frozen=True)
class RetrainSetting:
    """The network, data and protocol of a retraining study (`ProtocolRetrainConfig`, and
    `empirics.experiments.retrain_flip.RetrainFlipConfig`): `model` trained under the named `protocol` for at most
    `epochs` on `n_train` points of `dataset`, with the networks' fixed input layer `preprocess` (`lr_power`: the
    exponent of the width-consistent protocol's schedule where not its primary one, the schedule axis)."""

    dataset: str = "mnist"
    task: str = "10class"
    model: str = "relu"
    n_train: int = 100
    n_test: int = 100
    width: int = 512
    protocol: str = PROPER
    epochs: int = 1000
    ridge_rel: float = RIDGE_REL_DEFAULT
    data_seed: int = 0
    data_dir: str | None = None
    device: str = "auto"
    preprocess: str = "raw"
    lr_power: float | None = None


@dataclass(frozen=True)
class ProtocolRetrainConfig(RetrainSetting):
    """The retraining check in the claims' own setting: either network, trained under a named protocol.

    The network is trained on `n_train` points (10 classes, full resolution unless `pool` > 1); then for
    `n_remove` points at evenly spaced ranks of the predicted total influence it is retrained from the
    *same initialisation* with the same protocol and seed but without that point (for MLP-Attn the
    point also leaves the attention context, as it would in a real removal). The actual change of the
    network's test loss (squared error to one-hot / +-1 targets, the loss the influence is defined on)
    is compared with the NTK leave-one-out prediction from the trained network's empirical kernel.
    `preprocess` is the networks' fixed input layer; every refit keeps the full training set's statistics (the
    preprocessing is part of the pipeline, fixed before training, not of what a removal changes).
    """

    epochs: int = 600
    n_remove: int = 12
    pool: int = 1
    seed: int = 0


def _bootstrap_corr(pred: np.ndarray, act: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Pearson and Spearman with 95 % percentile bootstrap intervals over the removed points."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name, fn in (("pearson", stats.pearsonr), ("spearman", stats.spearmanr)):
        if np.ptp(pred) == 0 or np.ptp(act) == 0:
            out[name] = {"value": float("nan"), "ci": [float("nan"), float("nan")]}
            continue
        point = float(fn(pred, act).statistic)
        boots = []
        for _ in range(n_boot):
            idx = rng.integers(0, len(pred), len(pred))
            if np.ptp(pred[idx]) > 0 and np.ptp(act[idx]) > 0:
                boots.append(float(fn(pred[idx], act[idx]).statistic))
        lo, hi = np.quantile(boots, [0.025, 0.975]) if boots else (np.nan, np.nan)
        out[name] = {"value": point, "ci": [float(lo), float(hi)]}
    return out


#: The estimands `protocol_retrain_study` compares with retraining, each predicted quantity against the actual change
#: of the loss it predicts (`ESTIMAND_LOSS`): the paper's, the same with the initial function removed, and the loss
#: the network is trained with.
ESTIMANDS = ("paper", "initial-removed", "training-loss")
ESTIMAND_LOSS = {"paper": "squared", "initial-removed": "squared", "training-loss": "training"}
PREDICTED = {
    "paper": "NTK leave-one-out of kernel regression with the trained kernel on one-hot / +-1 targets, squared loss",
    "initial-removed": "the same on the residual targets y - f0 with f0 (the network at initialisation) added back to "
                       "the predictor, the linearised network's own leave-one-out",
    "training-loss": "Gauss-Newton influence on the loss the network is trained with (cross-entropy: residuals "
                     "softmax - one-hot; squared loss: f - y) with the trained kernel, damping = the leave-one-out "
                     "ridge (empirics.attribution.gauss_newton.gn_influence_mean)",
}
ACTUAL = {"squared": "change of the retrained network's summed squared error to the targets on the test set",
          "training": "change of the retrained network's summed training loss (cross-entropy, or the squared loss "
                      "under gd-mse) on the test set"}


@dataclass(frozen=True)
class SplitAtInit:
    """One split as `matched_predictions` reads it: inputs, labels, and the network's outputs on them at
    initialisation (the initial function the `initial-removed` estimand takes out)."""

    x: torch.Tensor
    y: torch.Tensor
    f0: np.ndarray


def matched_predictions(net: nn.Module, kernels: tuple[np.ndarray, np.ndarray], train: SplitAtInit,
                        test: SplitAtInit, ridge: float, loss: str) -> dict[str, np.ndarray]:
    """Predicted total influence (n,) of every training point under each of `ESTIMANDS`, from the trained network's
    kernels; `train.f0` and `test.f0` are the network's outputs at initialisation, `loss` its training loss
    (`TrainConfig.loss`)."""
    from empirics.attribution.gauss_newton import gn_influence_mean, loss_residuals

    x, y, f0_train = train.x, train.y, train.f0
    xt, yt, f0_test = test.x, test.y, test.f0
    K, Kt = kernels
    c = f0_train.shape[1]
    Y = targets(y.cpu(), c, torch.float64).numpy()
    Yt = targets(yt.cpu(), c, torch.float64).numpy()
    with torch.no_grad():
        out, out_t = net(x), net(xt)
    paper, _ = kernel_influence(K, Y, ridge, Kt, Yt)
    centred, _ = kernel_influence(K, Y - f0_train, ridge, Kt, Yt - f0_test)
    gn = gn_influence_mean(K, Kt, loss_residuals(out, y.cpu(), loss), loss_residuals(out_t, yt.cpu(), loss), ridge)
    return {"paper": paper.sum(axis=1), "initial-removed": centred.sum(axis=1), "training-loss": gn.sum(axis=1)}


@dataclass(frozen=True)
class RetrainRecord(HasRunHeader, Record):
    """The result of `protocol_retrain_study`: the network's training and gate, the correlation of predicted
    influence with the actual change of the test loss after retraining (`value` and bootstrap `ci` of each: the
    paper's estimand), the removed points, and every estimand of `ESTIMANDS` against the loss it predicts."""

    experiment: str
    config: dict[str, Any]
    model: str
    training: dict[str, Any]
    pearson: dict[str, Any]
    spearman: dict[str, Any]
    sign_agreement: float
    points: list[dict[str, Any]]
    data: dict[str, Any]
    versions: dict[str, Any]
    device: dict[str, Any]
    wall_s: float
    estimands: list[dict[str, Any]] = field(default_factory=list)


def protocol_retrain_study(cfg: ProtocolRetrainConfig) -> RetrainRecord:
    """Predicted NTK-LOO influence against actual leave-one-out retraining under a training protocol (its values
    as the cache reads them back)."""
    from empirics.common import dataset_tensors
    from empirics.data.datasets import DataRequest, load_dataset
    from empirics.nets.engine import train_many
    from empirics.nets.models import ModelSpec, build_model, input_channels
    from empirics.nets.protocols import adequacy, chance_accuracy, protocol_config
    from empirics.records import pick_device, run_header

    t0 = time.perf_counter()
    device = pick_device(cfg.device)
    ds = load_dataset(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test,
                      request=DataRequest(task=cfg.task, seed=cfg.data_seed, data_dir=cfg.data_dir))
    t = dataset_tensors(ds, device)
    xtr = torch.as_tensor(_pool(ds.x_train, ds.image_shape, cfg.pool), dtype=torch.float32, device=device)
    xte = torch.as_tensor(_pool(ds.x_test, ds.image_shape, cfg.pool), dtype=torch.float32, device=device)
    spec = ModelSpec(cfg.model, xtr.shape[1], cfg.width, t.out_dim, seed=cfg.seed, preprocess=cfg.preprocess,
                     channels=input_channels(ds))
    tcfg = protocol_config(cfg.protocol, cfg.epochs, seed=cfg.seed, dataset=cfg.dataset, preprocess=cfg.preprocess,
                           lr_power=cfg.lr_power)
    Yt = targets(t.y_test, t.out_dim, torch.float64).cpu().numpy()

    def fit(keeps: list[np.ndarray]) -> list[tuple[nn.Module, Any]]:
        """Networks trained on each subset of the training set, together (`empirics.nets.engine.train_many`: the same
        weights and records as training them one by one)."""
        jobs = []
        for keep in keeps:
            kt = torch.as_tensor(keep, device=device)
            net = build_model(spec, xtr[kt], device=device, reference=xtr)  # input statistics of the full set
            jobs.append((net, xtr[kt], t.y_train[kt], tcfg, xte, t.y_test, f"retrain {cfg.model}"))
        return [(job[0], rec) for job, rec in zip(jobs, train_many(jobs), strict=True)]

    train_loss = loss_fn(t.out_dim, tcfg.loss)

    def losses(net: nn.Module) -> dict[str, float]:
        """The network's summed test losses: squared error to the targets, and the loss it is trained with."""
        with torch.no_grad():
            out = net(xte)
            return {"squared": float(((out.double().cpu().numpy() - Yt) ** 2).sum()),
                    "training": float(train_loss(out, t.y_test).double().sum())}

    n = xtr.shape[0]
    with torch.no_grad():  # the network's function at initialisation (every refit starts from these weights)
        init = build_model(spec, xtr, device=device, reference=xtr)
        f0_tr, f0_te = init(xtr).double().cpu().numpy(), init(xte).double().cpu().numpy()
    ((net, rec),) = fit([np.arange(n)])
    kernels = model_kernels(net, xtr, xte)
    infl = influence_scores(net, (xtr, t.y_train), (xte, t.y_test), Ridge(rel=cfg.ridge_rel), kernels=kernels)
    base = losses(net)
    order = np.argsort(infl.total)
    picks = order[np.unique(np.linspace(0, n - 1, min(cfg.n_remove, n)).round().astype(int))]
    refits = [losses(m) for m, _ in fit([np.setdiff1d(np.arange(n), [i]) for i in picks])]
    act = {name: np.array([r[name] - base[name] for r in refits]) for name in base}
    preds = matched_predictions(net, kernels, SplitAtInit(xtr, t.y_train, f0_tr), SplitAtInit(xte, t.y_test, f0_te),
                                infl.ridge, tcfg.loss)
    pred = infl.total[picks]
    estimands = [{"name": name, "predicted": PREDICTED[name], "actual": ACTUAL[ESTIMAND_LOSS[name]],
                  **_bootstrap_corr(preds[name][picks], act[ESTIMAND_LOSS[name]]),
                  "sign_agreement": float(np.mean(np.sign(preds[name][picks]) == np.sign(act[ESTIMAND_LOSS[name]]))),
                  "values": [[float(p), float(a)] for p, a in zip(preds[name][picks], act[ESTIMAND_LOSS[name]],
                                                                 strict=True)]}
                 for name in ESTIMANDS]
    act = act["squared"]
    return RetrainRecord.from_dict(encode({
        "experiment": "influence-retrain-protocol",
        "config": asdict(cfg),
        "model": cfg.model,
        "training": {"train_acc": rec.final_train_acc, "test_acc": rec.final_test_acc,
                     "epochs_run": rec.epochs_run, "plateau_reached": rec.plateau_reached,
                     "gate": adequacy(rec, chance_accuracy(t.out_dim, t.out_dim))},
        **_bootstrap_corr(pred, act),
        "sign_agreement": float(np.mean(np.sign(pred) == np.sign(act))),
        "points": [{"index": int(i), "predicted": float(p), "actual": float(a)}
                   for i, p, a in zip(picks, pred, act, strict=True)],
        "estimands": estimands,
        "data": ds.provenance,
        **run_header(device),
        "wall_s": time.perf_counter() - t0,
    }))
