"""L-infinity attacks: budgets, the [0, 1] box, strength ordering and MLP-Attn's recomputed context."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tolerances import F32_REORDER, F32_ROUNDING

from empirics.common import dataset_tensors
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.losses import loss_fn
from empirics.nets.models import ModelSpec, build_model
from empirics.nets.train import TrainConfig, train
from ntkm.errors import UserInputError

NAMES = ["fgsm", "pgd", "mim", "random"]


def _setup(kind: str, out_dim: int, seed: int, n: int = 24, d: int = 12):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen)
    x[: n // 3] = (x[: n // 3] > 0.5).float()  # some pixels exactly on the box boundary
    y = torch.randint(0, max(out_dim, 2), (n,), generator=gen)
    model = build_model(ModelSpec(kind, d, 16, out_dim, seed=seed), x)
    return model, x, y


@given(name=st.sampled_from(NAMES), kind=st.sampled_from(["relu", "attn"]), out_dim=st.sampled_from([1, 3]),
       eps=st.floats(0.0, 1.0), seed=st.integers(0, 10_000), context=st.sampled_from(["fixed", "recomputed"]),
       steps=st.integers(1, 4))
def test_every_perturbation_is_inside_the_ball_and_the_box(name, kind, out_dim, eps, seed, context, steps):
    model, x, y = _setup(kind, out_dim, seed)
    idx = torch.arange(0, 24, 3)
    cfg = AttackConfig(name, eps, steps=steps, seed=seed, context=context)
    x_adv = attack(model, x[idx], y[idx], cfg, train_x=x, train_idx=idx)
    assert x_adv.shape == x[idx].shape and x_adv.dtype == x.dtype
    assert float((x_adv - x[idx]).abs().max()) <= eps + F32_ROUNDING
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    assert model.W.grad is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["relu", "attn"])
def test_eps_zero_returns_the_input(name, kind):
    model, x, y = _setup(kind, 3, 0)
    out = attack(model, x, y, AttackConfig(name, 0.0, context="recomputed"), train_x=x, train_idx=torch.arange(24))
    assert torch.equal(out, x)


def test_random_baseline_has_the_full_budget_where_the_box_allows():
    x = torch.full((50, 30), 0.5)
    out = attack(build_model(ModelSpec("relu", 30, 8, 1)), x, torch.zeros(50, dtype=torch.long),
                 AttackConfig("random", 0.2, seed=3))
    assert torch.allclose((out - x).abs(), torch.full_like(x, 0.2))
    assert 0.3 < float((out > x).float().mean()) < 0.7


def test_same_seed_same_perturbation():
    model, x, y = _setup("relu", 3, 1)
    a = attack(model, x, y, AttackConfig("pgd", 0.2, seed=5))
    b = attack(model, x, y, AttackConfig("pgd", 0.2, seed=5))
    assert torch.equal(a, b)


@pytest.fixture(scope="module")
def trained_pair(mnist_small):
    t = dataset_tensors(mnist_small)
    out = {}
    for kind in ("relu", "attn"):
        model = build_model(ModelSpec(kind, t.x_train.shape[1], 64, 10, seed=0), t.x_train)
        train(model, t.x_train, t.y_train, TrainConfig(epochs=5, seed=0))
        out[kind] = model
    return t, out


@pytest.mark.parametrize("kind", ["relu", "attn"])
def test_pgd_raises_the_loss_at_least_as_much_as_fgsm(trained_pair, kind):
    t, models = trained_pair
    model = models[kind]
    x, y = t.x_train[:60], t.y_train[:60]
    per_ex = loss_fn(10)
    with torch.no_grad():
        clean = float(per_ex(model(x), y).mean())
        losses = {}
        for name in ("fgsm", "pgd", "mim", "random"):
            x_adv = attack(model, x, y, AttackConfig(name, 0.1, steps=10, seed=0))
            losses[name] = float(per_ex(model(x_adv), y).mean())
    assert losses["fgsm"] > clean
    assert losses["pgd"] >= losses["fgsm"] - F32_ROUNDING
    assert losses["mim"] >= losses["random"]


def test_recomputed_context_attack_differs_from_fixed_and_sees_its_own_effect(trained_pair):
    t, models = trained_pair
    model = models["attn"]
    idx = torch.arange(0, 120, 4)
    x, y = t.x_train[idx], t.y_train[idx]
    per_ex = loss_fn(10)
    fixed = attack(model, x, y, AttackConfig("pgd", 0.3, steps=10, seed=0, context="fixed"))
    recomputed = attack(model, x, y, AttackConfig("pgd", 0.3, steps=10, seed=0, context="recomputed"),
                        train_x=t.x_train, train_idx=idx)
    assert float((fixed - recomputed).abs().max()) > 1e-3
    assert float((recomputed - x).abs().max()) <= 0.3 + F32_ROUNDING
    assert float(recomputed.min()) >= 0.0 and float(recomputed.max()) <= 1.0
    assert torch.equal(model.context, t.x_train.T @ t.x_train) or torch.allclose(
        model.context, t.x_train.T @ t.x_train, rtol=F32_REORDER)

    def loss_in_context(x_adv: torch.Tensor) -> float:
        ctx = t.x_train.index_copy(0, idx, x_adv)
        with torch.no_grad():
            return float(per_ex(model(x_adv, context_inputs=ctx), y).mean())

    assert loss_in_context(recomputed) >= loss_in_context(fixed) - 1e-3


def test_recomputed_context_needs_the_training_set():
    model, x, y = _setup("attn", 3, 0)
    with pytest.raises(UserInputError):
        attack(model, x, y, AttackConfig("fgsm", 0.1, context="recomputed"))


@pytest.mark.parametrize("kwargs", [dict(name="cw", eps=0.1), dict(name="pgd", eps=1.5), dict(name="pgd", eps=-0.1),
                                    dict(name="pgd", eps=0.1, steps=0), dict(name="pgd", eps=0.1, context="both")])
def test_bad_attack_config_is_a_user_error(kwargs):
    with pytest.raises(UserInputError):
        AttackConfig(**kwargs)
