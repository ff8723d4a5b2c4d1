"""Input preprocessing as the networks' fixed first layer (`ModelSpec.preprocess`): features against the
preprocessing done by hand, attack budgets in pixel units, statistics fixed at build time and kept through a
save/load round trip, and the closed-form and analytic kernels seeing the inputs the network sees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from empirics.data.datasets import input_statistics, preprocess
from empirics.kernels.ntk import empirical_ntk
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.models import ModelSpec, build_model, preprocessed_inputs, save_model
from ntkm.errors import UserInputError
from theory import kernels

C, HW = 3, 4  # three colour channels of 2 x 2 pixels
D = C * HW


def _pixels(n: int, seed: int = 0) -> torch.Tensor:
    """[0, 1] pixels whose channels have different means and spreads (so the statistics matter)."""
    gen = torch.Generator().manual_seed(seed)
    lo = torch.tensor([0.1, 0.5, 0.7]).repeat_interleave(HW)
    spread = torch.tensor([0.05, 0.3, 0.2]).repeat_interleave(HW)
    return (lo + spread * torch.rand(n, D, generator=gen, dtype=torch.float64)).clamp(0, 1)


def _by_hand(x: torch.Tensor, ref: torch.Tensor, unit: bool = False) -> torch.Tensor:
    """Per-channel standardisation written out: mean and std over every pixel of a channel of `ref`."""
    per = ref.reshape(len(ref), C, HW)
    mu, sd = per.mean(dim=(0, 2)), per.std(dim=(0, 2), unbiased=False)
    h = ((x.reshape(len(x), C, HW) - mu[None, :, None]) / sd[None, :, None]).reshape(len(x), D)
    return h / h.norm(dim=1, keepdim=True) if unit else h


def _spec(kind: str, preprocess_mode: str, **kw) -> ModelSpec:
    return ModelSpec(kind, D, 32, 3, preprocess=preprocess_mode, channels=C, **kw)


@pytest.mark.parametrize("mode", ["channel", "unit"])
def test_features_equal_the_preprocessing_by_hand(mode):
    x, xt = _pixels(20), _pixels(7, seed=1)
    want = _by_hand(xt, x, unit=mode == "unit")
    relu = build_model(_spec("relu", mode), x, dtype=torch.float64)
    assert torch.allclose(relu.features(xt), want, atol=1e-12)
    attn = build_model(_spec("attn", mode), x, dtype=torch.float64)
    xp = _by_hand(x, x, unit=mode == "unit")
    ctx_feats = want @ (xp.T @ xp)  # C = X~^T X~ of the preprocessed training inputs
    assert torch.allclose(attn.features(xt), ctx_feats / ctx_feats.norm(dim=1, keepdim=True), atol=1e-10)
    soft = build_model(_spec("softmax", mode), x, dtype=torch.float64)
    assert torch.allclose(soft.context, xp, atol=1e-12)  # the keys are the preprocessed training inputs
    # the numpy twin (the kappa sweep's `preprocess`) and `preprocessed_inputs` (the analytic kernels) agree
    assert np.allclose(preprocess(xt.numpy(), mode, reference=x.numpy(), channels=C), want.numpy(), atol=1e-12)
    got_tr, got_te = preprocessed_inputs(_spec("relu", mode), x.numpy(), xt.numpy())
    assert np.allclose(got_tr, xp.numpy(), atol=1e-12) and np.allclose(got_te, want.numpy(), atol=1e-12)
    if mode == "unit":
        assert torch.allclose(relu.features(xt).norm(dim=1), torch.ones(7, dtype=torch.float64))


def test_raw_is_the_identity_and_adds_no_buffers():
    x = _pixels(10)
    m = build_model(ModelSpec("attn", D, 8, 3), x, dtype=torch.float64)
    assert "input_shift" not in m.state_dict()
    assert torch.equal(m.preprocess_inputs(x), x)
    assert ModelSpec("relu", D, 8, 3, channels=3).channels == 1  # no statistics: equal networks, equal specs


def test_statistics_are_per_channel_and_a_constant_channel_keeps_scale_one():
    x = _pixels(30).numpy()
    x[:, :HW] = 0.25
    shift, scale = input_statistics(x, C)
    assert shift.shape == scale.shape == (D,)
    assert np.allclose(shift[:HW], 0.25) and np.allclose(scale[:HW], 1.0)
    assert np.allclose(shift[HW:2 * HW], x[:, HW:2 * HW].mean())
    assert np.allclose(scale[2 * HW:], x[:, 2 * HW:].std())


@pytest.mark.parametrize(("kind", "context"), [("relu", "fixed"), ("attn", "fixed"), ("attn", "recomputed")])
def test_attack_budgets_stay_in_pixel_units(kind, context):
    """A PGD attack through the preprocessing layer moves the raw input by at most eps (and keeps it in [0, 1]),
    while the standardised input the network computes on moves by more than eps: the budget is in pixel units."""
    x = _pixels(24)
    model = build_model(_spec(kind, "channel"), x, dtype=torch.float64)
    y = torch.arange(24) % 3
    eps = 0.05
    idx = torch.arange(8)
    x_adv = attack(model, x[:8], y[:8], AttackConfig("pgd", eps, steps=5, context=context),
                   train_x=x, train_idx=idx)
    assert float((x_adv - x[:8]).abs().max()) <= eps + 1e-12
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    seen = model.preprocess_inputs(x_adv) - model.preprocess_inputs(x[:8])
    assert float(seen.abs().max()) > 2 * eps  # the first channel's std is ~0.014: eps there is several std
    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert loss(model(x_adv), y[:8]) > loss(model(x[:8]), y[:8])  # the attack did something


def test_statistics_stay_fixed_when_the_context_is_rebuilt():
    x = _pixels(20)
    model = build_model(_spec("attn", "channel"), x, dtype=torch.float64)
    shift = model.input_shift.clone()
    moved = (x + 0.3).clamp(0, 1)
    model.set_context(moved)
    assert torch.equal(model.input_shift, shift)
    xp = _by_hand(moved, x)  # the new inputs through the OLD statistics
    assert torch.allclose(model.context, xp.T @ xp, atol=1e-10)
    assert torch.allclose(model.features(x[:3], context_inputs=moved), model.features(x[:3]), atol=1e-12)


def test_leave_one_out_refits_can_keep_the_full_sets_statistics():
    x = _pixels(20)
    full = build_model(_spec("relu", "channel"), x, dtype=torch.float64)
    refit = build_model(_spec("relu", "channel"), x[1:], dtype=torch.float64, reference=x)
    assert torch.equal(full.input_shift, refit.input_shift) and torch.equal(full.input_scale, refit.input_scale)
    own = build_model(_spec("relu", "channel"), x[1:], dtype=torch.float64)
    assert not torch.equal(own.input_shift, full.input_shift)


@pytest.mark.parametrize("kind", ["relu", "attn", "qkv"])
def test_save_load_round_trip_keeps_the_statistics(tmp_path, kind):
    from verify.audit.modelio import load_model

    x = _pixels(20).float()
    model = build_model(_spec(kind, "unit"), x)
    path, _ = save_model(model, tmp_path / "net.safetensors")
    loaded = load_model(path).module
    assert torch.equal(loaded.input_shift, model.input_shift) and torch.equal(loaded.input_scale, model.input_scale)
    assert loaded.spec.preprocess == "unit" and loaded.spec.channels == C
    xt = _pixels(5, seed=2).float()
    with torch.no_grad():
        assert torch.allclose(loaded(xt), model(xt), atol=1e-6)


def test_a_preprocessing_model_without_training_inputs_is_refused():
    with pytest.raises(UserInputError, match="needs the training inputs"):
        build_model(_spec("relu", "channel"))
    with pytest.raises(UserInputError, match="channels must divide"):
        ModelSpec("relu", D, 8, 3, preprocess="channel", channels=5)
    with pytest.raises(UserInputError, match="unknown preprocess"):
        ModelSpec("relu", D, 8, 3, preprocess="zca")


@pytest.mark.parametrize("kind", ["relu", "attn", "qkv"])
def test_closed_form_ntk_sees_the_preprocessed_inputs(kind):
    """The closed-form kernel against `torch.func` (which differentiates the whole forward, layer included)."""
    x = _pixels(9)
    model = build_model(_spec(kind, "channel", **({"qkv_dim": 5} if kind == "qkv" else {})), x, dtype=torch.float64)
    fast = empirical_ntk(model, x[:6], x[3:], "mean", "closed_form")
    slow = empirical_ntk(model, x[:6], x[3:], "mean", "torch_func")
    assert float((fast - slow).norm() / slow.norm()) < 1e-8


@pytest.mark.parametrize("kind", ["relu", "attn"])
def test_analytic_reference_kernel_is_that_of_the_preprocessed_network(kind):
    """The Thm 4.2 kernel on the preprocessed inputs (as `empirics.experiments.distance` computes it) matches the
    empirical kernel of wide networks at initialisation; on the raw pixels it does not."""
    from theory import gram

    x = _pixels(8)
    spec = ModelSpec(kind, D, 1, 1, preprocess="channel", channels=C)
    (xp,) = preprocessed_inputs(spec, x.numpy())

    def analytic(inputs: np.ndarray) -> np.ndarray:
        feats = gram.attention_features(inputs, inputs) if kind == "attn" else inputs
        return kernels.analytic_ntk_two_layer(feats, feats)

    wide = np.mean([empirical_ntk(build_model(ModelSpec(kind, D, 20000, 1, seed=s, preprocess="channel", channels=C),
                                              x, dtype=torch.float64), x).numpy() for s in range(3)], axis=0)
    err = np.linalg.norm(wide - analytic(xp)) / np.linalg.norm(analytic(xp))
    raw_err = np.linalg.norm(wide - analytic(x.numpy())) / np.linalg.norm(analytic(x.numpy()))
    assert err < 0.03 and raw_err > 10 * err, (err, raw_err)
