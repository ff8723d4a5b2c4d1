"""`verify.audit.sharpness`: the sharpness subsample rule (`hessian_subset`: all points for small models, a seeded
subsample of HESSIAN_VALUES / parameters for large ones, `--hessian-points` when given), and the chunked
Hessian-vector products within a memory budget against the single graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from verify.audit.modelio import FlatInput
from verify.audit.sharpness import (
    HESSIAN_MIN_POINTS,
    HESSIAN_VALUES,
    HvpOptions,
    chunk_points,
    hessian_products,
    hessian_subset,
    top_hessian,
)


def test_small_models_keep_every_point():
    assert np.array_equal(hessian_subset(1000, 1_068_810, None, 0), np.arange(1000))


def test_large_models_get_a_seeded_sorted_subsample_of_the_stated_size():
    sub = hessian_subset(1000, 11_173_962, None, 3)
    assert len(sub) == HESSIAN_VALUES // 11_173_962 == 107
    assert np.all(np.diff(sub) > 0) and sub.max() < 1000
    assert np.array_equal(sub, hessian_subset(1000, 11_173_962, None, 3))
    assert not np.array_equal(sub, hessian_subset(1000, 11_173_962, None, 4))
    assert len(hessian_subset(1000, 10**12, None, 0)) == HESSIAN_MIN_POINTS


def test_explicit_points_win_and_never_exceed_the_training_set():
    assert len(hessian_subset(500, 10**9, 250, 0)) == 250
    assert np.array_equal(hessian_subset(50, 10**9, 80, 0), np.arange(50))


# --- top_hessian within a memory budget: chunked Hessian-vector products ---------------------------------------------



def _cnn() -> nn.Module:
    """A float64 CNN with batch norm in evaluation mode (non-trivial running statistics), on flat 1x6x6 inputs."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Tanh(), nn.Flatten(), nn.Linear(48, 4)).double()
    net[1].running_mean.uniform_(-0.2, 0.2)
    net[1].running_var.uniform_(0.5, 1.5)
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 1.5)
        net[1].bias.uniform_(-0.3, 0.3)
    return FlatInput(net.eval(), (1, 6, 6))


def _mlp() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(36, 12), nn.Tanh(), nn.Linear(12, 4)).double()


def _data(n: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return torch.rand(n, 36, generator=gen, dtype=torch.float64), torch.randint(0, 4, (n,), generator=gen)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("make", [_cnn, _mlp], ids=["cnn-batchnorm-eval", "mlp"])
@pytest.mark.parametrize("max_bytes", [1, 60_000])
def test_chunked_products_equal_the_single_graph(make, max_bytes: int):
    model = make()
    x, y = _data()
    whole = hessian_products(model, x, y)
    chunked = hessian_products(model, x, y, max_bytes=max_bytes)
    assert (whole.chunks, whole.points_per_chunk) == (1, len(x))
    assert chunked.chunks > 1 and chunked.chunks == -(-len(x) // chunked.points_per_chunk)
    assert chunked.how == whole.how == "double backward" and chunked.graph_bytes_per_point > 0
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        v = torch.randn(whole.like.shape, generator=gen, dtype=torch.float64)
        assert _rel(chunked.hvp(v), whole.hvp(v)) <= 1e-10
    assert abs(chunked.loss - whole.loss) <= 1e-12 * abs(whole.loss)


@pytest.mark.parametrize("make", [_cnn, _mlp], ids=["cnn-batchnorm-eval", "mlp"])
def test_chunked_eigenvalue_agrees_and_a_tiny_budget_runs_one_point_per_chunk(make):
    model = make()
    x, y = _data()
    whole = top_hessian(model, x, y, iters=40, seed=0)
    tiny = top_hessian(model, x, y, iters=40, seed=0, options=HvpOptions(max_bytes=1))
    assert (whole["chunks"], whole["points_per_chunk"]) == (1, len(x))
    assert (tiny["chunks"], tiny["points_per_chunk"]) == (len(x), 1)
    assert tiny["iters"] == whole["iters"]
    assert abs(tiny["value"] - whole["value"]) <= 1e-10 * abs(whole["value"])
    for key in ("loss", "sharpness_w2", "sharpness_per_loss", "sharpness_per_input", "weight_norm2"):
        assert tiny[key] == pytest.approx(whole[key], rel=1e-10)
    assert set(whole) == set(tiny) - {"graph_bytes_per_point"}


def test_a_budget_that_holds_every_point_keeps_the_single_graph():
    model = _mlp()
    x, y = _data()
    r = top_hessian(model, x, y, iters=10, seed=0, options=HvpOptions(max_bytes=1 << 30))
    assert (r["chunks"], r["points_per_chunk"]) == (1, len(x)) and r["graph_bytes_per_point"] > 0
    assert r["value"] == top_hessian(model, x, y, iters=10, seed=0)["value"]


def test_chunks_grow_with_the_budget_and_respect_a_static_batch():
    x, y = _data(20)
    model = _mlp()
    sizes = [hessian_products(model, x, y, max_bytes=int(b)).points_per_chunk for b in np.geomspace(2**14, 2**22, 60)]
    assert sizes == sorted(sizes) and sizes[0] == 1 and sizes[-1] == 20 and len(set(sizes)) >= 3
    assert chunk_points(100, 10.0, 0.0, 400) == 20 and chunk_points(100, 10.0, 0.0, 400, unit=3) == 18
    assert chunk_points(100, 10.0, 500.0, 400) == 1 and chunk_points(10, 1.0, 0.0, 10**6) == 10
    assert chunk_points(107, 20.0, 0.0, 1160) == 27  # at most 29 a chunk: four chunks, as even as they can be
    net = _cnn().inner
    static = FlatInput(net, (1, 6, 6), static_batch=4)
    whole = hessian_products(static, x, y)
    chunked = hessian_products(static, x, y, max_bytes=1)
    assert chunked.points_per_chunk == 4 and chunked.chunks == 5
    v = torch.randn(whole.like.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert _rel(chunked.hvp(v), whole.hvp(v)) <= 1e-10


def test_finite_differences_chunk_the_same_way():
    model = _cnn()
    x, y = _data()
    whole = hessian_products(model, x, y, finite_differences=True)
    chunked = hessian_products(model, x, y, finite_differences=True, max_bytes=1)
    assert whole.how.startswith("central") and chunked.how.startswith("central")
    assert (whole.chunks, chunked.chunks, chunked.points_per_chunk) == (1, len(x), 1)
    v = torch.randn(whole.like.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert _rel(chunked.hvp(v), whole.hvp(v)) <= 1e-8
    exact = hessian_products(model, x, y).hvp(v)
    assert _rel(chunked.hvp(v), exact) <= 1e-4
