"""The index reads as data: the keyword arguments of DynamoDB's ``Query`` on the two sparse
indexes (docs/schema.md), without ``TableName``. Pure: no I/O.

Written once for the daemon's store, the jobs' driver, the balancer and the baseline; each
adds its table and client, and may extend the fresh ``dict`` (``ExclusiveStartKey``).
"""

from __future__ import annotations

from typing import Any

#: the sparse index of held items: ``key`` (hash), ``pool_id`` (range)
LEASED_INDEX = "leased_resources"
#: the sparse index of free items: ``partition`` (hash), ``lease_available`` (range)
AVAILABLE_INDEX = "available_resources"


def leased_query(key: str, pool_id: str) -> dict[str, Any]:
    """The items the ``leased_resources`` index shows held by ``key`` in ``pool_id``: every
    client's and region's (the caller keeps its client's). Eventually consistent."""
    return {
        "IndexName": LEASED_INDEX,
        "KeyConditionExpression": "#k = :k AND pool_id = :p",
        "ExpressionAttributeNames": {"#k": "key"},
        "ExpressionAttributeValues": {":k": {"S": key}, ":p": {"S": pool_id}},
    }


def available_query(
    partition: str,
    limit: int | None = None,
    forward: bool | None = None,
    after: tuple[str, str, str] | None = None,
    count: bool = False,
) -> dict[str, Any]:
    """The free items of one sub-partition of the ``available_resources`` index
    (``rasd.core.lease.partition_name``): at most ``limit`` a page; in index order
    (``forward`` True) or from its end (False; None: DynamoDB's default, forward); starting
    ``after`` a position (lease_available, client_id, resource) that need not name an item;
    ``count``: only their number (``Select=COUNT``). Eventually consistent."""
    kw: dict[str, Any] = {
        "IndexName": AVAILABLE_INDEX,
        "KeyConditionExpression": "#p = :p",
        "ExpressionAttributeNames": {"#p": "partition"},
        "ExpressionAttributeValues": {":p": {"S": partition}},
    }
    if limit is not None:
        kw["Limit"] = limit
    if forward is not None:
        kw["ScanIndexForward"] = forward
    if count:
        kw["Select"] = "COUNT"
    if after is not None:
        lease_available, client_id, resource = after
        kw["ExclusiveStartKey"] = {
            "partition": {"S": partition},
            "lease_available": {"S": lease_available},
            "client_id": {"S": client_id},
            "resource": {"S": resource},
        }
    return kw
