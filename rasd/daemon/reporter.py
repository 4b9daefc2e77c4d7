"""The reporter: what a daemon tells of its pools (headroom) and of the demand it could not meet.

Theory of operation
-------------------
:meth:`Reporter.headroom` answers the ``headroom`` verb: the balancer's estimate of the
pool's free resources in our region when it wrote a fresh one, else a count of the
available index, cached for HEADROOM_TTL. Unmet demand (a request answered NO_CAPACITY: the
``Miss`` effect) never reaches the table's stream, so the reporter writes it to our miss
counter item of the pool for the balancer: at most one write per pool every
``miss_report_interval`` seconds, and only when there were misses; what a failed write did
not report is added to the next one.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from ..core.builders import miss_report_update
from ..core.errors import RasdError
from ..core.lease import US, headroom_resource, partition_name
from ..core.serialize import headroom_from_ddb
from ..steps import daemon as daemon_steps
from .driver import Driver, Local
from .pools import PoolTable

log = structlog.get_logger("rasd.daemon.reporter")

HEADROOM_TTL = 10.0
HEADROOM_STALE = 900.0  # seconds: three missed 5-minute balancer runs


class Reporter:
    """Headroom answers and the miss reports."""

    def __init__(self, driver: Driver, pools: PoolTable, local: Local) -> None:
        self.driver = driver
        self.pools = pools
        self.region = driver.region
        self._headroom: dict[tuple[str, str], tuple[float, int]] = {}
        self._misses: dict[tuple[str, str], int] = {}  # NO_CAPACITY answers not yet reported
        local.miss = self.miss

    def miss(self, eff: daemon_steps.Miss) -> str | None:
        """The ``Miss`` effect: a request found no free resource in ``eff.pool``. Returns what
        the answer may add about the pool's items that are not claimable yet."""
        k = (eff.pool.client_id, eff.pool.pool_id)
        self._misses[k] = self._misses.get(k, 0) + 1
        return self.driver.prefetch.why_empty(eff.pool)

    async def flush_misses(self, deadline: float) -> None:
        """Write the NO_CAPACITY answers since the last report to our miss counter items."""
        drv = self.driver
        misses, self._misses = self._misses, {}
        for (client_id, pool_id), n in misses.items():
            upd = miss_report_update(
                client_id, pool_id, self.region, drv.owner, n, drv.clock.now_us()
            )
            try:
                await drv.store.update_raw(upd, deadline)
                drv.counters.inc("misses.reported", n)
            except RasdError:
                self._misses[(client_id, pool_id)] = self._misses.get((client_id, pool_id), 0) + n
                raise

    async def report_misses_forever(self) -> None:
        """Report unmet demand for the balancer, every ``miss_report_interval`` seconds."""
        while True:
            await asyncio.sleep(self.driver.cfg.miss_report_interval)
            if self._misses:
                try:
                    await self.flush_misses(time.monotonic() + 5.0)
                except RasdError as exc:
                    log.warning("miss_report_failed", error=str(exc))

    async def headroom(self, client_id: str, pool_id: str, deadline: float) -> int:
        """Free resources of the pool in our region: the balancer's estimate when it has
        written one, else a count of the available index, cached for HEADROOM_TTL."""
        pool = await self.pools.get(client_id, pool_id, deadline)
        drv = self.driver
        k = (pool.client_id, pool.pool_id)
        now = drv.clock.mono()
        cached = self._headroom.get(k)
        if cached is not None and cached[0] > now:
            return cached[1]
        meta = await drv.store.get_meta(
            headroom_resource(client_id, pool_id, self.region), deadline
        )
        value: int | None = None
        if meta is not None and "headroom" in meta:
            spare, updated = headroom_from_ddb(meta)
            # trusted only while fresh: not after three missed 5-minute balancer runs
            if updated is not None and drv.clock.now_us() - updated < HEADROOM_STALE * US:
                value = spare
        if value is None:
            counts = await asyncio.gather(
                *(
                    drv.store.count_available(
                        partition_name(client_id, pool_id, self.region, n), deadline
                    )
                    for n in range(10)
                )
            )
            value = sum(counts)
        self._headroom[k] = (now + HEADROOM_TTL, value)
        return value
