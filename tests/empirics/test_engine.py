"""The batched training engine trains every network as `empirics.nets.train.train` does, one by one: same final weights
and the same records, for every protocol, with per-width learning rates and networks that stop at different epochs;
jobs it does not implement go through `train` itself."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, make_dataclass, replace

import pytest
import torch
from tolerances import F32_ACCUMULATED, F32_REORDER, F32_ROUNDING

from empirics.common import dataset_tensors
from empirics.data.datasets import DataRequest, load_dataset
from empirics.nets.engine import SUPPORTED_FIELDS, fallback_reason, fallbacks, gemm_flops, train_many
from empirics.nets.models import ModelSpec, QKVAttentionNet, TwoLayerNet
from empirics.nets.protocols import PROTOCOL_NAMES, protocol_config
from empirics.nets.train import TrainConfig, train_job


@pytest.fixture(autouse=True)
def _torch_threads():
    """One thread (the suite's default): these are small products, and a second thread on a shared machine is slow."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def subsets():
    """Two real MNIST subsets (their own data seeds) of 96 training and 32 test images, and one of CIFAR-10."""
    mnist = [dataset_tensors(load_dataset("mnist", n_train=96, n_test=32,
                                          request=DataRequest(sample="balanced", seed=s))) for s in (0, 1)]
    cifar = dataset_tensors(load_dataset("cifar10", n_train=64, n_test=16,
                                         request=DataRequest(sample="balanced", seed=0)))
    return mnist, cifar


def _jobs(subsets, protocol: str, widths=(16, 320), epochs: int = 40, **overrides):
    """Both models at each width on both MNIST subsets, each with its own initialisation and batch-order seed."""
    mnist, _ = subsets
    jobs = []
    for s, t in enumerate(mnist):
        for kind in ("relu", "attn"):
            for m in widths:
                model = TwoLayerNet(ModelSpec(kind, t.x_train.shape[1], m, t.out_dim, seed=s), t.x_train)
                cfg = replace(protocol_config(protocol, epochs, seed=s), batch_size=32, check_every=2,
                              plateau_window=10, **overrides)
                jobs.append((model, t.x_train, t.y_train, cfg, t.x_test, t.y_test, f"{kind} {m}"))
    return jobs


def _copy(jobs):
    return [(copy.deepcopy(j[0]), *j[1:]) for j in jobs]


def _assert_same(jobs, loop_records, engine_jobs, engine_records):
    for a, b, ja, jb in zip(loop_records, engine_records, jobs, engine_jobs, strict=True):
        assert torch.allclose(ja[0].W, jb[0].W, rtol=F32_REORDER, atol=F32_REORDER), ja[-1]
        assert (b.epochs_run, b.plateau_reached, b.epochs, b.lr) == (a.epochs_run, a.plateau_reached, a.epochs, a.lr)
        assert b.train_acc == a.train_acc and b.test_acc == a.test_acc
        assert (b.final_train_acc, b.final_test_acc) == (a.final_train_acc, a.final_test_acc)
        assert b.train_loss == pytest.approx(a.train_loss, rel=F32_ACCUMULATED)
        assert b.final_train_loss == pytest.approx(a.final_train_loss, rel=F32_ACCUMULATED)
        assert b.rel_weight_change == pytest.approx(a.rel_weight_change, rel=F32_ACCUMULATED)
        assert b.protocol == a.protocol


@pytest.mark.parametrize("protocol", PROTOCOL_NAMES)
def test_engine_equals_the_loop_for_every_protocol(subsets, protocol):
    """Paper (coupled L2), width-consistent (its own rate per width, plateau stopping), decoupled (AdamW) and
    gd-mse (full batch, a learning rate per network from its own NTK)."""
    jobs = _jobs(subsets, protocol)
    ours = _copy(jobs)
    loop = [train_job(j) for j in jobs]
    _assert_same(jobs, loop, ours, train_many(ours))
    assert not fallbacks(ours)
    if protocol == "width-consistent":
        assert len({r.lr for r in loop}) == 2  # one rate per width (m = 320 is above the cap of any version)
    if protocol == "gd-mse":
        assert len({r.lr for r in loop}) == len(loop)  # one rate per network


def test_networks_that_stop_at_different_epochs_are_frozen_where_they_stopped(subsets):
    """Under plateau stopping the networks of one group stop at different epochs; each keeps the weights and the
    record of its own stop while the others go on."""
    jobs = _jobs(subsets, "width-consistent", widths=(16,), epochs=80)
    ours = _copy(jobs)
    loop = [train_job(j) for j in jobs]
    assert len({r.epochs_run for r in loop}) > 1, [r.epochs_run for r in loop]
    assert any(r.plateau_reached and r.epochs_run < 80 for r in loop)
    _assert_same(jobs, loop, ours, train_many(ours))


def test_groups_of_different_shapes_and_data_sets_in_one_call(subsets):
    """MNIST and CIFAR-10 jobs, a binary task and a curve recorded every epoch, mixed in one call, in order."""
    mnist, cifar = subsets
    t = mnist[0]
    y_bin = (t.y_train % 2).long()
    specs = [(ModelSpec("attn", 3072, 24, cifar.out_dim, seed=3), cifar.x_train, cifar.y_train, cifar),
             (ModelSpec("relu", 784, 24, 1, seed=4), t.x_train, y_bin, None),
             (ModelSpec("relu", 784, 24, t.out_dim, seed=5), t.x_train, t.y_train, t)]
    jobs = []
    for spec, x, y, test in specs:
        cfg = replace(protocol_config("paper", 6, seed=spec.seed), record_every=1)
        jobs.append((TwoLayerNet(spec, x), x, y, cfg, None if test is None else test.x_test,
                     None if test is None else test.y_test, spec.kind))
    ours = _copy(jobs)
    loop = [train_job(j) for j in jobs]
    got = train_many(ours)
    _assert_same(jobs, loop, ours, got)
    assert got[0].epochs == list(range(1, 7)) and got[1].test_acc == []


def test_unsupported_jobs_fall_back_to_train(subsets):
    """The trainable-attention model, adversarial training and a TrainConfig field the engine does not know go
    through `train` (same results as calling it), and say why."""
    t = subsets[0][0]
    base = protocol_config("paper", 3, seed=0)
    qkv = QKVAttentionNet(ModelSpec("qkv", 784, 16, t.out_dim, qkv_dim=8), t.x_train)
    relu = TwoLayerNet(ModelSpec("relu", 784, 16, t.out_dim), t.x_train)
    adv = replace(base, adv_train=True, adv_steps=1, epochs=1)
    extended_cls = make_dataclass("Extended", [("warmup", int, 0)], bases=(TrainConfig,), frozen=True)
    extended = extended_cls(**{f.name: getattr(base, f.name) for f in fields(base)}, warmup=2)
    jobs = [(qkv, t.x_train, t.y_train, base, t.x_test, t.y_test, "qkv"),
            (relu, t.x_train, t.y_train, adv, t.x_test, t.y_test, "adv")]
    reasons = [fallback_reason(j) for j in jobs]
    assert "QKVAttentionNet" in reasons[0] and "adv_train" in reasons[1]
    assert "Extended" in fallback_reason((relu, t.x_train, t.y_train, extended))
    ours = _copy(jobs)
    _assert_same(jobs, [train_job(j) for j in jobs], ours, train_many(ours))


def test_whitelist_names_every_train_config_field(monkeypatch):
    """Every field of today's TrainConfig is judged by the whitelist; a field missing from it (one added to
    TrainConfig later), a subclass of TrainConfig, or a head the engine does not reproduce make it fall back."""
    assert set(SUPPORTED_FIELDS) == {f.name for f in fields(TrainConfig)}

    @dataclass(frozen=True)
    class Later(TrainConfig):
        schedule: str = "constant"

    relu = TwoLayerNet(ModelSpec("relu", 4, 2, 1))
    x, y = torch.rand(8, 4), torch.randint(0, 2, (8,))
    assert fallback_reason((relu, x, y, TrainConfig())) is None
    assert "Later" in fallback_reason((relu, x, y, Later()))
    monkeypatch.delitem(SUPPORTED_FIELDS, "lr_max")
    assert "lr_max" in fallback_reason((relu, x, y, TrainConfig()))
    monkeypatch.undo()

    class Scaled(TwoLayerNet):
        pass

    assert "Scaled" in fallback_reason((Scaled(ModelSpec("relu", 4, 2, 1)), x, y, TrainConfig()))


def test_a_head_the_engine_does_not_reproduce_falls_back(subsets, monkeypatch):
    """If `TwoLayerNet.head` computed something else than the engine's stacked head, the group goes to `train`."""
    t = subsets[0][0]
    jobs = _jobs(subsets, "paper", widths=(16,), epochs=3)[:2]
    monkeypatch.setattr(TwoLayerNet, "head", lambda self, f: 2 * (torch.relu(f @ self.W.T) @ self.A) / self.width**0.5)
    ours = _copy(jobs)
    _assert_same(jobs, [train_job(j) for j in jobs], ours, train_many(ours))
    assert t.x_train.shape[0] == 96


def test_gemm_flops_counts_the_last_short_batch():
    """Four products per step (forward and backward of both layers); a short last batch counts its own size."""
    full = gemm_flops(1, 256, 128, 10, 20, 3)
    assert full == 2 * 2.0 * 128 * 10 * (2 * 20 + 2 * 3)
    assert gemm_flops(2, 300, 128, 10, 20, 3) == 2 * (full + 2.0 * 44 * 10 * (2 * 20 + 2 * 3))


def _numbers(x, path=""):
    """Every leaf of a record, by path, without the timings and the machine description."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() if "wall_s" not in key and key not in ("versions", "device")
                for k, v in _numbers(val, f"{path}/{key}").items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, val in enumerate(x) for k, v in _numbers(val, f"{path}[{i}]").items()}
    return {path: x}


@pytest.mark.parametrize("unit", ["distance", "malleability"])
def test_units_give_the_same_record_with_and_without_the_engine(unit, monkeypatch):
    """A small NTK-distance and malleability unit (two seeds, each its own subset; the distance sweep at two widths
    with per-width rates and plateau stopping) record the same numbers whether their networks are trained together
    by the engine or one by one by `train`, and the engine did train them."""
    from empirics import common
    from empirics.experiments import distance, malleability
    from empirics.nets import engine

    tr = replace(protocol_config("width-consistent", 12), check_every=2, plateau_window=6)
    if unit == "distance":
        cfg = distance.DistanceConfig(n_train=40, n_test=16, widths=(16, 32), seeds=(0, 1), train=tr)
        run, module = distance.run_ntk_distance, distance
    else:
        cfg = malleability.MalleabilityConfig(n_train=60, n_test=20, width=32, seeds=(0, 1), attack_steps=2, train=tr,
                                              attacks=("fgsm",), seed_baseline=True)
        run, module = malleability.run_malleability, malleability
    groups = []
    real = engine._train_group
    monkeypatch.setattr(engine, "_train_group",
                        lambda nets, label, *rest: groups.append(len(nets)) or real(nets, label, *rest))
    monkeypatch.setattr(common, "_TRAINED", type(common._TRAINED)())
    with_engine = _numbers(run(cfg).to_dict())
    assert groups and max(groups) >= 4, groups  # both seeds' networks of one shape in one group
    common._TRAINED.clear()
    monkeypatch.setattr(module, "train_networks", lambda requests: None)
    monkeypatch.setattr(module, "train_seeds_together", lambda *a: None)
    n_groups = len(groups)
    one_by_one = _numbers(run(cfg).to_dict())
    assert len(groups) == n_groups
    assert with_engine.keys() == one_by_one.keys()
    for key, value in one_by_one.items():
        other = with_engine[key]
        if isinstance(value, float) and isinstance(other, float):
            assert other == pytest.approx(value, rel=F32_ACCUMULATED, abs=F32_ROUNDING, nan_ok=True), key
        else:
            assert other == value, key


@pytest.mark.parametrize("model", ["relu", "attn"])
def test_retraining_study_is_the_same_with_its_refits_trained_together(model, monkeypatch):
    """The influence check's leave-one-out refits (one network per removed point, each on its own subset and, for
    MLP-Attn, its own context) give the same record trained together by the engine as one by one by `train`."""
    from empirics.attribution.influence import ProtocolRetrainConfig, protocol_retrain_study
    from empirics.nets import engine

    cfg = ProtocolRetrainConfig(model=model, n_train=40, n_test=20, width=32, epochs=12, n_remove=4)
    groups = []
    real = engine._train_group
    monkeypatch.setattr(engine, "_train_group",
                        lambda nets, label, *rest: groups.append(len(nets)) or real(nets, label, *rest))
    together = _numbers(protocol_retrain_study(cfg).to_dict())
    assert sorted(groups) == [1, 4]  # the full fit, then the four refits as one group
    monkeypatch.setattr(engine, "train_many", lambda jobs: [train_job(j) for j in jobs])
    one_by_one = _numbers(protocol_retrain_study(cfg).to_dict())
    assert together.keys() == one_by_one.keys()
    for key, value in one_by_one.items():
        if isinstance(value, float):
            assert together[key] == pytest.approx(value, rel=F32_ACCUMULATED, abs=F32_ROUNDING, nan_ok=True), key
        else:
            assert together[key] == value, key


@pytest.mark.parametrize("protocol", ["paper", "width-consistent", "decoupled"])
def test_fused_adam_option_equals_the_loop_with_torchs_fused_adam(subsets, protocol, monkeypatch):
    """`train_many(..., fused_adam=True)` steps the stack in torch's fused Adam/AdamW kernel: the loop whose
    optimisers are `torch.optim.Adam(fused=True)` gives the same networks (to float32 reordering), and the
    single-tensor loop the same to float32 rounding accumulated over the window (in norm: a 1-ulp difference of
    one step moves single entries of a ReLU network further, measured up to 4e-4 absolute on entries of size 1)."""
    jobs = _jobs(subsets, protocol, epochs=20)
    fused_ours, plain = _copy(jobs), _copy(jobs)
    got = train_many(fused_ours, fused_adam=True)
    loop_plain = [train_job(j) for j in plain]
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        monkeypatch.setattr(torch.optim, cls.__name__, type(cls.__name__, (cls,), {
            "__init__": lambda self, params, _c=cls, **kw: _c.__init__(self, params, fused=True, **kw)}))
    loop_fused = [train_job(j) for j in jobs]
    _assert_same(jobs, loop_fused, fused_ours, got)
    for a, b in zip(plain, fused_ours, strict=True):
        assert float((a[0].W - b[0].W).norm() / a[0].W.norm()) < F32_ACCUMULATED
    assert [r.epochs_run for r in loop_plain] == [r.epochs_run for r in got]
