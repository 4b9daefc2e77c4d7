"""The names of our code that the docs and the code's own docstrings and comments give
resolve to something that exists, and docs/performance.md holds no history.

What is checked
---------------
A *reference* is a dotted name whose first part is one of our top-level packages (``rasd``,
``rasd_client``, ``rasd_jobs``, ``check``, ``chaos``, ``bench``, ``sim``,
``fleet``, ``tests``: :data:`PACKAGES`), such as ``rasd.steps.take.acquire``, found

* in backticks, single or double (markdown and reST), or bare in running text, in README.md
  and docs/*.md (fenced code blocks skipped), and in every docstring, bare string statement
  and comment of those packages' .py files;
* in backticks only, when its first part is the name of one of our classes:
  ``Renewer.maybe_refresh``, ``:meth:`Driver.run``` (the *Class.attr* form).

A trailing ``()`` is dropped. A dotted name whose first part is a module's
last name (``decide.should_extend``) is not checked: the same form names counters
(``ddb.Query``, ``cache.hit``) and fields of JSON answers.

How one resolves
----------------
A full reference: the longest prefix that imports as a module, then ``getattr`` for each
further part. A Class.attr reference: against every class of ours of that name (found by
parsing our .py files; ``__main__`` modules are never imported); it resolves when one of them
has the attribute, so a name several classes share is checked against all of them rather
than skipped. A class has an attribute when ``getattr`` finds it, or when a class of its MRO
annotates it or assigns ``self.<attr>`` (instance attributes, dataclass fields).

Left out
--------
:data:`HISTORY`: pages that record what the code was at the time (a changelog, measurement
notes of past branches, the performance archive); a name there was right when written.
:data:`OUTSIDE`: references that look like ours but name something outside our code.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: our top-level packages and their directories (pyproject.toml's package-dir)
PACKAGES = {
    "rasd": "rasd",
    "rasd_client": "client/rasd_client",
    "rasd_jobs": "jobs/rasd_jobs",
    "check": "check",
    "chaos": "chaos",
    "bench": "bench",
    "sim": "sim",
    "fleet": "fleet",
    "tests": "tests",
}
#: what a reference's first part is imported as
ALIASES: dict[str, str] = {}

#: pages of history, not read: each names the code as it was when it was written
HISTORY = {
    "CHANGELOG.md",  # what each change did, in the names of its day
    "docs/history/performance-history.md",  # superseded measurements and findings, as then
    "docs/history/perf-cpu-notes.md",  # notes of the branch that made the data path lean
    "docs/history/perf-mem-notes.md",  # notes of the branch `mem` (the cached hit)
    "docs/history/perf-spread-notes.md",  # notes of the prefetch lanes' branch, before and after
}

#: references that name something outside our code: pattern -> why
OUTSIDE = {
    r"rasd\.(socket|service)": "systemd units (systemd/), not Python",
    r".*__mutmut_\d*": "a mutant mutmut generates in its copy of the tree (docs/checker.md)",
}

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)
TICKED = re.compile(r"``(.+?)``|`([^`]+?)`", re.S)
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
FIRSTS = "|".join(sorted([*PACKAGES, *ALIASES]))
BARE = re.compile(rf"(?<![\w./`-])(?:{FIRSTS})(?:\.[A-Za-z_]\w*)+")


def _python_files() -> Iterator[tuple[str, Path]]:
    for package, directory in PACKAGES.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            if "results" not in path.relative_to(ROOT).parts:
                yield package, path


def _texts() -> Iterator[tuple[Path, int, str]]:
    """(file, line of the text's start, text): the docs, then each docstring, bare string
    statement and comment of our .py files, as they stand in the source."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        if str(path.relative_to(ROOT)) not in HISTORY:
            # a fenced block becomes as many empty lines, so line numbers hold
            yield path, 1, FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    for _, path in _python_files():
        source = path.read_text()
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                end = node.end_lineno or node.lineno
                yield path, node.lineno, "".join(lines[node.lineno - 1 : end])
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                yield path, token.start[0], token.string


def scan(text: str, classes: set[str] | dict[str, list[str]]) -> Iterator[tuple[int, str]]:
    """(offset, name) of each reference in ``text``: backticked names that start with one of
    our packages or ``classes``, then bare names that start with one of our packages."""
    for m in TICKED.finditer(text):
        name = (m.group(1) or m.group(2)).strip()
        head = name.split(".")[0]
        if DOTTED.fullmatch(name) and (head in PACKAGES or head in ALIASES or head in classes):
            yield m.start(), name
    unticked = TICKED.sub(lambda m: " " * len(m.group(0)), text)
    for m in BARE.finditer(unticked):
        yield m.start(), m.group(0)


@cache
def references() -> tuple[tuple[str, str], ...]:
    """(file:line, name) of every reference (the module docstring says which)."""
    classes = _classes()
    return tuple(
        (f"{path.relative_to(ROOT)}:{first_line + text.count(chr(10), 0, offset)}", name)
        for path, first_line, text in _texts()
        for offset, name in scan(text, classes)
    )


@cache
def _classes() -> dict[str, list[str]]:
    """Class name -> the modules of ours that define a class of that name (at any depth)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for package, path in _python_files():
        parts = [package, *path.relative_to(ROOT / PACKAGES[package]).with_suffix("").parts]
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                by_name[node.name].append(".".join(parts))
    return dict(by_name)


def _has(obj: Any, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    if not inspect.isclass(obj):
        return False
    assigned = re.compile(rf"\bself\.{re.escape(attr)}\s*(:[^=\n]*)?=[^=]")
    for klass in obj.__mro__:
        if attr in vars(klass).get("__annotations__", {}):
            return True
        try:
            if assigned.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):  # a builtin, or no source
            continue
    return False


def _resolves_in(module: str, rest: list[str]) -> bool:
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        return False
    for attr in rest:
        if inspect.ismodule(obj) and not hasattr(obj, attr):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{attr}")
                continue
            except ImportError:
                return False
        if not _has(obj, attr):
            return False
        if not hasattr(obj, attr):
            return True  # an instance attribute or a field: nothing further to follow
        obj = getattr(obj, attr)
    return True


@cache
def resolves(name: str) -> bool:
    parts = name.removesuffix("()").split(".")
    head = ALIASES.get(parts[0], parts[0])
    if head in PACKAGES:
        return _resolves_in(head, parts[1:])
    return any(_resolves_in(module, parts) for module in _classes()[head])


def _outside(name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in OUTSIDE)


def test_every_reference_to_our_code_resolves() -> None:
    refs = references()
    assert len(refs) > 500, f"only {len(refs)} references found: is the scan broken?"
    stale = [
        f"{where}: {name}" for where, name in refs if not _outside(name) and not resolves(name)
    ]
    assert not stale, f"{len(stale)} references name nothing:\n" + "\n".join(stale)


def test_the_allow_list_is_used() -> None:
    """Each OUTSIDE entry still matches a reference, so none outlives its reason."""
    names = {name for _, name in references()}
    unused = [p for p in OUTSIDE if not any(re.fullmatch(p, n) for n in names)]
    assert not unused, f"OUTSIDE entries that match no reference: {unused}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "see `rasd.steps.take.acquire` and ``rasd_jobs.rollout``",
            ["rasd.steps.take.acquire", "rasd_jobs.rollout"],
        ),
        ("the renewer (rasd.daemon.renewer). Then `rasd`", ["rasd.daemon.renewer"]),
        (":meth:`Driver.run` and `ddb.Query`, `take.py`", ["Driver.run"]),
    ],
)
def test_the_scan_finds(text: str, expected: list[str]) -> None:
    """Backticks single and double, bare names, the Class.attr form; not a counter's name,
    a file's or a lone package's."""
    assert [name for _, name in scan(text, {"Driver"})] == expected


def test_a_stale_reference_does_not_resolve() -> None:
    """The resolver says no to what is gone, and yes to each form that exists."""
    assert resolves("rasd.steps.take.acquire") and resolves("rasd_jobs.rollout")
    assert resolves("Renewer._extend_after")  # an instance attribute
    assert resolves("rasd.core.decide.pick()")
    assert not resolves("rasd.dynamo.store._never_sent")
    assert not resolves("chaos.proxy.claim_of")
    assert not resolves("Acquirer._extend_after")
    assert not resolves("rasd.check")


# ------------------------------------------------------------------------ performance.md
PAST = re.compile(r"\b(history|historical|earlier|before|old|first pass|superseded)\b", re.I)


def test_performance_md_has_no_history() -> None:
    """docs/performance.md holds today's figures, the methods that reproduce them and the
    noise; past runs and superseded findings live in docs/history/performance-history.md, which it
    points to. A heading that names a past ("history", "historical", "earlier", "before",
    "old", "first pass", "superseded": the words the moved sections' headings used) means a
    history section came back."""
    page = FENCE.sub("", (ROOT / "docs/performance.md").read_text())
    headings = [line for line in page.splitlines() if line.startswith("#")]
    assert len(headings) > 5
    past = [h for h in headings if PAST.search(h)]
    assert not past, f"history in docs/performance.md (move it to the archive): {past}"
    assert "docs/history/performance-history.md" in page
    assert (ROOT / "docs/history/performance-history.md").exists()
