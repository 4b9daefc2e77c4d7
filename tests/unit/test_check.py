"""The protocol model checker (check/, docs/checker.md).

A checker that cannot find the old bugs proves nothing: each known-bad rule set (the OLD
protocol's scenarios A, B and C) must be caught in bounded time. The real rules must pass the
exhaustive CI configuration. The two violations the checker found with the real rules are
pinned as replayed traces, so they stay reproducible until the protocol is fixed.
"""

from __future__ import annotations

import dataclasses

import pytest

from check.__main__ import QUICK_BFS, WALK
from check.explore import bfs, format_trace, script, walk, walks
from check.model import Config
from check.rulesets import BAD_A, BAD_B, BAD_C, FIXED_EXTEND, REAL

#: small enough to explore completely in a few seconds, big enough for scenarios A and B
TINY = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra",),
    max_faults=1,
    max_crashes=0,
    max_ops=2,
    horizon=0,
    liberator=False,
    release=False,
)


def test_bad_a_act_on_unknown_is_caught() -> None:
    """A: giving a claim back at once after the mapping write's reply was lost lets two keys
    hold one resource (the pending mapping already names the claim)."""
    res = bfs(TINY, BAD_A, max_states=100_000)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert any("LOST" in lab for lab, _ in res.trace), format_trace(res)


def test_bad_b_trust_own_claim_is_caught() -> None:
    """B: serving a pending mapping unverified (or a claim whose mapping write lost)."""
    res = bfs(TINY, BAD_B, max_states=100_000)
    assert res.violation is not None, format_trace(res)


def test_bad_c_no_quarantine_is_caught() -> None:
    """C: an early release frees the resource at once while caches still serve it."""
    res = walks(WALK, BAD_C, range(300), 120)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)


def test_real_rules_pass_tiny_exhaustively() -> None:
    """Every interleaving of TINY (one fault) keeps I1 and I2 with the real rules."""
    res = bfs(TINY, REAL)  # about 57,000 states, 20 s of CPU
    assert res.complete
    assert res.violation is None, format_trace(res)


def test_walks_replay_from_their_seed() -> None:
    """A seed replays the same walk: the trace printed with a violation is reproducible."""
    a = walk(WALK, BAD_C, 7, 100)
    b = walk(WALK, BAD_C, 7, 100)
    assert a.trace == b.trace


# ------------------------------------------------------ found with the real rules
_GET = "d0 get_lease(k1) "
_ACQUIRE_K1 = [
    "d0 get_lease(k1) called",
    "d0 get_lease(k1) read mapping",
    "d0 get_lease(k1) candidate ra",
    "d0 get_lease(k1) map_acquire APPLIED",
    "d0 get_lease(k1) claim APPLIED",
    "d0 bg confirm(k1) map_confirm APPLIED",
]
_K2_TAKES_RA = [
    "d1 get_lease(k2) called",
    "d1 get_lease(k2) read mapping",
    "d1 get_lease(k2) candidate ra",
    "d1 get_lease(k2) map_acquire APPLIED",
    "d1 get_lease(k2) claim APPLIED",
]
_ONE = dataclasses.replace(TINY, horizon=20, ticks=(1, 5), max_ops=8)


def test_found_extension_race_frees_a_live_lease() -> None:
    """PROTOCOL BUG (real rules, no fault): two daemons extend one lease at once; the one
    asking for less loses map_extend (``exp < new`` fails: the other already pushed it
    further), decide.after_extend says FreeOrphan, and the resource is freed while the live
    mapping still names it. After the quarantine another key claims it: I1.
    When the protocol is fixed this test must be turned around."""
    steps = [
        *_ACQUIRE_K1,
        "time +5",
        "time +1",
        "time +1",
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
        "d0 bg extend(k1) extend_resource APPLIED",
        "d1 bg extend(k1) extend_resource APPLIED",
        "d1 bg extend(k1) map_extend APPLIED",
        "d0 bg extend(k1) map_extend REJECTED",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
        "time +5",
        *_K2_TAKES_RA,
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
    ]
    res = script(_ONE, REAL, steps)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    # the candidate fix (never free on a lost map_extend) closes this path
    with pytest.raises(ValueError, match="not enabled"):
        script(_ONE, FIXED_EXTEND, steps)


def test_found_map_extend_not_sent_frees_a_live_lease() -> None:
    """PROTOCOL BUG (real rules, one fault): map_extend not sent (throttled to the deadline,
    breaker open) is REJECTED with an error; after_extend only looks at the outcome and says
    FreeOrphan, so the resource is freed while the mapping still names it."""
    steps = [
        *_ACQUIRE_K1,
        "time +5",
        "time +1",
        "time +1",
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d0 bg extend(k1) extend_resource APPLIED",
        "d0 bg extend(k1) map_extend NOT SENT",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
        "time +1",
        "time +1",
        "time +1",
        "time +1",
        *_K2_TAKES_RA,
    ]
    res = script(_ONE, REAL, steps)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)


def test_found_release_landing_after_its_deadline() -> None:
    """FINDING (real rules, one fault): map_release is delayed past the request's deadline
    (UNKNOWN: the app is told the release failed, nothing frees the resource), then lands.
    The key's mapping is free, so the key acquires a second resource while its first answer
    is still valid (no completed release) and the first resource stays held by it: I2."""
    cfg = dataclasses.replace(_ONE, resources=("ra", "rb"), release=True)
    steps = [
        *_ACQUIRE_K1,
        "d0 release(k1) called",
        "d0 release(k1) read mapping",
        "d0 release(k1) map_release DELAYED/LOST",
        "in-flight map_release",
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d0 get_lease(k1) candidate rb",
        "d0 get_lease(k1) map_acquire APPLIED",
        "d0 get_lease(k1) claim APPLIED",
    ]
    res = script(cfg, REAL, steps)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)


def test_quick_bfs_config_is_tiny() -> None:
    """The CI run (python -m check --quick) explores the configuration tested here."""
    assert QUICK_BFS == TINY


def test_found_quarantine_short_by_the_clock_skew() -> None:
    """FINDING (real rules, no fault): the quarantine of an early free is written on the
    freeing daemon's clock (now + Q) and checked on the claimer's clock; a claimer whose clock
    is ahead by the skew takes the resource at rel + Q - skew, while I1 holds the released
    answer valid until rel + Q."""
    cfg = dataclasses.replace(_ONE, release=True, ticks=(1,))
    steps = [
        *_ACQUIRE_K1,
        "d0 release(k1) called",
        "d0 release(k1) read mapping",
        "d0 release(k1) map_release APPLIED",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
        "time +1",
        "time +1",
        "time +1",
        "time +1",
        *_K2_TAKES_RA,
    ]
    res = script(cfg, REAL, steps)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert "valid until 5" in res.violation.detail and "at t=4" in res.violation.detail
