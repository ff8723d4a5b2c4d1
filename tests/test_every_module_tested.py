"""Every source module of the installed packages is imported by some test file, or is on a short allow-list
that says where it is exercised instead.

"Imported" means a test file (any `.py` under `tests/`, helpers and conftests included) names the module in an
`import`, a `from ... import`, or an `importlib.import_module("...")` literal, at top level or inside a function.
The packages are the ones `pyproject.toml` installs (`[tool.setuptools] packages`); `benchmarks/` is not one
(its scripts are measured by running them; `tests/benchmarks/` tests their harness). An `__init__.py` that holds
only a docstring is not a module to test. A new module without a test fails here: add
`tests/<package>/test_<module>.py` (see tests/README.md), or, only where a direct test would merely repeat one
that exists, an entry below with the test that exercises it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Modules no test imports directly, each with the test that runs its code. A stale entry (the module is gone, or
#: a test now imports it) fails `test_allow_list_is_current`, so the list only shrinks.
ALLOWED_UNTESTED: dict[str, str] = {
    "verify.__main__": "`python -m verify`, run as a subprocess in tests/verify/test_bad_input.py",
    "verify.commands.data": "run through verify.cli.main in tests/empirics/test_datasets.py",
    "verify.commands.kappa": "run through verify.cli.main in tests/verify/test_commands_kappa.py",
    "verify.commands.landscape": "run through verify.cli.main in tests/empirics/test_landscape.py",
    "verify.commands.report": "`verify report`, run through verify.cli.main in tests/verify/test_bad_input.py",
    "reports.audit_figures": "drawn by reports.render for the audit report in tests/verify/test_audit.py",
    "reports.text": "the terminal and claims.md tables of `verify claims`, in tests/verify/test_claims.py",
    "theory._validate": "the input checks of every theory function, in tests/theory/test_validate.py",
    "empirics.progress": "the stderr progress lines, read with NTKM_PROGRESS=1 in tests/verify/test_executors.py",
}


def installed_packages() -> list[str]:
    """The top-level packages `pyproject.toml` installs (its `packages = [...]` line; no tomllib on 3.10)."""
    line = re.search(r"^packages = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert line, "pyproject.toml has no `packages = [...]` line"
    return sorted({name.strip().strip('"').split(".")[0] for name in line.group(1).split(",")})


def _only_docstring(tree: ast.Module) -> bool:
    body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def source_modules(packages: list[str]) -> set[str]:
    """Dotted names of the modules of `packages` (a package by its own name when its `__init__` has code)."""
    out = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                if _only_docstring(ast.parse(path.read_text())):
                    continue
                parts = parts[:-1]
            out.add(".".join(parts))
    return out


def imported_names(path: Path) -> set[str]:
    """Every module name a file could be importing: `import a.b`, `from a import b` (a and a.b) and
    `importlib.import_module("a.b")` literals, wherever they are in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def untested_modules() -> set[str]:
    """Source modules that no file under `tests/` imports (importing `a.b` runs package `a` too)."""
    imported = set().union(*(imported_names(p) for p in (ROOT / "tests").rglob("*.py")))
    imported |= {name.rsplit(".", k)[0] for name in imported for k in range(1, name.count(".") + 1)}
    return source_modules(installed_packages()) - imported


def test_every_module_has_a_test_that_imports_it() -> None:
    missing = sorted(untested_modules() - ALLOWED_UNTESTED.keys())
    assert not missing, ("no test file imports these modules; add tests/<package>/test_<module>.py "
                         f"(tests/README.md): {missing}")


def test_allow_list_is_current() -> None:
    gone = sorted(ALLOWED_UNTESTED.keys() - source_modules(installed_packages()))
    assert not gone, f"allow-listed modules that no longer exist; remove them from ALLOWED_UNTESTED: {gone}"
    tested = sorted(ALLOWED_UNTESTED.keys() - untested_modules())
    assert not tested, f"allow-listed modules a test now imports; remove them from ALLOWED_UNTESTED: {tested}"


def test_the_scan_sees_lazy_and_importlib_imports(tmp_path: Path) -> None:
    """The scanner is what the check stands on: it must see imports inside functions and by string."""
    f = tmp_path / "test_x.py"
    f.write_text("import importlib\n\ndef f():\n    from theory.gram import gram\n    import verify.cli\n"
                 "    importlib.import_module('reports.text')\n")
    assert {"theory.gram", "theory.gram.gram", "verify.cli", "reports.text"} <= imported_names(f)
    assert "theory.krr" not in imported_names(f)
