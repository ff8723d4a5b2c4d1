"""Small pieces shared by the experiments: tensors from a dataset, trained-model bundles, spreads."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from empirics.models import ModelSpec, TwoLayerNet, build_model
from empirics.train import TrainConfig, TrainRecord, train


@dataclass
class Tensors:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    out_dim: int


def dataset_tensors(ds: Any, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Tensors:
    """Torch tensors of a `empirics.datasets.Dataset`; binary tasks get one output (MSE on +-1)."""
    out_dim = 1 if ds.task == "binary" else int(ds.num_classes)
    return Tensors(
        torch.as_tensor(ds.x_train, dtype=dtype, device=device),
        torch.as_tensor(ds.y_train, dtype=torch.long, device=device),
        torch.as_tensor(ds.x_test, dtype=dtype, device=device),
        torch.as_tensor(ds.y_test, dtype=torch.long, device=device),
        out_dim,
    )


@dataclass
class Trained:
    """A trained network, its state at initialisation, and its training record."""

    model: TwoLayerNet
    init_W: torch.Tensor
    record: TrainRecord


def train_network(spec: ModelSpec, t: Tensors, cfg: TrainConfig, device: str = "cpu", label: str = "") -> Trained:
    model = build_model(spec, t.x_train, device=device)
    init_W = model.W.detach().clone()
    rec = train(model, t.x_train, t.y_train, cfg, t.x_test, t.y_test, label=label or f"{spec.kind} m={spec.width}")
    return Trained(model, init_W, rec)


def as_float64(model: TwoLayerNet) -> TwoLayerNet:
    """A float64 copy (kernels and their inverses are computed in float64)."""
    return copy.deepcopy(model).double()


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min, max and count of finite values."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "min": float(arr.min()),
        "max": float(arr.max()),
        "n": int(arr.size),
    }


def experiment_data(cfg: Any, dataset: Any | None = None) -> tuple[Any, Tensors, str]:
    """The data set an experiment config names (or the one given), its tensors, and the device.

    `cfg` needs the fields dataset, task, n_train, n_test, sample, data_seed, data_dir, data_source, device.
    """
    from empirics.datasets import load_dataset
    from empirics.records import pick_device

    device = pick_device(cfg.device)
    ds = dataset or load_dataset(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test, task=cfg.task,
                                 sample=cfg.sample, seed=cfg.data_seed, data_dir=cfg.data_dir,
                                 source=cfg.data_source)
    return ds, dataset_tensors(ds, device), device
