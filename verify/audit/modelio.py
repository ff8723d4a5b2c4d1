"""Safe loading of a user's model and data for `verify audit`.

Models. The format is found from the file's bytes (magic numbers), not its name:

Before any loader sees a file, every pickle in it (each `.pkl` member of an archive, the
pickles nested in a `.pt2`, a legacy `torch.save` stream) is read opcode by opcode without being
unpickled (`check_pickle`): a pickle that names any global outside the tensor-only format of
`torch.load(weights_only=True)` (or, in TorchScript, outside `__torch__` types) is refused in one line.

- TorchScript archive (zip with `code/`): `torch.jit.load`. Its unpickler only builds TorchScript
  types, so loading runs no Python code from the file.
- torch.export program (zip with `archive_format`, usually `.pt2`): read by `load_export_program`,
  never by `torch.export.load` (which falls back to unrestricted unpickling, `exec`s the file's guard
  code and `sympify`s (evaluates) its shape expressions). Members that would be unpickled, native code
  (AOTInductor), legacy archives, operators outside `torch.ops` / symbolic integer arithmetic and
  shape expressions that are not plain arithmetic on symbols are refused; guard code and node
  metadata are dropped; weights are read as raw bytes and sample inputs with `weights_only=True`.
- safetensors weights (8-byte header length, then JSON): `safetensors.torch.load_file`.
- `torch.save` files (zip with `data.pkl`, or a legacy pickle): `torch.load(weights_only=True)`.
  A pickle that needs arbitrary code (a whole `torch.save(model)`, or a crafted `__reduce__`
  payload) is refused before anything runs, and reported in one line.

A module saved in training mode with batch norm or dropout is refused (call `model.eval()` first).

Weights (safetensors or a state dict) need an architecture spec: the JSON that
`empirics.nets.models.save_model` writes beside them (`PATH.json`, or `--spec FILE`); only the suite's
own networks can be rebuilt from weights.

Data (`--train`, `--test`), read by `empirics.data.userdata` (the data front-end the experiments use too;
`Split`, `load_split`, `check_labels` and `sniff_format` stay importable from here): a `.npz` with
arrays `x`, `y` (or `x_train`, `y_train`, `x_test`, `y_test`), an MNIST IDX folder, a CIFAR-10
python-batch folder, an image folder `ROOT/{train,test}/<class>/*.png|jpg`, or a built-in data set name
(`mnist`, `cifar10`). Inputs must lie in [0, 1] (uint8 is divided by 255): attacks use eps in pixel
units and clip to [0, 1], so normalisation belongs inside the model. Every problem is a one-line `UserInputError`.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from empirics.data.userdata import Split, sniff_format
from empirics.data.userdata import check_labels as check_labels
from empirics.data.userdata import first_line as _first_line
from empirics.data.userdata import load_split as load_split
from ntkm.errors import UserInputError
from ntkm.io import sha256_file

MODEL_FORMATS = ("torchscript", "export", "safetensors", "state-dict")
SPEC_FORMAT = "ntk-malleability-suite/two-layer"
SAVE_HINT = ("save a state_dict (with its --spec JSON), torch.jit.script(model).save(PATH) or "
             "torch.export.save(torch.export.export(model, (x,)), PATH) instead")


# --- reading pickles without unpickling them -----------------------------------------------------

_FALLBACK_TENSOR_GLOBALS = frozenset({
    "collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device",
    *(f"torch.{t}Storage" for t in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char",
                                   "Byte", "Bool", "ComplexFloat", "ComplexDouble")),
})
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
                         "BINSTRING", "STRING"})
_NEUTRAL_OPS = frozenset({"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME", "PROTO"})
_TS_MODULES = ("__torch__", "torch.jit._pickle")


def tensor_globals() -> frozenset[str]:
    """The globals `torch.load(weights_only=True)` may build: the tensor-only pickle format."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        return frozenset(str(k) for k in _get_allowed_globals())
    except (ImportError, AttributeError):
        return _FALLBACK_TENSOR_GLOBALS


def torchscript_global(name: str) -> bool:
    """Whether a TorchScript archive's pickle may name this global (its own types, tensors)."""
    return name.split(".")[0] in _TS_MODULES or name.startswith("torch.jit._pickle.") or name in tensor_globals()


def _pickle_globals(f: io.BytesIO) -> list[str]:
    """Every global one pickle names (as module.name), from its opcodes; never unpickles.

    A STACK_GLOBAL must take its module and name straight from string pushes (or memo reads of
    them); anything computed otherwise, and the copyreg extension opcodes, yield '<unresolved>'.
    """
    found: list[str] = []
    memo: dict[int, str | None] = {}
    pushes: list[str | None] = []
    for op, arg, _pos in pickletools.genops(f):
        name = op.name
        if name in _STRING_OPS:
            pushes.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
        elif name == "MEMOIZE":
            memo[len(memo)] = pushes[-1] if pushes else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushes[-1] if pushes else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            pushes.append(memo.get(int(arg)))
        elif name in _NEUTRAL_OPS:
            continue
        elif name in ("GLOBAL", "INST"):
            found.append(str(arg).replace(" ", ".", 1))
            pushes.append(None)
        elif name == "STACK_GLOBAL":
            mod, attr = (pushes[-2], pushes[-1]) if len(pushes) >= 2 else (None, None)
            found.append(f"{mod}.{attr}" if mod is not None and attr is not None else "<unresolved>")
            pushes.append(None)
        elif name.startswith("EXT"):
            found.append("<unresolved>")
            pushes.append(None)
        else:
            pushes.append(None)
    return found


def check_pickle(data: bytes, where: str, allowed: Callable[[str], bool], count: int = 1) -> None:
    """Refuse `data` unless its first `count` pickles (fewer if the data ends) name only allowed globals.

    A legacy `torch.save` file is five pickles in a row (then raw storage bytes); a zip member one.
    """
    f = io.BytesIO(data)
    for i in range(count):
        if i and f.tell() >= len(data):
            return
        try:
            names = _pickle_globals(f)
        except Exception as exc:  # noqa: BLE001 - pickletools raises many kinds on malformed data
            raise UserInputError(f"{where} is not a well-formed pickle ({_first_line(exc, 80)}); it was refused "
                                 f"and nothing in it ran; {SAVE_HINT}") from None
        bad = sorted({n for n in names if not allowed(n)})
        if bad:
            raise UserInputError(f"{where} holds a pickle that needs arbitrary code to load (it names "
                                 f"{', '.join(bad[:3])}); it was refused and nothing in it ran; {SAVE_HINT}")


def _check_zip_pickles(zf: zipfile.ZipFile, where: str, allowed: Callable[[str], bool]) -> None:
    """Every `.pkl` member of a torch zip archive, read without unpickling."""
    for info in zf.infolist():
        if info.filename.endswith(("pkl", ".pickle")):
            check_pickle(zf.read(info), f"{where} (member {info.filename})", allowed)


def check_torch_file(data: bytes, where: str) -> None:
    """A `torch.save` file (zip or legacy) in the tensor-only format, else a one-line refusal."""
    allowed = tensor_globals().__contains__
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                _check_zip_pickles(zf, where, allowed)
        except zipfile.BadZipFile as exc:
            raise UserInputError(f"{where} is not a readable zip archive ({_first_line(exc)})") from None
    else:
        check_pickle(data, where, allowed, count=5)


# --- torch.export programs, read without torch.export.load -----------------------------------------

_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z_]*[0-9]+$")
_SYMPY_CALLS = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "StrictGreaterThan",
    "StrictLessThan", "GreaterThan", "LessThan", "Equality", "Unequality", "BooleanTrue", "BooleanFalse",
    "Abs", "Mod", "floor", "ceiling", "Eq", "Ne", "Lt",
    "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise", "FloorDiv", "ModularIndexing", "Where", "PythonMod",
    "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
    "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
    "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
})
_SYMPY_NAMES = frozenset({"True", "False", "oo", "zoo", "nan", "int_oo"})
_TRAINING_OPS = ("_native_batch_norm_legit_functional", "native_dropout", "_native_batch_norm_legit.default")


def _safe_sym_expr(text: str) -> bool:
    """Whether a shape expression is plain arithmetic on symbols (sympy evaluates it as Python)."""
    import ast

    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    ok_nodes = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.Name, ast.Load,
                ast.Constant, ast.keyword, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
    for node in ast.walk(tree):
        if not isinstance(node, ok_nodes):
            return False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS):
            return False
        if isinstance(node, ast.Name) and node.id not in _SYMPY_CALLS and node.id not in _SYMPY_NAMES \
                and not _SYMBOL.match(node.id):
            return False
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and not _SYMBOL.match(node.value):
            return False
        if isinstance(node, ast.Constant) and not isinstance(node.value, (str, int, float, bool)):
            return False
    return True


def _safe_target(target: str) -> bool:
    """Whether a graph node's target is a torch operator or symbolic-integer arithmetic."""
    import operator

    from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

    parts = target.split(".")
    if any(not p or "__" in p for p in parts):
        return False
    roots = {"torch": torch, "_operator": operator, "math": math}
    if parts[0] not in roots or len(parts) < 2:
        return False
    obj: Any = roots[parts[0]]
    for part in parts[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    if isinstance(obj, (OpOverload, OpOverloadPacket, HigherOrderOperator)):
        return parts[1] == "ops"
    try:
        from torch._export.serde.serialize import _SYM_OPS
    except ImportError:
        _SYM_OPS = set()
    return obj in _SYM_OPS or obj is operator.getitem or (parts[0] == "math" and callable(obj))


def _sanitise_program(doc: Any, where: str) -> None:
    """Check every node target and shape expression of a serialized program; drop guard code and node
    metadata (neither is needed to run it; both reach `exec` or codegen)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
        raise UserInputError(f"{where}: the program JSON has no graph_module; re-save with torch.export.save")
    doc["guards_code"] = []
    stack: list[Any] = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, list):
            stack.extend(obj)
            continue
        if not isinstance(obj, dict):
            continue
        if "target" in obj and "inputs" in obj and "outputs" in obj:
            target = obj.get("target")
            if not isinstance(target, str) or not _safe_target(target):
                raise UserInputError(f"{where}: the program calls '{str(target)[:80]}', which is not a torch "
                                     "operator; refused (only torch.ops and symbolic-size arithmetic are run)")
            if any(t in target for t in _TRAINING_OPS) or _training_flag(obj):
                raise UserInputError(f"{where}: the program runs batch norm or dropout in training mode; call "
                                     "model.eval() before torch.export.export(model, ...) and save it again")
            obj["metadata"] = {}
        expr = obj.get("expr_str")
        if isinstance(expr, str) and not _safe_sym_expr(expr):
            raise UserInputError(f"{where}: a shape expression is not plain arithmetic on symbols "
                                 f"('{expr[:60]}'); refused")
        stack.extend(v for k, v in obj.items() if k != "expr_str")


def _training_flag(node: dict[str, Any]) -> bool:
    """A batch_norm / dropout node whose `training` / `train` argument is True."""
    if not any(k in str(node.get("target")) for k in ("batch_norm", "dropout")):
        return False
    for inp in node.get("inputs") or []:
        if isinstance(inp, dict) and inp.get("name") in ("training", "train"):
            if isinstance(inp.get("arg"), dict) and inp["arg"].get("as_bool") is True:
                return True
    return False


def _payload_config(raw: bytes, where: str, tensor_prefix: str | None) -> dict[str, Any]:
    try:
        cfg = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{where} is not valid JSON ({_first_line(exc)})") from None
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    if not isinstance(entries, dict):
        raise UserInputError(f"{where} has no 'config' table; re-save with torch.export.save")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") or not isinstance(meta.get("path_name"), str):
            raise UserInputError(f"{where}: entry '{fqn}' is stored as a pickle (or is malformed); refused and "
                                 "nothing in it ran; export a model whose weights and constants are plain tensors")
        if tensor_prefix is not None and not meta["path_name"].startswith(tensor_prefix):
            raise UserInputError(f"{where}: constant '{fqn}' is a Python or custom object, not a tensor; refused")
    return cfg


def load_export_program(path: Path) -> Any:
    """An `ExportedProgram` from a `.pt2`, read member by member without unrestricted unpickling."""
    where = str(path)
    try:
        from torch._export.serde import schema
        from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass
        from torch.export.pt2_archive._package import PT2ArchiveReader, _load_constants, _load_state_dict
    except ImportError:
        raise UserInputError(f"{where}: this torch version cannot read .pt2 archives safely; save the model "
                             "with torch.jit.script(model).save(PATH) instead") from None
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename.split("/", 1)[1] if "/" in i.filename else i.filename: i for i in zf.infolist()}

        def read(name: str) -> bytes:
            return zf.read(infos[name]) if name in infos else b""

        if any(n.startswith("data/aotinductor/") or n.endswith((".so", ".dll", ".dylib", ".pyd")) for n in infos):
            raise UserInputError(f"{where} contains compiled native code (AOTInductor); refused; save the program "
                                 "with torch.export.save(torch.export.export(model, (x,)), PATH) instead")
        if "serialized_exported_program.json" in infos or "data/weights/model.pt" in infos \
                or "data/constants/model.pt" in infos:
            raise UserInputError(f"{where} is a torch.export archive in a legacy format whose weights are pickles; "
                                 "re-save it with torch.export.save in torch >= 2.7")
        if read("archive_format").strip() != b"pt2" or "models/model.json" not in infos:
            raise UserInputError(f"{where} is not a torch.export archive with one program 'model'; "
                                 "save it with torch.export.save(torch.export.export(model, (x,)), PATH)")
        for name in infos:
            if name.endswith(("pkl", ".pickle")):
                check_pickle(read(name), f"{where} (member {name})", tensor_globals().__contains__)
            elif name.endswith(".pt"):
                check_torch_file(read(name), f"{where} (member {name})")
        _payload_config(read("data/weights/model_weights_config.json"), f"{where} (weights config)", None)
        _payload_config(read("data/constants/model_constants_config.json"), f"{where} (constants config)",
                        "tensor")
        try:
            doc = json.loads(read("models/model.json"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserInputError(f"{where}: models/model.json is not valid JSON ({_first_line(exc)})") from None
        _sanitise_program(doc, where)
        sample_raw = read("data/sample_inputs/model.pt")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sample = torch.load(io.BytesIO(sample_raw), map_location="cpu", weights_only=True) if sample_raw else None
            if sample is not None and not isinstance(sample, tuple):
                raise UserInputError(f"{where}: the sample inputs are a {type(sample).__name__}, not a tuple")
            with PT2ArchiveReader(str(path)) as reader:
                state_dict = _load_state_dict(reader, "model")
                constants = _load_constants(reader, "model")
            if not isinstance(state_dict, dict) or not isinstance(constants, dict):
                raise UserInputError(f"{where}: weights in a legacy pickled layout; refused")
            program = _dict_to_dataclass(schema.ExportedProgram, doc)
            return ExportedProgramDeserializer(None).deserialize(program, state_dict, constants, sample)
    except UserInputError:
        raise
    except pickle.UnpicklingError as exc:
        raise _refuse_pickle(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - any failure of the deserializer is a bad file
        raise UserInputError(f"{where} looks like a torch.export program but cannot be loaded "
                             f"({_first_line(exc)})") from None


def export_module(ep: Any) -> nn.Module:
    """The runnable module of an exported program, without its generated guard code."""
    import inspect

    if "check_guards" in inspect.signature(ep.module).parameters:
        return ep.module(check_guards=False)
    return ep.module()


def _check_eval_mode(module: Any, where: str) -> None:
    """Refuse a TorchScript module saved in training mode that has batch norm or dropout."""
    kinds = ("BatchNorm", "Dropout", "SyncBatchNorm")
    for sub in [module, *module.modules()]:
        name = str(getattr(sub, "original_name", type(sub).__name__))
        if getattr(sub, "training", False) and any(k in name for k in kinds):
            raise UserInputError(f"{where} was saved in training mode with {name} (its output would depend on the "
                                 "batch or be random); call model.eval() before torch.jit.script(model).save(PATH)")


# --- models --------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A loaded model and what is known about it before it meets data."""

    module: nn.Module
    fmt: str
    path: Path
    sha256: str
    size_bytes: int
    graph: torch.fx.GraphModule | None = None
    static_batch: int | None = None
    declared_shape: tuple[int, ...] | None = None
    spec: dict[str, Any] | None = None
    spec_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def is_suite(self) -> bool:
        return self.spec is not None

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters() if p.requires_grad)

    def widest_layer(self) -> int:
        """The largest output width of a weight matrix or kernel (the model's "width")."""
        if self.spec is not None:
            return int(self.spec["width"])
        dims = [int(p.shape[0]) for p in self.module.parameters() if p.dim() >= 2]
        return max(dims) if dims else 0

    def describe(self) -> dict[str, Any]:
        name = getattr(self.module, "original_name", None) or type(self.module).__name__
        return {"format": self.fmt, "path": str(self.path), "sha256": self.sha256, "bytes": self.size_bytes,
                "class": str(name), "parameters": self.n_params, "widest_layer": self.widest_layer(),
                "static_batch": self.static_batch, "spec": self.spec,
                "spec_path": str(self.spec_path) if self.spec_path else None, "notes": list(self.notes)}


def _refuse_pickle(path: Path, exc: BaseException) -> UserInputError:
    return UserInputError(
        f"{path} is a pickle that needs arbitrary code to load (e.g. torch.save of a whole model); it was "
        f"refused and nothing in it ran ({_first_line(exc, 80)}); {SAVE_HINT}")


def _torch_load_weights(path: Path) -> dict[str, torch.Tensor]:
    check_torch_file(path.read_bytes(), str(path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refuse_pickle(path, exc) from None
    except (RuntimeError, EOFError, ValueError, OSError, AttributeError) as exc:
        raise UserInputError(f"{path} is not a readable torch.save file ({_first_line(exc)})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserInputError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors; {SAVE_HINT}")
    return {str(k): v for k, v in obj.items()}


def _load_spec(weights: Path, spec: str | Path | None) -> tuple[dict[str, Any], Path]:
    cands = [Path(spec)] if spec else [weights.with_name(weights.name + ".json"), weights.with_suffix(".json")]
    found = next((c for c in cands if c.is_file()), None)
    if found is None:
        where = str(cands[0]) if spec else " or ".join(str(c) for c in cands)
        raise UserInputError(f"weights in {weights} need an architecture spec but {where} does not exist; pass "
                             "--spec FILE (the JSON empirics.nets.models.save_model writes), or save the model with "
                             "torch.jit.script(model).save(PATH) or torch.export.save(...) instead")
    try:
        doc = json.loads(found.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"spec {found} is not valid JSON ({_first_line(exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != SPEC_FORMAT or not isinstance(doc.get("spec"), dict):
        raise UserInputError(f"spec {found} is not a '{SPEC_FORMAT}' file (written by empirics.nets.models.save_model)")
    return doc["spec"], found


def _build_suite(tensors: dict[str, torch.Tensor], spec: dict[str, Any], path: Path) -> nn.Module:
    from empirics.nets.kinds import kind as kind_of
    from empirics.nets.models import ModelSpec, build_model

    try:
        ms = ModelSpec(**spec)
    except TypeError as exc:
        raise UserInputError(f"spec for {path} has unknown or missing fields ({_first_line(exc)})") from None
    dummy = (torch.ones(1, ms.d) if kind_of(ms.kind).attention_options or ms.preprocess != "raw"
             else None)  # buffers come from the file
    model = build_model(ms, dummy)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)
    except RuntimeError as exc:
        raise UserInputError(f"weights in {path} do not match the spec ({_first_line(exc)})") from None
    return model.eval()


def _exported_input(ep: Any) -> tuple[tuple[int, ...] | None, int | None]:
    """Per-example input shape and static batch size (None when dynamic) of an exported program."""
    users = list(ep.graph_signature.user_inputs)
    if len(users) != 1:
        raise UserInputError(f"the exported program takes {len(users)} inputs; the audit needs a model with "
                             "one tensor input")
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name == users[0]:
            val = node.meta.get("val")
            if val is None or not hasattr(val, "shape"):
                return None, None
            shape = list(val.shape)
            if not shape:
                return None, None
            rest = tuple(int(s) for s in shape[1:]) if all(isinstance(s, int) for s in shape[1:]) else None
            return rest, (int(shape[0]) if isinstance(shape[0], int) else None)
    return None, None


def keep_forkable() -> None:
    """Run autograd's engine once now, before a `.pt2` is read, so that processes forked later can run a backward.

    The engine starts its device threads once, at the first backward of a process, and only where a registered device
    type counts at least one device; starting them marks the process, and a forked child's backward then raises
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing"). In torch's CUDA builds
    (seen with 2.11.0+cu130 and 2.14.1+cu130 on a machine without a GPU; not in 2.13.0+cpu) reading a `.pt2` makes
    the count positive, so the model check's backward marked the audit and its CPU re-fit workers failed. A backward
    before the read finds no device, and the engine does not look again. Where a GPU is visible the engine's threads
    would start anyway (torch's code; not measured here) and the re-fit workers fall back to one process, saying why
    (`refit.Refitter._pooled`)."""
    w = torch.zeros((), requires_grad=True)
    (w * 2.0).backward()


def load_model(path: str | Path, spec: str | Path | None = None) -> LoadedModel:
    """Load a model file safely (see the module docstring); raises one-line `UserInputError`s."""
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise UserInputError(f"model file {p} does not exist")
    if not p.is_file():
        what = "a folder" if p.is_dir() else "a named pipe, device or socket (reading it could block forever)"
        raise UserInputError(f"model path {p} is {what}; give a TorchScript, torch.export or weights file")
    fmt = sniff_format(p)
    common = {"path": p, "sha256": sha256_file(p), "size_bytes": p.stat().st_size}
    if fmt == "torchscript":
        with zipfile.ZipFile(p) as zf:
            _check_zip_pickles(zf, str(p), torchscript_global)
        try:
            module = torch.jit.load(str(p), map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any failure of the TorchScript loader is a bad file
            raise UserInputError(f"{p} looks like TorchScript but cannot be loaded ({_first_line(exc)})") from None
        _check_eval_mode(module, str(p))
        module.eval()
        return LoadedModel(module, "torchscript", **common)
    if fmt == "export":
        keep_forkable()
        ep = load_export_program(p)
        shape, batch = _exported_input(ep)
        gm = export_module(ep)
        notes = [] if batch is None else [f"exported with a static batch size {batch}; inputs are padded to it"]
        return LoadedModel(gm, "export", graph=gm, static_batch=batch, declared_shape=shape, notes=notes, **common)
    if fmt in ("safetensors", "torch-zip", "pickle"):
        if fmt == "safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                tensors = load_file(str(p))
            except (SafetensorError, OSError, ValueError) as exc:
                raise UserInputError(f"{p} is not a readable safetensors file ({_first_line(exc)})") from None
        else:
            tensors = _torch_load_weights(p)
        sp, sp_path = _load_spec(p, spec)
        module = _build_suite(tensors, sp, p)
        return LoadedModel(module, "safetensors" if fmt == "safetensors" else "state-dict", spec=sp,
                           spec_path=sp_path, declared_shape=(int(sp["d"]),), **common)
    if fmt == "npz":
        raise UserInputError(f"{p} is a NumPy .npz data file, not a model; pass it to --train or --test")
    if fmt == "json":
        raise UserInputError(f"{p} is a JSON file; pass architecture specs with --spec and the weights to --model")
    raise UserInputError(f"{p} is not a model format the audit reads (TorchScript, torch.export .pt2, "
                         "safetensors + spec, or a torch.save state dict); its first bytes are not recognised")


def _model_error(exc: BaseException) -> str:
    """'Type: message' of the model's error; for TorchScript's interpreter, the error the script raised (its
    last line) rather than the interpreter's banner."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if len(lines) > 1 and "TorchScript interpreter" in lines[0]:
        return lines[-1][:160]
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:120]}"


class ModelFailure(UserInputError):
    """The user's model failed in a forward pass during the audit: the audit is not measurable (one line, exit 2,
    no risk level); `reason` is the model's own error."""

    def __init__(self, reason: str):
        super().__init__(f"not measurable: your model failed in a forward pass during the audit ({reason}); no "
                         "risk level is issued; fix the model so that it runs on any batch and rerun")
        self.reason = reason


class FlatInput(nn.Module):
    """Calls a model on flat inputs (n, d): reshapes to the model's input shape and, for a program
    exported with a static batch size, runs chunks of exactly that size (padding the last).

    Outputs are (n, c) (a 1-D output becomes one column). `train()`/`eval()` do not reach the inner
    model (exported programs refuse them; the audit always evaluates).
    """

    def __init__(self, inner: nn.Module, input_shape: tuple[int, ...], static_batch: int | None = None):
        super().__init__()
        self.inner = inner
        self.input_shape = tuple(input_shape)
        self.static_batch = static_batch

    def train(self, mode: bool = True) -> FlatInput:
        self.training = mode
        return self

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        try:
            out = self.inner(x)
        except Exception as exc:  # noqa: BLE001 - the user's model failed: the audit cannot go on (ModelFailure)
            raise ModelFailure(_model_error(exc)) from None
        while isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise UserInputError(f"the model returned {type(out).__name__}; the audit needs a tensor of logits")
        if out.dim() not in (1, 2):
            raise UserInputError(f"the model returned outputs of shape {_fmt_shape(tuple(out.shape))}; the audit needs "
                                 "logits of shape (n, classes) (or (n,) for one output): reshape or pool inside "
                                 "the model")
        return out.unsqueeze(1) if out.dim() == 1 else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        xs = x.reshape(n, *self.input_shape)
        b = self.static_batch
        if not b or n == b:
            return self._call(xs)
        outs = []
        for i in range(0, n, b):
            chunk = xs[i:i + b]
            k = chunk.shape[0]
            if k < b:
                chunk = torch.cat([chunk, chunk[-1:].expand(b - k, *self.input_shape)])
            outs.append(self._call(chunk)[:k])
        return torch.cat(outs)


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """'1,28,28' -> (1, 28, 28); None stays None."""
    if text is None:
        return None
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise UserInputError(f"--input-shape must be comma-separated integers like 1,28,28, got '{text}'") from None
    if not shape or any(s < 1 for s in shape):
        raise UserInputError(f"--input-shape must be positive integers like 1,28,28, got '{text}'")
    return shape


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _try_forward(model: FlatInput, x: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """The model's outputs on `x`, or None and the first line of its error (`UserInputError` propagates)."""
    try:
        with torch.no_grad():
            return model(x), ""
    except ModelFailure as exc:
        return None, exc.reason
    except UserInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model is reported, not raised
        return None, _first_line(exc, 100)


def bind_input(loaded: LoadedModel, x_sample: np.ndarray, image_shape: tuple[int, ...] | None,
               input_shape: tuple[int, ...] | None = None) -> tuple[FlatInput, tuple[int, ...], int]:
    """The model wrapped for flat inputs, its per-example input shape and its number of outputs.

    Tries `input_shape` if given, else the shape the file declares, else flat (d,) and then the data's
    image shape, with a forward pass on two examples. Checks that outputs are finite and that each
    example's output does not depend on the others in the batch.
    """
    d = int(x_sample.shape[1])
    if input_shape is not None:
        cands = [input_shape]
    elif loaded.declared_shape is not None:
        cands = [loaded.declared_shape]
    else:
        cands = [(d,)] + ([tuple(image_shape)] if image_shape and tuple(image_shape) != (d,) else [])
    for shape in cands:
        if math.prod(shape) != d:
            want = "the model expects" if shape in (input_shape, loaded.declared_shape) else "shape"
            raise UserInputError(f"{want} inputs of shape {_fmt_shape(shape)} per example ({math.prod(shape)} "
                                 f"values) but the data has {d} values per example{_img(image_shape)}")
    x = torch.as_tensor(x_sample[:2], dtype=torch.float32)
    errors = []
    for shape in cands:
        model = FlatInput(loaded.module, shape, loaded.static_batch)
        out, failure = _try_forward(model, x)
        if out is None:
            errors.append(f"{_fmt_shape(shape)}: {failure}")
            continue
        _check_output(out, x.shape[0])
        if loaded.static_batch is None and x.shape[0] > 1:
            with torch.no_grad():
                alone = model(x[1:2])
            if not torch.allclose(alone, out[1:2], rtol=1e-4, atol=1e-5):
                raise UserInputError("the model's output for one example changes with the other examples in the "
                                     "batch (batch norm or dropout in training mode?); call model.eval() before "
                                     "saving it")
        return model, tuple(shape), int(out.shape[1])
    tried = "; ".join(errors)
    raise UserInputError(f"the model does not accept the data ({d} values per example{_img(image_shape)}); "
                         f"tried input shapes {tried}; pass --input-shape C,H,W")


def probe_batches(model: FlatInput, splits: dict[str, np.ndarray], sizes: tuple[int, ...], classes: int) -> None:
    """Run the model on every batch size the audit uses (each whole split, the attacked subset, one
    example) before any work: each must give finite outputs of shape (n, classes)."""
    for name, x in splits.items():
        for n in sorted({len(x), *(s for s in sizes if 1 <= s <= len(x))}):
            out, failure = _try_forward(model, torch.as_tensor(x[:n], dtype=torch.float32))
            if out is None:
                raise UserInputError(f"the model fails on a batch of {n} {name} examples ({failure}); it must "
                                     "accept any batch size (export with a dynamic batch dimension)")
            if tuple(out.shape) != (n, classes):
                raise UserInputError(f"the model returned shape {_fmt_shape(tuple(out.shape))} for a batch of {n} "
                                     f"{name} examples but ({n}, {classes}) for two; outputs must be (n, classes)")
            if not torch.isfinite(out).all():
                raise UserInputError(f"the model returned NaN or Inf on a batch of {n} {name} examples; fix the "
                                     "model (or the data) so that every output is finite")


def check_varied(split: Split, where: str) -> None:
    """Refuse data whose examples are all identical (e.g. all-zero images): influence is not measurable."""
    if len(split.x) >= 2 and float(np.ptp(split.x, axis=0).max()) == 0.0:
        v = float(split.x[0].max())
        raise UserInputError(f"{where}: not measurable: all {len(split.x)} inputs are identical (every pixel "
                             f"{v:g} in every example{', all-zero images' if v == 0 else ''}), so influence and flip "
                             "rates are undefined; check how the data were exported")


def _img(image_shape: tuple[int, ...] | None) -> str:
    return f", image shape {_fmt_shape(tuple(image_shape))}" if image_shape else ""


def _check_output(out: torch.Tensor, n: int) -> None:
    if out.shape[0] != n:
        raise UserInputError(f"the model returned {out.shape[0]} rows for {n} examples; it must return one "
                             "row of logits per example")
    if not torch.isfinite(out).all():
        raise UserInputError("the model returned NaN or Inf on the training data")


def fx_graph_for(loaded: LoadedModel, model: FlatInput, x_sample: np.ndarray) -> torch.fx.GraphModule | None:
    """An FX graph computing the same function (enables the fast kernel path), or None.

    Exported programs have one. A TorchScript module is converted with torch's TorchScript-to-export
    converter when it can be, and the result is used only if it reproduces the module's outputs.
    """
    if loaded.graph is not None:
        return loaded.graph
    if loaded.fmt != "torchscript":
        return None
    x = torch.as_tensor(x_sample[:3], dtype=torch.float32)
    xs = x.reshape(x.shape[0], *model.input_shape)
    try:
        import logging

        from torch._export.converter import TS2EPConverter

        level = logging.getLogger("torch").level
        logging.getLogger("torch").setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                gm = TS2EPConverter(loaded.module, (xs,)).convert().module()
                same = torch.allclose(FlatInput(gm, model.input_shape)(x), model(x), rtol=1e-5, atol=1e-6)
                same = same and torch.allclose(FlatInput(gm, model.input_shape)(x[:1]), model(x[:1]),
                                               rtol=1e-5, atol=1e-6)
        finally:
            logging.getLogger("torch").setLevel(level)
    except Exception:  # noqa: BLE001 - the converter is optional; any failure means "no graph"
        return None
    from empirics.kernels.audit_ntk import trainable

    n_ts = sum(p.numel() for p in loaded.module.parameters() if p.requires_grad)
    if not same or sum(t.numel() for t in trainable(gm).values()) != n_ts:
        return None
    loaded.notes.append("TorchScript converted to an FX graph (checked against the module's outputs) "
                        "for the factored kernel path")
    return gm


#: Copies of the parameters (4 bytes each) the audit holds at least at once: the model, a gradient, a per-example
#: gradient, a re-fit's copy, its gradient and Adam's two moments, and one spare. A model whose parameters need
#: more than the memory budget (or the memory the machine has) is refused before any kernel work.
PARAM_COPIES = 8


def available_memory() -> int:
    """Bytes this process may still allocate: the machine's available memory, within the address-space limit
    (`ulimit -v`, less what the process already maps) when one is set."""
    from empirics.data.userdata import memory_bytes

    avail = memory_bytes()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
            avail = min(avail, max(soft - mapped, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return avail


def check_model(model: FlatInput, loaded: LoadedModel, train: Split, test_labels: np.ndarray, out_dim: int,
                max_bytes: int) -> None:
    """The audit's model checks, before any panel (one-line `UserInputError`; "not measurable: ..." where the
    model cannot be audited at all), on the training split (its first examples are the probe batch; its class
    names, where the data names them) and the labels of both splits:

    - the model has trainable parameters, and their count fits the memory budget and the machine
      (`PARAM_COPIES` copies of 4 bytes each);
    - its outputs match the number of classes of the data (the class names' count where the data names them,
      else at most 2 x (largest label + 1) + 8 outputs, so a missing top class in a small sample is no error);
    - on a probe batch its logits are finite with and without autograd, the same both ways, and gradients of
      them reach its parameters (logits computed under torch.no_grad() or detached inside forward cannot be
      differentiated: influence is not measurable).
    """
    params = [p for p in loaded.module.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    if n_params == 0:
        raise UserInputError("not measurable: the model has no trainable parameters (influence and the kernel are "
                             "gradients with respect to them); give the trained model with its parameters")
    need = PARAM_COPIES * 4 * n_params
    avail = available_memory()
    if need > max_bytes or need > avail:
        which = (f"the --max-memory-gb budget of {max_bytes / 2**30:.3g} GiB" if need <= avail or max_bytes < avail
                 else f"the {avail / 2**30:.3g} GiB of memory available")
        raise UserInputError(f"the model has {n_params:,} parameters: the audit holds at least {PARAM_COPIES} copies "
                             f"of them ({need / 2**30:.3g} GiB), more than {which}; raise --max-memory-gb (on a "
                             "machine with that memory) or audit a smaller model")
    labels, classes = np.concatenate([train.y, test_labels]), train.classes
    top = int(labels.max()) + 1 if labels.size else 1
    if classes:
        wanted = len(classes)
        ok = out_dim == wanted or (wanted == 2 and out_dim == 1)
        what = f"the data names {wanted} classes"
    else:
        ok = out_dim <= 2 * max(top, 2) + 8
        what = f"the labels run 0..{top - 1}"
    if not ok:
        raise UserInputError(f"the model has {out_dim} outputs but {what}; the outputs must be one logit per class "
                             "(or one output for a binary task): give the model trained on these classes")
    x = torch.as_tensor(train.x[:2], dtype=torch.float32)
    with torch.no_grad():
        plain = model(x)
    with torch.enable_grad():
        out = model(x)
    if not torch.isfinite(plain).all():
        raise UserInputError("not measurable: the model returns NaN or Inf on a probe batch of training examples; "
                             "fix the model (or the data) so that every output is finite")
    if not torch.isfinite(out).all():
        raise UserInputError("not measurable: the model's outputs are finite without autograd but NaN or Inf while "
                             "gradients are recorded; gradients and influence would be NaN: fix the model")
    if not torch.allclose(out.detach(), plain, rtol=1e-4, atol=1e-5):
        raise UserInputError("not measurable: the model's outputs differ with and without autograd on the same "
                             "batch; the audit differentiates the function it evaluates: fix the model")
    if not out.requires_grad:
        raise UserInputError("not measurable: the model's outputs do not depend on its parameters with autograd "
                             "(logits computed under torch.no_grad() or detached inside forward?); influence is a "
                             "gradient: return logits computed with autograd")
    grads = torch.autograd.grad(out.float().square().sum(), params, allow_unused=True)
    if all(g is None for g in grads):
        raise UserInputError("not measurable: no gradient of the model's outputs reaches its parameters (the "
                             "logits are detached from them); influence is a gradient: fix the model")
    if not all(torch.isfinite(g).all() for g in grads if g is not None):
        raise UserInputError("not measurable: the gradients of the model's outputs with respect to its parameters "
                             "are NaN or Inf on a probe batch; fix the model")
