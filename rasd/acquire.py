"""get_lease, release and headroom: the driver around the protocol's pure decisions.

Theory of operation
-------------------
``try_hit`` is the hot path and never awaits: a cached lease is answered at once. The cache
holds each answer at most ``confirm_interval`` (S) after it was last confirmed; a hit past S/2
starts a background re-confirmation (one consistent read), and a hit whose sliding
``lease_expires`` calls for it (``decide.should_extend``) starts a background extension.

A miss goes through ``get_lease``, which makes concurrent requests for one
(client, pool, key) share one resolution (single-flight). The resolution reads the key's
mapping items (one strongly consistent Query) and does what ``rasd.core.decide`` says:

* serve a live lease (one round trip for an uncached existing lease);
* verify a pending one against its resource item, wait for its acquirer, or fence it;
* acquire: the mapping write and the claim of a prefetched candidate go out together (one
  round trip after the read), and ``decide.after_acquire`` says what their outcomes mean.

This module decides nothing itself: every branch is a decision of ``rasd.core.decide``, which the
protocol checker (``check/``) explores. docs/design.md argues the invariants.
Only our region's items are ever written; another region's lease is served as it is.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import time
from collections.abc import Coroutine
from typing import Any

import structlog
from cachetools import TTLCache

from .cache import HEAD, CacheKey, LeaseCache, lease_of
from .config import Config
from .core.builders import miss_report_update
from .core.clock import Clock
from .core.decide import check_expiry, should_extend
from .core.errors import BadRequest, RasdError, Timeout, UnknownPool
from .core.lease import US, Lease, Pool, headroom_resource, partition_name
from .core.serialize import headroom_from_ddb
from .limits import BucketTable
from .observe.metrics import Counters
from .prefetch import Prefetcher
from .protocol import ID_PACK
from .steps import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Program,
    QueryLeased,
    QueryMappings,
    Send,
    Sleep,
    Spawn,
    Together,
    drive,
)
from .steps import daemon as S
from .steps.daemon import BACKGROUND_DEADLINE
from .store import Store

log = structlog.get_logger("rasd.acquire")

UNKNOWN_POOL_TTL = 5.0  # seconds a pool miss is remembered (a new pool shows up after this)
UNKNOWN_POOL_MAX = 1024  # pool misses remembered at most (the oldest go first)
HEADROOM_TTL = 10.0
HEADROOM_STALE = 900.0  # seconds: three missed 5-minute balancer runs
#: seconds between two reads of the wall clock on the hit path (Acquirer.wall_us)
WALL_RESYNC = 0.25


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
        self.rules = cfg.rules()
        self.region = cfg.region
        self.store = store
        self.clock = clock or Clock()
        self.counters = counters or store.counters
        self.rng = rng or random.Random()
        self.cache = LeaseCache(
            self.clock,
            cfg.cache_max_leases,
            int(cfg.skew_margin * US),
            cfg.confirm_interval,
            cfg.region,
        )
        self.prefetch = Prefetcher(cfg, store, self.clock, self.counters, self.rng)
        self.pools: dict[tuple[str, str], Pool] = {}
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{self.rng.getrandbits(32):08x}"
        # Each daemon extends at a slightly different point, so a fleet does not write at once.
        self.extend_fraction = cfg.extend_fraction * self.rng.uniform(0.9, 1.0)
        # Pools asked for that do not exist, remembered UNKNOWN_POOL_TTL: bounded, so a caller
        # cycling through made-up pool names cannot grow the daemon.
        self._unknown: TTLCache[tuple[str, str], bool] = TTLCache(
            UNKNOWN_POOL_MAX, UNKNOWN_POOL_TTL, timer=self.clock.mono
        )
        self._flights: dict[CacheKey, asyncio.Task[tuple[Lease, bool]]] = {}
        self._refreshing: set[CacheKey] = set()
        self._headroom: dict[tuple[str, str], tuple[float, int]] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self._relists: set[asyncio.Task[None]] = set()  # quarantines to end (not drained)
        self.buckets: BucketTable[tuple[str, str]] = BucketTable(cfg.rate_limit, cfg.rate_burst)
        self._extend_after: dict[CacheKey, tuple[float, int]] = {}  # backoff after failures
        self._misses: dict[tuple[str, str], int] = {}  # NO_CAPACITY answers not yet reported
        self._wall_synced = -math.inf
        self._wall_offset_us = 0

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
        if k in self._unknown:
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        p = await self.store.get_pool(client_id, pool_id, deadline)
        if p is None:
            self._unknown[k] = True
            raise UnknownPool(f"no pool {pool_id!r} for client {client_id!r}")
        self.pools[k] = p
        return p

    def _check(self, pool: Pool, requested_us: int, now_us: int) -> None:
        why = check_expiry(requested_us, now_us, pool.max_lease_us)
        if why:
            raise BadRequest(why)

    # --------------------------------------------------------------------- hot path
    def wall_us(self, mono: float) -> int:
        """Wall time (microseconds) at monotonic time ``mono``, from an offset read again
        once WALL_RESYNC has passed: a hit reads no clock but the one its request read. Only
        for checks that tolerate a fraction of a second (the requested lease end, when to
        extend); cache validity runs on the monotonic clock alone (docs/design.md, I3)."""
        if not 0 <= mono - self._wall_synced < WALL_RESYNC:
            self._wall_synced = mono
            self._wall_offset_us = self.clock.now_us() - int(mono * US)
        return int(mono * US) + self._wall_offset_us

    def try_hit(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float | None = None,
    ) -> Lease | None:
        """The full path's cache hit: the cached Lease when :meth:`hit_answer` would answer,
        else None; raises BadRequest when the pool refuses the lease end. Never awaits and
        never touches DynamoDB. ``now``: the request's monotonic time (read once by the
        server). (The server counts hits and misses: this is also called again after a miss.)"""
        if now is None:
            now = self.clock.mono()
        if self.hit_answer(client_id, pool_id, key, requested_us, now, 0) is None:
            pool = self.pools.get((client_id, pool_id))
            if pool is not None:
                self._check(pool, requested_us, self.wall_us(now))  # a refused end, named
            return None
        return self.cache.get((client_id, pool_id, key), now)

    def hit_answer(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float,
        req_id: int,
    ) -> bytes | None:
        """What the cache answers a get_lease at monotonic time ``now``, for both paths (the
        full path through :meth:`try_hit`): the whole answer frame for request ``req_id``
        (0 <= req_id <= protocol.ID_MAX), or None when this is not a plain hit (no pool, a
        lease end the pool refuses, no valid entry). Starts the background work a hit calls
        for: a re-confirmation past S/2, an extension when the caller asks for more than the
        lease has (``_maybe_refresh``); the Lease is rebuilt only then. Otherwise allocates
        only the answer."""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        if 0 <= now - self._wall_synced < WALL_RESYNC:
            now_us = int(now * US) + self._wall_offset_us
        else:
            now_us = self.wall_us(now)
        if not 0 < requested_us - now_us <= pool.max_lease_us:  # check_expiry, inlined
            return None
        r = self.cache.read(client_id, pool_id, key, now)
        if r is None:
            return None
        e, confirmed, extend_from_us, end = r
        if now - confirmed > self.cache.half_s or requested_us > extend_from_us:
            k = (client_id, pool_id, key)
            if k not in self._refreshing:
                self._maybe_refresh(k, lease_of(client_id, pool_id, key, e), requested_us, now_us)
        return e[HEAD:end] + ID_PACK(req_id)

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
    def steps_daemon(self) -> S.Daemon:
        """This daemon as its programs see it (read at each program's start: tests rename
        the owner)."""
        return S.Daemon(self.region, self.owner, self.rules, self.cfg.legacy_agents)

    async def _resolve(
        self, pool: Pool, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        prog = S.resolve(self.steps_daemon(), pool, key, requested_us)
        return await drive(prog, _Run(self, deadline).perform)

    def _new_token(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def _no_capacity(self, pool: Pool) -> None:
        k = (pool.client_id, pool.pool_id)
        self._misses[k] = self._misses.get(k, 0) + 1

    def _relist_later(self, ident: tuple[str, str], until_us: int) -> None:
        task = asyncio.get_running_loop().create_task(self._run_bg(S.relist(ident, until_us)))
        self._relists.add(task)
        task.add_done_callback(self._relists.discard)

    async def _run_bg(self, prog: Program[Any]) -> Any:
        """Run a background program: its own deadline, not bound to a request."""
        return await drive(prog, _Run(self, time.monotonic() + BACKGROUND_DEADLINE).perform)

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

    # ------------------------------------------------------- extension and re-confirmation
    def _maybe_refresh(self, k: CacheKey, lease: Lease, requested_us: int, now_us: int) -> None:
        """After a hit: extend a sliding lease that needs it, else re-confirm a stale answer."""
        if k in self._refreshing:
            return
        if (
            lease.region == self.region
            and lease.token is not None
            and should_extend(lease, requested_us, now_us, self.extend_fraction)
        ):
            backoff = self._extend_after.get(k)
            if backoff is not None and self.clock.mono() < backoff[0]:
                return  # the last attempt failed: retry later, not on every hit
            self._refreshing.add(k)
            self.spawn(self._extend_bg(k, lease, requested_us))
        elif self.cache.stale(k, self.clock.mono()):
            self._refreshing.add(k)
            self.spawn(self._reconfirm(k, lease))

    async def _extend_bg(self, k: CacheKey, lease: Lease, requested_us: int) -> None:
        try:
            error = await self._run_bg(S.extend_bg(self.steps_daemon(), lease, requested_us))
            if error is None:
                self._extend_after.pop(k, None)
            else:
                self._extension_failed(k, lease, error)
        finally:
            self._refreshing.discard(k)

    def _extension_failed(self, k: CacheKey, lease: Lease, exc: RasdError) -> None:
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

    async def _reconfirm(self, k: CacheKey, lease: Lease) -> None:
        """A cached answer is past S/2: read the mapping again (``steps.daemon.reconfirm``)."""
        try:
            pool = self.pools.get((k[0], k[1]))
            if pool is None:
                return
            await self._run_bg(S.reconfirm(self.steps_daemon(), pool, lease))
        finally:
            self._refreshing.discard(k)

    # -------------------------------------------------------------------- release
    async def release(self, client_id: str, pool_id: str, key: str, deadline: float) -> int:
        """Give back the key's lease in our region (``steps.daemon.release``). Returns 1, or
        raises NotHeld."""
        pool = await self.pool(client_id, pool_id, deadline)
        prog = S.release(self.steps_daemon(), pool, key)
        return await drive(prog, _Run(self, deadline).perform)

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
        meta = await self.store.get_meta(
            headroom_resource(client_id, pool_id, self.region), deadline
        )
        value: int | None = None
        if meta is not None and "headroom" in meta:
            spare, updated = headroom_from_ddb(meta)
            # trusted only while fresh: not after three missed 5-minute balancer runs
            if updated is not None and self.clock.now_us() - updated < HEADROOM_STALE * US:
                value = spare
        if value is None:
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
        for t in set(self._relists):
            t.cancel()  # ras-liberator re-lists what is left
        pending = set(self._bg) | set(self._flights.values())
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for t in set(self._bg):
            t.cancel()


class _Run:
    """One program's run in this daemon: performs its effects (``rasd.steps`` and
    ``rasd.steps.daemon``) with its deadline (monotonic seconds)."""

    __slots__ = ("acq", "deadline", "refill")

    def __init__(self, acq: Acquirer, deadline: float) -> None:
        self.acq = acq
        self.deadline = deadline
        self.refill: Pool | None = None  # RefillSoon: behind the next round trip's calls

    async def perform(self, eff: Any) -> Any:
        acq = self.acq
        t = type(eff)
        if t is QueryMappings:
            return await acq.store.query_mappings(
                eff.client_id, eff.pool_id, eff.key, self.deadline
            )
        if t is GetItem:
            return await acq.store.get_item(eff.key, self.deadline)
        if t is Send:
            if self.refill is None:
                return await acq.store.write(eff.write, self.deadline, eff.readback)
            sending = asyncio.ensure_future(acq.store.write(eff.write, self.deadline, eff.readback))
            self._refill()
            return await sending
        if t is Now:
            return acq.clock.now_us()
        if t is Mono:
            return acq.clock.mono()
        if t is Note:
            if eff.level:
                getattr(log, eff.level)(eff.event, **dict(eff.fields))
            else:
                acq.counters.inc(eff.event)
            return None
        if t is S.CachePut:
            acq.cache.put(eff.lease, eff.sent)
            return None
        if t is S.CacheDrop:
            acq.cache.drop(eff.key)
            return None
        if t is Together:
            # every call sent at once (one round trip); a failed read fails the effect
            calls = asyncio.gather(*(self.perform(c) for c in eff.calls), return_exceptions=True)
            if self.refill is not None:
                self._refill()
            results = await calls
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            return tuple(results)
        if t is Spawn:
            return acq.spawn(acq._run_bg(eff.fn(*eff.args)))
        if t is S.Refresh:
            lease = eff.lease
            k = (lease.client_id, lease.pool_id, lease.key)
            acq._maybe_refresh(k, lease, eff.requested_us, acq.clock.now_us())
            return None
        if t is S.TakeCandidate:
            return await acq.prefetch.candidate(eff.pool, self.deadline)
        if t is S.RefillSoon:
            self.refill = eff.pool
            return None
        if t is S.Untake:
            acq.prefetch.untake(eff.pool, eff.cand)
            return None
        if t is S.LostCandidate:
            acq.prefetch.lost(eff.pool, eff.cand)
            return None
        if t is S.RateLimit:
            return acq.buckets.try_take((eff.pool.client_id, eff.pool.pool_id), acq.clock.mono())
        if t is S.NewToken:
            return acq._new_token()
        if t is S.Miss:
            acq._no_capacity(eff.pool)
            return None
        if t is Sleep:
            if eff.bounded and time.monotonic() + eff.seconds >= self.deadline:
                raise Timeout("another daemon is acquiring this key; deadline passed")
            await asyncio.sleep(eff.seconds)
            return None
        if t is S.Deadline:
            self.deadline = time.monotonic() + eff.seconds
            return None
        if t is Join:
            left = self.deadline - time.monotonic()
            if left > 0:
                await asyncio.wait({eff.handle}, timeout=left)
            return None
        if t is S.RelistLater:
            acq._relist_later(eff.ident, eff.until_us)
            return None
        if t is QueryLeased:
            return await acq.store.query_leased(eff.client_id, eff.pool_id, eff.key, self.deadline)
        raise TypeError(f"no such effect: {eff!r}")

    def _refill(self) -> None:
        pool, self.refill = self.refill, None
        assert pool is not None
        self.acq.prefetch.refill_soon(pool)
