"""No function takes more than `MAX_PARAMS` parameters (issue 28 item 4 for the audit; issue 41 for every source
file outside tests): the code passes typed objects (`AuditConfig`, `AuditRun`, `NetworkContext`, `Tensors`,
`RefitInputs`, `DataRequest`, ...) instead of long lists of loose values. Every function, method and lambda is read
with `ast` (nothing is imported); `self` / `cls` do not count, `*args` and `**kwargs` count one each."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_PARAMS = 6
GLOBS = ("verify/audit/*.py", "empirics/*/audit_*.py", "reports/audit_*.py", "verify/commands/audit.py")
#: Every source folder outside tests (issue 41).
SOURCE_FOLDERS = ("ntkm", "theory", "empirics", "verify", "reports", "benchmarks", "scripts")

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def audit_files() -> list[Path]:
    return sorted({p for g in GLOBS for p in ROOT.glob(g)})


def n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> int:
    """Parameters of a function as the rule counts them: positional-only, ordinary and keyword-only ones, `*args`
    and `**kwargs` one each, a leading `self` / `cls` not at all."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    extra = (a.vararg is not None) + (a.kwarg is not None)
    return len(names) + extra - (1 if names[:1] in (["self"], ["cls"]) else 0)


def too_long(path: Path) -> list[str]:
    """`file:line name (count)` for each function of `path` over the limit."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT)
    return [f"{rel}:{fn.lineno} {getattr(fn, 'name', '<lambda>')} ({n_params(fn)})"
            for fn in ast.walk(tree) if isinstance(fn, FUNCTIONS) and n_params(fn) > MAX_PARAMS]


def test_the_audit_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in audit_files()}
    assert {"verify/audit/pipeline.py", "verify/audit/validity.py", "empirics/kernels/audit_ntk.py",
            "empirics/attribution/audit_attribution.py", "reports/audit_report.py", "verify/commands/audit.py"} <= names


@pytest.mark.parametrize("source, count", [
    ("def f(a, b, c, d, e, f): pass", 6),
    ("def f(self, a, b, c, d, e, f): pass", 6),
    ("def f(cls, a, /, b, *args, c, **kw): pass", 5),
    ("def f(a, b=1, *, c=2): pass", 3),
    ("g = lambda a, b, *c: a", 3),
])
def test_the_count(source, count):
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, FUNCTIONS))
    assert n_params(fn) == count


def test_no_audit_function_takes_more_than_six_parameters():
    over = [line for path in audit_files() for line in too_long(path)]
    assert not over, (f"audit functions with more than {MAX_PARAMS} parameters (group them in the typed objects "
                      "that exist, or a small frozen dataclass):\n" + "\n".join(over))


def source_files() -> list[Path]:
    return sorted(p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_source_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in source_files()}
    assert {"empirics/nets/train.py", "verify/stability.py", "benchmarks/harness.py", "scripts/compare_claims.py",
            "theory/bounds.py", "ntkm/io.py"} <= names


def test_no_function_outside_tests_takes_more_than_six_parameters():
    over = [line for path in source_files() for line in too_long(path)]
    assert not over, (f"functions with more than {MAX_PARAMS} parameters (group them in the typed objects that "
                      "exist, or a small frozen dataclass):\n" + "\n".join(over))
