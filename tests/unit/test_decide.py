"""Every branch of the acquisition protocol's pure decisions (rasd.core.decide), time passed in.
The protocol checker (check/) explores how they compose; these pin each one down."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rasd.core import decide, verdicts
from rasd.core import lease as lease_items
from rasd.core import legacy as legacy_rules
from tests.helpers.decisions import NOW, RULES, S, m, r

A, R, U = decide.Outcome.APPLIED, decide.Outcome.REJECTED, decide.Outcome.UNKNOWN


# ------------------------------------------------------------------------------ on_read
def test_no_mapping_acquires_at_version_zero() -> None:
    assert decide.on_read(None, [], NOW, RULES) == decide.Acquire(0)


def test_free_mapping_acquires_at_its_version() -> None:
    assert decide.on_read(m(state=lease_items.FREE, ver=7), [], NOW, RULES) == decide.Acquire(7)


def test_live_mapping_is_served() -> None:
    d = decide.on_read(m(), [], NOW, RULES)
    assert isinstance(d, decide.Serve) and d.lease.resource == "r1" and not d.foreign
    assert d.lease.token == "tok" and d.lease.version == 5


def test_live_mapping_near_its_end_is_extended_not_served() -> None:
    """Within the margin of its end (and until the liberator's grace), extend first."""
    assert decide.on_read(m(exp=NOW + 4 * S), [], NOW, RULES) == decide.Extend(m(exp=NOW + 4 * S))
    assert isinstance(decide.on_read(m(exp=NOW - 1 * S), [], NOW, RULES), decide.Extend)


def test_lapsed_mapping_acquires_anew() -> None:
    """Past its end plus the grace, the liberator may free the resource: acquire again."""
    assert decide.on_read(m(exp=NOW - 2 * S, ver=9), [], NOW, RULES) == decide.Acquire(9)


def test_pending_mapping_is_verified() -> None:
    p = m(state=lease_items.PENDING)
    assert decide.on_read(p, [], NOW, RULES) == decide.Verify(p)


def test_foreign_lease_is_served_instead_of_acquiring() -> None:
    """Another region's live lease is served as it is (avoids a cross-region duplicate)."""
    f = m(region="eu-west-1", res="rf")
    d = decide.on_read(None, [f], NOW, RULES)
    assert isinstance(d, decide.Serve) and d.foreign and d.lease.resource == "rf"
    d = decide.on_read(m(state=lease_items.PENDING), [f], NOW, RULES)
    assert isinstance(d, decide.Serve) and d.foreign


def test_earliest_of_cross_region_duplicates_is_served_everywhere() -> None:
    own = m(since=NOW - 5 * S)
    older = m(region="eu-west-1", res="rf", since=NOW - 9 * S)
    newer = m(region="eu-west-1", res="rf", since=NOW - 1 * S)
    d = decide.on_read(own, [older], NOW, RULES)
    assert isinstance(d, decide.Serve) and d.lease.resource == "rf"
    d = decide.on_read(own, [newer], NOW, RULES)
    assert isinstance(d, decide.Serve) and d.lease.resource == "r1"


def test_foreign_pending_or_ending_is_ignored() -> None:
    assert decide.on_read(
        None, [m(region="eu-west-1", state=lease_items.PENDING)], NOW, RULES
    ) == decide.Acquire(0)
    ending = m(region="eu-west-1", exp=NOW + 1 * S)
    assert decide.on_read(None, [ending], NOW, RULES) == decide.Acquire(0)


# -------------------------------------------------------------------------- on_resource
def test_pending_whose_claim_landed_is_served_and_confirmed() -> None:
    p = m(state=lease_items.PENDING)
    d = decide.on_resource(p, r(), NOW, RULES)
    assert isinstance(d, decide.Serve) and d.confirm == p


def test_pending_whose_claim_landed_near_its_end_is_extended() -> None:
    p = m(state=lease_items.PENDING, exp=NOW + 1 * S)
    d = decide.on_resource(p, r(), NOW, RULES)
    assert isinstance(d, decide.Extend) and d.mapping.state == lease_items.LIVE
    assert d.pending == p  # beside the paper's agent, settled before it is extended


def test_young_pending_waits_for_its_acquirer() -> None:
    p = m(state=lease_items.PENDING, since=NOW - 1 * S)
    assert isinstance(decide.on_resource(p, r(holder="other"), NOW, RULES), decide.Wait)
    assert isinstance(decide.on_resource(p, None, NOW, RULES), decide.Wait)


def test_old_pending_whose_claim_may_still_land_is_fenced() -> None:
    """The resource is still at the version the claim was conditioned on: fence it."""
    p = m(state=lease_items.PENDING, rver=4)
    free = replace(r(holder=None, key=None, version=4))
    assert decide.on_resource(p, free, NOW, RULES) == decide.FenceResource(free)


def test_old_pending_whose_claim_can_never_land_is_taken_over() -> None:
    """The resource moved past the claim's version without the claim: take over."""
    p = m(state=lease_items.PENDING, rver=4, ver=6)
    assert decide.on_resource(p, r(holder="other", version=5), NOW, RULES) == decide.Acquire(6)
    assert decide.on_resource(p, None, NOW, RULES) == decide.Acquire(6)


def test_claim_landed_needs_token_key_and_resource() -> None:
    p = m(state=lease_items.PENDING)
    assert decide.claim_landed(p, r())
    assert not decide.claim_landed(p, r(holder="other"))
    assert not decide.claim_landed(p, r(key="k2"))
    assert not decide.claim_landed(replace(p, resource="r9"), r())
    assert not decide.claim_landed(p, None)


# ------------------------------------------------------------------------ after_acquire
@pytest.mark.parametrize(
    ("mapping", "claim", "expected"),
    [
        (A, A, decide.Won()),
        (A, R, decide.NextCandidate(4)),
        (R, A, decide.GiveBack(decide.NeverNamed("map_acquire"))),
        (R, R, decide.Reread("another daemon wrote the mapping first")),
        (R, U, decide.FenceOwnClaim(decide.NeverNamed("map_acquire"))),
    ],
)
def test_after_acquire(
    mapping: decide.Outcome, claim: decide.Outcome, expected: decide.AcquireStep
) -> None:
    assert decide.after_acquire(mapping, claim, 3) == expected


@pytest.mark.parametrize(("mapping", "claim"), [(A, U), (U, A), (U, R), (U, U)])
def test_after_acquire_never_acts_on_an_unknown_mapping_or_own_claim(
    mapping: decide.Outcome, claim: decide.Outcome
) -> None:
    """I4: with the mapping's or (mapping applied) the claim's outcome unknown, give up and
    leave the state for a reader to resolve; never give a claim back on a guess."""
    assert isinstance(decide.after_acquire(mapping, claim, 3), decide.GiveUp)


# ------------------------------------------------------------------------- after_extend
def test_after_extend() -> None:
    assert decide.after_extend(A, A) == decide.Extended()
    assert decide.after_extend(A, R) == decide.CheckMapping()
    assert isinstance(decide.after_extend(A, U), decide.Forget)
    assert isinstance(decide.after_extend(R, None), decide.Forget)
    assert isinstance(decide.after_extend(U, None), decide.Forget)


def test_a_lost_mapping_extension_frees_only_what_no_mapping_names() -> None:
    """Found by the protocol checker: two daemons extend one lease at once and the one asking
    for less loses ``map_extend`` (``exp < new``): the mapping still names the lease, so the
    resource must NOT be freed. Only a mapping that no longer names it makes it an orphan."""
    lease = decide.lease_from_mapping(m())
    assert isinstance(decide.on_extend_check(m(exp=NOW + 7200 * S), lease), decide.Forget)
    assert isinstance(decide.on_extend_check(m(state=lease_items.PENDING), lease), decide.Forget)
    assert decide.on_extend_check(m(token="other"), lease) == decide.FreeOrphan()
    assert decide.on_extend_check(m(res="r9"), lease) == decide.FreeOrphan()
    assert decide.on_extend_check(m(state=lease_items.FREE), lease) == decide.FreeOrphan()
    assert decide.on_extend_check(None, lease) == decide.FreeOrphan()


# ------------------------------------------------------------------------------ release
def test_release_decisions() -> None:
    assert isinstance(decide.on_release_read(None, NOW, RULES), decide.NotHeld)
    assert isinstance(decide.on_release_read(m(state=lease_items.FREE), NOW, RULES), decide.NotHeld)
    assert isinstance(decide.on_release_read(m(exp=NOW - 3 * S), NOW, RULES), decide.NotHeld)
    d = decide.on_release_read(m(), NOW, RULES)
    assert isinstance(d, decide.ReleaseLease) and d.lease.token == "tok"
    p = m(state=lease_items.PENDING)
    assert decide.on_release_read(p, NOW, RULES) == decide.Verify(p)
    assert isinstance(decide.on_release_resource(p, r(), NOW, RULES), decide.ReleaseLease)
    dead = m(state=lease_items.PENDING, rver=4)
    assert decide.on_release_resource(
        dead, r(holder="x", version=6), NOW, RULES
    ) == decide.DropMapping(dead)
    young = m(state=lease_items.PENDING, since=NOW)
    assert isinstance(decide.on_release_resource(young, r(holder="x"), NOW, RULES), decide.Wait)


# ------------------------------------------------------------------------------- repair
def test_orphan_verdict() -> None:
    """A held resource no mapping names (and none ever will) is an orphan; one whose mapping
    write could still land needs the mapping fenced first."""
    held = replace(r(), mver=3)
    assert verdicts.orphan_verdict(held, m(ver=3)) is verdicts.Orphan.LEASE
    assert (
        verdicts.orphan_verdict(held, m(state=lease_items.PENDING, ver=3)) is verdicts.Orphan.LEASE
    )
    assert verdicts.orphan_verdict(held, m(token="other", ver=3)) is verdicts.Orphan.ORPHAN
    assert verdicts.orphan_verdict(held, m(state=lease_items.FREE, ver=5)) is verdicts.Orphan.ORPHAN
    assert verdicts.orphan_verdict(held, m(token="other", ver=2)) is verdicts.Orphan.FENCE_MAPPING
    assert verdicts.orphan_verdict(replace(held, mver=1), None) is verdicts.Orphan.FENCE_MAPPING
    assert verdicts.orphan_verdict(held, None) is verdicts.Orphan.ORPHAN  # reaped by TTL long ago


def test_orphan_free_at_holds_a_possibly_served_orphan_to_its_lease_end() -> None:
    """An orphan a mapping may have named (a release or ras-dedupe stopped between its two
    writes) may still be in use to its lease's end: claimable only after that end plus the
    grace. One whose mapping write never landed was never served: the quarantine only."""
    held = r()  # mver 3, lease to NOW + 1 h
    end = NOW + 3600 * S + 2 * S
    q = NOW + 57 * S
    assert (
        verdicts.orphan_free_at(held, m(state=lease_items.FREE, ver=5), NOW, 57 * S, 2 * S) == end
    )
    assert verdicts.orphan_free_at(held, None, NOW, 57 * S, 2 * S) == end  # unknown: to its end
    assert verdicts.orphan_free_at(held, m(token="other", ver=2), NOW, 57 * S, 2 * S) == q  # below
    assert verdicts.orphan_free_at(held, m(token="other", ver=3), NOW, 57 * S, 2 * S) == q  # lost
    short = replace(held, lease_expires_us=NOW + 10 * S)  # ends within the quarantine
    assert verdicts.orphan_free_at(short, m(state=lease_items.FREE, ver=5), NOW, 57 * S, 2 * S) == q


def test_cache_validity_is_the_earlier_bound() -> None:
    assert decide.cache_valid_until_us(NOW, NOW + 3600 * S, RULES) == NOW + 30 * S
    assert decide.cache_valid_until_us(NOW, NOW + 10 * S, RULES) == NOW + 5 * S


def test_name_held_until_covers_every_lease_and_quarantine_on_it() -> None:
    """A deleted resource's name is held (a re-add is claimable no earlier) until its
    quarantine ends, or, for a lease deleted with --force, until the later of the quarantine
    (caches) and its end plus the skew (apps: no app released it)."""
    held = r()  # lease to NOW + 1 h
    assert verdicts.name_held_until(held, NOW, 57 * S, 2 * S) == NOW + 3600 * S + 2 * S
    short = replace(held, lease_expires_us=NOW + 10 * S)
    assert verdicts.name_held_until(short, NOW, 57 * S, 2 * S) == NOW + 57 * S
    quarantined = replace(
        r(holder=None, key=None), lease_available=lease_items.fmt_time(NOW + 40 * S)
    )
    assert verdicts.name_held_until(quarantined, NOW, 57 * S, 2 * S) == NOW + 40 * S
    free = replace(r(holder=None, key=None), lease_available=lease_items.fmt_time(NOW - 40 * S))
    assert verdicts.name_held_until(free, NOW, 57 * S, 2 * S) == NOW


# ------------------------------------------------------------ beside the paper's agent
def held(
    res: str,
    key: str = "k",
    exp: int = NOW + 60 * S,
    holder: str | None = None,
    hver: int | None = None,
    version: int = 5,
    region: str = "us-east-1",
) -> lease_items.ResourceItem:
    """An item the leased index shows held; by default a lease of the paper's agent (no
    holder)."""
    return lease_items.ResourceItem(
        "c", res, "p", region, "x", version, key, exp, None, None, holder, 0, hver
    )


def test_beside_legacy_settles_a_landed_claim_instead_of_serving_it() -> None:
    """A pending mapping whose claim landed is settled before it is served, by whoever
    reads it; anything else is left as it is."""
    mine = replace(m(state=lease_items.PENDING, since=NOW), owner="me")
    landed = decide.Serve(decide.lease_from_mapping(mine), confirm=mine)
    assert legacy_rules.beside_legacy(landed) == legacy_rules.Settle(mine)
    live = decide.Serve(decide.lease_from_mapping(m()))
    assert legacy_rules.beside_legacy(live) is live
    assert legacy_rules.beside_legacy(decide.Extend(m())) == decide.Extend(m())
    extending = decide.Extend(replace(mine, state=lease_items.LIVE), pending=mine)
    assert legacy_rules.beside_legacy(extending) == legacy_rules.Settle(mine)
    assert legacy_rules.beside_legacy(legacy_rules.Settle(mine)) == legacy_rules.Settle(mine)


def test_on_settle_yields_to_a_lease_of_the_paper_agent_made_meanwhile() -> None:
    """The leased index, read after our claim landed, shows another running lease of the key
    in our region that rasd does not hold: adopt it, do not serve our claim."""
    p = m(state=lease_items.PENDING, res="r1")
    ours = held("r1", holder="tok", hver=5)
    theirs = held("r2")
    assert legacy_rules.on_settle(p, [ours], NOW) == legacy_rules.Confirm(p)
    assert legacy_rules.on_settle(p, [ours, theirs], NOW) == legacy_rules.YieldTo(p, theirs)
    # a holder the paper's agent left behind (hver behind version) is no rasd lease
    stale = held("r3", holder="old", hver=3, version=6)
    assert legacy_rules.on_settle(p, [ours, stale], NOW) == legacy_rules.YieldTo(p, stale)


def test_on_settle_waits_for_a_lease_at_its_end_until_it_passed_on_every_clock() -> None:
    p = m(state=lease_items.PENDING, res="r1")
    grace = 2 * S
    ending = held("r2", exp=NOW - 1)
    assert legacy_rules.on_settle(p, [ending], NOW, grace) == decide.Wait(
        "another lease of the key is at its end here, not yet on every host",
        until_us=NOW - 1 + grace,
    )
    assert legacy_rules.on_settle(p, [ending], NOW - 1 + grace, grace) == legacy_rules.Confirm(p)


def test_on_settle_ignores_what_is_no_rival() -> None:
    p = m(state=lease_items.PENDING, res="r1")
    others = [
        held("r2", exp=NOW),  # ended
        held("r3", key="k2"),  # another key
        held("r4", region="eu-west-1"),  # another region: a cross-region duplicate at most
    ]
    assert legacy_rules.on_settle(p, others, NOW) == legacy_rules.Confirm(p)


def test_on_settle_yields_to_a_claim_of_rasd_no_mapping_names() -> None:
    """Another daemon's claim for the key that lost the mapping (or whose outcome was
    unknown) is held until it is given back; rasd never serves it, but the paper's agent
    answers it from the index: it is a rival like the paper's own leases, the earliest
    first."""
    p = replace(m(state=lease_items.PENDING, res="r1"), since_us=NOW)
    orphan = replace(held("r5", holder="t5", hver=5), lease_acquired_us=NOW - 2 * S)
    assert legacy_rules.on_settle(p, [orphan], NOW) == legacy_rules.YieldTo(p, orphan)
    theirs = held("r6")  # the paper's: no lease_acquired, so the earliest
    assert legacy_rules.on_settle(p, [orphan, theirs], NOW) == legacy_rules.YieldTo(p, theirs)


def test_on_settle_ignores_a_young_claim_of_rasd_being_given_back() -> None:
    """A claim of rasd's younger than ORPHAN_RIVAL_AGE_US is the losing side of a race for
    the key, given back by its acquirer at that moment: no rival (two daemons racing one key
    would otherwise yield to each other's losing claims until the deadline). Its age is
    measured at the settled acquisition's start, so a reader that settles the same pending
    mapping later decides as its acquirer did."""
    p = replace(m(state=lease_items.PENDING, res="r1"), since_us=NOW)
    young = NOW - legacy_rules.ORPHAN_RIVAL_AGE_US + 1
    loser = replace(held("r5", holder="t5", hver=5), lease_acquired_us=young)
    assert legacy_rules.on_settle(p, [loser], NOW) == legacy_rules.Confirm(p)
    assert legacy_rules.on_settle(p, [loser], NOW + 30 * S) == legacy_rules.Confirm(
        p
    )  # a reader, 30 s later
    old = replace(loser, lease_acquired_us=NOW - legacy_rules.ORPHAN_RIVAL_AGE_US)
    assert legacy_rules.on_settle(p, [old], NOW) == legacy_rules.YieldTo(p, old)
    assert legacy_rules.on_settle(p, [old], NOW + 30 * S) == legacy_rules.YieldTo(p, old)


def test_on_lapsed_ends_a_lease_whose_item_has_ended_on_every_clock() -> None:
    """Past its end on the mapping: extended only if the item shows it still running (an
    extension the mapping lags); ended once the item's end has passed by the clock-skew
    bound (every host's clock past it), so that the key acquires anew; waited for between."""
    grace = 2 * S
    lapsed = m(exp=NOW - 3 * S)
    item = replace(r(), lease_expires_us=NOW - grace)
    assert legacy_rules.on_lapsed(lapsed, item, NOW, grace) == legacy_rules.EndLapsed(lapsed)
    assert legacy_rules.on_lapsed(
        lapsed, replace(item, lease_expires_us=NOW - 3 * S), NOW, grace
    ) == (legacy_rules.EndLapsed(lapsed))
    # past its end here, but a host whose clock is behind by up to the bound may still serve it
    # (and within the bound before its end, not extended): waited for until it has passed on
    # every clock, which no read before then can change
    ending = "the lease ends within the clock-skew bound: not extended"
    ended = "the lease is at its end on this host's clock, not yet on every host's"
    for end, why in (
        (NOW + grace, ending),
        (NOW + 1, ending),
        (NOW, ended),
        (NOW - 1, ended),
        (NOW - grace + 1, ended),
    ):
        got = legacy_rules.on_lapsed(
            lapsed, replace(item, lease_expires_us=end), NOW, grace, margin_us=grace
        )
        assert got == decide.Wait(why, until_us=end + grace), end
    # an item that names no end is no lease to wait for
    no_end = replace(item, lease_expires_us=None)
    assert legacy_rules.on_lapsed(lapsed, no_end, NOW, grace) == legacy_rules.EndLapsed(lapsed)
    extended = replace(item, lease_expires_us=NOW + 30 * S)
    assert legacy_rules.on_lapsed(lapsed, extended, NOW, grace) == decide.Extend(lapsed)
    assert legacy_rules.on_lapsed(lapsed, replace(item, lease_expires_us=NOW + 1), NOW, grace) == (
        decide.Extend(lapsed)
    )
    # no longer our claim (liberated, freed, taken): ended at once
    assert legacy_rules.on_lapsed(lapsed, None, NOW, grace) == legacy_rules.EndLapsed(lapsed)
    assert legacy_rules.on_lapsed(lapsed, replace(extended, holder="other"), NOW, grace) == (
        legacy_rules.EndLapsed(lapsed)
    )
    assert legacy_rules.on_lapsed(
        lapsed, replace(item, holder="other"), NOW, grace
    ) == legacy_rules.EndLapsed(lapsed)
