"""The paper-preset cost model of `benchmarks.scale`: every network of every unit is counted, as the preset says."""

from __future__ import annotations

from benchmarks.scale import Primitives, estimate_units, needed_epochs
from verify.costs import distance_default
from verify.presets import preset


def gd_mse_twins() -> bool:
    """Whether an NTK-distance unit trains each network a second time under gd-mse (`DistanceConfig.gd_mse`)."""
    return bool(distance_default("gd_mse", False))


def _unit_cost_primitives() -> Primitives:
    """One second per epoch of every network, nothing else: the estimate is then the number of epochs."""
    keys = needed_epochs()
    return Primitives({k: 1.0 for k in keys}, {(d, m): 0.0 for _, d, _, m in keys}, 1, {1: 0.0}, 0.0)


def test_training_estimate_counts_every_epoch_of_every_network():
    p = preset("paper")
    rows = {r["unit"]: r for r in estimate_units(_unit_cost_primitives(), "cpu")}
    seeds, widths = len(p["seeds"]), len(p["widths"])
    twins = 2 if gd_mse_twins() else 1  # the NTK-distance experiment trains a gd-mse twin of every network
    assert rows["ntk-distance:mnist@paper"]["train_s"] == twins * seeds * 2 * widths * p["paper_epochs"]
    assert rows["ntk-distance:cifar10@proper"]["train_s"] == twins * seeds * 2 * widths * p["epochs"]
    # standard networks, plus adversarially trained ones at (adv_steps + 1) epochs' cost for adv_max_epochs epochs
    adv = rows["malleability-adv:mnist@paper"]["train_s"]
    assert adv == seeds * 2 * p["paper_epochs"] + seeds * 2 * min(p["paper_epochs"], p["adv_max_epochs"]) * 8
    # the 10-class unit trains a second initialisation of every network for the seed-to-seed baseline
    assert rows["malleability:mnist:10class@proper"]["train_s"] == 2 * seeds * 2 * p["epochs"]


def test_every_unit_that_trains_has_an_estimate():
    rows = estimate_units(_unit_cost_primitives(), "cpu")
    trains = [r for r in rows if r["unit"].split(":")[0] in ("ntk-distance", "malleability", "malleability-adv",
                                                               "malleability-eps", "landscape", "influence-retrain")]
    assert trains and all(r["train_s"] > 0 for r in trains)
