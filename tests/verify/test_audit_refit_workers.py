"""Re-fits on the CPU in worker processes (`--refit-workers`) and in channels-last layout: the pooled re-fits equal
the re-fits of one process bit for bit, the channels-last re-fit equals the default layout's to float32 rounding and
puts the saved weights back as they were, a failing pool falls back and says why, and SIGTERM ends every worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import F32_ACCUMULATED
from torch import nn

from verify.audit import refit as refit_mod
from verify.audit.modelio import FlatInput
from verify.audit.refit import RefitConfig, RefitJob, Refitter

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (1, 12, 12)
D = 144


class PoolCNN(nn.Module):
    """Convolution, max-pooling, a linear head: the layers whose CPU kernels the layout changes."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.c2(h)), 2)
        return self.fc(h.flatten(1))


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(D, 24), nn.Tanh(), nn.Linear(24, 3)).eval()
    return PoolCNN().eval()


def _jobs(n: int = 70, count: int = 6) -> tuple[torch.Tensor, torch.Tensor, list[RefitJob]]:
    g = torch.Generator().manual_seed(1)
    x, y, xt = torch.rand(n, D, generator=g), torch.randint(0, 3, (n,), generator=g), torch.rand(9, D, generator=g)
    rng = np.random.default_rng(0)
    keeps = [torch.as_tensor(np.sort(rng.choice(n, n - 7, replace=False))) for _ in range(count)]
    return x, y, [RefitJob(x, y, m % 3, {"test": xt, "train": x}, keeps[m]) for m in range(count)]


def _refitter(model: nn.Module, workers: int) -> Refitter:
    cfg = RefitConfig(epochs=3, lr=1e-2, batch_size=16, stack="off", workers=workers)
    return Refitter.for_module(model, FlatInput(model, SHAPE), cfg, 3, SHAPE)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's thread count: the in-process re-fit is then the worker's, bit for bit
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_pooled_refits_equal_the_refits_of_one_process_bit_for_bit(kind: str):
    model = _model(kind)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, _, jobs = _jobs()
    pooled, alone = _refitter(model, 2), _refitter(model, 1)
    got, want = pooled.outputs_many(jobs), alone.outputs_many(jobs)
    for g, w in zip(got, want, strict=True):
        for k in w:
            assert np.array_equal(g[k], w[k])
    assert not np.array_equal(got[0]["test"], got[1]["test"])  # other subsets and seeds: other models
    assert not multiprocessing.active_children()  # the pool ended with the call
    path = pooled.describe_path()
    assert (path["workers"], path["worker_refits"], pooled.count) == (2, 6, 6)
    assert "2 worker processes" in path["workers_reason"]
    assert alone.describe_path()["workers_reason"] == "--refit-workers 1"
    for k, v in model.state_dict().items():  # the saved model is untouched in this process
        assert torch.equal(v, before[k])


def test_a_channels_last_refit_equals_the_default_layouts_and_puts_the_weights_back(monkeypatch):
    model = _model("cnn")
    layout = {k: v.stride() for k, v in model.named_parameters()}
    values = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y, jobs = _jobs(count=3)
    fast = _refitter(model, 1)
    assert len(fast._channels_last()) == 2  # both convolutions' weights
    got = fast.outputs_many(jobs)
    for k, v in model.named_parameters():
        assert v.stride() == layout[k] and torch.equal(v, values[k])
    monkeypatch.setattr(Refitter, "_channels_last", lambda self: [])
    want = _refitter(model, 1).outputs_many(jobs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g["test"], w["test"], rtol=F32_ACCUMULATED, atol=F32_ACCUMULATED)
    assert any(not np.array_equal(g["test"], w["test"]) for g, w in zip(got, want, strict=True))  # another path
    with fast.fitted(x, y, 0):  # inside a re-fit the weights are channels-last
        assert all(p.is_contiguous(memory_format=torch.channels_last) for p in fast._channels_last())


def _boom(i: int):
    raise RuntimeError("worker down")


def test_a_failing_pool_leaves_the_refits_to_this_process_and_says_why(monkeypatch):
    model = _model("mlp")
    _, _, jobs = _jobs(count=4)
    want = _refitter(model, 1).outputs_many(jobs)
    monkeypatch.setattr(refit_mod, "_pool_run", _boom)
    ref = _refitter(model, 2)
    got = ref.outputs_many(jobs)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g["test"], w["test"])
    path = ref.describe_path()
    assert path["worker_refits"] == 0 and path["workers"] == 1 and ref.count == 4
    assert path["workers_reason"].startswith("the worker processes failed (RuntimeError: worker down)")


def test_bad_worker_counts_are_one_line_errors(capsys):
    from ntkm.errors import UserInputError

    for bad in (0, refit_mod.WORKERS_MAX + 1):
        with pytest.raises(UserInputError, match="--refit-workers must be from 1 to"):
            RefitConfig(workers=bad)
    assert 1 <= refit_mod.default_workers() <= refit_mod.WORKERS_MAX

    from verify.cli import main

    # the command's one-line error, before any file is read
    assert main(["audit", "--model", "absent.pt2", "--train", "a.npz", "--test", "b.npz", "--refit-workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--refit-workers must be from 1 to" in err[0]


def test_the_default_worker_count_follows_a_containers_cpu_quota(tmp_path: Path):
    cpu_max = tmp_path / "cpu.max"
    cores = len(os.sched_getaffinity(0))
    cpu_max.write_text("100000 100000\n")  # one CPU's worth of time
    assert refit_mod.default_workers(cpu_max) == 1
    cpu_max.write_text("max 100000\n")  # no quota: the cores this process may use
    assert refit_mod.default_workers(cpu_max) == min(cores, refit_mod.WORKERS_MAX)
    assert refit_mod.default_workers(tmp_path / "absent") == min(cores, refit_mod.WORKERS_MAX)


CHILD = """
import sys, torch
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
sys.path.insert(0, {here!r})
from ntkm import interrupts
from test_audit_refit_workers import _jobs, _model, _refitter
interrupts.install()
torch.set_num_threads(1)
ref = _refitter(_model("cnn"), 2)
ref.cfg = ref.cfg.__class__(epochs=400, lr=1e-2, batch_size=16, stack="off", workers=2)
_, _, jobs = _jobs(count=8)
print("started", flush=True)
try:
    ref.outputs_many(jobs)
except KeyboardInterrupt:
    sys.exit(143)
"""


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.skipif(sys.platform != "linux", reason="worker processes are forked on Linux only")
def test_sigterm_ends_the_refit_workers_within_seconds(tmp_path: Path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), here=str(ROOT / "tests" / "verify")))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "NTKM_PROGRESS": "0"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 60
    while len(_group_alive(proc.pid)) < 3 and time.monotonic() < deadline:  # the parent and its two workers
        time.sleep(0.1)
    assert len(_group_alive(proc.pid)) >= 3
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    while _group_alive(proc.pid) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "a worker outlived its command"


EXPORTED = """
import sys
sys.path[:0] = [{root!r}, {tests!r}, {here!r}]
import torch
from test_audit_refit_workers import SHAPE, _jobs, _refitter
from verify.audit.modelio import FlatInput, load_model
loaded = load_model({path!r}).module
FlatInput(loaded, SHAPE)(torch.rand(4, 144)).sum().backward()  # the model check's backward
refitter = _refitter(loaded, 2)
refitter.outputs_many(_jobs()[2])
path = refitter.describe_path()
print(path["worker_refits"], path["workers_reason"])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="worker processes are forked on Linux only")
def test_a_model_read_from_a_pt2_keeps_its_refit_workers(tmp_path: Path):
    """The re-fits of a `.pt2` model run in the worker processes after a backward through it (a fresh process: the
    engine's state is per process). In torch's CUDA builds reading a `.pt2` used to mark the process so that the
    workers' first backward failed and the re-fits fell back to one process (`modelio.keep_forkable`); this CPU build
    never marks it, so here the test guards the path, and it fails without the fix under 2.14.1+cu130."""
    path = tmp_path / "cnn.pt2"  # exported here: the audit reads a file that another process wrote
    batch = {"x": {0: torch.export.Dim("batch")}}
    torch.export.save(torch.export.export(_model("cnn"), (torch.rand(4, *SHAPE),), dynamic_shapes=batch), path)
    script = tmp_path / "exported.py"
    script.write_text(EXPORTED.format(root=str(ROOT), tests=str(ROOT / "tests"), here=str(ROOT / "tests" / "verify"),
                                      path=str(path)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NTKM_PROGRESS": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    count, reason = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) == 6, reason
