"""The liberator's and the jobs' repair programs (rasd.steps.repair) at their boundaries: what
each returns, the notes it counts and logs (event, level, fields: what the job's summary and
log show), the writes it sends and what they leave on the item; and the builders they write
with (liberate, free_orphan, relist), applied to items. Driven by the scripted ``Table`` of
tests.helpers.scripted, time passed in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rasd.core import verdicts
from rasd.core.builders import free_orphan, liberate, relist
from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.lease import FREE, US, Mapping, ResourceItem, fmt_time, map_pk
from rasd.core.map_builders import map_acquire
from rasd.core.verdicts import Orphan
from rasd.core.writes import Cond, Write, apply
from rasd.steps import GetItem, WriteResult
from rasd.steps import repair as repair_steps
from tests.helpers.scripted import EAST, HOUR, NOW, RUN, G, Q, Rec, Table

HELD = ("key", "lease_expires", "lease_acquired", "holder", "mver", "hver")
AGE = RUN.orphan_age_us
assert AGE is not None


def ctx(r: ResourceItem, **more: object) -> dict[str, object]:
    return {
        "client_id": r.client_id,
        "pool_id": r.pool_id,
        "resource": r.resource,
        "region": r.region,
        "key": r.key,
        "version": r.version,
    } | more


def never_named(t: Table, name: str = "ra", end: int = NOW + HOUR) -> ResourceItem:
    """A held item (mver 1) whose key's mapping went, at that version, to another claim: an
    orphan no app was ever answered with."""
    r = t.lease(name, "k1", end, mapped=False)
    mid = (map_pk("c", "p", "k1"), EAST)
    t.land(map_acquire(mid, 0, "t-other", "other", 1, end, NOW - HOUR, "d2"))
    assert t.mapping("k1").ver == r.mver == 1
    return r


UNKNOWN = WriteResult(Outcome.UNKNOWN)


# ------------------------------------------------------------------------------ applied
def test_applied_tells_applied_from_a_lost_race_and_raises_the_rest() -> None:
    assert repair_steps.applied(WriteResult(Outcome.APPLIED)) is True
    assert repair_steps.applied(WriteResult(Outcome.REJECTED)) is False
    err = Unavailable("throttled")
    for res in (WriteResult(Outcome.REJECTED, error=err), WriteResult(Outcome.UNKNOWN, error=err)):
        with pytest.raises(Unavailable) as got:
            repair_steps.applied(res)
        assert got.value is err
    with pytest.raises(Unavailable, match=r"^write outcome unknown$"):
        repair_steps.applied(UNKNOWN)


# ------------------------------------------------------------------------------ builders
def test_liberate_free_orphan_and_relist_build_these_writes() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW - HOUR)
    lib = liberate(r, NOW)
    assert lib == Write(
        ("c", "ra"),
        (
            Cond("version", "=", r.version),
            Cond("lease_expires", "=", fmt_time(NOW - HOUR)),
            Cond("region", "=", EAST),
        ),
        set=(("lease_available", fmt_time(NOW)), ("version", r.version + 1)),
        remove=HELD,
    )
    assert lib.kind == "liberate"
    conds = (Cond("version", "=", r.version), Cond("holder", "=", "t-ra"))
    late = free_orphan(r, NOW, NOW + Q)
    assert late == Write(
        ("c", "ra"),
        conds,
        set=(("quarantine_until", fmt_time(NOW + Q)), ("version", r.version + 1)),
        remove=HELD,
    )
    assert late.kind == "free_orphan"
    now = free_orphan(r, NOW, NOW)
    assert now == Write(
        ("c", "ra"),
        conds,
        set=(("lease_available", fmt_time(NOW)), ("version", r.version + 1)),
        remove=HELD,
    )
    q = replace(r, key=None, holder=None, quarantine_until=fmt_time(NOW))
    rel = relist(q, NOW + 1)
    assert rel == Write(
        ("c", "ra"),
        (
            Cond("version", "=", r.version),
            Cond("quarantine_until", "=", fmt_time(NOW)),
            Cond("quarantine_until", "<=", fmt_time(NOW + 1)),
            Cond("key", "not_exists"),
            Cond("region", "=", EAST),
        ),
        set=(("lease_available", fmt_time(NOW)), ("version", r.version + 1)),
        remove=("quarantine_until",),
    )
    assert rel.kind == "relist"


def test_free_orphan_and_liberate_leave_a_free_item_one_version_on() -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW - HOUR)
    before = t.items[("c", "ra")]
    for w in (free_orphan(r, NOW, NOW + Q), liberate(r, NOW)):
        after = apply(before, w)
        assert after is not None and not set(HELD) & set(after)
        assert int(after["version"]) == r.version + 1
        # a second copy of the write (built from the same read) finds the version moved on
        assert apply(after, w) is None


# -------------------------------------------------------------------- release and repair
def test_release_held_wants_a_held_item_before_any_call() -> None:
    t = Rec()
    r = t.lease("ra", "k1", NOW + HOUR)
    with pytest.raises(AssertionError):
        t.run(repair_steps.release_held(replace(r, holder=None), NOW, Q, G))
    assert t.calls == []


def early(w: Write) -> Write:
    return replace(w, kind="early")


@pytest.mark.parametrize(("q", "kind"), [(0, "free_claim"), (1, "early")])
def test_release_held_sends_an_early_free_only_before_its_time(q: int, kind: str) -> None:
    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    ops = repair_steps.Ops(early_free=early)
    assert t.run(repair_steps.release_held(r, NOW, q, G, ops=ops)) == "released"
    assert t.writes() == ["map_release", kind]
    attr = "lease_available" if q == 0 else "quarantine_until"
    assert t.items[("c", "ra")][attr] == fmt_time(NOW + q)


@pytest.mark.parametrize(("q", "kind"), [(0, "free_orphan"), (1, "early")])
def test_repair_sends_an_early_free_only_before_its_time(q: int, kind: str) -> None:
    t = Table()
    r = never_named(t)
    ops = repair_steps.Ops(early_free=early)
    assert t.run(repair_steps.repair(r, t.mapping("k1"), NOW, q, G, ops=ops)) == "freed_orphan"
    assert t.writes() == [kind]


def test_release_held_and_repair_examined_judge_with_the_ops_given() -> None:
    def always(v: Orphan) -> repair_steps.Ops:
        return repair_steps.Ops(orphan_verdict=lambda r, m: v)

    t = Table()
    r = t.lease("ra", "k1", NOW + HOUR)
    # a verdict of ORPHAN for a lease: repaired as one, through the same ops
    assert (
        t.run(repair_steps.release_held(r, NOW, Q, G, ops=always(Orphan.ORPHAN))) == "freed_orphan"
    )
    t2 = Table()
    o = t2.lease("ra", "k1", NOW + HOUR, mapped=False)
    assert t2.run(repair_steps.repair_examined(o, NOW, Q, G, ops=always(Orphan.LEASE))) == "lease"
    assert t2.writes() == []


def test_repair_examined_frees_an_orphan_to_its_end_plus_the_grace() -> None:
    t = Table()
    o = t.lease("ra", "k1", NOW + HOUR, mapped=False)  # its mapping write may still land
    assert t.run(repair_steps.repair_examined(o, NOW, Q, G)) == "freed_orphan"
    assert t.writes() == ["map_fence", "free_orphan"]
    assert t.res("ra").quarantine_until == fmt_time(NOW + HOUR + G)
    t2 = Table()
    n = never_named(t2)
    assert t2.run(repair_steps.repair_examined(n, NOW, Q, G)) == "freed_orphan"
    assert t2.res("ra").quarantine_until == fmt_time(NOW + Q)


def test_orphan_free_at_holds_an_orphan_the_mapping_moved_past_to_its_end() -> None:
    """Past ``r.mver`` the mapping may have named the claim before it moved on, whoever it
    names now: held to the end; at ``r.mver`` naming another claim: never named."""
    r = Table().lease("ra", "k1", NOW + HOUR, mapped=False)
    m = Mapping("c", "p", "k1", EAST, r.mver + 1, FREE, "t-other", "other")
    assert verdicts.orphan_free_at(r, m, NOW, Q, G) == NOW + HOUR + G
    at = replace(m, ver=r.mver)
    assert verdicts.orphan_free_at(r, at, NOW, Q, G) == NOW + Q
    assert verdicts.orphan_free_at(r, replace(at, token=r.holder), NOW, Q, G) == NOW + HOUR + G


# --------------------------------------------------------------------- the liberator
def test_liberate_item_frees_only_past_the_grace_and_says_so() -> None:
    cutoff = NOW - RUN.grace_us
    t = Rec()
    at = t.lease("ra", "k1", cutoff)  # ends exactly at the cutoff: not yet
    assert t.run(repair_steps.liberate_item(at, RUN)) == "lease"
    assert t.writes() == [] and t.counted() == ["checked"]
    t = Rec()
    past = t.lease("ra", "k1", cutoff - 1)
    assert t.run(repair_steps.liberate_item(past, RUN)) == "freed"
    c = ctx(past, lease_expires=fmt_time(cutoff - 1))
    assert t.notes == [("expired", "", {}), ("freed", "", {}), ("freed", "debug", c)]
    assert t.res("ra").lease_available == fmt_time(NOW)


def test_liberate_item_dry_run_lost_race_and_errors() -> None:
    end = NOW - HOUR
    t = Rec()
    r = t.lease("ra", "k1", end)
    c = ctx(r, lease_expires=fmt_time(end))
    assert t.run(repair_steps.liberate_item(r, replace(RUN, dry_run=True))) == "would_free"
    assert t.calls == []
    assert t.notes == [("expired", "", {}), ("would_free", "", {}), ("would_free", "debug", c)]
    t.notes.clear()
    stale = replace(r, version=r.version - 1)
    assert t.run(repair_steps.liberate_item(stale, RUN)) == "lost_race"
    cs = ctx(stale, lease_expires=fmt_time(end))
    assert t.notes == [("expired", "", {}), ("lost_races", "", {}), ("lost_race", "info", cs)]
    err = Unavailable("throttled")
    for res, shown in (
        (UNKNOWN, "None"),
        (WriteResult(Outcome.REJECTED, error=err), repr(err)),
        (WriteResult(Outcome.UNKNOWN, error=err), repr(err)),
    ):
        t.notes.clear()
        t.results[len(t.calls) + 1] = res
        assert t.run(repair_steps.liberate_item(r, RUN)) == "error"
        assert t.notes == [
            ("expired", "", {}),
            ("errors", "", {}),
            ("free_failed", "error", c | {"error": shown}),
        ]
    assert t.res("ra").key == "k1"


def test_liberate_item_checks_for_orphans_with_the_ops_given() -> None:
    t = Table()
    o = t.lease("ra", "k1", NOW + HOUR, mapped=False)
    lease_only = repair_steps.Ops(orphan_verdict=lambda r, m: Orphan.LEASE)
    assert t.run(repair_steps.liberate_item(o, RUN, lease_only)) == "lease"
    assert t.writes() == []
    assert t.run(repair_steps.liberate_item(o, RUN)) == "freed_orphan"


def test_check_orphan_looks_only_at_old_held_items() -> None:
    t = Rec()
    old = t.lease("ra", "k1", NOW + HOUR, mapped=False, acquired=NOW - AGE - 1)
    assert t.run(repair_steps.check_orphan(old, replace(RUN, orphan_age_us=None))) == "young"
    assert t.run(repair_steps.check_orphan(replace(old, holder=None), RUN)) == "young"
    assert t.run(repair_steps.check_orphan(replace(old, lease_acquired_us=None), RUN)) == "young"
    edge = replace(old, lease_acquired_us=NOW - AGE)  # exactly the orphan age: young
    assert t.run(repair_steps.check_orphan(edge, RUN)) == "young"
    assert t.calls == [] and t.notes == []
    assert t.run(repair_steps.check_orphan(old, RUN)) == "freed_orphan"


def test_check_orphan_leaves_an_item_that_changed_since_the_scan() -> None:
    t = Rec()
    r = t.lease("ra", "k1", NOW + HOUR, mapped=False)
    t.items[("c", "ra")] = t.items[("c", "ra")] | {"holder": "t-next"}  # claimed again
    assert t.run(repair_steps.check_orphan(r, RUN)) == "gone"
    t.items[("c", "ra")] = {k: v for k, v in t.items[("c", "ra")].items() if k != "key"}
    t.items[("c", "ra")]["holder"] = "t-ra"
    assert t.run(repair_steps.check_orphan(r, RUN)) == "gone"  # no key any more
    del t.items[("c", "ra")]
    assert t.run(repair_steps.check_orphan(r, RUN)) == "gone"
    assert t.writes() == [] and t.counted() == ["checked"] * 3 and t.logged() == []


def test_check_orphan_leaves_a_lease_its_mapping_names() -> None:
    t = Rec()
    r = t.lease("ra", "k1", NOW + HOUR)
    assert t.run(repair_steps.check_orphan(r, RUN)) == "lease"
    assert t.writes() == [] and t.notes == [("checked", "", {})]
    assert t.calls == [GetItem(("c", "ra")), GetItem((map_pk("c", "p", "k1"), EAST))]


@pytest.mark.parametrize(("legacy", "until"), [(False, NOW + Q), (True, NOW + HOUR + RUN.grace_us)])
def test_check_orphan_frees_a_never_named_orphan_after_the_quarantine(
    legacy: bool, until: int
) -> None:
    """Judged on the mapping as read (at the claim's version, naming another claim: never
    named, no fence); held to its end plus the grace only when the paper's agent may run."""
    t = Rec()
    r = never_named(t)
    assert t.run(repair_steps.check_orphan(r, replace(RUN, legacy_agents=legacy))) == "freed_orphan"
    assert t.writes() == ["free_orphan"]
    assert t.res("ra").quarantine_until == fmt_time(until)
    assert t.notes == [
        ("checked", "", {}),
        ("orphans", "", {}),
        ("orphans_freed", "", {}),
        ("orphan_freed", "warning", ctx(r)),
    ]


def test_check_orphan_dry_run_lost_race_and_error() -> None:
    t = Rec()
    r = never_named(t)
    assert t.run(repair_steps.check_orphan(r, replace(RUN, dry_run=True))) == "would_free_orphan"
    assert t.writes() == []
    assert t.notes == [
        ("checked", "", {}),
        ("orphans", "", {}),
        ("would_free_orphan", "info", ctx(r)),
    ]
    t.notes.clear()
    t.calls.clear()

    def moved() -> None:
        t.items[("c", "ra")] = t.items[("c", "ra")] | {"version": r.version + 1}

    t.before[3] = moved  # after the two reads, before the free
    assert t.run(repair_steps.check_orphan(r, RUN)) == "lost_race"
    assert t.notes == [
        ("checked", "", {}),
        ("orphans", "", {}),
        ("lost_races", "", {}),
        ("lost_race", "warning", ctx(r)),
    ]
    t = Rec()
    fresh = never_named(t)
    t.results[3] = UNKNOWN
    assert t.run(repair_steps.check_orphan(fresh, RUN)) == "error"
    exc: RasdError = Unavailable("write outcome unknown")
    assert t.notes == [
        ("checked", "", {}),
        ("orphans", "", {}),
        ("errors", "", {}),
        ("repair_failed", "error", ctx(fresh, error=repr(exc))),
    ]


# ----------------------------------------------------------------------- relist_item
def quarantined(t: Table, until: int) -> ResourceItem:
    t.free("ra")
    item = {k: v for k, v in t.items[("c", "ra")].items() if k != "lease_available"}
    t.items[("c", "ra")] = item | {"quarantine_until": fmt_time(until)}
    return t.res("ra")


def test_relist_item_relists_from_the_end_of_the_quarantine_on() -> None:
    t = Rec()
    assert t.run(repair_steps.relist_item(t.free("rb"), NOW)) == "quarantined"  # listed already
    r = quarantined(t, NOW)
    assert t.run(repair_steps.relist_item(r, NOW - 1)) == "quarantined"
    assert t.calls == [] and t.notes == []
    assert t.run(repair_steps.relist_item(r, NOW, dry_run=True)) == "would_relist"
    assert t.calls == [] and t.notes == [("quarantine_over", "", {})]
    assert t.run(repair_steps.relist_item(r, NOW)) == "relisted"  # exactly at its end
    assert t.writes() == ["relist"]
    after = t.items[("c", "ra")]
    assert after["lease_available"] == fmt_time(NOW) and "quarantine_until" not in after
    assert int(after["version"]) == r.version + 1
    assert t.counted() == ["quarantine_over", "quarantine_over", "relisted"]


def test_relist_item_lost_race_and_error() -> None:
    t = Rec()
    r = quarantined(t, NOW)
    t.items[("c", "ra")] = t.items[("c", "ra")] | {"version": r.version + 1}
    assert t.run(repair_steps.relist_item(r, NOW + US)) == "lost_race"
    assert t.notes == [("quarantine_over", "", {}), ("lost_races", "", {})]
    t.notes.clear()
    t.results[len(t.calls) + 1] = UNKNOWN
    assert t.run(repair_steps.relist_item(r, NOW + US)) == "error"
    exc: RasdError = Unavailable("write outcome unknown")
    assert t.notes == [
        ("quarantine_over", "", {}),
        ("errors", "", {}),
        ("relist_failed", "error", ctx(r, error=repr(exc))),
    ]
