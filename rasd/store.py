"""The only module of the daemon that talks to DynamoDB (through one long-lived aioboto3 client).

Uses GetItem, Query, UpdateItem and BatchWriteItem only. A failed condition is a lost race and
comes back as ``None``; throttling, 5xx and network errors are retried with full-jitter backoff
inside the request's deadline and then raise ``Unavailable``. Every call is counted by
operation in ``counters`` (``ddb.Query``, ``ddb.UpdateItem``...), which is how the tests prove
that a cache hit made no DynamoDB call.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any

import aioboto3
import structlog
from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from .config import Config
from .errors import Timeout, Unavailable
from .lease import (
    META_CLIENT,
    Item,
    Pool,
    ResourceItem,
    Update,
    item_from_ddb,
    pool_meta_key,
)
from .limits import CircuitBreaker
from .metrics import Counters

log = structlog.get_logger("rasd.store")

RETRYABLE = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "LimitExceededException",
        "TransactionConflictException",
    }
)
THROTTLES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
BACKOFF_BASE = 0.01
BACKOFF_CAP = 0.25


class Store:
    """DynamoDB access for one daemon. ``start()`` opens and warms the connection pool."""

    def __init__(self, config: Config, counters: Counters | None = None) -> None:
        self.config = config
        self.table = config.table
        self.counters = counters or Counters()
        self._client: Any = None
        self._ctx: Any = None
        self.breaker = CircuitBreaker(
            config.breaker_failures, config.breaker_window, config.breaker_cooldown
        )

    # ------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.config
        session = aioboto3.Session()
        self._ctx = session.client(
            "dynamodb",
            region_name=os.environ.get("AWS_REGION") or cfg.region,
            endpoint_url=cfg.endpoint_url,
            config=AioConfig(
                max_pool_connections=cfg.ddb_max_connections,
                connect_timeout=cfg.ddb_connect_timeout,
                read_timeout=cfg.ddb_read_timeout,
                retries={"max_attempts": 1, "mode": "standard"},  # we retry, within deadlines
                tcp_keepalive=True,
                connector_args={"keepalive_timeout": 60.0},
            ),
        )
        self._client = await self._ctx.__aenter__()

    async def warm(self, deadline_s: float = 10.0) -> None:
        """Open ``ddb_warm_connections`` connections so the first requests find them ready."""
        n = max(1, self.config.ddb_warm_connections)
        deadline = time.monotonic() + deadline_s
        await asyncio.gather(*(self._warm_one(deadline) for _ in range(n)))

    async def _warm_one(self, deadline: float) -> None:
        await self._call("GetItem", deadline, Key=pool_meta_key("#warm", "#warm"))

    async def close(self) -> None:
        if self._ctx is not None:
            await self._ctx.__aexit__(None, None, None)
            self._ctx = None
            self._client = None

    # ---------------------------------------------------------------------------- calls
    async def _call(
        self, op: str, deadline: float, ambiguous: list[bool] | None = None, **kw: Any
    ) -> dict[str, Any] | None:
        """One DynamoDB call with retries until ``deadline`` (monotonic seconds).

        Returns None when a condition failed (a lost race). Raises ``Timeout`` when DynamoDB
        gave no answer before the deadline, ``Unavailable`` when it kept failing (or the
        circuit breaker is open).
        """
        method = getattr(self._client, _METHODS[op])
        breaker = self.breaker
        attempt = 0
        while True:
            attempt += 1
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                self.counters.inc("ddb.deadline")
                raise Timeout(f"DynamoDB {op}: deadline passed after {attempt - 1} tries")
            if not breaker.allow(now):
                self.counters.inc("ddb.breaker_open")
                raise Unavailable(
                    "DynamoDB is failing; circuit breaker open",
                    retry_after=round(breaker.retry_after(now), 3),
                )
            self.counters.inc(f"ddb.{op}")
            try:
                async with asyncio.timeout(left):
                    resp: dict[str, Any] = await method(TableName=self.table, **kw)
                breaker.record_success(time.monotonic())
                return resp
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code == "ConditionalCheckFailedException":
                    breaker.record_success(time.monotonic())
                    self.counters.inc("ddb.conditional_failed")
                    return None
                if code in THROTTLES:
                    self.counters.inc("ddb.throttles")  # per partition: not an outage
                elif code in RETRYABLE:
                    breaker.record_failure(time.monotonic())
                    self.counters.inc("ddb.errors")
                    if ambiguous is not None:
                        ambiguous.append(True)  # a 5xx write may have been applied
                else:
                    breaker.record_success(time.monotonic())  # DynamoDB answered
                    self.counters.inc("ddb.errors")
                    raise Unavailable(f"DynamoDB {op} failed: {code}: {exc}") from exc
                reason = code
            except TimeoutError:
                breaker.record_failure(time.monotonic())
                self.counters.inc("ddb.timeouts")
                raise Timeout(f"DynamoDB {op}: no answer within the deadline") from None
            except (BotoCoreError, OSError) as exc:
                breaker.record_failure(time.monotonic())
                self.counters.inc("ddb.errors")
                if ambiguous is not None:
                    ambiguous.append(True)  # e.g. a read timeout: the write may have landed
                reason = type(exc).__name__
            sleep = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))
            if time.monotonic() + sleep >= deadline:
                raise Unavailable(f"DynamoDB {op}: {reason}, no time left to retry")
            log.debug("ddb_retry", op=op, reason=reason, attempt=attempt, sleep=sleep)
            await asyncio.sleep(sleep)

    # -------------------------------------------------------------------------- queries
    async def list_pools(self, deadline: float) -> list[Pool]:
        pools: list[Pool] = []
        kw: dict[str, Any] = {
            "KeyConditionExpression": "client_id = :m AND begins_with(#r, :pfx)",
            "ExpressionAttributeNames": {"#r": "resource"},
            "ExpressionAttributeValues": {":m": {"S": META_CLIENT}, ":pfx": {"S": "pool#"}},
        }
        while True:
            resp = await self._call("Query", deadline, **kw)
            assert resp is not None
            pools.extend(_pool_from(it) for it in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return pools
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def get_pool(self, client_id: str, pool_id: str, deadline: float) -> Pool | None:
        resp = await self._call("GetItem", deadline, Key=pool_meta_key(client_id, pool_id))
        assert resp is not None
        item = resp.get("Item")
        return _pool_from(item) if item else None

    async def query_key(
        self, client_id: str, pool_id: str, key: str, deadline: float
    ) -> list[ResourceItem]:
        """Items holding ``key`` in the pool, every region (``leased_resources`` index)."""
        resp = await self._call(
            "Query",
            deadline,
            IndexName="leased_resources",
            KeyConditionExpression="#k = :k AND pool_id = :p",
            ExpressionAttributeNames={"#k": "key"},
            ExpressionAttributeValues={":k": {"S": key}, ":p": {"S": pool_id}},
        )
        assert resp is not None
        items = [item_from_ddb(it) for it in resp.get("Items", [])]
        return [it for it in items if it.client_id == client_id]

    async def query_available(
        self,
        partition: str,
        limit: int,
        forward: bool,
        deadline: float,
        start: str | None = None,
    ) -> list[ResourceItem]:
        """Up to ``limit`` free items of one sub-partition (``available_resources`` index),
        from ``start`` (a lease_available time) on in the direction asked, or from an end."""
        cond = "#p = :p"
        values: dict[str, Any] = {":p": {"S": partition}}
        if start is not None:
            cond += " AND lease_available >= :s" if forward else " AND lease_available <= :s"
            values[":s"] = {"S": start}
        resp = await self._call(
            "Query",
            deadline,
            IndexName="available_resources",
            KeyConditionExpression=cond,
            ExpressionAttributeNames={"#p": "partition"},
            ExpressionAttributeValues=values,
            Limit=limit,
            ScanIndexForward=forward,
        )
        assert resp is not None
        return [item_from_ddb(it) for it in resp.get("Items", [])]

    async def count_available(self, partition: str, deadline: float) -> int:
        kw: dict[str, Any] = {
            "IndexName": "available_resources",
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": "partition"},
            "ExpressionAttributeValues": {":p": {"S": partition}},
            "Select": "COUNT",
        }
        total = 0
        while True:
            resp = await self._call("Query", deadline, **kw)
            assert resp is not None
            total += int(resp.get("Count", 0))
            if "LastEvaluatedKey" not in resp:
                return total
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def get_meta(self, resource: str, deadline: float) -> Item | None:
        resp = await self._call(
            "GetItem",
            deadline,
            Key={"client_id": {"S": META_CLIENT}, "resource": {"S": resource}},
        )
        assert resp is not None
        item: Item | None = resp.get("Item")
        return item

    # --------------------------------------------------------------------------- writes
    async def update(
        self,
        upd: Update,
        deadline: float,
        applied: Callable[[ResourceItem], bool] | None = None,
    ) -> ResourceItem | None:
        """A conditional UpdateItem on a resource item: the new item, or None if we lost.

        A retry after a timeout or 5xx may fail its condition because the *first* attempt was
        applied. When that happened and ``applied`` is given, the item is read back (strongly
        consistent) and returned if ``applied(item)`` says it carries our write.
        """
        ambiguous: list[bool] = []
        resp = await self._call("UpdateItem", deadline, ambiguous, ReturnValues="ALL_NEW", **upd)
        if resp is not None:
            return item_from_ddb(resp["Attributes"])
        if ambiguous and applied is not None:
            self.counters.inc("ddb.ambiguous_writes")
            got = await self._call("GetItem", deadline, Key=upd["Key"], ConsistentRead=True)
            item = got.get("Item") if got else None
            if item is not None and applied(current := item_from_ddb(item)):
                self.counters.inc("ddb.ambiguous_applied")
                return current
        return None

    async def get_lock(self, key: Item, deadline: float) -> Item | None:
        """The per-key acquisition lock item, strongly consistent (None if absent)."""
        resp = await self._call("GetItem", deadline, Key=key, ConsistentRead=True)
        assert resp is not None
        item: Item | None = resp.get("Item")
        return item

    async def update_raw(self, upd: Update, deadline: float) -> bool:
        """A conditional UpdateItem on a non-resource item (locks, counters): did it apply?"""
        return await self._call("UpdateItem", deadline, **upd) is not None


_METHODS = {
    "GetItem": "get_item",
    "Query": "query",
    "UpdateItem": "update_item",
    "BatchWriteItem": "batch_write_item",
}


def _pool_from(item: Item) -> Pool:
    _, client_id, pool_id = item["resource"]["S"].split("#", 2)
    return Pool(client_id, pool_id, int(float(item["max_lease"]["N"]) * 1_000_000))
