"""Empirical neural tangent kernels: one entry point, `empirical_ntk`, with a choice of implementation.

Implementations (`NtkImpl`, modelled on neural-tangents' `empirical_ntk_fn(implementation=...)`; every pair is
compared in `tests/empirics/test_ntk_implementations.py`):

- `closed_form`: the suite's own networks only. For the paper's two networks only `W` is trained and
  `d f_c / d w_r = m^-1/2 a_rc relu'(w_r . x~) x~`, so

      Theta_cc'(x, x') = (1/m) <x~, x~'> * sum_r a_rc a_rc' D[x, r] D[x', r]

  i.e. `(1/m) (X~ X~'^T) o (D diag(a_c o a_c') D'^T)`: two matrix products per output pair instead of a
  contraction of per-example Jacobians (docs/DESIGN.md). The trainable-attention variant (`QKVAttentionNet`,
  `x~ = u / |u|`, `u = (x Q) M`, `M = K^T C V`) adds, per output c, with `h_c = (I - x~ x~^T) g_c / |u|` and
  `g_c = m^-1/2 W^T (a_c o relu'(W x~))` (the gradient of f_c in u),
  `alpha^2 [ <x, x'> h_c M^T M h'_c + <q, q'> h_c (CV)^T (CV) h'_c + q (CK)^T (CK) q' <h_c, h'_c> ]`
  for the Q, K and V blocks (`q = x Q`): Gram products in the k-dimensional attention space instead of
  Jacobians with 3 d k columns.
- `torch_func`: any eager `nn.Module`, per-example Jacobians with `torch.func.jacrev` + `vmap`, chunked to bound
  memory.
- `autograd_factored`: `empirics.kernels.audit_ntk.ModelJacobian`, plain autograd one example (or one batch) at a time,
  with the linear layers of an FX graph (a `torch.export` program's `.module()`) factored; the one path that
  takes TorchScript modules and exported programs, which `torch.func` refuses. "mean" reduction only, on CPU.
- `auto`: `closed_form` for the suite's networks (exactly their classes, with no other parameter trainable:
  `closed_form_gap`; anything else gets a Jacobian path, never a kernel that drops a parameter),
  `autograd_factored` for TorchScript modules and FX graphs, `torch_func` for any other module.

The trained parameters are the model's own (`W` for `TwoLayerNet`; `W`, `W_Q`, `W_K`, `W_V` for
`QKVAttentionNet`) in the closed form, and those that require grad in the Jacobian paths.

Kernel `reduction`: "mean" gives `(1/c) sum_c Theta_cc` (the per-output kernel that the analytic NTK of Thm 4.2,
`theory.kernels.analytic_ntk_two_layer`, predicts; the one influence uses), "trace" the sum, "full" the
(n1, n2, c, c) block.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn

from empirics.kernels.audit_ntk import ModelJacobian
from empirics.nets.models import QKVAttentionNet, TwoLayerNet
from ntkm.errors import UserInputError

REDUCTIONS = ("mean", "trace", "full")


class NtkImpl(str, Enum):
    """How `empirical_ntk` computes the kernel (module docstring); the plain strings are accepted too."""

    AUTO = "auto"
    CLOSED_FORM = "closed_form"
    TORCH_FUNC = "torch_func"
    AUTOGRAD_FACTORED = "autograd_factored"


@dataclass(frozen=True)
class JacobianOptions:
    """How the two Jacobian paths run: the bytes of Jacobian held at once (`max_bytes`; None: each path's default)
    and the batch size a program was exported with (`static_batch`, `autograd_factored` only)."""

    max_bytes: int | None = None
    static_batch: int | None = None


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise UserInputError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


#: The trained parameters the closed form differentiates, per network class (module docstring).
CLOSED_FORM_PARAMETERS: dict[type, tuple[str, ...]] = {TwoLayerNet: ("W",), QKVAttentionNet: ("W", "W_Q", "W_K", "W_V")}


def closed_form_gap(model: nn.Module) -> str | None:
    """Why the closed form would not be `model`'s exact kernel (None: it is): the model is not exactly one of the
    suite's network classes (a subclass may compute or train more), or parameters it does not differentiate train."""
    covered = CLOSED_FORM_PARAMETERS.get(type(model))
    if covered is None:
        return f"{type(model).__name__} is not one of {', '.join(c.__name__ for c in CLOSED_FORM_PARAMETERS)}"
    extra = [n for n, p in model.named_parameters() if p.requires_grad and n not in covered]
    return f"trainable parameters {', '.join(extra)} besides {', '.join(covered)}" if extra else None


def resolve_implementation(model: nn.Module, implementation: NtkImpl | str = NtkImpl.AUTO) -> NtkImpl:
    """The implementation `empirical_ntk` uses for `model`: `implementation` itself, or the choice of "auto"."""
    try:
        impl = NtkImpl(implementation)
    except ValueError:
        names = ", ".join(repr(i.value) for i in NtkImpl)
        raise UserInputError(f"unknown empirical-NTK implementation {implementation!r}; "
                             f"choose one of {names}") from None
    if impl is NtkImpl.CLOSED_FORM:
        why = closed_form_gap(model)
        if why:
            raise UserInputError(f"the closed-form NTK does not cover this model ({why}); use implementation "
                                 "'torch_func' or 'autograd_factored'")
    if impl is not NtkImpl.AUTO:
        return impl
    if closed_form_gap(model) is None:
        return NtkImpl.CLOSED_FORM
    if isinstance(model, (torch.jit.ScriptModule, torch.fx.GraphModule)):
        return NtkImpl.AUTOGRAD_FACTORED
    return NtkImpl.TORCH_FUNC


def empirical_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, reduction: str = "mean",
                  implementation: NtkImpl | str = NtkImpl.AUTO, *,
                  options: JacobianOptions = JacobianOptions()) -> torch.Tensor:
    """Empirical NTK of `model` between the rows of `x1` and `x2` (default `x1`), as a float64 tensor.

    The model is called on batches of rows of `x1` (its own input shape after the batch axis). The result is
    (n1, n2) for "mean" and "trace", (n1, n2, c, c) for "full"; float64 whatever the model's dtype (a float32
    kernel is computed in float32 and converted exactly, so timings and precision are those of the model's
    dtype), on `x1`'s device (on CPU for `autograd_factored`). `options.max_bytes` bounds the Jacobians held at
    once by the two Jacobian paths (default: 1 GiB for `torch_func`, 2 GiB for `autograd_factored`);
    `options.static_batch` is the batch size a program was exported with (`autograd_factored` only).
    """
    max_bytes, static_batch = options.max_bytes, options.static_batch
    _check_reduction(reduction)
    impl = resolve_implementation(model, implementation)
    if static_batch is not None and impl is not NtkImpl.AUTOGRAD_FACTORED:
        raise UserInputError(f"static_batch applies to the autograd_factored implementation only, not {impl.value}")
    if impl is NtkImpl.CLOSED_FORM:
        k = _closed_form_qkv(model, x1, x2, reduction) if isinstance(model, QKVAttentionNet) \
            else _closed_form_head(model, x1, x2, reduction)
    elif impl is NtkImpl.TORCH_FUNC:
        k = _torch_func(model, x1, x2, reduction, 1 << 30 if max_bytes is None else max_bytes)
    else:
        k = _autograd_factored(model, x1, x2, reduction, 2 << 30 if max_bytes is None else max_bytes, static_batch)
    return k.to(torch.float64)


@torch.no_grad()
def _closed_form_head(model: TwoLayerNet | QKVAttentionNet, x1: torch.Tensor, x2: torch.Tensor | None,
                      reduction: str) -> torch.Tensor:
    """The W block in closed form (module docstring): the whole kernel of a `TwoLayerNet`."""
    W = model.W
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
    """Per-point factors of the Q, K, V blocks: `q = x Q` and, per output, `h_c` (the gradient of f_c in x~
    projected and divided by |u|)."""
    q = x @ (model.alpha * model.W_Q)
    u = q @ model.mixing()
    norm = u.norm(dim=1, keepdim=True).clamp_min(1e-30)
    f = u / norm
    D = (f @ model.W.T > 0).to(x.dtype)
    g = torch.stack([(D * a_c) @ model.W for a_c in model.A.T], dim=1) / model.spec.width**0.5
    h = (g - (g @ f.unsqueeze(2)) * f.unsqueeze(1)) / norm.unsqueeze(1)
    return q, h


@torch.no_grad()
def _closed_form_qkv(model: QKVAttentionNet, x1: torch.Tensor, x2: torch.Tensor | None,
                     reduction: str) -> torch.Tensor:
    """The kernel of `QKVAttentionNet` in closed form: the W block plus the Q, K and V blocks (module docstring)."""
    k_w = _closed_form_head(model, x1, x2, reduction)  # the head block only needs features, W and A
    x1 = model.preprocess_inputs(x1)  # the Q, K, V blocks act on what the fixed input layer gives
    x2 = None if x2 is None else model.preprocess_inputs(x2)
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


def _torch_func(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, reduction: str,
                max_bytes: int) -> torch.Tensor:
    """The kernel from per-example Jacobians (`torch.func.jacrev` + `vmap`) of the parameters that require grad,
    accumulated over chunks of examples so that at most about `max_bytes` of Jacobian is alive at once."""
    from torch.func import functional_call, jacrev, vmap

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
    for s1 in _chunks(n1, chunk):
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


def _autograd_factored(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, reduction: str,
                       max_bytes: int, static_batch: int | None) -> torch.Tensor:
    """`ModelJacobian(...).kernel`: factored linear layers when `model` is an FX graph, plain autograd otherwise."""
    if reduction != "mean":
        raise UserInputError(f"the autograd_factored implementation computes the 'mean' reduction only, "
                             f"not {reduction!r}; use implementation 'torch_func' for it")
    graph = model if isinstance(model, torch.fx.GraphModule) else None
    jac = ModelJacobian(model, tuple(x1.shape[1:]), graph=graph, static_batch=static_batch)
    return jac.kernel(x1.cpu(), None if x2 is None else x2.cpu(), max_bytes=max_bytes)
