"""Training protocols do what they say; the adequacy gate rejects networks that did not learn; the
influence of the claims' own setting is checked against real leave-one-out retraining, for both networks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from tolerances import F32_ACCUMULATED, F64_ALGORITHM

from empirics.common import dataset_tensors, train_network
from empirics.nets.models import ModelSpec
from empirics.nets.protocols import GATE_TEXT, PROTOCOL_NAMES, adequacy, chance_accuracy, protocol_config
from empirics.nets.train import TrainConfig, TrainRecord, effective_lr, plateau_reached, train
from ntkm.errors import UserInputError
from verify.claims.base import NA, gated


def test_width_consistent_protocol_keeps_relative_weight_change_shrinking(mnist_small):
    """lr ~ m^-1/2 keeps Adam's function-space step fixed, so ||W_T - W_0|| / ||W_0|| falls
    roughly like m^-1/2; at the paper's fixed lr it does not fall that way."""
    t = dataset_tensors(mnist_small)
    widths = (256, 1024, 4096)
    change = {}
    for name in ("width-consistent", "paper"):
        cfg = replace(protocol_config(name, 30), plateau=False)
        change[name] = [train_network(ModelSpec("relu", t.x_train.shape[1], m, t.out_dim), t, cfg)
                        .record.rel_weight_change for m in widths]
    proper = change["width-consistent"]
    assert proper[0] > proper[1] > proper[2]
    slope = np.polyfit(np.log(widths), np.log(proper), 1)[0]
    assert -0.75 < slope < -0.3, slope
    assert effective_lr(protocol_config("width-consistent", 1), 4096) == pytest.approx(
        effective_lr(protocol_config("width-consistent", 1), 1024) / 2)
    assert effective_lr(protocol_config("width-consistent", 1), 16) == protocol_config("width-consistent", 1).lr
    assert effective_lr(protocol_config("paper", 1), 16) == effective_lr(protocol_config("paper", 1), 4096) == 1e-3


def test_paper_protocol_decay_is_coupled_and_decoupled_differs(mnist_small):
    """torch Adam's weight_decay is added to the gradient (coupled); AdamW decays the weights directly."""
    t = dataset_tensors(mnist_small)
    spec = ModelSpec("attn", t.x_train.shape[1], 64, t.out_dim)
    norms = {}
    for name in ("paper", "decoupled"):
        cfg = replace(protocol_config(name, 20), plateau=False, weight_decay=0.5, lr=0.05)
        norms[name] = float(train_network(spec, t, cfg).model.W.detach().norm())
    init = float(train_network(spec, t, protocol_config("paper", 0)).model.W.detach().norm())
    # coupled decay with Adam: the decay term dominates the normalised step and shrinks W fast
    assert norms["paper"] < 0.9 * init
    assert norms["decoupled"] != pytest.approx(norms["paper"], rel=1e-3)


def test_gd_protocol_takes_its_step_from_the_ntk(mnist_small):
    from empirics.kernels.ntk import empirical_ntk
    from empirics.nets.models import build_model
    from empirics.nets.train import gd_learning_rate

    t = dataset_tensors(mnist_small)
    model = build_model(ModelSpec("relu", t.x_train.shape[1], 128, t.out_dim), t.x_train)
    k = empirical_ntk(model.double(), t.x_train.double()).numpy()
    expected = t.x_train.shape[0] / np.linalg.eigvalsh(k)[-1]
    assert gd_learning_rate(model, t.x_train) == pytest.approx(expected, rel=F64_ALGORITHM)
    rec = train_network(ModelSpec("relu", t.x_train.shape[1], 128, t.out_dim), t,
                        protocol_config("gd-mse", 200)).record
    assert rec.lr == pytest.approx(expected, rel=F32_ACCUMULATED)
    assert rec.train_loss[-1] < rec.train_loss[0]


def test_plateau_rule_on_curves():
    epochs = list(range(0, 201, 5))
    falling = [2.0 * 0.97**e for e in epochs]  # 3 % per epoch: still learning
    flat = [1.0 + 0.5 * np.exp(-e / 10) for e in epochs]  # converged after ~60 epochs
    assert not plateau_reached(falling, epochs, 50, 0.02)
    assert plateau_reached(flat, epochs, 50, 0.02)
    assert not plateau_reached(flat[:5], epochs[:5], 50, 0.02)  # not a full window yet
    tiny = [2.3] + [1e-3 * 0.9**e for e in epochs[1:]]  # CE on separable data: relative falls, absolute nothing
    assert plateau_reached(tiny, epochs, 50, 0.02)


def test_plateau_stop_ends_training_early(mnist_small):
    t = dataset_tensors(mnist_small)
    rec = train_network(ModelSpec("relu", t.x_train.shape[1], 256, t.out_dim), t,
                        protocol_config("width-consistent", 2000)).record
    assert rec.plateau_reached and rec.epochs_run < 2000
    assert rec.epochs[-1] == rec.epochs_run


def test_gate_thresholds_and_reasons():
    def rec(tr: float, te: float, plateau: bool) -> TrainRecord:
        return TrainRecord(final_train_acc=tr, final_test_acc=te, plateau_reached=plateau, epochs_run=10)

    chance = chance_accuracy(10, 10)
    assert adequacy(rec(0.9, 0.5, True), chance)["passed"]
    assert "train acc" in adequacy(rec(0.3, 0.5, True), chance)["reason"]
    assert "test acc" in adequacy(rec(0.9, 0.12, True), chance)["reason"]
    assert "no plateau" in adequacy(rec(0.9, 0.5, False), chance)["reason"]
    assert not adequacy(rec(0.7, 0.7, True), chance_accuracy(1, 2))["passed"]  # binary: 0.75 needed
    assert "chance" in GATE_TEXT


def test_schedule_gives_distinct_rates_at_every_width_of_every_sweep():
    """No two widths of any preset's sweep (the distance widths and the malleability width) share a learning rate,
    on either data set and under every input preprocessing; the paper's protocol is width-independent by design."""
    from empirics.data.datasets import INPUT_PREPROCESSINGS
    from empirics.nets.protocols import LR_REF_WIDTH, PROPER_LR, proper_lr
    from verify.presets import PRESET_NAMES, preset

    top = max(lr for t in PROPER_LR.values() for lr, _ in t.values())
    for name in PRESET_NAMES:
        p = preset(name)
        widths = sorted({*p["widths"], p["mall_width"]})
        assert min(widths) >= LR_REF_WIDTH  # the anchor is the narrowest width: no rate above the pilot's
        for pre in INPUT_PREPROCESSINGS:
            for ds in ("mnist", "cifar10", None):
                cfg = protocol_config("width-consistent", p["epochs"], dataset=ds, preprocess=pre)
                rates = [effective_lr(cfg, m) for m in widths]
                assert len(set(rates)) == len(widths) and rates == sorted(rates, reverse=True), (name, ds, rates)
                assert rates[0] <= top
                lr16, power = proper_lr(ds, pre)
                assert rates[-1] == pytest.approx(lr16 * (LR_REF_WIDTH / widths[-1]) ** power)  # the stated schedule


def test_rates_follow_the_preprocessing():
    """Each piloted preprocessing gets its own table; `channel` (not piloted) the smaller of the two per data set,
    and a user's data set the smallest rate of the preprocessing."""
    from empirics.nets.protocols import PROPER_LR, proper_lr

    for pre, table in PROPER_LR.items():
        for ds, rate in table.items():
            assert proper_lr(ds, pre) == rate
            assert protocol_config("width-consistent", 5, dataset=ds, preprocess=pre).lr == rate[0]
        assert proper_lr(None, pre) == min(table.values())
    for ds in ("mnist", "cifar10"):
        assert proper_lr(ds, "channel") == min(PROPER_LR["raw"][ds], PROPER_LR["unit"][ds])


def test_pilot_records_are_what_the_protocol_uses():
    """`PROPER_LR` is, per preprocessing, the choice recorded by scripts/pilot_lr.py in its pilot record,
    re-derived from the recorded runs by the pilot's own rule, and the recorded rates are the schedule's."""
    import importlib.util
    import json
    from pathlib import Path

    from empirics.nets.protocols import LR_POWERS, LR_REF_WIDTH, PILOT_RECORDS, PROPER_LR, PROPER_LR_BY_POWER, proper_lr

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("pilot_lr", root / "scripts" / "pilot_lr.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    assert set(PILOT_RECORDS) == set(PROPER_LR)
    for pre, rel in PILOT_RECORDS.items():
        record = json.loads((root / rel).read_text())
        assert record["git_commit"] and record["date"] and record["config"]["widths"][0] == LR_REF_WIDTH
        assert record["config"]["preprocessings"] == [pre]
        assert set(record["datasets"]) == set(PROPER_LR[pre])
        for ds, block in record["datasets"].items():
            assert all(r["lr"] == pytest.approx(r["lr16"] * (LR_REF_WIDTH / r["width"]) ** r["power"])
                       and r["loss_vs_chance"] == pytest.approx(r["final_train_loss"] / r["chance_loss"])
                       and r["preprocess"] == pre for r in block["runs"])
            chosen = pilot.choose(block["runs"])["chosen"]
            assert chosen == block["chosen"] and (chosen["lr16"], chosen["power"]) == PROPER_LR[pre][ds]
            for power in LR_POWERS:  # the schedule axis: each exponent's anchor by the same rule on its own runs
                own = pilot.choose([r for r in block["runs"] if r["power"] == power])["chosen"]
                assert own == {"lr16": PROPER_LR_BY_POWER[pre][ds][power], "power": power}
                assert proper_lr(ds, pre, power) == (own["lr16"], power)


def test_pilot_rule_prefers_more_adequate_cells_then_lower_loss():
    """The pilot's rule on synthetic runs: more cells adequate on training wins over a lower loss; among equals the
    lower worst-case loss wins; and a seed that fails makes its cell fail."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("pilot_lr", Path(__file__).resolve().parents[2] / "scripts"
                                                  / "pilot_lr.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)

    def run(lr16, power, width, seed, plateau, acc, loss):
        return {"lr16": lr16, "power": power, "preprocess": "unit", "model": "attn", "width": width, "seed": seed,
                "plateau_reached": plateau, "final_train_acc": acc, "chance_acc": 0.1, "loss_vs_chance": loss}

    runs = [run(0.02, 0.5, w, s, True, 0.9, 0.01) for w in (16, 512) for s in (0, 1)]
    runs[-1] = run(0.02, 0.5, 512, 1, False, 0.9, 0.01)  # one seed short of a plateau: its cell fails
    runs += [run(0.04, 0.25, w, s, True, 0.9, 0.3) for w in (16, 512) for s in (0, 1)]
    out = pilot.choose(runs)
    assert out["chosen"] == {"lr16": 0.04, "power": 0.25}
    assert next(s for s in out["scores"] if s["lr16"] == 0.02)["failing"] == ["unit/attn/512"]
    runs += [run(0.08, 0.25, w, s, True, 0.9, 0.2) for w in (16, 512) for s in (0, 1)]
    assert pilot.choose(runs)["chosen"] == {"lr16": 0.08, "power": 0.25}  # equal cells: the lower loss
    runs += [run(0.08, 0.5, w, s, True, 0.5, 0.2) for w in (16, 512) for s in (0, 1)]  # train acc below the gate
    assert pilot.choose(runs)["chosen"] == {"lr16": 0.08, "power": 0.25}


def test_adversarial_gate_passes_and_fails_on_synthetic_records():
    """Robust accuracy gates adversarially trained networks only, at the threshold stated in the gate text."""
    from empirics.nets.protocols import GATE_ROBUST

    chance = chance_accuracy(10, 10)
    need = chance + GATE_ROBUST * (1 - chance)

    def rec(robust: float) -> TrainRecord:
        return TrainRecord(final_train_acc=0.9, final_test_acc=0.5, plateau_reached=True, epochs_run=60,
                           final_robust_train_acc=robust)

    assert adequacy(rec(need + 0.01), chance)["passed"]
    failed = adequacy(rec(need - 0.01), chance)
    assert not failed["passed"] and "robust train acc" in failed["reason"] and failed["robust_train_acc"] < need
    assert adequacy(rec(float("nan")), chance)["passed"]  # standard training: no robust accuracy, no robust test
    assert f"chance + {GATE_ROBUST:g}(1 - chance)" in GATE_TEXT


@pytest.mark.parametrize("preset_name", ["quick", "full", "paper"])
def test_adversarial_budget_leaves_room_for_the_plateau_window(preset_name):
    """At quick and paper the adversarial budget exceeds the plateau window, so a flat adversarial loss curve passes
    the plateau check within it and a still-falling one fails; at the old 40 epochs even a flat one could not pass."""
    from verify.presets import preset

    budget = preset(preset_name)["adv_max_epochs"]
    window = TrainConfig().plateau_window
    epochs = list(range(0, budget + 1, TrainConfig().check_every))
    flat = [1.0 + np.exp(-e / 2) for e in epochs]
    falling = [2.0 * 0.98**e for e in epochs]
    assert plateau_reached(flat, epochs, window, 0.02)
    assert not plateau_reached(falling, epochs, window, 0.02)
    old = [e for e in epochs if e <= 40]
    assert not plateau_reached(flat[:len(old)], old, window, 0.02)


def test_adversarial_training_records_robust_accuracy(mnist_small):
    """PGD accuracy at eps 0 is the clean accuracy; adversarial training records its robust accuracy (at most the
    clean one here) and the loss it minimised; standard training records neither."""
    from dataclasses import replace

    from empirics.nets.models import build_model
    from empirics.nets.train import accuracy, robust_accuracy

    t = dataset_tensors(mnist_small)
    spec = ModelSpec("relu", t.x_train.shape[1], 32, t.out_dim)
    cfg = replace(protocol_config("width-consistent", 5, dataset="mnist"), adv_train=True, adv_eps=0.1, adv_steps=2,
                  check_every=1, plateau=False)
    model = build_model(spec, t.x_train)
    rec = train(model, t.x_train, t.y_train, cfg)
    assert robust_accuracy(model, t.x_train, t.y_train, replace(cfg, adv_eps=0.0)) == accuracy(model, t.x_train,
                                                                                              t.y_train)
    assert 0.0 <= rec.final_robust_train_acc <= rec.final_train_acc
    assert len(rec.adv_train_loss) == len(rec.train_loss) > 0
    plain = train(build_model(spec, t.x_train), t.x_train, t.y_train, replace(cfg, adv_train=False))
    assert np.isnan(plain.final_robust_train_acc) and plain.adv_train_loss == []


def test_untrained_network_fails_the_gate_and_the_rule_says_not_measurable(mnist_small):
    t = dataset_tensors(mnist_small)
    tr = train_network(ModelSpec("relu", t.x_train.shape[1], 32, t.out_dim), t, protocol_config("paper", 0))
    assert not tr.gate["passed"] and "no plateau" in tr.gate["reason"]
    out = gated([{"model": "relu", "seed": 0, **tr.training_summary()}], GATE_TEXT, "protocol")
    assert out is not None and out.verdict == NA and "below the adequacy gate" in out.ours


def test_protocol_names_and_bad_input():
    for name in PROTOCOL_NAMES:
        assert protocol_config(name, 3).protocol == name
    with pytest.raises(UserInputError):
        protocol_config("sgd-magic", 3)
    with pytest.raises(UserInputError):
        replace(protocol_config("paper", 3), lr=float("nan"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["relu", "attn"])
def test_retraining_study_under_the_claims_protocol(model):
    """Both networks are really retrained without each removed point; the correlations come from those
    retrainings, with bootstrap intervals that contain the point estimate."""
    from scipy import stats

    from empirics.attribution.influence import ProtocolRetrainConfig, RetrainRecord, protocol_retrain_study
    from ntkm import codec

    r = protocol_retrain_study(ProtocolRetrainConfig(model=model, n_train=40, n_test=30, width=128, epochs=80,
                                                     n_remove=8))
    assert RetrainRecord.from_dict(r.to_dict()) == r and RetrainRecord.from_dict(codec.loads(codec.dumps(r))) == r
    pred = np.array([p["predicted"] for p in r.points])
    act = np.array([p["actual"] for p in r.points])
    assert len(pred) == 8 and np.all(act != 0)
    assert r.spearman["value"] == pytest.approx(stats.spearmanr(pred, act).statistic)
    assert r.pearson["value"] == pytest.approx(stats.pearsonr(pred, act).statistic)
    for ci in (r.pearson, r.spearman):
        lo, hi = ci["ci"]
        assert -1 <= lo <= ci["value"] <= hi <= 1
    assert "gate" in r.training
    by_name = {e["name"]: e for e in r.estimands}
    assert list(by_name) == ["paper", "initial-removed", "training-loss"]
    assert by_name["paper"]["spearman"] == r.spearman  # the verdict's estimand is the paper's
    paper = np.array(by_name["paper"]["values"])
    np.testing.assert_allclose(paper, np.column_stack([pred, act]))
    train_loss = np.array(by_name["training-loss"]["values"])
    assert by_name["training-loss"]["spearman"]["value"] == pytest.approx(
        stats.spearmanr(train_loss[:, 0], train_loss[:, 1]).statistic)


@pytest.mark.parametrize(("out_dim", "loss"), [(10, "auto"), (10, "mse"), (1, "auto")])
def test_loss_residuals_are_the_gradient_of_the_training_loss(out_dim, loss):
    """The Gauss-Newton estimand's residuals `dL/df` against autograd of the very loss `train` uses."""
    from empirics.attribution.gauss_newton import loss_residuals
    from empirics.nets.losses import loss_fn

    gen = torch.Generator().manual_seed(out_dim)
    out = torch.randn(7, out_dim, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, max(out_dim, 2), (7,), generator=gen)
    (grad,) = torch.autograd.grad(loss_fn(out_dim, loss)(out, y).sum(), out)
    np.testing.assert_allclose(loss_residuals(out, y, loss), grad.numpy(), rtol=1e-12, atol=1e-12)


def test_the_initial_function_removed_estimand_is_the_papers_when_the_network_starts_at_zero():
    """With f0 = 0 the residual targets are the targets: the two kernel estimands coincide; with f0 they differ."""
    from empirics.attribution.influence import SplitAtInit, matched_predictions, model_kernels
    from empirics.nets.models import ModelSpec, build_model

    gen = torch.Generator().manual_seed(0)
    x, xt = torch.rand(20, 6, generator=gen), torch.rand(9, 6, generator=gen)
    y, yt = torch.randint(0, 3, (20,), generator=gen), torch.randint(0, 3, (9,), generator=gen)
    net = build_model(ModelSpec("relu", 6, 32, 3, seed=0), x)
    K = model_kernels(net, x, xt)
    zero = matched_predictions(net, K, SplitAtInit(x, y, np.zeros((20, 3))), SplitAtInit(xt, yt, np.zeros((9, 3))),
                               0.1, "auto")
    np.testing.assert_allclose(zero["initial-removed"], zero["paper"], rtol=1e-12)
    shifted = matched_predictions(net, K, SplitAtInit(x, y, np.full((20, 3), 0.3)),
                                  SplitAtInit(xt, yt, np.full((9, 3), 0.3)), 0.1, "auto")
    assert not np.allclose(shifted["initial-removed"], shifted["paper"])


def test_retraining_without_training_changes_nothing_for_relu():
    """Control: with 0 epochs the network is its initialisation whatever the data, so removing a point
    changes nothing for 2L-ReLU (its features do not depend on the training set); for MLP-Attn the
    point leaves the attention context, so the function changes."""
    from empirics.attribution.influence import ProtocolRetrainConfig, protocol_retrain_study

    torch.manual_seed(0)
    relu = protocol_retrain_study(ProtocolRetrainConfig(model="relu", n_train=30, n_test=20, width=64, epochs=0,
                                                        n_remove=4))
    attn = protocol_retrain_study(ProtocolRetrainConfig(model="attn", n_train=30, n_test=20, width=64, epochs=0,
                                                        n_remove=4))
    assert all(p["actual"] == 0 for p in relu.points)
    assert any(p["actual"] != 0 for p in attn.points)
