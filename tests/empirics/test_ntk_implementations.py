"""Every pair of empirical-NTK implementations (`empirics.kernels.ntk.NtkImpl`) agrees on the same models.

Modelled on neural-tangents' test of `empirical_ntk_fn`, which compares every pair of its implementations. Models:
the paper's 2L-ReLU and MLP-Attn (closed form, `torch.func`, and the factored autograd path on a `torch.export`
copy and on a TorchScript copy) and a small generic MLP (no closed form; its exported copy has linear layers the
factored path does factor). All in float64.
"""

from __future__ import annotations

from itertools import combinations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torchscript import script

from empirics.kernels.audit_ntk import ModelJacobian
from empirics.kernels.ntk import JacobianOptions, NtkImpl, empirical_ntk, resolve_implementation
from empirics.nets.models import ModelSpec, build_model
from ntkm.errors import UserInputError

D, OUT, N = 12, 3, 10

# Float64 throughout. The implementations differ only in summation order over at most c P = 3 * 32 * 12 terms per
# entry (relative rounding about 1e-16 * sqrt(c P), below 1e-14), while a missing or doubled term of the kernel
# (one output, one hidden unit: about 1/(c m) = 1e-2 of an entry) would be far above the bounds.
RTOL = 1e-10
ATOL_REL = 1e-12  # absolute tolerance as a fraction of the largest entry (entries of a ReLU kernel may be ~0)


def _inputs(seed: int = 0) -> torch.Tensor:
    return torch.rand(N, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _suite_net(kind: str, x: torch.Tensor) -> nn.Module:
    return build_model(ModelSpec(kind, D, 32, OUT, seed=3), x, dtype=torch.float64).eval()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, OUT)).double().eval()


def _exported(model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    dyn = ({0: torch.export.Dim("batch")},)
    return torch.export.export(model, (x[:3],), dynamic_shapes=dyn).module()


def _scripted(model: nn.Module, x: torch.Tensor) -> torch.jit.ScriptModule:
    """A TorchScript copy: scripted where TorchScript compiles the module, traced otherwise (the suite's nets keep
    their spec, a dataclass, which `torch.jit.script` cannot type)."""
    try:
        return script(model)
    except Exception:  # noqa: BLE001 - any compile failure: fall back to tracing the same function
        return torch.jit.trace(model, (x[:3],))


MODELS = {"2l-relu": lambda x: _suite_net("relu", x), "mlp-attn": lambda x: _suite_net("attn", x),
          "mlp": lambda x: _mlp()}
# Implementations as (name, how the model is handed over): the factored autograd path gets the exported and the
# TorchScript copies, which `torch.func` refuses.
VARIANTS = {
    "closed_form": (NtkImpl.CLOSED_FORM, lambda m, x: m),
    "torch_func": (NtkImpl.TORCH_FUNC, lambda m, x: m),
    "autograd_factored/export": (NtkImpl.AUTOGRAD_FACTORED, _exported),
    "autograd_factored/torchscript": (NtkImpl.AUTOGRAD_FACTORED, _scripted),
}
APPLICABLE = {"2l-relu": list(VARIANTS), "mlp-attn": list(VARIANTS), "mlp": list(VARIANTS)[1:]}
CASES = [(model, a, b) for model, names in APPLICABLE.items() for a, b in combinations(names, 2)]


def _kernel(variant: str, model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None) -> torch.Tensor:
    impl, copy_of = VARIANTS[variant]
    return empirical_ntk(copy_of(model, x1), x1, x2, "mean", impl)


@pytest.mark.claim("thm4.2")
@pytest.mark.parametrize(("model_name", "a", "b"), CASES, ids=[f"{m}:{a}-vs-{b}" for m, a, b in CASES])
def test_every_pair_of_implementations_agrees(model_name: str, a: str, b: str):
    x = _inputs()
    model = MODELS[model_name](x)
    for x1, x2 in ((x, None), (x[:4], x[4:])):  # the symmetric kernel and a cross block
        ka, kb = _kernel(a, model, x1, x2), _kernel(b, model, x1, x2)
        assert ka.dtype == kb.dtype == torch.float64
        assert ka.shape == kb.shape == (len(x1), len(x1 if x2 is None else x2))
        assert float(kb.abs().max()) > 0
        assert torch.allclose(ka, kb, rtol=RTOL, atol=ATOL_REL * float(kb.abs().max())), (a, b)


def test_the_exported_mlp_goes_through_factored_layers():
    """The MLP pairs above exercise the factored form, not only plain autograd: its exported linear layers are
    factored (and the TorchScript copy, which has no FX graph, is not)."""
    x = _inputs()
    mlp = _mlp()
    gm = _exported(mlp, x)
    assert len(ModelJacobian(gm, (D,), graph=gm).layers) == 3
    assert not ModelJacobian(_scripted(mlp, x), (D,)).layers


def test_static_batch_export_matches_torch_func():
    """A program exported with a fixed batch size goes through `static_batch` (each example repeated to fill it)."""
    x = _inputs(1)
    mlp = _mlp()
    static = torch.export.export(mlp, (x[:3],)).module()
    got = empirical_ntk(static, x, implementation="autograd_factored", options=JacobianOptions(static_batch=3))
    want = empirical_ntk(mlp, x, implementation="torch_func")
    assert torch.allclose(got, want, rtol=RTOL, atol=ATOL_REL * float(want.abs().max()))


@pytest.mark.claim("thm4.2")
@given(kind=st.sampled_from(["relu", "attn"]), width=st.sampled_from([1, 7, 64]),
       out_dim=st.sampled_from([1, 3, 10]), seed=st.integers(0, 10_000),
       reduction=st.sampled_from(["mean", "trace", "full"]), layers=st.sampled_from([1, 2]))
def test_closed_form_matches_torch_func_over_shapes_and_reductions(kind, width, out_dim, seed, reduction, layers):
    """The closed form against `torch.func` on random networks, every reduction, with a small Jacobian budget (so
    the chunked accumulation runs). Relative Frobenius error below 1e-6: the features of two attention layers can be
    nearly collinear, which costs the float64 sums a few digits."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(17, 12, generator=gen, dtype=torch.float64)
    model = build_model(ModelSpec(kind, 12, width, out_dim, attn_layers=layers, seed=seed), x, dtype=torch.float64)
    fast = empirical_ntk(model, x[:9], x[4:], reduction, "closed_form")
    slow = empirical_ntk(model, x[:9], x[4:], reduction, "torch_func", options=JacobianOptions(max_bytes=4096))
    assert fast.shape == slow.shape
    if slow.norm() == 0:
        assert fast.norm() == 0
    else:
        assert float((fast - slow).norm() / slow.norm()) < 1e-6


def test_auto_chooses_as_documented():
    x = _inputs()
    mlp = _mlp()
    assert resolve_implementation(_suite_net("relu", x)) is NtkImpl.CLOSED_FORM
    assert resolve_implementation(_suite_net("attn", x), "auto") is NtkImpl.CLOSED_FORM
    assert resolve_implementation(mlp) is NtkImpl.TORCH_FUNC
    assert resolve_implementation(_exported(mlp, x)) is NtkImpl.AUTOGRAD_FACTORED
    assert resolve_implementation(_scripted(mlp, x)) is NtkImpl.AUTOGRAD_FACTORED
    assert resolve_implementation(_suite_net("relu", x), "torch_func") is NtkImpl.TORCH_FUNC  # an explicit choice
    with pytest.raises(UserInputError, match="closed-form NTK does not cover this model"):  # never a wrong kernel
        resolve_implementation(mlp, "closed_form")


def test_float32_models_give_a_float64_kernel_computed_in_float32():
    x = _inputs()
    k64 = empirical_ntk(_suite_net("relu", x), x)
    k32 = empirical_ntk(_suite_net("relu", x).float(), x.float())
    assert k32.dtype == torch.float64
    assert torch.equal(k32, k32.float().double())  # exactly representable: converted, not recomputed
    assert torch.allclose(k32, k64, rtol=1e-5, atol=1e-6 * float(k64.abs().max()))  # float32 rounding, ~1e-7


def test_bad_choices_are_user_input_errors():
    x = _inputs()
    mlp = _mlp()
    with pytest.raises(UserInputError, match="unknown empirical-NTK implementation 'jacobian'.*'torch_func'"):
        empirical_ntk(mlp, x, implementation="jacobian")
    with pytest.raises(UserInputError, match="reduction must be one of"):
        empirical_ntk(mlp, x, reduction="sum")
    with pytest.raises(UserInputError, match="closed-form NTK does not cover this model .*Sequential is not one of"):
        empirical_ntk(mlp, x, implementation="closed_form")
    with pytest.raises(UserInputError, match="'mean' reduction only"):
        empirical_ntk(mlp, x, reduction="full", implementation="autograd_factored")
    with pytest.raises(UserInputError, match="static_batch applies to the autograd_factored"):
        empirical_ntk(mlp, x, options=JacobianOptions(static_batch=3))
