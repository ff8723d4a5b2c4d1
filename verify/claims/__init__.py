"""The claims registry: one entry per claim of the paper (docs/PAPER.md), each with its verdict rule.

One module per claim group (`theory`, `kappa`, `ntk`, `malleability`, `landscape`, `variants`); shared types in
`base`. Every entry states the paper's value, the protocol we run and the rule that turns our
measurement into a verdict, written before any run. Empirical claims are judged under both training
protocols (`base.PROTOCOLS`) and the table shows both verdicts; nothing in the "ours" column is
copied from the paper.
"""

from __future__ import annotations

from typing import Any

from verify.claims import units
from verify.claims.base import NA, PROTOCOLS, VERDICTS, Claim, Outcome, Results, Verdict, unavailable

__all__ = ["PROTOCOLS", "VERDICTS", "Claim", "Outcome", "Verdict", "all_claims", "evaluate_claim", "claim_row"]


def all_claims() -> list[Claim]:
    from verify.claims.influence import INFLUENCE_CLAIMS
    from verify.claims.kappa import KAPPA_CLAIMS
    from verify.claims.landscape import LANDSCAPE_CLAIMS
    from verify.claims.malleability import MALLEABILITY_CLAIMS
    from verify.claims.ntk import NTK_CLAIMS
    from verify.claims.theory import THEORY_CLAIMS
    from verify.claims.variants import VARIANT_CLAIMS

    return (THEORY_CLAIMS + KAPPA_CLAIMS + NTK_CLAIMS + MALLEABILITY_CLAIMS + INFLUENCE_CLAIMS + LANDSCAPE_CLAIMS
            + VARIANT_CLAIMS)


def protocol_units(claim: Claim, protocol: str | None) -> tuple[str, ...]:
    """The unit names a claim needs under `protocol` (empirical claims) or as written."""
    return tuple(units.at(u, protocol) for u in claim.units) if claim.empirical and protocol else claim.units


def evaluate_claim(claim: Claim, results: Results, protocol: str | None = None) -> Outcome:
    """Run the claim's rule (on `protocol`'s units for an empirical claim); a missing unit gives
    "not measurable here" with the reason."""
    names = protocol_units(claim, protocol)
    why = unavailable(results, names)
    if why:
        return Outcome("-", NA, why)
    view = {base: results[full] for base, full in zip(claim.units, names, strict=True)}
    return claim.evaluate({**results, **view})


def claim_row(claim: Claim, results: Results) -> dict[str, Any]:
    """One row of the claims table. An empirical claim carries one outcome per protocol under
    `by_protocol`; its headline `verdict` is the properly-trained one, and `robust` says whether the
    two protocols agree."""
    row: dict[str, Any] = {"id": claim.id, "group": claim.group, "source": claim.source,
                           "statement": claim.statement, "paper": claim.paper, "v2": claim.v2, "rule": claim.rule,
                           "empirical": claim.empirical}
    if not claim.empirical:
        o = evaluate_claim(claim, results)
        return {**row, **_outcome_dict(o)}
    per = {p: _outcome_dict(evaluate_claim(claim, results, p)) for p in PROTOCOLS}
    head = per[PROTOCOLS[-1]]
    verdicts = {per[p]["verdict"] for p in PROTOCOLS}
    return {**row, **head, "by_protocol": per,
            "robust": len(verdicts) == 1 and Verdict.NA.value not in verdicts}


def _outcome_dict(o: Outcome) -> dict[str, Any]:
    return {"ours": o.ours, "verdict": Verdict(o.verdict).value, "protocol": o.protocol, "numbers": o.numbers,
            "seeds": o.seeds, "gate": o.gate, "condition": o.condition}
