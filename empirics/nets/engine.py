"""Train many networks at once: `train_many(jobs)` returns what `[train_job(job) for job in jobs]` returns.

The suite's networks are small two-layer heads `m^-1/2 A^T relu(W x~)` with only `W` trained and the features `x~`
fixed (`empirics.nets.models.TwoLayerNet`), so training one costs a few small matrix products per step, and per-call
overhead and the Python loop dominate at the narrow widths. Jobs that agree on every shape and on the optimiser's
scalars (n, width, head dimension, outputs, batch size, optimiser, decay, learning rate, weight decay, loss, epochs
and recording cadence) form a group, trained as one stacked computation: `W` as an (S, m, d) tensor, batched matrix
products with the gradient written out (the head is two products and a ReLU), and Adam applied to the whole stack
with the scalars of `torch.optim.Adam` / `AdamW` / `SGD` (same operations in the same order, elementwise, so the
update of each slice is the update torch would make). Each network keeps its own semantics: its features and data
subset, its generator and per-epoch batch order (`torch.randperm` from `torch.Generator().manual_seed(cfg.seed)`),
its Adam moments, its learning rate (full-batch GD with `lr_from_ntk` steps each slice with its own), its loss
history and plateau stopping: a network that stops leaves the stack (no more updates or steps) and its record is
frozen. Final accuracies, losses and the relative weight change are computed on the model itself with the code of
`empirics.nets.train.train`. Before training, the stacked head is checked to reproduce each model's own `head` exactly
(a model whose head computes something else falls back). The gradient of the loss comes from autograd through the very
loss `train` uses; the products are the ones autograd takes for `head`, batched. Measured on torch 2.13 CPU, the results
equal the loop's bit for bit (a batched product's slice equals `mm`) at widths 16 and up; at width 8 they differ by
about one float32 ulp (the slice of a batched product rounds otherwise there); what is promised is agreement to float32
rounding.

Padded stacking (`train_many(..., pad=True)`; the default on CUDA, where one network per step is launch-bound, about
1 ms per optimiser step at any width, so the device is only filled when the networks sharing a data set are one
stack). The group key then drops the width m and the number of training points n: jobs that agree on the input
dimension, outputs, test-set size, loss, optimiser, decay, batch size, weight decay, epochs, recording cadence and,
for Adam, the number of batches per epoch `ceil(n / batch)` (so every network of a stack takes its optimiser steps
at the same step counts and shares Adam's bias correction) form one group. `W` and `A` are zero-padded to the
widest width of the stack: a padded hidden unit has `W x~ = 0` and `A = 0`, so it adds exactly nothing to the
output and gets exactly zero gradient; Adam's moments stay 0 and its update is `0 / (sqrt(0) + eps) = 0` (weight
decay of a zero row is zero too), so the padded rows stay exactly zero (checked when a network leaves the stack).
Each network keeps its own scale `m_j^-1/2` and learning rate (`effective_lr` depends on the width) as (S, 1, 1)
tensors. The feature rows are padded to the largest n of the stack; each network draws its own per-epoch
permutation of its own n_j indices from its own generator, as `train` does, and its batches are cut from it at the
common batch size, so a network's last batch of an epoch may be shorter than another's: a per-(network, row)
weight, `1 / (its own batch size)` on its valid rows and 0 on the filler rows, makes each network's gradient the
mean over its own batch (full-batch GD: over its own n_j points). Losses, accuracies and the plateau stop read each
network's own n_j rows. What is promised: agreement with the loop to float32 rounding (the padded products reduce
over more, exactly zero, terms, which can change the kernels' summation order; not bit-equal), the same epochs run
and plateau flags, and accuracies equal up to a near-tie of two outputs (an exact tie, two equal columns of A,
which the loop breaks towards the first class, is broken either way by rounding). Measured on torch 2.13 CPU:
bit-equal to the loop for widths 16 to 320 (MNIST, every protocol, plateau stops included) and for leave-one-out
stacks; a padded width-8 network within 2e-7 of max |W| after 20 epochs. The head check compares each network's
first n_j outputs with its own `head` to float32 rounding (`PAD_HEAD_TOL` of the sum of the terms' magnitudes)
instead of bit for bit. Unpadded stacking (`pad=False`, the default on a CPU) is the exact grouping above.

Captured epochs (`train_many(..., capture=True)`, issue 39 item 2): each epoch of a stack runs as one
`_EpochProgram` over buffers that stay in place, captured once as a CUDA graph on CUDA and replayed every epoch (one
launch instead of some 25 per optimiser step); off CUDA the same program runs uncaptured, bit-equal to the step loop
(measured on torch 2.13 CPU, padded or not, Adam and GD, plateau stops). Off by default until a device check has
measured its speed and agreement on a GPU (`benchmarks.gpu_check`, engine variant "graphs").

Anything else runs through `train` unchanged: models that are not exactly `TwoLayerNet` (the trainable-attention
`qkv`), adversarial training, and any `TrainConfig` whose fields are not all on the explicit whitelist below (a field
added to `TrainConfig` later makes the engine fall back instead of silently ignoring it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from empirics.nets.losses import loss_fn, predict_labels
from empirics.nets.models import TwoLayerNet
from empirics.nets.train import (
    TrainConfig,
    TrainRecord,
    accuracy,
    effective_lr,
    gd_learning_rate,
    plateau_reached,
    train_job,
)
from empirics.progress import Progress

#: A training job: (model, x, y, cfg, x_test, y_test, label), what `empirics.nets.train.train_job` passes to `train`.
Job = tuple[nn.Module, torch.Tensor, torch.Tensor, TrainConfig, "torch.Tensor | None", "torch.Tensor | None", str]

#: The `TrainConfig` fields the engine implements, each with the values it implements exactly.
SUPPORTED_FIELDS: dict[str, Callable[[Any], bool]] = {
    "epochs": lambda v: True,
    "optimizer": lambda v: v in ("adam", "gd"),
    "lr": lambda v: True,
    "weight_decay": lambda v: True,
    "batch_size": lambda v: True,
    "seed": lambda v: True,
    "adv_train": lambda v: v is False,
    "adv_eps": lambda v: True,  # unused without adversarial training
    "adv_steps": lambda v: True,
    "record_every": lambda v: True,
    "loss": lambda v: v in ("auto", "mse"),
    "protocol": lambda v: True,
    "decay": lambda v: v in ("coupled", "decoupled"),
    "lr_ref_width": lambda v: True,
    "lr_max": lambda v: True,
    "lr_width_power": lambda v: True,
    "plateau": lambda v: True,
    "plateau_window": lambda v: True,
    "plateau_tol": lambda v: True,
    "check_every": lambda v: True,
    "lr_from_ntk": lambda v: True,
}
#: Adam's defaults, as `empirics.nets.train.train` uses them.
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
#: Most bytes one group keeps stacked (five copies of W: itself, gradient, two moments, a temporary; and the
#: features), by device. On a CPU a group larger than the caches streams Adam's state from memory at every step,
#: where one network at a time keeps it in cache (measured: 20 CIFAR-10 networks of width 512 stacked ran 0.44x
#: the loop), so CPU groups stay within a quarter of a 32 MiB L3; a GPU takes large groups.
MAX_GROUP_BYTES = {"cpu": 8 << 20, "cuda": 1 << 30}
#: On CUDA a group may take this fraction of the device memory free when it is planned, where that exceeds
#: `MAX_GROUP_BYTES["cuda"]` (an H200 holds the 100 networks of a CIFAR-10 sweep at m = 4,096, ~31 GB, in one stack).
CUDA_FREE_FRACTION = 0.4
#: Padded stacks pad a network to at most this multiple of its own width: a stack's arithmetic grows with its padded
#: width, while each separate stack costs one more launch-bound step (about 1 ms on an H200 whatever the width), so
#: the sweep's widths 16-4,096 form three stacks (4,096; 1,024 and 256; 64 and 16) rather than one at 4,096 (which
#: would do 3.2x the sweep's arithmetic) or five.
PAD_MAX_RATIO = 8
#: The padded head check: each network's outputs within this fraction of the largest sum of the magnitudes of the
#: terms of an output (`m^-1/2 sum_i |A_i| relu(W x~)_i`) of its own head; float32 sums of up to thousands of
#: terms in another order differ by ~sqrt(m) ulps of that sum, a head computing something else by O(1) of it.
PAD_HEAD_TOL = 1e-5


def fallback_reason(job: Sequence[Any]) -> str | None:
    """Why `job` cannot be trained by the engine exactly (None: it can)."""
    model, x, _, cfg = job[:4]
    if type(model) is not TwoLayerNet:
        return f"model {type(model).__name__} (features move during training)"
    if type(cfg) is not TrainConfig:
        return f"training config of type {type(cfg).__name__}"
    for f in fields(cfg):
        check = SUPPORTED_FIELDS.get(f.name)
        if check is None:
            return f"TrainConfig field '{f.name}' is not implemented by the engine"
        if not check(getattr(cfg, f.name)):
            return f"{f.name}={getattr(cfg, f.name)!r}"
    if [n for n, p in model.named_parameters() if p.requires_grad] != ["W"]:
        return "trainable parameters other than W"
    if x.shape[0] == 0:
        return "empty training set"
    return None


@dataclass
class _Net:
    """One network of a group: its job, features, learning rate, generator, history and record."""

    index: int
    model: TwoLayerNet
    x: torch.Tensor
    y: torch.Tensor
    cfg: TrainConfig
    x_test: torch.Tensor | None
    y_test: torch.Tensor | None
    feats: torch.Tensor
    test_feats: torch.Tensor | None
    lr: float
    w0: torch.Tensor
    gen: torch.Generator
    rec: TrainRecord
    hist_e: list[int]
    hist_l: list[float]

    @property
    def n(self) -> int:
        return self.feats.shape[0]

    @property
    def width(self) -> int:
        return self.model.W.shape[0]


def _job_lr(job: Sequence[Any]) -> float:
    """The learning rate `train` uses for `job` (as `train` computes it)."""
    model, x, _, cfg = job[:4]
    width = model.spec.width
    lr = effective_lr(cfg, width) if width else cfg.lr
    if cfg.lr_from_ntk:
        lr = cfg.lr * gd_learning_rate(model, x)
    return lr


def _prepare(index: int, job: Sequence[Any]) -> _Net:
    model, x, y, cfg, x_test, y_test = job[:6]
    lr = _job_lr(job)
    with torch.no_grad():
        feats = model.features(x)
        test_feats = model.features(x_test) if x_test is not None else None
    return _Net(index, model, x, y, cfg, x_test, y_test, feats, test_feats, lr, model.W.detach().clone(),
                torch.Generator().manual_seed(cfg.seed), TrainRecord(protocol=cfg.protocol, lr=lr), [0], [])


def _every(cfg: TrainConfig) -> int:
    return cfg.record_every or max(cfg.check_every, cfg.epochs // 10)


def _padded(job: Sequence[Any], pad: bool | None) -> bool:
    """Whether `job` is stacked padded: `pad`, or (None) on CUDA only."""
    return pad if pad is not None else job[0].W.device.type == "cuda"


def _group_key(job: Sequence[Any], lr: float | None, padded: bool) -> tuple[Any, ...]:
    """Jobs with equal keys train as one stack. Unpadded: every shape and optimiser scalar (Adam's learning rate
    `lr` included); padded: not the width, nor n (for Adam only its number of batches per epoch), nor the rate."""
    model, x, y, cfg, x_test, y_test = job[:6]
    w, a = model.W, model.A
    adam = cfg.optimizer == "adam"
    n_test = None if x_test is None else x_test.shape[0]
    shared = (w.dtype, str(w.device), y.dtype, n_test, y_test is not None, cfg.loss, cfg.optimizer,
              cfg.decay if adam else None, cfg.batch_size if adam else None, cfg.weight_decay, cfg.epochs,
              cfg.check_every, _every(cfg))
    if padded:
        return (True, w.shape[1], a.shape[1], -(-x.shape[0] // cfg.batch_size) if adam else 1, *shared)
    # x.shape[0] and W's second dimension are the features' shape, n_test and it the test features'
    return (False, tuple(w.shape), tuple(a.shape), x.shape[0], *shared, lr if adam else None)


def _loss_grad(per_ex: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], out: torch.Tensor,
               y: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """d(mean per-example loss of each network)/d(out) for (S, b, c) outputs, by autograd through the very loss
    `train` uses (row by row the same kernels, so the same numbers as each network's own backward pass).

    `weights` (S, b): each row's weight, `1 / (its network's batch size)` or 0 on filler rows (padded stacks); the
    gradient of a row is then exactly what the mean over its network's own batch gives it."""
    with torch.enable_grad():
        leaf = out.detach().requires_grad_(True)
        s, b = out.shape[:2]
        per = per_ex(leaf.flatten(0, 1), y.flatten()).view(s, b)
        (per.mean(dim=1) if weights is None else per * weights).sum().backward()
    return leaf.grad


def _pad_stack(tensors: list[torch.Tensor], rows: int) -> torch.Tensor:
    """`tensors` stacked, each zero-padded along its first dimension to `rows`."""
    out = tensors[0].new_zeros((len(tensors), rows, *tensors[0].shape[1:]))
    for j, t in enumerate(tensors):
        out[j, :t.shape[0]] = t
    return out


class _Stack:
    """The active networks of a group as stacked tensors; `drop` removes finished ones.

    Padded (`padded`): `W`, `A` zero-padded to the widest network, the features and labels to the largest n; per
    network its scale `sqrt(m_j)` (S, 1, 1), learning rate (S,) in float64, AdamW decay factor (S, 1, 1) and row
    weights `rw` (S, n): `1 / (size of the batch of its epoch's permutation this position falls in)` on its n_j
    rows, 0 on the filler rows."""

    #: The per-network tensors `drop` selects from.
    PER_NET = ("F", "Y", "Ft", "Yt", "W", "A", "m1", "m2", "scale", "lr", "decay", "rw")

    def __init__(self, nets: list[_Net], padded: bool = False):
        self.nets = nets
        self.padded = padded
        self.Ft = torch.stack([n.test_feats for n in nets]) if nets[0].test_feats is not None else None
        self.Yt = torch.stack([n.y_test for n in nets]) if nets[0].y_test is not None else None
        self.lr = self.decay = self.rw = None
        if not padded:
            self.F = torch.stack([n.feats for n in nets])
            self.Y = torch.stack([n.y for n in nets])
            self.W = torch.stack([n.model.W.detach() for n in nets]).clone()
            self.A = torch.stack([n.model.A for n in nets])
            self.scale: float | torch.Tensor = nets[0].model.spec.width ** 0.5
        else:
            w = nets[0].model.W
            n_max, m_max = max(net.n for net in nets), max(net.width for net in nets)
            self.F = _pad_stack([net.feats for net in nets], n_max)
            self.Y = _pad_stack([net.y for net in nets], n_max)
            self.W = _pad_stack([net.model.W.detach() for net in nets], m_max)
            self.A = _pad_stack([net.model.A for net in nets], m_max)
            self.scale = torch.tensor([net.model.spec.width ** 0.5 for net in nets], dtype=w.dtype,
                                      device=w.device).view(-1, 1, 1)
            self.lr = torch.tensor([net.lr for net in nets], dtype=torch.float64, device=w.device)
            cfg = nets[0].cfg
            self.decay = torch.tensor([1 - net.lr * cfg.weight_decay for net in nets], dtype=w.dtype,
                                      device=w.device).view(-1, 1, 1)
            batch = cfg.batch_size if cfg.optimizer == "adam" else None
            self.rw = torch.stack([_row_weights(net.n, batch or net.n, n_max, w.dtype) for net in nets]).to(w.device)
        self.m1 = torch.zeros_like(self.W)
        self.m2 = torch.zeros_like(self.W)

    def head(self, feats: torch.Tensor) -> torch.Tensor:
        return torch.bmm(torch.relu(torch.bmm(feats, self.W.mT)), self.A) / self.scale

    def padded_rows_are_zero(self, j: int) -> bool:
        """Network j's padded hidden units (rows of W and of Adam's moments beyond its width) are exactly zero."""
        m = self.nets[j].width
        return not any(bool(t[j, m:].any()) for t in (self.W, self.m1, self.m2))

    def drop(self, done: list[int]) -> None:
        for j in done:
            if self.padded and not self.padded_rows_are_zero(j):
                raise RuntimeError(f"padded stack: the padded rows of network {self.nets[j].index} moved")
            with torch.no_grad():
                self.nets[j].model.W.copy_(self.W[j, :self.nets[j].width])
        keep = [j for j in range(len(self.nets)) if j not in set(done)]
        sel = torch.tensor(keep, dtype=torch.long, device=self.W.device)
        self.nets = [self.nets[j] for j in keep]
        for name in self.PER_NET:
            t = getattr(self, name)
            if isinstance(t, torch.Tensor):
                setattr(self, name, t.index_select(0, sel))


def _row_weights(n: int, batch: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """(rows,): at position p < n of an epoch's permutation, 1 / (size of the batch p falls in), divided in `dtype`
    as the backward pass of the mean divides; 0 at the filler positions p >= n."""
    pos = torch.arange(rows)
    size = (n - pos // batch * batch).clamp(min=1, max=batch).to(dtype)
    return torch.ones(rows, dtype=dtype).div(size).where(pos < n, 0.0)


def _reproduces_heads(st: _Stack, out: torch.Tensor) -> bool:
    """Whether the stacked head's outputs `out` (on the stacked features) are each network's own `head`: bit for
    bit unpadded; padded, on its own n_j rows within `PAD_HEAD_TOL` of the sum of its terms' magnitudes."""
    if not st.padded:
        return all(torch.equal(out[j], net.model.head(net.feats)) for j, net in enumerate(st.nets))
    terms = torch.bmm(torch.relu(torch.bmm(st.F, st.W.mT)), st.A.abs()) / st.scale
    for j, net in enumerate(st.nets):
        own, bound = net.model.head(net.feats), terms[j, :net.n]
        if own.shape != bound.shape or not bool(((out[j, :net.n] - own).abs() <= PAD_HEAD_TOL * bound.max()).all()):
            return False
    return True


def _train_group(nets: list[_Net], label: str, fused_adam: bool = False, padded: bool = False,
                 on_epoch: Callable[[int], None] | None = None, capture: bool = False) -> bool:
    """Train the networks of one group together (see the module docstring); records are filled in place;
    `on_epoch(epoch)` is called after each epoch (a benchmark's clock); `capture`: each epoch's steps run as one
    `_EpochProgram` (a CUDA graph on CUDA), rebuilt when networks leave the stack.

    False (nothing trained) when the stacked head does not reproduce each model's own `head` (exactly; padded, to
    float32 rounding): the model computes something the engine does not implement."""
    cfg0 = nets[0].cfg
    out_dim = nets[0].model.A.shape[1]
    per_ex = loss_fn(out_dim, cfg0.loss)
    st = _Stack(nets, padded)
    n = st.F.shape[1]  # padded: the largest n of the stack
    batch = cfg0.batch_size if cfg0.optimizer == "adam" else n
    every, step = _every(cfg0), 0
    program: _EpochProgram | None = None
    with torch.no_grad():
        out = st.head(st.F)
        if not _reproduces_heads(st, out):
            return False
        for j, net in enumerate(nets):
            net.hist_l.append(float(per_ex(out[j, :net.n], st.Y[j, :net.n]).mean()))
    with Progress(cfg0.epochs, label) as bar, torch.no_grad():
        for epoch in range(1, cfg0.epochs + 1):
            if padded:  # each network's permutation of its own n_j points, then filler positions (row 0, weight 0)
                perms = torch.zeros(len(st.nets), n, dtype=torch.long)
                for j, net in enumerate(st.nets):
                    perms[j, :net.n] = torch.randperm(net.n, generator=net.gen)
                perms = perms.to(st.W.device)
            else:
                perms = torch.stack([torch.randperm(n, generator=net.gen) for net in st.nets]).to(st.W.device)
            if capture:
                program = program or _EpochProgram(st, per_ex, batch)
                program.run(perms, step + 1)
                step += len(program.starts)
            else:
                k = len(st.nets)
                flat_f = st.F.view(k * n, -1)
                offsets = torch.arange(k, device=st.W.device)[:, None] * n
                for i in range(0, n, batch):
                    grad = _batch_gradient(st, per_ex, flat_f, perms[:, i:i + batch], offsets, i)
                    step += 1
                    (_update_fused if fused_adam and cfg0.optimizer == "adam" else _update)(st, grad, step)
            last = epoch == cfg0.epochs
            for net in st.nets:
                net.rec.epochs_run = epoch
            if not (epoch % cfg0.check_every == 0 or epoch % every == 0 or last):
                bar.update(1)
                if on_epoch is not None:
                    on_epoch(epoch)
                continue
            out = st.head(st.F)
            k = len(st.nets)
            losses = [float(per_ex(out[j, :net.n], st.Y[j, :net.n]).mean()) for j, net in enumerate(st.nets)]
            test_out = st.head(st.Ft) if st.Ft is not None and st.Yt is not None else None
            done = []
            for j, net in enumerate(st.nets):
                net.hist_e.append(epoch)
                net.hist_l.append(losses[j])
                rec, c = net.rec, net.cfg
                rec.plateau_reached = plateau_reached(net.hist_l, net.hist_e, c.plateau_window, c.plateau_tol)
                stop = c.plateau and rec.plateau_reached
                if epoch % every == 0 or last or stop:
                    rec.epochs.append(epoch)
                    rec.train_loss.append(losses[j])
                    rec.train_acc.append(float((predict_labels(out[j, :net.n]) == st.Y[j, :net.n]).float().mean()))
                    if test_out is not None:
                        rec.test_acc.append(float((predict_labels(test_out[j]) == st.Yt[j]).float().mean()))
                if stop:
                    done.append(j)
            bar.update(1, f"loss={max(losses):.4f} active={k}")
            if on_epoch is not None:
                on_epoch(epoch)
            if done:  # the networks left have all taken `step` steps, so they share Adam's bias correction
                st.drop(done)
                program = None  # its buffers were the stack's before the drop
            if not st.nets:
                break
        st.drop(list(range(len(st.nets))))
    return True


def _batch_gradient(st: _Stack, per_ex: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], flat_f: torch.Tensor,
                    idx: torch.Tensor, offsets: torch.Tensor, start: int) -> torch.Tensor:
    """The (S, m, d) gradient of each network's mean loss over its batch `idx` (S, b) (positions `start` onward of
    its epoch's permutation): the stacked head and, written out, the backward pass of `TwoLayerNet.head` as autograd
    computes it for each network."""
    k = idx.shape[0]
    xb = flat_f.index_select(0, (idx + offsets).flatten()).view(k, idx.shape[1], -1)
    yb = st.Y.gather(1, idx)
    h = torch.bmm(xb, st.W.mT)
    out = torch.bmm(torch.relu(h), st.A) / st.scale
    weights = None if st.rw is None else st.rw[:, start:start + idx.shape[1]]
    g_h = torch.bmm(_loss_grad(per_ex, out, yb, weights) / st.scale, st.A.mT).where(h > 0, 0.0)
    return torch.bmm(g_h.mT, xb)


class _EpochProgram:
    """One epoch of a stack's optimiser steps as one program over fixed buffers (issue 39 item 2).

    Eagerly, a step dispatches some 25 small kernels, so on a GPU an epoch of a stack costs about 1.5 ms per step
    whatever its arithmetic (launch-bound). The program reads only buffers that stay in place (the stack's tensors,
    the epoch's permutations, the Adam bias corrections of its steps, the learning rates) so that on CUDA it is
    captured once as a CUDA graph (`torch.cuda.CUDAGraph`) and each epoch is one replay after its permutations and
    bias corrections are copied in. Elsewhere the same program runs eagerly (what the CPU tests compare with the
    loop). The Adam step is `_update_padded`'s, with its step-dependent scalars read from the buffers: the bias
    correction `1 - beta1^t` in float64 (as `_update_padded` makes it), `sqrt(1 - beta2^t)` rounded to W's dtype.
    Capture first runs the program once on a side stream (warm-up, as torch asks) with the stack's weights and
    moments saved and put back after, then records it; networks leaving the stack end the program (rebuilt on the
    new stack). Fused Adam is not captured (its step counter lives in its own kernel's arguments)."""

    def __init__(self, st: _Stack, per_ex: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch: int):
        dev, k, n = st.W.device, len(st.nets), st.F.shape[1]
        self.st, self.per_ex, self.batch = st, per_ex, batch
        self.starts = list(range(0, n, batch))
        self.perm = torch.zeros(k, n, dtype=torch.long, device=dev)
        self.bias1 = torch.ones(len(self.starts), dtype=torch.float64, device=dev)
        self.bias2 = torch.ones(len(self.starts), dtype=st.W.dtype, device=dev)
        self.lr = st.lr if st.lr is not None else torch.tensor([net.lr for net in st.nets], dtype=torch.float64,
                                                                 device=dev)
        self.offsets = torch.arange(k, device=dev)[:, None] * n
        self.adam = st.nets[0].cfg.optimizer == "adam"
        self.graph: Any = None
        self.captured = dev.type == "cuda"

    def _body(self) -> None:
        st = self.st
        flat_f = st.F.view(self.perm.shape[0] * self.perm.shape[1], -1)
        for j, i in enumerate(self.starts):
            grad = _batch_gradient(st, self.per_ex, flat_f, self.perm[:, i:i + self.batch], self.offsets, i)
            if self.adam:
                _adam_step(st, grad, self.lr, self.bias1[j], self.bias2[j])
            else:
                _update(st, grad, 0)  # full-batch GD: no step-dependent scalar

    def _capture(self) -> None:
        import torch.cuda

        st = self.st
        saved = [t.clone() for t in (st.W, st.m1, st.m2)]
        side = torch.cuda.Stream(device=st.W.device)
        side.wait_stream(torch.cuda.current_stream(st.W.device))
        with torch.cuda.stream(side):
            self._body()
        torch.cuda.current_stream(st.W.device).wait_stream(side)
        for t, kept in zip((st.W, st.m1, st.m2), saved, strict=True):
            t.copy_(kept)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph

    def run(self, perms: torch.Tensor, first_step: int) -> None:
        """One epoch: the networks' permutations `perms` (S, n) and the steps `first_step` onward."""
        self.perm.copy_(perms)
        steps = range(first_step, first_step + len(self.starts))
        dev = self.bias1.device
        self.bias1.copy_(torch.tensor([1 - BETA1**t for t in steps], dtype=torch.float64, device=dev))
        self.bias2.copy_(torch.tensor([(1 - BETA2**t) ** 0.5 for t in steps], dtype=torch.float64, device=dev))
        if not self.captured:
            self._body()
            return
        if self.graph is None:
            self._capture()
        self.graph.replay()


def _adam_step(st: _Stack, grad: torch.Tensor, lr: torch.Tensor, bias1: torch.Tensor,
               bias2: torch.Tensor | float) -> None:
    """The Adam / AdamW step of `_update_padded` and `_EpochProgram`, with the learning rates `lr` (S,) and the bias
    corrections `bias1` = 1 - beta1^t (a float64 tensor) and `bias2` = sqrt(1 - beta2^t) (`_update_padded`: a Python
    number; the program: a tensor in W's dtype, so that nothing in the step changes from step to step and a captured
    program replays it)."""
    cfg = st.nets[0].cfg
    if cfg.weight_decay != 0:
        if cfg.decay == "decoupled":
            st.W.mul_(st.decay if st.decay is not None else 1 - st.nets[0].lr * cfg.weight_decay)
        else:
            grad = grad.add(st.W, alpha=cfg.weight_decay)
    st.m1.lerp_(grad, 1 - BETA1)
    st.m2.mul_(BETA2).addcmul_(grad, grad, value=1 - BETA2)
    step_size = (lr / bias1).neg_().to(st.W.dtype).view(-1, 1, 1)
    denom = (st.m2.sqrt() / bias2).add_(EPS)
    st.W.addcdiv_(st.m1 * step_size, denom)


def _update(st: _Stack, grad: torch.Tensor, step: int) -> None:
    """One optimiser step on the stack, with the operations of torch's single-tensor Adam / AdamW / SGD."""
    cfg = st.nets[0].cfg
    wd = cfg.weight_decay
    if cfg.optimizer == "gd":
        if wd != 0:
            grad = grad.add(st.W, alpha=wd)
        for j, net in enumerate(st.nets):
            st.W[j].add_(grad[j], alpha=-net.lr)
        return
    if st.padded:
        _update_padded(st, grad, step)
        return
    lr = st.nets[0].lr
    if wd != 0:
        if cfg.decay == "decoupled":
            st.W.mul_(1 - lr * wd)
        else:
            grad = grad.add(st.W, alpha=wd)
    st.m1.lerp_(grad, 1 - BETA1)
    st.m2.mul_(BETA2).addcmul_(grad, grad, value=1 - BETA2)
    step_size = lr / (1 - BETA1**step)
    denom = (st.m2.sqrt() / (1 - BETA2**step) ** 0.5).add_(EPS)
    st.W.addcdiv_(st.m1, denom, value=-step_size)


def _update_padded(st: _Stack, grad: torch.Tensor, step: int) -> None:
    """`_update`'s Adam / AdamW step with a learning rate per network: its decay factor `1 - lr_j wd` and step size
    `lr_j / (1 - beta1^step)` (divided in float64 as torch divides, then rounded to W's dtype, as torch rounds the
    scalar) as (S, 1, 1) tensors; `addcdiv_(m1 * s, denom)` is `addcdiv_(m1, denom, value=s)` (value * m1 first).
    The bias corrections are shared: every network of the stack has taken `step` steps."""
    bias1 = torch.full((), 1 - BETA1**step, dtype=torch.float64, device=st.W.device)  # a device tensor: exact /
    _adam_step(st, grad, st.lr, bias1, (1 - BETA2**step) ** 0.5)


def _update_fused(st: _Stack, grad: torch.Tensor, step: int) -> None:
    """One Adam / AdamW step on the whole stack in torch's fused kernel (`torch.optim.Adam(fused=True)`'s): one pass
    over W, the gradient and the two moments instead of about eight. Not bit-equal to the single-tensor
    operations of `_update` (it rounds its intermediate terms differently, ~1 float32 ulp per step), so it is an
    option measured by `benchmarks.engine`, not what the claims train with. Padded, the kernel runs once per
    distinct learning rate of the stack, on the slices of the networks that have it (a slice's padded rows get a
    zero gradient, so they stay zero)."""
    cfg = st.nets[0].cfg
    adam = torch._fused_adamw_ if cfg.decay == "decoupled" else torch._fused_adam_
    steps = torch.tensor(float(step), device=st.W.device)
    if not st.padded:
        adam([st.W], [grad], [st.m1], [st.m2], [], [steps], lr=st.nets[0].lr, beta1=BETA1,
             beta2=BETA2, weight_decay=cfg.weight_decay, eps=EPS, amsgrad=False, maximize=False)
        return
    by_lr: dict[float, list[int]] = {}
    for j, net in enumerate(st.nets):
        by_lr.setdefault(net.lr, []).append(j)
    for lr, js in by_lr.items():
        adam([st.W[j] for j in js], [grad[j] for j in js], [st.m1[j] for j in js], [st.m2[j] for j in js], [],
             [steps] * len(js), lr=lr, beta1=BETA1, beta2=BETA2, weight_decay=cfg.weight_decay, eps=EPS,
             amsgrad=False, maximize=False)


def _finish(net: _Net, wall_s: float) -> TrainRecord:
    """The final records, computed on the model with the code of `empirics.nets.train.train`."""
    model, x, y, rec = net.model, net.x, net.y, net.rec
    per_ex = loss_fn(model.A.shape[1], net.cfg.loss)
    with torch.no_grad():
        out = model(x)
        rec.final_train_loss = float(per_ex(out, y).mean())
        rec.final_train_acc = float((predict_labels(out) == y).float().mean())
        if net.x_test is not None and net.y_test is not None:
            rec.final_test_acc = accuracy(model, net.x_test, net.y_test)
        p, q = model.W, net.w0
        num, den = float(((p - q) ** 2).sum()), float((q**2).sum())
        rec.rel_weight_change = (num / den) ** 0.5 if den > 0 else float("nan")
    rec.wall_s = wall_s
    return rec


def _group_cap(device: torch.device) -> int:
    """The most bytes one group may stack on `device`: `MAX_GROUP_BYTES`, and on CUDA up to `CUDA_FREE_FRACTION` of
    the memory free now."""
    cap = MAX_GROUP_BYTES.get(device.type, MAX_GROUP_BYTES["cpu"])
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cap = max(cap, int(CUDA_FREE_FRACTION * free))
    return cap


def _chunks(jobs: Sequence[Sequence[Any]], group: list[int], padded: bool) -> list[list[int]]:
    """Split a group (job indices) so that what it stacks stays under its device's `MAX_GROUP_BYTES` (at least one
    network): five copies of W and the features per network, at the stack's padded width and n. Padded, the
    group is first sorted by width and n (widest first), so that a chunk pads to about its own networks' sizes, and
    a network narrower than 1 / `PAD_MAX_RATIO` of its chunk's width starts a new chunk."""
    if padded:
        group = sorted(group, key=lambda i: (-jobs[i][0].W.shape[0], -jobs[i][1].shape[0], i))
    w = jobs[group[0]][0].W
    cap = _group_cap(w.device)
    d, size = w.shape[1], w.element_size()
    chunks: list[list[int]] = []
    chunk: list[int] = []
    m_max = n_max = 0
    for i in group:
        m, n = max(m_max, jobs[i][0].W.shape[0]), max(n_max, jobs[i][1].shape[0])
        too_wide = padded and chunk and m > PAD_MAX_RATIO * jobs[i][0].W.shape[0]
        if chunk and (too_wide or (len(chunk) + 1) * (5 * m * d + n * d) * size > cap):
            chunks.append(chunk)
            chunk, m, n = [], jobs[i][0].W.shape[0], jobs[i][1].shape[0]
        chunk.append(i)
        m_max, n_max = m, n
    return [*chunks, chunk]


def fallbacks(jobs: Sequence[Sequence[Any]]) -> list[tuple[int, str]]:
    """The jobs the engine leaves to `train` (index, why)."""
    return [(i, r) for i, job in enumerate(jobs) if (r := fallback_reason(job)) is not None]


def _plan(jobs: Sequence[Sequence[Any]], pad: bool | None,
          lr_of: Callable[[int], float]) -> list[tuple[list[int], bool]]:
    """The stacks the supported jobs form, in order of their first job: (job indices, padded). `lr_of(i)`: job
    i's learning rate (asked only for an unpadded Adam job, whose group it keys)."""
    fallback = {i for i, _ in fallbacks(jobs)}
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        if i in fallback:
            continue
        padded = _padded(job, pad)
        lr = lr_of(i) if not padded and job[3].optimizer == "adam" else None
        groups.setdefault(_group_key(job, lr, padded), []).append(i)
    return [(chunk, key[0]) for key, group in groups.items() for chunk in _chunks(jobs, group, key[0])]


def stack_plan(jobs: Sequence[Sequence[Any]], pad: bool | None = None) -> list[list[int]]:
    """The job indices of each stack `train_many(jobs, pad=pad)` trains (after chunking by `MAX_GROUP_BYTES`), in
    the order it trains them; jobs that fall back to `train` are in none. Trains nothing and changes nothing (an
    unpadded Adam job with `lr_from_ntk` computes its rate, which keys its group)."""
    return [chunk for chunk, _ in _plan(jobs, pad, lambda i: _job_lr(jobs[i]))]


def train_many(jobs: Sequence[Sequence[Any]], label: str = "engine", fused_adam: bool = False,
               pad: bool | None = None, on_epoch: Callable[[int], None] | None = None,
               capture: bool = False) -> list[TrainRecord]:
    """Train every job (`Job`, label optional; `empirics.nets.train.train_job`) in place; the records in order.

    Supported jobs are grouped and trained stacked; the rest go through `train` one by one. A record's `wall_s` is
    its group's training time divided by the group's size (the networks were trained together). `fused_adam`
    steps Adam in torch's fused kernel (`_update_fused`: faster, equal to float32 rounding, not bit-equal).
    `pad`: stack networks of different widths and n zero-padded (module docstring; equal to the loop to float32
    rounding); None pads on CUDA only, so a CPU run is the exact grouping (bit-equal to the loop, measured).
    `on_epoch(epoch)`: called after every epoch of every stack (not for the jobs that fall back), e.g. to time
    the stacked epochs apart from building and finishing the stacks. `capture`: each epoch of a stack runs as one
    `_EpochProgram`, captured as a CUDA graph on CUDA (one launch per epoch instead of ~25 per step; equal to the
    loop to float32 rounding, measured on the CPU, where the program runs uncaptured); not with `fused_adam`. Off by
    default until a device check has measured what it buys (`benchmarks.gpu_check`'s engine variant "graphs").
    """
    if capture and fused_adam:
        raise ValueError("capture and fused_adam cannot be combined: the fused kernel's step counter is not captured")
    records: list[TrainRecord | None] = [None] * len(jobs)
    fallback = {i for i, _ in fallbacks(jobs)}
    for i in sorted(fallback):
        records[i] = train_job(jobs[i])
    nets = {i: _prepare(i, job) for i, job in enumerate(jobs) if i not in fallback}
    for group, padded in _plan(jobs, pad, lambda i: nets[i].lr):
        chunk = [nets[i] for i in group]
        t0 = time.perf_counter()
        widths = sorted({net.width for net in chunk})
        m = f"{widths[0]}" if len(widths) == 1 else f"{widths[0]}..{widths[-1]}"
        if not _train_group(chunk, f"{label} {len(chunk)} x m={m}", fused_adam, padded, on_epoch, capture):
            for net in chunk:
                records[net.index] = train_job(jobs[net.index])
            continue
        wall = (time.perf_counter() - t0) / len(chunk)
        for net in chunk:
            records[net.index] = _finish(net, wall)
    return [r for r in records if r is not None]


def flops_per_step(batch: int, width: int, d: int, out_dim: int) -> float:
    """Floating-point operations of one training step of one network (forward and backward products)."""
    return 2.0 * batch * width * (2 * d + 2 * out_dim)


def gemm_flops(epochs: int, n: int, batch: int, width: int, d: int, out_dim: int) -> float:
    """The matrix-product work of `epochs` epochs of one network (loss checks not counted)."""
    full, rest = divmod(n, batch)
    per_epoch = full * flops_per_step(batch, width, d, out_dim) + (flops_per_step(rest, width, d, out_dim)
                                                                    if rest else 0.0)
    return epochs * per_epoch

