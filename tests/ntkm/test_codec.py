"""The one JSON codec (`ntkm.codec`): round trips with NaN / infinity and numpy values, the stored
representation of today's records, typed dataclass decoding, and the cache and audit reading back what
they wrote."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ntkm import codec

BASELINE = Path(__file__).resolve().parents[1] / "data" / "smoke-claims-43279c4.json.gz"

floats = st.floats(allow_nan=True, allow_infinity=True)
texts = st.text(max_size=8).filter(lambda s: s not in codec.NONFINITE)
scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | floats | texts
arrays = st.lists(floats, max_size=5).map(lambda v: np.asarray(v, dtype=np.float64))
values = st.recursive(scalars | arrays | st.floats(width=32).map(np.float32) | st.integers(-99, 99).map(np.int64),
                      lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(texts, inner, max_size=4), max_leaves=20)


def plain(v):
    """What a value should read back as, built without the codec: containers as lists and dicts, numpy as
    Python numbers (float32 widened exactly as numpy does)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return [float(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def same(a, b) -> bool:
    """Equality that counts NaN equal to NaN and tells 1 from 1.0 from True."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@settings(max_examples=200, deadline=None)
@given(values)
def test_round_trip_preserves_nan_infinity_and_numpy(v):
    assert same(codec.loads(codec.dumps(v)), plain(v))


class _Dict(dict):
    pass


class _List(list):
    pass


class _Float(float):
    pass


class _Int(int):
    pass


def subclassed(v):
    """`v` with every dict, list, tuple, float and int replaced by a subclass of it: `encode` takes its general
    path (isinstance checks) for these instead of its fast path by exact type."""
    if isinstance(v, dict):
        return _Dict({k: subclassed(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return _List(subclassed(x) for x in v)
    if type(v) is float:
        return _Float(v)
    if type(v) is int:
        return _Int(v)
    return v


@settings(max_examples=200, deadline=None)
@given(values)
def test_encode_by_exact_type_gives_what_the_general_path_gives(v):
    """The fast path (exact built-in types) against the general one (the same values as subclasses)."""
    assert json.dumps(codec.encode(v)) == json.dumps(codec.encode(subclassed(v)))


def test_non_finite_numbers_are_stored_as_the_strings_of_todays_records():
    text = codec.dumps({"a": float("nan"), "b": [np.inf, -np.inf], "c": np.float64("nan")})
    assert json.loads(text) == {"a": "nan", "b": ["inf", "-inf"], "c": "nan"}
    assert "NaN" not in text and "Infinity" not in text


def test_stored_claims_record_re_encodes_to_itself():
    """The baseline claims.json (written before the codec existed) decodes and encodes back unchanged, and
    holds the non-finite strings this codec turns into floats."""
    raw = json.loads(gzip.decompress(BASELINE.read_bytes()))
    decoded = codec.loads(json.dumps(raw))
    assert codec.encode(decoded) == raw
    flat = json.dumps(raw)
    assert '"inf"' in flat or '"-inf"' in flat or '"nan"' in flat


def test_canonical_text_and_hash_ignore_key_order():
    assert codec.canonical({"b": 1, "a": [1.5, float("inf")]}) == '{"a":[1.5,"inf"],"b":1}'
    assert codec.stable_hash({"a": 1, "b": 2}) == codec.stable_hash({"b": 2, "a": 1})
    assert codec.stable_hash({"a": 1}) != codec.stable_hash({"a": 2})
    assert len(codec.stable_hash({}, length=32)) == 32


@dataclass(frozen=True)
class Interval:
    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Row:
    name: str
    ci: Interval
    per_seed: tuple[float, ...]
    pair: tuple[int, float]
    extra: dict[str, float] = field(default_factory=dict)
    note: str | None = None
    best: Interval | None = None


intervals = st.builds(Interval, floats, floats, floats)
rows = st.builds(Row, texts, intervals, st.tuples(floats, floats) | st.tuples(), st.tuples(st.integers(), floats),
                 st.dictionaries(texts, floats, max_size=3), st.none() | texts, st.none() | intervals)


@settings(max_examples=150, deadline=None)
@given(rows)
def test_dataclass_round_trip_through_stored_json(row):
    back = codec.from_dict(Row, json.loads(codec.dumps(row)))
    assert same(codec.encode(back), codec.encode(row))
    assert isinstance(back.ci, Interval) and isinstance(back.per_seed, tuple)
    assert all(isinstance(x, float) for x in (back.ci.value, back.ci.lo, back.ci.hi, *back.per_seed))


def test_from_dict_refuses_unknown_fields():
    with pytest.raises(TypeError, match="no field"):
        codec.from_dict(Interval, {"value": 1.0, "lo": 0.0, "hi": 2.0, "width": 3.0})


def test_a_renamed_field_reads_back_from_a_record_stored_before_the_rename():
    """`Record.RENAMED`: a kappa record stored with the former key `preprocessing` reads back as `preprocess`; the
    new key wins where both are present, and an unknown key is still refused."""
    from verify.records import KappaRecord

    old = {"dataset": "mnist", "sample": "first", "preprocessing": "unit", "rows": [], "missing": []}
    back = KappaRecord.from_dict(old)
    assert back.preprocess == "unit" and "preprocessing" not in back.to_dict()
    assert KappaRecord.from_dict(back.to_dict()) == back
    with pytest.raises(TypeError, match="no field"):
        KappaRecord.from_dict({**old, "preprocess": "raw"})
    with pytest.raises(TypeError, match="no field"):
        KappaRecord.from_dict({**old, "colour": "red"})


def test_cache_reads_back_what_it_wrote(tmp_path):
    from verify.runner import Cache, Unit

    def fn(n: int) -> dict:
        return {"values": np.arange(n) / 2.0, "ratio": float("inf"), "missing": float("nan"), "k": np.int64(n)}

    unit = Unit("codec-test", {"n": 3}, fn)
    stored, cached = Cache(tmp_path, version="v1").run(unit, log=lambda _: None)
    assert not cached
    again, cached = Cache(tmp_path, version="v1").run(unit, log=lambda _: None)
    assert cached and same(again.to_dict(), stored.to_dict())
    got = again.payload
    assert got["values"] == [0.0, 0.5, 1.0] and got["ratio"] == math.inf and math.isnan(got["missing"])
    assert got["k"] == 3 and json.loads(Cache(tmp_path, "v1").path(unit).read_text())["ratio"] == "inf"


def test_audit_record_reads_back_what_it_wrote(tmp_path):
    """The audit's writer and the codec reader its `read_record` parses with."""
    rec = {"experiment": "audit", "risk": {"high_floor": float("inf"), "value": float("nan")},
           "levers": [np.float32(0.25)]}
    codec.write_json(tmp_path / "audit.json", rec)
    back = codec.read_json(tmp_path / "audit.json")
    assert back["risk"]["high_floor"] == math.inf and math.isnan(back["risk"]["value"])
    assert back["levers"] == [0.25]
