"""get_lease, release and headroom: the driver around the protocol's pure decisions.

Theory of operation
-------------------
``try_hit`` is the hot path and never awaits: a cached lease is answered at once. The cache
holds each answer at most ``confirm_interval`` (S) after it was last confirmed; a hit past S/2
starts a background re-confirmation (one consistent read), and a hit whose sliding
``lease_expires`` calls for it (``lease.should_extend``) starts a background extension.

A miss goes through ``get_lease``, which makes concurrent requests for one
(client, pool, key) share one resolution (single-flight). The resolution reads the key's
mapping items (one strongly consistent Query) and does what ``rasd.decide`` says:

* serve a live lease (one round trip for an uncached existing lease);
* verify a pending one against its resource item, wait for its acquirer, or fence it;
* acquire: the mapping write and the claim of a prefetched candidate go out together (one
  round trip after the read), and ``decide.after_acquire`` says what their outcomes mean.

This module decides nothing itself: every branch is a decision of ``rasd.decide``, which the
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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

import structlog
from cachetools import TTLCache

from . import decide as D
from .cache import HEAD, ID_PACK, META, CacheKey, LeaseCache, lease_of
from .clock import Clock
from .config import Config
from .errors import BadRequest, Busy, NoCapacity, NotHeld, RasdError, Timeout, UnknownPool
from .lease import (
    PENDING,
    US,
    Lease,
    Mapping,
    Pool,
    ResourceItem,
    adopt,
    check_expiry,
    claim,
    confirmed,
    extend_resource,
    extended_to,
    fence_resource,
    fmt_time,
    free_claim,
    headroom_from_ddb,
    headroom_resource,
    holds,
    lease_from_mapping,
    map_acquire,
    map_confirm,
    map_drop_dead,
    map_extend,
    map_extended_to,
    map_pk,
    map_release,
    mapping_from,
    miss_report_update,
    names_claim,
    no_token,
    not_held_by,
    partition_name,
    pick,
    relist,
    resource_from,
    should_extend,
)
from .limits import BucketTable
from .metrics import Counters
from .prefetch import Prefetcher
from .store import Store, WriteResult

log = structlog.get_logger("rasd.acquire")

UNKNOWN_POOL_TTL = 5.0  # seconds a pool miss is remembered (a new pool shows up after this)
UNKNOWN_POOL_MAX = 1024  # pool misses remembered at most (the oldest go first)
HEADROOM_TTL = 10.0
HEADROOM_STALE = 900.0  # seconds: three missed 5-minute balancer runs
BACKGROUND_DEADLINE = 5.0  # extensions, confirmations, give-backs: not bound to a request
WAIT_FIRST = 0.005  # polling a pending mapping: 5 ms, doubling, up to WAIT_MAX
WAIT_MAX = 0.1
#: seconds between two reads of the wall clock on the hit path (Acquirer.wall_us)
WALL_RESYNC = 0.25
#: seconds after its quarantine's end that a daemon re-lists an item it quarantined
RELIST_SLACK = 1.0
#: a daemon re-lists what it freed only if that is due within this long (else the liberator)
RELIST_MAX_WAIT_US = 600 * US
META_UNPACK = META.unpack_from


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
        """Answer from the cache, or None. Never awaits and never touches DynamoDB.
        ``now``: the request's monotonic time (read once by the server).
        (The server counts hits and misses: this is also called again after a miss.)"""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        if now is None:
            now = self.clock.mono()
        now_us = self.wall_us(now)
        if not 0 < requested_us - now_us <= pool.max_lease_us:
            self._check(pool, requested_us, now_us)  # raises, naming what is wrong
        e = self.cache.entry(client_id, pool_id, key, now)
        if e is None:
            return None
        lease = lease_of(client_id, pool_id, key, e)
        _, confirmed, extend_from_us, _ = META_UNPACK(e)
        if now - confirmed > self.cache.half_s or requested_us > extend_from_us:
            k = (client_id, pool_id, key)
            if k not in self._refreshing:
                self._maybe_refresh(k, lease, requested_us, now_us)
        return lease

    def hit_answer(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float,
        req_id: int,
    ) -> bytes | None:
        """The server's fast path: the whole answer frame of a cache hit for request
        ``req_id`` (0 <= req_id < 2**64), or None when this is not a plain hit (no pool, a
        lease end the pool refuses, no valid entry). Decides nothing :meth:`try_hit` would
        decide otherwise: on None the server takes the full path, which names any error.
        Allocates only the answer; the Lease is rebuilt only when the hit needs background
        work (past S/2, or an extension), by the same tests as :meth:`try_hit`."""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        if 0 <= now - self._wall_synced < WALL_RESYNC:
            now_us = int(now * US) + self._wall_offset_us
        else:
            now_us = self.wall_us(now)
        if not 0 < requested_us - now_us <= pool.max_lease_us:
            return None
        pools = self.cache.entries.get(client_id)
        if pools is None:
            return None
        d = pools.get(pool_id)
        if d is None:
            return None
        e = d.get(key)
        if e is None:
            return None
        until, confirmed, extend_from_us, end = META_UNPACK(e)
        if now >= until:
            self.cache.expired(d, key)
            return None
        if now - confirmed > self.cache.half_s or requested_us > extend_from_us:
            k = (client_id, pool_id, key)
            if k not in self._refreshing:
                lease = lease_of(client_id, pool_id, key, e)
                self._maybe_refresh(k, lease, requested_us, now_us)
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
    async def _read(
        self, pool: Pool, key: str, deadline: float
    ) -> tuple[Mapping | None, list[Mapping]]:
        ms = await self.store.query_mappings(pool.client_id, pool.pool_id, key, deadline)
        own = next((m for m in ms if m.region == self.region), None)
        return own, [m for m in ms if m.region != self.region]

    async def _read_first(
        self, pool: Pool, key: str, deadline: float
    ) -> tuple[Mapping | None, list[Mapping], list[ResourceItem]]:
        """:meth:`_read`, and with ``legacy_agents`` the leased index's items of the key, read
        at once (one round trip): where a lease of the paper's agent would be."""
        if not self.cfg.legacy_agents:
            own, others = await self._read(pool, key, deadline)
            return own, others, []
        mappings, held = await asyncio.gather(
            self._read(pool, key, deadline),
            self.store.query_leased(pool.client_id, pool.pool_id, key, deadline),
            return_exceptions=True,
        )
        if isinstance(mappings, BaseException):
            raise mappings
        if isinstance(held, BaseException):
            raise held
        return mappings[0], mappings[1], held

    async def _resource(
        self, client_id: str, resource: str, deadline: float
    ) -> ResourceItem | None:
        got = await self.store.get_item((client_id, resource), deadline)
        return resource_from(got) if got is not None else None

    async def _resolve(
        self, pool: Pool, key: str, requested_us: int, deadline: float
    ) -> tuple[Lease, bool]:
        wait = WAIT_FIRST
        while True:
            sent = self.clock.mono()  # the answer is confirmed as of the read's departure
            own, others, held = await self._read_first(pool, key, deadline)
            d = D.on_read(own, others, self.clock.now_us(), self.rules)
            if isinstance(d, D.Verify):
                r = await self._resource(pool.client_id, d.mapping.resource or "", deadline)
                d = D.on_resource(d.mapping, r, self.clock.now_us(), self.rules)
            if isinstance(d, D.Acquire) and held:
                adopted = await self._adopt(pool, key, held, d.expect_ver, deadline)
                if adopted is None:
                    continue
                d = adopted
            if self.cfg.legacy_agents:
                settled = await self._beside_legacy(pool, key, d, deadline)
                if settled is None:
                    continue
                d = settled
            if isinstance(d, D.Serve):
                self.cache.put(d.lease, sent)
                if d.confirm is not None:
                    self.spawn(self._confirm(d.confirm))
                self.counters.inc("lease.existing")
                k = (pool.client_id, pool.pool_id, key)
                self._maybe_refresh(k, d.lease, requested_us, self.clock.now_us())
                return d.lease, False
            if (
                isinstance(d, D.Extend)
                and self.cfg.legacy_agents
                and d.mapping.expires_us is not None
                and d.mapping.expires_us <= self.clock.now_us()
            ):
                r = await self._resource(pool.client_id, d.mapping.resource or "", deadline)
                lapsed = D.on_lapsed(d.mapping, r, self.clock.now_us())
                if isinstance(lapsed, D.EndLapsed):
                    await self._end_lapsed(lapsed.mapping, deadline)
                    continue
            if isinstance(d, D.Extend):
                lease = await self._extend_now(d.mapping, requested_us, deadline)
                if lease is not None:
                    return lease, False
                continue
            if isinstance(d, D.Acquire):
                got = await self._acquire(pool, key, requested_us, d.expect_ver, deadline)
                if isinstance(got, Mapping):
                    # legacy_agents: our claim won; served only once settled
                    settled = await self._beside_legacy(pool, key, D.Settle(got), deadline)
                    if isinstance(settled, D.Serve):
                        self.cache.put(settled.lease, sent)
                        ours = settled.lease.resource == got.resource
                        self.counters.inc("lease.new" if ours else "lease.existing")
                        return settled.lease, ours
                    continue  # yielded, then not servable at once: read again
                if got is not None:
                    return got, True
                continue
            if isinstance(d, D.FenceResource):
                await self._fence(d.resource, deadline)
                continue
            # Wait: another daemon of this region is acquiring this key.
            wait = await self._wait(wait, deadline)

    async def _wait(self, wait: float, deadline: float) -> float:
        """Another daemon of this region is acquiring the key: poll again after ``wait``
        (5 ms, doubling, up to WAIT_MAX), within the deadline. Returns the next wait."""
        self.counters.inc("acq.waits")
        if time.monotonic() + wait >= deadline:
            raise Timeout("another daemon is acquiring this key; deadline passed")
        await asyncio.sleep(wait)
        return min(wait * 2, WAIT_MAX)

    async def _fence(self, r: ResourceItem, deadline: float) -> None:
        res = await self.store.write(fence_resource(r.ident, r.version), deadline)
        self.counters.inc("acq.fenced" if res.outcome is D.Outcome.APPLIED else "acq.fence_lost")
        if res.error is not None and res.outcome is not D.Outcome.REJECTED:
            raise res.error

    async def _end_lapsed(self, m: Mapping, deadline: float) -> None:
        """``decide.EndLapsed``: release the mapping at the version read (an extension that
        landed since makes this a lost race: read again), then free the resource in the
        background (held to its end, as every free beside the paper's agent)."""
        assert m.token is not None
        res = await self.store.write(
            map_release(m.ident, m.token, self.clock.now_us(), m.ver), deadline, no_token(m.token)
        )
        if res.outcome is D.Outcome.APPLIED:
            self.counters.inc("lease.ended_lapsed")
            self.spawn(self._free_claim((m.client_id, m.resource or ""), m.key, m.token))
            return
        if res.outcome is D.Outcome.REJECTED and res.error is None:
            return
        raise res.error or Timeout("release outcome unknown")

    async def _beside_legacy(
        self, pool: Pool, key: str, d: D.Decision | D.Settle, deadline: float
    ) -> D.Decision | None:
        """With ``legacy_agents``, a pending mapping whose claim landed is settled, not served
        (``decide.beside_legacy``): the leased index read once more, then the mapping
        confirmed and served, or the paper's agent's lease adopted instead. None: read again."""
        while True:
            b = D.beside_legacy(d)
            if not isinstance(b, D.Settle):
                return b
            d2 = await self._settle(pool, key, b.mapping, deadline)
            if d2 is None:
                return None
            d = d2

    async def _settle(self, pool: Pool, key: str, m: Mapping, deadline: float) -> D.Decision | None:
        """A pending mapping ``m`` whose claim landed: read the leased index (now, after the
        claim landed) and ask ``decide.on_settle``. Confirm: ``map_confirm``, and serve once
        it applied (None: it lost, read again). YieldTo: adopt the paper's lease at ``m``'s
        version; once the mapping no longer names our claim, give the claim back."""
        assert m.token is not None and m.resource is not None
        held = await self.store.query_leased(pool.client_id, pool.pool_id, key, deadline)
        s = D.on_settle(m, held, self.clock.now_us())
        if isinstance(s, D.YieldTo):
            self.counters.inc("lease.yielded")
            res, token = m.resource, m.token

            async def give_back() -> None:
                # The mapping, at the pending version, now names the other lease: our claim can
                # no longer be confirmed, and no daemon served it. It leaves the leased index
                # before the adoption writes the other item (which refreshes its
                # ``lease_acquired``), so the paper's lookups never pick it beside that one
                # (they may have answered it already: held to its end). Should we stop
                # before the adoption, readers resolve the pending mapping (rule 2).
                await self._free_claim((m.client_id, res), key, token, within=deadline)

            return await self._adopt(pool, key, [s.item], m.ver, deadline, named=give_back)
        return await self._confirm_now(m, deadline)

    async def _confirm_now(self, m: Mapping, deadline: float) -> D.Serve | None:
        """Write the pending mapping ``m`` live; serve it once that applied (None: it lost to
        another daemon's settling, read again; unknown: an error, the state left as it is)."""
        assert m.token is not None
        res = await self.store.write(map_confirm(m), deadline, confirmed(m.token))
        self.counters.inc(f"acq.confirm_{res.outcome.value}")
        if res.outcome is D.Outcome.APPLIED:
            return D.Serve(lease_from_mapping(m))
        if res.outcome is D.Outcome.REJECTED and res.error is None:
            return None
        raise res.error or Timeout("confirmation outcome unknown")

    async def _adopt(
        self,
        pool: Pool,
        key: str,
        held: list[ResourceItem],
        expect_ver: int,
        deadline: float,
        named: Callable[[], Awaitable[None]] | None = None,
    ) -> D.Decision | None:
        """The key has no lease in our mapping, but the leased index shows a resource of our
        region held for it: a lease of the paper's agent. Read the item (strongly
        consistent); if it is a running lease of the key, name it in the mapping (at the
        version read, like any acquisition), then record our token on the item (conditional
        on the version read). Returns what to do next: serve or extend the adopted lease,
        acquire (nothing to adopt, or it changed before our write: the mapping is then ours
        at the next version), or None to read again (another daemon wrote the mapping)."""
        now = self.clock.now_us()
        hint = pick(
            [
                it
                for it in held
                if D.adoptable(it, pool.client_id, pool.pool_id, key, self.region, now)
            ]
        )
        if hint is None:
            return D.Acquire(expect_ver)
        r = await self._resource(pool.client_id, hint.resource, deadline)
        now = self.clock.now_us()
        if r is None or not D.adoptable(r, pool.client_id, pool.pool_id, key, self.region, now):
            return D.Acquire(expect_ver)
        assert r.lease_expires_us is not None
        token = self._new_token()
        m = Mapping(
            pool.client_id,
            pool.pool_id,
            key,
            self.region,
            expect_ver + 1,
            PENDING,
            token,
            r.resource,
            r.version,
            r.lease_expires_us,
            now,
            self.owner,
        )
        mw = map_acquire(
            m.ident, expect_ver, token, r.resource, r.version, r.lease_expires_us, now, self.owner
        )
        mres = await self.store.write(mw, deadline, names_claim(token, r.resource))
        ares = None
        if mres.outcome is D.Outcome.APPLIED:
            if named is not None:
                await named()  # the mapping names the lease now, not yet adopted
            ares = await self.store.write(
                adopt(r, token, expect_ver + 1, now), deadline, holds(token, key)
            )
        # The writes went one after the other: the adoption is sent only once the mapping
        # names it, so it never holds a lease that no mapping can name.
        step = D.after_acquire(
            mres.outcome, ares.outcome if ares else D.Outcome.REJECTED, expect_ver
        )
        if isinstance(step, D.Won):
            assert ares is not None and ares.item is not None
            self.counters.inc("lease.adopted")
            d = D.on_resource(m, resource_from(ares.item), self.clock.now_us(), self.rules)
            if isinstance(d, D.Serve) and d.confirm is not None:
                # Settled already: the lease is the paper agent's own. Confirmed before it is
                # served, as a settled claim is (readers wait for it meanwhile).
                return await self._confirm_now(d.confirm, deadline)
            return d
        if isinstance(step, D.NextCandidate):
            self.counters.inc("lease.adopt_lost")
            return D.Acquire(step.expect_ver)
        if isinstance(step, D.Reread):
            return None
        self.counters.inc("acq.gave_up")
        raise _error_of(mres, *(() if ares is None else (ares,))) or Timeout(
            "adoption outcome unknown"
        )

    def _new_token(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    async def _acquire(
        self, pool: Pool, key: str, requested_us: int, expect_ver: int, deadline: float
    ) -> Lease | Mapping | None:
        """Claim a candidate and name it in the key's mapping, both in one round trip.
        None: re-read (someone else wrote the mapping first). With ``legacy_agents`` a won
        claim is returned as its pending mapping, for the caller to settle."""
        wait = self.buckets.try_take((pool.client_id, pool.pool_id), self.clock.mono())
        if wait > 0:
            self.counters.inc("shed.rate_limited")
            raise Busy(
                f"acquisition rate limit of pool {pool.pool_id!r} reached",
                retry_after=round(wait, 3),
            )
        token = self._new_token()
        ident = (map_pk(pool.client_id, pool.pool_id, key), self.region)
        while True:
            cand = await self.prefetch.candidate(pool, deadline)
            if cand is None:
                raise self._no_capacity(pool)
            item = cand.item
            now = self.clock.now_us()
            mw = map_acquire(
                ident, expect_ver, token, item.resource, item.version, requested_us, now, self.owner
            )
            cw = claim(item, key, requested_us, now, token, expect_ver + 1)
            sent = self.clock.mono()
            writes = asyncio.gather(
                self.store.write(mw, deadline, names_claim(token, item.resource)),
                self.store.write(cw, deadline, holds(token, key)),
            )
            # Queued behind the two writes: building the refill's Query never delays them.
            self.prefetch.refill_soon(pool)
            mres, cres = await writes
            if cres.outcome is D.Outcome.UNKNOWN or cres.error is not None:
                # not refused by its condition: the item may still be free at this version
                self.prefetch.untake(pool, cand)
            step = D.after_acquire(mres.outcome, cres.outcome, expect_ver)
            if isinstance(step, D.Won):
                pending = Mapping(
                    pool.client_id,
                    pool.pool_id,
                    key,
                    self.region,
                    expect_ver + 1,
                    PENDING,
                    token,
                    item.resource,
                    item.version,
                    requested_us,
                    now,
                    self.owner,
                )
                if self.cfg.legacy_agents:
                    return pending
                lease = Lease(
                    pool.client_id,
                    pool.pool_id,
                    key,
                    item.resource,
                    self.region,
                    requested_us,
                    item.version + 1,
                    now,
                    token,
                )
                self.cache.put(lease, sent)
                self.spawn(self._confirm(pending))
                self.counters.inc("lease.new")
                return lease
            if isinstance(step, D.NextCandidate):
                self.counters.inc("prefetch.conflicts")
                self.prefetch.lost(pool, cand)
                expect_ver = step.expect_ver
                continue
            if isinstance(step, D.GiveBack):
                # No mapping names this claim, so nobody serves it: give it back in the
                # background (retried), and read again now.
                self.counters.inc("acq.gave_back")
                self.spawn(self._free_claim(item.ident, key, token))
                return None
            if isinstance(step, D.FenceOwnClaim):
                self.counters.inc("acq.fence_own")
                self.spawn(self._fence_own_claim(item, key, token))
                return None
            if isinstance(step, D.Reread):
                self.counters.inc("acq.lost_mapping")
                return None
            assert isinstance(step, D.GiveUp)
            self.counters.inc("acq.gave_up")
            raise _error_of(mres, cres) or Timeout(step.why)

    async def _confirm(self, m: Mapping) -> None:
        res = await self.store.write(map_confirm(m), time.monotonic() + BACKGROUND_DEADLINE)
        self.counters.inc(f"acq.confirm_{res.outcome.value}")

    async def _free_claim(
        self, ident: tuple[str, str], key: str, token: str, within: float | None = None
    ) -> None:
        """Free a claim that no mapping names, with quarantine (docs/design.md). Retried for
        about a minute; if the daemon dies first, the liberator's orphan repair frees it.
        With ``legacy_agents`` not before the lease's end plus the skew either: the paper's
        agent answers any lease it finds in the leased index, to its end, and is never told
        of a release (the end is read first, and the free is conditional on it).
        ``within``: a request's deadline: no retry after an error, which is raised."""
        for attempt in range(6):
            deadline = within if within is not None else time.monotonic() + BACKGROUND_DEADLINE
            now = self.clock.now_us()
            available = now + self.rules.quarantine_us
            ends: int | None = None
            if self.cfg.legacy_agents:
                try:
                    r = await self._resource(ident[0], ident[1], deadline)
                except RasdError as exc:
                    res = WriteResult(D.Outcome.UNKNOWN, error=exc)
                    r = None
                else:
                    if r is None or r.holder != token or r.key != key:
                        return  # not ours any more
                    ends = r.lease_expires_us
                if ends is not None:
                    available = max(available, ends + self.rules.grace_us)
            if not self.cfg.legacy_agents or ends is not None:
                w = free_claim(ident, key, token, now, available, ends)
                res = await self.store.write(w, deadline, not_held_by(token))
                if res.outcome is D.Outcome.REJECTED and res.error is None and ends is not None:
                    continue  # extended since the read: read the end again
            if res.outcome is not D.Outcome.UNKNOWN and res.error is None:
                self.counters.inc(f"acq.free_claim_{res.outcome.value}")
                if res.outcome is D.Outcome.APPLIED and available - now <= RELIST_MAX_WAIT_US:
                    self._relist_later(ident, available)
                return
            self.counters.inc("acq.free_claim_errors")
            if within is not None:
                raise res.error or Timeout("give-back outcome unknown")
            log.warning(
                "claim_not_given_back",
                resource=ident[1],
                key=key,
                attempt=attempt + 1,
                error=str(res.error),
            )
            await asyncio.sleep(min(2.0**attempt, 16.0))

    def _relist_later(self, ident: tuple[str, str], until_us: int) -> None:
        task = asyncio.get_running_loop().create_task(self._relist(ident, until_us))
        self._relists.add(task)
        task.add_done_callback(self._relists.discard)

    async def _relist(self, ident: tuple[str, str], until_us: int) -> None:
        """Put an item this daemon quarantined back in the available index once the
        quarantine is over (read strongly consistent, then ``relist``, conditional on what
        was read). Best effort: if the daemon stops first, ``ras-liberator`` re-lists it."""
        await asyncio.sleep(max(0.0, (until_us - self.clock.now_us()) / US) + RELIST_SLACK)
        deadline = time.monotonic() + BACKGROUND_DEADLINE
        try:
            r = await self._resource(ident[0], ident[1], deadline)
            now = self.clock.now_us()
            if r is None or r.quarantine_until is None or r.quarantine_until > fmt_time(now):
                return  # taken, re-listed, or quarantined again (by its own freer) since
            res = await self.store.write(relist(r, now), deadline)
            self.counters.inc(f"quarantine.relist_{res.outcome.value}")
        except RasdError as exc:
            self.counters.inc("quarantine.relist_errors")
            log.warning("relist_failed", resource=ident[1], error=str(exc))

    async def _fence_own_claim(self, item: ResourceItem, key: str, token: str) -> None:
        """Our claim's outcome is unknown and no mapping names it: make sure it never lands,
        or give it back if it did."""
        deadline = time.monotonic() + BACKGROUND_DEADLINE
        res = await self.store.write(fence_resource(item.ident, item.version), deadline)
        if res.outcome is D.Outcome.APPLIED:
            return
        cur = await self._resource(item.client_id, item.resource, deadline)
        if cur is not None and cur.holder == token:
            await self._free_claim(item.ident, key, token)

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

    async def _extend(
        self, lease: Lease, requested_us: int, deadline: float
    ) -> tuple[D.ExtendStep, WriteResult]:
        """The resource first, then the mapping: the mapping's end never passes the
        resource's."""
        want = fmt_time(requested_us)
        res = await self.store.write(
            extend_resource(lease, requested_us), deadline, extended_to(lease.token, want)
        )
        mres: WriteResult | None = None
        if res.outcome is D.Outcome.APPLIED:
            mres = await self.store.write(
                map_extend(lease, requested_us), deadline, map_extended_to(lease.token, want)
            )
        step = D.after_extend(res.outcome, mres.outcome if mres else None)
        if isinstance(step, D.CheckMapping):
            try:
                got = await self.store.get_item(
                    (map_pk(lease.client_id, lease.pool_id, lease.key), lease.region), deadline
                )
            except RasdError as exc:  # unknown: leave any orphan to the liberator's repair
                return D.Forget(f"mapping unreadable: {exc}"), mres or res
            step = D.on_extend_check(mapping_from(got) if got else None, lease)
        if isinstance(step, D.FreeOrphan):
            self.counters.inc("lease.extend_orphaned")
            assert lease.token is not None
            self.spawn(self._free_claim((lease.client_id, lease.resource), lease.key, lease.token))
        return step, mres or res

    async def _extend_now(self, m: Mapping, requested_us: int, deadline: float) -> Lease | None:
        """Our lease is too close to its end to serve: extend it (None: re-read)."""
        lease = lease_from_mapping(m)
        now = self.clock.now_us()
        if requested_us <= lease.expires_us:
            # The caller asks for no more than the lease has: it is valid until its end.
            return lease if lease.expires_us > now else None
        sent = self.clock.mono()
        step, last = await self._extend(lease, requested_us, deadline)
        if isinstance(step, D.Extended):
            new = replace(lease, expires_us=requested_us)
            self.cache.put(new, sent)
            self.counters.inc("lease.extended")
            return new
        if last.outcome is D.Outcome.UNKNOWN or (
            last.error is not None and last.outcome is not D.Outcome.APPLIED
        ):
            raise last.error or Timeout("extension outcome unknown")
        if isinstance(step, D.Forget):
            # The resource write lost: if the resource is no longer ours the lease is over
            # (liberated), and the mapping is ended so the key can acquire again.
            r = await self._resource(m.client_id, lease.resource, deadline)
            if r is None or r.holder != m.token:
                assert m.token is not None
                await self.store.write(map_release(m.ident, m.token, now), deadline)
                self.counters.inc("lease.ended_lapsed")
        return None

    async def _extend_bg(self, k: CacheKey, lease: Lease, requested_us: int) -> None:
        try:
            sent = self.clock.mono()
            step, last = await self._extend(
                lease, requested_us, time.monotonic() + BACKGROUND_DEADLINE
            )
            if isinstance(step, D.Extended):
                self._extend_after.pop(k, None)
                self.cache.put(replace(lease, expires_us=requested_us), sent)
                self.counters.inc("lease.extended")
                return
            if last.outcome is D.Outcome.REJECTED and last.error is None:
                # Lost: someone else extended, released or liberated it. Forget it here; the
                # next request reads the truth.
                self._extend_after.pop(k, None)
                self.counters.inc("lease.extend_conflicts")
                self.cache.drop(k)
                return
            self._extension_failed(k, lease, last.error or Timeout("extension outcome unknown"))
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
        """A cached answer is past S/2: read the mapping again (I3). Still the same lease:
        confirmed as of this read. Anything else: dropped, the next request resolves it."""
        try:
            sent = self.clock.mono()
            pool = self.pools.get((k[0], k[1]))
            if pool is None:
                return
            own, others = await self._read(pool, k[2], time.monotonic() + BACKGROUND_DEADLINE)
            d = D.on_read(own, others, self.clock.now_us(), self.rules)
            if (
                isinstance(d, D.Serve)
                and d.lease.resource == lease.resource
                and d.lease.token == lease.token
            ):
                self.cache.put(d.lease, sent)
                self.counters.inc("lease.reconfirmed")
            else:
                self.cache.drop(k)
                self.counters.inc("lease.reconfirm_dropped")
        except RasdError as exc:
            self.counters.inc("lease.reconfirm_errors")  # served until S, then dropped
            log.warning("reconfirm_failed", key=k[2], error=str(exc))
        finally:
            self._refreshing.discard(k)

    # -------------------------------------------------------------------- release
    async def release(self, client_id: str, pool_id: str, key: str, deadline: float) -> int:
        """Give back the key's lease in our region: the mapping first, then the resource with
        quarantine (docs/design.md, I3). Returns 1, or raises NotHeld."""
        pool = await self.pool(client_id, pool_id, deadline)
        k = (client_id, pool_id, key)
        self.cache.drop(k)
        wait = WAIT_FIRST
        while True:
            own, others = await self._read(pool, key, deadline)
            now = self.clock.now_us()
            d = D.on_release_read(own, now, self.rules)
            if isinstance(d, D.Verify):
                r = await self._resource(client_id, d.mapping.resource or "", deadline)
                d = D.on_release_resource(d.mapping, r, now, self.rules)
            if isinstance(d, D.NotHeld):
                held = sorted(m.region for m in others if D.servable(m, now, self.rules))
                if held:
                    raise NotHeld(
                        f"{key!r} holds no lease in {self.region} (held in {', '.join(held)})"
                    )
                raise NotHeld(f"{key!r} holds no lease in pool {pool_id!r}")
            if isinstance(d, D.ReleaseLease):
                lease = d.lease
                assert lease.token is not None and own is not None
                res = await self.store.write(
                    map_release(own.ident, lease.token, now), deadline, no_token(lease.token)
                )
                if res.outcome is D.Outcome.REJECTED and res.error is None:
                    continue  # changed under us: read again
                if res.outcome is not D.Outcome.APPLIED:
                    raise res.error or Timeout("release outcome unknown")
                self.cache.drop(k)
                self.counters.inc("lease.released")
                # The resource: quarantined, so caches elsewhere run out first. If this write
                # is lost the liberator's orphan repair frees it (also with quarantine).
                free = self.spawn(self._free_claim((client_id, lease.resource), key, lease.token))
                if self.cfg.legacy_agents:
                    # The paper's agent answers whatever the leased index shows for the key:
                    # answer the release once the resource no longer shows it, so that the
                    # key's next lease (here, or the paper agent's) cannot overlap the one
                    # released. Within the deadline; the free goes on in the background.
                    left = deadline - time.monotonic()
                    if left > 0:
                        await asyncio.wait({free}, timeout=left)
                return 1
            if isinstance(d, D.DropMapping):
                await self.store.write(map_drop_dead(d.mapping, now), deadline)
                continue
            if isinstance(d, D.FenceResource):
                await self._fence(d.resource, deadline)
                continue
            wait = await self._wait(wait, deadline)

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


def _error_of(*results: WriteResult) -> RasdError | None:
    return next((r.error for r in results if r.error is not None), None)
