"""A module docstring says the module's own job in a few lines; the design's arguments live
once, in docs/ (design.md, operations.md, protocol.md, checker.md), and a docstring points to
the section by name."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.sources import ROOT, python_files

#: the packages whose module docstrings are held short
SCANNED = ("rasd", "client/rasd_client", "jobs", "check")
#: the longest module docstring, quotes included
MAX_DOC_LINES = 10


def docstring_lines(path: Path) -> int:
    """How many lines the module's docstring spans (0 without one)."""
    body = ast.parse(path.read_text(), str(path)).body
    if not body:
        return 0
    first = body[0]
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return 0
    return (first.end_lineno or first.lineno) - first.lineno + 1


def long_docstrings(root: Path, dirs: tuple[str, ...], limit: int) -> dict[str, int]:
    """``{path: lines}`` for every module under ``dirs`` whose docstring is over ``limit``."""
    found = {}
    for path, rel in python_files(dirs, root):
        n = docstring_lines(path)
        if n > limit:
            found[rel] = n
    return found


def test_every_module_docstring_is_short() -> None:
    over = long_docstrings(ROOT, SCANNED, MAX_DOC_LINES)
    assert not over, (
        f"module docstrings over {MAX_DOC_LINES} lines: say the module's job, and move the "
        "argument to docs/ (pointing to its section by name):\n"
        + "\n".join(f"{p}: {n} lines" for p, n in over.items())
    )


def test_no_docstring_holds_a_theory_of_operation() -> None:
    """The heading that long narrations went under stays out of module docstrings."""
    found = []
    for path, rel in python_files(SCANNED):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        if "theory of operation" in doc.lower():
            found.append(rel)
    assert not found, found


def test_the_check_counts_the_docstring_and_names_the_module(tmp_path: Path) -> None:
    pkg = tmp_path / "rasd"
    pkg.mkdir()
    (pkg / "short.py").write_text('"""One line."""\nx = 1\n')
    (pkg / "long.py").write_text('"""Job.\n\n' + "more\n" * 3 + '"""\n')
    (pkg / "none.py").write_text("x = '''not a docstring'''\n")
    assert docstring_lines(pkg / "short.py") == 1
    assert docstring_lines(pkg / "none.py") == 0
    assert long_docstrings(tmp_path, ("rasd",), 5) == {"rasd/long.py": 6}
    assert long_docstrings(tmp_path, ("rasd",), 6) == {}
