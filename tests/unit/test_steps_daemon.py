"""The daemon's programs that settle, renew and give back (rasd.steps.settle, .renew,
.give_back), driven by a scripted ``perform`` over plain items (``rasd.core.writes.apply``, as
the checker evaluates writes), with time passed in. Every write that carries a read-back is
checked against it: the item it wrote carries it, the item before did not (I4)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from rasd.core import decide
from rasd.core.decide import Outcome, Rules, lease_from_mapping
from rasd.core.errors import NotHeld, RasdError, Timeout, Unavailable
from rasd.core.lease import (
    FREE,
    LIVE,
    PENDING,
    US,
    Lease,
    Mapping,
    fmt_time,
    map_pk,
)
from rasd.core.map_builders import map_confirm
from rasd.core.serialize import resource_from
from rasd.core.writes import ItemKey, Write
from rasd.steps import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    QueryLeased,
    QueryMappings,
    Send,
    Sleep,
    Spawn,
    WriteResult,
    drive_sync,
)
from rasd.steps import give_back as give_back_steps
from rasd.steps import renew as renew_steps
from rasd.steps import settle as settle_steps
from rasd.steps.daemon import (
    RELIST_MAX_WAIT_US,
    RELIST_SLACK,
    CacheDrop,
    CachePut,
    Deadline,
    Ops,
    RelistLater,
)
from tests.helpers.daemontable import (
    EAST,
    HOUR,
    MONO,
    NOW,
    POOL,
    RULES,
    SOUTH,
    WEST,
    G,
    M,
    Q,
    Table,
    daemon,
)


def unknown(error: RasdError | None = None) -> WriteResult:
    return WriteResult(Outcome.UNKNOWN, error=error)


def refused(error: RasdError) -> WriteResult:
    return WriteResult(Outcome.REJECTED, error=error)


# ---------------------------------------------------------------------------- settling
def settling(t: Table, end: int = NOW + HOUR) -> decide.Serve:
    """Our pending mapping whose claim of ``ra`` landed, as ``on_resource`` serves it."""
    m = t.pending("ra", "k1", end, "t1")
    return decide.Serve(lease_from_mapping(m), confirm=m)


def test_settling_confirms_a_landed_claim_the_leased_index_shows_no_rival_of() -> None:
    t = Table()
    dec = settling(t)
    t.paper("rw", "k1", NOW + HOUR, region=WEST)  # another region's: no rival here
    assert dec.confirm is not None
    got = t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec))
    assert got == decide.Serve(lease_from_mapping(dec.confirm))
    assert t.of(QueryLeased) == [QueryLeased("c", "p", "k1")]
    assert t.writes() == ["map_confirm"] and t.bare == []
    m = t.mapping("k1")
    assert (m.state, m.token, m.ver) == (LIVE, "t1", dec.confirm.ver + 1)
    assert t.counts == Counter({"acq.confirm_applied": 1})


def extending(t: Table) -> decide.Extend:
    """Our pending mapping whose claim of ``ra`` landed, as ``on_resource`` decides it for a
    request that wants a longer lease than it has: extend it (writing it live)."""
    m = t.pending("ra", "k1", NOW + HOUR, "t1")
    return decide.Extend(replace(m, state=LIVE), pending=m)


def test_extending_a_pending_mapping_beside_the_paper_agent_yields_to_its_lease_first() -> None:
    """Extending writes the mapping live, which confirms it: beside the paper's agent a
    pending mapping is settled first, here yielding to the paper's lease of the key made
    while our claim was in flight; nothing of ours is extended, and the call reads again."""
    t = Table()
    dec = extending(t)
    t.paper("rp", "k1", NOW + HOUR)
    got = t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec))
    assert got is None  # read again: the next round extends what is live
    assert t.writes() == ["map_acquire", "adopt", "map_confirm"] and t.bare == []
    given_back_first(t)
    m = t.mapping("k1")
    assert (m.state, m.resource) == (LIVE, "rp")
    assert t.res("ra").key is None


def given_back_first(t: Table) -> None:
    """Our claim on ``ra`` was given back by a program of its own, spawned once the mapping
    named the paper's lease and joined before the adoption was sent (a request's deadline
    cannot leave it held); it runs here."""
    [sp] = [c for c in t.calls if isinstance(c, Spawn)]
    assert sp.fn is give_back_steps.free_claim and sp.args[1:] == (
        ("c", "ra"),
        "k1",
        "t1",
        decide.Freed.UNRELEASED,
    )
    kinds = [
        "spawn" if isinstance(c, Spawn) else "join" if isinstance(c, Join) else c.write.kind
        for c in t.calls
        if isinstance(c, (Spawn, Join, Send))
    ]
    assert kinds[:4] == ["map_acquire", "spawn", "join", "adopt"]
    t.drain()


def test_extending_a_pending_mapping_beside_the_paper_agent_settles_it_then_reads_again() -> None:
    t = Table()
    dec = extending(t)
    assert t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec)) is None
    assert t.of(QueryLeased) == [QueryLeased("c", "p", "k1")]
    assert t.writes() == ["map_confirm"] and t.bare == []
    assert t.mapping("k1").state == LIVE


def test_extending_a_live_mapping_beside_the_paper_agent_is_left_as_it_is() -> None:
    t = Table()
    live = decide.Extend(extending(t).mapping)
    assert t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", live)) == live
    assert t.calls == []


def test_settling_leaves_other_decisions_as_they_are() -> None:
    t = Table()
    served = settling(t)
    plain = decide.Serve(served.lease)
    for dec in (decide.Acquire(3), plain, decide.Wait("w")):
        assert t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec)) == dec
    assert t.calls == []


def test_settling_yields_to_the_paper_agents_lease_and_gives_ours_back_first() -> None:
    t = Table()
    dec = settling(t)
    assert dec.confirm is not None
    rp = t.paper("rp", "k1", NOW + HOUR)
    got = t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec))
    m = t.mapping("k1")
    assert (m.state, m.token, m.resource, m.rver, m.owner) == (
        LIVE,
        "tok",
        "rp",
        rp.version,
        "host-1",
    )
    assert m.ver == dec.confirm.ver + 2 and m.since_us == NOW
    assert got == decide.Serve(
        Lease("c", "p", "k1", "rp", EAST, NOW + HOUR, rp.version + 1, NOW, "tok")
    )
    # the mapping names the paper's lease before ours is given back, then the item is adopted
    assert t.writes() == ["map_acquire", "adopt", "map_confirm"] and t.bare == []
    given_back_first(t)
    ours = t.res("ra")
    assert ours.key is None and ours.quarantine_until == fmt_time(NOW + HOUR + G)
    after = t.res("rp")
    assert (after.holder, after.mver, after.key) == ("tok", dec.confirm.ver + 1, "k1")
    assert t.counts == Counter(
        {
            "lease.yielded": 1,
            "lease.adopted": 1,
            "acq.free_claim_applied": 1,
            "acq.confirm_applied": 1,
        }
    )
    assert t.of(RelistLater) == []  # held to its end: an hour is the liberator's


def test_settling_that_loses_the_mapping_reads_again_and_keeps_our_claim() -> None:
    t = Table()
    dec = settling(t)
    t.paper("rp", "k1", NOW + HOUR)
    assert dec.confirm is not None
    # another daemon settles the mapping first (it confirms it) before our adoption's write
    t.before[5] = lambda: t.land(map_confirm(t.mapping("k1")))
    assert t.run(settle_steps.beside_legacy(daemon(True), POOL, "k1", dec)) is None
    assert t.writes() == ["map_acquire"]
    assert t.res("ra").holder == "t1" and t.res("rp").holder is None
    assert t.counts == Counter({"lease.yielded": 1})


def test_confirm_now_serves_only_once_the_mapping_is_live() -> None:
    t = Table()
    m = t.pending("ra", "k1", NOW + HOUR, "t1")
    assert t.run(settle_steps.confirm_now(m)) == decide.Serve(lease_from_mapping(m))
    assert t.mapping("k1").state == LIVE and t.bare == []
    assert t.run(settle_steps.confirm_now(m)) is None  # lost: read again
    assert t.counts == Counter({"acq.confirm_applied": 1, "acq.confirm_rejected": 1})
    t.script["map_confirm"] = [
        refused(Unavailable("throttled")),
        unknown(),
        unknown(Unavailable("x")),
    ]
    with pytest.raises(Unavailable, match="throttled"):
        t.run(settle_steps.confirm_now(m))
    with pytest.raises(Timeout, match=r"^confirmation outcome unknown$"):
        t.run(settle_steps.confirm_now(m))
    with pytest.raises(Unavailable, match=r"^x$"):
        t.run(settle_steps.confirm_now(m))
    assert t.counts["acq.confirm_unknown"] == 2


# ------------------------------------------------------------------------ adoption
def adopting(t: Table, expect_ver: int = 0, **kw: Any) -> Any:
    held = [r for r in map(resource_from, t.items.values()) if r.key == "k1"]
    return t.run(settle_steps.adopt_paper_lease(daemon(True), POOL, "k1", held, expect_ver, **kw))


def test_adoption_names_the_paper_agents_lease_then_adopts_and_confirms_it() -> None:
    t = Table()
    t.paper("rw", "k1", NOW + HOUR, region=WEST)  # not ours to adopt
    t.set(("c", "rw"), lease_acquired=fmt_time(NOW - 2 * HOUR))
    rp = t.paper("rp", "k1", NOW + HOUR)
    t.set(("c", "rp"), lease_acquired=fmt_time(NOW - HOUR))
    got = adopting(t)
    assert got == decide.Serve(
        Lease("c", "p", "k1", "rp", EAST, NOW + HOUR, rp.version + 1, NOW, "tok")
    )
    assert t.writes() == ["map_acquire", "adopt", "map_confirm"] and t.bare == []
    assert t.mapping("k1").state == LIVE and t.res("rw").holder is None
    assert t.mapping("k1").rver == rp.version  # the version of the lease adopted
    assert t.counts == Counter({"lease.adopted": 1, "acq.confirm_applied": 1})


def test_adoption_without_a_running_lease_of_ours_acquires() -> None:
    t = Table()
    assert t.run(settle_steps.adopt_paper_lease(daemon(True), POOL, "k1", [], 3)) == decide.Acquire(
        3
    )
    assert t.calls == [Now()]
    # the index shows a lease in another region, one that has ended, one of another key
    t.paper("rw", "k1", NOW + HOUR, region=WEST)
    t.paper("re", "k1", NOW)
    assert adopting(t, 4) == decide.Acquire(4)
    assert t.writes() == [] and t.of(GetItem) == []


def test_adoption_acquires_when_the_item_read_no_longer_holds_the_lease() -> None:
    t = Table()
    hint = t.paper("rp", "k1", NOW + HOUR)
    t.set(("c", "rp"), lease_expires=fmt_time(NOW))  # ended as the item says
    assert t.run(
        settle_steps.adopt_paper_lease(daemon(True), POOL, "k1", [hint], 2)
    ) == decide.Acquire(2)
    assert t.of(GetItem) == [GetItem(("c", "rp"))] and t.writes() == []
    t.set(("c", "rp"), lease_expires=fmt_time(NOW + 1))  # runs a microsecond more
    got = t.run(settle_steps.adopt_paper_lease(daemon(True), POOL, "k1", [hint], 0))
    assert isinstance(got, decide.Extend)  # adopted, too close to its end to serve
    del t.items[("c", "rp")]
    assert t.run(
        settle_steps.adopt_paper_lease(daemon(True), POOL, "k1", [hint], 5)
    ) == decide.Acquire(5)


def test_adoption_of_a_lease_near_its_end_extends_it() -> None:
    t = Table()
    rp = t.paper("rp", "k1", NOW + M)
    got = adopting(t)
    assert got == decide.Extend(
        Mapping("c", "p", "k1", EAST, 1, LIVE, "tok", "rp", rp.version, NOW + M, NOW, "host-1")
    )
    assert t.writes() == ["map_acquire", "adopt"] and t.counts == Counter({"lease.adopted": 1})


def test_adoption_that_loses_the_mapping_reads_again() -> None:
    t = Table()
    t.paper("rp", "k1", NOW + HOUR)
    t.lease("ra", "k1", NOW + HOUR)  # another daemon acquired meanwhile: ver moved
    t.set(("c", "ra"), key="k2")
    assert adopting(t, 0) is None
    assert t.writes() == ["map_acquire"] and t.res("rp").holder is None


def test_adoption_lost_to_the_paper_agent_tries_the_next_candidate() -> None:
    t = Table()
    t.paper("rp", "k1", NOW + HOUR)
    # the paper's agent extends its lease after our read: the adoption's conditions fail
    t.before[6] = lambda: t.set(("c", "rp"), version=5, lease_expires=fmt_time(NOW + 2 * HOUR))
    assert adopting(t, 0) == decide.Acquire(1)
    assert t.writes() == ["map_acquire", "adopt"]
    m = t.mapping("k1")
    assert (m.state, m.ver, m.resource) == (PENDING, 1, "rp")
    assert t.counts == Counter({"lease.adopt_lost": 1})


@pytest.mark.parametrize(
    ("results", "raised", "message"),
    [
        ({"map_acquire": [unknown()]}, Timeout, "^adoption outcome unknown$"),
        ({"map_acquire": [unknown(Unavailable("m"))]}, Unavailable, "^m$"),
        ({"adopt": [unknown(Unavailable("a"))]}, Unavailable, "^a$"),
        ({"adopt": [unknown()]}, Timeout, "^adoption outcome unknown$"),
    ],
)
def test_adoption_whose_outcome_is_unknown_gives_up(
    results: dict[str, list[WriteResult]], raised: type[Exception], message: str
) -> None:
    t = Table()
    t.paper("rp", "k1", NOW + HOUR)
    t.script = results
    with pytest.raises(raised, match=message):
        adopting(t)
    assert t.counts["acq.gave_up"] == 1
    assert t.writes() == (["map_acquire"] if "map_acquire" in results else ["map_acquire", "adopt"])


# ------------------------------------------------------------------- a lapsed lease
def test_end_lapsed_releases_the_mapping_at_the_version_read_then_frees() -> None:
    t = Table()
    m = t.lease("ra", "k1", NOW - US)
    d = daemon(True)
    assert t.run(settle_steps.end_lapsed(d, m)) is None
    after = t.mapping("k1")
    assert (after.state, after.token, after.ver) == (FREE, None, m.ver + 1)
    assert t.items[m.ident]["ttl"] == NOW // US + 24 * 3600
    assert t.spawned == [
        Spawn(give_back_steps.free_claim, (d, ("c", "ra"), "k1", "t1", decide.Freed.UNRELEASED))
    ]
    assert t.counts == Counter({"lease.ended_lapsed": 1}) and t.bare == []
    t.drain()
    assert t.res("ra").key is None


def test_end_lapsed_loses_to_an_extension_and_reads_again() -> None:
    t = Table()
    m = t.lease("ra", "k1", NOW - US)
    t.land(Write(m.ident, (), set=(("ver", m.ver + 1),)))  # extended since read
    assert t.run(settle_steps.end_lapsed(daemon(True), m)) is None
    assert t.mapping("k1").state == LIVE and t.spawned == [] and t.counts == Counter()
    t.script["map_release"] = [refused(Unavailable("r")), unknown()]
    with pytest.raises(Unavailable, match=r"^r$"):
        t.run(settle_steps.end_lapsed(daemon(True), m))
    with pytest.raises(Timeout, match=r"^release outcome unknown$"):
        t.run(settle_steps.end_lapsed(daemon(True), m))
    assert t.spawned == []


# ------------------------------------------------------------------------ renewing
def test_confirm_writes_the_pending_mapping_live_in_the_background() -> None:
    t = Table()
    m = t.pending("ra", "k1", NOW + HOUR, "t1")
    assert t.run(renew_steps.confirm(m)) is None
    assert t.calls[0] == Deadline(5.0) and t.mapping("k1").state == LIVE
    t.run(renew_steps.confirm(m))
    assert t.counts == Counter({"acq.confirm_applied": 1, "acq.confirm_rejected": 1})


def near_end(t: Table, end: int = NOW + M // 2) -> Lease:
    return lease_from_mapping(t.lease("ra", "k1", end))


def test_extend_writes_the_resource_then_the_mapping() -> None:
    t = Table()
    lease = near_end(t)
    step, last = t.run(renew_steps.extend(daemon(), lease, NOW + HOUR))
    assert step == decide.Extended() and last.outcome is Outcome.APPLIED
    assert last.item == t.items[t.mapping("k1").ident]
    assert t.writes() == ["extend_resource", "map_extend"] and t.bare == []
    assert t.res("ra").lease_expires_us == NOW + HOUR
    assert t.mapping("k1").expires_us == NOW + HOUR


def test_extend_of_a_resource_no_longer_ours_is_forgotten() -> None:
    t = Table()
    lease = near_end(t)
    t.set(("c", "ra"), holder="t9")
    step, last = t.run(renew_steps.extend(daemon(), lease, NOW + HOUR))
    assert isinstance(step, decide.Forget) and last.outcome is Outcome.REJECTED
    assert t.writes() == ["extend_resource"] and t.spawned == []


def test_extend_whose_mapping_still_names_the_lease_is_forgotten() -> None:
    """The mapping was extended further elsewhere: the lease is not over."""
    t = Table()
    lease = near_end(t)
    mid = t.mapping("k1").ident
    t.set(mid, exp=fmt_time(NOW + 2 * HOUR))
    step, last = t.run(renew_steps.extend(daemon(), lease, NOW + HOUR))
    assert isinstance(step, decide.Forget) and last.outcome is Outcome.REJECTED
    assert t.of(GetItem) == [GetItem(mid)]
    assert t.spawned == [] and t.counts == Counter()


@pytest.mark.parametrize("gone", ["released", "deleted"])
def test_extend_whose_mapping_no_longer_names_the_lease_frees_the_resource(gone: str) -> None:
    t = Table()
    lease = near_end(t)
    mid = t.mapping("k1").ident
    if gone == "deleted":
        del t.items[mid]
    else:
        t.set(mid, state=FREE, token=None, res=None)
    d = daemon()
    step, last = t.run(renew_steps.extend(d, lease, NOW + HOUR))
    assert step == decide.FreeOrphan() and last.outcome is Outcome.REJECTED
    assert t.counts == Counter({"lease.extend_orphaned": 1})
    assert t.spawned == [
        Spawn(give_back_steps.free_claim, (d, ("c", "ra"), "k1", "t1", decide.Freed.UNRELEASED))
    ]
    t.drain()
    # No app released it, and apps were answered with it: claimable only after the end the
    # resource now records (our extension's) plus the skew, also without the paper's agent.
    assert t.res("ra").key is None
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)


def test_extend_whose_mapping_is_unreadable_or_unknown_is_forgotten() -> None:
    t = Table()
    lease = near_end(t)
    t.script["map_extend"] = [refused(Unavailable("m")), unknown()]
    t.fail[GetItem] = Unavailable("down")
    step, last = t.run(renew_steps.extend(daemon(), lease, NOW + HOUR))
    assert step == decide.Forget("mapping unreadable: down") and last.outcome is Outcome.REJECTED
    step, last = t.run(renew_steps.extend(daemon(), lease, NOW + 2 * HOUR))
    assert isinstance(step, decide.Forget) and last.outcome is Outcome.UNKNOWN
    assert len(t.of(GetItem)) == 1 and t.spawned == []


def test_extend_now_serves_a_lease_that_has_what_is_asked() -> None:
    t = Table()
    m = t.lease("ra", "k1", NOW + 1)
    lease = lease_from_mapping(m)
    assert t.run(renew_steps.extend_now(daemon(), m, NOW + 1)) == lease
    assert t.run(renew_steps.extend_now(daemon(), m, NOW)) == lease
    t.now = NOW + 1  # at its end: read again
    assert t.run(renew_steps.extend_now(daemon(), m, NOW)) is None
    assert t.writes() == []


def test_extend_now_extends_and_caches_the_longer_lease() -> None:
    t = Table()
    lease = near_end(t)
    got = t.run(renew_steps.extend_now(daemon(), t.mapping("k1"), NOW + HOUR))
    assert got == replace(lease, expires_us=NOW + HOUR)
    assert t.of(CachePut) == [CachePut(got, MONO)]
    assert t.counts == Counter({"lease.extended": 1})


def test_extend_now_ends_a_lease_whose_resource_is_gone() -> None:
    for gone in ("taken", "deleted"):
        t = Table()
        near_end(t)
        m = t.mapping("k1")
        if gone == "deleted":
            del t.items[("c", "ra")]
        else:
            t.set(("c", "ra"), holder="t9")
        assert t.run(renew_steps.extend_now(daemon(), m, NOW + HOUR)) is None
        assert t.writes() == ["extend_resource", "map_release"]
        after = t.mapping("k1")
        assert (after.state, after.token) == (FREE, None), gone
        assert t.items[m.ident]["ttl"] == NOW // US + 24 * 3600
        assert t.counts == Counter({"lease.ended_lapsed": 1}) and t.of(CachePut) == []


def test_extend_now_keeps_a_lease_extended_further_elsewhere_or_orphaned() -> None:
    t = Table()
    near_end(t)
    m = t.mapping("k1")
    t.set(m.ident, exp=fmt_time(NOW + 2 * HOUR))
    assert t.run(renew_steps.extend_now(daemon(), m, NOW + HOUR)) is None
    assert t.writes() == ["extend_resource", "map_extend"] and t.mapping("k1").state == LIVE
    assert t.of(GetItem) == [GetItem(m.ident), GetItem(("c", "ra"))]
    t2 = Table()
    near_end(t2)
    m2 = t2.mapping("k1")
    t2.set(m2.ident, state=FREE, token=None)
    assert t2.run(renew_steps.extend_now(daemon(), m2, NOW + HOUR)) is None
    assert t2.writes() == ["extend_resource", "map_extend"]
    assert t2.counts == Counter({"lease.extend_orphaned": 1})


@pytest.mark.parametrize(
    ("results", "raised", "message"),
    [
        ({"extend_resource": [unknown()]}, Timeout, "^extension outcome unknown$"),
        ({"extend_resource": [unknown(Unavailable("u"))]}, Unavailable, "^u$"),
        ({"extend_resource": [refused(Unavailable("r"))]}, Unavailable, "^r$"),
        ({"map_extend": [refused(Unavailable("m"))]}, Unavailable, "^m$"),
        ({"map_extend": [unknown()]}, Timeout, "^extension outcome unknown$"),
    ],
)
def test_extend_now_whose_outcome_is_unknown_raises(
    results: dict[str, list[WriteResult]], raised: type[Exception], message: str
) -> None:
    t = Table()
    near_end(t)
    t.script = results
    with pytest.raises(raised, match=message):
        t.run(renew_steps.extend_now(daemon(), t.mapping("k1"), NOW + HOUR))
    assert "map_release" not in t.writes() and t.of(CachePut) == []


def test_extend_bg_extends_or_forgets() -> None:
    t = Table()
    lease = near_end(t)
    blind = daemon(extend_read_first=False)
    assert t.run(renew_steps.extend_bg(blind, lease, NOW + HOUR)) is None
    assert t.calls[:2] == [Deadline(5.0), Mono()]
    assert t.of(CachePut) == [CachePut(replace(lease, expires_us=NOW + HOUR), MONO)]
    assert t.counts == Counter({"lease.extended": 1}) and t.of(CacheDrop) == []
    # lost: it ends no earlier than asked now (extended elsewhere)
    assert t.run(renew_steps.extend_bg(blind, lease, NOW + HOUR)) is None
    assert t.of(CacheDrop) == [CacheDrop(("c", "p", "k1"))]
    assert t.counts["lease.extend_conflicts"] == 1 and len(t.of(CachePut)) == 1


def test_extend_bg_reads_first_and_writes_nothing_when_extended_elsewhere() -> None:
    """Another host extended the key's lease to the end this hit asks for: the read shows it,
    the lease is served as read (confirmed as of the read), and nothing is written."""
    t = Table()
    lease = near_end(t)
    assert (
        t.run(renew_steps.extend(daemon(), lease, NOW + HOUR))[0] == decide.Extended()
    )  # another host
    t.calls.clear()
    assert t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR - 1)) is None
    assert [type(c) for c in t.calls] == [Deadline, Mono, QueryMappings, Now, CachePut]
    assert t.of(CachePut) == [CachePut(replace(lease, expires_us=NOW + HOUR), MONO)]
    assert t.counts == Counter({"lease.extend_skipped": 1})


@pytest.mark.parametrize("servable", [True, False])
def test_extend_bg_reads_first_then_extends_a_lease_still_ending_soon(servable: bool) -> None:
    """Still ours and ending too soon: extended. A lease the read would serve is confirmed
    by it; one within the margin of its end is not served meanwhile."""
    t = Table()
    lease = near_end(t, NOW + 2 * M if servable else NOW + M // 2)
    assert t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR)) is None
    assert t.writes() == ["extend_resource", "map_extend"]
    confirmed = [CachePut(lease, MONO)] if servable else []
    assert t.of(CachePut) == [*confirmed, CachePut(replace(lease, expires_us=NOW + HOUR), MONO)]
    assert t.counts == Counter({"lease.extended": 1})


def test_extend_bg_reads_first_and_forgets_a_lease_no_longer_mapped() -> None:
    t = Table()
    lease = near_end(t)
    t.set((map_pk("c", "p", "k1"), EAST), token="another")
    assert t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR)) is None
    assert t.writes() == [] and t.of(CachePut) == []
    assert t.of(CacheDrop) == [CacheDrop(("c", "p", "k1"))]
    assert t.counts == Counter({"lease.extend_conflicts": 1})


def test_extend_bg_returns_the_error_to_retry_after() -> None:
    t = Table()
    lease = near_end(t)
    t.script["extend_resource"] = [unknown(), refused(Unavailable("r"))]
    got = t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR))
    assert isinstance(got, Timeout) and str(got) == "extension outcome unknown"
    got = t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR))
    assert isinstance(got, Unavailable) and str(got) == "r"
    assert t.of(CacheDrop) == [] and t.counts == Counter()
    t.fail[QueryMappings] = Unavailable("q")  # the read fails: retried after, nothing sent
    got = t.run(renew_steps.extend_bg(daemon(), lease, NOW + HOUR))
    assert isinstance(got, Unavailable) and str(got) == "q" and len(t.of(Send)) == 2


def test_reconfirm_keeps_only_the_same_lease() -> None:
    t = Table()
    lease = lease_from_mapping(t.lease("ra", "k1", NOW + HOUR))
    assert t.run(renew_steps.reconfirm(daemon(), POOL, lease)) is None
    assert t.calls[:2] == [Deadline(5.0), Mono()]
    assert t.of(CachePut) == [CachePut(lease, MONO)] and t.of(CacheDrop) == []
    assert t.counts == Counter({"lease.reconfirmed": 1})
    for other in (replace(lease, token="t9"), replace(lease, resource="rb")):
        t.calls.clear()
        t.run(renew_steps.reconfirm(daemon(), POOL, other))
        assert t.of(CacheDrop) == [CacheDrop(("c", "p", "k1"))] and t.of(CachePut) == []
    assert t.counts["lease.reconfirm_dropped"] == 2


def test_reconfirm_that_cannot_read_keeps_the_answer_until_s() -> None:
    t = Table()
    lease = lease_from_mapping(t.lease("ra", "k1", NOW + HOUR))
    t.fail[QueryMappings] = Unavailable("down")
    t.run(renew_steps.reconfirm(daemon(), POOL, lease))
    assert t.of(CacheDrop) == [] and t.of(CachePut) == []
    assert t.counts == Counter({"lease.reconfirm_errors": 1})
    assert t.logs == [("reconfirm_failed", (("key", "k1"), ("error", "down")), "warning")]


# ----------------------------------------------------------------------- giving back
def orphan(t: Table, end: int = NOW + HOUR, token: str = "t1") -> ItemKey:
    """A claim of ``token`` on ``ra`` no mapping names."""
    t.claimed("ra", "k1", end, token)
    return ("c", "ra")


def test_free_claim_quarantines_and_relists_what_is_due_soon() -> None:
    t = Table()
    ident = orphan(t)
    assert t.run(give_back_steps.free_claim(daemon(), ident, "k1", "t1")) is None
    assert t.calls[0] == Deadline(5.0) and t.writes() == ["free_claim"] and t.bare == []
    r = t.res("ra")
    assert (r.key, r.holder, r.quarantine_until) == (None, None, fmt_time(NOW + Q))
    assert t.of(RelistLater) == [RelistLater(ident, NOW + Q)]
    assert t.counts == Counter({"acq.free_claim_applied": 1}) and t.logs == []
    # not ours any more: nothing to free, and no retry
    assert t.run(give_back_steps.free_claim(daemon(), ident, "k1", "t1")) is None
    assert t.counts["acq.free_claim_rejected"] == 1 and len(t.of(Send)) == 2
    assert len(t.of(RelistLater)) == 1


@pytest.mark.parametrize(
    ("quarantine", "relisted"), [(RELIST_MAX_WAIT_US, True), (RELIST_MAX_WAIT_US + 1, False)]
)
def test_free_claim_relists_only_within_the_longest_wait(quarantine: int, relisted: bool) -> None:
    t = Table()
    ident = orphan(t)
    d = replace(daemon(), rules=replace(RULES, quarantine_us=quarantine))
    t.run(give_back_steps.free_claim(d, ident, "k1", "t1"))
    assert t.res("ra").quarantine_until == fmt_time(NOW + quarantine)
    assert t.of(RelistLater) == ([RelistLater(ident, NOW + quarantine)] if relisted else [])


def test_free_claim_passes_give_back_to_the_quarantine_rule() -> None:
    """The rules may free a lost acquisition's claim sooner (``Ops.quarantine_us``): the
    flag reaches them, also on a retry."""
    ops = Ops(
        quarantine_us=lambda rules, give_back, pool_q: 0 if give_back else rules.quarantine_us
    )
    t = Table()
    ident = orphan(t)
    t.script["free_claim"] = [unknown(Unavailable("x"))]
    t.run(give_back_steps.free_claim(daemon(ops=ops), ident, "k1", "t1", decide.Freed.UNNAMED))
    r = t.res("ra")
    assert (r.lease_available, r.quarantine_until) == (fmt_time(NOW), None)
    t2 = Table()
    t2.run(
        give_back_steps.free_claim(daemon(ops=ops), orphan(t2), "k1", "t1", decide.Freed.RELEASED)
    )
    assert t2.res("ra").quarantine_until == fmt_time(NOW + Q)


def test_free_claim_retries_with_backoff_then_leaves_it_to_the_liberator() -> None:
    t = Table()
    ident = orphan(t)
    t.script["free_claim"] = [unknown(Unavailable("down")) for _ in range(7)]
    assert t.run(give_back_steps.free_claim(daemon(), ident, "k1", "t1")) is None
    assert [s for s in t.of(Sleep)] == [
        Sleep(s, bounded=False) for s in (1.0, 2.0, 4.0, 8.0, 16.0, 16.0)
    ]
    assert t.logs == [
        (
            "claim_not_given_back",
            (("resource", "ra"), ("key", "k1"), ("attempt", n), ("error", "down")),
            "warning",
        )
        for n in range(1, 7)
    ]
    assert t.counts == Counter({"acq.free_claim_errors": 6}) and len(t.of(Deadline)) == 6
    t.calls.clear()
    t.run(give_back_steps.free_claim(daemon(free_claim_attempts=2), ident, "k1", "t1"))
    assert len(t.of(Send)) == 2
    t.calls.clear()
    assert t.run(give_back_steps.free_claim(daemon(), ident, "k1", "t1", attempt=6)) is None
    assert t.calls == []
    t.run(give_back_steps.free_claim(daemon(), ident, "k1", "t1", attempt=5))
    assert t.writes() == ["free_claim"] and t.res("ra").key is None


def test_free_claim_beside_the_paper_agent_holds_to_the_lease_end() -> None:
    t = Table()
    ident = orphan(t)
    t.run(give_back_steps.free_claim(daemon(True), ident, "k1", "t1"))
    assert t.calls[:3] == [Deadline(5.0), Now(), GetItem(ident)]
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)
    assert t.of(RelistLater) == []  # due in an hour: the liberator's
    # a lease ending sooner than the quarantine: the quarantine
    t2 = Table()
    t2.run(give_back_steps.free_claim(daemon(True), orphan(t2, end=NOW + US), "k1", "t1"))
    assert t2.res("ra").quarantine_until == fmt_time(NOW + Q)
    assert t2.of(RelistLater) == [RelistLater(ident, NOW + Q)]
    t3 = Table()
    t3.run(give_back_steps.free_claim(daemon(True), orphan(t3, end=NOW + Q - G + 1), "k1", "t1"))
    assert t3.res("ra").quarantine_until == fmt_time(NOW + Q + 1)


def test_free_claim_beside_the_paper_agent_reads_the_end_again_after_an_extension() -> None:
    t = Table()
    ident = orphan(t)
    end2 = NOW + 2 * HOUR
    t.before[4] = lambda: t.set(ident, lease_expires=fmt_time(end2))  # before the write
    t.run(give_back_steps.free_claim(daemon(True), ident, "k1", "t1"))
    assert t.writes() == ["free_claim", "free_claim"] and t.of(Sleep) == [] and t.logs == []
    assert t.res("ra").quarantine_until == fmt_time(end2 + G)
    assert t.counts == Counter({"acq.free_claim_applied": 1})
    # the attempts run out
    t2 = Table()
    orphan(t2)
    t2.before[4] = lambda: t2.set(ident, lease_expires=fmt_time(end2))
    t2.run(give_back_steps.free_claim(daemon(True, free_claim_attempts=1), ident, "k1", "t1"))
    assert t2.writes() == ["free_claim"] and t2.res("ra").holder == "t1"


@pytest.mark.parametrize("change", ["holder", "key", "deleted"])
def test_free_claim_beside_the_paper_agent_leaves_what_is_not_ours(change: str) -> None:
    t = Table()
    ident = orphan(t)
    if change == "deleted":
        del t.items[ident]
    else:
        t.set(ident, **{change: "other"})
    assert t.run(give_back_steps.free_claim(daemon(True), ident, "k1", "t1")) is None
    assert t.writes() == [] and t.counts == Counter() and t.logs == []


def test_free_claim_beside_the_paper_agent_that_cannot_read_retries() -> None:
    t = Table()
    ident = orphan(t)
    t.fail[GetItem] = Unavailable("down")
    t.run(give_back_steps.free_claim(daemon(True, free_claim_attempts=2), ident, "k1", "t1"))
    assert t.writes() == [] and t.counts == Counter({"acq.free_claim_errors": 2})
    assert [f[1][3] for f in t.logs] == [("error", "down")] * 2
    # held without an end (no lease to hold it to): not freed, an error on every attempt
    t2 = Table()
    orphan(t2)
    t2.set(ident, lease_expires=None)
    t2.run(give_back_steps.free_claim(daemon(True, free_claim_attempts=2), ident, "k1", "t1"))
    assert t2.writes() == [] and t2.counts == Counter({"acq.free_claim_errors": 2})


def quarantined(t: Table, until: int) -> ItemKey:
    t.free("ra")
    t.set(("c", "ra"), lease_available=None, quarantine_until=fmt_time(until))
    return ("c", "ra")


def test_relist_waits_for_the_quarantine_then_relists() -> None:
    t = Table()
    ident = quarantined(t, NOW + 3 * US)

    def slept(s: Sleep) -> None:
        t.now = NOW + 3 * US

    t.on_sleep = slept
    assert t.run(give_back_steps.relist(ident, NOW + 3 * US)) is None
    assert t.calls[:4] == [
        Now(),
        Sleep(3.0 + RELIST_SLACK, bounded=False),
        Deadline(5.0),
        GetItem(ident),
    ]
    r = t.res("ra")
    assert (r.lease_available, r.quarantine_until) == (fmt_time(NOW + 3 * US), None)
    assert t.counts == Counter({"quarantine.relist_applied": 1})
    # past already: no wait beyond the slack
    t2 = Table()
    t2.run(give_back_steps.relist(quarantined(t2, NOW - US), NOW - HOUR))
    assert t2.of(Sleep) == [Sleep(RELIST_SLACK, bounded=False)]
    assert t2.res("ra").lease_available == fmt_time(NOW - US)


def test_relist_leaves_what_changed_since() -> None:
    t = Table()
    ident = quarantined(t, NOW + 1)  # quarantined again, by its own freer
    t.run(give_back_steps.relist(ident, NOW))
    t.set(ident, quarantine_until=None, lease_available=fmt_time(NOW))  # re-listed
    t.run(give_back_steps.relist(ident, NOW))
    del t.items[ident]
    t.run(give_back_steps.relist(ident, NOW))
    assert t.writes() == [] and t.counts == Counter()
    quarantined(t, NOW)  # ends now: due
    t.before[6] = lambda: t.set(ident, version=9)  # taken and freed again meanwhile
    t.calls.clear()
    t.run(give_back_steps.relist(ident, NOW))
    assert t.counts == Counter({"quarantine.relist_rejected": 1})


def test_relist_that_cannot_read_logs_and_leaves_it_to_the_liberator() -> None:
    t = Table()
    ident = quarantined(t, NOW)
    t.fail[GetItem] = Unavailable("down")
    t.run(give_back_steps.relist(ident, NOW))
    assert t.counts == Counter({"quarantine.relist_errors": 1})
    assert t.logs == [("relist_failed", (("resource", "ra"), ("error", "down")), "warning")]


# ----------------------------------------------------------------------- fencing
def test_fence_own_claim_fences_a_claim_that_has_not_landed() -> None:
    t = Table()
    item = t.free("ra")
    t.run(give_back_steps.fence_own_claim(daemon(), item, "k1", "t1"))
    assert t.calls[0] == Deadline(5.0) and t.writes() == ["fence_resource"]
    assert t.res("ra").version == item.version + 1 and t.of(GetItem) == []


def test_fence_own_claim_gives_back_a_claim_that_landed() -> None:
    """With the quarantine only when no mapping ever named it (its mapping write refused),
    else held to its end plus the skew (``decide.given_back``)."""
    for proof, until in ((decide.NeverNamed("map_acquire"), NOW + Q), (None, NOW + HOUR + G)):
        t = Table()
        item = t.free("ra")
        t.claimed("ra", "k1", NOW + HOUR, "t1")
        t.run(give_back_steps.fence_own_claim(daemon(), item, "k1", "t1", proof))
        assert "free_claim" in t.writes() and t.writes()[0] == "fence_resource"
        assert t.res("ra").quarantine_until == fmt_time(until), proof
    for holder in ("t9", None):  # someone else's claim, or deleted
        t2 = Table()
        t2.claimed("ra", "k1", NOW + HOUR, "t9")
        if holder is None:
            del t2.items[("c", "ra")]
        t2.run(give_back_steps.fence_own_claim(daemon(), item, "k1", "t1"))
        assert t2.writes() == ["fence_resource"] and t2.of(GetItem) == [GetItem(("c", "ra"))]


# ------------------------------------------------------------------------- releasing
@pytest.mark.parametrize("legacy", [False, True])
def test_release_frees_the_mapping_then_the_resource(legacy: bool) -> None:
    t = Table()
    m = t.lease("ra", "k1", NOW + HOUR)
    d = daemon(legacy)
    assert t.run(give_back_steps.release(d, POOL, "k1")) == 1
    after = t.mapping("k1")
    assert (after.state, after.token, after.ver) == (FREE, None, m.ver + 1)
    assert t.items[m.ident]["ttl"] == NOW // US + 24 * 3600
    assert t.writes() == ["map_release"] and t.bare == []
    spawn = Spawn(
        give_back_steps.free_claim, (d, ("c", "ra"), "k1", "t1", decide.Freed.RELEASED, 0)
    )
    # the cache forgets it before the read and once released; beside the paper's agent the
    # answer waits for the free
    drop = CacheDrop(("c", "p", "k1"))
    want = [drop, QueryMappings("c", "p", "k1"), Now(), t.calls[3], drop, spawn]
    assert t.calls == want + ([Join(1)] if legacy else [])
    assert t.counts == Counter({"lease.released": 1})
    t.drain()
    until = NOW + HOUR + G if legacy else NOW + Q
    assert t.res("ra").quarantine_until == fmt_time(until)


def test_a_release_in_a_pool_with_an_outage_budget_keeps_the_pools_quarantine() -> None:
    """The pool's own quarantine (longer than Q: hosts cut off from DynamoDB serve its
    cached answers for its outage budget) reaches the free; never shorter than Q."""
    for pool_q, want in ((Q + 600 * US, Q + 600 * US), (Q // 2, Q)):
        t = Table()
        t.lease("ra", "k1", NOW + HOUR)
        pool = replace(POOL, outage_budget_us=600 * US, quarantine_us=pool_q)
        assert t.run(give_back_steps.release(daemon(), pool, "k1")) == 1
        t.drain()
        assert t.res("ra").quarantine_until == fmt_time(NOW + want)


def test_release_notes_the_token_released() -> None:
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    notes: list[Note] = []

    def perform(eff: Any) -> Any:
        if isinstance(eff, Note):
            notes.append(eff)
        return t.perform(eff)

    drive_sync(give_back_steps.release(daemon(), POOL, "k1"), perform)
    assert notes == [Note("lease.released", (("token", "t1"),))]


def test_release_of_a_key_that_holds_no_lease_here_says_where_it_is_held() -> None:
    t = Table()
    with pytest.raises(NotHeld) as exc:
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert str(exc.value) == "'k1' holds no lease in pool 'p'"
    t.lease("rw", "k1", NOW + HOUR, region=WEST)
    t.lease("rs", "k1", NOW + HOUR, region=SOUTH)
    t.lease("rx", "k1", NOW + M, region="eu-west-1")  # too close to its end to serve
    with pytest.raises(NotHeld) as exc:
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert str(exc.value) == "'k1' holds no lease in us-east-1 (held in sa-east-1, us-west-2)"
    # ours ended beyond the grace: not held either
    t.lease("ra", "k1", NOW - G)
    with pytest.raises(NotHeld):
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert t.writes() == []


def test_release_that_loses_the_mapping_reads_again() -> None:
    t = Table()
    m = t.lease("ra", "k1", NOW + HOUR)

    def released() -> None:
        t.set(m.ident, state=FREE, token=None)

    t.before[4] = released  # another daemon released it meanwhile
    with pytest.raises(NotHeld):
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert t.writes() == ["map_release"] and len(t.of(QueryMappings)) == 2
    assert t.of(CacheDrop) == [CacheDrop(("c", "p", "k1"))] and t.spawned == []


@pytest.mark.parametrize(
    ("result", "raised", "message"),
    [
        (unknown(), Timeout, "^release outcome unknown$"),
        (unknown(Unavailable("u")), Unavailable, "^u$"),
        (refused(Unavailable("r")), Unavailable, "^r$"),
    ],
)
def test_release_whose_outcome_is_unknown_raises(
    result: WriteResult, raised: type[Exception], message: str
) -> None:
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    t.script["map_release"] = [result]
    with pytest.raises(raised, match=message):
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert t.spawned == [] and len(t.of(CacheDrop)) == 1 and t.counts == Counter()


def test_release_of_a_pending_mapping_whose_claim_landed() -> None:
    t = Table()
    m = t.pending("ra", "k1", NOW + HOUR, "t1")
    assert t.run(give_back_steps.release(daemon(), POOL, "k1")) == 1
    assert t.of(GetItem) == [GetItem(("c", "ra"))]
    assert t.mapping("k1").state == FREE and t.mapping("k1").ver == m.ver + 1
    t.drain()
    assert t.res("ra").key is None


def test_release_of_a_pending_mapping_whose_claim_never_lands() -> None:
    """Fenced first (the claim may still be in flight), then the mapping dropped."""
    t = Table()
    m = t.pending("ra", "k1", NOW + HOUR, "t1", landed=False)
    with pytest.raises(NotHeld):
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    assert t.writes() == ["fence_resource", "map_drop_dead"]
    after = t.mapping("k1")
    assert (after.state, after.ver) == (FREE, m.ver + 1)
    assert t.items[m.ident]["ttl"] == NOW // US + 24 * 3600
    assert t.counts == Counter({"acq.fenced": 1}) and len(t.of(CacheDrop)) == 1


def test_release_of_a_pending_mapping_waits_for_its_acquirer() -> None:
    t = Table()
    t.now = NOW - HOUR + US  # the acquirer wrote it a second ago
    t.pending("ra", "k1", NOW + HOUR, "t1", landed=False)
    sleeps: list[Sleep] = []

    def slept(s: Sleep) -> None:
        sleeps.append(s)
        if len(sleeps) == 2:  # the acquirer's claim lands
            t.set(("c", "ra"), key="k1", holder="t1", lease_expires=fmt_time(NOW + HOUR))

    t.on_sleep = slept
    assert t.run(give_back_steps.release(daemon(), POOL, "k1")) == 1
    assert sleeps == [Sleep(0.005), Sleep(0.01)]
    assert t.counts == Counter({"acq.waits": 2, "lease.released": 1})


def test_only_a_lost_acquisitions_free_is_a_give_back_also_on_its_retries() -> None:
    """What ``Ops.quarantine_us`` is told: the free of an orphan (the default) or of a claim
    a mapping named (``UNRELEASED``) is not a give-back; a give-back stays one on every
    retry, after an extension read beside the paper's agent as after an error."""
    seen: list[bool] = []

    def quarantine_us(rules: Rules, give_back: bool, pool_q_us: int) -> int:
        seen.append(give_back)
        return rules.quarantine_us

    ops = Ops(quarantine_us=quarantine_us)
    t = Table()
    ident = orphan(t)
    t.before[4] = lambda: t.set(ident, lease_expires=fmt_time(NOW + 2 * HOUR))
    t.run(
        give_back_steps.free_claim(daemon(True, ops=ops), ident, "k1", "t1", decide.Freed.UNNAMED)
    )
    assert seen == [True, True] and t.res("ra").holder is None
    seen.clear()
    t2 = Table()
    t2.run(give_back_steps.free_claim(daemon(ops=ops), orphan(t2), "k1", "t1"))
    t3 = Table()
    t3.run(
        give_back_steps.free_claim(daemon(ops=ops), orphan(t3), "k1", "t1", decide.Freed.UNRELEASED)
    )
    assert seen == [False, False]


def test_free_claim_beside_the_paper_agent_reads_the_end_once_per_attempt() -> None:
    """Extended before every write: each of the ``free_claim_attempts`` attempts reads the
    end again and writes once, then the claim is left to the liberator."""
    t = Table()
    ident = orphan(t)
    for n in (4, 8, 12, 16):  # Deadline, Now, GetItem, Send per attempt
        t.before[n] = lambda n=n: t.set(ident, lease_expires=fmt_time(NOW + n * HOUR))
    t.run(give_back_steps.free_claim(daemon(True, free_claim_attempts=3), ident, "k1", "t1"))
    assert t.writes() == ["free_claim"] * 3 and len(t.of(GetItem)) == 3
    assert t.res("ra").holder == "t1"


def test_release_beside_the_paper_agent_joins_the_free_it_spawned() -> None:
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    t.spawned.append(
        Spawn(give_back_steps.relist, (("c", "zz"), NOW))
    )  # an earlier spawn: handle 1
    assert t.run(give_back_steps.release(daemon(True), POOL, "k1")) == 1
    assert [j.handle for j in t.of(Join)] == [2]


def test_a_release_read_again_names_the_key_it_releases() -> None:
    """After a lost race (the mapping changed under the release) and after dropping a dead
    pending mapping, the next round reads the same key: its NotHeld names it."""
    t = Table()
    m = t.lease("ra", "k1", NOW + HOUR)
    t.before[4] = lambda: t.set(m.ident, state=FREE, token=None)
    with pytest.raises(NotHeld, match=r"^'k1' holds no lease in pool 'p'$"):
        t.run(give_back_steps.release(daemon(), POOL, "k1"))
    t2 = Table()
    t2.pending("ra", "k1", NOW + HOUR, "t1", landed=False)
    with pytest.raises(NotHeld, match=r"^'k1' holds no lease in pool 'p'$"):
        t2.run(give_back_steps.release(daemon(), POOL, "k1"))


def test_a_release_read_again_waits_from_the_first_wait() -> None:
    """The mapping changed under the release to another acquirer's young pending claim: the
    next round waits for it from the first wait (then releases what the key holds)."""
    t = Table()
    t.now = NOW - HOUR + US
    t.lease("ra", "k1", NOW + HOUR)
    t.before[4] = lambda: t.pending("rb", "k1", NOW + HOUR, "t2", landed=False)
    sleeps: list[Sleep] = []

    def slept(s: Sleep) -> None:
        sleeps.append(s)
        t.set(("c", "rb"), key="k1", holder="t2", lease_expires=fmt_time(NOW + HOUR))

    t.on_sleep = slept
    assert t.run(give_back_steps.release(daemon(), POOL, "k1")) == 1
    assert sleeps == [Sleep(0.005)] and t.mapping("k1").state == FREE


def test_a_release_after_dropping_a_dead_mapping_waits_from_the_first_wait() -> None:
    """A dead pending mapping dropped, then another acquirer's young pending claim read in
    the next round: waited for from the first wait."""
    t = Table()
    m = t.pending("ra", "k1", NOW + HOUR, "t1", landed=False)

    def acquired() -> None:
        assert t.pending("rb", "k1", NOW + HOUR, "t2", landed=False).token == "t2"
        t.set(m.ident, since=fmt_time(NOW))

    t.before[10] = acquired  # the read of the key's mappings after the drop
    sleeps: list[Sleep] = []

    def slept(s: Sleep) -> None:
        sleeps.append(s)
        t.set(("c", "rb"), key="k1", holder="t2", lease_expires=fmt_time(NOW + HOUR))

    t.on_sleep = slept
    assert t.run(give_back_steps.release(daemon(), POOL, "k1")) == 1
    assert t.writes()[:2] == ["fence_resource", "map_drop_dead"]
    assert isinstance(t.calls[9], QueryMappings) and t.of(GetItem)[-1] == GetItem(("c", "rb"))
    assert sleeps == [Sleep(0.005)] and t.mapping("k1").state == FREE


def test_adoption_names_the_version_of_the_lease_it_adopts_while_pending() -> None:
    """Between the mapping write and the adoption, readers (other daemons, the liberator)
    judge the pending mapping by the claim's version it names: the paper lease's."""
    t = Table()
    t.paper("rp", "k1", NOW + HOUR)
    t.set(("c", "rp"), version=7)  # written by the paper's agent before
    rp = t.res("rp")
    seen: list[Mapping] = []
    perform = t.perform

    def spy(eff: Any) -> Any:
        if isinstance(eff, Send) and eff.write.kind == "adopt":
            seen.append(t.mapping("k1"))
        return perform(eff)

    t.perform = spy  # type: ignore[method-assign]
    adopting(t)
    assert [(m.state, m.resource, m.rver) for m in seen] == [(PENDING, "rp", rp.version)]
