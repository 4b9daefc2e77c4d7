"""The jobs' release, repair and delete programs (``rasd.steps.repair``, ``rasd.steps.admin``)
run by the jobs' driver (``rasd_jobs.leases``), and dedupe's decisions, on an in-memory
table.

The writes are the real ``rasd.core.writes.Write`` values the jobs build, applied with
``rasd.core.writes.apply`` (the checker's semantics, compared with moto's in
tests/integration/test_writes_model.py); only their rendering for boto3 is replaced, so each
test sees which writes were made, in which order, and what the table holds after them. Time
is passed in. The integration tests run the same functions against moto over HTTP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from rasd.config import Config
from rasd.core.lease import FREE, LIVE, PENDING, US, Mapping, ResourceItem, fmt_time, map_pk
from rasd.core.serialize import mapping_from, resource_from
from rasd.core.verdicts import outlasts, served_end
from rasd.core.writes import Cond, ItemKey, Value, Write, apply, from_av, to_av
from rasd.steps import Program, Send, Together, WriteResult
from rasd.steps import admin as admin_steps
from rasd.steps import repair as repair_steps
from rasd_jobs import leases

C, P, K, REGION = "c", "p", "k1", "r1"
NOW = 1_000 * US
Q = 5 * US  # quarantine
GRACE = 2 * US
MAP_ID = (map_pk(C, P, K), REGION)
RES_ID = (C, "ra")
SKEW_US = int(Config().max_clock_skew * US)  # the grace of an orphan's hold by default


class Table:
    """A DynamoDB client holding plain-dict items: get_item and update_item only."""

    def __init__(self, *items: dict[str, Value]) -> None:
        self.items = {(str(i["client_id"]), str(i["resource"])): dict(i) for i in items}
        self.writes: list[str] = []
        self.before_write: dict[str, dict[str, Value]] = {}  # kind -> attrs set just before
        self.after_write: dict[str, Callable[[dict[ItemKey, Any]], object]] = {}

    def get_item(self, *, TableName: str, Key: dict[str, Any], ConsistentRead: bool) -> Any:
        assert TableName == "t" and ConsistentRead is True
        ident = (str(from_av(Key["client_id"])), str(from_av(Key["resource"])))
        item = self.items.get(ident)
        return {"Item": {k: to_av(v) for k, v in item.items()}} if item else {}

    def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
        assert TableName == "t"
        w = Write
        if w.kind in self.before_write:  # someone else writes the item first
            self.items[w.key].update(self.before_write.pop(w.kind))
        self.writes.append(w.kind)
        new = apply(self.items.get(w.key), w)
        if new is None:
            raise ClientError(
                {"Error": {"Code": "ConditionalCheckFailedException", "Message": ""}},
                "UpdateItem",
            )
        self.items[w.key] = new
        if w.kind in self.after_write:
            self.after_write.pop(w.kind)(self.items)
        return {}

    def resource(self) -> ResourceItem:
        return resource_from(self.items[RES_ID])

    def mapping(self) -> Mapping:
        return mapping_from(self.items[MAP_ID])


@pytest.fixture(autouse=True)
def _writes_as_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "render", lambda w: {"Write": w})


def held(exp_s: int = 1_010, mver: int = 1, version: int = 3, **kw: Value) -> dict[str, Value]:
    item: dict[str, Value] = {
        "client_id": C,
        "resource": "ra",
        "pool_id": P,
        "region": REGION,
        "partition": "part",
        "version": version,
        "key": K,
        "lease_expires": fmt_time(exp_s * US),
        "lease_acquired": fmt_time(990 * US),
        "holder": "t1",
        "mver": mver,
        "hver": version,
    }
    item.update(kw)
    return item


def mapping(ver: int = 2, exp_s: int = 1_010, **kw: Value) -> dict[str, Value]:
    item: dict[str, Value] = {
        "client_id": MAP_ID[0],
        "resource": REGION,
        "ver": ver,
        "state": LIVE,
        "token": "t1",
        "res": "ra",
        "rver": 2,
        "exp": fmt_time(exp_s * US),
        "since": fmt_time(990 * US),
    }
    item.update(kw)
    return item


def release_held(t: Table, r: ResourceItem, **kw: Any) -> str:
    """``release_held`` run by the jobs' driver; ``hold_to_end_grace_us``: held to the
    lease's end plus that grace (else an orphan's hold uses the clock-skew bound)."""
    g = kw.pop("hold_to_end_grace_us", None)
    prog = repair_steps.release_held(
        r, NOW, Q, SKEW_US if g is None else g, hold_to_end=g is not None, **kw
    )
    return str(leases.run(t, "t", prog))


def release(t: Table, **kw: Any) -> str:
    return release_held(t, t.resource(), **kw)


# ------------------------------------------------------------------------- release_held
def test_release_frees_the_mapping_then_the_resource_with_quarantine() -> None:
    t = Table(held(), mapping())
    assert release(t) == "released"
    assert t.writes == ["map_release", "free_claim"]
    m, r = t.mapping(), t.resource()
    assert (m.state, m.token, m.resource, m.ver) == (FREE, None, None, 3)
    assert r.key is None and r.holder is None and r.version == 4
    assert r.quarantine_until == fmt_time(NOW + Q) and r.lease_available is None


def test_release_lost_to_a_mapping_write_frees_nothing() -> None:
    t = Table(held(), mapping())
    t.before_write["map_release"] = {"token": "t2"}  # another acquisition won the key
    assert release(t) == "lost_race"
    assert t.writes == ["map_release"]
    assert t.resource().holder == "t1"


def test_release_holds_to_the_end_the_resource_shows_now() -> None:
    """ras-dedupe: apps may use the lease to its end; a daemon extended the resource after
    ``r`` was read, so the later end (read again after the mapping's release) counts."""
    t = Table(held(exp_s=1_010), mapping(exp_s=1_010))
    r = t.resource()
    t.before_write["map_release"] = {}
    t.items[RES_ID]["lease_expires"] = fmt_time(1_020 * US)  # extended after r was read
    assert release_held(t, r, hold_to_end_grace_us=GRACE) == "released"
    assert t.resource().quarantine_until == fmt_time(1_020 * US + GRACE)


def test_release_holds_to_the_end_read_before_when_the_item_is_gone() -> None:
    t = Table(held(exp_s=1_010), mapping(exp_s=1_010))
    r = t.resource()
    assert release_held(t, r, hold_to_end_grace_us=GRACE) == "released"
    assert t.resource().quarantine_until == fmt_time(1_010 * US + GRACE)
    # deleted between the two writes: the end read before still bounds the free
    t = Table(held(exp_s=1_010), mapping(exp_s=1_010))
    t.after_write["map_release"] = lambda items: items.pop(RES_ID)
    assert release_held(t, r, hold_to_end_grace_us=GRACE) == "released"
    assert t.writes == ["map_release", "free_claim"]
    # the quarantine when it is later than the lease's end plus grace
    t = Table(held(exp_s=1_001), mapping(exp_s=1_001))
    assert release(t, hold_to_end_grace_us=GRACE) == "released"
    assert t.resource().quarantine_until == fmt_time(NOW + Q)


def test_release_by_an_end_keeps_a_lease_that_runs_later() -> None:
    for exp_s, end_s, want in [(1_010, 1_009, "kept"), (1_010, 1_010, "released")]:
        t = Table(held(exp_s=exp_s), mapping(exp_s=exp_s))
        assert release(t, end_by_us=end_s * US) == want, (exp_s, end_s)
        assert t.writes == ([] if want == "kept" else ["map_release", "free_claim"])
    # the mapping's end counts too (extended there, the item read before)
    t = Table(held(exp_s=1_010), mapping(exp_s=1_011))
    assert release(t, end_by_us=1_010 * US) == "kept"
    # no end known on either: kept
    t = Table(held(), mapping())
    r = t.resource()
    t.items[MAP_ID].pop("exp")
    no_end = dataclasses.replace(r, lease_expires_us=None)
    assert release_held(t, no_end, end_by_us=2_000 * US) == "kept"


def test_release_by_an_end_is_conditional_on_the_version_it_read() -> None:
    t = Table(held(), mapping(ver=2))
    t.before_write["map_release"] = {"ver": 3}  # a daemon extended the mapping meanwhile
    assert release(t, end_by_us=1_010 * US) == "lost_race"
    t = Table(held(), mapping(ver=2))
    t.before_write["map_release"] = {"ver": 3}  # without end_by, the token alone decides
    assert release(t) == "released"


def test_release_of_an_orphan_repairs_it() -> None:
    """A mapping that names another acquisition at the claim's version: never named, so
    freed with the quarantine only, whatever the grace."""
    t = Table(held(mver=2), mapping(ver=2, token="t2"))
    assert release(t) == "freed_orphan"
    assert t.writes == ["free_orphan"]
    assert t.resource().quarantine_until == fmt_time(NOW + Q)
    # named once (the mapping moved past the claim's version): held to its end + grace,
    # the clock-skew bound when no grace is given
    assert SKEW_US != 7 * US
    for kw, grace in [({}, SKEW_US), ({"hold_to_end_grace_us": 7 * US}, 7 * US)]:
        t = Table(held(mver=1, exp_s=1_010), mapping(ver=3, state=FREE))
        assert release(t, **kw) == "freed_orphan"
        assert t.resource().quarantine_until == fmt_time(1_010 * US + grace)


def test_release_of_a_mapping_reaped_by_ttl_repairs_the_item() -> None:
    t = Table(held(mver=2, exp_s=1_010))
    assert release(t, hold_to_end_grace_us=GRACE) == "freed_orphan"
    assert t.writes == ["free_orphan"]
    assert t.resource().quarantine_until == fmt_time(1_010 * US + GRACE)


def test_release_wants_a_held_item() -> None:
    t = Table(held(), mapping())
    r = t.resource()
    for bad in (dataclasses.replace(r, key=None), dataclasses.replace(r, holder=None)):
        with pytest.raises(AssertionError):
            release_held(t, bad)
    assert t.writes == []


# ------------------------------------------------------------------------------- repair
def repair(t: Table, m: Mapping | None, **kw: Any) -> str:
    return str(leases.run(t, "t", repair_steps.repair(t.resource(), m, NOW, Q, GRACE, **kw)))


def test_repair_leaves_a_lease_and_a_foreign_item_alone() -> None:
    t = Table(held(), mapping())
    assert repair(t, t.mapping()) == "lease"
    t = Table(held(hver=1), mapping(token="t9"))  # the paper's agent wrote it since
    assert repair(t, t.mapping()) == "lease"
    assert t.writes == []


def test_repair_fences_a_mapping_write_that_may_still_land() -> None:
    t = Table(held(mver=3), mapping(ver=2, token="t0", state=FREE))
    assert repair(t, t.mapping()) == "freed_orphan"
    assert t.writes == ["map_fence", "free_orphan"]
    assert t.mapping().ver == 3
    assert t.resource().quarantine_until == fmt_time(NOW + Q)  # never named
    # no mapping at all, the claim's write (version 1) not landed: created free at 1
    t = Table(held(mver=1))
    assert repair(t, None) == "freed_orphan"
    assert t.writes == ["map_fence", "free_orphan"]
    assert (t.mapping().ver, t.mapping().state) == (1, FREE)


def test_repair_stops_when_the_fence_or_the_free_loses() -> None:
    t = Table(held(mver=3), mapping(ver=2, token="t0", state=FREE))
    t.before_write["map_fence"] = {"ver": 3, "token": "t1", "res": "ra", "state": PENDING}
    assert repair(t, t.mapping()) == "lost_race"
    assert t.writes == ["map_fence"]
    assert t.resource().holder == "t1"
    t = Table(held(mver=1), mapping(ver=3, state=FREE))
    t.before_write["free_orphan"] = {"version": 9}
    assert repair(t, t.mapping()) == "lost_race"


def test_repair_without_a_fence_holds_a_named_orphan_to_its_end() -> None:
    t = Table(held(mver=1, exp_s=1_010), mapping(ver=3, state=FREE))
    assert repair(t, t.mapping()) == "freed_orphan"
    assert t.writes == ["free_orphan"]
    assert t.resource().quarantine_until == fmt_time(1_010 * US + GRACE)


def test_repair_hold_to_end_holds_even_a_never_named_claim() -> None:
    t = Table(held(mver=2, exp_s=1_010), mapping(ver=2, token="t2"))
    assert repair(t, t.mapping(), hold_to_end=True) == "freed_orphan"
    assert t.resource().quarantine_until == fmt_time(1_010 * US + GRACE)
    t = Table(held(mver=2, exp_s=1_001), mapping(ver=2, token="t2"))
    assert repair(t, t.mapping(), hold_to_end=True) == "freed_orphan"
    assert t.resource().quarantine_until == fmt_time(NOW + Q)


# ------------------------------------------------------------------------------- delete
def delete(t: Table, force: bool = False) -> bool:
    return leases.run(t, "t", admin_steps.delete_item(RES_ID, NOW, force, Q, GRACE))


def free(**kw: Value) -> dict[str, Value]:
    item: dict[str, Value] = {
        "client_id": C,
        "resource": "ra",
        "pool_id": P,
        "region": REGION,
        "partition": "part",
        "version": 3,
        "lease_available": fmt_time(900 * US),
    }
    item.update(kw)
    return item


def test_delete_of_a_free_resource_leaves_a_tombstone() -> None:
    t = Table(free())
    assert delete(t)
    assert t.writes == ["tombstone"]
    stone = t.items[RES_ID]
    assert "pool_id" not in stone and stone["hold_until"] == fmt_time(NOW)
    assert delete(t) and t.writes == ["tombstone"]  # a tombstone: done, no write
    assert delete(Table())  # no item: done


def test_delete_refuses_a_running_lease_or_a_quarantine_without_force() -> None:
    t = Table(held(exp_s=1_010), mapping())
    assert not delete(t)
    t = Table(free(lease_available=fmt_time(NOW + US)))
    assert not delete(t)
    t = Table(free(quarantine_until=fmt_time(NOW + US)).copy())
    t.items[RES_ID].pop("lease_available")
    assert not delete(t)
    assert t.writes == []


def test_delete_of_an_ended_lease_releases_its_mapping_first() -> None:
    t = Table(held(exp_s=1_000), mapping(exp_s=1_000))
    assert delete(t)
    assert t.writes == ["map_release", "tombstone"]
    assert t.mapping().state == FREE
    assert t.items[RES_ID]["hold_until"] == fmt_time(NOW + Q)


def test_delete_with_force_holds_the_name_to_the_leases_end() -> None:
    t = Table(held(exp_s=1_010), mapping())
    assert delete(t, force=True)
    assert t.writes == ["map_release", "tombstone"]
    assert t.items[RES_ID]["hold_until"] == fmt_time(1_010 * US + GRACE)
    t = Table(free(lease_available=fmt_time(NOW + 9 * US)))
    assert delete(t, force=True)
    assert t.items[RES_ID]["hold_until"] == fmt_time(NOW + 9 * US)


def test_delete_rereads_when_the_item_changes_and_gives_up_after_five() -> None:
    class Busy(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            self.items[RES_ID]["version"] = int(self.items[RES_ID]["version"]) + 1
            return super().update_item(TableName=TableName, Write=Write)

    t = Busy(free())
    assert not delete(t)
    assert t.writes == ["tombstone"] * 5
    t = Table(free())
    t.before_write["tombstone"] = {"version": 4}  # one change, then it applies
    assert delete(t)
    assert t.writes == ["tombstone", "tombstone"]


def test_the_driver_tells_applied_from_a_lost_race_from_unknown() -> None:
    w = Write(RES_ID, (), set=(("x", 1),))

    def send(write: Write) -> Program[WriteResult]:
        return (yield Send(write))  # type: ignore[no-any-return]

    t = Table(free())
    assert leases.run(t, "t", send(w)).outcome.value == "applied"
    assert t.items[RES_ID]["x"] == 1
    lost = Write(RES_ID, (Cond("version", "=", 99),), set=(("x", 2),))
    assert leases.run(t, "t", send(lost)).outcome.value == "rejected"

    class Down(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            raise ClientError({"Error": {"Code": "InternalServerError"}}, "UpdateItem")

    res = leases.run(Down(free()), "t", send(w))
    assert res.outcome.value == "unknown" and res.error is not None


def _send(write: Write, readback: Any = None) -> Program[WriteResult]:
    return (yield Send(write, readback))  # type: ignore[no-any-return]


def test_the_driver_says_rejected_when_no_attempt_can_have_applied() -> None:
    """As the daemon's store: a write DynamoDB refused outright (validation, access) or one
    that never left (connection refused) did not apply: REJECTED, with the error."""
    w = Write(RES_ID, (), set=(("x", 1),))

    class Refused(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            raise ClientError({"Error": {"Code": "ValidationException"}}, "UpdateItem")

    class Unreachable(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            raise EndpointConnectionError(
                endpoint_url="http://x", error=ConnectionRefusedError("refused")
            )

    for table in (Refused(free()), Unreachable(free())):
        res = leases.run(table, "t", _send(w))
        assert res.outcome.value == "rejected" and res.error is not None, table


def test_a_lost_race_after_an_attempt_that_may_have_applied_is_read_back() -> None:
    """botocore retries inside a call: when an attempt may have applied (a 500) and the
    retry loses its condition, our own first attempt may be why. With a read-back the
    driver reads the item; without one the outcome is UNKNOWN, never REJECTED."""
    w = Write(RES_ID, (Cond("version", "=", 3),), set=(("x", 1), ("version", 4)))

    class LandedThenLost(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            super().update_item(TableName=TableName, Write=Write)  # applied ...
            leases._attempt(response=(_Http(500), {"Error": {"Code": "InternalServerError"}}))
            return super().update_item(TableName=TableName, Write=Write)  # ... retry lost

    ours = leases.run(LandedThenLost(free()), "t", _send(w, lambda it: it.get("x") == 1))
    assert ours.outcome.value == "applied"
    theirs = leases.run(LandedThenLost(free()), "t", _send(w, lambda it: it.get("x") == 2))
    assert theirs.outcome.value == "rejected" and theirs.error is None
    blind = leases.run(LandedThenLost(free()), "t", _send(w))
    assert blind.outcome.value == "unknown" and blind.error is not None


class _Http:
    def __init__(self, status: int) -> None:
        self.status_code = status


def test_together_sends_its_calls_at_once() -> None:
    """As the daemon does: the second call goes out before the first is answered."""
    import threading

    both = threading.Barrier(2, timeout=5)

    class Meeting(Table):
        def update_item(self, *, TableName: str, Write: Write, **_: Any) -> Any:
            both.wait()  # breaks (and fails the test) unless both calls are under way
            return super().update_item(TableName=TableName, Write=Write)

    a = Write(RES_ID, (), set=(("x", 1),))
    b = Write(RES_ID, (), set=(("y", 2),))

    def prog() -> Program[Any]:
        return (yield Together((Send(a), Send(b))))

    res = leases.run(Meeting(free()), "t", prog())
    assert [r.outcome.value for r in res] == ["applied", "applied"]


# ---------------------------------------------------------------- dedupe's decisions
def _item(exp_s: int | None, holder: str = "t1", resource: str = "ra") -> ResourceItem:
    return ResourceItem(
        client_id=C,
        resource=resource,
        pool_id=P,
        region=REGION,
        partition="part",
        version=3,
        key=K,
        lease_expires_us=None if exp_s is None else exp_s * US,
        holder=holder,
    )


def test_outlasts_needs_the_margin_past_the_extras_end() -> None:
    keep, margin = _item(1_012), 2 * US
    assert outlasts(keep, _item(1_010), margin)  # exactly the margin
    assert not outlasts(keep, _item(1_011), margin)
    assert not outlasts(_item(None), _item(1_000), margin)
    assert not outlasts(keep, _item(None), margin)


def test_served_end_is_the_earlier_end_of_a_live_mapping_naming_the_survivor() -> None:
    keep = _item(1_012)
    m = mapping_from(mapping(exp_s=1_011))
    assert served_end(keep, m) == 1_011 * US
    assert served_end(_item(1_010), m) == 1_010 * US
    assert served_end(keep, None) is None
    assert served_end(keep, mapping_from(mapping(state=PENDING))) is None
    assert served_end(keep, mapping_from(mapping(token="t2"))) is None
    assert served_end(keep, mapping_from(mapping(res="rb"))) is None
    no_exp = mapping(exp_s=1_011)
    no_exp.pop("exp")
    assert served_end(keep, mapping_from(no_exp)) == 1_012 * US
    assert served_end(_item(None), mapping_from(no_exp)) is None
