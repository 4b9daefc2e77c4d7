"""The test suite's layout: a test module (``test_*.py``) or a conftest is pytest's to load,
never a library, so no module of the repository imports one: what tests share lives in
tests/helpers/ (test doubles in tests/doubles/). The shipped packages import nothing of tests/.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: every directory of Python the repository runs: the packages, the tools, the tests
SCANNED = ("rasd", "client", "jobs", "check", "chaos", "bench", "sim", "fleet", "tests")
#: what the wheel and the .deb ship (pyproject's packages)
SHIPPED = ("rasd", "client", "jobs")


def module_name(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


@functools.cache
def imported(root: Path, path: Path) -> list[tuple[int, str]]:
    """Every module an import in ``path`` may name (``from a import b`` names ``a`` and
    ``a.b``), relative imports resolved, with the line."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(root, path).rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names.append((node.lineno, base))
            names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return names


def is_test_module(root: Path, name: str) -> bool:
    """A module name that is a file of the tree named test_*.py or conftest.py."""
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    return path.is_file() and (path.name.startswith("test_") or path.name == "conftest.py")


def find_test_module_imports(root: Path, dirs: tuple[str, ...]) -> list[str]:
    """``file:line imports module`` for every import of a test module or conftest."""
    found = []
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            for line, name in imported(root, path):
                if is_test_module(root, name):
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def test_no_module_imports_a_test_module() -> None:
    found = find_test_module_imports(ROOT, SCANNED)
    assert not found, "move what they share to tests/helpers/:\n" + "\n".join(found)


def test_the_shipped_packages_import_nothing_of_the_tests() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for d in SHIPPED
        for path in sorted((ROOT / d).rglob("*.py"))
        for line, name in imported(ROOT, path)
        if name == "tests" or name.startswith("tests.")
    ]
    assert not found, "\n".join(found)


def test_the_finder_finds_each_kind_of_import(tmp_path: Path) -> None:
    """Absolute, from-package, relative and conftest imports are found; a helper is not."""
    unit = tmp_path / "tests" / "unit"
    (tmp_path / "tests" / "helpers").mkdir(parents=True)
    unit.mkdir()
    for f in ("__init__.py", "conftest.py", "helpers/__init__.py", "helpers/tables.py"):
        (tmp_path / "tests" / f).write_text("")
    (unit / "__init__.py").write_text("")
    (unit / "test_b.py").write_text("X = 1\n")
    (unit / "test_a.py").write_text(
        "from tests.helpers.tables import seed\n"
        "import tests.unit.test_b\n"
        "from tests.unit import test_b\n"
        "from .test_b import X\n"
        "from tests.conftest import seed_pool\n"
        "def f():\n"
        "    from tests.unit.test_b import X\n"
    )
    assert find_test_module_imports(tmp_path, ("tests",)) == [
        "tests/unit/test_a.py:2 imports tests.unit.test_b",
        "tests/unit/test_a.py:3 imports tests.unit.test_b",
        "tests/unit/test_a.py:4 imports tests.unit.test_b",
        "tests/unit/test_a.py:5 imports tests.conftest",
        "tests/unit/test_a.py:7 imports tests.unit.test_b",
    ]
