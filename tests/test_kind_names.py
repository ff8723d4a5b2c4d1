"""Model kinds are read from the registry (`empirics.nets.kinds`), never by comparing against their names: no `==`,
`!=`, `in` or `not in` with a model kind's name as a string literal outside `empirics/nets/kinds.py` and
`empirics/vocab.py` (issue 28). Code that needs the paper's two networks reads `empirics.vocab.PAPER_PAIR`; a capability
is a flag."""

from __future__ import annotations

import ast
from pathlib import Path

from empirics.vocab import PAPER_PAIR, Model
from reports.audit_report import REFERENCE_KEYS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("theory", "empirics", "verify", "reports", "ntkm")
REGISTRY = {"empirics/nets/kinds.py", "empirics/vocab.py"}
NAMES = {m.value for m in Model}


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def kind_name_comparisons(source: str) -> list[str]:
    """Each comparison in `source` that tests against a model kind's name written as a literal."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(_literals(side) & NAMES for side in (node.left, *node.comparators)):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_comparison_against_a_model_kind_name_outside_the_registry():
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in REGISTRY:
                found += [f"{rel}:{hit}" for hit in kind_name_comparisons(path.read_text())]
    assert not found, ("compare through empirics.nets.kinds (flags) and empirics.vocab.PAPER_PAIR instead:\n"
                       + "\n".join(found))


def test_the_scan_sees_each_form_of_comparison():
    planted = ('if kind == "attn": pass\nif "relu" != k: pass\nif m in ("softmax", "x"): pass\n'
               'if "qkv" not in kinds: pass\nif kind == other: pass\nname = "relu"\n')
    assert len(kind_name_comparisons(planted)) == 4


def test_the_reports_reference_keys_are_the_registrys_pair():
    """`reports` imports no experiment code, so it names the audit record's reference keys itself: they must be
    the pair the audit writes them from."""
    assert REFERENCE_KEYS == PAPER_PAIR
