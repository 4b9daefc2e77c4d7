"""get_lease, release and headroom: the daemon's lease logic around cache, prefetch and store.

Theory of operation
-------------------
``try_hit`` is the hot path and never awaits: a cached lease is answered at once, and if the
caller's sliding ``lease_expires`` calls for it (``lease.should_extend``) an extension is
started in the background (refresh-ahead), so the caller is still served from the cache.

A miss goes through ``get_lease``, which makes concurrent requests for one
(client, pool, key) share one resolution (single-flight), then:

1. one Query on ``leased_resources``: a live lease (any region) is cached and returned; an
   expired, not yet liberated lease of our region is re-let to the same key;
2. otherwise a new lease: the per-key acquisition lock (``lease.take_acq_lock``) and the claim
   of a prefetched candidate go out *together*, so an uncontended new lease costs the Query
   plus one round trip. If another daemon holds the lock, our claim (if it won) is released
   in the background and we wait for that daemon's lease to appear. A lost claim is a normal
   outcome: take the next candidate.

Only our region's items are ever written; another region's lease is returned as it is.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from .cache import CacheKey, LeaseCache
from .clock import Clock
from .config import Config
from .errors import BadRequest, Busy, NoCapacity, NotHeld, RasdError, Timeout, UnknownPool
from .lease import (
    US,
    Item,
    Lease,
    Pool,
    ResourceItem,
    acq_key,
    check_expiry,
    claim,
    claim_verdict,
    drop_acq_lock,
    extend,
    lease_from_item,
    miss_report_update,
    parse_time,
    partition_name,
    pick,
    release,
    relet,
    should_extend,
    take_acq_lock,
)
from .limits import BucketTable
from .metrics import Counters
from .prefetch import Prefetcher
from .store import Store

log = structlog.get_logger("rasd.acquire")

UNKNOWN_POOL_TTL = 5.0  # seconds a pool miss is remembered (a new pool shows up after this)
HEADROOM_TTL = 10.0
HEADROOM_STALE = 900.0  # seconds: three missed 5-minute balancer runs
EXTEND_DEADLINE = 5.0
LOCK_WAIT_FIRST = 0.005


class Acquirer:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock | None = None,
        counters: Counters | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = cfg
        self.region = cfg.region
        self.store = store
        self.clock = clock or Clock()
        self.counters = counters or store.counters
        self.rng = rng or random.Random()
        self.cache = LeaseCache(self.clock, cfg.cache_max_leases, int(cfg.skew_margin * US))
        self.prefetch = Prefetcher(cfg, store, self.clock, self.counters, self.rng)
        self.pools: dict[tuple[str, str], Pool] = {}
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{self.rng.getrandbits(32):08x}"
        # Each daemon extends at a slightly different point, so a fleet does not write at once.
        self.extend_fraction = cfg.extend_fraction * self.rng.uniform(0.9, 1.0)
        self._unknown: dict[tuple[str, str], float] = {}
        self._flights: dict[CacheKey, asyncio.Task[tuple[Lease, bool]]] = {}
        self._extending: set[CacheKey] = set()
        self._headroom: dict[tuple[str, str], tuple[float, int]] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self.buckets: BucketTable[tuple[str, str]] = BucketTable(cfg.rate_limit, cfg.rate_burst)
        self._extend_after: dict[CacheKey, tuple[float, int]] = {}  # backoff after failures
        self._misses: dict[tuple[str, str], int] = {}  # NO_CAPACITY answers not yet reported

    # ------------------------------------------------------------------------ pools
    async def load_pools(self, deadline: float) -> int:
        pools = await self.store.list_pools(deadline)
        self.pools = {(p.client_id, p.pool_id): p for p in pools}
        return len(pools)

    async def pool(self, client_id: str, pool_id: str, deadline: float) -> Pool:
        k = (client_id, pool_id)
        p = self.pools.get(k)
        if p is not None:
            return p
        if self._unknown.get(k, 0.0) > self.clock.mono():
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        p = await self.store.get_pool(client_id, pool_id, deadline)
        if p is None:
            self._unknown[k] = self.clock.mono() + UNKNOWN_POOL_TTL
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        self.pools[k] = p
        return p

    def _check(self, pool: Pool, requested_us: int, now_us: int) -> None:
        why = check_expiry(requested_us, now_us, pool.max_lease_us)
        if why:
            raise BadRequest(why)

    # --------------------------------------------------------------------- hot path
    def try_hit(self, client_id: str, pool_id: str, key: str, requested_us: int) -> Lease | None:
        """Answer from the cache, or None. Never awaits and never touches DynamoDB.
        (The server counts hits and misses: this is also called again after a miss.)"""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        self._check(pool, requested_us, self.clock.now_us())
        k = (client_id, pool_id, key)
        lease = self.cache.get(k)
        if lease is None:
            return None
        self._maybe_extend(lease, requested_us)
        return lease

    async def get_lease(
        self, client_id: str, pool_id: str, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        """The lease for ``key`` and whether this call acquired it."""
        pool = await self.pool(client_id, pool_id, deadline)
        hit = self.try_hit(client_id, pool_id, key, requested_us)
        if hit is not None:
            return hit, False
        k = (client_id, pool_id, key)
        flight = self._flights.get(k)
        if flight is not None:
            self.counters.inc("singleflight.joined")
            lease, _ = await asyncio.shield(flight)
            return lease, False
        task = asyncio.get_running_loop().create_task(
            self._resolve(pool, key, requested_us, deadline)
        )
        self._flights[k] = task
        task.add_done_callback(lambda t: self._flight_done(k, t))
        return await asyncio.shield(task)

    def _flight_done(self, k: CacheKey, task: asyncio.Task[tuple[Lease, bool]]) -> None:
        self._flights.pop(k, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up already

    # ------------------------------------------------------------------ resolution
    async def _resolve(
        self, pool: Pool, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        wait = LOCK_WAIT_FIRST
        lock_key = acq_key(pool.client_id, pool.pool_id, self.region, key)
        while True:
            # The key's lock is read together with the index (same round trip): it tells a
            # lease from a lock loser's claim that is being given back (docs/design.md).
            items, lock = await asyncio.gather(
                self.store.query_key(pool.client_id, pool.pool_id, key, deadline),
                self.store.get_lock(lock_key, deadline),
            )
            now = self.clock.now_us()
            standing: list[ResourceItem] = []
            undecided = False
            for it in items:
                if it.expired(now):
                    continue
                verdict = self._verdict(it, lock, now)
                if verdict:
                    standing.append(it)
                elif verdict is None:
                    undecided = True
                else:
                    self.counters.inc("acq.loser_claim_skipped")
            chosen = pick(standing)
            if chosen is not None and not undecided:
                lease = lease_from_item(chosen)
                self.cache.put(lease)
                self.counters.inc("lease.existing")
                self._maybe_extend(lease, requested_us)
                return lease, False
            if chosen is None and not undecided and not self._lock_held_by_other(lock, now):
                expired_mine = pick(
                    [it for it in items if it.region == self.region and it.expired(now)]
                )
                if expired_mine is not None:
                    upd = relet(lease_from_item(expired_mine), requested_us, now, self.region)
                    got = await self.store.update(upd, deadline)
                    if got is not None:
                        lease = lease_from_item(got)
                        self.cache.put(lease)
                        self.counters.inc("lease.relet")
                        return lease, True
                    continue  # someone changed it under us: read again
                acquired = await self._acquire_new(pool, key, requested_us, deadline)
                if acquired is not None:
                    return acquired, True
            # Another daemon of this region is acquiring this key: its lease will show up.
            self.counters.inc("acq.waits")
            if time.monotonic() + wait >= deadline:
                raise Timeout("another daemon is acquiring this key; deadline passed")
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.1)

    def _verdict(self, item: ResourceItem, lock: Item | None, now_us: int) -> bool | None:
        if item.region != self.region or item.claimed_by == self.owner:
            return True  # other regions have their own locks; our own claims we know
        fresh_us = int((self.cfg.acq_lock_hold + self.cfg.skew_margin) * US)
        return claim_verdict(item, lock, now_us, fresh_us)

    def _lock_held_by_other(self, lock: Item | None, now_us: int) -> bool:
        """Someone else is acquiring this key right now: do not race them with a claim."""
        if lock is None or lock.get("lock_owner", {}).get("S") == self.owner:
            return False
        until = lock.get("lock_expires", {}).get("S")
        return until is not None and parse_time(until) >= now_us

    async def _acquire_new(
        self, pool: Pool, key: str, requested_us: int, deadline: float
    ) -> Lease | None:
        wait = self.buckets.try_take((pool.client_id, pool.pool_id), self.clock.mono())
        if wait > 0:
            self.counters.inc("shed.rate_limited")
            raise Busy(
                f"acquisition rate limit of pool {pool.pool_id!r} reached",
                retry_after=round(wait, 3),
            )
        cand = await self.prefetch.candidate(pool, deadline)
        if cand is None:
            raise self._no_capacity(pool)
        now = self.clock.now_us()
        hold = int(self.cfg.acq_lock_hold * US)
        lock = take_acq_lock(pool.client_id, pool.pool_id, self.region, key, self.owner, now, hold)
        lock_res, claim_res = await asyncio.gather(
            self.store.update_raw(lock, deadline),
            self._claim(cand.item, key, requested_us, now, deadline),
            return_exceptions=True,
        )
        if lock_res is not True:
            if isinstance(claim_res, ResourceItem):  # we won a claim we must not keep
                # Give it back before polling for the winner's lease: our next Query would
                # otherwise find this claim and hand it out while the undo frees it. Shielded:
                # the undo goes on (and retries) even if this request is cancelled.
                await asyncio.shield(self.spawn(self._undo_claim(lease_from_item(claim_res))))
            if isinstance(lock_res, BaseException):
                raise lock_res
            self.counters.inc("acq.lock_busy")
            return None
        if isinstance(claim_res, BaseException):
            raise claim_res
        while claim_res is None:
            self.counters.inc("prefetch.conflicts")
            cand = await self.prefetch.candidate(pool, deadline)
            if cand is None:
                raise self._no_capacity(pool)
            claim_res = await self._claim(
                cand.item, key, requested_us, self.clock.now_us(), deadline
            )
        lease = lease_from_item(claim_res)
        self.cache.put(lease)
        self.counters.inc("lease.new")
        return lease

    async def _claim(
        self, item: ResourceItem, key: str, requested_us: int, now_us: int, deadline: float
    ) -> ResourceItem | None:
        upd = claim(item, key, requested_us, now_us, self.region, self.owner)
        nv = item.version + 1

        def ours(cur: ResourceItem) -> bool:  # our own earlier attempt landed
            return cur.version == nv and cur.key == key and cur.claimed_by == self.owner

        return await self.store.update(upd, deadline, ours)

    def _no_capacity(self, pool: Pool) -> NoCapacity:
        self.counters.inc("lease.no_capacity")
        k = (pool.client_id, pool.pool_id)
        self._misses[k] = self._misses.get(k, 0) + 1
        return NoCapacity(f"no free resource in pool {pool.pool_id!r} in {self.region}")

    async def flush_misses(self, deadline: float) -> None:
        """Write the NO_CAPACITY answers since the last report to our miss counter items."""
        misses, self._misses = self._misses, {}
        for (client_id, pool_id), n in misses.items():
            upd = miss_report_update(
                client_id, pool_id, self.region, self.owner, n, self.clock.now_us()
            )
            try:
                await self.store.update_raw(upd, deadline)
                self.counters.inc("misses.reported", n)
            except RasdError:
                self._misses[(client_id, pool_id)] = self._misses.get((client_id, pool_id), 0) + n
                raise

    async def report_misses_forever(self) -> None:
        """Unmet demand never reaches the stream, so report it for the balancer: at most one
        write per pool every ``miss_report_interval`` seconds, and only when there were misses."""
        while True:
            await asyncio.sleep(self.cfg.miss_report_interval)
            if self._misses:
                try:
                    await self.flush_misses(time.monotonic() + 5.0)
                except RasdError as exc:
                    log.warning("miss_report_failed", error=str(exc))

    async def _undo_claim(self, lease: Lease) -> None:
        """Release a claim made alongside a lock we did not get. Retried for about a minute:
        until it lands, the key holds two resources in this region (ras-dedupe's job if we
        die first; see docs/design.md)."""
        for attempt in range(6):
            try:
                got = await self.store.update(
                    release(lease, self.clock.now_us(), self.region),
                    time.monotonic() + EXTEND_DEADLINE,
                )
                self.counters.inc("acq.undone" if got else "acq.undo_lost")
                return
            except RasdError as exc:
                self.counters.inc("acq.undo_errors")
                log.error(
                    "speculative_claim_not_undone",
                    client_id=lease.client_id,
                    pool_id=lease.pool_id,
                    key=lease.key,
                    resource=lease.resource,
                    attempt=attempt + 1,
                    error=str(exc),
                )
                await asyncio.sleep(min(2.0**attempt, 16.0))

    # ------------------------------------------------------------------ extension
    def _maybe_extend(self, lease: Lease, requested_us: int) -> None:
        if lease.region != self.region:
            return  # another region's lease: returned as it is, never written by us
        if not should_extend(lease, requested_us, self.clock.now_us(), self.extend_fraction):
            return
        k = (lease.client_id, lease.pool_id, lease.key)
        if k in self._extending:
            return
        backoff = self._extend_after.get(k)
        if backoff is not None and self.clock.mono() < backoff[0]:
            return  # the last attempt failed: retry later, not on every hit
        self._extending.add(k)
        self.spawn(self._extend(lease, requested_us, k))

    async def _extend(self, lease: Lease, requested_us: int, k: CacheKey) -> None:
        deadline = time.monotonic() + EXTEND_DEADLINE
        try:
            got = await self.store.update(extend(lease, requested_us, self.region), deadline)
            self._extend_after.pop(k, None)
            if got is not None:
                self.cache.put(lease_from_item(got))
                self.counters.inc("lease.extended")
                return
            # Lost: someone else extended, released or liberated it. Re-read the truth.
            self.counters.inc("lease.extend_conflicts")
            items = await self.store.query_key(lease.client_id, lease.pool_id, lease.key, deadline)
            now = self.clock.now_us()
            chosen = pick([it for it in items if not it.expired(now)])
            if chosen is None:
                self.cache.drop(k)
            else:
                self.cache.put(lease_from_item(chosen))
        except RasdError as exc:
            # Retried on a later cache hit after a backoff (1, 2, 4 ... 30 s), until the lease
            # leaves the cache; a lease that gets close to its end is logged as at risk.
            self.counters.inc("lease.extend_errors")
            failures = self._extend_after.get(k, (0.0, 0))[1] + 1
            retry_in = min(30.0, 2.0 ** (failures - 1))
            self._extend_after[k] = (self.clock.mono() + retry_in, failures)
            if len(self._extend_after) > 10_000:
                self._extend_after.pop(next(iter(self._extend_after)))
            left = (lease.expires_us - self.clock.now_us()) / US
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
        finally:
            self._extending.discard(k)

    # -------------------------------------------------------------------- release
    async def release(self, client_id: str, pool_id: str, key: str, deadline: float) -> int:
        """Free every item of our region that ``key`` holds in the pool. Returns the count."""
        pool = await self.pool(client_id, pool_id, deadline)
        k = (client_id, pool_id, key)
        self.cache.drop(k)
        released = 0
        for _ in range(3):
            items = await self.store.query_key(client_id, pool_id, key, deadline)
            mine = [it for it in items if it.region == self.region]
            if not mine:
                break
            lost = False
            for it in mine:
                now = self.clock.now_us()
                got = await self.store.update(
                    release(lease_from_item(it), now, self.region),
                    deadline,
                    _freed_at(it.version + 1),
                )
                if got is None:
                    lost = True
                    continue
                released += 1
                self.prefetch.give_back(pool, got)
            if not lost:
                break
        self.cache.drop(k)
        if released:
            self.counters.inc("lease.released", released)
            upd = drop_acq_lock(
                client_id, pool_id, self.region, key, self.owner, self.clock.now_us()
            )
            self.spawn(self.store.update_raw(upd, time.monotonic() + EXTEND_DEADLINE))
            return released
        others = sorted({it.region for it in items if it.region != self.region})
        if others:
            raise NotHeld(f"{key!r} holds no lease in {self.region} (held in {', '.join(others)})")
        raise NotHeld(f"{key!r} holds no lease in pool {pool_id!r}")

    # ------------------------------------------------------------------- headroom
    async def headroom(self, client_id: str, pool_id: str, deadline: float) -> int:
        """Free resources of the pool in our region: the balancer's estimate when it has
        written one, else a count of the available index, cached for HEADROOM_TTL."""
        pool = await self.pool(client_id, pool_id, deadline)
        k = (pool.client_id, pool.pool_id)
        now = self.clock.mono()
        cached = self._headroom.get(k)
        if cached is not None and cached[0] > now:
            return cached[1]
        meta = await self.store.get_meta(f"headroom#{client_id}#{pool_id}#{self.region}", deadline)
        if meta is not None and "headroom" in meta and self._fresh(meta):
            # free minus the demand projected over the next 10 minutes; a projected shortfall
            # is reported as 0 (no spare resources), never as a negative count.
            value = max(0, int(float(meta["headroom"]["N"])))
        else:
            counts = await asyncio.gather(
                *(
                    self.store.count_available(
                        partition_name(client_id, pool_id, self.region, n), deadline
                    )
                    for n in range(10)
                )
            )
            value = sum(counts)
        self._headroom[k] = (now + HEADROOM_TTL, value)
        return value

    def _fresh(self, meta: dict[str, Any]) -> bool:
        """A balancer figure older than HEADROOM_STALE (three missed runs) is not trusted."""
        updated = meta.get("updated", {}).get("S")
        if not updated:
            return False
        try:
            return self.clock.now_us() - parse_time(updated) < HEADROOM_STALE * US
        except ValueError:
            return False

    # ----------------------------------------------------------------- background
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg_done)
        return task

    def _bg_done(self, task: asyncio.Task[Any]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.counters.inc("background.errors")
            log.warning("background_task_failed", error=repr(task.exception()))

    async def drain(self, timeout: float) -> None:
        pending = set(self._bg) | set(self._flights.values())
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for t in set(self._bg):
            t.cancel()


def _freed_at(version: int) -> Callable[[ResourceItem], bool]:
    """Does the item show our release (for a release retried after an ambiguous error)?"""
    return lambda cur: cur.version == version and cur.key is None
