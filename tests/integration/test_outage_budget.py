"""A pool's outage budget, against moto over HTTP behind a fault proxy (``fleet.proxy``)
whose outage window makes every call of the daemon fail, as a DynamoDB outage or a host cut
off from it would.

S is 1 s here (``confirm_interval``), the skew bound and the lag 0.5 s each, so a budget of
10 s asks a quarantine of at least 11 s. Each phase's bound is checked seconds away from where
it changes, so a loaded machine moves no answer across it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import structlog

import rasd_client
from fleet.proxy import FaultPlan, Proxy
from rasd.core import schema
from rasd.core.lease import US, parse_time
from rasd_client import aio
from tests.helpers.admin_cli import run
from tests.helpers.deadlines import WAIT, until

pytestmark = [pytest.mark.integration]

BOUNDS = {"confirm_interval": 1.0, "max_clock_skew": 0.5, "replication_lag": 0.5}
BUDGET = 10.0
QUARANTINE = BUDGET + 1.0  # the least add-pool takes: budget + skew + lag


def _pool(ddb: Any, table: str, pool: str, names: list[str], budget: float = BUDGET) -> None:
    q = QUARANTINE if budget else 0.0
    schema.put_pool(ddb, table, "demo", pool, 3600, outage_budget_s=budget, quarantine_s=q)
    schema.add_resources(ddb, table, "demo", pool, "us-east-1", names)


def _asker(sock: str) -> Callable[..., Any]:
    async def ask(key: str, pool: str = "budget", timeout: float = WAIT) -> rasd_client.Lease:
        return await aio.get_lease(
            "demo", pool, key, timedelta(minutes=10), timeout=timeout, socket_path=sock
        )

    return ask


@pytest.fixture
def proxy(moto_endpoint: str) -> Any:
    host, port = moto_endpoint.split("://", 1)[1].rsplit(":", 1)
    plan = FaultPlan(rate=0.0, enabled=True)
    p = Proxy((host, int(port)), http=True, plan=plan, seed="outage").start()
    yield p
    p.stop()


async def test_an_outage_within_the_budget_answers_confirmed_leases_and_fails_new_keys(
    make_daemon: Any, ddb: Any, table: str, proxy: Proxy
) -> None:
    _pool(ddb, table, "budget", [f"b{i}" for i in range(8)])
    _pool(ddb, table, "plain", ["p0", "p1"], budget=0.0)
    async with make_daemon(endpoint_url=proxy.url, **BOUNDS) as d:
        ask = _asker(d.cfg.socket)
        try:
            keys = [f"k{i}" for i in range(4)]
            held = {k: (await ask(k)).resource for k in keys}
            plain = (await ask("p", "plain")).resource
            start = time.time()
            proxy.plan.outage = (start, start + 19.0)
            answered = failed = 0
            # asked until 4.5 s in, each answered within 2 s: inside every window (>= 9 s)
            while time.time() < start + 4.5:
                for k in keys:
                    if time.time() < start + 4.5:
                        assert (await ask(k, timeout=2.0)).resource == held[k]
                        answered += 1
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            with pytest.raises(rasd_client.Unavailable):
                await ask("new-key")
            new_key_s = time.monotonic() - t0
            with pytest.raises(rasd_client.Unavailable):
                await ask("p", "plain")  # past S: a pool without a budget fails
            await asyncio.sleep(max(0.0, start + 11.5 - time.time()))
            for k in keys:  # every window is over (its confirmation was before the outage)
                with pytest.raises((rasd_client.Unavailable, rasd_client.Timeout)):
                    await ask(k, timeout=1.0)
                failed += 1
            assert time.time() < start + 18.0  # all of it inside the outage
            assert d.counters["outage.at_once"] + d.counters["outage.after_failure"] > 0

            async def back() -> bool:
                try:
                    return (await ask("k0", timeout=1.0)).resource == held["k0"]
                except rasd_client.RasdError:
                    return False

            await until(back, "service back after the outage")
            recovered_s = time.time() - (start + 19.0)
            assert (await ask("new-key")).resource not in held.values()
            assert (await ask("p", "plain")).resource == plain
        finally:
            await aio.close()
    assert answered >= 4 and failed == 4
    assert new_key_s < WAIT
    print(f"answered {answered}; new key failed in {new_key_s:.3f}s; back {recovered_s:.1f}s")


async def test_a_host_cut_off_serves_a_released_lease_only_until_its_resource_can_be_taken(
    make_daemon: Any, ddb: Any, table: str, proxy: Proxy
) -> None:
    """d1 is cut off (its proxy fails every call) while d0 goes on: d0's release keeps the
    one resource out for the pool's quarantine, and d1's last answer of it for the released
    key comes before d0 can hand it to another key."""
    _pool(ddb, table, "budget", ["only"])
    async with (
        make_daemon(**BOUNDS) as d0,
        make_daemon(endpoint_url=proxy.url, **BOUNDS) as d1,
    ):
        ask0, ask1 = _asker(d0.cfg.socket), _asker(d1.cfg.socket)
        try:
            assert (await ask0("k1")).resource == "only"
            assert (await ask1("k1")).resource == "only"  # d1 reads it: cached, confirmed
            cut = time.time()
            proxy.plan.outage = (cut, cut + 3600.0)
            await aio.release("demo", "budget", "k1", timeout=WAIT, socket_path=d0.cfg.socket)
            released = time.time()

            def item() -> dict[str, Any]:
                return ddb.get_item(  # type: ignore[no-any-return]
                    TableName=table,
                    Key={"client_id": {"S": "demo"}, "resource": {"S": "only"}},
                    ConsistentRead=True,
                )["Item"]

            await until(lambda: "quarantine_until" in item(), "the free, in the background")
            out_until = parse_time(item()["quarantine_until"]["S"]) / US
            assert out_until >= released + QUARANTINE - 1.0  # the pool's, not Q (2 s)
            with pytest.raises(rasd_client.NoCapacity):
                await ask0("k2")
            last_served = 0.0
            taken = None
            while taken is None:  # d1's answers and d0's tries, one after the other
                try:
                    assert (await ask1("k1", timeout=1.0)).resource == "only"
                    last_served = time.time()
                except (rasd_client.Unavailable, rasd_client.Timeout):
                    pass  # its window is over
                try:
                    taken = (await ask0("k2", timeout=1.0)).resource
                except (rasd_client.NoCapacity, rasd_client.Timeout):
                    pass  # in quarantine (or a slow moto)
                assert time.time() < released + QUARANTINE + 30.0, "never taken again"
                await asyncio.sleep(0.05)
            with pytest.raises((rasd_client.Unavailable, rasd_client.Timeout)):
                await ask1("k1", timeout=1.0)  # k2 holds it now: d1 no longer answers it
        finally:
            await aio.close()
    assert taken == "only"
    assert last_served > released + 3.0  # d1 answered from its window, past S


@pytest.fixture
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()  # rasadmin configures its own logging
    yield
    structlog.configure(**saved)


@pytest.mark.usefixtures("_restore_logging")
def test_rasadmin_sets_a_budget_once_with_its_quarantine_and_shows_both(
    table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """add-pool takes a budget only with a quarantine long enough (usage errors: the table
    of tests.helpers.admin_cli); a redefinition keeps it and refuses to change it; list-pools
    and show-pool show both."""
    where = ["--table", table, "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    pool = ["--client", "demo", "--pool", "ads"]
    budget = ["--outage-budget", "600", "--quarantine", "627"]
    code, out, err = run(["add-pool", *pool, *budget, *where], capsys)
    assert code == 0, err
    assert json.loads(out)["outage_budget"] == 600 and json.loads(out)["quarantine"] == 627
    code, out, err = run(["add-pool", *pool, "--max-lease", "7200", *where], capsys)
    assert code == 0 and json.loads(out)["outage_budget"] == 600, err  # kept
    for other in (["--outage-budget", "900", "--quarantine", "927"], ["--quarantine", "700"]):
        code, _, err = run(["add-pool", *pool, *other, *where], capsys)
        assert code in (1, 2) and ("refusing" in err or "goes with" in err), err
    code, out, _ = run(["list-pools", "--json", *where], capsys)
    (row,) = json.loads(out)
    assert (row["max_lease"], row["outage_budget"], row["quarantine"]) == (7200, 600, 627)
    code, out, _ = run(["show-pool", *pool, *where], capsys)
    assert "outage budget 600s (released resources quarantined 627s)" in out
