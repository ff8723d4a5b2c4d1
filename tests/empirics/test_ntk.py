"""Empirical NTK: the closed form against the generic torch.func path, and both against Thm 4.2."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from empirics.models import ModelSpec, build_model
from empirics.ntk import empirical_ntk, ntk_generic, ntk_two_layer
from theory import gram, kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.claim("thm4.2")
@given(kind=st.sampled_from(["relu", "attn"]), width=st.sampled_from([1, 7, 64]),
       out_dim=st.sampled_from([1, 3, 10]), seed=st.integers(0, 10_000),
       reduction=st.sampled_from(["mean", "trace", "full"]), layers=st.sampled_from([1, 2]))
def test_closed_form_matches_generic(kind, width, out_dim, seed, reduction, layers):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(17, 12, generator=gen, dtype=torch.float64)
    model = build_model(ModelSpec(kind, 12, width, out_dim, attn_layers=layers, seed=seed), x, dtype=torch.float64)
    fast = ntk_two_layer(model, x[:9], x[4:], reduction)
    slow = ntk_generic(model, x[:9], x[4:], reduction, max_bytes=4096)
    assert fast.shape == slow.shape
    if slow.norm() == 0:
        assert fast.norm() == 0
    else:
        assert _rel(fast, slow) < 1e-6


def test_generic_symmetric_chunks_match_unchunked(mnist_small):
    x = torch.as_tensor(mnist_small.x_train[:30], dtype=torch.float64)
    model = build_model(ModelSpec("attn", x.shape[1], 32, 10, seed=1), x, dtype=torch.float64)
    whole = ntk_generic(model, x, None, "full", max_bytes=1 << 30)
    chunked = ntk_generic(model, x, None, "full", max_bytes=50_000)
    assert _rel(chunked, whole) < 1e-12
    assert _rel(empirical_ntk(model, x), ntk_generic(model, x)) < 1e-6


@pytest.mark.claim("thm4.2")
@pytest.mark.parametrize("kind", ["relu", "attn"])
def test_empirical_ntk_approaches_analytic_on_real_data(kind, mnist_small):
    """Error of the width-m kernel against Thm 4.2's closed form falls like m^-1/2 on real MNIST."""
    x_np = mnist_small.x_train[:60].astype(np.float64)
    x = torch.as_tensor(x_np)
    feats = x_np if kind == "relu" else gram.attention_features(x_np, x_np)
    analytic = torch.as_tensor(kernels.ntk_two_layer(feats))
    widths = [64, 256, 1024, 4096]
    errs = []
    for m in widths:
        e = [_rel(ntk_two_layer(build_model(ModelSpec(kind, x.shape[1], m, 10, seed=s), x, dtype=torch.float64),
                                x), analytic) for s in range(4)]
        errs.append(float(np.mean(e)))
    slope = np.polyfit(np.log(widths), np.log(errs), 1)[0]
    # Monte-Carlo rate m^-1/2, with a margin: nearly collinear attention features decay a little faster
    assert -0.85 < slope < -0.35, (errs, slope)
    assert errs[-1] < 0.1
