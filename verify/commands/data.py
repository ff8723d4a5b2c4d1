"""`verify data`: where each data set is found (`info`) and a checksum-verified downloader (`download`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from empirics.data import datasets as D
from empirics.data.download import download
from ntkm.errors import UserInputError
from verify.commands.options import options
from verify.outputs import check_output_dir

NAME = "data"
HELP = "show where MNIST / CIFAR-10 are found and their provenance, or download them with checksums"
ORDER = 90


@dataclass(frozen=True)
class DataCommandOptions:
    """`verify data`'s options."""

    action: str = field(default="info", metadata={"help": "info (default) or download", "positional": True,
                                                  "nargs": "?"})
    data_dir: str | None = field(default=None, metadata={"help": "look only in this folder (info)"})
    dataset: str | None = field(default=None, metadata={
        "help": "mnist or cifar10 (download: required; info: default both)"})
    dest: str | None = field(default=None, metadata={
        "help": f"download folder (default: {D.default_download_dir()})"})
    quiet: bool = field(default=False, metadata={"help": "no progress lines on stderr"})


OPTIONS = options(DataCommandOptions, "action", "data_dir", "dataset", "dest", "quiet")


def _datasets(value: str | None) -> tuple[str, ...]:
    if value is None:
        return D.DATASETS
    if value not in D.DATASETS:
        raise UserInputError(f"unknown --dataset '{value}'; choose {', '.join(D.DATASETS)}")
    return (value,)


def info_text(data_dir: str | None, names: tuple[str, ...]) -> str:
    """A human-readable report: the copy each data set would be loaded from, and what was searched."""
    lines = []
    sample = D.sample_info()["datasets"]
    for name in names:
        src, searched = D.find_data(name, data_dir)
        lines.append(f"{name}:")
        if src is not None:
            lines.append(f"  found: {src.describe()}")
            for f in src.files:
                lines.append(f"    {f.name}  sha256 {D.file_sha256(f)}")
        else:
            fallback = "an error (--data-dir given)" if data_dir else "the bundled sample"
            lines.append(f"  not found; loading gives {fallback}")
        for s in searched:
            lines.append(f"  searched: {s}")
        smp = sample[name]
        lines.append(
            f"  bundled sample: {smp['n_train']} train + {smp['n_test']} test images of "
            f"{smp['source_label']} "
            f"({smp['npz']}, {smp['npz_bytes']} bytes); licence: {smp['licence']}"
        )
    lines.append(
        f"search order: --data-dir, ${D.ENV_VAR}, ./data, ../shared/data, {D.default_download_dir()}, "
        "then the bundled sample"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.action == "info":
        if args.data_dir is not None and not Path(args.data_dir).expanduser().is_dir():
            raise UserInputError(f"--data-dir {args.data_dir} is not a folder; pass an existing folder")
        sys.stdout.write(info_text(args.data_dir, _datasets(args.dataset)) + "\n")
        return 0
    if args.action == "download":
        if args.dataset is None:
            raise UserInputError("download needs --dataset mnist or --dataset cifar10")
        dest = str(check_output_dir(args.dest, "--dest")) if args.dest else str(D.default_download_dir())
        for name in _datasets(args.dataset):
            for path in download(name, dest, quiet=args.quiet):
                sys.stdout.write(f"verified {path}\n")
        if args.dest and not args.quiet:
            sys.stderr.write(f"use it with --data-dir {args.dest} or set {D.ENV_VAR}={args.dest}\n")
        return 0
    raise UserInputError(f"unknown action '{args.action}'; choose info or download")
