"""The code base stays ruff-clean (configuration in pyproject.toml), and every note a docstring or comment
cites (`docs/PAPER.md`, `benchmarks/README.md`, ...) is in the repository."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    proc = subprocess.run(["ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Folders whose Python files are scanned for citations of notes.
SOURCE_DIRS = ("ntkm", "theory", "empirics", "verify", "reports", "benchmarks", "tests", "scripts")
#: A cited Markdown file: a path of word characters, dots, slashes and dashes ending in `.md`.
MD_CITATION = re.compile(r"(?<![\w./<>-])((?:[\w-]+/)*[\w.-]*\w\.md)\b")
#: Markdown files the code writes, named in docstrings as outputs, not notes (claims.md beside claims.json,
#: the audit's `<OUT>-summary.md`, a benchmark's `--markdown runs/scale.md` in a usage line).
OUTPUTS = re.compile(r"^(claims\.md|[\w-]*-summary\.md|runs/[\w.-]+\.md)$")


def docstrings_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring (module, class, function) and every comment of a Python file."""
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.lineno, first.value.value
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def missing_notes(root: Path, dirs: tuple[str, ...] = SOURCE_DIRS) -> tuple[set[str], list[str]]:
    """Every note cited, and `file:line: name` for each citation that resolves to no file, from the
    repository root or from the citing file's folder ("README.md beside this file")."""
    cited: set[str] = set()
    missing = []
    for folder in dirs:
        for path in sorted((root / folder).rglob("*.py")):
            for line, text in docstrings_and_comments(path):
                for name in MD_CITATION.findall(text):
                    if OUTPUTS.match(name):
                        continue
                    cited.add(name)
                    if not ((root / name).is_file() or (path.parent / name).is_file()):
                        missing.append(f"{path.relative_to(root)}:{line}: {name}")
    return cited, sorted(missing)


def test_cited_notes_are_in_the_repository():
    cited, missing = missing_notes(ROOT)
    assert {"docs/PAPER.md", "docs/DESIGN.md"} <= cited  # the scan sees the citations it is meant to check
    assert not missing, "docstrings or comments cite notes that are not in the repository:\n" + "\n".join(missing)


def test_cited_notes_check_finds_a_missing_note(tmp_path):
    """A bare note name (the notes used to live outside the repository) and a missing README fail; the names
    of outputs do not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "PAPER.md").write_text("# paper")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        '"""Objects (docs/PAPER.md); writes claims.md and OUT-summary.md."""\n'
        "def f():\n"
        '    """As PAPER.md says."""\n'
        "    return 1  # see pkg/README.md\n")
    cited, missing = missing_notes(tmp_path, ("pkg",))
    assert cited == {"docs/PAPER.md", "PAPER.md", "pkg/README.md"}
    assert missing == ["pkg/m.py:3: PAPER.md", "pkg/m.py:4: pkg/README.md"]
    (tmp_path / "pkg" / "README.md").write_text("# pkg")
    assert missing_notes(tmp_path, ("pkg",))[1] == ["pkg/m.py:3: PAPER.md"]
