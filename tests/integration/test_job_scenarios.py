"""Every actor that writes the table keeps I1: the adversarial scenarios of the jobs and
``rasadmin``, replayed deterministically against moto's server with the real daemons' driver
(``rasd.daemon.coordinator.Coordinator`` on one FakeClock) and the real commands.

Each test asks one question of I1 (a resource is never answered to two keys while a lease on
it runs): can a job or command make a resource claimable while a daemon still answers it to
another key?
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import boto3
import pytest
import structlog
from botocore.exceptions import ClientError

from rasd.config import Config
from rasd.core import builders, map_builders, schema, serialize
from rasd.core import lease as lease_items
from rasd.core.errors import NoCapacity
from rasd.core.writes import item_from_av, key_av, render
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from rasd_jobs import balancer, dedupe, liberator
from tests.doubles.clock import FakeClock
from tests.helpers.tables import hold

pytestmark = pytest.mark.integration

C, P = "demo", "default"
EAST, WEST = "us-east-1", "eu-west-1"


@pytest.fixture(autouse=True)
def _one_table_for_all_regions(monkeypatch: pytest.MonkeyPatch) -> Any:
    """AWS_REGION pins every client to moto's us-east-1: the one table stands in for the
    global table whatever RAS region a daemon or job manages."""
    monkeypatch.setenv("AWS_REGION", EAST)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@asynccontextmanager
async def daemon(
    url: str, table: str, name: str, clock: FakeClock, region: str = EAST
) -> AsyncIterator[Coordinator]:
    cfg = Config(table=table, endpoint_url=url, region=region, socket=f"/nonexistent/{name}.sock")
    store = Store(cfg.validate())
    await store.start()
    acq = Coordinator(cfg, store, clock=clock, owner=name)
    try:
        await acq.pool_table.load(time.monotonic() + 5)
        yield acq
    finally:
        await acq.drain(2.0)
        # prefetch refills still running would fail on the closed store, and their unretrieved
        # exceptions be logged (traceback formatting calls ast.parse) from whatever thread
        # collects them, racing pytest's own ast.parse on CPython 3.11.7
        refills = [t for t in acq.prefetch._refills.values() if not t.done()]
        if refills:
            await asyncio.wait(refills, timeout=2.0)
        await store.close()


async def get_lease(
    d: Coordinator, key: str, clock: FakeClock, secs: float = 3600
) -> lease_items.Lease | None:
    """get_lease(key) asking for now + secs; None on NO_CAPACITY."""
    try:
        lease, _ = await d.acquirer.get_lease(
            C, P, key, clock.now_us() + int(secs * lease_items.US), time.monotonic() + 5
        )
    except NoCapacity:
        return None
    return lease


def item(ddb: Any, table: str, resource: str) -> dict[str, Any] | None:
    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": C}, "resource": {"S": resource}},
        ConsistentRead=True,
    ).get("Item")
    return item_from_av(raw) if raw else None


def claimable_from(item: dict[str, Any]) -> str:
    """When a freed item is claimable: its quarantine's end (out of the available index until
    re-listed) or, once listed, its ``lease_available``."""
    return str(item.get("quarantine_until") or item["lease_available"])


# --------------------------------------------- ras-dedupe stopped between its two writes
class FailFreeClaim:
    """A boto3 client whose first ``free_claim`` of ``res`` fails (a 5xx past botocore's
    retries, or the job killed between its two writes)."""

    def __init__(self, inner: Any, res: str) -> None:
        self._inner, self._res, self.failed = inner, res, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update_item(self, **kw: Any) -> Any:
        names = set(kw.get("ExpressionAttributeNames", {}).values())
        if (
            kw["Key"]["resource"]["S"] == self._res
            and "holder" in names
            and bool(names & {"lease_available", "quarantine_until"})
            and "REMOVE" in kw["UpdateExpression"]
            and not self.failed
        ):
            self.failed += 1
            raise ClientError(
                {
                    "Error": {"Code": "InternalServerError", "Message": "injected"},
                    "ResponseMetadata": {"HTTPStatusCode": 500},
                },
                "UpdateItem",
            )
        return self._inner.update_item(**kw)


@pytest.mark.parametrize("repairer", ["liberator", "dedupe"])
async def test_orphan_left_by_dedupe_is_held_to_its_lease_end(
    moto_endpoint: str, ddb: Any, table: str, repairer: str
) -> None:
    """A cross-region duplicate: west's daemon answered k1 -> rb until t0+3600 while east's
    earlier acquisition of ra had not replicated. ras-dedupe keeps ra, releases rb: its
    map_release applies, its free of rb fails. rb is an orphan whose lease apps still use
    (no app released it). Orphan repair (the liberator's, or the next dedupe run's) must keep
    rb unclaimable until k1's answer ends (plus the skew), not just for the quarantine."""
    schema.put_pool(ddb, table, C, P, 7200)
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    t0 = clock.now_us()
    schema.add_resources(ddb, table, C, P, EAST, ["ra"], now_us=t0 - 60 * lease_items.US)
    schema.add_resources(ddb, table, C, P, WEST, ["rb"], now_us=t0 - 60 * lease_items.US)
    async with daemon(moto_endpoint, table, "dW1", clock, WEST) as dw1:
        lease = await get_lease(dw1, "k1", clock)
        await dw1.drain(2.0)
    assert lease is not None and lease.resource == "rb"
    hold(
        ddb,
        table,
        "ra",
        "k1",
        t0 + 3660 * lease_items.US,
        t0 - 1 * lease_items.US,
        token="tok-east",
    )
    flaky = FailFreeClaim(ddb, "rb")
    opts = dedupe.Options(table=table, region=WEST, now_us=t0 + 10 * lease_items.US, segments=1)
    s1 = dedupe.run(flaky, opts)
    assert flaky.failed == 1 and s1["errors"] == 1
    assert item(ddb, table, "rb")["key"] == "k1"  # the orphan: held, no mapping names it
    if repairer == "dedupe":
        s2 = dedupe.run(
            ddb,
            dedupe.Options(table=table, region=WEST, now_us=t0 + 900 * lease_items.US, segments=1),
        )
    else:
        s2 = liberator.run(
            ddb,
            liberator.Options(
                table=table, region=WEST, now_us=t0 + 130 * lease_items.US, segments=1
            ),
        )
    assert s2["orphans_freed"] == 1
    rb = item(ddb, table, "rb")
    assert rb is not None and "key" not in rb
    available = lease_items.parse_time(str(claimable_from(rb)))
    assert available >= lease.expires_us + int(Config().max_clock_skew * lease_items.US)
    # A daemon of rb's region asks for another key just after the quarantine alone would end.
    clock.advance((t0 + 1000 * lease_items.US - clock.now_us()) / lease_items.US)
    async with daemon(moto_endpoint, table, "dW2", clock, WEST) as dw2:
        other = await get_lease(dw2, "k2", clock, 600)
    assert other is None, f"{other} answered to k2 while k1's answer (rb) runs to its end"


# --------------------------------------------- ras-balancer without the donor's replica
class Replica:
    """A boto3 client of one replica: the job's table name is mapped to that replica's table
    (two moto tables stand for the global table's two replicas)."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner, self._name = inner, name

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self._inner, attr)
        if not callable(real) or attr in ("get_paginator",):
            return real if attr != "get_paginator" else self._paginator

        def call(**kw: Any) -> Any:
            if "TableName" in kw:
                kw["TableName"] = self._name
            return real(**kw)

        return call

    def _paginator(self, op: str) -> Any:
        inner = self._inner.get_paginator(op)
        name = self._name

        class Pages:
            def paginate(self, **kw: Any) -> Any:
                return inner.paginate(**{**kw, "TableName": name})

        return Pages()


def replicate_lww(
    ddb: Any, rep: dict[str, str], key: dict[str, Any], writes: list[tuple[int, str]]
) -> None:
    """Global tables' last-writer-wins for one item written in several replicas within the
    lag: the replica with the latest write wins everywhere. ``writes``: (order, region)."""
    _, winner = max(writes)
    img = ddb.get_item(TableName=rep[winner], Key=key, ConsistentRead=True)["Item"]
    for t in rep.values():
        ddb.put_item(TableName=t, Item=img)


@pytest.mark.parametrize("peer", [False, True])
async def test_balancer_never_moves_a_region_in_another_regions_replica(
    moto_endpoint: str, ddb: Any, table: str, peer: bool
) -> None:
    """eu-west-1's daemon claims all four of its items in its replica; within the replication
    lag us-east-1's replica still shows them free. A ras-balancer run for us-east-1 with no
    --peer-endpoint for eu-west-1 would move two of them in us-east-1's replica; last writer
    wins, the claims are gone while the mappings still name them, and us-east-1 answers them
    to other keys. Without eu-west-1's replica the run must refuse and write no item; with
    it, the moves go to eu-west-1's replica, where the claims already won."""

    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    rep = {EAST: f"{table}-east", WEST: f"{table}-west"}
    names = [f"w{i}" for i in range(4)]
    for t in rep.values():
        schema.create_table(ddb, t)
        schema.put_pool(ddb, t, C, P, 7200)
        schema.add_resources(ddb, t, C, P, WEST, names, now_us=clock.now_us() - 60 * lease_items.US)
    got: dict[str, str] = {}
    async with daemon(moto_endpoint, rep[WEST], "dW", clock, WEST) as dw:
        for k in ("k1", "k2", "k3", "k4"):
            lease = await get_lease(dw, k, clock)
            assert lease is not None
            got[lease.resource] = k
        await dw.drain(2.0)
    assert sorted(got) == names
    streams = boto3.client("dynamodbstreams", endpoint_url=moto_endpoint, region_name=EAST)
    east = Replica(ddb, rep[EAST])
    clients = balancer.Clients(
        ddb=east, streams=streams, peers={WEST: Replica(ddb, rep[WEST])} if peer else {}
    )
    opts = balancer.Options(table="rasd", region=EAST, now_us=clock.now_us(), regions=(EAST, WEST))
    summary = balancer.run(opts, clients)
    for r in names:  # replication: east's copy of an item wins where east wrote it last
        key = {"client_id": {"S": C}, "resource": {"S": r}}
        moved = ddb.get_item(TableName=rep[EAST], Key=key, ConsistentRead=True)["Item"]
        writes = [(0, WEST)] + ([(1, EAST)] if moved["region"]["S"] == EAST else [])
        replicate_lww(ddb, rep, key, writes)
    clock.advance(2.0)
    async with daemon(moto_endpoint, rep[EAST], "dE", clock, EAST) as de:
        other = await get_lease(de, "k9", clock)
    async with daemon(moto_endpoint, rep[WEST], "dW2", clock, WEST) as dw2:
        if other is not None:
            mine = await get_lease(dw2, got[other.resource], clock)
            assert mine is None or mine.resource != other.resource, (
                f"{other.resource} answered to k9 in us-east-1 and to {got[other.resource]} "
                "in eu-west-1"
            )
    assert other is None
    if peer:
        assert summary["status"] == "ok" and summary["moved"] == 0, summary
    else:
        assert summary["status"] == "refused" and summary["missing_peer_endpoints"] == [WEST]


# ------------------------------------------------------- rasadmin delete, then add again
def admin_call(url: str, table: str, clock: FakeClock, *argv: str) -> int:
    from rasd_jobs import admin

    common = ["--endpoint-url", url, "--table", table, "--region", EAST]
    return admin.main([*argv, *common, "--now", str(clock.now_us() / lease_items.US)])


@pytest.mark.parametrize("force", [False, True])
async def test_deleted_quarantined_name_added_again_waits_for_the_quarantine(
    moto_endpoint: str, ddb: Any, table: str, tmp_path: Any, force: bool
) -> None:
    """k1's lease on res-0 is released through d1 (res-0 quarantined for Q) while d2 still
    serves it from its cache. `rasadmin delete-resource` refuses a quarantined item without
    --force; with --force it leaves a tombstone, and `rasadmin add-resources` of the same
    name makes it claimable only when the quarantine ends: d3 does not answer it to k2 while
    d2 may still answer it to k1, and does once the quarantine is over."""
    schema.put_pool(ddb, table, C, P, 7200)
    schema.add_resources(ddb, table, C, P, EAST, ["res-0"])
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    names = tmp_path / "names"
    names.write_text("res-0\n")
    async with (
        daemon(moto_endpoint, table, "d1", clock) as d1,
        daemon(moto_endpoint, table, "d2", clock) as d2,
        daemon(moto_endpoint, table, "d3", clock) as d3,
    ):
        a = await get_lease(d1, "k1", clock)
        b = await get_lease(d2, "k1", clock)
        assert a is not None and b is not None and a.resource == b.resource == "res-0"
        await d1.releaser.release(C, P, "k1", time.monotonic() + 2)
        await d1.drain(2.0)
        released = item(ddb, table, "res-0")
        assert released is not None and "key" not in released
        until = lease_items.parse_time(str(claimable_from(released)))
        clock.advance(1.0)
        argv = ["delete-resource", "--client", C, "--resource", "res-0"]
        rc = admin_call(moto_endpoint, table, clock, *argv, *(["--force"] if force else []))
        assert rc == (0 if force else 1)
        rc = admin_call(
            moto_endpoint, table, clock, "add-resources", "--client", C, "--pool", P,
            "--file", str(names),
        )  # fmt: skip
        assert rc == 0
        back = item(ddb, table, "res-0")
        assert back is not None and str(claimable_from(back)) >= lease_items.fmt_time(until)
        clock.advance(1.0)
        relist = liberator.Options(table=table, region=EAST, now_us=clock.now_us(), segments=1)
        liberator.run(ddb, relist)  # too early: re-lists nothing
        d3.prefetch.buffers.clear()
        other = await get_lease(d3, "k2", clock)
        cached = d2.cache.get((C, P, "k1"))
        assert cached is not None and cached.resource == "res-0"  # allowed for up to S (I3)
        assert other is None, f"{other.resource} answered to k2 while d2 answers it to k1"
        clock.advance((until - clock.now_us()) / lease_items.US + 1)
        # the quarantine is over: the liberator re-lists the re-added name
        liberator.run(ddb, dataclasses.replace(relist, now_us=clock.now_us()))
        d3.prefetch.buffers.clear()
        later = await get_lease(d3, "k2", clock)
        assert later is not None and later.resource == "res-0"  # the quarantine is over


async def test_force_deleted_lease_added_again_waits_for_its_end(
    moto_endpoint: str, ddb: Any, table: str, tmp_path: Any
) -> None:
    """`rasadmin delete-resource --force` of a running lease, then `add-resources` of the
    name: the app was answered until the lease's end and no app released it, so the name is
    claimable again only after that end plus the skew."""
    schema.put_pool(ddb, table, C, P, 7200)
    schema.add_resources(ddb, table, C, P, EAST, ["res-0"])
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    names = tmp_path / "names"
    names.write_text("res-0\n")
    async with daemon(moto_endpoint, table, "d1", clock) as d1:
        a = await get_lease(d1, "k1", clock, 600)
        await d1.drain(2.0)
    assert a is not None
    clock.advance(1.0)
    argv = ["delete-resource", "--client", C, "--resource", "res-0", "--force"]
    assert admin_call(moto_endpoint, table, clock, *argv) == 0
    add = ["add-resources", "--client", C, "--pool", P, "--file", str(names)]
    assert admin_call(moto_endpoint, table, clock, *add) == 0
    back = item(ddb, table, "res-0")
    skew = int(Config().max_clock_skew * lease_items.US)
    assert back is not None and claimable_from(back) == lease_items.fmt_time(a.expires_us + skew)
    assert int(back["version"]) > a.version  # fencing tokens keep growing through a re-add
    clock.advance(300.0)
    async with daemon(moto_endpoint, table, "d2", clock) as d2:
        assert await get_lease(d2, "k2", clock) is None


async def test_admin_release_holds_the_resource_to_the_lease_end(
    moto_endpoint: str, ddb: Any, table: str
) -> None:
    """`rasadmin release-resource` of a running lease: the key's mapping is released (its
    next get_lease acquires anew), but no app released the lease, so the resource is
    claimable only after its end plus the skew, not after the quarantine alone."""
    schema.put_pool(ddb, table, C, P, 7200)
    schema.add_resources(ddb, table, C, P, EAST, ["res-0"])
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    async with daemon(moto_endpoint, table, "d1", clock) as d1:
        a = await get_lease(d1, "k1", clock, 600)
        await d1.drain(2.0)
    assert a is not None
    argv = ["release-resource", "--client", C, "--resource", "res-0"]
    assert admin_call(moto_endpoint, table, clock, *argv) == 0
    freed = item(ddb, table, "res-0")
    skew = int(Config().max_clock_skew * lease_items.US)
    assert freed is not None and claimable_from(freed) == lease_items.fmt_time(a.expires_us + skew)
    clock.advance(120.0)  # past the quarantine, before the lease's end
    async with daemon(moto_endpoint, table, "d2", clock) as d2:
        assert await get_lease(d2, "k2", clock) is None


def test_delete_pool_writes_another_regions_items_only_through_its_endpoint(
    moto_endpoint: str, ddb: Any, table: str
) -> None:
    """`rasadmin delete-pool` of a pool with items in two regions, pointed at one region's
    replica: deleting (tombstoning) eu-west-1's items there would race eu-west-1's claims by
    last-writer-wins, so it refuses before any write unless that region has an endpoint
    (--peer-endpoint), or --unreplicated says the table is one plain table."""
    schema.put_pool(ddb, table, C, P, 7200)
    schema.add_resources(ddb, table, C, P, EAST, ["e0"])
    schema.add_resources(ddb, table, C, P, WEST, ["w0"])
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    argv = ["delete-pool", "--client", C, "--pool", P]
    assert admin_call(moto_endpoint, table, clock, *argv) == 1
    assert item(ddb, table, "w0") is not None and item(ddb, table, "e0") is not None
    assert ddb.get_item(TableName=table, Key=serialize.pool_meta_key(C, P)).get("Item") is not None
    assert admin_call(moto_endpoint, table, clock, *argv, "--unreplicated") == 0
    assert all(serialize.is_tombstone(item(ddb, table, r) or {}) for r in ("e0", "w0"))


# ------------------------------------------------------------- the daemons' config file
def _duplicate_in_two_regions(
    ddb: Any, table: str, tmp_path: Any, outlasts_s: int
) -> tuple[Any, int, int]:
    """A config with a wide skew and margin (17 s in all), and key k1 held in both regions
    for an hour: rb in east to ``end``, ra in west (the survivor) ``outlasts_s`` longer.
    Returns the config's path, now and ``end`` (µs)."""
    conf = tmp_path / "rasd.toml"
    conf.write_text("max_clock_skew = 10.0\nskew_margin = 7.0\n")
    schema.put_pool(ddb, table, C, P, 7200)
    now = int(time.time() * lease_items.US)
    schema.add_resources(ddb, table, C, P, WEST, ["ra"], now_us=now - 60 * lease_items.US)
    schema.add_resources(ddb, table, C, P, EAST, ["rb"], now_us=now - 60 * lease_items.US)
    end = now + 3600 * lease_items.US
    survivor_end = end + outlasts_s * lease_items.US
    hold(ddb, table, "ra", "k1", survivor_end, now - 2 * lease_items.US, token="tok-west")
    hold(ddb, table, "rb", "k1", end, now - 1 * lease_items.US, token="tok-east")
    return conf, now, end


def test_jobs_take_the_daemons_bounds_from_their_config_file(
    moto_endpoint: str, ddb: Any, table: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """ras-dedupe with --config: the skew and margin are the daemons' (here 10 s and 7 s, not
    the built-in 2 s and 5 s). The survivor must outlast the extra by margin + skew, and the
    released extra is held to its end plus that skew. The liberator refuses a --grace below
    the config's max_clock_skew; a bad file is a usage error (exit 2)."""
    conf, now, end = _duplicate_in_two_regions(ddb, table, tmp_path, outlasts_s=20)
    at = ["--now", str(now / lease_items.US), "--endpoint-url", moto_endpoint, "--table", table]
    run = ["--region", EAST, *at, "--segments", "1"]
    assert dedupe.main([*run, "--config", str(conf)]) == 0
    summary = capsys.readouterr().out
    assert '"released": 1' in summary, summary
    rb = item(ddb, table, "rb")
    assert rb is not None and claimable_from(rb) == lease_items.fmt_time(end + 10 * lease_items.US)

    lib = ["--region", EAST, *at, "--config", str(conf)]
    assert liberator.main([*lib, "--grace", "5"]) == 2
    assert "max_clock_skew" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("max_clock_skew = 'soon'\n")
    assert dedupe.main([*run, "--config", str(bad)]) == 2


def test_dedupe_keeps_an_extra_its_survivor_outlasts_only_by_the_default_slack(
    moto_endpoint: str, ddb: Any, table: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same duplicate, the survivor outlasting the extra by 10 s: enough for the built-in
    margin + skew (7 s), not for the config's (17 s), so with --config the extra is kept."""
    conf, now, _ = _duplicate_in_two_regions(ddb, table, tmp_path, outlasts_s=10)
    run = ["--region", EAST, "--now", str(now / lease_items.US), "--endpoint-url", moto_endpoint]
    run += ["--table", table, "--segments", "1", "--config", str(conf)]
    assert dedupe.main(run) == 0
    assert '"kept_until_survivor_outlasts": 1' in capsys.readouterr().out
    rb = item(ddb, table, "rb")
    assert rb is not None and rb["key"] == "k1"


# ------------------------------------- ras-dedupe: an orphan that became a lease meanwhile
class LandsBeforeRelease:
    """A boto3 client that, on the second consistent read of ``mapping`` (dedupe reads it
    once to examine the item, once more to free it), first lands ``late`` (a daemon's
    map_acquire that was in flight) and waits until a daemon has served it."""

    def __init__(self, inner: Any, mapping: dict[str, Any], late: Any) -> None:
        self._inner, self._mapping, self._late = inner, mapping, late
        self.reads = 0
        self.landed, self.served = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_item(self, **kw: Any) -> Any:
        if kw["Key"] == self._mapping:
            self.reads += 1
            if self.reads == 2:
                self._inner.update_item(TableName=kw["TableName"], **render(self._late))
                self.landed.set()
                assert self.served.wait(10)
        return self._inner.get_item(**kw)


async def test_dedupe_never_frees_an_orphan_that_became_a_lease(
    moto_endpoint: str, ddb: Any, table: str
) -> None:
    """k1 got ra in us-east-1; in eu-west-1 a daemon's claim of rb landed but its mapping
    write was still in flight (its request gave up), so ras-dedupe (west) examines rb as an
    orphan. The write lands, a west daemon serves k1 -> rb, and only then does dedupe free
    "the orphan". It must not: rb is a lease now, perhaps served until its end, and no app
    released it. Dedupe leaves it (a lost race; the next run judges it as a lease), so no
    other key gets rb while k1's answer runs."""
    schema.put_pool(ddb, table, C, P, 7200)
    clock = FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())
    t0 = clock.now_us()
    schema.add_resources(ddb, table, C, P, EAST, ["ra"], now_us=t0 - 60 * lease_items.US)
    schema.add_resources(ddb, table, C, P, WEST, ["rb"], now_us=t0 - 60 * lease_items.US)

    def resource(name: str) -> lease_items.ResourceItem:
        raw = ddb.get_item(TableName=table, Key=key_av((C, name)), ConsistentRead=True)["Item"]
        return serialize.item_from_ddb(raw)

    # east's lease on ra, its mapping still pending (the confirm not yet written): west's
    # daemons do not serve it, they verify and serve their own pending mapping
    east = (lease_items.map_pk(C, P, "k1"), EAST)
    ra0, ra_end = resource("ra"), t0 + 3660 * lease_items.US
    for w in (
        map_builders.map_acquire(
            east, 0, "tok-east", "ra", ra0.version, ra_end, t0 - lease_items.US, "dE0"
        ),
        builders.claim(ra0, "k1", ra_end, t0 - lease_items.US, "tok-east", 1),
    ):
        ddb.update_item(TableName=table, **render(w))
    rb0, end = resource("rb"), t0 + 3600 * lease_items.US
    ident = (lease_items.map_pk(C, P, "k1"), WEST)
    ddb.update_item(TableName=table, **render(builders.claim(rb0, "k1", end, t0, "tok-west", 1)))
    late = map_builders.map_acquire(ident, 0, "tok-west", "rb", rb0.version, end, t0, "dW0")
    hooked = LandsBeforeRelease(ddb, key_av(ident), late)
    opts = dedupe.Options(table=table, region=WEST, now_us=t0 + 10 * lease_items.US, segments=1)
    async with daemon(moto_endpoint, table, "dW1", clock, WEST) as dw1:
        run = asyncio.create_task(asyncio.to_thread(dedupe.run, hooked, opts))
        assert await asyncio.to_thread(hooked.landed.wait, 10)
        served = await get_lease(dw1, "k1", clock)
        hooked.served.set()
        summary = await run
    assert served is not None and served.resource == "rb"  # the pending lease, verified
    clock.advance(120.0)  # past the quarantine, long before k1's answer ends
    async with daemon(moto_endpoint, table, "dW2", clock, WEST) as dw2:
        other = await get_lease(dw2, "k2", clock, 600)
    assert other is None, f"{other.resource} answered to k2 while k1's answer runs to its end"
    assert summary["released"] == 0 and summary["orphans_freed"] == 0, summary
    assert summary["lost_races"] == 1, summary
