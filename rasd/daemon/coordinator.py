"""The daemon's roles, composed: each made with what it needs, nothing patched in afterwards.

Theory of operation
-------------------
As KCL's lease coordinator builds its taker, renewer and refresher, :class:`Coordinator`
builds the daemon's: the pool table (``rasd.daemon.pools``), the prefetcher, the driver
(``rasd.daemon.driver``), the renewer, which makes and keeps the lease cache
(``rasd.daemon.renewer``), the releaser, the reporter and the taker (``rasd.daemon.acquire``).
The server holds the coordinator and calls each role for its verbs: ``taker.get_lease``,
``releaser.release``, ``reporter.headroom``, and the cache's ``answer`` for the hit.

The roles and the driver need each other: the driver runs the roles' programs, and the roles
perform a few of its effects (``Refresh``, ``CachePut``, ``CacheDrop``, ``Miss``,
``RelistLater``). So the coordinator is made in one pass: the pool table, the prefetcher, the
driver (given the coordinator as its :class:`~rasd.daemon.driver.LocalEffects`), the roles,
and last the coordinator's own binding of each local effect to the role that performs it;
no role's attribute is set from outside, and the driver calls them only once a role runs a
program. The cache and the renewer need each other too (the hit calls ``maybe_refresh``; the
renewer reads the cache's staleness), so the renewer makes the cache, handing it the pool
table's dict, its set of keys being refreshed and its ``maybe_refresh``, which the hit reads
as attributes of the cache's own. The driver reads
the strict pools the pool table updates (``StrictPools``, shared as the rollout mode is);
the hit tables (``rasd.daemon.published``) come from the daemon, which pauses and closes them.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..config import Config
from ..core.clock import Clock
from ..core.lease import Lease
from ..dynamo.store import Store
from ..observe.metrics import Counters
from ..steps import daemon as S
from .acquire import Taker
from .cache import CacheKey
from .driver import Driver, RolloutMode, StrictPools
from .pools import PoolTable
from .prefetch import Prefetcher
from .published import Published
from .releaser import Releaser
from .renewer import Renewer
from .reporter import Reporter


class Coordinator:
    """One daemon's roles over one driver and one pool table: ``taker``, ``renewer`` (and its
    ``cache``), ``releaser``, ``reporter``; and the local effects the driver performs through
    them (``LocalEffects``). ``owner``: the daemon's name in the table (tests give one)."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock | None = None,
        counters: Counters | None = None,
        rng: random.Random | None = None,
        published: Published | None = None,
        owner: str | None = None,
    ) -> None:
        clock = clock or Clock()
        counters = counters or store.counters
        rng = rng or random.Random()
        rollout = RolloutMode(cfg.legacy_agents)
        strict = StrictPools()
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.counters = counters
        self.pool_table = pools = PoolTable(store, clock, rollout, published, strict)
        #: (client_id, pool_id) -> Pool: the pool table's dict, read in place
        self.pools = pools.by_id
        self.prefetch = Prefetcher(cfg, store, clock, counters, rng)
        self.driver = drv = Driver(
            cfg, store, clock, counters, rng, rollout, self, self.prefetch, strict, owner
        )
        self.renewer = renewer = Renewer(drv, pools, published)
        self.cache = cache = renewer.cache
        self.releaser = releaser = Releaser(drv, pools)
        self.reporter = reporter = Reporter(drv, pools)
        self.taker = Taker(drv, pools)
        # The local effects (``LocalEffects``), each bound once to the role that performs it.
        self.refresh: Callable[[S.Refresh], None] = renewer.refresh
        self.cache_put: Callable[[Lease, float], None] = cache.put
        self.cache_drop: Callable[[CacheKey], None] = cache.drop
        self.miss: Callable[[S.Miss], str | None] = reporter.miss
        self.relist_later: Callable[[S.RelistLater], None] = releaser.relist_later

    async def drain(self, timeout: float) -> None:
        """Shutdown: every role's tasks (the one task group), waited for at most ``timeout``."""
        await self.driver.tasks.drain(timeout)
