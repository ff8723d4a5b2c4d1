"""The field's attribution libraries inside the audit (`empirics.attribution.audit_attribution`), checked against what
is known independently: the rewritten graph computes the model's function; kronfluence's KFAC on a linear least-squares
model is the closed-form Gauss-Newton influence; TRAK at a projection as large as the parameters is its closed form
`diag(1 - p) Phi (Phi^T Phi)^-1 phi_t`; kronfluence's identity scores are autograd's gradient dot products. The
library-backed tests run only where the library is installed; without it, every row says how to install it."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn

from empirics.attribution import audit_attribution as aa
from empirics.common import Tensors
from ntkm.errors import UserInputError
from reports.audit_report import lds_rows
from verify.audit.modelio import FlatInput
from verify.audit.validity import estimator_rows
from verify.commands.audit import _peers


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 3, 3, stride=2, padding=1)
        self.fc = nn.Linear(3 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c(x)).flatten(1))


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    torch.set_num_threads(1)


def _cnn_problem(n: int = 40, t: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = FlatInput(SmallCNN().eval(), (1, 8, 8))
    x, xt = torch.rand(n, 64, generator=g), torch.rand(t, 64, generator=g)
    y, yt = torch.randint(0, 3, (n,), generator=g), torch.randint(0, 3, (t,), generator=g)
    return net, x, y, xt, yt


def test_modular_rewrite_keeps_the_function_and_leaves_the_model_alone():
    net, x, *_ = _cnn_problem()
    before = [p.detach().clone() for p in net.parameters()]
    gm, made = aa.modular(aa.exported_graph(net, x))
    kinds = sorted(type(m).__name__ for m in gm.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))
    assert made == 2 and kinds == ["Conv2d", "Linear"]
    with torch.no_grad():
        torch.testing.assert_close(gm(x), net(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gm(x[:3]), net(x[:3]), rtol=1e-6, atol=1e-6)
        for p in aa.tracked_params(gm):
            p.add_(1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_without_the_libraries_every_row_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(aa.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("kronfluence", "trak") else real(name, *a))
    net, x, y, xt, yt = _cnn_problem()
    rows = aa.peer_estimators(net, None, Tensors(x, y, xt, yt, 3), aa.PEERS, 0)
    assert set(rows) == set(aa.PEERS)
    for r in rows.values():
        assert r["status"] == aa.NOT_INSTALLED and aa.INSTALL in r["reason"] and "influence" not in r
    val = {"lds": {"ntk": {"value": 0.1, "lo": 0.0, "hi": 0.2}}, "best": "ntk"}
    estimator_rows(val, {"ntk": 1.5}, rows)
    shown = lds_rows(val)
    assert shown[0]["seconds"] == 1.5 and [r["label"] for r in shown[1:]] == [aa.PEER_LABELS[p] for p in aa.PEERS]
    assert all(r["unscored"] and aa.INSTALL in r["reason"] for r in shown[1:])


def test_peers_option():
    assert _peers("none") == () and _peers("ekfac,trak") == ("ekfac", "trak")
    with pytest.raises(UserInputError, match="--peers"):
        _peers("ekfac,lissa")


# --- with the libraries ------------------------------------------------------------------------------------------


def test_wiring_check_passes_and_a_miswired_library_fails_every_kronfluence_row(monkeypatch):
    pytest.importorskip("kronfluence")
    net, x, y, xt, yt = _cnn_problem()
    gm, _ = aa.modular(aa.exported_graph(net, x))
    w = aa.wiring_check(gm, Tensors(x, y, xt, yt, 3), 0)
    assert w["passed"] and w["max_rel_diff"] < aa.WIRING_TOL
    assert w["parameters"] == sum(p.numel() for p in net.parameters())
    real = aa.kronfluence_scores
    monkeypatch.setattr(aa, "kronfluence_scores", lambda *a, **k: -real(*a, **k))
    rows = aa.peer_estimators(net, None, Tensors(x, y, xt, yt, 3), aa.KRONFLUENCE, 0)
    assert all(r["status"] == aa.FAILED and "wiring check failed" in r["reason"] for r in rows.values())


def test_kfac_is_the_closed_form_gauss_newton_influence_of_a_linear_least_squares_model():
    """One linear layer, one output, half squared error: the Gauss-Newton Hessian is E[a a^T] exactly and K-FAC's
    factors are E[a a^T] and the (sampled) E[g^2], a scalar; so KFAC's influence is the exact one times a constant
    (at the library's default damping of 1e-8; the audit's peers use its heuristic, checked below)."""
    pytest.importorskip("kronfluence")
    g = torch.Generator().manual_seed(1)
    n, t, d = 200, 15, 6
    x, xt = torch.randn(n, d, generator=g), torch.randn(t, d, generator=g)
    y, yt = torch.randint(0, 2, (n,), generator=g), torch.randint(0, 2, (t,), generator=g)
    torch.manual_seed(1)
    lin = nn.Linear(d, 1)
    model = FlatInput(lin, (d,))
    infl = aa.kronfluence_scores(model, Tensors(x, y, xt, yt, 1), "kfac", 0, damping=1e-8)  # ~undamped
    a, at = (torch.cat([v, torch.ones(len(v), 1)], 1).double().numpy() for v in (x, xt))
    with torch.no_grad():
        r = (lin(x)[:, 0] - (2.0 * y - 1.0)).double().numpy()
        rt = (lin(xt)[:, 0] - (2.0 * yt - 1.0)).double().numpy()
    grads, grads_t = a * r[:, None], at * rt[:, None]
    exact = grads @ np.linalg.solve(a.T @ a / n, grads_t.T)
    corr = np.corrcoef(infl.ravel(), exact.ravel())[0, 1]
    assert corr > 0.9999, corr
    # the documented heuristic (damping_factor=None) adds 0.1 x the mean eigenvalue of the K-FAC curvature c a^T a / n
    # (c the scalar gradient factor), so its influence is the exact one with a ridge of 0.1 x mean eig(a^T a / n)
    heur = aa.kronfluence_scores(model, Tensors(x, y, xt, yt, 1), "kfac", 0, damping=None)
    cov = a.T @ a / n
    ridge = 0.1 * np.mean(np.linalg.eigvalsh(cov))
    damped = grads @ np.linalg.solve(cov + ridge * np.eye(len(cov)), grads_t.T)
    assert np.corrcoef(heur.ravel(), damped.ravel())[0, 1] > 0.9999
    assert np.corrcoef(heur.ravel(), exact.ravel())[0, 1] < np.corrcoef(heur.ravel(), damped.ravel())[0, 1]


class FixedReadout(nn.Module):
    """tanh features with a fixed (buffer) readout: the margin gradients span all 12 parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.w = nn.Parameter(torch.randn(3, 4))
        self.register_buffer("readout", torch.randn(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w.T) @ self.readout.T


def test_trak_at_a_full_projection_is_its_closed_form():
    pytest.importorskip("trak")
    g = torch.Generator().manual_seed(3)
    n, t = 60, 8
    x, xt = torch.randn(n, 4, generator=g), torch.randn(t, 4, generator=g)
    y, yt = torch.randint(0, 3, (n,), generator=g), torch.randint(0, 3, (t,), generator=g)
    model = FixedReadout()
    assert aa.trak_proj_dim(n, 12) == 12
    scores = aa.trak_scores(model, Tensors(x, y, xt, yt, 3), 0)

    def margin_grads(xs, ys):
        rows, ps = [], []
        for xi, yi in zip(xs, ys, strict=True):
            out = model(xi[None])[0]
            other = torch.cat([out[:yi], out[yi + 1:]])
            m = out[yi] - torch.logsumexp(other, 0)
            rows.append(torch.autograd.grad(m, model.w)[0].reshape(-1).double())
            ps.append(float(torch.softmax(out.detach(), 0)[yi]))
        return torch.stack(rows).numpy(), np.array(ps)

    phi, p = margin_grads(x, y)
    phi_t, _ = margin_grads(xt, yt)
    exact = (1 - p)[:, None] * (phi @ np.linalg.solve(phi.T @ phi, phi_t.T))
    corr = np.corrcoef(scores.ravel(), exact.ravel())[0, 1]
    assert corr > 0.999, corr


def test_every_library_estimator_runs_on_a_cnn_graph():
    pytest.importorskip("kronfluence")
    pytest.importorskip("trak")
    net, x, y, xt, yt = _cnn_problem()
    rows = aa.peer_estimators(net, None, Tensors(x, y, xt, yt, 3), aa.PEERS, 0)
    for name, r in rows.items():
        assert r["status"] == aa.OK, (name, r["reason"])
        assert r["influence"].shape == (40, 10) and np.isfinite(r["influence"]).all() and r["seconds"] > 0
    ident = rows["identity"]["influence"]
    assert rows["identity"]["wiring"]["passed"]
    assert np.corrcoef(ident.ravel(), rows["ekfac"]["influence"].ravel())[0, 1] > 0
