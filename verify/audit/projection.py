"""Which kernel `verify audit` uses for a model outside the suite, exact or projected, and what the projection
costs in accuracy, measured against the exact kernel on a subsample.

Choice (`choose_projection`): `--projection-dim 0` exact; `--projection-dim K` projected to K; by default
exact while the Jacobian features of all audited points fit `--max-memory-gb` (then the exact kernel is cheap),
else projected to `AUTO_DIM` when that is fewer dimensions than there are points (below that the projection
saves nothing over the exact kernel assembled in blocks). The features a model needs per point, c outputs x
P parameters, are how model size enters.

Which projection (`projected_kernel`): when every parameter sits in a linear, conv2d or batch-norm node of the model's
FX graph (`empirics.kernels.audit_structured`), the Kronecker-structured projection of batched per-example gradients,
target width `STRUCTURED_AUTO_DIM` by default, shared among the weights by each one's measured share of the kernel on a
seeded pilot with its leading gradient directions kept exactly (no dense R, no per-example Jacobian; minutes for a
ResNet-18 on 1,000 images); otherwise the dense Gaussian / Rademacher projection of per-example Jacobians
(`empirics.kernels.audit_ntk.ProjectedJacobian`).

Error (`projection_error`): on a seeded subsample of `ERROR_TRAIN` training and `ERROR_TEST` test points, the
exact kernel (`empirics.kernels.audit_ntk.ModelJacobian`) against the projected one: relative Frobenius error of the
training and test-train kernel entries, and the Spearman correlation of the NTK leave-one-out influence each
gives on that subsample.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from empirics.attribution.influence import Ridge, influence_from_kernels
from empirics.common import Tensors
from empirics.intervals import spearman
from empirics.kernels.audit_ntk import ModelJacobian, ProjectedJacobian, Projection
from empirics.kernels.audit_structured import ProjectedStructured, StructuredJacobian
from empirics.nets.losses import targets
from empirics.progress import log
from ntkm.errors import UserInputError

if TYPE_CHECKING:  # verify.audit.config imports this module (AUTO_DIM)
    from verify.audit.config import AuditConfig

AUTO_DIM = 512
STRUCTURED_AUTO_DIM = 8192
ERROR_TRAIN, ERROR_TEST = 48, 24


def choose_projection(jac: ModelJacobian, n_points: int, cfg: AuditConfig, max_bytes: int,
                      structured: bool = False) -> tuple[Projection | None, str]:
    """The projection to use (None: exact) and why, by the rule in the module docstring (`cfg.projection_dim`,
    `cfg.projection_kind`, seeded by `cfg.seed`); `structured`: the Kronecker-structured projection applies (its cost
    does not grow with the parameters, so it is always cheaper than the exact kernel in blocks)."""
    dim, kind, seed = cfg.projection_dim, cfg.projection_kind, cfg.seed
    need = jac.bytes_per_example() * n_points
    gib = f"{need / 2**30:.2f} GiB"
    if dim == 0:
        return None, "exact (--projection-dim 0)"
    if dim is not None:
        per_point = 4 * jac.out_dim * dim  # float32 projected features of one point, all outputs
        if per_point * n_points > max_bytes:
            most = max(max_bytes // (4 * jac.out_dim * n_points), 1)
            raise UserInputError(f"--projection-dim {dim}: the projected features of {n_points} points would take "
                                 f"{per_point * n_points / 2**30:.3g} GiB, beyond --max-memory-gb "
                                 f"{max_bytes / 2**30:g}; give at most {most} (or 0 for the exact kernel)")
        return Projection(dim, kind, seed), f"projected as asked (--projection-dim {dim})"
    if need <= max_bytes:
        return None, f"exact: the Jacobians of all {n_points} points take {gib}, within --max-memory-gb"
    if structured:
        return Projection(STRUCTURED_AUTO_DIM, "gaussian", seed), (
            f"projected automatically: the Jacobians of all {n_points} points need {gib} > --max-memory-gb")
    if AUTO_DIM >= n_points:
        return None, (f"exact, in blocks: the Jacobians need {gib} > --max-memory-gb, but a projection to "
                      f"{AUTO_DIM} dimensions would not be smaller than the {n_points} points")
    return Projection(AUTO_DIM, kind, seed), (f"projected automatically: the Jacobians of all {n_points} points "
                                              f"need {gib} > --max-memory-gb")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def projected_kernel(jac: ModelJacobian, structured: StructuredJacobian | None, projection: Projection,
                     max_bytes: int) -> ProjectedJacobian | ProjectedStructured:
    """The projected kernel by the rule in the module docstring, within the memory budget (dense path: a quarter
    of it for a batch's exact Jacobians, half for R)."""
    if structured is not None and projection.kind == "gaussian":
        return ProjectedStructured(structured, projection)
    return ProjectedJacobian(jac, projection, batch_bytes=max(1, max_bytes // 4), cache_bytes=max_bytes // 2)


def projection_error(exact: ModelJacobian | StructuredJacobian, proj: ProjectedJacobian | ProjectedStructured,
                     t: Tensors, cfg: AuditConfig, max_bytes: int) -> dict[str, Any]:
    """The projected kernel's error against the exact one on a subsample of `t` seeded by `cfg.seed` (module
    docstring); influence with the ridge `cfg.ridge_rel`."""
    x, xt, yt = t.x_train, t.x_test, t.y_test.cpu().numpy()
    Y = targets(t.y_train, t.out_dim, torch.float64).cpu().numpy()
    Yt = targets(t.y_test, t.out_dim, torch.float64).cpu().numpy()
    seed, ridge_rel = cfg.seed, cfg.ridge_rel
    tic = time.perf_counter()
    rng = np.random.default_rng(seed + 4099)
    m, mt = min(len(x), ERROR_TRAIN), min(len(xt), ERROR_TEST)
    sub = np.sort(rng.choice(len(x), m, replace=False))
    subt = np.sort(rng.choice(len(xt), mt, replace=False))
    log(f"audit: projection error against the exact kernel on {m} + {mt} points")
    both = torch.cat([x[torch.as_tensor(sub, device=x.device)], xt[torch.as_tensor(subt, device=xt.device)]])
    k_all = exact.kernel(both, max_bytes=max_bytes).cpu().numpy()
    ke, ket = k_all[:m, :m], k_all[m:, :m]
    f = proj.features(both)
    kp_all = proj.gram(f, f).cpu().numpy()
    kp, kpt = kp_all[:m, :m], kp_all[m:, :m]
    ie = influence_from_kernels((ke, ket), Y[sub], Yt[subt], yt[subt], reg=Ridge(rel=ridge_rel))
    ip = influence_from_kernels((kp, kpt), Y[sub], Yt[subt], yt[subt], reg=Ridge(rel=ridge_rel))
    return {"n": int(m), "n_test": int(mt), "kernel_rel_error": _rel(kp, ke), "test_kernel_rel_error": _rel(kpt, ket),
            "influence_spearman": spearman(ie.total, ip.total), "wall_s": time.perf_counter() - tic,
            "what": "relative Frobenius error of the kernel entries, and Spearman correlation of NTK leave-one-out "
                    f"influence, projected against exact, on {m} training and {mt} test points (seeded subsample)"}
