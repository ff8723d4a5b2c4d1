"""Typed experiment records from the few fields a rule's test sets: `complete` fills every other required field
with an empty value of its type, so a synthetic record is built and read exactly like a stored one."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from ntkm.codec import Record, encode

R = TypeVar("R", bound=Record)

#: The empty value of each plain field type.
EMPTY: dict[Any, Any] = {dict: dict, list: list, str: str, int: int, float: lambda: math.nan}


def _filled(tp: Any, value: Any) -> Any:
    """`value` with its nested records (a record field, or the values of a dict of records) completed."""
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return _fields(tp, value)
    if typing.get_origin(tp) is dict and isinstance(value, Mapping):
        inner = typing.get_args(tp)[1]
        return {k: _filled(inner, v) for k, v in value.items()}
    return value


def _fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name in data:
            out[f.name] = _filled(tp, data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out[f.name] = (_fields(tp, {}) if dataclasses.is_dataclass(tp)
                           else EMPTY[typing.get_origin(tp) or tp]())
    return out


def complete(cls: type[R], data: Mapping[str, Any]) -> R:
    """The record `cls` with the fields in `data` (nested records completed too) and empty values elsewhere."""
    return cls.from_dict(encode(_fields(cls, data)))
