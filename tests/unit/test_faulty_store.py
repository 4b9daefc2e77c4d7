"""The fault-injecting Store (tests.doubles.store): its plan, and that its faults drive the real
Store._call logic."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    ReadTimeoutError,
)

import rasd.dynamo.store
from rasd.config import Config
from rasd.core.errors import Timeout, Unavailable
from tests.doubles.store import Faults, FaultyClient, FaultyStore, fault_exception, install


# ----------------------------------------------------------------------------- plan logic
def test_no_rules_no_faults() -> None:
    """An empty plan never injects, but still records every attempt."""
    f = Faults()
    assert f.pick("Query") is None
    assert f.history == [("Query", None)]
    assert f.calls() == 1


def test_next_n_calls_rule_is_used_up_then_removed() -> None:
    """times=N injects into exactly the next N matching attempts."""
    f = Faults()
    f.add("throttle", ops={"Query"}, times=2)
    kinds = [r.kind if (r := f.pick("Query")) else None for _ in range(4)]
    assert kinds == ["throttle", "throttle", None, None]
    assert f.rules == []
    assert f.injected["throttle"] == 2


def test_rules_only_match_their_operations() -> None:
    """A rule for UpdateItem leaves Query alone, and vice versa."""
    f = Faults()
    f.add("down", ops={"UpdateItem"})
    assert f.pick("Query") is None
    rule = f.pick("UpdateItem")
    assert rule is not None and rule.kind == "down"
    assert f.calls("UpdateItem") == 1


def test_first_matching_rule_wins_in_order_added() -> None:
    """Rules apply in the order added; a later rule acts once an earlier one is used up."""
    f = Faults()
    f.add("throttle", times=1)
    f.add("server_error", times=1)
    assert [f.pick("GetItem").kind for _ in range(2)] == ["throttle", "server_error"]  # type: ignore[union-attr]
    assert f.pick("GetItem") is None


def test_probability_is_seeded_and_roughly_right() -> None:
    """Probabilistic rules are reproducible from the seed, and fire about as often as
    asked; a rule that does not fire lets later rules be considered."""
    a, b = Faults(seed=7), Faults(seed=7)
    for f in (a, b):
        f.add("throttle", probability=0.3)
        f.add("slow", delay=0.1)
        for _ in range(1000):
            f.pick("Query")
    assert a.history == b.history
    assert 200 < a.injected["throttle"] < 400
    assert a.injected["throttle"] + a.injected["slow"] == 1000


def test_probability_zero_and_clear() -> None:
    """probability=0 never fires; clear() heals while keeping the counts."""
    f = Faults()
    f.add("down", probability=0.0)
    assert f.pick("Query") is None
    f.add("down", ops={"Query"})
    assert f.pick("Query") is not None
    f.clear()
    assert f.pick("Query") is None
    assert f.injected["down"] == 1


@pytest.mark.parametrize(
    "kw",
    [
        {"kind": "explode"},
        {"kind": "down", "ops": {"Scan"}},
        {"kind": "down", "probability": 1.5},
        {"kind": "down", "times": 0},
        {"kind": "slow", "delay": -1},
    ],
)
def test_bad_rules_are_refused(kw: dict[str, Any]) -> None:
    """A typo in a test's fault plan fails loudly instead of silently injecting nothing."""
    with pytest.raises(ValueError):
        Faults().add(**kw)


# --------------------------------------------------------------------- exception shapes
@pytest.mark.parametrize(
    ("kind", "code", "status"),
    [
        ("throttle", "ProvisionedThroughputExceededException", 400),
        ("server_error", "InternalServerError", 500),
        ("condition", "ConditionalCheckFailedException", 400),
        ("validation", "ValidationException", 400),
    ],
)
def test_client_errors_have_botocore_shape(kind: Any, code: str, status: int) -> None:
    """Injected ClientErrors look like botocore's: code and HTTP status where Store reads them."""
    exc = fault_exception(kind, "Query")
    assert isinstance(exc, ClientError)
    assert exc.response["Error"]["Code"] == code
    assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert exc.operation_name == "Query"


def test_network_faults_are_botocore_errors() -> None:
    """timeout and down raise the botocore classes aiobotocore raises for them."""
    assert isinstance(fault_exception("timeout", "Query"), ReadTimeoutError)
    down = fault_exception("down", "Query")
    assert isinstance(down, EndpointConnectionError)
    assert isinstance(down, BotoCoreError)
    assert fault_exception("slow", "Query") is None


# ------------------------------------------------------- through the real Store._call logic
class FakeClient:
    """Stands in for the aiobotocore client: answers every call at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def query(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("query", kw))
        return {"Items": [], "Count": 0}

    async def update_item(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("update_item", kw))
        return {"Attributes": {}}

    async def close(self) -> None:
        self.calls.append(("close", {}))


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> tuple[rasd.dynamo.store.Store, FakeClient, Faults]:
    s = rasd.dynamo.store.Store(Config(table="t"), rng=lambda: 0.0)  # retries without backoff waits
    fake = FakeClient()
    s._client = fake
    faults = install(s, Faults(seed=1))
    return s, fake, faults


def far() -> float:
    return time.monotonic() + 60.0


async def test_store_retries_injected_throttles_and_counts_them(
    store: tuple[rasd.dynamo.store.Store, FakeClient, Faults],
) -> None:
    """Throttles injected below _call are retried by the store and counted as throttles;
    every attempt counts as a call (ddb.Query)."""
    s, fake, faults = store
    faults.add("throttle", ops={"Query"}, times=2)
    assert await s._call("Query", far(), KeyConditionExpression="x") == {"Items": [], "Count": 0}
    assert s.counters["ddb.Query"] == 3
    assert s.counters["ddb.throttles"] == 2
    assert fake.calls == [("query", {"TableName": "t", "KeyConditionExpression": "x"})]


@pytest.mark.parametrize("kind", ["server_error", "timeout", "down"])
async def test_store_retries_server_and_network_faults(
    store: tuple[rasd.dynamo.store.Store, FakeClient, Faults], kind: Any
) -> None:
    """5xx, read timeouts and refused connections are retried within the deadline and
    counted as errors."""
    s, fake, faults = store
    faults.add(kind, times=1)
    assert await s._call("UpdateItem", far()) == {"Attributes": {}}
    assert s.counters["ddb.UpdateItem"] == 2
    assert s.counters["ddb.errors"] == 1
    assert len(fake.calls) == 1


async def test_store_turns_injected_condition_failure_into_lost_race(
    store: tuple[rasd.dynamo.store.Store, FakeClient, Faults],
) -> None:
    """A conditional-check failure is a value (None), not an exception, and is not retried."""
    s, fake, faults = store
    faults.add("condition", ops={"UpdateItem"}, times=1)
    assert await s._call("UpdateItem", far()) is None
    assert s.counters["ddb.conditional_failed"] == 1
    assert fake.calls == []


async def test_store_raises_unavailable_on_non_retryable_error(
    store: tuple[rasd.dynamo.store.Store, FakeClient, Faults],
) -> None:
    """A non-retryable DynamoDB error surfaces at once as UNAVAILABLE."""
    s, _, faults = store
    faults.add("validation", times=1)
    with pytest.raises(Unavailable, match="ValidationException"):
        await s._call("Query", far())
    assert s.counters["ddb.Query"] == 1


async def test_store_gives_up_when_the_deadline_passes(
    store: tuple[rasd.dynamo.store.Store, FakeClient, Faults],
) -> None:
    """A deadline already passed: the store makes no call and raises TIMEOUT (the
    request's deadline passed; no wall time is spent)."""
    s, fake, faults = store
    faults.add("down")
    with pytest.raises(Timeout):
        await s._call("Query", time.monotonic() - 1.0)
    assert fake.calls == []


async def test_slow_fault_waits_through_the_injected_sleep() -> None:
    """slow delays the real call by `delay` through the (injectable) sleep, then answers."""
    waits: list[float] = []

    async def fake_sleep(s: float) -> None:
        waits.append(s)

    faults = Faults()
    faults.add("slow", ops={"Query"}, delay=0.25, times=1)
    fake = FakeClient()
    client = FaultyClient(fake, faults, sleep=fake_sleep)
    assert await client.query(TableName="t") == {"Items": [], "Count": 0}
    assert waits == [0.25]
    assert fake.calls == [("query", {"TableName": "t"})]


async def test_other_client_methods_pass_through() -> None:
    """Only the store's DynamoDB operations are intercepted; the rest is the real client."""
    faults = Faults()
    faults.add("down")
    fake = FakeClient()
    await FaultyClient(fake, faults).close()
    assert fake.calls == [("close", {})]
    assert faults.history == []


def test_install_needs_a_started_store_and_is_idempotent() -> None:
    """install() on an unstarted store is a clear error; twice does not double-wrap."""
    s = rasd.dynamo.store.Store(Config(table="t"))
    with pytest.raises(RuntimeError, match="started"):
        install(s, Faults())
    s._client = FakeClient()
    install(s, Faults())
    second = Faults()
    install(s, second)
    assert isinstance(s._client, FaultyClient)
    assert not isinstance(s._client._inner, FaultyClient)
    assert s._client.faults is second


async def test_faulty_store_wraps_its_client_on_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """FaultyStore.start() = Store.start() + install(): the plan applies from the first call."""

    async def fake_start(self: rasd.dynamo.store.Store) -> None:
        self._client = FakeClient()

    monkeypatch.setattr(rasd.dynamo.store.Store, "start", fake_start)
    faults = Faults()
    s = FaultyStore(Config(table="t"), faults=faults)
    await s.start()
    assert isinstance(s._client, FaultyClient)
    assert s._client.faults is faults


def test_only_connection_set_up_failures_count_as_never_sent() -> None:
    """A write that met a failure after it was on the wire may have applied (I4): aiobotocore
    maps a connection reset after sending to EndpointConnectionError too, so only connect
    failures are taken as "never sent"."""
    import socket

    import aiohttp
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    from rasd.dynamo.retry import never_sent as _never_sent

    url = "http://x"
    refused = EndpointConnectionError(endpoint_url=url, error=ConnectionRefusedError(111, "x"))
    dns = EndpointConnectionError(endpoint_url=url, error=socket.gaierror("x"))
    reset = EndpointConnectionError(endpoint_url=url, error=aiohttp.ClientOSError(104, "reset"))
    assert _never_sent(refused) and _never_sent(dns)
    assert _never_sent(ConnectTimeoutError(endpoint_url=url))
    assert not _never_sent(reset)
    assert not _never_sent(ReadTimeoutError(endpoint_url=url))
