"""No module of the shipped code is over ``MAX_LINES`` lines: a module that grows past it
holds more than one job, and is split by what its parts do (as rasd.daemon.candidates,
rasd.daemon.lanes and rasd.daemon.sizing are)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the daemon's package and the client library
SCANNED = ("rasd", "client")
MAX_LINES = 500


def oversized(root: Path, dirs: tuple[str, ...], limit: int) -> list[str]:
    """``path: N lines`` for every .py module under ``dirs`` longer than ``limit`` lines."""
    found = []
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            n = len(path.read_bytes().splitlines())
            if n > limit:
                found.append(f"{path.relative_to(root)}: {n} lines")
    return found


def test_no_module_is_over_the_limit() -> None:
    found = oversized(ROOT, SCANNED, MAX_LINES)
    assert not found, f"over {MAX_LINES} lines, split by what the parts do:\n" + "\n".join(found)


def test_the_check_names_the_module_and_its_length(tmp_path: Path) -> None:
    """A module at the limit passes; one line more is named, with its length."""
    pkg = tmp_path / "rasd" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text("x = 1\n" * 5)
    (pkg / "big.py").write_text("x = 1\n" * 6)
    assert oversized(tmp_path, ("rasd",), 5) == ["rasd/sub/big.py: 6 lines"]
