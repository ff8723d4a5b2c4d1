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
from torchscript import script

from empirics.data.datasets import DataRequest, load_dataset
from ntkm.errors import UserInputError
from verify.cli import main
from verify.outputs import MANIFEST, check_output_dir, output_set
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
    ds = load_dataset("mnist", n_train=40, n_test=10, request=DataRequest(source="bundled"))
    x = ds.x_train.reshape(-1, 1, 28, 28)
    np.savez(d / "train.npz", x=x, y=ds.y_train)
    np.savez(d / "test.npz", x=ds.x_test.reshape(-1, 1, 28, 28), y=ds.y_test)
    np.savez(d / "zeros.npz", x=np.zeros_like(x), y=ds.y_train)
    np.savez(d / "label10.npz", x=x, y=np.full(len(x), 10))
    np.savez(d / "label-1.npz", x=x, y=np.full(len(x), -1))
    np.savez(d / "scalar_y.npz", x=x, y=np.int64(3))
    np.savez(d / "flat_x.npz", x=x.reshape(-1)[:784], y=ds.y_train[:1])
    torch.manual_seed(0)
    script(CNN().eval()).save(str(d / "cnn.ts"))
    script(CNN(bn=True).train()).save(str(d / "bn_train.ts"))
    script(Cube().eval()).save(str(d / "cube.ts"))
    script(SmallBatchesOnly(False).eval()).save(str(d / "small_raise.ts"))
    script(SmallBatchesOnly(True).eval()).save(str(d / "small_nan.ts"))
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
    audit_text = out.with_suffix(".json").read_text()
    (d / "int400.json").write_text(audit_text.replace('"experiment": "audit"',
                                                      '"experiment": "audit", "big": 1' + "0" * 400, 1))
    (d / "int5000.json").write_text(audit_text.replace('"experiment": "audit"',
                                                       '"experiment": "audit", "big": ' + "7" * 5000, 1))
    (d / "deep.json").write_text('{"experiment": "audit", "claims": [], "summary": {}, "x": ' + "[" * 100_000
                                 + "]" * 100_000 + "}")
    for split in ("train", "test"):
        (d / "bomb" / split / "cat").mkdir(parents=True)
        (d / "bomb" / split / "cat" / "a.png").write_bytes(_png_header(30_000, 30_000))
    return {"dir": d, "marker": marker, "audit_json": out.with_suffix(".json")}


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels (a decompression bomb when large) with one byte of image data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b""))


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
    # hostile records, paths of the wrong kind and options past what exists (issue 27)
    "diff record with 10**400": (["audit", "diff", "{d}/int400.json", "{d}/first/audit.json"], 2, "401 digits"),
    "diff record with a 5,000-digit int": (["audit", "diff", "{d}/first/audit.json", "{d}/int5000.json"], 2,
                                           "5000 digits"),
    "diff record nested 100,000 deep": (["audit", "diff", "{d}/deep.json", "{d}/first/audit.json"], 2,
                                        "nested 100001 levels"),
    "render record with 10**400": (["audit", "--render", "{d}/int400.json", "--out", "{d}/first/r2.pdf"], 2,
                                   "401 digits"),
    "render record nested 100,000 deep": (["audit", "--render", "{d}/deep.json", "--out", "{d}/first/r2.pdf"], 2,
                                          "nested"),
    "report record nested 100,000 deep": (["report", "{d}/deep.json", "--out", "{d}/x"], 2, "nested"),
    "report record with a 5,000-digit int": (["report", "{d}/int5000.json", "--out", "{d}/x"], 2, "5000 digits"),
    "diff a folder": (["audit", "diff", "{d}/imgs", "{d}/first/audit.json"], 2, "is a folder, not a file"),
    "render a folder": (["audit", "--render", "{d}/imgs", "--out", "{d}/first/r2.pdf"], 2, "is a folder, not a file"),
    "report a folder": (["report", "{d}/imgs"], 2, "is a folder, not a file"),
    "claims --only ,": (["claims", "--only", ",", "--out", "{d}/x"], 2, "names no claim"),
    "decompression-bomb PNG": (["audit", "--model", M, "--train", "{d}/bomb", "--test", TE], 2,
                               r"a\.png declares more pixels"),
    "target-test beyond the test points": ([*AUD, "--n-test", "100", "--target-test", "50"], 2,
                                           "--target-test 50 is beyond the 10 test points"),
    "projection-dim 10**12": ([*AUD, "--projection-dim", str(10**12)], 2, "--projection-dim 1000000000000: .* give at "
                              "most"),
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
    """An earlier run's set (so the folder's manifest lists its files)."""
    with output_set(folder, ("a.json", "a.html", "a.pdf")) as s:
        for name in ("a.json", "a.html", "a.pdf"):
            s.path(name).write_text(f"old {name}")


def test_output_set_replaces_the_whole_set_and_drops_stale_members(tmp_path: Path):
    _previous_set(tmp_path)
    with output_set(tmp_path, ("a.json", "a.html", "a.pdf", "figs"), folders=("figs",)) as s:
        s.path("a.json").write_text("new")
        s.path("figs").mkdir()
        (s.path("figs") / "f.png").write_text("png")
    assert (tmp_path / "a.json").read_text() == "new" and (tmp_path / "figs" / "f.png").exists()
    assert not (tmp_path / "a.pdf").exists() and not (tmp_path / "a.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "a.json", "figs"]
    assert s.final(s.dir / "a.json") == tmp_path / "a.json"


def test_audit_set_removes_earlier_audit_files_but_not_a_users_own(env, tmp_path: Path, capsys):
    (tmp_path / "r.json").write_text('{"experiment": "audit", "old": true}')
    (tmp_path / "r.html").write_text("<html>my own notes, not an audit</html>")
    assert main(["audit", "--render", str(env["audit_json"]), "--out", str(tmp_path / "r.pdf")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.pdf"]
    assert "my own notes" in (tmp_path / "r.html").read_text()


def _user_files(folder: Path) -> dict[str, bytes]:
    """A user's own folder of files: name -> content, to check after a run."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"notes.txt": b"my notes\n", "data.json": b'{"mine": true}\n'}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _unchanged(folder: Path, files: dict[str, bytes]) -> bool:
    return folder.is_dir() and {p.name: p.read_bytes() for p in folder.iterdir()} == files


@pytest.mark.parametrize("flag, member", [("--json", "a.json"), ("--summary", "a-summary.md"), ("--html", "a.html"),
                                          (None, "a.pdf")])
def test_audit_refuses_a_folder_where_an_output_file_goes(flag, member, env, tmp_path: Path, capsys):
    """Issue 27: the user's folder `a.json/` (or `a-summary.md/`, ...) was moved aside and deleted; exit 0."""
    mine = _user_files(tmp_path / member)
    code = main(["audit", "--render", str(env["audit_json"]), "--out", str(tmp_path / "a.pdf"),
                 *([flag] if flag else [])])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and f"{tmp_path / member} is a folder" in line, line
    assert _unchanged(tmp_path / member, mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == [member]


def test_a_folder_appearing_where_a_file_goes_is_refused_at_the_swap(tmp_path: Path):
    """The same check runs again when the set is swapped in (a folder made while the run worked)."""
    with pytest.raises(UserInputError, match="is a folder"), output_set(tmp_path, ("a.json", "a.pdf")) as s:
        s.path("a.json").write_text("new")
        mine = _user_files(tmp_path / "a.json")
    assert _unchanged(tmp_path / "a.json", mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_figures_are_merged_and_only_the_suites_files_removed(tmp_path: Path):
    """`figures/` holding the user's own figures: only files an earlier set wrote (its manifest) are replaced or
    removed; the user's file, even one added after the earlier run, is untouched."""
    with output_set(tmp_path, ("claims.json", "figures"), folders=("figures",)) as s:
        s.path("claims.json").write_text("1")
        s.path("figures").mkdir()
        for name in ("kappa.png", "old_only.png"):
            (s.path("figures") / name).write_text(f"run 1 {name}")
    mine = {"my_plot.png": b"user figure", **{p.name: p.read_bytes() for p in (tmp_path / "figures").iterdir()}}
    (tmp_path / "figures" / "my_plot.png").write_bytes(mine["my_plot.png"])
    with output_set(tmp_path, ("claims.json", "figures"), folders=("figures",)) as s:
        s.path("claims.json").write_text("2")
        s.path("figures").mkdir()
        (s.path("figures") / "kappa.png").write_text("run 2 kappa.png")
    got = {p.name: p.read_bytes() for p in (tmp_path / "figures").iterdir()}
    assert got == {"my_plot.png": b"user figure", "kappa.png": b"run 2 kappa.png"}
    listed = json.loads((tmp_path / MANIFEST).read_text())["files"]
    assert listed == ["claims.json", "figures/kappa.png"]


def test_a_users_file_with_a_members_name_that_the_run_does_not_write_survives(tmp_path: Path):
    """`claims.pdf` of the user's own (no manifest lists it) beside a run that writes no PDF."""
    (tmp_path / "claims.pdf").write_bytes(b"%PDF my paper")
    with output_set(tmp_path, ("claims.json", "claims.pdf")) as s:
        s.path("claims.json").write_text("new")
    assert (tmp_path / "claims.pdf").read_bytes() == b"%PDF my paper"


def test_report_merges_into_a_users_figures_folder(env, tmp_path: Path, monkeypatch, capsys):
    """`verify report` into a folder whose `figures/` holds the user's files (the renderer stubbed: it writes
    claims.md and one figure, a different one on the second run)."""
    import reports.claims_report as claims_report

    rec = tmp_path / "claims.json"
    rec.write_text((env["dir"] / "claims_min.json").read_text())
    mine = _user_files(tmp_path / "figures")
    names = iter(["kappa_vs_n.png", "flip_rates.png"])

    def render(record, out, pdf=True):
        (Path(out) / "figures").mkdir()
        fig = Path(out) / "figures" / next(names)
        fig.write_bytes(b"png")
        (Path(out) / "claims.md").write_text("md")
        return claims_report.Written([Path(out) / "claims.md", fig])

    monkeypatch.setattr(claims_report, "render_all", render)
    for _ in range(2):
        assert main(["report", str(rec), "--no-pdf"]) == 0, capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "figures").iterdir()} == {**mine, "flip_rates.png": b"png"}
    assert rec.read_text() == (env["dir"] / "claims_min.json").read_text()


@pytest.mark.parametrize("kind", ["figures", "cache"])
def test_claims_refuses_a_file_where_its_folders_go_before_any_work(kind, tmp_path: Path, capsys):
    (tmp_path / kind).write_bytes(b"user file")
    code = main(["claims", "--only", "thm4.1", "--out", str(tmp_path), "--no-pdf"])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and f"{tmp_path / kind} is a file" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [kind] and (tmp_path / kind).read_bytes() == b"user file"


def test_a_fresh_claims_run_removes_only_cache_entries(tmp_path: Path):
    from verify.commands.claims import drop_cache_entries

    cache = Cache(tmp_path, version="v1")
    unit = Unit("u", {"a": 1}, lambda a: {"value": a})
    cache.run(unit, lambda m: None)
    (tmp_path / "mine.json").write_text('{"unit": "mine"}')
    (tmp_path / "broken.json").write_text("{")
    drop_cache_entries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json", "mine.json"]


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_or_interrupted_set_leaves_the_previous_one(tmp_path: Path, exc: BaseException):
    _previous_set(tmp_path)
    with pytest.raises(type(exc)), output_set(tmp_path, ("a.json", "a.html", "a.pdf")) as s:
        s.path("a.json").write_text("new")
        raise exc
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "a.html", "a.json", "a.pdf"]
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
    from verify.audit.budget import REALISTIC_REASON
    from verify.audit.ci import read_record
    from verify.audit.risk import NOT_MEASURABLE, risk_level

    r = risk_level(float("nan"), [0.1, 0.2], 0.05, 0.2)
    assert r["level"] == NOT_MEASURABLE and "NaN" in r["reason"]
    assert risk_level(0.5, [0.1, 0.2], 0.05, 0.2)["level"] == "high"
    rec = read_record(env["audit_json"], "--render")
    rec["risk"].update(level=NOT_MEASURABLE, reason=r["reason"], advice=["check the data"])
    assert "NOT MEASURABLE" in render_report(rec, REALISTIC_REASON)


class _Diverging:
    """Re-fits whose test outputs are NaN (or overflow to infinite logits) once the training inputs were altered; the
    control re-fit, on the unaltered set, stays finite: a model finite on clean data that diverges under attack."""

    def __init__(self, x: torch.Tensor, value: float):
        self.x, self.value = x, value

    def control(self, x, y, seed, evals):
        return {k: np.tile(np.arange(3.0), (len(v), 1)) for k, v in evals.items()}

    def outputs(self, x, y, seed, evals):
        if torch.equal(x, self.x):
            return self.control(x, y, seed, evals)
        return {k: np.tile([self.value, 0.0, -self.value], (len(v), 1)) for k, v in evals.items()}

    def controls(self, x, y, seeds, evals):
        return [self.control(x, y, s, evals) for s in seeds]

    def outputs_many(self, jobs):
        return [self.outputs(j.x if j.keep is None else j.x[j.keep], j.y, j.seed, j.evals) for j in jobs]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_under_perturbation_is_not_measurable_in_the_outcome_table_and_curves(value, env, tmp_path: Path,
                                                                                         capsys):
    """Issue 27: the outcome table printed "nan [-inf, inf]"; now the panel and the curves say why instead."""
    from dataclasses import replace

    from empirics.common import Tensors
    from ntkm.codec import write_json
    from verify.audit.ci import read_record
    from verify.audit.config import AuditConfig
    from verify.audit.outcome import CurveGrid, outcome_curves, outcome_panel
    from verify.audit.refit import RefitInputs
    from verify.audit.risk import NOT_MEASURABLE

    gen = torch.Generator().manual_seed(0)
    x, xt = torch.rand(12, 4, generator=gen), torch.rand(6, 4, generator=gen)
    y, yt = torch.randint(0, 3, (12,), generator=gen), torch.randint(0, 3, (6,), generator=gen)
    model = nn.Linear(4, 3)
    per_test = np.random.default_rng(0).normal(size=(12, 6))
    inp = RefitInputs(_Diverging(x, value), model, Tensors(x, y, xt, yt, 3))
    cfg = AuditConfig("model", "train", eps=0.1, steps=1, refit_seeds=2, seed=0, outcome_targets=2,
                      curve_attack="fgsm")
    panel = outcome_panel(inp, per_test, np.arange(3), "fgsm", cfg)
    curves = outcome_curves(inp, per_test, per_test.sum(axis=1), CurveGrid(3, (0.05, 0.1), (2, 3)),
                            replace(cfg, refit_seeds=3))
    for part in (panel, curves):
        assert part["verdict"] == NOT_MEASURABLE and "NaN or infinite" in part["reason"], part
    rec = read_record(env["audit_json"], "--render")
    rec["panels"]["outcome"] = panel
    if "budget" in rec["panels"]:
        rec["panels"]["budget"]["refit"] = curves
    write_json(tmp_path / "diverged.json", rec)
    out = tmp_path / "r.pdf"
    assert main(["audit", "--render", str(tmp_path / "diverged.json"), "--out", str(out), "--html"]) == 0, \
        capsys.readouterr().err
    page = out.with_suffix(".html").read_text()
    assert "NaN or infinite" in page and not re.search(r"\bnan\b|\binf\b", page.split("<body", 1)[-1])


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
