"""`verify audit` end to end on models trained outside the suite, Gauss-Newton influence, the risk rule,
and one-line errors (exit 2, nothing written) for every kind of bad input."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from tolerances import F32_ROUNDING, F64_ALGORITHM, F64_ROUNDING, F64_SOLVE, F64_ULPS
from torch import nn
from torch.func import functional_call, jacrev, vmap
from torchscript import script

from empirics.attribution.audit_attribution import INSTALL, PEERS, installed
from empirics.attribution.gauss_newton import (
    gn_influence_explicit,
    gn_influence_full,
    gn_influence_mean,
    loss_residuals,
)
from empirics.common import Tensors, train_network
from empirics.data.datasets import DataRequest, load_dataset
from empirics.kernels.audit_ntk import ModelJacobian
from empirics.nets.models import ModelSpec, save_model
from empirics.nets.train import TrainConfig
from empirics.records import git_state
from verify.audit.estimators import ESTIMATORS
from verify.audit.risk import NOT_MEASURABLE, NOT_VALIDATED, RISK_LEVELS, assess_risk, model_gate, risk_level
from verify.cli import main

SMALL = ["--n", "60", "--n-test", "20", "--tau", "0.2", "--steps", "2", "--baseline-seeds", "2",
         "--ref-width", "32", "--ref-epochs", "2", "--hessian-iters", "3", "--top-k", "4",
         "--lds-subsets", "4", "--refit-epochs", "1", "--refit-seeds", "2", "--outcome-targets", "5"]
NO_PANELS = ["--skip", "budget,poison,validity,outcome"]


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 5, stride=2)
        self.c2 = nn.Conv2d(4, 8, 3, stride=2)
        self.fc = nn.Linear(8 * 5 * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).flatten(1))


class AttnNet(nn.Module):
    """The 28 image rows as tokens, one softmax-attention block, mean pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(28, 16)
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x.reshape(x.shape[0], 28, 28))
        a, _ = self.att(h, h, h, need_weights=False)
        return self.head((h + a).mean(dim=1))


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 40) -> nn.Module:
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for i in range(steps):
        b = slice((i * 16) % len(x), (i * 16) % len(x) + 16)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[b]), y[b]).backward()
        opt.step()
    return model.eval()


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    ds = load_dataset("mnist", n_train=80, n_test=30, request=DataRequest(source="bundled"))
    folder = tmp_path_factory.mktemp("audit")
    np.savez(folder / "train.npz", x=(ds.x_train.reshape(-1, 28, 28) * 255).round().astype(np.uint8), y=ds.y_train)
    np.savez(folder / "test.npz", x=ds.x_test.reshape(-1, 1, 28, 28), y=ds.y_test)
    x = torch.as_tensor(ds.x_train).reshape(-1, 1, 28, 28)
    cnn = _fit(CNN(), x, torch.as_tensor(ds.y_train))
    script(cnn).save(str(folder / "cnn.ts"))
    return {"folder": folder, "train": str(folder / "train.npz"), "test": str(folder / "test.npz"),
            "cnn": str(folder / "cnn.ts"), "ds": ds}


def _audit(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["audit", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture(scope="module")
def cnn_report(data, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cnn-report") / "report.pdf"
    code = main(["audit", "--model", data["cnn"], "--train", data["train"], "--test", data["test"], *SMALL,
                 "--out", str(out), "--json", "--html"])
    return {"code": code, "out": out, "record": json.loads(out.with_suffix(".json").read_text())}


# --- end to end ---------------------------------------------------------------------------------------------


def _check_record(rec: dict, references: bool) -> None:
    risk, val = rec["risk"], rec["panels"].get("validity", {})
    issued = risk["model_gate"]["passed"] and val.get("verdict") == "trustworthy"
    assert (risk["level"] in RISK_LEVELS) == issued, (risk["level"], risk.get("reason"))
    assert risk["unvalidated_level"] in (*RISK_LEVELS, "not measurable")
    assert set(rec["models"]) == ({"user", "relu", "attn"} if references else {"user"})
    assert rec["code"] == git_state()  # the code version beside every number
    for m in rec["models"].values():
        assert m["n_selected"] == 12
        for a in ("fgsm", "pgd", "mim"):
            assert 0.0 <= m["attacks"][a]["flip_rate"] <= 1.0
            assert m["attacks"][a]["max_abs_perturbation"] <= 0.3 + F32_ROUNDING
        assert len(m["baseline"]["flip_rates"]) == 2
        assert len(m["influence_total"]) == 60 and len(m["gn_total"]) == 60
        assert -1.0 <= m["rho_ntk_gn"] <= 1.0
        assert m["ntk"]["lambda_max"] > 0
    assert len(rec["levers"]) == 4 and len(rec["levers"][0]["pixels"]) == 784
    assert rec["model"]["sha256"] and rec["data"]["train"]["sha256"] and rec["versions"]["torch"]


def test_cnn_torchscript_audit_end_to_end(cnn_report):
    assert cnn_report["code"] == 0
    out = cnn_report["out"]
    assert out.read_bytes()[:5] == b"%PDF-"
    html = out.with_suffix(".html").read_text()
    assert html.count("data:image/png;base64,") == 8  # with the first page's lever thumbnails
    for title in ("(validity)", "Budget curves", "Outcome: what altering", "Planted-poison self-test"):
        assert title in html
    rec = cnn_report["record"]
    _check_record(rec, references=True)
    panels = rec["panels"]
    assert panels["run"] == ["budget", "poison", "validity", "outcome"]
    assert panels["refit"]["kind"] == "warm start" and panels["refit"]["count"] > 4
    assert [p["eps"] for p in panels["budget"]["by_eps"]] == sorted(p["eps"] for p in panels["budget"]["by_eps"])
    assert panels["validity"]["verdict"] in ("trustworthy", "fragile", "inconclusive", "not measurable")
    assert any(abs(a) > 0 for a in panels["validity"]["scatter"]["actual"])  # the re-fits did train the module
    val = panels["validity"]
    own = set(ESTIMATORS) - set(val.get("unscored", {}))
    ensembles = {f"ens-{n}" for n in own} if val["ensemble"]["members"] else set()
    assert len(val["ensemble"]["members"]) == rec["config"]["ensemble"] or val["ensemble"]["skipped"]
    assert set(val["lds"]) == own | ensembles | {p for p in PEERS if installed(p)} and val["best"] in val["lds"]
    assert val["lead"] in own | ensembles and rec["models"]["user"]["estimator"] == val["lead"]
    assert all(val["lds"][k]["seconds"] > 0 for k in val["lds"])
    for p in PEERS:
        if not installed(p):
            assert INSTALL in val["unscored"][p]["reason"] and INSTALL in html.replace("&#39;", "'")
    assert f"{val['lds'][val['best']]['label']} (best)" in html and "empirical Fisher (exact, dual)" in html
    assert set(panels["outcome"]["rows"]) == {"acc_change", "target_flip", "target_loss_change"}
    assert panels["poison"]["k"] == 3 and set(panels["poison"]["rankings"]) >= {"harmful_ntk", "training_loss"}
    for ref in ("relu", "attn"):
        assert rec["models"][ref]["training"]["protocol"] == "width-consistent"
        assert rec["models"][ref]["gate"]["passed"] is False  # 2 epochs cannot reach a plateau
    assert rec["risk"]["left_out"] == ["2L-ReLU", "MLP-Attn"] and rec["risk"]["high_floor"] in ("inf", float("inf"))
    assert rec["model"]["format"] == "torchscript" and rec["model"]["input_shape"] == [1, 28, 28]
    assert rec["data"]["image_shape"] == [1, 28, 28]


def test_an_ensemble_lead_ranks_the_flip_rates_levers_and_attributions(data, tmp_path, capsys, monkeypatch):
    """Where an ensemble predicts the re-fits best it leads (forced here: on 60 points any estimator may win): the
    flip rates, budget curves, levers and exported attributions rank by the ensemble's influence, the references by
    the estimator it averages, and every flip rate is a number."""
    from verify.audit import validity

    monkeypatch.setattr(validity, "lead_estimator", lambda scores: "ens-ef" if "ens-ef" in scores else "ef")
    out = tmp_path / "ens.pdf"
    code, _, err = _audit(["--model", data["cnn"], "--train", data["train"], "--test", data["test"], *SMALL,
                           "--skip", "poison,outcome", "--out", str(out), "--json", "--html", "--attributions"], capsys)
    assert code == 0, err
    rec = json.loads(out.with_suffix(".json").read_text())
    val, user = rec["panels"]["validity"], rec["models"]["user"]
    assert val["lead"] == user["estimator"] == "ens-ef" and "ensemble" in user["estimator_label"]
    np.testing.assert_allclose(user["estimator_total"], np.sum(_exported_influence(tmp_path / "ens-attributions.npz"),
                                                                axis=1), rtol=1e-12)
    assert {rec["models"][r]["estimator"] for r in ("relu", "attn")} == {"ef"}
    _check_record(rec, references=True)
    assert all(0 <= p["flip_rate"] <= 1 for p in rec["panels"]["budget"]["by_eps"])
    assert "averaged over the re-fits (ensemble)" in out.with_suffix(".html").read_text()


def _exported_influence(path: Path) -> np.ndarray:
    """The exported training x test influence of an audit's `--attributions` file (no pickle)."""
    return np.load(path, allow_pickle=False)["influence"]


def test_refit_panels_are_not_measurable_when_the_control_refit_loses_the_fit(data, tmp_path, capsys):
    out = tmp_path / "lost.pdf"
    code, stdout, err = _audit(["--model", data["cnn"], "--train", data["train"], "--test", data["test"], *SMALL,
                                "--no-reference", "--skip", "budget", "--refit-lr", "1.0", "--refit-epochs", "3",
                                "--out", str(out), "--json", "--html"], capsys)
    assert code == 0, err
    pan = json.loads(out.with_suffix(".json").read_text())["panels"]
    assert not pan["refit"]["control"]["passed"] and "control re-fit" in pan["refit"]["control"]["reason"]
    for p in ("validity", "outcome", "poison"):
        assert pan[p]["verdict"] == "not measurable" and "not adequate" in pan[p]["reason"]
    assert "Influence is NOT MEASURABLE" in out.with_suffix(".html").read_text()
    assert "influence not measurable against re-fits" in stdout


def test_attention_model_exported_audit_end_to_end(data, tmp_path, capsys):
    ds = data["ds"]
    model = _fit(AttnNet(), torch.as_tensor(ds.x_train).reshape(-1, 1, 28, 28), torch.as_tensor(ds.y_train))
    path = tmp_path / "attn.pt2"
    ep = torch.export.export(model, (torch.rand(2, 1, 28, 28),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(ep, str(path))
    out = tmp_path / "attn.pdf"
    code, stdout, _ = _audit(["--model", str(path), "--train", data["train"], "--test", data["test"], *SMALL,
                              *NO_PANELS, "--no-reference", "--out", str(out), "--json"], capsys)
    assert code == 0, stdout
    rec = json.loads(out.with_suffix(".json").read_text())
    _check_record(rec, references=False)
    assert rec["model"]["format"] == "export" and "factored" in rec["model"]["kernel_method"]
    assert rec["risk"]["references"].startswith("paper-reported")
    assert "malleability risk" in stdout


def test_suite_trained_model_audit_end_to_end(data, tmp_path, capsys):
    ds = data["ds"]
    t = Tensors(torch.as_tensor(ds.x_train), torch.as_tensor(ds.y_train), torch.as_tensor(ds.x_test),
                torch.as_tensor(ds.y_test), 10)
    tr = train_network(ModelSpec("attn", 784, 32, 10), t, TrainConfig(epochs=2))
    weights, spec = save_model(tr.model, tmp_path / "suite.safetensors")
    out = tmp_path / "suite.pdf"
    code, _, err = _audit(["--model", str(weights), "--train", data["train"], "--test", data["test"], *SMALL,
                           *NO_PANELS, "--no-reference", "--out", str(out), "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out.with_suffix(".json").read_text())
    _check_record(rec, references=False)
    assert rec["model"]["format"] == "safetensors" and rec["model"]["spec"]["kind"] == "attn"
    assert rec["model"]["kernel_method"].startswith("closed form")
    assert rec["model"]["spec_path"] == str(spec)


def test_attributions_are_exported_as_plain_arrays_and_levers_by_class(data, tmp_path, capsys):
    """`--attributions` (issue 43 item 7): the lead estimator's training x test influence as an .npz that loads
    without pickle; its row sums are the totals the flip rates rank by, its levers the record's; the record says
    what the file is; the per-class table counts the levers against the classes' shares; --render cannot export."""
    ds = data["ds"]
    t = Tensors(torch.as_tensor(ds.x_train), torch.as_tensor(ds.y_train), torch.as_tensor(ds.x_test),
                torch.as_tensor(ds.y_test), 10)
    tr = train_network(ModelSpec("relu", 784, 32, 10), t, TrainConfig(epochs=2))
    weights, _ = save_model(tr.model, tmp_path / "relu.safetensors")
    out = tmp_path / "relu.pdf"
    code, stdout, err = _audit(["--model", str(weights), "--train", data["train"], "--test", data["test"], *SMALL,
                                *NO_PANELS, "--no-reference", "--out", str(out), "--json", "--html",
                                "--attributions"], capsys)
    assert code == 0, err
    rec = json.loads(out.with_suffix(".json").read_text())
    npz = np.load(tmp_path / "relu-attributions.npz", allow_pickle=False)
    user = rec["models"]["user"]
    assert npz["influence"].shape == (60, 20) == tuple(rec["attributions"]["shape"])
    assert rec["attributions"] == {"estimator": user["estimator"], "shape": [60, 20], "file": "relu-attributions.npz"}
    np.testing.assert_allclose(npz["influence"].sum(axis=1), user["estimator_total"], rtol=1e-12, atol=1e-15)
    assert npz["levers"].tolist() == user["selected"] and str(npz["estimator"]) == user["estimator"]
    y = npz["train_labels"]
    classes = rec["lever_classes"]
    assert sum(c["levers"] for c in classes) == len(user["selected"])
    for c in classes:
        assert c["levers"] == int(np.sum(y[user["selected"]] == c["label"])) == c["helpful"] + c["harmful"]
        assert c["share_of_training"] == pytest.approx(np.mean(y == c["label"]))
        assert c["over"] == pytest.approx(c["share_of_levers"] / c["share_of_training"])
        exact = stats.binomtest(c["levers"], len(user["selected"]), c["share_of_training"]).pvalue
        assert c["p"] == pytest.approx(exact)
        assert c["p"] <= c["p_holm"] <= 1 and c["beyond_chance"] == (c["p_holm"] <= 0.05)
    assert "Where the levers lie" in out.with_suffix(".html").read_text()
    from verify.audit.ci import summary_markdown

    dense = [c for c in classes if c["beyond_chance"] and c["over"] > 1]
    line = next(ln for ln in summary_markdown(rec).splitlines() if "where the levers lie" in ln)
    assert ("than chance would give" in line) == (not dense) and all(f"class {c['class']}:" in line for c in dense)
    assert "relu-attributions.npz" in stdout
    code, _, err = _audit(["--render", str(out.with_suffix(".json")), "--out", str(tmp_path / "again.pdf"),
                           "--attributions"], capsys)
    assert code == 2 and "rerun the audit with --attributions" in err


def test_report_rerenders_from_json_and_survives_missing_weasyprint(cnn_report, tmp_path, capsys, monkeypatch):
    import reports.render as render

    saved = cnn_report["out"].with_suffix(".json")
    out = tmp_path / "again.pdf"
    code, _, _ = _audit(["--render", str(saved), "--out", str(out)], capsys)
    assert code == 0 and out.read_bytes()[:5] == b"%PDF-" and not out.with_suffix(".html").exists()

    def broken(path, html):
        raise render.PdfUnavailable("weasyprint cannot load (libpango missing); install Pango")

    monkeypatch.setattr(render, "write_pdf", broken)
    out2 = tmp_path / "nopdf.pdf"
    code, _, err = _audit(["--render", str(saved), "--out", str(out2)], capsys)
    assert code == 3
    assert not out2.exists() and out2.with_suffix(".html").exists()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "weasyprint cannot load" in lines[0] and "nopdf.html" in lines[0]


# --- bad input: one line, exit 2, nothing written -----------------------------------------------------------


def _bad_cases(data: dict, tmp: Path) -> dict[str, tuple[list[str], str]]:
    rng = np.random.default_rng(0)
    text = tmp / "notes.pt"
    text.write_text("not a model\n")
    noise = tmp / "noise.bin"
    noise.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    evil = tmp / "evil.pt"
    evil.write_bytes(pickle.dumps(Payload(tmp / "MARKER"), protocol=2))
    nan = tmp / "nan.npz"
    x = rng.random((30, 784)).astype(np.float32)
    x[3, 5] = np.nan
    np.savez(nan, x=x, y=np.zeros(30, dtype=np.int64))
    labels = tmp / "labels.npz"
    np.savez(labels, x=rng.random((30, 784)), y=np.full(30, 12))
    empty = tmp / "empty.npz"
    np.savez(empty, x=np.zeros((0, 784)), y=np.zeros(0))
    m, tr, te = data["cnn"], data["train"], data["test"]
    return {
        "missing model": (["--model", str(tmp / "nope.ts"), "--train", tr, "--test", te], "does not exist"),
        "wrong file": (["--model", str(text), "--train", tr, "--test", te], "not a model format"),
        "unknown format": (["--model", str(noise), "--train", tr, "--test", te], "not a model format"),
        "malicious pickle": (["--model", str(evil), "--train", tr, "--test", te], "nothing in it ran"),
        "shape mismatch": (["--model", m, "--train", tr, "--test", te, "--input-shape", "3,32,32"],
                           r"\(3, 32, 32\).*3072 values.*784 values"),
        "NaN data": (["--model", m, "--train", str(nan), "--test", te], "NaN or Inf"),
        "label out of range": (["--model", m, "--train", str(labels), "--test", te], "label 12 is out of range"),
        "empty set": (["--model", m, "--train", tr, "--test", str(empty)], "empty"),
        "missing data": (["--model", m, "--train", str(tmp / "nope.npz"), "--test", te], "no such file"),
        "no test split": (["--model", m, "--train", str(labels)], "--test is required"),
        "bad eps": (["--model", m, "--train", tr, "--test", te, "--eps", "2"], "eps"),
    }


CASES = ["missing model", "wrong file", "unknown format", "malicious pickle", "shape mismatch", "NaN data",
         "label out of range", "empty set", "missing data", "no test split", "bad eps"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_no_output(case: str, data, tmp_path, capsys):
    args, match = _bad_cases(data, tmp_path)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, stdout, err = _audit([*args, *SMALL, "--out", str(out_dir / "r.pdf"), "--json", "--html"], capsys)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("verify audit: error:"), err
    assert "Traceback" not in err
    import re

    assert re.search(match, lines[0]), lines[0]
    assert list(out_dir.iterdir()) == []
    assert not (tmp_path / "MARKER").exists()


# --- Gauss-Newton influence ---------------------------------------------------------------------------------


def _jacobians(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, xi):
        return functional_call(model, p, (xi[None],))[0]

    j = vmap(jacrev(f), (None, 0))(params, x)
    return torch.cat([v.reshape(x.shape[0], -1, v[0].numel() // v.shape[1]) for v in j.values()], 2).numpy()


def _tanh_problem(seed: int, n: int, width: int):
    """Jacobians and loss residuals of a small 3-class tanh network on random inputs (n training, 4 test points)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, width), nn.Tanh(), nn.Linear(width, 3)).double()
    x, xt = torch.randn(n, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    y, yt = torch.randint(0, 3, (n,)), torch.randint(0, 3, (4,))
    with torch.no_grad():
        r, rt = loss_residuals(model(x), y), loss_residuals(model(xt), yt)
    return x, xt, y, yt, _jacobians(model, x), _jacobians(model, xt), r, rt


def test_gauss_newton_woodbury_matches_explicit_hessian_inverse():
    _, _, _, _, J, Jt, r, rt = _tanh_problem(0, 11, 6)
    theta = np.einsum("icp,jdp->ijcd", J, J)
    theta_t = np.einsum("tcp,jdp->tjcd", Jt, J)
    for damping in (1e-3, 0.1, 10.0):
        ref = gn_influence_explicit(J, Jt, r, rt, damping)
        got = gn_influence_full(theta, theta_t, r, rt, damping)
        assert np.abs(got - ref).max() / np.abs(ref).max() < F64_SOLVE


def test_empirical_fisher_dual_matches_explicit_fisher_inverse():
    """The n-dimensional Woodbury form of empirical-Fisher influence against the P x P Fisher solve, with the full
    gradient Gram (r_i^T J_i J_j^T r_j) and, for a model whose outputs do not couple, the mean-kernel Gram."""
    from empirics.attribution.gauss_newton import ef_grams_mean, ef_influence, ef_influence_explicit

    x, xt, y, yt, J, Jt, r, rt = _tanh_problem(1, 9, 7)
    S = np.einsum("ic,icp,jdp,jd->ij", r, J, J, r)
    St = np.einsum("tc,tcp,jdp,jd->tj", rt, Jt, J, r)
    for damping in (1e-3, 0.1, 10.0):
        ref = ef_influence_explicit(J, Jt, r, rt, damping)
        got = ef_influence(S, St, 9 * damping)
        assert np.abs(got - ref).max() / np.abs(ref).max() < F64_SOLVE
    one = nn.Linear(5, 1).double()  # one output: Theta = K exactly
    J1, Jt1 = _jacobians(one, x), _jacobians(one, xt)
    with torch.no_grad():
        r1, rt1 = loss_residuals(one(x), y % 2), loss_residuals(one(xt), yt % 2)
    S1, St1 = ef_grams_mean(J1[:, 0] @ J1[:, 0].T, Jt1[:, 0] @ J1[:, 0].T, r1, rt1)
    ref = ef_influence_explicit(J1, Jt1, r1, rt1, 0.05)
    assert np.abs(ef_influence(S1, St1, 9 * 0.05) - ref).max() / np.abs(ref).max() < F64_SOLVE


def test_mean_form_is_exact_for_one_output_with_the_generic_kernel():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)).double().eval()
    x, xt = torch.rand(9, 6, dtype=torch.float64), torch.rand(3, 6, dtype=torch.float64)
    y, yt = torch.randint(0, 2, (9,)), torch.randint(0, 2, (3,))
    eng = ModelJacobian(model, (6,))
    K, Kt = eng.kernel(x).numpy(), eng.kernel(xt, x).numpy()
    with torch.no_grad():
        r, rt = loss_residuals(model(x), y), loss_residuals(model(xt), yt)
    damping = 0.05
    ref = gn_influence_explicit(_jacobians(model, x), _jacobians(model, xt), r, rt, damping)
    got = gn_influence_mean(K, Kt, r, rt, 9 * damping)
    assert np.abs(got - ref).max() / np.abs(ref).max() < F64_SOLVE


def test_mean_form_equals_full_form_when_outputs_do_not_couple():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(7, 7))
    K, Kt = a @ a.T, rng.normal(size=(3, 7))
    r, rt = rng.normal(size=(7, 4)), rng.normal(size=(3, 4))
    eye = np.eye(4)
    full = gn_influence_full(np.einsum("ij,cd->ijcd", K, eye), np.einsum("tj,cd->tjcd", Kt, eye), r, rt, 0.2)
    assert np.allclose(gn_influence_mean(K, Kt, r, rt, 7 * 0.2), full, rtol=F64_ALGORITHM, atol=F64_ROUNDING)


# --- the risk rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flip, base, relu, attn, level", [
    (0.10, [0.08, 0.12, 0.10], 0.03, 0.30, "low"),
    (0.04, [0.00, 0.01, 0.00], 0.05, 0.30, "low"),
    (0.15, [0.00, 0.01, 0.00], 0.05, 0.30, "medium"),
    (0.30, [0.00, 0.01, 0.00], 0.05, 0.30, "high"),
    (0.50, [0.00, 0.01, 0.00], 0.05, 0.30, "high"),
    (0.20, [0.00, 0.01, 0.00], 0.10, 0.08, "high"),
    (0.50, [0.00, 0.01, 0.00], 0.05, None, "medium"),
    (0.04, [0.00, 0.01, 0.00], None, 0.30, "medium"),
    (0.01, [0.00, 0.01, 0.00], None, None, "low"),
])
def test_risk_rule(flip, base, relu, attn, level):
    r = risk_level(flip, base, relu, attn)
    assert r["level"] == level
    assert r["low_ceiling"] <= r["high_floor"]


VALID = {"verdict": "trustworthy"}


def _measured(flip: float, gate: bool | None = None) -> dict:
    m = {"worst_flip_rate": flip, "baseline": {"flip_rates": [0.00, 0.01, 0.00]}}
    return m if gate is None else {**m, "gate": {"passed": gate}}


def test_assess_risk_takes_the_scale_from_the_references_or_the_paper():
    """Without references the scale is the paper's R = 5 %, A = 20 % (module docstring of verify.audit.risk); a
    trained reference below the adequacy gate is left out of the scale and named in the record."""
    paper = assess_risk({"user": _measured(0.15)}, trained=False, eps=0.3, validity=VALID)
    assert (paper["level"], paper["relu_reference"], paper["attn_reference"]) == ("medium", 0.05, 0.20)
    assert paper["references"] == "paper-reported values (no references trained)"
    assert "not at the eps 8/255" in assess_risk({"user": _measured(0.15)}, trained=False, eps=8 / 255)["references"]
    assert assess_risk({"user": _measured(0.25)}, trained=False, eps=0.3, validity=VALID)["level"] == "high"
    trained = {"user": _measured(0.04), "relu": _measured(0.05, gate=False), "attn": _measured(0.30, gate=True)}
    r = assess_risk(trained, trained=True, eps=0.3, validity=VALID)
    assert r["level"] == "medium" and r["left_out"] == ["2L-ReLU"] and r["attn_reference"] == 0.30
    assert r["references"].endswith("2L-ReLU did not pass the adequacy gate and is left out of the scale")
    assert r["advice"] and all(isinstance(a, str) for a in r["advice"]) and r["gate"]
    trained["relu"]["gate"]["passed"] = True
    assert assess_risk(trained, trained=True, eps=0.3, validity=VALID)["level"] == "low"


def _fragile(ntk: float, gn: float) -> dict:
    score = {k: {"value": v, "lo": v - 0.05, "hi": v + 0.05, "fraction": v / 0.3, "fraction_lo": (v - 0.05) / 0.3,
                 "fraction_hi": (v + 0.05) / 0.3, "validated": (v - 0.05) / 0.3 >= 0.5} for k, v in (("ntk", ntk),
                                                                                                     ("gn", gn))}
    return {"verdict": "fragile", "reason": "r", "lds": score, "ceiling": {"value": 0.3}, "best": "gn"}


def test_risk_level_is_issued_only_for_a_model_above_chance_with_trustworthy_influence():
    """The level of the scale stays in the record, but the headline is "not validated" unless the validity verdict is
    trustworthy, and "not measurable" for a model that fails the model gate (module docstring of verify.audit.risk)."""
    user = {"user": _measured(0.15)}
    ok = model_gate(0.9, np.arange(30) % 10, 10)
    assert ok["passed"]
    assert assess_risk(user, False, 0.3, ok, VALID)["level"] == "medium"
    skipped = assess_risk(user, False, 0.3, ok, None)
    assert skipped["level"] == NOT_VALIDATED and "--skip validity" in skipped["reason"]
    assert skipped["unvalidated_level"] == "medium" and not skipped["validated"]
    fragile = assess_risk(user, False, 0.3, ok, _fragile(0.05, 0.20))
    assert fragile["level"] == NOT_VALIDATED and "Gauss-Newton, reached LDS 0.20" in fragile["reason"]
    assert "--lds-repeats" in " ".join(fragile["advice"]) and "--train-fn" in " ".join(fragile["advice"])
    at_chance = model_gate(0.1, np.arange(30) % 10, 10)
    assert not at_chance["passed"] and "below 0.190" in at_chance["reason"]
    r = assess_risk(user, False, 0.3, at_chance, VALID)
    assert r["level"] == NOT_MEASURABLE and r["reason"] == at_chance["reason"] and not r["validated"]
    # the one thing to do next comes first, where the record says why no level was issued (issue 43 item 7)
    assert r["advice"][0].startswith("The model has not learnt") and r["next_step"] == r["advice"][0]
    straddling = {**_fragile(0.05, 0.20), "verdict": "inconclusive",
                  "adaptive": {"to_settle": {"subsets": 130, "extra_refits": 164, "seconds": 600.0}}}
    s = assess_risk(user, False, 0.3, ok, straddling)
    assert s["advice"][0].startswith("Rerun with --lds-max-subsets 130 (164 more re-fits, about 10 min")
    odds = [{"share": 0.5, "subsets": 90, "extra_refits": 84, "seconds": 300.0},
            {"share": 0.8, "subsets": 400, "extra_refits": 704, "seconds": 2580.0}]
    with_odds = {**straddling, "adaptive": {"to_settle": {**straddling["adaptive"]["to_settle"], "odds": odds}}}
    step = assess_risk(user, False, 0.3, ok, with_odds)["next_step"]  # the budget that settles 4 in 5 outcomes
    assert step.startswith("Rerun with --lds-max-subsets 400 (up to 704 more re-fits, about 43 min")
    assert "alone 130" in step
    on_bar = {**straddling, "adaptive": {"to_settle": {"subsets": None, "why": "on the bar", "odds": odds}}}
    assert "--lds-max-subsets 400" in assess_risk(user, False, 0.3, ok, on_bar)["next_step"]
    no_control = {**_fragile(0.05, 0.20), "control": {"passed": False, "reason": "test accuracy fell"}}
    assert "--train-fn" in assess_risk(user, False, 0.3, ok, no_control)["advice"][0]
    assert assess_risk(user, False, 0.3, ok, VALID)["next_step"] == ""


def test_not_validated_reason_without_a_ceiling_says_why_instead_of_nan():
    """Re-fits that do not agree with each other give a zero ceiling and no fraction (the README's ResNet-18): the
    reason names the LDS reached and the validity panel's reason, never a NaN fraction."""
    v = _fragile(0.05, 0.20)
    v.update(verdict="inconclusive", reason="repeated re-fits do not agree", ceiling={"value": 0.0})
    for s in v["lds"].values():
        s.update(fraction=float("nan"), fraction_lo=float("nan"), fraction_hi=float("nan"), validated=False)
    r = assess_risk({"user": _measured(0.15)}, False, 0.3, model_gate(0.9, np.arange(30) % 10, 10), v)
    assert r["level"] == NOT_VALIDATED and "nan" not in r["reason"]
    assert "LDS 0.20 [0.15, 0.25]" in r["reason"] and "repeated re-fits do not agree" in r["reason"]


@pytest.mark.parametrize("acc, labels, out_dim, passed, why", [
    (0.30, np.arange(100) % 10, 10, True, ""),  # chance 0.10: above 0.19, Wilson lower end 0.22 > 0.10
    (0.20, np.arange(30) % 10, 10, False, "not significantly"),  # above 0.19, but [0.095, 0.37] holds 0.10
    (0.81, np.r_[np.zeros(80), np.ones(20)].astype(int), 10, False, "below 0.820"),  # chance: the majority share
    (0.85, np.r_[np.zeros(80), np.ones(20)].astype(int), 10, False, "not significantly"),  # [0.77, 0.91]
    (0.95, np.r_[np.zeros(80), np.ones(20)].astype(int), 10, True, ""),
    (0.54, np.arange(40) % 2, 1, False, "below 0.550"),  # one output: chance 1/2
])
def test_model_gate_against_chance_and_the_majority_label(acc, labels, out_dim, passed, why):
    g = model_gate(acc, labels, out_dim)
    assert g["passed"] is passed and why in g["reason"]
    assert 0.0 <= g["test_acc_lo"] <= acc <= g["test_acc_hi"] <= 1.0


def test_sharpness_by_finite_differences_matches_double_backward():
    from verify.audit.sharpness import HvpOptions, top_hessian

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)).double()
    x, y = torch.rand(40, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    exact = top_hessian(model, x, y, iters=60, seed=0)
    fd = top_hessian(model, x, y, iters=60, seed=0, options=HvpOptions(finite_differences=True))
    assert exact["hvp"] == "double backward" and fd["hvp"].startswith("central")
    assert abs(fd["value"] - exact["value"]) <= 1e-4 * abs(exact["value"])


@pytest.mark.parametrize("budget", [1 << 30, 2000])
def test_perturbed_rows_equal_a_full_recomputation(budget: int):
    from verify.audit.measure import GenericKernels

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double().eval()
    x, xt = torch.rand(10, 6, dtype=torch.float64), torch.rand(4, 6, dtype=torch.float64)
    eng = ModelJacobian(model, (6,))
    prov = GenericKernels(eng, budget)
    K, Kst = prov.clean(x, xt)
    sel = np.array([1, 4, 7])
    x_new = x.clone()
    x_new[sel] = torch.rand(3, 6, dtype=torch.float64)
    K2, Kst2 = prov.perturbed(x_new, sel, K, Kst, xt)
    assert np.allclose(K2, eng.kernel(x_new).numpy(), rtol=F64_ROUNDING, atol=F64_ULPS)
    assert np.allclose(Kst2, eng.kernel(xt, x_new).numpy(), rtol=F64_ROUNDING, atol=F64_ULPS)


def test_only_an_earlier_audits_files_count_as_its_outputs(tmp_path: Path):
    """`verify.audit.files.earlier_audit_file` decides what a rerun may replace: an audit's PDF, HTML, summary
    and JSON record, never a user's file that happens to have the same name."""
    from verify.audit.config import SUMMARY_MARKER
    from verify.audit.files import earlier_audit_file, output_members

    assert output_members(tmp_path / "a.pdf") == ("a.pdf", "a.html", "a.json", "a-summary.md")
    files = {"a.pdf": (b"%PDF-1.7 ...", b"my notes"),
             "a.html": (b"<h1>Training-data malleability audit</h1>", b"<h1>my page</h1>"),
             "a-summary.md": (SUMMARY_MARKER.encode() + b"\n| |", b"# my summary"),
             "a.json": (b'{"experiment": "audit", "risk": {}}', b'{"experiment": "claims"}')}
    for name, (ours, theirs) in files.items():
        p = tmp_path / name
        p.write_bytes(ours)
        assert earlier_audit_file(p), name
        p.write_bytes(theirs)
        assert not earlier_audit_file(p), name
    assert not earlier_audit_file(tmp_path / "missing.pdf")
