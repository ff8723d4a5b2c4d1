"""Pure-data readers of the tables stored in experiment records, shared by the typed records of `empirics` and the
renderers of `reports` (which read the stored dicts and may import only `ntkm` and `theory`).

A distance record's `per_width` table maps each width, written as a string (JSON object keys are strings), to the
spread over seeds of every metric (`{"mean", "std", "min", "max", "n"}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def widths(per_width: Mapping[str, Any]) -> list[int]:
    """The widths of a `per_width` table, ascending."""
    return sorted(int(w) for w in per_width)


def at_width(per_width: Mapping[str, Any], width: int, metric: str) -> dict[str, Any]:
    """The spread over seeds of `metric` at `width` in a `per_width` table (`KeyError` when either is absent)."""
    return per_width[str(width)][metric]
