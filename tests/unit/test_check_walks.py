"""The real rules under the random walks of ``python -m check --quick`` (docs/checker.md).

The exhaustive CI configuration (tests/unit/test_check.py) lets no time pass and has no
liberator, release or orphan repair: the extension, release, liberation and quarantine paths
of the real rules are reached there only by the scripted traces. The walks of ``WALK`` have
all of them (time, faults, a crash, releases, the liberator); the quick run makes 300 of them,
and so does this test, so that pytest's run of the checker sees those paths too (mutation
testing showed what it otherwise misses: docs/checker.md "Mutation testing")."""

from __future__ import annotations

import pytest

from check.__main__ import WALK
from check.explore import format_trace, walks
from check.rulesets import REAL

pytestmark = pytest.mark.search


def test_real_rules_pass_the_quick_walks() -> None:
    res = walks(WALK, REAL, range(300), 120)
    assert res.violation is None, format_trace(res)
    assert res.transitions > 10_000  # the walks went somewhere
