"""Unit names (`verify.claims.units`): the names `verify claims` builds are the ones the stored smoke record
(written before the names had one definition) holds, and every claim reads only units that exist."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from verify.claims import PROTOCOLS, all_claims, protocol_units, units
from verify.experiments import units_for

BASELINE = Path(__file__).resolve().parents[1] / "data" / "smoke-claims-43279c4.json.gz"


def test_unit_names_are_those_of_the_stored_record():
    stored = json.loads(gzip.decompress(BASELINE.read_bytes()))["units"]
    assert list(units_for("smoke")) == list(stored)


def test_names():
    assert units.malleability("cifar10", "binary") == "malleability:cifar10:binary"
    assert units.ntk_distance("mnist") == "ntk-distance:mnist"
    assert units.ntk_distance("mnist", "qkv") == "ntk-distance:mnist:qkv"
    assert units.at(units.landscape("mnist"), "paper") == "landscape:mnist@paper"
    assert units.influence_retrain("attn") == "influence-retrain:attn"


def test_every_claim_reads_units_that_exist():
    known = set(units_for("full"))
    for c in all_claims():
        for p in PROTOCOLS if c.empirical else (None,):
            assert set(protocol_units(c, p)) <= known, c.id
