"""What every claim module shares: the `Verdict` enum, `Claim` and `Outcome`, the two training
protocols and the input preprocessings every empirical claim is judged under, and the adequacy gate as the rules
read it.

A claim's rule lives in exactly one function of one module of this package, and `verify claims` and
the single-experiment commands call that same function. Claim ids are written out literally in each
module, so one search for an id finds its rule, its check and its test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from empirics.vocab import LandscapeVerdict, model_short
from ntkm.errors import UserInputError
from theory import checks as theory_checks

#: Unit name -> its result as the cache holds it: the unit's typed record (`verify.runner.Unit.record`), or a dict.
Results = dict[str, Any]


class Verdict(str, Enum):
    """The verdicts a rule may give. `UNDERDETERMINED`: the measurement agrees or disagrees with the
    paper depending on a choice the paper leaves free (e.g. the n at which kappa is taken). `INCONCLUSIVE`:
    the data cannot tell (an interval that contains both the paper's value, or the claimed direction, and
    the null). `PARTLY` only for a partial condition that the rule names."""

    HOLDS = "holds"
    PARTLY = "partly"
    NOT = "does not hold"
    INCONCLUSIVE = "inconclusive"
    UNDERDETERMINED = "underdetermined"
    NA = "not measurable here"

    def __str__(self) -> str:
        return self.value


VERDICTS = tuple(v.value for v in Verdict)


class PartlyAs(str, Enum):
    """What a "partly" stands for, printed beside it ("partly (one estimand)"): each partial condition a rule names
    has one of these labels, so one word no longer carries several meanings (issue 40 item 2)."""

    ONE_ESTIMAND = "one estimand"
    SLOWER = "converges more slowly"
    CONVERGENCE_NOT_SHOWN = "ReLU convergence not shown"
    SECONDARY = "secondary metric"
    SECONDARY_AGAINST = "a secondary metric against"
    FACTOR_EXCLUDED = "factor excluded"
    NOISE = "not beyond noise"
    NOT_VALIDATED = "not validated"
    DATASETS_DISAGREE = "data sets disagree"
    SOME_EPS = "some eps"
    CORRECTED = "corrected form"
    ONE_CRITERION = "one criterion"
    NOT_A_MINIMUM = "not a minimum"
    WEAK = "weak agreement"
    SOME_N = "some n"
    NOT_BEYOND_CONTROL = "not beyond ReLU"
    ILL_POSED = "ill-posed as stated"

    def __str__(self) -> str:
        return self.value


def verdict_label(verdict: Verdict | str, partly_as: PartlyAs | str | None, axis: str | None = None) -> str:
    """The verdict as printed: "partly (<what>)" where a partial verdict names its condition, "underdetermined
    (<axis>)" where the free choice that splits it is named, else the verdict."""
    v = Verdict(verdict)
    if v is Verdict.PARTLY and partly_as:
        return f"{v.value} ({PartlyAs(partly_as).value})"
    return f"{v.value} ({axis})" if v is Verdict.UNDERDETERMINED and axis else v.value

#: The two training protocols of every empirical claim: the paper's reported setup, and one that trains
#: both networks properly (see `empirics.nets.protocols`). Unit names carry the protocol as `name@protocol`.
PROTOCOLS = ("paper", "proper")


@dataclass(frozen=True)
class ClaimsProtocol:
    """A claims protocol: its label in reports, the training protocol of `empirics.nets.protocols` it runs (by name, so
    that this table imports without torch), which of the preset's epochs bound it, and, for a protocol on the
    schedule axis (issue 40 item 3), the width-consistent exponent it trains at and the protocol whose verdicts it is
    compared with (`varies`: their measured verdicts differing make the headline "underdetermined (schedule)")."""

    name: str
    label: str
    training: str
    epochs_key: str
    lr_power: float | None = None
    varies: str | None = None


#: Every claims protocol a preset may name (`protocols`): the two of `PROTOCOLS` and the schedule axis's other
#: exponent (the width-consistent protocol at lr exponent 1/4 with its own piloted anchor).
CLAIMS_PROTOCOLS: dict[str, ClaimsProtocol] = {c.name: c for c in (
    ClaimsProtocol("paper", "paper protocol", "paper", "paper_epochs"),
    ClaimsProtocol("proper", "proper training", "width-consistent", "epochs"),
    ClaimsProtocol("proper-quarter", "proper training, lr exponent 1/4", "width-consistent", "epochs", lr_power=0.25,
                   varies="proper"),
)}


def claims_protocol(name: str) -> ClaimsProtocol:
    """The claims protocol called `name`; an unknown name is a one-line error listing them."""
    try:
        return CLAIMS_PROTOCOLS[name]
    except KeyError:
        raise UserInputError(f"unknown claims protocol '{name}'; choose one of {', '.join(CLAIMS_PROTOCOLS)}") \
            from None
#: The input preprocessings every empirical claim may be judged under (`empirics.nets.models.ModelSpec.preprocess`):
#: raw [0, 1] pixels (the paper's setup as restated), per-channel standardisation, and standardisation then unit
#: norm (the presets' standardised condition, docs/DEVIATIONS.md D19). Which of them a run uses is the preset's
#: `preprocessings`; a condition is a protocol x preprocessing pair (`units.condition`).
PREPROCESSINGS = ("raw", "channel", "unit")


@dataclass
class Outcome:
    """What we measured for one claim (under one protocol) and the verdict its rule gives.

    `gate` is the adequacy condition the rule applied (empty for claims that train nothing);
    `condition` the interval condition that decided the verdict; `partly_as` names what a "partly" stands for
    (`PartlyAs`; None for other verdicts), `axis` the free choice that makes an "underdetermined" verdict; `tests` the
    deciding tests of its intervals against points (`verify.multiplicity.point_test`), for the multiplicity columns.
    """

    ours: str
    verdict: Verdict
    protocol: str
    numbers: dict[str, Any] = field(default_factory=dict)
    seeds: int | None = None
    gate: str = ""
    condition: str = ""
    partly_as: PartlyAs | None = None
    axis: str | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The verdict as printed (`verdict_label`)."""
        return verdict_label(self.verdict, self.partly_as, self.axis)


@dataclass(frozen=True)
class Claim:
    """One claim of the paper. `empirical` claims are evaluated once per protocol (see `PROTOCOLS`),
    with `units` resolved to that protocol's units; `fixed_units` are read as named under every condition (a unit
    whose condition is part of its design, such as the influence positive control); `optional_units` are resolved
    like `units` and read where the run has them, their absence no reason for "not measurable here" (a retrain-based
    flip row of the claim's own data set that a preset does not run); `fixed_optional_units` are read as named where
    the run has them (a positive control that runs only at the presets of a powered design)."""

    id: str
    source: str
    statement: str
    paper: str
    rule: str
    units: tuple[str, ...]
    evaluate: Callable[[Results], Outcome]
    v2: str | None = None
    group: str = "theory"
    empirical: bool = False
    fixed_units: tuple[str, ...] = ()
    optional_units: tuple[str, ...] = ()
    fixed_optional_units: tuple[str, ...] = ()


#: The key of a unit result that stands for a unit the preset does not run (`not_run`).
NOT_RUN = "not_run_at_preset"


def not_run(reason: str) -> dict[str, Any]:
    """The result that stands for a unit the preset does not run, saying why (`unavailable` reads it like a unit
    whose data is missing; `verify.claims.evaluate_claim` puts the reason in the row)."""
    return {"unavailable": reason, NOT_RUN: True}


def not_run_reason(results: Results, units: Iterable[str]) -> str | None:
    """The reason the first of `units` that the preset does not run was not run (`not_run`), or None."""
    for u in units:
        r = results.get(u)
        if isinstance(r, dict) and r.get(NOT_RUN):
            return str(r["unavailable"])
    return None


def unavailable(results: Results, units: Iterable[str]) -> str | None:
    """The reason a needed unit has no result (data missing, unit failed), or None."""
    for u in units:
        r = results.get(u)
        if r is None:
            return f"unit {u} was not run"
        if isinstance(r, dict) and "unavailable" in r:
            return f"{u}: {r['unavailable']}"
    return None


def gate_failures(runs: Iterable[dict[str, Any]]) -> list[str]:
    """Descriptions of the trained networks in `runs` that failed the adequacy gate.

    Each run carries `gate` = {"passed": bool, "reason": str} (`empirics.nets.protocols.adequacy`), and
    `model`, `seed` and (where it varies) `width`. A run without a gate record counts as failed: a
    verdict is never issued on a network whose training was not checked.
    """
    out = []
    for r in runs:
        g = r.get("gate")
        if g is None or not g.get("passed"):
            where = f"{r.get('model', '?')} seed {r.get('seed', '?')}" + (f" m={r['width']}" if "width" in r else "")
            out.append(f"{where}: {g['reason'] if g else 'no training record'}")
    return out


def gated(runs: Iterable[dict[str, Any]], gate_text: str, protocol: str) -> Outcome | None:
    """`Outcome(NA)` naming the networks below the gate, or None when every network passed."""
    failed = gate_failures(runs)
    if not failed:
        return None
    shown = "; ".join(failed[:4]) + (f"; and {len(failed) - 4} more" if len(failed) > 4 else "")
    return Outcome(f"not measurable: {len(failed)} network(s) below the adequacy gate ({shown})", Verdict.NA,
                   protocol, {"gate_failures": failed}, gate=gate_text)


def kernel_predictor(runs: Iterable[dict[str, Any]],
                     names: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The kernel predictors' test accuracy beside each network's own, from the runs of a malleability or landscape
    record (`empirics.experiments.distance.kernel_predictor_accuracy`): the text of the means over seeds per model (and
    training, where not standard), and per model the per-seed values, each model named by `names` (kind -> name;
    its short name where absent). ("", {}) for runs that do not record it."""
    from empirics.experiments.distance import (
        KERNEL_PREDICTOR_ACC,  # here, not at the top: the claims registry stays torch-free
    )

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if any(k in r for k in KERNEL_PREDICTOR_ACC):
            training = r.get("training", "standard")
            model = r.get("model", "?")
            label = (names or {}).get(model, model_short(model)) + ("" if training == "standard" else f" ({training})")
            groups.setdefault(label, []).append(r)
    if not groups:
        return "", {}

    def mean(rs: list[dict[str, Any]], key: str) -> str:
        vals = [float(v) for r in rs if isinstance(v := r.get(key), (int, float)) and math.isfinite(v)]
        return f"{sum(vals) / len(vals):.2f}" if vals else "-"

    analytic, trained = KERNEL_PREDICTOR_ACC
    text = ("kernel predictor test acc (analytic NTK / the trained network's NTK; the network itself): "
            + ", ".join(f"{label} {mean(rs, analytic)} / {mean(rs, trained)} ({mean(rs, 'test_acc')})"
                        for label, rs in groups.items()))
    numbers = {label: {"seeds": [r.get("seed") for r in rs], "analytic_ntk": [r.get(analytic) for r in rs],
                       "trained_ntk": [r.get(trained) for r in rs], "network": [r.get("test_acc") for r in rs]}
               for label, rs in groups.items()}
    return text, numbers


def with_kernel_predictor(out: Outcome, runs: Iterable[dict[str, Any]],
                          names: Mapping[str, str] | None = None) -> Outcome:
    """`out` with the kernel predictors' test accuracy of `runs` (`kernel_predictor`, the models named by `names`)
    appended to its text and numbers (`kernel_predictor_test_acc`); `out` itself where the runs do not record it.
    The verdict is untouched."""
    text, numbers = kernel_predictor(runs, names)
    if not text:
        return out
    return replace(out, ours=f"{out.ours}; {text}", numbers={**out.numbers, "kernel_predictor_test_acc": numbers})


HOLDS, PARTLY, NOT, UNDERDETERMINED, NA = (Verdict.HOLDS, Verdict.PARTLY, Verdict.NOT, Verdict.UNDERDETERMINED,
                                           Verdict.NA)
INCONCLUSIVE = Verdict.INCONCLUSIVE

#: The claims verdict each verdict word of a record stands for: the landscape experiment's own words and the
#: verdicts of `theory.checks` (a corrected or ill-posed theorem holds only partly as stated).
RECORD_VERDICTS: dict[str, Verdict] = {
    LandscapeVerdict.HOLDS: HOLDS, LandscapeVerdict.PARTLY: PARTLY, LandscapeVerdict.NOT: NOT,
    LandscapeVerdict.NA: NA, theory_checks.HOLDS: HOLDS, theory_checks.HOLDS_CORRECTED: PARTLY,
    theory_checks.ILL_POSED: PARTLY, theory_checks.DOES_NOT_HOLD: NOT,
}


#: What a record's verdict word that stands for "partly" names (`RECORD_VERDICTS`).
RECORD_PARTLY_AS: dict[str, PartlyAs] = {theory_checks.HOLDS_CORRECTED: PartlyAs.CORRECTED,
                                         theory_checks.ILL_POSED: PartlyAs.ILL_POSED}


def verdict_of(word: str) -> Verdict:
    """The claims verdict of a record's verdict word (`RECORD_VERDICTS`); any other word (a crashed check) is
    "not measurable here"."""
    return RECORD_VERDICTS.get(word, NA)
