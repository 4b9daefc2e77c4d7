"""The index reads (``rasd.core.reads``): each names its index's keys as the table declares
them (``rasd.core.schema.table_spec``), and adds only what its caller asked for."""

from __future__ import annotations

from typing import Any

from rasd.core.reads import AVAILABLE_INDEX, LEASED_INDEX, available_query, leased_query
from rasd.core.schema import table_spec


def _keys(index: str) -> list[str]:
    (gsi,) = (g for g in table_spec("t")["GlobalSecondaryIndexes"] if g["IndexName"] == index)
    return [k["AttributeName"] for k in gsi["KeySchema"]]


def _named(kw: dict[str, Any]) -> str:
    """The key condition with its placeholder names substituted."""
    cond = str(kw["KeyConditionExpression"])
    for placeholder, name in kw.get("ExpressionAttributeNames", {}).items():
        cond = cond.replace(placeholder, name)
    return cond


def test_leased_query_reads_the_key_and_pool_of_the_leased_index() -> None:
    kw = leased_query("k1", "p1")
    assert kw["IndexName"] == LEASED_INDEX
    hash_key, range_key = _keys(LEASED_INDEX)
    assert _named(kw) == f"{hash_key} = :k AND {range_key} = :p"
    assert kw["ExpressionAttributeValues"] == {":k": {"S": "k1"}, ":p": {"S": "p1"}}


def test_available_query_reads_one_partition_with_only_the_options_given() -> None:
    kw = available_query("c.p.r.3")
    assert kw["IndexName"] == AVAILABLE_INDEX
    assert _named(kw) == f"{_keys(AVAILABLE_INDEX)[0]} = :p"
    assert kw["ExpressionAttributeValues"] == {":p": {"S": "c.p.r.3"}}
    assert not {"Limit", "ScanIndexForward", "Select", "ExclusiveStartKey"} & set(kw)
    assert available_query("c.p.r.3", 5, False)["Limit"] == 5
    assert available_query("c.p.r.3", 5, False)["ScanIndexForward"] is False
    assert available_query("c.p.r.3", count=True)["Select"] == "COUNT"


def test_available_query_after_a_position_starts_at_the_index_key_it_names() -> None:
    kw = available_query("c.p.r.3", 5, True, after=("2024-01-01T00:00:00.000000Z", "c", "r9"))
    start = kw["ExclusiveStartKey"]
    assert start == {
        "partition": {"S": "c.p.r.3"},
        "lease_available": {"S": "2024-01-01T00:00:00.000000Z"},
        "client_id": {"S": "c"},
        "resource": {"S": "r9"},
    }
    # the index's keys and the table's, as DynamoDB wants an index's start key
    assert set(start) == set(_keys(AVAILABLE_INDEX)) | {"client_id", "resource"}
