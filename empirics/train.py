"""Training the paper's networks: Adam (the reported defaults) or full-batch gradient descent.

Losses (`loss="auto"`): cross-entropy for 10 classes; MSE against +-1 targets for binary tasks (one
output), as PAPER.md's training summary reports. `loss="mse"` uses squared error against one-hot
targets for 10 classes too (the setting in which NTK theory's kernel-regression limit is exact).
Optional PGD adversarial training (Madry et al. 2018): each
batch is replaced by its PGD adversarial version before the step. Everything is seeded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from empirics.models import TwoLayerNet
from empirics.progress import Progress
from theory.errors import UserInputError

OPTIMIZERS = ("adam", "gd")


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

    def __post_init__(self) -> None:
        if self.loss not in ("auto", "mse"):
            raise UserInputError(f"unknown loss '{self.loss}'; choose auto (CE / MSE for binary) or mse")
        if self.optimizer not in OPTIMIZERS:
            raise UserInputError(f"unknown optimizer '{self.optimizer}'; choose adam or gd")
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


def loss_fn(out_dim: int, loss: str = "auto") -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-example loss: cross-entropy (c > 1) or MSE to +-1 targets (one output); `loss="mse"`
    gives half the squared error to one-hot targets for c > 1."""
    if out_dim > 1 and loss == "mse":
        def mse_onehot(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return 0.5 * ((out - nn.functional.one_hot(y, out_dim).to(out.dtype)) ** 2).sum(dim=1)

        return mse_onehot
    if out_dim == 1:
        def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return 0.5 * (out[:, 0] - (2.0 * y.to(out.dtype) - 1.0)) ** 2

        return mse

    def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y, reduction="none")

    return ce


def predict_labels(out: torch.Tensor) -> torch.Tensor:
    return (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(dim=1)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((predict_labels(model(x)) == y).float().mean()) if len(y) else float("nan")


def targets(y: torch.Tensor, out_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Regression targets that match the training loss: one-hot (10 classes) or +-1 (binary)."""
    if out_dim == 1:
        return (2.0 * y.to(dtype) - 1.0)[:, None]
    return nn.functional.one_hot(y, out_dim).to(dtype)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
          x_test: torch.Tensor | None = None, y_test: torch.Tensor | None = None,
          label: str = "training") -> TrainRecord:
    """Train `model` in place on (x, y) and return its training record."""
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
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        batch = cfg.batch_size
    else:
        opt = torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        batch = x.shape[0]
    rec = TrainRecord()
    n = x.shape[0]
    every = cfg.record_every or max(1, cfg.epochs // 10)  # 0: about ten points on the curves
    with Progress(cfg.epochs, label) as bar:
        for epoch in range(1, cfg.epochs + 1):
            perm = torch.randperm(n, generator=gen).to(x.device)
            for i in range(0, n, batch):
                idx = perm[i:i + batch]
                yb = y[idx]
                if cfg.adv_train:
                    from empirics.attacks import AttackConfig, attack

                    xb = attack(model, x[idx], yb, AttackConfig("pgd", cfg.adv_eps, steps=cfg.adv_steps,
                                                            seed=cfg.seed * 100003 + epoch * 1009 + i))
                else:
                    xb = inputs[idx]
                opt.zero_grad(set_to_none=True)
                per_ex(net(xb), yb).mean().backward()
                opt.step()
            if epoch % every == 0 or epoch == cfg.epochs:
                with torch.no_grad():
                    out = net(inputs)
                    rec.epochs.append(epoch)
                    rec.train_loss.append(float(per_ex(out, y).mean()))
                    rec.train_acc.append(float((predict_labels(out) == y).float().mean()))
                    if test_inputs is not None and y_test is not None:
                        rec.test_acc.append(float((predict_labels(net(test_inputs)) == y_test).float().mean()))
                bar.update(1, f"loss={rec.train_loss[-1]:.4f}")
            else:
                bar.update(1)
    with torch.no_grad():
        out = model(x)
        rec.final_train_loss = float(per_ex(out, y).mean())
        rec.final_train_acc = float((predict_labels(out) == y).float().mean())
        if x_test is not None and y_test is not None:
            rec.final_test_acc = accuracy(model, x_test, y_test)
    rec.wall_s = time.perf_counter() - t0
    return rec
