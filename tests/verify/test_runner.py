"""The unit cache's typed records (`verify.runner.UnitResult` around each unit's own record): what is stored is what
is read back, a stored record of the wrong shape is refused with the record's name and the missing field, and a
cache entry of the wrong shape is recomputed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from empirics.attribution.influence import RetrainRecord
from empirics.experiments.distance import DistanceRecord
from empirics.experiments.landscape import LandscapeJudgement, LandscapeRecord
from empirics.experiments.mall_stats import MallSummary
from empirics.experiments.malleability import MalleabilityRecord
from ntkm import codec
from verify.experiments import kappa_unit, theory_unit
from verify.records import KappaRecord, TheoryRecord
from verify.runner import Cache, Unit, UnitResult


def untimed(stored: dict) -> dict:
    """A stored record without the seconds each theory check or kappa row took."""
    return {k: [{**c, "seconds": 0.0} for c in v] if k in ("checks", "rows") else v for k, v in stored.items()}


def test_theory_and_kappa_units_read_back_as_their_records(tmp_path: Path):
    """The two units assembled in `verify`, on real runs: the cache returns the record the unit computed."""
    theory = Unit("theory", {"seed": 0}, theory_unit, TheoryRecord)
    kappa = Unit("kappa:mnist", {"dataset": "mnist", "ns": [10, 20], "sample": "first", "preprocess": "raw",
                                 "eps": 0.1, "data_dir": None}, kappa_unit, KappaRecord)
    for unit in (theory, kappa):
        computed = unit.fn(**unit.config)
        assert type(computed) is unit.record and unit.record.from_dict(computed.to_dict()) == computed
        stored, cached = Cache(tmp_path, version="v1").run(unit, log=lambda _: None)
        again, cached_again = Cache(tmp_path, version="v1").run(unit, log=lambda _: None)
        assert not cached and cached_again and again == stored and isinstance(again.payload, unit.record)
        assert untimed(again.payload.to_dict()) == untimed(computed.to_dict())  # two runs: timings differ
        flat = json.loads(Cache(tmp_path, "v1").path(unit).read_text())
        assert flat == codec.encode(again.to_dict()) and flat["unit"] == unit.name
        assert list(flat)[:4] == ["unit", "unit_config", "code_version", "unit_wall_s"]
        assert list(flat)[-1] == "result_sha256"
    record = Cache(tmp_path, version="v1").get(theory).payload
    assert record.check("prop4.5").claim_id == "prop4.5" and record.check("no such check") is None
    assert [r["n"] for r in Cache(tmp_path, version="v1").get(kappa).payload.rows] == [10, 20]


@pytest.mark.parametrize("cls", [DistanceRecord, MalleabilityRecord, MallSummary, LandscapeRecord, RetrainRecord,
                                 TheoryRecord, KappaRecord])
def test_a_stored_record_without_a_required_field_is_refused_by_name(cls):
    with pytest.raises(TypeError, match=rf"stored {cls.__name__} lacks required field\(s\) "):
        cls.from_dict({})
    with pytest.raises(TypeError, match=f"{cls.__name__} has no field"):
        cls.from_dict({"no_such_field": 1})
    with pytest.raises(TypeError, match=f"stored {cls.__name__} is a list"):
        cls.from_dict([])


def test_the_missing_field_is_named_and_optional_fields_may_be_absent():
    stored = {"verdict": "not measurable", "reason": "needs both relu and attn"}
    judged = LandscapeJudgement.from_dict(stored)
    assert judged.seeds is None and judged.to_dict() == stored
    summary = {k: [] for k in ("rows", "pooled", "comparisons", "ratios", "curated", "curated_diff",
                               "seed_baseline")}
    with pytest.raises(TypeError, match=r"lacks required field\(s\) bootstrap$"):
        MallSummary.from_dict(summary)
    assert MallSummary.from_dict({**summary, "bootstrap": {}}).adv_train is None
    with pytest.raises(TypeError, match="stored unit result lacks result_sha256"):
        UnitResult.from_dict({"unit": "u", "unit_config": {}, "code_version": "v", "unit_wall_s": 1.0})


def test_a_cache_entry_whose_payload_is_not_the_units_record_is_recomputed(tmp_path: Path):
    """The schema check includes the record type: an entry written for a dict result (digest intact) that lacks the
    record's fields is recomputed, and the fresh entry reads back as the record."""
    calls = []

    def fn(n: int) -> KappaRecord:
        calls.append(n)
        return KappaRecord("mnist", "first", "raw", [{"n": n}], [])

    untyped = Unit("kappa:mnist", {"n": 3}, lambda n: {"rows": [{"n": n}]})
    cache = Cache(tmp_path, version="v1")
    cache.run(untyped, log=lambda _: None)
    typed = Unit("kappa:mnist", {"n": 3}, fn, KappaRecord)
    assert cache.path(typed) == cache.path(untyped) and cache.get(typed) is None
    res, cached = cache.run(typed, log=lambda _: None)
    assert not cached and calls == [3] and res.payload == KappaRecord("mnist", "first", "raw", [{"n": 3}], [])
    assert cache.run(typed, log=lambda _: None) == (res, True)
