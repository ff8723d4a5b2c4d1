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
the same batch order on 90 % of the data), so the ensembles are not run there.

An ensemble may lead (since 2026-12-06; before, it was scored but never led, because the flip rates had no ensemble
path): the members are kept (`Member`: a warm re-fit's weights as a `Refitter.snapshot`, a train function's own
module; each one's kernel provider and estimates), and `EnsembleLead.perturbed` gives the ensemble's influence on a
perturbed training set as the mean of each member's, each from that member's own kernel rows of the perturbed
points and its own loss residuals there. The attack that perturbs the points is the one on the user's model (the
model audited); only the attribution is the ensemble's. A member keeps the Jacobian features of its clean data
while they fit `--max-memory-gb` beside the user's model's and the members' kept before it (`keeps_jacobians`), so a
probe costs it only the moved points' features; a member beyond that budget recomputes the features of the whole
perturbed training set at every probe (memory stays at one member's).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from empirics.attribution.gauss_newton import loss_residuals
from empirics.attribution.influence import InfluenceResult
from empirics.common import Tensors
from empirics.progress import log
from verify.audit.config import AuditConfig
from verify.audit.estimators import estimator_labels
from verify.audit.measure import Estimated, GenericKernels, Network, estimate_network, model_jacobian
from verify.audit.modelio import FlatInput
from verify.audit.refit import Refitter
from verify.audit.seeding import seeding

#: The prefix of an ensemble estimator's name (`ens-ef`: empirical Fisher averaged over the re-fits).
PREFIX = "ens-"


def ensemble_labels() -> dict[str, str]:
    """Each ensemble's label in the report, from the registry's (read at call time)."""
    return {f"{PREFIX}{name}": f"{label}, averaged over the re-fits (ensemble)"
            for name, label in estimator_labels().items()}


def is_ensemble(name: str) -> bool:
    """Whether `name` is an ensemble estimator's (`ens-` and a registered estimator)."""
    return name.startswith(PREFIX) and name[len(PREFIX):] in estimator_labels()


def base_estimator(name: str) -> str:
    """The registered estimator an ensemble averages (`ens-ef` -> `ef`); any other name unchanged."""
    return name[len(PREFIX):] if is_ensemble(name) else name


@dataclass
class Member:
    """One kept ensemble member: its seed; its weights (a warm re-fit's `Refitter.snapshot`, applied to the
    re-fitter's module when needed; None for a train function's model, which is its own module); the module on flat
    inputs; its kernel provider (no cached Jacobians) and its estimates on the clean data."""

    seed: int
    snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None
    net: FlatInput
    provider: GenericKernels
    est: Estimated


@dataclass
class Ensembles:
    """The ensemble estimators' per-test influence by name (training x test points), the member seeds, the seconds
    spent, why none was computed where none was, and the members kept for the flip rates."""

    per_test: dict[str, np.ndarray] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str = ""
    members: list[Member] = field(default_factory=list)

    def lead(self, name: str, refit: Refitter) -> EnsembleLead | None:
        """The ensemble `name` as the estimator the flip rates rank by (None: `name` is not one of these)."""
        if name not in self.per_test or not self.members:
            return None
        return EnsembleLead(name, base_estimator(name), self.members, refit, self.per_test[name])


@dataclass
class EnsembleLead:
    """An ensemble estimator the flip rates rank by: its name, the registered estimator it averages, the members,
    the re-fitter whose module a warm member's weights are applied to, and its clean influence (training x test)."""

    name: str
    base: str
    members: list[Member]
    refit: Refitter
    per_test: np.ndarray

    @property
    def label(self) -> str:
        return ensemble_labels()[self.name]

    def clean(self, like: InfluenceResult) -> InfluenceResult:
        """The ensemble's clean influence, with the kernel predictor's other fields of `like` (the user's model's)."""
        return replace(like, per_test=self.per_test, total=self.per_test.sum(axis=1))

    def perturbed(self, x_new: torch.Tensor, chosen: np.ndarray, x_adv: torch.Tensor, y_chosen: torch.Tensor,
                  xt: torch.Tensor, yt: np.ndarray) -> InfluenceResult:
        """The ensemble's influence on the training set `x_new` (the points `chosen` replaced by `x_adv`): the mean
        over the members of each one's `base` influence from its own kernel rows of the perturbed points and its own
        loss residuals there (at its clean data's ridges); the kernel predictor's test loss and accuracy averaged."""
        news = []
        for m in self.members:
            with self.refit.applied(m.snapshot) if m.snapshot is not None else nullcontext():
                K2, Kst2 = m.provider.perturbed(x_new, chosen, m.est.K, m.est.Kst, xt)

                def residuals(m: Member = m) -> np.ndarray:
                    with torch.no_grad():
                        r2 = m.est.r_train.copy()
                        r2[chosen] = loss_residuals(m.net(x_adv), y_chosen)
                        return r2
                news.append(m.est.perturbed(self.base, K2, Kst2, yt, residuals))
        per = np.mean([r.per_test for r in news], axis=0)
        return replace(news[0], per_test=per, total=per.sum(axis=1),
                       test_loss=float(np.mean([r.test_loss for r in news])),
                       test_acc=float(np.mean([r.test_acc for r in news])))


def keeps_jacobians(provider: GenericKernels, points: int, kept: int, max_bytes: int) -> bool:
    """Whether a member may keep its clean Jacobian features: they were cached (within the budget alone) and the
    user's model's, the `kept` members' before it and its own fit `max_bytes` together."""
    return provider.holds_jacobians and (kept + 2) * provider.jac.bytes_per_example() * points <= max_bytes


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
    kept: list[Member] = []
    start = time.perf_counter()
    for k, s in enumerate(seeds):
        log(f"audit: ensemble member {k + 1}/{len(seeds)} (re-fit with seed {s}, its empirical NTK)")
        with refit.fitted(t.x_train, t.y_train, s) as fitted:
            net = fitted if isinstance(fitted, FlatInput) else FlatInput(fitted, input_shape)
            jac = model_jacobian(net.inner, input_shape, net.static_batch)
            provider = GenericKernels(jac, max_bytes)
            member = Network(f"re-fit {s}", net, provider, jac.n_params, 0)
            est = estimate_network(member, t, cfg)
            snap = refit.snapshot() if refit.cfg.train_fn is None else None  # a warm re-fit: its weights, kept
        keep = keeps_jacobians(provider, len(t.x_train) + len(t.x_test), len(kept), max_bytes)
        kept.append(Member(s, snap, net, provider if keep else provider.refreshed(), est))
        if not keep:
            log(f"audit: ensemble member {k + 1}'s Jacobians do not fit the memory budget beside the others'; each "
                "probe of the flip rates recomputes its whole kernel row set (slower)")
        for name, per in est.per_test.items():
            if np.isfinite(per).all():
                sums[name] = sums.get(name, 0.0) + per
                counts[name] = counts.get(name, 0) + 1
    per_test = {f"{PREFIX}{name}": total / counts[name] for name, total in sums.items() if counts[name] == len(seeds)}
    return Ensembles(per_test, seeds, time.perf_counter() - start, members=kept)
