"""The centred-context MLP-Attn variant (`--centre`): numpy against torch, invariances, kernels, CLI.

The variant maps `x -> normalise(C_c^k (x - mu))` with `mu` the training mean and `C_c` the context of
the mean-removed training inputs. It is a named variant beside the paper's (uncentred) model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import F32_ROUNDING, F64_ALGORITHM, F64_FEATURES

from empirics.kernels.ntk import empirical_ntk
from empirics.nets.models import ModelSpec, build_model, save_model
from theory import gram, kernels


def _data(seed: int, n: int = 15, d: int = 9) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, d)), rng.random((6, d))


@pytest.mark.claim("ntk-attn-centred-mnist", "flip-centred-mnist")
@given(seed=st.integers(0, 10_000), shift=st.floats(-5, 5), k=st.sampled_from([1, 2]))
@settings(max_examples=40, deadline=None)
def test_centred_features_ignore_a_common_shift(seed, shift, k):
    """Centring removes any vector added to every training row and query; the paper's map does not."""
    x_tr, x_te = _data(seed)
    v = shift * np.random.default_rng(seed + 1).standard_normal(x_tr.shape[1])
    a = gram.attention_features(x_tr, x_te, k=k, centre=True)
    b = gram.attention_features(x_tr + v, x_te + v, k=k, centre=True)
    assert np.allclose(a, b, atol=F64_FEATURES)


@pytest.mark.claim("ntk-attn-centred-mnist", "flip-centred-mnist")
@given(seed=st.integers(0, 10_000), k=st.sampled_from([1, 2]), rank=st.sampled_from([None, 3]))
@settings(max_examples=40, deadline=None)
def test_centred_features_are_the_paper_map_on_mean_removed_data(seed, k, rank):
    x_tr, x_te = _data(seed)
    mu = x_tr.mean(axis=0)
    want = gram.attention_features(x_tr - mu, x_te - mu, k=k, rank=rank)
    got = gram.attention_features(x_tr, x_te, k=k, rank=rank, centre=True)
    assert np.allclose(got, want, atol=F64_ALGORITHM)


@pytest.mark.claim("ntk-attn-centred-mnist", "flip-centred-mnist")
@given(seed=st.integers(0, 10_000), layers=st.sampled_from([1, 2]), rank=st.sampled_from([None, 4]))
@settings(max_examples=25, deadline=None)
def test_torch_model_features_match_numpy(seed, layers, rank):
    """The network's features (torch) against `theory.gram.attention_features` (numpy), centred."""
    x_tr, x_te = _data(seed)
    xt = torch.as_tensor(x_tr)
    spec = ModelSpec("attn", x_tr.shape[1], 8, 3, attn_layers=layers, attn_rank=rank, seed=seed, attn_centre=True)
    model = build_model(spec, xt, dtype=torch.float64)
    got = model.features(torch.as_tensor(x_te)).numpy()
    want = gram.attention_features(x_tr, x_te, k=layers, rank=rank, centre=True)
    assert np.allclose(got, want, atol=F64_FEATURES)
    # the differentiable path (what an attack with a recomputed context uses) gives the same features
    again = model.features(torch.as_tensor(x_te), context_inputs=xt).detach().numpy()
    assert np.allclose(again, want, atol=F64_FEATURES)


@pytest.mark.claim("flip-centred-mnist")
def test_set_context_rebuilds_the_mean():
    x_tr, x_te = _data(3)
    model = build_model(ModelSpec("attn", x_tr.shape[1], 8, 2, attn_centre=True), torch.as_tensor(x_tr),
                        dtype=torch.float64)
    moved = x_tr + 0.5 * np.random.default_rng(0).random(x_tr.shape)
    model.set_context(torch.as_tensor(moved))
    want = gram.attention_features(moved, x_te, centre=True)
    assert np.allclose(model.features(torch.as_tensor(x_te)).numpy(), want, atol=F64_FEATURES)


@pytest.mark.claim("ntk-attn-centred-mnist", "flip-centred-mnist")
def test_centred_closed_form_ntk_matches_generic_and_analytic_limit():
    x_tr, _ = _data(5, n=20, d=7)
    xt = torch.as_tensor(x_tr)
    model = build_model(ModelSpec("attn", 7, 32, 4, seed=2, attn_centre=True), xt, dtype=torch.float64)
    fast = empirical_ntk(model, xt, implementation="closed_form")
    slow = empirical_ntk(model, xt, implementation="torch_func")
    assert float((fast - slow).norm() / slow.norm()) < 1e-8
    wide = build_model(ModelSpec("attn", 7, 20_000, 1, seed=2, attn_centre=True), xt, dtype=torch.float64)
    k_inf = kernels.analytic_ntk_mlp_attn(x_tr, x_tr, centre=True)
    err = float(np.linalg.norm(empirical_ntk(wide, xt).numpy() - k_inf) / np.linalg.norm(k_inf))
    assert err < 0.05


def test_centring_spreads_the_features_of_real_images(mnist_small):
    """On MNIST the paper's features nearly align (the mean image dominates `C x`); centred ones do not."""
    x = mnist_small.x_train[:100].astype(np.float64)

    def mean_cos(f: np.ndarray) -> float:
        g = f @ f.T
        return float((g.sum() - np.trace(g)) / (g.shape[0] * (g.shape[0] - 1)))

    paper = mean_cos(gram.attention_features(x, x))
    centred = mean_cos(gram.attention_features(x, x, centre=True))
    assert paper > 0.9
    assert centred < paper - 0.5


def test_centred_model_round_trips_through_safetensors(tmp_path):
    from verify.audit.modelio import load_model

    x_tr, x_te = _data(7)
    model = build_model(ModelSpec("attn", x_tr.shape[1], 8, 3, seed=1, attn_centre=True),
                        torch.as_tensor(x_tr, dtype=torch.float32))
    path, _ = save_model(model, tmp_path / "net.safetensors")
    loaded = load_model(path)
    xq = torch.as_tensor(x_te, dtype=torch.float32)
    assert torch.allclose(loaded.module(xq), model(xq), atol=F32_ROUNDING)


@pytest.mark.claim("ntk-attn-centred-mnist")
@pytest.mark.slow
def test_cli_runs_the_centred_variant_and_records_it(tmp_path, capsys):
    from verify.cli import main

    out = tmp_path / "d.json"
    rc = main(["ntk-distance", "--preset", "smoke", "--model", "attn", "--widths", "16,64", "--seeds", "1",
               "--n-train", "40", "--n-test", "20", "--epochs", "3", "--centre", "--json", str(out)])
    assert rc == 0
    assert "centred (variant" in capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["config"]["attn_centre"] is True


@pytest.mark.claim("ntk-attn-centred-mnist", "flip-centred-mnist")
def test_relu_spec_ignores_the_attention_options():
    """2L-ReLU has no context: a sweep run with --centre (or a rank) trains the very same 2L-ReLU networks, so the
    training memo shares them with the paper-model sweep instead of training them again."""
    plain = ModelSpec("relu", 9, 8, 3, seed=1)
    assert ModelSpec("relu", 9, 8, 3, seed=1, attn_centre=True, attn_rank=4, attn_layers=2) == plain
    assert ModelSpec("attn", 9, 8, 3, seed=1, attn_centre=True) != ModelSpec("attn", 9, 8, 3, seed=1)
