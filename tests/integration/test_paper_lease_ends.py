"""Beside the paper's agent, a lease of rasd ends where the paper's agent sees it end, against
moto's server with the daemon on a clock the test moves (docs/design.md, "Beside the paper's
agent"): a lapsed lease whose item the paper's agent leased again to the key is adopted, not
extended under the stale holder; an adopted lease is not extended within the clock-skew
bound of its end, where the extension could land after it, beside the paper's other lease.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import rasd_client.errors
from bench.baseline import BaselineAgent, paper_liberate
from chaos.audit import table_checks
from rasd.config import Config
from rasd.core import builders, serialize
from rasd.core import lease as lease_items
from rasd.core import legacy as legacy_rules
from rasd.core.decide import lease_from_item
from rasd.core.writes import render
from rasd_client import aio as rasd_aio
from tests.doubles.clock import FakeClock
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import rollout_on, scan_all, seed_pool

pytestmark = pytest.mark.integration

C, P, EAST = "demo", "default", "us-east-1"
RULES = Config().rules()


@pytest.fixture(autouse=True)
def _rollout_mode(ddb: Any, table: str) -> None:
    rollout_on(ddb, table)


def item(ddb: Any, table: str, name: str) -> lease_items.ResourceItem:
    raw = ddb.get_item(
        TableName=table, Key={"client_id": {"S": C}, "resource": {"S": name}}, ConsistentRead=True
    )["Item"]
    return serialize.item_from_ddb(raw)


def mapping(ddb: Any, table: str, key: str) -> lease_items.Mapping:
    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": lease_items.map_pk(C, P, key)}, "resource": {"S": EAST}},
        ConsistentRead=True,
    )["Item"]
    return serialize.mapping_from_ddb(raw)


async def test_a_lapsed_lease_the_paper_leased_again_to_its_key_is_adopted(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any
) -> None:
    """rasd's lease of k ends; the paper's liberator frees it and the paper's agent leases the
    same resource to k again, leaving rasd's holder on the item, stale. Asked for k within the
    grace of its end, the daemon must not extend that lease under its old token (the table
    then holds a live mapping whose item's holder is not current, test_chaos_mixed's final
    table): it ends its mapping and adopts the paper's lease."""
    (name,) = seed_pool(ddb, table, count=1)
    clock = FakeClock(now_us=time.time_ns() // 1000)
    agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
    try:
        async with make_daemon(clock=clock) as d:
            s = d.cfg.socket
            end = clock.now_us() + 10 * lease_items.US
            mine = await rasd_aio.get_lease(
                C, P, "k", end / lease_items.US, socket_path=s, timeout=WAIT
            )
            await d.coordinator.drain(2.0)
            assert mine.resource == name
            token = item(ddb, table, name).holder
            clock.advance(11)  # a second past its end, within the grace
            assert paper_liberate(ddb, table, end + 3 * lease_items.US)["freed"] == 1
            theirs = agent.get_lease(
                C, P, "k", end + 60 * lease_items.US, now_us=end + 3 * lease_items.US
            )
            assert theirs.new and theirs.resource == name
            stale = item(ddb, table, name)
            assert stale.holder == token and not stale.holder_current
            want = (clock.now_us() + 600 * lease_items.US) / lease_items.US
            got = await rasd_aio.get_lease(C, P, "k", want, socket_path=s, timeout=WAIT)
            await d.coordinator.drain(2.0)
            assert got.resource == name and got.version > mine.version
            assert d.counters["lease.adopted"] == 1 and d.counters["lease.ended_lapsed"] == 1
    finally:
        agent.ddb.close()
    r, m = item(ddb, table, name), mapping(ddb, table, "k")
    assert r.holder_current and r.holder != token
    assert (m.state, m.token, m.resource) == (lease_items.LIVE, r.holder, name)
    checks = table_checks(scan_all(ddb, table), C, clock.now_us() / lease_items.US)
    assert checks["live_mappings_not_held"] == 0, checks


async def test_an_adopted_lease_is_not_extended_within_the_skew_bound_of_its_end(
    ddb: Any, table: str, make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHANGELOG's reproduction: two paper agents split k (ra until the end here, rb for an
    hour); a daemon adopted ra. Asked for a longer lease 130 ms before ra's end, it sent an
    extension that took 142 ms to apply (here: the clock moves while it is in flight), so ra
    ran again after its end beside rb, a second lease rasd made. Now nothing is extended
    within the clock-skew bound of the end: the request waits (the clock stands still: it
    times out), and once ra's end has passed on every clock the key adopts rb."""
    ra, rb, *_ = seed_pool(ddb, table, count=4)
    clock = FakeClock(now_us=time.time_ns() // 1000)
    end = clock.now_us() + 60 * lease_items.US
    for name, until in ((ra, end), (rb, end + 3600 * lease_items.US)):
        ddb.update_item(
            TableName=table, **render(builders.paper_claim(item(ddb, table, name), "k", until))
        )
    async with make_daemon(clock=clock) as d:
        s = d.cfg.socket
        first = await rasd_aio.get_lease(
            C, P, "k", end / lease_items.US, socket_path=s, timeout=WAIT
        )
        assert first.resource == ra and not first.new
        assert d.counters["lease.adopted"] == 1
        await d.coordinator.drain(2.0)
        write = d.store.write

        async def slow_extension(w: Any, *args: Any, **kw: Any) -> Any:
            if w.kind == "extend_resource":
                clock.advance(0.142)  # applies 12 ms after the end
            return await write(w, *args, **kw)

        monkeypatch.setattr(d.store, "write", slow_extension)
        clock.advance(60 - 0.130)
        want = (clock.now_us() + 600 * lease_items.US) / lease_items.US
        with pytest.raises(rasd_client.errors.Timeout):
            await rasd_aio.get_lease(C, P, "k", want, socket_path=s, timeout=0.5)
        assert item(ddb, table, ra).lease_expires_us == end
        clock.advance(0.130 + d.cfg.max_clock_skew)
        got = await rasd_aio.get_lease(C, P, "k", want, socket_path=s, timeout=WAIT)
        assert got.resource == rb and d.counters["lease.adopted"] == 2
        await d.coordinator.drain(2.0)
    assert item(ddb, table, ra).lease_expires_us == end


async def test_moto_refuses_the_extension_beside_the_paper_agent_as_the_model_does(
    ddb: Any, table: str
) -> None:
    """The extension's two conditions beside the paper's agent, rendered for DynamoDB: a
    holder the paper's writes left stale (``hver`` behind ``version``), and an end within the
    floor as it is sent, are refused by moto's server as by ``writes.apply``; a current
    holder with the end past the floor is extended."""
    name, other = seed_pool(ddb, table, count=2)
    now = time.time_ns() // 1000
    for n in (name, other):
        claim = builders.claim(
            item(ddb, table, n), "k", now + 60 * lease_items.US, now, f"t-{n}", 1
        )
        ddb.update_item(TableName=table, **render(claim))
    ours = lease_from_item(item(ddb, table, name))
    ok = builders.extend_resource(
        ours, now + 600 * lease_items.US, legacy_rules.extend_floor(now, RULES)
    )
    late = builders.extend_resource(ours, now + 600 * lease_items.US, now + 60 * lease_items.US)
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        ddb.update_item(TableName=table, **render(late))
    ddb.update_item(TableName=table, **render(ok))
    assert item(ddb, table, name).lease_expires_us == now + 600 * lease_items.US
    assert item(ddb, table, name).holder_current
    # the paper's liberator and agent leave the other's holder stale, same key
    theirs = lease_from_item(item(ddb, table, other))
    ddb.update_item(TableName=table, **render(builders.paper_free(item(ddb, table, other), now)))
    ddb.update_item(
        TableName=table,
        **render(builders.paper_claim(item(ddb, table, other), "k", now + 60 * lease_items.US)),
    )
    assert not item(ddb, table, other).holder_current
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        w = builders.extend_resource(
            theirs, now + 600 * lease_items.US, legacy_rules.extend_floor(now, RULES)
        )
        ddb.update_item(TableName=table, **render(w))
