"""Entry point of the `verify` command.

Each subcommand lives in its own module under `verify/commands/` and exposes `NAME`, `HELP`,
`ORDER`, `OPTIONS` (its options, generated from dataclass fields by `verify.commands.options`) and
`run(args) -> int`. Errors the user can fix
(`UserInputError`), and numeric options that are not finite numbers, become one line on stderr
and exit code 2, never a traceback.

Interrupts: SIGINT (Ctrl-C) and SIGTERM (`timeout`, containers, Slurm) both stop the command
cleanly with one line on stderr and exit code 130 (SIGINT) or 143 (SIGTERM). Whatever was
being computed when the signal came is dropped; finished experiment units stay cached and output
sets are never half-replaced (`verify.outputs`). An exception raised after a signal arrived (e.g. a
library interrupted mid-draw) counts as the interrupt, so no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import pkgutil
import signal
import sys
from pathlib import Path
from types import FrameType, ModuleType

from ntkm import interrupts
from ntkm.errors import UserInputError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem and where to look."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def _command_modules() -> list[ModuleType]:
    import verify.commands as pkg

    mods = [importlib.import_module(f"verify.commands.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    mods = [m for m in mods if hasattr(m, "NAME") and hasattr(m, "run")]
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def build_parser() -> argparse.ArgumentParser:
    from verify.commands.options import add_options

    parser = _Parser(
        prog="verify",
        description="Verify the claims of arXiv:2603.13085 and audit models for influence malleability.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        add_options(p, mod.OPTIONS)
        p.set_defaults(_run=mod.run)
    return parser


EXIT_CODES = interrupts.EXIT_CODES
_received = interrupts.received
install_signal_handlers = interrupts.install


#: Options naming an output folder, by command (checked before the command starts any work).
OUTPUT_FOLDERS = {"claims": "out"}


def _device_ok(device: str) -> bool:
    """auto, cpu, cuda or cuda:N (torch's other devices, such as meta, hold no data to compute on)."""
    if device in ("auto", "cpu", "cuda"):
        return True
    head, _, index = device.partition(":")
    return head == "cuda" and index.isascii() and index.isdigit() and len(index) <= 3


def _check_args(args: argparse.Namespace) -> None:
    """Checks every command gets before it runs: finite numbers, writable output paths."""
    from verify.outputs import check_output_dir

    for key, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UserInputError(f"--{key.replace('_', '-')} must be a finite number, got {value}")
    device = getattr(args, "device", None)
    if isinstance(device, str) and not _device_ok(device):
        raise UserInputError(f"--device {device} is not a device the suite computes on; use cpu or cuda (or cuda:N, "
                             "or auto: CUDA when present)")
    folder = getattr(args, OUTPUT_FOLDERS.get(args.command, ""), None)
    if isinstance(folder, str):
        check_output_dir(folder, f"--{OUTPUT_FOLDERS[args.command]}", manifest=True)
    plot = getattr(args, "plot", None)
    if isinstance(plot, str):
        p = Path(plot).expanduser().absolute()
        if p.is_dir():
            raise UserInputError(f"--plot {plot} is a folder; give a file name (or prefix) for the figures")
        check_output_dir(p.parent, "--plot")
        if not p.parent.is_dir():
            raise UserInputError(f"--plot {plot}: folder {p.parent} does not exist; create it or give another path")


def _interrupted(args: argparse.Namespace) -> int:
    interrupts.ignore()
    signum = _received[-1] if _received else signal.SIGINT
    name = signal.Signals(signum).name
    if hasattr(args, "resume"):
        advice = "finished experiment units are cached; rerun with --resume to continue"
    else:
        advice = "no output was half-written (earlier outputs stay unless the new set was complete); rerun it"
    sys.stderr.write(f"\nverify {args.command}: interrupted ({name}); {advice}\n")
    return EXIT_CODES.get(signum, 130)


def set_threads() -> None:
    """torch intra-op threads: `NTKM_THREADS` (default 1). The experiments are many small matrix products;
    measured on the 2-core machine with one other busy process, an epoch of the paper's network took
    22-24 ms with one thread and 232-624 ms with two (OpenMP threads waiting for a preempted sibling)."""
    import torch

    raw = os.environ.get("NTKM_THREADS", "1")
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise UserInputError(f"NTKM_THREADS must be a positive integer, got '{raw}'")
    torch.set_num_threads(int(raw))


_late: list[int] = []


def _after_finish(signum: int, frame: FrameType | None) -> None:
    """A signal once the command has finished (its outputs complete) while the process shuts down: one line, and
    the command's exit code stands; a second signal ends the process at once."""
    if _late:
        os._exit(EXIT_CODES.get(signum, 130))
    _late.append(signum)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"\nverify: {signal.Signals(signum).name} after the command had finished; its outputs are "
                         "complete\n")


def main(argv: list[str] | None = None) -> int:
    """The `verify` command. Run as the process's entry point (`argv` None), a signal that comes after the
    command finished no longer interrupts the interpreter's shutdown (`_after_finish`)."""
    code = _run_command(argv)
    if argv is None:
        with contextlib.suppress(ValueError):
            for sig in EXIT_CODES:
                signal.signal(sig, _after_finish)
    return code


def _run_command(argv: list[str] | None) -> int:
    install_signal_handlers()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted(argparse.Namespace(command="(starting)"))
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        set_threads()
        _check_args(args)
        code = int(args._run(args) or 0)
        interrupts.checkpoint()
        return code
    except UserInputError as exc:
        if _received:
            return _interrupted(args)
        sys.stderr.write(f"verify {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return _interrupted(args)
    except OSError as exc:  # a path the file system refuses (a name too long, a permission) reached the top
        if _received:
            return _interrupted(args)
        where = f" {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"verify {args.command}: error: cannot use{where[:300]}: {exc.strerror or exc}; give "
                         "another path\n")
        return 2
    except Exception as exc:
        if _received:
            return _interrupted(args)
        if _out_of_memory(exc):
            sys.stderr.write(f"verify {args.command}: error: ran out of memory ({str(exc).splitlines()[0][:160]}); "
                             "give fewer points or a smaller model, or a machine with more memory\n")
            return 2
        raise


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: Python's MemoryError, torch's out-of-memory error (CUDA) or its CPU allocator's."""
    import torch

    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


if __name__ == "__main__":
    sys.exit(main())
