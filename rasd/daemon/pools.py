"""The pools a daemon knows (:class:`PoolTable`): each role's first question of a request.

Read at start-up and each refresh, a pool not held read once, a pool that does not exist
remembered a while in bounded number (docs/design.md, "The roles, and what each keeps").
"""

from __future__ import annotations

import asyncio

from cachetools import TTLCache

from ..core.clock import Clock
from ..core.errors import UnknownPool
from ..core.lease import Pool
from ..dynamo.store import Store
from .driver import RolloutMode, StrictPools
from .published import Published

UNKNOWN_POOL_TTL = 5.0  # seconds a pool miss is remembered (a new pool shows up after this)
UNKNOWN_POOL_MAX = 1024  # pool misses remembered at most (the oldest go first)


class PoolTable:
    """The pools a daemon knows, by (client_id, pool_id), and those known not to exist."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        rollout: RolloutMode,
        published: Published | None = None,
        strict: StrictPools | None = None,
    ) -> None:
        self.store = store
        #: the hit tables: a pool redefined or deleted leaves them at once
        self.published = published
        #: the table's rollout record, read with the pools
        self.rollout = rollout
        self.by_id: dict[tuple[str, str], Pool] = {}
        #: the strict pools, which the driver's programs read (shared with the driver)
        self.strict = strict or StrictPools()
        self._unknown: TTLCache[tuple[str, str], bool] = TTLCache(
            UNKNOWN_POOL_MAX, UNKNOWN_POOL_TTL, timer=clock.mono
        )

    async def load(self, deadline: float) -> int:
        """Read every pool definition again (the table's pool items), and the rollout record
        and signal in the same round trip: the number of pools read."""
        pools, rollout = await asyncio.gather(
            self.store.list_pools(deadline), self.store.read_rollout(deadline)
        )
        self.rollout.update(rollout)
        by_id = self.by_id
        fresh = {(p.client_id, p.pool_id): p for p in pools}
        if self.published is not None:
            for k, p in by_id.items():
                if fresh.get(k) != p:
                    self.published.drop_pool(*k)
        by_id.clear()  # in place: the roles and the cached hit hold this dict
        by_id.update(fresh)
        self._strict_changed()
        return len(pools)

    def _strict_changed(self) -> None:
        """Which pools are strict, for the driver's programs (``DaemonContext.homes``)."""
        self.strict.update(
            tuple(sorted((c, p, pool.home) for (c, p), pool in self.by_id.items() if pool.home))
        )

    async def get(self, client_id: str, pool_id: str, deadline: float) -> Pool:
        """The pool, read from the table if this daemon does not know it yet; raises
        UnknownPool for a pool that does not exist."""
        k = (client_id, pool_id)
        p = self.by_id.get(k)
        if p is not None:
            return p
        if k in self._unknown:
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        p = await self.store.get_pool(client_id, pool_id, deadline)
        if p is None:
            self._unknown[k] = True
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        self.by_id[k] = p
        if p.home:
            self._strict_changed()
        return p
