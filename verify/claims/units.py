"""The names of the experiment units of `verify claims`, written once.

A unit's name is its key in the results table, the stem of its cache file and what a claim lists in
`Claim.units`; empirical units run once per condition, training protocol x input preprocessing, as
`name@protocol` (raw pixels) or `name@protocol+preprocess` (`at`, `condition`). The claims
modules, `verify.experiments` and the tests build every name with these functions, so a renamed unit
cannot leave a rule reading a name that no longer exists. (`reports.claims_report` spells the few names
its figures need literally: `reports` imports nothing from `verify`.)
"""

from __future__ import annotations

THEORY = "theory"
PREMISE = "premise:thm4.7"
KAPPA_BINARY = "kappa:binary"


def kappa(dataset: str) -> str:
    """kappa(G) against n for one data set."""
    return f"kappa:{dataset}"


def ntk_distance(dataset: str, variant: str | None = None) -> str:
    """The NTK-distance sweep over widths (`variant`: centred, softmax, qkv; None: the paper's models)."""
    return f"ntk-distance:{dataset}" + (f":{variant}" if variant else "")


def malleability(dataset: str, task_or_variant: str) -> str:
    """A flip-rate unit: `task_or_variant` is the task (10class, binary) or a variant's name."""
    return f"malleability:{dataset}:{task_or_variant}"


def malleability_adv(dataset: str) -> str:
    """The adversarial-training flip-rate unit."""
    return f"malleability-adv:{dataset}"


def malleability_eps(dataset: str) -> str:
    """The flip-rate unit with an eps sweep."""
    return f"malleability-eps:{dataset}"


def landscape(dataset: str) -> str:
    """The loss-landscape unit."""
    return f"landscape:{dataset}"


def influence_retrain(model: str) -> str:
    """The leave-one-out retraining check of one network."""
    return f"influence-retrain:{model}"


def flip_retrain(model: str, dataset: str = "mnist", task: str = "10class") -> str:
    """The retrain-based flip study of one network (`empirics.experiments.retrain_flip`) on one data set and task: MNIST
    10 classes keeps its first name, `flip-retrain:MODEL` (and so its cache files), the others are
    `flip-retrain:DATASET:TASK:MODEL`."""
    return f"flip-retrain:{model}" if (dataset, task) == ("mnist", "10class") else \
        f"flip-retrain:{dataset}:{task}:{model}"


def flip_retrain_fixed(model: str = "attn") -> str:
    """The ablation of the retrain-based flip study of MNIST 10 classes: the attention context held fixed (the clean
    full set's) in every retrain (`empirics.experiments.retrain_flip.retrain_model`), one unit per claims condition."""
    return f"flip-retrain-fixed:{model}"


#: The positive control of the retrain-based flip instrument: MLP-Attn under gd-mse on unit-norm MNIST inputs, one
#: fixed condition like `INFLUENCE_CONTROL` (`verify.claims.retrain_flip.FLIP_CONTROL_RULE`).
FLIP_RETRAIN_CONTROL = "flip-retrain-control"


#: The positive control of the influence instrument: one fixed condition (gd-mse on unit-norm inputs), not one per
#: claims condition.
INFLUENCE_CONTROL = "influence-control"


def condition(protocol: str, preprocess: str = "raw") -> str:
    """The name of one claims condition, protocol x input preprocessing: the protocol alone for raw pixels (so the
    names of raw units, their cache files and claims.json stay those of before the axis), `protocol+preprocess`
    otherwise (`proper+channel`)."""
    return protocol if preprocess == "raw" else f"{protocol}+{preprocess}"


def at(name: str, protocol: str, preprocess: str = "raw") -> str:
    """The name of unit `name` trained under claims protocol `protocol` on inputs preprocessed by `preprocess`."""
    return f"{name}@{condition(protocol, preprocess)}"
