"""The only module of the daemon that talks to DynamoDB (:class:`Store`), through one
long-lived client: the lean one (``rasd.dynamo.ddb``) or aioboto3's.

GetItem, Query and single-item writes only, retried within the request's deadline; every
write returns an ``Outcome`` and never guesses (I4); calls counted by operation.
docs/design.md, "Talking to DynamoDB".
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
)

from ..config import Config
from ..core.decide import Outcome
from ..core.errors import RasdError, Timeout, Unavailable
from ..core.lease import META_CLIENT, Item, Mapping, Pool, ResourceItem, Update, map_pk
from ..core.map_builders import read_back
from ..core.reads import available_query, leased_query
from ..core.rollout import ROLLOUT_KEY, SIGNAL_KEY, Rollout, rollout_from
from ..core.serialize import item_from_ddb, mapping_from, pool_from_ddb, pool_meta_key
from ..core.writes import ItemKey, Value, Write, item_from_av, key_av, render
from ..limits import CircuitBreaker
from ..observe.metrics import Counters
from ..steps import WriteResult
from .aws import AwsSettings
from .clients import open_client
from .heard import HEARD
from .retry import MIN_ATTEMPT, Failure, RetryPolicy, attempt_budget, attempt_failed
from .retry import request_id as _rid

log = structlog.get_logger("rasd.dynamo.store")

Sleep = Callable[[float], Awaitable[object]]


class Store:
    """DynamoDB access for one daemon. ``start()`` resolves the AWS settings, opens and warms
    the connection pool. ``rng`` (a float in [0, 1)) and ``sleep`` drive the retry backoff:
    tests pass their own."""

    def __init__(
        self,
        config: Config,
        counters: Counters | None = None,
        *,
        rng: Callable[[], float] = random.random,
        sleep: Sleep = asyncio.sleep,
        region: str | None = None,
        on_date: Callable[[bytes, float], None] | None = None,
    ) -> None:
        self.config = config
        #: the replica's region, when it is another region's (a strict pool's home): it
        #: decides the endpoint and the signature, whatever AWS_REGION says
        self.peer_region = region
        self.table = config.table
        self.counters = counters or Counters()
        self._client: Any = None
        self._ctx: Any = None
        #: the last failure seen (operation and reason), named in "circuit breaker open"
        self.last_failure: str | None = None
        self.breaker = CircuitBreaker(
            config.breaker_failures, config.breaker_window, config.breaker_cooldown
        )
        self._rng = rng
        self._sleep = sleep
        #: botocore's standard mode; ``max_attempts`` is the AWS settings' (set by start())
        self.retry = RetryPolicy(rng=rng)
        #: the AWS settings in effect (``rasd.dynamo.aws``), once start() resolved them
        self.aws: AwsSettings | None = None
        #: told every answer's Date header and when its request left (monotonic s): the
        #: daemon's clock watch (``rasd.server.clockwatch``)
        self.on_date = on_date

    # ------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Raises ``rasd.dynamo.aws.AwsSettingsError`` for an AWS setting rasd cannot honour."""
        region = self.peer_region or os.environ.get("AWS_REGION") or self.config.region
        self._ctx, self._client, self.aws = await open_client(self.config, region, self.on_date)
        self.retry = RetryPolicy(self.aws.max_attempts, rng=self._rng)

    async def confirm_aws(self) -> AwsSettings | None:
        """When the AWS settings came from the cache (``rasd.dynamo.awscache``), botocore's own
        resolution of them, in the background: None when it agrees, else botocore's settings
        (the daemon must not go on with the cached ones). Raises ``AwsSettingsError`` when
        botocore refuses them."""
        confirm = getattr(self._ctx, "confirm_settings", None)  # the lean client only
        return None if confirm is None else await confirm()

    async def warm(self, deadline_s: float = 10.0) -> None:
        """Open ``ddb_warm_connections`` connections so the first requests find them ready,
        and (the lean client) keep that many usable: replaced before they age out."""
        n = max(1, self.config.ddb_warm_connections)
        deadline = time.monotonic() + deadline_s
        await asyncio.gather(*(self._warm_one(deadline) for _ in range(n)))
        keep = getattr(self._client, "keep_warm", None)
        if keep is not None:
            keep(self.config.ddb_warm_connections)

    async def _warm_one(self, deadline: float) -> None:
        await self._call("GetItem", deadline, Key=pool_meta_key("#warm", "#warm"))

    @property
    def client(self) -> Any:
        """The DynamoDB client in use: ``rasd.dynamo.ddb.LeanDynamoDB`` or aiobotocore's, by
        ``ddb_client`` (None before ``start()``)."""
        return self._client

    def wrap_client(self, wrap: Callable[[Any], Any]) -> None:
        """Put a wrapper around the started client (fault injection in tests:
        ``tests.doubles.store``). Every later call goes through ``wrap(client)``."""
        if self._client is None:
            raise RuntimeError("wrap_client() needs a started Store (await store.start())")
        self._client = wrap(self._client)

    async def close(self) -> None:
        if self._ctx is not None:
            await self._ctx.__aexit__(None, None, None)
            self._ctx = None
            self._client = None

    # ---------------------------------------------------------------------------- calls
    def _heard(self, now: float) -> None:
        """DynamoDB answered a call (whatever it said): for the breaker, and for the request
        the call was made for when it keeps count (:data:`HEARD`)."""
        self.breaker.record_success(now)
        heard = HEARD.get()
        if heard is not None:
            heard.append(now)

    async def _call(
        self, op: str, deadline: float, ambiguous: list[bool] | None = None, **kw: Any
    ) -> dict[str, Any] | None:
        """One DynamoDB call with retries (``rasd.dynamo.retry``) until ``deadline`` (monotonic s).

        Returns None when a condition failed (a lost race). Raises ``Timeout`` when DynamoDB
        gave no answer before the deadline, ``Unavailable`` when it kept failing, refused the
        call (or the circuit breaker is open). A failed attempt of a write that may have
        applied appends to ``ambiguous``.
        """
        if self._client is None:
            raise Unavailable(f"DynamoDB {op}: the store is closed")
        method = getattr(self._client, OPERATIONS[op])
        breaker = self.breaker
        policy = self.retry
        counters = self.counters
        share = self.config.ddb_attempt_share
        attempt = 0
        cost = 0  # the quota the last retry took
        refreshed = False
        rid = ""  # the request id of DynamoDB's last error answer
        while True:
            attempt += 1
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                counters.inc("ddb.deadline")
                raise Timeout(
                    f"DynamoDB {op}: deadline passed after {attempt - 1} tries{_rid(rid)}"
                )
            if not breaker.allow(now):
                counters.inc("ddb.breaker_open")
                raise Unavailable(
                    f"DynamoDB is failing ({self.last_failure or 'unknown'}); circuit breaker open",
                    retry_after=round(breaker.retry_after(now), 3),
                )
            counters.inc(f"ddb.{op}")
            budget = attempt_budget(left, share)
            try:
                async with asyncio.timeout(budget):
                    resp: dict[str, Any] = await method(TableName=self.table, **kw)
                if self.on_date is not None and self.config.ddb_client != "lean":
                    date = resp["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
                    if date:  # botocore keeps the headers; the lean client reports them itself
                        self.on_date(date.encode(), now)
                self._heard(time.monotonic())
                if cost or policy.quota.available != policy.quota.capacity:
                    policy.succeeded(cost)
                return resp
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    self._heard(time.monotonic())
                    policy.succeeded(cost)  # DynamoDB answered: a lost race, not trouble
                    counters.inc("ddb.conditional_failed")
                    return None
                failure, never_sent, reason, detail, rid = attempt_failed(exc, rid)
            except (TimeoutError, BotoCoreError, OSError) as exc:
                failure, never_sent, reason, detail, rid = attempt_failed(exc, rid)
            now = time.monotonic()
            if failure is Failure.EXPIRED_TOKEN:
                self._heard(now)  # DynamoDB answered
                counters.inc("ddb.expired_token")
                refresh = getattr(self._client, "refresh_credentials", None)
                if not refreshed and refresh is not None:
                    refreshed = True  # one forced refresh and one more attempt per call
                    log.warning("ddb_credentials_expired", op=op, request_id=rid)
                    try:
                        await refresh()
                    except Exception as exc:  # any provider's failure
                        raise Unavailable(
                            f"DynamoDB {op}: credentials expired ({reason}) and could not be "
                            f"refreshed: {type(exc).__name__}: {exc}{_rid(rid)}"
                        ) from exc
                    attempt -= 1  # the attempt with fresh credentials is not a retry
                    continue
                done = "a refresh did not help" if refreshed else "this client cannot refresh them"
                raise Unavailable(
                    f"DynamoDB {op}: credentials expired ({reason}); {done}{_rid(rid)}"
                )
            if failure is Failure.FATAL:
                self._heard(now)  # DynamoDB answered (or this is no outage)
                counters.inc("ddb.errors")
                raise Unavailable(f"DynamoDB {op} failed: {detail}{_rid(rid)}")
            if failure is Failure.THROTTLE:
                counters.inc("ddb.throttles")
                breaker.record_failure(now)  # the fleet backs off together
            elif failure is Failure.CONFLICT:
                counters.inc("ddb.conflicts")  # another writer: DynamoDB itself is fine
                self._heard(now)
            elif failure is Failure.TIMEOUT and budget < MIN_ATTEMPT:
                # The caller's deadline cut this attempt short, not DynamoDB: no evidence of
                # an outage, and one caller's tiny deadlines must not open the breaker on all.
                counters.inc("ddb.timeouts_cut_short")
            else:
                counters.inc("ddb.timeouts" if reason == "timeout" else "ddb.errors")
                breaker.record_failure(now)
            if ambiguous is not None and failure.may_have_applied and not never_sent:
                ambiguous.append(True)  # the write may have landed
            self.last_failure = f"{op}: {reason}"
            if failure is Failure.TIMEOUT and now >= deadline - 0.001:
                raise Timeout(f"DynamoDB {op}: no answer within the deadline{_rid(rid)}")
            decision = policy.after_failure(attempt, failure, now, deadline)
            if not decision.retry:
                counters.inc(f"ddb.gave_up.{decision.reason}")
                why = {
                    "max_attempts": f"after {attempt} attempts",
                    "quota": "retry quota exhausted",
                    "deadline": "no time left to retry",
                }.get(decision.reason, decision.reason)
                if failure is Failure.TIMEOUT and decision.reason == "deadline":
                    raise Timeout(f"DynamoDB {op}: no answer within the deadline{_rid(rid)}")
                # debug: the caller's error (which names the request id) is what gets logged
                log.debug(
                    "ddb_gave_up", op=op, reason=reason, attempts=attempt, why=why, request_id=rid
                )
                raise Unavailable(f"DynamoDB {op}: {detail}, {why}{_rid(rid)}")
            cost = decision.cost
            log.debug(
                "ddb_retry",
                op=op,
                reason=reason,
                attempt=attempt,
                sleep=round(decision.delay, 4),
                request_id=rid,
            )
            await self._sleep(decision.delay)
            if self._client is None:  # closed (shutdown) while this call waited to retry
                raise Unavailable(f"DynamoDB {op}: the store is closed")

    # -------------------------------------------------------------------------- queries
    async def read_rollout(self, deadline: float) -> Rollout:
        """The table's rollout record and the daemons' signal, read at once."""
        record, signal = await asyncio.gather(
            self.get_item(ROLLOUT_KEY, deadline), self.get_item(SIGNAL_KEY, deadline)
        )
        return rollout_from(record, signal)

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
        resp = await self._call("Query", deadline, **leased_query(key, pool_id))
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
        kw = available_query(partition, limit, forward, after)
        resp = await self._call("Query", deadline, **kw)
        assert resp is not None
        return [item_from_ddb(it) for it in resp.get("Items", [])]

    async def query_quarantined(
        self, client_id: str, pool_id: str, region: str, limit: int, deadline: float
    ) -> tuple[list[str], bool]:
        """The ends (``quarantine_until``) of the quarantines of the pool's items in
        ``region`` among the client's first ``limit`` items (one Query of the base table,
        filtered: quarantined items are in no index), and whether that read every item of
        the client. Eventually consistent: only said in NO_CAPACITY's message."""
        resp = await self._call(
            "Query",
            deadline,
            KeyConditionExpression="client_id = :c",
            FilterExpression="pool_id = :p AND #r = :r AND attribute_exists(quarantine_until)",
            ProjectionExpression="quarantine_until",
            ExpressionAttributeNames={"#r": "region"},
            ExpressionAttributeValues={
                ":c": {"S": client_id},
                ":p": {"S": pool_id},
                ":r": {"S": region},
            },
            Limit=limit,
        )
        assert resp is not None
        until = [it["quarantine_until"]["S"] for it in resp.get("Items", [])]
        return until, "LastEvaluatedKey" not in resp

    async def count_available(self, partition: str, deadline: float) -> int:
        kw = available_query(partition, count=True)
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

        After an attempt that may have applied (``ambiguous``), a retry's failed condition
        may be that attempt's own doing, and a write whose every answer was lost may have
        landed. Then, if ``mine`` is given, the item is read back (strongly consistent, while
        the deadline allows) and the write counts as APPLIED when ``mine(item)`` says it
        carries it. Otherwise the outcome is UNKNOWN, never REJECTED: a write that applied
        must not be reported as one that will not.
        """
        ambiguous: list[bool] = []
        try:
            resp = await self._call(
                "UpdateItem", deadline, ambiguous, ReturnValues="ALL_NEW", **render(w)
            )
        except RasdError as exc:
            if not ambiguous:
                return WriteResult(Outcome.REJECTED, error=exc)  # nothing that could apply sent
            return await self._read_back(w, deadline, mine, exc)
        if resp is not None:
            return WriteResult(Outcome.APPLIED, item_from_av(resp["Attributes"]))
        if not ambiguous:
            return WriteResult(Outcome.REJECTED)  # a lost race
        lost = Unavailable(
            "DynamoDB UpdateItem: a retry lost its condition after an attempt that may have applied"
        )
        return await self._read_back(w, deadline, mine, lost)

    async def _read_back(
        self,
        w: Write,
        deadline: float,
        mine: Callable[[dict[str, Value]], bool] | None,
        error: RasdError,
    ) -> WriteResult:
        """The outcome of a write an attempt of which may have applied, from the item read
        back (``map_builders.read_back``): APPLIED when it carries the write, REJECTED only
        when it proves the write never applied, else UNKNOWN with ``error``. A read-back that
        merely does not show the write proves nothing: it may have applied and been written
        over since (I1: its claim may have been answered)."""
        if mine is not None:
            self.counters.inc("ddb.ambiguous_writes")  # a read-back
            try:
                cur = await self.get_item(w.key, deadline)
            except RasdError as exc:
                self.counters.inc("ddb.unknown_writes")
                return WriteResult(Outcome.UNKNOWN, error=exc)
            seen = read_back(w, cur, mine)
            if seen is True:
                self.counters.inc("ddb.ambiguous_applied")
                return WriteResult(Outcome.APPLIED, cur)
            if seen is False:
                return WriteResult(Outcome.REJECTED)
        self.counters.inc("ddb.unknown_writes")
        return WriteResult(Outcome.UNKNOWN, error=error)

    async def update_raw(self, upd: Update, deadline: float) -> bool:
        """A conditional UpdateItem on a meta item (miss counters): did it apply?"""
        return await self._call("UpdateItem", deadline, **upd) is not None


#: The DynamoDB operations the daemon uses, and the client method of each.
OPERATIONS: dict[str, str] = {
    "GetItem": "get_item",
    "Query": "query",
    "UpdateItem": "update_item",
}
