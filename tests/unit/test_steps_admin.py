"""rasadmin's programs (rasd.steps.admin) and the paper's agent's (rasd.steps.paper), each
status and result they return, the writes they send and the notes they count, on the plain
items of ``tests.helpers.scripted.Table`` with time passed in. ``jobs/rasd_jobs/admin/`` prints the
statuses, the item read and the detail; ``rasadmin delete-pool`` sums the notes."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rasd.core.builders import claim, paper_claim, paper_free, readd, tombstone
from rasd.core.lease import FREE, LIVE, META_CLIENT, US, ResourceItem, fmt_time, map_pk
from rasd.core.map_builders import map_acquire
from rasd.core.serialize import pool_from_ddb
from rasd.core.writes import Write
from rasd.steps import At, Note, Put, QueryAvailable, QueryLeased, Send, drive_sync
from rasd.steps import admin as admin_steps
from rasd.steps import paper as paper_steps
from rasd.steps.admin import AdminResult
from tests.helpers.scripted import EAST, HOUR, NOW, RULES, WEST, G, Q, Table


def paper_lease(t: Table, name: str, key: str, end: int, region: str = EAST) -> ResourceItem:
    """A lease the paper's agent made: key and end, no holder, no mapping."""
    t.free(name, region)
    t.land(paper_claim(t.res(name), key, end))
    return t.res(name)


def quarantined(t: Table, name: str, until: int) -> ResourceItem:
    """A free item early-freed, out of the available index until ``until``."""
    t.free(name)
    item = {k: v for k, v in t.items[("c", name)].items() if k != "lease_available"}
    t.items[("c", name)] = item | {"quarantine_until": fmt_time(until)}
    return t.res(name)


def gone(t: Table, name: str) -> ResourceItem:
    """A deleted name: its tombstone, held until now."""
    t.free(name)
    t.land(tombstone(t.res(name), NOW, NOW))
    return t.res(name)


def noting(
    t: Table, prog: Any, before: Callable[[Any], None] | None = None
) -> tuple[Any, list[Note]]:
    """Run ``prog`` on ``t``, keeping every note (with or without a level); ``before`` sees
    each effect first."""
    notes: list[Note] = []

    def perform(eff: Any) -> Any:
        if isinstance(eff, Note):
            notes.append(eff)
        elif before is not None:
            before(eff)
        return t.perform(eff)

    return drive_sync(prog, perform), notes


def on_send(kind: str, hook: Callable[[], None]) -> Callable[[Any], None]:
    """A ``before`` that runs ``hook`` once, just before the first write of ``kind``."""
    done: list[bool] = []

    def before(eff: Any) -> None:
        call = eff.call if isinstance(eff, At) else eff
        if isinstance(call, Send) and call.write.kind == kind and not done:
            done.append(True)
            hook()

    return before


# ------------------------------------------------------------------- release-resource
def test_release_resource_answers_each_refusal_with_the_item_read() -> None:
    t = Table()
    west = t.lease("rw", "k2", NOW + HOUR, region=WEST)
    free = t.free("rf")
    paper = paper_lease(t, "rp", "k3", NOW + HOUR)
    gone(t, "rt")

    def release(name: str) -> AdminResult:
        return t.run(admin_steps.release_resource(("c", name), EAST, NOW, Q, G))

    assert release("zz") == AdminResult("missing")
    assert release("rt") == AdminResult("missing")  # a tombstone is no resource
    assert release("rw") == AdminResult("other_region", west, WEST)
    assert release("rf") == AdminResult("not_leased", free)
    assert release("rp") == AdminResult("no_holder", paper)
    assert t.writes() == []


def test_release_resource_reports_when_it_is_claimable_again() -> None:
    t = Table()
    a = t.lease("ra", "k1", NOW + HOUR)
    got = t.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G))
    assert got == AdminResult("released", a, fmt_time(NOW + HOUR + G))
    # a lease past its end plus the skew, no quarantine: claimable at once (lease_available)
    t2 = Table()
    b = t2.lease("rb", "k1", NOW - G)
    got = t2.run(admin_steps.release_resource(("c", "rb"), EAST, NOW, 0, G))
    assert got == AdminResult("released", b, fmt_time(NOW))
    assert t2.res("rb").lease_available == fmt_time(NOW)
    # deleted meanwhile (its read-back carries neither): released, no time to report
    t3 = Table()
    c = t3.lease("rc", "k1", NOW + HOUR)

    def delete() -> None:
        t3.land(tombstone(t3.res("rc"), NOW, NOW + HOUR + G))

    t3.before[6] = delete  # after the free (call 5), before its read-back
    got = t3.run(admin_steps.release_resource(("c", "rc"), EAST, NOW, Q, G))
    assert t3.writes() == ["map_release", "free_claim"]
    assert got == AdminResult("released", c, None)


def test_release_resource_is_a_lost_race_when_the_lease_changed_after_the_read() -> None:
    t = Table()
    a = t.lease("ra", "k1", NOW + HOUR)
    mid = (map_pk("c", "p", "k1"), EAST)

    def reacquired() -> None:  # the key's mapping names another acquisition now
        t.land(Write(mid, (), set=(("token", "t-other"),)))

    got, _ = noting(
        t,
        admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G),
        on_send("map_release", reacquired),
    )
    assert got == AdminResult("lost_race", a)
    assert t.res("ra").key == "k1" and len(t.calls) == 3  # no free, no read-back


def test_release_resource_decides_with_the_ops_given() -> None:
    """The known-bad Q rule set puts an early free back in the available index."""
    from check.rulesets import BAD_Q, job_ops

    t = Table()
    t.lease("ra", "k1", NOW + HOUR)
    got = t.run(admin_steps.release_resource(("c", "ra"), EAST, NOW, Q, G, ops=job_ops(BAD_Q)))
    assert got.status == "released"
    assert t.res("ra").lease_available == fmt_time(NOW + HOUR + G)
    assert t.res("ra").quarantine_until is None


# -------------------------------------------------------------------- delete-resource
def test_delete_resource_statuses_carry_the_item_and_when() -> None:
    t = Table()
    a = t.lease("ra", "k1", NOW + HOUR)
    west = t.free("rw", WEST)
    q = quarantined(t, "rq", NOW + US)
    gone(t, "rt")

    def delete(name: str, force: bool = False, now: int = NOW) -> AdminResult:
        return t.run(admin_steps.delete_resource(("c", name), EAST, now, force, Q, G))

    assert delete("zz") == AdminResult("missing")
    assert delete("rt") == AdminResult("missing")
    assert delete("rw") == AdminResult("other_region", west, WEST)
    assert delete("ra") == AdminResult("leased", a)
    assert delete("rq") == AdminResult("quarantined", q, fmt_time(NOW + US))
    assert t.writes() == []


def test_delete_resource_without_force_deletes_what_nothing_can_still_serve() -> None:
    """A free item claimable now and a lease past its end need no ``force``; an item an
    older rasd quarantined with a later ``lease_available`` does, until that time."""
    t = Table()
    f = t.free("rf")
    x = t.lease("rx", "k1", NOW)  # ended exactly now
    old = t.free("ro")
    t.items[("c", "ro")] |= {"lease_available": fmt_time(NOW + US)}
    old = t.res("ro")

    def delete(name: str, now: int = NOW) -> AdminResult:
        return t.run(admin_steps.delete_resource(("c", name), EAST, now, False, Q, G))

    assert delete("rf") == AdminResult("deleted", f, fmt_time(NOW))
    assert delete("rx") == AdminResult("deleted", x, fmt_time(NOW + Q))
    assert delete("ro") == AdminResult("quarantined", old, fmt_time(NOW + US))
    assert delete("ro", NOW + US).status == "deleted"


def test_delete_resource_is_changed_when_a_daemon_claims_it_after_the_read() -> None:
    t = Table()
    f = t.free("rf")

    def claimed() -> None:
        t.land(claim(t.res("rf"), "k1", NOW + HOUR, NOW, "t-d", 1))

    t.before[2] = claimed  # after the command's read, before delete_item's
    assert t.run(admin_steps.delete_resource(("c", "rf"), EAST, NOW, False, Q, G)) == AdminResult(
        "changed", f
    )
    assert t.res("rf").key == "k1" and t.writes() == []


def test_delete_resource_reports_no_hold_when_the_name_was_added_again_meanwhile() -> None:
    t = Table()
    f = t.free("rf")

    def added_again() -> None:
        stone = t.items[("c", "rf")]
        t.land(readd(("c", "rf"), int(stone["version"]), str(stone["hold_until"]), "p", EAST, NOW))

    t.before[4] = added_again  # after the tombstone (call 3), before its read-back
    assert t.run(admin_steps.delete_resource(("c", "rf"), EAST, NOW, False, Q, G)) == AdminResult(
        "deleted", f, None
    )


def test_delete_resource_decides_with_the_admin_ops_given() -> None:
    """The known-bad R rule set deletes a quarantined item without ``force`` and holds the
    name until now only: both through the ops given, in the command and in its delete."""
    from check.rulesets import BAD_R, admin_ops

    t = Table()
    q = quarantined(t, "rq", NOW + US)
    got = t.run(admin_steps.delete_resource(("c", "rq"), EAST, NOW, False, Q, G, admin_ops(BAD_R)))
    assert got == AdminResult("deleted", q, fmt_time(NOW))


# ------------------------------------------------------------------------ delete-pool
def test_delete_pool_refusals_name_an_example_and_how_many() -> None:
    t = Table()
    a = t.lease("ra", "k1", NOW + HOUR)
    b = t.lease("rb", "k2", NOW + HOUR)
    x = t.lease("rx", "k3", NOW)  # ended exactly now: neither leased nor quarantined
    f = t.free("rf")
    q1 = quarantined(t, "q1", NOW + US)
    q2 = quarantined(t, "q2", NOW + US)
    job = admin_steps.PoolDelete("c", "p", True, (x, f, a, q1, b, q2), NOW, False, Q, G)
    assert t.run(admin_steps.delete_pool(job)) == AdminResult("leased", a, "2")
    quiet = replace(job, items=(x, f, q1, q2))
    assert t.run(admin_steps.delete_pool(quiet)) == AdminResult("quarantined", q1, "2")
    assert t.run(admin_steps.delete_pool(replace(quiet, dry_run=True, force=True))) == AdminResult(
        "dry_run"
    )
    assert t.calls == []
    assert t.run(admin_steps.delete_pool(replace(quiet, force=True))) == AdminResult("deleted")
    assert t.writes() == ["map_release"] + ["tombstone"] * 4 and t.counts["deleted"] == 4


def test_delete_pool_without_force_deletes_free_and_ended_items() -> None:
    t = Table()
    x = t.lease("rx", "k3", NOW)
    f = t.free("rf")
    job = admin_steps.PoolDelete("c", "p", False, (x, f), NOW, False, Q, G)
    assert t.run(admin_steps.delete_pool(job)) == AdminResult("deleted")
    assert t.writes() == ["map_release", "tombstone", "tombstone"]


def test_delete_pool_is_missing_only_without_a_definition_and_items() -> None:
    t = Table()
    t.run(admin_steps.define_pool("c", "p", 60.0))
    f = t.free("rf")
    t.calls.clear()
    job = admin_steps.PoolDelete("c", "p", False, (), NOW, False, Q, G)
    assert t.run(admin_steps.delete_pool(job)) == AdminResult("missing") and t.calls == []
    defined = replace(job, defined=True)
    assert t.run(admin_steps.delete_pool(defined)) == AdminResult("deleted")
    assert admin_steps.pool_key("c", "p") not in t.items
    assert t.run(admin_steps.delete_pool(replace(job, items=(f,)))) == AdminResult("deleted")
    assert t.counts["deleted"] == 1


def test_delete_pool_counts_and_logs_an_item_claimed_since_the_listing() -> None:
    t = Table()
    a = t.free("ra")
    b = t.free("rb")
    t.lease("ra", "k1", NOW + HOUR)  # claimed after the listing read it free
    job = admin_steps.PoolDelete("c", "p", True, (a, b), NOW, False, Q, G)
    got, notes = noting(t, admin_steps.delete_pool(job))
    assert got == AdminResult("deleted")
    assert notes == [
        Note("changed_meanwhile"),
        Note("changed_meanwhile", (("resource", "ra"),), "warning"),
        Note("deleted"),
    ]
    assert t.res("ra").key == "k1"


# ------------------------------------------------------------------------- add-pool
def test_define_pool_writes_the_definition_daemons_read() -> None:
    t = Table()
    puts: list[Put] = []
    got, _ = noting(t, admin_steps.define_pool("c", "p", 90.5), puts.append)
    assert got is True
    item = {
        "client_id": {"S": META_CLIENT},
        "resource": {"S": "pool#c#p"},
        "kind": {"S": "pool"},
        "max_lease": {"N": "90.5"},
    }
    assert puts == [Put(admin_steps.pool_key("c", "p"), item, only_new=False)]
    assert puts[0].item == item  # (Put compares its key and only_new only)
    assert pool_from_ddb(item).max_lease_us == int(90.5 * US)
    # redefined: written again; only_new (rasadmin adopt) leaves a definition alone
    assert t.run(admin_steps.define_pool("c", "p", 30.0)) is True
    assert t.items[admin_steps.pool_key("c", "p")]["max_lease"] == "30.0"
    assert t.run(admin_steps.define_pool("c", "p", 10.0, only_new=True)) is False
    assert t.items[admin_steps.pool_key("c", "p")]["max_lease"] == "30.0"
    assert t.run(admin_steps.define_pool("c", "q", 10.0, only_new=True)) is True


# --------------------------------------------------------------------- add-resources
def test_add_resource_writes_a_free_item_of_the_pool_and_region() -> None:
    t = Table()
    assert t.run(admin_steps.add_resource("c", "p", WEST, "rn", NOW)) == "added"
    r = t.res("rn")
    assert (r.client_id, r.pool_id, r.region, r.lease_available) == ("c", "p", WEST, fmt_time(NOW))
    assert r.claimable(NOW)


def test_add_resource_again_waits_for_the_hold_strictly_after_now() -> None:
    for hold, want, attr in (
        (NOW + 1, "held", "quarantine_until"),
        (NOW, "added", "lease_available"),
        (NOW - HOUR, "added", "lease_available"),
    ):
        t = Table()
        t.free("ra")
        t.land(tombstone(t.res("ra"), NOW - HOUR, hold))
        assert t.run(admin_steps.add_resource("c", "q", WEST, "ra", NOW)) == want, hold
        r = t.res("ra")
        assert (r.pool_id, r.region) == ("q", WEST)
        assert t.items[("c", "ra")][attr] == fmt_time(max(hold, NOW))


def test_add_resource_puts_again_when_the_tombstone_is_reaped_meanwhile() -> None:
    t = Table()
    gone(t, "ra")

    def reaped() -> None:
        t.items.pop(("c", "ra"))

    t.before[2] = reaped  # after the rejected put, before the read
    assert t.run(admin_steps.add_resource("c", "p", EAST, "ra", NOW)) == "added"
    assert [type(c).__name__ for c in t.calls] == ["Put", "GetItem", "Put"]
    assert t.res("ra").claimable(NOW)


def test_add_resource_gives_up_on_a_tombstone_that_keeps_changing() -> None:
    t = Table()
    gone(t, "ra")

    def bump(eff: Any) -> None:
        if isinstance(eff, Send):
            stone = t.items[("c", "ra")]
            t.items[("c", "ra")] = stone | {"version": int(stone["version"]) + 1}

    got, _ = noting(t, admin_steps.add_resource("c", "p", EAST, "ra", NOW), bump)
    assert got == "changing"
    assert t.writes() == ["readd"] * admin_steps.ATTEMPTS


# ----------------------------------------------------------------------------- adopt
def test_adopt_lease_writes_the_mapping_and_the_holder_the_daemon_would() -> None:
    t = Table()
    r = paper_lease(t, "ra", "k1", NOW + HOUR)
    assert t.run(admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", dry=False)) == "adopted"
    m = t.mapping("k1")
    assert (m.state, m.ver, m.token, m.resource) == (LIVE, 2, "tok", "ra")
    assert (m.rver, m.expires_us, m.since_us, m.owner) == (r.version, NOW + HOUR, NOW, "adm")
    after = t.res("ra")
    assert (after.holder, after.mver, after.hver) == ("tok", 1, r.version + 1)
    assert after.lease_acquired_us == NOW and after.holder_current


def test_adopt_lease_adopts_an_orphan_a_crash_left_held() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR, mapped=False)  # held, its mapping never written
    assert t.run(admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", dry=False)) == "adopted"
    assert t.mapping("k1").token == "tok" and t.res("ra").holder == "tok"


def test_adopt_lease_only_a_running_lease_and_not_beside_another() -> None:
    t = Table()
    ended = paper_lease(t, "rx", "k1", NOW)
    running = paper_lease(t, "ry", "k1", NOW + 1)
    assert t.run(admin_steps.adopt_lease(ended, NOW, RULES, "adm", "tok", dry=False)) == "ended"
    assert (
        t.run(admin_steps.adopt_lease(running, NOW, RULES, "adm", "tok", dry=True)) == "would_adopt"
    )
    t.lease("ra", "k2", NOW + HOUR)  # the key's mapping names this lease, live
    split = paper_lease(t, "rb", "k2", NOW + HOUR)
    assert (
        t.run(admin_steps.adopt_lease(split, NOW, RULES, "adm", "tok", dry=False)) == "kept_split"
    )
    assert t.writes() == [] and t.mapping("k2").resource == "ra"


def test_adopt_lease_loses_to_an_acquisition_of_the_key() -> None:
    t = Table()
    r = paper_lease(t, "ra", "k1", NOW + HOUR)
    mid = (map_pk("c", "p", "k1"), EAST)

    def acquired() -> None:
        t.land(map_acquire(mid, 0, "t-d", "rz", 0, NOW + HOUR, NOW, "d1"))

    got, _ = noting(
        t,
        admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", False),
        on_send("map_acquire", acquired),
    )
    assert got == "lost_race" and t.writes() == ["map_acquire"]
    assert t.mapping("k1").token == "t-d" and t.res("ra").holder is None


def test_adopt_lease_drops_its_mapping_when_the_item_moved_on() -> None:
    """The paper's liberator frees the item between the two writes: the mapping names a
    claim that can never land, so it is dropped at once."""
    t = Table()
    r = paper_lease(t, "ra", "k1", NOW + HOUR)

    def freed() -> None:
        t.land(paper_free(t.res("ra"), NOW))

    got, _ = noting(
        t, admin_steps.adopt_lease(r, NOW, RULES, "adm", "tok", False), on_send("adopt", freed)
    )
    assert got == "lost_race"
    assert t.writes() == ["map_acquire", "adopt", "map_drop_dead"]
    m = t.mapping("k1")
    assert (m.state, m.ver, m.token) == (FREE, 2, None)
    assert t.items[m.ident]["ttl"] == NOW // US + 24 * 3600


# -------------------------------------------------------------------------- balancer
def test_move_free_writes_in_the_items_region() -> None:
    t = Table()
    r = t.free("rw", WEST)
    assert t.run(admin_steps.move_free(r, EAST)) is True
    assert t.calls == [At(WEST, Send(admin_steps.move(r, EAST)))]
    assert t.res("rw").region == EAST


# ------------------------------------------------------------------- the paper's agent
def scripted(
    t: Table, leased: list[ResourceItem], available: dict[int, list[ResourceItem]]
) -> tuple[Callable[[Any], Any], list[Any]]:
    calls: list[Any] = []

    def perform(eff: Any) -> Any:
        calls.append(eff)
        if isinstance(eff, QueryLeased):
            return list(leased)
        if isinstance(eff, QueryAvailable):
            return list(available.get(eff.partition, []))
        return t.perform(eff)

    return perform, calls


def test_paper_get_lease_answers_only_this_clients_running_lease() -> None:
    t = Table()
    mine = paper_lease(t, "ra", "k1", NOW + HOUR)
    ended = paper_lease(t, "rb", "k1", NOW)
    other = replace(paper_lease(t, "rc", "k1", NOW + HOUR), client_id="d")
    perform, calls = scripted(t, [other, ended, mine], {})
    got = drive_sync(
        paper_steps.paper_get_lease("c", "p", "k1", EAST, NOW + HOUR, NOW, (0,), 10), perform
    )
    assert got == paper_steps.PaperAnswer(mine, False)
    assert calls == [QueryLeased("c", "p", "k1")]
    # none of this client's leases runs: it claims (none left here)
    perform, calls = scripted(t, [other, ended], {})
    got = drive_sync(
        paper_steps.paper_get_lease("c", "p", "k1", EAST, NOW + HOUR, NOW, (0,), 10), perform
    )
    assert got is None and len(calls) == 2


def test_paper_get_lease_claims_from_each_partition_in_turn() -> None:
    t = Table()
    f = t.free("rf")
    perform, calls = scripted(t, [], {3: [f]})
    prog = paper_steps.paper_get_lease("c", "p", "k1", WEST, NOW + HOUR, NOW, (1, 3), 7)
    got = drive_sync(prog, perform)
    assert got is not None and got.new and got.item == t.res("rf")
    assert calls[1:3] == [
        QueryAvailable("c", "p", WEST, 1, 7),
        QueryAvailable("c", "p", WEST, 3, 7),
    ]
    assert got.item.key == "k1" and got.item.lease_expires_us == NOW + HOUR


def test_paper_get_lease_tries_a_page_in_the_seeds_order() -> None:
    def tried(seed: int | None) -> list[str]:
        t = Table()
        stale = [replace(t.free(f"r{i}"), version=9) for i in range(8)]  # all conflicts
        perform, calls = scripted(t, [], {0: stale})
        prog = paper_steps.paper_get_lease("c", "p", "k1", EAST, NOW + HOUR, NOW, (0,), 8, seed)
        assert drive_sync(prog, perform) is None
        assert t.counts["conflicts"] == 8
        return [c.write.key[1] for c in calls if isinstance(c, Send)]

    names = [f"r{i}" for i in range(8)]
    assert tried(None) == names
    want = list(names)
    random.Random(11).shuffle(want)
    assert want != names and tried(11) == want


def test_paper_free_expired_after_the_end_plus_the_grace() -> None:
    grace = 60 * US
    for end, want in (
        (NOW - grace, "freed"),
        (NOW - grace + 1, "running"),
        (NOW + grace, "running"),
    ):
        t = Table()
        r = paper_lease(t, "ra", "k1", end)
        assert t.run(paper_steps.paper_free_expired(r, NOW, grace)) == want, end
        assert (t.res("ra").key is None) == (want == "freed")
    t = Table()
    r = paper_lease(t, "ra", "k1", NOW)
    assert t.run(paper_steps.paper_free_expired(r, NOW)) == "freed"
    assert t.run(paper_steps.paper_free_expired(r, NOW)) == "lost_race"  # the version moved on
    assert t.run(paper_steps.paper_free_expired(t.res("ra"), NOW)) == "running"  # free now
    no_end = replace(r, lease_expires_us=None)
    assert t.run(paper_steps.paper_free_expired(no_end, NOW)) == "running"
    assert t.writes() == ["paper_free", "paper_free"]
