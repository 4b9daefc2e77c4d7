"""No import is renamed to one or two characters: ``from rasd.core import lease as L`` makes
every reader look the letter up, so a module is imported under its own name or a name that
says what it is (``daemon_steps``). ruff's N812 catches an upper-case alias of a lower-case
module; this catches the short lower-case ones too. The few conventions every Python reader
knows are allowed (``CONVENTIONS``)."""

from __future__ import annotations

import ast

from tests.helpers.sources import python_files

#: every package of the checkout with Python in it
SCANNED = ("rasd", "client", "jobs", "check", "tests", "bench", "chaos", "sim", "fleet")
MIN_LEN = 3
#: (module, alias): the aliases the libraries' own documentation uses
CONVENTIONS = {
    ("multiprocessing", "mp"),
    ("hypothesis.strategies", "st"),
    ("numpy", "np"),
}


def short_aliases(source: str, name: str = "<snippet>") -> list[str]:
    """``name:line: import ... as alias`` for each alias shorter than MIN_LEN, not a convention."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            base = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            for alias in node.names:
                if alias.asname is None or len(alias.asname) >= MIN_LEN:
                    continue
                module = f"{base}.{alias.name}" if base else alias.name
                if (module, alias.asname) in CONVENTIONS:
                    continue
                found.append(f"{name}:{node.lineno}: {module} as {alias.asname}")
    return found


def test_no_import_is_renamed_to_one_or_two_characters() -> None:
    found = []
    for path, rel in python_files(SCANNED):
        found += short_aliases(path.read_text(), rel)
    assert not found, "name these imports for what they are:\n" + "\n".join(found)


def test_the_check_catches_a_short_alias_and_allows_the_conventions() -> None:
    snippet = (
        "import multiprocessing as mp\n"
        "from hypothesis import strategies as st\n"
        "from rasd.core import lease as L\n"
        "from . import stream as st\n"
        "import concurrent.futures as cf\n"
        "from ..steps import daemon as daemon_steps\n"
    )
    assert short_aliases(snippet) == [
        "<snippet>:3: rasd.core.lease as L",
        "<snippet>:4: stream as st",
        "<snippet>:5: concurrent.futures as cf",
    ]
