"""Loss landscape: Hessian-vector products against explicit Hessians, estimators, slices, verdict, smoke."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from tolerances import F32_ACCUMULATED, F64_ALGORITHM, F64_ROUNDING, ITERATIVE

from empirics.experiments.landscape import (
    LandscapeConfig,
    LandscapeRecord,
    filter_normalized_direction,
    hessian_vector_product,
    hutchinson_trace,
    interpolation,
    lanczos_top,
    landscape_verdict,
    loss_of_weights,
    not_a_minimum,
    power_iteration,
    run_landscape,
    slice_1d,
    slice_2d,
)
from empirics.nets.models import ModelSpec, build_model
from empirics.nets.train import TrainConfig
from ntkm import codec
from verify.claims import units
from verify.claims.landscape import LANDSCAPE_CLAIMS

pytestmark = [pytest.mark.claim("landscape-mnist"), pytest.mark.claim("landscape-cifar10")]


def _tiny(kind: str, out_dim: int, seed: int = 0, n: int = 20, d: int = 4, width: int = 6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, max(out_dim, 2), (n,), generator=gen)
    model = build_model(ModelSpec(kind, d, width, out_dim, seed=seed), x, dtype=torch.float64)
    loss = loss_of_weights(model, x, y)
    w = model.W.detach().clone()
    hess = torch.autograd.functional.hessian(loss, w).reshape(w.numel(), w.numel())
    return model, loss, w, hess


@pytest.mark.parametrize("kind", ["relu", "attn"])
@pytest.mark.parametrize("out_dim", [1, 3])
def test_top_eigenvalue_matches_explicit_hessian(kind, out_dim):
    _, loss, w, hess = _tiny(kind, out_dim, seed=3)
    exact = float(torch.linalg.eigvalsh(hess)[-1])
    hvp = hessian_vector_product(loss, w)
    power = power_iteration(hvp, w, iters=20000, seed=1, tol=1e-15)
    lanczos = lanczos_top(hvp, w, iters=w.numel(), seed=1)
    assert abs(power["value"] - exact) / exact < ITERATIVE
    assert abs(lanczos["value"] - exact) / exact < F64_ALGORITHM
    assert lanczos["residual"] < ITERATIVE


@pytest.mark.parametrize("kind", ["relu", "attn"])
@pytest.mark.parametrize("out_dim", [1, 3])
def test_closed_form_hvp_matches_autograd(kind, out_dim):
    _, loss, w, hess = _tiny(kind, out_dim, seed=5)
    v = torch.randn(w.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fast = loss.hvp_at(w)(v)
    auto = hessian_vector_product(loss, w)(v)
    explicit = (hess @ v.reshape(-1)).reshape(w.shape)
    assert float((fast - auto).norm() / auto.norm()) < F64_ALGORITHM
    assert float((auto - explicit).norm() / explicit.norm()) < F64_ALGORITHM


def test_hutchinson_within_standard_errors():
    _, loss, w, hess = _tiny("relu", 3, seed=7)
    est = hutchinson_trace(loss.hvp_at(w), w, samples=400, seed=2)
    exact = float(hess.trace())
    assert est["samples"] == 400 and est["stderr"] > 0
    assert abs(est["value"] - exact) <= 4 * est["stderr"] + 1e-9 * abs(exact)


def test_interpolation_endpoints_are_exact():
    model, loss, w1, _ = _tiny("attn", 3, seed=11)
    w0 = torch.randn(w1.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    curve = interpolation({"train": loss}, w0, w1, [-0.5, 0.0, 0.5, 1.0, 1.5])
    assert curve["train"][1] == float(loss(w0))
    assert curve["train"][3] == float(loss(w1))
    mid = float(loss(0.5 * w0 + 0.5 * w1))
    assert curve["train"][2] == pytest.approx(mid, rel=F64_ROUNDING)


def test_filter_normalized_rows_and_slices():
    _, loss, w, _ = _tiny("relu", 3, seed=13, width=8)
    w[2] = 0.0
    d = filter_normalized_direction(w, seed=0)
    assert torch.allclose(d.norm(dim=1), w.norm(dim=1), rtol=F64_ROUNDING, atol=0)
    assert torch.equal(d, filter_normalized_direction(w, seed=0))
    assert not torch.equal(d, filter_normalized_direction(w, seed=1))
    d2 = filter_normalized_direction(w, seed=0, salt=1)
    ts = [-1.0, 0.0, 0.5]
    line = slice_1d({"train": loss}, w, d, ts)
    grid = slice_2d(loss, w, d, d2, ts)
    assert line["train"][1] == float(loss(w)) == grid[1][1]
    assert line["train"][2] == pytest.approx(float(loss(w + 0.5 * d)), rel=F64_ROUNDING)
    assert grid[0][2] == pytest.approx(float(loss(w + 0.5 * d - 1.0 * d2)), rel=F64_ROUNDING)


def _run(seed: int, eig: float, flat: float, acc: float = 0.9, model: str = "relu", passed: bool = True,
         past_minimum: bool = False) -> dict:
    """A synthetic landscape run: `eig` is used for every sharpness number, `flat` for the flatness ones."""
    return {"seed": seed, "model": model, "top_eigenvalue": eig, "filter_increase": flat, "trace": eig,
            "sharpness_w2": eig, "sharpness_per_loss": eig, "sharpness_per_input": eig, "filter_increase_rel": flat,
            "slice_increase": flat, "train_acc": acc, "interp_argmin_alpha": 1.5 if past_minimum else 1.0,
            "feature_norm2": 1.0, "train_loss": 0.1,
            "interpolation": {"alpha": [0.0, 1.0, 1.5], "train": [2.0, 0.1, 0.05 if past_minimum else 0.2]},
            "gate": {"passed": passed, "reason": "passed" if passed else "train acc 0.10 < 0.55"}}


def _result(relu: list, attn: list, **attn_kw) -> dict:
    return {"models": {"relu": {"runs": [_run(s, *v) for s, v in enumerate(relu)]},
                       "attn": {"runs": [_run(s, *v, model="attn", **attn_kw) for s, v in enumerate(attn)]}}}


@pytest.mark.parametrize(("relu", "attn", "expected"), [
    ([(2.0, 2.0), (3.0, 3.0), (2.5, 2.5)], [(1.0, 1.0)] * 3, "holds"),
    ([(2.0, 0.5), (3.0, 0.5), (2.5, 0.4)], [(1.0, 1.0)] * 3, "partly"),
    ([(0.5, 2.0), (0.4, 3.0), (0.5, 2.5)], [(1.0, 1.0)] * 3, "partly"),
    ([(2.0, 0.5), (0.5, 2.0), (1.0, 1.0)], [(1.0, 1.0)] * 3, "does not hold"),
    ([(0.5, 0.5), (0.4, 0.4), (0.6, 0.6)], [(1.0, 1.0)] * 3, "does not hold"),
    ([(float("nan"), 2.0), (3.0, 3.0), (3.0, 3.0)], [(1.0, 1.0)] * 3, "not measurable"),
])
def test_verdict_rule_decides_on_seed_intervals(relu, attn, expected):
    assert landscape_verdict(_result(relu, attn)).verdict == expected


def test_verdict_acts_on_its_caveats():
    """Sharper in every seed, yet no verdict when a network did not learn or a point is not a minimum."""
    sharp = [(2.0, 2.0), (3.0, 3.0), (2.5, 2.5)]
    flat = [(1.0, 1.0)] * 3
    held = landscape_verdict(_result(sharp, flat))
    assert held.verdict == "holds" and held.reason is None and held.criteria_above == list(held.intervals)[:2]
    untrained = landscape_verdict(_result(sharp, flat, acc=0.1, passed=False))
    assert untrained.verdict == "not measurable" and "adequacy gate" in untrained.reason
    assert any(c.startswith("attn: training accuracy") for c in untrained.caveats)
    assert set(untrained.to_dict()) == {"verdict", "reason", "gate", "seeds", "caveats"}
    moving = landscape_verdict(_result(sharp, flat, past_minimum=True))
    assert moving.verdict == "partly" and any("not a minimum" in c for c in moving.caveats)
    only_relu = {"models": {"relu": {"runs": [_run(0, 1.0, 1.0)]}}}
    assert landscape_verdict(only_relu).to_dict() == {"verdict": "not measurable", "reason": "needs both relu and attn"}


def test_per_unit_loss_normalisation_divides_each_criterion_by_the_training_loss():
    """The normalisation axis: ReLU flatter as measured (about half), but trained to a 4x lower loss (for
    cross-entropy the curvature vanishes with the loss), so per unit loss it is the sharper one; the two readings
    give opposite verdicts, and an unknown normalisation is a one-line error."""
    flatter = [(0.5, 0.5), (0.4, 0.4), (0.6, 0.6)]
    res = _result(flatter, [(1.0, 1.0)] * 3)
    for r in res["models"]["relu"]["runs"]:
        r["train_loss"] = 0.025
    assert landscape_verdict(res).verdict == "does not hold"
    per = landscape_verdict(res, "per unit loss")
    assert per.verdict == "holds"
    expect = np.mean([np.log((v / 0.025) / (1.0 / 0.1)) for _, v in flatter])
    assert per.intervals["filter_increase"]["mean"] == pytest.approx(expect, rel=1e-12)
    with pytest.raises(ValueError, match="unknown landscape normalisation 'per epoch'"):
        landscape_verdict(res, "per epoch")


def _line(beyond: float, at_zero: float = 2.3, at_one: float = 2.15e-4) -> dict:
    return {"train_loss": at_one, "interpolation": {"alpha": [-0.5, 0.0, 0.5, 1.0, 1.1, 1.5],
                                                    "train": [3.0, at_zero, 0.5, at_one, beyond, beyond * 2]}}


def test_not_a_minimum_tolerance_is_tied_to_the_initial_loss():
    """Passable: the recorded landscape-mnist case (2.15e-4 at alpha 1, 1.67e-4 at 1.1: a relative 22 % fall, 2e-5 of
    the initial loss) is a minimum. Failable: a fall by 5 % of the initial loss beyond the trained weights is not;
    the same absolute fall counts less against a larger initial loss."""
    assert not not_a_minimum(_line(1.67e-4))
    assert not_a_minimum(_line(0.6 - 0.05 * 2.3, at_one=0.6))
    fall = {"alpha": [0.0, 1.0, 1.2], "train": [1.0, 0.5, 0.485]}
    assert not_a_minimum({"interpolation": fall, "train_loss": 0.5})
    assert not not_a_minimum({"interpolation": {**fall, "train": [2.0, 0.5, 0.485]}, "train_loss": 0.5})
    assert not not_a_minimum(_line(3e-4))  # loss rises past the trained point


def test_smoke_on_real_mnist(mnist_small, tmp_path):
    from reports.figures import landscape_contours, landscape_lines

    cfg = LandscapeConfig(width=32, seeds=(0, 1), n_train=120, n_test=40, train=TrainConfig(epochs=2),
                          points=5, grid=5, hessian_iters=6, hutchinson_samples=3, flat_directions=2)
    record = run_landscape(cfg, dataset=mnist_small)
    assert LandscapeRecord.from_dict(record.to_dict()) == record
    assert LandscapeRecord.from_dict(codec.loads(codec.dumps(record))) == record
    result = codec.loads(codec.dumps(record))  # the figures read the stored dict (reports imports no empirics)
    assert set(record.models) == {"relu", "attn"}
    for res in result["models"].values():
        for run in res["runs"]:
            for key in ("top_eigenvalue", "trace", "filter_increase", "sharpness_w2", "sharpness_per_loss",
                        "sharpness_per_input", "slice_increase", "train_loss", "test_loss", "grad_norm",
                        "feature_mean_cosine"):
                assert math.isfinite(run[key]), key
            assert run["top_eigenvalue"] > 0
            interp = run["interpolation"]
            assert interp["train"][interp["alpha"].index(1.0)] == run["train_loss"]
            assert run["slice_1d"]["train"][run["slice_1d"]["t"].index(0.0)] == run["train_loss"]
            assert run["train_loss"] == pytest.approx(run["final_train_loss_float32"], rel=F32_ACCUMULATED)
        assert res["summary"]["top_eigenvalue"]["n"] == 2
    assert record.verdict.verdict in ("holds", "partly", "does not hold", "not measurable")
    for res in record.models.values():
        assert all("gate" in r and "train_acc" in r for r in res.runs)
        for key in ("ntk_predictor_test_acc", "trained_ntk_predictor_test_acc"):  # the kernel predictors, per seed
            assert all(0.0 <= r[key] <= 1.0 for r in res.runs) and res.summary[key]["n"] == 2
    row = LANDSCAPE_CLAIMS[0].evaluate({units.landscape("mnist"): record})
    relu, attn = (record.models[m].summary for m in ("relu", "attn"))
    assert (f"kernel predictor test acc (analytic NTK / the trained network's NTK; the network itself): ReLU "
            f"{relu['ntk_predictor_test_acc']['mean']:.2f} / {relu['trained_ntk_predictor_test_acc']['mean']:.2f} "
            f"({relu['test_acc']['mean']:.2f}), Attn {attn['ntk_predictor_test_acc']['mean']:.2f}") in row.ours
    assert row.numbers["kernel_predictor_test_acc"]["ReLU"]["trained_ntk"] == [
        r["trained_ntk_predictor_test_acc"] for r in record.models["relu"].runs]
    for fn, name in ((landscape_lines, "lines.png"), (landscape_contours, "contours.png")):
        path = fn(result, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as img:
            img.verify()


def test_cli_smoke_and_bad_model(tmp_path, capsys):
    from verify.cli import main

    out = tmp_path / "ls.json"
    code = main(["landscape", "--preset", "smoke", "--seeds", "1", "--width", "16", "--n-train", "60",
                 "--n-test", "20", "--epochs", "1", "--json", str(out), "--plot", str(tmp_path / "fig")])
    assert code == 0
    text = capsys.readouterr().out
    assert "top eig" in text and "Claim 'ReLU sharp, Attn flat'" in text
    record = json.loads(out.read_text())
    assert record["experiment"] == "landscape" and record["preset"] == "smoke"
    assert (tmp_path / "fig-lines.png").exists() and (tmp_path / "fig-contours.png").exists()
    assert main(["landscape", "--preset", "smoke", "--model", "cnn"]) == 2
