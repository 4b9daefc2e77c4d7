"""Prefetched claim candidates per (client, pool), so a new lease costs one conditional write.

Theory of operation
-------------------
``CandidateBuffer`` (pure, time passed in) holds free items read from the
``available_resources`` index. A new lease takes the first fresh candidate and makes the single
conditional claim; losing the race just means taking the next one.

Spreading daemons over different items (see the dalloc seed): every refill reads a random
sub-partition, from a random starting time within the span of ``lease_available`` values seen
there before, in a random direction, and keeps a random sample of the page. Twenty daemons
therefore hold mostly different items instead of all racing for the head of the index.

Sizing: the buffer tracks demand as an EWMA of takes per second and keeps about
``REFILL_HORIZON`` seconds of it (clamped to ``prefetch_min..prefetch_max``); a refill starts in
the background when it falls below half of that. Candidates older than ``candidate_max_age``
are dropped: by then another daemon has likely taken them.

Only items claimable now are kept: an early free (release, give-back, dedupe) sets
``lease_available`` in the future (the quarantine, docs/design.md I3), and claims are
conditional on ``lease_available <= now``.

When a sweep of all ten sub-partitions finds nothing, the pool is marked exhausted for
``exhausted_backoff`` seconds and NO_CAPACITY is answered without reading DynamoDB at all.

``Prefetcher`` does the I/O around the buffers.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from dataclasses import dataclass

import structlog

from .clock import Clock
from .config import Config
from .errors import RasdError
from .lease import PARTITIONS, Pool, ResourceItem, fmt_time, parse_time, partition_name
from .metrics import Counters
from .store import Store

log = structlog.get_logger("rasd.prefetch")

REFILL_HORIZON = 2.0  # seconds of demand a buffer should hold
DEMAND_HALF_LIFE = 3.0  # seconds: react within a few seconds to a burst of new keys


@dataclass(slots=True)
class Candidate:
    item: ResourceItem
    fetched: float  # monotonic seconds


class CandidateBuffer:
    """Candidates of one pool. Pure: every method takes ``now`` (monotonic seconds)."""

    def __init__(self, cfg: Config, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.q: deque[Candidate] = deque()
        self.exhausted_until = 0.0
        self.rate = 0.0  # EWMA of takes per second
        self._last_take = 0.0
        #: per sub-partition: the (min, max) lease_available seen, for random starting points
        self.span: dict[int, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.q)

    # -- demand --------------------------------------------------------------------------
    def _note_take(self, now: float) -> None:
        dt = max(now - self._last_take, 1e-3) if self._last_take else DEMAND_HALF_LIFE
        self._last_take = now
        alpha = 1.0 - math.exp(-dt * math.log(2) / DEMAND_HALF_LIFE)
        self.rate += alpha * (1.0 / dt - self.rate)

    def target(self) -> int:
        want = math.ceil(self.rate * REFILL_HORIZON)
        return max(self.cfg.prefetch_min, min(self.cfg.prefetch_max, want))

    def needs_refill(self) -> bool:
        return len(self.q) < max(1, self.target() // 2)

    # -- candidates ----------------------------------------------------------------------
    def take(self, now: float) -> Candidate | None:
        """The next fresh candidate, dropping stale ones."""
        self._note_take(now)
        while self.q:
            c = self.q.popleft()
            if now - c.fetched <= self.cfg.candidate_max_age:
                return c
        return None

    def add(self, items: list[ResourceItem], now: float) -> int:
        """Keep a random sample of ``items`` (up to the target); returns how many were kept."""
        held = {c.item.resource for c in self.q}
        fresh = [it for it in items if it.resource not in held]
        room = max(0, self.target() - len(self.q))
        if len(fresh) > room:
            fresh = self.rng.sample(fresh, room)
        for it in fresh:
            self.q.append(Candidate(it, now))
        return len(fresh)

    def learn_span(self, n: int, items: list[ResourceItem]) -> None:
        times = [parse_time(it.lease_available) for it in items if it.lease_available]
        if not times:
            return
        lo, hi = min(times), max(times)
        old = self.span.get(n)
        if old:
            lo, hi = min(lo, old[0]), max(hi, old[1])
        self.span[n] = (lo, hi)

    def start_point(self, n: int) -> str | None:
        """A random lease_available to start reading sub-partition ``n`` from (None: head)."""
        span = self.span.get(n)
        if span is None or span[0] == span[1] or self.rng.random() < 0.25:
            return None
        return fmt_time(self.rng.randint(span[0], span[1]))

    # -- exhaustion ----------------------------------------------------------------------
    def exhausted(self, now: float) -> bool:
        return now < self.exhausted_until

    def mark_exhausted(self, now: float) -> None:
        self.exhausted_until = now + self.cfg.exhausted_backoff

    def partitions(self) -> list[int]:
        order = list(range(PARTITIONS))
        self.rng.shuffle(order)
        return order


class Prefetcher:
    """Keeps a CandidateBuffer per (client, pool) filled from DynamoDB."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock,
        counters: Counters,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.counters = counters
        self.rng = rng or random.Random()
        self.buffers: dict[tuple[str, str], CandidateBuffer] = {}
        self._refills: dict[tuple[str, str], asyncio.Task[None]] = {}

    def buffer(self, pool: Pool) -> CandidateBuffer:
        k = (pool.client_id, pool.pool_id)
        buf = self.buffers.get(k)
        if buf is None:
            buf = self.buffers[k] = CandidateBuffer(self.cfg, self.rng)
        return buf

    def depth(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    async def candidate(self, pool: Pool, deadline: float) -> Candidate | None:
        """A candidate to claim, or None when the pool has no free item in this region."""
        buf = self.buffer(pool)
        now = self.clock.mono()
        c = buf.take(now)
        if c is not None:
            self.counters.inc("prefetch.hits")
            if buf.needs_refill():
                self._start_refill(pool, buf)
            return c
        self.counters.inc("prefetch.misses")
        if buf.exhausted(now):
            self.counters.inc("prefetch.exhausted_fast")
            return None
        refill = self._refills.get((pool.client_id, pool.pool_id))
        if refill is not None and not refill.done():
            await asyncio.shield(refill)
            c = buf.take(self.clock.mono())
            if c is not None:
                return c
        await self._sweep(pool, buf, deadline)
        return buf.take(self.clock.mono())

    async def idle(self, timeout: float = 5.0) -> None:
        """Wait for background refills in flight (tests; shutdown)."""
        pending = [t for t in self._refills.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def warm(self, pools: list[Pool], timeout: float, limit: int = 64) -> None:
        """Fill the buffers of (up to ``limit``) known pools, waiting at most ``timeout``
        seconds, so the first new lease of each does not pay for a sweep."""
        for pool in pools[:limit]:
            self._start_refill(pool, self.buffer(pool))
        await self.idle(timeout)

    # -- I/O -----------------------------------------------------------------------------
    def _start_refill(self, pool: Pool, buf: CandidateBuffer) -> None:
        k = (pool.client_id, pool.pool_id)
        task = self._refills.get(k)
        if task is None or task.done():
            self._refills[k] = asyncio.get_running_loop().create_task(self._refill(pool, buf))

    async def _refill(self, pool: Pool, buf: CandidateBuffer) -> None:
        deadline = time.monotonic() + max(2.0, self.cfg.default_deadline)
        try:
            for n in buf.partitions()[:3]:
                if await self._read(pool, buf, n, deadline) and not buf.needs_refill():
                    return
        except RasdError as exc:
            self.counters.inc("prefetch.refill_errors")
            log.warning("prefetch_refill_failed", pool=pool.pool_id, error=str(exc))

    async def _sweep(self, pool: Pool, buf: CandidateBuffer, deadline: float) -> None:
        """The buffer is empty: read one random sub-partition, then all the others at once."""
        order = buf.partitions()
        if await self._read(pool, buf, order[0], deadline):
            return
        found = await asyncio.gather(*(self._read(pool, buf, n, deadline) for n in order[1:]))
        if not any(found):
            buf.mark_exhausted(self.clock.mono())
            self.counters.inc("prefetch.exhausted")

    async def _read(self, pool: Pool, buf: CandidateBuffer, n: int, deadline: float) -> bool:
        self.counters.inc("prefetch.reads")
        part = partition_name(pool.client_id, pool.pool_id, self.cfg.region, n)
        start = buf.start_point(n)
        forward = self.rng.random() < 0.5
        items = await self.store.query_available(
            part, self.cfg.prefetch_page, forward, deadline, start=start
        )
        buf.learn_span(n, items)
        items = [it for it in items if it.claimable(self.clock.now_us())]
        if not items and (start is not None or not forward):
            # Nothing claimable past the random start, or only quarantined items at the tail
            # (early frees are claimable from a future ``lease_available``): read the head.
            items = await self.store.query_available(part, self.cfg.prefetch_page, True, deadline)
            items = [it for it in items if it.claimable(self.clock.now_us())]
        buf.add(items, self.clock.mono())
        return bool(items)
