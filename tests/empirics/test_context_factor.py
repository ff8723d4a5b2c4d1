"""MLP-Attn's context product through the training inputs, `h C = (h X^T) X`, against the d x d `C` (models.py).

Where `2 n < d` (CIFAR-10 at n = 500; MNIST only at n < 392) a `TwoLayerNet` keeps the preprocessed (for the
centred variant mean-removed) training inputs as a non-persistent buffer and multiplies through them. The
reference is the same network computing with its d x d context: the model loaded from its own state dict (which
drops the factor), checked against an explicit `attention_features(x, C)`; features and input gradients are
compared on real MNIST and CIFAR-10 subsets of the bundled data (input gradients against the float64 dense route).
"""

from __future__ import annotations

import pytest
import torch
from tolerances import F32_REORDER

from empirics.data.datasets import DataRequest, load_dataset
from empirics.nets.context_product import factor_is_cheaper
from empirics.nets.models import (
    ModelSpec,
    TwoLayerNet,
    apply_preprocess,
    attention_context,
    attention_features,
    save_model,
)

# n_train per data set: below d / 2, so the factor is used (MNIST d = 784, CIFAR-10 d = 3072).
SIZES = {"mnist": 120, "cifar10": 200}
VARIANTS = [(False, 1, "raw"), (True, 1, "channel"), (False, 2, "unit"), (True, 2, "raw")]


@pytest.fixture(scope="module", params=list(SIZES))
def data(request):
    return load_dataset(request.param, n_train=SIZES[request.param], n_test=32,
                        request=DataRequest(sample="balanced", seed=0))


def _torch(ds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.as_tensor(ds.x_train), torch.as_tensor(ds.x_test), torch.as_tensor(ds.y_test).long()


def _model(ds, centre: bool, layers: int, preprocess: str) -> TwoLayerNet:
    channels = 3 if ds.name == "cifar10" and preprocess != "raw" else 1
    spec = ModelSpec("attn", ds.d, 64, ds.num_classes, seed=1, attn_centre=centre, attn_layers=layers,
                     preprocess=preprocess, channels=channels)
    return TwoLayerNet(spec, torch.as_tensor(ds.x_train))


def _dense_twin(model: TwoLayerNet) -> TwoLayerNet:
    """The same network built from its spec and its state dict: it multiplies by the d x d `C`."""
    twin = TwoLayerNet(model.spec, torch.ones(1, model.spec.d), reference=torch.rand(4, model.spec.d))
    twin.load_state_dict(model.state_dict())
    assert twin.context_factor.numel() == 0
    return twin


def _input_grad(model: TwoLayerNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    (g,) = torch.autograd.grad(loss, x)
    return g


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 sums in another order, relative to the larger entry."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= F32_REORDER * float(b.abs().max())


@pytest.mark.parametrize(("centre", "layers", "preprocess"), VARIANTS)
def test_factored_features_and_input_gradients_equal_the_dense_product(data, centre, layers, preprocess):
    x_tr, x_te, y_te = _torch(data)
    model = _model(data, centre, layers, preprocess)
    assert model.context_factor.shape == x_tr.shape  # the factor is what is used here
    dense = _dense_twin(model)
    q = apply_preprocess(model, x_te)
    explicit = attention_features(q - model.context_mean if centre else q, model.context, layers)
    assert _close(dense.features(x_te), explicit)
    assert _close(model.features(x_te), explicit)
    exact = _dense_twin(model).double()  # float64: the float32 dense route itself is off by ~7e-6 (raw CIFAR-10)
    assert _close(_input_grad(model, x_te, y_te), _input_grad(exact, x_te.double(), y_te))


def test_the_state_dict_is_unchanged_and_a_saved_model_loads(data, tmp_path):
    """The factor is never saved: the keys are the weights, signs, input statistics, C (and the mean)."""
    from verify.audit.modelio import load_model

    _, x_te, _ = _torch(data)
    model = _model(data, True, 1, "channel")
    assert set(model.state_dict()) == {"W", "A", "input_shift", "input_scale", "context", "context_mean"}
    assert "context_factor" in dict(model.named_buffers())  # functional_call (the NTK) swaps it with the rest
    path, _ = save_model(model, tmp_path / "m.safetensors")
    loaded = load_model(path).module
    assert _close(loaded(x_te), model(x_te).detach())


def test_set_context_refreshes_the_factor(data):
    x_tr, x_te, y_te = _torch(data)
    model = _model(data, True, 1, "raw")
    moved = (x_tr + 0.1 * torch.rand(x_tr.shape, generator=torch.Generator().manual_seed(2))).clamp(0, 1)
    model.set_context(moved)
    assert torch.equal(model.context_factor, moved - moved.mean(dim=0))
    fresh = _model(data, True, 1, "raw")
    fresh.context = attention_context(moved, centre=True)  # assigning C directly drops the factor
    fresh.context_mean = moved.mean(dim=0)
    assert fresh.context_factor.numel() == 0
    assert _close(model.features(x_te), fresh.features(x_te))
    assert _close(_input_grad(model, x_te, y_te), _input_grad(fresh, x_te, y_te))


def test_context_inputs_path_through_the_factor_is_differentiable_in_the_training_inputs(data):
    """`features(x, context_inputs=X')` (the recomputed-context attack) against `C(X')` built explicitly."""
    x_tr, x_te, _ = _torch(data)
    model = _model(data, False, 2, "channel")
    x2 = x_tr.clone().requires_grad_(True)
    f = model.features(x_te, context_inputs=x2)
    (g,) = torch.autograd.grad(f[:, :5].sum(), x2)
    x3 = x_tr.clone().requires_grad_(True)
    ref = attention_features(apply_preprocess(model, x_te), attention_context(apply_preprocess(model, x3)), 2)
    (g_ref,) = torch.autograd.grad(ref[:, :5].sum(), x3)
    assert _close(f.detach(), ref.detach())
    assert _close(g, g_ref)


def test_no_factor_where_it_is_not_cheaper_or_the_context_is_truncated():
    ds = load_dataset("mnist", n_train=400, n_test=8,
                      request=DataRequest(sample="balanced", seed=0))  # 2 n = 800 > d = 784
    assert not factor_is_cheaper(400, 784) and factor_is_cheaper(500, 3072)
    spec = ModelSpec("attn", ds.d, 16, ds.num_classes)
    assert TwoLayerNet(spec, torch.as_tensor(ds.x_train)).context_factor.numel() == 0
    small = torch.as_tensor(ds.x_train[:100])
    truncated = ModelSpec("attn", ds.d, 16, ds.num_classes, attn_rank=20)
    assert TwoLayerNet(truncated, small).context_factor.numel() == 0
    assert TwoLayerNet(spec, small).context_factor.numel() > 0


@pytest.mark.parametrize(("dataset", "n"), [("mnist", 120), ("mnist", 400), ("cifar10", 200)])
def test_the_cost_model_prices_the_product_the_model_computes(dataset, n):
    """`verify.costs.flops` counts, per example, the context product's multiply-adds of the path the model takes."""
    from verify import costs

    ds = load_dataset(dataset, n_train=n, n_test=8, request=DataRequest(sample="balanced", seed=0))
    model = TwoLayerNet(ModelSpec("attn", ds.d, 16, ds.num_classes), torch.as_tensor(ds.x_train))
    f = model.context_factor
    taken = 2 * f.shape[0] * f.shape[1] if f.dim() == 2 else ds.d * ds.d
    assert costs.flops("attn", ds.d, n, 16)[0] - costs.flops("relu", ds.d, n, 16)[0] == taken
