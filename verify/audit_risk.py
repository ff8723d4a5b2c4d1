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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from empirics.protocols import GATE_TEXT
from reports.text import eps_label
from theory.paper import PAPER_AUDIT_REFERENCE

RISK_LEVELS = ("low", "medium", "high")
NOT_MEASURABLE = "not measurable"


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
    left_out = [name for name, v in (("2L-ReLU", relu_flip), ("MLP-Attn", attn_flip)) if v is None]
    return {"level": level, "reason": reason, "flip_rate": flip, "noise_ceiling": noise, "low_ceiling": low_ceiling,
            "high_floor": high_floor, "relu_reference": math.nan if relu_flip is None else relu_flip,
            "attn_reference": math.nan if attn_flip is None else attn_flip, "left_out": left_out,
            "references_separate": bool(attn_flip is not None and attn_flip > low_ceiling),
            "rule": "low if F <= max(N, R); high if F >= max(A, N, R); medium otherwise (F: worst-case flip "
                    "rate over the attacks; N: random-noise mean + 2 std; R, A: 2L-ReLU and MLP-Attn worst-case "
                    "flip rates; a reference below the adequacy gate is left out: without R the low ceiling is N, "
                    "without A there is no high)"}


ADVICE = {
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


def assess_risk(models: dict[str, Any], trained: bool, eps: float) -> dict[str, Any]:
    """The record's risk entry for the measured `models` (`user`, and `relu` / `attn` when `trained`): the level by
    `risk_level`, where the reference scale came from, the advice and the adequacy gate's text.

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
        if abs(eps - 0.3) > 1e-9:
            risk["references"] += (f"; the paper measured them at eps 0.3, not at the eps {eps_label(eps)} "
                                   "used here")
    risk["advice"] = ADVICE[risk["level"]]
    risk["gate"] = GATE_TEXT
    return risk
