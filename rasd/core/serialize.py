"""Lease items to and from DynamoDB's attribute maps. Pure: no I/O.

A read's attribute map becomes a frozen item of :mod:`rasd.core.lease` (resource, mapping and
the meta items the daemon reads), its kind told by its partition key (docs/schema.md); writes
go the other way in :mod:`rasd.core.builders` and :mod:`rasd.core.map_builders`.
"""

from __future__ import annotations

from typing import Any

from .lease import FREE, MAP_PREFIX, META_CLIENT, US, Item, Mapping, Pool, ResourceItem, parse_time
from .writes import Value, item_from_av


# --------------------------------------------------------------------------------------- items
def _s(d: dict[str, Value], name: str) -> str | None:
    v = d.get(name)
    return v if isinstance(v, str) else None


def _n(d: dict[str, Value], name: str) -> int:
    v = d.get(name)
    return v if isinstance(v, int) else 0


def resource_from(d: dict[str, Value]) -> ResourceItem:
    """A resource item from its plain-dict form (``rasd.core.writes.item_from_av``)."""
    exp = _s(d, "lease_expires")
    acq = _s(d, "lease_acquired")
    return ResourceItem(
        client_id=str(d["client_id"]),
        resource=str(d["resource"]),
        pool_id=_s(d, "pool_id") or "",
        region=_s(d, "region") or "",
        partition=_s(d, "partition") or "",
        version=_n(d, "version"),
        key=_s(d, "key"),
        lease_expires_us=parse_time(exp) if exp else None,
        lease_available=_s(d, "lease_available"),
        lease_acquired_us=parse_time(acq) if acq else None,
        holder=_s(d, "holder"),
        mver=_n(d, "mver"),
        hver=d["hver"] if isinstance(d.get("hver"), int) else None,  # type: ignore[arg-type]
        quarantine_until=_s(d, "quarantine_until"),
    )


def item_from_ddb(item: Item) -> ResourceItem:
    return resource_from(item_from_av(item))


def is_resource_item(item: Item) -> bool:
    """A resource item, not a meta or mapping item (those have a '#' client_id and no
    ``pool_id``)."""
    return not item["client_id"]["S"].startswith("#") and "pool_id" in item


def is_mapping_pk(pk: str) -> bool:
    return pk.startswith(MAP_PREFIX)


def mapping_from(d: dict[str, Value]) -> Mapping:
    """A mapping item from its plain-dict form."""
    pk = str(d["client_id"])
    if not pk.startswith(MAP_PREFIX):
        raise ValueError(f"not a mapping item: {pk!r}")
    client_id, pool_id, key = pk[len(MAP_PREFIX) :].split("#", 2)
    exp = _s(d, "exp")
    since = _s(d, "since")
    return Mapping(
        client_id=client_id,
        pool_id=pool_id,
        key=key,
        region=str(d["resource"]),
        ver=_n(d, "ver"),
        state=_s(d, "state") or FREE,
        token=_s(d, "token"),
        resource=_s(d, "res"),
        rver=_n(d, "rver"),
        expires_us=parse_time(exp) if exp else None,
        since_us=parse_time(since) if since else 0,
        owner=_s(d, "owner"),
    )


def mapping_from_ddb(item: Item) -> Mapping:
    return mapping_from(item_from_av(item))


def is_tombstone(item: dict[str, Any]) -> bool:
    """A deleted resource's name (:func:`tombstone`), not a resource (either form: the
    attribute map or the plain dict)."""
    return "hold_until" in item and "pool_id" not in item


# ---------------------------------------------------------------------------------- meta items
def pool_meta_key(client_id: str, pool_id: str) -> Item:
    return {"client_id": {"S": META_CLIENT}, "resource": {"S": f"pool#{client_id}#{pool_id}"}}


def pool_from_ddb(item: Item) -> Pool:
    """A pool definition (``#meta`` / ``pool#{client}#{pool}``, ``max_lease`` in seconds,
    ``home``: a strict pool's home region, ``outage_budget`` and ``quarantine`` in seconds)."""
    _, client_id, pool_id = item["resource"]["S"].split("#", 2)
    home = item.get("home", {}).get("S") or None

    def us(name: str) -> int:
        return int(float(item.get(name, {"N": "0"})["N"]) * US)

    return Pool(client_id, pool_id, us("max_lease"), home, us("outage_budget"), us("quarantine"))


def pool_item(
    client_id: str,
    pool_id: str,
    max_lease_s: float,
    home: str | None = None,
    outage_budget_s: float = 0.0,
    quarantine_s: float = 0.0,
) -> dict[str, Any]:
    """A pool definition's item (``serialize.pool_from_ddb`` reads it)."""
    item: dict[str, Any] = {
        **pool_meta_key(client_id, pool_id),
        "kind": {"S": "pool"},
        "max_lease": {"N": str(max_lease_s)},
    }
    if home is not None:
        item["home"] = {"S": home}
    if outage_budget_s:
        item["outage_budget"] = {"N": str(outage_budget_s)}
        item["quarantine"] = {"N": str(quarantine_s)}
    return item


def headroom_from_ddb(item: Item) -> tuple[int, int | None]:
    """(headroom, updated in epoch µs or None) from a headroom item. A projected shortfall
    reads as 0 spare resources, never a negative count."""
    value = max(0, int(float(item.get("headroom", {"N": "0"})["N"])))
    updated = item.get("updated", {}).get("S")
    try:
        return value, parse_time(updated) if updated else None
    except ValueError:
        return value, None


def miss_count_from_ddb(item: Item) -> int:
    """The count of a daemon's miss counter item (``misses#...``)."""
    return int(item.get("count", {}).get("N", "0"))
