"""Device discipline, checked by running the code on torch's `meta` device (issue 39 item 1).

A meta tensor has a shape and no data, and torch refuses to combine it with a CPU tensor ("Tensor on device cpu is
not on the expected device meta!"), as it refuses a CPU tensor beside a CUDA one. So a path that runs with its inputs
and model on meta makes every tensor it combines with them on their device: what a GPU needs, checked on a CPU.
This covers what the static check (tests/test_device_discipline.py) cannot see: tensors that arrive on different
devices, like issue 39's bug (2), GPU outputs minus labels held on the CPU in
`empirics.attribution.gauss_newton.loss_residuals`.

Meta tensors cannot be read, so the steps that leave the device on purpose are replaced or split off: the input
statistics of the networks' fixed first layer are computed on the CPU in numpy
(`empirics.nets.models.reference_statistics`, replaced here by statistics of stand-in CPU data of the same shape; what
is checked is that the result goes back to the inputs' device, issue 39's bug (1)), and the residuals are checked in
their torch part (`loss_residuals_torch`; `loss_residuals` only adds `.cpu().numpy()`). Paths that read values
(`float(...)`, a numpy solve, a data-dependent choice) are outside what meta can run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from empirics.attribution.gauss_newton import loss_residuals, loss_residuals_torch
from empirics.data.datasets import INPUT_PREPROCESSINGS, input_statistics
from empirics.experiments.landscape import filter_normalized_direction
from empirics.kernels.audit_ntk import JacobianOptions, ModelJacobian, ProjectedJacobian, Projection
from empirics.kernels.audit_structured import ProjectedStructured, StructuredJacobian, plan_nodes
from empirics.kernels.ntk import empirical_ntk
from empirics.nets import models
from empirics.nets.attacks import AttackConfig, attack
from empirics.nets.kinds import KINDS
from empirics.nets.models import ModelSpec, build_model

META = torch.device("meta")
N, D, T, C = 12, 8, 5, 3


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=META)


@pytest.fixture
def cpu_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first layer's statistics from stand-in CPU data of the reference's shape (meta has no values to read)."""

    def fake(reference: torch.Tensor, channels: int) -> tuple[np.ndarray, np.ndarray]:
        n, d = reference.shape
        return input_statistics(np.linspace(0.0, 1.0, n * d).reshape(n, d) ** 2, channels)

    monkeypatch.setattr(models, "reference_statistics", fake)


def _spec(name: str, preprocess: str = "raw", **kw: object) -> ModelSpec:
    return ModelSpec(name, D, 16, C, preprocess=preprocess, qkv_dim=4, **kw)


def _variants() -> list[tuple[str, str, dict]]:
    """Every registered kind under every input layer, and the attention options where a kind has them."""
    out = [(name, p, {}) for name in KINDS for p in INPUT_PREPROCESSINGS]
    for name, info in KINDS.items():
        if info.attention_options:
            out += [(name, "channel", {"attn_rank": 2}), (name, "unit", {"attn_centre": True, "attn_layers": 2})]
    return out


def _where(net: nn.Module) -> set[str]:
    return {t.device.type for t in [*net.parameters(), *net.buffers()]}


def _id(v: object) -> str:
    return v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "defaults"


@pytest.mark.parametrize(("name", "preprocess", "options"), _variants(), ids=_id)
@pytest.mark.parametrize("n", [N, 3])  # n = 3: 2 n < d, MLP-Attn multiplies through the factor X
def test_every_kind_builds_and_runs_where_its_inputs_are(cpu_statistics, name, preprocess, options, n):
    x, xt = _meta(n, D), _meta(T, D)
    net = build_model(_spec(name, preprocess, **options), x, device="meta")
    assert _where(net) == {"meta"}
    out = net(xt)
    assert out.device == META and out.shape == (T, C)
    if KINDS[name].recomputed_context:
        assert net(xt, context_inputs=x).device == META
    if KINDS[name].has_context:
        net.set_context(x)
        assert _where(net) == {"meta"}
    assert build_model(_spec(name, preprocess, **options), x[:2], device="meta", reference=x)(xt).device == META


@pytest.mark.parametrize("preprocess", [p for p in INPUT_PREPROCESSINGS if p != "raw"])
def test_the_first_layer_statistics_follow_the_reference(cpu_statistics, preprocess):
    """Issue 39's bug (1): the statistics are made on the CPU and must go back to the inputs' device, inside the
    constructor (which runs the first layer on the training inputs before `build_model` moves the module)."""
    x = _meta(N, D)
    for name in KINDS:
        cls = models.QKVAttentionNet if KINDS[name].trains_attention else models.TwoLayerNet
        built = cls(_spec(name, preprocess), x)
        assert built.input_shift.device == META and built.input_scale.device == META


@pytest.mark.parametrize(("out_dim", "loss"), [(1, "auto"), (C, "auto"), (C, "mse")])
def test_loss_residuals_are_made_on_the_outputs_device(out_dim, loss):
    """Issue 39's bug (2): outputs of a model on the device, labels held on the CPU."""
    y = torch.tensor([0, 1, 2, 1, 0]) % max(2, out_dim)
    r = loss_residuals_torch(_meta(T, out_dim), y, loss)
    assert r.device == META and r.shape == (T, out_dim) and r.dtype == torch.float64
    out = torch.linspace(-1, 1, T * out_dim).reshape(T, out_dim)  # the numpy wrapper is the torch part, on the CPU
    np.testing.assert_array_equal(loss_residuals(out, y, loss), loss_residuals_torch(out, y, loss).numpy())


@pytest.mark.parametrize("name", ["fgsm", "pgd", "mim"])
def test_attacks_run_where_the_model_is(name):
    """PGD's random start is drawn by a seeded CPU generator and moved to the inputs."""
    x, xt = _meta(N, D), _meta(T, D)
    net = build_model(_spec("attn"), x, device="meta")
    y = torch.zeros(T, dtype=torch.long, device=META)
    cfg = AttackConfig(name, 0.1, steps=2, seed=0)
    assert attack(net, xt, y, cfg).device == META
    recomputed = AttackConfig(name, 0.1, steps=2, seed=0, context="recomputed")
    idx = torch.arange(2, device=META)
    assert attack(net, x[:2], y[:2], recomputed, train_x=x, train_idx=idx).device == META


@pytest.mark.parametrize("name", list(KINDS))
def test_empirical_ntk_runs_where_the_model_is(name):
    x, xt = _meta(N, D), _meta(T, D)
    net = build_model(_spec(name), x, device="meta")
    assert empirical_ntk(net, xt).device == META


def test_landscape_direction_follows_the_weights():
    assert filter_normalized_direction(_meta(4, 3), seed=0).device == META


def test_audit_jacobian_and_its_projection_run_where_the_model_is():
    """The audit's generic NTK: probes, Jacobian rows and kernels on the parameters' device, and the projection's
    blocks (drawn by seeded CPU generators) moved there."""
    net = build_model(_spec("relu"), _meta(N, D), device="meta")
    jac = ModelJacobian(net, (D,), options=JacobianOptions(progress=False))
    xt = _meta(T, D)
    assert jac.kernel(xt).device == META
    assert jac.kernel(xt, max_bytes=1).device == META  # block by block
    for kind in ("gaussian", "rademacher"):
        assert ProjectedJacobian(jac, Projection(8, kind)).kernel(xt).device == META
    assert Projection(8).block(0, 0, 2, 3, device=META).device == META


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, 1, 1)
        self.b1 = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 24, 2, 2, 0, bias=False)
        self.fc = nn.Linear(24, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.b1(self.c1(x))))).mean(dim=(2, 3)))


def test_structured_audit_kernels_run_where_the_graph_is():
    """The structured exact kernel and the Kronecker projection (equal split: the share allocation's pilot reads
    values) on a graph moved to the device."""
    shape = (2, 4, 4)
    torch.manual_seed(0)
    net = _Conv().eval()
    graph = torch.export.export(net, (torch.rand(2, *shape),), dynamic_shapes=({0: torch.export.Dim("b")},)).module()
    graph = graph.to(META)
    nodes, why = plan_nodes(graph)
    assert nodes is not None, why
    jac = StructuredJacobian(graph, shape, nodes, progress=False)
    x = _meta(T, int(np.prod(shape)))
    assert jac.kernel(x).device == META
    for dim in (8, 64):  # the big weights projected on one side or both
        proj = ProjectedStructured(jac, Projection(dim, "gaussian", 0), progress=False, allocation="equal")
        assert proj.kernel(x).device == META
