"""A pytest plugin for mutation testing only (``-p check.mutate_plugin``, set in pyproject's
``[tool.mutmut] pytest_add_cli_args``; never loaded by ``make test``).

Theory of operation
-------------------
mutmut runs the tests from its copy of the tree (``mutants/``), first on its ``sys.path``, and
runs each mutant with only the tests that called the mutated function (``pytest -x`` on their
ids). Two things keep that honest and fast:

* **One ``jobs`` package.** The tests import the jobs as ``rasd_jobs`` (the installed name,
  which the editable install maps to the original ``jobs/``), the checker imports them as
  ``jobs``. mutmut mutates ``mutants/jobs/`` and keys each function by its module's name
  (``jobs.dedupe``), so ``rasd_jobs`` and its modules are made aliases of ``jobs``'s: every
  test then runs the mutated code, under the name mutmut looks for.
* **Fastest tests first.** mutmut hands pytest the test ids in no particular order and stops
  at the first failure. The checker's exhaustive searches take seconds each; a unit test that
  kills the same mutant takes milliseconds. :func:`pytest_collection_modifyitems` orders the
  selected tests by the duration mutmut recorded for each (``mutmut-stats.json``), so a mutant
  pays for the slow searches only when the fast tests let it through.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path
from typing import Any

import jobs

# Point the installed name at the mutated package before any test imports it.
sys.modules["rasd_jobs"] = jobs
for _info in pkgutil.iter_modules(jobs.__path__):
    sys.modules[f"rasd_jobs.{_info.name}"] = importlib.import_module(f"jobs.{_info.name}")


def _durations() -> dict[str, float]:
    for path in (Path("mutmut-stats.json"), Path("mutants/mutmut-stats.json")):
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return {str(k): float(v) for k, v in data.get("duration_by_test", {}).items()}
    return {}


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Order the tests by their recorded duration (unknown ones first: they are new)."""
    durations = _durations()
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
