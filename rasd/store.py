"""The only module of the daemon that talks to DynamoDB, through one long-lived client: the lean
one (``rasd.ddb``, the default) or aioboto3's (``ddb_client = "botocore"``).

Uses GetItem, Query and UpdateItem only (single-item operations: any DynamoDB-compatible
engine serves them). Throttling, 5xx and network errors are retried with full-jitter backoff
inside the request's deadline. Every call is counted by operation in ``counters``
(``ddb.Query``, ``ddb.UpdateItem``...), which is how the tests prove that a cache hit made no
DynamoDB call.

Writes (``write``) never guess (docs/design.md, I4): each returns an ``Outcome``. APPLIED
carries the item as written. REJECTED means the write did not and will not apply: its
condition failed (a lost race, a normal value), or nothing that could apply was ever sent.
UNKNOWN means an attempt may have applied (a timeout, a lost reply, a 5xx) and no read-back
could tell before the deadline. Each attempt gets at most ATTEMPT_SHARE of the time left, so
an attempt that hangs leaves time for a retry or a read-back within the request's deadline.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)

from .config import Config
from .ddb import ConnectFailed
from .decide import Outcome
from .errors import RasdError, Timeout, Unavailable
from .lease import (
    META_CLIENT,
    Item,
    Mapping,
    Pool,
    ResourceItem,
    Update,
    item_from_ddb,
    map_pk,
    mapping_from,
    pool_from_ddb,
    pool_meta_key,
)
from .limits import CircuitBreaker
from .metrics import Counters
from .writes import ItemKey, Value, Write, item_from_av, key_av, render

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
#: An attempt may use at most this share of the time left before the deadline (all of it when
#: less than MIN_ATTEMPT is left): a hung attempt leaves time for a retry or a read-back.
ATTEMPT_SHARE = 0.6
MIN_ATTEMPT = 0.1


@dataclass(frozen=True, slots=True)
class WriteResult:
    outcome: Outcome
    #: the item as written (APPLIED), as a plain dict (``rasd.writes.item_from_av``)
    item: dict[str, Value] | None = None
    #: why the outcome is not APPLIED, when an error (not a condition) decided it
    error: RasdError | None = None


class Store:
    """DynamoDB access for one daemon. ``start()`` opens and warms the connection pool."""

    def __init__(self, config: Config, counters: Counters | None = None) -> None:
        self.config = config
        self.table = config.table
        self.counters = counters or Counters()
        self._client: Any = None
        self._ctx: Any = None
        #: the last failure seen (operation and reason), named in "circuit breaker open"
        self.last_failure: str | None = None
        self.breaker = CircuitBreaker(
            config.breaker_failures, config.breaker_window, config.breaker_cooldown
        )

    # ------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.config
        region = os.environ.get("AWS_REGION") or cfg.region
        if cfg.ddb_client == "lean":
            from .ddb import LeanDynamoDB

            self._client = await LeanDynamoDB.create(
                cfg.endpoint_url,
                region,
                max_connections=cfg.ddb_max_connections,
                connect_timeout=cfg.ddb_connect_timeout,
                read_timeout=cfg.ddb_read_timeout,
            )
            self._ctx = self._client
            return
        # aioboto3 takes about a second to import: only this path pays for it
        import aioboto3
        from aiobotocore.config import AioConfig

        session = aioboto3.Session()
        self._ctx = session.client(
            "dynamodb",
            region_name=region,
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

    @property
    def client(self) -> Any:
        """The DynamoDB client in use: ``rasd.ddb.LeanDynamoDB`` or aiobotocore's, by
        ``ddb_client`` (None before ``start()``)."""
        return self._client

    def wrap_client(self, wrap: Callable[[Any], Any]) -> None:
        """Put a wrapper around the started client (fault injection in tests:
        ``rasd.testing``). Every later call goes through ``wrap(client)``."""
        if self._client is None:
            raise RuntimeError("wrap_client() needs a started Store (await store.start())")
        self._client = wrap(self._client)

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
        method = getattr(self._client, OPERATIONS[op])
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
                    f"DynamoDB is failing ({self.last_failure or 'unknown'}); circuit breaker open",
                    retry_after=round(breaker.retry_after(now), 3),
                )
            self.counters.inc(f"ddb.{op}")
            budget = left if left < MIN_ATTEMPT else max(MIN_ATTEMPT, left * ATTEMPT_SHARE)
            try:
                async with asyncio.timeout(budget):
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
                elif code in RETRYABLE or _status(exc) >= 500:
                    # (any 5xx: a proxy's or an overloaded server's page has no error type)
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
                if ambiguous is not None:
                    ambiguous.append(True)  # sent, no answer: the write may have landed
                if time.monotonic() >= deadline - 0.001:
                    raise Timeout(f"DynamoDB {op}: no answer within the deadline") from None
                reason = "timeout"
            except (BotoCoreError, OSError) as exc:
                breaker.record_failure(time.monotonic())
                self.counters.inc("ddb.errors")
                if ambiguous is not None and not _never_sent(exc):
                    ambiguous.append(True)  # e.g. a read timeout: the write may have landed
                reason = type(exc).__name__
            self.last_failure = f"{op}: {reason}"
            sleep = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))
            if time.monotonic() + sleep >= deadline:
                if reason == "timeout":
                    raise Timeout(f"DynamoDB {op}: no answer within the deadline")
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
            pools.extend(pool_from_ddb(it) for it in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return pools
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def get_pool(self, client_id: str, pool_id: str, deadline: float) -> Pool | None:
        resp = await self._call("GetItem", deadline, Key=pool_meta_key(client_id, pool_id))
        assert resp is not None
        item = resp.get("Item")
        return pool_from_ddb(item) if item else None

    async def query_mappings(
        self, client_id: str, pool_id: str, key: str, deadline: float
    ) -> list[Mapping]:
        """The key's mapping items, one per region: a strongly consistent Query of one
        partition (our region's item is exact; other regions' are replicated copies)."""
        resp = await self._call(
            "Query",
            deadline,
            KeyConditionExpression="client_id = :pk",
            ExpressionAttributeValues={":pk": {"S": map_pk(client_id, pool_id, key)}},
            ConsistentRead=True,
        )
        assert resp is not None
        return [mapping_from(item_from_av(it)) for it in resp.get("Items", [])]

    async def query_leased(
        self, client_id: str, pool_id: str, key: str, deadline: float
    ) -> list[ResourceItem]:
        """The items the ``leased_resources`` index shows held by ``key`` in the pool (any
        region). An index read: eventually consistent, only a hint of where to look."""
        resp = await self._call(
            "Query",
            deadline,
            IndexName="leased_resources",
            KeyConditionExpression="#k = :k AND pool_id = :p",
            ExpressionAttributeNames={"#k": "key"},
            ExpressionAttributeValues={":k": {"S": key}, ":p": {"S": pool_id}},
        )
        assert resp is not None
        items = (item_from_ddb(it) for it in resp.get("Items", []))
        return [it for it in items if it.client_id == client_id]

    async def get_item(self, key: ItemKey, deadline: float) -> dict[str, Value] | None:
        """One item, strongly consistent, as a plain dict (None if absent)."""
        resp = await self._call("GetItem", deadline, Key=key_av(key), ConsistentRead=True)
        assert resp is not None
        item = resp.get("Item")
        return item_from_av(item) if item else None

    async def query_available(
        self,
        partition: str,
        limit: int,
        forward: bool,
        deadline: float,
        after: tuple[str, str, str] | None = None,
    ) -> list[ResourceItem]:
        """Up to ``limit`` free items of one sub-partition (``available_resources`` index) in
        the direction asked: from an end, or ``after`` a position (lease_available, client_id,
        resource) that need not name an item (DynamoDB, moto and dynalite place such an
        ``ExclusiveStartKey`` where it would sort): how daemons spread over a pool."""
        kw: dict[str, Any] = {
            "IndexName": "available_resources",
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": "partition"},
            "ExpressionAttributeValues": {":p": {"S": partition}},
            "Limit": limit,
            "ScanIndexForward": forward,
        }
        if after is not None:
            lease_available, client_id, resource = after
            kw["ExclusiveStartKey"] = {
                "partition": {"S": partition},
                "lease_available": {"S": lease_available},
                "client_id": {"S": client_id},
                "resource": {"S": resource},
            }
        resp = await self._call("Query", deadline, **kw)
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
    async def write(
        self,
        w: Write,
        deadline: float,
        mine: Callable[[dict[str, Value]], bool] | None = None,
    ) -> WriteResult:
        """One conditional write; never raises for DynamoDB's or the network's failures.

        A retry after an ambiguous attempt may fail its condition because the *first*
        attempt applied. Then, if ``mine`` is given, the item is read back (strongly
        consistent) and the write counts as APPLIED when ``mine(item)`` says it carries it.
        """
        ambiguous: list[bool] = []
        try:
            resp = await self._call(
                "UpdateItem", deadline, ambiguous, ReturnValues="ALL_NEW", **render(w)
            )
        except RasdError as exc:
            if ambiguous:
                self.counters.inc("ddb.unknown_writes")
                return WriteResult(Outcome.UNKNOWN, error=exc)
            return WriteResult(Outcome.REJECTED, error=exc)  # nothing that could apply was sent
        if resp is not None:
            return WriteResult(Outcome.APPLIED, item_from_av(resp["Attributes"]))
        if ambiguous and mine is not None:
            self.counters.inc("ddb.ambiguous_writes")
            try:
                cur = await self.get_item(w.key, deadline)
            except RasdError as exc:
                self.counters.inc("ddb.unknown_writes")
                return WriteResult(Outcome.UNKNOWN, error=exc)
            if cur is not None and mine(cur):
                self.counters.inc("ddb.ambiguous_applied")
                return WriteResult(Outcome.APPLIED, cur)
        return WriteResult(Outcome.REJECTED)

    async def update_raw(self, upd: Update, deadline: float) -> bool:
        """A conditional UpdateItem on a meta item (miss counters): did it apply?"""
        return await self._call("UpdateItem", deadline, **upd) is not None


#: The DynamoDB operations the daemon uses, and the client method of each.
OPERATIONS: dict[str, str] = {
    "GetItem": "get_item",
    "Query": "query",
    "UpdateItem": "update_item",
}


def _status(exc: ClientError) -> int:
    """The HTTP status of a DynamoDB error answer (0 if unknown)."""
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status if isinstance(status, int) else 0


def _never_sent(exc: BaseException) -> bool:
    """Did this failure happen before the request was on the wire (so a write that met it did
    not apply)? Only connection set-up failures qualify. aiobotocore also maps aiohttp's
    generic connection errors, a reset after the request went out among them, to
    EndpointConnectionError, so that class alone proves nothing: its cause must be a connect
    error (the lean client's causes are all of that kind: ``rasd.ddb.ConnectFailed``)."""
    if isinstance(exc, ConnectTimeoutError):
        return True
    if not isinstance(exc, EndpointConnectionError):
        return False
    cause = getattr(exc, "kwargs", {}).get("error")
    if isinstance(cause, ConnectionRefusedError | socket.gaierror | ConnectFailed):
        return True
    aiohttp = sys.modules.get("aiohttp")  # imported only by the botocore path
    return aiohttp is not None and isinstance(cause, aiohttp.ClientConnectorError)
