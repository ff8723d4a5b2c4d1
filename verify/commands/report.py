"""`verify report claims.json`: re-render Markdown, HTML and PDF from a saved record alone.

The outputs (claims.md, claims.html, claims.pdf, figures/) are written as one set
(`verify.outputs`): a failed or interrupted re-render leaves the previous set as it was.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from ntkm.codec import read_json
from ntkm.errors import UserInputError
from verify.commands.options import options
from verify.outputs import check_output_dir, output_set

NAME = "report"
HELP = "re-render claims.md / claims.html / claims.pdf from a saved claims.json (no recomputation)"
ORDER = 6
#: The files and folders one rendering writes (claims.json, the input, is not touched).
REPORT_MEMBERS = ("claims.md", "claims.html", "claims.pdf", "figures")


@dataclass(frozen=True)
class ReportOptions:
    """`verify report`'s options."""

    record: str = field(metadata={"help": "a claims.json written by 'verify claims'", "positional": True})
    out: str | None = field(default=None, metadata={"help": "output folder (default: the record's folder)"})
    no_pdf: bool = field(default=False, metadata={"help": "skip the PDF"})


OPTIONS = options(ReportOptions, "record", "out", "no_pdf")


def check_claims_record(record: Any, path: Path) -> None:
    """Refuse (one line) a record without the structure the claims report draws."""
    if not isinstance(record, dict) or "claims" not in record or "summary" not in record:
        raise UserInputError(f"{path} is not a claims record (no 'claims'/'summary'); pass a claims.json")
    claims = record["claims"]
    if not isinstance(claims, list) or not all(isinstance(c, dict) and "id" in c and "verdict" in c for c in claims):
        raise UserInputError(f"{path}: 'claims' must be a list of claim rows with 'id' and 'verdict'; pass the "
                             "claims.json that 'verify claims' wrote")
    if not isinstance(record["summary"], dict):
        raise UserInputError(f"{path}: 'summary' must be a table of verdict counts; pass a claims.json")


def run(args: argparse.Namespace) -> int:
    path = Path(args.record)
    if path.is_dir():
        raise UserInputError(f"{path} is a folder, not a file; pass the claims.json that 'verify claims' wrote (in "
                             "that folder: verify report FOLDER/claims.json)")
    if not path.exists():
        raise UserInputError(f"{path} does not exist; pass the claims.json that 'verify claims' wrote")
    try:
        record = read_json(path)  # a named pipe or device is refused in one line, never read
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path} is not valid JSON ({exc.__class__.__name__}: {str(exc).splitlines()[0][:120]}); "
                             "pass a claims.json") from None
    check_claims_record(record, path)
    out = check_output_dir(Path(args.out) if args.out else path.parent, manifest=True)
    from reports.claims_report import render_all

    with output_set(out, REPORT_MEMBERS, folders=("figures",)) as staged:
        try:
            written = render_all(record, staged.dir, pdf=not args.no_pdf)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, jinja2.UndefinedError) as exc:
            raise UserInputError(f"{path} lacks fields this version draws ({type(exc).__name__}: "
                                 f"{str(exc)[:80]}); rerun 'verify claims'") from None
    print("wrote " + ", ".join(str(staged.final(p)) for p in written))
    return 0 if written.pdf_ok else 3
