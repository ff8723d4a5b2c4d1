"""Train many networks at once: `train_many(jobs)` returns what `[train(*job) for job in jobs]` returns.

The suite's networks are small two-layer heads `m^-1/2 A^T relu(W x~)` with only `W` trained and the features `x~`
fixed (`empirics.models.TwoLayerNet`), so training one costs a few small matrix products per step, and per-call
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
`empirics.train.train`. Before training, the stacked head is checked to reproduce each model's own `head` exactly (a
model whose head computes something else falls back).
The gradient of the loss comes from autograd through the very loss `train` uses; the products are the ones
autograd takes for `head`, batched. Measured on torch 2.13 CPU, the results equal the loop's bit for bit (a batched
product's slice equals `mm`); what is promised is agreement to float32 rounding.

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

from empirics.losses import loss_fn, predict_labels
from empirics.models import TwoLayerNet
from empirics.progress import Progress
from empirics.train import TrainConfig, TrainRecord, accuracy, effective_lr, gd_learning_rate, plateau_reached, train

#: A training job: the arguments of `empirics.train.train` (model, x, y, cfg, x_test, y_test, label).
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
#: Adam's defaults, as `empirics.train.train` uses them.
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
#: Most bytes one group keeps stacked (five copies of W: itself, gradient, two moments, a temporary; and the
#: features), by device. On a CPU a group larger than the caches streams Adam's state from memory at every step,
#: where one network at a time keeps it in cache (measured: 20 CIFAR-10 networks of width 512 stacked ran 0.44x
#: the loop), so CPU groups stay within a quarter of a 32 MiB L3; a GPU takes large groups.
MAX_GROUP_BYTES = {"cpu": 8 << 20, "cuda": 1 << 30}


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


def _prepare(index: int, job: Sequence[Any]) -> _Net:
    model, x, y, cfg, x_test, y_test = job[:6]
    width = model.spec.width
    lr = effective_lr(cfg, width) if width else cfg.lr
    if cfg.lr_from_ntk:
        lr = cfg.lr * gd_learning_rate(model, x)
    with torch.no_grad():
        feats = model.features(x)
        test_feats = model.features(x_test) if x_test is not None else None
    return _Net(index, model, x, y, cfg, x_test, y_test, feats, test_feats, lr, model.W.detach().clone(),
                torch.Generator().manual_seed(cfg.seed), TrainRecord(protocol=cfg.protocol, lr=lr), [0], [])


def _every(cfg: TrainConfig) -> int:
    return cfg.record_every or max(cfg.check_every, cfg.epochs // 10)


def _group_key(net: _Net) -> tuple[Any, ...]:
    cfg, w = net.cfg, net.model.W
    adam = cfg.optimizer == "adam"
    return (w.shape, net.model.A.shape, w.dtype, str(w.device), tuple(net.feats.shape), net.y.dtype,
            None if net.test_feats is None else tuple(net.test_feats.shape), net.y_test is not None, cfg.loss,
            cfg.optimizer, cfg.decay if adam else None, cfg.batch_size if adam else None, net.lr if adam else None,
            cfg.weight_decay, cfg.epochs, cfg.check_every, _every(cfg))


def _loss_grad(per_ex: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], out: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """d(mean per-example loss of each network)/d(out) for (S, b, c) outputs, by autograd through the very loss
    `train` uses (row by row the same kernels, so the same numbers as each network's own backward pass)."""
    with torch.enable_grad():
        leaf = out.detach().requires_grad_(True)
        s, b = out.shape[:2]
        per_ex(leaf.flatten(0, 1), y.flatten()).view(s, b).mean(dim=1).sum().backward()
    return leaf.grad


class _Stack:
    """The active networks of a group as stacked tensors; `drop` removes finished ones."""

    def __init__(self, nets: list[_Net]):
        self.nets = nets
        self.F = torch.stack([n.feats for n in nets])
        self.Y = torch.stack([n.y for n in nets])
        self.Ft = torch.stack([n.test_feats for n in nets]) if nets[0].test_feats is not None else None
        self.Yt = torch.stack([n.y_test for n in nets]) if nets[0].y_test is not None else None
        self.W = torch.stack([n.model.W.detach() for n in nets]).clone()
        self.A = torch.stack([n.model.A for n in nets])
        self.m1 = torch.zeros_like(self.W)
        self.m2 = torch.zeros_like(self.W)
        self.scale = nets[0].model.spec.width ** 0.5

    def head(self, feats: torch.Tensor) -> torch.Tensor:
        return torch.bmm(torch.relu(torch.bmm(feats, self.W.mT)), self.A) / self.scale

    def drop(self, done: list[int]) -> None:
        for j in done:
            with torch.no_grad():
                self.nets[j].model.W.copy_(self.W[j])
        keep = [j for j in range(len(self.nets)) if j not in set(done)]
        sel = torch.tensor(keep, dtype=torch.long, device=self.W.device)
        self.nets = [self.nets[j] for j in keep]
        for name in ("F", "Y", "Ft", "Yt", "W", "A", "m1", "m2"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, sel))


def _train_group(nets: list[_Net], label: str, fused_adam: bool = False) -> bool:
    """Train the networks of one group together (see the module docstring); records are filled in place.

    False (nothing trained) when the stacked head does not reproduce each model's own `head` exactly: the model
    computes something the engine does not implement."""
    cfg0 = nets[0].cfg
    out_dim = nets[0].model.A.shape[1]
    per_ex = loss_fn(out_dim, cfg0.loss)
    st = _Stack(nets)
    n = st.F.shape[1]
    batch = cfg0.batch_size if cfg0.optimizer == "adam" else n
    every, step = _every(cfg0), 0
    with torch.no_grad():
        out = st.head(st.F)
        if not all(torch.equal(out[j], net.model.head(net.feats)) for j, net in enumerate(nets)):
            return False
        for j, net in enumerate(nets):
            net.hist_l.append(float(per_ex(out[j], st.Y[j]).mean()))
    with Progress(cfg0.epochs, label) as bar, torch.no_grad():
        for epoch in range(1, cfg0.epochs + 1):
            perms = torch.stack([torch.randperm(n, generator=net.gen) for net in st.nets]).to(st.W.device)
            k = len(st.nets)
            flat_f = st.F.view(k * n, -1)
            offsets = torch.arange(k, device=st.W.device)[:, None] * n
            for i in range(0, n, batch):
                idx = perms[:, i:i + batch]
                xb = flat_f.index_select(0, (idx + offsets).flatten()).view(k, idx.shape[1], -1)
                yb = st.Y.gather(1, idx)
                h = torch.bmm(xb, st.W.mT)
                out = torch.bmm(torch.relu(h), st.A) / st.scale
                # the backward pass of `TwoLayerNet.head` as autograd computes it for each network
                g_h = torch.bmm(_loss_grad(per_ex, out, yb) / st.scale, st.A.mT).where(h > 0, 0.0)
                grad = torch.bmm(g_h.mT, xb)
                step += 1
                (_update_fused if fused_adam and cfg0.optimizer == "adam" else _update)(st, grad, step)
            last = epoch == cfg0.epochs
            for net in st.nets:
                net.rec.epochs_run = epoch
            if not (epoch % cfg0.check_every == 0 or epoch % every == 0 or last):
                bar.update(1)
                continue
            out = st.head(st.F)
            k = len(st.nets)
            losses = [float(per_ex(out[j], st.Y[j]).mean()) for j in range(k)]
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
                    rec.train_acc.append(float((predict_labels(out[j]) == st.Y[j]).float().mean()))
                    if test_out is not None:
                        rec.test_acc.append(float((predict_labels(test_out[j]) == st.Yt[j]).float().mean()))
                if stop:
                    done.append(j)
            bar.update(1, f"loss={max(losses):.4f} active={k}")
            if done:  # the networks left have all taken `step` steps, so they share Adam's bias correction
                st.drop(done)
            if not st.nets:
                break
        st.drop(list(range(len(st.nets))))
    return True


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


def _update_fused(st: _Stack, grad: torch.Tensor, step: int) -> None:
    """One Adam / AdamW step on the whole stack in torch's fused kernel (`torch.optim.Adam(fused=True)`'s): one pass
    over W, the gradient and the two moments instead of about eight. Not bit-equal to the single-tensor
    operations of `_update` (it rounds its intermediate terms differently, ~1 float32 ulp per step), so it is an
    option measured by `benchmarks.engine`, not what the claims train with."""
    cfg = st.nets[0].cfg
    adam = torch._fused_adamw_ if cfg.decay == "decoupled" else torch._fused_adam_
    adam([st.W], [grad], [st.m1], [st.m2], [], [torch.tensor(float(step))], lr=st.nets[0].lr, beta1=BETA1,
         beta2=BETA2, weight_decay=cfg.weight_decay, eps=EPS, amsgrad=False, maximize=False)


def _finish(net: _Net, wall_s: float) -> TrainRecord:
    """The final records, computed on the model with the code of `empirics.train.train`."""
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


def _chunks(nets: list[_Net]) -> list[list[_Net]]:
    """Split a group so that what it stacks stays under its device's `MAX_GROUP_BYTES` (at least one network)."""
    w = nets[0].model.W
    per = 5 * w.numel() * w.element_size() + nets[0].feats.numel() * nets[0].feats.element_size()
    size = max(1, MAX_GROUP_BYTES.get(w.device.type, MAX_GROUP_BYTES["cpu"]) // per)
    return [nets[i:i + size] for i in range(0, len(nets), size)]


def fallbacks(jobs: Sequence[Sequence[Any]]) -> list[tuple[int, str]]:
    """The jobs the engine leaves to `train` (index, why)."""
    return [(i, r) for i, job in enumerate(jobs) if (r := fallback_reason(job)) is not None]


def train_many(jobs: Sequence[Sequence[Any]], label: str = "engine", fused_adam: bool = False) -> list[TrainRecord]:
    """Train every job (the arguments of `empirics.train.train`, label optional) in place; the records in order.

    Supported jobs are grouped and trained stacked; the rest go through `train` one by one. A record's `wall_s` is
    its group's training time divided by the group's size (the networks were trained together). `fused_adam`
    steps Adam in torch's fused kernel (`_update_fused`: faster, equal to float32 rounding, not bit-equal).
    """
    records: list[TrainRecord | None] = [None] * len(jobs)
    fallback = {i for i, _ in fallbacks(jobs)}
    for i in sorted(fallback):
        records[i] = train(*jobs[i])
    nets = [_prepare(i, job) for i, job in enumerate(jobs) if i not in fallback]
    groups: dict[tuple[Any, ...], list[_Net]] = {}
    for net in nets:
        groups.setdefault(_group_key(net), []).append(net)
    for group in groups.values():
        for chunk in _chunks(group):
            t0 = time.perf_counter()
            m = chunk[0].model.spec.width
            if not _train_group(chunk, f"{label} {len(chunk)} x m={m}", fused_adam):
                for net in chunk:
                    records[net.index] = train(*jobs[net.index])
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

