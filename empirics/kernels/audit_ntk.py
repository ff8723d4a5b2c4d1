"""Exact empirical NTK of an arbitrary classifier (TorchScript, torch.export or eager), memory-bounded.

`empirics.kernels.ntk.ntk_generic` uses `torch.func`, which refuses TorchScript modules ("The stateless API
can't be used with Jitted modules") and cannot vmap an exported program whose batch size was
specialised. This module gets per-example Jacobians with plain autograd instead, one example at a
time: with a batch of one example the gradient of output c w.r.t. the parameters *is* that
example's Jacobian row (for a program exported with a static batch size B, the example is repeated
B times and the outputs averaged, which gives the same gradient).

An example's Jacobian is stored in one of two forms, and the kernel ("mean" reduction,
`K(x, x') = (1/c) sum_c <df_c(x)/dtheta, df_c(x')/dtheta>`) is the sum of their Gram matrices:

- materialised: `d f_c / d p` for every parameter p of this kind, an array (c, P_m);
- factored (structured derivatives, Novak et al. 2022): a weight used only by one `aten.linear`
  node of an FX graph (an exported program, or a TorchScript module converted to one) has gradient
  `sum_s delta_s a_s^T` over the S rows of the node's input (tokens, positions, or 1), so its
  kernel contribution is `sum_c sum_{s,s'} (a_is . a_js') (delta_ics . delta_jcs')`, computed from
  the node input `a` (S, d_in) and output gradient `delta` (c, S, d_out) without forming the
  (d_out x d_in) gradient (its bias, if used nowhere else, adds `sum_c (sum_s delta_ics) .
  (sum_t delta_jct)`). A layer is factored when `S^2 (d_in + c d_out) < c d_in d_out`.

When every parameter is factored and a probe shows the graph keeps examples apart in those nodes,
examples go through in batches (one forward and c backward passes per batch); otherwise one at a
time, on one thread (the operations are too small to gain from more).

For a 784-1024-256-10 MLP (1.07 M parameters) the factored form turns the `n^2 c P` Jacobian
contraction (1e13 flops at n = 1000) into about `n^2 (d_in + c d_out)` per layer (1e10).
Memory: features of all points are kept when they fit in `max_bytes`; otherwise the kernel is
assembled block by block, recomputing Jacobians (slower, bounded memory).

`ProjectedJacobian` (below) projects each batch's Jacobians to k dimensions with a seeded Gaussian or
Rademacher matrix generated in blocks, the approach of TRAK and dattri's projectors: an unbiased kernel
estimate from n c k numbers instead of n c P.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from empirics.progress import Progress

_LINEAR = torch.ops.aten.linear.default
_PAIR_ELEMENTS = 1 << 24


@dataclass
class JacobianFeatures:
    """Per-example Jacobians of n examples: `mat` (n, c, P_m) and factored linear layers (A, Delta)."""

    mat: torch.Tensor
    lin: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.mat.shape[0])

    def select(self, idx: torch.Tensor | slice) -> JacobianFeatures:
        return JacobianFeatures(self.mat[idx], [(a[idx], d[idx]) for a, d in self.lin])

    @staticmethod
    def cat(parts: Sequence[JacobianFeatures]) -> JacobianFeatures:
        mat = torch.cat([p.mat for p in parts])
        lin = [(torch.cat([p.lin[k][0] for p in parts]), torch.cat([p.lin[k][1] for p in parts]))
               for k in range(len(parts[0].lin))]
        return JacobianFeatures(mat, lin)


@dataclass
class _Layer:
    """A factored linear node: its name, parameters, rows S per example, input and output widths."""

    node: str
    weight: str
    bias: str | None
    rows: int
    d_in: int
    d_out: int


class _Capture(torch.fx.Interpreter):
    """Runs an FX graph and keeps the input and output of the chosen `aten.linear` nodes."""

    def __init__(self, gm: torch.fx.GraphModule, watch: set[str]):
        super().__init__(gm)
        self.watch = watch
        self.seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def run_node(self, n: torch.fx.Node) -> object:
        out = super().run_node(n)
        if n.name in self.watch:
            self.seen[n.name] = (self.env[n.args[0]], out)
        return out


def _first_tensor(out: object) -> torch.Tensor:
    while isinstance(out, (tuple, list)) and len(out) > 0:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model output is {type(out).__name__}, not a tensor")
    return out


def _as_2d(out: torch.Tensor) -> torch.Tensor:
    return out.unsqueeze(1) if out.dim() == 1 else out.reshape(out.shape[0], -1)


def trainable(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, and buffers, that require grad (a converted TorchScript graph keeps its weights as
    buffers that still require grad)."""
    out = {k: p for k, p in module.named_parameters() if p.requires_grad}
    out.update({k: b for k, b in module.named_buffers() if b.requires_grad and k not in out})
    return out


def sole_use(gm: torch.fx.GraphModule) -> Callable[[object], str | None]:
    """`own(arg)`: the name of the trainable parameter that node argument `arg` reads, if that read is the
    parameter's only use in the graph (so its gradient comes from that one node), else None."""
    params = trainable(gm)
    uses: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target in params:
            uses[node.target] = uses.get(node.target, 0) + len(node.users)

    def own(arg: object) -> str | None:
        ok = isinstance(arg, torch.fx.Node) and arg.op == "get_attr" and arg.target in params
        return str(arg.target) if ok and uses[arg.target] == 1 else None

    return own


def linear_candidates(gm: torch.fx.GraphModule) -> dict[str, tuple[str, str | None]]:
    """`aten.linear` nodes whose weight (and bias) are parameters used by nothing else.

    Returns node name -> (weight name, bias name or None); a bias that is shared or not a
    parameter stays materialised.
    """
    own = sole_use(gm)
    out: dict[str, tuple[str, str | None]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _LINEAR and len(node.args) >= 2:
            w = own(node.args[1])
            if w is not None:
                out[node.name] = (w, own(node.args[2]) if len(node.args) > 2 else None)
    return out


@dataclass(frozen=True)
class JacobianOptions:
    """How `ModelJacobian` works: whether it factors the linear layers of an FX graph (`factor`), whether it shows a
    progress bar (`progress`; None: when stderr is a terminal or `NTKM_PROGRESS=1`), and the examples of one batch in
    batched mode (`batch_size`)."""

    factor: bool = True
    progress: bool | None = None
    batch_size: int = 64


class ModelJacobian:
    """Per-example Jacobians and the empirical NTK of a classifier with outputs (n, c).

    `model(x)` takes the model's own input shape (n, *input_shape); `graph` (optional) is an FX
    GraphModule computing the same function, whose parameters are then the ones differentiated
    (enables the factored linear layers); `static_batch` is the batch size a program was exported
    with (None: any); `options` the rest (`JacobianOptions`). All parameters that require grad are
    differentiated.

    Batched mode: when every parameter is a factored linear weight or bias and a probe shows that
    each such node keeps the rows of different examples apart (layout (batch, S, d)), examples go
    through in batches and one backward per output gives every example's `delta` at once.
    Otherwise each example runs alone (or repeated to fill a static batch).
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int], graph: torch.fx.GraphModule | None = None,
                 static_batch: int | None = None, options: JacobianOptions | None = None):
        opts = options or JacobianOptions()
        self.model = model
        self.graph = graph
        self.input_shape = tuple(int(s) for s in input_shape)
        self.static_batch = int(static_batch) if static_batch else None
        self.progress = opts.progress
        owner = graph if graph is not None else model
        named = list(trainable(owner).items())
        if not named:
            raise ValueError("the model has no trainable parameters")
        self._named = named
        self.dtype = named[0][1].dtype
        #: where the parameters are: the probes, Jacobian features and kernels are made there
        self.device = named[0][1].device
        self.layers: list[_Layer] = []
        self.out_dim = 0
        self.batched = False
        self.batch_size = self.static_batch or max(1, opts.batch_size)
        self._plan(opts.factor and graph is not None)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for _, p in self._named)

    @property
    def method(self) -> str:
        if not self.layers:
            return "autograd, one example at a time"
        how = "batched" if self.batched else "one example at a time"
        return f"factored linear layers ({len(self.layers)}) + autograd, {how}"

    def _copies(self, x: torch.Tensor) -> torch.Tensor:
        """One example, repeated to the static batch size (or alone)."""
        xb = x.reshape(1, *self.input_shape)
        b = self.static_batch or 1
        return xb.expand(b, *self.input_shape).contiguous() if b > 1 else xb

    def _run(self, xb: torch.Tensor, watch: set[str]) -> tuple[torch.Tensor, dict[str, tuple]]:
        if self.graph is None:
            return _as_2d(_first_tensor(self.model(xb))), {}
        cap = _Capture(self.graph, watch)
        out = _as_2d(_first_tensor(cap.run(xb)))
        return out, cap.seen

    def _plan(self, factor: bool) -> None:
        cands = linear_candidates(self.graph) if factor else {}
        d = int(math.prod(self.input_shape))
        probe = torch.linspace(0.1, 0.9, d, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            out, seen = self._run(self._copies(probe), set(cands))
        self.out_dim = c = int(out.shape[1])
        for name, (weight, bias) in cands.items():
            if name not in seen:
                continue
            a, z = seen[name]
            d_in, d_out = int(a.shape[-1]), int(z.shape[-1])
            rows = int(a.numel() // d_in)
            per_example = max(1, rows // (self.static_batch or 1))
            if per_example**2 * (d_in + c * d_out) < c * d_in * d_out:
                self.layers.append(_Layer(name, weight, bias, rows, d_in, d_out))
        factored = {lay.weight for lay in self.layers} | {lay.bias for lay in self.layers if lay.bias}
        self._mat = [(k, p) for k, p in self._named if k not in factored]
        self.p_mat = sum(p.numel() for _, p in self._mat)
        if self.layers and not self.p_mat:
            self.batched = self._separable(d)

    def _separable(self, d: int) -> bool:
        """Do the factored nodes hold examples as (batch, S, d) blocks? Checked on a probe batch."""
        k = self.static_batch or 3
        gen = torch.Generator().manual_seed(0)
        xs = torch.rand(k, d, generator=gen, dtype=self.dtype).to(self.device)  # the seeded CPU probe, moved
        watch = {lay.node for lay in self.layers}
        with torch.no_grad():
            _, seen = self._run(xs.reshape(k, *self.input_shape), watch)
            for j in range(k):
                _, one = self._run(self._copies(xs[j]), watch)
                for lay in self.layers:
                    for pos in (0, 1):
                        got, want = seen[lay.node][pos], one[lay.node][pos]
                        if got.numel() % k or want.numel() % (self.static_batch or 1):
                            return False
                        got = got.reshape(k, -1)[j]
                        want = want.reshape(self.static_batch or 1, -1)[0]
                        tol = 1e-5 * max(1.0, float(want.abs().max()))  # rounding of another batch size
                        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=tol):
                            return False
        for lay in self.layers:
            lay.rows //= self.static_batch or 1
        return True

    def bytes_per_example(self) -> int:
        item = self._named[0][1].element_size()
        c = self.out_dim
        return item * (c * self.p_mat + sum(lay.rows * (lay.d_in + c * lay.d_out) for lay in self.layers))

    def _grads(self, out: torch.Tensor, targets: list[torch.Tensor], scale: float) -> list[list[torch.Tensor | None]]:
        c = out.shape[1]
        return [list(torch.autograd.grad(out[:, k].sum() * scale, targets, retain_graph=k < c - 1,
                                         allow_unused=True)) for k in range(c)]

    def example(self, x: torch.Tensor) -> JacobianFeatures:
        """Jacobian features of one example (flat or shaped), run alone or as copies."""
        watch = {lay.node for lay in self.layers}
        mat_params = [p for _, p in self._mat]
        b = self.static_batch or 1
        with torch.enable_grad():
            out, seen = self._run(self._copies(x.detach()), watch)
            zs = [seen[lay.node][1] for lay in self.layers]
            grads = self._grads(out, zs + mat_params, 1.0 / b)
        dt = out.dtype
        mats = []
        for g in grads:
            flat = [torch.zeros(p.numel(), dtype=dt, device=out.device) if gi is None else gi.detach().reshape(-1)
                    for gi, p in zip(g[len(zs):], mat_params, strict=True)]
            mats.append(torch.cat(flat) if flat else torch.zeros(0, dtype=dt, device=out.device))
        lin = []
        for j, lay in enumerate(self.layers):
            deltas = [torch.zeros(lay.rows, lay.d_out, dtype=dt, device=out.device) if g[j] is None
                      else g[j].detach().reshape(lay.rows, lay.d_out) for g in grads]
            lin.append((seen[lay.node][0].detach().reshape(1, lay.rows, lay.d_in), torch.stack(deltas)[None]))
        return JacobianFeatures(torch.stack(mats)[None], lin)

    def _batch(self, x: torch.Tensor) -> JacobianFeatures:
        """Features of a batch of examples in one forward pass (batched mode only)."""
        n = len(x)
        b = self.static_batch or n
        xb = x.detach().reshape(n, *self.input_shape)
        if b > n:
            xb = torch.cat([xb, xb[-1:].expand(b - n, *self.input_shape)])
        watch = {lay.node for lay in self.layers}
        with torch.enable_grad():
            out, seen = self._run(xb, watch)
            grads = self._grads(out, [seen[lay.node][1] for lay in self.layers], 1.0)
        lin = []
        for j, lay in enumerate(self.layers):
            a = seen[lay.node][0].detach().reshape(b, lay.rows, lay.d_in)[:n]
            ds = [torch.zeros(b, lay.rows, lay.d_out, dtype=out.dtype, device=out.device) if g[j] is None
                  else g[j].detach().reshape(b, lay.rows, lay.d_out) for g in grads]
            lin.append((a, torch.stack(ds, dim=1)[:n]))
        return JacobianFeatures(torch.zeros(n, self.out_dim, 0, dtype=out.dtype, device=out.device), lin)

    def features(self, x: torch.Tensor, label: str = "jacobians") -> JacobianFeatures:
        """Jacobian features of the rows of `x` (n, d). One example at a time runs on one thread: the
        operations are too small to gain from more, and lose much when the cores are shared."""
        parts = []
        x = x.to(self.dtype)
        step = self.batch_size if self.batched else 1
        threads = torch.get_num_threads()
        if not self.batched:
            torch.set_num_threads(1)
        try:
            with Progress(len(x), label, enabled=self.progress) as bar:
                for i in range(0, len(x), step):
                    parts.append(self._batch(x[i:i + step]) if self.batched else self.example(x[i]))
                    bar.update(min(step, len(x) - i))
        finally:
            torch.set_num_threads(threads)
        return JacobianFeatures.cat(parts)

    def gram(self, fa: JacobianFeatures, fb: JacobianFeatures) -> torch.Tensor:
        """`(1/c) sum_c J_c(a) J_c(b)^T` in float64, shape (len(fa), len(fb))."""
        na, nb = len(fa), len(fb)
        k = torch.zeros(na, nb, dtype=torch.float64, device=fa.mat.device)
        if self.p_mat:
            ma, mb = fa.mat.reshape(na, -1), fb.mat.reshape(nb, -1)
            if ma.shape[1] * (na + nb) <= (1 << 27):
                ma, mb = ma.double(), mb.double()
            k += (ma @ mb.T).double()
        for lay, (aa, da), (ab, db) in zip(self.layers, fa.lin, fb.lin, strict=True):
            k += _factored_gram(aa.double(), da.double(), ab.double(), db.double(), lay.bias is not None)
        return k / self.out_dim

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, max_bytes: int = 2 << 30) -> torch.Tensor:
        """Empirical NTK between rows of x1 and x2 (default x1), float64, within about `max_bytes`."""
        sym = x2 is None
        x2 = x1 if x2 is None else x2
        per = max(1, self.bytes_per_example())
        n1, n2 = len(x1), len(x2)
        if per * (n1 + (0 if sym else n2)) <= max_bytes:
            f1 = self.features(x1)
            f2 = f1 if sym else self.features(x2)
            return self.gram(f1, f2)
        chunk = max(1, max_bytes // (2 * per))
        out = torch.zeros(n1, n2, dtype=torch.float64, device=self.device)
        for i in range(0, n1, chunk):
            f1 = self.features(x1[i:i + chunk], label=f"jacobians {i}/{n1}")
            for j in range(0, n2, chunk):
                if sym and j < i:
                    continue
                f2 = f1 if (sym and j == i) else self.features(x2[j:j + chunk], label=f"jacobians {j}/{n2}")
                blk = self.gram(f1, f2)
                out[i:i + chunk, j:j + chunk] = blk
                if sym and j != i:
                    out[j:j + chunk, i:i + chunk] = blk.T
        return out


def _factored_gram(aa: torch.Tensor, da: torch.Tensor, ab: torch.Tensor, db: torch.Tensor,
                   bias: bool) -> torch.Tensor:
    """`sum_c sum_{s,t} (a_is . b_jt + [bias]) (delta_ics . delta_jct)` for all (i, j)."""
    na, s, _ = aa.shape
    nb, t = ab.shape[0], ab.shape[1]
    if s == 1 and t == 1:
        ga = aa[:, 0] @ ab[:, 0].T
        return (ga + 1.0 if bias else ga) * (da.reshape(na, -1) @ db.reshape(nb, -1).T)
    out = torch.empty(na, nb, dtype=aa.dtype, device=aa.device)
    step = max(1, _PAIR_ELEMENTS // max(1, nb * s * t))
    for i in range(0, na, step):
        sl = slice(i, i + step)
        gram_a = torch.einsum("isd,jtd->ijst", aa[sl], ab)
        if bias:
            gram_a = gram_a + 1.0
        gram_d = torch.einsum("icse,jcte->ijst", da[sl], db)
        out[sl] = (gram_a * gram_d).sum(dim=(2, 3))
    return out


# --- projected empirical NTK ---------------------------------------------------------------------------

PROJECTION_KINDS = ("gaussian", "rademacher")
_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Projection:
    """A random projection R (P x k) of per-example gradients: entries N(0, 1/k) or +-1/sqrt(k), so that
    E[R R^T] = I and `<R^T g, R^T g'>` is an unbiased estimate of `<g, g'>` (relative error about
    sqrt(2/k) per entry, Johnson-Lindenstrauss). R is generated in blocks of rows of one parameter at a
    time, each from its own seed (`seed`, parameter index, block index), so the same R comes out whether
    blocks are cached or regenerated."""

    dim: int
    kind: str = "gaussian"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dim < 1 or self.kind not in PROJECTION_KINDS:
            raise ValueError(f"projection needs dim >= 1 and kind in {PROJECTION_KINDS}")

    def block(self, param: int, index: int, rows: int, cols: int,
              device: torch.device | str | None = None) -> torch.Tensor:
        """Rows `index * rows ...` of parameter `param`'s part of R, as (rows, cols, k) float32 on `device`: drawn on
        the CPU by a seeded CPU generator (the same R on every device), then moved."""
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + param) * 1_000_033 + index)
        shape = (rows, cols, self.dim)
        if self.kind == "gaussian":
            return (torch.randn(shape, generator=gen) / math.sqrt(self.dim)).to(device=device)
        return ((torch.randint(0, 2, shape, generator=gen, dtype=torch.int8).float() * 2 - 1)
                / math.sqrt(self.dim)).to(device=device)


class ProjectedJacobian:
    """Per-example Jacobians projected to k dimensions, `Phi_c(x) = R^T df_c(x)/dtheta` (n, c, k), and the
    kernel `(1/c) sum_c Phi_c(x) . Phi_c(x')`, an unbiased estimate of `ModelJacobian`'s exact kernel.

    Examples go through in batches whose exact Jacobian features fit `batch_bytes`; each batch is projected
    and dropped, so no Jacobian of more than one batch is ever held. Factored linear layers are projected
    from their factors, `sum_s delta_s^T R_W a_s`: through the factors (`a R_W` first) or by materialising
    the gradient of a block of output rows, whichever takes fewer operations. Blocks of R are kept for reuse
    while they fit `cache_bytes`, otherwise regenerated. Same interface as `ModelJacobian` where the audit
    uses it (`features`, `gram`, `kernel`, `bytes_per_example`, `method`).
    """

    def __init__(self, jac: ModelJacobian, projection: Projection, batch_bytes: int = 256 << 20,
                 cache_bytes: int = 1 << 30):
        self.jac = jac
        self.projection = projection
        self.dtype = jac.dtype
        self.out_dim = jac.out_dim
        self.batch_bytes = batch_bytes
        self.cache_bytes = cache_bytes
        self._cache: dict[tuple[int, int], torch.Tensor] = {}
        self._cached = 0

    @property
    def n_params(self) -> int:
        return self.jac.n_params

    @property
    def method(self) -> str:
        p = self.projection
        return f"{self.jac.method}; projected to k = {p.dim} ({p.kind}, seed {p.seed})"

    def bytes_per_example(self) -> int:
        return 4 * self.out_dim * self.projection.dim

    def _r(self, param: int, index: int, rows: int, cols: int) -> torch.Tensor:
        key = (param, index)
        if key in self._cache:
            return self._cache[key]
        r = self.projection.block(param, index, rows, cols, device=self.jac.device)
        if self._cached + r.numel() * 4 <= self.cache_bytes:
            self._cache[key] = r
            self._cached += r.numel() * 4
        return r

    def _project(self, f: JacobianFeatures) -> torch.Tensor:
        n, c, k = len(f), self.out_dim, self.projection.dim
        out = torch.zeros(n, c, k, dtype=torch.float32, device=f.mat.device)
        pid, col = 0, 0
        for _, p in self.jac._mat:
            size = p.numel()
            g = f.mat[:, :, col:col + size].float()
            step = max(1, _CHUNK_ELEMENTS // max(1, k))
            for b, lo in enumerate(range(0, size, step)):
                hi = min(size, lo + step)
                out += g[:, :, lo:hi] @ self._r(pid, b, hi - lo, 1)[:, 0]
            pid, col = pid + 1, col + size
        for lay, (a, d) in zip(self.jac.layers, f.lin, strict=True):
            a, d = a.float(), d.float()
            step = max(1, _CHUNK_ELEMENTS // (lay.d_in * k))
            for b, lo in enumerate(range(0, lay.d_out, step)):
                hi = min(lay.d_out, lo + step)
                r = self._r(pid, b, hi - lo, lay.d_in)
                s_rows, o = lay.rows, hi - lo
                through_factors = s_rows * lay.d_in * k + c * s_rows * k < c * lay.d_in * (s_rows + k)
                per = s_rows * o * k if through_factors else c * o * lay.d_in
                ex = max(1, _CHUNK_ELEMENTS // per)
                for e in range(0, n, ex):
                    de, ae = d[e:e + ex, :, :, lo:hi], a[e:e + ex]
                    if through_factors:
                        out[e:e + ex] += torch.einsum("ncso,nsok->nck", de, torch.einsum("nsi,oik->nsok", ae, r))
                    else:
                        grad = torch.einsum("ncso,nsi->ncoi", de, ae).reshape(len(de), c, -1)
                        out[e:e + ex] += grad @ r.reshape(-1, k)
            pid += 1
            if lay.bias is not None:
                out += d.sum(dim=2) @ self._r(pid, 0, lay.d_out, 1)[:, 0]
                pid += 1
        return out

    def features(self, x: torch.Tensor, label: str = "jacobians") -> JacobianFeatures:
        """Projected features of the rows of `x`, as `JacobianFeatures` with `mat` (n, c, k)."""
        per = max(1, self.jac.bytes_per_example())
        step = max(1, self.batch_bytes // per)
        parts = [self._project(self.jac.features(x[i:i + step], label=f"{label} (projected) {i}/{len(x)}"))
                 for i in range(0, len(x), step)]
        return JacobianFeatures(torch.cat(parts) if parts else torch.zeros(0, self.out_dim, self.projection.dim,
                                                                          device=self.jac.device))

    def gram(self, fa: JacobianFeatures, fb: JacobianFeatures) -> torch.Tensor:
        """`(1/c) sum_c Phi_c(a) Phi_c(b)^T` in float64."""
        ma, mb = fa.mat.reshape(len(fa), -1).double(), fb.mat.reshape(len(fb), -1).double()
        return ma @ mb.T / self.out_dim

    def kernel(self, x1: torch.Tensor, x2: torch.Tensor | None = None, max_bytes: int = 2 << 30) -> torch.Tensor:
        """Projected NTK between rows of x1 and x2 (default x1); the features of all points are small."""
        f1 = self.features(x1)
        return self.gram(f1, f1 if x2 is None else self.features(x2))
