"""The kappa sweep: condition numbers of G = X X^T on real training images, and the width bounds.

For each n the first (or a seeded class-balanced) n training images are loaded, preprocessed,
and `theory.conditioning.condition_numbers` computes kappa(G), kappa_d(G) and kappa_eff from the
singular values of X in float64 (on raw pixels also kappa and kappa_d of the same images under
per-channel standardisation, `*_channel`, the networks' `channel` input layer). kappa(G^3) = kappa(G)^3
(Thm 4.7) is reported in log space, and Thm 4.7's v1 (`kappa^6 / eps^2`) and v2 (`kappa_d^6 n ln n`) width
bounds with constant 1.
Used by `verify kappa` (which prints it) and the claims units `kappa:<dataset>` (`verify.experiments`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from empirics.data.datasets import DataRequest, load_dataset
from empirics.data.datasets import preprocess as preprocess_inputs
from theory.bounds import width_bound_v1, width_bound_v2
from theory.conditioning import condition_numbers, log10_kappa_power


def kappa_rows(
    dataset: str,
    ns: tuple[int, ...],
    *,
    request: DataRequest | None = None,
    preprocess: str = "raw",
    eps: float = 0.1,
) -> list[dict[str, Any]]:
    """One record per n: condition numbers, kappa^3 (log10), both width bounds and data provenance (`request`: the
    task, subset rule, seed and where to look for each n's images, None for `DataRequest()`'s defaults)."""
    rows = []
    for n in ns:
        t0 = time.perf_counter()
        ds = load_dataset(dataset, n_train=n, n_test=1, request=request)
        channels = ds.image_shape[0] if ds.image_shape else 1
        cn = condition_numbers(preprocess_inputs(ds.x_train, preprocess, channels=channels))
        beside = {}
        if preprocess == "raw":  # the same images standardised per channel, reported beside
            standardised = condition_numbers(preprocess_inputs(ds.x_train, "channel", channels=channels))
            beside = {f"{k}_channel": standardised[k] for k in ("kappa", "kappa_d", "log10_kappa")}
        log10_k3 = log10_kappa_power(cn["kappa"], 3)
        rows.append(
            {
                **{
                    k: cn[k]
                    for k in (
                        "n",
                        "d",
                        "rank",
                        "kappa",
                        "kappa_d",
                        "kappa_eff",
                        "log10_kappa",
                        "log10_kappa_d",
                        "log10_kappa_eff",
                        "sigma_max",
                        "sigma_min",
                    )
                },
                "kappa_cubed": math.inf if log10_k3 > 308 else 10.0**log10_k3,
                "log10_kappa_cubed": log10_k3,
                "bound_v1": width_bound_v1(cn["kappa"], eps),
                "bound_v2": width_bound_v2(cn["kappa_d"], n),
                **beside,
                "provenance": ds.provenance,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
    return rows
