"""A pytest plugin for mutation testing only (``-p check.mutate_plugin``, set in pyproject's
``[tool.mutmut] pytest_add_cli_args``; never loaded by ``make test``).

Theory of operation
-------------------
mutmut runs the tests from its copy of the tree (``mutants/``), first on its ``sys.path``, and
runs each mutant with only the tests that called the mutated function (``pytest -x`` on their
ids). Three things keep that honest and fast:

* **One ``jobs`` package.** The tests import the jobs as ``rasd_jobs`` (the installed name,
  which the editable install maps to the original ``jobs/``); mutmut copies ``jobs/`` beside
  the mutated ``rasd/`` in ``mutants/``. ``rasd_jobs`` and its modules are made aliases of
  that copy, so a test never holds two copies of a job's module. (The jobs' protocol is in
  ``rasd/steps/``, which is mutated; ``jobs/`` keeps the drivers, which are not.)
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

import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any

import jobs

# Point the installed name at the mutated package before any test imports it.
sys.modules["rasd_jobs"] = jobs
for _info in pkgutil.walk_packages(jobs.__path__, "jobs."):
    if _info.name.endswith(".__main__"):  # a command line run as a program, not imported
        continue
    _name = _info.name.removeprefix("jobs.")
    sys.modules[f"rasd_jobs.{_name}"] = importlib.import_module(_info.name)


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
