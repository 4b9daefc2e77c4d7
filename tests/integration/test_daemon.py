"""The daemon end to end: real client, real Unix socket, moto's server over HTTP.

Time that matters to leases comes from a FakeClock handed to the daemon, so expiry and
refresh-ahead are tested by advancing it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from datetime import timedelta
from typing import Any

import msgpack
import pytest

import rasd_client
from rasd.core import lease as lease_items
from rasd.core import serialize
from rasd.daemon.renewer import Renewer
from rasd_client import _table, wire
from rasd_client import aio as rasd_aio
from tests.doubles.clock import FakeClock
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import hold, scan_all, seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"


def ddb_calls(d: Any) -> int:
    return sum(
        v
        for k, v in d.counters.snapshot().items()
        if k in {"ddb.GetItem", "ddb.Query", "ddb.UpdateItem", "ddb.BatchWriteItem"}
    )


def item_of(ddb: Any, table: str, resource: str) -> dict[str, Any]:
    got: dict[str, Any] = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": C}, "resource": {"S": resource}},
        ConsistentRead=True,
    )["Item"]
    return got


async def wait_for(pred: Any, what: str) -> None:
    """Wait for background work to complete (bounded; not a timing assertion)."""
    for _ in range(500):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def exp(clock: FakeClock, seconds: float) -> float:
    return (clock.now_us() + int(seconds * lease_items.US)) / lease_items.US


async def test_new_then_cached_lease(ddb: Any, table: str, make_daemon: Any) -> None:
    """A new lease is written to the table; asking again is a cache hit with no DynamoDB call."""
    seed_pool(ddb, table, count=20)
    async with make_daemon() as d:
        sock = d.cfg.socket
        first = await rasd_aio.get_lease(C, P, "k1", timedelta(hours=1), socket_path=sock)
        assert first.new and first.version == 1 and first.region == "us-east-1"
        row = item_of(ddb, table, first.resource)
        assert row["key"]["S"] == "k1" and "lease_available" not in row
        assert lease_items.parse_time(row["lease_expires"]["S"]) == int(
            first.lease_expires.timestamp() * 1e6
        )
        # the new lease's background work (its confirmation, a prefetch refill queued behind
        # the claim) is not the hit's: let it finish before counting
        await d.coordinator.prefetch.idle()
        await wait_for(
            lambda: not d.coordinator.driver.tasks.background, "the new lease's background writes"
        )
        before = ddb_calls(d)
        again = await rasd_aio.get_lease(C, P, "k1", timedelta(hours=1), socket_path=sock)
        assert not again.new and again.resource == first.resource
        assert ddb_calls(d) == before
        # a hit: the daemon's, or its hit table's (this process has it once it asked for it)
        assert d.counters["cache.hit"] + _table.current.hits >= 1
        # the sync client sees the same lease (thread: the daemon runs in this loop)
        sync = await asyncio.to_thread(
            rasd_client.get_lease, C, P, "k1", timedelta(hours=1), socket_path=sock
        )
        assert sync.resource == first.resource and not sync.new


async def test_expiry_relet_refresh_ahead_and_release(
    ddb: Any, table: str, make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sliding lease_expires extends in the background (resource, then mapping); a shorter
    request never writes; a lease past its end and the liberator's grace is not served, the
    key gets a new one; release frees the item with quarantine. (Its requests wait for their
    answers: what they answer is the subject, not how fast.)"""
    seed_pool(ddb, table, count=10)
    clock = FakeClock(now_us=__import__("time").time_ns() // 1000)
    monkeypatch.setattr(Renewer, "EXTEND_JITTER", (1.0, 1.0))  # no jitter: exact numbers
    # legacy_agents off: the release's quarantine alone (no paper agent on the table)
    async with make_daemon(
        clock=clock, skew_margin=5.0, extend_fraction=0.5, legacy_agents=False
    ) as d:
        s = d.cfg.socket
        a = await rasd_aio.get_lease(C, P, "k", exp(clock, 100), socket_path=s, timeout=WAIT)
        # refresh-ahead: 60 s later, asking for now+100 s (40 s left < 50 s) -> background write
        clock.advance(60)
        b = await rasd_aio.get_lease(C, P, "k", exp(clock, 100), socket_path=s, timeout=WAIT)
        assert b.lease_expires == a.lease_expires and not b.new  # served from the cache
        await wait_for(lambda: d.counters["lease.extended"] == 1, "extension")
        c = await rasd_aio.get_lease(C, P, "k", exp(clock, 100), socket_path=s, timeout=WAIT)
        assert c.resource == a.resource and c.version == a.version  # same acquisition
        assert c.lease_expires > a.lease_expires
        assert d.counters["ddb.UpdateItem"] >= 4  # claim, mapping, confirm, then R and M
        # a shorter request never shortens and never writes
        writes = d.counters["ddb.UpdateItem"]
        await rasd_aio.get_lease(C, P, "k", exp(clock, 10), socket_path=s, timeout=WAIT)
        assert d.counters["ddb.UpdateItem"] == writes
        # expiry: past the end and the grace -> a new lease (the old item is the liberator's)
        clock.advance(200)
        e = await rasd_aio.get_lease(C, P, "k", exp(clock, 100), socket_path=s, timeout=WAIT)
        assert e.new and e.resource != a.resource
        # release: the item is free again, out of the available index until the quarantine
        # is over (re-listed then)
        await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        await d.coordinator.drain(2.0)
        row = item_of(ddb, table, e.resource)
        assert "key" not in row and "lease_available" not in row
        q = int(d.cfg.quarantine * lease_items.US)
        assert lease_items.parse_time(row["quarantine_until"]["S"]) == clock.now_us() + q
        with pytest.raises(rasd_client.NotHeld):
            await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        f = await rasd_aio.get_lease(C, P, "k", exp(clock, 100), socket_path=s, timeout=WAIT)
        assert f.new


async def test_other_regions_lease_is_returned_unchanged(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """A lease held in another region is returned as it is: never extended, never written."""
    names = seed_pool(ddb, table, region="eu-west-1", count=3)
    seed_pool(ddb, table, region="us-east-1", count=3, prefix="us-")
    clock = FakeClock(now_us=__import__("time").time_ns() // 1000)
    hold(ddb, table, names[0], "eu-key", clock.now_us() + 30 * lease_items.US, clock.now_us())
    async with make_daemon(clock=clock) as d:
        got = await rasd_aio.get_lease(C, P, "eu-key", exp(clock, 3600), socket_path=d.cfg.socket)
        assert got.resource == names[0] and got.region == "eu-west-1" and not got.new
        await asyncio.sleep(0.05)  # let any (wrong) background extension run
        assert d.counters["ddb.UpdateItem"] == 0
        assert item_of(ddb, table, names[0])["version"]["N"] == "1"  # the claim's write only
        with pytest.raises(rasd_client.NotHeld, match="eu-west-1"):
            await rasd_aio.release(C, P, "eu-key", socket_path=d.cfg.socket)


async def test_exhaustion_and_unknown_pool(ddb: Any, table: str, make_daemon: Any) -> None:
    """An exhausted pool answers NO_CAPACITY, the second time without reading DynamoDB;
    an undefined pool answers UNKNOWN_POOL."""
    seed_pool(ddb, table, count=3)
    async with make_daemon(exhausted_backoff=30.0) as d:
        s = d.cfg.socket
        got = {
            (await rasd_aio.get_lease(C, P, f"k{i}", timedelta(hours=1), socket_path=s)).resource
            for i in range(3)
        }
        assert len(got) == 3
        with pytest.raises(rasd_client.NoCapacity):
            await rasd_aio.get_lease(C, P, "k-more", timedelta(hours=1), socket_path=s)
        queries = d.counters["ddb.Query"]
        with pytest.raises(rasd_client.NoCapacity):
            await rasd_aio.get_lease(C, P, "k-more2", timedelta(hours=1), socket_path=s)
        # the key lookup only (its mappings: a table out of rollout mode), no sweep
        assert d.counters["ddb.Query"] == queries + 1
        with pytest.raises(rasd_client.UnknownPool):
            await rasd_aio.get_lease(C, "nope", "k", timedelta(hours=1), socket_path=s)
        with pytest.raises(rasd_client.BadRequest, match="maximum"):
            await rasd_aio.get_lease(C, P, "k0", timedelta(days=30), socket_path=s)
        with pytest.raises(rasd_client.BadRequest, match="past"):
            await rasd_aio.get_lease(C, P, "k0", 1_000_000, socket_path=s)


async def test_single_flight(ddb: Any, table: str, make_daemon: Any) -> None:
    """Concurrent requests for one new key inside one daemon share one acquisition."""
    seed_pool(ddb, table, count=20)
    async with make_daemon() as d:
        s = d.cfg.socket
        leases = await asyncio.gather(
            *(rasd_aio.get_lease(C, P, "hot", timedelta(hours=1), socket_path=s) for _ in range(30))
        )
        assert len({x.resource for x in leases}) == 1
        assert sum(x.new for x in leases) == 1
        assert d.counters["lease.new"] == 1
        leased = [it for it in scan_all(ddb, table) if it.get("key", {}).get("S") == "hot"]
        assert len(leased) == 1


async def test_two_daemons_one_new_key(ddb: Any, table: str, make_daemon: Any) -> None:
    """Two daemons of one region racing for one brand-new key end with one resource."""
    seed_pool(ddb, table, count=40)
    async with make_daemon() as d1, make_daemon() as d2:
        for round_ in range(5):
            key = f"race-{round_}"
            a, b = await asyncio.gather(
                rasd_aio.get_lease(
                    C, P, key, timedelta(hours=1), socket_path=d1.cfg.socket, timeout=10
                ),
                rasd_aio.get_lease(
                    C, P, key, timedelta(hours=1), socket_path=d2.cfg.socket, timeout=10
                ),
            )
            assert a.resource == b.resource
    rows = [serialize.item_from_ddb(it) for it in scan_all(ddb, table) if it["client_id"]["S"] == C]
    per_key: dict[str, int] = {}
    for r in rows:
        if r.key:
            per_key[r.key] = per_key.get(r.key, 0) + 1
    assert per_key == {f"race-{i}": 1 for i in range(5)}


def raw_exchange(path: str, data: bytes) -> list[Any]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.sendall(data)
    dec = wire.FrameDecoder()
    out: list[Any] = []
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            dec.feed(chunk)
            out.extend(dec.frames())
            if out and len(out) >= data.count(b"\x00\x00") // 100 + 1 and out[-1].get("id") == 99:
                break
    except TimeoutError:
        pass
    finally:
        s.close()
    return out


async def test_malformed_frames_get_bad_request_and_daemon_keeps_serving(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """Garbage, wrong types and oversized frames get BAD_REQUEST; other clients are served."""
    seed_pool(ddb, table, count=5)
    async with make_daemon() as d:
        s = d.cfg.socket
        junk = (
            struct.pack(">I", 3)
            + b"\xc1\xc1\xc1"
            + wire.encode(
                {
                    "v": 1,
                    "id": 1,
                    "op": "get_lease",
                    "client_id": C,
                    "pool_id": P,
                    "key": 42,
                    "lease_expires_us": 1,
                }
            )
            + struct.pack(">I", 4)
            + msgpack.packb([1, 2, 3])
            + wire.encode({"v": 1, "id": 99, "op": "ping"})
        )
        out = await asyncio.to_thread(raw_exchange, s, junk)
        codes = [(f.get("id"), f.get("code")) for f in out]
        assert codes[:3] == [(None, "BAD_REQUEST"), (1, "BAD_REQUEST"), (None, "BAD_REQUEST")]
        assert out[3]["id"] == 99 and out[3]["ok"]
        huge = await asyncio.to_thread(raw_exchange, s, struct.pack(">I", 2**31) + b"x" * 10)
        assert huge and huge[0]["code"] == "BAD_REQUEST"
        ok = await rasd_aio.get_lease(C, P, "still-fine", timedelta(hours=1), socket_path=s)
        assert ok.new
        assert d.counters["req.bad_frame"] >= 3


async def test_headroom_from_balancer_metadata_or_count(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """headroom() serves the balancer's fresh figure (floored at 0) and falls back to counting
    free items when there is none or it is stale."""
    seed_pool(ddb, table, count=12)
    clock = FakeClock(now_us=__import__("time").time_ns() // 1000)

    def put_headroom(value: int, updated_us: int) -> None:
        ddb.put_item(
            TableName=table,
            Item={
                "client_id": {"S": lease_items.META_CLIENT},
                "resource": {"S": f"headroom#{C}#{P}#us-east-1"},
                "headroom": {"N": str(value)},
                "free": {"N": "12"},
                "updated": {"S": lease_items.fmt_time(updated_us)},
            },
        )

    async with make_daemon(clock=clock) as d:
        s = d.cfg.socket
        assert await rasd_aio.headroom(C, P, socket_path=s, timeout=WAIT) == 12  # counted
        put_headroom(7, clock.now_us())
        d.coordinator.reporter._headroom.clear()
        assert await rasd_aio.headroom(C, P, socket_path=s, timeout=WAIT) == 7
        put_headroom(-3, clock.now_us())
        d.coordinator.reporter._headroom.clear()
        assert await rasd_aio.headroom(C, P, socket_path=s, timeout=WAIT) == 0
        put_headroom(7, clock.now_us() - 3600 * lease_items.US)  # stale: count again
        d.coordinator.reporter._headroom.clear()
        assert await rasd_aio.headroom(C, P, socket_path=s, timeout=WAIT) == 12


async def test_prometheus_endpoint_exports_the_daemons_counters(
    ddb: Any, table: str, make_daemon: Any, socket_only: None
) -> None:
    """With metrics_port set, /metrics on loopback shows the cache hit/miss counters, DynamoDB
    calls per operation and latency per path of the live daemon. Its calls go over the socket
    (``socket_only``): a hit table fetched between them would answer a hit the daemon never
    counts."""
    import urllib.request

    seed_pool(ddb, table, count=5)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    async with make_daemon(metrics_port=port) as d:
        s = d.cfg.socket
        for _ in range(3):
            await rasd_aio.get_lease(C, P, "m", timedelta(hours=1), socket_path=s)
        url = f"http://127.0.0.1:{port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    text = body.decode()
    assert 'rasd_cache_lookups_total{result="hit"} 2.0' in text
    assert 'rasd_cache_lookups_total{result="miss"} 1.0' in text
    assert 'rasd_dynamodb_calls_total{op="Query"}' in text
    assert 'rasd_request_duration_seconds_count{path="new"} 1.0' in text
    assert "rasd_cache_leases" in text
