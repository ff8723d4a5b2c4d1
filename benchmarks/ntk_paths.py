"""Alternative empirical-NTK paths that the benchmarks compare with `empirics.kernels.ntk.empirical_ntk`.

- `empirical_ntk_vjp_jvp`: NTK-vector products (the torch.func NTK tutorial's second method). For each basis
  cotangent `e_(i,c)` one vjp through the whole first batch gives `J(x1)^T e_(i,c)`, and one jvp through
  the second batch gives the kernel column `J(x2) J(x1)^T e_(i,c)`; basis vectors are vmapped in chunks
  so that the parameter-shaped intermediates stay within `max_bytes`. Cost about `2 c n^2 P` (P = m d
  parameters), like a Jacobian contraction, but no per-example Jacobian is stored.
- `empirical_ntk_autograd_loop`: the textbook loop, one `torch.autograd.grad` per example and output, the rows
  stacked into J (n c x P), then `J J^T`. Memory `n c P` floats: it materialises every Jacobian.

Also the cost models used for FLOP rates, extrapolation and the memory limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def _params_buffers(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    return params, buffers


def _reduce(block: torch.Tensor, reduction: str) -> torch.Tensor:
    """(n1, c, n2, c) kernel blocks -> "mean" (n1, n2), "trace" or "full" (n1, n2, c, c)."""
    if reduction == "full":
        return block.permute(0, 2, 1, 3).contiguous()
    diag = torch.diagonal(block, dim1=1, dim2=3).sum(dim=-1)
    return diag / block.shape[1] if reduction == "mean" else diag


def empirical_ntk_vjp_jvp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None,
                          reduction: str = "mean", max_bytes: int = 1 << 30) -> torch.Tensor:
    """Empirical NTK by vmapped vjp / jvp products (see the module docstring). Any module, any reduction."""
    from torch.func import functional_call, jvp, vjp, vmap

    params, buffers = _params_buffers(model)
    x2 = x1 if x2 is None else x2

    def f(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (p, buffers), (x,))

    out1, vjp_fn = vjp(lambda p: f(p, x1), params)
    n1, c = out1.shape
    n2 = x2.shape[0]

    def column(v: torch.Tensor) -> torch.Tensor:
        (g,) = vjp_fn(v)
        _, t = jvp(lambda p: f(p, x2), (params,), (g,))
        return t

    n_params = sum(p.numel() for p in params.values())
    hidden = max(c, n_params // max(1, x1[0].numel()))  # width of a two-layer net; a heuristic elsewhere
    per_vector = x1.element_size() * (3 * n_params + 2 * (n1 + n2) * hidden)
    chunk = max(1, int(max_bytes // per_vector))
    basis = torch.eye(n1 * c, dtype=out1.dtype, device=out1.device).reshape(n1 * c, n1, c)
    cols = [vmap(column)(basis[s:s + chunk]) for s in range(0, n1 * c, chunk)]
    block = torch.cat(cols).reshape(n1, c, n2, c)
    return _reduce(block, reduction).detach()


def empirical_ntk_autograd_loop(model: nn.Module, x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Empirical NTK from a plain loop of `torch.autograd.grad` (one backward per example and output)."""
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    n = x.shape[0]
    J: torch.Tensor | None = None
    c = 0
    for i in range(n):
        out = model(x[i:i + 1])[0]
        if J is None:
            c = out.shape[0]
            J = torch.empty(n, c, n_params, dtype=x.dtype, device=x.device)
        for k in range(c):
            grads = torch.autograd.grad(out[k], params, retain_graph=k < c - 1)
            J[i, k] = torch.cat([g.reshape(-1) for g in grads])
    assert J is not None
    flat = J.reshape(n * c, n_params)
    block = (flat @ flat.T).reshape(n, c, n, c)
    return _reduce(block, reduction).detach()


def closed_form_flops(n: int, m: int, d: int, c: int = 10, attn: bool = False) -> float:
    """Floating-point operations of the closed-form `empirical_ntk(..., "mean")` on n points (one kernel).

    Matrix products: pre-activations `X~ W^T` (2 n m d), Gram `X~ X~^T` (2 n^2 d), `(D diag(s)) D^T`
    (2 n^2 m); elementwise work (`O(n m + n^2)`, plus `||a_r||^2` over c outputs) is counted too. For
    MLP-Attn the features `normalise(X C)` add `2 n d^2 + 3 n d`.
    """
    feats = 2.0 * n * d * d + 3.0 * n * d if attn else 0.0
    return feats + 2.0 * n * m * d + 2.0 * n * n * d + 2.0 * n * n * m + 3.0 * n * m + 3.0 * n * n + 2.0 * m * c


def generic_flops(n: int, m: int, d: int, c: int = 10) -> float:
    """Leading cost of a Jacobian contraction: `2 c P n^2` with P = m d (the Jacobians cost `O(n c P)`)."""
    return 2.0 * c * m * d * n * n


@dataclass(frozen=True)
class ChunkMemory:
    """The chunking and calibration of `generic_peak_bytes`: the byte budget of two Jacobian chunks (`max_bytes`),
    the process's baseline bytes and how many chunk pairs are alive at the peak (`jacobian_copies`)."""

    max_bytes: int = 1 << 30
    base_bytes: float = 0.0
    jacobian_copies: float = 2.0


#: `torch_func`'s 1 GiB chunk budget, no baseline, two chunk pairs alive.
DEFAULT_CHUNKS = ChunkMemory()


def generic_peak_bytes(n: int, m: int, d: int, c: int = 10, itemsize: int = 4,
                       chunks: ChunkMemory = DEFAULT_CHUNKS) -> float:
    """Memory model of `empirics.kernels.ntk.empirical_ntk(..., implementation="torch_func")` (chunked per-example
    Jacobians).

    The output kernel (n^2 items), the inputs and W, and the Jacobian chunks: `torch_func` sizes a
    chunk so that two chunks `j1`, `j2` (c P items per example each) hold at most `chunks.max_bytes`;
    `chunks.jacobian_copies` counts how many such pairs are alive at the peak (jacrev's per-parameter
    result plus the concatenated copy: about 2, calibrated against measured peak RSS by the runner), on top of
    `chunks.base_bytes`.
    """
    max_bytes, base_bytes, jacobian_copies = chunks.max_bytes, chunks.base_bytes, chunks.jacobian_copies
    per_example = c * m * d * itemsize
    chunk = max(1, max_bytes // (2 * per_example))
    jac = jacobian_copies * 2 * min(chunk, n) * per_example
    return base_bytes + n * n * itemsize + (n * d + m * d + m * c) * itemsize + jac


def largest_n(limit_bytes: float, peak: Callable[[int], float]) -> int:
    """Largest n with `peak(n) <= limit_bytes` (peak increasing in n); bisection."""
    lo, hi = 1, 1
    while peak(hi) <= limit_bytes:
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak(mid) <= limit_bytes:
            lo = mid
        else:
            hi = mid
    return lo if peak(lo) <= limit_bytes else 0


def loop_jacobian_bytes(n: int, m: int, d: int, c: int = 10, itemsize: int = 4) -> float:
    """The autograd loop keeps all n c P Jacobian entries (plus the (n c)^2 block before reduction)."""
    return float(n * c * m * d * itemsize + (n * c) ** 2 * itemsize)


def log_slope(cost: Callable[[float], float], a: float, b: float) -> float:
    """Local exponent of a cost model between a and b: `log(cost(b)/cost(a)) / log(b/a)`."""
    return math.log(cost(b) / cost(a)) / math.log(b / a)
