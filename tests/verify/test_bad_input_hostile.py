"""The bad-input battery, continued (issue 27): code the user did not name is never imported, cache entries and
records of the wrong shape are recomputed or refused, no lock file or folder outlives a refused run, digits
outside ASCII are refused in one line, and a signal after the outputs were written is no traceback.

These need no trained model or audit record (tests/verify/test_bad_input.py holds the cases that do).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ntkm.codec import Record
from ntkm.errors import UserInputError
from ntkm.io import MAX_JSON_DEPTH, json_depth, parse_json
from verify.audit.refit import RefitConfig, Refitter, load_train_fn
from verify.runner import Cache, Unit

ROOT = Path(__file__).resolve().parents[2]
SHADOW = "from pathlib import Path\nPath({marker!r}).write_text('imported')\n"
TRAIN = ("import torch\n\n\ndef fit(x, y, seed):\n    return torch.nn.Sequential(torch.nn.Flatten(), "
         "torch.nn.Linear(x[0].numel(), {outputs}))\n")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A working directory holding the user's train modules and shadow modules that leave a mark if imported;
    `sys.path` is restored and the modules imported from it are dropped afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    for shadow in ("weasyprint", "json_helpers"):
        (tmp_path / f"{shadow}.py").write_text(SHADOW.format(marker=str(tmp_path / f"MARK-{shadow}")))
    (tmp_path / "mytrain.py").write_text(TRAIN.format(outputs=3))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "recipe.py").write_text(TRAIN.format(outputs=5))
    yield tmp_path
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.parametrize("spec", ["mytrain:fit", "pkg.recipe:fit"])
def test_train_fn_imports_only_the_named_module(spec: str, workdir: Path):
    """Issue 27: `MODULE:FUNCTION` put the working directory first on sys.path, so a `weasyprint.py` there was
    imported (and ran) when the report was rendered."""
    fn = load_train_fn(spec)
    assert callable(fn) and isinstance(fn(torch.zeros(2, 4), torch.zeros(2), 0), nn.Module)
    assert str(workdir) not in sys.path and "" not in sys.path
    for shadow in ("weasyprint", "json_helpers"):
        sys.modules.pop(shadow, None)
        spec_found = importlib.util.find_spec(shadow)
        assert spec_found is None or Path(str(spec_found.origin)).parent != workdir
        try:
            importlib.import_module(shadow)  # what rendering the PDF does
        except Exception:  # noqa: BLE001 - weasyprint missing or without its libraries: not ours either way
            pass
        assert not (workdir / f"MARK-{shadow}").exists()


def test_train_fn_module_importing_a_sibling_is_one_line(workdir: Path):
    (workdir / "needs_helper.py").write_text("import json_helpers\n\ndef fit(x, y, seed):\n    pass\n")
    with pytest.raises(UserInputError, match="No module named 'json_helpers'.*only the named module") as err:
        load_train_fn("needs_helper:fit")
    assert "\n" not in str(err.value) and not (workdir / "MARK-json_helpers").exists()


def test_train_fn_from_an_installed_module_still_works(workdir: Path):
    assert load_train_fn("json:dumps") is json.dumps


@pytest.mark.parametrize("outputs, ok", [(3, True), (5, False)])
def test_train_fn_with_the_wrong_number_of_outputs_is_refused(outputs: int, ok: bool, workdir: Path):
    (workdir / "recipe_n.py").write_text(TRAIN.format(outputs=outputs))
    refit = Refitter(nn.Identity(), [], RefitConfig(train_fn="recipe_n:fit"), 3, (4,))
    x, y = torch.rand(6, 4), torch.randint(0, 3, (6,))
    if ok:
        assert refit.outputs(x, y, 0, {"test": x})["test"].shape == (6, 3)
        return
    with pytest.raises(UserInputError, match=r"shape \(2, 5\) .* gives \(2, 3\)") as err:
        refit.outputs(x, y, 0, {"test": x})
    assert "\n" not in str(err.value)


# --- the experiment cache --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Counted(Record):
    """A unit record with typed fields."""

    count: int
    value: float
    name: str
    sizes: tuple[int, ...] = ()


def _counted(a: int) -> Counted:
    return Counted(a, a / 2, "u", (a, a + 1))


@pytest.mark.parametrize("field, bad", [("count", "three"), ("value", "x"), ("value", [1.0]), ("name", 7),
                                        ("sizes", "12"), ("sizes", [1, "2"]), ("count", True)])
def test_a_cache_entry_of_the_wrong_type_with_a_matching_digest_is_recomputed(field, bad, tmp_path: Path):
    """Issue 27: an entry edited to a value of the wrong type, its digest updated to match, was a traceback."""
    from verify.runner import _digest

    cache = Cache(tmp_path, version="v1")
    unit = Unit("typed", {"a": 4}, _counted, Counted)
    assert cache.run(unit, lambda m: None)[0].payload == _counted(4)
    entry = json.loads(cache.path(unit).read_text())
    entry[field] = bad
    entry["result_sha256"] = _digest({k: v for k, v in entry.items() if k != "result_sha256"})
    cache.path(unit).write_text(json.dumps(entry))
    res, cached = cache.run(unit, lambda m: None)
    assert not cached and res.payload == _counted(4)
    assert cache.run(unit, lambda m: None)[1]


def test_a_refused_unit_leaves_no_lock_file_and_no_folder(tmp_path: Path):
    """Issue 27: a refused `claims` run left an empty lock file (and the folders made for it) in --out/cache."""
    def refuse(a: int) -> dict:
        raise UserInputError("data folder /nope has no MNIST files; pass --data-dir")

    out = tmp_path / "out"
    cache = Cache(out / "cache", version="v1")
    with pytest.raises(UserInputError):
        cache.run(Unit("refused", {"a": 1}, refuse), lambda m: None)
    assert list(tmp_path.iterdir()) == []
    cache.run(Unit("fine", {"a": 1}, lambda a: {"value": a}), lambda m: None)
    assert [p.name.split("-")[0] for p in (out / "cache").iterdir()] == ["fine"]


# --- records: nesting and integers beyond what the readers handle ----------------------------------------------


@pytest.mark.parametrize("text, match", [("[" * 100_000 + "]" * 100_000, "nested 100000 levels"),
                                         ('{"n": 1' + "0" * 400 + "}", "401 digits"),
                                         ('{"n": -' + "9" * 5000 + "}", "5000 digits")])
def test_parse_json_refuses_what_would_overflow_or_recurse(text: str, match: str):
    with pytest.raises(json.JSONDecodeError, match=match):
        parse_json(text)


def test_parse_json_reads_ordinary_records_like_json_loads():
    doc = {"a": [1, -2, 3.5, "x[{\\\"]}", {"b": [[[]]]}], "seed": 2**63, "deep": [[[[1]]]]}
    text = json.dumps(doc)
    assert parse_json(text) == json.loads(text) == doc
    assert json_depth(text) == 6 and json_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) == MAX_JSON_DEPTH


# --- digits outside ASCII ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("digit", ["²", "٣", "３"])
def test_unicode_digits_are_refused_in_one_line(digit: str):
    """Issue 27: '²'.isdigit() is True but int('²') fails: a traceback from --classes and --ray-address."""
    from empirics.data.userdata import pick_classes
    from verify.executors import check_address

    with pytest.raises(UserInputError, match="neither a class"):
        pick_classes(["0", "1", "2"], [0, 1, 2], "binary", (digit, "1"), "data.npz")
    with pytest.raises(UserInputError, match="is not HOST:PORT"):
        check_address(f"10.0.0.5:637{digit}")


def test_unicode_digit_in_ntkm_threads_is_one_line():
    from verify.cli import set_threads

    os.environ["NTKM_THREADS"] = "²"
    try:
        with pytest.raises(UserInputError, match="NTKM_THREADS must be a positive integer"):
            set_threads()
    finally:
        os.environ["NTKM_THREADS"] = "1"


# --- a signal after the outputs were written --------------------------------------------------------------------

LATE_SIGNAL = """
import os, signal, sys
import verify.cli as cli
import verify.commands.theory as theory

def run(args):
    print("wrote {out}", flush=True)
    return 0

theory.run = run
sys.argv = ["verify", "theory"]
code = cli.main()
os.kill(os.getpid(), signal.{sig})  # lands while the process shuts down, after the command finished
sys.exit(code)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_just_after_wrote_is_no_traceback(sig: str, tmp_path: Path):
    """Issue 27: SIGINT in the half-second after "wrote ..." gave a shutdown traceback (or a silent death)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NTKM_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL.format(out=tmp_path / "x", sig=sig)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"verify: {sig} after the command had finished; its outputs are complete"], proc.stderr
