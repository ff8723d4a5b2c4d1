"""Sharpness for `verify audit`: the top Hessian eigenvalue of the mean training loss (`top_hessian`) on the
training points `hessian_subset` chooses."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from empirics.landscape import power_iteration, scale_aware
from empirics.losses import loss_fn


def _flat_grad(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
               create_graph: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    with torch.enable_grad():
        out = model(x)
        loss = loss_fn(out.shape[1])(out, y).mean()
        grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True))
    return loss, grads


def top_hessian(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, iters: int, seed: int,
                finite_differences: bool = False) -> dict[str, Any]:
    """Top Hessian eigenvalue of the mean training loss w.r.t. all trained parameters (power iteration on
    Hessian-vector products), with the scale-aware normalisations of `empirics.landscape.scale_aware`.

    Products come from double backward; where an operation has no second derivative (e.g. PyTorch's CPU
    flash attention) they come from central differences of gradients, `(g(t + h v) - g(t - h v)) / 2h`
    with `h = 1e-3 max(1, ||theta||)` (also when `finite_differences`), and `hvp` says which.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = [p.numel() for p in params]
    shapes = [p.shape for p in params]
    like = torch.zeros(sum(sizes), dtype=params[0].dtype)
    t0 = time.perf_counter()

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [c.reshape(s) for c, s in zip(torch.split(v, sizes), shapes, strict=True)]

    try:
        if finite_differences:
            raise RuntimeError("asked for")
        loss, grads = _flat_grad(model, params, x, y, create_graph=True)
        if not any(g.requires_grad for g in grads):
            raise RuntimeError("the gradient does not depend on the parameters")

        def hvp(v: torch.Tensor) -> torch.Tensor:
            hs = torch.autograd.grad(grads, params, grad_outputs=split(v), retain_graph=True, allow_unused=True)
            return torch.cat([torch.zeros(n, dtype=v.dtype) if h is None else h.reshape(-1)
                              for h, n in zip(hs, sizes, strict=True)])

        hvp(like)
        how = "double backward"
    except RuntimeError as exc:
        reason = str(exc).splitlines()[0][:160]
        loss, _ = _flat_grad(model, params, x, y)
        with torch.no_grad():
            h = 1e-3 * max(1.0, float(torch.sqrt(sum((p.double() ** 2).sum() for p in params))))

        def hvp(v: torch.Tensor) -> torch.Tensor:
            parts = split(v)
            with torch.no_grad():
                for p, d in zip(params, parts, strict=True):
                    p.add_(d, alpha=h)
            try:
                _, gp = _flat_grad(model, params, x, y)
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.sub_(d, alpha=2 * h)
                _, gm = _flat_grad(model, params, x, y)
            finally:
                with torch.no_grad():
                    for p, d in zip(params, parts, strict=True):
                        p.add_(d, alpha=h)
            return torch.cat([((a - b) / (2 * h)).reshape(-1) for a, b in zip(gp, gm, strict=True)])

        how = f"central differences of gradients (no double backward: {reason})"
    try:
        res = power_iteration(hvp, like, iters, seed, tol=1e-4)
    except RuntimeError as exc:
        return {"value": float("nan"), "error": str(exc).splitlines()[0][:200], "wall_s": time.perf_counter() - t0}
    w2 = float(sum((p.detach().double() ** 2).sum() for p in params))
    f2 = float((x.double() ** 2).sum(dim=1).mean())
    lv = float(loss.detach())
    res.update(scale_aware(res["value"], lv, w2, f2))
    res.update({"loss": lv, "weight_norm2": w2, "hvp": how, "wall_s": time.perf_counter() - t0})
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
