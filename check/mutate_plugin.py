"""A pytest plugin for mutation testing only (``-p check.mutate_plugin``, from pyproject's
``[tool.mutmut]``; never loaded by ``make test``): deselects the checker's searches in the
fast phase (``RASD_MUTATE_FAST``) and runs the fastest tests first, by the durations mutmut
recorded (``mutmut-stats.json``). docs/checker.md, "Mutation testing".
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
