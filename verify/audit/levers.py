"""The levers (step 6 of `verify.audit.pipeline`): the top training points by |influence| of the lead estimator,
with the attacks that flipped them, where they lie by class (beyond chance or not), and the lead estimator's full
training x test attributions for `--attributions`."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from verify.audit.config import AuditConfig
from verify.audit.measure import NetworkContext
from verify.audit.modelio import Split
from verify.multiplicity import ALPHA, holm


def _class_name(split: Split, label: int) -> str:
    return split.classes[label] if split.classes and label < len(split.classes) else str(label)


def levers(user: dict[str, Any], split: Split, cfg: AuditConfig) -> list[dict[str, Any]]:
    """The top-k training points by |influence| of the estimator the flip rates rank by, with the attacks that flipped
    their sign, and their NTK leave-one-out and Gauss-Newton influence beside it."""
    total = np.asarray(user["estimator_total"])
    ntk = np.asarray(user["influence_total"])
    gn = np.asarray(user["gn_total"])
    sel = list(user["selected"])
    order = sorted(sel, key=lambda i: (-abs(total[i]), i))[: cfg.top_k]
    out = []
    for i in order:
        pos = sel.index(i)
        flipped = [a for a in cfg.attacks if user["attacks"][a]["examples"][pos]["flipped"]]
        after = {a: user["attacks"][a]["examples"][pos]["new"] for a in cfg.attacks}
        worst = user["worst_attack"]
        out.append({"index": int(i), "label": int(split.y[i]), "class": _class_name(split, int(split.y[i])),
                    "influence": float(total[i]), "ntk_influence": float(ntk[i]), "gn_influence": float(gn[i]),
                    "role": "helpful" if total[i] > 0 else "harmful", "flipped_by": flipped,
                    "influence_after": after,
                    "pixels": split.x[i].round(4).tolist(),
                    "perturbed_pixels": np.asarray(user["adversarial_pixels"][worst][pos]).round(4).tolist()})
    return out


def lever_classes(user: dict[str, Any], split: Split) -> list[dict[str, Any]]:
    """Where the levers lie (issue 43 item 7): for each class, how many of the top-k training points by |influence|
    of the lead estimator (`user["selected"]`) belong to it, helpful and harmful, beside its share of the training
    set; `over` is the ratio of the two shares (above 1: the class holds more of the levers than of the data), `p`
    the exact binomial test of its count against its share of the data (scipy), Holm-adjusted across the classes
    (`p_holm`, `beyond_chance` at 0.05): with few levers a ratio of 2 is often chance."""
    y = np.asarray(split.y)
    total = np.asarray(user["estimator_total"])
    sel = np.asarray(user["selected"], dtype=int)
    rows = []
    for c in np.unique(y):
        mine = sel[y[sel] == c]
        share, base = len(mine) / max(len(sel), 1), float(np.mean(y == c))
        rows.append({"label": int(c), "class": _class_name(split, int(c)), "levers": int(len(mine)),
                     "helpful": int((total[mine] > 0).sum()),
                     "harmful": int((total[mine] <= 0).sum()), "share_of_levers": share, "share_of_training": base,
                     "over": share / base if base > 0 else float("nan"),
                     "p": float(stats.binomtest(len(mine), len(sel), base).pvalue) if len(sel) else 1.0})
    for r, adj in zip(rows, holm([r["p"] for r in rows]), strict=True):
        r["p_holm"] = adj
        r["beyond_chance"] = bool(adj <= ALPHA)
    return sorted(rows, key=lambda r: (-r["levers"], r["label"]))


def attributions(user: dict[str, Any], ctx: NetworkContext, train: Split, test: Split) -> dict[str, Any]:
    """The lead estimator's influence of every training point on every test point's loss (training x test; positive:
    the point helps, removing it raises that loss), for `--attributions` (`verify.audit.files.write_outputs` saves it
    as .npz, the JSON record keeps only what it is)."""
    per = np.asarray(ctx.clean.per_test, dtype=np.float64)
    return {"estimator": ctx.estimator, "shape": list(per.shape), "influence": per,
            "train_labels": np.asarray(train.y), "test_labels": np.asarray(test.y),
            "levers": np.asarray(user["selected"], dtype=np.int64)}
