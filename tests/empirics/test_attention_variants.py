"""Softmax attention and trainable Q/K/V attention (`empirics.nets.models` kinds "softmax", "qkv").

Each closed form is checked against an independent computation: the torch features against numpy
(`theory.kernels`), the closed-form empirical NTKs against `torch.func` Jacobians (`empirics.kernels.ntk`), the
Monte Carlo reference against the Thm 4.2 closed form where one exists, and identity Q/K/V against MLP-Attn.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerances import F32_ROUNDING, F64_ALGORITHM, F64_ROUNDING

from empirics.experiments.landscape import LandscapeConfig
from empirics.experiments.malleability import MalleabilityConfig
from empirics.kernels.mc_reference import mc_reference_kernel, predictor_jackknife_se
from empirics.kernels.ntk import empirical_ntk
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.models import ModelSpec, QKVAttentionNet, TwoLayerNet, build_model, save_model
from empirics.nets.train import TrainConfig, train
from ntkm.errors import UserInputError
from theory import gram, kernels

D = 6


def _data(seed: int = 0, n: int = 9, n_test: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, D, generator=g, dtype=torch.float64),
            torch.rand(n_test, D, generator=g, dtype=torch.float64))


@pytest.mark.claim("ntk-softmax-mnist", "flip-softmax-mnist")
@pytest.mark.parametrize("temperature", [None, 0.05, 10.0])
def test_softmax_features_match_numpy(temperature):
    x, xt = _data(1)
    spec = ModelSpec("softmax", D, 5, 2, attn_temperature=temperature)
    m = build_model(spec, x, dtype=torch.float64)
    ours = m.features(xt).numpy()
    ref = kernels.softmax_attention_features(x.numpy(), xt.numpy(), spec.temperature)
    assert np.allclose(ours, ref, atol=F64_ROUNDING)


@pytest.mark.claim("ntk-softmax-mnist")
def test_softmax_temperature_limits():
    """T -> inf averages the training set (every point gets the normalised mean); T -> 0 picks the best key."""
    x, xt = _data(2)
    mean = x.numpy().mean(axis=0)
    hot = kernels.softmax_attention_features(x.numpy(), xt.numpy(), 1e9)
    assert np.allclose(hot, mean / np.linalg.norm(mean), atol=1e-7)
    cold = kernels.softmax_attention_features(x.numpy(), xt.numpy(), 1e-6)
    best = x.numpy()[(xt.numpy() @ x.numpy().T).argmax(axis=1)]
    assert np.allclose(cold, best / np.linalg.norm(best, axis=1, keepdims=True), atol=1e-9)


@pytest.mark.claim("ntk-softmax-mnist", "flip-softmax-mnist")
def test_softmax_temperature_follows_the_input_scale():
    """Unit-norm inputs get T = 1/sqrt(d), so their logits x.x'/T are the channel-standardised ones up to the
    ratio of norms (sqrt(d) cos under both); with T = sqrt(d) they would be uniform to within e^(2/d) and every
    input would get the same features (the softmax rows' networks stayed at chance, D22)."""
    d = 64
    g = torch.Generator().manual_seed(3)
    xc = torch.randn(40, d, generator=g, dtype=torch.float64)  # channel-standardised scale: entries ~ 1
    xu = xc / xc.norm(dim=1, keepdim=True)
    unit, channel = ModelSpec("softmax", d, 5, 2, preprocess="unit"), ModelSpec("softmax", d, 5, 2)
    assert unit.temperature == pytest.approx(d ** -0.5) and channel.temperature == pytest.approx(d ** 0.5)
    assert ModelSpec("softmax", d, 5, 2, preprocess="unit", attn_temperature=2.0).temperature == 2.0
    norms = xc.norm(dim=1)
    assert torch.allclose(xu @ xu.T / unit.temperature, (xc @ xc.T / channel.temperature) * d
                          / torch.outer(norms, norms))
    flat = kernels.softmax_attention_features(xu.numpy(), xu.numpy(), d ** 0.5)
    sharp = kernels.softmax_attention_features(xu.numpy(), xu.numpy(), unit.temperature)
    spread = lambda f: float(np.linalg.norm(f - f.mean(axis=0), axis=1).mean())  # noqa: E731
    assert spread(flat) < 0.1 * spread(sharp)


@pytest.mark.claim("ntk-softmax-mnist", "flip-softmax-mnist", "ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv")
@pytest.mark.parametrize("kind", ["softmax", "qkv"])
@pytest.mark.parametrize("parameterization", ["ntk", "standard"])
@pytest.mark.parametrize("reduction", ["mean", "trace", "full"])
def test_closed_form_ntk_matches_jacobians(kind, parameterization, reduction):
    x, xt = _data(3)
    spec = ModelSpec(kind, D, 7, 3, parameterization, seed=4, qkv_dim=4)
    m = build_model(spec, x, dtype=torch.float64)
    closed = empirical_ntk(m, x, xt, reduction)
    generic = empirical_ntk(m, x, xt, reduction, "torch_func")
    assert torch.allclose(closed, generic, rtol=F64_ALGORITHM, atol=F64_ROUNDING)
    sym = empirical_ntk(m, x, None, reduction)
    assert torch.allclose(sym, empirical_ntk(m, x, None, reduction, "torch_func"), rtol=F64_ALGORITHM,
                          atol=F64_ROUNDING)


@pytest.mark.claim("ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv")
def test_qkv_kernel_includes_the_attention_blocks():
    """The Q/K/V blocks are a real part of the kernel: it differs from the W block alone by more than rounding."""
    x, _ = _data(5)
    m = build_model(ModelSpec("qkv", D, 8, 2, seed=1, qkv_dim=3), x, dtype=torch.float64)
    full = empirical_ntk(m, x)
    m.requires_grad_(False).W.requires_grad_(True)  # the W block alone
    head = empirical_ntk(m, x, implementation="torch_func")
    assert float((full - head).abs().max()) > 1e-3 * float(full.abs().max())


@pytest.mark.claim("ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv")
def test_qkv_with_identity_projections_is_mlp_attn():
    """Q = K = V = I (k = d) gives the paper's linearized attention `normalise(x C)` and the same network."""
    x, xt = _data(6)
    q = build_model(ModelSpec("qkv", D, 5, 2, "standard", seed=2, qkv_dim=D), x, dtype=torch.float64)
    a = build_model(ModelSpec("attn", D, 5, 2, "standard", seed=2), x, dtype=torch.float64)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V"):
            getattr(q, name).copy_(torch.eye(D, dtype=torch.float64))
        q.W.copy_(a.W)
    assert torch.allclose(q.features(xt), a.features(xt), atol=F64_ROUNDING)
    ref = gram.attention_features(x.numpy(), xt.numpy())
    assert np.allclose(q.features(xt).detach().numpy(), ref, atol=F64_ROUNDING)
    assert torch.allclose(q(xt), a(xt), atol=F64_ROUNDING)


@pytest.mark.parametrize("kind", ["softmax", "qkv"])
def test_context_inputs_path_is_the_rebuilt_context(kind):
    """`features(x, context_inputs=X')` equals the model after `set_context(X')`, and is differentiable in X'."""
    x, xt = _data(7)
    m = build_model(ModelSpec(kind, D, 5, 2, seed=3, qkv_dim=4), x, dtype=torch.float64)
    x2 = (x + 0.1 * torch.rand_like(x)).requires_grad_(True)
    on_the_fly = m.features(xt, context_inputs=x2)
    (g,) = torch.autograd.grad((on_the_fly[:, 0] - on_the_fly[:, 1]).sum(), x2)
    assert float(g.abs().max()) > 0
    m.set_context(x2.detach())
    assert torch.allclose(on_the_fly.detach(), m.features(xt).detach(), atol=F64_ROUNDING)


@pytest.mark.claim("flip-softmax-mnist", "flip-qkv-mnist", "v2-qkv")
@pytest.mark.parametrize("kind", ["softmax", "qkv"])
def test_fixed_context_attack_stays_in_the_ball(kind):
    x, _ = _data(8)
    m = build_model(ModelSpec(kind, D, 16, 3, seed=0, qkv_dim=4), x.float())
    y = torch.tensor([0, 1, 2] * 3)
    adv = attack(m, x.float(), y, AttackConfig("pgd", 0.1, steps=3))
    assert float((adv - x.float()).abs().max()) <= 0.1 + F32_ROUNDING and float((adv - x.float()).abs().max()) > 0


@pytest.mark.claim("ntk-qkv-mnist", "flip-qkv-mnist", "v2-qkv")
def test_qkv_training_moves_the_attention_weights():
    """The trainer's fixed-feature shortcut applies to `TwoLayerNet` only: Q, K, V are trained too."""
    x, _ = _data(9, n=24)
    y = torch.arange(24) % 3
    m = build_model(ModelSpec("qkv", D, 16, 3, seed=0, qkv_dim=4), x.float())
    assert isinstance(m, QKVAttentionNet) and not isinstance(m, TwoLayerNet)
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    train(m, x.float(), y, TrainConfig(epochs=3, lr=1e-2, weight_decay=0.0, batch_size=8))
    assert set(before) == {"W", "W_Q", "W_K", "W_V"}
    assert all(float((p.detach() - before[k]).abs().max()) > 0 for k, p in m.named_parameters())


@pytest.mark.claim("ntk-qkv-mnist", "v2-qkv")
@pytest.mark.parametrize("kind", ["relu", "attn", "softmax"])
def test_monte_carlo_reference_matches_the_closed_form(kind):
    """E_init[Theta_0] is the Thm 4.2 kernel on each model's features; the MC mean agrees within 5 standard errors
    entrywise, and its standard error is small enough that a 10 % error of the closed form would be detected."""
    x, xt = _data(10, n=6, n_test=2)
    spec = ModelSpec(kind, D, 1, 1)
    joint = torch.cat([x, xt])
    mc = mc_reference_kernel(spec, x, joint, draws=24, width=256, seed=0)
    xn, jn = x.numpy(), joint.numpy()
    feats = {"relu": jn, "attn": gram.attention_features(xn, jn),
             "softmax": kernels.softmax_attention_features(xn, jn, spec.temperature)}[kind]
    exact = kernels.analytic_ntk_two_layer(feats)
    z = np.abs(mc.mean - exact) / np.maximum(mc.se, 1e-300)
    assert z.max() < 5.0
    assert 5 * np.linalg.norm(mc.se) < 0.1 * np.linalg.norm(exact)


@pytest.mark.claim("ntk-qkv-mnist", "v2-qkv")
def test_qkv_monte_carlo_reference_is_width_independent():
    """No closed form for qkv, but its expected kernel does not depend on the width (module docstring of
    `empirics.kernels.mc_reference`): two widths 32x apart agree within their combined standard errors (a kernel block
    missing its 1/m would differ 32-fold)."""
    x, _ = _data(11, n=5)
    spec = ModelSpec("qkv", D, 1, 2, qkv_dim=4)
    a = mc_reference_kernel(spec, x, x, draws=40, width=8, seed=0)
    b = mc_reference_kernel(spec, x, x, draws=40, width=256, seed=1)
    z = np.abs(a.mean - b.mean) / np.sqrt(a.se**2 + b.se**2)
    assert z.max() < 5.0


@pytest.mark.claim("ntk-qkv-mnist", "v2-qkv")
def test_jackknife_of_a_linear_statistic_is_the_standard_error():
    """For a kernel predictor that is linear in the kernel (ridge-free, one test row) the jackknife reduces to the
    textbook standard error of the mean; checked on an independent numpy computation."""
    x, xt = _data(12, n=4, n_test=1)
    spec = ModelSpec("relu", D, 1, 1)
    mc = mc_reference_kernel(spec, x, torch.cat([x, xt]), draws=6, width=4, seed=0)
    y = np.random.default_rng(0).standard_normal((4, 1))
    se = predictor_jackknife_se(mc, 4, y, ridge=1e6)  # a huge ridge makes f ~ K_st y / ridge: linear in K
    lin = np.array([s[4:, :4] @ y / 1e6 for s in mc.samples]).reshape(6, -1)
    expected = float(np.sqrt((lin.std(axis=0, ddof=1) ** 2 / 6).sum()))
    assert se == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("kind", ["softmax", "qkv"])
def test_save_and_load_through_the_audit_loader(kind, tmp_path):
    """The audit rebuilds suite models from spec + safetensors without the training set (`_build_suite`)."""
    from verify.audit.modelio import load_model

    x, xt = _data(13)
    m = build_model(ModelSpec(kind, D, 5, 2, seed=5, qkv_dim=3), x.float())
    path, _ = save_model(m, tmp_path / f"{kind}.safetensors")
    loaded = load_model(path)
    net = getattr(loaded, "module", loaded)
    assert torch.allclose(net(xt.float()), m(xt.float()), atol=F32_ROUNDING)


def test_old_specs_without_the_new_fields_still_load():
    old = {"kind": "attn", "d": 4, "width": 3, "out_dim": 2, "parameterization": "ntk", "attn_layers": 1,
           "attn_rank": None, "seed": 0}
    spec = ModelSpec(**old)
    assert spec.attn_temperature is None and spec.qkv_dim == 64 and spec.head_dim == 4


@pytest.mark.parametrize("make", [
    lambda: ModelSpec("softmax", 4, 3, 2, attn_centre=True),
    lambda: ModelSpec("qkv", 4, 3, 2, attn_layers=2),
    lambda: ModelSpec("softmax", 4, 3, 2, attn_temperature=0.0),
    lambda: ModelSpec("qkv", 4, 3, 2, qkv_dim=0),
    lambda: MalleabilityConfig(models=("relu", "qkv"), attack_context="recomputed"),
    lambda: LandscapeConfig(models=("qkv",)),
    lambda: build_model(ModelSpec("softmax", 4, 3, 2)).features(torch.ones(1, 4)),
])
def test_bad_variant_input_is_one_line(make):
    with pytest.raises(UserInputError) as exc:
        make()
    assert "\n" not in str(exc.value)


@pytest.mark.claim("ntk-qkv-mnist", "v2-qkv")
def test_distance_recovers_the_initial_qkv_network_after_training():
    """The NTK-distance run's Theta_0 and f_0 come from a rebuild of the spec: it must be the network training
    started from (compared with a copy taken before training)."""
    from empirics.common import as_float64
    from empirics.experiments.distance import _at_init

    x, _ = _data(14, n=24)
    m = build_model(ModelSpec("qkv", D, 8, 3, seed=7, qkv_dim=4), x.float())
    before = as_float64(m)
    train(m, x.float(), torch.arange(24) % 3, TrainConfig(epochs=2, lr=1e-2, weight_decay=0.0, batch_size=8))
    m0 = _at_init(as_float64(m), m.W.detach(), x.float())
    for (name, p), (_, q) in zip(m0.named_parameters(), before.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    assert torch.equal(empirical_ntk(m0, x), empirical_ntk(before, x))
