"""The malleability protocol end to end on real MNIST (small n), its JSON record, and the CLI's errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from tolerances import F32_ROUNDING

from empirics.experiments.mall_stats import ratio
from empirics.experiments.malleability import (
    MalleabilityConfig,
    MalleabilityRecord,
    compare,
    n_top,
    run_malleability,
    top_by_abs,
)
from empirics.nets.train import TrainConfig
from ntkm import codec
from ntkm.errors import UserInputError
from verify.claims.base import Verdict
from verify.claims.malleability import experiment_outcomes
from verify.cli import main

SMOKE = MalleabilityConfig(dataset="mnist", width=64, n_train=60, n_test=20, seeds=(0, 1), tau=0.1,
                           eps=0.3, eps_sweep=(0.0,), attack_steps=2, train=TrainConfig(epochs=2))


@pytest.fixture(scope="module")
def smoke_record():
    record = run_malleability(SMOKE)
    stored = MalleabilityRecord.from_dict(codec.loads(codec.dumps(record)))
    assert stored == record and MalleabilityRecord.from_dict(record.to_dict()) == record
    return stored


@pytest.mark.claim("flip-mnist", "eps-robustness")
def test_record_has_what_claims_and_reports_need(smoke_record):
    r = smoke_record
    assert r.experiment == "malleability"
    assert r.eps_values == [0.3, 0.0]
    assert r.n_selected == 6
    assert {"versions", "device", "data", "config", "summary", "definitions", "wall_s"} <= set(r.to_dict())
    assert "adv_train" not in r.to_dict()["summary"]  # present only when adversarial training ran
    assert r.data["label"].startswith("MNIST")
    assert len(r.runs) == 4  # 2 seeds x 2 models, each trained once
    outcomes = experiment_outcomes(r)
    assert [name for name, _ in outcomes] == ["Attn more malleable", "ranking over eps"]
    for _, o in outcomes:
        assert o.verdict in set(Verdict) and o.gate


@pytest.mark.claim("flip-mnist", "ratio-6-9x", "curated-removal", "adversarial-intervention", "spearman-rankings")
def test_flip_rates_baseline_and_examples_are_consistent(smoke_record):
    for run in smoke_record.runs:
        sel = run["selected"]
        assert len(sel) == run["n_selected"] == 6
        ms = [m for m in run["measurements"] if m["intervention"] != "curated"]
        assert {(m["intervention"], m["attack"], m["eps"]) for m in ms} == {
            (i, a, e) for i in ("transformed", "adversarial") for a in ("random", "fgsm", "pgd", "mim")
            for e in (0.3, 0.0)}
        olds = None
        for m in ms:
            assert 0.0 <= m["flip_rate"] <= 1.0 and 0.0 <= m["pair_flip_rate"] <= 1.0
            assert m["max_abs_perturbation"] <= m["eps"] + F32_ROUNDING
            ex = m["examples"]
            assert [e["index"] for e in ex] == sel
            for e in ex:
                assert e["flipped"] == (np.sign(e["old"]) != np.sign(e["new"]))
            assert m["flip_rate"] == pytest.approx(np.mean([e["flipped"] for e in ex]))
            cur = [e["old"] for e in ex]
            olds = cur if olds is None else olds
            assert cur == olds  # one clean influence per trained network
            if m["eps"] == 0.0:
                assert m["flip_rate"] == 0.0
                assert m["rho_all"] == pytest.approx(1.0)
                assert all(e["new"] == pytest.approx(e["old"], rel=1e-9, abs=1e-12) for e in ex)
        cur = [m for m in run["measurements"] if m["intervention"] == "curated"]
        assert {m["attack"] for m in cur} == {"removal", "random"}
        removal = next(m for m in cur if m["attack"] == "removal")
        assert removal["removed"] == sel
        assert -1.0 <= removal["rho_remaining"] <= 1.0


@pytest.mark.claim("flip-mnist", "ratio-6-9x", "curated-removal")
def test_summary_rows_and_ratios(smoke_record):
    s = smoke_record.summary
    head = [r for r in s.rows if r["intervention"] == "transformed" and r["eps"] == 0.3]
    want = {(m, a) for m in ("relu", "attn") for a in ("fgsm", "pgd", "mim")}
    assert {(r["model"], r["attack"]) for r in head} == want
    for r in head:
        assert r["flip_rate"]["n"] == 2 and 0.0 <= r["flip_rate"]["mean"] <= 1.0
        assert r["baseline_flip_rate"]["n"] == 2
        assert r["paper_flip_pct"] is not None
        assert r["n_seeds"] == 2 and r["n_points"] == [6, 6]
        lo, hi = float(r["flip_ci"]["lo"]), float(r["flip_ci"]["hi"])
        assert lo <= r["flip_ci"]["value"] <= hi and r["flip_ci"]["method"] == "t"
        assert r["flip_ci"]["per_seed"] == pytest.approx(r["per_seed_flip_rate"])
        assert r["excess_ci"]["value"] == pytest.approx(r["flip_ci"]["value"] - r["baseline_ci"]["value"])
    assert any(q["attack"] == "random" for q in s.ratios)
    assert {c["attack"] for c in s.comparisons} == {"fgsm", "pgd", "mim", "pooled"}
    assert len(s.curated) == 4 and len(s.curated_diff) == 2
    assert "Student-t" in s.bootstrap["method"] and "Fieller" in s.bootstrap["ratio_method"]
    assert s.find("rows", model="attn", attack="pgd", eps=0.3) == next(
        r for r in s.rows if r["model"] == "attn" and r["attack"] == "pgd" and r["eps"] == 0.3)
    assert s.find("rows", model="cnn") is None and s.find("adv_train", model="attn") is None


def _direct_ridge_solve_acc(k_tt: np.ndarray, k_st: np.ndarray, y: np.ndarray, y_test: np.ndarray,
                            ridge: float) -> float:
    """Kernel ridge regression on one-hot targets by `numpy.linalg.solve`, and its test accuracy."""
    alpha = np.linalg.solve(k_tt + ridge * np.eye(len(y)), np.eye(10)[y])
    return float(np.mean((k_st @ alpha).argmax(axis=1) == y_test))


@pytest.mark.claim("flip-mnist")
def test_kernel_predictor_accuracy_matches_a_direct_solve(smoke_record):
    """Each run's kernel-predictor accuracies against kernels built another way on the same subset: the analytic
    NTK from its formula (`<x, x'> (pi - theta) / 2 pi` written out for 2L-ReLU; `theory.kernels.analytic_ntk_mlp_attn`
    for MLP-Attn) and the trained network's NTK from its Jacobians (`torch_func`, not the closed form), each solved
    by numpy with ridge `n * weight_decay` (the NTK-distance rule under decay)."""
    import torch

    from empirics.common import experiment_data, train_network
    from empirics.experiments.malleability import network_config
    from empirics.kernels.ntk import empirical_ntk
    from theory.kernels import analytic_ntk_mlp_attn

    for seed in SMOKE.seeds:
        ds, t, device = experiment_data(SMOKE, None, seed)
        x, xt = np.asarray(ds.x_train, np.float64), np.asarray(ds.x_test, np.float64)
        ridge = SMOKE.n_train * SMOKE.train.weight_decay
        for kind in SMOKE.models:
            run = next(r for r in smoke_record.runs if r["seed"] == seed and r["model"] == kind)
            spec, tcfg = network_config(SMOKE, ds, t, kind, seed, adv=False)
            tr = train_network(spec, t, tcfg, device)
            assert tr.record.final_test_acc == run["test_acc"]  # the network the run measured
            if kind == "relu":
                norm = np.linalg.norm(x, axis=1)
                inner = np.concatenate([x, xt]) @ x.T
                cos = np.clip(inner / np.outer(np.concatenate([norm, np.linalg.norm(xt, axis=1)]), norm), -1, 1)
                k = inner * (np.pi - np.arccos(cos)) / (2 * np.pi)
            else:
                k = analytic_ntk_mlp_attn(x, np.concatenate([x, xt]), x)
            n = len(x)
            assert run["ntk_predictor_test_acc"] == _direct_ridge_solve_acc(k[:n], k[n:], ds.y_train, ds.y_test,
                                                                            ridge)
            m64 = copy.deepcopy(tr.model).double()
            both = torch.as_tensor(np.concatenate([x, xt]))
            theta = empirical_ntk(m64, both, both[:n], implementation="torch_func").numpy()
            assert run["trained_ntk_predictor_test_acc"] == _direct_ridge_solve_acc(
                theta[:n], theta[n:], ds.y_train, ds.y_test, ridge)
            assert run["kernel_predictor_wall_s"] >= 0


def test_top_by_abs_and_count():
    total = np.array([0.1, -5.0, 2.0, -0.2, 3.0])
    assert top_by_abs(total, 2).tolist() == [1, 4]
    assert n_top(0.1, 500) == 50 and n_top(0.001, 60) == 1 and n_top(1.0, 7) == 7


def test_ratio_is_undefined_when_relu_flips_nothing():
    r = ratio([0.3, 0.2], [0.0, 0.1])
    assert r["ratio"] == pytest.approx(5.0)
    assert r["per_seed"] == [None, pytest.approx(2.0)]
    z = ratio([0.3, 0.2], [0.0, 0.0])
    assert z["ratio"] is None and "undefined" in z["note"]


def test_compare_counts_sign_flips():
    from empirics.attribution.influence import InfluenceResult

    def res(total):
        t = np.asarray(total, float)
        return InfluenceResult(t[:, None], t, 1.0, np.zeros((1, 1)), 0.0, 1.0)

    m = compare(res([1.0, -2.0, 3.0, 0.5]), res([-1.0, -1.0, 3.0, 0.4]), np.array([0, 1, 2]))
    assert m["flip_rate"] == pytest.approx(1 / 3)
    assert [e["flipped"] for e in m["examples"]] == [True, False, False]


@pytest.mark.parametrize("kwargs", [dict(attacks=("cw",)), dict(eps=1.2), dict(eps=-0.1), dict(tau=0.0),
                                    dict(tau=1.5), dict(interventions=("erase",)), dict(attack_context="x"),
                                    dict(eps_sweep=(0.1, 2.0)), dict(models=("vit",))])
def test_bad_config_is_a_user_error(kwargs):
    with pytest.raises(UserInputError):
        MalleabilityConfig(**kwargs)


@pytest.mark.parametrize("argv", [
    ["--attack", "cw"], ["--eps", "1.5"], ["--eps", "-0.2"], ["--eps", "abc"], ["--tau", "0"],
    ["--tau", "1.2"], ["--intervention", "erase"], ["--eps-sweep", "0.1,7"], ["--attack-context", "both"],
    ["--model", "vit"], ["--dataset", "svhn"], ["--preset", "huge"],
])
def test_cli_bad_inputs_exit_2_with_one_line(argv, capsys):
    assert main(["malleability", "--preset", "smoke", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_smoke_run_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["malleability", "--preset", "smoke", "--seeds", "1", "--n-train", "40", "--n-test", "10",
               "--width", "32", "--epochs", "1", "--attack", "fgsm", "--intervention", "transformed",
               "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "flip rate" in text and "Attn/ReLU" in text and "Verdict:" in text
    rec = json.loads(out.read_text())
    assert rec["preset"] == "smoke" and rec["config"]["attacks"] == ["fgsm"]


def test_a_dead_networks_zero_kernel_gives_no_kernel_predictor_instead_of_an_error():
    """A network whose ReLUs all died has the zero kernel: without decay its ridge (from the trace) is 0 and kernel
    regression is undefined, so its kernel-predictor accuracy is NaN (a smoke claims run once stopped on it)."""
    import torch

    from empirics.common import Tensors
    from empirics.experiments.distance import kernel_predictor_accuracy
    from empirics.nets.models import ModelSpec, build_model

    x = torch.rand(6, 4, dtype=torch.float64)
    t = Tensors(x, torch.tensor([0, 1, 0, 1, 0, 1]), x[:3], torch.tensor([0, 1, 0]), 2)
    model = build_model(ModelSpec("relu", 4, 8, 2, seed=0), x)
    zero = (np.zeros((6, 6)), np.zeros((3, 6)))
    out = kernel_predictor_accuracy(model, t, 0.0, trained=zero)
    assert np.isnan(out["trained_ntk_predictor_test_acc"]) and np.isfinite(out["ntk_predictor_test_acc"])
    eye = (np.eye(6), np.zeros((3, 6)))
    assert np.isfinite(kernel_predictor_accuracy(model, t, 0.0, trained=eye)["trained_ntk_predictor_test_acc"])
