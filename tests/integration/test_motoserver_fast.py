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
        schema.create_table(ddb, "t")
        schema.put_pool(ddb, "t", "demo", "default", 3600)
        schema.add_resources(
            ddb, "t", "demo", "default", "us-east-1", (f"r-{i:04d}" for i in range(60))
        )
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
