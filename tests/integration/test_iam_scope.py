"""The daemon's IAM policy (docs/operations.md) against what a daemon really sends: every
request of a daemon that leases, releases, reaches a strict pool's home in another region,
answers NO_CAPACITY and reports it, finds a lease of the paper's agent and then runs rollout
mode, is allowed by the policy; a write to ``#meta`` or to another client's items is not."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

import rasd_client
from rasd.core import rollout
from rasd.core.lease import US, fmt_time
from rasd.core.serialize import pool_meta_key
from rasd.daemon.driver import Run
from rasd.dynamo.store import Store
from rasd.steps import GetItem
from rasd_client import aio as rasd_aio
from tests.helpers.deadlines import WAIT
from tests.helpers.iam import Call, allows, call_of, filled, policies
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

C = "demo"
HOME, OWN = "us-east-1", "eu-west-1"


class Recorder:
    """A DynamoDB client that notes each GetItem, Query and UpdateItem before sending it."""

    def __init__(self, inner: Any, region: str, calls: list[Call]) -> None:
        self._inner, self._region, self._calls = inner, region, calls

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)
        op = {"get_item": "GetItem", "query": "Query", "update_item": "UpdateItem"}.get(name)
        if op is None:
            return fn

        async def call(**kw: Any) -> Any:
            self._calls.append(call_of(self._region, op, kw))
            return await fn(**kw)

        return call


@pytest.fixture(autouse=True)
def one_moto_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both regions sign for moto's us-east-1, where the one table is."""
    monkeypatch.setenv("AWS_REGION", HOME)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every request of every store started from here on (a strict pool's home included),
    with the region it stands for."""
    seen: list[Call] = []
    start = Store.start

    async def recorded(self: Store) -> None:
        await start(self)
        region = self.peer_region or self.config.region
        self.wrap_client(lambda c: Recorder(c, region, seen))

    monkeypatch.setattr(Store, "start", recorded)
    return seen


def _policy() -> dict[str, Any]:
    return filled(policies()["Daemon (`rasd serve`)"], REGION=OWN, HOME_REGION=HOME, CLIENT=C)


def test_the_policy_refuses_meta_writes_and_other_clients() -> None:
    p = _policy()
    assert allows(p, Call(OWN, "GetItem", "", "#meta"))
    assert not allows(p, Call(OWN, "UpdateItem", "", "#meta"))  # pools, the rollout record
    assert allows(p, Call(OWN, "UpdateItem", "", C))
    assert not allows(p, Call(OWN, "UpdateItem", "", "other"))
    assert not allows(p, Call(OWN, "UpdateItem", "", "demo2"))
    assert not allows(p, Call(OWN, "UpdateItem", "", "#map#other#p#k"))
    assert not allows(p, Call(OWN, "GetItem", "", "#map#demox#p#k"))
    assert not allows(p, Call(OWN, "Query", "available_resources", "other.p.eu-west-1.3"))
    assert not allows(p, Call("ap-south-1", "GetItem", "", C))  # another region's replica
    assert not allows(p, Call(OWN, "UpdateItem", "", "#agree#demo#p#k"))  # only at the home
    assert allows(p, Call(HOME, "UpdateItem", "", "#agree#demo#p#k"))
    assert not allows(p, Call(OWN, "Scan", "", C))


async def test_every_request_of_a_daemon_is_allowed_by_its_policy(
    ddb: Any, table: str, make_daemon: Any, moto_endpoint: str, calls: list[Call]
) -> None:
    seed_pool(ddb, table, C, "default", region=OWN, count=20)
    seed_pool(ddb, table, C, "strict", region=HOME, count=10, prefix="us-")
    seed_pool(ddb, table, C, "strict", region=OWN, count=10, prefix="eu-")
    ddb.put_item(
        TableName=table,
        Item={**pool_meta_key(C, "strict"), "kind": {"S": "pool"}, "max_lease": {"N": "36000"},
              "home": {"S": HOME}},
    )  # fmt: skip
    seed_pool(ddb, table, C, "empty", region=HOME, count=2)  # none in our region
    # a lease of the paper's agent: key and end, no holder
    paper = seed_pool(ddb, table, C, "old", region=OWN, count=1, prefix="paper-")[0]
    end = fmt_time(int((time.time() + 3600) * US))
    ddb.update_item(
        TableName=table,
        Key={"client_id": {"S": C}, "resource": {"S": paper}},
        UpdateExpression="SET #k = :k, lease_expires = :e REMOVE lease_available",
        ExpressionAttributeNames={"#k": "key"},
        ExpressionAttributeValues={":k": {"S": "old-key"}, ":e": {"S": end}},
    )

    async with make_daemon(
        region=OWN, peer_endpoints={HOME: moto_endpoint}, default_deadline=WAIT
    ) as d:

        async def get(pool: str, key: str) -> rasd_client.Lease:
            lease: rasd_client.Lease = await rasd_aio.get_lease(
                C, pool, key, timedelta(minutes=30), timeout=WAIT, socket_path=d.cfg.socket
            )
            return lease

        a = await get("default", "k1")
        assert (await get("default", "k1")).resource == a.resource  # the hit
        await rasd_aio.release(C, "default", "k1", timeout=WAIT, socket_path=d.cfg.socket)
        await get("strict", "s1")  # its agreement is written at the home
        with pytest.raises(rasd_client.NoCapacity):
            await get("empty", "e1")
        coord = d.coordinator
        await coord.reporter.flush_misses(time.monotonic() + WAIT)
        # the daemon reads the paper's lease: rollout mode on, the signal raised
        await Run(coord.driver, time.monotonic() + WAIT).perform(GetItem((C, paper)))
        await coord.driver.tasks.drain(WAIT)
        assert coord.driver.rollout.on and coord.driver.counters["rollout.raised"] == 1
        await get("default", "k2")  # rollout mode: the miss reads the leased index
        await coord.pool_table.load(time.monotonic() + WAIT)

    sig = ddb.get_item(TableName=table, Key={"client_id": {"S": "#hosts"},
                       "resource": {"S": rollout.SIGNAL_KEY[1]}}, ConsistentRead=True)  # fmt: skip
    assert "Item" in sig
    p = _policy()
    refused = sorted({c for c in calls if not allows(p, c)}, key=repr)
    assert refused == [], refused
    # what the run covered: each statement's kind of request was made
    kinds = {(c.region, c.op, c.index, c.leading_key.split("#")[1] if "#" in c.leading_key
              else c.leading_key.split(".")[0]) for c in calls}  # fmt: skip
    for want in [
        (OWN, "GetItem", "", "meta"),  # pools, the rollout record, warm-up
        (OWN, "Query", "", "meta"),  # the pool list
        (OWN, "UpdateItem", "", C),  # claims, releases
        (OWN, "UpdateItem", "", "map"),  # mapping items
        (OWN, "Query", "", "map"),
        (OWN, "UpdateItem", "", "hosts"),  # the miss counter and the signal
        (OWN, "GetItem", "", "hosts"),
        (HOME, "UpdateItem", "", "agree"),
        (OWN, "Query", "available_resources", C),
        (OWN, "Query", "leased_resources", "k2"),
    ]:
        assert want in kinds, (want, sorted(kinds))
    assert not any(c.op == "UpdateItem" and c.leading_key == "#meta" for c in calls)
