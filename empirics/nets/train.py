"""Training the paper's networks under a named protocol (`empirics.nets.protocols`), recorded in every result.

Optimisers: Adam with coupled L2 (`decay="coupled"`, torch's `weight_decay`: the paper's reported
setup), AdamW (`decay="decoupled"`), or full-batch gradient descent. `lr_ref_width` scales the
learning rate as `lr * sqrt(lr_ref_width / m)` (capped at `lr_max` when one is given; the width-consistent
protocol gives none, so every width has its own rate), which keeps the function-space step of Adam the same
at every width in NTK parameterisation. `plateau=True` trains until the training loss stops
improving (see `plateau_reached`) or `epochs` (the maximum) is reached; every record says whether
the plateau was reached, whatever the stopping rule.

Losses (`loss="auto"`, defined in `empirics.nets.losses`): cross-entropy for 10 classes; MSE against +-1
targets for binary tasks (one output), as docs/PAPER.md's training summary reports. `loss="mse"` uses squared
error against one-hot targets for 10 classes too (the setting in which NTK theory's kernel-regression limit
is exact).
Optional PGD adversarial training (Madry et al. 2018): each
batch is replaced by its PGD adversarial version before the step; the plateau is then judged on the loss
being minimised (the epoch's mean loss on the adversarial batches, `adv_train_loss`), and the record gets the
PGD accuracy on the training set at the training eps (`final_robust_train_acc`, which the adequacy gate
reads). Everything is seeded.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from empirics.nets.losses import loss_fn, predict_labels
from empirics.nets.models import TwoLayerNet
from empirics.progress import Progress
from ntkm.errors import UserInputError

OPTIMIZERS = ("adam", "gd")
DECAYS = ("coupled", "decoupled")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-3
    batch_size: int = 128
    seed: int = 0
    adv_train: bool = False
    adv_eps: float = 0.3
    adv_steps: int = 7
    record_every: int = 0
    loss: str = "auto"
    protocol: str = "custom"
    decay: str = "coupled"
    lr_ref_width: int | None = None
    lr_max: float | None = None
    lr_width_power: float = 0.5
    plateau: bool = False
    plateau_window: int = 50
    plateau_tol: float = 0.02
    check_every: int = 5
    lr_from_ntk: bool = False

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise UserInputError(f"unknown weight decay '{self.decay}'; choose one of {', '.join(DECAYS)}")
        if not (self.lr > 0 and self.weight_decay >= 0 and self.plateau_tol > 0):
            raise UserInputError("lr must be > 0, weight_decay >= 0 and plateau_tol > 0 (finite numbers)")
        if self.plateau_window < 1 or self.check_every < 1:
            raise UserInputError("plateau_window and check_every must be >= 1")
        if self.loss not in ("auto", "mse"):
            raise UserInputError(f"unknown loss '{self.loss}'; choose auto (CE / MSE for binary) or mse")
        if self.optimizer not in OPTIMIZERS:
            raise UserInputError(f"unknown optimizer '{self.optimizer}'; choose adam or gd")
        if not self.lr_width_power > 0:
            raise UserInputError("lr_width_power must be > 0 (a power of 0 gives every width the same rate)")
        if self.epochs < 0 or self.lr <= 0 or self.batch_size < 1:
            raise UserInputError("epochs must be >= 0, lr > 0 and batch_size >= 1")


@dataclass
class TrainRecord:
    """Loss and accuracy curves (per recorded epoch) and the final accuracies."""

    epochs: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    final_train_acc: float = float("nan")
    final_test_acc: float = float("nan")
    final_train_loss: float = float("nan")
    wall_s: float = 0.0
    protocol: str = "custom"
    lr: float = float("nan")
    epochs_run: int = 0
    plateau_reached: bool = False
    rel_weight_change: float = float("nan")
    adv_train_loss: list[float] = field(default_factory=list)
    final_robust_train_acc: float = float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


def effective_lr(cfg: TrainConfig, width: int) -> float:
    """The learning rate used at `width`: `lr`, or `lr * (lr_ref_width / width) ** lr_width_power` capped at
    `lr_max`."""
    lr = cfg.lr if cfg.lr_ref_width is None else cfg.lr * (cfg.lr_ref_width / width) ** cfg.lr_width_power
    return min(lr, cfg.lr_max) if cfg.lr_max is not None else lr


def gd_learning_rate(model: TwoLayerNet, x: torch.Tensor) -> float:
    """`n / lambda_max(Theta_0)` (closed-form empirical NTK at the current weights, float64): with this step,
    gradient descent on the mean squared loss moves the top kernel mode of the function by a step of 1 (stable
    below 2) at every width, which makes the protocol width-consistent."""
    from empirics.kernels.ntk import empirical_ntk

    m64 = copy.deepcopy(model).double()
    theta = empirical_ntk(m64, x.double())
    top = float(torch.linalg.eigvalsh(theta)[-1])
    return x.shape[0] / top if top > 0 else 1.0


def plateau_reached(losses: list[float], epochs: list[int], window: int, tol: float) -> bool:
    """True when training has stopped making progress: the best training loss of the last `window` epochs
    improves on the best loss before them by less than `tol` relative to that loss, or by less than
    `tol / 4` of the first recorded loss (cross-entropy on separable data keeps shrinking by a constant
    factor forever, long after it has stopped mattering). Needs a full window of history."""
    if not epochs or epochs[-1] - epochs[0] < window:
        return False
    cut = epochs[-1] - window
    before = [v for e, v in zip(epochs, losses, strict=True) if e <= cut]
    recent = [v for e, v in zip(epochs, losses, strict=True) if e > cut]
    if not before or not recent:
        return False
    gain = min(before) - min(recent)
    return gain < tol * min(before) or gain < tol / 4 * losses[0]


def robust_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig) -> float:
    """Accuracy on (x, y) under the PGD attack adversarial training used (eps `adv_eps`, `adv_steps` steps), with
    a seed no training batch used."""
    from empirics.nets.attacks import AttackConfig, attack

    xa = attack(model, x, y, AttackConfig("pgd", cfg.adv_eps, steps=cfg.adv_steps, seed=cfg.seed * 100003 + 7))
    return accuracy(model, xa, y)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((predict_labels(model(x)) == y).float().mean()) if len(y) else float("nan")


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
          held_out: tuple[torch.Tensor, torch.Tensor] | None = None, label: str = "training") -> TrainRecord:
    """Train `model` in place on (x, y) and return its training record; `held_out` (x_test, y_test), when given, is
    the test set whose accuracy the record follows."""
    x_test, y_test = held_out if held_out is not None else (None, None)
    t0 = time.perf_counter()
    out_dim = model(x[:1]).shape[1]
    net, inputs, test_inputs = model, x, x_test
    if isinstance(model, TwoLayerNet) and not cfg.adv_train:
        # W is the only trained parameter, so the features x~ (for MLP-Attn, C x: the costly product
        # with the d x d context) are fixed during training: compute them once.
        with torch.no_grad():
            inputs = model.features(x)
            test_inputs = model.features(x_test) if x_test is not None else None
        net = model.head
    per_ex = loss_fn(out_dim, cfg.loss)
    gen = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    w0 = [p.detach().clone() for p in params]
    width = getattr(getattr(model, "spec", None), "width", None)
    lr = effective_lr(cfg, width) if width else cfg.lr
    if cfg.lr_from_ntk and isinstance(model, TwoLayerNet):
        lr = cfg.lr * gd_learning_rate(model, x)
    if cfg.optimizer == "adam":
        opt_cls = torch.optim.AdamW if cfg.decay == "decoupled" else torch.optim.Adam
        opt = opt_cls(params, lr=lr, weight_decay=cfg.weight_decay)
        batch = cfg.batch_size
    else:
        opt = torch.optim.SGD(params, lr=lr, weight_decay=cfg.weight_decay)
        batch = x.shape[0]
    rec = TrainRecord(protocol=cfg.protocol, lr=lr)
    n = x.shape[0]
    every = cfg.record_every or max(cfg.check_every, cfg.epochs // 10)  # 0: about ten points on the curves
    with torch.no_grad():
        loss0 = float(per_ex(net(inputs), y).mean())
    hist_e: list[int] = [0]
    hist_l: list[float] = [loss0]
    with Progress(cfg.epochs, label) as bar:
        for epoch in range(1, cfg.epochs + 1):
            perm = torch.randperm(n, generator=gen).to(x.device)
            adv_sum = 0.0
            for i in range(0, n, batch):
                idx = perm[i:i + batch]
                yb = y[idx]
                if cfg.adv_train:
                    from empirics.nets.attacks import AttackConfig, attack

                    xb = attack(model, x[idx], yb, AttackConfig("pgd", cfg.adv_eps, steps=cfg.adv_steps,
                                                            seed=cfg.seed * 100003 + epoch * 1009 + i))
                else:
                    xb = inputs[idx]
                opt.zero_grad(set_to_none=True)
                batch_loss = per_ex(net(xb), yb).mean()
                batch_loss.backward()
                opt.step()
                adv_sum += float(batch_loss.detach()) * len(idx) if cfg.adv_train else 0.0
            rec.epochs_run = epoch
            last = epoch == cfg.epochs
            if epoch % cfg.check_every == 0 or epoch % every == 0 or last:
                with torch.no_grad():
                    out = net(inputs)
                    loss = float(per_ex(out, y).mean())
                hist_e.append(epoch)
                hist_l.append(adv_sum / n if cfg.adv_train else loss)
                if cfg.adv_train and len(hist_l) == 2:
                    hist_l[0] = hist_l[1]  # no adversarial loss before the first epoch: start the history here
                rec.plateau_reached = plateau_reached(hist_l, hist_e, cfg.plateau_window, cfg.plateau_tol)
                stop = cfg.plateau and rec.plateau_reached
                if epoch % every == 0 or last or stop:
                    rec.epochs.append(epoch)
                    rec.train_loss.append(loss)
                    if cfg.adv_train:
                        rec.adv_train_loss.append(hist_l[-1])
                    with torch.no_grad():
                        rec.train_acc.append(float((predict_labels(out) == y).float().mean()))
                        if test_inputs is not None and y_test is not None:
                            rec.test_acc.append(float((predict_labels(net(test_inputs)) == y_test).float().mean()))
                bar.update(1, f"loss={loss:.4f}")
                if stop:
                    break
            else:
                bar.update(1)
    with torch.no_grad():
        out = model(x)
        rec.final_train_loss = float(per_ex(out, y).mean())
        rec.final_train_acc = float((predict_labels(out) == y).float().mean())
        if x_test is not None and y_test is not None:
            rec.final_test_acc = accuracy(model, x_test, y_test)
        num = sum(float(((p - q) ** 2).sum()) for p, q in zip(params, w0, strict=True))
        den = sum(float((q**2).sum()) for q in w0)
        rec.rel_weight_change = (num / den) ** 0.5 if den > 0 else float("nan")
    if cfg.adv_train:
        rec.final_robust_train_acc = robust_accuracy(model, x, y, cfg)
    rec.wall_s = time.perf_counter() - t0
    return rec


def train_job(job: Sequence[Any]) -> TrainRecord:
    """`train` on one training job, the tuple `empirics.nets.engine.train_many` takes: (model, x, y, cfg, x_test,
    y_test) and optionally a label; the test set counts where both of its arrays are given."""
    model, x, y, cfg, x_test, y_test = job[:6]
    held_out = None if x_test is None or y_test is None else (x_test, y_test)
    return train(model, x, y, cfg, held_out, *job[6:])
