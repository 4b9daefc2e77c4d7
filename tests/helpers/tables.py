"""The test table on moto's server, through a plain boto3 client: a pool seeded with free
resources, a resource leased exactly as a daemon leases it, every item read back."""

from __future__ import annotations

from typing import Any

from rasd.core import schema


def seed_pool(
    ddb: Any,
    table: str,
    client_id: str = "demo",
    pool_id: str = "default",
    region: str = "us-east-1",
    count: int = 20,
    max_lease_s: float = 7200,
    prefix: str = "res-",
) -> list[str]:
    """Define a pool and add ``count`` free resources to ``region``; returns their names."""
    schema.put_pool(ddb, table, client_id, pool_id, max_lease_s)
    names = [f"{prefix}{i:05d}" for i in range(count)]
    schema.add_resources(ddb, table, client_id, pool_id, region, names)
    return names


def scan_all(ddb: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` (consistent reads), through boto3's Scan paginator."""
    pages = ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return [item for page in pages for item in page["Items"]]


def hold(
    ddb: Any,
    table: str,
    resource: str,
    key: str,
    expires_us: int,
    now_us: int,
    client_id: str = "demo",
    token: str | None = None,
) -> str:
    """Lease ``resource`` to ``key`` exactly as a daemon does (docs/design.md): the mapping
    item at the version read, the claim with the same token, then the confirmation. Returns
    the token. Leasing a key again in the same region leaves the earlier resource an orphan,
    as a crash can."""
    from rasd.core import builders, map_builders, serialize
    from rasd.core import lease as lease_items
    from rasd.core.writes import item_from_av, key_av, render

    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client_id}, "resource": {"S": resource}},
        ConsistentRead=True,
    )["Item"]
    item = serialize.item_from_ddb(raw)
    ident = (lease_items.map_pk(client_id, item.pool_id, key), item.region)
    got = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True).get("Item")
    ver = serialize.mapping_from(item_from_av(got)).ver if got else 0
    tok = token or f"tok-{resource}-{ver}"
    w = map_builders.map_acquire(
        ident, ver, tok, resource, item.version, expires_us, now_us, "test"
    )
    ddb.update_item(TableName=table, **render(w))
    ddb.update_item(
        TableName=table, **render(builders.claim(item, key, expires_us, now_us, tok, ver + 1))
    )
    m = lease_items.Mapping(
        client_id,
        item.pool_id,
        key,
        item.region,
        ver + 1,
        lease_items.PENDING,
        tok,
        resource,
        item.version,
        expires_us,
        now_us,
    )
    ddb.update_item(TableName=table, **render(map_builders.map_confirm(m)))
    return tok


def rollout_on(ddb: Any, table: str) -> None:
    """Put ``table`` in rollout mode, as ``rasadmin adopt`` does first: the paper's agent may
    write it, and every rasd daemon and job keeps the rules that are safe beside it."""
    from rasd_jobs import common

    assert common.write_rollout(ddb, table, True, common.read_rollout(ddb, table), "test", "test")
