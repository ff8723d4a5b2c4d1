"""Typed records of the units `verify claims` computes from `theory` and `empirics` functions that return no record
of their own: the theorem checks and the kappa(G) sweep (`verify.experiments.theory_unit` / `kappa_unit`).

The experiments' records live beside their experiments (`empirics.experiments.distance.DistanceRecord`, ...); these two
are assembled here, from `theory.checks.CheckResult` and `empirics.experiments.kappa.kappa_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ntkm.codec import Record
from theory.checks import CheckResult


@dataclass(frozen=True)
class TheoryRecord(Record):
    """Every check of `theory.checks.run_all_checks`, in its order."""

    checks: list[CheckResult]

    def check(self, claim_id: str) -> CheckResult | None:
        """The check of claim `claim_id` (None when the run has none)."""
        return next((c for c in self.checks if c.claim_id == claim_id), None)


@dataclass(frozen=True)
class KappaRecord(Record):
    """kappa(G) against n on one data set: one row per size loaded (`empirics.experiments.kappa.kappa_rows`), and the
    sizes the available data could not provide, each with its reason."""

    dataset: str
    sample: str
    preprocess: str
    rows: list[dict[str, Any]]
    missing: list[dict[str, Any]]

    #: Stored as `preprocessing` before issue 41 (one spelling of the input preprocessing).
    RENAMED: ClassVar[dict[str, str]] = {"preprocessing": "preprocess"}
