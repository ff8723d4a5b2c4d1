"""Experiment units for `verify claims`, each cached under a key of its config and the code version.

A unit is one call of an experiment function of `theory` or `empirics` (never a re-implementation)
with sizes from a preset. Its result is stored as `<out>/cache/<unit>-<key>.json`, written
atomically once the unit finishes, so an interrupted run loses at most the unit in progress and a
rerun with `--resume` recomputes nothing that had finished. The key hashes the unit's config and a
digest of the source code of `theory/` and `empirics/`, so a code change never reuses a stale result.

Integrity: a unit that fails because of its input or environment (`UserInputError`: missing or
corrupt data, no CUDA, ...) is never cached; the run stops with that one-line error (exit 2) so a
later `--resume` computes the unit once the problem is fixed. A cache file that is not valid JSON
or fails the schema (a dict naming this unit, its config and the code version, whose result fields
match the `result_sha256` stored with them and read back as the unit's typed record, `Unit.record`)
is ignored and recomputed. A finished unit is held as a `UnitResult`: the cache's metadata and the
unit's record, stored flat in one JSON object. Each unit
is claimed with an exclusive `fcntl` lock on `.<unit>-<key>.lock` while it runs; a second run on
the same folder waits for it and then reuses its result instead of computing it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntkm.codec import Record, read_json, stable_hash, type_errors, write_json
from ntkm.errors import UserInputError
from verify.outputs import disk_error

ROOT = Path(__file__).resolve().parents[1]


def code_version() -> str:
    """sha256 over the source of the packages that compute results (theory, empirics)."""
    h = hashlib.sha256()
    for pkg in ("theory", "empirics"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: Fields the cache adds around a unit's own result (not covered by its digest).
META_KEYS = ("unit", "unit_config", "code_version", "unit_wall_s", "result_sha256")


def _digest(entry: dict[str, Any]) -> str:
    """Digest of a cache entry's result fields: a truncated or edited entry no longer matches."""
    return stable_hash({k: v for k, v in entry.items() if k not in META_KEYS}, length=32)


@dataclass(frozen=True)
class Unit:
    """One cached experiment run: `fn(**config)` returns its typed result, a `record` (or, for a unit without a
    record type, a JSON-ready dict)."""

    name: str
    config: dict[str, Any]
    fn: Callable[..., Any]
    record: type[Record] | None = None

    def key(self, version: str) -> str:
        return stable_hash({"unit": self.name, "config": self.config, "code": version})


@dataclass(frozen=True)
class UnitResult:
    """A finished unit as the cache holds it: the metadata the cache adds (`META_KEYS`) and the unit's own result,
    `payload` (its typed record, or a dict for a unit without a record type). Stored flat: the metadata keys and
    the payload's keys side by side in one JSON object."""

    unit: str
    unit_config: dict[str, Any]
    code_version: str
    unit_wall_s: float
    result_sha256: str
    payload: Any

    def to_dict(self) -> dict[str, Any]:
        """The stored dict: metadata, the payload's fields, and the digest last."""
        body = self.payload.to_dict() if isinstance(self.payload, Record) else dict(self.payload)
        return {"unit": self.unit, "unit_config": self.unit_config, "code_version": self.code_version,
                "unit_wall_s": self.unit_wall_s, **body, "result_sha256": self.result_sha256}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], record: type[Record] | None = None) -> UnitResult:
        """A stored unit read back, its payload as `record` when given (`TypeError` naming the missing or unknown
        fields when the stored dict does not have that shape)."""
        missing = [k for k in META_KEYS if k not in data]
        if missing:
            raise TypeError(f"stored unit result lacks {', '.join(missing)}")
        body = {k: v for k, v in data.items() if k not in META_KEYS}
        return cls(data["unit"], data["unit_config"], data["code_version"], data["unit_wall_s"],
                   data["result_sha256"], record.from_dict(body) if record is not None else body)


class Cache:
    """Finished units on disk."""

    def __init__(self, folder: Path, version: str | None = None):
        self.folder = folder
        self.version = version or code_version()

    def path(self, unit: Unit) -> Path:
        safe = unit.name.replace(":", "_").replace("/", "_")
        return self.folder / f"{safe}-{unit.key(self.version)}.json"

    def get(self, unit: Unit) -> UnitResult | None:
        """The cached result, or None when absent, unreadable or not this unit's (schema check, the unit's record
        type included)."""
        p = self.path(unit)
        if not p.exists():
            return None
        try:
            res = read_json(p, what="cache entry")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # a special file or one too large: one line
            return None
        if not isinstance(res, dict) or res.get("unit") != unit.name or res.get("code_version") != self.version:
            return None
        if "unavailable" in res or res.get("result_sha256") != _digest(res):
            return None
        if stable_hash(res.get("unit_config")) != stable_hash(unit.config):
            return None
        try:
            hit = UnitResult.from_dict(res, unit.record)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None
        return None if isinstance(hit.payload, Record) and type_errors(hit.payload) else hit

    @contextlib.contextmanager
    def claim(self, unit: Unit, log: Callable[[str], None]) -> Iterator[None]:
        """Hold the unit's lock file (waiting, with one log line, while another run holds it); the holder removes
        it on release, so no lock file outlives a run (a waiter that then holds a removed file tries again)."""
        try:
            import fcntl
        except ImportError:
            yield
            return
        lock = self.path(unit).with_name(f".{self.path(unit).stem}.lock")
        made = [d for d in (self.folder, *self.folder.parents) if not d.exists()]
        while True:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue  # another run removed the folder it had made, between the two calls
            except OSError as exc:
                raise disk_error(exc, self.folder) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"[wait]   {unit.name}: another run is computing it")
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)
            for d in made:  # folders this claim created, removed again while empty (a refused unit)
                with contextlib.suppress(OSError):
                    d.rmdir()

    def run(self, unit: Unit, log: Callable[[str], None]) -> tuple[UnitResult, bool]:
        """The unit's result, from the cache when present; returns (result, was_cached).

        Raises the unit's `UserInputError` (prefixed with the unit's name) without caching anything.
        """
        hit = self.get(unit)
        if hit is not None:
            log(f"[cached] {unit.name}")
            return hit, True
        with self.claim(unit, log):
            hit = self.get(unit)
            if hit is not None:
                log(f"[cached] {unit.name} (computed by another run)")
                return hit, True
            log(f"[run]    {unit.name} ...")
            t0 = time.perf_counter()
            try:
                res = unit.fn(**unit.config)
            except UserInputError as exc:
                raise input_error(unit, exc) from None
            stored = self.store(unit, res, time.perf_counter() - t0)
        log(f"[done]   {unit.name} in {stored.unit_wall_s:.1f} s")
        return stored, False

    def store(self, unit: Unit, res: Record | dict[str, Any], wall_s: float) -> UnitResult:
        """Write a finished unit's result (its record or dict, with its metadata and digest) atomically; returns it
        as read back, so a result computed anywhere (this process, a Ray worker) is cached the same way."""
        body = res.to_dict() if isinstance(res, Record) else res
        entry = {"unit": unit.name, "unit_config": unit.config, "code_version": self.version, "unit_wall_s": wall_s,
                 **body}
        entry["result_sha256"] = _digest(entry)
        try:
            write_json(self.path(unit), entry)
        except OSError as exc:
            raise disk_error(exc, self.folder) from None
        return UnitResult.from_dict(read_json(self.path(unit)), unit.record)


def config_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """A unit's JSON-style config as keyword arguments of its experiment's config dataclass: lists become tuples,
    `train` a `TrainConfig` (every other value as stored, so the rebuilt config is the one the unit ran)."""
    from empirics.nets.train import TrainConfig

    out = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    if isinstance(out.get("train"), dict):
        out["train"] = TrainConfig(**out["train"])
    return out


def input_error(unit: Unit, exc: BaseException) -> UserInputError:
    """A unit's input or environment error, named after the unit (never cached)."""
    return UserInputError(f"experiment {unit.name}: {exc} (nothing was cached; fix it and rerun with --resume)")
