"""Empirical NTK: the chunking of the torch.func path, and the width-m kernel against Thm 4.2.

The implementations against each other: tests/empirics/test_ntk_implementations.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from empirics.kernels.ntk import JacobianOptions, empirical_ntk
from empirics.nets.models import ModelSpec, build_model
from theory import gram, kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_torch_func_symmetric_chunks_match_unchunked(mnist_small):
    x = torch.as_tensor(mnist_small.x_train[:30], dtype=torch.float64)
    model = build_model(ModelSpec("attn", x.shape[1], 32, 10, seed=1), x, dtype=torch.float64)
    whole = empirical_ntk(model, x, None, "full", "torch_func", options=JacobianOptions(max_bytes=1 << 30))
    chunked = empirical_ntk(model, x, None, "full", "torch_func", options=JacobianOptions(max_bytes=50_000))
    assert _rel(chunked, whole) < 1e-12


@pytest.mark.claim("thm4.2")
@pytest.mark.parametrize("kind", ["relu", "attn"])
def test_empirical_ntk_approaches_analytic_on_real_data(kind, mnist_small):
    """Error of the width-m kernel against Thm 4.2's closed form falls like m^-1/2 on real MNIST."""
    x_np = mnist_small.x_train[:60].astype(np.float64)
    x = torch.as_tensor(x_np)
    feats = x_np if kind == "relu" else gram.attention_features(x_np, x_np)
    analytic = torch.as_tensor(kernels.analytic_ntk_two_layer(feats))
    widths = [64, 256, 1024, 4096]
    errs = []
    for m in widths:
        e = [_rel(empirical_ntk(build_model(ModelSpec(kind, x.shape[1], m, 10, seed=s), x, dtype=torch.float64),
                                x), analytic) for s in range(4)]
        errs.append(float(np.mean(e)))
    slope = np.polyfit(np.log(widths), np.log(errs), 1)[0]
    # Monte-Carlo rate m^-1/2, with a margin: nearly collinear attention features decay a little faster
    assert -0.85 < slope < -0.35, (errs, slope)
    assert errs[-1] < 0.1
