"""The balancer's tests' regions, clock and a way to lease items as a daemon would."""

from __future__ import annotations

from typing import Any

from rasd.core import builders, lease
from rasd.core.lease import US, partition_name
from rasd.core.serialize import item_from_ddb
from rasd.core.writes import render

E, W, A = "us-east-1", "eu-west-1", "ap-southeast-1"
T0 = 1_900_000_000 * US


def claim_n(ddb: Any, table: str, region: str, n: int, now_us: int, prefix: str = "k") -> list:
    """Lease ``n`` free items of demo/default in ``region`` as a daemon would."""
    got: list[lease.ResourceItem] = []
    for part in range(10):
        resp = ddb.query(
            TableName=table,
            IndexName="available_resources",
            KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": "partition"},
            ExpressionAttributeValues={
                ":p": {"S": partition_name("demo", "default", region, part)}
            },
        )
        for raw in resp["Items"]:
            if len(got) == n:
                return got
            it = item_from_ddb(raw)
            k = f"{prefix}{len(got)}"
            upd = builders.claim(it, k, now_us + 3600 * US, now_us, f"tok-{k}", 1)
            ddb.update_item(TableName=table, **render(upd))
            got.append(it)
    assert len(got) == n
    return got
