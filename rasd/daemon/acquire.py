"""get_lease past the cache: the acquirer (:class:`Acquirer`).

A miss reads the pool, refuses a lease end the pool does not allow, and shares one resolution
(``steps.take.resolve``) among concurrent requests for one (client, pool, key). The roles:
docs/design.md, "The roles, and what each keeps"; the path: docs/design.md, "get_lease".
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..core.decide import check_expiry
from ..core.errors import BadRequest
from ..core.lease import Lease, Pool
from ..steps.daemon import WAIT_FIRST
from ..steps.take import resolve
from .cache import CacheKey
from .driver import Driver
from .pools import PoolTable


class Acquirer:
    """``get_lease`` on a miss: the pool's check, single-flight, the resolution."""

    def __init__(self, driver: Driver, pools: PoolTable, ends: Mapping[CacheKey, int]) -> None:
        self.driver = driver
        self.pools = pools
        self.clock = driver.clock
        self._flights: dict[CacheKey, asyncio.Task[tuple[Lease, bool]]] = {}
        #: the keys whose lease this host knew lately (``LeaseCache.ends``): in rollout
        #: mode a miss on one reads before it writes the key's mapping beside the read
        #: (it most likely names a lease, which would refuse that write)
        self._known = ends

    def _check(self, pool: Pool, requested_us: int, now_us: int) -> None:
        why = check_expiry(requested_us, now_us, pool.max_lease_us)
        if why:
            raise BadRequest(why)

    async def get_lease(
        self, client_id: str, pool_id: str, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        """The lease for ``key`` and whether this call acquired it: a miss (the cache, asked
        by the server, had no answer), resolved from the table. Raises BadRequest when the
        pool refuses the lease end."""
        pool = await self.pools.get(client_id, pool_id, deadline)
        self._check(pool, requested_us, self.clock.now_us())
        k = (client_id, pool_id, key)
        flight = self._flights.get(k)
        if flight is not None:
            self.driver.counters.inc("singleflight.joined")
            lease, _ = await asyncio.shield(flight)
            return lease, False
        task = self.driver.tasks.request(self._resolve(k, pool, requested_us, deadline))
        self._flights[k] = task
        task.add_done_callback(lambda t: self._flight_done(k, t))
        return await asyncio.shield(task)

    def _flight_done(self, k: CacheKey, task: asyncio.Task[tuple[Lease, bool]]) -> None:
        self._flights.pop(k, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up already

    async def _resolve(
        self, k: CacheKey, pool: Pool, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        speculate = k not in self._known
        return await self.driver.run(
            resolve, pool, k[2], requested_us, WAIT_FIRST, (), True, speculate, deadline=deadline
        )
