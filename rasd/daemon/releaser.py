"""The releaser: a lease given back at a caller's request, and what a give-back re-lists.

Theory of operation
-------------------
:meth:`Releaser.release` runs ``steps.give_back.release`` within the request's deadline: the
mapping first, then the resource with quarantine (the give-back itself goes on in the
driver's task group, ``steps.give_back.free_claim``). An item this daemon quarantined is put
back in the available index once its quarantine is over (``RelistLater``:
``steps.give_back.relist``), in a task that shutdown cancels, for ``ras-liberator`` re-lists
what is left.
"""

from __future__ import annotations

from ..steps import daemon as daemon_steps
from ..steps.give_back import release, relist
from .driver import Driver, Local
from .pools import PoolTable


class Releaser:
    """Releases, and the re-listing of what this daemon quarantined."""

    def __init__(self, driver: Driver, pools: PoolTable, local: Local) -> None:
        self.driver = driver
        self.pools = pools
        local.relist_later = self.relist_later

    async def release(self, client_id: str, pool_id: str, key: str, deadline: float) -> int:
        """Give back the key's lease in our region (``steps.give_back.release``). Returns 1,
        or raises NotHeld."""
        pool = await self.pools.get(client_id, pool_id, deadline)
        return await self.driver.run(release, pool, key, deadline=deadline)

    def relist_later(self, eff: daemon_steps.RelistLater) -> None:
        """The ``RelistLater`` effect: re-list ``eff.ident`` once its quarantine is over."""
        drv = self.driver
        drv.tasks.detach(drv.run_bg(relist(eff.ident, eff.until_us)))
