"""The audit's output files (`write_outputs`): the PDF, and beside it on request the HTML, the JSON record, the
Markdown summary for a pull-request comment and the exported attributions, staged and swapped in as one output set
(`verify.outputs`); `earlier_audit_file` says which existing files an earlier audit wrote (only those may be
replaced). `verify.audit.ci.read_record` reads a record back."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ntkm.errors import UserInputError
from verify.audit.budget import REALISTIC_REASON
from verify.audit.ci import summary_markdown
from verify.audit.config import SUMMARY_MARKER

#: Exit code when the PDF cannot be made (weasyprint or its system libraries missing); HTML is written.
PDF_UNAVAILABLE_EXIT = 3


def output_members(out: Path) -> tuple[str, str, str, str]:
    """The files of one audit's output set: the PDF and the HTML, JSON and Markdown summary beside it."""
    return out.name, out.with_suffix(".html").name, out.with_suffix(".json").name, summary_name(out)


def summary_name(out: Path) -> str:
    """The Markdown summary's file name beside the PDF (`--summary`): `<stem>-summary.md`."""
    return f"{out.stem}-summary.md"


def attributions_name(out: Path) -> str:
    """The exported attributions beside the PDF (`--attributions`): `<stem>-attributions.npz`."""
    return f"{out.stem}-attributions.npz"


#: The member that marks an .npz as this suite's exported attributions (so a stale one may be replaced).
ATTRIBUTIONS_MARK = "ntkm_audit_attributions"


def _save_attributions(path: Path, attrib: dict[str, Any]) -> None:
    """The lead estimator's per-test influence and what it is, as plain arrays (no pickled objects)."""
    arrays = {k: np.asarray(v) for k, v in attrib.items() if k not in ("shape", "file")}
    with open(path, "wb") as f:
        np.savez_compressed(f, **{ATTRIBUTIONS_MARK: np.asarray(1)}, **arrays)


def earlier_audit_file(path: Path) -> bool:
    """Whether an existing file is an earlier audit's output (so it may be removed as stale): a PDF, the
    audit HTML, or an audit JSON record; anything else with that name is left alone."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if path.suffix == ".pdf":
        return head.startswith(b"%PDF")
    if path.suffix == ".html":
        return b"Training-data malleability audit" in head
    if path.suffix == ".md":
        return head.startswith(SUMMARY_MARKER.encode())
    if path.suffix == ".npz":
        return head.startswith(b"PK") and f"{ATTRIBUTIONS_MARK}.npy".encode() in head
    return b'"experiment": "audit"' in head


def write_outputs(result: dict[str, Any], out: str | Path, html: bool = False, json_out: bool = False,
                  summary: bool = False, attributions: bool = False) -> int:
    """Render everything, stage the PDF (and HTML / JSON) as one output set, then swap it in.

    `summary` adds the Markdown summary for a pull-request comment (`verify.audit.ci.summary_markdown`);
    `attributions` the lead estimator's per-test influence as `<stem>-attributions.npz` (the JSON keeps its name and
    shape; a record re-rendered from JSON has no array to write).
    Returns 0, or `PDF_UNAVAILABLE_EXIT` (3) when weasyprint cannot run: the HTML is then written anyway.
    A stale member of the set (e.g. last run's PDF when this run could make none) is removed, so the
    files beside each other always come from the same run.
    """
    from ntkm.codec import write_json
    from ntkm.io import atomic_write_text
    from reports.audit_report import render_report
    from reports.render import PdfUnavailable, write_pdf
    from verify.outputs import output_set

    out = Path(out).expanduser().absolute()

    pdf_name, html_name, json_name, md_name = output_members(out)
    npz_name = attributions_name(out)
    attrib = result.get("attributions") or {}
    has_array = isinstance(attrib.get("influence"), np.ndarray)
    if attributions and not has_array:
        raise UserInputError("--attributions needs the audit's arrays, which a record re-rendered from JSON does not "
                             "hold; rerun the audit with --attributions")
    if attrib:
        result = {**result, "attributions": {"estimator": str(attrib["estimator"]), "shape": list(attrib["shape"]),
                                             "file": npz_name if attributions else attrib.get("file")}}
    problem, pdf_ok = "", True
    with output_set(out.parent, (*output_members(out), npz_name), owned=earlier_audit_file,
                    manifest=False) as staged:
        if attributions:
            _save_attributions(staged.path(npz_name), attrib)
        page = render_report(result, REALISTIC_REASON)
        try:
            write_pdf(staged.path(pdf_name), page)
        except PdfUnavailable as exc:
            pdf_ok, problem = False, str(exc)
        if json_out:
            write_json(staged.path(json_name), result)
        if html or not pdf_ok:
            atomic_write_text(staged.path(html_name), page)
        if summary:
            atomic_write_text(staged.path(md_name), summary_markdown(result))
    if not pdf_ok:
        sys.stderr.write(f"verify audit: no PDF: {problem} ({out.with_suffix('.html')})\n")
        return PDF_UNAVAILABLE_EXIT
    return 0
