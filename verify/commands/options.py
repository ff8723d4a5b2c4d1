"""Command-line options generated from dataclass fields, so that an option's default and help are written once.

A field says how it appears on the command line in its metadata (the kronfluence pattern):
`dataclasses.field(default=..., metadata={"help": ...})`, plus, where needed, `flag` (else `--field-name`),
`aliases`, `metavar`, `choices`, `nargs` and `positional`. Only `help` is required; `options` refuses a field
without it. A `Param` adds what only a command knows: the preset key that fills an unset option, how the option's
text becomes the field's value (comma lists, range-checked numbers), an argparse `type`. `options` generates the
`Option`s, `add_options` their argparse arguments, `values` the fields' values back from the parsed arguments.

The defaults: a field's default is the option's (a tuple as its comma-separated text; a number parsed from text
as its text); an option filled from the preset defaults to None; a bool field is a `store_true` flag (a field
that defaults to True is the `--no-...` flag that turns it off).

The argument blocks several commands share are defined once here: the data options (`DataOptions`), the run
options of the experiment commands (`RunOptions`), the training protocol (`ProtocolOptions`) and where
experiment units run (`verify.executors.ExecutorConfig`, `EXECUTOR`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, replace
from typing import Any

from empirics.nets.protocols import PAPER, PROPER, PROTOCOL_NAMES, protocol_config
from empirics.nets.train import TrainConfig
from ntkm.errors import UserInputError
from verify.commands._common import json_target, split_classes
from verify.executors import ExecutorConfig
from verify.presets import PRESET_NAMES, n_train_for, parse_choices

#: Preset keys of a training-set size, read per data set (`verify.presets.n_train_for`).
N_TRAIN_KEYS = ("n_train", "mall_n_train")

#: `Param.default` when the option's default is the field's.
AS_FIELD: Any = object()


@dataclass(frozen=True)
class Param:
    """How a command exposes one field beyond its metadata: `preset` fills the option when it is not given;
    `parse` turns the option's value into the field's (it also checks it); `text` takes a numeric field as text
    (its `parse` checks it, with the command's own message); `default` replaces the option's default (when the
    field's default is not how the option spells it); `type` is the argparse type."""

    name: str
    preset: str | None = None
    parse: Callable[[Any], Any] | None = None
    text: bool = False
    default: Any = AS_FIELD
    type: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Option:
    """One generated argparse argument (`flags`, `kwargs`) and how its field's value is read back."""

    owner: type
    param: Param
    flags: tuple[str, ...]
    kwargs: Mapping[str, Any]
    invert: bool = False

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments that holds this option."""
        return self.flags[0].lstrip("-").replace("-", "_")

    def add_to(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(*self.flags, **self.kwargs)

    def value(self, args: argparse.Namespace, pre: Mapping[str, Any] | None = None) -> Any:
        """The field's value that the parsed `args` give (`pre`: the preset, for an option it fills)."""
        raw = getattr(args, self.dest)
        if self.param.preset is not None and raw in (None, ""):
            if pre is None:
                raise ValueError(f"{self.flags[0]} falls back to the preset; pass the preset's size table")
            if self.param.preset in N_TRAIN_KEYS:  # per data set, as the claims size it (CIFAR-10 250 at quick)
                return n_train_for(pre, getattr(args, "dataset", ""), self.param.preset)  # type: ignore[arg-type]
            return pre[self.param.preset]
        if self.invert:
            return not raw
        return self.param.parse(raw) if self.param.parse is not None else raw


def _base_type(hint: Any) -> Any:
    """`int` for `int | None`, `tuple` for `tuple[str, ...]`: the type an option's value must become."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _base_type(args[0]) if len(args) == 1 else object
    return typing.get_origin(hint) or hint


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _option(owner: type, f: dataclasses.Field, hint: Any, param: Param) -> Option:
    where = f"{owner.__name__}.{f.name}"
    meta = f.metadata
    help_text = meta.get("help")
    if not isinstance(help_text, str) or not help_text.strip():
        raise TypeError(f"{where} has no help text; declare it as dataclasses.field(..., metadata={{'help': ...}})")
    base, default = _base_type(hint), _field_default(f)
    kw: dict[str, Any] = {"help": help_text, **{k: meta[k] for k in ("metavar", "choices", "nargs") if k in meta}}
    if meta.get("positional"):
        if default is not MISSING and meta.get("nargs") == "?":
            kw["default"] = default
        return Option(owner, param, (f.name,), kw)
    flags = (meta.get("flag", "--" + f.name.replace("_", "-")), *meta.get("aliases", ()))
    invert = False
    if param.preset is not None:
        note = "" if param.preset == f.name else f" {param.preset}"
        kw.update(default=None, help=f"{help_text} (default: the preset's{note})")
    elif base is bool:
        if default is True and not flags[0].startswith("--no-"):
            raise TypeError(f"{where} defaults to True; its flag must be the --no-... that turns it off")
        invert = default is True
        kw["action"] = "store_true"
    elif param.default is not AS_FIELD:
        kw["default"] = param.default
    elif isinstance(default, tuple):
        kw["default"] = ",".join(map(str, default)) if default else None
    elif param.text and default not in (MISSING, None):
        kw["default"] = str(default)
    else:
        kw["default"] = None if default is MISSING else default
    if base is not bool:
        if param.type is not None:
            kw["type"] = param.type
        elif base in (int, float) and not param.text:
            kw["type"] = base
        elif base not in (int, float, str) and param.parse is None:
            raise TypeError(f"{where} is a {base.__name__}; its Param needs a parse from the option's text")
    return Option(owner, param, flags, kw, invert)


def options(owner: type, *params: str | Param) -> tuple[Option, ...]:
    """The options of `owner`'s fields named by `params` (a name alone: the field as its metadata says), in that
    order; a field without help text is refused (`TypeError`)."""
    fields = {f.name: f for f in dataclasses.fields(owner)}
    hints = typing.get_type_hints(owner)
    out = []
    for p in params:
        param = Param(p) if isinstance(p, str) else p
        if param.name not in fields:
            raise TypeError(f"{owner.__name__} has no field '{param.name}'")
        out.append(_option(owner, fields[param.name], hints[param.name], param))
    return tuple(out)


def add_options(p: argparse.ArgumentParser, opts: Iterable[Option]) -> None:
    """Add every option to the parser, in order."""
    for o in opts:
        o.add_to(p)


def values(opts: Iterable[Option], args: argparse.Namespace, pre: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Field name -> value that the parsed `args` give, for every option of `opts` (in order: the first bad
    option raises first)."""
    return {o.name: o.value(args, pre) for o in opts}


def choices(what: str, allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """`parse` of a comma-separated list of names from `allowed` (`what` names it in the error)."""
    return lambda text: parse_choices(text, what, allowed)


# ---- the data options -----------------------------------------------------------------------------------------

#: `--dataset` and `--task` of the experiment commands, which also take a PATH to the user's own data set.
PATH_DATASET_HELP = ("mnist, cifar10, or PATH to your own data set: an IDX folder, CIFAR-style python batches, an "
                     "image folder train/<class>/*, test/<class>/*, or a .npz with x_train, y_train, x_test, y_test "
                     "(default: %(default)s)")
PATH_TASK_HELP = " / the two --classes of a PATH"


@dataclass(frozen=True)
class DataOptions:
    """Which data an experiment (or `verify kappa`) loads; the defaults are the experiment configs' (a test keeps
    them equal)."""

    dataset: str = field(default="mnist", metadata={"help": "mnist or cifar10 (default: %(default)s)"})
    classes: tuple[str, ...] | None = field(default=None, metadata={
        "help": "the two classes of --task binary on a PATH data set, by name or index (e.g. cat,dog)",
        "metavar": "A,B"})
    task: str = field(default="10class", metadata={
        "help": "10class (every class), or binary: MNIST 3-vs-8 / CIFAR-10 automobile-vs-airplane"})
    data_dir: str | None = field(default=None, metadata={
        "help": "folder with the data (else $NTKM_DATA_DIR, ./data, ../shared/data, the user cache, then the "
                "bundled sample)"})
    sample: str = field(default="balanced", metadata={"help": "subset: balanced (seeded, class-balanced) or first"})


def data_options(paths: bool = False) -> tuple[Option, ...]:
    """`--dataset`, `--task`, `--data-dir`, `--sample`; with `paths`, `--dataset` may be a PATH and `--classes`
    picks a binary task's two classes (the experiment commands)."""
    dataset, classes, task, data_dir, sample = options(
        DataOptions, "dataset", Param("classes", text=True, parse=split_classes), "task", "data_dir", "sample")
    if not paths:
        return dataset, task, data_dir, sample
    dataset = dataclasses.replace(dataset, kwargs={**dataset.kwargs, "help": PATH_DATASET_HELP,
                                                   "metavar": "mnist|cifar10|PATH"})
    task = dataclasses.replace(task, kwargs={**task.kwargs, "help": task.kwargs["help"] + PATH_TASK_HELP})
    return dataset, classes, task, data_dir, sample


#: The data options of the experiment commands (a PATH data set allowed).
PATH_DATA = data_options(paths=True)


# ---- the run options of the experiment commands ---------------------------------------------------------------

#: `--json FILE` of every command that writes its record as JSON.
JSON_HELP = "also write the result record as JSON to FILE, atomically ('-': print only the JSON, to stdout)"


@dataclass(frozen=True)
class RunOptions:
    """How big an experiment command's run is, where its tensors live and where its record goes."""

    preset: str = field(default="quick", metadata={"help": f"one of {', '.join(PRESET_NAMES)} (default: %(default)s)"})
    seeds: int | None = field(default=None, metadata={"help": "number of seeds (default: the preset's)"})
    device: str = field(default="auto", metadata={"help": "auto (CUDA when present), cpu or cuda"})
    json: str | None = field(default=None, metadata={"help": JSON_HELP, "metavar": "FILE"})


PRESET, SEEDS, DEVICE, JSON = options(RunOptions, "preset", "seeds", "device", Param("json", type=json_target))


def seed_range(args: argparse.Namespace, pre: Mapping[str, Any]) -> tuple[int, ...]:
    """The seeds 0..N-1 of `--seeds N` (default: as many as the preset has)."""
    seeds = args.seeds if args.seeds is not None else len(pre["seeds"])
    if seeds < 1:
        raise UserInputError(f"--seeds must be >= 1, got {seeds}")
    return tuple(range(seeds))


# ---- the training protocol ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProtocolOptions:
    """`--protocol` and the overrides on top of it, for every command that trains networks (None: the
    protocol's own value)."""

    protocol: str = field(default=PROPER, metadata={
        "help": f"training protocol: {', '.join(PROTOCOL_NAMES)} (default: %(default)s; 'paper' is the paper's "
                "reported Adam with coupled L2 1e-3; see README, 'Training protocols')"})
    epochs: int | None = field(default=None, metadata={
        "help": "epochs (fixed for 'paper', the maximum for the plateau-trained protocols; default: the preset's)"})
    lr: float | None = field(default=None, metadata={"help": "override the protocol's learning rate"})
    optimizer: str | None = field(default=None, metadata={
        "help": "override the protocol's optimizer: adam or gd (full batch)"})
    loss: str | None = field(default=None, metadata={
        "help": "override the loss: auto (cross-entropy; MSE for binary) or mse"})


PROTOCOL = options(ProtocolOptions, "protocol", "epochs", "lr", "optimizer", "loss")


def train_config(args: argparse.Namespace, pre: Mapping[str, Any]) -> TrainConfig:
    """The `TrainConfig` that `--protocol`, `--epochs`, `--lr`, `--optimizer` and `--loss` describe."""
    if args.epochs is not None and args.epochs < 0:
        raise UserInputError(f"--epochs must be >= 0, got {args.epochs}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise UserInputError(f"--lr must be a finite number > 0, got {args.lr}")
    epochs = args.epochs if args.epochs is not None else pre["paper_epochs" if args.protocol == PAPER else "epochs"]
    overrides = {k: v for k, v in (("lr", args.lr), ("optimizer", args.optimizer), ("loss", args.loss))
                 if v is not None}
    return replace(protocol_config(args.protocol, epochs, dataset=getattr(args, "dataset", None),
                                   preprocess=getattr(args, "preprocess", None) or "raw"), **overrides)


# ---- where experiment units run -------------------------------------------------------------------------------

#: `--executor`, `--ray-address`, `--cpus-per-unit` of a command that runs experiment units.
EXECUTOR = options(ExecutorConfig, "name", "address", "cpus_per_unit")

#: The options every experiment command (ntk-distance, malleability, landscape) starts with.
EXPERIMENT = (*PATH_DATA, PRESET, SEEDS, DEVICE, JSON, *EXECUTOR, *PROTOCOL)
