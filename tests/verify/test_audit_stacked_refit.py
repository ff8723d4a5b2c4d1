"""Stacked re-fits (issue 43 item 2) equal one-at-a-time re-fits, and fall back where the model does not allow them;
`verify audit --device` (item 1): the choice, the one-line refusal, the move of model and data, and a CPU record
equal to the default run's; a model below the accuracy gate runs no panel."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from test_audit import CNN, SMALL, data  # noqa: F401 - the module-scoped data fixture
from tolerances import F32_ACCUMULATED
from torch import nn

from verify.audit import binding, pipeline
from verify.audit.modelio import FlatInput
from verify.audit.refit import RefitConfig, RefitJob, Refitter, per_example_loss
from verify.cli import main

SHAPE = (1, 12, 12)
D = 144


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    torch.set_num_threads(2)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, stride=2)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c1(x)).flatten(1))


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(D, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x.flatten(1)))))


class DataDependent(nn.Module):
    """Control flow on a value: vmap refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        return out if float(out.sum()) > -1e9 else -out


def _models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"mlp": nn.Sequential(nn.Flatten(), nn.Linear(D, 24), nn.Tanh(), nn.Linear(24, 3)), "cnn": SmallCNN()}


def _problem(n: int = 70) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[RefitJob]]:
    g = torch.Generator().manual_seed(1)
    x, y, xt = torch.rand(n, D, generator=g), torch.randint(0, 3, (n,), generator=g), torch.rand(9, D, generator=g)
    x_alt = x.clone()
    x_alt[:5] += 0.1
    rng = np.random.default_rng(0)
    keeps = [torch.as_tensor(np.sort(rng.choice(n, n - 7, replace=False))) for _ in range(3)]
    ev = {"test": xt, "train": x}
    jobs = [RefitJob(x, y, 0, ev, keeps[0]), RefitJob(x, y, 1, ev, keeps[0]), RefitJob(x, y, 0, ev, keeps[1]),
            RefitJob(x, y, 5, ev, keeps[2]),  # subsets and seeds of their own, equal size: one stack
            RefitJob(x, y, 0, ev), RefitJob(x_alt, y, 0, ev), RefitJob(x_alt, y, 2, ev),  # the whole (altered) set
            RefitJob(x, y, 3, ev, keeps[0][:-4])]  # a size of its own: one at a time
    return x, y, xt, jobs


def _refitter(model: nn.Module, stack: str, shape: tuple[int, ...] = SHAPE) -> Refitter:
    cfg = RefitConfig(epochs=3, lr=1e-2, batch_size=16, stack=stack)  # 63 or 70 points: a short last batch
    return Refitter.for_module(model, FlatInput(model, shape), cfg, 3, shape)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_stacked_refits_equal_one_at_a_time(kind: str):
    model = _models()[kind].eval()
    before = [p.detach().clone() for p in model.parameters()]
    x, y, _, jobs = _problem()
    stacked, loop = _refitter(model, "on"), _refitter(model, "off")
    got, want = stacked.outputs_many(jobs), loop.outputs_many(jobs)
    path = stacked.describe_path()
    assert path["stacked"] and "vmap" in path["reason"], path
    assert (path["stacked_refits"], path["one_at_a_time_refits"]) == (7, 1) and stacked.count == 8
    assert loop.describe_path().items() >= {"stacked": False, "reason": "--refit-stack off", "mode": "off",
                                            "stacked_refits": 0, "one_at_a_time_refits": 8}.items()
    for g, w in zip(got, want, strict=True):
        for k in ("test", "train"):
            np.testing.assert_allclose(g[k], w[k], rtol=F32_ACCUMULATED, atol=F32_ACCUMULATED)
        np.testing.assert_allclose(per_example_loss(g["train"], y.numpy(), 3), per_example_loss(w["train"],
                                   y.numpy(), 3), rtol=F32_ACCUMULATED, atol=F32_ACCUMULATED)
    assert not np.allclose(got[0]["test"], got[1]["test"])  # the seeds do differ
    # the weights themselves: each stacked copy against the module after its own one-at-a-time re-fit
    weights = stacked.fit_stacked(jobs[:4])
    for j, job in enumerate(jobs[:4]):
        with loop.fitted(x[job.keep], y[job.keep], job.seed):
            for name, p in zip(loop.names, loop.params, strict=True):
                torch.testing.assert_close(weights[name][j], p.detach(), rtol=F32_ACCUMULATED, atol=F32_ACCUMULATED)
    for p, b in zip(model.parameters(), before, strict=True):  # the saved weights are untouched
        assert torch.equal(p, b)


def test_batch_norm_that_updates_its_statistics_falls_back_and_says_so():
    torch.manual_seed(0)
    model = BatchNormNet().train()  # running statistics change on every forward
    _, _, _, jobs = _problem()
    stats = model.bn.running_mean.clone()
    refit = _refitter(model, "on", (D,))
    got = refit.outputs_many(jobs[:3])
    path = refit.describe_path()
    assert not path["stacked"] and "buffer" in path["reason"] and "batch-norm" in path["reason"], path
    assert path["one_at_a_time_refits"] == 3
    assert torch.equal(model.bn.running_mean, stats)  # every re-fit starts from, and leaves, the saved statistics
    want = _refitter(model, "off", (D,)).outputs_many(jobs[:3])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["test"], w["test"])
    # in evaluation mode (every audited file) the statistics are constants: the copies stack
    model.eval()
    ev = _refitter(model, "on", (D,))
    np.testing.assert_allclose(ev.outputs_many(jobs[:3])[2]["test"],
                               _refitter(model, "off", (D,)).outputs_many(jobs[:3])[2]["test"],
                               rtol=F32_ACCUMULATED, atol=F32_ACCUMULATED)
    assert ev.describe_path()["stacked"]


def test_a_model_vmap_refuses_falls_back_and_says_why():
    torch.manual_seed(0)
    model = DataDependent().eval()
    _, _, _, jobs = _problem()
    refit = _refitter(model, "on", (D,))
    got = refit.outputs_many(jobs[:3])
    path = refit.describe_path()
    assert not path["stacked"] and path["reason"].startswith("the stacked re-fit failed"), path
    want = _refitter(model, "off", (D,)).outputs_many(jobs[:3])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["test"], w["test"])


def test_auto_does_not_stack_on_the_cpu_nor_a_train_function():
    model = _models()["mlp"].eval()
    x, y, _, _ = _problem()
    stack, why = _refitter(model, "auto")._decide(x, y)  # this machine's CPU
    assert not stack and "CPU" in why
    assert _refitter(model, "on")._decide(x, y)[0]
    cfg = RefitConfig(epochs=1, train_fn="json:dumps", stack="on")
    fn = Refitter.for_module(model, FlatInput(model, SHAPE), cfg, 3, SHAPE)
    assert fn._decide(x, y) == (False, "your --train-fn fits each model itself, one at a time")


# --- --device ---------------------------------------------------------------------------------------------


def test_device_choice(monkeypatch):
    assert pipeline.pick_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pipeline.pick_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pipeline.pick_device("auto") == "cuda"


def test_device_cuda_without_cuda_is_one_line_exit_2(data, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["audit", "--model", data["cnn"], "--train", data["train"], "--test", data["test"], "--device", "cuda",
                 "--out", str(tmp_path / "a.pdf")])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA device" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


class _Stop(Exception):
    pass


def test_model_and_data_move_to_the_device_before_the_jacobians(data, tmp_path, monkeypatch):  # noqa: F811
    """On torch's meta device, which refuses to mix with the CPU (an exported program: a TorchScript module's
    parameters cannot be re-created on meta, though `.to("cuda")` moves them in place)."""
    torch.manual_seed(0)
    path = tmp_path / "cnn.pt2"
    ep = torch.export.export(CNN().eval(), (torch.rand(2, 1, 28, 28),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(ep, str(path))
    seen = {}

    def stop(net, t, cfg):
        seen["t"], seen["net"] = t, net
        raise _Stop

    monkeypatch.setattr(pipeline, "pick_device", lambda requested: "meta")
    monkeypatch.setattr(pipeline, "estimate_network", stop)
    monkeypatch.setattr(binding, "choose_projection", lambda *a, **k: (None, "exact (test)"))
    monkeypatch.setattr(binding.StructuredJacobian, "build", lambda *a: (None, "its probe reads values (.item())"))
    cfg = pipeline.AuditConfig(model=str(path), train=data["train"], test=data["test"], n=40, n_test=20,
                               reference=False)
    with pytest.raises(_Stop):
        pipeline.run_audit(cfg)
    t = seen["t"]
    assert {v.device.type for v in (t.x_train, t.y_train, t.x_test, t.y_test)} == {"meta"}
    assert {p.device.type for p in seen["net"].model.parameters()} == {"meta"}
    assert seen["net"].provider.jac.device.type == "meta"  # the Jacobians are made there


def _numbers(rec: object, path: str = "") -> dict[str, object]:
    """Every leaf of a record by its path, without what differs between two equal runs (times, memory, dates)."""
    if isinstance(rec, dict):
        out: dict[str, object] = {}
        for k, v in rec.items():
            if k in ("timings", "memory", "created", "seconds", "wall_s", "peak_rss_gib_after") or \
                    (path, k) == ("/config", "device"):
                continue
            out.update(_numbers(v, f"{path}/{k}"))
        return out
    if isinstance(rec, list):
        return {k: v for i, x in enumerate(rec) for k, v in _numbers(x, f"{path}/{i}").items()}
    if isinstance(rec, str):  # a text that quotes a time ("5,497 subsets (..., 12.3 min here)") quotes this run's clock
        return {path: re.sub(r"\b\d[\d,]*(?:\.\d+)? (?:min|s|h)\b", "<time>", rec)}
    return {path: rec}


def test_device_cpu_record_equals_the_default_run(data, tmp_path, capsys):  # noqa: F811
    recs = []
    for extra in ([], ["--device", "cpu"]):
        out = tmp_path / f"r{len(recs)}.pdf"
        code = main(["audit", "--model", data["cnn"], "--train", data["train"], "--test", data["test"], *SMALL,
                     "--no-reference", "--skip", "budget,poison", "--peers", "none", "--out", str(out), "--json",
                     *extra])
        assert code in (0, 3), capsys.readouterr().err
        recs.append(json.loads(out.with_suffix(".json").read_text()))
    assert recs[0]["device"]["used"] == recs[1]["device"]["used"] == "cpu"
    assert recs[1]["config"]["device"] == "cpu" and recs[0]["config"]["device"] == "auto"
    a, b = _numbers(recs[0]), _numbers(recs[1])
    assert a.keys() == b.keys()
    assert {k for k in a if a[k] != b[k] and not (isinstance(a[k], float) and np.isnan(a[k]) and np.isnan(b[k]))} \
        == set()
    path = recs[0]["panels"]["refit"]["path"]
    assert not path["stacked"] and "CPU" in path["reason"] and path["one_at_a_time_refits"] > 4


def test_a_model_below_the_accuracy_gate_runs_no_panel(data, tmp_path, capsys):  # noqa: F811
    from torchscript import script

    torch.manual_seed(3)
    path = tmp_path / "untrained.ts"
    with torch.no_grad():
        model = CNN().eval()
        model.fc.bias.copy_(torch.tensor([9.0] + [0.0] * 9))  # always class 0: below the gate
    script(model).save(str(path))
    out = tmp_path / "u.pdf"
    code = main(["audit", "--model", str(path), "--train", data["train"], "--test", data["test"], *SMALL,
                 "--no-reference", "--out", str(out), "--json", "--html"])
    assert code in (0, 3), capsys.readouterr().err
    rec = json.loads(out.with_suffix(".json").read_text())
    pan = rec["panels"]
    assert pan["run"] == [] and "refit" not in pan and "validity" not in pan and "budget" not in pan
    assert pan["skipped"]["panels"] == ["budget", "poison", "validity", "outcome"]
    assert "has not learnt the task" in pan["skipped"]["reason"]
    assert rec["risk"]["level"] == "not measurable"
    assert "Panels not run" in out.with_suffix(".html").read_text()
