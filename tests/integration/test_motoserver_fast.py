"""``motoserver.fast_queries`` answers every Query as moto does, only faster: the same table
in two servers of their own (``spawn``), one with it and one without, asked the same Queries."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from rasd.core import schema
from rasd.core.lease import partition_name
from rasd.core.reads import available_query
from rasd.devtools import motoserver

pytestmark = pytest.mark.integration


@pytest.fixture
def two_servers() -> Iterator[tuple[Any, Any]]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    fast, plain = motoserver.spawn(fast=True), motoserver.spawn(fast=False)
    try:
        yield tuple(  # type: ignore[misc]
            boto3.client("dynamodb", endpoint_url=s.endpoint, region_name="us-east-1")
            for s in (fast, plain)
        )
    finally:
        fast.stop()
        plain.stop()


def same_time(x: Any) -> Any:
    """``x`` with every ``lease_available`` alike: the two tables were seeded moments apart."""
    if isinstance(x, dict):
        return {k: {"S": "T"} if k == "lease_available" else same_time(v) for k, v in x.items()}
    if isinstance(x, list):
        return [same_time(v) for v in x]
    return x


def demo_table(ddb: Any, resources: int) -> None:
    """Table ``t`` with the pool ``demo/default`` and its ``resources`` free in us-east-1."""
    schema.create_table(ddb, "t")
    schema.put_pool(ddb, "t", "demo", "default", 3600)
    names = (f"r-{i:04d}" for i in range(resources))
    schema.add_resources(ddb, "t", "demo", "default", "us-east-1", names)


def test_fast_queries_answer_as_moto_does(two_servers: tuple[Any, Any]) -> None:
    queries: list[dict[str, Any]] = []
    for n in (0, 3):
        part = partition_name("demo", "default", "us-east-1", n)
        for limit, forward in ((5, True), (100, True), (7, False)):
            queries.append({**available_query(part, limit), "ScanIndexForward": forward})
    queries.append(
        {
            "KeyConditionExpression": "client_id = :c AND begins_with(#r, :p)",
            "ExpressionAttributeNames": {"#r": "resource"},
            "ExpressionAttributeValues": {":c": {"S": "demo"}, ":p": {"S": "r-001"}},
        }
    )
    queries.append(
        {
            "KeyConditionExpression": "client_id = :c",
            "ExpressionAttributeValues": {":c": {"S": "other"}},
            "Limit": 3,
        }
    )
    answers = []
    for ddb in two_servers:
        demo_table(ddb, 60)
        schema.add_resources(ddb, "t", "other", "p", "us-east-1", (f"o-{i}" for i in range(5)))
        got = []
        for q in queries:
            resp = ddb.query(TableName="t", **q)
            page = [resp["Items"], resp.get("LastEvaluatedKey")]
            if "LastEvaluatedKey" in resp:  # the next page, from where this one stopped
                more = ddb.query(TableName="t", ExclusiveStartKey=resp["LastEvaluatedKey"], **q)
                page.append(more["Items"])
            got.append(page)
        answers.append(got)
    fast, plain = (same_time(a) for a in answers)
    assert fast == plain
    assert any(page[0] for page in fast)  # the Queries found something


def scan_pages(ddb: Any, **kw: Any) -> list[list[Any]]:
    """Every page of a Scan: its items, ScannedCount and LastEvaluatedKey."""
    pages = []
    start: dict[str, Any] = {}
    while True:
        resp = ddb.scan(TableName="t", **kw, **start)
        pages.append([resp["Items"], resp["ScannedCount"], resp.get("LastEvaluatedKey")])
        if "LastEvaluatedKey" not in resp:
            return pages
        start = {"ExclusiveStartKey": resp["LastEvaluatedKey"]}


def test_fast_scans_answer_as_moto_does(two_servers: tuple[Any, Any]) -> None:
    """The same pages, cut where moto cuts them (``Limit``, and 1 MB: 300 items of 4 KB),
    the same items in them and the same ScannedCount."""
    some = {
        "FilterExpression": "attribute_exists(quarantine_until) AND quarantine_until <= :now",
        "ExpressionAttributeValues": {":now": {"S": "2026-06"}},
    }
    names = {"#r": "resource"}
    scans: list[dict[str, Any]] = [
        some,
        {**some, "Limit": 7},
        {**some, "Segment": 1, "TotalSegments": 2},
        {**some, "ProjectionExpression": "client_id, #r", "ExpressionAttributeNames": names},
        {
            "FilterExpression": "begins_with(client_id, :m) AND #p <> :x",
            "ExpressionAttributeNames": {"#p": "pad"},
            "ExpressionAttributeValues": {":m": {"S": "#map#"}, ":x": {"S": "nothing"}},
        },
        {
            "FilterExpression": "#p = :x",
            "ExpressionAttributeNames": {"#p": "pad"},
            "ExpressionAttributeValues": {":x": {"S": "nothing"}},
        },
    ]
    answers = []
    for ddb in two_servers:
        demo_table(ddb, 40)
        for i in range(0, 300, 25):
            batch = []
            for j in range(i, i + 25):
                item = {
                    "client_id": {"S": f"#map#demo#default#k-{j:03d}"},
                    "resource": {"S": "us-east-1"},
                    "pad": {"S": "x" * 4000},
                }
                if j % 3:
                    item["quarantine_until"] = {"S": f"2026-{j % 12 + 1:02d}"}
                batch.append({"PutRequest": {"Item": item}})
            ddb.batch_write_item(RequestItems={"t": batch})
        answers.append([scan_pages(ddb, **kw) for kw in scans])
    fast, plain = (same_time(a) for a in answers)
    assert fast == plain
    assert any(len(pages) > 1 for pages in fast[:1])  # the 1 MB cut was reached
    assert all(any(page[0] for page in pages) for pages in fast[:5])
