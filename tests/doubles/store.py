"""A fault-injecting DynamoDB client around the real Store.

Faults are injected *below* ``Store._call``: the DynamoDB client the store talks to
(``rasd.dynamo.ddb``'s or aiobotocore's, by ``ddb_client``) is wrapped, and a planned fault raises
the exception botocore itself would raise, which ``rasd.dynamo.ddb`` raises for the same condition
too: ``ClientError`` with the real error-code shape, ``ReadTimeoutError``,
``EndpointConnectionError``. So the store's own retry, backoff, deadline and counting logic
(``ddb.throttles``, ``ddb.errors``, ``Unavailable``...) runs exactly as in production, and
each injected attempt is counted as a call, as a real failed attempt is.

Usage (integration tests, against moto's server)::

    faults = Faults(seed=1)
    store = FaultyStore(cfg, faults=faults)        # or: store = Store(cfg) ...
    await store.start()                            #     await store.start()
                                                   #     install(store, faults)
    faults.add("throttle", ops={"Query"}, times=3)          # next 3 Queries throttled
    faults.add("down", probability=0.2)                     # 20% of every call refused
    faults.add("slow", ops={"UpdateItem"}, delay=0.3)      # every UpdateItem 300 ms late
    ...
    assert faults.injected["throttle"] == 3
    faults.clear()                                          # heal

Rules are checked in the order added; the first that matches the operation and fires (by
its probability) applies, and a rule with ``times`` is removed once used up. ``Faults`` is
plain mutable state: tests change the plan while the daemon runs.

Kinds:

``throttle``      ``ProvisionedThroughputExceededException`` (HTTP 400): retried, counted as
                  ``ddb.throttles``.
``server_error``  ``InternalServerError`` (HTTP 500): retried, counted as ``ddb.errors``.
``timeout``       ``ReadTimeoutError`` after ``delay`` seconds (default 0): what aiobotocore
                  raises when DynamoDB does not answer within ``read_timeout``; retried.
``down``          ``EndpointConnectionError`` (connection refused): retried.
``slow``          waits ``delay`` seconds, then makes the real call (a long delay exercises
                  the deadline path: ``Store._call``'s own ``asyncio.timeout``).
``lost_reply``    the real call is made (a write APPLIES), then its reply is lost: after
                  ``delay`` seconds, ``ReadTimeoutError``, or the store's own attempt timeout
                  first. What the daemon must never act on without reading back (I4).
``condition``     ``ConditionalCheckFailedException``: a lost race (``None``), not an error.
``validation``    ``ValidationException`` (HTTP 400): not retryable; ``Unavailable`` at once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from rasd.config import Config
from rasd.dynamo.store import OPERATIONS, Store
from rasd.observe.metrics import Counters

FaultKind = Literal[
    "throttle", "server_error", "timeout", "down", "slow", "condition", "validation", "lost_reply"
]
KINDS: frozenset[str] = frozenset(get_args(FaultKind))
_OPS_BY_METHOD = {method: op for op, method in OPERATIONS.items()}
FAKE_ENDPOINT = "https://dynamodb.faulty.invalid"


@dataclass
class Rule:
    """One planned fault. ``ops`` None means every operation; ``times`` None means forever."""

    kind: FaultKind
    ops: frozenset[str] | None = None
    probability: float = 1.0
    times: int | None = None
    delay: float = 0.0
    used: int = 0

    def matches(self, op: str) -> bool:
        return self.ops is None or op in self.ops


@dataclass
class Faults:
    """A mutable fault plan, consulted once per DynamoDB attempt."""

    seed: int | None = None
    rules: list[Rule] = field(default_factory=list)
    #: How many faults of each kind were injected.
    injected: Counter[str] = field(default_factory=Counter)
    #: Every attempt seen: (operation, kind injected or None).
    history: list[tuple[str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def add(
        self,
        kind: FaultKind,
        *,
        ops: Iterable[str] | None = None,
        probability: float = 1.0,
        times: int | None = None,
        delay: float = 0.0,
    ) -> Rule:
        """Plan a fault. ``ops`` are operation names (``"Query"``, ``"UpdateItem"``...)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {sorted(KINDS)}")
        op_set = None if ops is None else frozenset(ops)
        unknown = (op_set or frozenset()) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown DynamoDB operations {sorted(unknown)}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 (or None for ever)")
        if delay < 0:
            raise ValueError("delay must be >= 0")
        rule = Rule(kind, op_set, probability, times, delay)
        self.rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        if rule in self.rules:
            self.rules.remove(rule)

    def clear(self) -> None:
        """Heal: no more faults (counts and history are kept)."""
        self.rules.clear()

    def pick(self, op: str) -> Rule | None:
        """The fault for this attempt of ``op``, if any; uses up one of a rule's ``times``."""
        chosen: Rule | None = None
        for rule in self.rules:
            if not rule.matches(op):
                continue
            if rule.probability < 1.0 and self.rng.random() >= rule.probability:
                continue
            chosen = rule
            break
        if chosen is not None:
            chosen.used += 1
            self.injected[chosen.kind] += 1
            if chosen.times is not None and chosen.used >= chosen.times:
                self.rules.remove(chosen)
        self.history.append((op, chosen.kind if chosen else None))
        return chosen

    def calls(self, op: str | None = None) -> int:
        """Attempts seen (of ``op``, or all)."""
        return sum(1 for o, _ in self.history if op is None or o == op)


def fault_exception(kind: FaultKind, op: str) -> Exception | None:
    """The botocore exception a real failure of this kind raises (None for slow)."""
    if kind in ("throttle", "server_error", "condition", "validation"):
        code, status, message = {
            "throttle": (
                "ProvisionedThroughputExceededException",
                400,
                "The level of configured provisioned throughput for the table was exceeded.",
            ),
            "server_error": ("InternalServerError", 500, "Internal server error"),
            "condition": ("ConditionalCheckFailedException", 400, "The conditional request failed"),
            "validation": ("ValidationException", 400, "injected validation error"),
        }[kind]
        prefix = "" if kind == "server_error" else "com.amazonaws.dynamodb.v20120810#"
        response: dict[str, Any] = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {
                "RequestId": f"FAULT-{kind.upper()}",
                "HTTPStatusCode": status,
                "HTTPHeaders": {"x-amzn-errortype": f"{prefix}{code}"},
                "RetryAttempts": 0,
            },
        }
        return ClientError(response, op)  # type: ignore[arg-type]
    if kind in ("timeout", "lost_reply"):
        return ReadTimeoutError(endpoint_url=FAKE_ENDPOINT)
    if kind == "down":
        return EndpointConnectionError(
            endpoint_url=FAKE_ENDPOINT, error=ConnectionRefusedError(111, "Connection refused")
        )
    return None


Sleep = Callable[[float], Awaitable[object]]


class FaultyClient:
    """Wraps the store's DynamoDB client: the store's operations consult the plan,
    anything else passes straight through."""

    def __init__(self, inner: Any, faults: Faults, *, sleep: Sleep = asyncio.sleep) -> None:
        self._inner = inner
        self.faults = faults
        self._sleep = sleep

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._inner, name)
        op = _OPS_BY_METHOD.get(name)
        if op is None:
            return real

        async def call(**kw: Any) -> Any:
            rule = self.faults.pick(op)
            if rule is not None and rule.kind == "lost_reply":
                await real(**kw)  # applied...
                await self._sleep(rule.delay)  # ...and the reply never comes
                raise ReadTimeoutError(endpoint_url=FAKE_ENDPOINT)
            if rule is not None:
                if rule.kind in ("slow", "timeout") and rule.delay > 0:
                    await self._sleep(rule.delay)
                exc = fault_exception(rule.kind, op)
                if exc is not None:
                    raise exc
            return await real(**kw)

        return call

    def __repr__(self) -> str:
        return f"FaultyClient({self._inner!r}, rules={len(self.faults.rules)})"


def install(store: Store, faults: Faults, *, sleep: Sleep = asyncio.sleep) -> Faults:
    """Wrap a started store's client with ``faults`` (idempotent). Returns ``faults``."""
    if isinstance(store.client, FaultyClient):
        store.client.faults = faults
    else:
        store.wrap_client(lambda inner: FaultyClient(inner, faults, sleep=sleep))
    return faults


class FaultyStore(Store):
    """The real :class:`Store`, whose DynamoDB client injects the faults planned in
    ``self.faults`` (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        counters: Counters | None = None,
        *,
        faults: Faults | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(config, counters, rng=rng)
        self.faults = faults if faults is not None else Faults()
        self._sleep = sleep

    async def start(self) -> None:
        await super().start()
        install(self, self.faults, sleep=self._sleep)
