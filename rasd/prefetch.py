"""Prefetched claim candidates per (client, pool), so a new lease costs one conditional write.

Theory of operation
-------------------
``CandidateBuffer`` (pure, time passed in) holds free items read from the
``available_resources`` index. A new lease takes the first fresh candidate and makes the single
conditional claim; losing the race just means taking the next one.

Spreading daemons over different items (see the dalloc seed). A pool seeded in one batch has
the same ``lease_available`` on every item, so a start *time* cannot spread readers: the index
orders such items by the base table's keys. Every read therefore starts after a random
position of the index, an ``ExclusiveStartKey`` (partition, lease_available, client_id,
resource) that need not exist:

* ``lease_available``: one of the values seen claimable in that sub-partition before (a
  reservoir, so dense times are picked as often as they occur), or the head when none is known;
* ``resource``: a random name drawn per character position from the names seen in the pool
  (``NameModel``), so the start falls anywhere in the range of names, not only between names
  already read;
* the direction is random, and the page is a random sample of what is read.

Sub-partitions: each daemon has a *home* sub-partition from a hash of its host identity
(hostname, pid) and reads it first most of the time (``HOME_SHARE``), the others in random
order; daemons of one host and of different hosts thus mostly read different sub-partitions.
When the read after a random start finds nothing claimable, the head is read (the fallback:
the start may lie past the last item, or a backend may ignore the key).

Sizing: the buffer tracks demand as an EWMA of takes per second and keeps about
``REFILL_HORIZON`` seconds of it plus twice the time a refill read takes (an EWMA too), clamped
to ``prefetch_min..prefetch_max``; a refill starts in
the background, after the claim it follows has been sent, when the buffer falls below half of
that. A background page after a random start is twice the room left (at least ``MIN_PAGE``,
at most ``prefetch_page``): a slow daemon reads small pages. A read from an end, where all
daemons that know nothing yet start, is a whole ``prefetch_page`` sampled at random.
Candidates older than ``candidate_max_age`` are dropped: by then another daemon has likely
taken them.

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
import os
import random
import socket
import time
import zlib
from collections import deque
from dataclasses import dataclass

import structlog

from .clock import Clock
from .config import Config
from .errors import RasdError
from .lease import PARTITIONS, Pool, ResourceItem, partition_name
from .metrics import Counters
from .store import Store

log = structlog.get_logger("rasd.prefetch")

REFILL_HORIZON = 2.0  # seconds of demand a buffer should hold
DEMAND_HALF_LIFE = 3.0  # seconds: react within a few seconds to a burst of new keys
HOME_SHARE = 0.75  # share of refills that read the daemon's home sub-partition first
SEEN_MAX = 32  # lease_available values remembered per sub-partition
NAMES_MAX = 64  # resource names remembered per pool (NameModel)
MIN_PAGE = 8  # smallest page a refill reads
HEAD_SHARE = 0.1  # share of reads that start at an end of the index anyway

#: (lease_available, resource): with the partition and client_id, an index position
StartKey = tuple[str, str]


def host_seed() -> int:
    """A stable number for this daemon (hostname and pid): its home sub-partition."""
    return zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode())


class NameModel:
    """Random resource names shaped like the ones seen: per character position, any character
    between the lowest and the highest seen there (names read at both ends of an index thus
    span its whole range). Pure; bounded (a reservoir of ``NAMES_MAX`` names)."""

    __slots__ = ("_chars", "_dirty", "n", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.n = 0  # names offered so far (reservoir sampling)
        self._chars: list[str] = []
        self._dirty = False

    def learn(self, name: str, rng: random.Random) -> None:
        self.n += 1
        if len(self.names) < NAMES_MAX:
            self.names.append(name)
        else:
            j = rng.randrange(self.n)
            if j >= NAMES_MAX:
                return
            self.names[j] = name
        self._dirty = True

    def draw(self, rng: random.Random) -> str | None:
        if not self.names:
            return None
        if self._dirty:
            width = max(len(x) for x in self.names)
            chars = []
            for i in range(width):
                seen = [ord(x[i]) for x in self.names if len(x) > i]
                chars.append("".join(map(chr, range(min(seen), max(seen) + 1))))
            self._chars = chars
            self._dirty = False
        length = len(rng.choice(self.names))
        return "".join(rng.choice(self._chars[i]) for i in range(length))


@dataclass(slots=True)
class Candidate:
    item: ResourceItem
    fetched: float  # monotonic seconds


class CandidateBuffer:
    """Candidates of one pool. Pure: every method takes ``now`` (monotonic seconds)."""

    def __init__(self, cfg: Config, rng: random.Random, seed: int = 0) -> None:
        self.cfg = cfg
        self.rng = rng
        self.home = seed % PARTITIONS
        self.q: deque[Candidate] = deque()
        self.exhausted_until = 0.0
        self.rate = 0.0  # EWMA of takes per second
        self._last_take = 0.0
        #: EWMA of how long a refill read took (seconds): the buffer must outlast it
        self.refill_s = 0.0
        #: per sub-partition: lease_available values seen claimable (a reservoir)
        self.seen: dict[int, list[str]] = {}
        self._seen_n: dict[int, int] = {}
        self.names = NameModel()
        self._ends: set[bool] = set()  # directions of reads from an end so far

    def __len__(self) -> int:
        return len(self.q)

    # -- demand --------------------------------------------------------------------------
    def _note_take(self, now: float) -> None:
        dt = max(now - self._last_take, 1e-3) if self._last_take else DEMAND_HALF_LIFE
        self._last_take = now
        alpha = 1.0 - math.exp(-dt * math.log(2) / DEMAND_HALF_LIFE)
        self.rate += alpha * (1.0 / dt - self.rate)

    def target(self) -> int:
        """REFILL_HORIZON seconds of demand, plus twice what a refill takes (a slow or loaded
        DynamoDB must not empty the buffer while its refill is on the way)."""
        want = math.ceil(self.rate * (REFILL_HORIZON + 2 * self.refill_s))
        return max(self.cfg.prefetch_min, min(self.cfg.prefetch_max, want))

    def note_refill(self, seconds: float) -> None:
        """A refill read took ``seconds`` (EWMA, weight 1/4: a few reads to follow a change)."""
        self.refill_s += 0.25 * (seconds - self.refill_s)

    def needs_refill(self) -> bool:
        return len(self.q) < max(1, self.target() // 2)

    def page(self) -> int:
        """How many items a refill reads: twice the room left, within MIN_PAGE..prefetch_page."""
        room = max(1, self.target() - len(self.q))
        return max(min(MIN_PAGE, self.cfg.prefetch_page), min(self.cfg.prefetch_page, 2 * room))

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

    def learn(self, n: int, items: list[ResourceItem]) -> None:
        """Remember where claimable items of sub-partition ``n`` are (``items``: claimable)."""
        seen = self.seen.setdefault(n, [])
        count = self._seen_n.get(n, 0)
        for it in items:
            if it.lease_available is None:
                continue
            count += 1
            if len(seen) < SEEN_MAX:
                seen.append(it.lease_available)
            else:
                j = self.rng.randrange(count)
                if j < SEEN_MAX:
                    seen[j] = it.lease_available
            self.names.learn(it.resource, self.rng)
        self._seen_n[n] = count
        if not seen:
            del self.seen[n]

    def start_key(self, n: int) -> StartKey | None:
        """A random position to read sub-partition ``n`` after (None: from an end)."""
        seen = self.seen.get(n)
        if not seen or self.rng.random() < HEAD_SHARE:
            return None
        name = self.names.draw(self.rng)
        if name is None:
            return None
        return self.rng.choice(seen), name

    def end_direction(self) -> bool:
        """The direction of a read from an end of the index (True: forward, from the head).
        The pool's first two go opposite ways, so names from both ends feed the NameModel."""
        left = [d for d in (True, False) if d not in self._ends]
        forward = self.rng.choice(left) if left else self.rng.random() < 0.5
        self._ends.add(forward)
        return forward

    # -- exhaustion ----------------------------------------------------------------------
    def exhausted(self, now: float) -> bool:
        return now < self.exhausted_until

    def mark_exhausted(self, now: float) -> None:
        self.exhausted_until = now + self.cfg.exhausted_backoff

    def partitions(self) -> list[int]:
        """Sub-partitions in the order to read them: mostly the home one first, then the
        others in random order."""
        order = list(range(PARTITIONS))
        self.rng.shuffle(order)
        if self.rng.random() < HOME_SHARE:
            order.remove(self.home)
            order.insert(0, self.home)
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

    def buffer(self, pool: Pool) -> CandidateBuffer:
        k = (pool.client_id, pool.pool_id)
        buf = self.buffers.get(k)
        if buf is None:
            buf = self.buffers[k] = CandidateBuffer(self.cfg, self.rng, self.seed)
        return buf

    def depth(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    async def candidate(self, pool: Pool, deadline: float) -> Candidate | None:
        """A candidate to claim, or None when the pool has no free item in this region.
        Starts no refill: call :meth:`refill_soon` once the claim has been sent, so that
        building the refill's request never delays the claim."""
        buf = self.buffer(pool)
        now = self.clock.mono()
        c = buf.take(now)
        if c is not None:
            self.counters.inc("prefetch.hits")
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
        deadline = time.monotonic() + max(2.0, self.cfg.default_deadline)
        try:
            for n in buf.partitions()[:3]:
                if await self._read(pool, buf, n, deadline, buf.page()) and not buf.needs_refill():
                    return
        except RasdError as exc:
            self.counters.inc("prefetch.refill_errors")
            log.warning("prefetch_refill_failed", pool=pool.pool_id, error=str(exc))

    async def _sweep(self, pool: Pool, buf: CandidateBuffer, deadline: float) -> None:
        """The buffer is empty: read one random sub-partition, then all the others at once."""
        order = buf.partitions()
        page = self.cfg.prefetch_page
        if await self._read(pool, buf, order[0], deadline, page):
            return
        found = await asyncio.gather(*(self._read(pool, buf, n, deadline, page) for n in order[1:]))
        if not any(found):
            buf.mark_exhausted(self.clock.mono())
            self.counters.inc("prefetch.exhausted")

    async def _read(
        self, pool: Pool, buf: CandidateBuffer, n: int, deadline: float, limit: int
    ) -> bool:
        self.counters.inc("prefetch.reads")
        part = partition_name(pool.client_id, pool.pool_id, self.cfg.region, n)
        start = buf.start_key(n)
        forward = self.rng.random() < 0.5 if start is not None else buf.end_direction()
        t0 = time.monotonic()
        if start is None:
            # From an end of the index, where every daemon with nothing learnt yet reads: a
            # whole page, of which add() keeps a random sample, so two such daemons rarely
            # keep the same items.
            limit = self.cfg.prefetch_page
            items = await self.store.query_available(part, limit, forward, deadline)
        else:
            self.counters.inc("prefetch.reads_random_start")
            lease_available, resource = start
            items = await self.store.query_available(
                part, limit, forward, deadline, after=(lease_available, pool.client_id, resource)
            )
        buf.note_refill(time.monotonic() - t0)
        now_us = self.clock.now_us()
        items = [it for it in items if it.claimable(now_us)]
        if not items and (start is not None or not forward):
            # Nothing claimable past the random start, or only quarantined items at the tail
            # (early frees are claimable from a future ``lease_available``): read the head.
            self.counters.inc("prefetch.reads_head_fallback")
            items = await self.store.query_available(part, limit, True, deadline)
            now_us = self.clock.now_us()
            items = [it for it in items if it.claimable(now_us)]
        buf.learn(n, items)
        buf.add(items, self.clock.mono())
        return bool(items)
