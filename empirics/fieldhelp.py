"""Help texts of the experiment config fields that several configs share, written once.

A config field carries its command-line help in `dataclasses.field(metadata=...)` (the kronfluence pattern);
`verify.commands.options` generates each command's options from it. The fields below occur in more than one
experiment config (`DistanceConfig`, `MalleabilityConfig`, `LandscapeConfig`), so their help lives here.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from empirics import kinds

MODELS = kinds.help_text()
N_TRAIN = "training points"
N_TEST = "test points"
WIDTH = "hidden width m"
PARAMETERIZATION = "ntk (paper) or standard"
ATTN_LAYERS = "stacked linearized attention layers k"
ATTN_RANK = "keep the top-r singular directions in C"
CENTRE = ("MLP-Attn variant: centre the attention context and the queries by the training mean, x -> C_c (x - mu) "
          "(reported as the 'centred' variant; the paper's model is uncentred)")


PREPROCESS = ("input preprocessing, the network's fixed first layer (attack eps stays in pixel units): raw ([0, 1] "
              "pixels), channel (per-channel standardisation with training statistics) or unit (channel, then "
              "each input scaled to unit norm)")


def helped(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with `default` whose command-line option has `help` (and `cli`: flag, aliases, metavar,
    choices)."""
    return field(default=default, metadata={"help": help, **cli})


def centre_field() -> Any:
    """`attn_centre`, the centred-context MLP-Attn variant: `--centre` (alias `--center`) on the command line."""
    return helped(False, CENTRE, flag="--centre", aliases=("--center",))


def preprocess_field() -> Any:
    """`preprocess`: the fixed input layer (`empirics.models.ModelSpec.preprocess`), `--preprocess` on the command
    line."""
    from empirics.datasets import INPUT_PREPROCESSINGS

    return helped("raw", PREPROCESS, choices=INPUT_PREPROCESSINGS)
