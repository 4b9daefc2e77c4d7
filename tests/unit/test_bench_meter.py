"""bench.meter: the proxy's capacity meter, on requests and answers as they cross it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import meter

FREE = {
    "client_id": {"S": "demo"}, "resource": {"S": "r1"}, "pool_id": {"S": "p"},
    "region": {"S": "us-east-1"}, "partition": {"S": "demo.p.us-east-1.0"},
    "lease_available": {"S": "2026-01-01T00:00:00.000000Z"}, "version": {"N": "1"},
}  # fmt: skip
HELD = {k: v for k, v in FREE.items() if k not in ("partition", "lease_available")} | {
    "key": {"S": "k"}, "lease_expires": {"S": "2026-01-01T01:00:00.000000Z"},
    "version": {"N": "2"},
}  # fmt: skip
KEY = {"client_id": {"S": "demo"}, "resource": {"S": "r1"}}


def _head(op: str, body: bytes, ua: str = "x") -> bytes:
    return (
        f"POST / HTTP/1.1\r\nX-Amz-Target: DynamoDB_20120810.{op}\r\nUser-Agent: {ua}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()


def _exchange(m: meter.Meter, op: str, req: dict[str, Any], status: int, resp: dict[str, Any],
              ua: str = "x") -> dict[str, Any]:  # fmt: skip
    body = json.dumps(req).encode()
    head, sent, ctx = m.request(_head(op, body, ua), body)
    m.response(ctx, f"HTTP/1.1 {status} OK\r\n\r\n".encode(), json.dumps(resp).encode())
    out: dict[str, Any] = json.loads(sent)
    assert f"Content-Length: {len(sent)}".encode() in head
    return out


def test_a_claim_bills_the_table_and_both_indexes(tmp_path: Path) -> None:
    m = meter.Meter(str(tmp_path / "m.json"), {("demo", "r1"): FREE})
    sent = _exchange(m, "UpdateItem", {"TableName": "t", "Key": KEY}, 200,
                     {"Attributes": HELD, "ConsumedCapacity": {"CapacityUnits": 1.0}})  # fmt: skip
    # the meter asked for the item after and the backend's count; the client asked neither
    assert sent["ReturnValues"] == "ALL_NEW" and sent["ReturnConsumedCapacity"] == "TOTAL"
    t = m.snapshot()["kinds"]["UpdateItem resource claim"]
    assert t == {"calls": 1, "rru": 0, "wru": 1, "wru_index": 2, "backend": 1.0}
    # the same write refused now: the existing item's size, no index
    refused = {"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}
    _exchange(m, "UpdateItem", {"TableName": "t", "Key": KEY}, 400, refused)
    assert m.snapshot()["kinds"]["UpdateItem resource refused"]["wru"] == 1
    m.close()
    assert json.loads((tmp_path / "m.json").read_text())["kinds"]


def test_reads_are_billed_as_the_backend_counts_them_and_jobs_apart(tmp_path: Path) -> None:
    m = meter.Meter(str(tmp_path / "m.json"))
    q = {"TableName": "t", "IndexName": "available_resources",
         "KeyConditionExpression": "#p = :p",
         "ExpressionAttributeValues": {":p": {"S": "x"}}}  # fmt: skip
    _exchange(m, "Query", q, 200, {"Items": [FREE], "ConsumedCapacity": {"CapacityUnits": 0.5}})
    got = {"Item": HELD, "ConsumedCapacity": {"CapacityUnits": 1.0}}
    get = {"TableName": "t", "Key": KEY, "ConsistentRead": True}
    _exchange(m, "GetItem", get, 200, got, ua="boto3 bench-job")
    kinds = m.snapshot()["kinds"]
    assert kinds["Query available_resources"]["rru"] == 0.5
    assert kinds["job: GetItem resource"]["rru"] == 1.0
    assert meter.bill(kinds) == {"rru": 0.5, "wru": 0, "weighted": 0.5}  # the job's apart
    assert meter.bill(kinds, jobs=True)["rru"] == 1.5
    # what it read is its copy of the item: the next write is billed from it
    assert m.items[("demo", "r1")] == HELD
    # a throttled or failed request bills nothing
    _exchange(m, "GetItem", {"TableName": "t", "Key": KEY}, 500, {})
    assert m.snapshot()["kinds"]["job: GetItem resource"]["calls"] == 1
    m.close()


def test_the_kinds_say_what_a_write_did() -> None:
    mk = {"client_id": {"S": "#map#demo#p#k"}, "resource": {"S": "us-east-1"}}
    req = {"Key": mk}
    assert meter.kind_of("UpdateItem", req, None, {"state": {"S": "pending"}}, False) == (
        "UpdateItem mapping none->pending"
    )
    longer = HELD | {"lease_expires": {"S": "2026-01-01T02:00:00.000000Z"}}
    extend = meter.kind_of("UpdateItem", {"Key": KEY}, HELD, longer, False)
    assert extend == "UpdateItem resource extend"
    assert (
        meter.kind_of("UpdateItem", {"Key": KEY}, HELD, FREE, False) == "UpdateItem resource free"
    )
    hosts = {"Key": {"client_id": {"S": "#hosts"}, "resource": {"S": "x"}}}
    assert meter.kind_of("UpdateItem", hosts, None, {}, False) == "UpdateItem hosts"
    first = {"kinds": {"a": {"calls": 1.0, "rru": 1.0}}}
    last = {"kinds": {"a": {"calls": 3.0, "rru": 4.0}, "b": {"calls": 0.0}}}
    assert meter.window(first, last) == {"a": {"calls": 2.0, "rru": 3.0}}
