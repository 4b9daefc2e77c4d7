"""What ships: every package of rasd's source tree is in the wheel (and so the .deb)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: each installed top-level package and its directory (pyproject's package-dir)
DIRS = {"rasd": "rasd", "rasd_client": "client/rasd_client", "rasd_jobs": "jobs/rasd_jobs"}


def test_every_package_of_the_tree_is_listed() -> None:
    """``[tool.setuptools] packages`` is an explicit list: a new package left out of it works
    in the editable install and is missing from the wheel and the .deb."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    tree = {
        ".".join((name, *p.parent.relative_to(ROOT / d).parts))
        for name, d in DIRS.items()
        for p in (ROOT / d).rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert tree <= listed, sorted(tree - listed)
