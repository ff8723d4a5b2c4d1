"""Plain-text and Markdown tables for the terminal and for claims.md, and the number formats the reports share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt(v: Any, digits: int = 3) -> str:
    """Compact number formatting: 3 significant digits, scientific when large or small."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    return str(v)


def eps_label(eps: float) -> str:
    """A perturbation budget as text: 8/255 for multiples of 1/255, else the number."""
    k = eps * 255
    return f"{round(k)}/255" if abs(k - round(k)) < 1e-6 else f"{eps:g}"


def mean_pm(s: dict[str, Any] | None, digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
    """'mean ± std (n=k)' from a spread dict."""
    if not s or not s.get("n"):
        return "-"
    return f"{fmt(s['mean'] * scale, digits)}{unit} ± {fmt(s['std'] * scale, 2)}{unit}"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned plain-text table."""
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def esc(c: Any) -> str:
        return (c if isinstance(c, str) else fmt(c)).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
