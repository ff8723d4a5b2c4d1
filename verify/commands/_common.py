"""Checks and output helpers shared by several subcommands (their options: `verify.commands.options`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ntkm.codec import dumps, public, write_json
from ntkm.errors import UserInputError
from verify.executors import executor_from_args, seed_map_for
from verify.outputs import check_output_dir, disk_error

DATASETS = ("mnist", "cifar10")
TASKS = ("10class", "binary")


def seed_map(args: argparse.Namespace, what: str) -> Any:
    """Where the experiment's seeds run (`--executor`): here, or one Ray task per seed."""
    from empirics.progress import log

    return seed_map_for(executor_from_args(args, args.device), log, what)


def centre_note(centre: bool) -> str:
    """The variant's label in a run's header line ('' for the paper's model)."""
    return ", MLP-Attn context centred (variant, not the paper's model)" if centre else ""


def check_data_args(args: argparse.Namespace, paths: bool = False) -> None:
    """One-line errors for bad data options; with `paths`, a PATH `--dataset` becomes absolute (it is part of
    the experiment's config) and `--classes` a tuple."""
    if paths:
        from empirics.data.userdata import check_data_options, resolve_path

        if args.dataset not in DATASETS:
            args.dataset = str(resolve_path(args.dataset))
        args.classes = split_classes(args.classes)
        check_data_options(args.dataset, args.task, args.classes, args.data_dir)
    if args.dataset not in DATASETS and not paths:
        raise UserInputError(f"unknown dataset '{args.dataset}'; choose mnist or cifar10")
    if args.task not in TASKS:
        raise UserInputError(f"unknown task '{args.task}'; choose 10class or binary")
    if args.sample not in ("balanced", "first"):
        raise UserInputError(f"unknown sample '{args.sample}'; choose balanced or first")


def split_classes(text: str | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """`--classes A,B` as a tuple (None when empty); a tuple passes through."""
    if isinstance(text, str):
        return tuple(c.strip() for c in text.split(",") if c.strip()) or None
    return text


def json_target(text: str) -> str:
    """argparse type of `--json FILE`: '-' or a file whose folder can be written, checked before any work."""
    if text == "-":
        return text
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name such as result.json")
    try:
        check_output_dir(p.absolute().parent, "--json")
    except UserInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def emit_json(target: str | None, record: Any) -> None:
    """Write the record (`ntkm.codec.public`) to a file atomically, or to stdout for '-'; a write error is one
    line."""
    if target is None:
        return
    record = public(record)  # an interval end that is not finite is null with its reason, never "-inf"
    if target == "-":
        sys.stdout.write(dumps(record))
        return
    try:
        write_json(target, record)
    except OSError as exc:
        raise disk_error(exc, Path(target).expanduser().absolute().parent) from None
