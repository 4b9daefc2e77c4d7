"""The double allocations of the lost-responses reproduction (scenarios A, B, C), replayed
deterministically against moto: each must keep I1 (a resource is never answered to two keys
while a lease on it runs) and I2 (one resource per key per region). A protocol with a lock
item and index adoption double-allocates in each of them.

Faults are injected under the store, at the aiobotocore client (a wrapper around the real
store, as ``tests.doubles.store`` does): "applied, reply lost" makes the real write, then never
answers, so the store's attempt timeout fires and the outcome is ambiguous (I4).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from rasd.config import Config
from rasd.core import builders, serialize
from rasd.core import lease as lease_items
from rasd.core.clock import Clock
from rasd.core.errors import NoCapacity, RasdError
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from rasd_jobs import dedupe, liberator
from tests.doubles.clock import FakeClock
from tests.helpers.deadlines import WAIT
from tests.helpers.hooked import Hooked
from tests.helpers.tables import scan_all, seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"


def names(kw: dict[str, Any]) -> set[str]:
    return set(kw.get("ExpressionAttributeNames", {}).values())


def is_map_acquire(kw: dict[str, Any]) -> bool:
    vals = kw.get("ExpressionAttributeValues", {}).values()
    return kw["Key"]["client_id"]["S"].startswith("#map#") and {"S": "pending"} in vals


def is_claim(kw: dict[str, Any]) -> bool:
    return "lease_available" in names(kw) and "attribute_exists" in kw.get(
        "ConditionExpression", ""
    )


@asynccontextmanager
async def daemons(
    url: str, table: str, n: int, clock: Clock | None = None, **overrides: Any
) -> AsyncIterator[list[Coordinator]]:
    out: list[Coordinator] = []
    try:
        for i in range(n):
            cfg = Config(table=table, endpoint_url=url, socket=f"/tmp/unused-{i}.sock", **overrides)
            store = Store(cfg.validate())
            await store.start()
            acq = Coordinator(cfg, store, clock=clock)
            acq.driver.owner = f"d{i + 1}"
            await acq.pool_table.load(time.monotonic() + 5)
            out.append(acq)
        yield out
    finally:
        for a in out:
            await a.drain(2.0)
            await a.store.close()


def relist_due(ddb: Any, table: str, clock: Clock) -> int:
    """Put the items whose quarantine is over on ``clock`` back in the available index, as
    ``ras-liberator`` does (the daemons' own re-listing waits in real time): how many."""
    opts = liberator.Options(table, "us-east-1", clock.now_us(), segments=1)
    summary = liberator.run(ddb, opts)
    assert summary["errors"] == 0, summary
    return int(summary["relisted"])


def req(clock: Clock | None = None, deadline: float = WAIT) -> tuple[int, float]:
    """A request: lease end in an hour, and its deadline: roomy, so that the scenario does not
    depend on how loaded the machine is (at 1 s a Query timed out at a load of 7.5)."""
    now = clock.now_us() if clock else int(time.time() * lease_items.US)
    return now + 3600 * lease_items.US, time.monotonic() + deadline


def holders(ddb: Any, table: str) -> dict[str, str | None]:
    return {
        it["resource"]["S"]: it.get("key", {}).get("S")
        for it in scan_all(ddb, table)
        if it["client_id"]["S"] == C
    }


async def try_get(d: Coordinator, key: str, clock: Clock | None = None) -> str | None:
    exp, dl = req(clock)
    try:
        lease, _ = await d.acquirer.get_lease(C, P, key, exp, dl)
    except NoCapacity:
        return None
    return lease.resource


async def test_a_mapping_applied_reply_lost(moto_endpoint: str, ddb: Any, table: str) -> None:
    """A: d1's mapping write lands but its reply is lost; meanwhile d2 serves the key. d1
    must not give the claim back on a guess (I4), so no third key can get the resource.
    The two writes in one round trip: without ``legacy_agents`` (beside the paper's agent the
    claim waits for the mapping's reply, tests/unit/test_steps_take.py)."""
    seed_pool(ddb, table, count=1, prefix="res-A")
    async with daemons(moto_endpoint, table, 3, legacy_agents=False) as (d1, d2, d3):
        landed = asyncio.Event()
        state: dict[str, Any] = {}

        async def hook(name: str, kw: dict[str, Any], real: Any) -> Any:
            if name == "update_item" and is_claim(kw):
                resp = await real(**kw)
                landed.set()
                return resp
            if name == "update_item" and is_map_acquire(kw) and "lost" not in state:
                state["lost"] = await real(**kw)  # APPLIED
                await landed.wait()
                exp, dl = req(deadline=4.0)
                lease, _ = await d2.acquirer.get_lease(C, P, "k23", exp, dl)
                state["d2"] = lease.resource
                await asyncio.sleep(30)  # the reply is lost
            return await real(**kw)

        d1.store.wrap_client(lambda inner: Hooked(inner, hook))
        exp, dl = req(deadline=8.0)
        try:
            got1: str | None = (await d1.acquirer.get_lease(C, P, "k23", exp, dl))[0].resource
        except RasdError:
            got1 = None
        assert state["d2"] == "res-A00000"
        assert got1 in (None, "res-A00000")  # d1 may resolve it by reading back: same lease
        await d1.drain(2.0)
        assert await try_get(d3, "k99") is None  # NO_CAPACITY: res-A is k23's
        hit = d2.cache.get((C, P, "k23"))
        assert hit is not None and hit.resource == "res-A00000"
        assert holders(ddb, table) == {"res-A00000": "k23"}


async def test_b_lost_race_claim_reply_lost(moto_endpoint: str, ddb: Any, table: str) -> None:
    """B: d1 loses the mapping race to d2 and its claim's replies are all lost. The orphan
    claim is never served (no mapping names it), is fenced or given back with quarantine, and
    ras-dedupe / the liberator never free what d2 serves. The two writes in one round trip:
    without ``legacy_agents`` (beside the paper's agent a daemon that loses the mapping sends
    no claim, tests/unit/test_steps_take.py)."""
    seed_pool(ddb, table, count=2, prefix="res-")
    async with daemons(moto_endpoint, table, 3, legacy_agents=False) as (d1, d2, d3):
        from rasd.daemon.candidates import Candidate

        for d, r in ((d1, "res-00000"), (d2, "res-00001")):
            raw = ddb.get_item(TableName=table, Key={"client_id": {"S": C}, "resource": {"S": r}})
            item = serialize.item_from_ddb(raw["Item"])

            async def cand(pool: Any, deadline: float, d: Coordinator = d, item: Any = item) -> Any:
                return Candidate(item, d.clock.mono())

            d.prefetch.candidate = cand  # type: ignore[method-assign]
        d2_done = asyncio.Event()
        state: dict[str, Any] = {}

        async def hook(name: str, kw: dict[str, Any], real: Any) -> Any:
            if name == "update_item" and is_map_acquire(kw) and "race" not in state:
                state["race"] = True
                exp, dl = req(deadline=4.0)  # d2 misses the same new key at once and wins
                lease, _ = await d2.acquirer.get_lease(C, P, "k23", exp, dl)
                state["d2"] = lease.resource
                d2_done.set()
                return await real(**kw)  # d1's mapping write: condition fails
            if name == "update_item" and is_claim(kw):
                await d2_done.wait()
                if "claimed" not in state:
                    state["claimed"] = await real(**kw)  # APPLIED
                await asyncio.sleep(30)  # every reply lost
            return await real(**kw)

        d1.store.wrap_client(lambda inner: Hooked(inner, hook))
        exp, dl = req(deadline=8.0)
        try:
            await d1.acquirer.get_lease(C, P, "k23", exp, dl)
        except RasdError:
            pass
        assert state["d2"] == "res-00001"
        d1.store._client = d1.store.client._inner  # heal: unwrap
        await d1.drain(3.0)
        exp, dl = req()
        l1, _ = await d1.acquirer.get_lease(C, P, "k23", exp, dl)  # the app retries through d1
        assert l1.resource == "res-00001", "d1 must serve the mapping's lease, not its orphan"
        now = int(time.time() * lease_items.US)
        dedupe.run(ddb, dedupe.Options(table=table, region="us-east-1", now_us=now))
        liberator.run(
            ddb, liberator.Options(table=table, region="us-east-1", now_us=now, orphan_age_us=0)
        )
        # Neither resource is claimable now: res-00001 is k23's, res-00000 is quarantined.
        assert await try_get(d3, "k99") is None
        hit = d2.cache.get((C, P, "k23"))
        assert hit is not None and hit.resource == "res-00001"
        assert holders(ddb, table) == {"res-00000": None, "res-00001": "k23"}


async def test_c_release_through_one_host(moto_endpoint: str, ddb: Any, table: str) -> None:
    """C: k23 is cached on d1 and d2 and released through d1. The resource stays unclaimable
    for the quarantine, longer than d2 may serve its cached answer (S); after both, it is
    claimable again."""
    seed_pool(ddb, table, count=2, prefix="res-")
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    # no paper agent beside rasd: the release's quarantine alone (legacy_agents off)
    async with daemons(moto_endpoint, table, 2, clock=clock, legacy_agents=False) as (d1, d2):
        a = await try_get(d1, "k23", clock)
        b = await try_get(d2, "k23", clock)
        assert a is not None and a == b
        assert await d1.releaser.release(C, P, "k23", time.monotonic() + WAIT) == 1
        await d1.drain(2.0)
        other = await try_get(d1, "k99", clock)
        assert other is not None and other != a
        hit = d2.cache.get((C, P, "k23"))
        assert hit is not None and hit.resource == a  # stale, within S: allowed by I3
        assert await try_get(d1, "k77", clock) is None  # the only other one is quarantined
        cfg = d1.cfg
        clock.advance(cfg.confirm_interval + 0.1)
        assert d2.cache.get((C, P, "k23")) is None  # S passed: not served
        clock.advance(cfg.quarantine - cfg.confirm_interval)
        relist_due(ddb, table, clock)  # Q passed: back in the available index
        d1.prefetch.buffers.clear()
        assert await try_get(d1, "k77", clock) == a  # claimable again


async def test_skewed_clocks_keep_the_quarantine(moto_endpoint: str, ddb: Any, table: str) -> None:
    """A daemon whose clock runs ahead by the skew bound claims a released resource no earlier
    than quarantine - skew after the release: still after every cache elsewhere has let the
    old answer go (quarantine >= S + skew)."""
    seed_pool(ddb, table, count=1, prefix="res-")
    base = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    async with daemons(moto_endpoint, table, 1, clock=base, legacy_agents=False) as (d1,):
        skew = d1.cfg.max_clock_skew
        ahead = FakeClock(now_us=base.now_us() + int(skew * lease_items.US), mono=base.mono())
        async with daemons(moto_endpoint, table, 1, clock=ahead) as (d2,):
            assert await try_get(d1, "k1", base) == "res-00000"
            assert await d1.releaser.release(C, P, "k1", time.monotonic() + WAIT) == 1
            await d1.drain(2.0)
            q = d1.cfg.quarantine
            for c in (base, ahead):
                c.advance(q - skew - 0.5)
            assert relist_due(ddb, table, ahead) == 0  # re-listed on the clock furthest ahead
            assert await try_get(d2, "k2", ahead) is None
            assert q - skew - 0.5 > d1.cfg.confirm_interval  # every cache let go by now
            for c in (base, ahead):
                c.advance(1.0)
            assert relist_due(ddb, table, ahead) == 1
            d2.prefetch.buffers.clear()
            assert await try_get(d2, "k2", ahead) == "res-00000"


def test_liberator_waits_for_the_grace(ddb: Any, table: str) -> None:
    """The liberator frees a lease only when its end plus --grace has passed on its own clock,
    so a liberator whose clock runs ahead by up to the grace never frees a running lease."""
    seed_pool(ddb, table, count=1, prefix="res-")
    now = int(time.time() * lease_items.US)
    raw = ddb.get_item(TableName=table, Key={"client_id": {"S": C}, "resource": {"S": "res-00000"}})
    item = serialize.item_from_ddb(raw["Item"])
    from rasd.core.writes import render

    exp = now + 10 * lease_items.US
    ddb.update_item(TableName=table, **render(builders.claim(item, "k", exp, now, "tok", 1)))
    grace = 2 * lease_items.US
    for at, freed in ((exp + grace - 1, 0), (exp + grace + 1, 1)):
        got = liberator.run(
            ddb,
            liberator.Options(
                table=table, region="us-east-1", now_us=at, grace_us=grace, orphan_age_us=None
            ),
        )
        assert got["freed"] == freed
