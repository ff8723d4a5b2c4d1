"""The roofline's model of the engine's optimiser traffic (`benchmarks.roofline.optimiser_passes`) against the
operations each update of `empirics.nets.engine` actually dispatches (a dispatch mode sums the elements read and
written of every W-sized argument and result), and the floor's arithmetic against a hand count."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchmarks.roofline import CACHE_BYTES, FLOAT32_BYTES, EpochShape, Rates, epoch_floor, optimiser_passes
from empirics.nets import engine
from empirics.nets.models import ModelSpec, build_model
from empirics.nets.protocols import PAPER, protocol_config


class Traffic(TorchDispatchMode):
    """Elements read and written by every operation, counting only tensors of at least `min_numel` elements: each
    distinct argument once as read (views and lists of slices included), each argument the schema marks as written
    (in place) and each fresh result as written; view operations (results aliasing an argument) move nothing."""

    def __init__(self, min_numel: int):
        super().__init__()
        self.min_numel, self.elements = min_numel, 0

    def _big(self, value: object) -> list[torch.Tensor]:
        return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor) and t.numel() >= self.min_numel]

    @staticmethod
    def _read_only(func, arg, kwargs) -> bool:
        """The fused Adam kernel's schema marks its gradients as written, but the kernel stores them back only to
        unscale them with a `grad_scale` (`aten/src/ATen/native/cuda/fused_adam_utils.cuh`); the engine passes none."""
        return "_fused_adam" in func.__name__ and arg.name == "grads" and kwargs.get("grad_scale") is None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        out = func(*args, **kwargs)
        if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return out  # a view
        values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
        seen: set[tuple[int, int]] = set()
        for arg, value in zip(schema.arguments, values, strict=False):
            for t in self._big(value):
                if (t.data_ptr(), t.numel()) not in seen:
                    seen.add((t.data_ptr(), t.numel()))
                    self.elements += t.numel()
                if arg.alias_info is not None and arg.alias_info.is_write and not self._read_only(func, arg, kwargs):
                    self.elements += t.numel()
        if not any(r.alias_info is not None for r in schema.returns):
            self.elements += sum(t.numel() for t in self._big(out))
        return out


def _stack(padded: bool, weight_decay: float, decay: str) -> engine._Stack:
    x, y = torch.rand(50, 784, generator=torch.Generator().manual_seed(0)), torch.arange(50) % 10
    cfg = dataclasses.replace(protocol_config(PAPER, 2), weight_decay=weight_decay, decay=decay)
    widths = (64, 32) if padded else (64, 64)
    jobs = [(build_model(ModelSpec("relu", 784, m, 10, seed=s), x), x, y, cfg, None, None, "job")
            for s, m in enumerate(widths)]
    return engine._Stack([engine._prepare(i, job) for i, job in enumerate(jobs)], padded)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("wd_decay", [(0.0, "coupled"), (1e-3, "coupled"), (1e-3, "decoupled")])
def test_the_modelled_passes_are_what_the_update_dispatches(fused: bool, padded: bool,
                                                            wd_decay: tuple[float, str]) -> None:
    wd, decay = wd_decay
    st = _stack(padded, wd, decay)
    grad = torch.randn_like(st.W)
    count = Traffic(min_numel=32 * 784)  # a network's slice at the narrowest width; per-network scalars are smaller
    with count:
        (engine._update_fused if fused else engine._update)(st, grad, 3)
    assert count.elements / st.W.numel() == optimiser_passes(fused, padded, wd, decay)


def test_the_floor_adds_products_at_the_gemm_rate_and_traffic_at_the_bandwidth() -> None:
    stacks = [(20, 4096), (40, 64)]
    n, batch, d, out_dim, passes = 300, 128, 784, 10, 20
    floor = epoch_floor(stacks, EpochShape(n, batch, d, out_dim), Rates(gemm_flop_s=1e12, bandwidth_b_s=1e11), passes)
    steps = 3  # 128 + 128 + 44 points
    flops = steps * 2.0 * batch * (20 * 4096 + 40 * 64) * (2 * d + 2 * out_dim)  # full batches in every step
    traffic = steps * (passes + 1) * 20 * 4096 * d * FLOAT32_BYTES  # 40 x 64 x 784 floats (8 MB) stay in cache
    assert floor["steps"] == steps and floor["flops"] == pytest.approx(flops)
    assert floor["gemm_s"] == pytest.approx(flops / 1e12) and floor["memory_s"] == pytest.approx(traffic / 1e11)
    assert floor["floor_s"] == pytest.approx(floor["gemm_s"] + floor["memory_s"])
    assert 40 * 64 * d * FLOAT32_BYTES < CACHE_BYTES <= 20 * 4096 * d * FLOAT32_BYTES
