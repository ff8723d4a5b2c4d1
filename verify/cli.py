"""Entry point of the `verify` command.

Each subcommand lives in its own module under `verify/commands/` and exposes `NAME`, `HELP`,
`ORDER`, `add_arguments(parser)` and `run(args) -> int`. Errors the user can fix
(`UserInputError`) become one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from theory.errors import UserInputError


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
    parser = _Parser(
        prog="verify",
        description="Verify the claims of arXiv:2603.13085 and audit models for influence malleability.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserInputError as exc:
        sys.stderr.write(f"verify {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"verify {args.command}: interrupted; finished steps are cached, rerun with --resume\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
