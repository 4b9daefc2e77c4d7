"""A deduplicated extra whose background extension loses its mapping is held to its end.

The interleaving (the evidence scenario ``dedupe_extra_vs_extension_freeorphan``), with real
daemons on fake clocks, the real ``ras-dedupe`` and ``ras-liberator``, against moto: k1 holds
rb in eu-west-1 (answered until t0+100 s) and, through an earlier acquisition, ra in
us-east-1. At t0+32 a hit asks for an hour, so the daemon extends rb in the background:
``extend_resource`` applies, ``ras-dedupe`` releases rb's mapping (ra survives), the
extension's ``map_extend`` is rejected and the daemon reads the mapping: free, so it gives rb
back (``FreeOrphan``). No app released k1's lease: rb must stay unclaimable until the end
apps were answered (plus the skew), in either mode, whoever's free lands first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from rasd.config import Config
from rasd.core import lease as lease_items
from rasd.core import schema
from rasd.core.errors import NoCapacity
from rasd.core.writes import item_from_av
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from rasd_jobs import dedupe, liberator
from tests.doubles.clock import FakeClock
from tests.helpers.hooked import Hooked
from tests.helpers.tables import hold

pytestmark = pytest.mark.integration

C, P = "demo", "default"
EAST, WEST = "us-east-1", "eu-west-1"


def _names(kw: dict[str, Any]) -> set[str]:
    return set(kw.get("ExpressionAttributeNames", {}).values())


def _is_free_of_rb(kw: dict[str, Any]) -> bool:
    return (
        kw["Key"]["resource"]["S"] == "rb"
        and "holder" in _names(kw)
        and bool(_names(kw) & {"lease_available", "quarantine_until"})
        and "REMOVE" in kw["UpdateExpression"]
    )


class _DedupeClient:
    """ras-dedupe's boto3 client: its own free of rb waits for the daemon's give-back."""

    def __init__(self, inner: Any, released: threading.Event, freed: threading.Event) -> None:
        self._inner, self._released, self._freed = inner, released, freed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update_item(self, **kw: Any) -> Any:
        if kw["Key"]["client_id"]["S"].startswith("#map#") and "state" in _names(kw):
            out = self._inner.update_item(**kw)
            self._released.set()
            return out
        if _is_free_of_rb(kw):
            self._freed.wait(10)
        return self._inner.update_item(**kw)


async def _daemon(url: str, table: str, clock: FakeClock, legacy: bool) -> Coordinator:
    cfg = Config(
        table=table, endpoint_url=url, region=WEST, socket="/nonexistent/x.sock",
        legacy_agents=legacy,
        # straight to the extension's writes: a read first would see ra's mapping here,
        # which in production may still be on its way (replication lag) when it reads
        extend_read_first=False,
    )  # fmt: skip
    store = Store(cfg.validate())
    await store.start()
    acq = Coordinator(cfg, store, clock=clock)
    await acq.pool_table.load(time.monotonic() + 5)
    acq.renewer.extend_fraction = 0.5  # no jitter
    return acq


async def _close(*ds: Coordinator) -> None:
    for d in ds:
        await d.drain(2.0)
        await d.prefetch.stop()
        await d.store.close()


def _item(ddb: Any, table: str, name: str) -> dict[str, Any]:
    key = {"client_id": {"S": C}, "resource": {"S": name}}
    return item_from_av(ddb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"])


@pytest.mark.parametrize("legacy", [False, True], ids=["after-rollout", "rollout"])
async def test_an_extra_extended_while_deduplicated_is_held_to_its_end(
    moto_endpoint: str, ddb: Any, table: str, legacy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_REGION", EAST)  # one moto backend stands for both regions
    schema.put_pool(ddb, table, C, P, 7200)
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    t0 = clock.now_us()
    schema.add_resources(ddb, table, C, P, EAST, ["ra"], now_us=t0 - 60 * lease_items.US)
    schema.add_resources(ddb, table, C, P, WEST, ["rb"], now_us=t0 - 60 * lease_items.US)
    d1 = await _daemon(moto_endpoint, table, clock, legacy)
    d2: Coordinator | None = None
    try:
        first, new = await d1.acquirer.get_lease(
            C, P, "k1", t0 + 100 * lease_items.US, time.monotonic() + 5
        )
        assert (first.resource, new) == ("rb", True)
        await d1.drain(2.0)
        clock.advance(16)
        # a hit past S/2: served, and confirmed again in the background
        assert d1.cache.answer(C, P, "k1", clock.now_us() + 100 * lease_items.US, clock.mono(), 0)
        for _ in range(100):
            if d1.counters["lease.reconfirmed"]:
                break
            await asyncio.sleep(0.02)
        await d1.drain(2.0)
        assert d1.counters["lease.reconfirmed"] == 1
        # the region that acquired k1 first (east) becomes visible: rb is the extra
        hold(
            ddb,
            table,
            "ra",
            "k1",
            t0 + 3660 * lease_items.US,
            t0 - lease_items.US,
            token="tok-east",
        )
        clock.advance(16)
        now_dedupe = clock.now_us()
        released, freed = threading.Event(), threading.Event()
        runs: list[threading.Thread] = []
        seen: list[str] = []

        async def hook(name: str, kw: dict[str, Any], real: Any) -> Any:
            if name != "update_item":
                return await real(**kw)
            names = _names(kw)
            cond = kw.get("ConditionExpression", "")
            if kw["Key"]["resource"]["S"] == "rb" and "lease_expires" in names and "<" in cond:
                out = await real(**kw)  # extend_resource applied; now ras-dedupe runs
                seen.append("extend_resource")
                opts = dedupe.Options(table=table, region=WEST, now_us=now_dedupe, segments=1)
                th = threading.Thread(
                    target=dedupe.run, args=(_DedupeClient(ddb, released, freed), opts)
                )
                th.start()
                runs.append(th)
                assert await asyncio.to_thread(released.wait, 10)
                return out
            if kw["Key"]["client_id"]["S"].startswith("#map#") and "exp" in names:
                seen.append("map_extend")
            if _is_free_of_rb(kw):
                try:
                    return await real(**kw)
                finally:
                    seen.append("daemon free")
                    freed.set()
            return await real(**kw)

        d1.store.wrap_client(lambda inner: Hooked(inner, hook))
        now = clock.mono()
        answered = d1.cache.answer(C, P, "k1", clock.now_us() + 3600 * lease_items.US, now, 0)
        assert answered is not None
        lease = d1.cache.get((C, P, "k1"), now)
        assert lease is not None and lease.resource == "rb"
        ends = lease.expires_us  # apps were answered rb until here (t0 + 100 s)
        assert ends == t0 + 100 * lease_items.US
        for _ in range(200):
            if freed.is_set():
                break
            await asyncio.sleep(0.02)
        await d1.drain(3.0)
        for th in runs:
            await asyncio.to_thread(th.join, 10)
        # the interleaving happened as described: the daemon's extension lost its mapping
        # to ras-dedupe and the daemon tried to give rb back
        assert seen[:2] == ["extend_resource", "map_extend"] and "daemon free" in seen
        rb = _item(ddb, table, "rb")
        assert rb.get("key") is None, "rb was freed (by the daemon or by ras-dedupe)"
        until = lease_items.parse_time(rb.get("quarantine_until") or rb["lease_available"])
        assert until >= ends + int(Config().max_clock_skew * lease_items.US)
        # the earliest moment rb can be claimable: re-listed by the real liberator, then
        # asked for by another daemon of the region for another key
        clock.advance((until - clock.now_us()) / lease_items.US + 1)
        liberator.run(
            ddb,
            liberator.Options(
                table=table, region=WEST, now_us=clock.now_us(), segments=1, legacy_agents=legacy
            ),
        )
        d2 = await _daemon(moto_endpoint, table, clock, legacy)
        try:
            other, _ = await d2.acquirer.get_lease(
                C, P, "k2", clock.now_us() + 600 * lease_items.US, time.monotonic() + 5
            )
            got = other.resource
        except NoCapacity:
            got = None
        assert not (got == "rb" and clock.now_us() < ends), "rb served to k2 while k1's runs"
    finally:
        await _close(d1, *([d2] if d2 else []))
