"""The loss-landscape claim: sharp minimum for 2L-ReLU, broad flat basin for MLP-Attn."""

from __future__ import annotations

from typing import Any

LANDSCAPE_CLAIMS: list = []


def landscape_unit_configs(p: dict[str, Any], data_dir: str | None) -> dict[str, dict[str, Any]]:
    return {}
