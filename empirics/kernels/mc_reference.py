"""Monte Carlo infinite-width reference kernel: the expected empirical NTK at initialisation.

For every network of the suite the per-output empirical NTK at initialisation is an average over the m
hidden units of i.i.d. terms (the W block), plus, for the trainable-attention variant (`qkv`), bilinear
forms in `g_c = m^-1/2 W^T (a_c o relu'(W x~))` whose cross-unit terms have mean 0 (the signs `a` are
independent). So `E_init[Theta_0]` does not depend on the width m, and for 2L-ReLU, MLP-Attn and softmax
attention it equals the closed form of Thm 4.2 (`theory.kernels`) exactly. Where no closed form exists (`qkv`:
the features `x~` themselves are random through `Q, K, V`) the reference is this expectation, estimated by the
mean over independent initialisations, with its per-entry standard error; the tests check the estimator
against the closed form where both exist.

Caveat recorded with every estimate: at a fixed input dimension the `qkv` kernel does not concentrate as m
grows (its Q, K, V blocks stay random), so its "infinite-width" reference is the mean kernel, not a limit
that a single wide network reaches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from empirics.kernels.ntk import empirical_ntk
from empirics.nets.models import ModelSpec, build_model
from ntkm.errors import UserInputError
from theory import krr

#: Offset of the initialisation seeds of the Monte Carlo draws (disjoint from the trained networks' seeds).
MC_SEED_OFFSET = 1_000_000


@dataclass
class MCKernel:
    """Mean of `draws` empirical NTKs at initialisation on the same points, and the draws themselves."""

    samples: np.ndarray  # (draws, n, n)
    width: int
    seeds: list[int]

    @property
    def mean(self) -> np.ndarray:
        return self.samples.mean(axis=0)

    @property
    def se(self) -> np.ndarray:
        """Per-entry standard error of the mean over draws."""
        return self.samples.std(axis=0, ddof=1) / np.sqrt(self.samples.shape[0])

    def summary(self) -> dict[str, Any]:
        mean = self.mean
        return {"kind": "monte-carlo", "estimand": "E_init[empirical NTK at initialisation] (width-independent)",
                "draws": int(self.samples.shape[0]), "width": self.width, "seeds": self.seeds,
                "rel_se_frobenius": float(np.linalg.norm(self.se) / max(np.linalg.norm(mean), 1e-300))}


def mc_reference_kernel(spec: ModelSpec, x_train: torch.Tensor, x_eval: torch.Tensor, draws: int = 16,
                        width: int = 512, seed: int = 0) -> MCKernel:
    """Empirical NTKs (per-output mean, float64) at `draws` initialisations of `spec` at `width`, on `x_eval`,
    with the attention context of `x_train`. Draw s uses initialisation seed `MC_SEED_OFFSET + 1000 seed + s`."""
    if draws < 2 or width < 1:
        raise UserInputError(f"a Monte Carlo reference needs at least 2 draws and width >= 1 (got {draws}, {width})")
    xt, xe = x_train.double(), x_eval.double()
    seeds = [MC_SEED_OFFSET + 1000 * seed + s for s in range(draws)]
    out = []
    for s in seeds:
        model = build_model(replace(spec, width=width, seed=s), xt, dtype=torch.float64, device=str(xt.device))
        out.append(empirical_ntk(model, xe, None, "mean").cpu().numpy())
    return MCKernel(np.stack(out), width, seeds)


def predictor_jackknife_se(mc: MCKernel, n_train: int, y_train: np.ndarray, ridge: float) -> float:
    """Jackknife standard error (Frobenius) of the kernel ridge predictor on the evaluation points beyond the first
    `n_train`, fitted with the Monte Carlo mean kernel: how far its Monte Carlo error can move `f_NTK`."""
    S = mc.samples.shape[0]
    total = mc.samples.sum(axis=0)
    preds = []
    for s in range(S):
        k = (total - mc.samples[s]) / (S - 1)
        preds.append(krr.krr_predict(k[n_train:, :n_train], krr.krr_fit(k[:n_train, :n_train], y_train, ridge)))
    p = np.stack(preds)
    return float(np.sqrt((S - 1) / S * ((p - p.mean(axis=0)) ** 2).sum()))
