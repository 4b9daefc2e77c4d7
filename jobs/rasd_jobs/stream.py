"""Reading the table's DynamoDB stream in one region (:func:`read_stream`), and classifying its
records (:func:`classify`, pure). Checkpoints go back to the caller, which persists them with
what it derived. docs/global.md, "Stream reading".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from rasd.core.lease import US

ACQUIRE = "acquire"
RELEASE = "release"
MOVE = "move"

#: GetRecords page size (DynamoDB Streams maximum: 1000).
PAGE = 1000


class NoStream(Exception):
    """The table has no stream (docs/schema.md: NEW_AND_OLD_IMAGES): the balancer cannot run."""


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one resource item."""

    kind: str  # ACQUIRE | RELEASE | MOVE
    client_id: str
    pool_id: str
    region: str  # where it happened (for MOVE: the destination)
    resource: str
    from_region: str | None = None  # MOVE only
    at_us: int | None = None  # ApproximateCreationDateTime, when the record has it


def _s(image: dict[str, Any] | None, name: str) -> str | None:
    if not image:
        return None
    v = image.get(name)
    if not isinstance(v, dict):
        return None
    s = v.get("S")
    return s if isinstance(s, str) else None


def _at_us(ddb: dict[str, Any]) -> int | None:
    t = ddb.get("ApproximateCreationDateTime")
    if isinstance(t, datetime):
        return int(t.timestamp() * US)
    if isinstance(t, (int, float)):  # the wire form: epoch seconds
        return int(t * US)
    return None


def classify(record: dict[str, Any]) -> list[Event]:
    """Events in one stream record (low-level attribute maps, as boto3 returns them).

    * ACQUIRE: the item gains a ``key`` (no key before, one after; also an INSERT carrying a
      key) or its ``key`` changes to another key;
    * RELEASE: the item loses its ``key`` (early release or liberation; also a leased item
      deleted);
    * MOVE: the item's ``region`` changes (the balancer's own writes).

    Meta items (``client_id`` starting with ``#``: pools, counters, locks, acquisition locks)
    and writes that change none of these (extensions, re-lets, inserts of free items) yield
    nothing. Re-lets of an expired lease to the same key are not new demand.
    """
    ddb = record.get("dynamodb") or {}
    old = ddb.get("OldImage")
    new = ddb.get("NewImage")
    img = new or old
    client = _s(img, "client_id") or _s(ddb.get("Keys"), "client_id")
    resource = _s(img, "resource") or _s(ddb.get("Keys"), "resource")
    if not client or client.startswith("#") or resource is None:
        return []
    pool = _s(img, "pool_id") or _s(old, "pool_id")
    if pool is None:
        return []
    at = _at_us(ddb)
    old_key, new_key = _s(old, "key"), _s(new, "key")
    old_region, new_region = _s(old, "region"), _s(new, "region")
    out: list[Event] = []
    if old_region and new_region and old_region != new_region:
        out.append(Event(MOVE, client, pool, new_region, resource, old_region, at))
    if new_key is not None and new_key != old_key:
        if old_key is not None and old_region:  # a key change: the old key let go of it
            out.append(Event(RELEASE, client, pool, old_region, resource, at_us=at))
        if new_region:
            out.append(Event(ACQUIRE, client, pool, new_region, resource, at_us=at))
    elif new_key is None and old_key is not None and old_region:
        out.append(Event(RELEASE, client, pool, old_region, resource, at_us=at))
    return out


# ------------------------------------------------------------------------------- reading
@dataclass(slots=True)
class StreamRead:
    """What one pass over the stream produced."""

    stream_arn: str
    checkpoints: dict[str, str]  # shard id -> last sequence number processed
    events: list[Event] = field(default_factory=list)
    records: int = 0
    shards: int = 0
    caught_up: bool = True  # False when the time budget ended the pass
    first_at_us: int | None = None
    last_at_us: int | None = None


def stream_arn(ddb: Any, table: str) -> str:
    arn = ddb.describe_table(TableName=table)["Table"].get("LatestStreamArn")
    if not arn:
        raise NoStream(f"table {table} has no stream (docs/schema.md: NEW_AND_OLD_IMAGES)")
    return str(arn)


def _shards(streams: Any, arn: str) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = []
    kw: dict[str, Any] = {"StreamArn": arn}
    while True:
        desc = streams.describe_stream(**kw)["StreamDescription"]
        shards.extend(desc.get("Shards", []))
        last = desc.get("LastEvaluatedShardId")
        if not last:
            return shards
        kw["ExclusiveStartShardId"] = last


def parents_first(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shards ordered so that a parent (when still listed) comes before its children, so the
    records of one item are seen in order across a shard split. Stable by shard id."""
    by_id = {s["ShardId"]: s for s in shards}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def visit(s: dict[str, Any]) -> None:
        sid = s["ShardId"]
        if sid in seen:
            return
        seen.add(sid)
        parent = s.get("ParentShardId")
        if parent in by_id:
            visit(by_id[parent])
        out.append(s)

    for s in sorted(shards, key=lambda s: s["ShardId"]):
        visit(s)
    return out


def _iterator(streams: Any, arn: str, shard_id: str, after: str | None) -> str | None:
    if after is not None:
        try:
            it = streams.get_shard_iterator(
                StreamArn=arn,
                ShardId=shard_id,
                ShardIteratorType="AFTER_SEQUENCE_NUMBER",
                SequenceNumber=after,
            )
            return it.get("ShardIterator")  # type: ignore[no-any-return]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("TrimmedDataAccessException", "ValidationException"):
                raise
            # the checkpoint is older than the stream's 24 h retention: read what is left
    it = streams.get_shard_iterator(
        StreamArn=arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )
    return it.get("ShardIterator")  # type: ignore[no-any-return]


def _records(
    streams: Any, iterator: str | None, deadline: float, clock: Callable[[], float]
) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """Pages of records; the flag says the shard is finished (closed) or caught up."""
    while iterator is not None:
        if clock() >= deadline:
            return
        resp = streams.get_records(ShardIterator=iterator, Limit=PAGE)
        recs = resp.get("Records", [])
        iterator = resp.get("NextShardIterator")
        # An empty page of an open shard means caught up; the next run continues from the
        # checkpoint, so stopping early only delays records by one run, never loses them.
        yield recs, (iterator is None or not recs)
        if not recs:
            return


def read_stream(
    streams: Any,
    arn: str,
    checkpoints: dict[str, str],
    budget_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
) -> StreamRead:
    """Read every shard from its checkpoint until caught up or ``budget_s`` is spent."""
    deadline = clock() + budget_s
    shards = parents_first(_shards(streams, arn))
    live = {s["ShardId"] for s in shards}
    # checkpoints of shards the stream no longer lists (trimmed after 24 h) are dropped
    out = StreamRead(arn, {k: v for k, v in checkpoints.items() if k in live}, shards=len(shards))
    for shard in shards:
        sid = shard["ShardId"]
        it = _iterator(streams, arn, sid, out.checkpoints.get(sid))
        finished = it is None
        for recs, done in _records(streams, it, deadline, clock):
            for rec in recs:
                out.records += 1
                seq = (rec.get("dynamodb") or {}).get("SequenceNumber")
                evs = classify(rec)
                out.events.extend(evs)
                at = _at_us(rec.get("dynamodb") or {})
                if at is not None:
                    out.first_at_us = at if out.first_at_us is None else min(out.first_at_us, at)
                    out.last_at_us = at if out.last_at_us is None else max(out.last_at_us, at)
                if seq:
                    out.checkpoints[sid] = str(seq)
            finished = done
        if not finished:
            out.caught_up = False
            break  # budget spent: keep shard order, do not read children past a parent
    return out
