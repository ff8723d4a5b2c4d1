"""Arguments and output helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from empirics.records import to_jsonable, write_json
from theory.errors import UserInputError
from verify.executors import add_executor_args, executor_from_args, seed_map_for
from verify.outputs import check_output_dir, disk_error
from verify.presets import PRESET_NAMES

DATASETS = ("mnist", "cifar10")
TASKS = ("10class", "binary")


def add_data_args(p: argparse.ArgumentParser, dataset_default: str | None = "mnist", paths: bool = False) -> None:
    """`--dataset`, `--task`, `--data-dir`, `--sample`; with `paths`, `--dataset` may be a PATH and `--classes`
    picks a binary task's two classes (the experiment commands)."""
    if paths:
        p.add_argument("--dataset", default=dataset_default, metavar="mnist|cifar10|PATH",
                       help="mnist, cifar10, or PATH to your own data set: an IDX folder, CIFAR-style python batches, "
                       "an image folder train/<class>/*, test/<class>/*, or a .npz with x_train, y_train, x_test, "
                       "y_test (default: %(default)s)")
        p.add_argument("--classes", default=None, metavar="A,B",
                       help="the two classes of --task binary on a PATH data set, by name or index (e.g. cat,dog)")
    else:
        p.add_argument("--dataset", default=dataset_default, help="mnist or cifar10 (default: %(default)s)")
    p.add_argument("--task", default="10class",
                   help="10class (every class), or binary: MNIST 3-vs-8 / CIFAR-10 automobile-vs-airplane"
                   + (" / the two --classes of a PATH" if paths else ""))
    p.add_argument("--data-dir", default=None, help="folder with the data (else $NTKM_DATA_DIR, ./data, "
                   "../shared/data, the user cache, then the bundled sample)")
    p.add_argument("--sample", default="balanced", help="subset: balanced (seeded, class-balanced) or first")


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="quick", help=f"one of {', '.join(PRESET_NAMES)} (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default: the preset's)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--json", default=None, metavar="FILE", type=json_target,
                   help="write the result record as JSON ('-' = stdout)")
    add_executor_args(p)


def seed_map(args: argparse.Namespace, what: str) -> Any:
    """Where the experiment's seeds run (`--executor`): here, or one Ray task per seed."""
    from empirics.progress import log

    return seed_map_for(executor_from_args(args, args.device), log, what)


def add_centre_arg(p: argparse.ArgumentParser) -> None:
    """`--centre`: the centred-context MLP-Attn variant (a named variant, never the paper's model)."""
    p.add_argument("--centre", "--center", dest="centre", action="store_true",
                   help="MLP-Attn variant: centre the attention context and the queries by the training mean, "
                   "x -> C_c (x - mu) (reported as the 'centred' variant; the paper's model is uncentred)")


def centre_note(centre: bool) -> str:
    """The variant's label in a run's header line ('' for the paper's model)."""
    return ", MLP-Attn context centred (variant, not the paper's model)" if centre else ""


def check_data_args(args: argparse.Namespace, paths: bool = False) -> None:
    """One-line errors for bad data options; with `paths`, a PATH `--dataset` becomes absolute (it is part of
    the experiment's config) and `--classes` a tuple."""
    if paths:
        from empirics.userdata import check_data_options, resolve_path

        if args.dataset not in DATASETS:
            args.dataset = str(resolve_path(args.dataset))
        if isinstance(args.classes, str):
            args.classes = tuple(c.strip() for c in args.classes.split(",") if c.strip()) or None
        check_data_options(args.dataset, args.task, args.classes, args.data_dir)
    if args.dataset not in DATASETS and not paths:
        raise UserInputError(f"unknown dataset '{args.dataset}'; choose mnist or cifar10")
    if args.task not in TASKS:
        raise UserInputError(f"unknown task '{args.task}'; choose 10class or binary")
    if args.sample not in ("balanced", "first"):
        raise UserInputError(f"unknown sample '{args.sample}'; choose balanced or first")


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
    """Write the record to a file atomically, or to stdout for '-'; a write error is one line."""
    if target is None:
        return
    if target == "-":
        sys.stdout.write(json.dumps(to_jsonable(record), indent=2) + "\n")
        return
    try:
        write_json(target, record)
    except OSError as exc:
        raise disk_error(exc, Path(target).expanduser().absolute().parent) from None
