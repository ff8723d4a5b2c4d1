"""Loading and binding one audit's inputs (steps 1-2 of `verify.audit.pipeline`): the model and the two data splits
checked against each other, the model bound to the data's input shape, everything moved once to the device, and
the kernel provider chosen (the suite's own analytic kernels, or the model's empirical NTK, exact or projected).

`AuditRun` carries what the stages share; `Stage` times them and notes the peak memory after each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from empirics.common import Tensors
from empirics.experiments.malleability import n_top
from empirics.kernels.audit_ntk import ModelJacobian
from empirics.kernels.audit_structured import ProjectedStructured, StructuredJacobian
from empirics.progress import log
from empirics.records import peak_rss_gib
from ntkm.errors import UserInputError
from verify.audit.config import AuditConfig
from verify.audit.measure import GenericKernels, KernelProvider, SuiteKernels
from verify.audit.modelio import (
    FlatInput,
    LoadedModel,
    Split,
    bind_input,
    check_labels,
    check_model,
    check_varied,
    fx_graph_for,
    load_model,
    load_split,
    parse_shape,
    probe_batches,
    sniff_format,
)
from verify.audit.projection import choose_projection, projected_kernel, projection_error
from verify.audit.refit import load_train_fn


@dataclass
class Stage:
    """Runs the audit's stages, adding up each one's wall time and noting the process's peak resident memory after it
    (the record's `memory`: which stage raised the peak)."""

    times: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block as stage `name` (a stage entered again adds up), the calls inside written out plainly."""
        tic = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - tic
            self.peak_gib[name] = peak_rss_gib()


@dataclass(frozen=True)
class Inputs:
    """The loaded model file and the two data splits, validated against each other."""

    loaded: LoadedModel
    train: Split
    test: Split


@dataclass(frozen=True)
class AuditRun:
    """One audit's bound inputs, shared by its stages: the settings and stage timer, the tensors, the model as the
    audit calls it (`model`, flat inputs), the network a re-fit trains (`refit_net`) and the module it comes from
    (`fit_module`: the loaded module or its FX graph), the kernel provider and why it was chosen, the loaded file,
    the per-example input shape, the image shape (None for flat data) and the memory bound in bytes."""

    cfg: AuditConfig
    st: Stage
    t: Tensors
    model: FlatInput
    refit_net: torch.nn.Module
    fit_module: torch.nn.Module
    provider: KernelProvider
    loaded: LoadedModel
    input_shape: tuple[int, ...]
    max_bytes: int
    image_shape: tuple[int, ...] | None = None
    kernel_reason: str = ""


def _has_test_split(source: str) -> bool:
    """False only for a .npz without x_test / y_test (every other source has a test split or fails later)."""
    p = Path(source).expanduser()
    if not p.is_file() or sniff_format(p) not in ("npz", "zip"):
        return True
    try:
        with np.load(p, allow_pickle=False) as z:
            return "x_test" in z.files and "y_test" in z.files
    except (ValueError, OSError):
        return True


def load_inputs(cfg: AuditConfig) -> tuple[LoadedModel, Split, Split]:
    """The model and the two data splits, validated against each other and against `--target-test` (one-line
    errors), and the user's `--train-fn` imported where a panel will re-fit with it (so a broken one fails first)."""
    loaded = load_model(cfg.model, cfg.spec)
    if cfg.test is None and not _has_test_split(cfg.train):
        raise UserInputError(f"--test is required: {cfg.train} holds no x_test / y_test arrays")
    train = load_split(cfg.train, "train", cfg.n, cfg.seed, cfg.data_dir)
    test = load_split(cfg.test or cfg.train, "test", cfg.n_test, cfg.seed, cfg.data_dir)
    if len(train.x) < 2:
        raise UserInputError(f"--train has {len(train.x)} example; the audit needs at least 2")
    if train.x.shape[1] != test.x.shape[1]:
        raise UserInputError(f"training inputs have {train.x.shape[1]} values per example but test inputs have "
                             f"{test.x.shape[1]}")
    check_varied(train, "--train")
    if cfg.target_test is not None and cfg.target_test >= len(test.x):
        raise UserInputError(f"--target-test {cfg.target_test} is beyond the {len(test.x)} test points loaded; give "
                             f"an index 0..{len(test.x) - 1}")
    if cfg.train_fn and set(cfg.panels) & {"validity", "outcome", "poison"}:
        log(f"audit: importing your train function {cfg.train_fn} (this runs your code)")
        load_train_fn(cfg.train_fn)
    return loaded, train, test


def bind(cfg: AuditConfig, st: Stage, inputs: Inputs, device: str) -> AuditRun:
    """Bind the model to the data (on the CPU, where every check runs before any panel), then move the model and the
    data once to `device` and choose the kernel provider."""
    loaded, train, test = inputs.loaded, inputs.train, inputs.test
    image_shape = train.image_shape or test.image_shape
    with st.timed("bind"):
        model, input_shape, out_dim = bind_input(loaded, train.x, image_shape, parse_shape(cfg.input_shape))
        check_labels(train, out_dim, "--train")
        check_labels(test, out_dim, "--test")
        probe_batches(model, {"training": train.x, "test": test.x}, (n_top(cfg.tau, len(train.x)), 1,
                                                                     cfg.refit_batch), out_dim)
        check_model(model, loaded, train, test.y, out_dim, int(cfg.max_memory_gb * 2**30))  # issue 42: before panels
    if image_shape is None and len(input_shape) == 3:
        image_shape = input_shape
    t = Tensors(torch.as_tensor(train.x, device=device), torch.as_tensor(train.y, device=device),
                torch.as_tensor(test.x, device=device), torch.as_tensor(test.y, device=device), out_dim)
    max_bytes = int(cfg.max_memory_gb * 2**30)
    if loaded.is_suite:
        loaded.module.to(device)  # loaded and bound on the CPU; everything after runs on `device`
        return AuditRun(cfg, st, t, model, model, loaded.module, SuiteKernels(loaded.module, max_bytes), loaded,
                        input_shape, max_bytes, image_shape)
    with st.timed("bind"):
        graph = fx_graph_for(loaded, model, train.x)
    for m in (loaded.module, graph):  # loaded, bound and converted on the CPU; everything after runs on `device`
        if m is not None:
            m.to(device)
    jac = ModelJacobian(model if graph is None else graph, input_shape, graph=graph,
                        static_batch=loaded.static_batch if graph is not None else None)
    structured, why = StructuredJacobian.build(graph, input_shape, loaded.static_batch)
    if structured is None:
        log(f"audit: structured per-example gradients do not apply ({why})")
    proj, reason = choose_projection(jac, len(train.x) + len(test.x), cfg, max_bytes, structured is not None)
    log(f"audit: kernel {reason}")
    provider = GenericKernels(jac if proj is None else projected_kernel(jac, structured, proj, max_bytes), max_bytes)
    fit_module = loaded.module if graph is None else graph
    refit_net = model if graph is None else FlatInput(graph, input_shape, loaded.static_batch)
    return AuditRun(cfg, st, t, model, refit_net, fit_module, provider, loaded, input_shape, max_bytes, image_shape,
                    reason)


def projection_record(run: AuditRun) -> dict[str, Any] | None:
    """What the record says about the kernel: None for the suite's own models, "exact", or the projection with its
    measured error (`verify.audit.projection.projection_error`) and, for a Kronecker projection, its allocation."""
    provider = run.provider
    if provider.recomputes_whole:  # the suite's own networks: the closed form
        return None
    p = provider.projection
    if p is None:
        return {"dim": 0, "kind": "exact", "reason": run.kernel_reason}
    with run.st.timed("projection error"):
        err = projection_error(provider.jac.jac, provider.jac, run.t, run.cfg, run.max_bytes)
    kron = isinstance(provider.jac, ProjectedStructured)
    out = {"dim": p.dim, "kind": p.kind, "seed": p.seed, "reason": run.kernel_reason, "error": err,
           "structure": "kronecker" if kron else "dense", "width": provider.jac.width if kron else p.dim}
    if kron:
        out.update(allocation_rule=provider.jac.allocation_rule, pilot=provider.jac.pilot,
                   allocation=provider.jac.allocation)
    return out
