"""The claims registry: one entry per claim of the paper (docs/PAPER.md), each with its verdict rule.

One module per claim group (`theory`, `kappa`, `ntk`, `malleability`, `landscape`, `variants`); shared types in
`base`. Every entry states the paper's value, the protocol we run and the rule that turns our
measurement into a verdict, written before any run. Empirical claims are judged under both training
protocols (`base.PROTOCOLS`) and under each input preprocessing the preset names (`base.PREPROCESSINGS`), one
condition per pair, and the table shows every verdict; nothing in the "ours" column is copied from the paper.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from verify.claims import units
from verify.claims.base import (
    NA,
    PREPROCESSINGS,
    PROTOCOLS,
    UNDERDETERMINED,
    VERDICTS,
    Claim,
    Outcome,
    PartlyAs,
    Results,
    Verdict,
    claims_protocol,
    not_run_reason,
    unavailable,
)

__all__ = ["PREPROCESSINGS", "PROTOCOLS", "VERDICTS", "Claim", "Outcome", "Verdict", "all_claims", "evaluate_claim",
           "claim_row", "claim_units", "conditions"]


def all_claims() -> list[Claim]:
    """Every claim, in the table's order; the influence-based ones (every malleability claim and the variants' flip
    rows) judged under the influence-validity rule (`verify.claims.influence.gated`)."""
    from verify.claims.influence import INFLUENCE_CLAIMS, gated
    from verify.claims.kappa import KAPPA_CLAIMS
    from verify.claims.landscape import LANDSCAPE_CLAIMS
    from verify.claims.malleability import MALLEABILITY_CLAIMS
    from verify.claims.ntk import NTK_CLAIMS
    from verify.claims.retrain_flip import RETRAIN_FLIP_CLAIMS
    from verify.claims.theory import THEORY_CLAIMS
    from verify.claims.variants import VARIANT_CLAIMS

    variants = [gated(c) if c.id.startswith("flip-") else c for c in VARIANT_CLAIMS]
    return (THEORY_CLAIMS + KAPPA_CLAIMS + NTK_CLAIMS + [gated(c) for c in MALLEABILITY_CLAIMS] + INFLUENCE_CLAIMS
            + RETRAIN_FLIP_CLAIMS + LANDSCAPE_CLAIMS + variants)


def conditions(preprocessings: Iterable[str] = ("raw",),
               protocols: Iterable[str] = PROTOCOLS) -> list[tuple[str, str]]:
    """The (protocol, preprocessing) conditions of an empirical claim, protocol-major: raw first within each
    protocol when `preprocessings` lists it first. `protocols`: the preset's claims protocols."""
    return [(p, pre) for p in protocols for pre in preprocessings]


def protocol_units(claim: Claim, protocol: str | None, preprocess: str = "raw") -> tuple[str, ...]:
    """The unit names a claim needs under `protocol` and `preprocess` (empirical claims) or as written, then its
    `fixed_units` as written."""
    own = tuple(units.at(u, protocol, preprocess) for u in claim.units) if claim.empirical and protocol \
        else claim.units
    return own + claim.fixed_units


def optional_units(claim: Claim, protocol: str | None, preprocess: str = "raw") -> tuple[str, ...]:
    """The optional units a claim reads under `protocol` and `preprocess` where the run has them."""
    return tuple(units.at(u, protocol, preprocess) for u in claim.optional_units) if claim.empirical and protocol \
        else claim.optional_units


def claim_units(claim: Claim, preprocessings: Iterable[str] = ("raw",),
                protocols: Iterable[str] = PROTOCOLS) -> tuple[str, ...]:
    """Every unit a claim needs: its units under each condition (empirical claims), or as written; then its optional
    units and fixed optional units, which a run computes where its preset has them (`verify.experiments.units_for`)."""
    if not claim.empirical:
        return claim.units + claim.fixed_units + claim.optional_units + claim.fixed_optional_units
    conds = conditions(preprocessings, protocols)
    return tuple(dict.fromkeys([*(u for p, pre in conds for u in protocol_units(claim, p, pre)),
                                *(u for p, pre in conds for u in optional_units(claim, p, pre)),
                                *claim.fixed_optional_units]))


def evaluate_claim(claim: Claim, results: Results, protocol: str | None = None, preprocess: str = "raw") -> Outcome:
    """Run the claim's rule (on the units of condition `protocol` x `preprocess` for an empirical claim); a missing
    unit gives "not measurable here" with the reason, and a unit the preset does not run says so in the row
    (`base.not_run`). Optional units are passed to the rule where `results` has them."""
    names = protocol_units(claim, protocol, preprocess)
    skipped = not_run_reason(results, names)
    if skipped:
        return Outcome(f"not measurable here: {skipped}", NA, skipped)
    why = unavailable(results, names)
    if why:
        return Outcome("-", NA, why)
    view = {base: results[full] for base, full in zip(claim.units, names[:len(claim.units)], strict=True)}
    view.update({base: results[full]
                 for base, full in zip(claim.optional_units, optional_units(claim, protocol, preprocess), strict=True)
                 if full in results})
    return claim.evaluate({**results, **view})


def preprocessing_splits(by_condition: dict[str, dict[str, Any]],
                         preprocessings: tuple[str, ...],
                         protocols: Iterable[str] = PROTOCOLS) -> dict[str, dict[str, str]]:
    """Per protocol, the verdict under each preprocessing, for the protocols under which two preprocessings give
    different measured verdicts ("not measurable here" under one of them is not a disagreement: nothing was
    measured there)."""
    out = {}
    for p in protocols:
        per = {pre: by_condition[units.condition(p, pre)]["verdict"] for pre in preprocessings
               if units.condition(p, pre) in by_condition}
        if len({v for v in per.values() if v != NA.value}) > 1:
            out[p] = per
    return out


def schedule_splits(by_condition: dict[str, dict[str, Any]], preprocessings: tuple[str, ...],
                    protocols: Iterable[str] = PROTOCOLS) -> dict[str, dict[str, str]]:
    """Per preprocessing, the verdicts of a protocol and of its schedule-axis variant (`CLAIMS_PROTOCOLS[...].varies`)
    where both were measured and they differ (issue 40 item 3), keyed by the varied protocol and preprocessing."""
    out = {}
    for v in protocols:
        base = claims_protocol(v).varies
        if base is None or base not in protocols:
            continue
        for pre in preprocessings:
            pair = {p: by_condition.get(units.condition(p, pre), {}).get("verdict") for p in (base, v)}
            measured = {x for x in pair.values() if x is not None and x != NA.value}
            if len(measured) > 1:
                out[units.condition(base, pre)] = {claims_protocol(p).label: x for p, x in pair.items()}
    return out


def claim_row(claim: Claim, results: Results, preprocessings: Iterable[str] = ("raw",),
              protocols: Iterable[str] = PROTOCOLS) -> dict[str, Any]:
    """One row of the claims table. An empirical claim carries one outcome per condition (protocol x
    preprocessing) under `by_condition` (keyed by `units.condition`) and, for raw pixels, per protocol under
    `by_protocol`. Its headline `verdict` is the properly-trained raw-pixel one, except that when two
    preprocessings give different measured verdicts under proper training the headline is "underdetermined"
    (preprocessing), naming both (`preprocessing_split` lists such splits per protocol); `robust` says whether
    every condition gives the same verdict and none is "not measurable here" (never with a single condition: nothing
    was compared). `protocols`: the preset's claims
    protocols (the headline is the last, proper training, where it is judged)."""
    pres, protos = tuple(preprocessings), tuple(protocols)
    row: dict[str, Any] = {"id": claim.id, "group": claim.group, "source": claim.source,
                           "statement": claim.statement, "paper": claim.paper, "v2": claim.v2, "rule": claim.rule,
                           "empirical": claim.empirical}
    if not claim.empirical:
        o = evaluate_claim(claim, results)
        return {**row, **_outcome_dict(o)}
    by_condition = {units.condition(p, pre): _outcome_dict(evaluate_claim(claim, results, p, pre))
                    for p, pre in conditions(pres, protos)}
    per = {p: by_condition[units.condition(p, pres[0])] for p in protos}
    main = [p for p in protos if claims_protocol(p).varies is None]
    lead = main[-1] if main else protos[-1]
    head = per[lead]
    splits = preprocessing_splits(by_condition, pres, protos)
    by_schedule = schedule_splits(by_condition, pres, protos)
    if lead in splits:
        named = "; ".join(f"{pre}: {v}" for pre, v in splits[lead].items())
        head = {**head, "verdict": UNDERDETERMINED.value, "label": f"{UNDERDETERMINED.value} (preprocessing)",
                "partly_as": None, "ours": f"underdetermined (preprocessing), under {lead} training: {named}",
                "condition": "the measured verdicts differ between input preprocessings"}
    elif units.condition(lead, pres[0]) in by_schedule:
        named = "; ".join(f"{label}: {v}" for label, v in by_schedule[units.condition(lead, pres[0])].items())
        head = {**head, "verdict": UNDERDETERMINED.value, "label": f"{UNDERDETERMINED.value} (schedule)",
                "partly_as": None, "ours": f"underdetermined (schedule), lr exponent 1/2 against 1/4: {named}",
                "condition": "the measured verdicts differ between the learning-rate schedules (the exponent of the "
                             "rate's decrease with width)"}
    verdicts = {o["verdict"] for o in by_condition.values()}
    return {**row, **head, "by_protocol": per, "by_condition": by_condition, "preprocessing_split": splits,
            "schedule_split": by_schedule,
            "robust": len(by_condition) > 1 and len(verdicts) == 1 and Verdict.NA.value not in verdicts}


def _outcome_dict(o: Outcome) -> dict[str, Any]:
    return {"ours": o.ours, "verdict": Verdict(o.verdict).value, "protocol": o.protocol, "numbers": o.numbers,
            "seeds": o.seeds, "gate": o.gate, "condition": o.condition,
            "partly_as": PartlyAs(o.partly_as).value if o.partly_as and Verdict(o.verdict) is Verdict.PARTLY else None,
            "label": o.label, "tests": o.tests}
