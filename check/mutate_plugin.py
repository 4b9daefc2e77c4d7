"""A pytest plugin for mutation testing only (``-p check.mutate_plugin``, set in pyproject's
``[tool.mutmut] pytest_add_cli_args``; never loaded by ``make test``).

Theory of operation
-------------------
mutmut runs the tests from its copy of the tree (``mutants/``), first on its ``sys.path``, and
runs each mutant with only the tests that called the mutated function (``pytest -x`` on their
ids). Three things keep that honest and fast:

* **The jobs as installed.** mutmut copies and mutates ``rasd/`` only (the jobs' protocol is
  in ``rasd/steps/``; ``jobs/rasd_jobs/`` keeps the drivers). ``mutants/`` is first on
  ``sys.path``, so ``rasd`` is the mutated copy, and ``rasd_jobs``, which is not there, is the
  editable install's: the original drivers, over the mutated protocol.
* **The checker last, and only where it is needed.** With ``RASD_MUTATE_FAST`` set (the first
  phase of ``python -m check.mutate``), the checker's searches (``tests/unit/test_check*.py``)
  are deselected whenever mutmut runs tests for a mutant or its clean run, though not while
  it records which tests call which function: each mutant first meets the fast unit tests
  only, and the second phase runs the mutants they let through with every test, the searches
  included. A search costs up to a minute; a unit test, milliseconds.
* **Fastest tests first.** mutmut hands pytest the test ids in no particular order and stops
  at the first failure. The checker's exhaustive searches take seconds each; a unit test that
  kills the same mutant takes milliseconds. :func:`pytest_collection_modifyitems` orders the
  selected tests by the duration mutmut recorded for each (``mutmut-stats.json``), so a mutant
  pays for the slow searches only when the fast tests let it through.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _durations() -> dict[str, float]:
    for path in (Path("mutmut-stats.json"), Path("mutants/mutmut-stats.json")):
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return {str(k): float(v) for k, v in data.get("duration_by_test", {}).items()}
    return {}


#: the checker's searches, in pytest's node ids
CHECKER_TESTS = ("tests/unit/test_check.py::", "tests/unit/test_check_walks.py::")


def _fast_only() -> bool:
    """The first phase, testing a mutant (or the clean run), not recording stats."""
    under_test = os.environ.get("MUTANT_UNDER_TEST", "")
    return bool(os.environ.get("RASD_MUTATE_FAST")) and under_test not in (
        "stats",
        "list_all_tests",
    )


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Drop the checker's searches in the first phase; order the rest by their recorded
    duration (unknown ones first: they are new)."""
    if _fast_only():
        dropped = [it for it in items if it.nodeid.startswith(CHECKER_TESTS)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [it for it in items if not it.nodeid.startswith(CHECKER_TESTS)]
    durations = _durations()
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
