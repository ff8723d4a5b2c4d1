"""Shared pytest set-up: hypothesis profiles and selection of tests by paper claim.

Profiles: `ci` (bounded, derandomised; chosen when CI is set) and `dev` (more examples,
random). Select tests of one claim with `pytest --claim thm4.1` or `-m claim`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--claim", action="append", default=[], help="run only tests marked claim(ID)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(config.getoption("--claim"))
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        ids = {m.args[0] for m in item.iter_markers("claim") if m.args}
        (keep if ids & wanted else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
