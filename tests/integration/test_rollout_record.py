"""Rollout mode lives in the table: the record, who sets it, who follows it, who raises it.

A table rasd creates has no record: daemons and jobs run the fast rules. ``rasadmin adopt``
turns rollout mode on before the paper's agent (or the first rasd host beside it) writes;
running daemons follow at their next pool refresh. ``rasadmin end-rollout`` turns it off: it
refuses while any item holds a lease of the paper's agent, and waits out every lease that
agent may have answered. A liberator that finds such a lease while the record says none
turns it on again, and says so.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from bench.baseline import BaselineAgent, paper_liberate
from rasd.config import Config
from rasd.core import lease as lease_items
from rasd_jobs import admin, common, liberator
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

C, P, EAST = "demo", "default", "us-east-1"


def now_us() -> int:
    return time.time_ns() // 1000


def rasadmin(
    capsys: pytest.CaptureFixture[str], url: str, table: str, *argv: str
) -> tuple[int, Any]:
    capsys.readouterr()
    cmd, *rest = argv
    rc = admin.main([cmd, "--endpoint-url", url, "--table", table, "--region", EAST, *rest])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else None


async def until(cond: Any, seconds: float = 5.0) -> None:
    """Wait for ``cond()`` (an event: a pool refresh), at most ``seconds``."""
    for _ in range(int(seconds / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_a_new_table_runs_the_fast_rules_until_adopt_turns_rollout_on(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_pool(ddb, table, count=4)
    assert common.read_rollout(ddb, table).paper_agents is False  # no record: rasd alone
    async with make_daemon(pool_refresh=0.1) as d:
        drv = d.coordinator.driver
        assert drv.rollout.on is False and drv.steps_daemon().legacy_agents is False
        rc, out = rasadmin(capsys, moto_endpoint, table, "adopt")
        assert rc == 0 and out["rollout"] is True and out["paper_agents_may_start_at"]
        await until(lambda: drv.rollout.on)  # the next pool refresh
        assert drv.steps_daemon().legacy_agents is True
        assert d.stats()["rollout"] is True  # what `rasd stats` reports
        rc, status = rasadmin(capsys, moto_endpoint, table, "rollout")
        assert rc == 0 and status["rollout"] is True and status["by"].startswith("rasadmin:")
        rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout")
        assert rc == 0 and out["changed"] is True and out["paper_leases"]["running"] == 0
        await until(lambda: not drv.rollout.on)
        assert drv.steps_daemon().legacy_agents is False
        assert d.stats()["rollout"] is False


async def test_a_forced_config_keeps_rollout_mode_whatever_the_table_says(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """``legacy_agents = true`` forces rollout mode; ``false`` (a stale config file from
    before the record) is no longer a way to run the fast rules beside the paper's agent."""
    seed_pool(ddb, table, count=2)
    async with make_daemon(legacy_agents=True) as d:
        assert d.coordinator.driver.rollout.on is True
    common.write_rollout(ddb, table, True, common.read_rollout(ddb, table), "t", "t")
    async with make_daemon(legacy_agents=False) as d:
        assert d.coordinator.driver.rollout.on is True  # the table decides


async def test_end_rollout_refuses_while_a_paper_lease_is_in_the_table(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_pool(ddb, table, count=4)
    rc, _ = rasadmin(capsys, moto_endpoint, table, "adopt")
    assert rc == 0
    agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
    try:
        got = agent.get_lease(C, P, "pk", now_us() + 2 * lease_items.US)
    finally:
        agent.ddb.close()
    rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout")
    assert rc == 1 and out["paper_leases"]["running"] == 1 and "refused" in out
    assert out["paper_leases"]["items"][0]["resource"] == got.resource
    assert common.read_rollout(ddb, table).paper_agents is True
    # the lease ends and the paper's liberator frees it: nothing of the agent is left
    later = now_us() + 60 * lease_items.US
    rc, out = rasadmin(
        capsys, moto_endpoint, table, "end-rollout", "--now", str(later / lease_items.US)
    )
    assert rc == 1 and out["paper_leases"]["ended"] == 1  # ended, not yet freed
    paper_liberate(ddb, table, later)
    rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout", "--dry-run")
    assert rc == 0 and out["changed"] is False and out["rollout"] is True
    rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout")
    assert rc == 0 and out["changed"] is True
    assert common.read_rollout(ddb, table).paper_agents is False


async def test_end_rollout_waits_out_a_lease_the_paper_agent_answered_and_rasd_adopted(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The paper's agent answers pk; a daemon in rollout mode adopts that lease (the item is
    rasd's now, no lease of the agent is left in the table). The agent's app still uses its
    answer to its end, so ``end-rollout`` only marks the record with that end plus the skew
    and turns it off at a run after it: with the record off earlier, a release would free the
    resource after the quarantine alone."""
    seed_pool(ddb, table, count=4)
    rc, _ = rasadmin(capsys, moto_endpoint, table, "adopt")
    assert rc == 0
    agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
    try:
        got = agent.get_lease(C, P, "pk", now_us() + 30 * lease_items.US)
    finally:
        agent.ddb.close()
    async with make_daemon() as d:
        assert d.coordinator.driver.rollout.on is True
        lease, _ = await d.coordinator.acquirer.get_lease(
            C, P, "pk", now_us() + 3600 * lease_items.US, time.monotonic() + 10.0
        )
    assert lease.resource == got.resource  # adopted, not a second lease of pk
    rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout")
    assert rc == 1 and out["paper_leases"]["running"] == 0 and out["ends_at"], out
    ends = lease_items.parse_time(out["ends_at"])
    assert ends >= got.expires_us + int(Config().max_clock_skew * lease_items.US)
    record = common.read_rollout(ddb, table)
    assert record.paper_agents is True and record.ends_at == out["ends_at"]
    before = (ends - lease_items.US) / lease_items.US
    rc, out = rasadmin(capsys, moto_endpoint, table, "end-rollout", "--now", str(before))
    assert rc == 1 and out["ends_at"] == record.ends_at and out["changed"] is False
    assert common.read_rollout(ddb, table).paper_agents is True
    rc, out = rasadmin(
        capsys, moto_endpoint, table, "end-rollout", "--now", str(ends / lease_items.US)
    )
    assert rc == 0 and out["changed"] is True, out
    assert common.read_rollout(ddb, table).paper_agents is False
    assert common.read_rollout(ddb, table).ends_at is None


async def test_adopt_again_removes_end_rollouts_mark(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The paper's agent came back after ``end-rollout`` marked the record: ``adopt`` (the
    operator's answer to it) removes the mark, so a later end waits anew."""
    seed_pool(ddb, table, count=4)
    rasadmin(capsys, moto_endpoint, table, "adopt")
    seen = common.read_rollout(ddb, table)
    assert common.write_rollout(ddb, table, True, seen, "t", "t", ends_at_us=now_us())
    rc, _ = rasadmin(capsys, moto_endpoint, table, "adopt")
    assert rc == 0 and common.read_rollout(ddb, table).ends_at is None


async def test_the_liberator_turns_rollout_mode_on_when_it_finds_a_paper_lease(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any
) -> None:
    """The record says no paper's agent writes the table, but one does: the liberator's
    scan finds its (expired) lease, counts it, logs an error and turns rollout mode on; a
    running daemon follows at its next pool refresh."""
    seed_pool(ddb, table, count=4)
    agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
    try:
        agent.get_lease(C, P, "pk", now_us() + 1 * lease_items.US)
    finally:
        agent.ddb.close()
    async with make_daemon(pool_refresh=0.1) as d:
        drv = d.coordinator.driver
        assert drv.rollout.on is False
        opts = liberator.Options(
            table=table, region=EAST, now_us=now_us() + 120 * lease_items.US, segments=1
        )
        s = liberator.run(ddb, opts)
        assert s["paper_leases_found"] == 1 and s["rollout"] is True and s["freed"] == 1, str(s)
        record = common.read_rollout(ddb, table)
        assert record.paper_agents and record.by.startswith("ras-liberator:")
        await until(lambda: drv.rollout.on)
