"""Unit names (`verify.claims.units`): the names `verify claims` builds are the ones the stored smoke record
(written before the names had one definition) holds, and every claim reads only units that exist."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from verify.claims import PROTOCOLS, all_claims, optional_units, protocol_units, units
from verify.experiments import units_for

BASELINE = Path(__file__).resolve().parents[1] / "data" / "smoke-claims-43279c4.json.gz"


#: Units added after the stored record was written (each with its own name function or constant).
ADDED_SINCE = (units.INFLUENCE_CONTROL,) + tuple(units.at(units.flip_retrain(m), p) for p in ("paper", "proper")
                                                 for m in ("relu", "attn"))


def test_unit_names_are_those_of_the_stored_record():
    """The names of every unit the stored record has are unchanged, in its order; the only others are those added
    since (`ADDED_SINCE`)."""
    stored = json.loads(gzip.decompress(BASELINE.read_bytes()))["units"]
    assert [u for u in units_for("smoke") if u not in ADDED_SINCE] == list(stored)
    assert set(units_for("smoke")) - set(stored) == set(ADDED_SINCE)


def test_names():
    assert units.malleability("cifar10", "binary") == "malleability:cifar10:binary"
    assert units.ntk_distance("mnist") == "ntk-distance:mnist"
    assert units.ntk_distance("mnist", "qkv") == "ntk-distance:mnist:qkv"
    assert units.at(units.landscape("mnist"), "paper") == "landscape:mnist@paper"
    assert units.influence_retrain("attn") == "influence-retrain:attn"
    assert units.flip_retrain("attn") == "flip-retrain:attn"
    assert units.flip_retrain("attn", "mnist", "10class") == "flip-retrain:attn"  # MNIST keeps its first name
    assert units.flip_retrain("relu", "cifar10", "10class") == "flip-retrain:cifar10:10class:relu"


def test_every_claim_reads_units_that_exist():
    known = set(units_for("full", every_set=True))
    for c in all_claims():
        for p in PROTOCOLS if c.empirical else (None,):
            assert set(protocol_units(c, p)) | set(optional_units(c, p)) <= known, c.id
