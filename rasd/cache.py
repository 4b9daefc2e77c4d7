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

Layout (compact: about a third of the bytes of a TLRU cache per lease): per client and pool a
plain dict ``key -> (lease, confirmed, valid_until)``, the key string being the lease's own.
Validity is checked on read, against the monotonic time the caller passes in (confirmation
ages must not jump with the wall clock); an entry past it is dropped when read. The size bound
is kept cheaply: a ``put`` that finds ``maxsize`` entries first drops every expired entry and,
if that is not enough, the oldest eighth of each pool (dicts keep insertion order, and a put
re-inserts its key at the end, so "oldest" is "confirmed longest ago"). Time comes from the
injected clock or the caller, so tests advance a FakeClock instead of sleeping.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from .clock import Clock
from .lease import US, Lease

CacheKey = tuple[str, str, str]  # (client_id, pool_id, key)
#: lease, confirmed (mono s), valid until (mono s)
Entry = tuple[Lease, float, float]
_Pool = dict[str, Entry]
_canon = sys.intern


class LeaseCache:
    __slots__ = ("_n", "_pools", "clock", "confirm_s", "half_s", "maxsize", "skew_margin_us")

    def __init__(self, clock: Clock, maxsize: int, skew_margin_us: int, confirm_s: float) -> None:
        self.clock = clock
        self.maxsize = maxsize
        self.skew_margin_us = skew_margin_us
        self.confirm_s = confirm_s
        self.half_s = confirm_s / 2
        #: client_id -> pool_id -> key -> entry
        self._pools: dict[str, dict[str, _Pool]] = {}
        self._n = 0  # entries held, expired ones included until they are dropped

    # ------------------------------------------------------------------------- hot path
    def entry(self, client_id: str, pool_id: str, key: str, now: float) -> Entry | None:
        """The entry valid at monotonic time ``now``, or None. No allocation on a hit."""
        pools = self._pools.get(client_id)
        if pools is None:
            return None
        d = pools.get(pool_id)
        if d is None:
            return None
        e = d.get(key)
        if e is None:
            return None
        if now < e[2]:
            return e
        del d[key]
        self._n -= 1
        return None

    # ---------------------------------------------------------------------- by CacheKey
    def get(self, k: CacheKey, now: float | None = None) -> Lease | None:
        e = self.entry(k[0], k[1], k[2], self.clock.mono() if now is None else now)
        return e[0] if e is not None else None

    def confirmed_at(self, k: CacheKey) -> float | None:
        e = self.entry(k[0], k[1], k[2], self.clock.mono())
        return e[1] if e is not None else None

    def stale(self, k: CacheKey, now: float) -> bool:
        """Past half of S since the last confirmation: re-confirm in the background."""
        e = self.entry(k[0], k[1], k[2], now)
        return e is not None and now - e[1] > self.half_s

    def put(self, lease: Lease, confirmed: float) -> None:
        """Store a lease confirmed at monotonic time ``confirmed`` (when the read or write that
        confirmed it was sent). An older confirmation never replaces a newer one; an entry
        already past its validity is simply not kept."""
        now = self.clock.mono()
        pools = self._pools.get(lease.client_id)
        if pools is None:
            pools = self._pools[lease.client_id] = {}
        d = pools.get(lease.pool_id)
        if d is None:
            d = pools[lease.pool_id] = {}
        key = lease.key
        # One string object per client, pool and region for all their leases (each DynamoDB
        # response brings fresh copies): about 150 bytes less per cached lease.
        client_id, pool_id, region = (
            _canon(lease.client_id),
            _canon(lease.pool_id),
            _canon(lease.region),
        )
        if (
            client_id is not lease.client_id
            or pool_id is not lease.pool_id
            or region is not lease.region
        ):
            lease = replace(lease, client_id=client_id, pool_id=pool_id, region=region)
        current = d.get(key)
        if current is not None and current[1] > confirmed and now < current[2]:
            return
        left_s = (lease.expires_us - self.skew_margin_us - self.clock.now_us()) / US
        until = min(confirmed + self.confirm_s, now + left_s)
        if current is not None:
            del d[key]  # re-inserted at the end: eviction goes oldest confirmation first
            self._n -= 1
        if until <= now:
            return
        if self._n >= self.maxsize:
            self._make_room(now)
        d[key] = (lease, confirmed, until)
        self._n += 1

    def drop(self, k: CacheKey) -> None:
        d = self._pools.get(k[0], {}).get(k[1])
        if d is not None and d.pop(k[2], None) is not None:
            self._n -= 1

    # ------------------------------------------------------------------------- upkeep
    def purge(self, now: float) -> int:
        """Drop every entry past its validity; returns how many are left."""
        n = 0
        for pools in self._pools.values():
            for pid, d in list(pools.items()):
                dead = [k for k, e in d.items() if e[2] <= now]
                for k in dead:
                    del d[k]
                n += len(d)
                if not d:
                    del pools[pid]
        self._n = n
        return n

    def _make_room(self, now: float) -> None:
        if self.purge(now) < self.maxsize:
            return
        for pools in self._pools.values():
            for d in pools.values():
                drop = max(1, len(d) // 8)
                for k in [k for k, _ in zip(d, range(drop), strict=False)]:
                    del d[k]
                    self._n -= 1

    def size(self) -> int:
        """Entries held, expired ones not yet dropped included (cheap: for gauges)."""
        return self._n

    def __len__(self) -> int:
        return self.purge(self.clock.mono())

    def __contains__(self, k: CacheKey) -> bool:
        return self.get(k) is not None
