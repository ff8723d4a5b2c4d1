"""Shared pytest set-up: hypothesis profiles and selection of tests by paper claim.

Profiles: `ci` (bounded, derandomised; chosen when CI is set) and `dev` (more examples,
random). Select the tests of one claim with `pytest --claim thm4.1` (repeatable), all claim-marked tests
with `-m claim`. Every `claim(ID)` marker and every `--claim ID` must name an id of the claims registry
(`verify/claims/`), so a renamed or mistyped id fails collection instead of silently selecting nothing.
The shared numeric tolerances are in `tests/tolerances.py`; the guide is `tests/README.md`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# pytester runs the claim-marker check of this file on fake test files (tests/test_conftest.py).
pytest_plugins = ["pytester"]

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
    parser.addoption("--claim", action="append", default=[], metavar="ID",
                     help="run only tests marked claim(ID); ID must be in the claims registry")


def registry_claim_ids() -> frozenset[str]:
    """The claim ids of the registry (`verify.claims.all_claims`), the only ids a marker may name."""
    from verify.claims import all_claims

    return frozenset(c.id for c in all_claims())


def marker_claim_ids(item: pytest.Item) -> list[str | None]:
    """The ids of an item's `claim` markers, every id of a multi-id marker (None for a marker written without one)."""
    return [cid for m in item.iter_markers("claim") for cid in (m.args or (None,))]


def unknown_claim_markers(items: list[pytest.Item], known: frozenset[str]) -> list[str]:
    """One line per claim marker whose id is missing or not in `known`, naming the test."""
    return [f"{item.nodeid}: claim({cid!r})" for item in items for cid in marker_claim_ids(item)
            if cid not in known]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail collection on a claim id the registry does not have; then apply `--claim` selection."""
    known = registry_claim_ids()
    wanted = set(config.getoption("--claim"))
    bad = unknown_claim_markers(items, known)
    bad += [f"--claim {cid}" for cid in sorted(wanted - known)]
    if bad:
        raise pytest.UsageError("claim ids not in the claims registry (verify/claims/; `verify claims --list` "
                                "lists them):\n  " + "\n  ".join(bad))
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        (keep if set(marker_claim_ids(item)) & wanted else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
