"""Sharpness for `verify audit`: the top Hessian eigenvalue of the mean training loss (`top_hessian`) on the
training points `hessian_subset` chooses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from empirics.experiments.landscape import power_iteration, scale_aware
from empirics.nets.losses import loss_fn


def _flat_grad(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
               create_graph: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    with torch.enable_grad():
        out = model(x)
        loss = loss_fn(out.shape[1])(out, y).mean()
        grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True))
    return loss, grads


def _saved_bytes(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                 create_graph: bool) -> tuple[int, tuple[torch.Tensor, ...]]:
    """Bytes of the tensors autograd saves for the gradient of the mean loss on `x` (the forward's, and with
    `create_graph` also the backward's: the double-backward graph), each storage once, the parameters' own storages
    (held anyway) left out; and the gradients (whose graph holds them when `create_graph`)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # alive until the sum is taken, so no storage address is reused meanwhile

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            s = t.untyped_storage()
            key, nbytes = s.data_ptr(), s.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without a plain storage (sparse, wrappers)
            key, nbytes = -id(t), t.numel() * t.element_size()
        if key not in skip:
            seen[key] = nbytes
        keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, grads = _flat_grad(model, params, x, y, create_graph=create_graph)
    total = sum(seen.values())
    keep.clear()
    return total, grads


#: Peak memory of one chunk's Hessian-vector product per point over the bytes its graph saves per point: the product's
#: backward holds, beside the graph, gradients w.r.t. activations and the backward-of-backward's intermediates. Measured
#: on the CIFAR-10 ResNet-18 (float32, 8.9 MiB saved per image): 14.6 MiB of peak resident memory per image as a
#: module, 18.8 MiB as the exported program the audit loads (1.6 and 2.1 times).
HVP_PEAK_OVER_SAVED = 2.25
#: Parameter-sized buffers counted beside the graph: the chunk's gradients, its product, the running sum, the power
#: iteration's vectors, and what the first products allocate once (the same ResNet-18: 0.39-0.44 GiB at one point per
#: chunk, nine to ten times its 43 MiB of parameters).
HVP_PARAM_BUFFERS = 10
#: Share of `max_bytes` one chunk's product may take (the rest of the audit holds its data, kernels and model).
HVP_BUDGET_SHARE = 0.5


def chunk_points(n: int, per_point: float, fixed: float, max_bytes: int, unit: int = 1) -> int:
    """Points per chunk: the fewest chunks whose estimated peak `fixed + points * per_point` stays within
    `HVP_BUDGET_SHARE * max_bytes`, made as even as they can be (sizes a multiple of `unit`, at least `unit`, at most
    `n`; the last chunk takes the rest)."""
    room = HVP_BUDGET_SHARE * max_bytes - fixed
    most = max(1, int(room // max(per_point * unit, 1.0)))  # units per chunk
    units = -(-n // unit)
    return min(n, -(-units // -(-units // most)) * unit)


def _chunk_size(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                max_bytes: int, create_graph: bool) -> tuple[int, float, tuple[torch.Tensor, ...]]:
    """(points per chunk, saved bytes per point, the smaller probe's gradients) from probes on one and two points
    (`u` and `2u` for a model that runs batches of exactly `u = model.static_batch` points, as `FlatInput` does for a
    program exported with a static batch size; chunks are then multiples of `u`). The saved bytes are affine in the
    points, `fixed + k per`, for models whose points do not interact (batch norm in evaluation mode), so the two probes
    give both; the parameter-sized buffers (`HVP_PARAM_BUFFERS`) are added to the fixed part."""
    unit = max(1, int(getattr(model, "static_batch", None) or 1))
    b2, _ = _saved_bytes(model, params, x[:2 * unit], y[:2 * unit], create_graph)
    b1, g1 = _saved_bytes(model, params, x[:unit], y[:unit], create_graph)
    per_unit = float(b2 - b1) if b2 > b1 else b2 / 2.0
    fixed = HVP_PEAK_OVER_SAVED * max(0.0, b1 - per_unit)
    fixed += HVP_PARAM_BUFFERS * sum(p.numel() * p.element_size() for p in params)
    per = per_unit / unit
    return chunk_points(len(x), HVP_PEAK_OVER_SAVED * per, fixed, max_bytes, unit), per, g1


def _chunked_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, slices: list[slice]) -> torch.Tensor:
    """The mean loss over all points: the per-point losses summed over the chunks (no graph, float64), over `n`."""
    n = len(x)
    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for sl in slices:
            out = model(x[sl])
            total += loss_fn(out.shape[1])(out, y[sl]).double().sum()
    return total / n


@dataclass
class HessianProducts:
    """Hessian-vector products of the mean loss over `x` (`hvp`, on flat vectors of all trained parameters), from
    `hessian_products`: `loss` is the mean loss at the parameters, `how` says how the products are taken, and the
    points are split into `chunks` of `points_per_chunk` (one chunk: a single reused graph)."""

    hvp: Callable[[torch.Tensor], torch.Tensor]
    like: torch.Tensor
    loss: float
    how: str
    chunks: int
    points_per_chunk: int
    graph_bytes_per_point: float | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"chunks": self.chunks, "points_per_chunk": self.points_per_chunk}
        if self.graph_bytes_per_point is not None:
            out["graph_bytes_per_point"] = self.graph_bytes_per_point
        return out


def hessian_products(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, finite_differences: bool = False,
                     max_bytes: int | None = None) -> HessianProducts:
    """Hessian-vector products of the mean loss for `top_hessian` (see there for the double-backward, finite-difference
    and chunked variants)."""
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = [p.numel() for p in params]
    shapes = [p.shape for p in params]
    like = torch.zeros(sum(sizes), dtype=params[0].dtype, device=params[0].device)
    n = len(x)

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [c.reshape(s) for c, s in zip(torch.split(v, sizes), shapes, strict=True)]

    def slices_of(size: int) -> list[slice]:
        return [slice(i, min(n, i + size)) for i in range(0, n, size)]

    per: float | None = None
    try:
        if finite_differences:
            raise RuntimeError("asked for")
        size = n
        if max_bytes is not None and n > 1:
            size, per, g1 = _chunk_size(model, params, x, y, max_bytes, create_graph=True)
            if not any(g.requires_grad for g in g1):
                raise RuntimeError("the gradient does not depend on the parameters")
            torch.autograd.grad(g1, params, grad_outputs=split(like), allow_unused=True)  # has double backward?
            del g1
        if size >= n:
            slices = slices_of(n)
            loss, grads = _flat_grad(model, params, x, y, create_graph=True)
            if not any(g.requires_grad for g in grads):
                raise RuntimeError("the gradient does not depend on the parameters")

            def hvp(v: torch.Tensor) -> torch.Tensor:
                hs = torch.autograd.grad(grads, params, grad_outputs=split(v), retain_graph=True, allow_unused=True)
                return torch.cat([torch.zeros(k, dtype=v.dtype, device=v.device) if h is None else h.reshape(-1)
                                  for h, k in zip(hs, sizes, strict=True)])

            hvp(like)
        else:
            slices = slices_of(size)
            loss = _chunked_loss(model, x, y, slices)

            def hvp(v: torch.Tensor) -> torch.Tensor:
                parts, total = split(v), torch.zeros_like(v)
                acc = split(total)
                for sl in slices:
                    _, g = _flat_grad(model, params, x[sl], y[sl], create_graph=True)
                    hs = torch.autograd.grad(g, params, grad_outputs=parts, allow_unused=True)
                    del g
                    w = (sl.stop - sl.start) / n
                    for a, h in zip(acc, hs, strict=True):
                        if h is not None:
                            a.add_(h, alpha=w)
                return total

        how = "double backward"
    except RuntimeError as exc:
        reason = str(exc).splitlines()[0][:160]
        size, per = n, None
        if max_bytes is not None and n > 1:
            size, per, _ = _chunk_size(model, params, x, y, max_bytes, create_graph=False)
        slices = slices_of(size)
        loss = _flat_grad(model, params, x, y)[0] if len(slices) == 1 else _chunked_loss(model, x, y, slices)
        with torch.no_grad():
            h = 1e-3 * max(1.0, float(torch.sqrt(sum((p.double() ** 2).sum() for p in params))))

        def grad_at() -> tuple[torch.Tensor, ...]:
            if len(slices) == 1:
                return _flat_grad(model, params, x, y)[1]
            total = like.clone()
            acc = split(total)
            for sl in slices:
                _, g = _flat_grad(model, params, x[sl], y[sl])
                w = (sl.stop - sl.start) / n
                for a, gi in zip(acc, g, strict=True):
                    a.add_(gi, alpha=w)
            return tuple(acc)

        def hvp(v: torch.Tensor) -> torch.Tensor:
            parts = split(v)
            with torch.no_grad():
                for p, d in zip(params, parts, strict=True):
                    p.add_(d, alpha=h)
            try:
                gp = grad_at()
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.sub_(d, alpha=2 * h)
                gm = grad_at()
            finally:
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.add_(d, alpha=h)
            return torch.cat([((a - b) / (2 * h)).reshape(-1) for a, b in zip(gp, gm, strict=True)])

        how = f"central differences of gradients (no double backward: {reason})"
    return HessianProducts(hvp, like, float(loss.detach()), how, len(slices), min(size, n), per)


@dataclass(frozen=True)
class HvpOptions:
    """How `top_hessian` forms its products: central differences even where double backward works
    (`finite_differences`), and the memory budget that sizes the chunks (`max_bytes`; None: one graph)."""

    finite_differences: bool = False
    max_bytes: int | None = None


def top_hessian(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, iters: int, seed: int,
                options: HvpOptions = HvpOptions()) -> dict[str, Any]:
    """Top Hessian eigenvalue of the mean training loss w.r.t. all trained parameters (power iteration on
    Hessian-vector products), with the scale-aware normalisations of `empirics.experiments.landscape.scale_aware`.

    Products come from double backward; where an operation has no second derivative (e.g. PyTorch's CPU
    flash attention) they come from central differences of gradients, `(g(t + h v) - g(t - h v)) / 2h`
    with `h = 1e-3 max(1, ||theta||)` (also when `options.finite_differences`), and `hvp` says which.

    Memory. Without `options.max_bytes` one double-backward graph over all points is built once and reused by every
    product (the CIFAR-10 ResNet-18 as the audit loads it, float32, 107 images: 2.5 GiB above the model and data).
    With `max_bytes` (the audit's memory budget), probes on one and two points measure the bytes that graph saves per
    point (`torch.autograd.graph.saved_tensors_hooks`, each storage once, the parameters left out: deterministic and
    independent of what the process held before, unlike resident-memory growth); a product is taken to peak at
    `HVP_PEAK_OVER_SAVED` times that plus `HVP_PARAM_BUFFERS` parameter-sized buffers, and the points are split into
    `chunks` of `points_per_chunk`, as even as they can be, so that this stays within `HVP_BUDGET_SHARE` (half) of
    `max_bytes`. Then `H v = sum_c (n_c / n) H_c v`, each chunk's graph built and freed within every product: the
    chunk's forward and gradient are recomputed each time, about one extra forward and backward per point per product
    (the ResNet-18 above within 2 GiB: 4 chunks of 27, 1.0 GiB above the model and data, 1.0-1.2 times the single
    graph's wall time: 263 s against 265 s for 20 products, 83 s against 70 s for 5, on a loaded 2-core CPU, one torch
    thread; `benchmarks/bench_sharpness_memory.py`). When all points fit in one chunk the single reused graph is kept
    (the probes cost a forward and backward on three points). The finite-difference products are chunked the same way,
    sized by a probe of the forward graph alone. `loss` is the mean over all points either way (chunked: the per-point
    losses summed over the chunks in float64, over `n`). Chunking assumes a point's loss does not depend on the other
    points in its batch (batch norm in evaluation mode, as the audit loads models). `max_bytes=None` is the behaviour
    before chunking; the result's `chunks` and `points_per_chunk` say what ran (and, with `max_bytes`,
    `graph_bytes_per_point` the probe's saved bytes per point).
    """
    t0 = time.perf_counter()
    ops = hessian_products(model, x, y, options.finite_differences, options.max_bytes)
    try:
        res = power_iteration(ops.hvp, ops.like, iters, seed, tol=1e-4)
    except RuntimeError as exc:
        return {"value": float("nan"), "error": str(exc).splitlines()[0][:200], "wall_s": time.perf_counter() - t0,
                **ops.describe()}
    params = [p for p in model.parameters() if p.requires_grad]
    w2 = float(sum((p.detach().double() ** 2).sum() for p in params))
    f2 = float((x.double() ** 2).sum(dim=1).mean())
    res.update(scale_aware(res["value"], ops.loss, w2, f2))
    res.update({"loss": ops.loss, "weight_norm2": w2, "hvp": ops.how, "wall_s": time.perf_counter() - t0,
                **ops.describe()})
    return res


#: Sharpness runs on all training points while points x parameters stays within this; beyond it, on a seeded
#: subsample of `HESSIAN_VALUES // parameters` points (at least `HESSIAN_MIN_POINTS`): a Hessian-vector product costs
#: about four backward passes over its points, so a ResNet-18 on 1,000 images would spend most of the audit here.
HESSIAN_VALUES = 1_200_000_000
HESSIAN_MIN_POINTS = 32


def hessian_subset(n: int, n_params: int, points: int | None, seed: int) -> np.ndarray:
    """Sorted indices of the training points the sharpness is measured on (`--hessian-points`, else the rule above)."""
    m = points if points is not None else max(HESSIAN_MIN_POINTS, HESSIAN_VALUES // max(1, n_params))
    if m >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed + 7919).choice(n, m, replace=False))
