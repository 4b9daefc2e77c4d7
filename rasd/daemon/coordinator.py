"""The daemon's roles, composed: each made with what it needs, nothing patched in afterwards.

Theory of operation
-------------------
As KCL's lease coordinator builds its taker, renewer and refresher, :class:`Coordinator`
builds the daemon's: the pool table (``rasd.daemon.pools``), the driver
(``rasd.daemon.driver``), the renewer, which makes and keeps the lease cache
(``rasd.daemon.renewer``), the releaser, the reporter and the acquirer (``rasd.daemon.acquire``).
The server holds the coordinator and calls each role for its verbs: ``acquirer.get_lease``,
``releaser.release``, ``reporter.headroom``, and the cache's ``answer`` for the hit.

The roles and the driver need each other: the driver runs the roles' programs, and the roles
perform a few of its effects (``Refresh``, ``CachePut``, ``CacheDrop``, ``Miss``,
``RelistLater``). So :class:`~rasd.daemon.driver.Local`, a table of one function per such
effect, is made first and given to the driver, and each role's constructor fills the slots of
its own effects; no role's attribute is set from outside. The cache and the renewer need each
other too (the hit calls ``maybe_refresh``; the renewer reads the cache's staleness), so the
renewer makes the cache, handing it the pool table's dict, its set of keys being refreshed and
its ``maybe_refresh``, which the hit reads as attributes of the cache's own. The driver reads
the strict pools the pool table updates (``StrictPools``, shared as the rollout mode is);
the hit tables (``rasd.daemon.published``) come from the daemon, which pauses and closes them.
"""

from __future__ import annotations

import random

from ..config import Config
from ..core.clock import Clock
from ..dynamo.store import Store
from ..observe.metrics import Counters
from .acquire import Acquirer
from .driver import Driver, Local, RolloutMode, StrictPools
from .pools import PoolTable
from .published import Published
from .releaser import Releaser
from .renewer import Renewer
from .reporter import Reporter


class Coordinator:
    """One daemon's roles over one driver and one pool table: ``acquirer``, ``renewer`` (and its
    ``cache``), ``releaser``, ``reporter``."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock | None = None,
        counters: Counters | None = None,
        rng: random.Random | None = None,
        published: Published | None = None,
    ) -> None:
        clock = clock or Clock()
        counters = counters or store.counters
        rollout = RolloutMode(cfg.legacy_agents)
        local = Local()
        strict = StrictPools()
        self.pool_table = pools = PoolTable(store, clock, rollout, published, strict)
        self.driver = drv = Driver(
            cfg, store, clock, counters, rng or random.Random(), rollout, local, strict
        )
        self.renewer = Renewer(drv, pools, local, published)
        self.releaser = Releaser(drv, pools, local)
        self.reporter = Reporter(drv, pools, local)
        self.acquirer = Acquirer(drv, pools)
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.counters = counters
        self.cache = self.renewer.cache
        self.prefetch = drv.prefetch
        #: (client_id, pool_id) -> Pool: the pool table's dict, read in place
        self.pools = pools.by_id

    async def drain(self, timeout: float) -> None:
        """Shutdown: every role's tasks (the one task group), waited for at most ``timeout``."""
        await self.driver.tasks.drain(timeout)
