"""The daemon's roles, composed: :class:`Coordinator` makes each with what it needs, in one
pass, and binds each local effect to the role that performs it; nothing is patched in
afterwards. The order and the wiring: docs/architecture.md, "The roles of one daemon"; what
each role keeps: docs/design.md, "The roles, and what each keeps".
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..config import Config
from ..core.clock import Clock
from ..core.lease import Lease
from ..dynamo.store import Store
from ..observe.metrics import Counters
from ..steps import daemon as daemon_steps
from .acquire import Acquirer
from .cache import CacheKey
from .driver import Driver, RolloutMode, StrictPools
from .pools import PoolTable
from .prefetch import Prefetcher
from .published import Published
from .releaser import Releaser
from .renewer import Renewer
from .reporter import Reporter


class Coordinator:
    """One daemon's roles over one driver and one pool table: ``acquirer``, ``renewer`` (and its
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
        self.acquirer = Acquirer(drv, pools, cache.ends)
        # The local effects (``LocalEffects``), each bound once to the role that performs it.
        self.refresh: Callable[[daemon_steps.Refresh], None] = renewer.refresh
        self.cache_put: Callable[[Lease, float], None] = cache.put
        self.cache_drop: Callable[[CacheKey], None] = cache.drop
        self.miss: Callable[[daemon_steps.Miss], str | None] = reporter.miss
        self.relist_later: Callable[[daemon_steps.RelistLater], None] = releaser.relist_later

    async def drain(self, timeout: float) -> None:
        """Shutdown: every role's tasks (the one task group), waited for at most ``timeout``."""
        await self.driver.tasks.drain(timeout)
