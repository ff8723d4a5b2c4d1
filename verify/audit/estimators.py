"""The audit's own influence estimators as objects, one registry of them (issue 41 item 1).

Each estimator scores a training set from the network's empirical NTK on it and the model's loss residuals: NTK
leave-one-out (the kernel machine's own influence, the paper's), Gauss-Newton, empirical Fisher and generalised
Gauss-Newton (`empirics.attribution.gauss_newton`). The same `score` gives the clean influence and, on a perturbed
training set's kernels and residuals at the clean data's ridge, the influence after an attack, so the flip rates,
levers, budget curves and the validity panel treat every registered estimator alike; an unknown name is a one-line
error. The attribution libraries' scores (kronfluence, TRAK) are validated beside these but are not here: they would
need their factors fitted again on every perturbed set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from empirics.attribution.gauss_newton import (
    GGN_MAX_DIM,
    ef_grams_mean,
    ef_influence,
    ggn_influence_mean,
    ggn_ridge,
    gn_influence_mean,
    output_hessians,
)
from empirics.attribution.influence import InfluenceResult

#: Ridge of the empirical-Fisher influence, relative to the mean diagonal of the gradients' Gram matrix (tr S / n):
#: the value issue 29 measured best on a small CNN (0.177 LDS there), fixed here before any audit used it.
EF_RIDGE_REL = 0.1


@dataclass(frozen=True)
class Scoring:
    """One training set as the estimators score it: the empirical NTK between training points (`K`, n x n) and from
    test to training points (`Kst`), the one-hot targets `Y`, the loss residuals at the training and test points
    (`r_train` None where no estimator that needs them is scored), NTK leave-one-out on these kernels (`base`: its
    ridge, predictions and influence) and the audit's relative ridge."""

    K: np.ndarray
    Kst: np.ndarray
    Y: np.ndarray
    r_train: np.ndarray | None
    r_test: np.ndarray
    base: InfluenceResult
    ridge_rel: float

    def residuals(self) -> np.ndarray:
        """The training residuals, which an estimator that `needs_residuals` is always given."""
        if self.r_train is None:
            raise ValueError("this estimator needs the loss residuals on the training set; none were computed")
        return self.r_train


class KernelEstimator(ABC):
    """An influence estimator computed from a network's empirical NTK: its name, label, whether it needs the loss
    residuals, when it cannot run, its ridge (fixed on the clean data and kept on every perturbed set) and its
    per-test influence (training x test points, the audit's sign: positive = removing the point raises the loss)."""

    name: ClassVar[str]
    label: ClassVar[str]
    needs_residuals: ClassVar[bool] = True

    def unavailable(self, n: int, classes: int) -> str | None:
        """Why it cannot run on `n` training points and `classes` outputs (None: it can)."""
        return None

    @abstractmethod
    def ridge(self, s: Scoring) -> float:
        """Its absolute ridge on the clean training set `s`."""

    @abstractmethod
    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        """Its per-test influence on the training set `s` at `ridge`."""

    def result(self, s: Scoring, ridge: float) -> InfluenceResult:
        """Its influence as an `InfluenceResult` (NTK leave-one-out's predictions and losses, its own scores)."""
        per = self.score(s, ridge)
        return replace(s.base, per_test=per, total=per.sum(axis=1))


class NtkLeaveOneOut(KernelEstimator):
    """The kernel machine's exact leave-one-out influence (`empirics.attribution.influence.kernel_influence`)."""

    name, label, needs_residuals = "ntk", "NTK leave-one-out", False

    def ridge(self, s: Scoring) -> float:
        return s.base.ridge

    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        return s.base.per_test

    def result(self, s: Scoring, ridge: float) -> InfluenceResult:
        return s.base


class GaussNewton(KernelEstimator):
    """Gauss-Newton influence on the same kernel via Woodbury (`empirics.attribution.gauss_newton.gn_influence_mean`),
    at the NTK leave-one-out ridge."""

    name, label = "gn", "Gauss-Newton"

    def ridge(self, s: Scoring) -> float:
        return s.base.ridge

    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        return gn_influence_mean(s.K, s.Kst, s.residuals(), s.r_test, ridge)


class EmpiricalFisher(KernelEstimator):
    """Empirical-Fisher influence, exact in the dual (`empirics.attribution.gauss_newton.ef_influence`), its ridge
    `EF_RIDGE_REL` times the mean diagonal of the gradients' Gram matrix (NaN influence where that is 0)."""

    name, label = "ef", "empirical Fisher (exact, dual)"

    def ridge(self, s: Scoring) -> float:
        S, _ = ef_grams_mean(s.K, s.Kst, s.residuals(), s.r_test)
        return EF_RIDGE_REL * float(np.trace(S)) / len(S)

    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        S, St = ef_grams_mean(s.K, s.Kst, s.residuals(), s.r_test)
        return ef_influence(S, St, ridge) if ridge > 0 else np.full((len(S), len(St)), np.nan)


class GeneralisedGaussNewton(KernelEstimator):
    """Generalised Gauss-Newton influence with the loss's Hessian in the outputs, exact in the dual
    (`empirics.attribution.gauss_newton.ggn_influence_mean`); it runs where the dual (n x classes square) fits
    `GGN_MAX_DIM`."""

    name, label = "ggn", "generalised Gauss-Newton (loss Hessian, exact, dual)"

    def unavailable(self, n: int, classes: int) -> str | None:
        if n * classes <= GGN_MAX_DIM:
            return None
        return (f"its exact dual is {n * classes} x {n * classes} (n x classes), above {GGN_MAX_DIM}: "
                "audit fewer training points (--n)")

    def ridge(self, s: Scoring) -> float:
        return ggn_ridge(s.K, output_hessians(s.residuals(), s.Y), s.ridge_rel)

    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        r = s.residuals()
        return ggn_influence_mean(s.K, s.Kst, r, s.r_test, output_hessians(r, s.Y), ridge)


#: The paper's estimator, the lead where the validity panel chose none.
PAPER_ESTIMATOR = NtkLeaveOneOut.name

#: The audit's own estimators, by name (the flip rates, levers and budget curves can rank by each).
ESTIMATORS: dict[str, KernelEstimator] = {e.name: e for e in (
    NtkLeaveOneOut(), GaussNewton(), EmpiricalFisher(), GeneralisedGaussNewton())}


def kernel_estimator(name: str) -> KernelEstimator:
    """The registered estimator `name`; an unknown name is a one-line error."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; one of {', '.join(ESTIMATORS)}") from None


def estimator_labels() -> dict[str, str]:
    """Each registered estimator's label, by name (read at call time, so an estimator added later is included)."""
    return {name: e.label for name, e in ESTIMATORS.items()}
