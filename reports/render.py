"""Jinja2 -> HTML -> PDF (weasyprint), written atomically.

Figures are embedded in the HTML as base64 data URIs, so one HTML file is self-contained. When
weasyprint or its system libraries (Pango, HarfBuzz) are missing, `write_pdf` raises
`PdfUnavailable` with a one-line message; callers still keep the HTML.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jinja2

from ntkm.io import atomic_write_bytes, atomic_write_text
from reports.text import fmt, mean_pm

TEMPLATES = Path(__file__).resolve().parent / "templates"


class PdfUnavailable(RuntimeError):
    """weasyprint cannot run here; the message says what to install."""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    env.filters["pm"] = mean_pm
    env.filters["pct"] = lambda v, d=1: "-" if v is None else f"{100 * v:.{d}f} %"
    return env


def image_data_uri(path: str | Path) -> str:
    """A PNG as a data URI for embedding."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def render_html(template: str, context: dict[str, Any]) -> str:
    css = (TEMPLATES / "report.css").read_text()
    return environment().get_template(template).render(css=css, **context)


def write_html(path: str | Path, html: str) -> Path:
    atomic_write_text(path, html)
    return Path(path)


def write_pdf(path: str | Path, html: str) -> Path:
    """Render HTML to PDF with weasyprint and write it atomically."""
    try:
        import weasyprint
    except (ImportError, OSError) as exc:
        raise PdfUnavailable(
            "weasyprint cannot load (" + str(exc).splitlines()[0][:120] + "); install Pango and HarfBuzz "
            "(Debian/Ubuntu: apt-get install libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz0b fonts-dejavu-core; "
            "macOS: brew install pango) — the HTML report was written"
        ) from None
    pdf = weasyprint.HTML(string=html, base_url=str(TEMPLATES)).write_pdf()
    atomic_write_bytes(path, pdf)
    return Path(path)
