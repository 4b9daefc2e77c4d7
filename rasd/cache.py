"""The daemon's lease cache: a TLRU cache where each entry dies at its lease end minus the
clock-skew margin. Only a cache: DynamoDB is the truth, a restart simply starts empty.

Time comes from the injected clock (``Clock.now_us``), so tests advance a FakeClock instead of
sleeping.
"""

from __future__ import annotations

from cachetools import TLRUCache

from .clock import Clock
from .lease import Lease, cache_until

CacheKey = tuple[str, str, str]  # (client_id, pool_id, key)


class LeaseCache:
    def __init__(self, clock: Clock, maxsize: int, skew_margin_us: int) -> None:
        self.skew_margin_us = skew_margin_us

        def ttu(_k: CacheKey, lease: Lease, now: float) -> float:
            return cache_until(lease.expires_us, skew_margin_us)

        self._c: TLRUCache[CacheKey, Lease] = TLRUCache(
            maxsize=maxsize,
            ttu=ttu,
            timer=clock.now_us,  # type: ignore[arg-type]
        )

    def get(self, k: CacheKey) -> Lease | None:
        return self._c.get(k)

    def put(self, lease: Lease) -> None:
        """Store a lease, unless it is already too close to its end to be served."""
        k = (lease.client_id, lease.pool_id, lease.key)
        current = self._c.get(k)
        if (
            current is not None
            and current.resource == lease.resource
            and current.version > lease.version
        ):
            return  # never go back to an older view of the same item
        self._c[k] = lease  # an entry already past its ttu is simply not kept

    def drop(self, k: CacheKey) -> None:
        self._c.pop(k, None)

    def __len__(self) -> int:
        self._c.expire()
        return len(self._c)

    def __contains__(self, k: CacheKey) -> bool:
        return self._c.get(k) is not None
