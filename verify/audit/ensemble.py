"""Ensemble estimators (issue 43 item 5): the audit's own estimators averaged over models it re-fits anyway.

TRAK (Park et al. 2023) averages its attributions over several trained models and its quality rises with their
number; the audit already fits the user's model again on the full training set with several seeds (the control
re-fits behind the re-fit noise and the noise ceiling). Each such checkpoint gets its own exact empirical NTK
(`empirics.kernels.audit_ntk.ModelJacobian` on the re-fitted module) and loss residuals, and every registered estimator
of `verify.audit.estimators.ESTIMATORS` is computed on it (`estimate_network`); the ensemble estimator is their mean
over the checkpoints. The validity panel scores each ensemble by the same LDS as every other estimator.

No re-fit scores itself: the members are full-data re-fits with the seeds seed, seed + 1, ...; the LDS targets are
subset re-fits with fresh seeds (`verify.audit.seeding`), so no member is one of the models it is scored against.
Under `--lds-seeds paired` a subset re-fit shares its seed with a member (a warm re-fit from the same weights with
the same batch order on 90 % of the data), so the ensembles are not run there. An ensemble cannot rank the flip rates
(its influence would need every member's kernel again on every perturbed training set), so it is scored but never
leads, like the attribution libraries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from empirics.common import Tensors
from empirics.progress import log
from verify.audit.config import AuditConfig
from verify.audit.estimators import estimator_labels
from verify.audit.measure import GenericKernels, Network, estimate_network, model_jacobian
from verify.audit.modelio import FlatInput
from verify.audit.refit import Refitter
from verify.audit.seeding import seeding

#: The prefix of an ensemble estimator's name (`ens-ef`: empirical Fisher averaged over the re-fits).
PREFIX = "ens-"


def ensemble_labels() -> dict[str, str]:
    """Each ensemble's label in the report, from the registry's (read at call time)."""
    return {f"{PREFIX}{name}": f"{label}, averaged over the re-fits (ensemble)"
            for name, label in estimator_labels().items()}


@dataclass
class Ensembles:
    """The ensemble estimators' per-test influence by name (training x test points), the member seeds, the seconds
    spent, and why none was computed where none was."""

    per_test: dict[str, np.ndarray] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str = ""


def ensemble_estimates(refit: Refitter, t: Tensors, cfg: AuditConfig, input_shape: tuple[int, ...],
                       max_bytes: int, members: int) -> Ensembles:
    """Every registered estimator averaged over `members` full-data re-fits (seeds `cfg.seed`, `cfg.seed` + 1, ...),
    each with its own exact empirical NTK (module docstring). `members` < 2: none (an average of one is the
    single re-fit, which says nothing an ensemble would)."""
    if members < 2:
        return Ensembles(skipped="--ensemble is below 2 (no ensemble)")
    if seeding(cfg.lds_seeds).paired:
        return Ensembles(skipped="with --lds-seeds paired the LDS re-fits share the members' seeds, so an ensemble "
                                 "would partly score itself")
    seeds = [cfg.seed + k for k in range(members)]
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    start = time.perf_counter()
    for k, s in enumerate(seeds):
        log(f"audit: ensemble member {k + 1}/{len(seeds)} (re-fit with seed {s}, its empirical NTK)")
        with refit.fitted(t.x_train, t.y_train, s) as fitted:
            net = fitted if isinstance(fitted, FlatInput) else FlatInput(fitted, input_shape)
            jac = model_jacobian(net.inner, input_shape, net.static_batch)
            member = Network(f"re-fit {s}", net, GenericKernels(jac, max_bytes), jac.n_params, 0)
            est = estimate_network(member, t, cfg)
        for name, per in est.per_test.items():
            if np.isfinite(per).all():
                sums[name] = sums.get(name, 0.0) + per
                counts[name] = counts.get(name, 0) + 1
    per_test = {f"{PREFIX}{name}": total / counts[name] for name, total in sums.items() if counts[name] == len(seeds)}
    return Ensembles(per_test, seeds, time.perf_counter() - start)
