"""The releaser (:class:`Releaser`): a lease given back at a caller's request, and what a
give-back re-lists (docs/design.md, "The roles, and what each keeps").
"""

from __future__ import annotations

from ..steps import daemon as daemon_steps
from ..steps.give_back import release, relist
from .driver import Driver
from .pools import PoolTable


class Releaser:
    """Releases, and the re-listing of what this daemon quarantined."""

    def __init__(self, driver: Driver, pools: PoolTable) -> None:
        self.driver = driver
        self.pools = pools

    async def release(self, client_id: str, pool_id: str, key: str, deadline: float) -> int:
        """Give back the key's lease in our region (``steps.give_back.release``). Returns 1,
        or raises NotHeld."""
        pool = await self.pools.get(client_id, pool_id, deadline)
        return await self.driver.run(release, pool, key, deadline=deadline)

    def relist_later(self, eff: daemon_steps.RelistLater) -> None:
        """The ``RelistLater`` effect: re-list ``eff.ident`` once its quarantine is over."""
        drv = self.driver
        drv.tasks.detach(drv.run_bg(relist(eff.ident, eff.until_us)))
