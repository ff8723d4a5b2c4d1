"""The projected empirical NTK of `verify audit`: its error against an exact kernel computed independently
(torch.func Jacobians) shrinks as k grows, R is the same cached or regenerated, the Jacobians go through in
bounded batches, the automatic choice, and the report stating the projection and its measured error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tolerances import F32_REORDER, F32_ROUNDING
from torch import nn
from torch.func import functional_call, jacrev, vmap
from torchscript import script

from empirics.common import Tensors
from empirics.kernels.audit_ntk import ModelJacobian, ProjectedJacobian, Projection
from verify.audit.config import AuditConfig
from verify.audit.projection import AUTO_DIM, choose_projection, projection_error
from verify.audit.record import record_errors
from verify.cli import main

KS = (8, 32, 128, 512)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 3)).eval()


def _exact(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The mean-reduction empirical NTK from torch.func Jacobians (independent of `empirics.kernels.audit_ntk`)."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    j = vmap(jacrev(lambda p, xi: functional_call(model, p, (xi[None],))[0]), (None, 0))(params, x)
    flat = torch.cat([v.reshape(len(x), v.shape[1], -1) for v in j.values()], 2).double()
    return torch.einsum("ncp,mcp->nm", flat, flat) / flat.shape[1]


def _jacobian(model: nn.Module, factored: bool) -> ModelJacobian:
    if not factored:
        return ModelJacobian(model, (10,))
    ep = torch.export.export(model, (torch.randn(2, 10),), dynamic_shapes=({0: torch.export.Dim("b")},))
    graph = ep.module()
    return ModelJacobian(graph, (10,), graph=graph)


@pytest.mark.parametrize(("kind", "factored"), [("gaussian", False), ("rademacher", False), ("gaussian", True)])
def test_projected_kernel_error_shrinks_as_k_grows(kind, factored):
    model = _mlp()
    x = torch.randn(25, 10, generator=torch.Generator().manual_seed(1))
    exact = _exact(model, x)
    jac = _jacobian(model, factored)
    assert bool(factored) == bool(jac.layers)
    errs = []
    for k in KS:
        e = [float((ProjectedJacobian(jac, Projection(k, kind, s)).kernel(x) - exact).norm() / exact.norm())
             for s in range(4)]
        errs.append(np.mean(e))
    assert all(b < a for a, b in zip(errs, errs[1:], strict=False)), errs
    assert errs[-1] < errs[0] / 4 and errs[-1] < 0.15, errs  # about sqrt(k) from 8 to 512: a factor of 8


def test_reported_error_and_influence_ranking_improve_with_k():
    model = _mlp()
    gen = torch.Generator().manual_seed(2)
    x, xt = torch.randn(30, 10, generator=gen), torch.randn(12, 10, generator=gen)
    y, yt = torch.randint(0, 3, (30,), generator=gen), torch.randint(0, 3, (12,), generator=gen)
    jac = ModelJacobian(model, (10,))
    cfg = AuditConfig("model", "train", seed=0, ridge_rel=1e-3)
    res = [projection_error(jac, ProjectedJacobian(jac, Projection(k, "gaussian", 0)), Tensors(x, y, xt, yt, 3), cfg,
                            1 << 30) for k in (8, 2048)]
    assert res[1]["kernel_rel_error"] < res[0]["kernel_rel_error"] / 4
    assert res[1]["influence_spearman"] > max(0.9, res[0]["influence_spearman"])
    exact = _exact(model, x).numpy()
    kp = ProjectedJacobian(jac, Projection(2048, "gaussian", 0)).kernel(x).numpy()
    want = np.linalg.norm(kp - exact) / np.linalg.norm(exact)
    assert res[1]["kernel_rel_error"] == pytest.approx(want, rel=F32_ROUNDING)


def test_projection_is_the_same_cached_or_regenerated_and_batches_are_bounded(monkeypatch):
    model = _mlp()
    x = torch.randn(20, 10, generator=torch.Generator().manual_seed(3))
    jac = ModelJacobian(model, (10,))
    cached = ProjectedJacobian(jac, Projection(64, "rademacher", 5)).kernel(x)
    seen: list[int] = []
    features = jac.features

    def spy(xb, label="jacobians"):
        seen.append(len(xb))
        return features(xb, label)

    monkeypatch.setattr(jac, "features", spy)
    small = ProjectedJacobian(jac, Projection(64, "rademacher", 5), batch_bytes=3 * jac.bytes_per_example(),
                              cache_bytes=0)
    assert torch.allclose(small.kernel(x), cached, rtol=F32_REORDER, atol=F32_ROUNDING)  # float32 sums in another order
    assert max(seen) == 3 and sum(seen) == 20
    other = ProjectedJacobian(jac, Projection(64, "rademacher", 6)).kernel(x)
    assert not torch.allclose(other, cached)


def test_automatic_choice_by_model_size_and_memory():
    jac = ModelJacobian(_mlp(), (10,))
    per = jac.bytes_per_example()
    n = AUTO_DIM * 2
    auto = AuditConfig("model", "train", seed=0)
    assert choose_projection(jac, n, auto, per * n)[0] is None
    proj, why = choose_projection(jac, n, auto, per * n - 1)
    assert proj is not None and proj.dim == AUTO_DIM and "automatically" in why
    assert choose_projection(jac, AUTO_DIM, auto, 1)[0] is None
    assert choose_projection(jac, n, AuditConfig("model", "train", projection_dim=0), 1)[0] is None
    asked = AuditConfig("model", "train", projection_dim=16, projection_kind="rademacher", seed=0)
    assert choose_projection(jac, n, asked, 1 << 40)[0] == Projection(16, "rademacher", 0)


def test_audit_report_states_the_projection_and_its_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(40, 1, 8, 8, generator=gen)
    y = (x.mean(dim=(1, 2, 3)) > 0.5).long() + 2 * (x[:, 0, 0, 0] > 0.5).long()
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy(), x_test=x[:16].numpy(), y_test=y[:16].numpy())
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    script(net).save(str(tmp_path / "m.ts"))
    out = tmp_path / "r.pdf"
    args = ["audit", "--model", str(tmp_path / "m.ts"), "--train", str(tmp_path / "d.npz"), "--n", "40",
            "--n-test", "16", "--steps", "1", "--baseline-seeds", "2", "--no-reference", "--hessian-iters", "2",
            "--attack", "fgsm", "--skip", "budget,poison,validity,outcome", "--out", str(out), "--html"]
    assert main([*args, "--json", "--projection-dim", "128", "--projection", "rademacher"]) == 0
    rec = json.loads(out.with_suffix(".json").read_text())
    proj = rec["model"]["projection"]
    assert proj["dim"] == 128 and proj["kind"] == "rademacher" and "k = 128" in rec["model"]["kernel_method"]
    assert proj["error"]["n"] == 40 and 0 < proj["error"]["kernel_rel_error"] < 0.5
    assert record_errors(rec) == []
    html = out.with_suffix(".html").read_text()
    assert "Projected kernel" in html and "k = 128 dimensions" in html
    capsys.readouterr()
    assert main([*args, "--projection-dim", "-1"]) == 2
    assert "--projection-dim must be >= 0" in capsys.readouterr().err
