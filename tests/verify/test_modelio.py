"""Safe model loading, data validation and the generic empirical NTK used by `verify audit`."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from empirics.audit_ntk import ModelJacobian
from empirics.models import ModelSpec, build_model, save_model
from empirics.ntk import ntk_generic
from theory.errors import UserInputError
from verify.modelio import (
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
    with pytest.raises(UserInputError, match="cannot be loaded"):
        load_model(fake)
    assert not marker.exists()


# --- formats by magic bytes ---------------------------------------------------------------------------------


def test_formats_are_detected_from_bytes_not_names(tmp_path: Path):
    m = SmallCNN().eval()
    ts = tmp_path / "model.bin"
    torch.jit.script(m).save(str(ts))
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
    torch.jit.script(SmallCNN().eval()).save(str(ts))
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
    torch.jit.script(SmallCNN().eval()).save(str(ts))
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
        assert torch.allclose(model(torch.as_tensor(x)), m(torch.as_tensor(x).reshape(7, 1, 8, 8)), atol=1e-6)


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
    return ntk_generic(FlatInput(model, shape), x)


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
    ts = torch.jit.script(eager)
    gm = _export(eager, shape, dtype=torch.float64).module()
    static = _export(eager, shape, dynamic=False, dtype=torch.float64).module()
    engines = {
        "torchscript": ModelJacobian(FlatInput(ts, shape), shape),
        "export": ModelJacobian(gm, shape, graph=gm),
        "export-static": ModelJacobian(static, shape, graph=static, static_batch=3),
    }
    for name, eng in engines.items():
        k = eng.kernel(x)
        assert torch.allclose(k, ref, rtol=1e-10, atol=1e-12 * float(ref.abs().max())), name
        kb = eng.kernel(x, max_bytes=3 * eng.bytes_per_example())
        assert torch.allclose(kb, ref, rtol=1e-10, atol=1e-12 * float(ref.abs().max())), name + " blocked"
        cross = eng.kernel(x[:3], x[3:])
        assert torch.allclose(cross, ref[:3, 3:], rtol=1e-10, atol=1e-12 * float(ref.abs().max())), name
    assert engines["export"].layers, "the linear layers should be factored"
    if arch == "mlp":
        assert engines["export"].batched and engines["export-static"].batched


def test_torchscript_is_converted_to_a_graph_when_possible(tmp_path: Path):
    ts = tmp_path / "mlp.ts"
    torch.jit.script(nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 3)).eval()).save(str(ts))
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
    assert torch.allclose(eng.kernel(xt), ref.kernel(xt), rtol=1e-4)
