"""rasd.dynamo.ddb against moto's server over HTTP: the lean client's responses and errors equal
botocore's for every operation the daemon uses (and PutItem/DeleteItem)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from rasd.dynamo.ddb import LeanDynamoDB

pytestmark = [pytest.mark.integration]


@pytest.fixture
async def lean(moto_endpoint: str) -> AsyncIterator[LeanDynamoDB]:
    client = await LeanDynamoDB.create(moto_endpoint, "us-east-1", max_connections=4)
    yield client
    await client.close()


def _strip(resp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resp.items() if k != "ResponseMetadata"}


def _item(res: str, **extra: Any) -> dict[str, Any]:
    return {"client_id": {"S": "c"}, "resource": {"S": res}, **extra}


async def _both(lean: LeanDynamoDB, boto: Any, op: str, **kw: Any) -> tuple[Any, Any]:
    """The same call through both clients: (lean's, botocore's) response or ClientError."""
    method = {"GetItem": "get_item", "Query": "query", "UpdateItem": "update_item"}.get(
        op, {"PutItem": "put_item", "DeleteItem": "delete_item"}.get(op)
    )
    assert method is not None
    out: list[Any] = []
    for call in (getattr(lean, method), None):
        try:
            if call is None:
                resp = await asyncio.to_thread(getattr(boto, method), **kw)
            else:
                resp = await call(**kw)
            out.append(_strip(resp))
        except ClientError as exc:
            out.append(exc)
    return out[0], out[1]


def _same_error(a: Any, b: Any, code: str) -> None:
    assert isinstance(a, ClientError) and isinstance(b, ClientError), (a, b)
    assert a.response["Error"] == b.response["Error"]
    assert a.response["Error"]["Code"] == code
    assert a.operation_name == b.operation_name
    assert (
        a.response["ResponseMetadata"]["HTTPStatusCode"]
        == b.response["ResponseMetadata"]["HTTPStatusCode"]
    )
    assert str(a) == str(b)


async def test_item_operations_match_botocore(lean: LeanDynamoDB, ddb: Any, table: str) -> None:
    t = {"TableName": table}
    # PutItem (with the old item back), lean on r1, botocore on r2
    for res in ("r1", "r2"):
        ddb.put_item(**t, Item=_item(res, n={"N": "1"}, s={"SS": ["a", "b"]}))
    a = _strip(
        await lean.put_item(
            **t,
            Item=_item("r1", n={"N": "2"}, m={"M": {"x": {"BOOL": True}}}),
            ReturnValues="ALL_OLD",
        )
    )
    b = _strip(
        ddb.put_item(
            **t,
            Item=_item("r2", n={"N": "2"}, m={"M": {"x": {"BOOL": True}}}),
            ReturnValues="ALL_OLD",
        )
    )
    a["Attributes"].pop("resource")
    b["Attributes"].pop("resource")
    assert a == b and a["Attributes"]["n"] == {"N": "1"}

    # GetItem: present, absent, consistent
    for key in (_item("r1"), _item("nope")):
        a, b = await _both(lean, ddb, "GetItem", **t, Key=key, ConsistentRead=True)
        assert a == b

    # UpdateItem ALL_NEW on both items, compared without the key
    upd = {
        "UpdateExpression": "SET n = n + :one, #l = :l",
        "ExpressionAttributeNames": {"#l": "label"},
        "ExpressionAttributeValues": {":one": {"N": "1"}, ":l": {"S": "ü-ß"}},
        "ReturnValues": "ALL_NEW",
    }
    a = _strip(await lean.update_item(**t, Key=_item("r1"), **upd))
    b = _strip(ddb.update_item(**t, Key=_item("r2"), **upd))
    assert a["Attributes"].pop("resource") == {"S": "r1"}
    b["Attributes"].pop("resource")
    assert a == b and a["Attributes"]["n"] == {"N": "3"}

    # a failed condition: the same ClientError
    cond = {
        "Key": _item("r1"),
        "UpdateExpression": "SET n = :z",
        "ConditionExpression": "n = :z",
        "ExpressionAttributeValues": {":z": {"N": "0"}},
    }
    a, b = await _both(lean, ddb, "UpdateItem", **t, **cond)
    _same_error(a, b, "ConditionalCheckFailedException")

    # a validation error (a bad expression), and an unknown table
    a, b = await _both(lean, ddb, "UpdateItem", **t, Key=_item("r1"), UpdateExpression="SET")
    _same_error(a, b, "ValidationException")
    a, b = await _both(lean, ddb, "GetItem", TableName="no-such-table", Key=_item("r1"))
    _same_error(a, b, "ResourceNotFoundException")

    # DeleteItem with the old item back
    a = _strip(await lean.delete_item(**t, Key=_item("r1"), ReturnValues="ALL_OLD"))
    b = _strip(ddb.delete_item(**t, Key=_item("r2"), ReturnValues="ALL_OLD"))
    a["Attributes"].pop("resource")
    b["Attributes"].pop("resource")
    assert a == b


async def test_query_pages_and_counts_match_botocore(
    lean: LeanDynamoDB, ddb: Any, table: str
) -> None:
    for i in range(7):
        ddb.put_item(
            TableName=table,
            Item={
                "client_id": {"S": "q"},
                "resource": {"S": f"r{i}"},
                "partition": {"S": "p#0"},
                "lease_available": {"S": f"2024-01-0{i + 1}"},
            },
        )
    base = {
        "TableName": table,
        "KeyConditionExpression": "client_id = :c",
        "ExpressionAttributeValues": {":c": {"S": "q"}},
        "ConsistentRead": True,
        "Limit": 3,
    }
    pages = 0
    kw = dict(base)
    while True:
        a, b = await _both(lean, ddb, "Query", **kw)
        assert a == b
        pages += 1
        if "LastEvaluatedKey" not in a:
            break
        kw["ExclusiveStartKey"] = a["LastEvaluatedKey"]
    assert pages == 3

    # the index the daemon reads, backwards, and Select=COUNT
    idx = {
        "TableName": table,
        "IndexName": "available_resources",
        "KeyConditionExpression": "#p = :p AND lease_available >= :s",
        "ExpressionAttributeNames": {"#p": "partition"},
        "ExpressionAttributeValues": {":p": {"S": "p#0"}, ":s": {"S": "2024-01-03"}},
        "ScanIndexForward": False,
        "Limit": 4,
    }
    a, b = await _both(lean, ddb, "Query", **idx)
    assert a == b and a["Count"] == 4
    a, b = await _both(lean, ddb, "Query", **{**idx, "Select": "COUNT"})
    assert a == b and "Items" not in a

    # a validation error
    a, b = await _both(lean, ddb, "Query", **{**base, "KeyConditionExpression": "nope = :c"})
    _same_error(a, b, "ValidationException")


async def test_calls_sent_together_share_the_pool(lean: LeanDynamoDB, table: str) -> None:
    """Many calls at once through a pool of 4 (moto closes every connection): all answered."""
    resps = await asyncio.gather(
        *(lean.get_item(TableName=table, Key=_item(f"g{i}")) for i in range(20))
    )
    assert all("Item" not in r for r in resps)
    assert lean._open <= 4
