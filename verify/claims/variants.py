"""Beyond the paper: named variants of the paper's model, judged by the paper's own rules.

`centred`: MLP-Attn with a mean-removed attention context, `x~ = normalise(C_c (x - mu))` (`--centre`).
The paper's uncentred `C x` is dominated by the mean image (mean pairwise cosine of MLP-Attn's MNIST
features about 0.99), so its features nearly align; the variant asks how much of the paper's NTK and
malleability results that alignment explains. The variant never replaces the paper's model: its rows
sit in their own group, and 2L-ReLU (which has no context) is trained exactly as in the paper-model
units, so the contrast isolates the centring.
"""

from __future__ import annotations

from typing import Any

from verify.claims.base import Claim, Results
from verify.claims.malleability import FLIP_RULE, flip_outcome
from verify.claims.ntk import NTK_RULE, ntk_claim
from verify.presets import n_train_for

CENTRED_DISTANCE = "ntk-distance:mnist:centred"
CENTRED_FLIP = "malleability:mnist:centred"
VARIANT_NOTE = "variant, not the paper's model: MLP-Attn with its attention context and queries centred"


def variant_unit_configs(p: dict[str, Any], data_dir: str | None) -> dict[str, tuple[str, dict[str, Any]]]:
    """(experiment kind, config keyword arguments) of every variant unit, sized by the preset (the training
    config is added per protocol by `verify.experiments`)."""
    distance = {"dataset": "mnist", "widths": list(p["widths"]), "seeds": list(p["seeds"]),
                "n_train": n_train_for(p, "mnist"), "n_test": p["n_test"], "data_dir": data_dir, "attn_centre": True}
    flip = {"dataset": "mnist", "task": "10class", "width": p["mall_width"], "n_test": p["mall_n_test"],
            "n_train": n_train_for(p, "mnist", "mall_n_train"), "seeds": list(p["seeds"]),
            "attack_steps": p["attack_steps"], "eps": 0.3, "tau": 0.1, "attacks": ["fgsm", "pgd", "mim"],
            "interventions": ["transformed"], "data_dir": data_dir, "attn_centre": True}
    return {CENTRED_DISTANCE: ("distance", distance), CENTRED_FLIP: ("malleability", flip)}


def _centred_flip(results: Results) -> Any:
    return flip_outcome(results[CENTRED_FLIP], "mnist", "10class")


VARIANT_CLAIMS = [
    Claim("ntk-attn-centred-mnist", "Variant of Table (NTK distance)",
          "MLP-Attn with a centred context on MNIST: NTK distance rises with width (the paper's claim for its "
          "uncentred model, asked of the variant)",
          paper=f"not in the paper ({VARIANT_NOTE}); the paper's model: 10.3 (m=16), 33.3 (1024), 43.4 (4096)",
          rule=NTK_RULE, units=(CENTRED_DISTANCE,), evaluate=ntk_claim("mnist", "attn", "rises", CENTRED_DISTANCE),
          group="variants", empirical=True),
    Claim("flip-centred-mnist", "Variant of Table (flip rate, 10 classes)",
          "MNIST: MLP-Attn with a centred context flips influence signs far more often than 2L-ReLU",
          paper=f"not in the paper ({VARIANT_NOTE}); the paper's model: see flip-mnist", rule=FLIP_RULE,
          units=(CENTRED_FLIP,), evaluate=_centred_flip, group="variants", empirical=True),
]
