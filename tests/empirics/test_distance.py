"""NTK distance experiment: trend rule, and the smoke sweep end to end on real MNIST."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from empirics.experiments.distance import (
    GD_METRIC,
    METRICS,
    DistanceConfig,
    DistanceRecord,
    gd_mse_run,
    linearised_change,
    run_ntk_distance,
    trend,
)
from empirics.nets.train import TrainConfig
from ntkm import codec
from verify.cli import main


def test_trend_rule():
    assert trend([16, 64, 256], [3.0, 2.0, 1.0])["verdict"] == "decreasing"
    assert trend([16, 64, 256], [1.0, 2.0, 3.0])["verdict"] == "increasing"
    assert trend([16, 64, 256, 1024], [1.0, 3.0, 0.5, 2.0])["verdict"] == "non-monotone"
    slope = trend([16, 64, 256, 1024], [1 / math.sqrt(w) for w in (16, 64, 256, 1024)])["loglog_slope"]
    assert slope == pytest.approx(-0.5)


def test_linearised_change_matches_stepping_the_linear_model():
    """The closed form against T explicit gradient-descent steps of the linear model on half the squared error."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 7))
    k = z @ z.T  # rank 7 of 30 training rows: zero eigenvalues take their limit
    k_tt, k_st = k[:30, :30], k[30:, :30]
    y, f0_tr, f0_te = rng.normal(size=(30, 3)), rng.normal(size=(30, 3)), rng.normal(size=(10, 3))
    eta = 30 / np.linalg.eigvalsh(k_tt)[-1]
    f_tr, f_te = f0_tr.copy(), f0_te.copy()
    for _ in range(25):
        r = f_tr - y
        f_tr, f_te = f_tr - eta / 30 * k_tt @ r, f_te - eta / 30 * k_st @ r
    np.testing.assert_allclose(linearised_change(k_tt, k_st, y - f0_tr, 25, eta), f_te - f0_te, rtol=1e-9, atol=1e-9)


def test_gd_function_change_shrinks_with_width(mnist_small):
    """NTK theory: under gd-mse a wide 2L-ReLU's function change follows its linearised model more closely."""
    import torch

    from empirics.common import NetworkRequest, dataset_tensors
    from empirics.experiments.distance import reference_kernels
    from empirics.nets.losses import targets
    from empirics.nets.models import ModelSpec

    t = dataset_tensors(mnist_small)
    x_tr, x_te = mnist_small.x_train.astype(np.float64), mnist_small.x_test.astype(np.float64)
    spec0 = ModelSpec("relu", t.x_train.shape[1], 1, t.out_dim)
    k_tt, k_st, _ = reference_kernels(DistanceConfig(), spec0, x_tr, x_te, t, 0)
    y = targets(t.y_train, t.out_dim, torch.float64).cpu().numpy()
    cfg = TrainConfig(epochs=60, seed=0)
    ratio = {m: gd_mse_run(NetworkRequest(ModelSpec("relu", t.x_train.shape[1], m, t.out_dim), t, cfg, "cpu"),
                           k_tt, k_st, y)
             for m in (32, 2048)}
    assert ratio[2048]["gd_epochs_run"] > 0 and ratio[2048]["gd_gate"]["reason"]
    assert ratio[2048][GD_METRIC] < 0.5 * ratio[32][GD_METRIC], {m: r[GD_METRIC] for m, r in ratio.items()}


@pytest.mark.claim("ntk-relu-mnist", "ntk-attn-mnist", "ntk-contrast-mnist")
def test_smoke_sweep_records_every_metric(mnist_small):
    cfg = DistanceConfig(widths=(16, 256), seeds=(0, 1), n_train=120, n_test=40, train=TrainConfig(epochs=2))
    res = run_ntk_distance(cfg, dataset=mnist_small)
    for kind in ("relu", "attn"):
        block = res.models[kind]
        assert len(block.runs) == 4 and block.widths() == [16, 256]
        for w in (16, 256):
            for metric in METRICS:
                s = block.spread(w, metric)
                assert s["n"] == 2 and math.isfinite(s["mean"]) and s["mean"] >= 0
                assert block.mean(w, metric) == np.mean([r[metric] for r in block.runs if r["width"] == w])
        assert set(block.trends) == set(METRICS)
        # the width-256 kernel at init is closer to Thm 4.2's analytic kernel than the width-16 one
        assert block.mean(256, "init_vs_analytic") < block.mean(16, "init_vs_analytic")
    assert res.parameterization == "ntk"
    assert res.data["dataset"] == "mnist"
    assert "torch" in res.versions and res.wall_s > 0
    stored = res.to_dict()
    assert list(stored) == ["models", "experiment", "config", "ridge", "ridge_rule", "parameterization", "data",
                            "versions", "device", "wall_s"]
    assert DistanceRecord.from_dict(stored) == res
    assert DistanceRecord.from_dict(codec.loads(codec.dumps(res))) == res


def test_cli_smoke_json_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "nd.json", tmp_path / "nd.png"
    rc = main(["ntk-distance", "--preset", "smoke", "--widths", "16,64", "--seeds", "1",
               "--json", str(out), "--plot", str(plot)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["preset"] == "smoke" and rec["config"]["widths"] == [16, 64]
    assert rec["models"]["attn"]["trends"]["kernel_drift"]["verdict"] in ("decreasing", "increasing", "non-monotone")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "trend vs width" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--dataset", "imagenet"], "not a built-in data set"),
    (["--widths", "16,-4"], "--widths"),
    (["--model", "cnn"], "unknown model"),
    (["--preset", "huge"], "unknown preset"),
    (["--seeds", "0"], "--seeds"),
])
def test_cli_bad_input_is_one_line(argv, needle, capsys, tmp_path):
    out = tmp_path / "x.json"
    rc = main(["ntk-distance", *argv, "--json", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
