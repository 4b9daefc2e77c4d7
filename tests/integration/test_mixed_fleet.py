"""rasd beside the paper's in-process agent on one table (docs/operations.md, "Rolling out
beside the paper's agent"): the agent is ``bench.baseline.BaselineAgent(paper=True)``, which
writes what the paper's agent writes and nothing more, and ``bench.baseline.paper_liberate``
is its hourly liberator. moto's server over HTTP, as every integration test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

import rasd_client.errors
from bench.baseline import BaselineAgent, NoCapacity, paper_claim, paper_liberate
from rasd.config import Config
from rasd.core import builders, schema, serialize
from rasd.core import lease as lease_items
from rasd.core.writes import render
from rasd.server import Daemon
from rasd.steps import take
from rasd_client import aio as rasd_aio
from rasd_jobs import admin, common, liberator
from tests.doubles.clock import FakeClock
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import rollout_on, scan_all, seed_pool

pytestmark = pytest.mark.integration

C, P, EAST = "demo", "default", "us-east-1"


@pytest.fixture(autouse=True)
def _rollout_mode(ddb: Any, table: str) -> None:
    """The paper's agent writes these tables: they are in rollout mode (``rasadmin adopt``)."""
    rollout_on(ddb, table)


@pytest.fixture
def paper(moto_endpoint: str, table: str) -> Iterator[Callable[[], BaselineAgent]]:
    """``paper()``: a paper agent on the test's table (its connections closed afterwards)."""
    made: list[BaselineAgent] = []

    def make() -> BaselineAgent:
        made.append(BaselineAgent(table, EAST, moto_endpoint, paper=True))
        return made[-1]

    yield make
    for agent in made:
        agent.ddb.close()


def resource(ddb: Any, table: str, name: str) -> lease_items.ResourceItem:
    raw = ddb.get_item(
        TableName=table, Key={"client_id": {"S": C}, "resource": {"S": name}}, ConsistentRead=True
    )["Item"]
    return serialize.item_from_ddb(raw)


def held_by(ddb: Any, table: str) -> dict[str, list[str]]:
    """key -> the resources the table shows held for it."""
    out: dict[str, list[str]] = {}
    for raw in scan_all(ddb, table):
        if serialize.is_resource_item(raw) and "key" in raw:
            out.setdefault(raw["key"]["S"], []).append(raw["resource"]["S"])
    return out


def now_us() -> int:
    return time.time_ns() // 1000


async def test_rasd_serves_what_the_paper_agent_leased(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """A key the paper's agent leased (no mapping item) is answered by rasd with the same
    resource, on every rasd host, and the paper's agent keeps answering it too: no key gets a
    second resource. (Before: rasd acquired a second resource for each such key.)"""
    seed_pool(ddb, table, count=30)
    agent = paper()
    theirs = {
        f"k{i}": agent.get_lease(C, P, f"k{i}", now_us() + 3600 * lease_items.US).resource
        for i in range(8)
    }
    async with make_daemon() as d1, make_daemon() as d2:
        for key, res in theirs.items():
            hour = timedelta(hours=1)
            a = await rasd_aio.get_lease(C, P, key, hour, socket_path=d1.cfg.socket, timeout=WAIT)
            b = await rasd_aio.get_lease(C, P, key, hour, socket_path=d2.cfg.socket, timeout=WAIT)
            assert (a.resource, b.resource) == (res, res), key
            assert not a.new and not b.new
        assert d1.counters["lease.adopted"] == len(theirs)
        assert d2.counters["lease.adopted"] == 0  # d2 found the mappings d1 wrote
        assert d1.counters["lease.new"] == 0 and d2.counters["lease.new"] == 0
        await d1.coordinator.drain(2.0)
    for key, res in theirs.items():
        again = agent.get_lease(C, P, key, now_us() + 3600 * lease_items.US)
        assert again.resource == res and not again.new
        r = resource(ddb, table, res)
        assert r.key == key and r.holder_current  # now a rasd lease as well
    assert {k: v for k, v in held_by(ddb, table).items()} == {k: [v] for k, v in theirs.items()}


async def test_adoption_extends_a_lease_about_to_end(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """A paper lease too close to its end to serve is adopted and extended (resource, then
    mapping) before it is answered, not replaced by a second resource."""
    seed_pool(ddb, table, count=5)
    clock = FakeClock(now_us=now_us())
    agent = paper()
    res = agent.get_lease(C, P, "short", clock.now_us() + 3 * lease_items.US).resource
    async with make_daemon(clock=clock) as d:
        got = await rasd_aio.get_lease(
            C,
            P,
            "short",
            (clock.now_us() + 600 * lease_items.US) / lease_items.US,
            socket_path=d.cfg.socket,
            timeout=WAIT,
        )
        assert got.resource == res and not got.new
        assert d.counters["lease.adopted"] == 1 and d.counters["lease.extended"] == 1
    r = resource(ddb, table, res)
    assert r.lease_expires_us == clock.now_us() + 600 * lease_items.US


async def test_paper_agent_cannot_take_a_quarantined_resource(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """A resource rasd released stays out of the available index for the quarantine: the
    paper's agent (candidates from that index, claim conditioned on the version alone)
    cannot take it, not even from an index entry read before rasd claimed it; once the
    quarantine is over it is re-listed and the agent may take it. (Before: the quarantine was
    a future ``lease_available`` inside the index and the agent took the resource at once.)"""
    names = seed_pool(ddb, table, count=4)
    before = {n: resource(ddb, table, n) for n in names}  # the index as a lagging read shows it
    agent = paper()
    async with make_daemon() as d:
        s = d.cfg.socket
        mine = await rasd_aio.get_lease(
            C, P, "rasd-key", timedelta(hours=1), socket_path=s, timeout=WAIT
        )
        await rasd_aio.release(C, P, "rasd-key", socket_path=s, timeout=WAIT)
        await d.coordinator.drain(2.0)  # the quarantining write; its re-listing is cancelled
    q = resource(ddb, table, mine.resource)
    assert q.key is None and q.lease_available is None and q.quarantine_until is not None
    taken = set()
    with pytest.raises(NoCapacity):
        for i in range(len(names)):
            taken.add(agent.get_lease(C, P, f"p{i}", now_us() + 3600 * lease_items.US).resource)
    assert mine.resource not in taken and len(taken) == len(names) - 1
    stale = before[mine.resource]  # free at version 0 in a stale index read
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        ddb.update_item(
            TableName=table, **render(paper_claim(stale, "p-stale", now_us() + lease_items.US))
        )
    # the quarantine ends: ras-liberator re-lists what no daemon re-listed
    end = lease_items.parse_time(q.quarantine_until or "")
    early = liberator.run(ddb, liberator.Options(table, EAST, end - lease_items.US, segments=1))
    assert early["relisted"] == 0 and early["freed"] == 0, early
    late = liberator.run(ddb, liberator.Options(table, EAST, end + lease_items.US, segments=1))
    assert late["relisted"] == 1 and late["errors"] == 0, late
    assert (
        agent.get_lease(C, P, "p-after", now_us() + 3600 * lease_items.US).resource == mine.resource
    )


async def test_daemon_relists_what_it_quarantined(ddb: Any, table: str, make_daemon: Any) -> None:
    """The daemon that quarantined an item puts it back in the available index once the
    quarantine is over (a short quarantine here), with no job. (Out of rollout mode: in it
    the free would also wait for the lease's end.)"""
    common.write_rollout(ddb, table, False, common.read_rollout(ddb, table), "test", "test")
    seed_pool(ddb, table, count=2)
    short = {"confirm_interval": 0.2, "max_clock_skew": 0.1, "replication_lag": 0.1}
    async with make_daemon(legacy_agents=False, **short) as d:
        s = d.cfg.socket
        mine = await rasd_aio.get_lease(C, P, "k", timedelta(hours=1), socket_path=s, timeout=WAIT)
        await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        for _ in range(600):
            if d.counters["quarantine.relist_applied"]:
                break
            await __import__("asyncio").sleep(0.01)
        r = resource(ddb, table, mine.resource)
        assert r.quarantine_until is None and r.lease_available is not None
        assert r.claimable(now_us())


async def test_both_liberators_free_nothing_early(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """The paper's liberator frees an expired rasd lease and leaves rasd's ``holder`` on the
    item; the paper's agent then leases the item to another key. rasd's orphan repair sees a
    stale holder, not an orphan, and leaves that running lease alone; neither liberator frees
    a lease before its end. (Before: orphan repair freed the paper agent's running lease.)"""
    seed_pool(ddb, table, count=1)
    clock = FakeClock(now_us=now_us())
    async with make_daemon(clock=clock) as d:
        got = await rasd_aio.get_lease(
            C,
            P,
            "rasd-key",
            (clock.now_us() + 10 * lease_items.US) / lease_items.US,
            socket_path=d.cfg.socket,
            timeout=WAIT,
        )
        await d.coordinator.drain(2.0)
    t = clock.now_us()
    # neither liberator frees the running rasd lease
    assert paper_liberate(ddb, table, t)["freed"] == 0
    opts = liberator.Options(table, EAST, t, orphan_age_us=0, segments=1)
    assert liberator.run(ddb, opts)["freed"] == 0
    # after its end, the paper's liberator frees it (holder left behind)
    assert paper_liberate(ddb, table, t + 11 * lease_items.US)["freed"] == 1
    agent = paper()
    theirs = agent.get_lease(C, P, "paper-key", now_us() + 3600 * lease_items.US)
    assert theirs.resource == got.resource
    r = resource(ddb, table, got.resource)
    assert r.key == "paper-key" and r.holder is not None and not r.holder_current
    # rasd's liberator, orphan repair included, later than the orphan age: left alone
    late = liberator.Options(table, EAST, t + 600 * lease_items.US, orphan_age_us=0, segments=1)
    summary = liberator.run(ddb, late)
    assert summary["foreign_held"] == 1 and summary["orphans_freed"] == 0, summary
    assert summary["freed"] == 0, summary
    assert paper_liberate(ddb, table, now_us())["freed"] == 0
    assert resource(ddb, table, got.resource).key == "paper-key"
    assert (
        agent.get_lease(C, P, "paper-key", now_us() + 3600 * lease_items.US).resource
        == got.resource
    )


def paper_table(ddb: Any, name: str) -> None:
    """A table as the paper describes it: both indexes, no stream, no TTL, no pool items."""
    spec = schema.table_spec(name)
    del spec["StreamSpecification"]
    ddb.create_table(**spec)


def rasadmin(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = admin.main(argv)
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


async def test_rasadmin_adopt_brings_a_paper_table_to_rasd(
    ddb: Any,
    moto_endpoint: str,
    paper: Any,
    short_tmp: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``rasadmin adopt`` on a table the paper's agent filled: the stream and a pool
    definition are added, every running lease gets its mapping where it is (a dry run first
    writes nothing), a daemon then answers every key with the paper agent's resource without
    adopting anything itself, and a second run is a no-op (no write)."""
    table = f"paper-{time.monotonic_ns()}"
    paper_table(ddb, table)
    try:
        names = [f"res-{i:05d}" for i in range(12)]
        schema.add_resources(ddb, table, C, P, EAST, names)
        agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
        try:
            theirs = {
                f"k{i}": agent.get_lease(C, P, f"k{i}", now_us() + 3600 * lease_items.US).resource
                for i in range(6)
            }
            agent.get_lease(C, P, "ended", now_us() - lease_items.US)  # past its end, not liberated
        finally:
            agent.ddb.close()
        argv = ["adopt", "--table", table, "--endpoint-url", moto_endpoint, "--region", EAST]
        code, dry, _ = rasadmin([*argv, "--dry-run", "--page-size", "5"], capsys)
        assert code == 0 and dry["writes"] == 0 and dry["adopted"] == 6, dry
        assert "enable the stream (NEW_AND_OLD_IMAGES)" in dry["schema_changes"], dry
        assert not [
            raw for raw in scan_all(ddb, table) if serialize.is_mapping_pk(raw["client_id"]["S"])
        ]
        code, first, err = rasadmin([*argv, "--page-size", "5"], capsys)
        assert code == 0 and first["errors"] == 0, (first, err)
        assert (first["adopted"], first["pools_added"], first["running_leases"]) == (6, 1, 6)
        assert "resume_from" in err  # the position after each page, for --resume-from
        code, second, _ = rasadmin(argv, capsys)
        assert code == 0 and second["writes"] == 0 and second["schema_changes"] == [], second
        assert (second["adopted"], second["already_rasd"], second["pools_added"]) == (0, 6, 0)
        desc = ddb.describe_table(TableName=table)["Table"]
        assert desc["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
        cfg = Config(
            clock_check="date",
            table=table,
            endpoint_url=moto_endpoint,
            socket=str(short_tmp / "adopted.sock"),
            ddb_warm_connections=1,
        ).validate()
        d = Daemon(cfg)
        await d.startup()
        try:
            for key, res in theirs.items():
                got = await rasd_aio.get_lease(
                    C, P, key, timedelta(hours=1), socket_path=cfg.socket, timeout=WAIT
                )
                assert got.resource == res and not got.new
            assert d.counters["lease.adopted"] == 0 and d.counters["lease.existing"] == 6
        finally:
            await d.shutdown(drain=2.0)
    finally:
        ddb.delete_table(TableName=table)


async def test_an_early_free_beside_the_paper_agent_waits_for_the_lease_end(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """The paper's agent answers a rasd lease it finds in the leased index with the lease's
    end and is never told of a release: with ``legacy_agents`` (the default) a release keeps
    the resource out of the available index until that end plus the skew, not just for the
    quarantine; the liberator re-lists it only then."""
    seed_pool(ddb, table, count=2)
    agent = paper()
    async with make_daemon() as d:
        s = d.cfg.socket
        mine = await rasd_aio.get_lease(C, P, "k", timedelta(hours=1), socket_path=s, timeout=WAIT)
        theirs = agent.get_lease(C, P, "k", now_us() + 3600 * lease_items.US)
        assert theirs.resource == mine.resource and not theirs.new
        await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        await d.coordinator.drain(2.0)
        skew = int(d.cfg.max_clock_skew * lease_items.US)
        q = int(d.cfg.quarantine * lease_items.US)
    r = resource(ddb, table, mine.resource)
    assert r.key is None and r.quarantine_until == lease_items.fmt_time(theirs.expires_us + skew)
    soon = liberator.run(
        ddb, liberator.Options(table, EAST, now_us() + q + lease_items.US, segments=1)
    )
    assert soon["relisted"] == 0, soon
    other = agent.get_lease(C, P, "k2", now_us() + 3600 * lease_items.US)
    assert other.resource != mine.resource
    with pytest.raises(NoCapacity):
        agent.get_lease(C, P, "k3", now_us() + 3600 * lease_items.US)
    after = liberator.Options(table, EAST, theirs.expires_us + skew, segments=1)
    assert liberator.run(ddb, after)["relisted"] == 1


class Recorder:
    """The daemon's DynamoDB client, recording every call: what it was, when it ran, whether
    DynamoDB answered it (a failed condition is an answer)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name not in ("get_item", "query", "update_item"):
            return method

        async def call(**kw: Any) -> Any:
            t0 = time.perf_counter()
            answered = False
            try:
                out = await method(**kw)
                answered = True
                return out
            except ClientError as exc:
                answered = exc.response["Error"]["Code"] == "ConditionalCheckFailedException"
                raise
            finally:
                c = {"what": _what(name, kw), "t0": t0, "t1": time.perf_counter()}
                self.calls.append(c | {"answered": answered})

        return call


def _what(name: str, kw: dict[str, Any]) -> str:
    if name == "query":
        return str(kw.get("IndexName") or "mappings")
    pk = kw.get("Key", {}).get("client_id", {}).get("S", "")
    kind = "M" if pk.startswith("#map#") else "meta" if pk.startswith("#") else "R"
    values = kw.get("ExpressionAttributeValues", {}).values()
    if name == "update_item" and kind == "M" and {"S": "live"} in values:
        return "map_confirm"
    return f"{name}:{kind}"


async def test_round_trips_of_each_path(ddb: Any, table: str, paper: Any, make_daemon: Any) -> None:
    """Round trips on a request's path (bench.storetrace.round_trips: overlapping calls are
    one), with the leased index read and a new key's mapping write beside the mapping Query:
    an existing lease uncached on a host costs 1, as without them (the write is refused); a
    new lease 3 (the read with the mapping write, the claim once the mapping applied, the
    leased index read again once the claim landed; the confirmation follows the answer:
    "Three round trips beside the paper's agent" in docs/design.md), or 4 when the daemon
    had no candidate at hand (the mapping write then follows the read; the index read for a
    candidate is not counted here); adopting a lease of the
    paper's agent costs 5, once per key and region (the read, the item read strongly
    consistent, the mapping write, the adoption, the confirmation).

    Each of those, plus at most one for each retry and read-back the store's counters show:
    moto on a loaded machine can leave an attempt unanswered past its share of the request's
    deadline; the store retries it, and reads a retried write back."""
    from bench.storetrace import round_trips

    seed_pool(ddb, table, count=20)
    agent = paper()
    agent.get_lease(C, P, "old", now_us() + 3600 * lease_items.US)
    async with make_daemon() as d1, make_daemon() as d2:
        recs = []
        for d in (d1, d2):
            rec = Recorder(d.store.client)
            d.store.wrap_client(lambda _c, rec=rec: rec)
            recs.append(rec)
            await d.coordinator.prefetch.idle()

        async def path(
            d: Any, rec: Recorder, key: str, trips: int | None, after: str = ""
        ) -> list[str]:
            """One get_lease's calls: ``trips`` round trips, plus what retries added; returns
            its steps. ``after``: a call made after the answer (in the background), which
            may still end before the client has read the answer. ``trips`` None: a new
            lease's, 3 when the mapping write went with the first read (a candidate was at
            hand), else 4, and then the daemon had none: it read the index for one."""
            await d.coordinator.prefetch.idle()
            rec.calls.clear()
            before = d.counters.snapshot()
            t0 = time.perf_counter()
            await rasd_aio.get_lease(
                C, P, key, timedelta(hours=1), socket_path=d.cfg.socket, timeout=WAIT
            )
            t1 = time.perf_counter()
            calls = [
                c
                for c in rec.calls
                if t0 <= c["t0"]
                and c["t1"] <= t1
                and c["what"] not in ("available_resources", after)
            ]
            extra = retried(d, before)
            if trips is None:
                first = next(c for c in calls if c["what"] == "mappings")
                spec = any(c["what"] == "update_item:M" and c["t0"] < first["t1"] for c in calls)
                missed = d.counters.snapshot().get("prefetch.misses", 0) - before.get(
                    "prefetch.misses", 0
                )
                assert spec or missed >= 1, (calls, missed)  # no candidate at hand, then
                trips = 3 if spec else 4
            # the store counted every attempt that went unanswered; each retry or read-back
            # costs at most one round trip more (two retried at once may overlap)
            assert sum(not c["answered"] for c in calls) <= extra, (calls, extra)
            assert trips <= round_trips(calls) <= trips + extra, (calls, extra)
            return steps(calls)

        new = await path(d1, recs[0], "fresh", None, after="map_confirm")
        spec = sorted(new[:3]) == sorted(["mappings", "leased_resources", "update_item:M"])
        head = 3 if spec else 2
        assert sorted(new[:head]) == sorted(
            ["mappings", "leased_resources", "update_item:M"][:head]
        )
        then = ["update_item:R", "leased_resources"]
        assert new[head:] == (then if spec else ["update_item:M", *then]), new
        await d1.coordinator.drain(2.0)
        await path(d2, recs[1], "fresh", 1)
        adopted = await path(d1, recs[0], "old", 5)
        assert adopted[-4:] == ["get_item:R", "update_item:M", "update_item:R", "map_confirm"]
        await d1.coordinator.drain(2.0)
        await path(d2, recs[1], "old", 1)


def retried(d: Any, before: dict[str, int]) -> int:
    """Attempts that failed (each retried, or the request would have failed) and read-backs
    of retried writes, by the daemon's store's counters since ``before``."""
    now = d.counters.snapshot()
    kinds = ("timeouts", "errors", "throttles", "conflicts", "ambiguous_writes")
    return sum(now.get(f"ddb.{k}", 0) - before.get(f"ddb.{k}", 0) for k in kinds)


#: the item each write of these paths is for
WRITTEN = {"update_item:M": "M", "update_item:R": "R", "map_confirm": "M"}


def steps(calls: list[dict[str, Any]]) -> list[str]:
    """What the calls did, in order: an attempt DynamoDB did not answer is left out (its
    retry follows), and so is the read-back of a retried write (a GetItem of the item the
    write before it was for)."""
    out: list[str] = []
    for c in calls:
        if not c["answered"]:
            continue
        if out and c["what"] == f"get_item:{WRITTEN.get(out[-1])}":
            continue
        out.append(c["what"])
    return out


async def test_a_release_beside_the_paper_agent_answers_once_the_resource_is_free(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """The paper's agent answers whatever the leased index shows for a key: with
    ``legacy_agents`` a release is answered only once the resource no longer holds the key,
    so the key's next lease (the paper agent's, here) is a new one, never the released lease
    answered on to its end beside rasd's next."""
    seed_pool(ddb, table, count=2)
    agent = paper()
    async with make_daemon() as d:
        s = d.cfg.socket
        mine = await rasd_aio.get_lease(C, P, "k", timedelta(hours=1), socket_path=s, timeout=WAIT)
        await d.coordinator.drain(2.0)
        await rasd_aio.release(C, P, "k", socket_path=s, timeout=5)
        released = resource(ddb, table, mine.resource)  # read as the answer arrives
        assert released.key is None and released.holder is None, released
        after = agent.get_lease(C, P, "k", now_us() + 3600 * lease_items.US)
        assert after.new and after.resource != mine.resource


async def test_a_claim_made_while_the_paper_agent_leased_the_key_yields_to_it(
    ddb: Any, table: str, paper: Any, make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both agents acquire one key at once: rasd's read (mapping and leased index) finds
    nothing, then the paper's agent leases the key, then rasd's claim lands. Before its
    answer rasd reads the leased index again (after its claim landed), finds the paper's
    lease and adopts it; its own claim, answered to no one, is given back. (Before: rasd
    answered its claim, and the key ran on two resources of one region, one per agent.)"""
    seed_pool(ddb, table, count=6)
    agent = paper()
    theirs: list[str] = []
    async with make_daemon() as d:
        acquire = take.acquire

        def paper_first(*args: Any) -> Any:
            # between rasd's read and its claim: the paper's lookup sees no lease either
            theirs.append(agent.get_lease(C, P, "k", now_us() + 3600 * lease_items.US).resource)
            return (yield from acquire(*args))

        write = d.store.write
        at_adoption: list[dict[str, list[str]]] = []

        async def adopt_seen(w: Any, *args: Any, **kw: Any) -> Any:
            if w.kind == "adopt":
                at_adoption.append(held_by(ddb, table))
            return await write(w, *args, **kw)

        monkeypatch.setattr(take, "acquire", paper_first)
        monkeypatch.setattr(d.store, "write", adopt_seen)
        got = await rasd_aio.get_lease(
            C, P, "k", timedelta(hours=1), socket_path=d.cfg.socket, timeout=WAIT
        )
        assert theirs and got.resource == theirs[0] and not got.new
        assert d.counters["lease.yielded"] == 1 and d.counters["lease.adopted"] == 1
        # our claim had left the leased index before the adoption's write: the paper's
        # lookups never find it beside the adopted lease with its refreshed lease_acquired
        assert at_adoption == [{"k": theirs}]
        await d.coordinator.drain(2.0)  # the give-back of our claim
    assert held_by(ddb, table) == {"k": theirs}
    again = agent.get_lease(C, P, "k", now_us() + 3600 * lease_items.US)
    assert again.resource == theirs[0] and not again.new


async def test_a_lease_past_its_end_is_not_extended_beside_a_paper_lease(
    ddb: Any, table: str, paper: Any, make_daemon: Any
) -> None:
    """rasd's lease ends; within the liberator's grace the paper's agent, which takes the end
    as final, leases the key another resource. rasd, asked again, must not extend its ended
    lease beside that one: the item shows it over. (Before: rasd extended it, and both
    leases ran on in one region.) Nor may it acquire anew before the end has passed on every
    host's clock (``max_clock_skew`` after it on its own): until then a host whose clock is
    behind may still serve the old lease, and the request waits. Then the key acquires anew,
    adopting the paper's lease; the ended one is the liberator's."""
    seed_pool(ddb, table, count=6)
    clock = FakeClock(now_us=now_us())
    agent = paper()
    async with make_daemon(clock=clock) as d:
        s = d.cfg.socket
        skew = d.cfg.max_clock_skew
        mine = await rasd_aio.get_lease(
            C,
            P,
            "k",
            (clock.now_us() + 3 * lease_items.US) / lease_items.US,
            socket_path=s,
            timeout=WAIT,
        )
        await d.coordinator.drain(2.0)
        clock.advance(4)  # 1 s past its end, within the grace and the skew bound
        theirs = agent.get_lease(
            C, P, "k", clock.now_us() + 3600 * lease_items.US, now_us=clock.now_us()
        )
        assert theirs.new and theirs.resource != mine.resource
        # the daemon's clock stands still: the request waits out its deadline, ending nothing
        with pytest.raises(rasd_client.errors.Timeout):
            await rasd_aio.get_lease(
                C,
                P,
                "k",
                (clock.now_us() + 600 * lease_items.US) / lease_items.US,
                socket_path=s,
                timeout=0.5,
            )
        assert d.counters["lease.ended_lapsed"] == 0
        assert resource(ddb, table, mine.resource).key == "k"
        clock.advance(skew)  # past its end by the skew bound: over on every host's clock
        got = await rasd_aio.get_lease(
            C,
            P,
            "k",
            (clock.now_us() + 600 * lease_items.US) / lease_items.US,
            socket_path=s,
            timeout=WAIT,
        )
        assert got.resource == theirs.resource, (mine.resource, theirs.resource, got.resource)
        assert d.counters["lease.adopted"] == 1 and d.counters["lease.new"] == 1
        await d.coordinator.drain(2.0)
    ended = resource(ddb, table, mine.resource)
    assert ended.lease_expires_us is not None and ended.lease_expires_us < clock.now_us()
    assert sorted(held_by(ddb, table)["k"]) == sorted([mine.resource, theirs.resource])


async def test_a_claim_settles_on_a_lost_claim_of_rasd_the_paper_agent_may_answer(
    ddb: Any, table: str, paper: Any, make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons acquired one key; one's claim landed but its mapping write was lost and
    its daemon died before giving it back (here: made by hand, token and all, with no
    mapping, a few seconds old), and the other wins the mapping.
    The lost claim stays in the leased index until it is given back, and the paper's agent
    answers it from there. The winner yields to it (adopts it) instead of serving a second
    resource beside it. (Before: it served its own claim; the 600 s mixed run split a key so,
    the paper's lookup answering the other daemon's lost claim.)"""
    names = seed_pool(ddb, table, count=4)
    lost: list[str] = []
    async with make_daemon() as d:
        acquire = take.acquire

        def lost_claim_first(*args: Any) -> Any:
            it = resource(ddb, table, names[0])
            # a claim that lost its mapping and was not given back (its daemon died): older
            # than legacy.ORPHAN_RIVAL_AGE_US, the age of a losing claim being given back
            w = builders.claim(
                it, "k", now_us() + 3600 * lease_items.US, now_us(), "feedfacefeedface", 9
            )
            ddb.update_item(TableName=table, **render(w))
            ddb.update_item(
                TableName=table,
                Key={"client_id": {"S": C}, "resource": {"S": it.resource}},
                UpdateExpression="SET lease_acquired = :t",
                ExpressionAttributeValues={
                    ":t": {"S": lease_items.fmt_time(now_us() - 5 * lease_items.US)}
                },
            )
            lost.append(it.resource)
            return (yield from acquire(*args))

        monkeypatch.setattr(take, "acquire", lost_claim_first)
        got = await rasd_aio.get_lease(
            C, P, "k", timedelta(hours=1), socket_path=d.cfg.socket, timeout=WAIT
        )
        assert got.resource == lost[0] and not got.new
        assert d.counters["lease.yielded"] == 1 and d.counters["lease.adopted"] == 1
        await d.coordinator.drain(2.0)
    assert held_by(ddb, table) == {"k": lost}
    theirs = paper().get_lease(C, P, "k", now_us() + 3600 * lease_items.US)
    assert theirs.resource == lost[0] and not theirs.new
