"""Theorem claims (Thm 4.1, 4.2, 4.7, Prop 4.5, stacking, truncation, LOO): verdicts of `theory.checks`."""

from __future__ import annotations

import math
from collections.abc import Callable

from reports.text import fmt
from theory.checks import CheckResult
from verify.claims import units
from verify.claims.base import NA, NOT, RECORD_PARTLY_AS, Claim, Outcome, Results, verdict_of
from verify.records import TheoryRecord

# ---- theory (Thm 4.1, 4.2, 4.7, Prop 4.5, stacking, truncation, LOO) ---------------------------



def _check(results: Results, check_id: str) -> CheckResult | None:
    record: TheoryRecord = results[units.THEORY]
    return record.check(check_id)


def _theory(check_id: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        c = _check(results, check_id)
        if c is None:
            return Outcome("-", NA, "theory check missing")
        return Outcome(f"{c.verdict}: {c.detail}", verdict_of(c.verdict), c.method, c.numbers,
                       condition=f"theory.checks verdict '{c.verdict}' ({THEORY_MAP_TEXT})",
                       partly_as=RECORD_PARTLY_AS.get(c.verdict))

    return evaluate


THEORY_MAP_TEXT = "holds -> holds; holds (corrected), ill-posed -> partly; does not hold as stated -> does not hold"


def evaluate_prop45(results: Results) -> Outcome:
    """Prop 4.5: "does not hold" when a perturbation exceeds the stated bound read as ||G e_j||_1 eps;
    the corrected bound, verified by `theory.checks.check_prop45`, is reported beside it."""
    c = _check(results, "prop4.5")
    if c is None:
        return Outcome("-", NA, "theory check missing")
    nums = c.numbers
    factor = nums.get("stated_reading_exceeded_by")
    if factor is None:
        return Outcome(f"{c.verdict}: {c.detail}", NA, c.method, nums,
                       condition="the check recorded no ratio to the stated bound")
    verdict = NOT if factor > 1 + 1e-9 else verdict_of(c.verdict)
    under = nums.get("paper_quantity_underestimate_factor") or [factor]
    stated = (f"stated bound ||G e_j||_1 eps exceeded {fmt(min(under))}-{fmt(max(under))}x by delta = eps*1"
              if verdict == NOT else f"stated bound ||G e_j||_1 eps not exceeded (largest ratio {fmt(factor)})")
    attained = nums.get("attained_ratio") or [math.nan]
    corrected = (f"corrected bound {nums.get('corrected_bound', '?')}: "
                 f"{'verified' if nums.get('corrected_bound_holds') else 'FAILS'} (ratio at most "
                 f"{fmt(max(nums.get('max_ratio_random_delta', 0.0), nums.get('max_ratio_signed_data', 0.0)))} "
                 f"over random deltas, {fmt(min(attained), 4)} for delta = eps*1 on pixel data)")
    return Outcome(f"{stated}; {corrected}", verdict, c.method, nums,
                   condition=f"does not hold iff max change / (||G e_j||_1 eps) > 1: {fmt(factor)}",
                   partly_as=RECORD_PARTLY_AS.get(c.verdict))


THEORY_RULE = ("holds if the exact (sympy / mpmath) and randomized (float64, hypothesis-style) checks agree "
               "with the statement as written; partly if only a corrected or restricted form holds; does not "
               "hold if a counterexample to every reading is found")

PROP45_RULE = ("does not hold if some perturbation with ||delta||_inf <= eps changes the other points' attention "
               "outputs by more than the stated bound read as ||G e_j||_1 eps (the only reading with matching "
               "dimensions); otherwise partly (G x_j is undefined as written) or holds; the corrected bound, "
               "checked against random and worst-case deltas, is reported beside it")

THEORY_CLAIMS = [
    Claim("thm4.1", "Thm 4.1", "Linearized attention induces K = G^3 (transitive similarity i->k->l->j)",
          paper="K(x_i,x_j) = sum_kl (x_i.x_k)(x_k.x_l)(x_l.x_j) = G^3", rule=THEORY_RULE, units=(units.THEORY,),
          evaluate=_theory("thm4.1")),
    Claim("thm4.2", "Thm 4.2", "NTK of MLP-Attn is E[relu'(w.x~)relu'(w.x~')] <x~,x~'> (only W trained)",
          paper="Theta = <x~,x~'> (pi - angle)/(2 pi); finite-width kernel converges to it",
          rule=THEORY_RULE + "; convergence: error falls like m^-1/2 (fitted slope in [-0.7, -0.3])",
          units=(units.THEORY,), evaluate=_theory("thm4.2")),
    Claim("thm4.7-kappa", "Thm 4.7", "Spectral amplification kappa(G^3) = kappa(G)^3",
          paper="kappa(G^3) = kappa(G)^3", rule=THEORY_RULE, units=(units.THEORY,), evaluate=_theory("thm4.7-kappa")),
    Claim("thm4.7-width", "Thm 4.7", "NTK regime needs m = Omega(kappa^6/eps^2): m >> 1e18 (MNIST), 1e24 (CIFAR)",
          paper="m >> 1e18 (kappa 1.2e3), m >> 1e24 (kappa 8.7e3)",
          v2="m = Omega(kappa_d^6 n log n): >> 1e24 (MNIST), >> 1e29 (CIFAR-10)",
          rule="holds if the stated magnitudes follow from the formula with the paper's kappa and eps <= 1 "
               "alone; partly if they need an unstated eps < 1; does not hold otherwise",
          units=(units.THEORY,), evaluate=_theory("thm4.7-width")),
    Claim("prop4.5", "Prop 4.5",
          "Perturbing one input by ||delta||_inf <= eps changes the kernel by <= ||G x_j||_1 eps",
          paper="bound ||G x_j||_1 * eps, growing with the data set", rule=PROP45_RULE, units=(units.THEORY,),
          evaluate=evaluate_prop45),
    Claim("stacking", "Sec. 4 (stacking)", "k linearized attention layers give G^(2k+1), kappa^(2k+1)",
          paper="G^(2k+1)", rule=THEORY_RULE, units=(units.THEORY,), evaluate=_theory("stacking")),
    Claim("truncation", "Sec. 4 (truncation)", "Top-r truncation of X shrinks kappa and restores convergence",
          paper="truncation lowers kappa", rule=THEORY_RULE, units=(units.THEORY,), evaluate=_theory("truncation")),
    Claim("loo", "Method (Zhang & Zhang 2022)", "Closed-form NTK leave-one-out equals refitting without the point",
          paper="used for all influence numbers", rule=THEORY_RULE, units=(units.THEORY,), evaluate=_theory("loo")),
]


