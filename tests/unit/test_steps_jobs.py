"""The jobs' programs (rasd.steps.repair, .dedupe, .admin, .paper), driven by a scripted
``perform`` over plain items (``rasd.core.writes.apply``, as the checker evaluates writes), with
time passed in; and the jobs' boto3 driver's outcomes (rasd_jobs.leases.Driver) on a stub."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.lease import FREE, LIVE, US, Mapping, ResourceItem, fmt_time, map_pk
from rasd.core.map_builders import map_acquire, map_extend
from rasd.core.serialize import resource_from
from rasd.core.writes import Write
from rasd.steps import (
    At,
    GetItem,
    Note,
    QueryAvailable,
    QueryLeased,
    Send,
    Spawn,
    drive_sync,
)
from rasd.steps import admin as admin_steps
from rasd.steps import dedupe as dedupe_steps
from rasd.steps import paper as paper_steps
from rasd.steps import repair as repair_steps
from rasd_jobs.leases import Driver
from tests.helpers.scripted import EAST, HOUR, NOW, RULES, RUN, WEST, G, M, Q, Table


# ------------------------------------------------------------------ release and repair
def test_release_held_releases_mapping_first_and_holds_to_the_end() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    got = t.run(repair_steps.release_held(r, NOW, Q, G, hold_to_end=True))
    assert got == "released"
    assert t.writes() == ["map_release", "free_claim"]
    assert t.mapping("k1").state == FREE
    after = t.res("ra")
    assert after.key is None and after.quarantine_until == fmt_time(NOW + HOUR + G)
    # without hold_to_end (an app released it): the quarantine only
    t2 = Table()
    r2 = t2.lease("ra", "k1", NOW + HOUR)
    assert t2.run(repair_steps.release_held(r2, NOW, Q, G)) == "released"
    assert t2.res("ra").quarantine_until == fmt_time(NOW + Q)


def test_release_held_keeps_an_extra_that_ends_after_end_by() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    assert t.run(repair_steps.release_held(r, NOW, Q, G, True, end_by_us=NOW + HOUR - 1)) == "kept"
    assert t.writes() == []


def test_release_held_loses_to_an_extension_after_the_end_was_read() -> None:
    """The mapping's release is conditional on the version the end was read at: a daemon
    that extends the lease meanwhile wins, and the lease stays."""
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    lease = replace(t.mapping("k1"))

    def extend() -> None:
        from rasd.core.decide import lease_from_mapping

        t.land(map_extend(lease_from_mapping(lease), NOW + 2 * HOUR))

    t.before[2] = extend  # after the mapping read (call 1), before the release (call 2)
    got = t.run(repair_steps.release_held(r, NOW, Q, G, True, end_by_us=NOW + HOUR))
    assert got == "lost_race"
    assert t.mapping("k1").state == LIVE and t.res("ra").key == "k1"


def test_repair_fences_a_mapping_write_that_may_still_land_then_frees() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR, mapped=False)  # mver 1, no mapping yet
    got = t.run(repair_steps.repair(r, None, NOW, Q, G))
    assert got == "freed_orphan"
    assert t.writes() == ["map_fence", "free_orphan"]
    assert t.mapping("k1").ver == 1
    # no mapping read: whether one named it is unknown, so held to its end plus the skew
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)


def test_repair_holds_an_orphan_a_mapping_may_have_named_to_its_end() -> None:
    """A ras-dedupe stopped between its two writes: the mapping moved past the claim's mver
    (released), the item is still held. Apps may use it to its end: held to end + grace.
    With the known-bad D5 function (the quarantine only), it would be claimable early."""
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    m = t.mapping("k1")
    t.land(Write(m.ident, (), set=(("state", FREE), ("ver", m.ver + 1))))
    m = t.mapping("k1")
    assert t.run(repair_steps.repair(r, m, NOW, Q, G)) == "freed_orphan"
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)

    def quarantine_only(r: ResourceItem, m: Mapping | None, now: int, q: int, g: int) -> int:
        return now + q

    t2 = Table()
    r2 = t2.lease("ra", "k1", NOW + HOUR)
    m2 = t2.mapping("k1")
    t2.land(Write(m2.ident, (), set=(("state", FREE), ("ver", m2.ver + 1))))
    bad = repair_steps.Ops(orphan_free_at=quarantine_only)
    assert t2.run(repair_steps.repair(r2, t2.mapping("k1"), NOW, Q, G, ops=bad)) == "freed_orphan"
    assert t2.res("ra").quarantine_until == fmt_time(NOW + Q)


def test_repair_leaves_a_lease_and_a_foreign_hold() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    assert t.run(repair_steps.repair(r, t.mapping("k1"), NOW, Q, G)) == "lease"
    stale = replace(r, hver=r.version - 1)  # the paper's agent wrote it since
    assert t.run(repair_steps.repair(stale, None, NOW, Q, G)) == "lease"
    assert t.writes() == []


# ------------------------------------------------------------------------ the liberator
def test_liberate_item_frees_an_expired_lease_and_counts_a_lost_race() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW - 61 * US)
    assert t.run(repair_steps.liberate_item(r, RUN)) == "freed"
    assert t.res("ra").lease_available == fmt_time(NOW)
    assert t.run(repair_steps.liberate_item(r, RUN)) == "lost_race"  # the version moved on
    assert (t.counts["expired"], t.counts["freed"], t.counts["lost_races"]) == (2, 1, 1)
    dry = replace(RUN, dry_run=True)
    t2 = Table()
    r2 = t2.lease("ra", "k1", NOW - 61 * US)
    assert t2.run(repair_steps.liberate_item(r2, dry)) == "would_free" and t2.calls == []


def test_liberate_item_within_the_grace_checks_for_an_orphan_only_when_old() -> None:
    t = Table()
    young = t.lease("ra", "k1", NOW - US, acquired=NOW - 60 * US, mapped=False)
    assert t.run(repair_steps.liberate_item(young, RUN)) == "young" and t.calls == []
    old = t.lease("rb", "k2", NOW + HOUR, mapped=False)
    assert t.run(repair_steps.liberate_item(old, RUN)) == "freed_orphan"
    # legacy_agents: held to its end plus the grace (the paper's agent may have answered it)
    assert t.res("rb").quarantine_until == fmt_time(NOW + HOUR + RUN.grace_us)
    assert (t.counts["checked"], t.counts["orphans"], t.counts["orphans_freed"]) == (1, 1, 1)


def test_check_orphan_leaves_the_paper_agents_lease() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR, mapped=False)
    t.items[("c", "ra")] = t.items[("c", "ra")] | {"version": r.version + 1}  # paper wrote it
    assert t.run(repair_steps.check_orphan(r, RUN)) == "foreign"
    assert t.writes() == [] and t.counts["foreign"] == 1


def test_check_orphan_counts_a_read_failure_as_an_error() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR, mapped=False)

    def perform(eff: Any) -> Any:
        if isinstance(eff, GetItem):
            raise Unavailable("down")
        return t.perform(eff)

    assert drive_sync(repair_steps.check_orphan(r, RUN), perform) == "error"
    assert t.counts["errors"] == 1


def test_relist_item_only_once_the_quarantine_is_over() -> None:
    t = Table()
    t.free("ra")
    t.items[("c", "ra")] = {
        k: v for k, v in t.items[("c", "ra")].items() if k != "lease_available"
    } | {"quarantine_until": fmt_time(NOW + US)}
    r = t.res("ra")
    assert t.run(repair_steps.relist_item(r, NOW)) == "quarantined"
    assert t.run(repair_steps.relist_item(r, NOW + US)) == "relisted"
    assert t.res("ra").lease_available == fmt_time(NOW + US)


# ------------------------------------------------------------------------ ras-dedupe
def dup_table(survivor_end: int = NOW + 2 * HOUR) -> tuple[Table, tuple[ResourceItem, ...]]:
    """k1 holds w-1 in the west (acquired first: the survivor) and e-1 in the east."""
    t = Table()
    w = t.lease("w-1", "k1", survivor_end, region=WEST, acquired=NOW - 2 * HOUR)
    e = t.lease("e-1", "k1", NOW + HOUR, region=EAST)
    return t, (e, w)


def test_dedupe_releases_the_extra_once_the_survivor_is_served_longer() -> None:
    t, items = dup_table()
    run = dedupe_steps.DedupeRun(EAST, NOW, Q, M, G)
    t.run(dedupe_steps.dedupe_key(items, run))
    assert t.counts["released"] == 1 and t.counts["duplicate_keys"] == 1
    assert t.res("e-1").key is None and t.res("w-1").key == "k1"
    assert t.res("e-1").quarantine_until == fmt_time(NOW + HOUR + G)  # held to its end
    # the survivor's mapping was read as the extra's region (east, ours) shows it
    assert GetItem((map_pk("c", "p", "k1"), WEST)) in t.calls


def test_dedupe_keeps_an_extra_the_survivor_does_not_outlast() -> None:
    t, items = dup_table(survivor_end=NOW + HOUR + M)  # outlasts by the margin only
    t.run(dedupe_steps.dedupe_key(items, dedupe_steps.DedupeRun(EAST, NOW, Q, M, G)))
    assert t.counts["kept_until_survivor_outlasts"] == 1 and t.writes() == []
    # the known-bad D3 slack (margin only) releases it
    t2, items2 = dup_table(survivor_end=NOW + HOUR + M)
    bad = repair_steps.Ops(dedupe_slack=lambda margin, grace: margin)
    t2.run(dedupe_steps.dedupe_key(items2, dedupe_steps.DedupeRun(EAST, NOW, Q, M, G), bad))
    assert t2.counts["released"] == 1


def test_dedupe_judges_the_survivor_in_the_extras_replica() -> None:
    """The west run releases a west extra only if the west replica shows the east survivor
    live; one that shows it pending (the confirm not replicated yet) keeps the extra."""
    t = Table()
    e = t.lease("e-1", "k1", NOW + 2 * HOUR, region=EAST, acquired=NOW - 2 * HOUR)
    w = t.lease("w-1", "k1", NOW + HOUR, region=WEST)
    mid = (map_pk("c", "p", "k1"), EAST)
    t.lagging[WEST] = dict(t.items) | {mid: t.items[mid] | {"state": "pending"}}
    run = dedupe_steps.DedupeRun(EAST, NOW, Q, M, G, peers=frozenset({WEST}))
    t.run(dedupe_steps.dedupe_key((e, w), run))
    assert At(WEST, GetItem(mid)) in t.calls
    assert t.counts["kept_until_survivor_outlasts"] == 1 and t.writes() == []


def test_dedupe_reports_another_regions_extra_without_its_endpoint() -> None:
    t = Table()
    e = t.lease("e-1", "k1", NOW + 2 * HOUR, region=EAST, acquired=NOW - 2 * HOUR)
    w = t.lease("w-1", "k1", NOW + HOUR, region=WEST)
    t.run(dedupe_steps.dedupe_key((e, w), dedupe_steps.DedupeRun(EAST, NOW, Q, M, G)))
    assert t.counts["foreign_reported"] == 1 and t.writes() == []


def test_dedupe_repairs_an_examined_orphan_only_while_it_is_one() -> None:
    """An item examined as an orphan whose mapping write lands before its repair is a lease
    then: left alone (the real program), released (the known-bad D6 substitution)."""
    for release_orphan, want in ((None, "lease"), (repair_steps.release_held, "released")):
        t = Table()
        k = t.lease("e-0", "k1", NOW + 2 * HOUR, acquired=NOW - 2 * HOUR)
        o = t.lease("e-1", "k1", NOW + HOUR, mapped=False, token="t-late")

        def land_late(t: Table = t, rver: int = o.version - 1) -> None:
            mid = (map_pk("c", "p", "k1"), EAST)
            t.land(
                map_acquire(mid, t.mapping("k1").ver, "t-late", "e-1", rver, NOW + HOUR, NOW, "d")
            )

        t.before[5] = land_late  # after examine's four reads, before the repair's read
        ops = repair_steps.Ops(release_orphan=release_orphan)
        t.run(dedupe_steps.dedupe_key((k, o), dedupe_steps.DedupeRun(EAST, NOW, Q, M, G), ops))
        assert (t.res("e-1").key is None) == (want == "released"), want


# --------------------------------------------------------------------------- rasadmin
def test_delete_resource_refuses_a_lease_and_leaves_a_tombstone_holding_the_name() -> None:
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    got = t.run(admin_steps.delete_resource(("c", "ra"), EAST, NOW, False, Q, G))
    assert got.status == "leased" and t.writes() == []
    got = t.run(admin_steps.delete_resource(("c", "ra"), WEST, NOW, True, Q, G))
    assert (got.status, got.detail) == ("other_region", EAST)
    got = t.run(admin_steps.delete_resource(("c", "ra"), EAST, NOW, True, Q, G))
    assert (got.status, got.detail) == ("deleted", fmt_time(NOW + HOUR + G))
    assert t.writes() == ["map_release", "tombstone"]
    # a re-add waits for the hold
    assert t.run(admin_steps.add_resource("c", "p", EAST, "ra", NOW)) == "held"
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)
    assert t.run(admin_steps.add_resource("c", "p", EAST, "ra", NOW)) == "exists"
    assert t.run(admin_steps.add_resource("c", "p", EAST, "rb", NOW)) == "added"


def test_delete_resource_refuses_a_quarantine_naming_its_end() -> None:
    """A released item is out of the available index until its quarantine ends: the refusal
    says until when (``quarantine_until``; its ``lease_available`` is gone)."""
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    assert t.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G)).status == "released"
    q = t.res("ra").quarantine_until
    assert q is not None and t.res("ra").lease_available is None
    got = t.run(admin_steps.delete_resource(("c", "ra"), EAST, NOW + US, False, Q, G))
    assert (got.status, got.detail) == ("quarantined", q)


def test_release_resource_holds_to_the_end_and_reports_when_claimable() -> None:
    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    got = t.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G))
    assert (got.status, got.detail) == ("released", fmt_time(NOW + HOUR + G))
    assert t.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G)).status == "not_leased"
    assert t.run(admin_steps.release_resource(("c", "zz"), EAST, NOW, Q, G)).status == "missing"


def test_delete_pool_refuses_a_held_pool_then_deletes_in_each_region() -> None:
    t = Table()
    a = t.lease("ra", "k1", NOW + HOUR)
    b = t.free("rb", WEST)
    t.run(admin_steps.define_pool("c", "p", 60.0))
    job = admin_steps.PoolDelete("c", "p", True, (a, b), NOW, False, Q, G)
    assert t.run(admin_steps.delete_pool(job)).status == "leased"
    assert admin_steps.pool_key("c", "p") in t.items
    assert t.run(admin_steps.delete_pool(replace(job, force=True))).status == "deleted"
    assert admin_steps.pool_key("c", "p") not in t.items and t.counts["deleted"] == 2
    assert At(WEST, GetItem(("c", "rb"))) in t.calls


def test_adopt_lease_makes_the_paper_agents_lease_a_rasd_lease() -> None:
    t = Table()
    t.free("ra")
    t.land(Write(("c", "ra"), (), set=(("key", "k1"), ("lease_expires", fmt_time(NOW + HOUR)))))
    r = t.res("ra")
    assert t.run(admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", dry=True)) == "would_adopt"
    assert t.run(admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", dry=False)) == "adopted"
    assert t.writes() == ["map_acquire", "adopt", "map_confirm"]
    m = t.mapping("k1")
    assert (m.state, m.token, m.resource) == (LIVE, "tok", "ra")
    assert t.run(admin_steps.adopt_lease(t.res("ra"), NOW, RULES, "adm", "t2", dry=False)) == "rasd"


def test_move_free_is_a_lost_race_once_claimed() -> None:
    t = Table()
    r = t.free("ra")
    t.lease("ra", "k1", NOW + HOUR)
    assert t.run(admin_steps.move_free(r, WEST)) is False
    r2 = t.free("rb")
    assert t.run(admin_steps.move_free(r2, WEST)) is True and t.res("rb").region == WEST


# ------------------------------------------------------------------- the paper's agent
def test_paper_get_lease_answers_the_index_else_claims_on_the_version() -> None:
    t = Table()
    a = t.free("ra")
    b = t.free("rb")
    calls: list[Any] = []

    def perform(eff: Any) -> Any:
        calls.append(eff)
        if isinstance(eff, QueryLeased):
            return [it for it in map(resource_from, t.items.values()) if it.key == "kp"]
        if isinstance(eff, QueryAvailable):
            return [a, b] if eff.partition == 3 else []
        return t.perform(eff)

    t.land(Write(a.ident, (), set=(("version", a.version + 1),)))  # a is stale: a conflict
    prog = paper_steps.paper_get_lease("c", "p", "kp", EAST, NOW + HOUR, NOW, (1, 3), 10)
    got = drive_sync(prog, perform)
    assert got is not None and got.new and got.item.resource == "rb"
    assert t.counts["conflicts"] == 1
    again = drive_sync(
        paper_steps.paper_get_lease("c", "p", "kp", EAST, NOW + HOUR, NOW, (1,), 10), perform
    )
    assert again is not None and not again.new and again.item.resource == "rb"
    assert drive_sync(paper_steps.paper_free_expired(t.res("rb"), NOW + HOUR), perform) == "freed"


# -------------------------------------------------------------------- replay (checker)
def test_a_dedupe_run_replays_exactly_from_its_results() -> None:
    t, items = dup_table()
    run = dedupe_steps.DedupeRun(EAST, NOW, Q, M, G)
    trace = Spawn(dedupe_steps.dedupe_key, (items, run)).trace()
    sent: list[Any] = []
    gen, eff = trace.resume()
    while gen is not None:
        res = t.perform(eff)
        trace = trace.then(res)
        sent.append(res)
        gen, eff = trace.resume()
    assert t.counts["released"] == 1 and len(trace.sent) == len(sent)


# ------------------------------------------------------------------- the boto3 driver
def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "UpdateItem")


class Stub:
    def __init__(self, update: Exception | None = None, get: Exception | None = None) -> None:
        self.update, self.get = update, get

    def update_item(self, **kw: Any) -> dict[str, Any]:
        if self.update:
            raise self.update
        return {"Attributes": {"client_id": {"S": "c"}, "resource": {"S": "ra"}}}

    def get_item(self, **kw: Any) -> dict[str, Any]:
        if self.get:
            raise self.get
        return {}


def test_driver_outcomes_and_errors() -> None:
    w = Write(("c", "ra"), ())
    assert Driver(Stub(), "t").perform(Send(w)).outcome is Outcome.APPLIED
    lost = Driver(Stub(update=client_error("ConditionalCheckFailedException")), "t").perform
    assert lost(Send(w)).outcome is Outcome.REJECTED
    res = Driver(Stub(update=client_error("InternalServerError")), "t").perform(Send(w))
    assert res.outcome is Outcome.UNKNOWN and isinstance(res.error, RasdError)
    # a read failure is thrown into the program; uncaught, the command sees boto3's error
    d = Driver(Stub(get=client_error("ResourceNotFoundException")), "t")
    with pytest.raises(RasdError):
        d.perform(GetItem(("c", "ra")))
    with pytest.raises(ClientError):
        d.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G))
    # a write to a region with no endpoint is refused
    with pytest.raises(RasdError):
        Driver(Stub(), "t").perform(At(WEST, Send(w)))
    # notes: counted without a level
    d2 = Driver(Stub(), "t")
    d2.perform(Note("x"))
    assert d2.counts["x"] == 1


# ------------------------------------------------- the checker's known-bad substitutions
def survivor_pending_in_west() -> tuple[Table, tuple[ResourceItem, ...], dedupe_steps.DedupeRun]:
    """An east survivor whose confirm has not reached the west replica; a west extra."""
    t = Table()
    e = t.lease("e-1", "k1", NOW + 2 * HOUR, region=EAST, acquired=NOW - 2 * HOUR)
    w = t.lease("w-1", "k1", NOW + HOUR, region=WEST)
    mid = (map_pk("c", "p", "k1"), EAST)
    t.lagging[WEST] = dict(t.items) | {mid: t.items[mid] | {"state": "pending"}}
    return t, (e, w), dedupe_steps.DedupeRun(EAST, NOW, Q, M, G, peers=frozenset({WEST}))


@pytest.mark.parametrize("name", ["D1", "D2", "D4"])
def test_known_bad_dedupe_sets_release_an_extra_whose_survivor_is_not_served(name: str) -> None:
    from check.rulesets import PROTOCOLS, REAL, job_ops

    bad = next(p for n, p in PROTOCOLS.items() if n.startswith(name + "-"))
    for proto, released in ((REAL, 0), (bad, 1)):
        t, items, run = survivor_pending_in_west()
        t.run(dedupe_steps.dedupe_key(items, run, job_ops(proto)))
        assert t.counts["released"] == released, proto.name


def test_known_bad_d3_d5_h_q_change_what_the_programs_do() -> None:
    from check.rulesets import BAD_D3, BAD_D5, BAD_H, BAD_Q, REAL, job_ops

    t, items = dup_table(survivor_end=NOW + HOUR + M)
    t.run(
        dedupe_steps.dedupe_key(items, dedupe_steps.DedupeRun(EAST, NOW, Q, M, G), job_ops(BAD_D3))
    )
    assert t.counts["released"] == 1

    def named_orphan() -> tuple[Table, ResourceItem, Mapping]:
        t = Table()
        r = t.lease("ra", "k1", NOW + HOUR)
        m = t.mapping("k1")
        t.land(Write(m.ident, (), set=(("state", FREE), ("ver", m.ver + 1))))
        return t, r, t.mapping("k1")

    for proto, attr, until in (
        (REAL, "quarantine_until", NOW + HOUR + G),
        (BAD_D5, "quarantine_until", NOW + Q),
        (BAD_Q, "lease_available", NOW + HOUR + G),
    ):
        t, r, m = named_orphan()
        assert t.run(repair_steps.repair(r, m, NOW, Q, G, ops=job_ops(proto))) == "freed_orphan"
        assert t.items[("c", "ra")].get(attr) == fmt_time(until), proto.name

    for proto, want in ((REAL, "foreign"), (BAD_H, "freed_orphan")):
        t = Table()
        r = t.lease("ra", "k1", NOW + HOUR, mapped=False)
        t.items[("c", "ra")] = t.items[("c", "ra")] | {"version": r.version + 1}
        stale = t.res("ra")
        assert t.run(repair_steps.check_orphan(stale, RUN, job_ops(proto))) == want, proto.name
