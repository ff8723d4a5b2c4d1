"""Seed stability (`verify.stability`): leave-one-seed-out and the seed bootstrap on synthetic per-seed values with a
known knife edge, and each record layout's resampler on the records of results/claims-quick.json."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from empirics.experiments.premise import BinaryKappaRecord
from ntkm.codec import decode
from verify import stability as S
from verify.claims.base import HOLDS, INCONCLUSIVE, Claim, Outcome

QUICK = Path(__file__).resolve().parents[2] / "results" / "claims-quick.json"


def kappa_record(values: list[float]) -> BinaryKappaRecord:
    """A binary-kappa record whose per-seed value (`binary.kappa`) of seed i is `values[i]`."""
    rows = [{"dataset": "cifar10", "n": 32, "seed": s, "binary": {"kappa": v}, "10class": {"kappa": 1.0}}
            for s, v in enumerate(values)]
    return BinaryKappaRecord.from_dict({"datasets": ["cifar10"], "sample": "first", "seeds": list(range(len(values))),
                                        "rows": rows, "missing": []})


def mean_rule(results: dict) -> Outcome:
    """Holds when the mean over seeds exceeds 1, else inconclusive."""
    vals = [r["binary"]["kappa"] for r in results["kappa:binary"].rows]
    return Outcome(f"{np.mean(vals):.2f}", HOLDS if np.mean(vals) > 1 else INCONCLUSIVE, "synthetic")


#: The conditions of the synthetic runs.
RAW_PROPER = S.RunConditions(("raw",), ("proper",))
CLAIM = Claim("synthetic", "-", "mean above 1", "-", "holds when the mean over seeds exceeds 1", ("kappa:binary",),
              mean_rule)


def test_one_seed_deciding_the_verdict_is_flagged_by_leave_one_out_and_the_bootstrap() -> None:
    st = S.stability([CLAIM], {"kappa:binary": kappa_record([0.0] * 9 + [10.5])}, RAW_PROPER,
                     resampling=S.Resampling(n=1000))
    s = st["synthetic"]
    assert s["computable"] and s["verdict"] == "holds"
    assert s["loo_seeds"] == [9] and s["loo_changes"][0]["verdict"] == "inconclusive"
    # holds exactly when seed 9 is drawn at least once: 1 - 0.9^10 = 0.651
    assert abs(s["bootstrap_agreement"] - (1 - 0.9 ** 10)) < 0.05
    assert s["fragile"] is True and s["resamples"] == 1000


def test_a_clear_verdict_is_stable() -> None:
    s = S.stability([CLAIM], {"kappa:binary": kappa_record([5.0, 6.0, 4.0, 5.5, 4.5])}, RAW_PROPER,
                    resampling=S.Resampling(n=1000))["synthetic"]
    assert s["bootstrap_agreement"] == 1.0 and s["loo_changes"] == [] and s["fragile"] is False


def test_the_bootstrap_is_reproducible_from_its_seed() -> None:
    res = {"kappa:binary": kappa_record([0.0] * 9 + [10.5])}
    a = S.stability([CLAIM], res, RAW_PROPER, resampling=S.Resampling(n=200, seed=1))["synthetic"]
    b = S.stability([CLAIM], res, RAW_PROPER, resampling=S.Resampling(n=200, seed=1))["synthetic"]
    assert a == b


def test_a_claim_without_seeds_says_why_it_is_not_computable() -> None:
    claim = Claim("kappa-only", "-", "-", "-", "-", ("kappa:mnist",), mean_rule)
    s = S.stability([claim], {"kappa:mnist": {"rows": []}}, RAW_PROPER,
                    resampling=S.Resampling(n=10))["kappa-only"]
    assert s["computable"] is False and s["reason"].startswith("not computable: ")


def test_labels_give_a_repeated_seed_a_fresh_label() -> None:
    assert S.labels([0, 1, 2], [2, 2, 0]) == [2, 3, 0]
    assert S.labels([3, 5, 9], [0, 2]) == [3, 9]


def test_pick_takes_the_drawn_seeds_in_order_and_relabels() -> None:
    items = [{"seed": s, "w": w} for s in (0, 1, 2) for w in (8, 16)]
    got = S.pick(items, [0, 1, 2], [2, 2], [2, 3])
    assert [(g["seed"], g["w"]) for g in got] == [(2, 8), (2, 16), (3, 8), (3, 16)]


# ---- each layout on a real record --------------------------------------------------------------------------------

@cache
def quick_results() -> dict:
    if not QUICK.exists():
        pytest.skip("results/claims-quick.json is not in this checkout")
    return S.results_from_record(json.loads(QUICK.read_text()))


def one_unit(layout: str) -> tuple[str, object]:
    name, rec = next((k, v) for k, v in quick_results().items() if type(v).__name__ == layout)
    return name, rec


def seeds_in(layout: str, rec: dict) -> list[int]:
    if layout == "DistanceRecord":
        return [r["seed"] for r in rec["models"]["relu"]["runs"]]
    if layout == "LandscapeRecord":
        return [r["seed"] for r in rec["models"]["relu"]["runs"]]
    if layout == "MalleabilityRecord":
        return [r["seed"] for r in rec["runs"]]
    if layout == "BinaryKappaRecord":
        return [r["seed"] for r in rec["rows"]]
    return rec["config"]["seeds"]


def close(a: object, b: object) -> bool:
    """Equal, floats to 1e-9 relative (least squares may differ in the last bits from the machine that ran it)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b


@pytest.mark.parametrize("layout", sorted(S.LAYOUTS))
def test_each_layout_reproduces_its_record_with_every_seed_once_and_uses_the_seeds_given(layout: str) -> None:
    name, rec = one_unit(layout)
    plain = S._as_dict(rec)
    seeds = S.LAYOUTS[layout].seeds(plain)
    same = S.typed(type(rec), S.LAYOUTS[layout].resample(plain, range(len(seeds)), seeds))
    stored, again = decode(rec.to_dict()), decode(same.to_dict())
    assert set(again) == set(stored)  # the record's shape
    for key in ("models", "summary", "verdict", "flips", "seed_flips", "resolved", "rows"):
        if key in stored:
            assert close(again[key], stored[key]), (name, key)
    positions = [1, 1, 0]
    drawn = S.typed(type(rec), S.LAYOUTS[layout].resample(plain, positions, S.labels(seeds, positions)))
    d = decode(drawn.to_dict())
    assert set(d) == set(stored)
    got = seeds_in(layout, d)
    assert sorted(set(got)) == sorted({seeds[1], max(seeds) + 1, seeds[0]})
    per = len(seeds_in(layout, stored)) // len(seeds)  # items per seed (widths, models x trainings, ...)
    assert len(got) == per * len(positions)


def test_retrain_flip_columns_follow_the_drawn_seeds() -> None:
    _, rec = one_unit("RetrainFlipRecord")
    plain = S._as_dict(rec)
    out = S.resample_retrain_flip(plain, [2, 0], [2, 0])
    for sn, by in plain["effects"].items():
        for ln, m in by.items():
            assert out["effects"][sn][ln] == [[row[2], row[0]] for row in m]


def test_the_bootstrap_in_worker_processes_counts_what_one_process_counts(monkeypatch) -> None:
    """The parallel bootstrap (spawned workers, draws made in the parent) against the same draws counted here, on
    the results of the real quick run for the claims whose rules read per-seed units."""
    import os

    record = json.loads(QUICK.read_text())
    only = ["ntk-contrast-cifar10", "adversarial-intervention"]
    parallel = S.from_record(record, n=2 * S.CHUNK, only=only)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    serial = S.from_record(record, n=2 * S.CHUNK, only=only)
    assert parallel == serial
    assert all(parallel[c]["resamples"] == 2 * S.CHUNK for c in only)


def test_the_memoised_slope_is_the_slope_and_keys_on_every_value() -> None:
    from empirics.intervals import loglog_slope

    memo = S._memo_slope(loglog_slope)
    w = [16, 64, 256, 1024]
    for v in ([1.0, 0.5, 0.3, 0.1], [1.0, float("nan"), 0.3, 0.1], [1.0, 0.5, 0.3, 0.2], [2.0, 0.5, 0.3, 0.1]):
        assert memo(w, v) == loglog_slope(w, v)
        assert memo(w, np.array(v)) == loglog_slope(w, v)  # a hit gives the same float
    assert memo(w[:2], [1.0, 0.5]) == loglog_slope(w[:2], [1.0, 0.5])


def test_the_bootstrap_with_its_memos_counts_what_it_counts_without(monkeypatch) -> None:
    """The memoised slope and prepared malleability records (`Layout.prepare`) against the plain functions, on the
    real quick run's claims that read distance slopes and malleability summaries."""
    import os

    record = json.loads(QUICK.read_text())
    only = ["ntk-contrast-cifar10", "adversarial-intervention"]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    fast = S.from_record(record, n=S.CHUNK, only=only)
    monkeypatch.setattr(S, "_memo_slope", lambda f: f)
    layout = S.LAYOUTS["MalleabilityRecord"]
    monkeypatch.setitem(S.LAYOUTS, "MalleabilityRecord", S.Layout(layout.seeds, layout.resample, layout.axis))
    assert S.from_record(record, n=S.CHUNK, only=only) == fast
