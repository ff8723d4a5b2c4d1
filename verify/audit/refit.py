"""Re-fits of the audited model on altered training sets (the audit's ground truth for influence).

Two kinds (the report says which one it used):

- **warm start** (default): the saved weights are the starting point; every trainable parameter of the
  TorchScript module, exported program or suite network (for a converted TorchScript module, the FX
  graph's copy of them) is trained again with Adam for `epochs` epochs at learning rate `lr`, batch
  `batch_size`, on the model's own loss (cross-entropy; MSE on +-1 for one output), with a seeded batch
  order. Batch norm and dropout keep their evaluation behaviour (the file is an evaluation graph).
  After each re-fit the saved weights are put back, so every re-fit starts from the same point and the
  rest of the audit sees the model as loaded.
- **train function** (`--train-fn module:function`): the user's own training recipe, fitted from scratch.
  `function(x, y, seed)` receives the training inputs in the model's input shape `(n, *input_shape)`
  (float32 in [0, 1]) and labels `(n,)` (int64) and returns a trained `torch.nn.Module` mapping such
  inputs to logits `(n, classes)`. Importing the module runs its code: it is the user's own code, named
  explicitly on the command line, and is never imported otherwise.

**Stacked re-fits** (`Refitter.outputs_many`, `--refit-stack auto|on|off`): warm-start re-fits of equal
training-set size run as one computation, `torch.func.vmap(grad(loss))` over `functional_call` on a stack of copies
of the trained tensors, each copy with its own subset (rows `keep`), seed (its own seeded batch order, drawn as the
one-at-a-time re-fit draws it) and Adam state (`adam_step`: torch's formulas, elementwise on the stack). They equal
the one-at-a-time re-fits to float32 rounding (tests/verify/test_audit_stacked_refit.py). They fall back to one at
a time, and `describe_path` (the record's `panels.refit.path`) says why, for a train function, a model that changes
its buffers when run (batch-norm statistics in training mode; in evaluation mode, as every audited file is, they are
constants and stack), tensors not reachable by name, a stack of two that exceeds `--max-memory-gb` (parameters, Adam
state and the activations a probe forward saves), or any error vmap / functional_call raise (data-dependent control
flow, in-place updates, a TorchScript module). `auto` stacks on CUDA and not on the CPU, measured with 2 threads on
a 2-core machine (16 re-fits of 900 of 1,000 points, 1 epoch, batch 64, best of 3): an MLP 784-128-10 (102k
parameters) 0.16 s stacked against 0.19 s one at a time, a small CNN (5.4k parameters) 0.26 s against 0.36 s (200
points, 3 epochs: 0.10 vs 0.18 s and 0.17 vs 0.27 s); but a CNN of the README's kind (two 3x3 convolutions 32 / 64,
414k parameters, CIFAR-sized inputs; 8 re-fits) 7.1 s stacked against 3.2 s: the vmapped convolutions' backward is
slower than eight plain ones, and the small models' gain (at most 1.7x on re-fits that take a fraction of a
second) does not pay for the large models' loss, so the CPU re-fits one at a time unless `--refit-stack on`.

**Worker processes and layout on the CPU** (`--refit-workers N`, default one per core): one-at-a-time warm re-fits run
in N forked processes of one torch thread each, which take job numbers and send back outputs; each re-fit is the
one-thread re-fit of one process, bit for bit, and the parent alone answers SIGTERM and Ctrl-C (the pool ends with it).
Python 3.12 warns (a DeprecationWarning) that fork() in a process with threads may deadlock the child when another
thread holds a lock; the workers run torch on one thread and take no lock of the parent's (3,158 re-fits of the
1,720-subset CNN audit, and the audit tests under Python 3.12, ran without one), and `--refit-workers 1` forks nothing.
In torch's CUDA builds (seen with 2.11.0+cu130 and 2.14.1+cu130 on a machine without a GPU; not in 2.13.0+cpu) reading a
`.pt2` used to mark the process, once the model check ran a backward, so that a forked child's first backward raised
("Unable to handle autograd's threading in combination with fork-based multiprocessing") and the re-fits fell back to
this process; `modelio.keep_forkable` runs the engine once before the read, which keeps the workers
(tests/verify/test_audit_refit_workers.py fails without it under 2.14.1+cu130). Where a GPU is visible, torch's engine
starts its device threads at the first backward whatever the model (its code; not measured here), so CPU re-fits there
(`--device cpu`) would fall back to one process, the record saying why (`workers_reason`). A warm re-fit on the CPU also
trains the 4-D weights in channels-last layout (`_channels_last`): oneDNN's convolutions and max-pooling are faster on
it. Measured (`benchmarks.bench_refit_workers`, results/refit-workers.json: README step 1's CNN, 16 re-fits of 900 of
1,000 MNIST images, 5 epochs, 2-core AMD EPYC): 0.546 s per re-fit with 2 threads in one process, 0.927 s with 1 thread,
0.643 s with 1 thread in channels-last, 0.345 s in 2 workers.

The effect of altering the training set is always measured against a **control**: the same kind of
re-fit, with the same seed, on the unaltered set; so what the optimiser does anyway cancels out.

Adequacy of the re-fits (the panels that use them are "not measurable" without it): a warm-start
control must keep the saved model's fit (train and test accuracy each at most `REFIT_TOLERANCE`
below the saved model's, and test accuracy at most `REFIT_TOLERANCE` above it: a warm start that
teaches an untrained model the task re-fits a different model than the one saved); a from-scratch
control must pass the accuracy part of the adequacy gate of `empirics.nets.protocols` (train accuracy at
least halfway from chance to 1, test accuracy a tenth of the way).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from empirics.common import Tensors
from empirics.kernels.audit_ntk import trainable
from empirics.nets.losses import loss_fn, predict_labels
from empirics.nets.protocols import GATE_TEST, GATE_TRAIN, chance_accuracy
from ntkm.errors import UserInputError

WARM, TRAIN_FN = "warm start", "train function"
#: How far (in accuracy) a warm-start control re-fit may fall below the saved model and still count.
REFIT_TOLERANCE = 0.05
#: The most re-fits stacked in one computation.
STACK_MAX = 64
#: `--refit-stack` values: auto (stack on CUDA; on the CPU one at a time: the module docstring's measurements), on, off.
STACK_MODES = ("auto", "on", "off")
#: The most worker processes of CPU re-fits (`--refit-workers`).
WORKERS_MAX = 8


def default_workers(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """`--refit-workers` auto: one worker process per core this process may run on (its CPU affinity, and a
    container's CPU quota where cgroup v2's `cpu.max` sets one), at most `WORKERS_MAX`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, min(WORKERS_MAX, cores))


@dataclass(frozen=True)
class RefitConfig:
    """How the audit fits the model again: warm start (epochs, lr, batch) or the user's `train_fn`."""

    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 64
    train_fn: str | None = None
    #: `--refit-stack` (`STACK_MODES`) and the memory budget of one stack, in bytes (`--max-memory-gb`)
    stack: str = "auto"
    stack_bytes: int = 2 << 30
    #: worker processes of one-at-a-time re-fits on the CPU (`--refit-workers`; None: `default_workers()`)
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.stack not in STACK_MODES:
            raise UserInputError(f"--refit-stack must be one of {', '.join(STACK_MODES)}, got '{self.stack}'")
        if self.workers is not None and not 1 <= self.workers <= WORKERS_MAX:
            raise UserInputError(f"--refit-workers must be from 1 to {WORKERS_MAX}, got {self.workers}")
        if self.epochs < 1 or not (math.isfinite(self.lr) and self.lr > 0) or self.batch_size < 1:
            raise UserInputError("--refit-epochs and --refit-batch must be >= 1 and --refit-lr a finite number > 0")
        if self.train_fn is not None and (self.train_fn.count(":") != 1 or not all(self.train_fn.split(":"))):
            raise UserInputError(f"--train-fn must be MODULE:FUNCTION (e.g. mytrain:fit or path/to/file.py:fit), "
                                 f"got '{self.train_fn}'")

    @property
    def kind(self) -> str:
        return TRAIN_FN if self.train_fn else WARM

    def describe(self) -> str:
        if self.train_fn:
            return f"the user's train function {self.train_fn}, from scratch, seeded"
        return (f"warm start from the saved weights: Adam, lr {self.lr:g}, {self.epochs} epochs, batch "
                f"{self.batch_size}, seeded batch order")


def load_train_fn(spec: str) -> Callable[..., nn.Module]:
    """Import `module:function` (a module name, or a path to a .py file). This runs the user's own code."""
    mod_name, fn_name = spec.split(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name).expanduser().absolute()
            if not path.is_file():
                raise UserInputError(f"--train-fn {spec}: file {path} does not exist")
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            if loader_spec is None or loader_spec.loader is None:
                raise UserInputError(f"--train-fn {spec}: {path} cannot be imported")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = _import_named(mod_name)
    except UserInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is reported in one line
        hint = ("; only the named module is taken from the working directory (it is not put on the import path): "
                "import its helpers relative to a package, or install them") if isinstance(exc, ImportError) else ""
        raise UserInputError(f"--train-fn {spec}: importing {mod_name} failed "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}){hint}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UserInputError(f"--train-fn {spec}: {mod_name} has no function {fn_name}")
    return fn


def _import_named(name: str) -> Any:
    """Import module `name` from the working directory (only that name's top-level module or package is looked
    up there), else from the installed packages. The working directory never goes on `sys.path`, so no other
    import (a `weasyprint.py` lying there, say) can be taken from it."""
    top = name.split(".")[0]
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(top, None)
                raise
    return importlib.import_module(name)


class Refitter:
    """Fits the model again on altered training sets; `outputs` returns the re-fitted model's outputs.

    `net` maps flat inputs (n, d) to logits (warm start trains `params`, which `net` uses, in place and
    restores them afterwards); `input_shape` is the per-example shape a train function receives.
    """

    def __init__(self, net: nn.Module, params: list[torch.Tensor], cfg: RefitConfig, out_dim: int,
                 input_shape: tuple[int, ...], names: list[str] | None = None):
        self.net = net
        self.params = params
        self.cfg = cfg
        self.out_dim = out_dim
        self.input_shape = tuple(input_shape)
        self.count = 0
        self.seconds = 0.0
        self._fn = load_train_fn(cfg.train_fn) if cfg.train_fn else None
        self._controls: dict[int, dict[str, np.ndarray]] = {}
        #: the names of `params` in `net` (what `functional_call` replaces), None when unknown (no stacking)
        self.names = names
        self.stack_mode = cfg.stack
        self.max_bytes = cfg.stack_bytes
        self.stacked_count = 0
        self._stack: tuple[bool, str] | None = None
        self._stack_size = 0
        self.workers = cfg.workers if cfg.workers is not None else default_workers()
        self.pooled_count = 0
        self._pool_off: str | None = None

    @classmethod
    def for_module(cls, module: nn.Module, net: nn.Module, cfg: RefitConfig, out_dim: int,
                   input_shape: tuple[int, ...]) -> Refitter:
        """A re-fitter that trains every trainable tensor of `module` (which `net` calls)."""
        named = trainable(module)
        params = list(named.values())
        if not params and cfg.train_fn is None:
            raise UserInputError("the model has no trainable parameters, so it cannot be re-fitted; pass "
                                 "--train-fn MODULE:FUNCTION with your own training recipe")
        prefix = next((name for name, m in net.named_modules() if m is module), None)
        names = None if prefix is None else [f"{prefix}.{k}" if prefix else k for k in named]
        return cls(net, params, cfg, out_dim, input_shape, names)

    def _warm(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
        per_ex = loss_fn(self.out_dim)
        opt = torch.optim.Adam(self.params, lr=self.cfg.lr)
        gen = torch.Generator().manual_seed(seed)
        n, b = len(x), self.cfg.batch_size
        with torch.enable_grad():
            for _ in range(self.cfg.epochs):
                perm = torch.randperm(n, generator=gen).to(x.device)  # seeded on the CPU, moved
                for i in range(0, n, b):
                    idx = perm[i:i + b]
                    opt.zero_grad(set_to_none=True)
                    per_ex(self.net(x[idx]), y[idx]).mean().backward()
                    opt.step()

    @contextmanager
    def fitted(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> Iterator[nn.Module]:
        """The model fitted again on (x, y) with `seed`, as a module on flat inputs; restored on exit."""
        tic = time.perf_counter()
        self.count += 1
        if self._fn is not None:
            torch.manual_seed(seed)
            try:
                model = self._fn(x.reshape(len(x), *self.input_shape).clone(), y.clone(), seed)
            except UserInputError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's function failing is reported in one line
                raise UserInputError(f"--train-fn {self.cfg.train_fn} failed ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
            if not isinstance(model, nn.Module):
                raise UserInputError(f"--train-fn {self.cfg.train_fn} returned {type(model).__name__}; it must "
                                     "return the trained torch.nn.Module")
            model.eval()
            fitted = self._checked_outputs(model, x[:2])
            self.seconds += time.perf_counter() - tic
            yield fitted
            return
        saved = [p.detach().clone() for p in self.params]
        bufs = self._buffer_state()
        relaid = self._channels_last()
        relaid_ids = {id(p) for p in relaid}
        try:
            for p in relaid:  # channels-last strides set even where a size-1 dimension makes both layouts valid
                p.data = torch.empty_like(p, memory_format=torch.channels_last).copy_(p.data)
            self._warm(x, y, seed)
            self.seconds += time.perf_counter() - tic
            yield self.net
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved, strict=True):
                    if id(p) in relaid_ids:
                        p.data = s  # the saved value in its own layout
                    else:
                        p.copy_(s)
            self._restore_buffers(bufs)

    def _channels_last(self) -> list[torch.Tensor]:
        """The 4-D weights a warm re-fit on the CPU trains in channels-last layout: oneDNN's convolutions and
        max-pooling run faster on it (README step 1's CNN, 1 thread: 0.927 s per re-fit against 0.643 s; equal to
        float32 rounding, tests/verify/test_audit_refit_workers.py); the saved layout is put back after the re-fit."""
        return [p for p in self.params if p.dim() == 4 and p.device.type == "cpu"]

    def _checked_outputs(self, model: nn.Module, x: torch.Tensor) -> nn.Module:
        """The train function's model on flat inputs, refused unless it gives `out_dim` logits per example."""
        from verify.audit.modelio import FlatInput

        net = FlatInput(model, self.input_shape)
        try:
            with torch.no_grad():
                out = net(x)
        except UserInputError as exc:
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model that does not fit the audit: "
                                 f"{exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's model failing is reported in one line
            why = str(exc).splitlines()[0] if str(exc) else ""
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model that fails on the training "
                                 f"inputs ({type(exc).__name__}: {why})") from None
        if tuple(out.shape) != (len(x), self.out_dim):
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model with outputs of shape "
                                 f"{tuple(out.shape)} for {len(x)} examples; the audited model gives ({len(x)}, "
                                 f"{self.out_dim}): return a model with the same {self.out_dim} outputs")
        return net

    def outputs(self, x: torch.Tensor, y: torch.Tensor, seed: int,
                evals: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Fit again on (x, y) with `seed`; return the re-fitted model's outputs on each named input set."""
        with self.fitted(x, y, seed) as net, torch.no_grad():
            return {k: net(v).detach().double().cpu().numpy() for k, v in evals.items()}

    def control(self, x: torch.Tensor, y: torch.Tensor, seed: int,
                evals: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """The re-fit on the unaltered training set with `seed` (computed once per seed)."""
        if seed not in self._controls:
            self._controls[seed] = self.outputs(x, y, seed, evals)
        return self._controls[seed]

    def controls(self, x: torch.Tensor, y: torch.Tensor, seeds: Sequence[int],
                 evals: dict[str, torch.Tensor]) -> list[dict[str, np.ndarray]]:
        """`control` for each of `seeds`, the ones not yet computed re-fitted together (`outputs_many`)."""
        todo = [s for s in dict.fromkeys(seeds) if s not in self._controls]
        for s, out in zip(todo, self.outputs_many([RefitJob(x, y, s, evals) for s in todo]), strict=True):
            self._controls[s] = out
        return [self._controls[s] for s in seeds]

    def snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every trained parameter and buffer of `net` with a copy of its value now (inside `fitted`: a warm
        re-fit's weights, which `applied` puts back later)."""
        return [(p, p.detach().clone()) for p in self.params] + self._buffer_state()

    @contextmanager
    def applied(self, snap: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[nn.Module]:
        """`net` with the values of `snap` (a `snapshot`), its own values restored on exit."""
        saved = self.snapshot()
        self._restore_buffers(snap)
        try:
            yield self.net
        finally:
            self._restore_buffers(saved)

    # --- stacked re-fits ----------------------------------------------------------------------------

    def _buffer_state(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every buffer of `net` that is not trained, with a copy of its value (what a run may change)."""
        trained = {id(p) for p in self.params}
        return [(b, b.detach().clone()) for b in self.net.buffers() if id(b) not in trained]

    @staticmethod
    def _restore_buffers(state: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy each saved value back into its tensor (parameters or buffers) where it differs."""
        with torch.no_grad():
            for b, v in state:
                if not torch.equal(b, v):
                    b.copy_(v)

    def _stack_decision(self, x: torch.Tensor, y: torch.Tensor) -> tuple[bool, str]:
        """Whether re-fits run stacked (`STACK_RULE`), and why (decided once, on the first jobs' data)."""
        if self._stack is not None:
            return self._stack
        self._stack = self._decide(x, y)
        return self._stack

    def _decide(self, x: torch.Tensor, y: torch.Tensor) -> tuple[bool, str]:
        if self._fn is not None:
            return False, "your --train-fn fits each model itself, one at a time"
        if self.stack_mode == "off":
            return False, "--refit-stack off"
        if self.names is None:
            return False, "the trained tensors are not reachable by name from the network the re-fits call"
        dev = self.params[0].device
        if self.stack_mode == "auto" and dev.type == "cpu":
            return False, ("on the CPU stacking is not faster than one re-fit at a time (measured: see "
                           "verify.audit.refit); --refit-stack on stacks anyway")
        n_probe = min(2, len(x))
        state = self._buffer_state()
        saved = {}
        try:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                    lambda t: saved.__setitem__(id(t), t.numel() * t.element_size()) or t, lambda t: t):
                loss_fn(self.out_dim)(self.net(x[:n_probe]), y[:n_probe]).mean()
        except Exception as exc:  # noqa: BLE001 - the loop re-fit reports the model's own failure
            return False, f"a probe forward failed ({type(exc).__name__})"
        changed = [i for i, (b, v) in enumerate(state) if not torch.equal(b, v)]
        self._restore_buffers(state)
        if changed:
            return False, (f"the model changes {len(changed)} buffer(s) when it runs (batch-norm running statistics "
                           "in training mode, say), which stacked copies would share")
        param_bytes = sum(p.numel() * p.element_size() for p in self.params)
        act = sum(saved.values()) / n_probe
        per_copy = 4 * param_bytes + 2 * self.cfg.batch_size * act
        self._stack_size = int(min(STACK_MAX, self.max_bytes // max(1.0, per_copy)))
        if self._stack_size < 2:
            return False, (f"two stacked copies (~{2 * per_copy / 2**30:.2f} GiB with their optimiser state and "
                           f"activations) exceed the memory budget (--max-memory-gb)")
        return True, (f"stacked: torch.func functional_call + vmap over up to {self._stack_size} copies of the "
                      "parameters, Adam applied elementwise to each copy")

    def describe_path(self) -> dict[str, Any]:
        """Which path the re-fits ran (for the record): stacked or one at a time, why, and how many each way."""
        stacked, why = self._stack if self._stack is not None else (False, "no group of re-fits to stack")
        pooled = self._pool_reason(self.params[0].device) if self.params else "no trained tensors"
        return {"stacked": bool(stacked and self.stacked_count > 0), "reason": why, "mode": self.stack_mode,
                "stacked_refits": self.stacked_count, "one_at_a_time_refits": self.count - self.stacked_count,
                "workers": self.workers if self.pooled_count else 1, "worker_refits": self.pooled_count,
                "workers_reason": pooled if pooled is not None else
                f"one-at-a-time re-fits in {self.workers} worker processes of one torch thread each"}

    def outputs_many(self, jobs: Sequence[RefitJob]) -> list[dict[str, np.ndarray]]:
        """`outputs` of each job; stacked where `_stack_decision` allows (jobs of equal training-set size, in chunks
        that fit the memory budget), one at a time otherwise and for any chunk whose stacked run fails (the failure
        then turns stacking off for the rest of the audit, and `describe_path` says why)."""
        results: list[dict[str, np.ndarray] | None] = [None] * len(jobs)
        if len(jobs) > 1 and self._stack_decision(jobs[0].x, jobs[0].y)[0]:
            groups: dict[int, list[int]] = {}
            for i, job in enumerate(jobs):
                groups.setdefault(job.n, []).append(i)
            for idx in groups.values():
                for c in range(0, len(idx) if len(idx) > 1 else 0, self._stack_size):
                    chunk = idx[c:c + self._stack_size]
                    if len(chunk) < 2 or not self._stack or not self._stack[0]:
                        continue
                    tic = time.perf_counter()
                    try:
                        outs = self._stacked([jobs[i] for i in chunk])
                    except Exception as exc:  # noqa: BLE001 - any refusal (vmap, functional_call) means one at a time
                        why = str(exc).splitlines()[0][:200] if str(exc) else ""
                        self._stack = (False, f"the stacked re-fit failed ({type(exc).__name__}: {why}); one at a time")
                        continue
                    self.seconds += time.perf_counter() - tic
                    self.count += len(chunk)
                    self.stacked_count += len(chunk)
                    for i, out in zip(chunk, outs, strict=True):
                        results[i] = out
        todo = [i for i, out in enumerate(results) if out is None]
        if len(todo) > 1 and self._pool_reason(jobs[todo[0]].x.device) is None:
            self._pooled(jobs, todo, results)
        for i in todo:
            if results[i] is None:
                results[i] = self.outputs(*jobs[i].data(), jobs[i].seed, jobs[i].evals)
        return results  # type: ignore[return-value]

    # --- re-fits in worker processes ----------------------------------------------------------------

    def _pool_reason(self, device: torch.device) -> str | None:
        """Why one-at-a-time re-fits of data on `device` do not run in worker processes (None: they do)."""
        if self._pool_off is not None:
            return self._pool_off
        if self.workers < 2:
            return "--refit-workers 1"
        if self._fn is not None:
            return "your --train-fn runs in this process"
        if device.type != "cpu" or self.params[0].device.type != "cpu":
            return "re-fits on a GPU run in this process"
        if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
            return "worker processes are forked, on Linux only"
        return None

    def _pooled(self, jobs: Sequence[RefitJob], todo: list[int],
                results: list[dict[str, np.ndarray] | None]) -> None:
        """`outputs` of the jobs `todo` in `workers` forked processes of one torch thread each: each re-fit is the
        one-at-a-time re-fit of a one-thread process (the same seed, subset and batch order), bit for bit; the
        children see the model and data as they are now (fork), take job numbers and send back outputs. A failure
        of the pool turns it off for the rest of the audit and leaves these jobs to this process."""
        global _POOL
        _POOL = (self, jobs)
        tic = time.perf_counter()
        done = 0
        try:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(self.workers, len(todo)), initializer=_pool_init) as pool:
                for i, out in pool.imap_unordered(_pool_run, todo):
                    results[i] = out
                    done += 1
        except (KeyboardInterrupt, UserInputError):
            raise
        except Exception as exc:  # noqa: BLE001 - a pool that fails leaves the re-fits to this process
            why = str(exc).splitlines()[0][:200] if str(exc) else ""
            self._pool_off = f"the worker processes failed ({type(exc).__name__}: {why}); one process"
            for i in todo:
                results[i] = None
            done = 0
        finally:
            _POOL = None
        self.seconds += time.perf_counter() - tic
        self.count += done
        self.pooled_count += done

    def _stacked(self, jobs: Sequence[RefitJob]) -> list[dict[str, np.ndarray]]:
        """`fit_stacked`, then each copy's outputs on its job's `evals`."""
        from torch.func import functional_call

        params = self.fit_stacked(jobs)
        with torch.no_grad():
            return [{name: functional_call(self.net, {nm: t[j] for nm, t in params.items()}, (e,))
                     .detach().double().cpu().numpy() for name, e in job.evals.items()}
                    for j, job in enumerate(jobs)]

    def fit_stacked(self, jobs: Sequence[RefitJob]) -> dict[str, torch.Tensor]:
        """The warm-start re-fits of `jobs` (equal training-set sizes) as one computation: the parameters stacked
        (one copy per job: name -> (jobs, *shape), the names of `names`), each copy's batch drawn from its own seeded
        order of its own subset, gradients by `vmap(grad(loss))` over `functional_call`, Adam elementwise on the
        stack (`adam_step`). The module's own parameters are not changed."""
        from torch.func import functional_call, grad, vmap

        assert self.names is not None
        dev = self.params[0].device
        n, b, k = jobs[0].n, self.cfg.batch_size, len(jobs)
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        offset: dict[tuple[int, int], int] = {}
        rows = []
        for job in jobs:
            key = (id(job.x), id(job.y))
            if key not in offset:
                offset[key] = sum(len(v) for v in xs)
                xs.append(job.x)
                ys.append(job.y)
            own = job.keep if job.keep is not None else torch.arange(len(job.x), device=job.x.device)
            rows.append(own.to(dev) + offset[key])
        X, Y = (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))
        base = torch.stack(rows)
        params = {nm: p.detach().unsqueeze(0).repeat(k, *([1] * p.dim())) for nm, p in zip(self.names, self.params,
                                                                                                strict=True)}
        m = {nm: torch.zeros_like(v) for nm, v in params.items()}
        v2 = {nm: torch.zeros_like(v) for nm, v in params.items()}
        per_ex = loss_fn(self.out_dim)
        net = self.net

        def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return per_ex(functional_call(net, p, (xb,)), yb).mean()

        grads_of = vmap(grad(loss))
        gens = [torch.Generator().manual_seed(job.seed) for job in jobs]
        state = self._buffer_state()
        step = 0
        try:
            with torch.enable_grad():
                for _ in range(self.cfg.epochs):
                    perms = torch.stack([torch.randperm(n, generator=g).to(dev) for g in gens])  # seeded, CPU
                    order = torch.gather(base, 1, perms)
                    for i in range(0, n, b):
                        idx = order[:, i:i + b]
                        g = grads_of(params, X[idx], Y[idx])
                        step += 1
                        adam_step(params, g, m, v2, step, self.cfg.lr)
            return params
        finally:
            self._restore_buffers(state)



@dataclass(frozen=True)
class RefitJob:
    """One re-fit for `Refitter.outputs_many`: fit on (x, y), or on the rows `keep` of them, with `seed`; report the
    re-fitted model's outputs on each named input of `evals`."""

    x: torch.Tensor
    y: torch.Tensor
    seed: int
    evals: dict[str, torch.Tensor] = field(default_factory=dict)
    keep: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return len(self.x) if self.keep is None else len(self.keep)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training set this job fits: (x, y), or their rows `keep`."""
        return (self.x, self.y) if self.keep is None else (self.x[self.keep], self.y[self.keep])


#: The re-fitter and jobs of the pool being run (read by the forked workers; None outside `Refitter._pooled`).
_POOL: tuple[Refitter, Sequence[RefitJob]] | None = None


def _pool_init() -> None:
    """A worker: one torch thread; the parent alone answers Ctrl-C and SIGTERM (it ends the pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)


def _pool_run(i: int) -> tuple[int, dict[str, np.ndarray]]:
    assert _POOL is not None
    refitter, jobs = _POOL
    job = jobs[i]
    return i, refitter.outputs(*job.data(), job.seed, job.evals)


#: torch.optim.Adam's defaults, which the re-fits use.
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


def adam_step(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], exp_avg: dict[str, torch.Tensor],
              exp_avg_sq: dict[str, torch.Tensor], step: int, lr: float) -> None:
    """One step of torch's Adam at its default betas and eps (no weight decay, not amsgrad; the formulas of
    `torch.optim.adam._single_tensor_adam`) on every tensor of `params`, in place, elementwise: so on a stack of
    copies it is each copy's own Adam."""
    (beta1, beta2), eps = ADAM_BETAS, ADAM_EPS
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    step_size = lr / bias_correction1
    with torch.no_grad():
        for k, p in params.items():
            g = grads[k]
            exp_avg[k].lerp_(g, 1 - beta1)
            exp_avg_sq[k].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (exp_avg_sq[k].sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg[k], denom, value=-step_size)


@dataclass(frozen=True)
class RefitInputs:
    """What a panel that re-fits the model and attacks its training points works on: the re-fitter, the saved model
    on flat inputs (the attacks' target) and the audit's data (`t.out_dim`: the model's outputs)."""

    refit: Refitter
    model: nn.Module
    t: Tensors


def per_example_loss(out: np.ndarray, y: np.ndarray, out_dim: int) -> np.ndarray:
    """The model's own loss of each example (cross-entropy, or MSE on +-1 for one output)."""
    with torch.no_grad():
        return loss_fn(out_dim)(torch.as_tensor(out), torch.as_tensor(y)).double().cpu().numpy()


def labels_of(out: np.ndarray) -> np.ndarray:
    return predict_labels(torch.as_tensor(out)).cpu().numpy()


def refit_adequacy(kind: str, control: dict[str, np.ndarray], t: Tensors,
                   saved_acc: tuple[float, float]) -> dict[str, Any]:
    """Did the control re-fit (its outputs on `t`'s training and test points) keep (warm start) or reach (train
    function) a fit? (the module docstring's rule; `saved_acc`: the saved model's train and test accuracy)"""
    saved_train_acc, saved_test_acc = saved_acc
    out_dim = t.out_dim
    tr = float(np.mean(labels_of(control["train"]) == t.y_train.cpu().numpy()))
    te = float(np.mean(labels_of(control["test"]) == t.y_test.cpu().numpy()))
    if kind == WARM:
        need_tr, need_te = saved_train_acc - REFIT_TOLERANCE, saved_test_acc - REFIT_TOLERANCE
        most_te = saved_test_acc + REFIT_TOLERANCE
        rule = (f"a warm-start control re-fit keeps the saved model's fit: train and test accuracy at most "
                f"{REFIT_TOLERANCE:g} below the saved model's ({saved_train_acc:.3f}, {saved_test_acc:.3f}), test "
                f"accuracy at most {REFIT_TOLERANCE:g} above it")
    else:
        chance = chance_accuracy(out_dim, max(out_dim, 2))
        need_tr, need_te = chance + GATE_TRAIN * (1 - chance), chance + GATE_TEST * (1 - chance)
        most_te = math.inf
        rule = (f"a from-scratch control re-fit passes the accuracy gate: train accuracy >= {need_tr:.2f}, test "
                f"accuracy >= {need_te:.2f}")
    why = []
    if tr < need_tr:
        why.append(f"control re-fit train accuracy {tr:.3f} < {need_tr:.3f}")
    if te < need_te:
        why.append(f"control re-fit test accuracy {te:.3f} < {need_te:.3f}")
    if te > most_te:
        why.append(f"control re-fit test accuracy {te:.3f} > {most_te:.3f}: the warm start improves the saved model "
                   f"({saved_test_acc:.3f}), so it fits a different model than the one saved")
    return {"passed": not why, "reason": "; ".join(why) or "passed", "train_acc": tr, "test_acc": te, "rule": rule}
