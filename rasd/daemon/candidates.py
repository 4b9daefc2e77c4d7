"""Claim candidates per (client, pool): which free items a new lease tries, and in what order.

``CandidateBuffer`` (pure, time passed in) keeps what the index reads return, drops what
went stale or lost a race, and marks a pool exhausted after a sweep found nothing claimable
(:func:`why_empty` says why). Where reads go is ``rasd.daemon.lanes``, how many to hold
``rasd.daemon.sizing``; the rules: docs/design.md, "Prefetch".
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from ..config import Config
from ..core.lease import ResourceItem, parse_time, partition_of
from .lanes import Lanes, Read
from .sizing import BURST_HALF_LIFE, DEMAND_HALF_LIFE, WHOLE_FREE, FleetView, Sizing, size_buffer

MIN_PAGE = 8  # smallest page a refill reads
TAKEN_MAX = 256  # (resource, version) taken lately, not kept as candidates again
UNCLAIMABLE_MAX = 256  # items with a lease_available ahead remembered per sweep
DIRECT_MAX_AGE = 2.0  # seconds a candidate is kept in direct mode (others take it soon)
#: In a quiet pool a candidate is kept up to this share of how long the items read had sat
#: claimable (at that age about four in five are still free), at most candidate_max_age_quiet
QUIET_SHARE = 0.25
QUIET_AFTER_LOST = 60.0  # seconds after a lost race the pool is not quiet


def why_empty(ahead: list[str], quarantined: list[str], all_read: bool, now: str) -> str | None:
    """What a NO_CAPACITY answer adds about the pool's free items that are not claimable:
    ``ahead``, the ``lease_available`` of those a sweep read that are claimable only later;
    ``quarantined``, the ``quarantine_until`` of those in quarantine (out of the available
    index until re-listed), ``all_read`` when that read covered every item. ``now``: the
    time, formatted. None when there is nothing to say."""
    parts = []
    if quarantined:
        n, first = len(quarantined), min(quarantined)
        count = f"{n}" if all_read else f"at least {n}"
        until = f"until {first}" if n == 1 else f"the first until {first}"
        part = f"{count} in quarantine ({until}, then claimable once re-listed)"
        if first <= now:
            part += "; it is over: the daemon that freed it re-lists it, else ras-liberator"
        parts.append(part)
    if ahead:
        n, first = len(ahead), min(ahead)
        parts.append(f"{n}{'+' if n >= UNCLAIMABLE_MAX else ''} not claimable before {first}")
    return "; ".join(parts) or None


@dataclass(slots=True)
class Candidate:
    item: ResourceItem
    fetched: float  # monotonic seconds
    lane: int = 0  # the lane it was read from (0: a sampled read, no lane)
    batch: int = 0  # the read it came from


class CandidateBuffer:
    """Candidates of one pool. Pure: every method takes ``now`` (monotonic seconds).
    ``lanes``: where its reads go; ``fleet``: what they saw of the pool, for its size."""

    def __init__(self, cfg: Config, rng: random.Random, seed: int = 0, pool: str = "") -> None:
        self.cfg = cfg
        self.rng = rng
        self.now = 0.0  # the latest time passed in (monotonic)
        self.lanes = Lanes(rng, cfg.prefetch_page, seed, pool)
        self.fleet = FleetView()
        self._batches = 0  # reads that kept candidates
        #: fresh claimable items reads found, kept or not (a sweep that found none: exhausted)
        self.found = 0
        self.q: deque[Candidate] = deque()
        self.exhausted_until = 0.0
        self.rate = 0.0  # takes per second: max(fast, slow)
        self.fast = 0.0  # decaying count of takes, BURST_HALF_LIFE
        self.slow = 0.0  # decaying count of takes, DEMAND_HALF_LIFE
        self._last_take: float | None = None
        #: EWMA of how long a refill read took (seconds): the buffer must outlast it
        self.refill_s = 0.0
        #: (resource, version) this daemon took lately, and when (monotonic): not a candidate
        #: again at that version (a new lane may cross an old one, two reads may return the
        #: same item, an index read may lag behind the claim); insertion order is time order
        self._taken: dict[tuple[str, int], float] = {}
        #: resource -> lease_available of the items read since the last sweep began that are
        #: claimable only later (bounded: UNCLAIMABLE_MAX)
        self.unclaimable: dict[str, str] = {}
        #: what NO_CAPACITY says while the pool is exhausted (why_empty), if anything
        self.why_empty: str | None = None
        #: candidates dropped by take() as older than max_age (a count, never reset)
        self.stale = 0
        #: how old the candidate of the last lost race was (seconds)
        self.lost_age = 0.0

    def __len__(self) -> int:
        return len(self.q)

    # -- demand --------------------------------------------------------------------------
    def _note_take(self, now: float) -> None:
        """Two decaying counts of takes, scaled to takes per second (each take adds
        ln 2 / half-life): a kernel estimate of the rate that is exact for a steady stream
        and needs no gap to divide by."""
        if self._last_take is not None:
            dt = max(0.0, now - self._last_take)
            self.fast *= 2.0 ** (-dt / BURST_HALF_LIFE)
            self.slow *= 2.0 ** (-dt / DEMAND_HALF_LIFE)
        self._last_take = now
        self.fast += math.log(2) / BURST_HALF_LIFE
        self.slow += math.log(2) / DEMAND_HALF_LIFE
        self.rate = max(self.fast, self.slow)

    def sizing(self) -> Sizing:
        """:func:`size_buffer` from this buffer's demand and what its reads saw of the pool."""
        free = self.fleet.free(self.now)
        daemons = self.fleet.daemons(self.now, self.rate, free)
        return size_buffer(
            self.rate, self.refill_s, free, daemons, self.cfg.prefetch_min, self.cfg.prefetch_max
        )

    def target(self) -> int:
        """REFILL_HORIZON seconds of demand, plus twice what a refill takes (a slow or loaded
        DynamoDB must not empty the buffer while its refill is on the way); never more than
        a fair share of a short pool (:func:`size_buffer`)."""
        return self.sizing().target

    def direct(self) -> bool:
        """The fair share is too small for a buffer: nothing refills ahead of demand."""
        return self.sizing().direct

    def whole(self) -> bool:
        """The pool's sub-partitions hold a few free items each: reads take one whole, from
        its head (a lane's random start would only skip some of them)."""
        free = self.fleet.free(self.now)
        return free is not None and free < WHOLE_FREE

    def note_refill(self, seconds: float) -> None:
        """A refill read took ``seconds`` (EWMA, weight 1/4: a few reads to follow a change)."""
        self.refill_s += 0.25 * (seconds - self.refill_s)

    def needs_refill(self) -> bool:
        """Below the low watermark, half the target: the refill lands before the rest is used.
        Never in direct mode: a miss reads for itself."""
        sz = self.sizing()
        return not sz.direct and len(self.q) < max(1, sz.target // 2)

    def page(self) -> int:
        """How many items a lane read asks for: the room left, within MIN_PAGE..prefetch_page."""
        room = max(1, self.target() - len(self.q))
        return max(min(MIN_PAGE, self.cfg.prefetch_page), min(self.cfg.prefetch_page, room))

    # -- candidates ----------------------------------------------------------------------
    def max_age(self, now: float) -> float:
        """How old a candidate may be: ``candidate_max_age``, sooner in direct mode. In a
        quiet pool (not short) longer: a quarter of how long the items read had sat
        claimable, at most ``candidate_max_age_quiet``; for QUIET_AFTER_LOST after a lost
        race, at most half the age of the candidate that lost (others take candidates that
        old: one lost at twice ``candidate_max_age`` or younger brings the plain limit back).
        A host that takes a new key now and then keeps its candidates and skips the index
        read; the claim's condition decides, as always."""
        base = self.cfg.candidate_max_age
        if self.q and self.direct():
            return min(base, DIRECT_MAX_AGE)
        quiet, age = self.cfg.candidate_max_age_quiet, self.fleet.age
        if quiet <= base or age is None or self.whole():
            return base
        limit = min(quiet, QUIET_SHARE * age)
        if now - self.fleet.lost_at <= QUIET_AFTER_LOST:
            limit = min(limit, self.lost_age / 2)
        return max(base, limit)

    def take(self, now: float) -> Candidate | None:
        """The next fresh candidate, dropping stale ones (:meth:`max_age`)."""
        self.now = max(self.now, now)
        self._note_take(now)
        max_age = self.max_age(now)
        while self.q:
            c = self.q.popleft()
            if now - c.fetched <= max_age:
                self._remember_taken(c.item, now)
                return c
            self.stale += 1
        return None

    def _remember_taken(self, item: ResourceItem, now: float) -> None:
        self._forget_taken(now)
        if len(self._taken) >= TAKEN_MAX:
            del self._taken[next(iter(self._taken))]
        self._taken[(item.resource, item.version)] = now

    def untake(self, item: ResourceItem) -> None:
        """The claim of ``item`` did not apply, or may not have: if a read shows it again at
        the same version, it is a candidate (the claim's condition decides)."""
        self._taken.pop((item.resource, item.version), None)

    def _forget_taken(self, now: float) -> None:
        """Drop takes older than ``candidate_max_age``: an index that still shows such an
        item at the version taken is lagging a lot, and the claim's condition decides."""
        horizon = now - self.cfg.candidate_max_age
        while self._taken:
            first = next(iter(self._taken))
            if self._taken[first] >= horizon:
                break
            del self._taken[first]

    def add(
        self, items: list[ResourceItem], now: float, lane: int = 0, keep: int | None = None
    ) -> int:
        """Keep candidates from a page of claimable ``items``: all of a lane's page, in index
        order (up to prefetch_max); of any other read a random sample up to the target (and
        up to ``keep`` if given). Returns how many were kept."""
        self.now = max(self.now, now)
        self._forget_taken(now)
        held = {c.item.resource for c in self.q}
        taken = self._taken
        fresh = [
            it for it in items if it.resource not in held and (it.resource, it.version) not in taken
        ]
        self.found += len(fresh)
        self._batches += 1
        batch = self._batches
        if lane:
            fresh = fresh[: max(0, self.cfg.prefetch_max - len(self.q))]
        else:
            room = max(0, self.target() - len(self.q))
            if keep is not None:
                room = min(room, keep)
            if len(fresh) > room:
                fresh = self.rng.sample(fresh, room)
        for it in fresh:
            self.q.append(Candidate(it, now, lane, batch))
        return len(fresh)

    def lost(self, cand: Candidate) -> int:
        """A claim of ``cand`` lost the race: another daemon reads the same stretch of the
        index. End the lane, drop its other candidates (they are that daemon's next claims
        too) and note the sub-partition as contended. Returns how many were dropped."""
        self.fleet.lost_at = self.now
        self.lost_age = self.now - cand.fetched
        self.lanes.contend(partition_of(cand.item.resource))
        if not cand.lane:
            if not self.whole():
                return 0
            # a whole sub-partition read: the winner read it too, and claims the rest next
            before = len(self.q)
            self.q = deque(c for c in self.q if c.batch != cand.batch)
            return before - len(self.q)
        self.lanes.leave(cand.lane)
        before = len(self.q)
        self.q = deque(c for c in self.q if c.lane != cand.lane)
        return before - len(self.q)

    # -- what to read ----------------------------------------------------------------------
    def plan(self, urgent: bool = False) -> Read:
        """The next refill read: in a pool whose sub-partitions fit in a page
        (:meth:`whole`), the next sub-partition of this daemon's spread order, whole, from
        its head; else the lanes' next read (:meth:`Lanes.plan`), a lane read asking for the
        room left (:meth:`page`)."""
        if self.whole():
            return Read(self.lanes.next_partition(), None, True, self.cfg.prefetch_page)
        return self.lanes.plan(self.page, urgent)

    def probe(self, n: int) -> Read:
        """A read of sub-partition ``n`` that starts no lane (:meth:`Lanes.probe`); from the
        head when the sub-partitions fit in a page."""
        if self.whole():
            return Read(n, None, True, self.cfg.prefetch_page)
        return self.lanes.probe(n)

    def read_done(
        self,
        read: Read,
        raw: list[ResourceItem],
        claimable: list[ResourceItem],
        now: float,
        now_us: int | None = None,
    ) -> int:
        """Take in what ``read`` returned (``claimable``: those claimable now, at ``now_us``
        on the wall clock if given): learn what the pool holds (:class:`FleetView`), move the
        lane on (:meth:`Lanes.read_done`), keep candidates. Returns how many were kept."""
        self.now = max(self.now, now)
        self._observe(read, raw, claimable, now, now_us)
        if len(claimable) < len(raw):
            self._note_unclaimable(raw, claimable)
        if not self.lanes.read_done(read, raw, claimable):
            return 0
        return self.add(claimable, now, read.lane, read.keep)

    def _observe(
        self,
        read: Read,
        raw: list[ResourceItem],
        claimable: list[ResourceItem],
        now: float,
        now_us: int | None,
    ) -> None:
        full = len(raw) >= read.limit
        taken = self._taken
        free = [it for it in claimable if (it.resource, it.version) not in taken]
        count = len(free)
        if read.after is not None and not full:
            # the rest of a sub-partition after a position, about half of it on average
            count *= 2
        ages = []
        if now_us is not None:
            for it in free:
                if it.lease_available is not None:
                    try:
                        ages.append((now_us - parse_time(it.lease_available)) / 1e6)
                    except ValueError:
                        continue
        self.fleet.observe(read.n, count, full, ages, now)

    def _note_unclaimable(self, raw: list[ResourceItem], claimable: list[ResourceItem]) -> None:
        ok = {it.resource for it in claimable}
        room = UNCLAIMABLE_MAX - len(self.unclaimable)
        for it in raw:
            if room <= 0:
                return
            if it.resource not in ok and it.lease_available is not None:
                if it.resource not in self.unclaimable:
                    room -= 1
                self.unclaimable[it.resource] = it.lease_available

    # -- exhaustion ----------------------------------------------------------------------
    def exhausted(self, now: float) -> bool:
        return now < self.exhausted_until

    def mark_exhausted(self, now: float) -> None:
        self.exhausted_until = now + self.cfg.exhausted_backoff

    def sweep_began(self) -> None:
        """A sweep starts: what NO_CAPACITY will say is what it reads."""
        self.unclaimable.clear()
        self.why_empty = None
