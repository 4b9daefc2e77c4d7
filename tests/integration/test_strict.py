"""Strict pools end to end: daemons of two regions on moto's server over HTTP (one table
stands for both replicas), the home region reached through ``peer_endpoints``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import rasd_client
from rasd.core import agree as agree_rules
from rasd.core.lease import parse_time
from rasd.core.serialize import pool_meta_key
from rasd.core.writes import item_from_av
from rasd_client import aio as rasd_aio
from tests.helpers.deadlines import WAIT, until
from tests.helpers.races import dead_endpoint
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def one_moto_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both regions' daemons sign for moto's us-east-1, where the one table is."""
    monkeypatch.setenv("AWS_REGION", HOME)


C, P = "demo", "strict"
HOME, OTHER = "us-east-1", "eu-west-1"


def strict_pool(ddb: Any, table: str, count: int = 30) -> None:
    seed_pool(ddb, table, C, P, region=HOME, count=count, prefix="us-")
    seed_pool(ddb, table, C, P, region=OTHER, count=count, prefix="eu-")
    ddb.put_item(
        TableName=table,
        Item={**pool_meta_key(C, P), "kind": {"S": "pool"}, "max_lease": {"N": "36000"},
              "home": {"S": HOME}},
    )  # fmt: skip


def agreement(ddb: Any, table: str, key: str) -> dict[str, Any] | None:
    k = agree_rules.agree_key(C, P, key)
    got = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": k[0]}, "resource": {"S": k[1]}},
        ConsistentRead=True,
    ).get("Item")
    return item_from_av(got) if got else None


def held(ddb: Any, table: str) -> dict[str, str]:
    """resource -> key of every held resource item of the pool."""
    pages = ddb.get_paginator("query").paginate(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="client_id = :c",
        ExpressionAttributeValues={":c": {"S": C}},
    )
    return {
        it["resource"]["S"]: it["key"]["S"] for pg in pages for it in pg["Items"] if "key" in it
    }


def strict_counts(*daemons: Any) -> str:
    """What the daemons counted of their strict pools' work, their give-backs, extensions and
    DynamoDB trouble: what a wait that ran out shows."""
    keep = ("strict.", "acq.free_claim", "lease.ext", "ddb.timeouts", "ddb.unknown", "background")
    return "; ".join(
        str({k: v for k, v in sorted(d.counters.snapshot().items()) if k.startswith(keep)})
        for d in daemons
    )


async def test_both_regions_answer_each_key_the_same_resource(
    ddb: Any, table: str, make_daemon: Any, moto_endpoint: str
) -> None:
    """Both regions ask for the same 20 new keys at once: each key is answered one
    resource in both, the one its agreement names; every claim that lost is given back."""
    strict_pool(ddb, table)
    keys = [f"k{i}" for i in range(20)]
    peers = {HOME: moto_endpoint}
    async with (
        make_daemon(region=HOME, default_deadline=WAIT) as a,
        make_daemon(region=OTHER, peer_endpoints=peers, default_deadline=WAIT) as b,
    ):

        async def get(d: Any, k: str) -> rasd_client.Lease:
            lease: rasd_client.Lease = await rasd_aio.get_lease(
                C, P, k, timedelta(hours=1), timeout=WAIT, socket_path=d.cfg.socket
            )
            return lease

        # (moto serves the 40 cold requests in about 1.5 s: the deadlines leave room)
        got = await asyncio.gather(*(get(a, k) for k in keys), *(get(b, k) for k in keys))
        # The daemons run in this loop, their withdrawals in the background: the table is
        # read in a thread, never with a blocking call here that would stall them.
        for i, k in enumerate(keys):
            ours, theirs = got[i], got[i + len(keys)]
            assert ours.resource == theirs.resource, k
            ag = await asyncio.to_thread(agreement, ddb, table, k)
            assert ag is not None and ag["res"] == ours.resource and ag["areg"] == ours.region
        agreed = a.counters["strict.agreed"] + b.counters["strict.agreed"]
        assert agreed >= len(keys)

        def count(name: str) -> int:
            return int(a.counters[name] + b.counters[name])

        holding: dict[str, str] = {}

        async def given_back() -> bool:
            # a withdrawal that could not drop its mapping leaves its claim to the lease's end
            # (1 h): the assertions below say which, without waiting for the bound
            nonlocal holding
            holding = await asyncio.to_thread(held, ddb, table)
            return sorted(holding.values()) == sorted(keys) or count("strict.withdraw_left") > 0

        # every claim that lost its agreement is withdrawn (in the background): its mapping
        # dropped, then its resource freed; the table shows the end of both (read every 50 ms:
        # each read is a Query that moto serialises with the withdrawals' writes)
        await until(
            given_back,
            lambda: f"held {len(holding)} resources for {len(keys)} keys; {strict_counts(a, b)}",
            every=0.05,
        )
        assert count("strict.withdraw_left") == 0, strict_counts(a, b)
        assert count("strict.withdrawn") == count("strict.deferred"), strict_counts(a, b)
        assert sorted(holding.values()) == sorted(keys)  # one held resource per key
        assert set(holding) == {lease.resource for lease in got}


async def test_an_extension_moves_the_agreement_first(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """A request for more than the lease has extends it in the background: the agreement's
    end first (so another region never takes the key over while the lease runs)."""
    strict_pool(ddb, table, count=3)
    async with make_daemon(region=HOME) as a:
        s = a.cfg.socket
        first = await rasd_aio.get_lease(C, P, "k", timedelta(hours=1), timeout=WAIT, socket_path=s)
        await rasd_aio.get_lease(C, P, "k", timedelta(hours=4), timeout=WAIT, socket_path=s)
        # the extension's end (or its failure, which nothing retries here) is counted
        ends = (
            "lease.extended",
            "lease.extend_errors",
            "lease.extend_conflicts",
            "strict.extend_refused",
        )
        await until(lambda: any(a.counters[n] for n in ends), lambda: strict_counts(a))
        assert a.counters["lease.extended"] == 1, strict_counts(a)
        ag = await asyncio.to_thread(agreement, ddb, table, "k")
        assert ag and parse_time(str(ag["exp"])) > first.lease_expires.timestamp() * 1e6, ag


async def test_home_region_down_fails_new_keys_or_falls_back(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """The home region unreachable: "fail" answers UNAVAILABLE and answers nothing
    unagreed; "local" answers the region's own lease, counted."""
    strict_pool(ddb, table, count=3)
    peers = {HOME: dead_endpoint()}
    # the home region's failure (a refused connection, retried: 3 attempts, botocore's
    # backoff of up to 1 s and then 2 s) must decide the answer, not the deadline: WAIT, as
    # the round trips before and after it take seconds of their own on a loaded machine
    async with make_daemon(region=OTHER, peer_endpoints=peers, default_deadline=WAIT) as b:
        with pytest.raises(rasd_client.Unavailable, match="home region us-east-1"):
            await rasd_aio.get_lease(
                C, P, "k1", timedelta(hours=1), timeout=WAIT, socket_path=b.cfg.socket
            )
        assert b.counters["strict.home_unreachable"] >= 1
        assert b.counters["strict.fallback"] == 0
    async with make_daemon(
        region=OTHER, peer_endpoints=peers, default_deadline=WAIT, strict_home_down="local"
    ) as c:
        lease = await rasd_aio.get_lease(
            C, P, "k2", timedelta(hours=1), timeout=WAIT, socket_path=c.cfg.socket
        )
        assert lease.region == OTHER and lease.new
        assert c.counters["strict.fallback"] == 1
    assert agreement(ddb, table, "k2") is None
