"""The experiment config fields that several configs share, declared once: type, default and help text.

A config field carries its command-line help in `dataclasses.field(metadata=...)` (the kronfluence pattern);
`verify.commands.options` generates each command's options from it. The data and architecture fields below occur
in every experiment config (`DistanceConfig`, `MalleabilityConfig`, `LandscapeConfig`; `width` in the last two):
`ExperimentFields` declares each once, and a config names it with `shared("name")` under the same annotation
(tests/empirics/test_fieldhelp.py keeps the annotations equal). Each config still lists its fields itself, in its
own order: dataclass inheritance would put the shared fields first, and a config's field order is the key order of
its stored record (`asdict`), so the records would change.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from empirics.nets import kinds
from empirics.nets.train import TrainConfig

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
    """`preprocess`: the fixed input layer (`empirics.nets.models.ModelSpec.preprocess`), `--preprocess` on the command
    line."""
    from empirics.data.datasets import INPUT_PREPROCESSINGS

    return helped("raw", PREPROCESS, choices=INPUT_PREPROCESSINGS)


@dataclass(frozen=True)
class ExperimentFields:
    """The data and architecture block of the experiment configs: which data (and subset per seed), which networks
    and how they are trained, where the tensors live. Not a config itself: the table `shared` copies fields from."""

    dataset: str = "mnist"
    task: str = "10class"
    classes: tuple[str, ...] | None = None
    models: tuple[str, ...] = helped(("relu", "attn"), MODELS, flag="--model")
    width: int = helped(1024, WIDTH)
    seeds: tuple[int, ...] = (0, 1, 2)
    n_train: int = helped(500, N_TRAIN)
    n_test: int = helped(200, N_TEST)
    sample: str = "balanced"
    data_seed: int = 0
    per_seed_data: bool = True
    train: TrainConfig = field(default_factory=TrainConfig)
    parameterization: str = helped("ntk", PARAMETERIZATION)
    attn_layers: int = helped(1, ATTN_LAYERS)
    attn_rank: int | None = helped(None, ATTN_RANK)
    attn_centre: bool = centre_field()
    preprocess: str = preprocess_field()
    data_dir: str | None = None
    data_source: str = "auto"
    device: str = "auto"


_SHARED = {f.name: f for f in fields(ExperimentFields)}


def shared(name: str, **cli: Any) -> Any:
    """A new field for config field `name` as `ExperimentFields` declares it (default or default factory, help text
    and command-line spelling); `cli` replaces parts of that metadata (a command's own help text)."""
    f = _SHARED[name]
    metadata = {**f.metadata, **cli}
    if f.default_factory is not MISSING:
        return field(default_factory=f.default_factory, metadata=metadata)
    return field(default=f.default, metadata=metadata)
