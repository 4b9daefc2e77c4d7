"""The daemon's lease cache. Only a cache: DynamoDB is the truth, a restart starts empty.

Theory of operation
-------------------
An entry is served until the earlier of (docs/design.md, I3):

* ``confirmed + S`` (``confirm_interval``): S after the daemon last confirmed the answer, by
  its own successful write or a strongly consistent read (the time the request was *sent*);
* ``lease_expires - skew_margin``: never close to the lease's end.

So a resource released, deduplicated or given back through another host stops being served
here at most S after this daemon last confirmed it, and every early free keeps the resource
unclaimable for a quarantine longer than S plus the clock skew. ``stale(k, now)`` tells the
server to re-confirm a hit in the background once half of S has passed, so busy keys never
drop out of the cache.

``cachetools.TLRUCache`` does the per-entry expiry and the size bound, on the monotonic clock
(confirmation ages must not jump with the wall clock). Time comes from the injected clock, so
tests advance a FakeClock instead of sleeping.
"""

from __future__ import annotations

from cachetools import TLRUCache

from .clock import Clock
from .lease import US, Lease

CacheKey = tuple[str, str, str]  # (client_id, pool_id, key)
_Entry = tuple[Lease, float, float]  # lease, confirmed (mono s), valid until (mono s)


class LeaseCache:
    def __init__(self, clock: Clock, maxsize: int, skew_margin_us: int, confirm_s: float) -> None:
        self.clock = clock
        self.skew_margin_us = skew_margin_us
        self.confirm_s = confirm_s

        def ttu(_k: CacheKey, e: _Entry, now: float) -> float:
            return e[2]

        self._c: TLRUCache[CacheKey, _Entry] = TLRUCache(maxsize=maxsize, ttu=ttu, timer=clock.mono)

    def get(self, k: CacheKey) -> Lease | None:
        e = self._c.get(k)
        return e[0] if e is not None else None

    def confirmed_at(self, k: CacheKey) -> float | None:
        e = self._c.get(k)
        return e[1] if e is not None else None

    def stale(self, k: CacheKey, now: float) -> bool:
        """Past half of S since the last confirmation: re-confirm in the background."""
        e = self._c.get(k)
        return e is not None and now - e[1] > self.confirm_s / 2

    def put(self, lease: Lease, confirmed: float) -> None:
        """Store a lease confirmed at monotonic time ``confirmed`` (when the read or write that
        confirmed it was sent). An older confirmation never replaces a newer one; an entry
        already past its validity is simply not kept."""
        k = (lease.client_id, lease.pool_id, lease.key)
        current = self._c.get(k)
        if current is not None and current[1] > confirmed:
            return
        left_s = (lease.expires_us - self.skew_margin_us - self.clock.now_us()) / US
        until = min(confirmed + self.confirm_s, self.clock.mono() + left_s)
        self._c[k] = (lease, confirmed, until)

    def drop(self, k: CacheKey) -> None:
        self._c.pop(k, None)

    def __len__(self) -> int:
        self._c.expire()
        return len(self._c)

    def __contains__(self, k: CacheKey) -> bool:
        return self._c.get(k) is not None
