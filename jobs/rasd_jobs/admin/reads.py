"""What rasadmin's commands read: pool definitions and resource items, strongly consistent
(the admin acts on what it shows), and the daemons' bounds from ``--config``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from rasd.core.lease import US, ResourceItem
from rasd.core.serialize import is_resource_item, item_from_ddb, pool_from_ddb, pool_meta_key

from .. import common


def get_pool(ddb: Any, table: str, client_id: str, pool_id: str) -> dict[str, Any] | None:
    resp = ddb.get_item(TableName=table, Key=pool_meta_key(client_id, pool_id), ConsistentRead=True)
    item = resp.get("Item")
    if item is None:
        return None
    return pool_row(item)


def pool_row(item: dict[str, Any]) -> dict[str, Any]:
    pool = pool_from_ddb(item)
    return {
        "client_id": pool.client_id,
        "pool_id": pool.pool_id,
        "max_lease": common.seconds(pool.max_lease_us / US),
        "home": pool.home,
        #: seconds, None when the pool has none (docs/design.md, "An outage budget")
        "outage_budget": common.seconds(pool.outage_budget_us / US)
        if pool.outage_budget_us
        else None,
        "quarantine": common.seconds(pool.quarantine_us / US) if pool.outage_budget_us else None,
    }


def client_items(
    ddb: Any,
    table: str,
    client_id: str,
    pool_id: str | None = None,
    region: str | None = None,
) -> Iterator[ResourceItem]:
    """Resource items of a client (a Query on the base table), optionally of one pool/region.
    Strongly consistent: the admin acts on what it shows."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {":c": {"S": client_id}}
    filters = []
    if pool_id is not None:
        filters.append("pool_id = :p")
        values[":p"] = {"S": pool_id}
    if region is not None:
        filters.append("#r = :r")
        names["#r"] = "region"
        values[":r"] = {"S": region}
    kw: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "client_id = :c",
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
    }
    if filters:
        kw["FilterExpression"] = " AND ".join(filters)
    if names:
        kw["ExpressionAttributeNames"] = names
    for page in common.scan_pages(ddb, kw):
        for raw in page.get("Items", []):
            if is_resource_item(raw):  # not a deleted resource's tombstone
                yield item_from_ddb(raw)


is_resource = is_resource_item


def no_pool(table: str, client_id: str | None, pool_id: str) -> common.JobError:
    """What every command says of a pool that is neither defined nor holds an item (exit 1)."""
    if client_id is None:
        return common.JobError(f"no pool {pool_id} of any client in table {table}")
    return common.JobError(f"no pool {client_id}/{pool_id} in table {table}")


def require_pool(ddb: Any, table: str, client_id: str, pool_id: str) -> dict[str, Any]:
    """The pool's definition; JobError when it has none (items are added to defined pools)."""
    pool = get_pool(ddb, table, client_id, pool_id)
    if pool is None:
        exc = no_pool(table, client_id, pool_id)
        raise common.JobError(f"{exc}: define it with `rasadmin add-pool`")
    return pool


def require_pool_or_items(ddb: Any, table: str, client_id: str, pool_id: str) -> None:
    """JobError (:func:`no_pool`) unless the pool is defined or holds an item of any region
    (items without a definition are listed too: show-pool calls them orphans)."""
    if get_pool(ddb, table, client_id, pool_id) is not None:
        return
    if next(client_items(ddb, table, client_id, pool_id), None) is None:
        raise no_pool(table, client_id, pool_id)


def get_resource(ddb: Any, table: str, client_id: str, resource: str) -> ResourceItem:
    resp = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client_id}, "resource": {"S": resource}},
        ConsistentRead=True,
    )
    raw = resp.get("Item")
    if raw is None or not is_resource(raw):
        raise common.JobError(f"no resource {resource!r} of client {client_id} in {table}")
    return item_from_ddb(raw)


def bounds(args: argparse.Namespace) -> tuple[int, int]:
    """(quarantine, clock-skew bound) in microseconds, as the daemons keep them (--config)."""
    cfg = common.daemon_config(args)
    return int(cfg.quarantine * US), int(cfg.max_clock_skew * US)
