"""Safe model loading, data validation and the generic empirical NTK used by `verify audit`."""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import F32_ACCUMULATED, F32_ROUNDING, F64_ALGORITHM, F64_ROUNDING
from torch import nn
from torchscript import script

from empirics.kernels.audit_ntk import ModelJacobian
from empirics.kernels.ntk import empirical_ntk
from empirics.nets.models import ModelSpec, build_model, save_model
from ntkm.errors import UserInputError
from verify.audit.modelio import (
    FlatInput,
    bind_input,
    check_labels,
    fx_graph_for,
    load_model,
    load_split,
    sniff_format,
)


class Payload:
    """Unpickling this would run `touch MARKER` (it must never happen)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, stride=2)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class TinyAttn(nn.Module):
    """Rows of a 1x8x8 image as 8 tokens, one softmax-attention block, mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 6)
        self.att = nn.MultiheadAttention(6, 2, batch_first=True)
        self.ln = nn.LayerNorm(6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x.reshape(x.shape[0], 8, 8))
        a, _ = self.att(h, h, h, need_weights=False)
        return self.out(self.ln(h + a).mean(dim=1))


def _export(model: nn.Module, shape: tuple[int, ...], dynamic: bool = True, dtype=torch.float32):
    ex = torch.rand(3, *shape, dtype=dtype)
    dyn = ({0: torch.export.Dim("batch")},) if dynamic else None
    return torch.export.export(model, (ex,), dynamic_shapes=dyn)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


# --- refusing code-running pickles -------------------------------------------------------------------------


def test_crafted_pickle_is_refused_and_never_runs(tmp_path: Path):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "model.pt"
    evil.write_bytes(pickle.dumps(Payload(marker), protocol=2))
    with pytest.raises(UserInputError, match="refused and nothing in it ran") as err:
        load_model(evil)
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_torch_save_of_payload_and_of_whole_module_are_refused(tmp_path: Path):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "weights.pth"
    torch.save({"w": Payload(marker)}, evil)
    with pytest.raises(UserInputError, match="refused"):
        load_model(evil)
    whole = tmp_path / "whole.pt"
    torch.save(SmallCNN(), whole)
    with pytest.raises(UserInputError, match="state_dict"):
        load_model(whole)
    assert not marker.exists()


def test_fake_torchscript_archive_with_payload_does_not_run(tmp_path: Path):
    marker = tmp_path / "MARKER"
    fake = tmp_path / "fake.ts"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("fake/data.pkl", pickle.dumps(Payload(marker), protocol=2))
        zf.writestr("fake/code/__torch__/m.py", "def forward(self): pass\n")
        zf.writestr("fake/constants.pkl", pickle.dumps(Payload(marker), protocol=2))
        zf.writestr("fake/version", "3\n")
    assert sniff_format(fake) == "torchscript"
    with pytest.raises(UserInputError, match="refused and nothing in it ran"):
        load_model(fake)
    assert not marker.exists()


# --- formats by magic bytes ---------------------------------------------------------------------------------


def test_formats_are_detected_from_bytes_not_names(tmp_path: Path):
    m = SmallCNN().eval()
    ts = tmp_path / "model.bin"
    script(m).save(str(ts))
    ep = tmp_path / "model.weights"
    torch.export.save(_export(m, (1, 8, 8)), str(ep))
    sd = tmp_path / "model.safetensors.pt"
    suite = build_model(ModelSpec("relu", 16, 8, 3))
    save_model(suite, sd)
    assert sniff_format(ts) == "torchscript"
    assert sniff_format(ep) == "export"
    assert sniff_format(sd) == "safetensors"
    assert load_model(ts).fmt == "torchscript"
    loaded = load_model(ep)
    assert loaded.fmt == "export" and loaded.declared_shape == (1, 8, 8) and loaded.static_batch is None
    assert load_model(sd).is_suite


@pytest.mark.parametrize("content, match", [
    (b"hello, I am a text file\n", "not a model format"),
    (bytes(range(256)) * 4, "not a model format"),
    (b'{"a": 1}', "JSON file"),
])
def test_wrong_or_unknown_files(tmp_path: Path, content: bytes, match: str):
    p = tmp_path / "model.pt"
    p.write_bytes(content)
    with pytest.raises(UserInputError, match=match) as err:
        load_model(p)
    assert "\n" not in str(err.value)


def test_missing_file_and_folder(tmp_path: Path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_model(tmp_path / "nope.pt")
    with pytest.raises(UserInputError, match="is a folder"):
        load_model(tmp_path)


def test_weights_need_a_spec_and_accept_state_dicts(tmp_path: Path):
    spec = ModelSpec("attn", 16, 8, 3, seed=1)
    x = torch.rand(10, 16)
    model = build_model(spec, x)
    path, spec_path = save_model(model, tmp_path / "net.safetensors")
    loaded = load_model(path)
    assert loaded.spec_path == spec_path
    assert torch.allclose(loaded.module(x), model(x))
    sd = tmp_path / "net.pth"
    torch.save(model.state_dict(), sd)
    with pytest.raises(UserInputError, match="architecture spec"):
        load_model(sd)
    again = load_model(sd, spec=spec_path)
    assert torch.allclose(again.module(x), model(x))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(UserInputError, match="not a"):
        load_model(path, spec=bad)


# --- binding the model to the data --------------------------------------------------------------------------


def test_flat_data_is_reshaped_for_an_image_model(tmp_path: Path):
    ts = tmp_path / "cnn.ts"
    script(SmallCNN().eval()).save(str(ts))
    loaded = load_model(ts)
    x = np.random.default_rng(0).random((5, 64), dtype=np.float32)
    model, shape, c = bind_input(loaded, x, (1, 8, 8))
    assert shape == (1, 8, 8) and c == 4
    assert model(torch.as_tensor(x)).shape == (5, 4)


def test_shape_mismatch_names_expected_and_given(tmp_path: Path):
    ep = tmp_path / "cnn.pt2"
    torch.export.save(_export(SmallCNN().eval(), (1, 8, 8)), str(ep))
    x = np.random.default_rng(0).random((5, 100), dtype=np.float32)
    with pytest.raises(UserInputError, match=r"\(1, 8, 8\).*64 values.*100 values") as err:
        bind_input(load_model(ep), x, None)
    assert "\n" not in str(err.value)
    ts = tmp_path / "cnn.ts"
    script(SmallCNN().eval()).save(str(ts))
    with pytest.raises(UserInputError, match="does not accept the data"):
        bind_input(load_model(ts), x, (1, 10, 10))


def test_static_batch_export_is_padded(tmp_path: Path):
    ep = tmp_path / "static.pt2"
    m = SmallCNN().eval()
    torch.export.save(_export(m, (1, 8, 8), dynamic=False), str(ep))
    loaded = load_model(ep)
    assert loaded.static_batch == 3
    x = np.random.default_rng(1).random((7, 64), dtype=np.float32)
    model, _, _ = bind_input(loaded, x, (1, 8, 8))
    with torch.no_grad():
        assert torch.allclose(model(torch.as_tensor(x)), m(torch.as_tensor(x).reshape(7, 1, 8, 8)), atol=F32_ROUNDING)


# --- data ---------------------------------------------------------------------------------------------------


def _npz(tmp_path: Path, name: str, **arrays) -> str:
    p = tmp_path / name
    np.savez(p, **arrays)
    return str(p)


def test_npz_loading_scales_and_transposes(tmp_path: Path):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(6, 5, 4, 3), dtype=np.uint8)
    s = load_split(_npz(tmp_path, "a.npz", x=img, y=np.arange(6) % 3), "train", None)
    assert s.image_shape == (3, 5, 4) and s.x.dtype == np.float32 and 0 <= s.x.min() and s.x.max() <= 1
    assert np.allclose(s.x[1].reshape(3, 5, 4), img[1].transpose(2, 0, 1) / 255.0)
    sub = load_split(_npz(tmp_path, "b.npz", x=rng.random((50, 7)), y=np.zeros(50)), "train", 10, seed=3)
    assert sub.x.shape == (10, 7) and sub.provenance["n_available"] == 50


@pytest.mark.parametrize("make, match", [
    (lambda r: {"x": np.full((4, 3), np.nan), "y": np.zeros(4)}, "NaN or Inf"),
    (lambda r: {"x": np.zeros((0, 3)), "y": np.zeros(0)}, "empty"),
    (lambda r: {"x": r.random((4, 3)) * 5, "y": np.zeros(4)}, r"must lie in \[0, 1\]"),
    (lambda r: {"x": r.random((4, 3)), "y": np.array([0, 1, 0.5, 1])}, "integers"),
    (lambda r: {"x": r.random((4, 3)), "y": np.zeros(3)}, "labels"),
    (lambda r: {"inputs": r.random((4, 3))}, "needs arrays 'x' and 'y'"),
])
def test_bad_data_gives_one_line_errors(tmp_path: Path, make, match):
    path = _npz(tmp_path, "bad.npz", **make(np.random.default_rng(0)))
    with pytest.raises(UserInputError, match=match) as err:
        load_split(path, "train", None)
    assert "\n" not in str(err.value)


def test_object_arrays_are_refused(tmp_path: Path):
    p = tmp_path / "obj.npz"
    np.savez(p, x=np.array([{"a": 1}], dtype=object), y=np.zeros(1))
    with pytest.raises(UserInputError, match="object arrays are refused"):
        load_split(str(p), "train", None)


def test_label_range_against_outputs(tmp_path: Path):
    s = load_split(_npz(tmp_path, "l.npz", x=np.zeros((3, 2)), y=np.array([0, 4, 1])), "train", None)
    with pytest.raises(UserInputError, match="label 4 is out of range for a model with 4 outputs"):
        check_labels(s, 4, "--train")
    check_labels(s, 5, "--train")
    with pytest.raises(UserInputError, match="0..1"):
        check_labels(s, 1, "--train")


def test_idx_and_image_folder_sources(tmp_path: Path):
    from PIL import Image

    for split in ("train", "test"):
        for c in ("cat", "dog"):
            d = tmp_path / "imgs" / split / c
            d.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(np.full((6, 5, 3), 40 * i, dtype=np.uint8)).save(d / f"{i}.png")
    s = load_split(str(tmp_path / "imgs"), "test", None)
    assert s.image_shape == (3, 6, 5) and len(s.x) == 6 and s.classes == ["cat", "dog"]
    with pytest.raises(UserInputError, match="neither"):
        load_split(str(tmp_path), "train", None)


# --- the generic empirical NTK ------------------------------------------------------------------------------


def _reference(model: nn.Module, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return empirical_ntk(FlatInput(model, shape), x, implementation="torch_func")


@pytest.mark.parametrize("arch", ["cnn", "attn", "mlp"])
def test_kernel_paths_match_torch_func_on_the_eager_twin(arch: str):
    torch.manual_seed(0)
    if arch == "cnn":
        eager, shape = SmallCNN(), (1, 8, 8)
    elif arch == "attn":
        eager, shape = TinyAttn(), (1, 8, 8)
    else:
        eager = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.Tanh(), nn.Linear(12, 5))
        shape = (1, 8, 8)
    eager = eager.eval().double()
    x = torch.rand(7, 64, dtype=torch.float64)
    ref = _reference(eager, x, shape)
    ts = script(eager)
    gm = _export(eager, shape, dtype=torch.float64).module()
    static = _export(eager, shape, dynamic=False, dtype=torch.float64).module()
    engines = {
        "torchscript": ModelJacobian(FlatInput(ts, shape), shape),
        "export": ModelJacobian(gm, shape, graph=gm),
        "export-static": ModelJacobian(static, shape, graph=static, static_batch=3),
    }
    atol = F64_ROUNDING * float(ref.abs().max())
    for name, eng in engines.items():
        k = eng.kernel(x)
        assert torch.allclose(k, ref, rtol=F64_ALGORITHM, atol=atol), name
        kb = eng.kernel(x, max_bytes=3 * eng.bytes_per_example())
        assert torch.allclose(kb, ref, rtol=F64_ALGORITHM, atol=atol), name + " blocked"
        cross = eng.kernel(x[:3], x[3:])
        assert torch.allclose(cross, ref[:3, 3:], rtol=F64_ALGORITHM, atol=atol), name
    assert engines["export"].layers, "the linear layers should be factored"
    if arch == "mlp":
        assert engines["export"].batched and engines["export-static"].batched


def test_torchscript_is_converted_to_a_graph_when_possible(tmp_path: Path):
    ts = tmp_path / "mlp.ts"
    script(nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 3)).eval()).save(str(ts))
    loaded = load_model(ts)
    x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    model, shape, _ = bind_input(loaded, x, None)
    gm = fx_graph_for(loaded, model, x)
    if gm is None:
        pytest.skip("torch's TorchScript converter is unavailable here")
    eng = ModelJacobian(gm, shape, graph=gm)
    ref = ModelJacobian(model, shape)
    xt = torch.as_tensor(x)
    assert eng.batched
    assert torch.allclose(eng.kernel(xt), ref.kernel(xt), rtol=F32_ACCUMULATED)


# --- a payload in every member of every accepted format never runs ---------------------------------------


def _payload_bytes(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=2)


def _torch_zip_payload(marker: Path) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save((Payload(marker),), buf)
    return buf.getvalue()


def _rewrite(src: Path, dst: Path, member: str | None, data: bytes | None) -> None:
    """Copy a zip archive, replacing one member's bytes (None: an identical copy)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, data if info.filename == member else zin.read(info))


def _model_files(tmp: Path) -> dict[str, Path]:
    m = SmallCNN().eval()
    files = {"torchscript": tmp / "m.ts", "export": tmp / "m.pt2", "state-dict": tmp / "sd.pt"}
    script(m).save(str(files["torchscript"]))
    torch.export.save(_export(m, (1, 8, 8)), str(files["export"]))
    suite = build_model(ModelSpec("relu", 16, 8, 3))
    save_model(suite, tmp / "suite.safetensors")
    torch.save(suite.state_dict(), files["state-dict"])
    (tmp / "sd.pt.json").write_bytes((tmp / "suite.safetensors.json").read_bytes())
    return files


def test_payload_is_live_so_the_tests_below_can_fail(tmp_path: Path):
    marker = tmp_path / "MARKER"
    pickle.loads(_payload_bytes(marker))
    assert marker.exists()


@pytest.mark.parametrize("fmt", ["torchscript", "export", "state-dict"])
def test_payload_in_every_archive_member_never_runs(fmt: str, tmp_path: Path):
    src = _model_files(tmp_path)[fmt]
    marker = tmp_path / "MARKER"
    control = tmp_path / f"control{src.suffix}"
    _rewrite(src, control, None, None)
    if fmt == "state-dict":
        (tmp_path / f"{control.name}.json").write_bytes((tmp_path / "sd.pt.json").read_bytes())
    assert load_model(control).fmt == fmt  # a rewritten archive still loads: refusals below are the payload's
    with zipfile.ZipFile(src) as zf:
        members = zf.namelist()
    refused = 0
    for member in members:
        for kind, data in (("pickle", _payload_bytes(marker)), ("torch.save", _torch_zip_payload(marker))):
            evil = tmp_path / f"evil{src.suffix}"
            _rewrite(src, evil, member, data)
            if fmt == "state-dict":
                (tmp_path / f"{evil.name}.json").write_bytes((tmp_path / "sd.pt.json").read_bytes())
            try:
                load_model(evil)
            except UserInputError as exc:
                assert "\n" not in str(exc), (member, kind)
                refused += 1
            assert not marker.exists(), f"payload ran from member {member} ({kind})"
    assert refused >= len(members)  # most members are refused outright; raw storages are only bytes


def test_payload_in_safetensors_header_and_data_never_runs(tmp_path: Path):
    marker = tmp_path / "MARKER"
    suite = build_model(ModelSpec("relu", 16, 8, 3))
    weights, _ = save_model(suite, tmp_path / "w.safetensors")
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["__metadata__"] = {"payload": _payload_bytes(marker).decode("latin-1")}
    h = json.dumps(header).encode()
    variants = [len(h).to_bytes(8, "little") + h + raw[8 + n:],
                raw[:8 + n] + _payload_bytes(marker).ljust(len(raw) - 8 - n, b"\0")[: len(raw) - 8 - n],
                raw[:8] + _payload_bytes(marker)]
    for i, data in enumerate(variants):
        evil = tmp_path / f"evil{i}.safetensors"
        evil.write_bytes(data)
        (tmp_path / f"evil{i}.safetensors.json").write_bytes((tmp_path / "w.safetensors.json").read_bytes())
        try:
            load_model(evil)
        except UserInputError as exc:
            assert "\n" not in str(exc)
        assert not marker.exists()


# --- torch.export archives: every path by which torch.export.load would run code is closed -------------------


def _pt2_doc(src: Path) -> tuple[str, dict]:
    with zipfile.ZipFile(src) as zf:
        name = next(n for n in zf.namelist() if n.endswith("models/model.json"))
        return name, json.loads(zf.read(name))


def _evil_program(src: Path, dst: Path, edit) -> None:
    name, doc = _pt2_doc(src)
    edit(doc)
    _rewrite(src, dst, name, json.dumps(doc).encode())


def _cmd(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


@pytest.mark.parametrize("attack", ["sympify", "target", "target-dunder", "pickled-weight",
                                    "opaque-constant", "aotinductor", "legacy", "sample-inputs"])
def test_export_archive_exploits_are_refused(attack: str, tmp_path: Path):
    src = _model_files(tmp_path)["export"]
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(src) as zf:
        names = zf.namelist()
        root = names[0].split("/")[0]
    if attack == "sympify":
        def edit(d):
            tv = d["graph_module"]["graph"]["tensor_values"]
            first = next(iter(tv.values()))
            first["sizes"][0] = {"as_expr": {"expr_str": _cmd(marker), "hint": None}}
        _evil_program(src, evil, edit)
    elif attack in ("target", "target-dunder"):
        bad = "torch.serialization.os.system" if attack == "target" else "torch.ops.__class__.__init__"
        _evil_program(src, evil, lambda d: d["graph_module"]["graph"]["nodes"][0].__setitem__("target", bad))
    elif attack == "pickled-weight":
        _pickled_weight_pt2(src, evil, marker)
    elif attack == "opaque-constant":
        const = {"config": {"c": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": False,
                                  "tensor_meta": None}}}
        _rewrite(src, evil, f"{root}/data/constants/model_constants_config.json", json.dumps(const).encode())
        with zipfile.ZipFile(evil, "a") as zf:
            zf.writestr(f"{root}/data/constants/opaque_obj_0", _payload_bytes(marker))
    elif attack == "aotinductor":
        _rewrite(src, evil, None, None)
        with zipfile.ZipFile(evil, "a") as zf:
            zf.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    elif attack == "legacy":
        _rewrite(src, evil, None, None)
        with zipfile.ZipFile(evil, "a") as zf:
            zf.writestr(f"{root}/data/weights/model.pt", _torch_zip_payload(marker))
    else:
        _rewrite(src, evil, f"{root}/data/sample_inputs/model.pt", _torch_zip_payload(marker))
    with pytest.raises(UserInputError) as err:
        load_model(evil)
    assert "\n" not in str(err.value)
    assert not marker.exists()


def _pickled_weight_pt2(src: Path, dst: Path, marker: Path) -> None:
    """A .pt2 whose first weight is declared a pickle and holds a torch.save'd payload."""
    with zipfile.ZipFile(src) as zf:
        cfg_name = next(n for n in zf.namelist() if n.endswith("model_weights_config.json"))
        cfg = json.loads(zf.read(cfg_name))
    first = next(iter(cfg["config"].values()))
    first["use_pickle"] = True
    weight = cfg_name.replace("model_weights_config.json", first["path_name"])
    mid = dst.with_suffix(".mid")
    _rewrite(src, mid, cfg_name, json.dumps(cfg).encode())
    _rewrite(mid, dst, weight, _torch_zip_payload(marker))


def test_torch_export_load_would_run_a_pickled_weight_but_the_audit_loader_does_not(tmp_path: Path):
    src = _model_files(tmp_path)["export"]
    live, marker = tmp_path / "LIVE", tmp_path / "MARKER"
    _pickled_weight_pt2(src, tmp_path / "live.pt2", live)
    with pytest.raises(Exception):  # noqa: B017 - torch fails after the payload already ran
        torch.export.load(str(tmp_path / "live.pt2"))
    assert live.exists(), "torch.export.load no longer unpickles this payload: the threat this test guards is gone"
    _pickled_weight_pt2(src, tmp_path / "evil.pt2", marker)
    with pytest.raises(UserInputError, match="stored as a pickle"):
        load_model(tmp_path / "evil.pt2")
    assert not marker.exists()


def test_export_guard_code_is_dropped_never_run(tmp_path: Path):
    src = _model_files(tmp_path)["export"]
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt2"
    _evil_program(src, evil, lambda d: d.__setitem__("guards_code", [_cmd(marker)]))
    loaded = load_model(evil)
    assert loaded.module(torch.rand(2, 1, 8, 8)).shape == (2, 4)
    assert not marker.exists()


def test_sympify_payload_would_run_so_the_expression_check_matters(tmp_path: Path):
    import sympy

    marker = tmp_path / "MARKER"
    sympy.sympify(_cmd(marker))
    assert marker.exists()


def test_models_saved_in_training_mode_are_refused(tmp_path: Path):
    m = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(108, 4)).train()
    ts, ep = tmp_path / "train.ts", tmp_path / "train.pt2"
    script(m).save(str(ts))
    torch.export.save(_export(m, (1, 8, 8)), str(ep))
    for path in (ts, ep):
        with pytest.raises(UserInputError, match="model.eval()"):
            load_model(path)
    m.eval()
    script(m).save(str(ts))
    assert load_model(ts).fmt == "torchscript"
