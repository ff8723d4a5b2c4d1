"""The risk level of `verify audit` (`risk_level`), the texts that go with it, and the record's risk entry
(`assess_risk`: which references set the scale, the advice).

Risk rule (fixed before any measurement; `risk_level`): let F be the model's worst-case flip rate
(maximum over the attacks run), B the random-noise flip rates over seeds, R and A the worst-case
flip rates of the 2L-ReLU and MLP-Attn references (without references: R = 5 %, A = 20 %, rounded
from the paper's reported 3-4 % and 19-35 % for 10 classes at eps = 0.3).

    noise ceiling  N = mean(B) + 2 std(B)
    low            F <= max(N, R)       indistinguishable from random noise, or no more malleable
                                        than the kernel-regime 2L-ReLU reference
    high           F >= max(A, N, R)    as malleable as the MLP-Attn reference (and above noise)
    medium         otherwise

That level is issued only when it can be trusted (`assess_risk`, rules fixed before any measurement):

- **not measurable** when a flip rate is NaN, or when the user's model fails `MODEL_GATE_RULE` (no better than
  chance on `--test`): the influence of a model that has learnt nothing says nothing about its training data;
- **not validated** when the validity panel did not run (`--skip validity`) or its verdict is not trustworthy
  (`verify.audit.validity`: the lead estimator, the one of the audit's own that validates best and that the flip
  rates rank by, must reach `FRACTION_MIN` of the noise ceiling of the re-fits, and removing its top levers must beat
  random removal), or when it is trustworthy on a knife-edge (`verify.audit.verdict_stability`: a rerun of its
  scoring or a resample of its subsets reads otherwise; added 2026-12-06 after a run, logged there); the record keeps
  the level the scale would give as `unvalidated_level`, the best LDS reached and what would help.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from empirics.intervals import wilson
from empirics.nets.protocols import GATE_TEST, GATE_TEXT, chance_accuracy
from empirics.vocab import NOT_MEASURABLE, PAPER_PAIR, model_name
from reports.text import eps_label
from theory.paper import PAPER_AUDIT_REFERENCE
from verify.audit.estimators import PAPER_ESTIMATOR
from verify.audit.validity import (
    FRACTION_MIN,
    ODDS_SHARES,
    TRUSTWORTHY,
    estimator_label,
    gpu_hint,
    level_note,
)

RISK_LEVELS = ("low", "medium", "high")
NOT_VALIDATED = "not validated"
#: The levels `verify audit` can issue: a risk level, or why none could be issued.
ALL_LEVELS = (*RISK_LEVELS, NOT_VALIDATED, NOT_MEASURABLE)
MODEL_GATE_RULE = (f"your model must beat chance on --test: test accuracy >= chance + {GATE_TEST:g}(1 - chance) and "
                   "the lower end of its 95 % Wilson interval above chance, where chance is the larger of 1 / classes "
                   "(1/2 for one output) and the share of the most frequent test label")


def risk_level(flip: float, baseline: list[float], relu_flip: float | None, attn_flip: float | None) -> dict[str, Any]:
    """low / medium / high from the worst-case flip rate (the rule in the module docstring).

    A reference given as None did not pass the adequacy gate and is left out of the scale: without R the
    low ceiling is the noise ceiling alone; without A there is no "high" (the top of the scale is unknown).
    """
    b = np.asarray(baseline, dtype=float)
    noise = float(b.mean() + 2 * (b.std(ddof=1) if b.size > 1 else 0.0)) if b.size else math.nan
    r_eff = 0.0 if relu_flip is None else relu_flip
    low_ceiling = max(noise, r_eff)
    high_floor = math.inf if attn_flip is None else max(attn_flip, low_ceiling)
    level = "low" if flip <= low_ceiling else "high" if flip >= high_floor else "medium"
    reason = ""
    if not all(math.isfinite(v) for v in (flip, noise, r_eff)) or (attn_flip is not None
                                                                   and not math.isfinite(attn_flip)):
        level = NOT_MEASURABLE
        reason = ("a flip rate could not be computed (NaN): influence is undefined for these data, e.g. constant "
                  "or duplicated inputs or a kernel without signal")
    left_out = [model_name(kind) for kind, v in zip(PAPER_PAIR.paper_order, (relu_flip, attn_flip), strict=True)
                if v is None]
    return {"level": level, "reason": reason, "flip_rate": flip, "noise_ceiling": noise, "low_ceiling": low_ceiling,
            "high_floor": high_floor, "relu_reference": math.nan if relu_flip is None else relu_flip,
            "attn_reference": math.nan if attn_flip is None else attn_flip, "left_out": left_out,
            "references_separate": bool(attn_flip is not None and attn_flip > low_ceiling),
            "rule": "low if F <= max(N, R); high if F >= max(A, N, R); medium otherwise (F: worst-case flip "
                    "rate over the attacks; N: random-noise mean + 2 std; R, A: 2L-ReLU and MLP-Attn worst-case "
                    "flip rates; a reference below the adequacy gate is left out: without R the low ceiling is N, "
                    "without A there is no high)"}


def model_gate(test_acc: float, y_test: np.ndarray, out_dim: int) -> dict[str, Any]:
    """Whether the user's model beats chance on the test points (`MODEL_GATE_RULE`)."""
    n = int(len(y_test))
    classes = max(out_dim, 2)
    shares = np.bincount(np.asarray(y_test, dtype=np.int64), minlength=classes) / max(n, 1)
    chance = max(chance_accuracy(out_dim, classes), float(shares.max()) if n else 0.0)
    need = chance + GATE_TEST * (1 - chance)
    lo, hi = wilson(test_acc, n)
    why = ""
    if not test_acc >= need:
        why = (f"your model's test accuracy {test_acc:.3f} on {n} test points is below {need:.3f} (chance {chance:.3f} "
               f"+ {GATE_TEST:g}(1 - chance)): it has not learnt the task")
    elif not lo > chance:
        why = (f"your model's test accuracy {test_acc:.3f} is not significantly above chance {chance:.3f} (95 % "
               f"Wilson interval [{lo:.3f}, {hi:.3f}] on {n} test points)")
    return {"passed": not why, "reason": why or "passed", "test_acc": float(test_acc), "test_acc_lo": lo,
            "test_acc_hi": hi, "chance": chance, "need": need, "n_test": n, "rule": MODEL_GATE_RULE}


def _not_validated(validity: dict[str, Any] | None) -> str:
    """Why the risk level cannot be issued, with the best LDS reached and what would help (empty when validated)."""
    if validity is None:
        return "the validity panel was not run (--skip validity), so the influence behind the flip rates is unchecked"
    stability = validity.get("stability") or {}
    if validity.get("verdict") == TRUSTWORTHY and stability.get("stable", True):
        return ""
    if validity.get("verdict") == TRUSTWORTHY:
        return (f"the influence behind the flip rates ({estimator_label(validity.get('lead', PAPER_ESTIMATOR))}) is "
                f"trustworthy against re-fits only on a knife-edge ({stability.get('detail', stability.get('text'))}):"
                " a verdict a single draw decides is not announced")
    lead = estimator_label(validity.get("lead", PAPER_ESTIMATOR))
    why = f"the influence behind the flip rates ({lead}) is {validity.get('verdict', 'unchecked')} against re-fits"
    scores = validity.get("lds") or {}
    if not scores:
        return f"{why} ({validity.get('reason', '')})"
    best = validity.get("best") or max(scores, key=lambda k: scores[k]["value"])
    s, c = scores[best], validity.get("ceiling", {})
    who = "it" if best == validity.get("lead", "ntk") else f"the best estimator, {estimator_label(best)},"
    why += f"; {who} reached LDS {s['value']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}]"
    if not math.isfinite(s.get("fraction", math.nan)):
        return (f"{why}, which cannot be set against the noise ceiling {c.get('value', math.nan):.2f}: "
                f"{validity.get('reason', 'the re-fits give no ground truth')}")
    return (f"{why}, {s['fraction']:.2f} [{s.get('fraction_lo', math.nan):.2f}, {s.get('fraction_hi', math.nan):.2f}]"
            f"{level_note(s.get('fraction_level'))} of the noise ceiling {c.get('value', math.nan):.2f} (bar: the "
            f"lower end at least {FRACTION_MIN:g})")


VALIDATION_HELP = ("What would help: more subsets (--lds-subsets) and repeats (--lds-repeats) narrow the intervals "
                   "and raise the ceiling; a from-scratch re-fit with your own recipe (--train-fn) measures what "
                   "retraining does, where a warm start keeps part of what the model learnt from the points left out; "
                   "where the control re-fit was not adequate because the warm start improved the model, a model "
                   "trained closer to convergence (or fewer --refit-epochs, a lower --refit-lr) keeps the re-fits "
                   "about the model you saved.")


ADVICE = {
    NOT_VALIDATED: [
        "No risk level is issued: the influence that the flip rates rank did not predict what re-fitting your model "
        "does well enough (see the validity panel), so a flip rate would describe that estimator's ranking, not "
        "your model.",
        VALIDATION_HELP,
    ],
    NOT_MEASURABLE: [
        "No risk level can be given for these data: check that the training inputs vary (not all-zero or constant "
        "images, not one example repeated) and that the model's outputs depend on them, then re-run the audit.",
    ],
    "low": [
        "No action is needed beyond ordinary data hygiene: the influence ranking of your training data is no "
        "easier to flip than random noise of the same size can, or than the kernel-regime 2L-ReLU reference.",
        "Re-run the audit after retraining, after changing the architecture, or when new training data arrives.",
    ],
    "medium": [
        "Review the lever examples below: check their provenance and labels; they are where an altered example "
        "would move the model's reliance most.",
        "Protect the training pipeline where it is cheapest: checksums on data files, restricted write access, "
        "deduplication and label audits for the examples with the largest influence.",
        "Re-audit with a larger --n and more --baseline-seeds before drawing firm conclusions.",
    ],
    "high": [
        "Treat the training data as an attack surface: a few altered examples can reorder which examples the "
        "model relies on, about as easily as for the paper's MLP-Attn reference.",
        "Verify the provenance of the lever examples first, and screen new training data (influence-based "
        "filtering, duplicate and outlier checks) before retraining.",
        "Compare with an architecture closer to the kernel regime (no linearized attention, wider layers): the "
        "paper ties malleability to attention's ill-conditioned Gram kernel (kappa^3).",
        "Do not assume adversarial training fixes this: the paper reports that it raises flip rates, while this "
        "suite's own runs (verify claims) saw it lower them slightly at small scale; re-audit after any change.",
    ],
}


def next_step(level: str, gate: dict[str, Any] | None, validity: dict[str, Any] | None) -> str:
    """The one thing to do next, where the record says why no level was issued (issue 43 item 7): the model has not
    learnt (below the accuracy gate), the re-fits do not reproduce it, or the validity panel ran out of subsets
    before its interval cleared the bar (with the subsets that would settle it); '' otherwise."""
    if level == NOT_MEASURABLE and gate is not None and not gate.get("passed", True):
        return (f"The model has not learnt ({gate.get('reason', 'below the accuracy gate')}): train it further and "
                "audit it again; influence of a model that has not learnt describes nothing it relies on.")
    if level != NOT_VALIDATED or not validity:
        return ""
    control = (validity.get("control") or {})
    if control and not control.get("passed", True):
        return ("Pass your training recipe with --train-fn: the warm-start re-fits do not reproduce the model you "
                f"saved ({control.get('reason', 'the control re-fit is not adequate')}).")
    adaptive = validity.get("adaptive") or {}
    key, why = (("to_stabilise", "the validity verdict is trustworthy only on a knife-edge, and that many subsets "
                 "would make it stable") if validity.get("verdict") == TRUSTWORTHY else
                ("to_settle", "the validity interval straddles the bar, and that many subsets would settle it"))
    more = adaptive.get(key) or {}
    most = next((o for o in more.get("odds") or [] if o.get("share") == ODDS_SHARES[-1]), None)
    if key == "to_settle" and most is not None:
        held = f"; at the point estimate alone {more['subsets']}" if more.get("subsets") else ""
        return (f"Rerun with --lds-max-subsets {most['subsets']} (up to {most['extra_refits']} more re-fits, about "
                f"{most['seconds'] / 60:.0f} min on this machine{gpu_hint(adaptive)}): the validity interval straddles "
                f"the bar, and 4 in 5 of the true fractions it allows would be settled by then (the panel stops as "
                f"soon as its interval leaves the bar{held}).")
    if more.get("subsets"):
        return (f"Rerun with --lds-max-subsets {more['subsets']} ({more['extra_refits']} more re-fits, about "
                f"{more['seconds'] / 60:.0f} min on this machine{gpu_hint(adaptive)}): {why}.")
    return ""


def assess_risk(models: dict[str, Any], trained: bool, eps: float, gate: dict[str, Any] | None = None,
                validity: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record's risk entry for the measured `models` (`user`, and `relu` / `attn` when `trained`): the level by
    `risk_level`, issued only when the user's model passes `gate` (`model_gate`; None: not checked) and `validity`
    (the validity panel; None: not run) is trustworthy (the module docstring), where the reference scale came from,
    the advice and the adequacy gate's text.

    A reference trained here sets its flip rate unless it failed the adequacy gate (then it is left out); without
    trained references the paper-reported rates (`theory.paper.PAPER_AUDIT_REFERENCE`) are the scale.
    """
    user = models["user"]
    ref_flip: dict[str, float | None] = {}
    for k in ("relu", "attn"):
        if k not in models:
            ref_flip[k] = PAPER_AUDIT_REFERENCE[k]
        else:
            ref_flip[k] = models[k]["worst_flip_rate"] if models[k]["gate"]["passed"] else None
    risk = risk_level(user["worst_flip_rate"], user["baseline"]["flip_rates"], ref_flip["relu"], ref_flip["attn"])
    if trained:
        risk["references"] = "trained on this data with the width-consistent protocol"
        if risk["left_out"]:
            risk["references"] += (f"; {' and '.join(risk['left_out'])} did not pass the adequacy gate and "
                                   f"{'is' if len(risk['left_out']) == 1 else 'are'} left out of the scale")
    else:
        risk["references"] = "paper-reported values (no references trained)"
        if user.get("estimator", PAPER_ESTIMATOR) != PAPER_ESTIMATOR:
            risk["references"] += (f"; the paper ranked by NTK leave-one-out influence, your model's flip rates by "
                                   f"{estimator_label(user['estimator'])}")
        if abs(eps - 0.3) > 1e-9:
            risk["references"] += (f"; the paper measured them at eps 0.3, not at the eps {eps_label(eps)} "
                                   "used here")
    risk["unvalidated_level"] = risk["level"]
    risk["model_gate"] = gate
    if risk["level"] != NOT_MEASURABLE and gate is not None and not gate["passed"]:
        risk["level"], risk["reason"] = NOT_MEASURABLE, gate["reason"]
    elif risk["level"] != NOT_MEASURABLE:
        why = _not_validated(validity)
        if why:
            risk["level"], risk["reason"] = NOT_VALIDATED, why
    risk["validated"] = risk["level"] in RISK_LEVELS
    step = next_step(risk["level"], gate, validity)
    risk["next_step"] = step
    risk["advice"] = ([step] if step else []) + ADVICE[risk["level"]]
    risk["gate"] = GATE_TEXT
    return risk
