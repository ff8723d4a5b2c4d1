"""The model-kind registry (`empirics.nets.kinds`): one test over every registered kind, each checked against something
independent (torch features against numpy's analytic features, the closed-form NTK against `torch.func`, the
reference kernel against Monte Carlo), and the combinations it does not support refused in one line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from empirics.experiments.distance import analytic_features, analytic_kernels
from empirics.kernels.mc_reference import mc_reference_kernel
from empirics.kernels.ntk import NtkImpl, closed_form_gap, empirical_ntk, resolve_implementation
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.kinds import ANALYTIC, KINDS, MONTE_CARLO, help_text, kind, kinds_where
from empirics.nets.models import ModelSpec, TwoLayerNet, build_model, preprocessed_inputs
from empirics.vocab import MODEL_KINDS
from ntkm.errors import UserInputError

ALL = list(KINDS)


def _data(seed: int = 0, n: int = 12, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen, dtype=torch.float64), torch.rand(5, d, generator=gen, dtype=torch.float64)


def _net(name: str, width: int = 64, seed: int = 0, preprocess: str = "raw") -> tuple[torch.nn.Module, ModelSpec]:
    x, _ = _data()
    spec = ModelSpec(name, x.shape[1], width, 3, seed=seed, preprocess=preprocess, qkv_dim=4)
    return build_model(spec, x, dtype=torch.float64), spec


def test_every_kind_of_the_vocabulary_is_registered_once():
    assert tuple(KINDS) == MODEL_KINDS
    assert all(k.reference in (ANALYTIC, MONTE_CARLO) for k in KINDS.values())
    assert all(name in help_text() for name in KINDS)
    assert kinds_where(has_context=False) == ("relu",)


@pytest.mark.parametrize("name", [n for n in ALL if KINDS[n].reference == ANALYTIC])
@pytest.mark.parametrize("preprocess", ["raw", "unit"])
def test_torch_features_are_the_analytic_features(name, preprocess):
    """The network's own feature map (torch) is the input map the closed-form reference kernel is built on (numpy)."""
    x, xt = _data()
    net, spec = _net(name, preprocess=preprocess)
    x_np, xt_np = preprocessed_inputs(spec, x.numpy(), xt.numpy())
    with torch.no_grad():
        ours = net.features(xt).numpy()
    np.testing.assert_allclose(ours, analytic_features(spec, x_np, xt_np), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_closed_form_ntk_is_torch_func(name):
    _, xt = _data()
    net, _ = _net(name)
    assert resolve_implementation(net) is NtkImpl.CLOSED_FORM
    np.testing.assert_allclose(empirical_ntk(net, xt, None, "full", NtkImpl.CLOSED_FORM).numpy(),
                               empirical_ntk(net, xt, None, "full", NtkImpl.TORCH_FUNC).numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in ALL if KINDS[n].reference == ANALYTIC])
def test_analytic_reference_is_the_monte_carlo_mean(name):
    """Where both exist, the closed form of Thm 4.2 is the expected empirical NTK at initialisation: every entry
    within 5 Monte Carlo standard errors (64 draws at width 256)."""
    x, xt = _data()
    _, spec = _net(name)
    x_np, xt_np = preprocessed_inputs(spec, x.numpy(), xt.numpy())
    k_tt, _ = analytic_kernels(spec, x_np, xt_np)
    mc = mc_reference_kernel(spec, x, x, draws=64, width=256)
    assert np.all(np.abs(mc.mean - k_tt) <= 5 * mc.se + 1e-12)


def test_a_kind_without_a_closed_form_reference_is_refused_not_replaced():
    x, xt = _data()
    _, spec = _net("qkv")
    assert kind("qkv").reference == MONTE_CARLO
    with pytest.raises(UserInputError, match="no closed-form reference kernel"):
        analytic_features(spec, x.numpy(), xt.numpy())


def test_unknown_kinds_and_unsupported_attacks_are_one_line_errors():
    with pytest.raises(UserInputError, match="unknown model 'gru'; choose one of relu, attn, softmax, qkv"):
        kind("gru")
    with pytest.raises(UserInputError, match="unknown model"):
        ModelSpec("gru", 4, 8, 2)
    x, _ = _data()
    net, _ = _net("softmax")
    y = torch.zeros(3, dtype=torch.long)
    with pytest.raises(UserInputError, match="recomputed-context attack is not implemented for model 'softmax'"):
        attack(net, x[:3].float().double(), y, AttackConfig("pgd", 0.1, steps=1, context="recomputed"),
               train_x=x, train_idx=torch.arange(3))
    relu, _ = _net("relu")  # no context to rebuild: a recomputed-context attack is the plain one
    cfg = AttackConfig("pgd", 0.1, steps=2, context="recomputed")
    torch.testing.assert_close(attack(relu, x[:3], y, cfg, train_x=x, train_idx=torch.arange(3)),
                               attack(relu, x[:3], y, replace(cfg, context="fixed")))


def test_extra_trainable_parameters_get_the_generic_kernel_not_a_closed_form_that_drops_them():
    """A `TwoLayerNet` subclass that trains its output layer too: `auto` takes `torch.func` (the kernel with the A
    block), and asking for the closed form is refused."""
    x, xt = _data()

    class TrainedHead(TwoLayerNet):
        def __init__(self, spec: ModelSpec, x_train: torch.Tensor):
            super().__init__(spec, x_train, torch.float64)
            self.A = torch.nn.Parameter(self.A.detach().clone())

    net = TrainedHead(ModelSpec("relu", 8, 16, 3), x)
    assert "TrainedHead" in closed_form_gap(net)
    assert resolve_implementation(net) is NtkImpl.TORCH_FUNC
    with pytest.raises(UserInputError, match="does not cover this model"):
        empirical_ntk(net, xt, None, "mean", NtkImpl.CLOSED_FORM)
    plain = TwoLayerNet(ModelSpec("relu", 8, 16, 3), x, torch.float64)
    plain.load_state_dict({k: v for k, v in net.state_dict().items()})
    full, w_only = empirical_ntk(net, xt), empirical_ntk(plain, xt)
    assert not torch.allclose(full, w_only)  # the A block is there
    plain.A = torch.nn.Parameter(plain.A.detach().clone())  # the exact class with A trainable: also not closed form
    assert "trainable parameters A" in closed_form_gap(plain)
