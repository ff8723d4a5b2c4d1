"""A small real audit's inputs for the audit tests that need a saved record (`tests/verify/test_audit_ci.py`,
`tests/verify/test_audit_record.py`): 60 bundled MNIST training and 30 test images as .npz files, and a small CNN
trained on them for 60 Adam steps, written as TorchScript.

Import it in a test module with `from small_audit import ...` (pytest puts `tests/` on the path).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchscript import script

from empirics.data.datasets import DataRequest, load_dataset


class CNN(nn.Module):
    """One strided convolution and a linear head: small enough for an audit in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 5, stride=3)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c1(x)).flatten(1))


def write_inputs(d: Path) -> tuple[nn.Module, nn.Module]:
    """Write `train.npz`, `test.npz`, the untrained CNN (`raw.ts`) and its trained copy (`cnn.ts`) into `d`;
    return both networks (seeded: the same every run)."""
    torch.set_num_threads(2)
    ds = load_dataset("mnist", n_train=60, n_test=30, request=DataRequest(source="bundled"))
    np.savez(d / "train.npz", x=ds.x_train.reshape(-1, 1, 28, 28), y=ds.y_train)
    np.savez(d / "test.npz", x=ds.x_test.reshape(-1, 1, 28, 28), y=ds.y_test)
    x, y = torch.as_tensor(ds.x_train).reshape(-1, 1, 28, 28), torch.as_tensor(ds.y_train)
    torch.manual_seed(0)
    raw = CNN().eval()
    script(raw).save(str(d / "raw.ts"))
    trained = CNN()
    trained.load_state_dict(raw.state_dict())
    opt = torch.optim.Adam(trained.parameters(), lr=5e-3)
    for _ in range(60):
        opt.zero_grad()
        nn.functional.cross_entropy(trained(x), y).backward()
        opt.step()
    script(trained.eval()).save(str(d / "cnn.ts"))
    return raw, trained
