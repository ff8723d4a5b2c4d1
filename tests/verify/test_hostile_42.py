"""Issue 42: hostile files cannot delete, hang or mislead.

Manifest paths are confined to their output folder and outputs never land in the installed package; no pattern
backtracks on untrusted text and special files (FIFOs) are refused wherever a file is read; broken models are
"not measurable" (one line, exit 2), never a risk level; `.npy` headers are checked before allocation; non-finite
interval ends are JSON null with a reason. Cases that could hang run `python -m verify` in a subprocess with a
timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from empirics.intervals import fieller, t_interval
from ntkm.codec import NULL_END_KEY, public, read_json
from ntkm.errors import UserInputError
from ntkm.io import json_depth, parse_json, read_regular
from verify.cli import main
from verify.outputs import MANIFEST, MANIFEST_FORMAT, check_output_dir, output_set, read_manifest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--n", "30", "--n-test", "10", "--tau", "0.2", "--steps", "1", "--baseline-seeds", "2", "--hessian-iters",
        "2", "--top-k", "2", "--no-reference"]
#: 240 KB of an unterminated string of escaped quotes: quadratic for the old string pattern.
QUOTES = b'"' + b'\\"' * 120_000


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    torch.set_num_threads(2)


def _cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "NTKM_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "verify", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _main(args: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


# --- 1. paths read from files stay inside their folder; outputs never land in the package -------------------------


def _manifest(folder: Path, files: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}))


def test_claims_resume_refuses_a_manifest_path_outside_the_folder(tmp_path: Path):
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    _manifest(out, ["figures/../../victim.txt", "figures/a.png"])
    r = _cli(["claims", "--resume", "--only", "thm4.1", "--out", str(out), "--no-pdf"])
    assert r.returncode == 2, r.stderr
    assert "not a file inside" in _one_line(r.stderr)
    assert victim.read_text() == "keep"
    assert not (out / "cache").exists()  # refused before any work


@pytest.mark.parametrize("listed", ["/etc/passwd", "../victim.txt", "figures/../../victim.txt", ".", "a//b"])
def test_manifest_paths_outside_or_unnormalised_are_refused(listed: str, tmp_path: Path):
    out = tmp_path / "out"
    _manifest(out, [listed])
    with pytest.raises(UserInputError, match="not a file inside") as err:
        read_manifest(out)
    assert "\n" not in str(err.value)


def test_a_manifest_path_through_a_link_out_of_the_folder_is_refused(tmp_path: Path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "a.png").write_text("user's")
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").symlink_to(outside)
    _manifest(out, ["figures/a.png"])
    with pytest.raises(UserInputError, match="not a file inside"):
        read_manifest(out)
    (out / MANIFEST).unlink()
    with pytest.raises(UserInputError, match="would move"), output_set(out, ["figures"], folders=["figures"]) as s:
        (s.path("figures")).mkdir()
        (s.path("figures") / "b.png").write_text("new")
    assert sorted(p.name for p in outside.iterdir()) == ["a.png"]


def test_a_fifo_manifest_is_refused_not_read(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / MANIFEST)
    with pytest.raises(UserInputError, match="named pipe"):
        read_manifest(out)


@pytest.mark.parametrize("inside", ["verify/schemas", "ntkm", "reports/templates"])
def test_outputs_never_land_in_the_installed_package(inside: str):
    with pytest.raises(UserInputError, match="installed package"):
        check_output_dir(ROOT / inside)


def test_audit_out_inside_the_package_is_refused_and_the_schema_untouched(data: dict, capsys):
    schema = ROOT / "verify" / "schemas" / "audit.schema.json"
    before = schema.read_bytes()
    code, err = _main(["audit", "--model", str(data["cnn"]), "--train", str(data["train"]), "--test",
                       str(data["test"]), *TINY, "--out", str(schema.with_suffix(".pdf")), "--json"], capsys)
    assert code == 2 and "installed package" in _one_line(err)
    assert schema.read_bytes() == before and not schema.with_suffix(".pdf").exists()


def test_claims_out_inside_the_package_is_refused(capsys):
    code, err = _main(["claims", "--only", "thm4.1", "--out", str(ROOT / "verify" / "claims_out")], capsys)
    assert code == 2 and "installed package" in _one_line(err)
    assert not (ROOT / "verify" / "claims_out").exists()


# --- 2. no backtracking on untrusted text; special files refused ------------------------------------------------


def test_json_depth_is_linear_on_escaped_quotes():
    t0 = time.perf_counter()
    assert json_depth(QUOTES) == 0
    assert json_depth(QUOTES * 4) == 0
    assert time.perf_counter() - t0 < 2
    assert json_depth('[1, {"a": "[[\\"[", "b": [2]}]') == 3
    assert json_depth('"\\\\"[[]]') == 2  # an escaped backslash ends the string
    with pytest.raises(json.JSONDecodeError):
        parse_json(QUOTES)


def test_read_json_checks_type_and_size_before_reading(tmp_path: Path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(UserInputError, match="more than"):
        read_json(big, limit=100)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(UserInputError, match="named pipe"):
        read_regular(fifo)
    with pytest.raises(UserInputError, match="folder"):
        read_regular(tmp_path)
    with pytest.raises(UserInputError, match="character device"):
        read_regular("/dev/zero")


@pytest.fixture(scope="module")
def claims_run(tmp_path_factory) -> dict:
    """One finished `verify claims --only thm4.1` (its cache entry's name and text)."""
    d = tmp_path_factory.mktemp("claims")
    r = _cli(["claims", "--only", "thm4.1", "--out", str(d / "out"), "--no-pdf"], timeout=120)
    assert r.returncode == 0, r.stderr
    (entry,) = (d / "out" / "cache").glob("*.json")
    return {"dir": d, "entry": entry.name, "text": entry.read_bytes()}


def _fresh(claims_run: dict, name: str) -> Path:
    out = claims_run["dir"] / name
    (out / "cache").mkdir(parents=True)
    return out


def test_a_fifo_as_the_cache_entry_with_resume_is_refused(claims_run: dict):
    out = _fresh(claims_run, "fifo-entry")
    os.mkfifo(out / "cache" / claims_run["entry"])
    r = _cli(["claims", "--resume", "--only", "thm4.1", "--out", str(out), "--no-pdf"])
    assert r.returncode == 2 and "named pipe" in _one_line(r.stderr)


def test_a_stray_fifo_in_the_cache_folder_of_a_fresh_run_is_refused(claims_run: dict):
    out = _fresh(claims_run, "fifo-stray")
    os.mkfifo(out / "cache" / "notes.json")
    r = _cli(["claims", "--only", "thm4.1", "--out", str(out), "--no-pdf"])
    assert r.returncode == 2 and "notes.json is a named pipe" in _one_line(r.stderr)


def test_escaped_quotes_as_a_cache_entry_are_recomputed_quickly(claims_run: dict):
    out = _fresh(claims_run, "quotes-entry")
    entry = out / "cache" / claims_run["entry"]
    entry.write_bytes(QUOTES)
    r = _cli(["claims", "--resume", "--only", "thm4.1", "--out", str(out), "--no-pdf"])
    assert r.returncode == 0, r.stderr
    assert json.loads(entry.read_bytes())["unit"]


def test_escaped_quotes_as_claims_json_or_audit_old_are_one_line(tmp_path: Path):
    bad = tmp_path / "claims.json"
    bad.write_bytes(QUOTES)
    r = _cli(["report", str(bad), "--out", str(tmp_path / "r")])
    assert r.returncode == 2 and "not valid JSON" in _one_line(r.stderr)
    r = _cli(["audit", "diff", str(bad), str(bad)])
    assert r.returncode == 2 and "OLD" in _one_line(r.stderr)


def test_fifo_as_a_record_is_refused(tmp_path: Path):
    fifo = tmp_path / "rec.json"
    os.mkfifo(fifo)
    for args in (["report", str(fifo)], ["audit", "diff", str(fifo), str(fifo)],
                 ["audit", "--render", str(fifo), "--out", str(tmp_path / "a.pdf")]):
        r = _cli(args)
        assert r.returncode == 2 and "named pipe" in _one_line(r.stderr), args


# --- 3. models that cannot be audited ---------------------------------------------------------------------------


class Linear(nn.Module):
    def __init__(self, outputs: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(784, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class NoGrad(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.fc(x.flatten(1))


class Detached(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)).detach()


class NoGradHead(Linear):
    """Features with autograd, logits under no_grad (the third variant)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1) * 1.0
        with torch.no_grad():
            out = self.fc(h)
        return out


class NoParams(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :10] * 2.0


class NanUnderAutograd(Linear):
    """Finite without autograd, NaN while gradients are recorded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        if torch.is_grad_enabled():
            return out * float("nan")
        return out


class FailsLater(Linear):
    """Raises after its first `limit` calls."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.calls = 0
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.limit:
            raise RuntimeError("the model broke mid-run")
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    from empirics.data.datasets import DataRequest, load_dataset

    d = tmp_path_factory.mktemp("h42")
    ds = load_dataset("mnist", n_train=40, n_test=10, request=DataRequest(source="bundled"))
    np.savez(d / "train.npz", x=ds.x_train.reshape(-1, 1, 28, 28), y=ds.y_train)
    np.savez(d / "test.npz", x=ds.x_test.reshape(-1, 1, 28, 28), y=ds.y_test)
    torch.manual_seed(0)
    models = {"cnn": Linear(), "nograd": NoGrad(), "detached": Detached(), "nograd_head": NoGradHead(),
              "noparams": NoParams(), "nan_autograd": NanUnderAutograd(), "wide": Linear(20_000),
              "fails_later": FailsLater(12)}
    paths = {}
    for name, m in models.items():
        paths[name] = d / f"{name}.ts"
        torch.jit.script(m.eval()).save(str(paths[name]))
    return {"dir": d, "train": d / "train.npz", "test": d / "test.npz", **paths}


def _audit(data: dict, model: str, *extra: str) -> list[str]:
    return ["audit", "--model", str(data[model]), "--train", str(data["train"]), "--test", str(data["test"]), *TINY,
            "--skip", "budget,poison,validity,outcome", "--out", str(data["dir"] / f"{model}.pdf"), *extra]


@pytest.mark.parametrize("model", ["nograd", "detached", "nograd_head", "noparams", "nan_autograd", "fails_later"])
def test_a_model_that_cannot_be_audited_is_not_measurable(model: str, data: dict, capsys):
    code, err = _main(_audit(data, model), capsys)
    line = _one_line(err)
    assert code == 2 and "not measurable" in line, line
    assert not (data["dir"] / f"{model}.pdf").exists() and not (data["dir"] / f"{model}.json").exists()


def test_outputs_not_matching_the_classes_are_refused_before_kernel_work(data: dict):
    r = _cli(_audit(data, "wide"), timeout=60)
    assert r.returncode == 2 and "20000 outputs" in _one_line(r.stderr)


def test_parameters_beyond_the_memory_budget_are_one_line(data: dict, capsys):
    code, err = _main(_audit(data, "cnn", "--max-memory-gb", "0.0001"), capsys)
    assert code == 2 and "parameters" in _one_line(err)


# --- 4. data headers checked before allocation --------------------------------------------------------------------


def _npy(arr: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


def test_npy_headers_and_pickles_in_a_train_npz_are_one_line(data: dict, tmp_path: Path, capsys):
    y = np.arange(40) % 10
    pickled = tmp_path / "pickle.npz"
    with zipfile.ZipFile(pickled, "w") as z:
        z.writestr("x.npy", pickle.dumps(b"not an array" * 100))
        z.writestr("y.npy", _npy(y))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10**9, 1, 28, 28)})
    huge = tmp_path / "huge.npz"
    with zipfile.ZipFile(huge, "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 4096)
        z.writestr("y.npy", _npy(y))
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    for path, match in ((pickled, "not a NumPy array"), (huge, "declares shape"), (fifo, "named pipe")):
        code, err = _main(["audit", "--model", str(data["cnn"]), "--train", str(path), "--test", str(data["test"]),
                           *TINY, "--out", str(tmp_path / "a.pdf")], capsys)
        assert code == 2 and match in _one_line(err), err


def test_a_fifo_as_the_model_or_an_idx_file_is_one_line(data: dict, tmp_path: Path, capsys):
    os.mkfifo(tmp_path / "model.ts")
    code, err = _main(["audit", "--model", str(tmp_path / "model.ts"), "--train", str(data["train"]), "--test",
                       str(data["test"]), *TINY, "--out", str(tmp_path / "a.pdf")], capsys)
    assert code == 2 and "named pipe" in _one_line(err)
    from empirics.data.idx import read_idx_bytes

    with pytest.raises(UserInputError, match="named pipe"):
        read_idx_bytes(tmp_path / "model.ts")


# --- 5. non-finite interval ends -----------------------------------------------------------------------------------


def test_non_finite_interval_ends_are_null_with_a_reason(tmp_path: Path):
    from verify.commands._common import emit_json

    rec = {"one_seed": t_interval([0.3]), "none": t_interval([float("nan"), float("nan")]),
           "ratio": fieller([1.0, 2.0, 3.0], [0.1, -0.1, 0.05]), "slope": {"ci": [float("-inf"), 1.0], "seeds": 1},
           "fine": t_interval([1.0, 2.0, 3.0])}
    emit_json(str(tmp_path / "r.json"), rec)
    text = (tmp_path / "r.json").read_text()
    assert '"-inf"' not in text and '"inf"' not in text
    doc = json.loads(text)
    for key in ("one_seed", "none", "ratio"):
        assert doc[key]["lo"] is None and doc[key]["hi"] is None and doc[key][NULL_END_KEY]
    assert doc["slope"]["ci"] == [None, 1.0] and "1 finite" in doc["slope"][NULL_END_KEY]
    assert NULL_END_KEY not in doc["fine"] and doc["fine"]["lo"] < doc["fine"]["hi"]
    assert public({"lo": 1.0, "hi": 2.0}) == {"lo": 1.0, "hi": 2.0}


# --- other one-line refusals ---------------------------------------------------------------------------------------


def test_a_249_character_out_with_summary_is_one_line(data: dict, tmp_path: Path, capsys):
    out = tmp_path / ("x" * 245 + ".pdf")
    code, err = _main(["audit", "--model", str(data["cnn"]), "--train", str(data["train"]), "--test",
                       str(data["test"]), *TINY, "--out", str(out), "--summary"], capsys)
    assert code == 2 and "shorter --out" in _one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("device", ["meta", "cpux", "cuda:x"])
def test_a_device_without_data_is_one_line(device: str, tmp_path: Path, capsys):
    code, err = _main(["claims", "--only", "thm4.1", "--device", device, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "use cpu or cuda" in _one_line(err)


def test_an_unwritable_cache_folder_is_refused_before_any_work(tmp_path: Path):
    """`--out` writable but its cache/ immutable: refused in one line before a unit runs (the set was written and the
    run ended with exit 2 after the work was lost)."""
    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)
    if subprocess.run(["chattr", "+i", str(out / "cache")], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        r = _cli(["claims", "--resume", "--only", "thm4.1", "--out", str(out), "--no-pdf"])
    finally:
        subprocess.run(["chattr", "-i", str(out / "cache")], capture_output=True)
    assert r.returncode == 2, r.stderr
    assert "cache folder" in _one_line(r.stderr)
    assert not (out / "claims.json").exists()


@pytest.mark.parametrize("error", [MemoryError("no room"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 8589934592 bytes.")])
def test_an_allocation_that_fails_is_one_line(error: Exception, monkeypatch, capsys):
    """An 80 M-parameter model under an 8 GB limit failed in torch's allocator with a traceback; whatever runs out of
    memory past the up-front checks ends in one line, exit 2."""
    import verify.commands.theory as theory_cmd

    def boom(args):
        raise error

    monkeypatch.setattr(theory_cmd, "run", boom)
    code, err = _main(["theory"], capsys)
    assert code == 2 and "ran out of memory" in _one_line(err)


def test_ctrl_c_during_pdf_rendering_is_never_lost(tmp_path: Path):
    """Issue 42 item 6: SIGINT while weasyprint renders the PDF (the HTML already staged) ends the command with 130,
    one line, no report in the folder and no staging folder left; a user's own file beside it untouched."""
    import signal

    rec = ROOT / "results" / "claims-quick.json"
    (tmp_path / "claims.json").write_bytes(rec.read_bytes())
    (tmp_path / "mine.txt").write_text("the user's")
    proc = subprocess.Popen([sys.executable, "-m", "verify", "report", str(tmp_path / "claims.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "NTKM_PROGRESS": "0"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(tmp_path.glob(".outputs-*/new/claims.html")):  # the HTML is staged: the PDF is being rendered
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the report ended before its PDF could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "interrupt" in err.lower(), err
    assert not (tmp_path / "claims.pdf").exists() and not (tmp_path / "claims.html").exists()
    assert not list(tmp_path.glob(".outputs-*")) and (tmp_path / "mine.txt").read_text() == "the user's"
