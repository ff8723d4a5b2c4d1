"""The units' cost model (`verify.costs`): its network identity against the process's real memo of trained networks,
its linearity (the columns the fit uses reproduce the estimate), the fit recovering known constants, groups and
the wall time of workers taking tasks in order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import empirics.common as common
from verify import costs
from verify.experiments import units_for

#: A training config for units that are only counted, never run.
TRAIN = {"protocol": "paper", "epochs": 3, "lr": 0.01, "batch_size": 128}


def _pair() -> list[tuple[str, dict]]:
    """A tiny NTK-distance unit and a malleability unit at one of its widths on the same data (both per-seed subsets
    of n_train points): the malleability unit's networks are the distance unit's at that width."""
    from verify.experiments import protocol_train
    from verify.presets import preset

    train = {**protocol_train(preset("smoke"), "paper"), "epochs": 3}
    base = {"dataset": "mnist", "seeds": [0, 1], "n_train": 40, "n_test": 20, "data_dir": None, "train": train}
    dist = {**base, "widths": [16, 32]}
    mall = {**base, "width": 32, "attacks": ["fgsm"], "interventions": ["transformed"], "attack_steps": 2,
            "eps": 0.3, "tau": 0.1, "task": "10class"}
    return [("ntk-distance:mnist@paper", dist), ("malleability:mnist:10class@paper", mall)]


@pytest.mark.slow
def test_predicted_reuse_is_the_memos(monkeypatch):
    """Run the two units in one process and count the networks each one added to the memo of trained networks
    (`empirics.common._TRAINED`: every network a unit trains on keyed data goes there, however it was trained)."""
    from verify.experiments import distance_unit, malleability_unit

    monkeypatch.setattr(common, "_TRAINED", common._TRAINED.__class__())
    units = _pair()
    predicted = costs.plan(units)
    trained = []
    for (_, cfg), fn in zip(units, (distance_unit, malleability_unit), strict=True):
        before = len(common._TRAINED)
        fn(**cfg)
        trained.append(len(common._TRAINED) - before)
    assert [p.networks - p.reused for p in predicted.values()] == trained
    assert trained[1] == 0 and predicted["malleability:mnist:10class@paper"].reused == 4  # 2 seeds x 2 models
    assert costs.groups(units) == [[n for n, _ in units]]


def test_the_estimate_is_linear_in_the_constants():
    units = [(n, u.config) for n, u in units_for("full").items()]
    est = [c.total_s for c in costs.plan(units).values()]
    feats = costs.features(units)
    again = [sum(f * costs.CALIBRATED.c[k] for f, k in zip(row, costs.CONSTANT_NAMES, strict=True)) for row in feats]
    assert again == pytest.approx(est, rel=1e-12)


def test_the_fit_recovers_constants_that_generated_the_times():
    units = [(n, u.config) for n, u in units_for("full").items()]
    truth = {k: v * (1.0 + 0.5 * i) for i, (k, v) in enumerate(costs.CALIBRATED.c.items())}
    times = [c.total_s for c in costs.plan(units, costs.Analytic(truth)).values()]
    fitted = costs.fit(units, times)
    pred = [c.total_s for c in costs.plan(units, costs.Analytic(fitted)).values()]
    assert pred == pytest.approx(times, rel=1e-6)
    assert costs.agreement(pred, times)["median_ratio"] == pytest.approx(1.0)


def test_counting_of_networks_follows_the_config():
    units = units_for("full")
    d = units["ntk-distance:mnist@paper"].config
    nets = costs.networks("ntk-distance:mnist@paper", d)
    gd = [n for n in nets if "gd-mse" in n.key]  # the gd-mse twin of every network, where the experiment trains one
    assert len(nets) - len(gd) == len(d["seeds"]) * 2 * len(d["widths"]) and len(gd) in (0, len(nets) - len(gd))
    m = units["malleability:mnist:10class@proper"].config
    assert len(costs.networks("malleability:mnist:10class@proper", m)) == 2 * len(m["seeds"]) * 2  # seed baseline
    adv = costs.networks("malleability-adv:mnist@paper", units["malleability-adv:mnist@paper"].config)
    assert {(n.regime, n.factor) for n in adv} == {("full", 1.0), ("full", 8.0)}


def test_groups_are_transitive_and_keep_the_run_order():
    a = {"dataset": "mnist", "seeds": [0], "n_train": 10, "n_test": 5, "train": TRAIN}
    units = [("ntk-distance:x", {**a, "widths": [8]}), ("theory", {"seed": 0}),
             ("malleability:y", {**a, "width": 8, "models": ["relu", "qkv"]}),
             ("ntk-distance:z", {**a, "widths": [16], "models": ["qkv"]}),
             ("malleability:w", {**a, "width": 16, "models": ["qkv"]})]
    assert costs.groups(units) == [["ntk-distance:x", "malleability:y"], ["theory"],
                                   ["ntk-distance:z", "malleability:w"]]


@pytest.mark.parametrize("tasks, jobs, wall", [([3, 3, 2, 2, 2], 2, 7), ([5, 1, 1], 1, 7), ([5, 1, 1], 4, 5),
                                               ([], 2, 0)])
def test_makespan_of_workers_taking_the_next_task(tasks, jobs, wall):
    assert costs.makespan(tasks, jobs) == wall


def test_retrain_flip_units_are_priced_at_their_data_sets_input_dimension():
    """The kernels of a retrain-based flip unit are priced at its data set's d (CIFAR-10: 3072), like its epochs."""
    units = units_for("full")
    mnist = units["flip-retrain:attn@proper"].config
    cifar = units["flip-retrain:cifar10:10class:attn@proper"].config
    assert {k: v for k, v in cifar.items() if k not in ("dataset", "train")} == \
        {k: v for k, v in mnist.items() if k not in ("dataset", "train")}
    prim = costs.CALIBRATED
    n = cifar["n_train"] + cifar["n_test"]
    assert costs.kernel_work("flip-retrain:cifar10:10class:attn@proper", cifar, prim) == pytest.approx(
        3 * (prim.kernel(3072, n, cifar["width"]) + prim.solve_at(n)))
    assert costs.unit_seconds("flip-retrain:cifar10:10class:attn@proper", cifar, prim).total_s > \
        2 * costs.unit_seconds("flip-retrain:attn@proper", mnist, prim).total_s


def _record(root, constants: dict) -> None:
    """A device check's record under `root` (results/gpu-check.json) with these primitives."""
    import json

    (root / "results").mkdir()
    rec = {"sections": {"environment": {"status": "ok", "result": {"gpu": "TestGPU", "code_version": "abc"}},
                        "primitives": {"status": "ok", "result": {"constants": constants}}}}
    (root / costs.GPU_RECORD).write_text(json.dumps(rec))


def test_a_record_that_timed_the_host_solve_prices_the_device_solve_as_modelled(tmp_path):
    """A device check from before the influence solves ran on the GPU (no `solve_host`) timed the host's solve: the
    plan keeps its other constants, models the device's solve and says so; a newer record's solve is used as is."""
    measured = {k: 1e-12 * (i + 1) for i, k in enumerate(costs.CONSTANT_NAMES)}
    old = tmp_path / "old"
    old.mkdir()
    _record(old, measured)
    prim = costs.gpu_prices(old)
    assert prim.stacked and prim.c["solve"] == costs.GPU_SOLVE_MODELLED
    assert all(prim.c[k] == v for k, v in measured.items() if k != "solve")
    assert "TestGPU" in prim.source and "solve modelled" in prim.source
    new = tmp_path / "new"
    new.mkdir()
    _record(new, {**measured, costs.DEVICE_SOLVE_MARK: 5.0})
    prim = costs.gpu_prices(new)
    assert prim.c == measured and "modelled" not in prim.source
    assert costs.gpu_prices(tmp_path / "none") is costs.GPU_MODELLED


@given(st.lists(st.floats(0.0, 1000.0), max_size=30), st.floats(1.0, 600.0))
def test_parts_are_consecutive_groups_within_the_budget(seconds, budget):
    grouped = [([f"u{i}", f"v{i}"], s) for i, s in enumerate(seconds)]
    cut = costs.parts(grouped, budget)
    assert [n for names, _ in cut for n in names] == [n for names, _ in grouped for n in names]
    for names, sec in cut:
        assert sec == pytest.approx(sum(s for i, s in enumerate(seconds) if f"u{i}" in names))
        assert sec <= budget or len(names) == 2  # over the budget only as one group of its own
    # greedy: no part could have taken the next part's first group
    for (_, a), (names, _) in itertools.pairwise(cut):
        first = seconds[int(names[0][1:])]
        assert a + first > budget
