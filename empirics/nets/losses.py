"""The per-example training losses and the label encodings that match them.

`loss="auto"`: cross-entropy for 10 classes; MSE against +-1 targets for binary tasks (one output);
`loss="mse"`: half the squared error to one-hot targets for 10 classes too. Training
(`empirics.nets.train`), the attacks (`empirics.nets.attacks`), the landscape and the audit all use these,
so the loss an attack maximises is the loss the network was trained on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


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
    """Class labels from network outputs: the sign of the one output (binary), else the argmax."""
    return (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(dim=1)


def targets(y: torch.Tensor, out_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Regression targets that match the training loss: one-hot (10 classes) or +-1 (binary)."""
    if out_dim == 1:
        return (2.0 * y.to(dtype) - 1.0)[:, None]
    return nn.functional.one_hot(y, out_dim).to(dtype)
