"""``rasadmin adopt`` reaches what the fast rules leave behind before the paper's agent starts.

Found from outside (the evidence script ``adopt_after_fast_orphan_paper_split``), replayed
with real daemons' roles on FakeClocks, the real ``rasadmin adopt`` and ``ras-liberator``,
and the paper's agent (``bench.baseline.BaselineAgent(paper=True)``), against moto's server.

* A losing claim of the fast rules whose give-back never went out (its daemon killed) stays
  in the leased index, held for the key, while the key's mapping names another resource.
  The paper's agent answers whatever that index shows for the key: started at
  ``paper_agents_may_start_at`` (t0+116 s, before the liberator's orphan age), it answered
  the orphan while rasd answered the key's lease, a split (I2). ``adopt`` now frees it by
  the liberator's orphan repair, held to its end (I1).
* A pending mapping whose claim may still land (its acquirer gave up on an unknown outcome)
  is fenced by ``adopt`` as a reader would: the claim, arriving late, is refused.

Each test first checks that its race happened (in the mode that can build it), so it cannot
pass because the race was missed; in rollout mode the losing claim is never sent (control).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from typing import Any

import pytest
import structlog

from bench.baseline import BaselineAgent
from rasd.core import lease as lease_items
from rasd.core import schema
from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.writes import Write
from rasd.steps import WriteResult
from rasd_jobs import admin, liberator
from tests.doubles.clock import FakeClock
from tests.helpers.races import MODES, WAIT, close, item, mapping, set_mode, settle, start

pytestmark = pytest.mark.integration

C, P = "demo", "default"
EAST = "us-east-1"


@pytest.fixture(autouse=True)
def _one_table_for_all_regions(monkeypatch: pytest.MonkeyPatch) -> Any:
    """AWS_REGION pins every client to moto's us-east-1; the jobs configure structlog: put it
    back."""
    monkeypatch.setenv("AWS_REGION", EAST)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _clock(behind_s: float = 0.0) -> FakeClock:
    return FakeClock(now_us=int((time.time() - behind_s) * lease_items.US), mono=time.monotonic())


def _adopt(url: str, table: str, now_us: int) -> dict[str, Any]:
    """The real ``rasadmin adopt`` at ``now_us``: its summary (exit status 0 checked)."""
    buf = io.StringIO()
    argv = ["adopt", "--endpoint-url", url, "--table", table, "--region", EAST]
    with contextlib.redirect_stdout(buf):
        rc = admin.main([*argv, "--now", str(now_us / lease_items.US)])
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("{")]
    out: dict[str, Any] = json.loads(lines[-1])
    assert rc == 0, out
    return out


def _seed(ddb: Any, table: str, t0: int) -> None:
    schema.put_pool(ddb, table, C, P, 7200)
    schema.add_resources(ddb, table, C, P, EAST, ["r_1", "r_2"], now_us=t0 - 60 * lease_items.US)


async def _past_the_bound(
    ddb: Any, url: str, table: str, clock: FakeClock, t0: int
) -> tuple[str, str]:
    """At t0+116 s (past the bound adopt printed for daemons, before the liberator's orphan
    age): the real ``ras-liberator`` runs, then the paper's agent and a new daemon (rollout
    mode) are asked for k. Returns (paper's answer, rasd's answer), both running."""
    clock.advance((t0 + 116 * lease_items.US - clock.now_us()) / lease_items.US)
    liberator.run(
        ddb, liberator.Options(table=table, region=EAST, now_us=clock.now_us(), segments=1)
    )
    agent = BaselineAgent(table, EAST, url, paper=True)
    got = agent.get_lease(C, P, "k", clock.now_us() + 600 * lease_items.US, clock.now_us())
    d3 = await start(url, table, "d3", clock, EAST, mode="rollout")
    try:
        lease, _ = await d3.acquirer.get_lease(
            C, P, "k", clock.now_us() + 3600 * lease_items.US, time.monotonic() + WAIT
        )
    finally:
        await close(d3)
    now = clock.now_us()
    assert got.expires_us > now and lease.expires_us > now
    return got.resource, lease.resource


@pytest.mark.parametrize("mode", MODES)
async def test_adopt_frees_a_losing_claim_the_fast_rules_left_before_the_paper_agent_starts(
    ddb: Any, table: str, moto_endpoint: str, mode: str
) -> None:
    url = moto_endpoint
    set_mode(ddb, url, table, mode)
    c1, c2 = _clock(), _clock(behind_s=1.0)  # d2's clock 1 s behind, within max_clock_skew
    t0 = c1.now_us()
    _seed(ddb, table, t0)
    d1 = await start(url, table, "d1", c1, EAST, mode=mode)
    d2 = await start(url, table, "d2", c2, EAST, mode=mode)
    seen: list[str] = []
    killed = asyncio.Event()
    real_q, real_w = d2.store.query_mappings, d2.store.write
    d1_lease: list[Any] = []

    async def query_mappings(client_id: str, pool_id: str, key: str, deadline: float) -> Any:
        ms = await real_q(client_id, pool_id, key, deadline)
        if not d1_lease:  # d2's first read of k: d1 acquires k before d2's writes go out
            lease, _ = await d1.acquirer.get_lease(
                C, P, "k", c1.now_us() + 3600 * lease_items.US, time.monotonic() + WAIT
            )
            await settle(d1)  # its confirmation written
            d1_lease.append(lease)
            d2.prefetch.buffers.clear()  # d2's candidate: the other resource, as the index is
        return ms

    async def write(w: Write, deadline: float, mine: Any = None) -> Any:
        if w.kind == "free_claim" and w.key[1] != "":
            seen.append(f"give-back {w.key[1]}")
            await killed.wait()  # d2 is killed before it goes out
            return WriteResult(Outcome.UNKNOWN, error=Unavailable("killed"))
        res = await real_w(w, deadline, mine)
        if w.kind in ("map_acquire", "claim"):
            seen.append(f"{w.kind} {res.outcome.value}")
        return res

    d2.store.query_mappings = query_mappings  # type: ignore[method-assign]
    d2.store.write = write  # type: ignore[method-assign]
    try:
        l2, _ = await d2.acquirer.get_lease(
            C, P, "k", c2.now_us() + 3600 * lease_items.US, time.monotonic() + WAIT
        )
        r1 = d1_lease[0].resource
        orphan = "r_2" if r1 == "r_1" else "r_1"
        assert l2.resource == r1
        m = mapping(ddb, table, "k", EAST) or {}
        assert (m.get("state"), m.get("res")) == ("live", r1)
        left = item(ddb, table, orphan) or {}
        if mode == "fast":
            # the race happened: d2's claim applied beside d1's lease, its give-back held
            # (the two writes go out together: their replies come back in either order)
            assert sorted(seen[:2]) == ["claim applied", "map_acquire rejected"], seen
            assert left.get("key") == "k" and left.get("holder"), left
            c1.advance(1)
            out = _adopt(url, table, c1.now_us())
            freed = item(ddb, table, orphan) or {}
        else:
            # control: the claim goes out only once the mapping applied: none was sent
            assert seen == ["map_acquire rejected"], seen
            assert left.get("key") is None, left
        await d1.pool_table.load(time.monotonic() + WAIT)  # d1's pool refresh: rollout mode
        assert d1.driver.rollout.on
        paper, rasd = await _past_the_bound(ddb, url, table, c1, t0)
        assert paper == rasd == r1, f"k split in {EAST}: the paper's agent {paper}, rasd {rasd}"
        if mode == "fast":
            assert out["orphans_freed"] == 1 and out["unsettled"] == 0, out
            # a scan begun before the fast rules' end cannot vouch for what they make later
            assert out["swept_after_fast_rules"] is False and out["sweep_again_after"], out
            assert out["paper_agents_may_start_at"] > out["fast_rules_until"], out
            assert freed.get("key") is None, freed  # out of the leased index
            until = lease_items.parse_time(str(freed["quarantine_until"]))
            # held to its lease's end plus the grace (I1: the paper's agent may have answered it)
            assert until >= lease_items.parse_time(str(left["lease_expires"])) + 2 * lease_items.US
            # a run begun past fast_rules_until (the record's change, on the wall clock, plus
            # the bound): a complete sweep
            past = lease_items.parse_time(out["fast_rules_until"]) + lease_items.US - c1.now_us()
            c1.advance(max(past, 0) / lease_items.US)
            again = _adopt(url, table, c1.now_us())
            assert again["swept_after_fast_rules"] is True and again["writes"] == 0, again
            assert again["paper_agents_may_start_at"] <= lease_items.fmt_time(c1.now_us()), again
    finally:
        killed.set()
        await close(d1)
        await d2.prefetch.stop()
        await d2.store.close()
        await d2.driver.close_peers()


async def test_adopt_fences_a_pending_claim_that_may_still_land(
    ddb: Any, table: str, moto_endpoint: str
) -> None:
    """Fast rules: d2's mapping write applied and its claim's outcome is unknown (the request
    gave up; the claim is still in flight). adopt fences it; the late claim is refused."""
    url = moto_endpoint
    set_mode(ddb, url, table, "fast")
    c2 = _clock()
    t0 = c2.now_us()
    _seed(ddb, table, t0)
    d2 = await start(url, table, "d2", c2, EAST, mode="fast")
    real_w = d2.store.write
    in_flight: list[Write] = []

    async def write(w: Write, deadline: float, mine: Any = None) -> Any:
        if w.kind == "claim" and not in_flight:
            in_flight.append(w)  # sent; DynamoDB has not applied it yet
            return WriteResult(Outcome.UNKNOWN, error=Unavailable("reply lost"))
        return await real_w(w, deadline, mine)

    d2.store.write = write  # type: ignore[method-assign]
    try:
        with pytest.raises(RasdError):  # the request gives up on the unknown outcome (I4)
            await d2.acquirer.get_lease(
                C, P, "k", c2.now_us() + 3600 * lease_items.US, time.monotonic() + WAIT
            )
        await settle(d2)
        assert in_flight, "the claim was never sent"
        m = mapping(ddb, table, "k", EAST) or {}
        assert m.get("state") == "pending" and m.get("res") == in_flight[0].key[1], m
        c2.advance(3)  # past pending_hold: a reader would fence it now
        out = _adopt(url, table, c2.now_us())
        late = await real_w(in_flight[0], time.monotonic() + WAIT)
        assert late.outcome is Outcome.REJECTED, f"the late claim landed: {late}"
        assert out["pending_fenced"] == 1 and out["unsettled"] == 0, out
        left = item(ddb, table, in_flight[0].key[1]) or {}
        assert left.get("key") is None, left  # nothing in the leased index for k
    finally:
        await d2.drain(2.0)
        await d2.prefetch.stop()
        await d2.store.close()
        await d2.driver.close_peers()
