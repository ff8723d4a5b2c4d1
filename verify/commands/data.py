"""`verify data`: where each data set is found (`info`) and a checksum-verified downloader (`download`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from empirics import datasets as D
from empirics.download import download
from theory.errors import UserInputError
from verify.outputs import check_output_dir

NAME = "data"
HELP = "show where MNIST / CIFAR-10 are found and their provenance, or download them with checksums"
ORDER = 90


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", default="info", help="info (default) or download")
    p.add_argument("--data-dir", default=None, help="look only in this folder (info)")
    p.add_argument("--dataset", default=None, help="mnist or cifar10 (download: required; info: default both)")
    p.add_argument("--dest", default=None, help=f"download folder (default: {D.default_download_dir()})")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


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
