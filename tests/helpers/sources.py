"""The repository's Python files, as the tests that read source walk them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: never source of ours: generated trees, results, caches, installed packages
SKIPPED = frozenset({"mutants", "results", "node_modules", "build", "__pycache__"})


def python_files(dirs: tuple[str, ...], root: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """Every ``.py`` file under ``dirs`` of ``root``, sorted, with its path relative to
    ``root`` (``/``-separated); files under SKIPPED or hidden folders are left out."""
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            parts = path.relative_to(root).parts
            if SKIPPED.isdisjoint(parts) and not any(p.startswith(".") for p in parts):
                yield path, path.relative_to(root).as_posix()
