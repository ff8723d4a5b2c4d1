"""The import graph of the suite's packages: layers point one way and no modules import each other.

Layers (docs/DESIGN.md, README "Layout"): `ntkm` is the base every package may import (the error type,
file IO, the JSON codec); `theory` (pure mathematics) imports only `ntkm`; `empirics` (torch experiments)
imports `theory` and `ntkm`; `reports` (rendering) imports `ntkm` and `theory` (only the paper's reference
values in `theory.paper`, drawn beside our numbers), never `empirics` or `verify`; `verify` (CLI, claims,
audit) may import all of them. None of them imports `benchmarks`, `tests` or `scripts`.

Every import counts for the layers, wherever it is written: module level, inside a function (a lazy
import), under `if TYPE_CHECKING:`, and `importlib.import_module("...")` / `__import__("...")` with a
literal name. A cycle among modules is an import cycle even when one edge is lazy: the two modules still
cannot be understood, tested or moved apart. Only an import under `if TYPE_CHECKING:` is no edge of the
cycle graph: it never runs, and it is Python's one way to annotate with a type of a module that imports
this one. `theory` and `ntkm` never import torch (theory stays importable and fast without it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Package -> the other first-party packages it may import.
ALLOWED: dict[str, frozenset[str]] = {
    "ntkm": frozenset(),
    "theory": frozenset({"ntkm"}),
    "empirics": frozenset({"theory", "ntkm"}),
    "reports": frozenset({"theory", "ntkm"}),
    "verify": frozenset({"ntkm", "theory", "empirics", "reports"}),
}
#: First-party top-level names that are not layers of the library: no layer may import them.
OUTSIDE = frozenset({"benchmarks", "tests", "scripts"})
#: Package -> third-party top-level modules it must not import at all.
FORBIDDEN_EXTERNAL: dict[str, frozenset[str]] = {"ntkm": frozenset({"torch"}), "theory": frozenset({"torch"})}
#: Cycles that another part of issue 13 removes, each with what removes it. Any other cycle fails the test,
#: and so does a listed one that no longer exists (then delete its entry): the list can only shrink.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


@dataclass(frozen=True)
class Import:
    """One import statement or call: who imports what, on which line, and whether it is lazy."""

    importer: str
    target: str
    line: int
    lazy: bool
    type_only: bool = False


def module_names(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` file under `root/<package>` (`__init__` names the package)."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _literal_import_call(node: ast.Call) -> str | None:
    """The module named by `importlib.import_module("x")`, `import_module("x")` or `__import__("x")`."""
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module of a `from ... import` (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


_RawImport = tuple[str, list[str], int, bool, bool]


def _raw_imports(module: str, path: Path) -> list[_RawImport]:
    """(module imported, names imported from it, line, lazy, type-only) for every import in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[_RawImport] = []

    def visit(node: ast.AST, lazy: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name, [], child.lineno, lazy, type_only) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                out.append((_resolve_from(module, is_package, child), [a.name for a in child.names],
                            child.lineno, lazy, type_only))
            elif isinstance(child, ast.Call) and (name := _literal_import_call(child)):
                out.append((name, [], child.lineno, lazy, type_only))
            if _is_type_checking(child):
                assert isinstance(child, ast.If)
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, type_only)
                continue
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), type_only)

    visit(tree, False, False)
    return out


def collect_imports(root: Path, packages: Iterable[str]) -> tuple[dict[str, Path], list[Import]]:
    """All imports made by the modules of `packages` under `root`.

    A first-party target is resolved to the module it names (`from a.b import c` is `a.b.c` when that
    is a module, else `a.b`); third-party targets keep their dotted name.
    """
    modules = module_names(root, packages)
    imports: list[Import] = []
    for module, path in modules.items():
        for target, names, line, lazy, type_only in _raw_imports(module, path):
            candidates = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or [target]
            for cand in candidates:
                resolved = cand
                while resolved and resolved not in modules and "." in resolved:
                    resolved = resolved.rsplit(".", 1)[0]
                imports.append(Import(module, resolved if resolved in modules else cand, line, lazy, type_only))
    return modules, imports


def layer_violations(root: Path, allowed: Mapping[str, frozenset[str]] = ALLOWED,
                     outside: frozenset[str] = OUTSIDE,
                     forbidden_external: Mapping[str, frozenset[str]] = FORBIDDEN_EXTERNAL) -> list[str]:
    """One line per import that points the wrong way, or at a forbidden third-party module."""
    _, imports = collect_imports(root, allowed)
    bad = []
    for imp in imports:
        src, dst = imp.importer.split(".")[0], imp.target.split(".")[0]
        where = f"{imp.importer}:{imp.line}{' (lazy)' if imp.lazy else ''} imports {imp.target}"
        if dst in allowed and dst != src and dst not in allowed[src]:
            bad.append(f"{where}: {src} may import only {', '.join(sorted(allowed[src])) or 'no other package'}")
        elif dst in outside:
            bad.append(f"{where}: library code must not import {dst}")
        elif dst in forbidden_external.get(src, frozenset()):
            bad.append(f"{where}: {src} must not import {dst}")
    return sorted(bad)


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (each one an import cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def import_cycles(root: Path, packages: Iterable[str] = ALLOWED) -> list[list[str]]:
    """The import cycles among the modules of `packages` (lazy imports included, `TYPE_CHECKING` ones not)."""
    modules, imports = collect_imports(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if imp.target in modules and imp.target != imp.importer and not imp.type_only:
            graph[imp.importer].add(imp.target)
    return strongly_connected(graph)


def test_layers_point_one_way():
    bad = layer_violations(ROOT)
    assert not bad, "wrong-way imports:\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = {tuple(c) for c in import_cycles(ROOT)}
    new = sorted(cycles - set(KNOWN_CYCLES))
    assert not new, "import cycles (lazy imports included):\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = sorted(set(KNOWN_CYCLES) - cycles)
    assert not gone, "no longer cycles; delete them from KNOWN_CYCLES:\n" + "\n".join(" <-> ".join(c) for c in gone)


#: empirics/ in wings (issue 41): each wing or shared module's rank, lowest first. A module may import from its own
#: rank or below, never above: the shared vocabularies and records, then data, networks (with training and attacks),
#: kernels, the pieces the experiments share (`common`, `fieldhelp`), attribution, and the experiments on top.
EMPIRICS_RANKS: dict[str, int] = {
    "vocab": 0, "records": 0, "intervals": 0, "progress": 0, "precision": 0,
    "data": 1, "nets": 2, "kernels": 3, "common": 4, "fieldhelp": 4, "attribution": 5, "experiments": 6,
}
#: Upward imports inside empirics/ that stay, each with why; a listed one that disappears fails the test, so the
#: list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("empirics.nets.train", "empirics.kernels.ntk"): "the gd-mse protocol's step n / lambda_max(Theta_0) is taken "
    "from the empirical NTK at the initial weights (a lazy import inside that protocol's branch)",
}


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "empirics" else None


def wing_violations(root: Path, ranks: Mapping[str, int] = EMPIRICS_RANKS) -> tuple[list[str], set[tuple[str, str]]]:
    """The imports inside empirics/ that point to a higher-ranked wing (`KNOWN_UPWARD` excepted), and the upward
    (importer, target) pairs found, for checking that list."""
    _, imports = collect_imports(root, ["empirics"])
    bad, upward = [], set()
    for imp in imports:
        a, b = _wing(imp.importer), _wing(imp.target)
        if a is None or b is None or imp.type_only:
            continue
        if a not in ranks or b not in ranks:
            bad.append(f"{imp.importer}:{imp.line} imports {imp.target}: give its wing a rank in EMPIRICS_RANKS")
        elif ranks[b] > ranks[a]:
            upward.add((imp.importer, imp.target))
            if (imp.importer, imp.target) not in KNOWN_UPWARD:
                bad.append(f"{imp.importer}:{imp.line} imports {imp.target}: {a} may not import {b}")
    return bad, upward


def test_empirics_wings_point_one_way():
    bad, upward = wing_violations(ROOT)
    assert not bad, "imports inside empirics/ that point up a wing:\n" + "\n".join(bad)
    gone = sorted(set(KNOWN_UPWARD) - upward)
    assert not gone, f"no longer imported; delete them from KNOWN_UPWARD: {gone}"


def test_the_wing_check_fails_on_an_upward_import(tmp_path):
    _write(tmp_path, {
        "empirics/__init__.py": "",
        "empirics/vocab.py": "",
        "empirics/data/__init__.py": "",
        "empirics/data/datasets.py": "def f():\n    from empirics.experiments.distance import run\n",
        "empirics/experiments/__init__.py": "",
        "empirics/experiments/distance.py": "from empirics.data.datasets import f\nfrom empirics import vocab\n",
    })
    bad, upward = wing_violations(tmp_path)
    assert bad == ["empirics.data.datasets:2 imports empirics.experiments.distance: data may not import experiments"]
    assert upward == {("empirics.data.datasets", "empirics.experiments.distance")}


def test_every_package_is_checked():
    """A new top-level package of the library must be given a layer here, or its imports go unchecked."""
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert tops - set(ALLOWED) - OUTSIDE == set()


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_checker_sees_lazy_relative_and_importlib_imports(tmp_path):
    """A synthetic tree: every spelling of an import is collected and resolved to its module."""
    _write(tmp_path, {
        "theory/__init__.py": "",
        "theory/a.py": "from . import b\nfrom .b import f\nimport ntkm.errors\n",
        "theory/b.py": "def f():\n    from theory.sub import c\n",
        "theory/sub/__init__.py": "",
        "theory/sub/c.py": "import importlib\nX = importlib.import_module('theory.a')\nY = __import__('numpy')\n"
                           "if TYPE_CHECKING:\n    from theory.b import f\nelse:\n    import scipy\n",
        "ntkm/__init__.py": "",
        "ntkm/errors.py": "",
    })
    _, imports = collect_imports(tmp_path, ["theory", "ntkm"])
    got = {(i.importer, i.target, i.lazy) for i in imports}
    assert got == {
        ("theory.a", "theory.b", False),
        ("theory.a", "ntkm.errors", False),
        ("theory.b", "theory.sub.c", True),
        ("theory.sub.c", "importlib", False),
        ("theory.sub.c", "theory.a", False),
        ("theory.sub.c", "numpy", False),
        ("theory.sub.c", "theory.b", False),
        ("theory.sub.c", "scipy", False),
    }
    assert {(i.target, i.type_only) for i in imports if i.importer == "theory.sub.c"} >= {
        ("theory.b", True), ("scipy", False), ("numpy", False)}


def test_checker_fails_on_a_new_cycle_and_a_wrong_way_import(tmp_path):
    """The checks above would fail on a cycle through a lazy import and on imports that point the wrong way
    (an import under `TYPE_CHECKING` counts for the layers, but as a back edge it closes no cycle)."""
    _write(tmp_path, {
        "ntkm/__init__.py": "",
        "theory/__init__.py": "",
        "theory/gram.py": "import numpy\n",
        "theory/bad.py": "def f():\n    import empirics.train\n",
        "empirics/__init__.py": "",
        "empirics/train.py": "from empirics.attacks import attack\nfrom theory import gram\n",
        "empirics/attacks.py": "def attack():\n    from empirics.train import train\n",
        "empirics/stats.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from empirics.run import Cfg\n",
        "empirics/run.py": "from empirics.stats import summary\n",
        "reports/__init__.py": "import torch\nfrom empirics import train\n",
        "reports/types.py": "import typing\nif typing.TYPE_CHECKING:\n    from verify import Unit\n",
        "verify/__init__.py": "import importlib\nimportlib.import_module('benchmarks.run')\n",
    })
    assert import_cycles(tmp_path) == [["empirics.attacks", "empirics.train"]]
    assert layer_violations(tmp_path) == [
        "reports.types:3 imports verify: reports may import only ntkm, theory",
        "reports:2 imports empirics.train: reports may import only ntkm, theory",
        "theory.bad:2 (lazy) imports empirics.train: theory may import only ntkm",
        "verify:2 imports benchmarks.run: library code must not import benchmarks",
    ]
    _write(tmp_path, {"theory/bad.py": "import torch\n", "empirics/attacks.py": "def attack():\n    pass\n",
                      "reports/__init__.py": "from theory import gram\n", "reports/types.py": "",
                      "verify/__init__.py": ""})
    assert import_cycles(tmp_path) == []
    assert layer_violations(tmp_path) == ["theory.bad:1 imports torch: theory must not import torch"]


def test_the_claims_registry_and_the_plan_import_without_torch():
    """`verify claims --plan` and `--list` read the registry and the cost model: importing them must not load torch
    (about 3 s here; a module-level `empirics.experiments.distance` import in verify/claims/base.py once did)."""
    import subprocess
    import sys

    code = "import sys, verify.claims, verify.plan, verify.costs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
