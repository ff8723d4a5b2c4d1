"""`verify report claims.json`: re-render Markdown, HTML and PDF from a saved record alone."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from theory.errors import UserInputError

NAME = "report"
HELP = "re-render claims.md / claims.html / claims.pdf from a saved claims.json (no recomputation)"
ORDER = 6


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", help="a claims.json written by 'verify claims'")
    p.add_argument("--out", default=None, help="output folder (default: the record's folder)")
    p.add_argument("--no-pdf", action="store_true", help="skip the PDF")


def run(args: argparse.Namespace) -> int:
    path = Path(args.record)
    if not path.is_file():
        raise UserInputError(f"{path} does not exist; pass the claims.json that 'verify claims' wrote")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path} is not valid JSON ({exc.__class__.__name__}); pass a claims.json") from None
    if not isinstance(record, dict) or "claims" not in record or "summary" not in record:
        raise UserInputError(f"{path} is not a claims record (no 'claims'/'summary'); pass a claims.json")
    from reports.claims_report import render_all

    written = render_all(record, Path(args.out) if args.out else path.parent, pdf=not args.no_pdf)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0 if written.pdf_ok else 3
