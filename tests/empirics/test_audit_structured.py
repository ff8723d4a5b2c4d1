"""Structured per-example gradients (`empirics.kernels.audit_structured`): the exact kernel against torch.func Jacobians
(independent of the module), the Kronecker projection's error shrinking as k grows and its mean converging to the
exact kernel (unbiasedness), the cases the structured path must refuse, and the audit choosing it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from empirics.kernels import audit_structured
from empirics.kernels.audit_ntk import Projection
from empirics.kernels.audit_structured import ProjectedStructured, StructuredJacobian, plan_nodes
from verify.cli import main

SHAPE = (3, 6, 6)


class ConvNet(nn.Module):
    """Every structured kind: convs with and without bias, stride and padding, batch norm, a wide conv on few
    positions (the factored Gram branch), a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, 1, 1)
        self.b1 = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 8, 3, 2, 1, bias=False)
        self.b2 = nn.BatchNorm2d(8)
        self.c3 = nn.Conv2d(8, 48, 3, 3, 0)
        self.fc = nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.tanh(self.b2(self.c2(h)))
        return self.fc(torch.relu(self.c3(h)).mean(dim=(2, 3)))


def _net(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    net = ConvNet().to(dtype).eval()
    gen = torch.Generator().manual_seed(1)
    for bn in (net.b1, net.b2):
        n = bn.num_features
        bn.running_mean.copy_(torch.rand(n, generator=gen, dtype=dtype) - 0.5)
        bn.running_var.copy_(torch.rand(n, generator=gen, dtype=dtype) + 0.5)
        bn.weight.data.copy_(torch.rand(n, generator=gen, dtype=dtype) + 0.5)
        bn.bias.data.copy_(torch.rand(n, generator=gen, dtype=dtype) - 0.5)
    return net


def _graph(net: nn.Module) -> torch.fx.GraphModule:
    ex = torch.rand(2, *SHAPE, dtype=next(net.parameters()).dtype)
    return torch.export.export(net, (ex,), dynamic_shapes=({0: torch.export.Dim("b")},)).module()


def _exact(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The mean-reduction empirical NTK from torch.func Jacobians of the eager net."""
    params = {k: v.detach() for k, v in net.named_parameters()}
    xs = x.reshape(len(x), *SHAPE)
    j = vmap(jacrev(lambda p, xi: functional_call(net, p, (xi[None],))[0]), (None, 0))(params, xs)
    flat = torch.cat([v.reshape(len(x), v.shape[1], -1) for v in j.values()], 2).double()
    return torch.einsum("ncp,mcp->nm", flat, flat) / flat.shape[1]


def _x(n: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.rand(n, int(np.prod(SHAPE)), generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("one_pass", [True, False])
def test_exact_structured_kernel_equals_torch_func_jacobians(one_pass, monkeypatch):
    if not one_pass:  # more points than one batch: output by output, in batches of 4
        monkeypatch.setattr(audit_structured, "ONE_PASS_POINTS", 2)
    net = _net()
    jac, why = StructuredJacobian.build(_graph(net), SHAPE, batch_size=4)
    assert jac is not None, why
    assert {nd.kind for nd in jac.nodes} == {"conv2d", "batch_norm", "linear"}
    c3 = next(nd for nd in jac.nodes if nd.weight and "c3" in nd.weight)
    assert 9 * 9 * (c3.d_in + c3.d_out) < (1 + 9) * c3.d_in * c3.d_out  # the factored branch runs for c3
    x, x2 = _x(9, 0), _x(5, 1)
    want = _exact(net, torch.cat([x, x2]))
    # float64 throughout: only rounding (about 1e-16 relative) separates the two; a lost term is about 1e-2
    torch.testing.assert_close(jac.kernel(x), want[:9, :9], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jac.kernel(x2, x), want[9:, :9], rtol=1e-10, atol=1e-12)


def test_kronecker_projection_error_shrinks_with_k_and_its_mean_is_the_exact_kernel():
    net = _net()
    jac, _ = StructuredJacobian.build(_graph(net), SHAPE)
    x = _x(12, 2)
    exact = _exact(net, x)

    def err(k: torch.Tensor) -> float:
        return float((k - exact).norm() / exact.norm())

    # a Kronecker projection's error falls more slowly than a dense one's (about share^-1/4 per layer: each side
    # k_out, k_in ~ sqrt(share) contributes ~sqrt(2/k_side)), so the grid spans more than two orders of magnitude
    errs = [np.mean([err(ProjectedStructured(jac, Projection(k, "gaussian", s)).kernel(x)) for s in range(8)])
            for k in (24, 768, 4000)]
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[2] < errs[0] / 2.5, errs
    # unbiased: the mean over 40 independent projections is much closer than one projection (about 1/sqrt(40))
    mean = torch.stack([ProjectedStructured(jac, Projection(24, "gaussian", s)).kernel(x) for s in range(40)]).mean(0)
    assert err(mean) < errs[0] / 3, (err(mean), errs[0])


def test_projection_is_seeded_and_batch_size_does_not_change_it():
    jac, _ = StructuredJacobian.build(_graph(_net()), SHAPE, batch_size=5)
    other, _ = StructuredJacobian.build(_graph(_net()), SHAPE, batch_size=2)
    x = _x(7, 3)
    a = ProjectedStructured(jac, Projection(64, "gaussian", 5)).kernel(x)
    b = ProjectedStructured(other, Projection(64, "gaussian", 5)).kernel(x)
    c = ProjectedStructured(jac, Projection(64, "gaussian", 6)).kernel(x)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)  # float32 features
    assert not torch.allclose(a, c)


class Scaled(nn.Module):
    """A parameter outside any structured node (a learned output scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class Mixing(nn.Module):
    """Centres each batch: the examples of a batch are not independent."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - x.mean(dim=0, keepdim=True))


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(2, 4, 1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(x).flatten(1)


@pytest.mark.parametrize(("module", "shape", "static", "reason"), [
    (Scaled, (4,), None, "not the weight or bias"),
    (Mixing, (4,), None, "mixes the examples"),
    (Grouped, (2, 2, 2), None, "not the weight or bias"),
    (Scaled, (4,), 8, "static batch size"),
])
def test_structured_path_refuses_what_it_cannot_do(module, shape, static, reason):
    torch.manual_seed(0)
    net = module().eval()
    gm = torch.export.export(net, (torch.rand(3, *shape),), dynamic_shapes=({0: torch.export.Dim("b")},)).module()
    jac, why = StructuredJacobian.build(gm, shape, static_batch=static)
    assert jac is None and reason in why


def test_plan_covers_every_parameter_of_a_resnet_block():
    net = _net(torch.float32)
    nodes, why = plan_nodes(_graph(net))
    assert nodes is not None, why
    owned = {nd.weight for nd in nodes} | {nd.bias for nd in nodes if nd.bias}
    assert len(owned) == len(list(net.parameters()))


def test_audit_uses_the_structured_projection_and_reports_its_error(tmp_path):
    net = _net(torch.float32)
    path = tmp_path / "cnn.pt2"
    ep = torch.export.export(net, (torch.rand(2, *SHAPE),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(ep, str(path))
    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("test", 20)):
        np.savez(tmp_path / f"{split}.npz", x=rng.random((n, *SHAPE)).astype(np.float32), y=rng.integers(0, 4, n))
    out = tmp_path / "audit.pdf"
    rc = main(["audit", "--model", str(path), "--train", str(tmp_path / "train.npz"), "--test",
               str(tmp_path / "test.npz"), "--n", "60", "--n-test", "20", "--projection-dim", "64", "--no-reference",
               "--skip", "budget,validity,outcome,poison", "--hessian-iters", "2", "--out", str(out), "--json",
               "--html"])
    assert rc in (0, 3)  # 3: no PDF on a machine without weasyprint's libraries
    rec = json.loads(out.with_suffix(".json").read_text())
    proj = rec["model"]["projection"]
    assert proj["structure"] == "kronecker" and proj["width"] > 0
    assert "structured per-example gradients" in rec["model"]["kernel_method"]
    assert 0 < proj["error"]["kernel_rel_error"] < 1
    assert rec["models"]["user"]["sharpness"]["points"] == 60
    assert "Kronecker-structured random projection" in out.with_suffix(".html").read_text()


def test_float32_rounding_of_large_activations_is_not_taken_for_mixing():
    """A trained float32 network has activations in the tens: batch size changes a convolution's rounding at about
    1e-7 of that scale, which must not read as examples mixing (a ResNet-18 after 4 epochs was refused before)."""
    net = _net(torch.float32)
    with torch.no_grad():
        net.c1.weight.mul_(400.0)
        net.c3.weight.mul_(40.0)
    gm = _graph(net)
    xs = torch.rand(3, *SHAPE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        big = float(net.c3(torch.tanh(net.b2(net.c2(torch.relu(net.b1(net.c1(xs))))))).abs().max())
    assert big > 10
    jac, why = StructuredJacobian.build(gm, SHAPE)
    assert jac is not None, why
