"""The table's schema (docs/schema.md) and the provisioning calls, for boto3 (sync) callers:
``rasadmin``, ``rasd dev``, the jobs and the tests. The daemon never creates anything."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from .builders import new_resource_item
from .lease import META_CLIENT
from .reads import AVAILABLE_INDEX, LEASED_INDEX
from .serialize import pool_item

ATTRS = ["client_id", "resource", "key", "pool_id", "partition", "lease_available"]


def table_spec(name: str) -> dict[str, Any]:
    """CreateTable arguments: base keys, both sparse indexes, stream with both images."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": a, "AttributeType": "S"} for a in ATTRS],
        "KeySchema": [
            {"AttributeName": "client_id", "KeyType": "HASH"},
            {"AttributeName": "resource", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": LEASED_INDEX,
                "KeySchema": [
                    {"AttributeName": "key", "KeyType": "HASH"},
                    {"AttributeName": "pool_id", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": AVAILABLE_INDEX,
                "KeySchema": [
                    {"AttributeName": "partition", "KeyType": "HASH"},
                    {"AttributeName": "lease_available", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    }


def create_table(ddb: Any, name: str, wait: bool = True) -> bool:
    """Create the table if it does not exist. Returns True when it was created (idempotent)."""
    try:
        ddb.describe_table(TableName=name)
        return False
    except ddb.exceptions.ResourceNotFoundException:
        pass
    try:
        ddb.create_table(**table_spec(name))
    except ddb.exceptions.ResourceInUseException:
        return False
    if wait:
        ddb.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )
    try:  # acquisition-lock items carry `ttl`; let DynamoDB reap them
        ddb.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"}
        )
    except Exception:  # noqa: BLE001 - TTL is housekeeping, not correctness
        pass
    return True


def put_pool(
    ddb: Any,
    table: str,
    client_id: str,
    pool_id: str,
    max_lease_s: float,
    home: str | None = None,
    outage_budget_s: float = 0.0,
    quarantine_s: float = 0.0,
) -> None:
    """Define a pool; ``home``: a strict pool's home region (docs/global.md); an outage
    budget with the quarantine it needs (docs/design.md, "An outage budget")."""
    item = pool_item(client_id, pool_id, max_lease_s, home, outage_budget_s, quarantine_s)
    ddb.put_item(TableName=table, Item=item)


def list_pool_items(ddb: Any, table: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kw: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "client_id = :m AND begins_with(#r, :pfx)",
        "ExpressionAttributeNames": {"#r": "resource"},
        "ExpressionAttributeValues": {":m": {"S": META_CLIENT}, ":pfx": {"S": "pool#"}},
    }
    while True:
        resp = ddb.query(**kw)
        out.extend(resp.get("Items", []))
        if "LastEvaluatedKey" not in resp:
            return out
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _chunks(it: Iterable[Any], n: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for x in it:
        chunk.append(x)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def batch_write(ddb: Any, table: str, items: Iterable[dict[str, Any]]) -> int:
    """PutRequests in batches of 25, retrying unprocessed items with backoff."""
    n = 0
    for chunk in _chunks(items, 25):
        req: dict[str, Any] = {table: [{"PutRequest": {"Item": it}} for it in chunk]}
        delay = 0.05
        while req:
            resp = ddb.batch_write_item(RequestItems=req)
            req = resp.get("UnprocessedItems") or {}
            if req:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        n += len(chunk)
    return n


def add_resources(
    ddb: Any,
    table: str,
    client_id: str,
    pool_id: str,
    region: str,
    resources: Iterable[str],
    now_us: int | None = None,
) -> int:
    """Add free resources to one region; each lands in a stable one of the 10 sub-partitions
    (FNV hash of the resource string), which spreads any large set evenly."""
    now = now_us if now_us is not None else time.time_ns() // 1000
    return batch_write(
        ddb, table, (new_resource_item(client_id, pool_id, region, r, now) for r in resources)
    )
