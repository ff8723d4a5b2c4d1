"""Per-example gradients of convolutional networks without per-example Jacobians: the audit's kernel at ResNet scale.

`empirics.kernels.audit_ntk.ModelJacobian` builds one example's Jacobian at a time (c backward passes with every weight
gradient, c x P numbers held), which is right up to about a million parameters and hours for a ResNet-18 (11M
parameters, 10 outputs: 447 MB of Jacobian per image). This module uses the structure of the three layer kinds such
networks are made of, on the FX graph of an exported (or converted) model, when every trainable parameter belongs to
one of them and the batch dimension keeps examples apart:

- `aten.linear` and `aten.conv2d` (groups 1): the gradient of weight W for one example and output c is
  `G = sum_s delta_s a_s^T` over the S positions s of the node (tokens, pixels), with `a_s` the node's input row or
  unfolded input patch and `delta_s` the gradient of output c w.r.t. the node's output at s;
- `aten.batch_norm` in inference mode: per-channel `dgamma = sum_s delta_s xhat_s`, `dbeta = sum_s delta_s`.

One batched forward pass keeps each node's input; one backward pass per output, to the node *outputs* only (no
weight gradient is formed), gives every example's `delta`. From these:

- **projected** (`ProjectedStructured`): `vec(G)` is projected with a Kronecker product `R = R_out (x) R_in` of two
  seeded Gaussian matrices, `R^T vec(G) = sum_s (R_out^T delta_s) (x) (R_in^T a_s)`, where `R_in^T a_s` at every
  position is one convolution of the node input with k_in random filters (LoGra, Choe et al. 2024). Since
  `E[R R^T] = E[R_out R_out^T] (x) E[R_in R_in^T] = I`, inner products, and so the kernel, are unbiased. Weights with
  no more values than the target dimension (a classifier's last linear layer), biases and batch-norm parameters
  are kept exact; the larger weights share the features an equal split of the target would use, allocated by each
  weight's share of the kernel as a seeded pilot on a few training points measures it, with the leading directions
  of each side of a weight's gradients kept exactly (`ProjectedStructured`, `allocate`).
- **exact** (`StructuredJacobian.kernel`): for each output and layer, the per-example gradients `G` of all points
  (in blocks of output channels) and their Gram matrix, or, for layers with few positions and many values (a
  ResNet's last stage), the same Gram through the factors `sum_{s,t} (a_is . a_jt)(delta_is . delta_jt)`; never the
  `n x c x P` of all Jacobians. It is the reference the projection's error is measured against (Gram products in
  the parameters' precision: float32 for a float32 model, about 1e-6 relative).

The kernel is `K(x, x') = (1/c) sum_c <df_c(x)/dtheta, df_c(x')/dtheta>`, as in `empirics.kernels.audit_ntk`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from empirics.kernels.audit_ntk import (
    JacobianFeatures,
    Projection,
    _as_2d,
    _Capture,
    _first_tensor,
    sole_use,
    trainable,
)
from empirics.progress import Progress

_aten = torch.ops.aten
_KINDS = {_aten.linear.default: "linear", _aten.conv2d.default: "conv2d", _aten.batch_norm.default: "batch_norm"}
_BLOCK_ELEMENTS = 1 << 25
#: The exact kernel of at most this many points runs them as one batch (one forward pass, its graph kept for the c
#: backward passes: about 0.5 GB for 72 CIFAR images through a ResNet-18); more points go in batches, output by output.
ONE_PASS_POINTS = 96


@dataclass
class _Node:
    """A structured node: its kind, parameters, input/output widths and (conv) geometry or (batch norm) statistics."""

    name: str
    kind: str
    weight: str | None
    bias: str | None
    d_in: int = 0
    d_out: int = 0
    kernel_size: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    mean: torch.Tensor | None = None
    inv_std: torch.Tensor | None = None

    @property
    def n_weight(self) -> int:
        """Values of the weight (batch norm: the channel scales)."""
        if self.weight is None:
            return 0
        return self.d_out if self.kind == "batch_norm" else self.d_out * self.d_in


def _pair(v: object, default: int) -> tuple[int, int]:
    if v is None:
        return (default, default)
    if isinstance(v, int):
        return (v, v)
    seq = list(v)  # type: ignore[call-overload]
    return (int(seq[0]), int(seq[-1])) if seq else (default, default)


def _attr(gm: torch.fx.GraphModule, target: str) -> torch.Tensor:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def plan_nodes(graph: torch.fx.GraphModule) -> tuple[list[_Node] | None, str]:
    """The structured nodes of `graph`, or None and why the structured path does not apply.

    It applies when every trainable parameter is the weight or bias of exactly one linear, groups-1 conv2d or
    inference batch-norm node and used by nothing else."""
    params = trainable(graph)
    own = sole_use(graph)
    nodes: list[_Node] = []
    for node in graph.graph.nodes:
        kind = _KINDS.get(node.target) if node.op == "call_function" else None
        if kind is None:
            continue
        args = list(node.args)
        if kind == "batch_norm":
            if len(args) < 8 or args[5]:
                continue
            w, b = own(args[1]), own(args[2])
            stats = [args[3], args[4]]
            if not all(isinstance(s, torch.fx.Node) and s.op == "get_attr" for s in stats):
                continue
            mean, var = (_attr(graph, str(s.target)).detach() for s in stats)
            if w is None and b is None:
                continue
            nodes.append(_Node(node.name, kind, w, b, d_in=int(mean.numel()), d_out=int(mean.numel()),
                               mean=mean.clone(), inv_std=1.0 / torch.sqrt(var + float(args[7]))))
            continue
        w = own(args[1]) if len(args) > 1 else None
        b = own(args[2]) if len(args) > 2 else None
        if w is None:
            continue
        weight = params[w]
        if kind == "conv2d":
            groups = int(args[6]) if len(args) > 6 else 1
            if weight.dim() != 4 or groups != 1:
                continue
            nodes.append(_Node(node.name, kind, w, b, d_in=int(weight[0].numel()), d_out=int(weight.shape[0]),
                               kernel_size=(int(weight.shape[2]), int(weight.shape[3])), stride=_pair(
                                   args[3] if len(args) > 3 else None, 1), padding=_pair(
                                   args[4] if len(args) > 4 else None, 0), dilation=_pair(
                                   args[5] if len(args) > 5 else None, 1)))
        else:
            nodes.append(_Node(node.name, kind, w, b, d_in=int(weight.shape[1]), d_out=int(weight.shape[0])))
    owned = {n.weight for n in nodes if n.weight} | {n.bias for n in nodes if n.bias}
    missing = [k for k in params if k not in owned]
    if missing:
        return None, (f"{len(missing)} parameter tensors (e.g. {missing[0]}) are not the weight or bias of a linear, "
                      "conv2d or batch-norm node of their own")
    if not nodes:
        return None, "no linear, conv2d or batch-norm node"
    return nodes, f"{len(nodes)} structured nodes"


class StructuredJacobian:
    """Per-example gradients of a graph whose parameters all sit in linear / conv2d / batch-norm nodes (module
    docstring), and its exact empirical NTK. Use `StructuredJacobian.build`, which returns None (and why) when the
    structure is not there."""

    def __init__(self, graph: torch.fx.GraphModule, input_shape: Sequence[int], nodes: list[_Node],
                 batch_size: int = 32, progress: bool | None = None):
        self.graph = graph
        self.input_shape = tuple(int(s) for s in input_shape)
        self.nodes = nodes
        self.batch_size = max(1, int(batch_size))
        self.progress = progress
        params = trainable(graph)
        self._params = params
        self.dtype = next(iter(params.values())).dtype
        #: where the parameters are: the probes, gradients, sketches and kernels are made there
        self.device = next(iter(params.values())).device
        self.watch = {n.name for n in nodes}
        with torch.no_grad():
            out, _ = self._run(torch.zeros(1, *self.input_shape, dtype=self.dtype, device=self.device), set())
        self.out_dim = int(out.shape[1])

    @classmethod
    def build(cls, graph: torch.fx.GraphModule | None, input_shape: Sequence[int], static_batch: int | None = None,
              batch_size: int = 32, progress: bool | None = None) -> tuple[StructuredJacobian | None, str]:
        """The structured Jacobian of `graph`, or None and the reason it does not apply."""
        if graph is None:
            return None, "no FX graph of the model"
        if static_batch:
            return None, f"the program was exported with a static batch size ({static_batch})"
        nodes, why = plan_nodes(graph)
        if nodes is None:
            return None, why
        jac = cls(graph, input_shape, nodes, batch_size, progress)
        if not jac._separable():
            return None, "the graph mixes the examples of a batch in a structured node"
        return jac, why

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self._params.values())

    @property
    def method(self) -> str:
        kinds = sorted({n.kind for n in self.nodes})
        return f"structured per-example gradients ({len(self.nodes)} {'/'.join(kinds)} nodes), batched"

    def bytes_per_example(self) -> int:
        """Bytes of one example's exact Jacobian (c x P numbers): what the exact path would hold."""
        return self._params[next(iter(self._params))].element_size() * self.out_dim * self.n_params

    def _run(self, xb: torch.Tensor, watch: set[str]) -> tuple[torch.Tensor, dict[str, tuple]]:
        cap = _Capture(self.graph, watch)
        out = _as_2d(_first_tensor(cap.run(xb)))
        return out, cap.seen

    def _separable(self) -> bool:
        """Do the structured nodes keep the examples of a batch apart? Checked on a probe batch of 3."""
        k = 3
        xs = torch.rand(k, *self.input_shape, generator=torch.Generator().manual_seed(0),
                        dtype=self.dtype).to(self.device)  # the seeded CPU probe, moved
        with torch.no_grad():
            _, seen = self._run(xs, self.watch)
            for j in range(k):
                _, one = self._run(xs[j:j + 1], self.watch)
                for name in self.watch:
                    for pos in (0, 1):
                        got, want = seen[name][pos], one[name][pos]
                        if got.shape[0] != k or got.shape[1:] != want.shape[1:]:
                            return False
                        # batch size changes the float rounding of a convolution (about 1e-7 of the values'
                        # scale); an example seen through another one differs by the scale itself
                        scale = float(want.abs().max())
                        if not torch.allclose(got[j:j + 1], want, rtol=1e-4, atol=1e-5 * max(1.0, scale)):
                            return False
        return True

    def deltas(self, x: torch.Tensor, outputs: Sequence[int] | None = None
               ) -> Iterator[tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
        """For one batch (n, d): per output c (default all), `(c, inputs, deltas)` with each structured node's input
        and the gradient of output c (summed over the batch, so per example) w.r.t. the node's output."""
        xb = x.detach().to(self.dtype).reshape(len(x), *self.input_shape)
        with torch.enable_grad():
            out, seen = self._run(xb, self.watch)
            names = [n.name for n in self.nodes]
            zs = [seen[n][1] for n in names]
            inputs = {n: seen[n][0].detach() for n in names}
            wanted = list(range(self.out_dim)) if outputs is None else list(outputs)
            for j, c in enumerate(wanted):
                grads = torch.autograd.grad(out[:, c].sum(), zs, retain_graph=j < len(wanted) - 1,
                                            allow_unused=True)
                yield c, inputs, {n: (torch.zeros_like(z) if g is None else g.detach())
                                  for n, z, g in zip(names, zs, grads, strict=True)}

    def patches(self, node: _Node, a: torch.Tensor) -> torch.Tensor:
        """The node input as rows `a_s`: (n, S, d_in) (conv2d: unfolded patches)."""
        if node.kind == "conv2d":
            return F.unfold(a, node.kernel_size, dilation=node.dilation, padding=node.padding,
                            stride=node.stride).transpose(1, 2)
        return a.reshape(len(a), -1, node.d_in)

    def rows(self, node: _Node, d: torch.Tensor) -> torch.Tensor:
        """The output gradient as rows `delta_s`: (n, S, d_out)."""
        if node.kind == "conv2d" or node.kind == "batch_norm" and d.dim() > 2:
            return d.flatten(2).transpose(1, 2)
        return d.reshape(len(d), -1, node.d_out)

    def xhat(self, node: _Node, a: torch.Tensor) -> torch.Tensor:
        """Batch norm's normalised input as rows (n, S, C)."""
        shape = (1, -1) + (1,) * (a.dim() - 2)
        z = (a - node.mean.to(a.dtype).reshape(shape)) * node.inv_std.to(a.dtype).reshape(shape)
        return self.rows(node, z)

    def small_grads(self, node: _Node, a: torch.Tensor, d: torch.Tensor) -> list[torch.Tensor]:
        """Exact per-example gradients of a node's bias and of batch-norm scales, each (n, values)."""
        out = []
        rd = self.rows(node, d)
        if node.kind == "batch_norm" and node.weight is not None:
            out.append((rd * self.xhat(node, a)).sum(dim=1))
        if node.bias is not None:
            out.append(rd.sum(dim=1))
        return out

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, max_bytes: int = 2 << 30) -> torch.Tensor:
        """Exact empirical NTK between rows of x1 and x2 (default x1), float64 (module docstring)."""
        x = x1 if x2 is None else torch.cat([x1, x2])
        n = len(x)
        k = torch.zeros(n, n, dtype=torch.float64, device=self.device)
        input_grams: dict[str, torch.Tensor] = {}
        with Progress(self.out_dim, "exact structured kernel", enabled=self.progress) as bar:
            if n <= ONE_PASS_POINTS:
                for _, a, d in self.deltas(x):
                    k += self._output_gram(a, d, max_bytes, input_grams)
                    bar.update(1)
            else:
                for c in range(self.out_dim):
                    ins: dict[str, list[torch.Tensor]] = {nd.name: [] for nd in self.nodes}
                    ds: dict[str, list[torch.Tensor]] = {nd.name: [] for nd in self.nodes}
                    for i in range(0, n, self.batch_size):
                        for _, a, d in self.deltas(x[i:i + self.batch_size], outputs=(c,)):
                            for nd in self.nodes:
                                ins[nd.name].append(a[nd.name])
                                ds[nd.name].append(d[nd.name])
                    k += self._output_gram({m: torch.cat(v) for m, v in ins.items()},
                                           {m: torch.cat(v) for m, v in ds.items()}, max_bytes, input_grams)
                    bar.update(1)
        k /= self.out_dim
        return k if x2 is None else k[:len(x1), len(x1):].contiguous()

    def _output_gram(self, a: dict[str, torch.Tensor], d: dict[str, torch.Tensor], max_bytes: int,
                     input_grams: dict[str, torch.Tensor]) -> torch.Tensor:
        """One output's kernel (before the 1/c): the Gram matrices of every node's per-example gradients."""
        n = len(next(iter(a.values())))
        k = torch.zeros(n, n, dtype=torch.float64, device=self.device)
        for nd in self.nodes:
            for g in self.small_grads(nd, a[nd.name], d[nd.name]):
                k += g.double() @ g.double().T
            if nd.weight is not None and nd.kind != "batch_norm":
                k += self._weight_gram(nd, a[nd.name], d[nd.name], max_bytes, input_grams)
        return k

    def _weight_gram(self, nd: _Node, a: torch.Tensor, d: torch.Tensor, max_bytes: int,
                     input_grams: dict[str, torch.Tensor]) -> torch.Tensor:
        """The weight's kernel contribution for one output: through the factors, `sum_{s,t} (a_is . a_jt)
        (delta_is . delta_jt)` with the input Gram kept across outputs, when that takes fewer operations (few
        positions, wide layers); else `G G^T` of the per-example gradients G, in blocks of output channels."""
        n = len(a)
        pa, rd = self.patches(nd, a), self.rows(nd, d)
        s = pa.shape[1]
        if n * s * s * (nd.d_in + nd.d_out) < (s + n) * nd.d_in * nd.d_out:
            if nd.name not in input_grams:
                f = pa.reshape(n * s, -1).double()
                input_grams[nd.name] = (f @ f.T).reshape(n, s, n, s)
            r = rd.reshape(n * s, -1).double()
            return (input_grams[nd.name] * (r @ r.T).reshape(n, s, n, s)).sum(dim=(1, 3))
        per_channel = max(1, n * nd.d_in)
        step = max(1, min(nd.d_out, max(1, max_bytes // 4) // (8 * per_channel), _BLOCK_ELEMENTS // per_channel))
        out = torch.zeros(n, n, dtype=torch.float64, device=pa.device)
        for lo in range(0, nd.d_out, step):
            g = torch.bmm(rd[:, :, lo:lo + step].transpose(1, 2), pa).reshape(n, -1)
            out += (g @ g.T).double()
        return out


# --- projection ------------------------------------------------------------------------------------------------


def _gaussian(key: tuple[int, int, int], rows: int, cols: int, dtype: torch.dtype,
              device: torch.device | None = None) -> torch.Tensor:
    """A seeded (rows, cols) matrix with entries N(0, 1/cols), so that E[R R^T] = I; `key` is (seed, layer, side).
    Drawn on the CPU by a seeded CPU generator (the same matrix on every device), then moved to `device`."""
    seed, layer, side = key
    gen = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 1_009 + side)
    return (torch.randn(rows, cols, generator=gen) / math.sqrt(cols)).to(device=device, dtype=dtype)


def _side_matrix(key: tuple[int, int, int], dim: int, k: int, lead: torch.Tensor | None,
                 dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """One side's R (dim, k): the r orthonormal columns `lead` kept exactly, then k - r seeded Gaussian columns
    projected off them, `R = [U, (I - U U^T) Z / sqrt(k - r)]`, so that `E[R R^T] = U U^T + (I - U U^T) = I`;
    `key` is (seed, layer, side) of the Gaussian draw."""
    r = 0 if lead is None else int(lead.shape[1])
    if r == 0:
        return _gaussian(key, dim, k, dtype, device)
    u = lead.to(device=device, dtype=torch.float64)
    z = _gaussian(key, dim, k - r, torch.float64, device)
    return torch.cat([u, z - u @ (u.T @ z)], dim=1).to(dtype)


@dataclass(frozen=True)
class _Part:
    """How one node's weight is represented: exact (k_out = k_in = 0) or projected to k_out x k_in, of which the first
    r_out (r_in) columns are leading directions of the side kept exactly; k_out = d_out (k_in = d_in) keeps that
    side exact."""

    k_out: int
    k_in: int
    r_out: int = 0
    r_in: int = 0

    @property
    def exact(self) -> bool:
        return self.k_out == 0


# --- allocation of the projected dimension ------------------------------------------------------------------------

#: Pilot points: a seeded subsample of the first rows projected, on which each weight's share of the kernel and the
#: leading directions of its two sides are measured before R is drawn.
PILOT_POINTS = 24
#: Columns of the pilot's one-pass (Nystrom) sketch of each side's second-moment operator.
SKETCH = 16
#: At most this many leading directions of a side are kept exactly: the first half of the sketch, which a one-pass
#: sketch of a steep spectrum finds well (later ones are rough, and the sketch's own error grows with them).
MAX_DIRECTIONS = SKETCH // 2
_PILOT_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Spectrum:
    """One side of a weight's per-example gradients `G_ic` (d_out x d_in; example i of the pilot, output c): the
    operator `H = sum_{i,c} G_ic G_ic^T` (out side, d_out x d_out) or `sum_{i,c} G_ic^T G_ic` (in side), whose trace
    `sum_{i,c} ||G_ic||^2` is the weight's part of the pilot kernel's trace (times c), and its leading eigenpairs from
    the sketch: `values` descending, `vectors` (dim, len(values)) orthonormal (None in a synthetic model)."""

    dim: int
    trace: float
    values: tuple[float, ...] = ()
    vectors: torch.Tensor | None = None

    def residual(self, r: int) -> float:
        """`sum_{m > r} lambda_m^2`, the part of `||H||_F^2` the side's random columns must carry once its first r
        directions are kept exactly; eigenvalues past the sketch are bounded by the last one measured (all of
        them in one direction when nothing was measured)."""
        lam = np.asarray(self.values, dtype=np.float64)
        tail = max(self.trace - float(lam.sum()), 0.0)
        if len(lam) >= self.dim:
            past = 0.0
        elif len(lam):
            past = tail * min(float(lam[-1]), tail)
        else:
            past = tail ** 2
        return float((lam[r:] ** 2).sum()) + past

    def rest(self, r: int) -> float:
        """The trace left to the random columns once the first r directions are kept exactly."""
        return max(self.trace - float(sum(self.values[:r])), 0.0)


@dataclass(frozen=True)
class LayerModel:
    """What the allocation knows of one projected weight: the spectra of its two sides (same trace)."""

    name: str
    out: Spectrum
    inp: Spectrum


def _side_table(spec: Spectrum, kmax: int, directions: int) -> tuple[np.ndarray, ...]:
    """For k = 0..min(dim, kmax) columns on one side: the modelled variance term `residual(r) / (k - r)` at the best
    number r of exact directions (at most `directions`, at least one random column), r, the random columns and the
    trace left to them; k = dim keeps the side exact (term 0). k = 0 is not a choice (inf)."""
    top = min(spec.dim, kmax)
    k = np.arange(top + 1)
    rmax = max(0, min(directions, len(spec.values), top - 1))
    res = np.array([spec.residual(r) for r in range(rmax + 1)])
    q = k[:, None] - np.arange(rmax + 1)[None, :]
    val = np.where(q >= 1, res[None, :] / np.maximum(q, 1), np.inf)
    r = val.argmin(axis=1)
    g = val[k, r]
    rest = np.array([spec.rest(int(v)) for v in r])
    random = k - r
    if top == spec.dim:  # the whole side: kept exact
        g[top], r[top], random[top], rest[top] = 0.0, 0, spec.dim, 0.0
    g[0] = np.inf
    return g, r, np.maximum(random, 1), rest


def _layer_table(layer: LayerModel, kmax: int, directions: int) -> tuple[np.ndarray, ...]:
    """For each budget k = 1..K (K = min(size, kmax)) of one weight: the least modelled variance with at most k
    features, `res_out / q_out + res_in / q_in + (rest_out rest_in / T)^2 / (q_out q_in)` over all splits
    k_out x floor(k / k_out) (a side given all its dimensions is exact and drops out), as a running minimum (more
    budget never hurts), with the split's k_out, k_in, its features k_out k_in and its exact directions."""
    d_o, d_i = layer.out.dim, layer.inp.dim
    kk = max(1, min(d_o * d_i, kmax))
    go, ro, qo, so = _side_table(layer.out, kk, directions)
    gi, ri, qi, si = _side_table(layer.inp, kk, directions)
    t = max(layer.out.trace, 1e-300)
    ko = np.arange(1, len(go))
    f = np.full(kk + 1, np.inf)
    best_o = np.ones(kk + 1, dtype=np.int64)
    best_i = np.ones(kk + 1, dtype=np.int64)
    step = max(1, (1 << 21) // len(ko))
    for lo in range(1, kk + 1, step):
        k = np.arange(lo, min(kk, lo + step - 1) + 1)
        ki = np.minimum(d_i, k[:, None] // ko[None, :])
        kic = np.maximum(ki, 1)
        cross = (so[ko][None, :] * si[kic] / t) ** 2 / (qo[ko][None, :] * qi[kic])
        val = np.where(ki >= 1, go[ko][None, :] + gi[kic] + cross, np.inf)
        j = val.argmin(axis=1)
        rows = np.arange(len(k))
        f[k], best_o[k], best_i[k] = val[rows, j], ko[j], kic[rows, j]
    idx = np.arange(kk + 1)
    keep = np.maximum.accumulate(np.where(f <= np.minimum.accumulate(f), idx, 0))
    f, best_o, best_i = f[keep], best_o[keep], best_i[keep]
    r_o = np.where(best_o < d_o, ro[best_o], 0)
    r_i = np.where(best_i < d_i, ri[best_i], 0)
    return f, best_o, best_i, best_o * best_i, r_o, r_i


def allocate(layers: Sequence[LayerModel], budget: int, directions: int = MAX_DIRECTIONS) -> list[_Part]:
    """Split `budget` features between the projected weights `layers`: the k_out x k_in (and exact directions r_out,
    r_in) of each that minimise the summed modelled variance of the kernel entries (`ProjectedStructured`) subject to
    `sum k_out k_in <= budget`, every weight keeping at least one random column per side it does not keep exact.

    Each weight's table of least variance against its budget (`_layer_table`) is searched with a Lagrange multiplier
    on the features (bisected until the total fits), then what is left of the budget goes, one step at a time, to
    the move with the largest fall of the variance per feature that still fits."""
    n = len(layers)
    if n == 0:
        return []
    if budget < n:
        raise ValueError(f"a budget of {budget} features cannot give {n} projected weights one each")
    tables = [_layer_table(layer, budget - (n - 1), directions) for layer in layers]
    scale = sum(layer.out.trace for layer in layers) ** 2 or 1.0
    fs = [t[0] / scale for t in tables]
    feats = [t[3] for t in tables]

    def pick(lam: float) -> list[int]:
        return [int(np.argmin(f[1:] + lam * c[1:])) + 1 for f, c in zip(fs, feats, strict=True)]

    def used(choice: list[int]) -> int:
        return int(sum(int(c[j]) for c, j in zip(feats, choice, strict=True)))

    choice = pick(0.0)
    if used(choice) > budget:
        lo, hi = 0.0, 1.0
        for _ in range(2000):
            if used(pick(hi)) <= budget:
                break
            lo, hi = hi, hi * 2
        for _ in range(100):
            mid = (lo + hi) / 2
            if used(pick(mid)) <= budget:
                hi = mid
            else:
                lo = mid
        choice = pick(hi)
    left = budget - used(choice)
    for _ in range(100_000):  # top up: the best variance fall per feature that still fits
        best: tuple[float, int, int, int] | None = None
        for li, (f, c) in enumerate(zip(fs, feats, strict=True)):
            cur = choice[li]
            dc = c - c[cur]
            df = f[cur] - f
            ok = (dc > 0) & (dc <= left) & (df > 0)
            ok[0] = False
            if ok.any():
                ratio = np.where(ok, df / np.maximum(dc, 1), -np.inf)
                j = int(ratio.argmax())
                if best is None or ratio[j] > best[0]:
                    best = (float(ratio[j]), li, j, int(dc[j]))
        if best is None:
            break
        choice[best[1]] = best[2]
        left -= best[3]
    out = []
    for t, j in zip(tables, choice, strict=True):
        _, ko, ki, _, r_o, r_i = t
        out.append(_Part(int(ko[j]), int(ki[j]), int(r_o[j]), int(r_i[j])))
    return out


def _omega(key: tuple[int, int, int], dim: int, cols: int, dtype: torch.dtype,
           device: torch.device | None = None) -> torch.Tensor:
    """The pilot's sketch of one side, on `device`: the identity when the side is no wider than the sketch (H is then
    measured exactly), else seeded Gaussian columns (drawn by a seeded CPU generator, then moved); `key` is (seed,
    layer, side)."""
    seed, layer, side = key
    if dim <= cols:
        return torch.eye(dim, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + layer) * 1_009 + side) * 7 + 5)
    return torch.randn(dim, cols, generator=gen).to(device=device, dtype=dtype)


def _spectrum(y: torch.Tensor, omega: torch.Tensor, trace: float, dim: int) -> Spectrum:
    """Leading eigenpairs of a PSD operator H from `y = H omega` (exact when omega is the identity; else the
    pseudo-inverse Nystrom approximation `H ~ y (omega^T y)^+ y^T`, Halko, Martinsson & Tropp 2011)."""
    y, om = y.double(), omega.double()
    if om.shape == (dim, dim) and bool((om == torch.eye(dim, dtype=om.dtype, device=om.device)).all()):
        w, v = torch.linalg.eigh((y + y.T) / 2)
        w, v = w.flip(0), v.flip(1)
    else:
        b = om.T @ y
        w, v = torch.linalg.eigh((b + b.T) / 2)
        keep = w > max(float(w.max()), 0.0) * 1e-12
        if not bool(keep.any()):
            return Spectrum(dim, trace)
        e = y @ (v[:, keep] / torch.sqrt(w[keep]))
        u, s, _ = torch.linalg.svd(e, full_matrices=False)
        w, v = s ** 2, u
    pos = w > 0
    w, v = w[pos], v[:, pos]
    return Spectrum(dim, trace, tuple(min(float(a), trace) for a in w), v)


@dataclass
class _Sketch:
    """A projected weight's pilot accumulators: its trace, the sketches `H_out omega_out`, `H_in omega_in`, and
    (positions route) the node's patches, their Gram `A A^T`, `A omega_in` and `sum_c Delta Delta^T A omega_in`."""

    om_o: torch.Tensor
    om_i: torch.Tensor
    y_o: torch.Tensor
    y_i: torch.Tensor
    trace: float = 0.0
    pa: torch.Tensor | None = None
    gp: torch.Tensor | None = None
    pom: torch.Tensor | None = None
    acc: torch.Tensor | None = None


def pilot_spectra(jac: StructuredJacobian, x: torch.Tensor, projected: Sequence[_Node], seed: int,
                  sketch: int = SKETCH, progress: bool | None = None
                  ) -> tuple[dict[str, tuple[Spectrum, Spectrum]], dict[str, float]]:
    """On the pilot rows `x` (one batch): each node's part of the kernel trace (`sum_{i,c}` of the squared norms of
    its parameters' per-example gradients: weight, bias, batch-norm scale and shift) and, for the `projected` weight
    nodes, the spectra of both sides (`Spectrum`) from the sketches `H_out Omega_out`, `H_in Omega_in` (`sketch`
    seeded Gaussian columns, or the identity for a side no wider).

    Per node the cheaper of two routes (per example and output): forming `G = sum_s delta_s a_s^T`
    (`S d_out d_in`, then `2 k d_out d_in` for the sketches of k columns in all), or working through positions with
    the patches' Gram `A A^T` (`S^2 d_out` for the trace, `S^2 k + 2 S k d_out` for the sketches, `S^2 d_in` once
    per example), as the exact kernel chooses between G and its factors (`StructuredJacobian._weight_gram`)."""
    names = {nd.name for nd in projected}
    c = jac.out_dim
    traces = {nd.name: 0.0 for nd in jac.nodes}
    state: dict[str, _Sketch] = {}
    for li, nd in enumerate(jac.nodes):
        if nd.name in names:
            p_o, p_i = min(sketch, nd.d_out), min(sketch, nd.d_in)
            state[nd.name] = _Sketch(_omega((seed, li, 2), nd.d_out, p_o, jac.dtype, jac.device),
                                     _omega((seed, li, 3), nd.d_in, p_i, jac.dtype, jac.device),
                                     torch.zeros(nd.d_out, p_o, dtype=torch.float64, device=jac.device),
                                     torch.zeros(nd.d_in, p_i, dtype=torch.float64, device=jac.device))
    with Progress(c, "projection pilot (share of the kernel)", enabled=progress) as bar:
        for _, a, d in jac.deltas(x):
            for nd in jac.nodes:
                an, dn = a[nd.name], d[nd.name]
                for g in jac.small_grads(nd, an, dn):
                    traces[nd.name] += float(torch.sum(g * g, dtype=torch.float64))
                if nd.weight is None or nd.kind == "batch_norm":
                    continue
                st = state.get(nd.name)
                if st is None:
                    traces[nd.name] += _weight_sq(jac, nd, an, dn)
                else:
                    _sketch_step(jac, nd, an, dn, st, c)
            bar.update(1)
    out: dict[str, tuple[Spectrum, Spectrum]] = {}
    for nd in projected:
        st = state[nd.name]
        if st.acc is not None and st.pa is not None:  # positions route: the in-side sketch ends with the patches
            st.y_i = (st.pa.transpose(1, 2) @ st.acc).sum(0).double()
        traces[nd.name] += st.trace
        out[nd.name] = (_spectrum(st.y_o, st.om_o, st.trace, nd.d_out), _spectrum(st.y_i, st.om_i, st.trace, nd.d_in))
    return out, traces


def _weight_sq(jac: StructuredJacobian, nd: _Node, a: torch.Tensor, d: torch.Tensor) -> float:
    """`sum_i ||G_i||^2` of one output for an exactly kept weight (G formed, in blocks of examples)."""
    pa, rd = jac.patches(nd, a), jac.rows(nd, d)
    step = max(1, _PILOT_ELEMENTS // max(1, nd.d_out * nd.d_in))
    total = 0.0
    for lo in range(0, len(pa), step):
        g = torch.bmm(rd[lo:lo + step].transpose(1, 2), pa[lo:lo + step])
        total += float(torch.sum(g * g, dtype=torch.float64))
    return total


def _sketch_step(jac: StructuredJacobian, nd: _Node, a: torch.Tensor, d: torch.Tensor, st: _Sketch, c: int) -> None:
    """One output's part of a projected weight's trace and side sketches (`pilot_spectra`)."""
    rd = jac.rows(nd, d)
    if st.pa is None:  # the node input is the same for every output: its patches (and route) once
        pa = jac.patches(nd, a)
        st.pa = pa
        s, k = pa.shape[1], st.om_i.shape[1] + st.om_o.shape[1]
        by_g = s * nd.d_out * nd.d_in + 2 * k * nd.d_out * nd.d_in
        by_pos = s * s * nd.d_out + s * s * k + 2 * s * k * nd.d_out + (s * s * nd.d_in + s * nd.d_in * k) / c
        if by_pos < by_g and len(pa) * s * s <= 4 * _PILOT_ELEMENTS:
            st.gp = pa @ pa.transpose(1, 2)
            st.pom = pa @ st.om_i
            st.acc = torch.zeros(len(pa), s, st.om_i.shape[1], dtype=pa.dtype, device=pa.device)
    pa = st.pa
    if st.gp is not None and st.pom is not None and st.acc is not None:
        st.trace += float(torch.sum(st.gp * (rd @ rd.transpose(1, 2)), dtype=torch.float64))
        st.acc += rd @ (rd.transpose(1, 2) @ st.pom)  # Delta Delta^T A omega_in, summed over outputs
        st.y_o += (rd.transpose(1, 2) @ (st.gp @ (rd @ st.om_o))).sum(0).double()  # Delta^T A A^T Delta omega_out
        return
    step = max(1, _PILOT_ELEMENTS // max(1, nd.d_out * nd.d_in))
    for lo in range(0, len(pa), step):
        g = torch.bmm(rd[lo:lo + step].transpose(1, 2), pa[lo:lo + step])
        st.trace += float(torch.sum(g * g, dtype=torch.float64))
        st.y_o += (g @ (g.transpose(1, 2) @ st.om_o)).sum(0).double()
        st.y_i += (g.transpose(1, 2) @ (g @ st.om_i)).sum(0).double()


class ProjectedStructured:
    """Kronecker-projected per-example gradients of a `StructuredJacobian` (module docstring), with the interface the
    audit uses (`features`, `gram`, `kernel`, `bytes_per_example`, `method`, `projection`; `jac` is the exact
    reference). A weight with at most `projection.dim` values is kept exact (a trained network's last linear layer
    carries much of its kernel, and projecting its 512 inputs to a few dozen dimensions cost a quarter of the kernel's
    accuracy on a ResNet-18); the larger weights share a budget of features, the k_out x k_in that an equal split of
    `projection.dim` between them would use (`budget`), so the width never exceeds the equal split's. The feature
    width actually used is `width`.

    **How the budget is shared** (`allocation="share"`, the default; `"equal"` is the equal split, each weight
    isqrt(dim / n) x (dim / n) / isqrt(dim / n)). The kernels of trained networks are far from evenly spread over
    their weights: on a CIFAR-10 ResNet-18 the stem and the head, kept exact, hold 60 % of the kernel's trace, the
    first stage's four convolutions 29 %, the other fourteen projected ones 10 % together; and each weight's
    per-example gradients are nearly of rank one in aggregate (effective ranks about 2 on both sides of the first
    stage). A pilot therefore measures, before R is drawn, on `PILOT_POINTS` (24) training rows drawn with the seed
    from the first rows projected (`calibrate`; or the rows given as `pilot`), for every projected weight, the
    operators `H_out = sum_{i,c} G_ic G_ic^T` and `H_in = sum_{i,c} G_ic^T G_ic` of its per-example gradients
    through one-pass sketches of 16 columns (`pilot_spectra`): their common trace is the weight's measured share of
    the kernel, their leading eigenpairs the directions that carry it. Then:

    - *leading directions kept exactly*: a side's R is `[U, (I - U U^T) Z / sqrt(q)]` (r leading directions U of
      its H, then q Gaussian columns off them), still `E[R R^T] = I`, so every kernel entry stays unbiased, and only
      the rest of the spectrum is left to chance;
    - *variance model*: projecting one side of a Gram with q Gaussian columns adds variance
      `(||M||_F^2 + tr(M^2)) / q` to an inner product `tr(M)` (M the pair's second moment on that side), which summed
      over the kernel's pairs scales like `residual(r) = sum_{m>r} lambda_m^2` of the side's H; with both sides
      projected, `res_out / q_out + res_in / q_in + (rest_out rest_in / T)^2 / (q_out q_in)`, a side given all its
      dimensions (k = d) being exact;
    - *allocation*: the k_out, k_in, r_out, r_in of every weight minimising the summed model under `sum k_out k_in <=
      budget` (`allocate`; a Lagrange multiplier on the features, then the leftover features one step at a time).

    In the rank-one limit without exact directions the model is `T^2 (1/k_out + 1/k_in + 1/(k_out k_in))`, least at
    k_out = k_in = sqrt(k), where it falls like `2 T^2 / sqrt(k)`: the Kronecker projection's variance falls like
    1/sqrt(k), not 1/k as a dense projection's, so the optimum budget grows like `share^(4/3)` rather than in
    proportion to the share, and a side of a high-share weight is best kept whole (its term vanishes) once k passes
    about d_side^2 / 4. Measured on that ResNet-18 (4 epochs on 1,000 images; `benchmarks/bench_kron_alloc.py`, the
    audit's error subsample of 48 + 24 points, 7,938 projected features in each case, projection seeds 0, 1, 2), the
    relative error of the training kernel entries is 6.2 %, 18.0 %, 9.6 % with the equal split, 2.9 %, 3.7 %, 3.7 %
    with the allocation alone (`directions=0`: the first stage's two leading convolutions get their whole out side,
    64 x 56 and 64 x 39) and 0.21 %, 0.21 %, 0.22 % with the leading directions kept exactly (the default), at the
    same cost of the features (0.11 s per point on one core in each case, within the machine's noise).

    The pilot is seeded and deterministic (same seed and rows, same R); its cost is one forward and c backward passes
    on 24 points plus the sketches and the allocation: 5 s on that ResNet-18, 4 % of its projected kernel of 1,200
    points (`pilot["seconds"]`). The allocation, each weight's measured share, k_out, k_in and exact directions, is
    in `allocation` (a list of dicts), the pilot's points, seconds and budget in `pilot`, a summary in `method`."""

    def __init__(self, jac: StructuredJacobian, projection: Projection, progress: bool | None = None,
                 allocation: str = "share", pilot: torch.Tensor | None = None, directions: int = MAX_DIRECTIONS):
        if projection.kind != "gaussian":
            raise ValueError("the structured projection is Gaussian")
        if allocation not in ("share", "equal"):
            raise ValueError(f"allocation is 'share' or 'equal', not {allocation!r}")
        self.jac = jac
        self.projection = projection
        self.dtype = jac.dtype
        self.out_dim = jac.out_dim
        self.progress = progress
        self.allocation_rule = allocation
        self.pilot_points = PILOT_POINTS
        self.directions = max(0, int(directions))
        weights = [nd for nd in jac.nodes if nd.kind != "batch_norm" and nd.weight is not None]
        big = [nd for nd in weights if nd.n_weight > projection.dim]
        share = max(1, projection.dim // max(1, len(big)))
        self.parts: dict[str, _Part] = {}
        for nd in weights:
            if nd not in big:
                self.parts[nd.name] = _Part(0, 0)
                continue
            k_out = min(nd.d_out, max(1, math.isqrt(share)))
            k_in = min(nd.d_in, max(1, share // k_out))
            self.parts[nd.name] = _Part(k_out, k_in)
        #: features the projected weights share (the equal split's)
        self.budget = sum(self.parts[nd.name].k_out * self.parts[nd.name].k_in for nd in big)
        self._big = big
        #: per weight node: its measured share of the pilot kernel's trace and how it is represented (after the pilot)
        self.allocation: list[dict] = []
        #: the pilot: points, seconds, budget, modelled variance (None before it, or for the equal split)
        self.pilot: dict | None = None
        self.calibrated = allocation == "equal" or not big
        self._draw({})
        if pilot is not None:
            self.calibrate(pilot)

    def _draw(self, lead: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]) -> None:
        """R of every projected weight from the seed (and the leading directions kept exactly), and the width."""
        self._r: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        seed, dt, dev = self.projection.seed, self.dtype, self.jac.device
        for i, nd in enumerate(self.jac.nodes):
            part = self.parts.get(nd.name)
            if part is None or part.exact:
                continue
            u_o, u_i = lead.get(nd.name, (None, None))
            r_out = None if part.k_out == nd.d_out else _side_matrix((seed, i, 0), nd.d_out, part.k_out, u_o, dt, dev)
            r_in = None if part.k_in == nd.d_in else _side_matrix((seed, i, 1), nd.d_in, part.k_in, u_i, dt, dev)
            self._r[nd.name] = (r_out, r_in)
        self.width = sum(self._node_width(nd) for nd in self.jac.nodes)

    def calibrate(self, x: torch.Tensor) -> None:
        """The pilot and the allocation (class docstring), on `PILOT_POINTS` rows of `x` drawn with the seed; done
        once (`features` calls it on its first rows), then R is fixed."""
        if self.calibrated:
            return
        tic = time.perf_counter()
        m = min(self.pilot_points, len(x))
        rng = np.random.default_rng([int(self.projection.seed), 29])
        idx = np.sort(rng.choice(len(x), m, replace=False))
        pilot = x[torch.as_tensor(idx, device=x.device)]
        spectra, traces = pilot_spectra(self.jac, pilot, self._big, self.projection.seed, progress=self.progress)
        layers = [LayerModel(nd.name, *spectra[nd.name]) for nd in self._big]
        parts = allocate(layers, self.budget, self.directions)
        lead: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        modelled = 0.0
        for nd, layer, part in zip(self._big, layers, parts, strict=True):
            self.parts[nd.name] = part
            lead[nd.name] = (_lead(layer.out, part.r_out), _lead(layer.inp, part.r_in))
            modelled += _modelled(layer, part)
        self._draw(lead)
        total = sum(traces.values()) or 1.0
        self.allocation = []
        for nd in self.jac.nodes:
            part = self.parts.get(nd.name)
            if part is None:
                continue
            exact = part.exact or (part.k_out == nd.d_out and part.k_in == nd.d_in)
            self.allocation.append({
                "node": nd.name, "weight": nd.weight, "kind": nd.kind, "d_out": nd.d_out, "d_in": nd.d_in,
                "share": traces[nd.name] / total, "exact": exact,
                "k_out": nd.d_out if part.exact else part.k_out, "k_in": nd.d_in if part.exact else part.k_in,
                "exact_out": nd.d_out if part.exact or part.k_out == nd.d_out else part.r_out,
                "exact_in": nd.d_in if part.exact or part.k_in == nd.d_in else part.r_in})
        self.pilot = {"points": int(m), "seconds": time.perf_counter() - tic, "budget": int(self.budget),
                      "projected_features": int(sum(self.parts[nd.name].k_out * self.parts[nd.name].k_in
                                                    for nd in self._big)),
                      "projected_share": sum(traces[nd.name] for nd in self._big) / total,
                      "modelled_relative_variance": modelled / total ** 2,
                      "what": "share: the node's parameters' part of the trace of the pilot kernel; k_out x k_in: "
                              "features per output; exact_out / exact_in: leading directions kept exactly"}
        self.calibrated = True

    def _node_width(self, nd: _Node) -> int:
        w = (nd.d_out if nd.kind == "batch_norm" and nd.weight is not None else 0) + (nd.d_out if nd.bias else 0)
        part = self.parts.get(nd.name)
        if part is not None:
            w += nd.n_weight if part.exact else part.k_out * part.k_in
        return w

    @property
    def n_params(self) -> int:
        return self.jac.n_params

    @property
    def method(self) -> str:
        n_proj = sum(not p.exact for p in self.parts.values())
        if not self._big:
            how = "no weight large enough to project"
        elif self.allocation_rule == "equal":
            how = "equal split"
        elif not self.calibrated:
            how = f"dimensions to be allocated by each weight's share of the kernel on a pilot of {self.pilot_points}"
            how += " points"
        else:
            r = sum(p.r_out + p.r_in for p in self.parts.values())
            how = (f"dimensions allocated by each weight's measured share of the kernel (pilot of "
                   f"{self.pilot['points'] if self.pilot else self.pilot_points} points), {r} leading directions "
                   "kept exactly")
        return (f"{self.jac.method}; weights of {n_proj} nodes Kronecker-projected (Gaussian, seed "
                f"{self.projection.seed}; {how}), the rest exact: {self.width} features per output")

    def bytes_per_example(self) -> int:
        """float32 features of one example (before the pilot: the equal split's width, an upper bound)."""
        return 4 * self.out_dim * self.width

    def _project_in(self, nd: _Node, a: torch.Tensor) -> torch.Tensor:
        """`R_in^T a_s` at every position, (n, S, k_in): for conv2d one convolution with k_in random filters."""
        r_in = self._r[nd.name][1]
        if nd.kind == "conv2d":
            if r_in is None:
                return self.jac.patches(nd, a)
            filt = r_in.T.reshape(-1, a.shape[1], *nd.kernel_size)
            return F.conv2d(a, filt, None, nd.stride, nd.padding, nd.dilation).flatten(2).transpose(1, 2)
        rows = self.jac.patches(nd, a)
        return rows if r_in is None else rows @ r_in

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        """(n, c, width) features of one batch."""
        n, c = len(x), self.out_dim
        out = torch.empty(n, c, self.width, dtype=torch.float32, device=self.jac.device)
        proj_in: dict[str, torch.Tensor] = {}
        for cc, a, d in self.jac.deltas(x):
            col = 0
            for nd in self.jac.nodes:
                for g in self.jac.small_grads(nd, a[nd.name], d[nd.name]):
                    out[:, cc, col:col + g.shape[1]] = g
                    col += g.shape[1]
                part = self.parts.get(nd.name)
                if part is None:
                    continue
                rd = self.jac.rows(nd, d[nd.name])
                if nd.name not in proj_in:  # the input side is the same for every output: once per batch
                    proj_in[nd.name] = (self.jac.patches(nd, a[nd.name]) if part.exact
                                        else self._project_in(nd, a[nd.name]))
                r_out = None if part.exact else self._r[nd.name][0]
                po = rd if r_out is None else rd @ r_out
                g = torch.einsum("nso,nsi->noi", po, proj_in[nd.name]).reshape(n, -1)
                out[:, cc, col:col + g.shape[1]] = g
                col += g.shape[1]
        return out

    def features(self, x: torch.Tensor, label: str = "jacobians") -> JacobianFeatures:
        """Projected features of the rows of `x`, as `JacobianFeatures` with `mat` (n, c, width); the first call
        runs the pilot on rows of `x` (`calibrate`) unless it has run."""
        if not self.calibrated and len(x):
            self.calibrate(x)
        # filled in place: no second copy
        mat = torch.empty(len(x), self.out_dim, self.width, dtype=torch.float32, device=self.jac.device)
        step = self.jac.batch_size
        with Progress(len(x), f"{label} (structured, projected)", enabled=self.progress) as bar:
            for i in range(0, len(x), step):
                mat[i:i + step] = self._features(x[i:i + step])
                bar.update(min(step, len(x) - i))
        return JacobianFeatures(mat)

    def gram(self, fa: JacobianFeatures, fb: JacobianFeatures) -> torch.Tensor:
        """`(1/c) sum_c Phi_c(a) Phi_c(b)^T` as float64 (products in the features' float32: the projection's own
        error is orders of magnitude larger, and a float64 copy of 1,200 x 10 x 17,600 features would take 1.7 GB)."""
        ma, mb = fa.mat.reshape(len(fa), -1), fb.mat.reshape(len(fb), -1)
        return (ma @ mb.T).double() / self.out_dim

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, max_bytes: int = 2 << 30) -> torch.Tensor:
        """Projected NTK between rows of x1 and x2 (default x1); the pilot, if it has not run, on rows of x1."""
        f1 = self.features(x1)
        return self.gram(f1, f1 if x2 is None else self.features(x2))


def _lead(spec: Spectrum, r: int) -> torch.Tensor | None:
    """The first r leading directions of a side (None for none)."""
    if r <= 0 or spec.vectors is None:
        return None
    return spec.vectors[:, :r]


def _modelled(layer: LayerModel, part: _Part) -> float:
    """The allocation's model of one weight's summed kernel-entry variance (`ProjectedStructured`), in trace^2."""
    d_o, d_i = layer.out.dim, layer.inp.dim
    t = max(layer.out.trace, 1e-300)
    ex_o, ex_i = part.k_out >= d_o, part.k_in >= d_i
    q_o, q_i = max(1, part.k_out - part.r_out), max(1, part.k_in - part.r_in)
    v = (0.0 if ex_o else layer.out.residual(part.r_out) / q_o) + (0.0 if ex_i else layer.inp.residual(part.r_in) / q_i)
    if not (ex_o or ex_i):
        v += (layer.out.rest(part.r_out) * layer.inp.rest(part.r_in) / t) ** 2 / (q_o * q_i)
    return v
