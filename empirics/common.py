"""Small pieces shared by the experiments: tensors from a dataset, trained-model bundles, spreads."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from empirics.nets.models import ModelSpec, TwoLayerNet, build_model
from empirics.nets.protocols import adequacy, chance_accuracy
from empirics.nets.train import TrainConfig, TrainRecord, train
from ntkm.codec import stable_hash


@dataclass
class Tensors:
    """A data set as tensors; `key` identifies its subset (index digests), for the training memo."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    out_dim: int
    key: str = ""

    @property
    def chance(self) -> float:
        return chance_accuracy(self.out_dim, self.out_dim)


def dataset_tensors(ds: Any, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Tensors:
    """Torch tensors of a `empirics.data.datasets.Dataset`; binary tasks get one output (MSE on +-1)."""
    out_dim = 1 if ds.task == "binary" else int(ds.num_classes)
    prov = getattr(ds, "provenance", {}) or {}
    key = stable_hash({k: prov.get(k) for k in ("label", "task", "train_indices_sha256", "test_indices_sha256",
                                                 "n_train", "n_test", "seed", "sample")})
    return Tensors(
        torch.as_tensor(ds.x_train, dtype=dtype, device=device),
        torch.as_tensor(ds.y_train, dtype=torch.long, device=device),
        torch.as_tensor(ds.x_test, dtype=dtype, device=device),
        torch.as_tensor(ds.y_test, dtype=torch.long, device=device),
        out_dim,
        key,
    )


@dataclass
class Trained:
    """A trained network, its state at initialisation, its training record and the adequacy gate's
    decision on it (`empirics.nets.protocols.adequacy`)."""

    model: TwoLayerNet
    init_W: torch.Tensor
    record: TrainRecord
    gate: dict[str, Any]

    def training_summary(self) -> dict[str, Any]:
        """What every result records next to a network's numbers: accuracies, loss, plateau, gate."""
        r = self.record
        return {"train_acc": r.final_train_acc, "test_acc": r.final_test_acc, "train_loss": r.final_train_loss,
                "epochs_run": r.epochs_run, "plateau_reached": r.plateau_reached, "lr": r.lr,
                "protocol": r.protocol, "rel_weight_change": r.rel_weight_change, "train_wall_s": r.wall_s,
                "curve": {"epochs": r.epochs, "train_loss": r.train_loss, "train_acc": r.train_acc,
                          "test_acc": r.test_acc},
                "gate": self.gate}


#: Networks trained in this process, keyed by (spec, training config, data subset): the claims' units
#: that train the same network on the same data (malleability, eps sweep, landscape) train it once.
_TRAINED: OrderedDict[str, Trained] = OrderedDict()
_TRAINED_MAX = 256


def _memo_key(spec: ModelSpec, t: Tensors, cfg: TrainConfig, device: str) -> str:
    return stable_hash({"spec": spec.to_dict(), "train": asdict(cfg), "data": t.key, "device": device}) if t.key else ""


def _remember(key: str, out: Trained) -> None:
    if key:
        _TRAINED[key] = out
        while len(_TRAINED) > _TRAINED_MAX:
            _TRAINED.popitem(last=False)


def train_network(spec: ModelSpec, t: Tensors, cfg: TrainConfig, device: str = "cpu", label: str = "") -> Trained:
    """Build and train a network (or reuse the one this process already trained identically).

    The returned model must not be modified in place by the caller (copy it first): it may be shared.
    """
    key = _memo_key(spec, t, cfg, device)
    if key and key in _TRAINED:
        _TRAINED.move_to_end(key)
        return _TRAINED[key]
    model = build_model(spec, t.x_train, device=device)
    init_W = model.W.detach().clone()
    rec = train(model, t.x_train, t.y_train, cfg, (t.x_test, t.y_test), label=label or f"{spec.kind} m={spec.width}")
    out = Trained(model, init_W, rec, adequacy(rec, t.chance))
    _remember(key, out)
    return out


@dataclass(frozen=True)
class NetworkRequest:
    """The arguments of `train_network`, for `train_networks`."""

    spec: ModelSpec
    data: Tensors
    cfg: TrainConfig
    device: str = "cpu"
    label: str = ""


def train_networks(requests: Sequence[NetworkRequest]) -> list[Trained]:
    """`[train_network(...) for r in requests]`, with the networks not trained yet trained together in one call
    of the batched engine (`empirics.nets.engine.train_many`, which gives the same weights and records) and memoised."""
    from empirics.nets.engine import train_many

    keys = [_memo_key(r.spec, r.data, r.cfg, r.device) for r in requests]
    slots = [k or f"unkeyed {i}" for i, k in enumerate(keys)]  # a request without a data key is never shared
    known = {k: _TRAINED[k] for k in slots if k in _TRAINED}
    todo: dict[str, NetworkRequest] = {}
    for k, r in zip(slots, requests, strict=True):
        if k not in known:
            todo.setdefault(k, r)
    models = {k: build_model(r.spec, r.data.x_train, device=r.device) for k, r in todo.items()}
    init = {k: m.W.detach().clone() for k, m in models.items()}
    jobs = [(models[k], r.data.x_train, r.data.y_train, r.cfg, r.data.x_test, r.data.y_test,
             r.label or f"{r.spec.kind} m={r.spec.width}") for k, r in todo.items()]
    for (k, r), rec in zip(todo.items(), train_many(jobs), strict=True):
        known[k] = Trained(models[k], init[k], rec, adequacy(rec, r.data.chance))
        _remember("" if k.startswith("unkeyed") else k, known[k])
    return [known[k] for k in slots]


def train_seeds_together(seed_map: SeedMap, seeds: Sequence[int],
                         requests: Callable[[int], list[NetworkRequest]]) -> None:
    """Train every seed's networks (`requests(seed)`) in one `train_networks` call before the seeds run, so that
    their per-seed parts find them in the memo: on the local path (`local_map`) only; where the seeds run elsewhere
    (a Ray task per seed), each part batches its own networks. Skipped when the memo could not hold them all."""
    if seed_map is not local_map:
        return
    reqs = [r for s in seeds for r in requests(s) if r.data.key]
    if len(reqs) <= _TRAINED_MAX:
        train_networks(reqs)


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


def experiment_data(cfg: Any, dataset: Any | None = None, seed: int = 0) -> tuple[Any, Tensors, str]:
    """The data set an experiment config names (or the one given), its tensors, and the device.

    `cfg` needs the fields dataset (mnist, cifar10 or a PATH, see `empirics.data.userdata`), task, n_train,
    n_test, sample, data_seed, data_dir, data_source, device, and optionally `classes` (the two classes of
    a binary task on a PATH) and `per_seed_data`: when true, seed `seed` draws its own subset (data seed
    `data_seed + seed`), so a spread over seeds is also a spread over data subsets. The data set's provenance
    names the networks' input preprocessing (`cfg.preprocess`, default raw), which acts inside the model.
    """
    from empirics.data.datasets import DataRequest
    from empirics.data.userdata import load_data
    from empirics.records import pick_device

    device = pick_device(cfg.device)
    data_seed = cfg.data_seed + (seed if getattr(cfg, "per_seed_data", False) else 0)
    ds = dataset or load_data(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test,
                              request=DataRequest(task=cfg.task, sample=cfg.sample, seed=data_seed,
                                                  data_dir=cfg.data_dir, source=cfg.data_source),
                              classes=getattr(cfg, "classes", None))
    prov = {**(ds.provenance or {}), "preprocess": getattr(cfg, "preprocess", "raw")}
    ds = dataclasses.replace(ds, provenance=prov)
    return ds, dataset_tensors(ds, device), device


def subset_provenance(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One provenance record for an experiment whose seeds drew their own subsets: the first seed's
    record plus the index digest of every seed's subset (`per_seed`: seed -> that subset's provenance)."""
    first = next(iter(per_seed.values()))
    return {**first, "per_seed_subsets": {str(s): {"seed": prov.get("seed"),
                                                   "train_indices_sha256": prov.get("train_indices_sha256")}
                                          for s, prov in per_seed.items()}}


#: How an experiment maps its per-seed part over the seeds: `seed_map(part, seeds)` returns the parts in
#: seed order. The default runs them here, one after another; `verify.executors` can run them as Ray tasks.
SeedMap = Callable[[Callable[[int], Any], Sequence[int]], list[Any]]


def local_map(part: Callable[[int], Any], seeds: Sequence[int]) -> list[Any]:
    return [part(s) for s in seeds]
