"""Every write builder of rasd.core.builders and .map_builders, written out in full, the rules of
rasd.core.decide next to them, and rasd.core.writes' rendering for DynamoDB.

The protocol checker runs the builders the daemon and ras-dedupe use; the ones only the
operator's tools and the balancer send (``adopt``, ``move``, ``tombstone``, ``readd``,
``map_drop_dead``) run in integration tests only. Here each write is compared with its
literal form (conditions, attributes set, removed, incremented, its ``kind`` for logs and
traces) and applied to items with ``rasd.core.writes.apply``, so a change to any part of it is
seen in milliseconds. Time is passed in.
"""

from __future__ import annotations

import pytest

from rasd.core import legacy, verdicts
from rasd.core import writes as item_writes
from rasd.core.builders import (
    adopt,
    claim,
    extend_resource,
    fence_resource,
    free_orphan,
    liberate,
    move,
    paper_claim,
    paper_free,
    readd,
    relist,
    tombstone,
)
from rasd.core.decide import check_expiry, lease_from_item, pick_mapping
from rasd.core.lease import (
    FREE,
    LIVE,
    PENDING,
    US,
    Lease,
    Mapping,
    ResourceItem,
    fmt_time,
    map_pk,
    partition_name,
    partition_of,
)
from rasd.core.map_builders import map_drop_dead, map_extend, map_fence, map_release
from rasd.core.serialize import is_tombstone
from rasd.core.writes import Cond, Write, apply, from_av, render_plain, to_av

NOW = 1_000 * US


def _held(**kw: object) -> ResourceItem:
    base: dict[str, object] = {
        "client_id": "c",
        "resource": "ra",
        "pool_id": "p",
        "region": "r1",
        "partition": "part",
        "version": 7,
        "key": "k1",
        "lease_expires_us": 1_010 * US,
        "lease_acquired_us": 990 * US,
        "holder": "t1",
        "mver": 2,
        "hver": 7,
    }
    base.update(kw)
    return ResourceItem(**base)  # type: ignore[arg-type]


def _free(**kw: object) -> ResourceItem:
    free: dict[str, object] = {
        "key": None,
        "lease_expires_us": None,
        "lease_acquired_us": None,
        "holder": None,
        "hver": None,
        "lease_available": fmt_time(900 * US),
    }
    return _held(**{**free, **kw})


def test_adopt_in_full() -> None:
    w = adopt(_held(holder=None, hver=None), "t9", 4, NOW)
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("version", "=", 7),
            Cond("key", "=", "k1"),
            Cond("lease_expires", "=", fmt_time(1_010 * US)),
            Cond("region", "=", "r1"),
        ),
        set=(
            ("lease_acquired", fmt_time(NOW)),
            ("holder", "t9"),
            ("mver", 4),
            ("hver", 8),
            ("version", 8),
        ),
    )
    assert w.kind == "adopt"
    with pytest.raises(AssertionError):
        adopt(_held(lease_expires_us=None), "t9", 4, NOW)


def test_move_in_full_and_never_a_held_item() -> None:
    w = move(_free(), "r2")
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("version", "=", 7),
            Cond("region", "=", "r1"),
            Cond("lease_available", "exists"),
            Cond("key", "not_exists"),
        ),
        set=(
            ("region", "r2"),
            ("partition", partition_name("c", "p", "r2", partition_of("ra"))),
            ("version", 8),
        ),
    )
    assert w.kind == "move"
    item = {"client_id": "c", "resource": "ra", "version": 7, "region": "r1"}
    assert apply({**item, "lease_available": "x"}, w) is not None
    assert apply({**item, "quarantine_until": "x"}, w) is None  # quarantined: stays
    assert apply({**item, "lease_available": "x", "key": "k1"}, w) is None


def test_map_drop_dead_in_full() -> None:
    m = Mapping("c", "p", "k1", "r1", ver=3, state=PENDING, token="t1", resource="ra")
    w = map_drop_dead(m, NOW)
    assert w == Write(
        key=(map_pk("c", "p", "k1"), "r1"),
        conds=(Cond("ver", "=", 3),),
        set=(("state", FREE), ("ver", 4), ("ttl", NOW // US + 24 * 3600)),
        remove=("token", "res", "rver", "exp", "owner"),
    )
    assert w.kind == "map_drop_dead"


def test_liberate_in_full() -> None:
    w = liberate(_held(), NOW)
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("version", "=", 7),
            Cond("lease_expires", "=", fmt_time(1_010 * US)),
            Cond("region", "=", "r1"),
        ),
        set=(("lease_available", fmt_time(NOW)), ("version", 8)),
        remove=("key", "lease_expires", "lease_acquired", "holder", "mver", "hver"),
    )
    assert w.kind == "liberate"
    with pytest.raises(AssertionError):
        liberate(_held(lease_expires_us=None), NOW)


def test_tombstone_and_readd_in_full() -> None:
    w = tombstone(_held(), NOW, 1_020 * US)
    assert w == Write(
        key=("c", "ra"),
        conds=(Cond("version", "=", 7),),
        set=(
            ("hold_until", fmt_time(1_020 * US)),
            ("deleted", fmt_time(NOW)),
            ("ttl", 1_020 + 24 * 3600),
            ("version", 8),
        ),
        remove=(
            "pool_id",
            "region",
            "partition",
            "lease_available",
            "quarantine_until",
            "key",
            "lease_expires",
            "lease_acquired",
            "holder",
            "mver",
            "hver",
        ),
    )
    assert w.kind == "tombstone"
    r = readd(("c", "ra"), 8, fmt_time(1_020 * US), "p", "r2", NOW)
    assert r == Write(
        key=("c", "ra"),
        conds=(Cond("version", "=", 8), Cond("hold_until", "exists")),
        set=(
            ("pool_id", "p"),
            ("region", "r2"),
            ("partition", partition_name("c", "p", "r2", partition_of("ra"))),
            ("quarantine_until", fmt_time(1_020 * US)),
            ("version", 9),
        ),
        remove=("hold_until", "deleted", "ttl"),
    )
    assert r.kind == "readd"
    # a hold that has run out: claimable at once
    late = readd(("c", "ra"), 8, fmt_time(900 * US), "p", "r2", NOW)
    assert ("lease_available", fmt_time(NOW)) in late.set
    stone = apply({"client_id": "c", "resource": "ra", "version": 7, "key": "k1"}, w)
    assert stone == {
        "client_id": "c",
        "resource": "ra",
        "version": 8,
        "hold_until": fmt_time(1_020 * US),
        "deleted": fmt_time(NOW),
        "ttl": 1_020 + 24 * 3600,
    }
    back = apply(stone, r)
    assert back is not None and back["quarantine_until"] == fmt_time(1_020 * US)
    assert "hold_until" not in back and "ttl" not in back
    assert apply({**stone, "version": 9}, r) is None  # written since it was read
    assert apply({"client_id": "c", "resource": "ra", "version": 8}, r) is None  # no tombstone


def test_lease_from_item_in_full() -> None:
    assert lease_from_item(_held()) == Lease(
        client_id="c",
        pool_id="p",
        key="k1",
        resource="ra",
        region="r1",
        expires_us=1_010 * US,
        version=7,
        acquired_us=990 * US,
        token="t1",
    )
    assert lease_from_item(_held(lease_acquired_us=None)).acquired_us == 0
    with pytest.raises(AssertionError):
        lease_from_item(_held(lease_expires_us=None))


def test_check_expiry_says_why() -> None:
    assert check_expiry(NOW, NOW, 60 * US) == "lease_expires is in the past"
    assert check_expiry(NOW + 61 * US, NOW, 60 * US) == (
        "lease_expires is beyond the pool's maximum lease of 60s"
    )
    assert check_expiry(NOW + 60 * US, NOW, 60 * US) is None


def test_pick_mapping_breaks_ties_by_region_then_resource() -> None:
    def m(region: str, resource: str | None, since: int = 5) -> Mapping:
        return Mapping("c", "p", "k1", region, 1, LIVE, "t", resource, since_us=since)

    assert pick_mapping([]) is None
    a, b = m("r1", "rb"), m("r1", "ra")
    assert pick_mapping([a, b]) is b
    none, upper = m("r1", None), m("r1", "A")
    assert pick_mapping([upper, none]) is none
    assert pick_mapping([m("r2", "ra"), m("r1", "rb")]).region == "r1"  # type: ignore[union-attr]
    assert pick_mapping([m("r1", "ra", 6), m("r2", "rb", 5)]).since_us == 5  # type: ignore[union-attr]


def test_name_held_until_of_items_without_an_end_or_a_mark() -> None:
    q, grace = 5 * US, 2 * US
    assert verdicts.name_held_until(_held(lease_expires_us=None), NOW, q, grace) == NOW + q
    assert verdicts.name_held_until(_held(), NOW, q, grace) == 1_010 * US + grace
    assert verdicts.name_held_until(_free(lease_available=None), NOW, q, grace) == NOW


def test_from_av_names_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match=r"^unsupported attribute value"):
        from_av({"B": b"x"})


def test_is_tombstone_in_either_form() -> None:
    assert is_tombstone({"hold_until": "x"})
    assert is_tombstone({"hold_until": {"S": "x"}, "client_id": {"S": "c"}})
    assert not is_tombstone({"hold_until": "x", "pool_id": "p"})  # re-added
    assert not is_tombstone({"pool_id": "p"})
    assert not is_tombstone({})


def test_render_plain_in_full() -> None:
    """The reference render() is compared with: its names and values, literally."""
    w = Write(
        key=("c", "r"),
        conds=(Cond("a", "not_exists"), Cond("b", "exists"), Cond("c", "<=", 3)),
        set=(("x", "y"), ("c", 4)),
        remove=("z", "w"),
        incr=("v", "u"),
    )
    assert render_plain(w) == {
        "Key": {"client_id": {"S": "c"}, "resource": {"S": "r"}},
        "ConditionExpression": (
            "attribute_not_exists(#a0) AND attribute_exists(#a1) AND #a2 <= :v0"
        ),
        "UpdateExpression": "SET #a3 = :v1, #a2 = :v2 REMOVE #a4, #a5 ADD #a6 :v3, #a7 :v3",
        "ExpressionAttributeNames": {
            "#a0": "a",
            "#a1": "b",
            "#a2": "c",
            "#a3": "x",
            "#a4": "z",
            "#a5": "w",
            "#a6": "v",
            "#a7": "u",
        },
        "ExpressionAttributeValues": {
            ":v0": {"N": "3"},
            ":v1": {"S": "y"},
            ":v2": {"N": "4"},
            ":v3": {"N": "1"},
        },
    }


def test_adoptable_needs_a_running_lease_of_this_key_pool_and_region() -> None:
    r = _held()

    def ok(item: ResourceItem | None, now_us: int = NOW) -> bool:
        return legacy.adoptable(item, "c", "p", "k1", "r1", now_us)

    assert ok(r)
    assert not ok(None)
    assert not ok(_held(key="k2"))
    assert not ok(_held(client_id="c2"))
    assert not ok(_held(pool_id="p2"))
    assert not ok(_held(region="r2"))
    assert not ok(_held(lease_expires_us=None))
    assert not ok(r, now_us=1_010 * US)  # ends now: not running
    assert ok(r, now_us=1_010 * US - 1)


def test_map_fence_in_full() -> None:
    ident = (map_pk("c", "p", "k1"), "r1")
    created = map_fence(ident, 0, NOW)
    assert created == Write(
        key=ident,
        conds=(Cond("ver", "not_exists"),),
        set=(("state", FREE), ("ver", 1), ("ttl", NOW // US + 24 * 3600)),
    )
    assert map_fence(ident, 1, NOW) == Write(
        key=ident, conds=(Cond("ver", "=", 1),), set=(("ver", 2),)
    )
    assert created.kind == map_fence(ident, 1, NOW).kind == "map_fence"


def test_relist_in_full() -> None:
    q = fmt_time(990 * US)
    w = relist(_free(lease_available=None, quarantine_until=q), NOW)
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("version", "=", 7),
            Cond("quarantine_until", "=", q),
            Cond("quarantine_until", "<=", fmt_time(NOW)),
            Cond("key", "not_exists"),
            Cond("region", "=", "r1"),
        ),
        set=(("lease_available", q), ("version", 8)),
        remove=("quarantine_until",),
    )
    assert w.kind == "relist"


def test_paper_claim_and_paper_free_in_full() -> None:
    """The paper's agent's two writes: on the version read alone; rasd's attributes stay.
    The checker's model tells the agent's claims apart by their kind."""
    w = paper_claim(_free(), "k2", 1_030 * US)
    assert w == Write(
        key=("c", "ra"),
        conds=(Cond("version", "=", 7),),
        set=(("key", "k2"), ("lease_expires", fmt_time(1_030 * US)), ("version", 8)),
        remove=("lease_available",),
    )
    assert w.kind == "paper_claim"
    item = {"client_id": "c", "resource": "ra", "version": 7, "lease_available": "x"}
    held = apply(item, w)
    assert held == {
        "client_id": "c",
        "resource": "ra",
        "version": 8,
        "key": "k2",
        "lease_expires": fmt_time(1_030 * US),
    }
    assert apply({**item, "version": 6}, w) is None
    f = paper_free(_held(version=8), NOW)
    assert f == Write(
        key=("c", "ra"),
        conds=(Cond("version", "=", 8),),
        set=(("lease_available", fmt_time(NOW)), ("version", 9)),
        remove=("key", "lease_expires"),
    )
    assert f.kind == "paper_free"
    assert apply({**held, "holder": "t1", "hver": 3}, f) == {
        "client_id": "c",
        "resource": "ra",
        "version": 9,
        "lease_available": fmt_time(NOW),
        "holder": "t1",
        "hver": 3,
    }
    assert apply({**held, "version": 9}, f) is None


def test_free_orphan_wants_a_holder_and_no_time_before_now() -> None:
    w = free_orphan(_held(), NOW, NOW)  # claimable at once
    assert ("lease_available", fmt_time(NOW)) in w.set
    with pytest.raises(AssertionError):
        free_orphan(_held(), NOW, NOW - 1)
    with pytest.raises(AssertionError):
        free_orphan(_held(holder=None), NOW, NOW + 1)


def test_to_av_of_every_kind_of_value() -> None:
    class Name(str):
        pass

    assert to_av("x") == {"S": "x"}
    assert to_av(Name("x")) == {"S": "x"}
    assert to_av(3) == {"N": "3"}
    with pytest.raises(TypeError, match=r"^booleans are not stored$"):
        to_av(True)


def test_render_makes_each_shape_once_and_bounds_its_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Write] = []
    plain = item_writes.render_plain

    def counting(w: Write) -> dict[str, object]:
        made.append(w)
        return plain(w)

    monkeypatch.setattr(item_writes, "render_plain", counting)
    monkeypatch.setattr(item_writes, "_TEMPLATES", {})
    a = Write(("c", "r"), (Cond("version", "=", 1),), set=(("x", "y"),))
    b = Write(("c", "s"), (Cond("version", "=", 2),), set=(("x", "z"),))
    assert item_writes.render(a) == plain(a) and item_writes.render(b) == plain(b)
    assert made == [a]  # b has a's shape: filled in, not made again
    for i in range(item_writes._TEMPLATES_MAX + 5):
        item_writes.render(Write(("c", "r"), (), set=((f"a{i}", 1),)))
        assert len(item_writes._TEMPLATES) <= item_writes._TEMPLATES_MAX


def test_map_extend_in_full() -> None:
    """It makes the mapping live (a pending mapping whose claim landed too close to its end
    is extended before it is served) and moves its TTL with its end: DynamoDB reaps a
    mapping by ``ttl``, which must never come before the lease's end (not in the model)."""
    lease = lease_from_item(_held())
    w = map_extend(lease, 1_020 * US)
    assert w == Write(
        key=(map_pk("c", "p", "k1"), "r1"),
        conds=(
            Cond("token", "=", "t1"),
            Cond("res", "=", "ra"),
            Cond("exp", "<", fmt_time(1_020 * US)),
        ),
        set=(("exp", fmt_time(1_020 * US)), ("state", LIVE), ("ttl", 1_020 + 24 * 3600)),
        incr=("ver",),
    )
    assert w.kind == "map_extend"


def test_extend_resource_in_full_moves_the_version() -> None:
    """An extension moves ``version`` (and ``hver`` with it): every write conditioned on the
    version read before it (a liberation, a tombstone of ``rasadmin delete-resource``, an
    orphan repair) then fails instead of ending a lease that was just made longer."""
    lease = lease_from_item(_held())
    w = extend_resource(lease, 1_020 * US)
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("holder", "=", "t1"),
            Cond("key", "=", "k1"),
            Cond("region", "=", "r1"),
            Cond("lease_expires", "<", fmt_time(1_020 * US)),
        ),
        set=(("lease_expires", fmt_time(1_020 * US)),),
        incr=("version", "hver"),
    )
    assert w.kind == "extend_resource"
    item = {
        "client_id": "c",
        "resource": "ra",
        "version": 7,
        "hver": 7,
        "holder": "t1",
        "key": "k1",
        "region": "r1",
        "lease_expires": fmt_time(1_010 * US),
    }
    stale = _held()  # read before the extension
    extended = apply(item, w)
    assert extended is not None and (extended["version"], extended["hver"]) == (8, 8)
    assert apply(extended, tombstone(stale, NOW, NOW)) is None
    assert apply(extended, liberate(stale, NOW)) is None


def test_map_release_in_full() -> None:
    ident = (map_pk("c", "p", "k1"), "r1")
    w = map_release(ident, "t1", NOW)
    assert w == Write(
        key=ident,
        conds=(Cond("token", "=", "t1"),),
        set=(("state", FREE), ("ttl", NOW // US + 24 * 3600)),
        remove=("token", "res", "rver", "exp", "owner"),
        incr=("ver",),
    )
    assert w.kind == "map_release"
    # ras-dedupe's: the token and the version its end was read at
    assert map_release(ident, "t1", NOW, 4).conds == (
        Cond("token", "=", "t1"),
        Cond("ver", "=", 4),
    )


def test_fence_resource_in_full_stops_a_claim_in_flight() -> None:
    w = fence_resource(("c", "ra"), 7)
    assert w == Write(key=("c", "ra"), conds=(Cond("version", "=", 7),), set=(("version", 8),))
    assert w.kind == "fence_resource"
    free = {
        "client_id": "c",
        "resource": "ra",
        "version": 7,
        "region": "r1",
        "lease_available": fmt_time(900 * US),
    }
    in_flight = claim(_free(), "k1", 1_010 * US, NOW, "t1", 1)  # conditioned on version 7
    assert apply(free, in_flight) is not None
    fenced = apply(free, w)
    assert fenced is not None and apply(fenced, in_flight) is None
