"""The data and architecture block the experiment configs share (`empirics.fieldhelp.ExperimentFields`): every config
declares those fields as the block does, and keeps its own field order (its stored records' key order). The help
texts themselves: tests/verify/test_commands_options.py checks every generated option has one and its field's
default."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from empirics import fieldhelp as H
from empirics.experiments.distance import DistanceConfig
from empirics.experiments.landscape import LandscapeConfig
from empirics.experiments.malleability import MalleabilityConfig

CONFIGS = (DistanceConfig, MalleabilityConfig, LandscapeConfig)
#: Where a config's command line says more or less than the block: (config, field) -> its own help text (none today:
#: the landscape's own "relu, attn" was stale, it takes every kind that trains W alone and refuses the rest).
OWN_HELP: dict[tuple[type, str], str] = {}
#: Each config's fields in order: the key order of `asdict(cfg)`, which the records and claims.json store. The
#: shared fields sit among each config's own ones, which is why the block is a table and not a base class.
ORDER = {
    DistanceConfig: ("dataset", "task", "classes", "models", "widths", "seeds", "n_train", "n_test", "sample",
                     "data_seed", "per_seed_data", "train", "parameterization", "attn_layers", "attn_rank",
                     "attn_centre", "preprocess", "reference_draws", "reference_width", "gd_mse", "data_dir",
                     "data_source", "device"),
    MalleabilityConfig: ("dataset", "task", "classes", "models", "attacks", "eps", "eps_sweep", "tau", "seeds",
                         "interventions", "width", "n_train", "n_test", "sample", "data_seed", "per_seed_data",
                         "train", "seed_baseline", "adv_train", "adv_max_epochs", "adv_steps", "attack_steps",
                         "attack_context", "ridge", "ridge_rel", "parameterization", "attn_layers", "attn_rank",
                         "attn_centre", "preprocess", "data_dir", "data_source", "device"),
    LandscapeConfig: ("dataset", "task", "classes", "models", "width", "seeds", "n_train", "n_test", "sample",
                      "data_seed", "per_seed_data", "train", "parameterization", "attn_layers", "attn_rank",
                      "attn_centre", "preprocess", "interp_range", "slice_range", "points", "grid", "hessian_iters",
                      "hutchinson_samples", "flat_step", "flat_directions", "data_dir", "data_source", "device"),
}


def _default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.__name__)
def test_a_config_declares_each_shared_field_as_the_block_does(cfg):
    block = {f.name: f for f in dataclasses.fields(H.ExperimentFields)}
    block_hints, hints = typing.get_type_hints(H.ExperimentFields), typing.get_type_hints(cfg)
    shared = [f for f in dataclasses.fields(cfg) if f.name in block]
    assert len(shared) >= len(block) - 1  # DistanceConfig has widths, not width
    for f in shared:
        ref = block[f.name]
        assert hints[f.name] == block_hints[f.name], (cfg.__name__, f.name)
        assert _default(f) == _default(ref) and (f.default_factory is dataclasses.MISSING) == (
            ref.default_factory is dataclasses.MISSING), (cfg.__name__, f.name)
        own = OWN_HELP.get((cfg, f.name))
        assert dict(f.metadata) == {**ref.metadata, **({"help": own} if own else {})}, (cfg.__name__, f.name)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.__name__)
def test_a_config_keeps_its_field_order(cfg):
    assert tuple(f.name for f in dataclasses.fields(cfg)) == ORDER[cfg]
    assert tuple(dataclasses.asdict(cfg())) == ORDER[cfg]


def test_shared_gives_a_new_field_each_time():
    """Two configs never share one `Field` object (dataclasses writes the name and type into it), and a default
    factory stays a factory (each config gets its own `TrainConfig`)."""
    a, b = H.shared("train"), H.shared("train")
    assert a is not b and a.default_factory is b.default_factory is not dataclasses.MISSING
    assert H.shared("models", help="x").metadata["help"] == "x" and H.shared("models").metadata["help"] == H.MODELS
    with pytest.raises(KeyError):
        H.shared("widths")
