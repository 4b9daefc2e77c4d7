"""The protocol model checker (check/, docs/checker.md).

A checker that cannot find the old bugs proves nothing: each known-bad rule set (the OLD
protocol's scenarios A, B and C) must be caught in bounded time. The real rules must pass the
exhaustive CI configuration. The violations the checker found with the real rules are kept
as replayed traces that must now end without a violation (regression tests).
"""

from __future__ import annotations

import dataclasses

import pytest

from check.__main__ import (
    ADMIN_RELEASED,
    BALANCER,
    DEDUPE,
    DEDUPE_EXTEND,
    DEDUPE_LIVE,
    DEDUPE_PENDING,
    EXTEND_SHARED,
    EXTEND_SHARED_PREFIX,
    HIT_TABLE,
    MIXED,
    MIXED_EXTEND,
    MIXED_LAPSED,
    MIXED_YIELD,
    OUTAGE,
    OUTAGE_RELEASED,
    OUTAGE_SMALL,
    QUICK_BFS,
    STRICT,
    STRICT_LOCAL,
    SWITCH_OFF,
    SWITCH_ON,
    WALK,
    WALK3,
    _acquired,
)
from check.explore import Result, bfs, format_trace, script, walk, walks
from check.model import Config, initial
from check.rulesets import (
    BAD_A,
    BAD_B,
    BAD_C,
    BAD_D1,
    BAD_D2,
    BAD_D3,
    BAD_D4,
    BAD_D5,
    BAD_D6,
    BAD_E,
    BAD_G,
    BAD_H,
    BAD_HT,
    BAD_L,
    BAD_M,
    BAD_O,
    BAD_O2,
    BAD_P,
    BAD_Q,
    BAD_R,
    BAD_S,
    BAD_X,
    REAL,
)
from check.world import REGION, T0, DaemonState
from rasd.core.lease import US, Lease

pytestmark = pytest.mark.search

#: the CI configuration (python -m check --quick): small enough to explore completely in a
#: few seconds, big enough for scenarios A and B
TINY = QUICK_BFS


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
    res = bfs(TINY, REAL)  # about 51,000 states, 17 s of CPU
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


def test_fixed_extension_race_no_longer_frees_a_live_lease() -> None:
    """A race the checker finds with the real rules and no fault: two daemons extend one lease
    at once; the one asking for less loses map_extend (``exp < new``: the other pushed it
    further). Freeing the resource then would free it while the live mapping still names it
    (I1); the daemon reads the mapping (decide.on_extend_check) and frees nothing."""
    prefix = [
        *_ACQUIRE_K1,
        "time +5",
        "time +1",
        "time +1",
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
        "d0 bg extend(k1) read mapping",  # extend_read_first: both still need extending
        "d1 bg extend(k1) read mapping",
        "d0 bg extend(k1) extend_resource APPLIED",
        "d1 bg extend(k1) extend_resource APPLIED",
        "d1 bg extend(k1) map_extend APPLIED",
        "d0 bg extend(k1) map_extend REJECTED",
    ]
    with pytest.raises(ValueError, match="not enabled"):  # the old trace's free_claim
        script(_ONE, REAL, [*prefix, "d0 bg free_claim(ra, t1) free_claim APPLIED"])
    res = script(_ONE, REAL, [*prefix, "d0 bg extend(k1) read mapping"])
    assert res.violation is None, format_trace(res)
    with pytest.raises(ValueError, match="not enabled"):  # ra is still k1's: no free_claim
        script(_ONE, REAL, [*prefix, "d0 bg extend(k1) read", "d0 bg free_claim"])


def test_fixed_map_extend_not_sent_no_longer_frees_a_live_lease() -> None:
    """A case the checker finds with the real rules and one fault: a map_extend that was never
    sent (throttled to the deadline, breaker open) must not free the resource. The mapping is
    read first; it still names the lease, so nothing is freed."""
    prefix = [
        *_ACQUIRE_K1,
        "time +5",
        "time +1",
        "time +1",
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d0 bg extend(k1) read mapping",
        "d0 bg extend(k1) extend_resource APPLIED",
        "d0 bg extend(k1) map_extend NOT SENT",
    ]
    with pytest.raises(ValueError, match="not enabled"):
        script(_ONE, REAL, [*prefix, "d0 bg free_claim(ra, t1) free_claim APPLIED"])
    res = script(_ONE, REAL, [*prefix, "d0 bg extend(k1) read mapping"])
    assert res.violation is None, format_trace(res)


def test_release_with_an_unknown_outcome_ends_the_lease_for_its_app() -> None:
    """FOUND BY THE CHECKER: map_release delayed past the deadline (the app hears the release
    failed), then lands; the key acquires a second resource while the first is still held by
    it. The contract now says (docs/protocol.md, docs/design.md I2): an app that called
    release stops using the lease, whatever the answer; so this is no I2 violation, and the
    first resource is an orphan the liberator frees (never served to another key)."""
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
    assert res.violation is None, format_trace(res)


def test_quarantine_is_read_on_the_most_advanced_clock() -> None:
    """FOUND BY THE CHECKER (real rules, no fault): the quarantine is written on the freeing
    daemon's clock and checked on the claimer's, so a claimer ahead by the skew takes the
    resource at rel + Q - skew. I1 now says so (docs/design.md): the window after a release
    is Q - max_clock_skew, which is still >= S + replication lag, so every cached answer has
    lapsed. The same trace is no violation; a claim one tick earlier is impossible."""
    cfg = dataclasses.replace(_ONE, release=True, ticks=(1,))
    base = [
        *_ACQUIRE_K1,
        "d0 release(k1) called",
        "d0 release(k1) read mapping",
        "d0 release(k1) map_release APPLIED",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
    ]
    res = script(cfg, REAL, [*base, *["time +1"] * 4, "relist(ra)", *_K2_TAKES_RA])
    assert res.violation is None, format_trace(res)
    with pytest.raises(ValueError, match="not enabled"):
        script(cfg, REAL, [*base, *["time +1"] * 3, "relist(ra)", *_K2_TAKES_RA])


# ------------------------------------------------ two regions, ras-dedupe, orphan repair
def test_bad_d1_dedupe_unversioned_is_caught() -> None:
    """D1 (an unversioned ras-dedupe): the extra's end checked only on the scan's items and
    its mapping released unconditionally. d1 extends the extra rb (and answers its app with
    the later end) between dedupe's check and its map_release; the release applies; once the
    survivor ra ends, r2 acquires rc while rb is still in use: a split in r2 (I2)."""
    cfg, prefix = DEDUPE_LIVE
    res = bfs(cfg, BAD_D1, prefix=prefix)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("extend_resource APPLIED" in lab for lab in labels), format_trace(res)
    assert any("dedupe map_release APPLIED" in lab for lab in labels), format_trace(res)


def test_bad_d2_dedupe_pending_survivor_is_caught() -> None:
    """D2 (a ras-dedupe that trusts pending mappings): a survivor whose mapping is still
    pending stands in for the extra, but other regions serve only live mappings: r2 acquires
    rc while rb is in use."""
    cfg, prefix = DEDUPE_PENDING
    res = bfs(cfg, BAD_D2, prefix=prefix)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    assert any("map_release APPLIED" in lab for lab, _ in res.trace), format_trace(res)


def test_real_rules_pass_the_dedupe_search() -> None:
    """Every interleaving of dedupe with both regions' daemons from a cross-region duplicate
    still pending (4,426 states) keeps I1 and I2 with the real rules. (From the confirmed
    duplicate, DEDUPE_LIVE, 30,129 states: `make check-protocol`, too slow for CI.)"""
    cfg, prefix = DEDUPE_PENDING
    res = bfs(cfg, REAL, prefix=prefix)
    assert res.complete
    assert res.violation is None, format_trace(res)


def test_real_dedupe_loses_the_race_to_an_extension() -> None:
    """D1's interleaving with the real rules: the mapping release is conditional on the
    version whose end was checked, so the extension makes it a lost race (the extra is kept
    and served; nothing is freed)."""
    cfg, prefix = DEDUPE_LIVE
    cfg = dataclasses.replace(cfg, max_ops=10)
    steps = [
        *prefix,
        *_EXAMINE,
        "dedupe read r1 mapping in r2",  # the survivor, as r2 shows it
        "dedupe read mapping in r2",  # release_held(rb): its own mapping
        "time +5",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
        "d1 get_lease(k1) extend_resource APPLIED",
        "d1 get_lease(k1) map_extend APPLIED",
    ]
    with pytest.raises(ValueError, match="not enabled"):
        script(cfg, REAL, [*steps, "dedupe map_release APPLIED"])
    res = script(cfg, REAL, [*steps, "dedupe map_release REJECTED"])
    assert res.violation is None, format_trace(res)
    assert "dedupe: lost_race resource=rb kind=extra" in res.trace[-1][1], format_trace(res)
    # D1 checks no end: its unconditional release applies
    res = script(cfg, BAD_D1, [*steps, "dedupe map_release APPLIED"])
    assert res.violation is None  # not yet: the split comes when r2 acquires again


def test_foreign_lease_is_served_across_regions() -> None:
    """A key live in r1 is served as it is by r2's daemon (decide.on_read, foreign): no
    second acquisition, and the answer names r1's resource."""
    cfg = dataclasses.replace(DEDUPE, max_ops=4, dedupe_runs=0)
    steps = [
        *_acquired(0, "ra"),
        "d0 bg confirm(k1) map_confirm APPLIED",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
    ]
    res = script(cfg, REAL, steps)
    assert res.violation is None
    assert any("ANSWER d1 k1 -> ra" in n for n in res.trace[-1][1]), format_trace(res)


def test_orphan_repair_fences_a_mapping_write_still_in_flight() -> None:
    """The liberator's orphan repair (rasd.steps.repair.repair): a claim landed, its mapping write
    is still in flight (the request gave up): FENCE_MAPPING first, so the late map_acquire is
    rejected, then free_orphan with quarantine."""
    cfg = dataclasses.replace(
        DEDUPE, max_ops=2, max_faults=1, dedupe_runs=0, repair_runs=1, horizon=3, ticks=(3,)
    )
    steps = [
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d0 get_lease(k1) candidate ra",
        "d0 get_lease(k1) map_acquire DELAYED/LOST",
        "d0 get_lease(k1) claim APPLIED",
        "time +3",
        "liberator orphan check ra@v1",
        "liberator orphan check ra read resource ra",
        "liberator orphan check ra read mapping",
        "liberator orphan check ra map_fence APPLIED",
        "in-flight map_acquire on",
        "liberator orphan check ra free_orphan APPLIED",
    ]
    res = script(cfg, REAL, steps)
    assert res.violation is None, format_trace(res)
    assert "rejected" in res.trace[-2][0], format_trace(res)


_EXAMINE = [
    "dedupe scan",
    "dedupe read resource ra",
    "dedupe read mapping",
    "dedupe read resource rb in r2",
    "dedupe read mapping in r2",
]
#: the survivor ra, as the extra rb's region r2 shows it
_SURVIVOR = "dedupe read r1 mapping in r2"
_RB_RELEASED = [
    "dedupe read mapping in r2",
    "dedupe map_release APPLIED",
]
_D1_TAKES_RC = [
    "d1 get_lease(k1) called",
    "d1 get_lease(k1) read mapping",
    "d1 get_lease(k1) candidate rc",
    "d1 get_lease(k1) map_acquire APPLIED",
    "d1 get_lease(k1) claim APPLIED",
]


def test_found_dedupe_margin_does_not_cover_clock_skew() -> None:
    """FOUND BY THE CHECKER (real rules, no fault), fixed: ras-dedupe released an extra when
    the survivor outlasted it by ``skew_margin`` (8 >= 7 + 1), but the extra's region stops
    serving the survivor at its end minus the margin *on its own clock*; with that clock
    ahead by the skew (d1 +1), r2 acquired rc at t = 6 while rb was valid until 7: a split in
    r2 (I2). The survivor must now outlast the extra by margin + max_clock_skew (D3 is the
    old rule)."""
    cfg, prefix = DEDUPE_LIVE
    cfg = dataclasses.replace(cfg, offsets=(0, 1), max_ops=10, ticks=(1, 5))
    res = script(cfg, REAL, [*prefix, *_EXAMINE])
    assert res.violation is None
    assert "dedupe: extra_kept resource=rb" in " ".join(res.trace[-1][1]), format_trace(res)
    bad = [
        *prefix,
        *_EXAMINE,
        _SURVIVOR,
        *_RB_RELEASED,
        "dedupe read resource rb in r2",
        "dedupe free_claim APPLIED",
        "time +1",
        "time +5",
        *_D1_TAKES_RC,
    ]
    res = script(cfg, BAD_D3, bad)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)


def test_found_dedupe_survivor_not_yet_live_in_the_extras_replica() -> None:
    """FOUND BY THE CHECKER (real rules, one crash, replication lag), fixed: dedupe read the
    survivor's mapping live in its own region's replica and released the extra; the extra's
    region still showed the survivor pending (its map_confirm not yet replicated), so a
    daemon there without a cached copy (d1 restarted) did not serve it and acquired rc while
    rb was valid: a split in r2 (I2). Dedupe now reads the survivor in the extra's region's
    replica and keeps the extra unless it is live there (D4 is the old rule)."""
    cfg, prefix = DEDUPE_PENDING
    cfg = dataclasses.replace(cfg, replica_history=1, max_crashes=1, max_ops=10)
    start = [*prefix, "d0 bg confirm(k1) map_confirm APPLIED", "d1 CRASHES", *_EXAMINE]
    lagging = f"{_SURVIVOR} (replica of r1 1 behind)"
    res = script(cfg, REAL, [*start, lagging])
    assert res.violation is None
    kept = "dedupe: extra_kept resource=rb why=survivor not live there"
    assert kept in res.trace[-1][1], format_trace(res)
    bad = [
        *start,
        "dedupe read mapping",  # D4: the survivor in its own region r1 (the job's replica)
        *_RB_RELEASED,
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping (replica of r1 1 behind)",
        "d1 get_lease(k1) candidate rc",
        "d1 get_lease(k1) map_acquire APPLIED",
        "d1 get_lease(k1) claim APPLIED",
    ]
    res = script(cfg, BAD_D4, bad)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)


def test_orphan_left_by_dedupe_is_held_to_its_lease_end() -> None:
    """An adversarial scenario: ras-dedupe releases the extra rb (k1's in r2, answered until
    12): map_release applies, its free_claim is never sent (a 5xx, or the job killed between
    its two writes). Were the liberator's orphan repair to free rb with the quarantine only
    (at 4 + 5 = 9 on its clock), d1 would answer rb to k2 at t = 9 while k1's answer runs to
    12 (I1: no app released it). Repair holds a possibly-served orphan to its lease's end plus
    the skew (verdicts.orphan_free_at); D5 is the quarantine-only rule."""
    cfg = dataclasses.replace(
        DEDUPE,
        keys=("k1", "k2"),
        leases=(16, 12),
        max_faults=1,
        max_ops=3,
        repair_runs=1,
        horizon=12,
        ticks=(1, 3, 5),
    )
    start = [
        *_acquired(0, "ra"),
        *_acquired(1, "rb"),
        "d0 bg confirm(k1) map_confirm APPLIED",
        "d1 bg confirm(k1) map_confirm APPLIED",
        *_EXAMINE,
        _SURVIVOR,
        *_RB_RELEASED,
        "dedupe read resource rb in r2",
        "dedupe free_claim NOT SENT",
        "time +3",
        "liberator orphan check rb",
        "liberator orphan check rb read resource rb",
        "liberator orphan check rb read mapping",
        "liberator orphan check rb free_orphan APPLIED",
        "time +5",
        "time +1",
        "d1 get_lease(k2) called",
        "d1 get_lease(k2) read mapping",
    ]
    takes_rb = [
        "relist(rb)",  # the quarantine is over: back in the available index
        "d1 get_lease(k2) candidate rb@v3",
        "d1 get_lease(k2) map_acquire APPLIED",
        "d1 get_lease(k2) claim APPLIED",
    ]
    res = script(cfg, BAD_D5, [*start, *takes_rb])
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    with pytest.raises(ValueError, match="not enabled"):  # rb is still in its hold
        script(cfg, REAL, [*start, *takes_rb])


def test_found_dedupe_released_an_orphan_that_had_become_a_lease() -> None:
    """FOUND BY THE CHECKER (real rules, one fault), fixed: d1's map_acquire for rb is in
    flight (its request gave up) when ras-dedupe examines k1's items, so rb is an orphan
    (the mapping is below its mver). The write lands, d1 serves rb to k1 (until 12), and
    dedupe's release of "the orphan" found a lease on its mapping and released it as one:
    with the quarantine only (no app released it) and without asking whether a survivor
    outlasts it. k2 got rb at t = 6 while k1's answer ran to 12 (I1). Dedupe now only
    repairs an orphan; one that became a lease is a lost race, judged as a lease by the next
    run (D6 is the old rule)."""
    cfg = dataclasses.replace(
        DEDUPE, keys=("k1", "k2"), leases=(16, 12), max_faults=1, max_ops=4, horizon=12,
        ticks=(1, 3, 5),
    )  # fmt: skip
    start = [
        *_acquired(0, "ra"),
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
        "d1 get_lease(k1) candidate rb",
        "d1 get_lease(k1) map_acquire DELAYED/LOST",
        "d1 get_lease(k1) claim APPLIED",
        *_EXAMINE,
        "in-flight map_acquire",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",
        "d1 get_lease(k1) read resource rb",
        "dedupe read mapping in r2",  # the orphan's, again, before it is repaired
    ]
    res = script(cfg, REAL, start)
    assert res.violation is None, format_trace(res)
    assert "dedupe: lost_race resource=rb kind=orphan" in res.trace[-1][1], format_trace(res)
    bad = [
        *start,
        "dedupe map_release APPLIED",
        "dedupe free_claim APPLIED",
        "time +5",
        "time +1",
        "d1 get_lease(k2) called",
        "d1 get_lease(k2) read mapping",
        "relist(rb)",  # the quarantine is over: back in the available index
        "d1 get_lease(k2) candidate rb@v3",
        "d1 get_lease(k2) map_acquire APPLIED",
        "d1 get_lease(k2) claim APPLIED",
    ]
    res = script(cfg, BAD_D6, bad)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)


# ------------------------------------------------ beside the paper's agent and its liberator
PAPER = Config(
    daemons=1,
    keys=("k1",),
    resources=("ra",),
    max_ops=2,
    max_faults=0,
    max_crashes=0,
    liberator=False,
    ticks=(1,),
    horizon=8,
    paper_calls=1,
    paper_liberator=True,
)


def test_bad_q_quarantine_in_the_index_is_caught() -> None:
    """Q (rasd before it shared a table with the paper's agent): a release's quarantine was a
    future ``lease_available``, inside the available index. The paper's agent, whose claim
    is conditioned on the version alone, takes the released resource for its key while the
    quarantine still protects the released lease's cached answers: I1."""
    res = bfs(PAPER, BAD_Q, max_states=200_000)  # found from the initial state
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("free_claim APPLIED" in lab for lab in labels), format_trace(res)
    assert any("paper get_lease(kp) paper_claim APPLIED" in lab for lab in labels), format_trace(
        res
    )


def test_real_rules_keep_the_paper_agent_out_of_the_quarantine() -> None:
    """From k1's release on, every interleaving of the paper's agent acquiring kp (from a
    lagging index, any version it may return), the paper's liberator, the re-listing and
    time keeps I1 and I2 with the real rules: the quarantined item is out of the available
    index at its current version (quarantine_until), so the old agent's version-only claim
    lands only after the re-listing, Q after the release. (With Q's rule the paper's agent
    takes ra at once: the test above.)"""
    released = [
        "d0 get_lease(k1) called",
        "d0 get_lease(k1) read mapping",
        "d0 get_lease(k1) candidate ra",
        "d0 get_lease(k1) map_acquire APPLIED",
        "d0 get_lease(k1) claim APPLIED",
        "d0 release(k1) called",
        "d0 release(k1) read mapping",
        "d0 release(k1) read resource ra",
        "d0 release(k1) map_release APPLIED",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
    ]
    # from the release on: the paper's agent, its liberator, the re-listing and time
    res = bfs(PAPER, REAL, max_states=200_000, prefix=released, ops_after_prefix=0)
    assert res.complete, res.states
    assert res.violation is None, format_trace(res)


STALE = Config(
    daemons=1,
    keys=("k1",),
    resources=("ra",),
    max_ops=3,
    max_faults=0,
    max_crashes=0,
    liberator=False,
    release=False,
    ticks=(1,),
    horizon=16,
    lease=12,  # the paper agent's
    leases=(3,),  # d0's
    paper_calls=1,
    paper_liberator=True,
    repair_runs=1,
    orphan_age=1,
)
_STALE_HOLDER = [
    *_ACQUIRE_K1[:5],
    "d0 bg confirm(k1) map_confirm APPLIED",
    *["time +1"] * 4,
    "paper liberator frees ra",  # k1's lease ended: its holder stays on the item
    "paper get_lease(kp) called",
    "paper get_lease(kp) read leased index (none)",
    "paper get_lease(kp) read available index candidate ra",
    "paper get_lease(kp) paper_claim APPLIED",  # kp holds ra, with k1's stale holder
    "liberator orphan check ra",
    "liberator orphan check ra read resource ra",
]


def test_bad_h_stale_holder_repair_is_caught() -> None:
    """H (before ``hver``): the paper's liberator frees k1's ended rasd lease and leaves its
    holder; the paper's agent leases the item to kp; orphan repair sees a holder no mapping
    names and frees kp's running lease (with quarantine); once re-listed, k1 gets it back
    while kp's answer runs: I1. Orphan repair's hold to the lease's end (D5's fix) also
    keeps this history safe, so the old holder rule is shown with the old orphan rule
    (``orphan_quarantine_only``): each of the two defences alone closes it."""
    res = script(
        STALE,
        dataclasses.replace(BAD_H, name="H+D5", orphan_quarantine_only=True),
        [
            *_STALE_HOLDER,
            "liberator orphan check ra read mapping",
            "liberator orphan check ra map_fence APPLIED",
            "liberator orphan check ra free_orphan APPLIED",
            *["time +1"] * 5,
            "relist(ra)",
            "time +1",
            *_ACQUIRE_K1[:5],
        ],
    )
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)


def test_real_rules_leave_the_paper_agents_lease_alone() -> None:
    """The same history with the real rules: the holder is stale (``hver`` != ``version``),
    orphan repair stops at its verdict (FOREIGN), and from there no interleaving of the
    daemon, both liberators and time breaks I1 or I2."""
    with pytest.raises(ValueError, match="not enabled"):  # FOREIGN: no mapping read, no write
        script(STALE, REAL, [*_STALE_HOLDER, "liberator orphan check ra read mapping"])
    res = bfs(STALE, REAL, max_states=200_000, prefix=_STALE_HOLDER, ops_after_prefix=1)
    assert res.complete, res.states
    assert res.violation is None, format_trace(res)


# ----------------------------------------------------------- rasadmin and the balancer
_ADMIN, _RELEASED, _AFTER = ADMIN_RELEASED
#: k2 asks d1 (clock +1) while rasadmin deletes ra (quarantined: k1's release) and adds it again
_DELETE_READD = [
    "d1 get_lease(k2) called",
    "d1 get_lease(k2) read mapping",
    "rasadmin delete-resource ra: read resource ra",
    "rasadmin delete-resource ra read resource ra",
    "rasadmin delete-resource ra tombstone APPLIED",
    "rasadmin delete-resource ra read resource ra",
    "rasadmin add-resources ra: put REJECTED",
    "rasadmin add-resources ra read resource ra",
    "rasadmin add-resources ra readd APPLIED",
    "d1 get_lease(k2) candidate ra",
]


def test_bad_r_admin_delete_and_readd_of_a_quarantined_item_is_caught() -> None:
    """R (rasadmin without its two defences): k1's lease on ra is released through d0 while
    d1's cache may still serve it (ra in quarantine); delete-resource takes ra without
    --force, the tombstone holds the name no longer than now, the re-add makes it claimable
    at once, and d1 answers ra to k2 while k1's answer is still protected: I1."""
    res = bfs(_ADMIN, BAD_R, prefix=_RELEASED, ops_after_prefix=_AFTER)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("rasadmin delete-resource ra" in lab for lab in labels), format_trace(res)
    assert any("readd APPLIED" in lab for lab in labels), format_trace(res)


def test_real_rules_pass_the_admin_configuration() -> None:
    """Every interleaving of one more app call with two rasadmin commands (delete-resource
    with or without --force, the re-add of a deleted name, add-pool redefining the longest
    lease) after k1's release, while d1's cache may serve k1: I1 and I2 hold."""
    res = bfs(_ADMIN, REAL, prefix=_RELEASED, ops_after_prefix=_AFTER)
    assert res.complete
    assert res.violation is None, format_trace(res)


def test_each_of_the_admin_defences_alone_keeps_the_quarantine() -> None:
    """The real delete-resource refuses a quarantined item without --force; were it to take
    it, the tombstone would hold the name to the quarantine's end, so the re-add is not
    claimable before then. Each defence alone keeps R's history out."""
    refusal_only = dataclasses.replace(BAD_R, name="R-hold-only", admin_delete_quarantined=False)
    hold_only = dataclasses.replace(BAD_R, name="R-refusal-only", admin_no_hold=False)
    with pytest.raises(ValueError, match="not enabled"):  # refused: no tombstone
        script(_ADMIN, refusal_only, [*_RELEASED, *_DELETE_READD[:5]])
    res = script(_ADMIN, refusal_only, [*_RELEASED, *_DELETE_READD[:3]])
    assert "rasadmin delete-resource ra -> quarantined" in " ".join(res.trace[-1][1])
    with pytest.raises(ValueError, match="not enabled"):  # held: ra is no candidate yet
        script(_ADMIN, hold_only, [*_RELEASED, *_DELETE_READD])
    res = script(_ADMIN, hold_only, [*_RELEASED, *_DELETE_READD[:-1]])
    assert res.violation is None
    assert "rasadmin add-resources ra -> held" in " ".join(res.trace[-1][1]), format_trace(res)
    res = script(_ADMIN, BAD_R, [*_RELEASED, *_DELETE_READD])
    # the re-add makes ra claimable while k1's answer is protected: I1 as the table has it,
    # before any claim (``World.check_state``)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert "claimable" in res.violation.detail
    assert res.trace[-1][0].endswith("rasadmin add-resources ra readd APPLIED"), format_trace(res)


def test_bad_m_balancer_without_peer_endpoints_is_caught() -> None:
    """M (the balancer without --peer-endpoint): d0 (r1) leases ra to k1; the balancer, in
    r2, moves ra to r2 in r2's replica, which still shows ra free; last-writer-wins drops
    d0's claim; d1 (r2) leases ra to k2 while k1's mapping still names it: I1."""
    res = bfs(BALANCER, BAD_M)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("wins by last-writer-wins" in lab for lab in labels), format_trace(res)


def test_real_rules_pass_the_balancer_configuration() -> None:
    """The balancer writes each item in its own region's replica, where its move is ordered
    with that region's claims: every interleaving of two regions' daemons (releases, time in
    steps of Q - skew and Q, clocks the skew apart) with one move keeps I1 and I2."""
    res = bfs(BALANCER, REAL)
    assert res.complete
    assert res.violation is None, format_trace(res)
    claimed = [*_acquired(0, "ra")[:-1], "d0 get_lease(k1) claim APPLIED"]
    with pytest.raises(ValueError, match="not enabled"):  # the move is ordered after the claim
        script(BALANCER, REAL, [*claimed, "balancer move ra@v0 r1->r2: move in r2"])
    res = script(BALANCER, REAL, [*claimed, "balancer move ra@v0 r1->r2: move REJECTED"])
    assert "balancer move ra@v0 r1->r2 -> False" in res.trace[-1][1], format_trace(res)


# --------------------------------------------- legacy_agents: both agents on one key
def test_bad_s_serving_an_unsettled_claim_is_caught() -> None:
    """S (no settling): with ``legacy_agents`` rasd's read finds no lease of k1, the paper's
    agent leases k1 rb, then rasd's claim of ra lands and is served as it is: rasd made k1's
    second lease in the region (I2; the model orders the two leases by their claims, and a
    second lease the paper's agent made is its race, not a violation)."""
    res = bfs(MIXED, BAD_S)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("paper get_lease(k1) paper_claim APPLIED" in lab for lab in labels), labels


def test_real_rules_settle_beside_the_paper_agent() -> None:
    """Every interleaving of one rasd acquisition of k1 (settled: leased index read after
    its claim landed, then confirmed or yielded) with the paper's agent acquiring k1: rasd
    never makes the second lease, and no resource goes to two keys."""
    res = bfs(MIXED, REAL)
    assert res.complete, res.states
    assert res.violation is None, format_trace(res)


def test_a_release_ends_the_lease_it_applied_to_whenever_it_was_called() -> None:
    """Release is per key: a release called before the key had a lease, which then releases
    the lease another app was answered meanwhile, ends that lease for I2 where it applied.
    (Deep mode's walk: with I2 ended only at release calls made after the lease's first
    answer, the key's next acquisition counted as a second resource.)"""
    res = walk(WALK3, REAL, 1140, 200)
    assert res.violation is None, format_trace(res)


def test_bad_p_extending_a_pending_mapping_unsettled_is_caught() -> None:
    """P: a second daemon finds k1's pending mapping, whose claim landed, within the margin of
    its end, and extends it (writing it live) without settling it, while the paper's agent
    leased k1 another resource as the claim was in flight: rasd made k1's second lease."""
    cfg, prefix = MIXED_EXTEND
    res = bfs(cfg, BAD_P, prefix=prefix, ops_after_prefix=1)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("paper get_lease(k1) paper_claim APPLIED" in lab for lab in labels), labels
    assert any("d1 get_lease(k1) extend_resource APPLIED" in lab for lab in labels), labels


def test_real_rules_settle_a_pending_mapping_before_extending_it() -> None:
    """Every interleaving of d1's call with d0's acquisition of k1 and the paper agent's:
    the extension of a pending mapping settles it first, so rasd never makes the second
    lease."""
    cfg, prefix = MIXED_EXTEND
    res = bfs(cfg, REAL, prefix=prefix, ops_after_prefix=1)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > 20_000


def test_bad_l_a_lapsed_lease_ended_on_the_readers_clock_is_caught() -> None:
    """L: d1, whose clock is a tick ahead, finds k1's lease past its end on its clock (a tick
    before the true end, while d0's app still uses it), ends it and acquires k1 anew; the
    paper's agent answers the new lease from the leased index: k1 holds two resources."""
    cfg, prefix = MIXED_LAPSED
    res = bfs(cfg, BAD_L, prefix=prefix, ops_after_prefix=1)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("d1 get_lease(k1) map_release APPLIED" in lab for lab in labels), labels


@pytest.mark.parametrize("faults", [0, 1])
def test_real_rules_end_a_lapsed_lease_once_every_clock_has_passed_it(faults: int) -> None:
    """The same with the real rules: d1 waits until the end has passed by the skew bound,
    with no fault and with one (lost replies, delayed writes, read errors)."""
    cfg, prefix = MIXED_LAPSED
    res = bfs(dataclasses.replace(cfg, max_faults=faults), REAL, prefix=prefix, ops_after_prefix=1)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > (30_000 if faults else 5_000)


def test_beside_the_paper_agent_no_claim_is_given_back_under_a_fault() -> None:
    """``MIXED`` with one fault: with the claim and its mapping write sent together, a fault
    that kept the mapping write from landing left a claim to give back, which the paper's
    agent answered from its lagging leased index while rasd answered the key another
    resource (I2). With ``legacy_agents`` the claim goes out only once the mapping applied,
    so no claim is ever given back, and the search is complete without a violation."""
    # no time budget: complete is the claim (15 s here; pytest-timeout bounds a runaway)
    res = bfs(dataclasses.replace(MIXED, max_faults=1), REAL)
    assert res.violation is None, format_trace(res)
    assert res.complete


#: CI's bound on its widest searches, in states taken in breadth-first order (so every
#: interleaving up to the depth the bound reaches, and the same states on every run); each
#: of them runs to completion in ``make check-protocol`` (docs/checker.md, "Searches")
WIDE = 60_000


def assert_wide_and_clean(res: Result, bound: int = WIDE) -> None:
    """No violation, and the search was as wide as its bound (or complete)."""
    assert res.violation is None, format_trace(res)
    assert res.complete or res.states >= bound, res.states


# ------------------------------------------- ras-dedupe against the extra's extension
@pytest.mark.parametrize("legacy", [False, True], ids=["after-rollout", "rollout"])
def test_real_rules_hold_an_unreleased_give_back_to_its_end(legacy: bool) -> None:
    """A daemon's extension of a deduplicated extra loses its mapping to ras-dedupe and
    the daemon gives the resource back: with the real rules it stays unclaimable until the
    end apps were answered, in either mode (in rollout mode every free is held to the
    lease's end whatever the give-back's reason), every interleaving within :data:`WIDE`:
    after the rollout, that reaches past the depth at which E breaks (the test below);
    ``make check-protocol`` runs both to completion."""
    cfg, prefix = DEDUPE_EXTEND[legacy]
    res = bfs(cfg, REAL, max_states=WIDE, prefix=prefix, ops_after_prefix=1)
    assert_wide_and_clean(res)
    assert res.states >= WIDE  # the interleavings were there to explore


def test_bad_e_unreleased_give_back_with_the_quarantine_only_is_caught() -> None:
    """E: the give-back of a lease no app released, with the quarantine only (the daemon's
    rule before it held such frees to the lease's end without the paper's agent): another
    key gets the resource while the first key's answer still runs (I1)."""
    cfg, prefix = DEDUPE_EXTEND[False]
    res = bfs(cfg, BAD_E, prefix=prefix, ops_after_prefix=1)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    # within the bound of the real rules' search above: with E's rule, that search would
    # have broken before it stopped
    assert res.states < WIDE, res.states
    labels = [lab for lab, _ in res.trace]
    assert any("dedupe map_release APPLIED" in lab for lab in labels), format_trace(res)
    assert any("free_claim(rb" in lab and "APPLIED" in lab for lab in labels), format_trace(res)


# ------------------------------------------------------------- the rollout record's switch
@pytest.mark.parametrize("cfg", [SWITCH_OFF, SWITCH_ON], ids=["end-rollout", "adopt"])
def test_real_rules_hold_across_the_rollout_switch(cfg: Config) -> None:
    """The record changes at any step, each daemon follows at a step of its own, and the
    programs it started before keep their mode: every interleaving within :data:`WIDE`
    keeps I1 and I2 (with the paper's agent calling after ``adopt`` once its bound has
    passed; the break the next test finds lies inside that bound)."""
    assert_wide_and_clean(bfs(cfg, REAL, max_states=WIDE))


def test_the_switch_is_explored_with_daemons_that_have_not_followed() -> None:
    """The search reaches states where the record changed and one daemon runs each mode."""
    from check.explore import _start
    from check.model import successors

    w = _start(SWITCH_OFF, REAL, None, None)
    (w,) = [n for lab, n in successors(w) if lab == "rasadmin end-rollout"]
    (w,) = [n for lab, n in successors(w) if lab == "d0 follows the rollout record"]
    assert [s.legacy_agents for s in w.setups] == [False, True]
    labels = [lab for lab, _ in successors(w)]
    assert "d1 follows the rollout record" in labels and "d0 get_lease(k1) called" in labels


def test_the_paper_agent_reading_an_index_from_before_adopt_splits_a_key() -> None:
    """Why ``adopt``'s bound counts: were the paper's agent to read the leased index as it
    was before every daemon followed (an index lagging across the switch), it would answer a
    losing claim a daemon made under the fast rules (I2), or a lease released before the
    switch, to its end, while its resource is claimable after the quarantine (I1, which the
    claimable invariant sees first). Walks of the swarm's world of the fast rules' leftovers
    find it once that index lags (there it is caught up: the bound has passed)."""
    from check import swarm

    cfg = dataclasses.replace(swarm.WORLDS["fast-leftover-then-adopt"], history=2)
    res = next(r for s in range(200) if (r := swarm.walk_in(cfg, REAL, s, 120)).violation)
    assert res.violation is not None and res.violation.name in ("I1", "I2"), format_trace(res)
    assert any(lab.endswith("rasadmin adopt") for lab, _ in res.trace), format_trace(res)


# ------------------------------------------------------------------------- strict pools
def test_strict_pool_keeps_one_resource_per_key_across_regions() -> None:
    """Both regions ask for k1 of a strict pool at once, another region's mapping read a
    version behind, one fault anywhere: every interleaving answers k1 one resource (I2 across
    regions), with either home-down setting."""
    for cfg in (STRICT, STRICT_LOCAL):
        res = bfs(cfg, REAL)
        assert res.complete
        assert res.violation is None, format_trace(res)


def test_bad_g_agreement_skipped_is_caught() -> None:
    """G: without the agreement each region answers its own claim: k1 holds ra and rb."""
    res = bfs(STRICT, BAD_G)
    assert res.violation is not None and res.violation.name == "I2", format_trace(res)
    labels = " | ".join(lab for lab, _ in res.trace)
    for d in ("d0", "d1"):
        assert f"{d} get_lease(k1) claim APPLIED" in labels, format_trace(res)


def test_strict_local_fallback_is_exempt_only_when_the_home_region_failed() -> None:
    """With "local", a lease answered unagreed is one whose home-region call failed (a
    fault): the fault-free interleavings of STRICT_LOCAL are those of STRICT."""
    a = bfs(dataclasses.replace(STRICT, max_faults=0), REAL)
    b = bfs(dataclasses.replace(STRICT_LOCAL, max_faults=0), REAL)
    assert a.states == b.states and a.violation is None and b.violation is None


# ------------------------------------------------- a sliding lease served on two daemons
@pytest.mark.parametrize("read_first", [True, False], ids=["read-first", "blind"])
def test_real_rules_extend_a_key_served_on_two_daemons(read_first: bool) -> None:
    """k1 cached on d0 and d1, asked again as time runs past its end, the liberator beside:
    each daemon extends the lease, or (``extend_read_first``) finds it extended by the other
    and writes nothing; every interleaving keeps I1 and I2 with either setting (with one
    fault too in ``make check-protocol``)."""
    cfg = dataclasses.replace(EXTEND_SHARED, extend_read_first=read_first)
    res = bfs(cfg, REAL, prefix=EXTEND_SHARED_PREFIX, ops_after_prefix=2)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > 10_000


def test_bad_x_an_extension_read_taken_as_the_end_asked_is_caught() -> None:
    """X: the extension's read finds the lease still ours and takes it as extended to the
    end the app asked for, writing nothing: the app is answered an end the table never
    held, and the liberator frees the resource before it (I1)."""
    res = bfs(EXTEND_SHARED, BAD_X, prefix=EXTEND_SHARED_PREFIX, ops_after_prefix=2)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    labels = [lab for lab, _ in res.trace]
    assert any("bg extend(k1) read mapping" in lab for lab in labels), format_trace(res)
    assert any("liberate APPLIED" in lab for lab in labels), format_trace(res)


# --------------------------------------------------- a yield whose request's deadline passes
def test_real_rules_give_a_yielded_claim_back_whatever_the_requests_deadline() -> None:
    """Settling finds the paper's lease of k1 made while d0's claim was in flight: the
    mapping names it, our claim is given back, the paper's lease adopted. Every interleaving,
    with the request's deadline falling at any of its calls, keeps I2: the give-back is a
    program of its own. (With it a step of the request, this world breaks in 6 s: the
    deadline passes after the mapping write, the claim stays on its item, and the paper's
    agent answers it beside its own lease; the mixed chaos run found it first.)"""
    res = bfs(MIXED_YIELD, REAL)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > 30_000


# ------------------------------------ an operator's end of a lease the paper's agent made
def test_a_paper_lease_the_operator_ended_is_ended_for_every_answer_of_it() -> None:
    """The swarm (seed 28785 of its 6-minute run): rasadmin delete-resource --force ends k1's
    lease of the paper's agent on ra; the agent, reading its lagging leased index, answers k1
    -> ra again (an answer it names anew), and a daemon then answers k1 -> rb. The later
    answer is the ended lease's, stale as a cached copy of a released lease is, so it is no
    second lease of k1 (I2); an answer of another lease of the paper's agent still counts."""
    cfg = dataclasses.replace(MIXED, keys=("k1",), resources=("ra", "rb"))
    w = initial(cfg, REAL)
    end = (T0 + 18) * US
    paper, d0 = DaemonState(9, 1), w.daemons[0]
    w.t = 5
    w.answer(paper, "k1", Lease("c", "p", "k1", "ra", REGION, end, 1, 0, "paper0"))
    w.lease_ended("k1", None)  # the operator's --force: no token (the paper's agent's)
    w.t = 11
    w.answer(paper, "k1", Lease("c", "p", "k1", "ra", REGION, end, 2, 0, "paper-found1"))
    w.t = 12
    w.answer(d0, "k1", Lease("c", "p", "k1", "rb", REGION, (T0 + 24) * US, 1, 0, "t4"))
    assert w.violation is None, w.violation
    w.answer(paper, "k1", Lease("c", "p", "k1", "ra", REGION, end + US, 3, 0, "paper-found2"))
    assert w.violation is not None and w.violation.name == "I2"


def test_the_paper_agents_answer_of_a_lease_rasd_adopted_is_that_lease() -> None:
    """The swarm in rollout mode (seed 5002906 of a run drawing the paper's agent on k1 every
    time): the paper's claim of ra for k1 lands after its call gave up; a daemon adopts it
    and answers it (its own token), its app releases k1, and the daemon answers k1 -> rb, a
    new lease. The paper's agent then answers k1 -> ra from its leased index, lagging the
    free of ra. That answer is of the lease rasd adopted (one claim, one end) and released:
    stale, as a cached copy of a released lease is, not a second lease of k1 (I2). The same
    answer from an index still showing ra held (the free never landed), and an answer of
    another claim the paper's agent made before rb's, still count."""
    cfg = dataclasses.replace(MIXED, keys=("k1",), resources=("ra", "rb", "rc"))
    w = initial(cfg, REAL)
    assert cfg.makers
    end = (T0 + 18) * US
    paper, d0 = DaemonState(9, 1), w.daemons[0]
    w.made_by("ra", "paper")
    w.made_by("rc", "paper")  # never adopted nor released
    w.t = 5
    w.answer(d0, "k1", Lease("c", "p", "k1", "ra", REGION, end, 2, 0, "t4"))
    w.release_called("k1")
    w.release_done("t4")
    w.t = 6
    w.made_by("rb", "rasd")
    w.answer(d0, "k1", Lease("c", "p", "k1", "rb", REGION, (T0 + 24) * US, 1, 0, "t6"))
    w.t = 7
    found = Lease("c", "p", "k1", "ra", REGION, end, 1, 0, "paper-found1")
    fresh = w.clone()
    w.lagged = frozenset({"paper-found1"})  # the index lagged the free of ra
    w.answer(paper, "k1", found)
    assert w.violation is None, w.violation
    # from an index that still shows ra held for k1 (its free never landed): counted
    fresh.answer(paper, "k1", found)
    assert fresh.violation is not None and fresh.violation.name == "I2"
    w.answer(paper, "k1", Lease("c", "p", "k1", "rc", REGION, end, 1, 0, "paper-found2"))
    assert w.violation is not None and w.violation.name == "I2"


# ------------------------------------------------------------------- an outage budget
def test_bad_o_a_release_quarantined_for_q_only_is_caught() -> None:
    """O: in a pool with an outage budget, an app's release keeps the resource out for
    the daemons' Q only: claimable while d1, cut off, may still answer k1 from its window
    (I1 with the pool's quarantine, checked as the free is written)."""
    res = bfs(OUTAGE, BAD_O, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert any("free_claim APPLIED" in lab for lab, _ in res.trace), format_trace(res)


def test_bad_o2_a_window_of_twice_the_budget_is_caught() -> None:
    """O2: d1 answers k1 from its window past what the pool's quarantine covers: ra is
    claimable (for k2) while that answer runs (I1)."""
    res = bfs(OUTAGE, BAD_O2, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert any("OUTAGE HIT" in lab for lab, _ in res.trace), format_trace(res)


def test_real_rules_keep_a_cut_off_hosts_window_answers_within_the_pools_quarantine() -> None:
    """k1 released through d0 while d1, which served it, may answer it from its outage
    window at any step; k2 asks for the one resource: every interleaving keeps I1 and I2
    (a smaller world than the quick run's: no liberator, no extension, the index current,
    to t = 9, when the pool's quarantine has run out on every clock)."""
    small = OUTAGE_SMALL
    res = bfs(small, REAL, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > 3_000
    # the same world reaches a window answer: with O2's longer window it breaks I1 there
    bad = bfs(small, BAD_O2, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert bad.violation is not None, "no window answer explored"
    assert any("OUTAGE HIT" in lab for lab, _ in bad.trace), format_trace(bad)


# ------------------------------------------------------------------------ the hit table
def test_bad_ht_a_table_read_past_s_is_caught() -> None:
    """HT: a hit table answers an entry up to its lease's end, not S: d1's other worker
    reads k1 from it after d0's release, once ra is claimable (I1)."""
    res = bfs(HIT_TABLE, BAD_HT, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert res.violation is not None and res.violation.name == "I1", format_trace(res)
    assert any("TABLE HIT" in lab for lab, _ in res.trace), format_trace(res)


def test_real_rules_hold_with_a_hit_table_read_while_the_daemon_is_busy() -> None:
    """k1 released through d0 while d1, which served it, has requests in flight and its
    other workers read its table at any step: every interleaving keeps I1 and I2."""
    res = bfs(HIT_TABLE, REAL, prefix=OUTAGE_RELEASED, ops_after_prefix=2)
    assert res.complete and res.violation is None, format_trace(res)
    assert res.states > 10_000
