"""Float noise on the rules' inputs: a verdict moves only where a number sits within the tolerance of a threshold,
and such claims are flagged as knife edges."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ntkm.codec import Record
from verify import reproducibility as rp


@dataclasses.dataclass(frozen=True)
class Interval(Record):
    value: float
    lo: float
    hi: float
    per_seed: list[float]
    eps: float


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """A claims table with one 'interval above 0' rule per result."""
    rows = []
    for cid, r in results.items():
        v = "holds" if r.lo > 0 else "does not hold"
        rows.append({"id": cid, "verdict": v, "by_protocol": {"proper": {"verdict": v}}})
    return rows


def test_only_a_bound_within_the_tolerance_of_its_threshold_is_a_knife_edge():
    results = {"clear": Interval(0.2, 0.05, 0.3, [0.1, 0.2, 0.3], 0.3),
               "edge": Interval(0.2, 0.5 * rp.TOLERANCE_ABS, 0.3, [0.1, 0.2, 0.3], 0.3),
               "below": Interval(0.0, -0.05, 0.1, [0.0, 0.1], 0.3)}
    rows = _rows(results)
    edges = rp.knife_edges(_rows, results, rows, n=8)
    assert [(e["claim"], e["where"]) for e in edges] == [("edge", "by_protocol/proper"), ("edge", "headline")]
    assert edges[0]["verdicts"] == ["does not hold", "holds"]
    block = rp.reproducibility_block(edges, 8)
    assert block["knife_edge"] == edges and block["tolerance_rel"] == rp.TOLERANCE_REL


def test_noise_moves_every_float_by_at_most_the_tolerance_and_keeps_equal_values_equal():
    noise = rp.FloatNoise(np.random.default_rng(0))
    rec = Interval(0.3, -0.25, math.inf, [0.3, 0.3, 7.0], 0.3)
    out = noise.payload(rec)
    assert isinstance(out, Interval) and out.hi == math.inf
    assert out.value == out.eps == out.per_seed[0] == out.per_seed[1] != 0.3  # one value, one draw
    for a, b in ((rec.lo, out.lo), (rec.per_seed[2], out.per_seed[2]), (rec.value, out.value)):
        assert a != b and abs(b - a) <= (rp.TOLERANCE_REL * abs(a) + rp.TOLERANCE_ABS) * (1 + 1e-9)
    plain = noise({"n": 3, "ok": True, "name": "x", "v": [1.5]})
    assert plain["n"] == 3 and plain["ok"] is True and plain["name"] == "x" and plain["v"][0] != 1.5


def test_verdicts_are_read_at_every_level_of_a_row():
    row = {"id": "a", "verdict": "holds", "by_condition": {"paper+raw": {"verdict": "partly", "numbers": {}}}}
    assert dict(rp.verdicts(row)) == {"headline": "holds", "by_condition/paper+raw": "partly"}


def test_a_rule_that_fails_on_noisy_input_is_reported_not_raised():
    results = {"a": Interval(0.2, 0.05, 0.3, [0.1], 0.3)}

    def fragile(res):
        if res["a"].lo != 0.05:
            raise KeyError("eps 0.30000003 not found")
        return _rows(res)

    (entry,) = rp.knife_edges(fragile, results, _rows(results), n=2)
    assert entry["claim"] == "(check failed)" and entry["where"] == "KeyError"


def test_configuration_blocks_are_not_moved_so_a_zero_weight_decay_stays_a_valid_config():
    """A unit's config is its design, not a measurement: a noisy `weight_decay` 0.0 would rebuild into a negative
    decay that `TrainConfig` rejects (the quick run's check once failed on exactly that)."""
    from dataclasses import asdict

    from empirics.nets.train import TrainConfig

    noise = rp.FloatNoise(np.random.default_rng(1))
    cfg = asdict(TrainConfig(weight_decay=0.0, lr=0.01))
    out = noise({"config": {"train": cfg}, "unit_config": {"train": cfg}, "value": 0.0, "per_seed": [0.5]})
    assert out["config"]["train"] == cfg and out["unit_config"]["train"] == cfg
    TrainConfig(**out["config"]["train"])  # still a valid config
    assert out["value"] != 0.0 and out["per_seed"][0] != 0.5  # measurements still move


def test_a_design_value_stays_put_wherever_it_occurs_so_rules_still_find_their_rows():
    """An eps of 0.3 in a unit's config is also the key its runs are looked up by: it is not moved anywhere, while
    a measurement equal to no design value still moves."""
    results = {"u": {"config": {"eps": 0.3, "train": {"weight_decay": 0.0}},
                     "runs": [{"eps": 0.3, "flip": 0.42}]}}

    def rule(res):
        run = next(r for r in res["u"]["runs"] if r["eps"] == res["u"]["config"]["eps"])
        return [{"id": "a", "verdict": "holds" if run["flip"] > 0 else "does not hold"}]

    assert rp.design_values(results) == {0.3, 0.0}
    assert rp.knife_edges(rule, results, rule(results), n=3) == []
    noise = rp.FloatNoise(np.random.default_rng(0), fixed=frozenset(rp.design_values(results)))
    out = noise(results)
    assert out["u"]["runs"][0]["eps"] == 0.3 and out["u"]["runs"][0]["flip"] != 0.42
