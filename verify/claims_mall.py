"""Malleability claims (flip-rate tables, the 6-9x ratio, adversarial training, eps robustness)."""

from __future__ import annotations

from typing import Any

MALLEABILITY_CLAIMS: list = []


def malleability_unit_configs(p: dict[str, Any], data_dir: str | None) -> dict[str, dict[str, Any]]:
    return {}
