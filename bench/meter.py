"""The capacity meter: what DynamoDB would bill for each request that crosses the delay proxy.

The proxy (``python -m bench.proxy --meter FILE``) hands the meter every request before it
goes upstream and every answer after it went back to the client. The meter asks the backend
for its own count (``ReturnConsumedCapacity``) and for the item an UpdateItem leaves
(``ReturnValues: ALL_NEW`` where the client asked for nothing); clients ignore the fields
they did not ask for. It keeps a copy of every item it saw, read or written (seeded by a
Scan at start), so a write's bill can follow ``bench.capacity``'s rules: the larger of the
item before and after, a refused write's existing item, and each index the write changes.

Reads are billed as the backend counts them (it alone knows how much a Query page read,
filtered or counted); writes as ``bench.capacity`` computes them, and the backend's count of
the base table's units is kept beside, as the check (dynalite counts neither the indexes
nor a refused write). Totals are by request kind (``kind_of``) and written to ``FILE``,
replaced whole twice a second, so the bench can take the difference over a window.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import defaultdict
from typing import Any

from . import capacity

_TARGET_RE = re.compile(rb"(?im)^x-amz-target:[ \t]*\S+\.(\w+)")
_CLEN_RE = re.compile(rb"(?im)^content-length:[ \t]*\d+")
_UA_RE = re.compile(rb"(?im)^user-agent:[^\r\n]*\bbench-job\b")
READS = ("GetItem", "Query", "Scan")
WRITES = ("UpdateItem", "PutItem", "DeleteItem")
#: the user-agent mark of the bench's jobs (boto3 ``user_agent_extra``): kinds "job:..."
JOB_MARK = "bench-job"

Key = tuple[str, str]


def _key(item_key: dict[str, Any]) -> Key:
    return (item_key["client_id"]["S"], item_key["resource"]["S"])


def _class(pk: str) -> str:
    if pk.startswith("#map#"):
        return "mapping"
    if pk.startswith("#agree#"):
        return "agreement"
    if pk.startswith("#"):
        return pk[1:]  # meta, hosts
    return "resource"


def _s(item: dict[str, Any] | None, name: str) -> str | None:
    if item is None or name not in item:
        return None
    v = item[name]
    return str(next(iter(v.values())))


def kind_of(op: str, req: dict[str, Any], before: Any, after: Any, refused: bool) -> str:
    """What a request is, for the bill's split: the operation, the index or item class, and
    for a write to a resource or mapping item what it did."""
    if op in READS:
        if "IndexName" in req:
            return f"{op} {req['IndexName']}"
        if op == "Query":
            m = re.match(r"\s*(#?\w+)\s*=\s*(:\w+)", req.get("KeyConditionExpression", ""))
            pk = req.get("ExpressionAttributeValues", {}).get(m[2] if m else "", {}).get("S", "")
            return f"Query {_class(pk)}"
        if op == "GetItem":
            return f"GetItem {_class(req['Key']['client_id']['S'])}"
        return op
    cls = _class(req["Key"]["client_id"]["S"]) if "Key" in req else "resource"
    if refused:
        return f"{op} {cls} refused"
    if cls == "resource":
        k0, k1 = _s(before, "key"), _s(after, "key")
        if k1 is not None and k0 != k1:
            what = "claim"
        elif k1 is not None:
            moved = _s(before, "lease_expires") != _s(after, "lease_expires")
            what = "extend" if moved else "touch"
        elif k0 is not None:
            what = "free"
        else:
            what = "relist" if _s(after, "lease_available") else "other"
        return f"{op} resource {what}"
    if cls == "mapping":
        s0, s1 = _s(before, "state"), _s(after, "state")
        if s0 == s1:
            what = "extend" if _s(before, "exp") != _s(after, "exp") else "same"
        else:
            what = f"{s0 or 'none'}->{s1}"
        return f"{op} mapping {what}"
    return f"{op} {cls}"


class Meter:
    """Totals by request kind: calls, read units, write units (base table and indexes), and
    the backend's own count. ``request``/``response`` run on the proxy's threads."""

    def __init__(self, out_path: str, seed: dict[Key, dict[str, Any]] | None = None) -> None:
        self.out_path = out_path
        self.items: dict[Key, dict[str, Any]] = dict(seed or {})
        self.lock = threading.Lock()
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.unmetered = 0
        self._stop = threading.Event()
        threading.Thread(target=self._flush_forever, daemon=True, name="meter").start()

    # --------------------------------------------------------------------- the proxy's hooks
    def request(self, head: bytes, body: bytes) -> tuple[bytes, bytes, Any]:
        m = _TARGET_RE.search(head)
        op = m.group(1).decode() if m else ""
        if op not in READS + WRITES or not body:
            return head, body, None
        req = json.loads(body)
        sent = dict(req)
        sent.setdefault("ReturnConsumedCapacity", "TOTAL")
        if op == "UpdateItem":
            sent.setdefault("ReturnValues", "ALL_NEW")
        new = json.dumps(sent).encode()
        head = _CLEN_RE.sub(f"Content-Length: {len(new)}".encode(), head)
        job = _UA_RE.search(head) is not None
        return head, new, (op, sent, job)

    def response(self, ctx: Any, rhead: bytes, rbody: bytes) -> None:
        if ctx is None:
            return
        op, req, job = ctx
        status = rhead[9:12]
        try:
            resp = json.loads(rbody) if rbody else {}
        except ValueError:
            resp = {}
        refused = status == b"400" and "ConditionalCheckFailed" in str(resp.get("__type", ""))
        if status != b"200" and not refused:
            return  # throttled or failed: DynamoDB bills nothing
        with self.lock:
            self._account(op, req, resp, refused, job)

    # ---------------------------------------------------------------------------- the bill
    def _account(
        self, op: str, req: dict[str, Any], resp: dict[str, Any], refused: bool, job: bool
    ) -> None:
        backend = float(resp.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
        rru = wru = wru_index = 0.0
        before = after = None
        if op in READS:
            rru = backend
            full = "ProjectionExpression" not in req and req.get("Select") != "COUNT"
            got = [resp["Item"]] if resp.get("Item") else resp.get("Items", [])
            if full:
                for it in got:
                    self.items[_key(it)] = it
        else:
            k = _key(req["Key"]) if "Key" in req else _key(req["Item"])
            before = self.items.get(k)
            if refused:
                wru = capacity.refused_write_units(before)
            else:
                if op == "UpdateItem":
                    after = resp.get("Attributes")
                    if after is None or req.get("ReturnValues") != "ALL_NEW":
                        self.unmetered += 1
                        return
                elif op == "PutItem":
                    after = req["Item"]
                wru = capacity.write_units(before, after)
                wru_index = float(sum(capacity.index_write_units(before, after).values()))
                if after is None:
                    self.items.pop(k, None)
                else:
                    self.items[k] = after
        kind = kind_of(op, req, before, after, refused)
        t = self.totals[("job: " if job else "") + kind]
        t["calls"] += 1
        t["rru"] += rru
        t["wru"] += wru
        t["wru_index"] += wru_index
        t["backend"] += backend

    # ------------------------------------------------------------------------------ output
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            kinds = {k: dict(v) for k, v in self.totals.items()}
        return {"at": time.time(), "kinds": kinds, "unmetered": self.unmetered}

    def flush(self) -> None:
        tmp = f"{self.out_path}.tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(self.snapshot(), fh)
            os.replace(tmp, self.out_path)
        except OSError:
            pass  # the bench is gone (its directory with it)

    def _flush_forever(self) -> None:
        while not self._stop.wait(0.5):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self.flush()


def seed_from_scan(endpoint: str, table: str, region: str = "us-east-1") -> dict[Key, Any]:
    """Every item of the table, for the meter's copy (a Scan, consistent)."""
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region)
    out: dict[Key, Any] = {}
    for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for it in page["Items"]:
            out[_key(it)] = it
    return out


def window(first: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, float]]:
    """What was billed between two snapshots, by kind."""
    out: dict[str, dict[str, float]] = {}
    for kind, t in last["kinds"].items():
        t0 = first["kinds"].get(kind, {})
        d = {f: v - t0.get(f, 0.0) for f, v in t.items()}
        if d.get("calls", 0) > 0:
            out[kind] = d
    return out


def bill(kinds: dict[str, dict[str, float]], jobs: bool = False) -> dict[str, float]:
    """Read and write units in all (the jobs' only if ``jobs``), and their weighted sum."""
    keep = [t for k, t in kinds.items() if jobs or not k.startswith("job: ")]
    rru = sum(t["rru"] for t in keep)
    wru = sum(t["wru"] + t["wru_index"] for t in keep)
    return {"rru": rru, "wru": wru, "weighted": capacity.weighted(rru, wru)}
