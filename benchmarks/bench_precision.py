"""Precision of the fast paths: the float32 closed-form NTK against the float64 one, per size.

The closed form `(1/m)(X X^T) o (D diag(s) D^T)` has two sources of float32 error: rounding in the
two products (about 1e-7 relative, since the long sums of the mask product are over 0/1 entries),
and ReLU masks `D = [W x > 0]` that flip because a pre-activation lies within rounding of zero.
One flipped entry changes a kernel row by a whole term of the mask product, so the error is
not small then: each row reports the maximum relative difference, how many mask entries differ
between float32 and float64, and the smallest |pre-activation|. The times show what float64 costs.
The paths that feed influence, kappa and the NTK distance (`empirics.attribution.influence.model_kernels`,
`empirics.experiments.distance`) already compute in float64; the row for `model_kernels` confirms it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.harness import Check, Row, fmt_num, fmt_time, max_rel_diff, time_result

SECTION = "7. Precision of the fast paths (float32 against float64, same weights and inputs)"


@dataclass
class PrecisionConfig:
    """Sizes (n, m, kind) and whether the networks are trained first."""

    cases: tuple[tuple[int, int, str], ...] = ((250, 1024, "relu"), (500, 1024, "relu"), (500, 4096, "relu"),
                                               (1000, 1024, "relu"), (1000, 4096, "relu"), (2000, 1024, "relu"),
                                               (500, 1024, "attn"))
    train_epochs: int = 3
    repeats: int = 3


def bench_precision(cfg: PrecisionConfig, x: np.ndarray, y: np.ndarray, log: Callable[[str], None] = print
                    ) -> tuple[list[Row], dict[str, Any]]:
    """One row per case: float32 error, mask flips, smallest |pre-activation|, float32 and float64 times."""
    import torch

    from empirics.attribution.influence import model_kernels
    from empirics.common import Tensors, train_network
    from empirics.kernels.ntk import empirical_ntk
    from empirics.nets.models import ModelSpec
    from empirics.nets.train import TrainConfig

    rows: list[Row] = []
    data: dict[str, Any] = {}
    d = x.shape[1]
    for n, m, kind in cfg.cases:
        log(f"  precision: {kind} n={n} m={m}")
        xs = torch.as_tensor(x[:n])
        t = Tensors(xs, torch.as_tensor(y[:n]), xs[:2], torch.as_tensor(y[:2]), 10)
        tr = train_network(ModelSpec(kind, d, m, 10, seed=0), t, TrainConfig(epochs=cfg.train_epochs, seed=0),
                           label=f"{kind} m={m}")
        net32 = tr.model
        net64 = _copy64(net32)
        x64 = xs.double()
        if hasattr(net64, "set_context"):
            net64.set_context(x64)
        t32, k32 = time_result(empirical_ntk, net32, xs, repeats=cfg.repeats)
        t64, k64 = time_result(empirical_ntk, net64, x64, repeats=cfg.repeats)
        K32, K64 = k32.double().numpy(), k64.numpy()
        err = max_rel_diff(K32, K64)
        with torch.no_grad():
            pre32 = net32.features(xs) @ net32.W.T
            pre64 = net64.features(x64) @ net64.W.T
        flips = int(((pre32 > 0) != (pre64 > 0)).sum())
        min_abs = float(pre64.abs().min())
        row_err = float(np.max(np.abs(K32 - K64).max(axis=1) / np.abs(K64).max()))
        Kmk, _ = model_kernels(net32, xs, xs[:2])
        mk_err = max_rel_diff(Kmk, K64)
        case = f"{'2L-ReLU' if kind == 'relu' else 'MLP-Attn'}, n={n}, m={m}, trained {cfg.train_epochs} epochs"
        rows.append(Row(SECTION, "closed form float32 vs float64", case, t32,
                        value=f"float64 {fmt_time(t64.median)} ({t64.median / t32.median:.2f}x the float32 time); "
                              f"{flips} of {n * m:,} ReLU mask entries differ; min |pre-activation| "
                              f"{fmt_num(min_abs)}",
                        checks=[Check("float32 max rel diff", err, 1e-2),
                                Check("model_kernels (feeds influence) max rel diff vs float64", mk_err, 1e-12)],
                        status="measured",
                        note="float32 error above ~1e-6 comes from flipped masks (rounding at a near-zero "
                             "pre-activation), not from the formula",
                        data={"float32_err": err, "row_err": row_err, "mask_flips": flips, "min_abs_preact": min_abs,
                              "t32_s": t32.median, "t64_s": t64.median, "model_kernels_err": mk_err}))
        data[f"{kind}/{n}/{m}"] = rows[-1].data
    return rows, data


def _copy64(model: Any) -> Any:
    import copy

    return copy.deepcopy(model).double()
