"""Prefetched claim candidates per (client, pool), so a new lease costs one conditional write.

:class:`Prefetcher` does the I/O around the buffers (``rasd.daemon.candidates``): it reads
the index pages a buffer plans, in the background once a claim was answered (``refill_soon``)
or while a request waits (``candidate``), and sweeps all ten sub-partitions before a pool
counts as having nothing free; a request joins a sweep under way (docs/design.md,
"Prefetch").
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import structlog

from ..config import Config
from ..core.clock import Clock
from ..core.errors import RasdError, Timeout
from ..core.lease import Pool, fmt_time, partition_name
from ..dynamo.store import Store
from ..observe.metrics import Counters
from .candidates import Candidate as Candidate
from .candidates import CandidateBuffer, why_empty
from .lanes import END_KEEP, Read, host_seed

log = structlog.get_logger("rasd.daemon.prefetch")

#: a short pool: where a sweep's reads after its first are cut into waves (2, then 3, then
#: the other 4 sub-partitions): at most four round trips, fewer reads than all at once
DIRECT_WAVES = (2, 5)
#: After an empty sweep, one Query of the client's items (at most this many) looks for the
#: pool's items in quarantine, which no index shows, for what NO_CAPACITY says
QUARANTINE_READ = 100
QUARANTINE_READ_S = 0.25  # at most this much of the request's deadline
QUARANTINE_READ_MIN_S = 0.05  # not tried with less than this left


class Prefetcher:
    """Keeps a CandidateBuffer per (client, pool) filled from DynamoDB."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock,
        counters: Counters,
        rng: random.Random | None = None,
        seed: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.counters = counters
        self.rng = rng or random.Random()
        self.seed = host_seed() if seed is None else seed
        self.buffers: dict[tuple[str, str], CandidateBuffer] = {}
        self._refills: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._sweeps: dict[tuple[str, str], asyncio.Task[int]] = {}
        #: when each sweep under way began (monotonic), for the requests that join it
        self._sweep_began: dict[asyncio.Task[int], float] = {}

    def buffer(self, pool: Pool) -> CandidateBuffer:
        k = (pool.client_id, pool.pool_id)
        buf = self.buffers.get(k)
        if buf is None:
            buf = self.buffers[k] = CandidateBuffer(
                self.cfg, self.rng, self.seed, f"{pool.client_id}/{pool.pool_id}"
            )
        return buf

    def depth(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    def at_hand(self, pool: Pool) -> Candidate | None:
        """A candidate already in the buffer, or None: never reads the index."""
        return self._take(self.buffer(pool), self.clock.mono())

    def _take(self, buf: CandidateBuffer, now: float) -> Candidate | None:
        """``buf.take``, counted: a hit, and the candidates it dropped as too old."""
        stale = buf.stale
        c = buf.take(now)
        if buf.stale != stale:
            self.counters.inc("prefetch.stale", buf.stale - stale)
        if c is not None:
            self.counters.inc("prefetch.hits")
        return c

    async def candidate(self, pool: Pool, deadline: float) -> Candidate | None:
        """A candidate to claim, or None when the pool has no free item in this region.
        Starts no refill: call :meth:`refill_soon` once the claim was answered, so that
        neither building the refill's request nor DynamoDB serving it delays the claim."""
        buf = self.buffer(pool)
        now = self.clock.mono()
        c = self._take(buf, now)
        if c is not None:
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
        k = (pool.client_id, pool.pool_id)
        # An empty sweep answers for a request only if it began at most exhausted_backoff
        # before the request came, as the exhausted mark does: a slow sweep (a loaded
        # backend) joined late read the pool too long ago.
        oldest = now - self.cfg.exhausted_backoff
        while True:
            sweep = self._sweeps.get(k)
            if sweep is not None and not sweep.done():
                self.counters.inc("prefetch.sweeps_joined")
                began = self._sweep_began.get(sweep, oldest)
                try:
                    kept = await asyncio.shield(sweep)
                except RasdError:
                    kept = 1  # that sweep's deadline, not ours: sweep ourselves
                if not kept and began < oldest:
                    self.counters.inc("prefetch.sweeps_too_old")
                    continue  # sweep ourselves
            else:
                sweep = asyncio.ensure_future(self._sweep(pool, buf, deadline))
                self._sweeps[k] = sweep
                self._sweep_began[sweep] = self.clock.mono()
                sweep.add_done_callback(self._sweep_done)
                kept = await asyncio.shield(sweep)
            c = buf.take(self.clock.mono())
            if c is not None or not kept:
                return c
            # What this sweep kept went to concurrent requests first: sweep again, until a
            # sweep finds nothing (NO_CAPACITY) or the deadline passes. The pool had free
            # items, so giving up with NO_CAPACITY after a number of sweeps would be wrong
            # (a burst of misses in direct mode, where a sweep keeps one candidate).
            self.counters.inc("prefetch.sweeps_again")
            if time.monotonic() >= deadline:
                raise Timeout("every candidate the sweeps found went to concurrent requests")

    def why_empty(self, pool: Pool) -> str | None:
        """What NO_CAPACITY says about the pool's free items that are not claimable, while
        the pool is exhausted (see ``rasd.daemon.candidates.why_empty``), or None."""
        buf = self.buffers.get((pool.client_id, pool.pool_id))
        if buf is None or not buf.exhausted(self.clock.mono()):
            return None
        return buf.why_empty

    def _sweep_done(self, task: asyncio.Task[int]) -> None:
        self._sweep_began.pop(task, None)
        for k, t in list(self._sweeps.items()):
            if t is task:
                del self._sweeps[k]
        if not task.cancelled():
            task.exception()  # retrieved: the requests waiting for it may have given up

    def lost(self, pool: Pool, cand: Candidate) -> None:
        """The claim of ``cand`` lost the race: leave its lane (see CandidateBuffer.lost)."""
        buf = self.buffers.get((pool.client_id, pool.pool_id))
        if buf is not None:
            dropped = buf.lost(cand)
            if dropped:
                self.counters.inc("prefetch.dropped_contended", dropped)

    def untake(self, pool: Pool, cand: Candidate) -> None:
        """The claim of ``cand`` failed for a reason other than its condition, or its outcome
        is unknown (see CandidateBuffer.untake)."""
        buf = self.buffers.get((pool.client_id, pool.pool_id))
        if buf is not None:
            buf.untake(cand.item)

    async def idle(self, timeout: float = 5.0) -> None:
        """Wait for background refills in flight (tests; shutdown)."""
        pending = [t for t in self._refills.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def stop(self) -> None:
        """Cancel the refills in flight and wait for them (shutdown, before the store closes:
        a refill must not read through a closed client)."""
        pending = [t for t in (*self._refills.values(), *self._sweeps.values()) if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._refills.clear()
        self._sweeps.clear()

    async def warm(self, pools: list[Pool], timeout: float, limit: int = 64) -> None:
        """Fill the buffers of (up to ``limit``) known pools, waiting at most ``timeout``
        seconds, so the first new lease of each does not pay for a sweep."""
        for pool in pools[:limit]:
            self._start_refill(pool, self.buffer(pool))
        await self.idle(timeout)

    def refill_soon(self, pool: Pool) -> None:
        """Top the pool's buffer up in the background if it runs low (after a take)."""
        buf = self.buffers.get((pool.client_id, pool.pool_id))
        if buf is not None and buf.needs_refill():
            self._start_refill(pool, buf)

    # -- I/O -----------------------------------------------------------------------------
    def _start_refill(self, pool: Pool, buf: CandidateBuffer) -> None:
        k = (pool.client_id, pool.pool_id)
        task = self._refills.get(k)
        if task is None or task.done():
            self._refills[k] = asyncio.get_running_loop().create_task(self._refill(pool, buf))

    async def _refill(self, pool: Pool, buf: CandidateBuffer) -> None:
        """Up to three reads (a lane that ends, a first read from an end) until the buffer is
        above its low watermark."""
        deadline = time.monotonic() + max(2.0, self.cfg.default_deadline)
        try:
            for _ in range(3):
                await self._read_plan(pool, buf, buf.plan(), deadline)
                if not buf.needs_refill():
                    return
        except RasdError as exc:
            self.counters.inc("prefetch.refill_errors")
            log.warning("prefetch_refill_failed", pool=pool.pool_id, error=str(exc))

    async def _sweep(self, pool: Pool, buf: CandidateBuffer, deadline: float) -> int:
        """The buffer is empty: read the lane (or a new one), then, unless that kept a
        candidate, every other sub-partition: at once, or in a short pool (direct, or read
        whole) in waves of ``DIRECT_WAVES`` (most misses end at the first few, as the paper's
        agent's do).
        Marks the pool exhausted when no read found a claimable item (kept or not), from the
        moment the sweep began: its reads are that old, and a slow sweep (a loaded backend)
        must not stretch the time NO_CAPACITY is answered without reading. Returns how many
        candidates were kept (or, if none, found)."""
        began = self.clock.mono()
        buf.sweep_began()
        found = buf.found
        first = buf.plan(urgent=True)
        kept = await self._read_plan(pool, buf, first, deadline)
        if kept:
            return kept
        others = [n for n in buf.lanes.partitions() if n != first.n]
        waves = [others]
        if buf.direct() or buf.whole():
            self.counters.inc("prefetch.sweeps_direct")
            cuts = [0, *DIRECT_WAVES, len(others)]
            waves = [others[a:b] for a, b in itertools.pairwise(cuts) if others[a:b]]
        for wave in waves:
            reads = (self._read(pool, buf, buf.probe(n), deadline) for n in wave)
            kept = sum(await asyncio.gather(*reads))
            if kept:
                return kept
        if buf.found == found:
            buf.mark_exhausted(began)
            self.counters.inc("prefetch.exhausted")
            await self._explain(pool, buf, deadline)
        # found but not kept (no room): not nothing, so the caller sweeps again
        return kept or buf.found - found

    async def _explain(self, pool: Pool, buf: CandidateBuffer, deadline: float) -> None:
        """After an empty sweep: what NO_CAPACITY will say, from what the sweep read (items
        claimable later) and one bounded Query for items in quarantine (in no index). Once
        per ``exhausted_backoff`` at most; a failed or unaffordable read says nothing."""
        quarantined: list[str] = []
        all_read = True
        now = time.monotonic()
        if deadline - now >= QUARANTINE_READ_MIN_S:
            self.counters.inc("prefetch.quarantine_reads")
            try:
                quarantined, all_read = await self.store.query_quarantined(
                    pool.client_id,
                    pool.pool_id,
                    self.cfg.region,
                    QUARANTINE_READ,
                    min(deadline, now + QUARANTINE_READ_S),
                )
            except RasdError as exc:
                self.counters.inc("prefetch.quarantine_read_errors")
                log.debug("quarantine_read_failed", pool=pool.pool_id, error=str(exc))
        ahead = list(buf.unclaimable.values())
        buf.why_empty = why_empty(ahead, quarantined, all_read, fmt_time(self.clock.now_us()))

    async def _read_plan(
        self, pool: Pool, buf: CandidateBuffer, read: Read, deadline: float
    ) -> int:
        """``read``; when it is the pool's first read from an end, the other end at the same
        time (one round trip, not two, before lanes can start: start-up waits for it; not
        when sub-partitions are read whole, with no lanes). Returns how many candidates were
        kept."""
        if read.after is None and not read.lane and not buf.lanes.ends_known() and not buf.whole():
            other = buf.plan(urgent=bool(read.keep))
            kept = await asyncio.gather(
                self._read(pool, buf, read, deadline), self._read(pool, buf, other, deadline)
            )
            return sum(kept)
        return await self._read(pool, buf, read, deadline)

    async def _read(self, pool: Pool, buf: CandidateBuffer, read: Read, deadline: float) -> int:
        """One read (and, when it keeps nothing after a random start or at the tail, a sample
        of the head). Returns how many candidates were kept."""
        self.counters.inc("prefetch.reads")
        part = partition_name(pool.client_id, pool.pool_id, self.cfg.region, read.n)
        t0 = time.monotonic()
        try:
            if read.after is None:
                items = await self.store.query_available(part, read.limit, read.forward, deadline)
            else:
                self.counters.inc(
                    "prefetch.reads_lane" if read.lane else "prefetch.reads_random_start"
                )
                lease_available, resource = read.after
                items = await self.store.query_available(
                    part,
                    read.limit,
                    read.forward,
                    deadline,
                    after=(lease_available, pool.client_id, resource),
                )
        except BaseException:
            buf.lanes.read_failed(read)
            raise
        buf.note_refill(time.monotonic() - t0)
        self.counters.inc("prefetch.items_read", len(items))
        now_us = self.clock.now_us()
        ok = [it for it in items if it.claimable(now_us)]
        kept = buf.read_done(read, items, ok, self.clock.mono(), now_us)
        found = kept if read.keep != 0 else len(ok)  # a read from an end may keep nothing
        if not found and (read.after is not None or not read.forward):
            # Nothing kept past the start (nothing claimable, or only what this daemon has
            # just taken), or only quarantined items at the tail (early frees are claimable
            # from a future ``lease_available``): a sample of the head.
            self.counters.inc("prefetch.reads_head_fallback")
            head = Read(read.n, None, True, self.cfg.prefetch_page, keep=END_KEEP)
            items = await self.store.query_available(part, head.limit, True, deadline)
            self.counters.inc("prefetch.items_read", len(items))
            now_us = self.clock.now_us()
            ok = [it for it in items if it.claimable(now_us)]
            kept = buf.read_done(head, items, ok, self.clock.mono(), now_us)
        return kept
