"""Rollout mode writes the key's mapping beside its first read, except for a key whose lease
the host knew lately: that key most likely has a mapping naming a lease, which would refuse
the write.

A real daemon in rollout mode (``legacy_agents``) on a fake clock, against moto, with its
DynamoDB calls recorded: the first miss on k1 sends the speculative ``map_acquire_unheld``
beside the reads (a new key: it applies); once k1's cached answer is dropped, the next miss
reads first and writes nothing, and another host's key the daemon never served is
speculated on again (refused: it has a lease). Once another host's lease of k3 has ended,
plus the grace, the speculative write applies on its mapping: the key's next lease takes no
mapping write after the read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rasd.config import Config
from rasd.core import lease as lease_items
from rasd.core import schema, serialize
from rasd.core.writes import key_av
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from tests.doubles.clock import FakeClock
from tests.helpers.hooked import Hooked

pytestmark = pytest.mark.integration

C, P, EAST = "demo", "default", "us-east-1"


async def _daemon(url: str, table: str, clock: FakeClock, owner: str) -> Coordinator:
    cfg = Config(
        table=table, endpoint_url=url, region=EAST, socket="/nonexistent/x.sock",
        legacy_agents=True,
    )  # fmt: skip
    store = Store(cfg.validate())
    await store.start()
    d = Coordinator(cfg, store, clock=clock, owner=owner)
    await d.pool_table.load(time.monotonic() + 5)
    return d


def fresh_map_ident(lease: lease_items.Lease) -> tuple[str, str]:
    return (lease_items.map_pk(C, P, lease.key), lease.region)


async def _close(d: Coordinator) -> None:
    await d.drain(2.0)
    await d.prefetch.stop()
    await d.store.close()


async def test_a_key_served_lately_is_read_before_its_mapping_is_written(
    moto_endpoint: str, ddb: Any, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_REGION", EAST)
    schema.put_pool(ddb, table, C, P, 7200)
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    t0 = clock.now_us()
    names = [f"r{i}" for i in range(60)]
    schema.add_resources(ddb, table, C, P, EAST, names, now_us=t0 - 60 * lease_items.US)
    d1 = await _daemon(moto_endpoint, table, clock, "host-1")
    d2 = await _daemon(moto_endpoint, table, clock, "host-2")
    writes: list[str] = []
    outcomes: list[str] = []
    events: list[str] = []

    async def hook(name: str, kw: dict[str, Any], real: Any) -> Any:
        if name == "query":
            events.append("query sent")
            try:
                return await real(**kw)
            finally:
                events.append("query answered")
        if name == "update_item" and kw["Key"]["client_id"]["S"].startswith("#map#"):
            events.append("mapping write sent")
        elif name == "update_item":
            events.append("resource write sent")
        if name == "update_item" and kw["Key"]["client_id"]["S"].startswith("#map#"):
            writes.append(kw["Key"]["client_id"]["S"].rsplit("#", 1)[1])
            try:
                got = await real(**kw)
            except Exception:
                outcomes.append("refused")
                raise
            outcomes.append("applied")
            return got
        return await real(**kw)

    d1.store.wrap_client(lambda inner: Hooked(inner, hook))
    try:
        end = t0 + 600 * lease_items.US
        got, new = await d2.acquirer.get_lease(C, P, "k2", end, time.monotonic() + 5)
        assert new  # k2: another host's key, never served by d1
        got, new = await d1.acquirer.get_lease(C, P, "k1", end, time.monotonic() + 5)
        assert new and writes[0] == "k1"  # speculated: the mapping written beside the read
        await d1.drain(2.0)
        # a candidate at hand on d1 (without one, a first read goes alone whatever the key)
        pool = await d1.pool_table.get(C, P, time.monotonic() + 5)
        for _ in range(250):
            if len(d1.prefetch.buffer(pool)) >= 2:
                break
            await asyncio.sleep(0.02)
        assert len(d1.prefetch.buffer(pool)) >= 2
        writes.clear()
        d1.cache.drop((C, P, "k1"))
        again, new = await d1.acquirer.get_lease(C, P, "k1", end, time.monotonic() + 5)
        assert (again.resource, new) == (got.resource, False)
        assert writes == []  # read first: nothing written for a key with a mapping
        other, new = await d1.acquirer.get_lease(C, P, "k2", end, time.monotonic() + 5)
        # never served here: speculated, and refused
        assert other.key == "k2" and not new and writes == ["k2"]
        assert outcomes[-1] == "refused"

        # k3's one-second lease, another host's, ends, and the grace passes: the write beside
        # the read takes its mapping
        short = clock.now_us() + lease_items.US
        _, new = await d2.acquirer.get_lease(C, P, "k3", short, time.monotonic() + 5)
        assert new
        await d2.drain(2.0)
        clock.advance(1 + d1.driver.rules.grace_us / 1e6)
        for _ in range(250):
            if len(d1.prefetch.buffer(pool)) >= 2:
                break
            await asyncio.sleep(0.02)
        d1.cache.drop((C, P, "k3"))
        writes.clear()
        outcomes.clear()
        events.clear()
        later = clock.now_us() + 600 * lease_items.US
        fresh, new = await d1.acquirer.get_lease(C, P, "k3", later, time.monotonic() + 5)
        assert new and fresh.expires_us == later
        # one mapping write before the answer, the one beside the read, and it applied
        assert (writes[:1], outcomes[:1]) == (["k3"], ["applied"])
        # ... sent beside the reads, before any of them was answered
        assert events.index("mapping write sent") < events.index("query answered"), events
        await d1.drain(2.0)
        # the claim follows that write: no other mapping write before it (the ended lease's
        # item, still in the leased index, asks nothing of the key)
        spec = events.index("mapping write sent")
        claim = events.index("resource write sent")
        assert spec < claim and "mapping write sent" not in events[spec + 1 : claim], events
        raw = ddb.get_item(
            TableName=table, Key=key_av(fresh_map_ident(fresh)), ConsistentRead=True
        )["Item"]
        m = serialize.mapping_from_ddb(raw)
        assert (m.state, m.token, m.resource) == (lease_items.LIVE, fresh.token, fresh.resource)
    finally:
        await _close(d1)
        await _close(d2)
