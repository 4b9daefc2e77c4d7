"""The protocol checker's model of a conditional write (``rasd.core.writes.apply``) agrees with a
real DynamoDB-compatible server (moto over HTTP) on every write the protocol makes, in every state
the protocol can meet, including missing attributes and string-ordered times. If this fails,
the checker is checking a different database than the one we run on."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rasd.core import builders, decide, map_builders, serialize
from rasd.core import lease as lease_items
from rasd.core import writes as item_writes

pytestmark = pytest.mark.integration

NOW = 1_800_000_000 * lease_items.US
T = lease_items.fmt_time
IDENT = ("c", "r1")
MIDENT = ("#map#c#p#k", "us-east-1")


def resource_states() -> list[dict[str, item_writes.Value] | None]:
    free = item_writes.item_from_av(builders.new_resource_item("c", "p", "us-east-1", "r1", NOW))
    free["version"] = 4
    quarantined = {**free, "lease_available": T(NOW + 60 * lease_items.US)}
    held = {k: v for k, v in free.items() if k != "lease_available"}
    held.update(
        key="k",
        lease_expires=T(NOW + 3600 * lease_items.US),
        lease_acquired=T(NOW),
        holder="tok",
        mver=2,
        version=5,
    )
    other = {**held, "key": "k2", "holder": "t2"}
    legacy = {k: v for k, v in held.items() if k not in ("holder", "mver")}
    eu = {**free, "region": "eu-west-1"}
    tomb = item_writes.apply(
        free, builders.tombstone(serialize.resource_from(free), NOW, NOW + 60 * lease_items.US)
    )
    assert tomb is not None and serialize.is_tombstone(tomb)
    return [None, free, quarantined, held, other, legacy, eu, tomb]


def resource_writes() -> list[item_writes.Write]:
    free = lease_items.ResourceItem("c", "r1", "p", "us-east-1", "x", 4, lease_available=T(NOW))
    held = lease_items.ResourceItem(
        "c", "r1", "p", "us-east-1", "x", 5, "k", NOW + 3600 * lease_items.US, None, NOW, "tok", 2
    )
    lease = decide.lease_from_item(held)
    return [
        builders.claim(free, "k", NOW + 3600 * lease_items.US, NOW, "tok", 1),
        builders.claim(free, "k", NOW + 3600 * lease_items.US, NOW + 61 * lease_items.US, "tok", 1),
        builders.fence_resource(IDENT, 4),
        builders.fence_resource(IDENT, 5),
        builders.free_claim(IDENT, "k", "tok", NOW, NOW + 60 * lease_items.US),
        builders.extend_resource(lease, NOW + 7200 * lease_items.US),
        builders.extend_resource(lease, NOW + 60 * lease_items.US),
        builders.liberate(held, NOW + 7200 * lease_items.US),
        builders.free_orphan(held, NOW, NOW + 60 * lease_items.US),
        builders.move(free, "eu-west-1"),
        builders.tombstone(free, NOW, NOW + 60 * lease_items.US),
        builders.tombstone(held, NOW, NOW + 3600 * lease_items.US),
        builders.readd(IDENT, 5, T(NOW + 60 * lease_items.US), "p", "us-east-1", NOW),
        builders.readd(IDENT, 4, T(NOW + 60 * lease_items.US), "p", "us-east-1", NOW),
    ]


def mapping_states() -> list[dict[str, item_writes.Value] | None]:
    pending = item_writes.apply(
        None, map_builders.map_acquire(MIDENT, 0, "tok", "r1", 4, NOW + lease_items.US, NOW, "h")
    )
    assert pending is not None
    live = {**pending, "state": lease_items.LIVE, "ver": 2}
    free = item_writes.apply(live, map_builders.map_release(MIDENT, "tok", NOW))
    lapsed = {**live, "exp": T(NOW - 3600 * lease_items.US)}
    return [None, pending, live, free, lapsed]


def mapping_writes() -> list[item_writes.Write]:
    m = serialize.mapping_from(mapping_states()[1])  # type: ignore[arg-type]
    lease = decide.lease_from_mapping(m)
    return [
        map_builders.map_acquire(MIDENT, 0, "t2", "r2", 1, NOW + lease_items.US, NOW, "h"),
        map_builders.map_acquire(MIDENT, 1, "t2", "r2", 1, NOW + lease_items.US, NOW, "h"),
        map_builders.map_acquire(MIDENT, 2, "t2", "r2", 1, NOW + lease_items.US, NOW, "h"),
        map_builders.map_confirm(m),
        map_builders.map_extend(lease, NOW + 7200 * lease_items.US),
        map_builders.map_extend(lease, NOW),
        map_builders.map_release(MIDENT, "tok", NOW),
        map_builders.map_release(MIDENT, "other", NOW),
        map_builders.map_release(
            MIDENT, "tok", NOW, ver=1
        ),  # ras-dedupe's: at the version it checked
        map_builders.map_release(MIDENT, "tok", NOW, ver=2),
        map_builders.map_fence(MIDENT, 0, NOW),
        map_builders.map_fence(MIDENT, 1, NOW),
        map_builders.map_drop_dead(m, NOW),
        # at, just before and long after the live mapping's end (NOW + 1 s)
        *[
            map_builders.map_acquire_unheld(MIDENT, by, "t2", "r2", 1, NOW + 9, NOW, "h")
            for by in (NOW + lease_items.US, NOW + lease_items.US - 1, NOW)
        ],
    ]


def put(
    ddb: Any, table: str, key: item_writes.ItemKey, item: dict[str, item_writes.Value] | None
) -> None:
    ddb.delete_item(TableName=table, Key=item_writes.key_av(key))
    if item is not None:
        ddb.put_item(TableName=table, Item={k: item_writes.to_av(v) for k, v in item.items()})


def get(ddb: Any, table: str, key: item_writes.ItemKey) -> dict[str, item_writes.Value] | None:
    raw = ddb.get_item(TableName=table, Key=item_writes.key_av(key), ConsistentRead=True).get(
        "Item"
    )
    return item_writes.item_from_av(raw) if raw else None


@pytest.mark.parametrize(
    ("key", "states", "writes"),
    [(IDENT, resource_states, resource_writes), (MIDENT, mapping_states, mapping_writes)],
    ids=["resource", "mapping"],
)
def test_apply_agrees_with_the_server(
    ddb: Any, table: str, key: item_writes.ItemKey, states: Any, writes: Any
) -> None:
    checked = 0
    for state, w in itertools.product(states(), writes()):
        put(ddb, table, key, state)
        expected = item_writes.apply(state, w)
        try:
            ddb.update_item(TableName=table, **item_writes.render(w))
            applied = True
        except ddb.exceptions.ConditionalCheckFailedException:
            applied = False
        assert applied == (expected is not None), (w.kind, state)
        assert get(ddb, table, key) == (expected if applied else state), (w.kind, state)
        checked += 1
    assert checked == len(states()) * len(writes())
