"""Empirical neural tangent kernels.

Fast path (DESIGN.md): for the paper's two networks only `W` is trained and
`d f_c / d w_r = m^-1/2 a_rc relu'(w_r . x~) x~`, so

    Theta_cc'(x, x') = (1/m) <x~, x~'> * sum_r a_rc a_rc' D[x, r] D[x', r]

i.e. `(1/m) (X~ X~'^T) o (D diag(a_c o a_c') D'^T)`: two matrix products per output pair instead of
a contraction of per-example Jacobians. The generic path works for any `nn.Module` with
`torch.func` (per-example Jacobians with vmap, chunked to bound memory). Each is tested and
benchmarked against the other.

Kernel `reduction`: "mean" gives `(1/c) sum_c Theta_cc` (the per-output kernel that the analytic
NTK of Thm 4.2 predicts; the one influence uses), "trace" the sum, "full" the (n1, n2, c, c) block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from empirics.models import TwoLayerNet

REDUCTIONS = ("mean", "trace", "full")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


@torch.no_grad()
def ntk_two_layer(model: TwoLayerNet, x1: torch.Tensor, x2: torch.Tensor | None = None,
                  reduction: str = "mean", weights: torch.Tensor | None = None) -> torch.Tensor:
    """Closed-form empirical NTK of a `TwoLayerNet` (only W trained). `weights` overrides W."""
    _check_reduction(reduction)
    W = model.W if weights is None else weights
    m = W.shape[0]
    f1 = model.features(x1)
    f2 = f1 if x2 is None else model.features(x2)
    d1 = (f1 @ W.T > 0).to(f1.dtype)
    d2 = d1 if x2 is None else (f2 @ W.T > 0).to(f2.dtype)
    gram = f1 @ f2.T
    A = model.A
    if reduction == "full":
        c = A.shape[1]
        out = torch.empty(f1.shape[0], f2.shape[0], c, c, dtype=f1.dtype, device=f1.device)
        for i in range(c):
            for j in range(i, c):
                blk = gram * ((d1 * (A[:, i] * A[:, j])) @ d2.T) / m
                out[:, :, i, j] = blk
                out[:, :, j, i] = blk
        return out
    scale = (A * A).sum(dim=1)  # ||a_r||^2 over outputs
    k = gram * ((d1 * scale) @ d2.T) / m
    return k / A.shape[1] if reduction == "mean" else k


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def ntk_generic(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, reduction: str = "mean",
                params: dict[str, torch.Tensor] | None = None, max_bytes: int = 1 << 30,
                forward: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """Empirical NTK of any module from per-example Jacobians (`torch.func.jacrev` + `vmap`).

    The kernel is accumulated over chunks of examples so that at most about `max_bytes` of Jacobian
    is alive at once. `params` selects the trained parameters (default: all with requires_grad).
    """
    from torch.func import functional_call, jacrev, vmap

    _check_reduction(reduction)
    if params is None:
        params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    n_params = sum(p.numel() for p in params.values())

    def f_single(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return out.reshape(-1)

    jac_fn = vmap(jacrev(f_single), in_dims=(None, 0))
    with torch.no_grad():
        c = f_single(params, x1[0]).numel()
    itemsize = x1.element_size()
    chunk = max(1, int(max_bytes // max(1, 2 * c * n_params * itemsize)))

    def jac(x: torch.Tensor) -> torch.Tensor:
        j = jac_fn(params, x)
        return torch.cat([v.reshape(x.shape[0], c, -1) for v in j.values()], dim=2)

    sym = x2 is None
    x2 = x1 if x2 is None else x2
    n1, n2 = x1.shape[0], x2.shape[0]
    shape = (n1, n2, c, c) if reduction == "full" else (n1, n2)
    out = torch.zeros(shape, dtype=x1.dtype, device=x1.device)
    s1_list = _chunks(n1, chunk)
    for s1 in s1_list:
        j1 = jac(x1[s1])
        for s2 in _chunks(n2, chunk):
            if sym and s2.start < s1.start:
                continue
            j2 = j1 if (sym and s2 == s1) else jac(x2[s2])
            if reduction == "full":
                blk = torch.einsum("icp,jdp->ijcd", j1, j2)
            else:
                blk = torch.einsum("icp,jcp->ij", j1, j2)
                if reduction == "mean":
                    blk = blk / c
            out[s1, s2] = blk
            if sym and s2 != s1:
                out[s2, s1] = blk.transpose(0, 1) if reduction != "full" else blk.permute(1, 0, 3, 2)
    return out.detach()


def empirical_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, reduction: str = "mean",
                  method: str = "auto") -> torch.Tensor:
    """Dispatch: the closed form for the paper's networks, the generic path otherwise."""
    if method == "auto":
        method = "closed" if isinstance(model, TwoLayerNet) else "generic"
    if method == "closed":
        if not isinstance(model, TwoLayerNet):
            raise ValueError("the closed-form NTK applies only to the suite's TwoLayerNet")
        return ntk_two_layer(model, x1, x2, reduction)
    return ntk_generic(model, x1, x2, reduction)
