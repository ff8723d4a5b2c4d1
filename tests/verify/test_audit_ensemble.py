"""Ensemble estimators (`verify.audit.ensemble`, issue 43 item 5): each ensemble is the mean over full-data re-fits
of its estimator, checked against an independent computation (explicit per-example Jacobians by autograd and the P x
P empirical-Fisher solve on each re-fitted model); the members are never the LDS re-fits they are scored against;
the designs where an ensemble would score itself, or average one model, run none and say why."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from empirics.attribution.gauss_newton import ef_influence_explicit, loss_residuals
from empirics.common import Tensors
from verify.audit.config import AuditConfig
from verify.audit.ensemble import PREFIX, ensemble_estimates
from verify.audit.estimators import EF_RIDGE_REL, ESTIMATORS
from verify.audit.modelio import FlatInput
from verify.audit.refit import RefitConfig, Refitter
from verify.audit.seeding import FRESH_OFFSET


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, t, d, c = 24, 6, 5, 3
    x, xt = torch.rand(n, d, generator=g, dtype=torch.float64), torch.rand(t, d, generator=g, dtype=torch.float64)
    y, yt = torch.arange(n) % c, torch.arange(t) % c
    torch.manual_seed(seed)
    inner = nn.Sequential(nn.Linear(d, 4), nn.Tanh(), nn.Linear(4, c)).double()
    inner[0].requires_grad_(False)  # a trained linear readout: its NTK is K (x) I_c exactly, the audit's mean form
    net = FlatInput(inner, (d,))
    refit = Refitter.for_module(inner, net, RefitConfig(epochs=3, lr=1e-2, batch_size=8), c, (d,))
    return Tensors(x, y, xt, yt, c), refit, inner, net


def _explicit_ef(net: nn.Module, t: Tensors) -> np.ndarray:
    """Empirical-Fisher influence from explicit per-example output Jacobians (autograd, one example at a time) and the
    P x P solve, at the audit's ridge rule (`EF_RIDGE_REL` x the mean squared gradient norm)."""
    params = [p for p in net.parameters() if p.requires_grad]

    def jac(x: torch.Tensor) -> np.ndarray:
        rows = []
        for xi in x:
            out = net(xi[None])[0]
            per_out = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(out[k], params, retain_graph=True)])
                       for k in range(out.numel())]
            rows.append(torch.stack(per_out).detach().numpy())
        return np.stack(rows)

    J, Jt = jac(t.x_train), jac(t.x_test)
    with torch.no_grad():
        r, rt = loss_residuals(net(t.x_train), t.y_train), loss_residuals(net(t.x_test), t.y_test)
    g = np.einsum("icp,ic->ip", J, r)
    n = len(g)
    ridge = EF_RIDGE_REL * float((g * g).sum()) / n
    return ef_influence_explicit(J, Jt, r, rt, ridge / n)


def test_an_ensemble_is_the_mean_of_its_members_estimator():
    t, refit, inner, net = _setup()
    before = [p.detach().clone() for p in inner.parameters()]
    cfg = AuditConfig("model", "train", seed=3)
    ens = ensemble_estimates(refit, t, cfg, (t.x_train.shape[1],), 1 << 30, 2)
    assert ens.seeds == [3, 4] and not ens.skipped
    assert set(ens.per_test) == {f"{PREFIX}{n}" for n in ESTIMATORS}
    members = []
    for s in ens.seeds:
        with refit.fitted(t.x_train, t.y_train, s) as fitted:
            members.append(_explicit_ef(fitted, t))
    np.testing.assert_allclose(ens.per_test[f"{PREFIX}ef"], np.mean(members, axis=0), rtol=1e-6, atol=1e-10)
    assert not np.allclose(members[0], members[1])  # the members differ: an average of two models, not one twice
    assert all(torch.equal(a, b) for a, b in zip(before, inner.parameters(), strict=True))  # the model restored


def test_the_members_are_not_the_lds_refits():
    cfg = AuditConfig("model", "train", seed=0, ensemble=3)
    members = [cfg.seed + k for k in range(cfg.ensemble)]
    assert max(members) < FRESH_OFFSET + cfg.seed  # every fresh LDS seed is at or above the offset


@pytest.mark.parametrize("kwargs, why", [({"lds_seeds": "paired"}, "paired"), ({}, "below 2")])
def test_designs_where_an_ensemble_would_score_itself_or_average_one_model_run_none(kwargs, why):
    t, refit, _, _ = _setup()
    members = 3 if kwargs else 1
    ens = ensemble_estimates(refit, t, AuditConfig("model", "train", **kwargs), (t.x_train.shape[1],), 1 << 30,
                             members)
    assert not ens.per_test and why in ens.skipped and refit.count == 0


def test_an_ensemble_of_one_is_refused_in_one_line():
    from ntkm.errors import UserInputError

    with pytest.raises(UserInputError, match="--ensemble"):
        AuditConfig("model", "train", ensemble=1)


def test_the_generalised_gauss_newton_estimator_says_why_it_did_not_run(monkeypatch):
    """Above its exact dual's size limit the estimator is not computed and the panel's unscored rows say why, instead
    of an interval of NaN; below it, it is computed beside the others."""
    import verify.audit.estimators as estimators
    from empirics.kernels.audit_ntk import ModelJacobian
    from verify.audit.measure import GenericKernels, Network, estimate_network

    t, _, inner, net = _setup()
    member = Network("m", net, GenericKernels(ModelJacobian(inner, (t.x_train.shape[1],)), 1 << 30), 15, 4)
    cfg = AuditConfig("model", "train")
    est = estimate_network(member, t, cfg)
    assert "ggn" in est.per_test and np.isfinite(est.per_test["ggn"]).all() and not est.skipped
    monkeypatch.setattr(estimators, "GGN_MAX_DIM", len(t.x_train) * t.out_dim - 1)
    small = estimate_network(member, t, cfg)
    assert "ggn" not in small.per_test and "above" in small.skipped["ggn"] and "--n" in small.skipped["ggn"]


@pytest.mark.parametrize("keep", [True, False], ids=["jacobians-kept", "over-the-memory-budget"])
def test_an_ensemble_lead_on_a_perturbed_set_is_the_mean_of_each_members_own_recomputation(keep: bool):
    """`EnsembleLead.perturbed` (kept weights applied to the module, kernel rows of the moved points from the member's
    kept clean Jacobians, or from all points' where they do not fit the budget beside the others', residuals there)
    against each member re-fitted again from its seed, its whole kernel recomputed on the perturbed set and every
    residual recomputed, then averaged; the user's weights are untouched throughout."""
    from verify.audit.measure import GenericKernels, model_jacobian

    t, refit, inner, net = _setup()
    cfg = AuditConfig("model", "train", seed=3)
    d = t.x_train.shape[1]
    one = model_jacobian(inner, (d,)).bytes_per_example() * (len(t.x_train) + len(t.x_test))
    ens = ensemble_estimates(refit, t, cfg, (d,), 1 << 30 if keep else one, 2)  # `one`: each member's alone fits
    assert [m.provider.holds_jacobians for m in ens.members] == [keep, keep]
    user = [p.detach().clone() for p in inner.parameters()]
    chosen = np.array([1, 5, 7])
    ct = torch.as_tensor(chosen)
    x_adv = t.x_train[ct] + 0.05
    x_new = t.x_train.index_copy(0, ct, x_adv)
    yt = t.y_test.numpy()
    for name in ("ens-ef", "ens-gn", "ens-ntk"):
        lead = ens.lead(name, refit)
        assert lead is not None and lead.base == name[len(PREFIX):]
        got = lead.perturbed(x_new, chosen, x_adv, t.y_train[ct], t.x_test, yt)
        expected = []
        for m in ens.members:
            with refit.fitted(t.x_train, t.y_train, m.seed) as fitted:
                K2, Kst2 = GenericKernels(model_jacobian(fitted.inner, (d,)), 1 << 30).clean(x_new, t.x_test)
                with torch.no_grad():
                    r_all = loss_residuals(fitted(x_new), t.y_train)
                expected.append(m.est.perturbed(lead.base, K2, Kst2, yt, lambda r_all=r_all: r_all).per_test)
        np.testing.assert_allclose(got.per_test, np.mean(expected, axis=0), rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(got.total, got.per_test.sum(axis=1))
        assert all(torch.equal(a, b) for a, b in zip(user, inner.parameters(), strict=True))
    assert ens.lead("ef", refit) is None  # a single network's estimator is not an ensemble lead


def test_a_kept_snapshot_is_applied_and_the_module_restored():
    t, refit, inner, _ = _setup()
    user = [p.detach().clone() for p in inner.parameters()]
    with refit.fitted(t.x_train, t.y_train, 9):
        snap = refit.snapshot()
        fitted = [p.detach().clone() for p in inner.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(user, fitted, strict=True))
    with refit.applied(snap):
        assert all(torch.equal(a, b) for a, b in zip(fitted, inner.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(user, inner.parameters(), strict=True))


def test_an_ensemble_may_lead_when_it_predicts_the_refits_best():
    from verify.audit.validity import lead_estimator

    def score(v: float) -> dict[str, float]:
        return {"value": v, "lo": v - 0.1}
    assert lead_estimator({"ef": score(0.2), "ens-ef": score(0.3), "kfac": score(0.5)}) == "ens-ef"
    assert lead_estimator({"ef": score(0.4), "ens-ef": score(0.3)}) == "ef"
    assert lead_estimator({"ens-nonsense": score(0.9), "gn": score(0.1)}) == "gn"  # only ensembles of registered ones
