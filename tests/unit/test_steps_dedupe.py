"""ras-dedupe's program (rasd.steps.dedupe) at its boundaries: which items it examines where,
what it keeps and releases and in which order, the calls it makes in which replica, and the
notes it counts and logs (event, level, fields: the job's summary and log). Driven by the
scripted ``Table`` of tests.helpers.scripted, time passed in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.lease import FREE, Mapping, ResourceItem, fmt_time, map_pk
from rasd.core.verdicts import Orphan
from rasd.core.writes import Write
from rasd.steps import At, GetItem, WriteResult
from rasd.steps import dedupe as dedupe_steps
from rasd.steps import repair as repair_steps
from tests.helpers.scripted import EAST, HOUR, NOW, WEST, G, M, Q, Rec, Table

EU = "eu-west-1"
MK = map_pk("c", "p", "k1")
CTX = {"client_id": "c", "pool_id": "p", "key": "k1"}
SLACK = M + G
RUN = dedupe_steps.DedupeRun(EAST, NOW, Q, M, G)


def ictx(it: ResourceItem, **more: object) -> dict[str, object]:
    return CTX | {"resource": it.resource, "region": it.region, "version": it.version} | more


def ectx(it: ResourceItem, **more: object) -> dict[str, object]:
    return CTX | {"resource": it.resource, "region": it.region} | more


def summary(keep: str | None, extras: list[str], orphans: list[str]) -> tuple[Any, ...]:
    return ("duplicate_key", "info", CTX | {"keep": keep, "extras": extras, "orphans": orphans})


def rec_dup(survivor_end: int = NOW + 2 * HOUR) -> tuple[Rec, tuple[ResourceItem, ...]]:
    t = Rec()
    w = t.lease("w-1", "k1", survivor_end, region=WEST, acquired=NOW - 2 * HOUR)
    e = t.lease("e-1", "k1", NOW + HOUR, region=EAST)
    return t, (e, w)


def released_mapping(t: Table, region: str) -> None:
    """The key's mapping in ``region`` released (a ras-dedupe stopped between its writes)."""
    m = t.mapping("k1", region)
    t.land(Write(m.ident, (), set=(("state", FREE), ("ver", m.ver + 1))))


# --------------------------------------------------------------------------- the run
def test_replica_and_writable() -> None:
    run = replace(RUN, peers=frozenset({WEST}))
    assert run.replica(EAST) is None and run.replica(WEST) == WEST and run.replica(EU) is None
    assert run.writable(EAST) and run.writable(WEST) and not run.writable(EU)


def test_a_release_logs_what_it_kept_and_released() -> None:
    t, (e, w) = rec_dup()
    t.run(dedupe_steps.dedupe_key((e, w), RUN))
    assert t.notes == [
        ("duplicate_keys", "", {}),
        summary("us-west-2:w-1", ["us-east-1:e-1"], []),
        ("released", "", {}),
        ("released", "info", ictx(e, kind="extra")),
    ]


def test_a_group_of_one_is_kept() -> None:
    t, (_e, w) = rec_dup()
    t.run(dedupe_steps.dedupe_key((w,), RUN))
    assert t.writes() == [] and t.res("w-1").key == "k1"
    assert t.notes == [("duplicate_keys", "", {}), summary("us-west-2:w-1", [], [])]


def test_groups_run_one_after_another_with_the_ops_given() -> None:
    t = Rec()
    groups = []
    for k in ("k1", "k2"):
        w = t.lease(f"w-{k}", k, NOW + HOUR + M, region=WEST, acquired=NOW - 2 * HOUR)
        e = t.lease(f"e-{k}", k, NOW + HOUR, region=EAST)
        groups.append((e, w))
    t.run(dedupe_steps.dedupe_groups(tuple(groups), RUN))
    assert t.counted().count("kept_until_survivor_outlasts") == 2 and t.writes() == []
    margin_only = repair_steps.Ops(dedupe_slack=lambda margin, grace: margin)
    t.run(dedupe_steps.dedupe_groups(tuple(groups), RUN, margin_only))
    assert t.counted().count("released") == 2
    assert t.res("e-k1").key is None and t.res("e-k2").key is None


# --------------------------------------------------------------------------- examine
def test_examine_leaves_out_what_changed_since_the_scan() -> None:
    t = Table()
    moved = t.lease("e-0", "k2", NOW + HOUR)  # the scan saw it hold k1
    gone = t.lease("e-9", "k1", NOW + HOUR, region=WEST)
    a = t.lease("e-1", "k1", NOW + HOUR, region=WEST)
    b = t.lease("e-2", "k1", NOW + HOUR)
    o = t.lease("e-3", "k1", NOW + HOUR, region=EU, mapped=False)
    del t.items[("c", "e-9")]
    scan = (replace(moved, key="k1"), gone, a, b, o)
    real, orphans = t.run(dedupe_steps.examine(scan, RUN))
    assert [it.resource for it in real] == ["e-1", "e-2"] and orphans == [o]


def test_examine_and_release_read_and_write_in_the_items_region() -> None:
    t = Table()
    e = t.lease("e-1", "k1", NOW + 2 * HOUR, region=EAST, acquired=NOW - 2 * HOUR)
    w = t.lease("w-1", "k1", NOW + HOUR, region=WEST)
    t.run(dedupe_steps.dedupe_key((e, w), replace(RUN, peers=frozenset({WEST}))))
    gets = [GetItem(k) for k in (("c", "w-1"), (MK, WEST))]
    assert t.calls[:5] == [
        GetItem(("c", "e-1")),
        GetItem((MK, EAST)),
        At(WEST, gets[0]),
        At(WEST, gets[1]),
        At(WEST, GetItem((MK, EAST))),  # the survivor as the west replica shows it
    ]
    rest = t.calls[5:]
    assert rest[0] == At(WEST, gets[1]) and rest[2] == At(WEST, gets[0])
    assert [type(c) for c in rest] == [At] * 4
    assert [c.call.write.kind for c in (rest[1], rest[3])] == ["map_release", "free_claim"]
    assert t.res("w-1").quarantine_until == fmt_time(NOW + HOUR + G)


def test_the_survivor_in_our_own_replica_is_read_there() -> None:
    t, (e, w) = rec_dup()
    t.run(dedupe_steps.dedupe_key((e, w), RUN))
    # examine reads four items; then the survivor's mapping, in our replica: no At
    assert t.calls[4] == GetItem((MK, WEST))


# ------------------------------------------------------------------------ extras
RUN3 = replace(RUN, peers=frozenset({WEST}))


def three(e_end: int, w_end: int = NOW + HOUR) -> tuple[Rec, tuple[ResourceItem, ...]]:
    """k1 held in three regions: the survivor s-1 in eu-west-1 (acquired first, to
    NOW + 2h), extras e-1 (east, ours) and w-1 (west, a peer); in scan order w, e, s."""
    t = Rec()
    s = t.lease("s-1", "k1", NOW + 2 * HOUR, region=EU, acquired=NOW - 3 * HOUR)
    e = t.lease("e-1", "k1", e_end)
    w = t.lease("w-1", "k1", w_end, region=WEST)
    return t, (w, e, s)


def test_extras_go_in_region_order_each_on_its_own() -> None:
    """e-1 (east) comes first, and is kept (the survivor does not outlast it); w-1 is
    released all the same."""
    t, (w, e, s) = three(e_end=NOW + 2 * HOUR)
    t.run(dedupe_steps.dedupe_key((w, e, s), RUN3))
    assert t.notes == [
        ("duplicate_keys", "", {}),
        summary(f"{EU}:s-1", ["us-east-1:e-1", "us-west-2:w-1"], []),
        ("kept_until_survivor_outlasts", "", {}),
        ("extra_kept", "info", ectx(e)),
        ("released", "", {}),
        ("released", "info", ictx(w, kind="extra")),
    ]
    assert t.res("w-1").key is None and t.res("e-1").key == "k1"


def test_an_extra_whose_survivor_read_fails_is_kept_and_the_next_goes_on() -> None:
    t, (w, e, s) = three(e_end=NOW + HOUR)
    err = Unavailable("down")

    def fail() -> None:
        raise err

    t.before[7] = fail  # examine's six reads, then the survivor as e-1's region shows it
    t.run(dedupe_steps.dedupe_key((w, e, s), RUN3))
    assert t.notes[2:] == [
        ("errors", "", {}),
        ("read_failed", "error", CTX | {"error": repr(err)}),
        ("released", "", {}),
        ("released", "info", ictx(w, kind="extra")),
    ]
    assert t.res("e-1").key == "k1" and t.res("w-1").key is None


def test_an_extra_is_kept_where_the_survivor_is_not_live() -> None:
    """Our replica shows the survivor pending (the west one live): e-1 is kept, w-1 goes."""
    t, (w, e, s) = three(e_end=NOW + HOUR)
    mid = (MK, EU)
    t.lagging[WEST] = dict(t.items)
    t.items[mid] = t.items[mid] | {"state": "pending"}
    t.run(dedupe_steps.dedupe_key((w, e, s), RUN3))
    assert t.notes[2:] == [
        ("kept_until_survivor_outlasts", "", {}),
        ("extra_kept", "info", ectx(e, why="survivor not live there")),
        ("released", "", {}),
        ("released", "info", ictx(w, kind="extra")),
    ]


def test_an_extra_is_kept_where_the_survivors_mapping_is_missing() -> None:
    t, (w, _e, s) = three(e_end=NOW + HOUR)
    t.lagging[WEST] = {k: v for k, v in t.items.items() if k != (MK, EU)}
    t.run(dedupe_steps.dedupe_key((w, s), RUN3))
    assert t.notes[2:] == [
        ("kept_until_survivor_outlasts", "", {}),
        ("extra_kept", "info", ectx(w, why="survivor not live there")),
    ]
    assert t.writes() == []


def test_an_extra_goes_only_if_it_ends_by_the_survivors_served_end_less_the_slack() -> None:
    """The survivor's item runs to NOW + 2h, its mapping (as the extra's region shows it) to
    the extra's end plus the slack, or a microsecond less: then the extra is kept, on its
    own mapping's end."""
    for short, want in ((0, "released"), (1, "kept_until_survivor_outlasts")):
        t, (e, w) = rec_dup()
        mid = (MK, WEST)
        t.items[mid] = t.items[mid] | {"exp": fmt_time(NOW + HOUR + SLACK - short)}
        t.run(dedupe_steps.dedupe_key((e, w), RUN))
        assert t.counted()[1:] == [want], short
        if short:
            assert t.notes[-1] == ("extra_kept", "info", ictx(e))
            assert t.writes() == []


def test_extras_are_released_with_the_ops_given() -> None:
    t, (e, w) = rec_dup()
    ops = repair_steps.Ops(early_free=lambda wr: replace(wr, kind="early"))
    t.run(dedupe_steps.dedupe_key((e, w), RUN, ops))
    assert t.writes() == ["map_release", "early"]


# ------------------------------------------------------------------------ orphans
def orphan_table() -> tuple[Rec, tuple[ResourceItem, ...]]:
    """Survivor w-1 (west); e-1 (east) held while its mapping was released: an orphan that
    may have been named (held to its end plus the grace)."""
    t, (e, w) = rec_dup()
    released_mapping(t, EAST)
    return t, (e, w)


def test_an_orphan_is_repaired_to_its_end_and_logged_as_one() -> None:
    t, (e, w) = orphan_table()
    t.run(dedupe_steps.dedupe_key((e, w), RUN))
    assert t.res("e-1").quarantine_until == fmt_time(NOW + HOUR + G)
    assert t.notes == [
        ("duplicate_keys", "", {}),
        summary("us-west-2:w-1", [], ["us-east-1:e-1"]),
        ("orphans_freed", "", {}),
        ("released", "info", ictx(e, kind="orphan")),
    ]


def test_orphans_are_judged_and_repaired_with_the_ops_given() -> None:
    def quarantine_only(r: ResourceItem, m: Mapping | None, now: int, q: int, g: int) -> int:
        return now + q

    t, (e, w) = orphan_table()
    t.run(dedupe_steps.dedupe_key((e, w), RUN, repair_steps.Ops(orphan_free_at=quarantine_only)))
    assert t.res("e-1").quarantine_until == fmt_time(NOW + Q)
    t, (e, w) = orphan_table()
    t.run(
        dedupe_steps.dedupe_key(
            (e, w), RUN, repair_steps.Ops(orphan_verdict=lambda r, m: Orphan.LEASE)
        )
    )
    assert t.notes[1] == summary("us-west-2:w-1", ["us-east-1:e-1"], [])
    assert "orphans_freed" not in t.counted()


def test_a_failed_read_while_examining_writes_nothing() -> None:
    t, (e, w) = rec_dup()
    err = Unavailable("down")

    def fail() -> None:
        raise err

    t.before[3] = fail  # the second item's read
    t.run(dedupe_steps.dedupe_key((e, w), RUN))
    assert t.notes == [
        ("duplicate_keys", "", {}),
        ("errors", "", {}),
        ("read_failed", "error", CTX | {"error": repr(err)}),
    ]
    assert len(t.calls) == 3 and t.writes() == []


def test_a_group_of_orphans_keeps_none() -> None:
    t, (e, w) = orphan_table()
    released_mapping(t, WEST)
    t.run(dedupe_steps.dedupe_key((e, w), replace(RUN, peers=frozenset({WEST}))))
    assert t.notes[1] == summary(None, [], ["us-east-1:e-1", "us-west-2:w-1"])
    assert t.counted().count("orphans_freed") == 2


# ------------------------------------------------------------------- release_one
def test_release_one_reports_an_item_of_a_region_without_an_endpoint() -> None:
    t, (_e, w) = rec_dup()
    hint = "run ras-dedupe --region us-west-2 against that region's table"
    for it, acquired in (
        (w, fmt_time(NOW - 2 * HOUR)),
        (replace(w, lease_acquired_us=None), fmt_time(0)),
    ):
        t.notes.clear()
        assert t.run(dedupe_steps.release_one(it, "orphan", RUN, tuple(CTX.items()))) is None
        assert t.notes == [
            ("foreign_reported", "", {}),
            (
                "foreign_duplicate",
                "warning",
                ictx(w, kind="orphan", lease_acquired=acquired, hint=hint),
            ),
        ]
    assert t.calls == []


def test_release_one_dry_run_lost_race_lease_and_error() -> None:
    c = tuple(CTX.items())
    t, (e, _w) = rec_dup()
    assert t.run(dedupe_steps.release_one(e, "extra", replace(RUN, dry_run=True), c)) is None
    assert t.calls == []
    assert t.notes == [("would_release", "", {}), ("would_release", "info", ictx(e, kind="extra"))]
    # a lease examined as an orphan is one now: left alone; an extra whose mapping's
    # release loses (its first write, after the mapping read): a lost race too
    for kind, got in (("orphan", "lease"), ("extra", "lost_race")):
        t.notes.clear()
        if kind == "extra":
            t.results[len(t.calls) + 2] = WriteResult(Outcome.REJECTED)
        assert t.run(dedupe_steps.release_one(e, kind, RUN, c)) == got
        assert t.notes == [("lost_races", "", {}), ("lost_race", "info", ictx(e, kind=kind))]
    t.notes.clear()
    t.results[len(t.calls) + 2] = WriteResult(Outcome.UNKNOWN)
    assert t.run(dedupe_steps.release_one(e, "extra", RUN, c)) is None
    exc: RasdError = Unavailable("write outcome unknown")
    assert t.notes == [("errors", "", {}), ("release_failed", "error", ictx(e, error=repr(exc)))]
    assert t.res("e-1").key == "k1"
