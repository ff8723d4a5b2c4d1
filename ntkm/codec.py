"""The suite's one JSON codec: every stored record (the unit cache, claims.json, audit records, `--json`
output) is written with `dumps` / `write_json` and read with `loads` / `read_json`.

Representation (unchanged from the records written before this module existed): NaN and +-infinity are
stored as the strings "nan", "inf" and "-inf" (strict JSON has no such numbers); numpy scalars and arrays,
torch tensors, tuples, paths and dataclasses become plain JSON values. Reading turns those three strings back
into floats, so a record read back holds the numbers it was written with. `from_dict` builds a dataclass
from its stored dict (nested dataclasses, tuples and the non-finite floats restored by field type).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ntkm.io import MAX_JSON_BYTES, atomic_write_text, parse_json, read_regular

#: The strings that stand for the non-finite floats in a stored record.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
#: Field metadata key: a dataclass field so marked is left out of its stored dict while it is None (the key
#: is absent from the record, as in records whose producer adds it only sometimes).
OMIT_NONE = "omit_none"

T = TypeVar("T")
#: Values `encode` returns as they are, by exact type (subclasses such as enum members take the general path).
_AS_IS = frozenset({str, int, bool, type(None)})


def encode(obj: Any) -> Any:
    """`obj` as plain JSON values: dataclasses and mappings as dicts (keys as strings), sequences, numpy and
    torch values as lists and numbers, enum members as their values, paths as strings, NaN / +-inf as "nan" /
    "inf" / "-inf"."""
    t = type(obj)  # the exact built-in types first (most of a record's values): the same result, sooner
    if t in _AS_IS:
        return obj
    if t is float:
        return str(obj) if math.isnan(obj) or math.isinf(obj) else obj
    if t is dict:
        return {str(k): encode(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [encode(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get(OMIT_NONE) and getattr(obj, f.name) is None)}
    if isinstance(obj, enum.Enum):
        return encode(obj.value)
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return encode(obj.tolist())
    if isinstance(obj, np.generic):
        return encode(obj.item())
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return str(obj)
        return obj
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):  # torch tensors
        return encode(obj.detach().cpu().tolist())
    return obj


#: Written beside an interval whose end is null in a user-facing JSON file (`public`).
NULL_END_KEY = "null_ends_reason"


def public(obj: Any) -> Any:
    """`encode(obj)` for a file a user reads (a command's `--json`): an interval end that is not a finite number
    (`lo` / `hi` of an interval record, either entry of a two-entry `ci`) is written as JSON null, never as the
    string "-inf" / "inf" / "nan", with the reason under `NULL_END_KEY` beside it. The suite's own stored records
    (cache entries, claims.json) keep `encode`'s representation, which reads back as the same floats."""
    return _null_ends(encode(obj))


def _null_ends(v: Any) -> Any:
    if isinstance(v, list):
        return [_null_ends(x) for x in v]
    if not isinstance(v, dict):
        return v
    out = {k: _null_ends(x) for k, x in v.items()}
    nulled = False
    for k in ("lo", "hi"):
        if "lo" in out and "hi" in out and _nonfinite(out[k]):
            out[k], nulled = None, True
    ci = out.get("ci")
    if isinstance(ci, list) and len(ci) == 2 and any(_nonfinite(e) for e in ci):
        out["ci"], nulled = [None if _nonfinite(e) else e for e in ci], True
    if nulled:
        out[NULL_END_KEY] = _end_reason(out)
    return out


def _nonfinite(v: Any) -> bool:
    return isinstance(v, str) and v in NONFINITE


def _end_reason(d: dict[str, Any]) -> str:
    if d.get("bounded") is False:
        return ("unbounded: Fieller's confidence set for the ratio is unbounded (the denominator's mean is not "
                "significantly different from 0)")
    n = d.get("n", d.get("seeds"))
    if isinstance(n, int) and n < 2:
        return f"unbounded: {n} finite per-seed value{'s' if n != 1 else ''}; an interval needs at least two"
    return "not a finite number: the per-seed values it comes from are not finite (NaN or infinite measurements)"


def decode(obj: Any) -> Any:
    """A stored JSON value with "nan", "inf" and "-inf" turned back into floats (everywhere in it)."""
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, str) and obj in NONFINITE:
        return NONFINITE[obj]
    return obj


def dumps(obj: Any) -> str:
    """The stored text of `obj`: indented JSON of `encode(obj)`, one trailing newline."""
    return json.dumps(encode(obj), indent=2, sort_keys=False) + "\n"


def loads(text: str | bytes) -> Any:
    """A record from its stored text, non-finite floats restored (`json.JSONDecodeError` on bad JSON, and on
    nesting or integers beyond `ntkm.io.parse_json`'s bounds)."""
    return decode(parse_json(text))


def canonical(obj: Any) -> str:
    """The canonical one-line text of `obj` (keys sorted, no spaces): what digests and cache keys hash."""
    return json.dumps(encode(obj), sort_keys=True, separators=(",", ":"))


def stable_hash(obj: Any, length: int = 16) -> str:
    """sha256 of the canonical JSON form of `obj`, truncated to `length` hex digits (cache keys, digests)."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:length]


def write_json(path: str | Path, obj: Any) -> None:
    """`dumps(obj)` written atomically to `path` (readers never see half a record)."""
    atomic_write_text(path, dumps(obj))


def read_json(path: str | Path, limit: int = MAX_JSON_BYTES, what: str = "") -> Any:
    """The record stored at `path` (`OSError`, `UnicodeDecodeError` or `json.JSONDecodeError` when unreadable).

    The one JSON reader: the file's type and size are checked before it is read (`ntkm.io.read_regular`: a
    named pipe, device, socket or folder, or a file over `limit` bytes, is a one-line `UserInputError`, never
    a hang), and the text is parsed within `ntkm.io.parse_json`'s bounds (no pattern backtracking)."""
    return loads(read_regular(path, limit, what).decode("utf-8"))


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """The dataclass `cls` built from its stored dict (the inverse of `encode` on a `cls` instance).

    Fields are converted by their annotated type: nested dataclasses, tuples (stored as lists), lists and
    dicts of those, and floats (the strings "nan" / "inf" / "-inf" included). Keys that are not fields of
    `cls` are refused (`TypeError`), so a stored record of another shape is not silently misread.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints, names, required = _schema(cls)
    unknown = set(data) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
    missing = [name for name in required if name not in data]
    if missing:
        raise TypeError(f"stored {cls.__name__} lacks required field(s) {', '.join(missing)}")
    return cls(**{k: _typed(hints[k], v) for k, v in data.items()})


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], frozenset[str], tuple[str, ...]]:
    """A dataclass's field types, its init field names and the required ones among them (computed once per class:
    `typing.get_type_hints` was most of a small record's decoding time)."""
    fs = [f for f in dataclasses.fields(cls) if f.init]
    required = tuple(f.name for f in fs if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    return typing.get_type_hints(cls), frozenset(f.name for f in fs), required


@functools.cache
def _shape(tp: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """An annotation's origin, arguments and whether it is a dataclass (once per annotation)."""
    return typing.get_origin(tp), typing.get_args(tp), dataclasses.is_dataclass(tp) and isinstance(tp, type)


def type_errors(obj: Any) -> list[str]:
    """The fields of a dataclass instance (nested ones included) whose value is not of the annotated type, as
    'Class.field: type'; empty when it conforms. `from_dict` converts but does not check: a stored record edited
    to hold a string where a number goes comes back with the string (the cache recomputes such an entry)."""
    hints = typing.get_type_hints(type(obj))
    return [f"{type(obj).__name__}.{f.name}: {type(getattr(obj, f.name)).__name__}"
            for f in dataclasses.fields(obj) if not _conforms(hints[f.name], getattr(obj, f.name))]


def _conforms(tp: Any, v: Any) -> bool:
    """Whether `v` is of annotated type `tp` (ints count as floats; annotations it does not know pass)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(a, v) for a in args)
    if tp is type(None):
        return v is None
    if tp in (int, float, bool, str):
        kinds = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}[tp]
        return isinstance(v, kinds) and (tp is bool or not isinstance(v, bool))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return isinstance(v, tp) and not type_errors(v)
    if origin is tuple or tp is tuple:
        if not isinstance(v, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(args[0], x) for x in v)
        return not args or (len(args) == len(v) and all(_conforms(a, x) for a, x in zip(args, v, strict=True)))
    if origin is list or tp is list:
        return isinstance(v, list) and (not args or all(_conforms(args[0], x) for x in v))
    if origin is dict or tp is dict:
        return isinstance(v, dict) and (len(args) != 2 or all(_conforms(args[1], x) for x in v.values()))
    return True


def _typed(tp: Any, v: Any) -> Any:
    """The stored value `v` as annotated type `tp` (unknown annotations: the decoded value as stored)."""
    try:
        origin, args, is_record = _shape(tp)
    except TypeError:  # an annotation that cannot be hashed
        origin, args, is_record = typing.get_origin(tp), typing.get_args(tp), dataclasses.is_dataclass(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _typed(options[0], v) if len(options) == 1 else decode(v)
    if tp is float:
        return float(NONFINITE.get(v, v)) if isinstance(v, (str, int, float)) and not isinstance(v, bool) else v
    if is_record and isinstance(v, Mapping):
        return from_dict(tp, v)
    if origin is tuple and isinstance(v, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(args[0], x) for x in v)
        if args and len(args) == len(v):
            return tuple(_typed(a, x) for a, x in zip(args, v, strict=True))
        return tuple(decode(v))
    if origin is list and isinstance(v, list):
        return [_typed(args[0], x) for x in v] if args else decode(v)
    if origin is dict and isinstance(v, Mapping):
        return {k: _typed(args[1], x) for k, x in v.items()} if args else decode(v)
    return decode(v)


def optional(default: Any = None) -> Any:
    """A dataclass field that is absent from the stored dict while it is None (see `OMIT_NONE`)."""
    return dataclasses.field(default=default, metadata={OMIT_NONE: True})


class Record:
    """Base of the suite's typed stored records (dataclasses): `to_dict` is the stored dict, `from_dict` reads it
    back (the one codec both ways: `encode` and the module's `from_dict`). `RENAMED` maps a field's former stored
    name to its name now: a record stored before the rename reads back unchanged."""

    RENAMED: typing.ClassVar[dict[str, str]] = {}

    def to_dict(self) -> dict[str, Any]:
        """The stored dict of this record (`encode`: NaN / inf as strings, tuples as lists)."""
        return encode(self)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        """The record read back from its stored dict (`TypeError` naming the record on a missing or unknown
        field)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"stored {cls.__name__} is a {type(data).__name__}, not a dict")
        renamed = getattr(cls, "RENAMED", {})
        if any(old in data for old in renamed):
            data = {renamed.get(k, k) if renamed.get(k, k) not in data else k: v for k, v in data.items()}
        return from_dict(cls, data)
