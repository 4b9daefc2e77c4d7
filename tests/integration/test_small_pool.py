"""A small pool cycling through short leases and the liberator: the daemon takes back what
it once held. Every NO_CAPACITY answer is checked against a strongly consistent scan made
just before the request; an answer given while the region held a claimable item fails.

One daemon on moto over HTTP, a pool of 16, leases of 2 s, ``ras-liberator --grace 0``
every 0.5 s in a thread, 4 new keys a second asked one at a time (about half the pool in
use). Requests are sequential and the liberator only frees, so an item claimable at the
scan is still claimable when the daemon reads the index.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

import rasd_client
from rasd.core.lease import fmt_time
from rasd_client import aio
from rasd_jobs import liberator
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import scan_all, seed_pool

pytestmark = [pytest.mark.integration]

POOL = 16
LEASE_S = 2.0
RATE = 4.0  # new keys per second
REQUESTS = 48  # three times the pool: every item is taken, freed and taken again


def claimable(ddb: Any, table: str, region: str = "us-east-1") -> list[str]:
    """Free items of ``region`` out of any quarantine now (strongly consistent)."""
    now = fmt_time(time.time_ns() // 1000)
    return [
        it["resource"]["S"]
        for it in scan_all(ddb, table)
        if not it["client_id"]["S"].startswith("#")
        and it.get("region", {}).get("S") == region
        and "key" not in it
        and "lease_available" in it
        and it["lease_available"]["S"] <= now
    ]


class Liberator(threading.Thread):
    """``ras-liberator --grace 0`` every ``every`` seconds, in-process (its ``run``)."""

    def __init__(self, ddb: Any, table: str, every: float) -> None:
        super().__init__(daemon=True)
        self.ddb, self.table, self.every = ddb, table, every
        self.stop = threading.Event()
        self.freed = 0
        self.runs = 0

    def run(self) -> None:
        while not self.stop.wait(self.every):
            opts = liberator.Options(
                table=self.table, region="us-east-1", now_us=time.time_ns() // 1000, grace_us=0
            )
            self.freed += liberator.run(self.ddb, opts)["freed"]
            self.runs += 1


async def test_small_pool_cycles_with_no_capacity_only_when_nothing_is_claimable(
    make_daemon: Any, ddb: Any, table: str
) -> None:
    seed_pool(ddb, table, count=POOL)
    lib = Liberator(ddb, table, 0.5)
    # no back-off after an empty sweep: every NO_CAPACITY comes from a sweep of that request
    async with make_daemon(exhausted_backoff=0.0) as d:
        lib.start()
        answered: list[tuple[str, str]] = []
        wrong: list[tuple[int, list[str]]] = []
        no_capacity = 0
        try:
            t0 = time.monotonic()
            for i in range(REQUESTS):
                await asyncio.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
                # read in a thread, so the daemon's loop runs on: nothing else claims
                # (requests are sequential) and the liberator only frees
                free = await asyncio.to_thread(claimable, ddb, table)
                try:
                    # the answer is the subject, not its speed
                    lease = await aio.get_lease(
                        "demo",
                        "default",
                        f"k{i}",
                        timedelta(seconds=LEASE_S),
                        timeout=WAIT,
                        socket_path=d.cfg.socket,
                    )
                    answered.append((f"k{i}", lease.resource))
                except rasd_client.NoCapacity:
                    no_capacity += 1
                    if free:
                        wrong.append((i, free))
        finally:
            lib.stop.set()
            lib.join(10)
            await aio.close()
    assert wrong == [], f"NO_CAPACITY while claimable: {wrong[:5]} ({no_capacity} in all)"
    # the test saw the pool cycle: more leases than items, items freed and taken again
    assert len(answered) > POOL and lib.freed > 0
    assert len({r for _, r in answered}) <= POOL < len(answered)
    # every answer was exclusive while it ran: one key per item at any one time in the table
    held = [it for it in scan_all(ddb, table) if "key" in it]
    assert len({it["resource"]["S"] for it in held}) == len(held)
