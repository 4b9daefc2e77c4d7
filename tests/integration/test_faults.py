"""DynamoDB misbehaving under a live daemon: throttling, 5xx, an outage, slowness, overload.

Faults are injected with ``tests.doubles.store.FaultyStore`` *below* ``Store._call``: the
daemon's own retry, deadline, circuit-breaker and shedding logic runs exactly as in production,
against moto's server over HTTP. Lease time comes from a ``FakeClock`` where it matters; the only
real waits are for real timers (the breaker's cooldown, a slow fault) and bounded polls for
background work.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

import rasd_client
from rasd.config import Config
from rasd.core import builders, map_builders, serialize
from rasd.core import lease as lease_items
from rasd.core import writes as item_writes
from rasd.core.clock import Clock
from rasd.core.writes import item_from_av, key_av, render
from rasd.daemon import renewer
from rasd.daemon.candidates import Candidate
from rasd.server import Daemon
from rasd_client import aio as rasd_aio
from tests.doubles.clock import FakeClock
from tests.doubles.store import Faults, FaultyStore, Rule
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import scan_all, seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"
HOUR = timedelta(hours=1)
_ids = itertools.count()


@pytest.fixture
def faulty_daemon(moto_endpoint: str, table: str, short_tmp: Path) -> Callable[..., Any]:
    """``async with faulty_daemon(faults, clock=..., **cfg) as d`` runs a Daemon in this loop
    whose store is a ``FaultyStore`` driven by ``faults`` (the plan may change mid-test)."""

    @asynccontextmanager
    async def factory(
        faults: Faults, clock: Clock | None = None, **overrides: Any
    ) -> AsyncIterator[Daemon]:
        # as make_daemon: the Date header alone, no check with a test's own clock
        overrides.setdefault("clock_check", "date" if clock is None else "off")
        cfg = Config(
            table=table,
            endpoint_url=moto_endpoint,
            socket=str(short_tmp / f"f{next(_ids)}.sock"),
            ddb_warm_connections=1,
            **overrides,
        ).validate()
        # Backoff delays drawn small: these tests are about what the daemon does under faults;
        # the backoff itself is botocore's (tests/unit/test_store_retries.py).
        store = FaultyStore(cfg, faults=faults, rng=lambda: 0.05)
        d = Daemon(cfg, clock=clock, store=store)
        await d.startup()
        try:
            yield d
        finally:
            faults.clear()  # let shutdown's own DynamoDB calls (miss reports) go through
            await d.shutdown(drain=2.0)

    return factory


async def wait_for(pred: Callable[[], bool], what: str, tries: int = 500) -> None:
    """Wait for background work (bounded poll; not a timing assertion)."""
    for _ in range(tries):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def real_clock_fake() -> FakeClock:
    """A FakeClock starting at the real time, so clients' ``timedelta`` ends are valid."""
    return FakeClock(now_us=time.time_ns() // 1000)


def at(clock: FakeClock, seconds: float) -> float:
    """Epoch seconds ``seconds`` after the fake clock's now (what a sliding client sends)."""
    return (clock.now_us() + int(seconds * lease_items.US)) / lease_items.US


async def test_throttling_and_5xx_are_retried_within_the_deadline(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """Throttles and 500s are retried with backoff inside the request's deadline (at most
    ``max_attempts`` attempts per call): the caller never sees them, and each failed attempt
    is counted (``ddb.throttles``/``ddb.errors``)."""
    seed_pool(ddb, table, count=10)
    faults = Faults(seed=1)
    async with faulty_daemon(faults) as d:
        faults.add("throttle", ops={"Query"}, times=2)
        faults.add("server_error", ops={"UpdateItem"}, times=2)
        lease = await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert lease.new
        assert faults.injected == {"throttle": 2, "server_error": 2}
        assert d.counters["ddb.throttles"] == 2
        assert d.counters["ddb.errors"] == 2
        assert d.store.breaker.state == "closed"
        # a 500 on a read is retried the same way
        faults.add("server_error", ops={"Query"}, times=2)
        other = await rasd_aio.get_lease(C, P, "k2", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert other.new and other.resource != lease.resource
        assert d.counters["ddb.errors"] == 4
    print(f"faults injected: {dict(faults.injected)}, attempts seen: {faults.calls()}")


async def test_outage_serves_cache_fails_fast_opens_breaker_and_recovers(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """DynamoDB down: cached leases are still served with no DynamoDB call; new work fails
    with UNAVAILABLE; after ``breaker_failures`` failures the breaker opens and requests fail
    without calling DynamoDB at all; once DynamoDB heals, the breaker closes by itself after
    its cooldown (no operator, no restart)."""
    seed_pool(ddb, table, count=10)
    faults = Faults(seed=2)
    # cooldown above the store's longest retry sleep (0.1 s here): otherwise a retry may
    # become the half-open probe and the count of refused attempts depends on the jitter.
    # One call makes max_attempts (3) attempts: its failures alone open the breaker.
    cfg = {"breaker_failures": 3, "breaker_window": 30.0, "breaker_cooldown": 1.0}
    async with faulty_daemon(faults, **cfg) as d:
        s = d.cfg.socket
        cached = await rasd_aio.get_lease(C, P, "cached", HOUR, socket_path=s, timeout=WAIT)
        await d.coordinator.prefetch.idle()  # a refill succeeding later would reset the count
        await wait_for(
            lambda: not d.coordinator.driver.tasks.background, "the mapping's confirmation"
        )  # likewise
        faults.add("down")  # every operation: connection refused
        seen = faults.calls()
        again = await rasd_aio.get_lease(C, P, "cached", HOUR, socket_path=s)
        assert again.resource == cached.resource and faults.calls() == seen

        with pytest.raises(rasd_client.Unavailable):
            await rasd_aio.get_lease(C, P, "new-1", HOUR, socket_path=s, timeout=5)
        assert faults.injected["down"] == cfg["breaker_failures"], str(faults.history[-8:])
        assert d.stats()["breaker"] == "open"

        # Hold the circuit open while we look (the cooldown is read live): a slow machine
        # must not reach the half-open probe in the middle of these assertions.
        d.store.breaker.cooldown = 600.0
        seen = faults.calls()
        for i in range(5):
            with pytest.raises(rasd_client.Unavailable) as err:
                await rasd_aio.get_lease(C, P, f"new-open-{i}", HOUR, socket_path=s, timeout=5)
            assert err.value.retry_after is not None and err.value.retry_after > 0
        assert faults.calls() == seen, "an open breaker must not call DynamoDB"
        hit = await rasd_aio.get_lease(C, P, "cached", HOUR, socket_path=s)
        assert hit.resource == cached.resource
        assert d.counters["ddb.breaker_open"] >= 5

        faults.clear()  # heal; the real 1 s cooldown then lets one probe through
        d.store.breaker.cooldown = cfg["breaker_cooldown"]
        recovered = None
        for _ in range(200):
            try:
                # its subject is that the breaker closes, not how fast the new lease is
                recovered = await rasd_aio.get_lease(
                    C, P, "after", HOUR, socket_path=s, timeout=WAIT
                )
                break
            except rasd_client.Unavailable:
                await asyncio.sleep(0.05)
        assert recovered is not None and recovered.new, "breaker never closed after healing"
        assert d.stats()["breaker"] == "closed"
        assert d.store.breaker.opened == 1
    print(
        f"outage: {faults.injected['down']} refused attempts, "
        f"breaker_open answers {d.counters['ddb.breaker_open']}"
    )


async def test_slow_dynamodb_beyond_the_client_timeout_gives_timeout(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """DynamoDB answering later than the request's deadline gives TIMEOUT (not a hang, not
    UNAVAILABLE), while cached leases are still served."""
    seed_pool(ddb, table, count=10)
    faults = Faults(seed=3)
    async with faulty_daemon(faults) as d:
        s = d.cfg.socket
        cached = await rasd_aio.get_lease(C, P, "cached", HOUR, socket_path=s, timeout=WAIT)
        faults.add("slow", delay=1.0)
        with pytest.raises(rasd_client.Timeout):
            await rasd_aio.get_lease(C, P, "slow-key", HOUR, socket_path=s, timeout=0.2)
        # the daemon itself answered TIMEOUT (the client's grace is longer than its deadline)
        await wait_for(lambda: d.counters["err.TIMEOUT"] == 1, "daemon TIMEOUT answer")
        assert d.counters["ddb.timeouts"] >= 1  # the Query and the lock read, both late
        hit = await rasd_aio.get_lease(C, P, "cached", HOUR, socket_path=s, timeout=0.2)
        assert hit.resource == cached.resource


async def test_load_shedding_answers_busy_at_once(ddb: Any, table: str, faulty_daemon: Any) -> None:
    """With ``max_inflight=2`` and slow DynamoDB, of 10 concurrent new-key requests the 8
    that find no slot get BUSY at once (``shed.busy``): every BUSY answer arrives before any
    admitted request finishes, i.e. nothing waits in a queue for a slot."""
    seed_pool(ddb, table, count=20)
    faults = Faults(seed=4)
    async with faulty_daemon(faults, max_inflight=2) as d:
        s = d.cfg.socket
        await rasd_aio.call_raw("ping", socket_path=s)  # open the shared connection first
        faults.add("slow", ops={"Query"}, delay=0.3)
        order: list[str] = []

        async def one(i: int) -> None:
            try:
                await rasd_aio.get_lease(C, P, f"shed-{i}", HOUR, socket_path=s, timeout=10)
                order.append("ok")
            except rasd_client.Busy as exc:
                assert exc.retry_after is not None
                order.append("busy")

        await asyncio.gather(*(one(i) for i in range(10)))
        assert sorted(order) == ["busy"] * 8 + ["ok"] * 2
        assert order[:8] == ["busy"] * 8, f"a BUSY came after an admitted request: {order}"
        assert d.counters["shed.busy"] == 8
        assert d.gate.inflight == 0


async def test_acquisition_rate_limit_busy_with_retry_after(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """A runaway client making a new key per call is stopped by the per-pool token bucket
    after the burst: BUSY with ``retry_after > 0``. Leases already held are still served, and
    the bucket refills with (fake) time."""
    seed_pool(ddb, table, count=20)
    clock = real_clock_fake()
    async with faulty_daemon(Faults(), clock=clock, rate_limit=1.0, rate_burst=3.0) as d:
        s = d.cfg.socket
        got = [
            await rasd_aio.get_lease(C, P, f"run-{i}", at(clock, 3600), socket_path=s, timeout=WAIT)
            for i in range(3)
        ]
        assert all(x.new for x in got)
        busy = 0
        for i in range(3, 8):
            with pytest.raises(rasd_client.Busy) as err:
                await rasd_aio.get_lease(C, P, f"run-{i}", at(clock, 3600), socket_path=s)
            assert err.value.retry_after is not None and err.value.retry_after > 0
            busy += 1
        assert d.counters["shed.rate_limited"] == busy == 5
        assert d.counters["lease.new"] == 3
        held = await rasd_aio.get_lease(C, P, "run-0", at(clock, 3600), socket_path=s)
        assert held.resource == got[0].resource and not held.new
        clock.advance(1.0)  # one token back
        more = await rasd_aio.get_lease(C, P, "run-3", at(clock, 3600), socket_path=s, timeout=WAIT)
        assert more.new


async def test_failed_background_extension_is_logged_and_retried_after_backoff(
    ddb: Any, table: str, faulty_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh-ahead extension that fails is logged (``lease_at_risk`` when the lease is
    near its end), is not retried on every hit (backoff), and is retried on a later hit once
    the backoff has passed; the lease then really is extended in the table."""
    seed_pool(ddb, table, count=5)
    clock = real_clock_fake()
    faults = Faults(seed=6)
    async with faulty_daemon(faults, clock=clock, skew_margin=5.0) as d:
        d.coordinator.renewer.extend_fraction = 0.5  # no per-daemon jitter: exact numbers
        s = d.cfg.socket
        first = await rasd_aio.get_lease(C, P, "k", at(clock, 100), socket_path=s, timeout=WAIT)
        # the new lease's background writes (map_confirm) first: on a loaded machine one could
        # otherwise take the injected fault meant for the extension (seen in a CI run)
        await wait_for(
            lambda: not d.coordinator.driver.tasks.background, "the new lease's background work"
        )
        clock.advance(60)  # 40 s left of the 100 asked for: below half -> extend
        faults.add("validation", ops={"UpdateItem"}, times=1)
        with capture_logs() as logs:
            # a fresh logger proxy, so a logger cached by an earlier test cannot bypass capture
            monkeypatch.setattr(renewer, "log", structlog.get_logger("rasd.daemon.renewer"))
            hit = await rasd_aio.get_lease(C, P, "k", at(clock, 100), socket_path=s)
            assert hit.resource == first.resource and hit.version == first.version
            await wait_for(lambda: d.counters["lease.extend_errors"] == 1, "failed extension")
        events = [e for e in logs if e["event"] in ("lease_at_risk", "lease_extension_failed")]
        assert len(events) == 1, logs
        assert events[0]["event"] == "lease_at_risk" and events[0]["log_level"] == "error"
        assert events[0]["key"] == "k" and events[0]["retry_in_s"] == 1.0
        assert "(request id FAULT-VALIDATION)" in events[0]["error"]  # DynamoDB's, to quote

        # within the backoff: hits are served, no new write is attempted
        writes = faults.calls("UpdateItem")
        for _ in range(3):
            await rasd_aio.get_lease(C, P, "k", at(clock, 100), socket_path=s)
        assert faults.calls("UpdateItem") == writes

        clock.advance(1.5)  # past the 1 s backoff: the next hit retries
        await rasd_aio.get_lease(C, P, "k", at(clock, 100), socket_path=s)
        await wait_for(lambda: d.counters["lease.extended"] == 1, "retried extension")
        after = await rasd_aio.get_lease(C, P, "k", at(clock, 100), socket_path=s)
        assert after.version == first.version  # the same acquisition: same fencing token
        assert after.lease_expires > first.lease_expires
        assert d.counters["lease.extend_errors"] == 1


def item(ddb: Any, table: str, resource: str, client: str = C) -> dict[str, Any] | None:
    raw = ddb.get_item(TableName=table, Key=key_av((client, resource)), ConsistentRead=True)
    return item_from_av(raw["Item"]) if "Item" in raw else None


def ghost_pending(
    ddb: Any, table: str, key: str, resource: str, since_us: int, token: str = "ghost"
) -> tuple[lease_items.ResourceItem, item_writes.Write]:
    """Another daemon's acquisition of ``key``: its mapping write landed (pending, naming
    ``resource``); returns the resource as read and the ghost's claim, not yet sent."""
    r = serialize.resource_from(item(ddb, table, resource) or {})
    ident = (lease_items.map_pk(C, P, key), "us-east-1")
    exp = since_us + 3600 * lease_items.US
    ddb.update_item(
        TableName=table,
        **render(
            map_builders.map_acquire(ident, 0, token, resource, r.version, exp, since_us, "ghost")
        ),
    )
    return r, builders.claim(r, key, exp, since_us, token, 1)


async def test_a_dead_acquirers_pending_mapping_is_fenced_and_taken_over(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """A daemon died after its mapping write and before its claim. Past pending_hold, a reader
    fences the named resource (its claim can then never land) and takes the mapping over."""
    seed_pool(ddb, table, count=4)
    now = time.time_ns() // 1000
    _, ghost_claim = ghost_pending(ddb, table, "k", "res-00000", now - 10 * lease_items.US)
    async with make_daemon() as d:
        got = await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert got.new and d.counters["acq.fenced"] == 1
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        ddb.update_item(TableName=table, **render(ghost_claim))  # the ghost's claim, too late
    held = [r["resource"]["S"] for r in scan_all(ddb, table) if r.get("key", {}).get("S") == "k"]
    assert held == [got.resource]
    m = serialize.mapping_from(
        item(ddb, table, "us-east-1", client=lease_items.map_pk(C, P, "k")) or {}
    )
    assert m.resource == got.resource and m.state == lease_items.LIVE


async def test_a_young_pending_mapping_is_waited_for_and_adopted(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """Another daemon is acquiring the key right now: a reader waits (no claim of its own),
    then serves the other daemon's lease once its claim lands, and confirms the mapping."""
    seed_pool(ddb, table, count=4)
    now = time.time_ns() // 1000
    _, ghost_claim = ghost_pending(ddb, table, "k", "res-00001", now)
    async with make_daemon() as d:
        task = asyncio.ensure_future(
            rasd_aio.get_lease(C, P, "k", HOUR, socket_path=d.cfg.socket, timeout=5)
        )
        await wait_for(lambda: d.counters["acq.waits"] >= 1, "a wait")
        assert not task.done()
        ddb.update_item(TableName=table, **render(ghost_claim))
        got = await task
        assert got.resource == "res-00001" and not got.new
        await wait_for(
            lambda: not d.coordinator.driver.tasks.background, "background work", tries=1000
        )
        assert d.counters["lease.new"] == 0
    m = serialize.mapping_from(
        item(ddb, table, "us-east-1", client=lease_items.map_pk(C, P, "k")) or {}
    )
    assert m.state == lease_items.LIVE and m.token == "ghost"


class BeforeFirstWrite(Faults):
    """No faults; ``hook`` runs just before the daemon's first UpdateItem goes out (another
    daemon's writes landing between this daemon's read and its writes)."""

    hook: Callable[[], None] = lambda: None

    def pick(self, op: str) -> Rule | None:
        rule = super().pick(op)
        if op == "UpdateItem" and self.calls("UpdateItem") == 1:
            self.hook()  # a blocking boto3 write: fine in a test
        return rule


async def test_the_mapping_loser_gives_its_claim_back_with_quarantine(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """Another daemon wins the key's mapping between this daemon's read and its writes. This
    daemon's claim (it applied) is named by no mapping: it is never served, and it is given
    back with quarantine; the caller gets the winner's lease."""
    seed_pool(ddb, table, count=4)
    clock = real_clock_fake()
    state: dict[str, Any] = {}

    def winner() -> None:
        _, claim_w = ghost_pending(ddb, table, "k", "res-00001", clock.now_us(), token="winner")
        ddb.update_item(TableName=table, **render(claim_w))
        state["won"] = "res-00001"

    faults = BeforeFirstWrite()
    faults.hook = winner
    # a table with no paper agent beside rasd: the quarantine alone
    async with faulty_daemon(faults, clock=clock, legacy_agents=False) as d:
        mine = serialize.resource_from(item(ddb, table, "res-00000") or {})

        async def candidate(pool: Any, deadline: float) -> Candidate:
            return Candidate(mine, d.coordinator.clock.mono())

        d.coordinator.prefetch.candidate = candidate  # type: ignore[method-assign]
        faults.history.clear()
        got = await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert got.resource == state["won"]
        await wait_for(
            lambda: not d.coordinator.driver.tasks.background, "background work", tries=1000
        )
        assert d.counters["acq.gave_back"] == 1
        q = int(d.cfg.quarantine * lease_items.US)
    given_back = item(ddb, table, "res-00000") or {}
    assert given_back["version"] == 2 and "key" not in given_back  # claimed, then freed
    assert lease_items.parse_time(str(given_back["quarantine_until"])) == clock.now_us() + q


def _read_timeout() -> Exception:
    from botocore.exceptions import ReadTimeoutError

    return ReadTimeoutError(endpoint_url="http://moto")


def _untyped_500() -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {
            "Error": {"Code": "500", "Message": "<html>Internal Server Error</html>"},
            "ResponseMetadata": {"HTTPStatusCode": 500},
        },
        "UpdateItem",
    )


@pytest.mark.parametrize("failure", [_read_timeout, _untyped_500], ids=["read_timeout", "html_500"])
async def test_a_claim_applied_before_its_answer_was_lost_is_recognised(
    ddb: Any, table: str, make_daemon: Any, failure: Callable[[], Exception]
) -> None:
    """A claim whose first attempt landed but whose answer was lost must not be taken for a
    lost race or a refusal: the daemon reads it back and keeps it, never claiming twice. The
    answer is lost as a read timeout, or as an overloaded server's or a proxy's 500 page with
    no DynamoDB error type (code "500"), which is retried like any 5xx (I4), never taken for a
    definite refusal."""
    seed_pool(ddb, table, count=6)
    async with make_daemon() as d:
        client = d.store.client
        real = client.update_item
        state = {"armed": True}

        async def applied_then_lost(**kw: Any) -> Any:
            resp = await real(**kw)
            names = set(kw.get("ExpressionAttributeNames", {}).values())
            if state["armed"] and {"holder", "mver", "lease_available"} <= names:
                state["armed"] = False
                raise failure()
            return resp

        client.update_item = applied_then_lost
        got = await rasd_aio.get_lease(C, P, "once", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert got.new
        assert not state["armed"], "the fault never fired"
        assert d.counters["ddb.ambiguous_applied"] == 1
    held = [r["resource"]["S"] for r in scan_all(ddb, table) if r.get("key", {}).get("S") == "once"]
    assert held == [got.resource]


async def test_a_claim_that_never_applied_leaves_its_item_a_candidate(
    ddb: Any, table: str, faulty_daemon: Any
) -> None:
    """A pool of one: the first attempt's two writes fail with an error that is not their
    condition (they never applied), so the item is still free at the version read. The
    daemon must not treat it as taken: the request's next attempt claims it, instead of
    answering NO_CAPACITY while the pool's only item is claimable."""
    (only,) = seed_pool(ddb, table, count=1)
    faults = Faults(seed=1)
    async with faulty_daemon(faults) as d:
        faults.add("validation", ops={"UpdateItem"}, times=2)
        lease = await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert faults.injected == {"validation": 2}
        assert lease.new and lease.resource == only


async def test_request_ids_in_answers(ddb: Any, table: str, faulty_daemon: Any) -> None:
    """DynamoDB failing: the UNAVAILABLE answer quotes DynamoDB's request id, the thing AWS
    support asks for (error log lines quote it too: the background extension test)."""
    seed_pool(ddb, table, count=10)
    faults = Faults(seed=3)
    async with faulty_daemon(faults, breaker_failures=1000) as d:
        await d.coordinator.prefetch.idle()
        faults.add("server_error", ops={"Query"})
        with pytest.raises(rasd_client.Unavailable) as err:
            await rasd_aio.get_lease(C, P, "rid", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert "(request id FAULT-SERVER_ERROR)" in err.value.message, err.value.message
