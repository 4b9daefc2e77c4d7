"""What `rasd serve` loads before serving: argparse without shutil, glibc malloc settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from rasd import cli
from rasd.server import malloc


@pytest.mark.parametrize("columns", ["100", "37", "0", "junk", None])
def test_help_width_is_the_one_argparse_picks(
    monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert cli._columns() == shutil.get_terminal_size().columns


def test_parsing_serve_imports_no_shutil() -> None:
    code = (
        "import sys; from rasd.cli import build_parser; "
        "build_parser().parse_args(['serve', '--socket', 'x']); "
        "print(sorted(m for m in ('shutil', 'bz2', 'lzma') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    assert out.strip() == "[]"


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert malloc.one_arena() is False


def test_one_arena_in_a_fresh_process() -> None:
    """Set on glibc (this test machine); trim() then works too."""
    code = "from rasd.server import malloc; print(malloc.one_arena()); malloc.trim()"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    assert out.strip() == str(glibc)
