"""The tier records (tests/tiers.py): a report without its tier, as xdist makes for a worker
that crashed inside a test, is still recorded as a failure of the run's tier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.tiers import Recorder


def report(nodeid: str, outcome: str, tier: str | None = None) -> Any:
    props = [("tier", tier)] if tier else []
    return SimpleNamespace(nodeid=nodeid, outcome=outcome, user_properties=props)


def test_a_crashed_workers_report_counts_against_the_tier_of_its_directory(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, ("fast", "property", "integration"))
    rec.pytest_runtest_logreport(report("tests/unit/test_a.py::t", "passed", "fast"))
    rec.pytest_runtest_logreport(report("tests/integration/test_b.py::t", "failed"))
    rec.pytest_runtest_logreport(report("tests/unit/test_c.py::t", "failed"))
    rec.pytest_sessionfinish()
    assert (tmp_path / "integration.txt").read_text() == "tests/integration/test_b.py::t\tfailed\n"
    fast = (tmp_path / "fast.txt").read_text().splitlines()
    assert fast == ["tests/unit/test_a.py::t\tpassed", "tests/unit/test_c.py::t\tfailed"]
