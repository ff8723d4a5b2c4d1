"""The audit's estimator registry (`verify.audit.estimators`, issue 41): every registered estimator scored on a model
with a known answer, and the recipe of docs/EXTENDING.md carried out — a new estimator defined in one place and
registered is computed, ranks the flip rates, is rescored on a perturbed set, is labelled and can lead, with no
other file edited.

The known answer: a model linear in its parameters, `f(x) = W x` with `c` outputs, whose Jacobian `J_i = I_c (x)
x_i^T` is explicit, so the empirical NTK is `X X^T (x) I_c` exactly. NTK leave-one-out is checked against actually
refitting the kernel machine without each point; the Gauss-Newton family against its P x P parameter-space
formula (`empirics.attribution.gauss_newton.*_explicit`, damping = ridge / n)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import F64_SOLVE
from torch import nn

from empirics.attribution.gauss_newton import (
    ef_influence_explicit,
    ggn_influence_explicit,
    gn_influence_explicit,
    gn_influence_mean,
    loss_residuals,
    output_hessians,
)
from empirics.attribution.influence import Ridge, influence_from_kernels
from empirics.common import Tensors
from empirics.kernels.audit_ntk import ModelJacobian
from verify.audit.config import AuditConfig
from verify.audit.ensemble import ensemble_labels
from verify.audit.estimators import ESTIMATORS, KernelEstimator, Scoring, kernel_estimator
from verify.audit.measure import GenericKernels, Network, estimate_network, measure_network
from verify.audit.modelio import FlatInput
from verify.audit.validity import estimator_label, lead_estimator

RIDGE_REL = 1e-2


def _linear_problem(n: int = 14, t: int = 5, d: int = 4, c: int = 3) -> dict[str, np.ndarray]:
    """A linear softmax model's data, Jacobians, one-hot targets and residuals (softmax minus target)."""
    rng = np.random.default_rng(7)
    X, Xt = rng.normal(size=(n, d)), rng.normal(size=(t, d))
    y, yt = np.arange(n) % c, np.arange(t) % c
    W = rng.normal(size=(c, d))
    Y, Yt = np.eye(c)[y], np.eye(c)[yt]

    def residuals(Z: np.ndarray, T: np.ndarray) -> np.ndarray:
        logits = Z @ W.T
        p = np.exp(logits - logits.max(1, keepdims=True))
        return p / p.sum(1, keepdims=True) - T

    def jac(Z: np.ndarray) -> np.ndarray:  # (points, c, c d): row a of f = W x depends on W[a] only
        return np.einsum("ab,id->iabd", np.eye(c), Z).reshape(len(Z), c, c * d)

    return {"X": X, "Xt": Xt, "yt": yt, "Y": Y, "Yt": Yt, "r": residuals(X, Y), "rt": residuals(Xt, Yt),
            "J": jac(X), "Jt": jac(Xt)}


def _scoring(p: dict[str, np.ndarray]) -> Scoring:
    K, Kst = p["X"] @ p["X"].T, p["Xt"] @ p["X"].T
    base = influence_from_kernels((K, Kst), p["Y"], p["Yt"], p["yt"], reg=Ridge(rel=RIDGE_REL))
    return Scoring(K, Kst, p["Y"], p["r"], p["rt"], base, RIDGE_REL)


def _refit_loo(p: dict[str, np.ndarray], ridge: float) -> np.ndarray:
    """NTK leave-one-out by refitting the kernel machine without each training point: the change of each test
    point's squared loss (the quantity NTK leave-one-out influence predicts in closed form)."""
    K, Kst, Y, Yt = p["X"] @ p["X"].T, p["Xt"] @ p["X"].T, p["Y"], p["Yt"]
    n = len(K)

    def losses(keep: np.ndarray) -> np.ndarray:
        alpha = np.linalg.solve(K[np.ix_(keep, keep)] + ridge * np.eye(len(keep)), Y[keep])
        return ((Kst[:, keep] @ alpha - Yt) ** 2).sum(1)

    full = losses(np.arange(n))
    return np.stack([losses(np.delete(np.arange(n), i)) - full for i in range(n)])


#: Each registered estimator's independent answer on the linear model, given its ridge (a new estimator adds its
#: reference here: step 3 of its recipe in docs/EXTENDING.md).
REFERENCES: dict[str, Callable[[dict[str, np.ndarray], float], np.ndarray]] = {
    "ntk": _refit_loo,
    "gn": lambda p, ridge: gn_influence_explicit(p["J"], p["Jt"], p["r"], p["rt"], ridge / len(p["X"])),
    "ef": lambda p, ridge: ef_influence_explicit(p["J"], p["Jt"], p["r"], p["rt"], ridge / len(p["X"])),
    "ggn": lambda p, ridge: ggn_influence_explicit(p["J"], p["Jt"], p["r"], p["rt"], output_hessians(p["r"], p["Y"]),
                                                   ridge / len(p["X"])),
}


def test_every_registered_estimator_has_a_reference():
    assert set(REFERENCES) == set(ESTIMATORS)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_each_estimator_equals_its_known_answer_on_a_linear_model(name: str):
    p = _linear_problem()
    s = _scoring(p)
    estimator = ESTIMATORS[name]
    ridge = estimator.ridge(s)
    assert ridge > 0
    got, want = estimator.score(s, ridge), REFERENCES[name](p, ridge)
    assert got.shape == want.shape == (len(p["X"]), len(p["Xt"]))
    assert np.allclose(got, want, rtol=F64_SOLVE, atol=F64_SOLVE * np.abs(want).max())
    result = estimator.result(s, ridge)
    assert np.array_equal(result.total, got.sum(axis=1)) and result.predictions is s.base.predictions


def test_an_unknown_estimator_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"unknown estimator 'nope'; one of ntk, gn") as err:
        kernel_estimator("nope")
    assert "\n" not in str(err.value)


def test_an_estimator_without_its_score_cannot_be_built():
    class Incomplete(KernelEstimator):
        name, label = "half", "half an estimator"

        def ridge(self, s: Scoring) -> float:
            return 1.0

    with pytest.raises(TypeError, match="score"):
        Incomplete()


class _GnStiff(KernelEstimator):
    """The recipe's new estimator, defined only here: Gauss-Newton at ten times the NTK ridge."""

    name, label = "gn-stiff", "Gauss-Newton, stiff ridge"

    def ridge(self, s: Scoring) -> float:
        return 10 * s.base.ridge

    def score(self, s: Scoring, ridge: float) -> np.ndarray:
        return gn_influence_mean(s.K, s.Kst, s.residuals(), s.r_test, ridge)


def test_a_new_estimator_registered_in_one_place_runs_through_the_audit(monkeypatch):
    """docs/EXTENDING.md's recipe: one class and one registry entry; nothing else is edited."""
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    monkeypatch.setitem(ESTIMATORS, _GnStiff.name, _GnStiff())
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(5)
    x, xt = torch.rand(20, 5, generator=g), torch.rand(6, 5, generator=g)
    t = Tensors(x, torch.arange(20) % 3, xt, torch.arange(6) % 3, 3)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    net = Network("your model", FlatInput(model, (5,)), GenericKernels(ModelJacobian(model, (5,)), 1 << 30), 0, 8)
    cfg = AuditConfig("model", "train", tau=0.25, steps=2, baseline_seeds=2, hessian_iters=2, attacks=("pgd",),
                      eps=0.2, seed=1)
    est = estimate_network(net, t, cfg)
    with torch.no_grad():
        r = loss_residuals(model(x), t.y_train)
    assert np.allclose(est.per_test["gn-stiff"], gn_influence_mean(est.K, est.Kst, r, est.r_test,
                                                                   10 * est.clean.ridge), rtol=F64_SOLVE)
    assert "gn-stiff" in est.seconds and est.ridges["gn-stiff"] == 10 * est.clean.ridge
    rec, ctx = measure_network(net, t, cfg, "gn-stiff", est)  # the flip rates rank by it and rescore with it
    assert rec["estimator"] == "gn-stiff" and rec["estimator_label"] == _GnStiff.label
    assert np.array_equal(rec["estimator_total"], est.per_test["gn-stiff"].sum(axis=1))
    assert np.isfinite(rec["attacks"]["pgd"]["flip_rate"])
    assert estimator_label("gn-stiff") == _GnStiff.label
    assert f"{_GnStiff.label}, averaged over the re-fits (ensemble)" in ensemble_labels().values()
    scores = {name: {"value": 0.1, "lo": 0.0} for name in est.per_test} | {"gn-stiff": {"value": 0.5, "lo": 0.2}}
    assert lead_estimator(scores) == "gn-stiff"


def estimator_name_comparisons(source: str, names: set[str]) -> list[str]:
    """Each comparison in `source` against one of `names` written as a string literal."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            sides = (node.left, *node.comparators)
            if any(isinstance(s, ast.Constant) and s.value in names for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_comparison_against_an_estimator_name_outside_its_registry():
    """A branch on an estimator's or a library peer's name is a method or flag of its registry entry instead
    (`verify.audit.estimators`, `empirics.attribution.audit_attribution.PEER_REGISTRY`)."""
    from empirics.attribution.audit_attribution import PEER_REGISTRY

    root = Path(__file__).resolve().parents[2]
    registries = {"verify/audit/estimators.py", "empirics/attribution/audit_attribution.py"}
    names = set(ESTIMATORS) | set(PEER_REGISTRY)
    found = [f"{p.relative_to(root)}:{hit}" for folder in ("verify", "reports", "empirics/attribution")
             for p in sorted((root / folder).rglob("*.py")) if p.relative_to(root).as_posix() not in registries
             for hit in estimator_name_comparisons(p.read_text(), names)]
    assert not found, "branch through the registries instead:\n" + "\n".join(found)
    assert estimator_name_comparisons('if lead == "gn":\n    pass\n', names) == ["1: lead == 'gn'"]
