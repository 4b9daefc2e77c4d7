"""get_lease: the acquirer.

Theory of operation
-------------------
The daemon's verbs are divided among roles, as KCL divides a lease coordinator's work (its
LeaseTaker, LeaseRenewer): :class:`Acquirer` answers ``get_lease``; the renewer
(``rasd.daemon.renewer``) extends and re-confirms what is served; the releaser
(``rasd.daemon.releaser``) gives leases back and re-lists what it quarantined; the reporter
(``rasd.daemon.reporter``) answers ``headroom`` and reports unmet demand. They share one
driver (``rasd.daemon.driver``: the store, the prefetcher, the one task group) and one pool
table (``rasd.daemon.pools``); ``rasd.daemon.coordinator`` makes them, each given what it
needs when made.

The cached hit is the cache's to answer (``LeaseCache.answer``, asked once per request by the
server). The cache holds each answer at most ``confirm_interval`` (S) after it was last
confirmed; a hit past S/2 asks the renewer for a background re-confirmation (one consistent
read), and a hit whose sliding ``lease_expires`` calls for it (``decide.should_extend``) for a
background extension.

A miss goes through :meth:`Acquirer.get_lease`, which does not ask the cache again (the server
just did; the resolution reads the table, the truth): it reads the pool, refuses a lease end
the pool does not allow, and makes concurrent requests for one (client, pool, key) share one
resolution (single-flight). The resolution
(``steps.take.resolve``) reads the key's mapping items (one strongly consistent Query) and
does what ``rasd.core.decide`` says:

* serve a live lease (one round trip for an uncached existing lease);
* verify a pending one against its resource item, wait for its acquirer, or fence it;
* acquire: the mapping write and the claim of a prefetched candidate go out together (one
  round trip after the read), and ``decide.after_acquire`` says what their outcomes mean.

No role decides anything itself: every branch is a decision of ``rasd.core.decide``, taken
by the programs of ``rasd.steps``, which the protocol checker (``check/``) explores.
docs/design.md argues the invariants. Only our region's items are ever written; another
region's lease is served as it is.
"""

from __future__ import annotations

import asyncio

from cachetools import TTLCache

from ..core.decide import check_expiry
from ..core.errors import BadRequest
from ..core.lease import Lease, Pool
from ..steps.daemon import WAIT_FIRST
from ..steps.take import resolve
from .cache import CacheKey
from .driver import Driver
from .pools import PoolTable

#: keys this host answered lately, and for how long (seconds): in rollout mode a miss on
#: one of them reads before it writes a new key's mapping (it most likely has one)
RECENT_KEYS, RECENT_S = 20_000, 600.0


class Acquirer:
    """``get_lease`` on a miss: the pool's check, single-flight, the resolution."""

    def __init__(self, driver: Driver, pools: PoolTable) -> None:
        self.driver = driver
        self.pools = pools
        self.clock = driver.clock
        self._flights: dict[CacheKey, asyncio.Task[tuple[Lease, bool]]] = {}
        self._recent: TTLCache[CacheKey, bool] = TTLCache(RECENT_KEYS, RECENT_S, driver.clock.mono)

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
        speculate = k not in self._recent
        got = await self.driver.run(
            resolve, pool, k[2], requested_us, WAIT_FIRST, (), True, speculate, deadline=deadline
        )
        self._recent[k] = True
        return got
