"""Empirical neural tangent kernels.

Fast path (DESIGN.md): for the paper's two networks only `W` is trained and
`d f_c / d w_r = m^-1/2 a_rc relu'(w_r . x~) x~`, so

    Theta_cc'(x, x') = (1/m) <x~, x~'> * sum_r a_rc a_rc' D[x, r] D[x', r]

i.e. `(1/m) (X~ X~'^T) o (D diag(a_c o a_c') D'^T)`: two matrix products per output pair instead of
a contraction of per-example Jacobians. The generic path works for any `nn.Module` with
`torch.func` (per-example Jacobians with vmap, chunked to bound memory). Each is tested and
benchmarked against the other.

The trainable-attention variant (`QKVAttentionNet`, `x~ = u / |u|`, `u = (x Q) M`, `M = K^T C V`) has a
closed form too (`ntk_qkv`): the W block above on its features plus, per output c, with
`h_c = (I - x~ x~^T) g_c / |u|` and `g_c = m^-1/2 W^T (a_c o relu'(W x~))` (the gradient of f_c in u),
`alpha^2 [ <x, x'> h_c M^T M h'_c + <q, q'> h_c (CV)^T (CV) h'_c + q (CK)^T (CK) q' <h_c, h'_c> ]`
for the Q, K and V blocks (`q = x Q`): Gram products in the k-dimensional attention space instead of
Jacobians with 3 d k columns.

Kernel `reduction`: "mean" gives `(1/c) sum_c Theta_cc` (the per-output kernel that the analytic
NTK of Thm 4.2 predicts; the one influence uses), "trace" the sum, "full" the (n1, n2, c, c) block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from empirics.models import QKVAttentionNet, TwoLayerNet

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


def _pair_sum(p1: torch.Tensor, p2: torch.Tensor, reduction: str) -> torch.Tensor:
    """`sum_k p1[i, c, k] p2[j, c', k]`: the (n1, n2, c, c) block ("full"), or its trace / mean over c = c'."""
    if reduction == "full":
        return torch.einsum("ick,jdk->ijcd", p1, p2)
    out = p1.reshape(p1.shape[0], -1) @ p2.reshape(p2.shape[0], -1).T
    return out / p1.shape[1] if reduction == "mean" else out


def _qkv_parts(model: QKVAttentionNet, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-point factors of `ntk_qkv`: `q = x Q` and, per output, `h_c` (the gradient of f_c in x~ projected and
    divided by |u|)."""
    q = x @ (model.alpha * model.W_Q)
    u = q @ model.mixing()
    norm = u.norm(dim=1, keepdim=True).clamp_min(1e-30)
    f = u / norm
    D = (f @ model.W.T > 0).to(x.dtype)
    g = torch.stack([(D * a_c) @ model.W for a_c in model.A.T], dim=1) / model.spec.width**0.5
    h = (g - (g @ f.unsqueeze(2)) * f.unsqueeze(1)) / norm.unsqueeze(1)
    return q, h


@torch.no_grad()
def ntk_qkv(model: QKVAttentionNet, x1: torch.Tensor, x2: torch.Tensor | None = None,
            reduction: str = "mean") -> torch.Tensor:
    """Closed-form empirical NTK of `QKVAttentionNet`: the W block plus the Q, K and V blocks (module docstring)."""
    _check_reduction(reduction)
    k_w = ntk_two_layer(model, x1, x2, reduction)  # the head block only needs features, W and A
    q1, h1 = _qkv_parts(model, x1)
    q2, h2 = (q1, h1) if x2 is None else _qkv_parts(model, x2)
    xx2 = x1 if x2 is None else x2
    a = model.alpha
    M = model.mixing()
    CK, CV = model.context @ (a * model.W_K), model.context @ (a * model.W_V)
    blocks = ((x1 @ xx2.T, _pair_sum(h1 @ (M.T @ M), h2, reduction)),  # Q
              (q1 @ q2.T, _pair_sum(h1 @ (CV.T @ CV), h2, reduction)),  # K
              ((q1 @ (CK.T @ CK)) @ q2.T, _pair_sum(h1, h2, reduction)))  # V
    total = torch.zeros_like(k_w)
    for shared, per_out in blocks:
        total += (shared[:, :, None, None] if reduction == "full" else shared) * per_out
    return k_w + a**2 * total


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
    """Dispatch: the closed form for the suite's networks, the generic path otherwise."""
    if method == "auto":
        method = "closed" if isinstance(model, (TwoLayerNet, QKVAttentionNet)) else "generic"
    if method == "closed":
        if isinstance(model, QKVAttentionNet):
            return ntk_qkv(model, x1, x2, reduction)
        if not isinstance(model, TwoLayerNet):
            raise ValueError("the closed-form NTK applies only to the suite's TwoLayerNet and QKVAttentionNet")
        return ntk_two_layer(model, x1, x2, reduction)
    return ntk_generic(model, x1, x2, reduction)
