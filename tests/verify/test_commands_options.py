"""Options generated from dataclass fields (`verify.commands.options`): every command's options carry help text and
the defaults of the fields they fill, so the command line and the configs cannot drift apart."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, replace

import pytest

from empirics.experiments.distance import DistanceConfig
from empirics.experiments.landscape import LandscapeConfig
from empirics.experiments.malleability import MalleabilityConfig
from empirics.nets.protocols import PAPER, PROPER, protocol_config
from verify.cli import _command_modules, build_parser
from verify.commands.options import DataOptions, Param, RunOptions, options
from verify.presets import PRESETS

#: Required positional arguments (dest: value) a command needs before it parses.
REQUIRED = {"report": {"record": "claims.json"}}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _defaults(name: str) -> argparse.Namespace:
    return build_parser().parse_args([name, *REQUIRED.get(name, {}).values()])


def _dataclass_default(owner: type, name: str) -> object:
    f = {f.name: f for f in dataclasses.fields(owner)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None  # a required field (the audit's --model / --train): unset on the command line


@pytest.mark.parametrize("mod", _command_modules(), ids=lambda m: m.NAME)
def test_each_option_has_help_and_gives_its_field_default(mod):
    """Parsed with no options, every generated option yields its field's default (the preset's value for an option
    the preset fills: `quick`, the default preset), and has help."""
    args = _defaults(mod.NAME)
    assert getattr(args, "preset", "quick") == "quick"
    quick = PRESETS["quick"]
    assert mod.OPTIONS, mod.NAME
    for opt in mod.OPTIONS:
        assert opt.kwargs["help"].strip(), f"{mod.NAME} {opt.flags[0]} has no help"
        if opt.dest in REQUIRED.get(mod.NAME, {}):
            continue  # a required positional has no default
        if opt.param.preset is not None:
            assert "the preset's" in opt.kwargs["help"], opt.flags
            expected = quick[opt.param.preset]
        else:
            expected = _dataclass_default(opt.owner, opt.name)
        assert opt.value(args, quick) == expected, f"{mod.NAME} {opt.flags[0]}"


@pytest.mark.parametrize("mod", _command_modules(), ids=lambda m: m.NAME)
def test_every_argument_of_a_command_is_generated(mod):
    """No argument is added by hand beside the generated ones (each has help text and a field)."""
    parser = _subparsers()[mod.NAME]
    flags = [a.option_strings or [a.dest] for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert flags == [list(o.flags) for o in mod.OPTIONS]
    assert all(a.help and a.help.strip() for a in parser._actions)


def test_the_shared_blocks_have_the_experiment_configs_defaults():
    """`DataOptions` and `RunOptions.device` fill the experiment configs: their defaults must be the configs'."""
    for cfg in (DistanceConfig, MalleabilityConfig, LandscapeConfig):
        for f in dataclasses.fields(DataOptions):
            assert _dataclass_default(cfg, f.name) == _dataclass_default(DataOptions, f.name), (cfg, f.name)
        assert _dataclass_default(cfg, "device") == _dataclass_default(RunOptions, "device")


def test_generation_refuses_a_field_without_help():
    @dataclass
    class Bare:
        x: int = 1
        y: int = field(default=2, metadata={"help": "   "})
        z: int = field(default=3, metadata={"flag": "--zed"})

    for name in ("x", "y", "z"):
        with pytest.raises(TypeError, match=f"Bare.{name} has no help text"):
            options(Bare, name)


def test_generation_refuses_fields_it_cannot_spell():
    @dataclass
    class Odd:
        sizes: tuple[int, ...] = field(default=(1, 2), metadata={"help": "sizes"})
        on: bool = field(default=True, metadata={"help": "on unless turned off"})

    with pytest.raises(TypeError, match="needs a parse"):
        options(Odd, "sizes")
    with pytest.raises(TypeError, match="--no-"):
        options(Odd, "on")
    with pytest.raises(TypeError, match="no field 'nope'"):
        options(Odd, "nope")
    (sizes,) = options(Odd, Param("sizes", parse=lambda t: tuple(int(v) for v in t.split(","))))
    assert sizes.kwargs["default"] == "1,2"
    assert sizes.value(argparse.Namespace(sizes="4,5")) == (4, 5)


def test_an_experiment_command_builds_the_config_its_options_describe():
    """Against the smoke preset's sizes written out here (n 100 / 40, two seeds, 20 epochs)."""
    import verify.commands.ntk_distance as nd

    args = build_parser().parse_args(["ntk-distance", "--preset", "smoke", "--model", "relu", "--widths", "8,16",
                                      "--center", "--attn-rank", "3", "--protocol", PAPER, "--lr", "0.5"])
    assert nd.config_from_args(args) == DistanceConfig(
        models=("relu",), widths=(8, 16), seeds=(0, 1), n_train=100, n_test=40, attn_centre=True, attn_rank=3,
        train=replace(protocol_config(PAPER, 20), lr=0.5))


def test_the_malleability_command_fills_from_the_preset_and_parses_its_text_options():
    import verify.commands.malleability as nm

    args = build_parser().parse_args(["malleability", "--preset", "smoke", "--eps", "0.1", "--tau", "0.2",
                                      "--eps-sweep", "0.2,0.4", "--attack", "pgd", "--seeds", "1"])
    cfg = nm.config_from_args(args)
    assert (cfg.eps, cfg.tau, cfg.eps_sweep, cfg.attacks, cfg.seeds) == (0.1, 0.2, (0.2, 0.4), ("pgd",), (0,))
    assert (cfg.width, cfg.n_train, cfg.n_test, cfg.attack_steps) == (128, 100, 40, 3)
    assert cfg.train == protocol_config(PROPER, 20, dataset=cfg.dataset, preprocess=cfg.preprocess)


@pytest.mark.parametrize("command", ["ntk-distance", "malleability", "landscape"])
def test_a_single_command_on_cifar10_trains_on_the_claims_size(command: str):
    """Issue 28: at quick the claims train CIFAR-10 on 250 points (`n_train_by_dataset`) but the single commands
    took 500; the preset's size is now read per data set, MNIST keeping the preset's n."""
    import importlib

    mod = importlib.import_module(f"verify.commands.{command.replace('-', '_')}")
    quick = PRESETS["quick"]
    for dataset, want in (("cifar10", quick["n_train_by_dataset"]["cifar10"]), ("mnist", None)):
        args = build_parser().parse_args([command, "--dataset", dataset])
        (opt,) = [o for o in mod.OPTIONS if o.name == "n_train"]
        assert opt.value(args, quick) == (want if want is not None else quick[opt.param.preset]), dataset
    assert quick["n_train_by_dataset"]["cifar10"] != quick["n_train"]  # else the test could not fail


def test_the_audit_inverts_no_reference_and_skip():
    import verify.commands.audit as na

    args = build_parser().parse_args(["audit", "--model", "m.pt", "--train", "mnist", "--no-reference", "--skip",
                                      "budget,outcome", "--projection", "rademacher"])
    cfg = na.config_from_args(args)
    assert (cfg.reference, cfg.panels, cfg.projection_kind) == (False, ("poison", "validity"), "rademacher")
