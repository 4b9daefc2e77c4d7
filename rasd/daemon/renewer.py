"""The renewer: the background work that keeps the leases a daemon serves.

Theory of operation
-------------------
After a hit (``LeaseCache.answer``) or a lease served from the table (the ``Refresh``
effect), :meth:`Renewer.maybe_refresh` starts at most one task per key, as
``rasd.core.cache_rules.refresh_of`` says: an extension when the caller asks for more than a
sliding lease has and ``rasd.core.decide.should_extend`` calls for it
(``steps.renew.extend_bg``), else a re-confirmation of an answer past S/2 (one consistent
read, ``steps.renew.reconfirm``). A failed extension is retried on a later hit after a
backoff (1, 2, 4 ... 30 s), and logged as at risk once the lease gets close to its end. The
programs decide; the renewer only says when to run them, in the driver's task group.

The renewer makes the lease cache (``rasd.daemon.cache``) and keeps it: the cached hit calls
its ``maybe_refresh`` and reads its set of keys being refreshed, and it reads the cache's
staleness, so the two are made together; the driver puts and drops entries through the
``CachePut`` and ``CacheDrop`` slots the renewer fills (``rasd.daemon.driver.Local``).
"""

from __future__ import annotations

import math

import structlog

from ..core import cache_rules, decide
from ..core.errors import RasdError
from ..core.lease import US, Lease
from ..steps import daemon as daemon_steps
from ..steps.renew import extend_bg, reconfirm
from .cache import CacheKey, LeaseCache
from .driver import Driver, Local
from .pools import PoolTable
from .published import Published

log = structlog.get_logger("rasd.daemon.renewer")

#: the hit table's asks are noted this much longer (``Renewer.touched``)
ASK_SLACK_US = US


class Renewer:
    """Extensions and re-confirmations of the leases this daemon serves."""

    def __init__(
        self, driver: Driver, pools: PoolTable, local: Local, published: Published | None = None
    ) -> None:
        cfg = driver.cfg
        self.driver = driver
        self.pools = pools.by_id
        self.cfg = cfg
        self.region = driver.region
        self.clock = driver.clock
        self.counters = driver.counters
        # Each daemon extends at a slightly different point, so a fleet does not write at once.
        self.extend_fraction = cfg.extend_fraction * driver.rng.uniform(0.9, 1.0)
        #: keys with a refresh under way (read by the hit path before it asks for another)
        self.refreshing: set[CacheKey] = set()
        self._extend_after: dict[CacheKey, tuple[float, int]] = {}  # backoff after failures
        #: the leases this daemon serves; the hit reads the pools, this set, maybe_refresh
        self.cache = cache = LeaseCache(
            self.clock,
            cfg.cache_max_leases,
            int(cfg.skew_margin * US),
            cfg.confirm_interval,
            cfg.region,
            pools=self.pools,
            refreshing=self.refreshing,
            refresh=self.maybe_refresh,
            rules=cfg.rules(),
            published=published,
        )
        local.refresh = self.refresh
        local.cache_put = cache.put
        local.cache_drop = cache.drop

    def refresh(self, eff: daemon_steps.Refresh) -> None:
        """The ``Refresh`` effect: a lease was just served from the table."""
        lease = eff.lease
        k = (lease.client_id, lease.pool_id, lease.key)
        self.maybe_refresh(k, lease, eff.requested_us, self.clock.now_us())

    def touched(self, k: CacheKey, requested_us: int) -> None:
        """A hit table answered ``k`` past its touch time or for an ask that may call for an
        extension: what a hit does (:meth:`maybe_refresh`, for a lease end the pool takes);
        and when that starts nothing, the table is told from when an extension is due for
        asks this long (``cache_rules.extend_due_us``), so the clients touch again only then."""
        mono, now_us = self.clock.mono(), self.clock.now_us()
        cache = self.cache
        pool = self.pools.get((k[0], k[1]))
        lease = cache.get(k, mono)
        if pool is None or lease is None:
            return
        if decide.check_expiry(requested_us, now_us, pool.max_lease_us):
            return  # a lease end the pool refuses: the client checked; nothing to do
        self.maybe_refresh(k, lease, requested_us, now_us)
        if k in self.refreshing or cache.published is None:
            return
        if lease.region != self.region or lease.token is None:
            return
        # a second longer than this ask as the daemon sees it: the client's own reading of the
        # same sliding ask, taken before the touch travelled, is that much longer at most
        ask_us = requested_us - now_us + ASK_SLACK_US
        due = cache_rules.extend_due_us(lease, ask_us, self.extend_fraction)
        cache.published.note(k[0], k[1], k[2], lease.expires_us, ask_us, due)

    def maybe_refresh(self, k: CacheKey, lease: Lease, requested_us: int, now_us: int) -> None:
        """After a hit: extend a sliding lease that needs it, else re-confirm a stale answer."""
        if k in self.refreshing:
            return
        mono = self.clock.mono()
        backoff = self._extend_after.get(k)  # the last extension failed: retry after this
        kind = cache_rules.refresh_of(
            lease,
            self.region,
            requested_us,
            now_us,
            self.extend_fraction,
            self.cache.stale(k, mono),
            backing_off=backoff is not None and mono < backoff[0],
        )
        if kind is cache_rules.Refresh.EXTEND:
            self.refreshing.add(k)
            self.driver.tasks.spawn(self._extend_bg(k, lease, requested_us))
        elif kind is cache_rules.Refresh.RECONFIRM:
            self.refreshing.add(k)
            self.driver.tasks.spawn(self._reconfirm(k, lease))

    async def _extend_bg(self, k: CacheKey, lease: Lease, requested_us: int) -> None:
        try:
            try:
                error = await self.driver.run(extend_bg, lease, requested_us)
            except RasdError as exc:  # this host's clock untrusted (GuardedClock), say
                error = exc
            if error is None:
                self._extend_after.pop(k, None)
            else:
                self._extension_failed(k, lease, error)
        finally:
            self.refreshing.discard(k)

    def _extension_failed(self, k: CacheKey, lease: Lease, exc: RasdError) -> None:
        # Retried on a later cache hit after a backoff (1, 2, 4 ... 30 s), until the lease
        # leaves the cache; a lease that gets close to its end is logged as at risk.
        self.counters.inc("lease.extend_errors")
        failures = self._extend_after.get(k, (0.0, 0))[1] + 1
        retry_in = min(30.0, 2.0 ** (failures - 1))
        self._extend_after[k] = (self.clock.mono() + retry_in, failures)
        if len(self._extend_after) > 10_000:
            self._extend_after.pop(next(iter(self._extend_after)))
        try:
            left = (lease.expires_us - self.clock.now_us()) / US
        except RasdError:  # no wall time while the clock is untrusted: its own alert says so
            left = math.inf
        at_risk = left < max(4 * self.cfg.skew_margin, 60.0)
        (log.error if at_risk else log.warning)(
            "lease_at_risk" if at_risk else "lease_extension_failed",
            client_id=lease.client_id,
            pool_id=lease.pool_id,
            key=lease.key,
            resource=lease.resource,
            seconds_left=round(left, 1),
            failures=failures,
            retry_in_s=retry_in,
            error=str(exc),
        )

    async def _reconfirm(self, k: CacheKey, lease: Lease) -> None:
        """A cached answer is past S/2: read the mapping again (``steps.renew.reconfirm``)."""
        try:
            pool = self.pools.get((k[0], k[1]))
            if pool is None:
                return
            await self.driver.run(reconfirm, pool, lease)
        finally:
            self.refreshing.discard(k)
