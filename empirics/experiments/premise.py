"""Premises the paper argues from, measured on real training images (arXiv:2603.13085).

- Thm 4.7 derives MLP-Attn's width requirement from `kappa(G^3) = kappa(G)^3`, i.e. it takes
  `kappa(G)^3` to be the condition number that governs the network's NTK. `premise_row` puts the
  numbers side by side for one set of inputs: kappa(G) and kappa(G)^3 (log space, from the singular
  values of X: G^3 is never formed), the condition number and smallest eigenvalue of the analytic
  NTK (Thm 4.2) of 2L-ReLU (raw x) and of MLP-Attn (attention features normalise(C x)), and of the
  empirical NTK of both networks at initialisation (closed form, float64) at the given widths.
- Sec. 5 explains the no-gap binary CIFAR-10 result (automobile vs airplane) by a lower kappa of that
  subset. `binary_kappa_unit` measures kappa(G) of the two-class and the ten-class subsets at equal n.

Both record the data provenance and every choice (n, sample, seed, widths); nothing here judges.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from empirics.data.datasets import DataRequest, load_dataset
from empirics.kernels.ntk import empirical_ntk
from empirics.nets.models import ModelSpec, build_model
from ntkm.codec import Record, encode
from ntkm.errors import UserInputError
from theory.conditioning import condition_numbers, kernel_spectrum, log10_kappa_power
from theory.gram import attention_features
from theory.kernels import analytic_ntk_two_layer

MODELS = ("relu", "attn")
#: Output width of the networks whose empirical NTK is measured (the 10-class heads; with `a = +-1` and
#: the "mean" reduction the kernel does not depend on it).
OUT_DIM = 10


def premise_row(X: np.ndarray, widths: tuple[int, ...] | list[int], seed: int = 0) -> dict[str, Any]:
    """Thm 4.7's premise on one training set `X` (n x d): kappa(G)^3 beside the NTKs' spectra.

    `ntk[model]["analytic"]` and each `ntk[model]["empirical"][k]` are `theory.conditioning.kernel_spectrum`
    records; `attn_features` conditions the Gram matrix of the normalised attention features,
    `D^-1/2 G^3 D^-1/2` (Thm 4.1 with the paper's normalisation), from their singular values.
    """
    A = np.asarray(X, dtype=np.float64)
    cn = condition_numbers(A)
    F = attention_features(A, A)
    fcn = condition_numbers(F)
    x_t = torch.from_numpy(A)
    ntk: dict[str, Any] = {}
    for kind, feats in (("relu", A), ("attn", F)):
        emp = []
        for m in widths:
            model = build_model(ModelSpec(kind, A.shape[1], int(m), OUT_DIM, seed=seed), x_t, dtype=torch.float64)
            emp.append({"width": int(m), **kernel_spectrum(empirical_ntk(model, x_t).numpy())})
        ntk[kind] = {"analytic": kernel_spectrum(analytic_ntk_two_layer(feats)), "empirical": emp}
    return {
        "n": cn["n"], "d": cn["d"], "rank": cn["rank"], "kappa_G": cn["kappa"], "log10_kappa_G": cn["log10_kappa"],
        "lambda_min_G": float(cn["sigma_min"]) ** 2 if cn["n"] <= cn["d"] else 0.0,
        "log10_kappa_G_cubed": log10_kappa_power(cn["kappa"], 3),
        "attn_features": {"kappa": fcn["kappa"], "log10_kappa": fcn["log10_kappa"]},
        "ntk": ntk, "seed": seed,
    }


def premise_unit(datasets: list[str], ns: list[int], widths: list[int], sample: str, seed: int,
                 data_dir: str | None) -> PremiseRecord:
    """`premise_row` for the first (or seeded balanced) n training images of each data set and n.

    Sizes the available data cannot provide are listed under `missing`, as in the kappa sweep.
    """
    rows, missing = [], []
    for ds_name in datasets:
        for n in ns:
            t0 = time.perf_counter()
            try:
                ds = load_dataset(ds_name, n_train=int(n), n_test=1,
                                  request=DataRequest(sample=sample, seed=seed, data_dir=data_dir))
            except UserInputError as exc:
                missing.append({"dataset": ds_name, "n": n, "reason": str(exc)})
                continue
            row = premise_row(ds.x_train, widths, seed)
            rows.append({"dataset": ds_name, **row, "provenance_label": ds.provenance.get("label", ds_name),
                         "seconds": round(time.perf_counter() - t0, 3)})
    return PremiseRecord.from_dict(encode({"datasets": list(datasets), "sample": sample, "widths": list(widths),
                                           "rows": rows, "missing": missing}))


def binary_kappa_unit(datasets: list[str], ns: list[int], seeds: list[int], sample: str,
                      data_dir: str | None) -> BinaryKappaRecord:
    """kappa(G) of the binary-task subset and of the 10-class subset of the same size, per data set,
    n and seed (`sample` "balanced": each seed draws its own class-balanced subsets)."""
    rows, missing = [], []
    for ds_name in datasets:
        for n in ns:
            for seed in seeds:
                rec: dict[str, Any] = {"dataset": ds_name, "n": int(n), "seed": int(seed)}
                try:
                    for task in ("binary", "10class"):
                        ds = load_dataset(ds_name, n_train=int(n), n_test=1,
                                          request=DataRequest(task=task, sample=sample, seed=int(seed),
                                                              data_dir=data_dir))
                        cn = condition_numbers(ds.x_train)
                        rec[task] = {"kappa": cn["kappa"], "log10_kappa": cn["log10_kappa"], "rank": cn["rank"],
                                     "classes": ds.classes, "provenance_label": ds.provenance.get("label", ds_name)}
                except UserInputError as exc:
                    missing.append({"dataset": ds_name, "n": n, "seed": seed, "reason": str(exc)})
                    continue
                rows.append(rec)
    return BinaryKappaRecord.from_dict(encode({"datasets": list(datasets), "sample": sample, "seeds": list(seeds),
                                               "rows": rows, "missing": missing}))


@dataclass(frozen=True)
class PremiseRecord(Record):
    """The result of `premise_unit`: one `premise_row` per data set and n loaded, and the sizes that were not."""

    datasets: list[str]
    sample: str
    widths: list[int]
    rows: list[dict[str, Any]]
    missing: list[dict[str, Any]]


@dataclass(frozen=True)
class BinaryKappaRecord(Record):
    """The result of `binary_kappa_unit`: kappa(G) of the binary and 10-class subsets per data set, n and seed."""

    datasets: list[str]
    sample: str
    seeds: list[int]
    rows: list[dict[str, Any]]
    missing: list[dict[str, Any]]
