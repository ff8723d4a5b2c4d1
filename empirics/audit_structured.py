"""Per-example gradients of convolutional networks without per-example Jacobians: the audit's kernel at ResNet scale.

`empirics.audit_ntk.ModelJacobian` builds one example's Jacobian at a time (c backward passes with every weight
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
  are kept exact; the target is shared equally between the larger weights.
- **exact** (`StructuredJacobian.kernel`): for each output and layer, the per-example gradients `G` of all points
  (in blocks of output channels) and their Gram matrix, or, for layers with few positions and many values (a
  ResNet's last stage), the same Gram through the factors `sum_{s,t} (a_is . a_jt)(delta_is . delta_jt)`; never the
  `n x c x P` of all Jacobians. It is the reference the projection's error is measured against (Gram products in
  the parameters' precision: float32 for a float32 model, about 1e-6 relative).

The kernel is `K(x, x') = (1/c) sum_c <df_c(x)/dtheta, df_c(x')/dtheta>`, as in `empirics.audit_ntk`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from empirics.audit_ntk import JacobianFeatures, Projection, _as_2d, _Capture, _first_tensor, sole_use, trainable
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
        self.watch = {n.name for n in nodes}
        with torch.no_grad():
            out, _ = self._run(torch.zeros(1, *self.input_shape, dtype=self.dtype), set())
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
        xs = torch.rand(k, *self.input_shape, generator=torch.Generator().manual_seed(0), dtype=self.dtype)
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
        k = torch.zeros(n, n, dtype=torch.float64)
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
        k = torch.zeros(n, n, dtype=torch.float64)
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
        out = torch.zeros(n, n, dtype=torch.float64)
        for lo in range(0, nd.d_out, step):
            g = torch.bmm(rd[:, :, lo:lo + step].transpose(1, 2), pa).reshape(n, -1)
            out += (g @ g.T).double()
        return out


# --- projection ------------------------------------------------------------------------------------------------


def _gaussian(seed: int, layer: int, side: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A seeded (rows, cols) matrix with entries N(0, 1/cols), so that E[R R^T] = I."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 1_009 + side)
    return (torch.randn(rows, cols, generator=gen) / math.sqrt(cols)).to(dtype)


@dataclass(frozen=True)
class _Part:
    """How one node's weight is represented: exact (k_out = k_in = 0) or projected to k_out x k_in."""

    k_out: int
    k_in: int

    @property
    def exact(self) -> bool:
        return self.k_out == 0


class ProjectedStructured:
    """Kronecker-projected per-example gradients of a `StructuredJacobian` (module docstring), with the interface the
    audit uses (`features`, `gram`, `kernel`, `bytes_per_example`, `method`, `projection`; `jac` is the exact
    reference). A weight with at most `projection.dim` values is kept exact (a trained network's last linear layer
    carries much of its kernel, and projecting its 512 inputs to a few dozen dimensions cost a quarter of the kernel's
    accuracy on a ResNet-18); `projection.dim` is shared equally between the larger weights. The feature width
    actually used is `width`."""

    def __init__(self, jac: StructuredJacobian, projection: Projection, progress: bool | None = None):
        if projection.kind != "gaussian":
            raise ValueError("the structured projection is Gaussian")
        self.jac = jac
        self.projection = projection
        self.dtype = jac.dtype
        self.out_dim = jac.out_dim
        self.progress = progress
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
        self._r: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        for i, nd in enumerate(jac.nodes):
            part = self.parts.get(nd.name)
            if part is None or part.exact:
                continue
            seed, dt = projection.seed, self.dtype
            r_out = None if part.k_out == nd.d_out else _gaussian(seed, i, 0, nd.d_out, part.k_out, dt)
            r_in = None if part.k_in == nd.d_in else _gaussian(seed, i, 1, nd.d_in, part.k_in, dt)
            self._r[nd.name] = (r_out, r_in)
        self.width = sum(self._node_width(nd) for nd in jac.nodes)

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
        return (f"{self.jac.method}; weights of {n_proj} nodes Kronecker-projected (Gaussian, seed "
                f"{self.projection.seed}), the rest exact: {self.width} features per output")

    def bytes_per_example(self) -> int:
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
        out = torch.empty(n, c, self.width, dtype=torch.float32)
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
        """Projected features of the rows of `x`, as `JacobianFeatures` with `mat` (n, c, width)."""
        parts = []
        step = self.jac.batch_size
        with Progress(len(x), f"{label} (structured, projected)", enabled=self.progress) as bar:
            for i in range(0, len(x), step):
                parts.append(self._features(x[i:i + step]))
                bar.update(min(step, len(x) - i))
        mat = torch.cat(parts) if parts else torch.zeros(0, self.out_dim, self.width)
        return JacobianFeatures(mat)

    def gram(self, fa: JacobianFeatures, fb: JacobianFeatures) -> torch.Tensor:
        """`(1/c) sum_c Phi_c(a) Phi_c(b)^T` as float64 (products in the features' float32: the projection's own
        error is orders of magnitude larger, and a float64 copy of 1,200 x 10 x 17,600 features would take 1.7 GB)."""
        ma, mb = fa.mat.reshape(len(fa), -1), fb.mat.reshape(len(fb), -1)
        return (ma @ mb.T).double() / self.out_dim

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, max_bytes: int = 2 << 30) -> torch.Tensor:
        """Projected NTK between rows of x1 and x2 (default x1)."""
        f1 = self.features(x1)
        return self.gram(f1, f1 if x2 is None else self.features(x2))
