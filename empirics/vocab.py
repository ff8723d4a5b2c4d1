"""The suite's vocabularies: one string enum each for the data sets, the models, the attacks and the words of
the landscape experiment's own verdict.

Members compare and hash equal to their values ("mnist", "relu", "pgd"), so records, configs and cache
keys hold the same strings as before; the display names live here once instead of in a map per module.
The tuples below are the values in their fixed order (the order seeds attacks: `empirics.experiments.malleability`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from theory.paper import PAPER_DATASET_LABELS, PAPER_MODEL_NAMES

#: The one word for a measurement that cannot be made here (a landscape verdict, an audit's risk level or validity
#: verdict, a width trend of too few points). The claims' verdict says "not measurable here" (`verify.claims.base`).
NOT_MEASURABLE = "not measurable"


class Dataset(StrEnum):
    """The built-in data sets."""

    MNIST = "mnist"
    CIFAR10 = "cifar10"

    @property
    def label(self) -> str:
        """The name the paper and the report print."""
        return PAPER_DATASET_LABELS[self.value]


class Model(StrEnum):
    """The networks: the paper's two (`relu`, `attn`) and the attention variants beyond it."""

    RELU = "relu"
    ATTN = "attn"
    SOFTMAX = "softmax"
    QKV = "qkv"

    @property
    def short(self) -> str:
        """The short name in rule texts ('ReLU', 'Attn'; the variants by their value)."""
        return {"relu": "ReLU", "attn": "Attn"}.get(self.value, self.value)

    @property
    def paper_name(self) -> str:
        """The paper's name ('2L-ReLU', 'MLP-Attn'; the variants by their value)."""
        return PAPER_MODEL_NAMES.get(self.value, self.value)


class Attack(StrEnum):
    """The perturbations: the paper's three attacks and the random-sign noise baseline of the same eps."""

    FGSM = "fgsm"
    PGD = "pgd"
    MIM = "mim"
    RANDOM = "random"


class LandscapeVerdict(StrEnum):
    """The words of the loss-landscape experiment's own verdict (`empirics.experiments.landscape.landscape_verdict`);
    `verify.claims.base.verdict_of` reads them as claims verdicts."""

    HOLDS = "holds"
    PARTLY = "partly"
    NOT = "does not hold"
    NA = NOT_MEASURABLE


#: The built-in data sets, in report order.
DATASETS: tuple[str, ...] = tuple(d.value for d in Dataset)


class ModelPair(NamedTuple):
    """Two model kinds compared as (treated, control): a flip-rate ratio is treated / control. A tuple, so it
    unpacks and compares as one."""

    treated: str
    control: str

    @property
    def paper_order(self) -> tuple[str, str]:
        """The two as the paper's tables list them, control first (2L-ReLU, then MLP-Attn)."""
        return (self.control, self.treated)


#: The paper's comparison: MLP-Attn (treated) against 2L-ReLU (control). The one name of the paper's two networks:
#: code that needs them reads them here (a variant is compared as (variant, control)), never by writing their names.
PAPER_PAIR = ModelPair(Model.ATTN.value, Model.RELU.value)
#: Every model kind a network may be built as.
MODEL_KINDS: tuple[str, ...] = tuple(m.value for m in Model)
#: Every perturbation an `AttackConfig` may name (the paper's attacks, then the noise baseline).
ATTACKS: tuple[str, ...] = tuple(a.value for a in Attack)
#: The paper's attacks, in the order of its tables (the noise baseline is not among them).
PAPER_ATTACKS: tuple[str, ...] = (Attack.FGSM.value, Attack.PGD.value, Attack.MIM.value)


def dataset_label(name: str) -> str:
    """The printed name of data set `name` ('MNIST'); an unknown name as given."""
    return Dataset(name).label if name in DATASETS else name


def model_short(name: str) -> str:
    """'ReLU' / 'Attn' for the paper's models, any other kind as given."""
    return Model(name).short if name in MODEL_KINDS else name


def model_name(name: str) -> str:
    """'2L-ReLU' / 'MLP-Attn' for the paper's models, any other kind as given."""
    return Model(name).paper_name if name in MODEL_KINDS else name
