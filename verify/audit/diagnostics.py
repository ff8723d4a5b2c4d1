"""The kernel-regime diagnostics of an audit (step 4 of `verify.audit.pipeline`): kappa of the data Gram matrix and
of each model's empirical NTK, the v1 / v2 width bounds of Thm 4.7 and the 2L-ReLU bound, each model's width (its
widest layer) and parameter count."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from theory.bounds import relu_width_bound, width_bound_v1, width_bound_v2
from theory.conditioning import condition_numbers
from verify.audit.config import AuditConfig


def diagnostics(x: np.ndarray, cfg: AuditConfig, models: dict[str, Any]) -> dict[str, Any]:
    """The record's `diagnostics`; a kappa that is not finite falls back to the effective condition number (and the
    record says which one each bound used)."""
    cn = condition_numbers(x.astype(np.float64))
    k1, src1 = (cn["kappa"], "kappa") if math.isfinite(cn["kappa"]) else (cn["kappa_eff"], "kappa_eff")
    k2, src2 = (cn["kappa_d"], "kappa_d") if math.isfinite(cn["kappa_d"]) else (cn["kappa_eff"], "kappa_eff")
    v1 = width_bound_v1(k1, cfg.bound_eps)
    v2 = width_bound_v2(k2, x.shape[0])
    relu = relu_width_bound(cfg.bound_eps)
    rows = []
    for key, m in models.items():
        rows.append({"model": key, "label": m["label"], "width": m["width"], "parameters": m["parameters"],
                     "log10_width": math.log10(max(1, m["width"])),
                     "kappa_ntk": m["ntk"]["kappa"], "log10_kappa_ntk": m["ntk"]["log10_kappa"]})
    return {"data_gram": {k: cn[k] for k in ("n", "d", "rank", "kappa", "kappa_d", "kappa_eff", "log10_kappa",
                                             "log10_kappa_d", "log10_kappa_eff")},
            "bound_eps": cfg.bound_eps, "v1_kappa": src1, "v2_kappa": src2,
            "v1": asdict(v1), "v2": asdict(v2), "relu": asdict(relu), "models": rows}
