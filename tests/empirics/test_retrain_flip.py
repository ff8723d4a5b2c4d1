"""Retrain-based flip rates (issue 26): on kernel regression, where leave-one-out is exact, retraining gives the NTK
flip rate; the noise rule, the seed-to-seed rate and the real study against retraining by the plain loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from empirics.attribution.influence import Ridge, influence_from_kernels
from empirics.experiments.malleability import compare, n_top, top_by_abs
from empirics.experiments.retrain_flip import (
    RetrainFlipConfig,
    effect_flips,
    halves_null,
    noise_threshold,
    resolved_points,
    retrain_flip_study,
    seed_flip_rate,
)
from ntkm.errors import UserInputError


def _krr_test_loss(X: np.ndarray, Y: np.ndarray, Xt: np.ndarray, Yt: np.ndarray, ridge: float) -> float:
    """Refit kernel ridge regression with the linear kernel on (X, Y) and return its summed squared test error."""
    alpha = np.linalg.solve(X @ X.T + ridge * np.eye(len(X)), Y)
    return float(((Xt @ X.T @ alpha - Yt) ** 2).sum())


@pytest.mark.claim("flip-retrain-mnist")
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_on_kernel_regression_the_retrain_flip_rate_is_the_ntk_one(seed):
    """Fitting is kernel ridge regression with a fixed (linear) kernel: retraining without a point is then exactly
    the leave-one-out formula the NTK flip rate uses, so both flip the same points."""
    rng = np.random.default_rng(seed)
    n, nt, d, c, ridge = 40, 25, 6, 3, 0.5
    X, Xt = rng.normal(size=(n, d)), rng.normal(size=(nt, d))
    Y, Yt = np.eye(c)[rng.integers(0, c, n)], np.eye(c)[rng.integers(0, c, nt)]
    clean = influence_from_kernels((X @ X.T, Xt @ X.T), Y, Yt, reg=Ridge(ridge))
    sel = top_by_abs(clean.total, n_top(0.25, n))
    Xp = X.copy()
    Xp[sel] += 0.8 * rng.choice([-1.0, 1.0], size=(len(sel), d))
    pert = influence_from_kernels((Xp @ Xp.T, Xt @ Xp.T), Y, Yt, reg=Ridge(ridge))
    ntk = compare(clean, pert, sel)

    def effects(Xs: np.ndarray) -> np.ndarray:
        full = _krr_test_loss(Xs, Y, Xt, Yt, ridge)
        per_point = [_krr_test_loss(np.delete(Xs, i, 0), np.delete(Y, i, 0), Xt, Yt, ridge) - full for i in sel]
        return np.repeat(np.array(per_point)[:, None], 3, axis=1)  # three "seeds" of a deterministic fit

    a, b = effects(X), effects(Xp)
    np.testing.assert_allclose(a[:, 0], clean.total[sel], rtol=1e-8, atol=1e-10)
    out = effect_flips(a, b)
    assert out["noise_threshold"] == 0.0
    assert out["flipped"] == [e["flipped"] for e in ntk["examples"]]
    assert out["flip_rate"] == pytest.approx(ntk["flip_rate"])
    assert seed_flip_rate(a)["rate"] == 0.0 and resolved_points(a) == len(sel)


def test_some_kernel_regression_case_flips():
    """The equality above is not vacuous: across its seeds some point flips and some does not."""
    rates = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        X, Xt = rng.normal(size=(40, 6)), rng.normal(size=(25, 6))
        Y, Yt = np.eye(3)[rng.integers(0, 3, 40)], np.eye(3)[rng.integers(0, 3, 25)]
        clean = influence_from_kernels((X @ X.T, Xt @ X.T), Y, Yt, reg=Ridge(0.5))
        sel = top_by_abs(clean.total, 10)
        Xp = X.copy()
        Xp[sel] += 0.8 * rng.choice([-1.0, 1.0], size=(10, 6))
        pert = influence_from_kernels((Xp @ Xp.T, Xt @ Xp.T), Y, Yt, reg=Ridge(0.5))
        rates.append(compare(clean, pert, sel)["flip_rate"])
    assert 0 < max(rates) and min(rates) < 1


def test_noise_threshold_is_the_pooled_t_bound():
    rng = np.random.default_rng(0)
    ch = rng.normal(size=(8, 4))
    s2 = np.mean(np.var(ch, axis=1, ddof=1))
    assert noise_threshold(ch) == pytest.approx(stats.t.ppf(0.975, 8 * 3) * np.sqrt(s2 / 4))
    assert noise_threshold(ch[:, :1]) == 0.0


def test_pure_seed_noise_rarely_counts_as_a_flip():
    """Effects near zero whose perturbed values differ only by seed noise: a sign change is common, a flip beyond the
    noise is not (about the test's 5 % size)."""
    rng = np.random.default_rng(1)
    k, r, reps = 20, 3, 400
    counted, signs = [], []
    for _ in range(reps):
        mu = rng.normal(scale=0.2, size=(k, 1))
        a, b = mu + rng.normal(size=(k, r)), mu + rng.normal(size=(k, r))
        out = effect_flips(a, b)
        counted.append(out["flip_rate"])
        signs.append(np.mean(np.sign(a.mean(1)) != np.sign(b.mean(1))))
    assert np.mean(counted) < 0.05 < np.mean(signs)


def test_a_real_sign_change_beyond_the_noise_counts():
    a = np.array([[1.0, 1.1, 0.9], [-2.0, -2.1, -1.9]])
    b = np.array([[-1.0, -0.9, -1.1], [-2.0, -1.9, -2.1]])
    out = effect_flips(a, b)
    assert out["flipped"] == [True, False] and out["n_flipped"] == 1 and out["pair_flip_rate"] == 0.5


def test_seed_flip_rate_counts_opposite_signs_over_seed_pairs():
    a = np.array([[1.0, -1.0, 1.0], [1.0, 1.0, 1.0]])
    out = seed_flip_rate(a)
    assert out["n_pairs"] == 6 and out["rate"] == pytest.approx(2 / 6)
    assert np.isnan(seed_flip_rate(a[:, :1])["rate"])


def test_bad_effects_and_configs_are_user_errors():
    with pytest.raises(UserInputError, match="same shape"):
        effect_flips(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(UserInputError, match="distinct retrain seeds"):
        RetrainFlipConfig(seeds=(0, 0))
    with pytest.raises(UserInputError, match="tau"):
        RetrainFlipConfig(tau=0.0)


@pytest.mark.claim("flip-retrain-mnist")
@pytest.mark.parametrize("model", ["relu", "attn"])
def test_study_effects_are_those_of_retraining_one_network_at_a_time(model):
    """The study's effects (engine, many networks at once) against one leave-one-out retraining through the plain
    `empirics.nets.train.train` loop, and its record against its own arrays."""
    from empirics.common import dataset_tensors
    from empirics.data.datasets import DataRequest, load_dataset
    from empirics.nets.losses import loss_fn
    from empirics.nets.models import ModelSpec, build_model, input_channels
    from empirics.nets.protocols import protocol_config
    from empirics.nets.train import train

    cfg = RetrainFlipConfig(model=model, n_train=30, n_test=20, width=32, epochs=15, tau=0.1, attack_steps=2,
                            seeds=(0, 1), device="cpu", preprocess="unit")
    r = retrain_flip_study(cfg)
    k = n_top(cfg.tau, cfg.n_train)
    assert len(r.selected) == k and len(r.gates) == 3 * 2 * (k + 1)
    for name in ("clean", "attack", "random"):
        assert np.array(r.effects[name]["training"]).shape == (k, 2)
    again = effect_flips(np.array(r.effects["clean"]["training"]), np.array(r.effects["attack"]["training"]))
    assert again["flipped"] == r.flips["attack"]["training"]["flipped"]

    ds = load_dataset("mnist", n_train=30, n_test=20, request=DataRequest(task="10class", seed=0))
    t = dataset_tensors(ds)
    spec = ModelSpec(model, t.x_train.shape[1], 32, t.out_dim, seed=1, preprocess="unit",
                     channels=input_channels(ds))
    tcfg = protocol_config(cfg.protocol, cfg.epochs, seed=1, dataset="mnist", preprocess="unit")
    ce = loss_fn(t.out_dim, tcfg.loss)

    def loss_after(keep: np.ndarray) -> float:
        kt = torch.as_tensor(keep)
        net = build_model(spec, t.x_train[kt], reference=t.x_train)
        train(net, t.x_train[kt], t.y_train[kt], tcfg, (t.x_test, t.y_test), "loop")
        with torch.no_grad():
            return float(ce(net(t.x_test), t.y_test).double().sum())

    i = r.selected[0]
    expected = loss_after(np.setdiff1d(np.arange(30), [i])) - loss_after(np.arange(30))
    assert r.effects["clean"]["training"][0][1] == pytest.approx(expected, rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.claim("flip-retrain-binary-mnist", "flip-retrain-cifar10")
@pytest.mark.parametrize(("dataset", "task", "model"), [("mnist", "binary", "attn"), ("cifar10", "10class", "relu")])
def test_the_study_runs_on_binary_mnist_and_cifar10(dataset, task, model):
    """The units of the rows of binary MNIST (3-vs-8, one +-1 output) and CIFAR-10 (d = 3072) run the same study:
    the record has the design's shapes, on the data set and task asked for."""
    cfg = RetrainFlipConfig(model=model, dataset=dataset, task=task, n_train=30, n_test=20, width=16, epochs=3,
                            tau=0.1, attack_steps=2, seeds=(0, 1), device="cpu", preprocess="unit")
    r = retrain_flip_study(cfg)
    k = n_top(cfg.tau, cfg.n_train)
    assert (r.config["dataset"], r.config["task"]) == (dataset, task)
    assert len(r.selected) == k and len(r.gates) == 3 * 2 * (k + 1)
    assert all(np.array(r.effects[s]["training"]).shape == (k, 2) for s in ("clean", "attack", "random"))
    assert r.loss == ("squared error" if task == "binary" else "cross-entropy")


# ---- the powered study's pieces (issue 40 item 5): the seed-halves null and the fixed-context ablation ----------

def test_the_seed_halves_null_is_the_flip_rule_between_two_halves_of_clean_seeds():
    rng = np.random.default_rng(3)
    k, r = 30, 10
    clean = rng.normal(scale=0.3, size=(k, 1)) + rng.normal(size=(k, r))
    out = halves_null(clean)
    direct = effect_flips(clean[:, :5], clean[:, 5:])
    assert out["flip_rate"] == direct["flip_rate"] and out["seeds_per_half"] == 5
    assert halves_null(clean[:, :9])["seeds_per_half"] == 4  # an odd last seed is left out
    assert halves_null(clean[:, :3]) is None  # a half needs two seeds for its noise threshold
    # no seed noise and the same sign in both halves: nothing flips; the halves disagree beyond noise: all flip
    same = np.tile(np.linspace(0.5, 1.5, k)[:, None], (1, r))
    assert halves_null(same)["flip_rate"] == 0.0
    split = np.hstack([same[:, :5], -same[:, 5:]]) + 1e-3 * rng.normal(size=(k, r))
    assert halves_null(split)["flip_rate"] == 1.0


def test_pure_seed_noise_gives_a_small_seed_halves_null():
    """Seeds that differ only by noise: the null counts few flips beyond the noise (about the test's size)."""
    rng = np.random.default_rng(4)
    rates = [halves_null(rng.normal(scale=0.2, size=(20, 1)) + rng.normal(size=(20, 10)))["flip_rate"]
             for _ in range(300)]
    assert np.mean(rates) < 0.08


@pytest.mark.parametrize("model", ["attn", "relu"])
def test_a_fixed_context_retrain_keeps_the_clean_sets_context(model):
    """The ablation's network on a reduced, perturbed set computes what a network built on the clean set computes
    with the same weights (the context is the clean set's); without the ablation an attention network's differs."""
    from empirics.experiments.retrain_flip import retrain_model
    from empirics.nets.models import ModelSpec, build_model

    rng = np.random.default_rng(5)
    x = torch.as_tensor(rng.normal(size=(12, 6)), dtype=torch.float32)
    reduced = x[1:] + 0.3 * torch.as_tensor(rng.normal(size=(11, 6)), dtype=torch.float32)
    spec = ModelSpec(model, 6, 16, 3, seed=0, preprocess="unit")
    clean_net = build_model(spec, x, reference=x)
    fixed = retrain_model(spec, reduced, x, True, "cpu")
    free = retrain_model(spec, reduced, x, False, "cpu")
    probe = torch.as_tensor(rng.normal(size=(5, 6)), dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(fixed(probe), clean_net(probe), atol=1e-6)
        differs = not torch.allclose(free(probe), clean_net(probe), atol=1e-4)
    assert differs == (model == "attn")


def test_the_fixed_context_study_records_its_ablation_and_differs_for_attention():
    base = dict(model="attn", n_train=30, n_test=20, width=32, epochs=10, tau=0.1, attack_steps=2, seeds=(0, 1, 2, 3),
                device="cpu", preprocess="unit")
    free = retrain_flip_study(RetrainFlipConfig(**base))
    fixed = retrain_flip_study(RetrainFlipConfig(**base, fixed_context=True))
    assert fixed.config["fixed_context"] and not free.config["fixed_context"]
    assert fixed.selected == free.selected  # the same reference network and selection
    assert fixed.null_halves["training"]["seeds_per_half"] == 2
    assert not np.allclose(fixed.effects["attack"]["training"], free.effects["attack"]["training"])
