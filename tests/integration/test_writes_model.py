"""The protocol checker's model of a conditional write (``rasd.core.writes.apply``) agrees with a
real DynamoDB-compatible server (moto over HTTP) on every write the protocol makes, in every state
the protocol can meet, including missing attributes and string-ordered times. If this fails,
the checker is checking a different database than the one we run on."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rasd.core import builders as B
from rasd.core import decide as D
from rasd.core import lease as L
from rasd.core import map_builders as MB
from rasd.core import serialize as S
from rasd.core import writes as W

pytestmark = pytest.mark.integration

NOW = 1_800_000_000 * L.US
T = L.fmt_time
IDENT = ("c", "r1")
MIDENT = ("#map#c#p#k", "us-east-1")


def resource_states() -> list[dict[str, W.Value] | None]:
    free = W.item_from_av(B.new_resource_item("c", "p", "us-east-1", "r1", NOW))
    free["version"] = 4
    quarantined = {**free, "lease_available": T(NOW + 60 * L.US)}
    held = {k: v for k, v in free.items() if k != "lease_available"}
    held.update(
        key="k",
        lease_expires=T(NOW + 3600 * L.US),
        lease_acquired=T(NOW),
        holder="tok",
        mver=2,
        version=5,
    )
    other = {**held, "key": "k2", "holder": "t2"}
    legacy = {k: v for k, v in held.items() if k not in ("holder", "mver")}
    eu = {**free, "region": "eu-west-1"}
    tomb = W.apply(free, B.tombstone(S.resource_from(free), NOW, NOW + 60 * L.US))
    assert tomb is not None and S.is_tombstone(tomb)
    return [None, free, quarantined, held, other, legacy, eu, tomb]


def resource_writes() -> list[W.Write]:
    free = L.ResourceItem("c", "r1", "p", "us-east-1", "x", 4, lease_available=T(NOW))
    held = L.ResourceItem(
        "c", "r1", "p", "us-east-1", "x", 5, "k", NOW + 3600 * L.US, None, NOW, "tok", 2
    )
    lease = D.lease_from_item(held)
    return [
        B.claim(free, "k", NOW + 3600 * L.US, NOW, "tok", 1),
        B.claim(free, "k", NOW + 3600 * L.US, NOW + 61 * L.US, "tok", 1),
        B.fence_resource(IDENT, 4),
        B.fence_resource(IDENT, 5),
        B.free_claim(IDENT, "k", "tok", NOW, NOW + 60 * L.US),
        B.extend_resource(lease, NOW + 7200 * L.US),
        B.extend_resource(lease, NOW + 60 * L.US),
        B.liberate(held, NOW + 7200 * L.US),
        B.free_orphan(held, NOW, NOW + 60 * L.US),
        B.move(free, "eu-west-1"),
        B.tombstone(free, NOW, NOW + 60 * L.US),
        B.tombstone(held, NOW, NOW + 3600 * L.US),
        B.readd(IDENT, 5, T(NOW + 60 * L.US), "p", "us-east-1", NOW),
        B.readd(IDENT, 4, T(NOW + 60 * L.US), "p", "us-east-1", NOW),
    ]


def mapping_states() -> list[dict[str, W.Value] | None]:
    pending = W.apply(None, MB.map_acquire(MIDENT, 0, "tok", "r1", 4, NOW + L.US, NOW, "h"))
    assert pending is not None
    live = {**pending, "state": L.LIVE, "ver": 2}
    free = W.apply(live, MB.map_release(MIDENT, "tok", NOW))
    return [None, pending, live, free]


def mapping_writes() -> list[W.Write]:
    m = S.mapping_from(mapping_states()[1])  # type: ignore[arg-type]
    lease = D.lease_from_mapping(m)
    return [
        MB.map_acquire(MIDENT, 0, "t2", "r2", 1, NOW + L.US, NOW, "h"),
        MB.map_acquire(MIDENT, 1, "t2", "r2", 1, NOW + L.US, NOW, "h"),
        MB.map_acquire(MIDENT, 2, "t2", "r2", 1, NOW + L.US, NOW, "h"),
        MB.map_confirm(m),
        MB.map_extend(lease, NOW + 7200 * L.US),
        MB.map_extend(lease, NOW),
        MB.map_release(MIDENT, "tok", NOW),
        MB.map_release(MIDENT, "other", NOW),
        MB.map_release(MIDENT, "tok", NOW, ver=1),  # ras-dedupe's: at the version it checked
        MB.map_release(MIDENT, "tok", NOW, ver=2),
        MB.map_fence(MIDENT, 0, NOW),
        MB.map_fence(MIDENT, 1, NOW),
        MB.map_drop_dead(m, NOW),
    ]


def put(ddb: Any, table: str, key: W.ItemKey, item: dict[str, W.Value] | None) -> None:
    ddb.delete_item(TableName=table, Key=W.key_av(key))
    if item is not None:
        ddb.put_item(TableName=table, Item={k: W.to_av(v) for k, v in item.items()})


def get(ddb: Any, table: str, key: W.ItemKey) -> dict[str, W.Value] | None:
    raw = ddb.get_item(TableName=table, Key=W.key_av(key), ConsistentRead=True).get("Item")
    return W.item_from_av(raw) if raw else None


@pytest.mark.parametrize(
    ("key", "states", "writes"),
    [(IDENT, resource_states, resource_writes), (MIDENT, mapping_states, mapping_writes)],
    ids=["resource", "mapping"],
)
def test_apply_agrees_with_the_server(
    ddb: Any, table: str, key: W.ItemKey, states: Any, writes: Any
) -> None:
    checked = 0
    for state, w in itertools.product(states(), writes()):
        put(ddb, table, key, state)
        expected = W.apply(state, w)
        try:
            ddb.update_item(TableName=table, **W.render(w))
            applied = True
        except ddb.exceptions.ConditionalCheckFailedException:
            applied = False
        assert applied == (expected is not None), (w.kind, state)
        assert get(ddb, table, key) == (expected if applied else state), (w.kind, state)
        checked += 1
    assert checked == len(states()) * len(writes())
