"""The model kinds and what each can do: one entry per kind, read wherever a kind's capability decides something.

The names of a kind (its value, the paper's name, the short name) live in `empirics.vocab.Model`; this table holds
the rest: how the network computes its features, where its infinite-width reference kernel comes from, and the
capability flags the experiments ask about. Code asks the table (`kind(name).recomputed_context`) instead of
comparing strings, and an unsupported combination is a one-line `UserInputError`, never a silent fallback
(an unknown kind has no reference kernel; an attack that cannot rebuild a kind's context says so).

How to add a kind: add its value to `vocab.Model` and an entry to `KINDS` with its feature strategy and flags; a new
strategy is one more `empirics.nets.features.FeatureStrategy` (its context, torch and analytic features and price are
its methods, so nothing else branches on it), and a kind whose parameters besides `W` train gets its own network
class in `empirics.nets.models`. `tests/empirics/test_kinds.py` then checks it against its reference over every
registered kind, and `tests/empirics/test_features.py` checks that its context is rebuilt on perturbed data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from empirics.vocab import Model
from ntkm.errors import UserInputError

if TYPE_CHECKING:
    from empirics.nets.features import FeatureStrategy

#: Where a kind's infinite-width reference kernel comes from.
ANALYTIC, MONTE_CARLO = "analytic", "monte-carlo"


@dataclass(frozen=True)
class Kind:
    """One model kind.

    features: the name of how the head's input is computed; `strategy` is its `empirics.nets.features.FeatureStrategy`
        (`identity`: the preprocessed input; `linear-attention`: `normalise(C^k x)` with the training-set context C;
        `softmax-attention`: softmax attention over the training inputs; `trained-attention`: Q, K, V projections
        that train with the head).
    reference: `analytic` (the closed form of Thm 4.2 on the kind's features, `theory.kernels`) or `monte-carlo`
        (the mean empirical NTK over initialisations, `empirics.kernels.mc_reference`; no closed form exists).
    has_context: its features depend on the training set (an attention context).
    attention_options: the linearized-attention options (layers, rank, centring) apply.
    recomputed_context: an attack can rebuild its context with the perturbed points (`empirics.nets.attacks`).
    trains_attention: parameters besides the head's `W` train, so its features move during training (its own
        network class, the per-network training loop, no gd-mse twin: gradient descent on the squared loss with
        `lr = n / lambda_max(Theta_0)` assumes fixed features).
    """

    model: Model
    features: str
    reference: str
    has_context: bool
    attention_options: bool
    recomputed_context: bool
    trains_attention: bool
    description: str

    @property
    def name(self) -> str:
        return self.model.value

    @property
    def strategy(self) -> FeatureStrategy:
        """The feature strategy object every feature decision is asked of (imported here, not at the top, so that
        the kind table stays importable without torch: the claims registry and `--plan` read it)."""
        from empirics.nets.features import strategy

        return strategy(self.features)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(Model.RELU, "identity", ANALYTIC, has_context=False, attention_options=False,
         recomputed_context=False, trains_attention=False, description="the paper's two-layer ReLU network"),
    Kind(Model.ATTN, "linear-attention", ANALYTIC, has_context=True, attention_options=True,
         recomputed_context=True, trains_attention=False,
         description="the paper's MLP on linearized attention over the training set"),
    Kind(Model.SOFTMAX, "softmax-attention", ANALYTIC, has_context=True, attention_options=False,
         recomputed_context=False, trains_attention=False,
         description="softmax attention over the training set, T = sqrt(d) or 1/sqrt(d) on unit-norm inputs"),
    Kind(Model.QKV, "trained-attention", MONTE_CARLO, has_context=True, attention_options=False,
         recomputed_context=False, trains_attention=True,
         description="trainable single-head Q/K/V linearized attention, k = 64; Monte Carlo reference"),
)}


def kind(name: str) -> Kind:
    """The entry of kind `name`; an unknown name is a one-line error listing the kinds."""
    try:
        return KINDS[str(name)]
    except KeyError:
        raise UserInputError(f"unknown model '{name}'; choose one of {', '.join(KINDS)}") from None


def kinds_where(**flags: object) -> tuple[str, ...]:
    """The kinds whose fields equal `flags` (e.g. `kinds_where(has_context=True)`), in the table's order."""
    return tuple(n for n, k in KINDS.items() if all(getattr(k, f) == v for f, v in flags.items()))


def help_text() -> str:
    """The `--model` choices with what each is, from the table (the paper's first)."""
    return "comma-separated: " + ", ".join(f"{n} ({k.description})" for n, k in KINDS.items())
