"""get_lease: the taker, and the daemon's roles composed over one driver.

Theory of operation
-------------------
The daemon's verbs are divided among roles, as KCL divides a lease coordinator's work (its
LeaseTaker, LeaseRenewer): :class:`Acquirer`, the taker, answers ``get_lease``; the renewer
(``rasd.renewer``) extends and re-confirms what is served; the releaser (``rasd.releaser``)
gives leases back and re-lists what it quarantined; the reporter (``rasd.reporter``) answers
``headroom`` and reports unmet demand. They share one driver (``rasd.driver``: the store,
the cache, the prefetcher, the one task group) and one pool table (``rasd.pools``). The
Acquirer composes them: the server holds it, and calls each role for its verbs.

``hit_answer`` is the hot path and never awaits: a cached lease is answered at once. The
cache holds each answer at most ``confirm_interval`` (S) after it was last confirmed; a hit
past S/2 asks the renewer for a background re-confirmation (one consistent read), and a hit
whose sliding ``lease_expires`` calls for it (``decide.should_extend``) for a background
extension.

A miss goes through :meth:`Acquirer.get_lease`, which makes concurrent requests for one
(client, pool, key) share one resolution (single-flight). The resolution
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
import math
import random

from .cache import HEAD, CacheKey, lease_of
from .config import Config
from .core.clock import Clock
from .core.decide import check_expiry
from .core.errors import BadRequest
from .core.lease import US, Lease, Pool
from .driver import Driver
from .observe.metrics import Counters
from .pools import PoolTable
from .protocol import ID_PACK
from .releaser import Releaser
from .renewer import Renewer
from .reporter import Reporter
from .steps import daemon as S
from .steps.take import resolve
from .store import Store

#: seconds between two reads of the wall clock on the hit path (Acquirer.wall_us)
WALL_RESYNC = 0.25


class Acquirer:
    """The taker (``get_lease``: the cached hit, single-flight, the resolution), and the
    roles beside it: ``renewer``, ``releaser``, ``reporter``, over one ``driver``."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock | None = None,
        counters: Counters | None = None,
        rng: random.Random | None = None,
    ) -> None:
        counters = counters or store.counters
        self.driver = drv = Driver(cfg, store, clock or Clock(), counters, rng or random.Random())
        self.pool_table = pools = PoolTable(store, drv.clock)
        self.renewer = Renewer(drv, pools)
        self.releaser = Releaser(drv, pools)
        self.reporter = Reporter(drv, pools)
        drv.local.update(
            {
                S.Refresh: self.renewer.refresh,
                S.Miss: self.reporter.miss,
                S.RelistLater: self.releaser.relist_later,
            }
        )
        self.cfg = cfg
        self.store = store
        self.counters = counters
        # What the hit path reads, held here (the same objects as the driver's and the
        # renewer's) so that a hit takes no hop through them.
        self.clock = drv.clock
        self.cache = drv.cache
        self.prefetch = drv.prefetch
        self.pools = pools.by_id
        self._refreshing = self.renewer.refreshing
        self._maybe_refresh = self.renewer.maybe_refresh
        self._flights: dict[CacheKey, asyncio.Task[tuple[Lease, bool]]] = {}
        self._wall_synced = -math.inf
        self._wall_offset_us = 0

    def _check(self, pool: Pool, requested_us: int, now_us: int) -> None:
        why = check_expiry(requested_us, now_us, pool.max_lease_us)
        if why:
            raise BadRequest(why)

    # --------------------------------------------------------------------- hot path
    def wall_us(self, mono: float) -> int:
        """Wall time (microseconds) at monotonic time ``mono``, from an offset read again
        once WALL_RESYNC has passed: a hit reads no clock but the one its request read. Only
        for checks that tolerate a fraction of a second (the requested lease end, when to
        extend); cache validity runs on the monotonic clock alone (docs/design.md, I3)."""
        if not 0 <= mono - self._wall_synced < WALL_RESYNC:
            self._wall_synced = mono
            self._wall_offset_us = self.clock.now_us() - int(mono * US)
        return int(mono * US) + self._wall_offset_us

    def try_hit(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float | None = None,
    ) -> Lease | None:
        """The full path's cache hit: the cached Lease when :meth:`hit_answer` would answer,
        else None; raises BadRequest when the pool refuses the lease end. Never awaits and
        never touches DynamoDB. ``now``: the request's monotonic time (read once by the
        server). (The server counts hits and misses: this is also called again after a miss.)"""
        if now is None:
            now = self.clock.mono()
        if self.hit_answer(client_id, pool_id, key, requested_us, now, 0) is None:
            pool = self.pools.get((client_id, pool_id))
            if pool is not None:
                self._check(pool, requested_us, self.wall_us(now))  # a refused end, named
            return None
        return self.cache.get((client_id, pool_id, key), now)

    def hit_answer(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float,
        req_id: int,
    ) -> bytes | None:
        """What the cache answers a get_lease at monotonic time ``now``, for both paths (the
        full path through :meth:`try_hit`): the whole answer frame for request ``req_id``
        (0 <= req_id <= protocol.ID_MAX), or None when this is not a plain hit (no pool, a
        lease end the pool refuses, no valid entry). Starts the background work a hit calls
        for: a re-confirmation past S/2, an extension when the caller asks for more than the
        lease has (``Renewer.maybe_refresh``); the Lease is rebuilt only then. Otherwise
        allocates only the answer."""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        if 0 <= now - self._wall_synced < WALL_RESYNC:
            now_us = int(now * US) + self._wall_offset_us
        else:
            now_us = self.wall_us(now)
        if not 0 < requested_us - now_us <= pool.max_lease_us:  # check_expiry, inlined
            return None
        r = self.cache.read(client_id, pool_id, key, now)
        if r is None:
            return None
        e, confirmed, extend_from_us, end = r
        if now - confirmed > self.cache.half_s or requested_us > extend_from_us:
            k = (client_id, pool_id, key)
            if k not in self._refreshing:
                self._maybe_refresh(k, lease_of(client_id, pool_id, key, e), requested_us, now_us)
        return e[HEAD:end] + ID_PACK(req_id)

    # --------------------------------------------------------------------- a miss
    async def get_lease(
        self, client_id: str, pool_id: str, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        """The lease for ``key`` and whether this call acquired it."""
        pool = await self.pool_table.get(client_id, pool_id, deadline)
        hit = self.try_hit(client_id, pool_id, key, requested_us)
        if hit is not None:
            return hit, False
        k = (client_id, pool_id, key)
        flight = self._flights.get(k)
        if flight is not None:
            self.driver.counters.inc("singleflight.joined")
            lease, _ = await asyncio.shield(flight)
            return lease, False
        task = self.driver.tasks.request(self._resolve(pool, key, requested_us, deadline))
        self._flights[k] = task
        task.add_done_callback(lambda t: self._flight_done(k, t))
        return await asyncio.shield(task)

    def _flight_done(self, k: CacheKey, task: asyncio.Task[tuple[Lease, bool]]) -> None:
        self._flights.pop(k, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up already

    async def _resolve(
        self, pool: Pool, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        return await self.driver.run(resolve, pool, key, requested_us, deadline=deadline)

    # ------------------------------------------------------------------- the roles
    async def drain(self, timeout: float) -> None:
        """Shutdown: every role's tasks (the one task group), waited for at most ``timeout``."""
        await self.driver.tasks.drain(timeout)
