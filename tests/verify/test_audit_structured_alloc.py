"""The Kronecker projection's dimension allocated by each weight's measured share of the kernel (issue 29, item 6:
`empirics.kernels.audit_structured.allocate`, `pilot_spectra`, `ProjectedStructured`).

Checked: the rule on synthetic spectra (within the budget and filling it, more features for a larger share, a weight
or side given all its dimensions kept exact and the rest of the budget going to the others); the pilot's measured
shares and spectra against torch.func Jacobians (independent of the module); and, on a small CNN whose layers'
shares are made unequal on purpose (a ReLU layer's weights scaled down and the next layer's up: the same function,
gradients moved between them), the allocated projection's kernel error below the equal split's at the same feature
count, averaged over seeds, the mean over seeds converging to the exact kernel (unbiasedness), and the pilot seeded
and recorded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from empirics.kernels.audit_ntk import Projection
from empirics.kernels.audit_structured import (
    SKETCH,
    LayerModel,
    ProjectedStructured,
    Spectrum,
    StructuredJacobian,
    allocate,
    pilot_spectra,
)

SHAPE = (3, 8, 8)
DIM = 128  # c1, c2, c3 projected (216, 1152, 3456 values), fc exact (120)


# --- the rule on synthetic spectra ----------------------------------------------------------------------------


def _spectrum(dim: int, trace: float, decay: float = 0.5, measured: int = SKETCH) -> Spectrum:
    """Geometric eigenvalues holding 90 % of the trace in the first `measured`, the rest unmeasured."""
    lam = decay ** np.arange(min(measured, dim))
    return Spectrum(dim, trace, tuple(lam / lam.sum() * trace * 0.9))


def _layer(name: str, d_out: int, d_in: int, share: float, decay: float = 0.5) -> LayerModel:
    return LayerModel(name, _spectrum(d_out, share, decay), _spectrum(d_in, share, decay))


@pytest.mark.parametrize("directions", [0, 8])
def test_allocation_fills_the_budget_and_gives_a_larger_share_more(directions):
    shares = [1.0, 2.0, 4.0, 8.0, 16.0]
    layers = [_layer(f"l{j}", 64, 576, s) for j, s in enumerate(shares)]
    budget = 2000
    parts = allocate(layers, budget, directions)
    feats = [p.k_out * p.k_in for p in parts]
    assert sum(feats) <= budget
    # what is left cannot buy another row or column of any weight
    assert budget - sum(feats) < min(min(p.k_out, p.k_in) for p in parts), feats
    assert all(b >= a for a, b in zip(feats, feats[1:], strict=False)), feats
    assert feats[-1] > 4 * feats[0], feats
    for p in parts:
        assert 1 <= p.k_out <= 64 and 1 <= p.k_in <= 576
        assert p.r_out <= directions and p.r_in <= directions
        assert p.k_out == 64 or p.r_out < p.k_out  # at least one random column on a side not kept whole
        assert p.r_in < p.k_in


def test_allocation_scales_with_the_share_not_the_order_or_the_units():
    layers = [_layer("a", 64, 576, 3.0), _layer("b", 128, 1152, 1.0), _layer("c", 32, 288, 0.5)]
    parts = allocate(layers, 1500)
    assert allocate(list(reversed(layers)), 1500) == list(reversed(parts))
    scaled = [LayerModel(ly.name, Spectrum(ly.out.dim, ly.out.trace * 1e-9, tuple(v * 1e-9 for v in ly.out.values)),
                         Spectrum(ly.inp.dim, ly.inp.trace * 1e-9, tuple(v * 1e-9 for v in ly.inp.values)))
              for ly in layers]
    assert allocate(scaled, 1500) == parts


def test_a_weight_given_all_its_values_is_exact_and_its_leftover_goes_to_the_others():
    small, large = _layer("small", 4, 6, 10.0), _layer("large", 64, 576, 1.0)
    parts = allocate([small, large], 600, directions=0)
    assert (parts[0].k_out, parts[0].k_in) == (4, 6)  # its whole size: 24 features, exact on both sides
    assert 600 - 24 - min(parts[1].k_out, parts[1].k_in) < parts[1].k_out * parts[1].k_in <= 600 - 24


def test_without_exact_directions_a_rank_one_weight_splits_evenly_or_keeps_a_narrow_side_whole():
    # rank one (the worst case of the model): variance T^2 (1/k_out + 1/k_in + 1/(k_out k_in)), least when even
    even = allocate([LayerModel("w", Spectrum(512, 1.0, (1.0,)), Spectrum(512, 1.0, (1.0,)))], 1024, directions=0)[0]
    assert abs(even.k_out - even.k_in) <= 2 and even.k_out * even.k_in > 1000
    # a 16-wide side given whole drops its term: 16 x 128 beats 45 x 45 (1/128 against 2/45)
    narrow = allocate([LayerModel("w", Spectrum(16, 1.0, (1.0,)), Spectrum(4096, 1.0, (1.0,)))], 2048,
                      directions=0)[0]
    assert (narrow.k_out, narrow.k_in) == (16, 128)


def test_allocation_refuses_a_budget_below_one_feature_per_weight():
    with pytest.raises(ValueError, match="budget"):
        allocate([_layer("a", 4, 4, 1.0), _layer("b", 4, 4, 1.0)], 1)


# --- a small CNN with unequal shares ----------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 24, 3, stride=2, padding=1)
        self.fc = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(h.mean(dim=(2, 3)))


def _net() -> nn.Module:
    """The CNN with c2's gradients made 6x larger and c3's 6x smaller (shares x36 and /36) without changing the
    function: c2's weight and bias scaled by 1/6, c3's weight by 6 (ReLU is positively homogeneous)."""
    torch.manual_seed(0)
    net = Net().double().eval()
    with torch.no_grad():
        net.c2.weight.mul_(1 / 6)
        net.c2.bias.mul_(1 / 6)
        net.c3.weight.mul_(6)
    return net


def _graph(net: nn.Module) -> torch.fx.GraphModule:
    ex = torch.rand(2, *SHAPE, dtype=torch.float64)
    return torch.export.export(net, (ex,), dynamic_shapes=({0: torch.export.Dim("b")},)).module()


def _jacobians(net: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example Jacobians (n, c, values) of each parameter, from torch.func on the eager net."""
    params = {k: v.detach() for k, v in net.named_parameters()}
    j = vmap(jacrev(lambda p, xi: functional_call(net, p, (xi[None],))[0]), (None, 0))(params, x.reshape(-1, *SHAPE))
    return {k: v.reshape(len(x), v.shape[1], -1) for k, v in j.items()}


def _exact(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    flat = torch.cat(list(_jacobians(net, x).values()), 2)
    return torch.einsum("ncp,mcp->nm", flat, flat) / flat.shape[1]


def _x(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, int(np.prod(SHAPE)), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.fixture(scope="module")
def setup():
    net = _net()
    jac, why = StructuredJacobian.build(_graph(net), SHAPE)
    assert jac is not None, why
    x = _x(16, 1)
    return net, jac, x, _exact(net, x)


def _err(k: torch.Tensor, exact: torch.Tensor) -> float:
    return float((k - exact).norm() / exact.norm())


def test_pilot_shares_and_spectra_match_torch_func_jacobians(setup):
    net, jac, x, _ = setup
    proj = ProjectedStructured(jac, Projection(DIM, "gaussian", 0), pilot=x)  # 16 rows: all of them in the pilot
    j = _jacobians(net, x)
    sq = {k: float((v ** 2).sum()) for k, v in j.items()}
    total = sum(sq.values())
    got = {a["weight"].split(".")[0]: a["share"] for a in proj.allocation}
    for layer in ("c1", "c2", "c3", "fc"):  # each node: its weight and its bias
        assert got[layer] == pytest.approx((sq[f"{layer}.weight"] + sq[f"{layer}.bias"]) / total, rel=1e-9)
    shares = [got[k] for k in ("c1", "c2", "c3")]
    assert max(shares) > 30 * min(shares)  # unequal on purpose
    big = [nd for nd in jac.nodes if nd.weight in ("c1.weight", "c3.weight")]
    spectra, _ = pilot_spectra(jac, x, big, seed=0)
    for nd in big:
        g = j[nd.weight].reshape(len(x), -1, nd.d_out, nd.d_in)  # (n, c, d_out, d_in)
        h_out = torch.einsum("ncoi,ncpi->op", g, g)
        h_in = torch.einsum("ncoi,ncoj->ij", g, g)
        out, inp = spectra[nd.name]
        assert out.trace == pytest.approx(float(h_out.trace()), rel=1e-9)
        assert inp.trace == pytest.approx(float(h_in.trace()), rel=1e-9)
        for spec, h in ((out, h_out), (inp, h_in)):
            want = torch.linalg.eigvalsh(h).flip(0)
            if h.shape[0] <= SKETCH:  # measured exactly
                np.testing.assert_allclose(spec.values, want[:len(spec.values)].numpy(), rtol=1e-8,
                                           atol=1e-12 * float(want[0]))
            else:  # a one-pass sketch of 16 columns: the leading eigenvalues, from below
                assert float(want[0]) * 0.95 <= spec.values[0] <= float(want[0]) * (1 + 1e-9)
                top = spec.vectors[:, 0].double()
                assert float(top @ h @ top) >= 0.95 * float(want[0])


def test_share_allocation_beats_the_equal_split_at_the_same_feature_count(setup):
    _, jac, x, exact = setup
    errs: dict[str, list[float]] = {"equal": [], "share, no exact directions": [], "share": []}
    kws = {"equal": {"allocation": "equal"}, "share, no exact directions": {"directions": 0}, "share": {}}
    for seed in range(6):
        widths = {}
        for name, kw in kws.items():
            proj = ProjectedStructured(jac, Projection(DIM, "gaussian", seed), **kw)
            errs[name].append(_err(proj.kernel(x), exact))
            widths[name] = proj.width
        assert widths["share"] <= widths["equal"] and widths["share, no exact directions"] <= widths["equal"]
    mean = {k: float(np.mean(v)) for k, v in errs.items()}
    assert mean["share, no exact directions"] < 0.8 * mean["equal"], mean  # the allocation alone
    assert mean["share"] < 0.5 * mean["share, no exact directions"], mean  # and the leading directions kept exactly


@pytest.mark.parametrize("directions", [0, 8])
def test_allocated_projection_is_unbiased(setup, directions):
    _, jac, x, exact = setup
    pilot = x[:8]
    ks = [ProjectedStructured(jac, Projection(DIM, "gaussian", s), pilot=pilot, directions=directions).kernel(x)
          for s in range(40)]
    one = float(np.mean([_err(k, exact) for k in ks]))
    # independent projections: the mean of 40 is about 1/sqrt(40) = 0.16 of one away from the exact kernel
    assert _err(torch.stack(ks).mean(0), exact) < one / 3, (_err(torch.stack(ks).mean(0), exact), one)


def test_pilot_is_seeded_deterministic_and_recorded(setup):
    _, jac, x, _ = setup
    proj = ProjectedStructured(jac, Projection(DIM, "gaussian", 3))
    assert not proj.calibrated and "to be allocated" in proj.method
    before = proj.bytes_per_example()
    k = proj.kernel(x)  # the pilot runs on rows of x
    assert proj.calibrated and proj.bytes_per_example() <= before
    again = ProjectedStructured(jac, Projection(DIM, "gaussian", 3), pilot=x).kernel(x)
    assert torch.equal(k, again)
    assert not torch.allclose(k, ProjectedStructured(jac, Projection(DIM, "gaussian", 4)).kernel(x))
    rec = proj.allocation
    assert [a["weight"] for a in rec] == ["c1.weight", "c2.weight", "c3.weight", "fc.weight"]
    assert all(0 < a["share"] < 1 for a in rec) and sum(a["share"] for a in rec) <= 1
    projected = [a for a in rec if not a["exact"]]
    assert len(projected) == 3 and rec[-1]["exact"] and (rec[-1]["k_out"], rec[-1]["k_in"]) == (5, 24)
    assert sum(a["k_out"] * a["k_in"] for a in projected) == proj.pilot["projected_features"] <= proj.budget
    assert proj.pilot["points"] == 16 and proj.pilot["seconds"] >= 0
    assert "measured share of the kernel" in proj.method and f"{proj.width} features" in proj.method
    equal = ProjectedStructured(jac, Projection(DIM, "gaussian", 3), allocation="equal")
    share = math.isqrt(DIM // 3)
    assert equal.calibrated and equal.pilot is None and "equal split" in equal.method
    assert all((p.k_out, p.k_in) == (share, DIM // 3 // share) for p in equal.parts.values() if not p.exact)
    assert equal.budget == proj.budget == 3 * share * (DIM // 3 // share)
    with pytest.raises(ValueError, match="allocation"):
        ProjectedStructured(jac, Projection(DIM, "gaussian", 3), allocation="proportional")
