"""The bad-input battery: every command, fed bad models, data files, options, paths, signals and a full
disk, answers with one line on stderr, the documented exit code (README: 2 bad input, 130 SIGINT, 143
SIGTERM), no traceback, no payload run and no partial outputs.

Most cases call `verify.cli.main` in-process (the same code path as the `verify` script, without
paying torch's import per case); the signal cases run `python -m verify` in a subprocess. The
disk-full case mounts a 256 KiB tmpfs when the machine allows it (root with mount rights), else it
is skipped and the ENOSPC case below covers the same path with a monkeypatched write.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from empirics.datasets import load_dataset
from ntkm.errors import UserInputError
from verify.cli import main
from verify.outputs import check_output_dir, output_set
from verify.runner import Cache, Unit

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--n", "30", "--n-test", "10", "--tau", "0.2", "--steps", "1", "--baseline-seeds", "2", "--hessian-iters",
        "2", "--top-k", "2", "--no-reference"]


class Payload:
    """Unpickling this would run `touch MARKER`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class CNN(nn.Module):
    def __init__(self, bn: bool = False) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 4, 5, stride=3)
        self.bn = nn.BatchNorm2d(4) if bn else nn.Identity()
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.c(x))).flatten(1))


class Cube(nn.Module):
    """Returns (n, 10, 10): not logits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)).reshape(-1, 10, 10)


class SmallBatchesOnly(nn.Module):
    """Fails (or returns NaN) on batches larger than 8: passes a two-example check, fails real work."""

    def __init__(self, nan: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.nan = nan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        if x.shape[0] > 8:
            if self.nan:
                return out * float("nan")
            raise RuntimeError("batch too large for this model")
        return out


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NTKM_PROGRESS", "0")
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """Tiny data, models in every format (good and bad) and one finished audit to re-render."""
    d = tmp_path_factory.mktemp("bad")
    ds = load_dataset("mnist", n_train=40, n_test=10, source="bundled")
    x = ds.x_train.reshape(-1, 1, 28, 28)
    np.savez(d / "train.npz", x=x, y=ds.y_train)
    np.savez(d / "test.npz", x=ds.x_test.reshape(-1, 1, 28, 28), y=ds.y_test)
    np.savez(d / "zeros.npz", x=np.zeros_like(x), y=ds.y_train)
    np.savez(d / "label10.npz", x=x, y=np.full(len(x), 10))
    np.savez(d / "label-1.npz", x=x, y=np.full(len(x), -1))
    np.savez(d / "scalar_y.npz", x=x, y=np.int64(3))
    np.savez(d / "flat_x.npz", x=x.reshape(-1)[:784], y=ds.y_train[:1])
    torch.manual_seed(0)
    torch.jit.script(CNN().eval()).save(str(d / "cnn.ts"))
    torch.jit.script(CNN(bn=True).train()).save(str(d / "bn_train.ts"))
    torch.jit.script(Cube().eval()).save(str(d / "cube.ts"))
    torch.jit.script(SmallBatchesOnly(False).eval()).save(str(d / "small_raise.ts"))
    torch.jit.script(SmallBatchesOnly(True).eval()).save(str(d / "small_nan.ts"))
    ep = torch.export.export(CNN().eval(), (torch.rand(2, 1, 28, 28),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(ep, str(d / "cnn.pt2"))
    marker = d / "MARKER"
    payload = pickle.dumps(Payload(marker), protocol=2)
    _evil_pt2(d / "cnn.pt2", d / "evil_weight.pt2", payload)
    _evil_pt2_program(d / "cnn.pt2", d / "evil_expr.pt2", marker, "expr")
    _evil_pt2_program(d / "cnn.pt2", d / "evil_target.pt2", marker, "target")
    with zipfile.ZipFile(d / "cnn.ts") as zin, zipfile.ZipFile(d / "evil.ts", "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, payload if info.filename.endswith("constants.pkl") else zin.read(info))
    torch.save({"w": Payload(marker)}, d / "evil_state.pt")
    (d / "a_file").write_text("not a folder\n")
    (d / "idx").mkdir()
    (d / "idx" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    (d / "idx" / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01")
    (d / "truncated.npz").write_bytes((d / "train.npz").read_bytes()[:300])
    for split in ("train", "test"):
        (d / "imgs" / split / "cat").mkdir(parents=True)
        (d / "imgs" / split / "cat" / "a.png").write_bytes(b"\x89PNG not really")
    out = d / "first" / "audit.pdf"
    out.parent.mkdir()
    code = main(["audit", "--model", str(d / "cnn.ts"), "--train", str(d / "train.npz"), "--test",
                 str(d / "test.npz"), *TINY, "--out", str(out), "--json"])
    assert code == 0
    (d / "wrong_audit.json").write_text(json.dumps({"experiment": "audit", "models": {}}))
    (d / "claims_like.json").write_text(json.dumps({"claims": "nope", "summary": {}}))
    (d / "claims_rows.json").write_text(json.dumps({"claims": [{"id": "x"}], "summary": {}}))
    (d / "broken.json").write_text("{not json")
    (d / "claims_min.json").write_text(json.dumps({"claims": [{"id": "x", "verdict": "holds"}], "summary": {}}))
    return {"dir": d, "marker": marker, "audit_json": out.with_suffix(".json")}


def _evil_pt2(src: Path, dst: Path, payload: bytes) -> None:
    """A .pt2 whose first weight is declared a pickle (torch.export.load would unpickle it unrestricted)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("model_weights_config.json"):
                cfg = json.loads(data)
                first = next(iter(cfg["config"].values()))
                first["use_pickle"] = True
                zout.writestr(info.filename.replace("model_weights_config.json", first["path_name"]) + "_p",
                              payload)
                data = json.dumps(cfg).encode()
            zout.writestr(info.filename, data)


def _evil_pt2_program(src: Path, dst: Path, marker: Path, kind: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("models/model.json"):
                doc = json.loads(data)
                g = doc["graph_module"]["graph"]
                if kind == "expr":
                    first = next(iter(g["tensor_values"].values()))
                    first["sizes"][0] = {"as_expr": {"expr_str": f"__import__('os').system('touch {marker}')",
                                                     "hint": None}}
                else:
                    g["nodes"][0]["target"] = "torch.serialization.os.system"
                data = json.dumps(doc).encode()
            zout.writestr(info.filename, data)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- the table -------------------------------------------------------------------------------------------------

M, TR, TE = "{d}/cnn.ts", "{d}/train.npz", "{d}/test.npz"
AUD = ["audit", "--model", M, "--train", TR, "--test", TE]

CASES: dict[str, tuple[list[str], int, str]] = {
    # models that would run code, and models that break the input contract
    "pt2 pickled weight": (["audit", "--model", "{d}/evil_weight.pt2", "--train", TR, "--test", TE], 2,
                           "stored as a pickle"),
    "pt2 shape expression": (["audit", "--model", "{d}/evil_expr.pt2", "--train", TR, "--test", TE], 2,
                             "shape expression"),
    "pt2 foreign target": (["audit", "--model", "{d}/evil_target.pt2", "--train", TR, "--test", TE], 2,
                           "not a torch operator"),
    "torchscript payload": (["audit", "--model", "{d}/evil.ts", "--train", TR, "--test", TE], 2, "nothing in it ran"),
    "state dict payload": (["audit", "--model", "{d}/evil_state.pt", "--train", TR, "--test", TE], 2,
                           "nothing in it ran"),
    "training mode": (["audit", "--model", "{d}/bn_train.ts", "--train", TR, "--test", TE], 2, r"model\.eval\(\)"),
    "(n, 10, 10) outputs": (["audit", "--model", "{d}/cube.ts", "--train", TR, "--test", TE], 2,
                            r"\(n, classes\)"),
    "fails on big batches": (["audit", "--model", "{d}/small_raise.ts", "--train", TR, "--test", TE], 2,
                             "fails on a batch of"),
    "NaN on big batches": (["audit", "--model", "{d}/small_nan.ts", "--train", TR, "--test", TE], 2, "NaN or Inf"),
    "missing model": (["audit", "--model", "{d}/nope.ts", "--train", TR, "--test", TE], 2, "does not exist"),
    # data
    "label 10": (["audit", "--model", M, "--train", "{d}/label10.npz", "--test", TE], 2, "label 10 is out of range"),
    "label -1": (["audit", "--model", M, "--train", "{d}/label-1.npz", "--test", TE], 2, "label -1 is out of range"),
    "scalar y": (["audit", "--model", M, "--train", "{d}/scalar_y.npz", "--test", TE], 2, "single value"),
    "1-D x": (["audit", "--model", M, "--train", "{d}/flat_x.npz", "--test", TE], 2, "one row per example"),
    "all-zero images": (["audit", "--model", M, "--train", "{d}/zeros.npz", "--test", TE], 2, "not measurable"),
    "data is a model": (["audit", "--model", M, "--train", M, "--test", TE], 2, "must be a NumPy .npz"),
    "corrupt IDX folder": (["audit", "--model", M, "--train", "{d}/idx", "--test", TE], 2, "idx"),
    "truncated npz": (["audit", "--model", M, "--train", "{d}/truncated.npz", "--test", TE], 2, "truncated.npz"),
    "broken image file": (["audit", "--model", M, "--train", "{d}/imgs", "--test", TE], 2, "a.png"),
    # options
    "eps nan": ([*AUD, "--eps", "nan"], 2, "--eps must be a finite number"),
    "tau inf": ([*AUD, "--tau", "inf"], 2, "--tau must be a finite number"),
    "memory nan": ([*AUD, "--max-memory-gb", "nan"], 2, "finite"),
    "bound-eps -inf": ([*AUD, "--bound-eps=-inf"], 2, "finite"),
    "ntk-distance lr nan": (["ntk-distance", "--lr", "nan"], 2, "--lr must be a finite number"),
    "landscape lr inf": (["landscape", "--lr", "inf"], 2, "--lr must be a finite number"),
    "kappa eps nan": (["kappa", "--eps", "nan"], 2, "--eps must be a finite number"),
    "unknown attack": ([*AUD, "--attack", "cw"], 2, "cw"),
    "unknown command": (["frobnicate"], 2, "invalid choice"),
    # output paths, checked before any work
    "audit out in /proc": ([*AUD, "--out", "/proc/verify-audit.pdf"], 2, "virtual file system"),
    "audit out in /sys": ([*AUD, "--out", "/sys/verify-audit.pdf"], 2, "virtual file system"),
    "audit out under a file": ([*AUD, "--out", "{d}/a_file/r.pdf"], 2, "a_file"),
    "audit out is a folder": ([*AUD, "--out", "{d}"], 2, "must end in .pdf|is a folder"),
    "theory json in /proc": (["theory", "--json", "/proc/theory.json"], 2, "virtual file system"),
    "theory json is a folder": (["theory", "--json", "{d}"], 2, "is a folder"),
    "kappa json in /sys": (["kappa", "--json", "/sys/kappa.json"], 2, "virtual file system"),
    "ntk-distance json in /proc": (["ntk-distance", "--json", "/proc/nd.json"], 2, "virtual file system"),
    "malleability json under a file": (["malleability", "--json", "{d}/a_file/m.json"], 2, "a_file"),
    "report out in /proc": (["report", "{d}/claims_min.json", "--out", "/proc/x"], 2, "virtual file system"),
    "report out is a file": (["report", "{d}/claims_min.json", "--out", "{d}/a_file"], 2, "is a file"),
    "report of an audit record": (["report", "{d}/first/audit.json"], 2, "not a claims record"),
    "data download dest in /proc": (["data", "download", "--dataset", "mnist", "--dest", "/proc/d"], 2,
                                    "virtual file system"),
    "claims out is a file": (["claims", "--out", "{d}/a_file", "--only", "thm4.1"], 2, "is a file"),
    "claims out in /proc": (["claims", "--out", "/proc/claims", "--only", "thm4.1"], 2, "virtual file system"),
    "claims out under a file": (["claims", "--out", "{d}/a_file/claims", "--only", "thm4.1"], 2, "a_file"),
    "ntk-distance plot in /sys": (["ntk-distance", "--plot", "/sys/nd.png"], 2, "virtual file system"),
    "landscape plot is a folder": (["landscape", "--plot", "{d}"], 2, "is a folder"),
    "ntk-distance plot folder missing": (["ntk-distance", "--plot", "{d}/nope/nd.png"], 2, "does not exist"),
    # saved records with the wrong structure
    "render wrong structure": (["audit", "--render", "{d}/wrong_audit.json", "--out", "{d}/first/r2.pdf"], 2,
                               "not an audit record this version can draw"),
    "render a claims record": (["audit", "--render", "{d}/claims_like.json", "--out", "{d}/first/r2.pdf"], 2,
                               "not an audit record"),
    "render broken JSON": (["audit", "--render", "{d}/broken.json", "--out", "{d}/first/r2.pdf"], 2, "not a JSON file"),
    "report claims not a list": (["report", "{d}/claims_like.json", "--out", "{d}/x"], 2, "list of claim rows"),
    "report rows lack verdict": (["report", "{d}/claims_rows.json", "--out", "{d}/x"], 2, "list of claim rows"),
    "report broken JSON": (["report", "{d}/broken.json", "--out", "{d}/x"], 2, "not valid JSON"),
    "report missing record": (["report", "{d}/none.json"], 2, "does not exist"),
    "data unknown action": (["data", "frob"], 2, "unknown action"),
    "data dir missing": (["data", "info", "--data-dir", "{d}/nope"], 2, "not a folder"),
    "claims unknown id": (["claims", "--only", "nope", "--out", "{d}/x"], 2, "unknown claim id"),
}


def _fill(args: list[str], d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in args]


def _snapshot(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def test_table_has_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_case(case: str, env, capsys):
    args, code, match = CASES[case]
    d = env["dir"]
    before = _snapshot(d)
    try:
        got = main(_fill(args, d))
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        got = exc.code
    err = capsys.readouterr().err
    assert got == code, err
    line = _one_line(err)
    assert re.search(match, line), line
    assert _snapshot(d) == before, "a bad input left files behind"
    assert not env["marker"].exists()


# --- output sets ----------------------------------------------------------------------------------------------


def _previous_set(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("a.json", "a.html", "a.pdf"):
        (folder / name).write_text(f"old {name}")


def test_output_set_replaces_the_whole_set_and_drops_stale_members(tmp_path: Path):
    _previous_set(tmp_path)
    with output_set(tmp_path, ("a.json", "a.html", "a.pdf", "figs")) as s:
        s.path("a.json").write_text("new")
        s.path("figs").mkdir()
        (s.path("figs") / "f.png").write_text("png")
    assert (tmp_path / "a.json").read_text() == "new" and (tmp_path / "figs" / "f.png").exists()
    assert not (tmp_path / "a.pdf").exists() and not (tmp_path / "a.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "figs"]
    assert s.final(s.dir / "a.json") == tmp_path / "a.json"


def test_audit_set_removes_earlier_audit_files_but_not_a_users_own(env, tmp_path: Path, capsys):
    (tmp_path / "r.json").write_text('{"experiment": "audit", "old": true}')
    (tmp_path / "r.html").write_text("<html>my own notes, not an audit</html>")
    assert main(["audit", "--render", str(env["audit_json"]), "--out", str(tmp_path / "r.pdf")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.pdf"]
    assert "my own notes" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_or_interrupted_set_leaves_the_previous_one(tmp_path: Path, exc: BaseException):
    _previous_set(tmp_path)
    with pytest.raises(type(exc)), output_set(tmp_path, ("a.json", "a.html", "a.pdf")) as s:
        s.path("a.json").write_text("new")
        raise exc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "a.pdf"]
    assert (tmp_path / "a.json").read_text() == "old a.json"


def test_full_disk_is_one_line_and_keeps_the_previous_set(tmp_path: Path, monkeypatch):
    """ENOSPC simulated (monkeypatched write); the real tmpfs case is below."""
    _previous_set(tmp_path)
    with pytest.raises(UserInputError, match="disk is full") as err, output_set(tmp_path, ("a.json",)) as s:
        raise OSError(errno.ENOSPC, "No space left on device", str(s.path("a.json")))
    assert "\n" not in str(err.value)
    assert (tmp_path / "a.json").read_text() == "old a.json"


def test_a_folder_the_set_created_is_removed_when_it_fails(tmp_path: Path):
    target = tmp_path / "new" / "deeper"
    with pytest.raises(RuntimeError), output_set(target, ("a.json",)) as s:
        s.path("a.json").write_text("x")
        raise RuntimeError
    assert not target.exists()


def test_check_output_dir_refuses_files_and_virtual_file_systems(tmp_path: Path):
    f = tmp_path / "f"
    f.write_text("x")
    for bad, match in ((f, "is a file"), (f / "sub", "is a file"), (Path("/proc/x"), "virtual"),
                       (Path("/sys/kernel"), "virtual"), (Path("/dev/shm/../null"), "virtual|file")):
        with pytest.raises(UserInputError, match=match):
            check_output_dir(bad)
    assert check_output_dir(tmp_path / "later") == tmp_path / "later"
    assert not (tmp_path / "later").exists()


def test_member_names_are_checked(tmp_path: Path):
    with pytest.raises(ValueError), output_set(tmp_path, ("a.json",)) as s:
        s.path("other.json")


def test_emit_json_write_error_is_one_line(tmp_path: Path, monkeypatch, capsys):
    import verify.commands._common as common

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common, "write_json", full)
    with pytest.raises(UserInputError, match="disk is full"):
        common.emit_json(str(tmp_path / "r.json"), {"a": 1})


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the ENOSPC case above simulates it")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here ({r.stderr.decode().strip()[:80]})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_real_full_disk_keeps_the_previous_audit_set(env, tiny_tmpfs: Path, capsys):
    for name in ("r.pdf", "r.html", "r.json"):
        (tiny_tmpfs / name).write_text(f"old {name}")
    (tiny_tmpfs / "filler").write_bytes(b"\0" * (200 * 1024))
    code = main(["audit", "--render", str(env["audit_json"]), "--out", str(tiny_tmpfs / "r.pdf"), "--json",
                 "--html"])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "disk is full" in line, line
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["filler", "r.html", "r.json", "r.pdf"]
    assert (tiny_tmpfs / "r.json").read_text() == "old r.json"


def test_rerender_replaces_a_stale_pdf(env, tmp_path: Path, capsys, monkeypatch):
    """A re-render that cannot make a PDF removes last run's PDF rather than leaving it beside new files."""
    import reports.render as render

    out = tmp_path / "r.pdf"
    assert main(["audit", "--render", str(env["audit_json"]), "--out", str(out)]) == 0
    assert out.exists()

    def broken(path, html):
        raise render.PdfUnavailable("weasyprint cannot load (libpango missing); install Pango")

    monkeypatch.setattr(render, "write_pdf", broken)
    assert main(["audit", "--render", str(env["audit_json"]), "--out", str(out)]) == 3
    capsys.readouterr()
    assert not out.exists() and out.with_suffix(".html").exists()


# --- the experiment cache ------------------------------------------------------------------------------------


def test_input_errors_are_not_cached_and_stop_the_run(tmp_path: Path):
    calls = []

    def missing(**kw):
        calls.append(kw)
        raise UserInputError("data folder /nope has no MNIST files; pass --data-dir")

    cache = Cache(tmp_path, version="v1")
    unit = Unit("kappa:mnist", {"n": 3}, missing)
    with pytest.raises(UserInputError, match="experiment kappa:mnist: data folder /nope"):
        cache.run(unit, lambda m: None)
    assert not cache.path(unit).exists()
    with pytest.raises(UserInputError):
        cache.run(unit, lambda m: None)
    assert len(calls) == 2


@pytest.mark.parametrize("content", ["[1, 2]", '{"code_version": "v1"}', '{"unit": "other", "code_version": "v1"}',
                                     '{"unit": "u", "code_version": "old"}', '{"unit": "u", "code_version": "v1", '
                                     '"unavailable": "no data"}', "{truncated", "EDITED"])
def test_cache_entries_failing_the_schema_are_recomputed(tmp_path: Path, content: str):
    cache = Cache(tmp_path, version="v1")
    unit = Unit("u", {"a": 1}, lambda a: {"value": a + 1})
    if content == "EDITED":
        cache.run(unit, lambda m: None)
        entry = json.loads(cache.path(unit).read_text())
        entry["value"] = 99
        content = json.dumps(entry)
    cache.path(unit).write_text(content)
    res, cached = cache.run(unit, lambda m: None)
    assert not cached and res.payload["value"] == 2
    assert cache.run(unit, lambda m: None)[1]


def test_concurrent_runs_compute_a_unit_once(tmp_path: Path):
    calls = []
    started = threading.Event()

    def slow(a: int) -> dict:
        calls.append(a)
        started.set()
        time.sleep(0.5)
        return {"value": a}

    unit = Unit("slow", {"a": 7}, slow)
    results: list = []
    first = threading.Thread(target=lambda: results.append(Cache(tmp_path, "v1").run(unit, lambda m: None)))
    first.start()
    started.wait(5)
    logs: list[str] = []
    second = Cache(tmp_path, "v1").run(unit, logs.append)
    first.join()
    assert len(calls) == 1 and second[1] is True and second[0].payload["value"] == 7
    assert any("another run" in m for m in logs)


# --- interrupts ------------------------------------------------------------------------------------------------


def test_interrupt_surfacing_as_another_exception_is_still_an_interrupt(monkeypatch, capsys):
    """matplotlib once turned a SIGINT mid-draw into ValueError('Invalid bounding box')."""
    import verify.commands.theory as theory

    def drawing(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            raise ValueError("Invalid bounding box") from None
        return 0

    monkeypatch.setattr(theory, "run", drawing)
    assert main(["theory"]) == 130
    line = _one_line(capsys.readouterr().err)
    assert "interrupted (SIGINT)" in line and "--resume" not in line


def test_claims_interrupt_advises_resume_and_keeps_finished_units(tmp_path: Path, monkeypatch, capsys):
    """SIGTERM between two cached units of a command with --resume: exit 143, the finished unit stays cached."""
    import verify.commands.claims as claims

    def two_units(args):
        cache = Cache(Path(args.out) / "cache", version="v1")
        cache.run(Unit("first", {"a": 1}, lambda a: {"value": a}), lambda m: None)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        cache.run(Unit("second", {"a": 2}, lambda a: {"value": a}), lambda m: None)
        return 0

    monkeypatch.setattr(claims, "run", two_units)
    code = main(["claims", "--out", str(tmp_path)])
    line = _one_line(capsys.readouterr().err)
    assert code == 143 and "interrupted (SIGTERM)" in line and "--resume" in line, line
    assert [p.name.split("-")[0] for p in (tmp_path / "cache").glob("*.json")] == ["first"]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_an_audit_stops_cleanly(sig: int, code: int, env, tmp_path: Path):
    """`python -m verify audit` gets the signal mid-computation: one line, the exit code, no outputs."""
    d = env["dir"]
    out = tmp_path / "out"
    out.mkdir()
    child_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child_env.pop("NTKM_PROGRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "verify", "audit", "--model", str(d / "cnn.ts"), "--train", str(d / "train.npz"),
         "--test", str(d / "test.npz"), "--n", "40", "--steps", "200", "--baseline-seeds", "20",
         "--out", str(out / "r.pdf"), "--json", "--html"],
        cwd=tmp_path, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = []
    assert proc.stderr is not None
    for line in proc.stderr:
        progress.append(line)
        if "audit: your model:" in line:
            break
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == code, "".join(progress) + rest
    assert "Traceback" not in rest
    final = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("audit:")]
    assert len(final) == 1 and f"interrupted ({signal.Signals(sig).name})" in final[0], rest
    assert "--resume" not in final[0]
    assert list(out.iterdir()) == []


# --- degenerate measurements and the claims report's set -----------------------------------------------------


def test_nan_flip_rate_is_not_measurable_never_a_level(env):
    from reports.audit_report import render_report
    from verify.audit import load_record
    from verify.audit_budget import REALISTIC_REASON
    from verify.audit_risk import NOT_MEASURABLE, risk_level

    r = risk_level(float("nan"), [0.1, 0.2], 0.05, 0.2)
    assert r["level"] == NOT_MEASURABLE and "NaN" in r["reason"]
    assert risk_level(0.5, [0.1, 0.2], 0.05, 0.2)["level"] == "high"
    rec = load_record(env["audit_json"])
    rec["risk"].update(level=NOT_MEASURABLE, reason=r["reason"], advice=["check the data"])
    assert "NOT MEASURABLE" in render_report(rec, REALISTIC_REASON)


def test_interrupted_claims_report_keeps_the_previous_set(env, tmp_path: Path, monkeypatch, capsys):
    import reports.claims_report as claims_report

    rec = tmp_path / "claims.json"
    rec.write_text((env["dir"] / "claims_min.json").read_text())
    for name in ("claims.md", "claims.html", "claims.pdf"):
        (tmp_path / name).write_text(f"old {name}")

    def half_then_interrupt(record, out, pdf=True):
        (Path(out) / "claims.md").write_text("new")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)

    monkeypatch.setattr(claims_report, "render_all", half_then_interrupt)
    assert main(["report", str(rec)]) == 130
    assert "interrupted (SIGINT)" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.html", "claims.json", "claims.md", "claims.pdf"]
    assert (tmp_path / "claims.md").read_text() == "old claims.md"


def test_full_disk_while_caching_a_unit_is_one_line(tmp_path: Path, monkeypatch):
    import verify.runner as runner

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "write_json", full)
    cache = Cache(tmp_path, version="v1")
    unit = Unit("u", {"a": 1}, lambda a: {"value": a})
    with pytest.raises(UserInputError, match="disk is full") as err:
        cache.run(unit, lambda m: None)
    assert "\n" not in str(err.value) and not cache.path(unit).exists()
