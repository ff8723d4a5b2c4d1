"""Device discipline, checked statically (issue 39 item 1): on the training, NTK, influence, attack, landscape,
retrain and audit paths (`empirics/`, `verify/audit/`) every tensor a torch factory makes lives on the device of its
inputs or model, and what stays on the CPU by design says so here.

The rule. A call of a tensor factory (`FACTORIES`: `torch.tensor`, `torch.zeros`, ... `torch.from_numpy`, by
attribute of an imported `torch` or by a name imported from it) passes when

- it has a `device=` keyword (not `torch.from_numpy`, which has none and always makes a CPU tensor), or
- its result is moved at once: the receiver of `.to(...)` with a device (`.to(x)`, `.to(device)`,
  `.to(device=...)`; not `.to(dtype)`, `.to(torch.float64)`, `.to(dtype=...)`) or of `.cuda()`, possibly through
  arithmetic with plain numbers (`(torch.rand(s, generator=g) * 2 - 1).to(x)`, `/ math.sqrt(k)`) and dtype casts
  (`.float()`, `.to(dtype)`) on the way.

`torch.*_like`, `x.new_*` and `torch.nn.functional.one_hot` take their input's device and are not factories here.
A factory call inside `register_buffer(name, ...)` is reported as such (a buffer made on the CPU beside inputs on a
GPU was bug (1) of issue 39). Every other call is reported as `path:line function: call` and fails
`test_every_tensor_factory_takes_its_device`, unless (path, enclosing function's qualified name, factory) is on
`ALLOWED` with the reason it stays on the CPU. Keys name functions, not lines, so the list survives edits; an entry
that no longer matches anything fails `test_allow_list_is_current`.

What the static rule cannot see (arithmetic between tensors that arrived on different devices, like bug (2) of the
issue: GPU outputs minus labels held on the CPU) is checked by running the code on torch's `meta` device, which
refuses to mix with CPU tensors: tests/empirics/test_device_meta.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The folders whose `.py` files are checked (recursively), relative to the repository root.
SCANNED = ("empirics", "verify/audit")
#: Torch functions that make a tensor, on the default device (the CPU) unless told otherwise.
FACTORIES = frozenset({"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "eye", "linspace", "rand",
                       "randn", "randint", "randperm", "from_numpy"})
#: Methods that change a tensor's dtype only: a result passed through them is not yet moved.
DTYPE_CASTS = frozenset({"float", "double", "half", "bfloat16", "int", "long", "bool", "type"})

_LOADED_ON_CPU = ("the user's model is loaded, bound to the data's shape and probed on the CPU; binding.bind then "
                  "moves the model and the data once to the audit's device")
_CPU_GENERATOR_MODULE = ("a fresh module's weights are drawn by its seeded CPU generator (the same network on every "
                         "device); build_model moves the whole module with .to(device) before it sees data")

#: (path, function qualname, factory) -> why this call makes a CPU tensor. One line each.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("empirics/nets/models.py", "_init_head", "randn"): _CPU_GENERATOR_MODULE,
    ("empirics/nets/models.py", "_init_head", "randint"): _CPU_GENERATOR_MODULE,
    ("empirics/nets/models.py", "QKVAttentionNet.__init__", "randn"): _CPU_GENERATOR_MODULE,
    ("empirics/nets/models.py", "preprocessed_inputs", "as_tensor"):
        "numpy interop: numpy inputs in, numpy out (.numpy()), the analytic reference kernels' inputs on the CPU",
    ("empirics/attribution/influence.py", "influence_from_kernels", "as_tensor"):
        "numpy interop: the kernel predictions F (numpy, from the solves) to labels, back to numpy",
    ("empirics/attribution/influence.py", "retrain_study", "as_tensor"):
        "a CPU study (RetrainConfig has no device): its data arrive as numpy and every tensor follows them",
    ("empirics/experiments/premise.py", "premise_row", "from_numpy"):
        "a CPU study: numpy X in, float64 kernel spectra out through numpy (no device option)",
    ("verify/audit/modelio.py", "_build_suite", "ones"): _LOADED_ON_CPU,
    ("verify/audit/modelio.py", "keep_forkable", "zeros"):
        "a scalar whose only use is one backward before any model is read (autograd's engine, not a computation)",
    ("verify/audit/modelio.py", "bind_input", "as_tensor"): _LOADED_ON_CPU,
    ("verify/audit/modelio.py", "probe_batches", "as_tensor"): _LOADED_ON_CPU,
    ("verify/audit/modelio.py", "fx_graph_for", "as_tensor"): _LOADED_ON_CPU,
    ("verify/audit/modelio.py", "check_model", "as_tensor"): _LOADED_ON_CPU,
    ("verify/audit/refit.py", "per_example_loss", "as_tensor"):
        "numpy interop: numpy outputs and labels in, numpy losses out",
    ("verify/audit/refit.py", "labels_of", "as_tensor"): "numpy interop: numpy outputs in, numpy labels out",
    ("empirics/nets/engine.py", "_train_group", "randperm"):
        "reviewed by engine owner: per-network seeded CPU generators draw the permutations, stacked and moved with "
        ".to(st.W.device)",
    ("empirics/nets/engine.py", "_train_group", "zeros"):
        "reviewed by engine owner: the padded stack's permutations, filled from the CPU generators, then moved with "
        ".to(st.W.device)",
    ("empirics/nets/engine.py", "_row_weights", "arange"):
        "reviewed by engine owner: CPU row weights, stacked and moved with .to(w.device) by _Stack.__init__",
    ("empirics/nets/engine.py", "_row_weights", "ones"):
        "reviewed by engine owner: CPU row weights, stacked and moved with .to(w.device) by _Stack.__init__",
}


@dataclass(frozen=True)
class Finding:
    """A factory call that makes a tensor on the default device."""

    path: str
    line: int
    function: str
    factory: str
    call: str
    buffer: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return self.path, self.function, self.factory

    def __str__(self) -> str:
        call = f"register_buffer(..., {self.call})" if self.buffer else self.call
        return f"{self.path}:{self.line} {self.function}: {call}"


def _torch_names(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """The names `torch` is imported as, and the factories imported from it by name (local name -> factory)."""
    modules, direct = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name == "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and not node.level:
            direct.update({a.asname or a.name: a.name for a in node.names if a.name in FACTORIES})
    return modules, direct


def _is_scalar(node: ast.expr) -> bool:
    """A plain number: a literal, `math.f(...)`, `float(...)`/`int(...)`, or arithmetic of those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_scalar(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_scalar(node.left) and _is_scalar(node.right)
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math") or \
            (isinstance(f, ast.Name) and f.id in ("float", "int"))
    return False


def _is_dtype(node: ast.expr, torch_modules: set[str]) -> bool:
    """An argument of `.to(...)` that names a dtype: `torch.float64`, `dtype`, `self.dtype`, `x.dtype`, `dt`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in torch_modules:
        return node.attr != "device"
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name is not None and (name == "dt" or name.endswith("dtype"))


def _to_kind(call: ast.Call, torch_modules: set[str]) -> str:
    """What a `.to(...)` call changes: "device" (or both) or "dtype" only."""
    keys = {k.arg for k in call.keywords}
    if "device" in keys or (call.args and not _is_dtype(call.args[0], torch_modules)):
        return "device"
    return "dtype"


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, torch_modules: set[str], direct: dict[str, str]):
        self.path, self.torch_modules, self.direct = path, torch_modules, direct
        self.scope: list[str] = []
        self.parent: dict[ast.AST, ast.AST] = {}
        self.found: list[Finding] = []

    def visit(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
        super().visit(node)

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _factory(self, call: ast.Call) -> str | None:
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.torch_modules:
            return f.attr if f.attr in FACTORIES else None
        return self.direct.get(f.id) if isinstance(f, ast.Name) else None

    def _moved(self, node: ast.expr) -> bool:
        """Is `node`'s value moved to a device before anything else touches it (module docstring)?"""
        while True:
            up = self.parent.get(node)
            if isinstance(up, ast.BinOp) and _is_scalar(up.right if up.left is node else up.left):
                node = up
            elif isinstance(up, ast.UnaryOp):
                node = up
            elif isinstance(up, ast.Attribute) and up.value is node:
                call = self.parent.get(up)
                if not (isinstance(call, ast.Call) and call.func is up):
                    return False
                if up.attr == "cuda" or up.attr == "to" and _to_kind(call, self.torch_modules) == "device":
                    return True
                if up.attr in DTYPE_CASTS or up.attr == "to":
                    node = call
                else:
                    return False
            else:
                return False

    def visit_Call(self, node: ast.Call) -> None:
        factory = self._factory(node)
        if factory is not None:
            has_device = factory != "from_numpy" and any(k.arg == "device" for k in node.keywords)
            if not has_device and not self._moved(node):
                up = self.parent.get(node)
                buffer = isinstance(up, ast.Call) and isinstance(up.func, ast.Attribute) \
                    and up.func.attr == "register_buffer"
                self.found.append(Finding(self.path, node.lineno, ".".join(self.scope) or "<module>", factory,
                                          ast.unparse(node), buffer))
        self.generic_visit(node)


def device_findings(source: str, path: str = "<string>") -> list[Finding]:
    """The factory calls of `source` that make a tensor without a device taken from their inputs."""
    tree = ast.parse(source, filename=path)
    modules, direct = _torch_names(tree)
    if not modules and not direct:
        return []
    checker = _Checker(path, modules, direct)
    checker.visit(tree)
    return checker.found


def scanned_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py"))


def all_findings() -> list[Finding]:
    out = []
    for p in scanned_files():
        out.extend(device_findings(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix()))
    return out


def test_every_tensor_factory_takes_its_device():
    bad = [f for f in all_findings() if f.key not in ALLOWED]
    assert not bad, ("tensor factories that make a CPU tensor on a device-following path (give them "
                     "device=<input>.device, move them with .to(x), or allow-list them in "
                     "tests/test_device_discipline.py with the reason):\n" + "\n".join(map(str, bad)))


def test_allow_list_is_current():
    """Every entry still matches a call (a fixed or removed one leaves), and says why in one line."""
    keys = {f.key for f in all_findings()}
    stale = sorted(k for k in ALLOWED if k not in keys)
    assert not stale, f"allow-list entries that match no call any more: {stale}"
    for key, why in ALLOWED.items():
        assert why.strip() and "\n" not in why, f"{key}: the reason is one line"


def test_the_scan_sees_the_modules():
    """The scan reads the folders it claims to (a moved folder would pass vacuously)."""
    paths = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {"empirics/nets/models.py", "empirics/attribution/gauss_newton.py", "verify/audit/measure.py"} <= paths


#: `empirics.nets.models._register_preprocess` as it was before the fix of issue 39's bug (1): buffers made on the CPU
#: while the reference inputs were on the GPU ("Expected all tensors to be on the same device" in apply_preprocess).
BUG_1 = '''
import torch
from torch import nn


def _register_preprocess(module: nn.Module, spec, reference: torch.Tensor | None, dtype: torch.dtype) -> None:
    if spec.preprocess == "raw":
        return
    shift, scale = input_statistics(reference.detach().cpu().double().numpy(), spec.channels)
    module.register_buffer("input_shift", torch.as_tensor(shift, dtype=dtype))
    module.register_buffer("input_scale", torch.as_tensor(scale, dtype=dtype))
'''


def test_bug_1_is_flagged():
    found = device_findings(BUG_1, "empirics/nets/models.py")
    assert [(f.function, f.factory, f.buffer) for f in found] == [("_register_preprocess", "as_tensor", True)] * 2
    assert all(f.key not in ALLOWED for f in found)
    assert "register_buffer(..., torch.as_tensor(shift, dtype=dtype))" in str(found[0])


def test_bug_1_fix_passes():
    fixed = BUG_1.replace("dtype=dtype)", "dtype=dtype, device=reference.device)")
    assert device_findings(fixed) == []


def _flagged(body: str, header: str = "import torch\nimport math\n") -> list[str]:
    src = header + "def f(x, gen, dtype, a):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return [f.factory for f in device_findings(src)]


def test_rule_passes_a_device_or_an_immediate_move():
    ok = """\
a = torch.zeros(3, device=x.device)
a = torch.tensor([1, 2], dtype=torch.long, device=x.device)
a = torch.randperm(5, generator=gen).to(x.device)
a = torch.from_numpy(a).to(x)
a = torch.randn(3, generator=gen, dtype=torch.float64).cuda()
a = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x)
a = (torch.randn(3, generator=gen) / math.sqrt(3)).to(device=x.device, dtype=dtype)
a = ((torch.randint(0, 2, (3,), generator=gen).float() * 2 - 1) / math.sqrt(2)).to(device=None)
a = torch.randn(3, generator=gen).to(dtype).to(x.device)
a = torch.zeros_like(x) + x.new_zeros(3) + torch.nn.functional.one_hot(a, 3)
"""
    assert _flagged(ok) == []


def test_rule_flags_cpu_tensors():
    assert _flagged("a = torch.tensor([1, 2])") == ["tensor"]  # a list becomes a CPU tensor
    assert _flagged("a = torch.as_tensor(a)") == ["as_tensor"]
    assert _flagged("a = torch.from_numpy(a)") == ["from_numpy"]
    assert _flagged("a = torch.from_numpy(a).double()") == ["from_numpy"]
    assert _flagged("a = torch.randn(3, generator=gen).to(dtype)") == ["randn"]  # a dtype cast moves nothing
    assert _flagged("a = torch.randn(3, generator=gen).to(torch.float64)") == ["randn"]
    assert _flagged("a = torch.randn(3, generator=gen).to(dtype=x.dtype)") == ["randn"]
    assert _flagged("a = (torch.rand(3, generator=gen) * x).to(x)") == ["rand"]  # mixed with x before the move
    assert _flagged("a = x + torch.ones(3)") == ["ones"]
    assert _flagged("a = torch.eye(3, dtype=dtype)\nb = torch.arange(3)\nc = torch.full((2,), 1.0)") == \
        ["eye", "arange", "full"]
    assert _flagged("a = torch.empty(2)\nb = torch.linspace(0, 1, 3)\nc = torch.ones(2)") == \
        ["empty", "linspace", "ones"]


def test_rule_follows_how_torch_is_imported():
    assert _flagged("a = th.zeros(3)", header="import torch as th\n") == ["zeros"]
    assert _flagged("a = zeros(3) + zeros(2, device=x.device)", header="from torch import zeros\n") == ["zeros"]
    assert _flagged("a = np.zeros(3)", header="import torch\nimport numpy as np\n") == []


def test_findings_name_the_enclosing_function():
    src = "import torch\nclass A:\n    def f(self):\n        def g():\n            return torch.ones(2)\n"
    (found,) = device_findings(src, "m.py")
    assert (found.key, found.line) == (("m.py", "A.f.g", "ones"), 5)
    assert str(found) == "m.py:5 A.f.g: torch.ones(2)"
