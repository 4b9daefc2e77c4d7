"""Claim candidates per (client, pool): which free items a new lease tries, and in what order.

Theory of operation
-------------------
``CandidateBuffer`` (pure, time passed in) holds free items read from the
``available_resources`` index. A new lease takes the first fresh candidate and makes the single
conditional claim; losing the race just means taking the next one. Prefetch only chooses
candidates: the claim's condition decides.

Lanes: spreading daemons over different items, so that their claims rarely meet. A pool
seeded in one batch has the same ``lease_available`` on every item, so a start *time* cannot
spread readers: the index orders such items by the base table's keys. A daemon therefore reads
a *lane*: it starts after a random position of the index, an ``ExclusiveStartKey``
(partition, lease_available, client_id, resource) that need not exist, and every later refill
continues forward after the last item it read, keeping every claimable item of the page in
index order. Each daemon thus consumes its own stretch of the index, and another daemon's
candidates overlap it only where two lanes run into each other, instead of at every refill
(when every refill started at a fresh random point, each start could land among another
daemon's candidates). The start position:

* ``lease_available``: one of the values seen claimable in that sub-partition (a reservoir, so
  dense times are picked as often as they occur), or in the pool when none is known there;
* ``resource``: a random name drawn per character position from the names seen in the pool
  (``NameModel``), so the start falls anywhere in the range of names.

At the end of its sub-partition (a short page) or at an item not claimable yet (the
quarantined tail) a lane wraps to the head; it ends when the head has nothing either, or when
a claim from it loses the race: the winner is reading the same stretch, so the daemon drops
the lane's other candidates (``lost``; a read of that lane still in flight keeps nothing),
counts the sub-partition as contended and starts a new lane at a new random position, in one
of the least contended sub-partitions. Each daemon has a *home* sub-partition from a hash of
its host identity (hostname, pid) where it starts most lanes (``HOME_SHARE``). A lane read
still in flight is never read twice (a sweep next to a refill starts another lane), and an
item this daemon took lately is not a candidate again *at the version it was taken at*
(``TAKEN_MAX``, ``candidate_max_age``): two lanes may cross and an index read may lag behind a
claim, but once the item is freed again (any free writes a new version) it is a candidate
like any other. Until both ends of
the pool have been read (the first two reads from an end go opposite ways, so the NameModel
spans the range of names; starting lanes from one end's names would crowd them into a part
of it), reads are from an end and keep nothing in the background, ``END_KEEP`` random items
when a request waits: every cold daemon reads there. When a lane's random start finds nothing
claimable, a sample of the head is read (the start may lie past the last item, or a backend
may ignore the key).

Sizing: demand is the larger of two decaying counts of takes (half-lives ``BURST_HALF_LIFE``
and ``DEMAND_HALF_LIFE``): a burst after a pause is seen within a few takes, a steady rate is
not forgotten in a short lull. The target is ``REFILL_HORIZON`` seconds of demand plus twice
the time a refill read takes (an EWMA), clamped to ``prefetch_min..prefetch_max``; the floor
is what a burst after a pause starts from. A refill starts in the background, after the claim
it follows has been sent, when the buffer falls below half of the target (the low watermark),
and reads the room left (at least ``MIN_PAGE``, at most ``prefetch_page``). Candidates older
than ``candidate_max_age`` are dropped: by then another daemon has likely taken them.

A short pool caps the target at a fair share, its free items over the daemons drawing on them
(:func:`size_buffer`), both estimated from this daemon's own reads (:class:`FleetView`); the
floor ``prefetch_min`` does not hold under that cap, since 16 daemons keeping 12 each of 20
free items would all hold the same ones. Under ``WHOLE_FREE`` free items a read takes a
sub-partition whole from its head (no lanes: a random start would skip some of its few
items); under a share of ``DIRECT_SHARE`` the daemon is direct: a target of 1, no refill
ahead of demand, a miss reads and claims, candidates left over go stale after
``DIRECT_MAX_AGE``, a lost claim drops the rest of its read.

Spread: sweeps and whole reads visit the sub-partitions in :func:`spread_order`, a
permutation by (daemon, pool, round) that changes every round, so two daemons rarely start
on the same sub-partition and no sub-partition is everyone's start.

Only items claimable now are kept: an early free (release, give-back, dedupe) sets
``lease_available`` in the future (the quarantine, docs/design.md I3), and claims are
conditional on ``lease_available <= now``.

When a sweep of all ten sub-partitions finds no candidate, kept or not (nothing claimable,
or only the stale copies of items this daemon has just claimed), the pool is marked exhausted for
``exhausted_backoff`` seconds from the sweep's start (what it read is that old) and NO_CAPACITY
is answered without reading DynamoDB at all. Those answers say what the daemon knows of the
pool's items that are free but not claimable (:func:`why_empty`): the ones the sweep read with
a ``lease_available`` ahead (``unclaimable``), and the ones in quarantine, which are in no
index (the prefetcher's one bounded read after the sweep).
A sweep that kept candidates which concurrent requests took first is swept again: NO_CAPACITY
is never the answer while the last sweep found something.

``rasd.daemon.prefetch.Prefetcher`` does the I/O around the buffers.
"""

from __future__ import annotations

import math
import os
import random
import socket
import zlib
from collections import deque
from dataclasses import dataclass

from ..config import Config
from ..core.lease import PARTITIONS, ResourceItem, parse_time, partition_of

REFILL_HORIZON = 1.0  # seconds of demand a buffer should hold (plus the refill's time)
DEMAND_HALF_LIFE = 3.0  # seconds: the steady demand, kept through a short lull
BURST_HALF_LIFE = 0.5  # seconds: a burst after a pause is seen within a few takes
HOME_SHARE = 0.75  # share of lanes that start in the daemon's home sub-partition
SEEN_MAX = 32  # lease_available values remembered per sub-partition
NAMES_MAX = 64  # resource names remembered per pool (NameModel)
MIN_PAGE = 8  # smallest page a refill reads
END_KEEP = 4  # items kept from a read from an end (where every cold daemon reads)
TAKEN_MAX = 256  # (resource, version) taken lately, not kept as candidates again
CONTENDED_MEMORY = 32  # lost claims remembered per pool (then halved) to steer new lanes
UNCLAIMABLE_MAX = 256  # items with a lease_available ahead remembered per sweep
FLEET_MEMORY = 5.0  # seconds a read's count of a sub-partition's free items stands for it
FLEET_MIN_SEEN = 2  # sub-partitions read lately before their counts stand for the pool
AGE_WEIGHT = 0.25  # EWMA weight of one read's mean age of its claimable items
MIN_AGE = 0.05  # seconds: floor of that age (clock skew, items freed just now)
MIN_RATE = 0.05  # takes per second: floor of a daemon's own demand (an idle daemon)
DIRECT_SHARE = 4  # a fair share below this: no buffer; a miss reads, then claims (direct)
WHOLE_FREE = 60  # free items below which sub-partitions are read whole, from the head
DIRECT_MAX_AGE = 2.0  # seconds a candidate is kept in direct mode (others take it soon)

#: (lease_available, resource): with the partition and client_id, an index position
StartKey = tuple[str, str]


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


@dataclass(frozen=True, slots=True)
class Sizing:
    """How many candidates a buffer holds (``target``); ``fair``, the pool's free items over
    the daemons drawing on them (None: not known to be short); ``direct``: the share is too
    small for a buffer, so a miss reads and claims at once and nothing refills ahead."""

    target: int
    fair: int | None
    direct: bool


def size_buffer(
    rate: float, refill_s: float, free: float | None, daemons: float, lo: int, hi: int
) -> Sizing:
    """The buffer's size. Demand: ``rate`` takes per second over REFILL_HORIZON plus twice
    the refill's time ``refill_s``, clamped to ``lo..hi``. Supply: when the free items are
    known (``free``, this region's, shared by ``daemons``), never more than the fair share
    free / daemons (at least 1), the floor ``lo`` included: a floor every daemon keeps would
    hold the same few items in every buffer of a nearly full pool. A share below
    ``DIRECT_SHARE`` is direct: a miss reads and claims one, as the paper's agent does."""
    want = math.ceil(rate * (REFILL_HORIZON + 2 * refill_s))
    target = max(lo, min(hi, want))
    if free is None:
        return Sizing(target, None, False)
    fair = max(1, int(free / max(1.0, daemons)))
    if fair < DIRECT_SHARE:
        return Sizing(1, fair, True)  # the candidate a miss claims at once, nothing ahead
    return Sizing(min(target, fair), fair, False)


class FleetView:
    """What a daemon's own index reads say about one pool, for :func:`size_buffer`; no read
    is made for it. Pure: time passed in.

    * Free items: per sub-partition, the claimable items its last read returned (not those
      this daemon just took), twice that for a read after a position (a lane's or a random
      start: half the sub-partition on average). A page that came back full says only "at
      least a page": the pool is not short (None). With at least ``FLEET_MIN_SEEN`` read
      within ``FLEET_MEMORY`` of the latest read, those not read count as the mean of
      those read. The estimate stands until the next read, however old: a daemon whose
      buffer makes it read seldom must not fall back to a full-size buffer for that.
    * Daemons drawing on them: Little's law. The free items are claimed at the fleet's rate
      free / age, where age is how long the claimable items read had been claimable (their
      ``lease_available``, an EWMA); over this daemon's own rate, that is how many daemons
      of its demand share the pool. A claim lost lately says there is at least one other,
      and in a short pool (under ``WHOLE_FREE``) that the share held was too big: a share
      of 1. (The age of the items read over-weights those that linger, so this count errs
      low.)
      Items read at their seeding time are old, so a fresh pool counts few daemons."""

    __slots__ = ("age", "counts", "lost_at")

    def __init__(self) -> None:
        #: sub-partition -> (claimable items read, the page was full, when: monotonic)
        self.counts: dict[int, tuple[int, bool, float]] = {}
        self.age: float | None = None
        self.lost_at = -math.inf

    def observe(self, n: int, claimable: int, full: bool, ages: list[float], now: float) -> None:
        self.counts[n] = (claimable, full, now)
        if ages:
            mean = max(MIN_AGE, sum(ages) / len(ages))
            self.age = mean if self.age is None else self.age + AGE_WEIGHT * (mean - self.age)

    def free(self, now: float) -> float | None:
        # the reads within FLEET_MEMORY of the latest one: a daemon that reads less often (a
        # bigger buffer) keeps its last estimate until it reads again
        newest = max((at for _, _, at in self.counts.values()), default=now)
        fresh = [(c, full) for c, full, at in self.counts.values() if newest - at <= FLEET_MEMORY]
        if len(fresh) < FLEET_MIN_SEEN or any(full for _, full in fresh):
            return None
        seen = sum(c for c, _ in fresh)
        return seen + seen / len(fresh) * (PARTITIONS - len(fresh))

    def daemons(self, now: float, own_rate: float, free: float | None) -> float:
        d = 1.0
        if free is not None and self.age is not None:
            d = max(1.0, free / self.age / max(own_rate, MIN_RATE))
        if now - self.lost_at <= FLEET_MEMORY:
            d = max(d, 2.0)
            if free is not None and free < WHOLE_FREE:
                # a lost race in a short pool: others claim what this daemon holds, however
                # few the age says they are; a share of 1 (direct) until the races stop
                d = max(d, free)
        return d


def spread_order(seed: int, pool: str, round_: int) -> list[int]:
    """Every sub-partition once, ranked by a hash of (daemon, pool, round): two daemons
    rarely rank the same one first, and each round ranks them anew."""
    return random.Random(f"{seed}:{pool}:{round_}").sample(range(PARTITIONS), PARTITIONS)


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
    lane: int = 0  # the lane it was read from (0: a sampled read, no lane)
    batch: int = 0  # the read it came from


@dataclass(slots=True, frozen=True)
class Read:
    """One Query of sub-partition ``n``: ``after`` a position, or from an end (None)."""

    n: int
    after: StartKey | None
    forward: bool
    limit: int
    #: the lane this read continues or starts (keeps the page in order); 0: keep a sample
    lane: int = 0
    #: the most a sampled read keeps (None: up to the target)
    keep: int | None = None


class CandidateBuffer:
    """Candidates of one pool. Pure: every method takes ``now`` (monotonic seconds)."""

    def __init__(self, cfg: Config, rng: random.Random, seed: int = 0, pool: str = "") -> None:
        self.cfg = cfg
        self.rng = rng
        self.seed = seed
        self.pool = pool
        self.home = seed % PARTITIONS
        self.now = 0.0  # the latest time passed in (monotonic)
        self.fleet = FleetView()
        self.round = 0  # spread_order's round: one per sweep, or per pass of whole reads
        self._order: list[int] = []  # what is left of this round's order
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
        #: per sub-partition: lease_available values seen claimable (a reservoir)
        self.seen: dict[int, list[str]] = {}
        self._seen_n: dict[int, int] = {}
        self.names = NameModel()
        self._ends: set[bool] = set()  # directions of reads from an end so far
        #: the current lane: its sub-partition, the position after which it continues, its id
        self.lane_n = 0
        self.lane_after: StartKey | None = None
        self.lane_id = 0
        self.lane_wrap = False  # the lane reached the end: it goes on from the head
        #: sub-partitions where claims lost lately (how many; halved past CONTENDED_MEMORY):
        #: new lanes avoid them
        self.contended: dict[int, int] = {}
        self._lanes = 0  # lane ids handed out
        self._busy: set[int] = set()  # lanes with a read in flight
        self._lost_lanes: deque[int] = deque(maxlen=8)  # lanes ended by a lost claim
        #: (resource, version) this daemon took lately, and when (monotonic): not a candidate
        #: again at that version (a new lane may cross an old one, two reads may return the
        #: same item, an index read may lag behind the claim); insertion order is time order
        self._taken: dict[tuple[str, int], float] = {}
        #: resource -> lease_available of the items read since the last sweep began that are
        #: claimable only later (bounded: UNCLAIMABLE_MAX)
        self.unclaimable: dict[str, str] = {}
        #: what NO_CAPACITY says while the pool is exhausted (why_empty), if anything
        self.why_empty: str | None = None

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
    def take(self, now: float) -> Candidate | None:
        """The next fresh candidate, dropping stale ones (sooner in direct mode)."""
        self.now = max(self.now, now)
        self._note_take(now)
        max_age = self.cfg.candidate_max_age
        if self.q and self.direct():
            max_age = min(max_age, DIRECT_MAX_AGE)
        while self.q:
            c = self.q.popleft()
            if now - c.fetched <= max_age:
                self._remember_taken(c.item, now)
                return c
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
        n = partition_of(cand.item.resource)
        self.fleet.lost_at = self.now
        self.contended[n] = self.contended.get(n, 0) + 1
        if sum(self.contended.values()) > CONTENDED_MEMORY:  # forget slowly: halve them all
            self.contended = {i: c // 2 for i, c in self.contended.items() if c > 1}
        if not cand.lane:
            if not self.whole():
                return 0
            # a whole sub-partition read: the winner read it too, and claims the rest next
            before = len(self.q)
            self.q = deque(c for c in self.q if c.batch != cand.batch)
            return before - len(self.q)
        if cand.lane == self.lane_id:
            self._end_lane()
        self._lost_lanes.append(cand.lane)  # a read of it still in flight keeps nothing
        before = len(self.q)
        self.q = deque(c for c in self.q if c.lane != cand.lane)
        return before - len(self.q)

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
        """A random position to read sub-partition ``n`` after (None: nothing known yet).
        The time is one seen in ``n``, or in another sub-partition of the pool when none is
        known there (a pool seeded in one batch has one time everywhere). None too until
        both ends of the pool have been read: the names seen at one end span only a part of
        the range, and every daemon would start its lanes in that part."""
        if not self.ends_known():
            return None
        seen = self.seen.get(n)
        if not seen:
            pools = [s for s in self.seen.values() if s]
            if not pools:
                return None
            seen = self.rng.choice(pools)
        name = self.names.draw(self.rng)
        if name is None:
            return None
        return self.rng.choice(seen), name

    def ends_known(self) -> bool:
        """Both ends of the pool have been read (lanes can start)."""
        return len(self._ends) == 2

    def end_direction(self) -> bool:
        """The direction of a read from an end of the index (True: forward, from the head).
        The pool's first two go opposite ways, so names from both ends feed the NameModel."""
        left = [d for d in (True, False) if d not in self._ends]
        forward = self.rng.choice(left) if left else self.rng.random() < 0.5
        self._ends.add(forward)
        return forward

    # -- what to read ----------------------------------------------------------------------
    def plan(self, urgent: bool = False) -> Read:
        """The next refill read: the current lane, or a new one (mostly in the home
        sub-partition) after a random position, or from an end when the pool's two ends are
        not known yet. A read from an end keeps nothing in the background (a lane read
        follows), and ``END_KEEP`` items when a request waits (``urgent``). In a pool whose
        sub-partitions fit in a page (:meth:`whole`): the next sub-partition of this
        daemon's spread order, whole, from its head."""
        if self.whole():
            return Read(self.next_partition(), None, True, self.cfg.prefetch_page)
        if (
            self.lane_id
            and self.lane_id not in self._busy
            and (self.lane_after is not None or self.lane_wrap)
        ):
            self._busy.add(self.lane_id)
            return Read(self.lane_n, self.lane_after, True, self.page(), self.lane_id)
        # no lane, or its read is still in flight (a sweep next to a refill): a new lane
        n = self.lane_partition()
        start = self.start_key(n)
        if start is None:
            keep = END_KEEP if urgent else 0
            return Read(n, None, self.end_direction(), self.cfg.prefetch_page, keep=keep)
        self._lanes += 1
        self.lane_n, self.lane_after, self.lane_id = n, start, self._lanes
        self.lane_wrap = False
        self._busy.add(self.lane_id)
        return Read(n, start, True, self.page(), self.lane_id)

    def lane_partition(self) -> int:
        """Where a new lane starts: mostly the home sub-partition, else one at random; either
        way one of those where claims lost least often."""
        n = self.home if self.rng.random() < HOME_SHARE else self.rng.randrange(PARTITIONS)
        if self.contended.get(n):
            least = min(self.contended.get(i, 0) for i in range(PARTITIONS))
            if self.contended[n] > least:
                n = self.rng.choice(
                    [i for i in range(PARTITIONS) if self.contended.get(i, 0) == least]
                )
        return n

    def next_partition(self) -> int:
        """The next sub-partition of this round's :func:`spread_order` (a new round once
        every one was read)."""
        if not self._order:
            self.round += 1
            self._order = spread_order(self.seed, self.pool, self.round)
        return self._order.pop(0)

    def probe(self, n: int) -> Read:
        """A read of sub-partition ``n`` that starts no lane (a sweep of the others, a
        fallback to the head): a whole page from a random position or an end, sampled; from
        the head when the sub-partitions fit in a page."""
        if self.whole():
            return Read(n, None, True, self.cfg.prefetch_page)
        start = self.start_key(n)
        forward = self.rng.random() < 0.5 if start is not None else self.end_direction()
        return Read(n, start, forward, self.cfg.prefetch_page)

    def read_done(
        self,
        read: Read,
        raw: list[ResourceItem],
        claimable: list[ResourceItem],
        now: float,
        now_us: int | None = None,
    ) -> int:
        """Take in what ``read`` returned (``claimable``: those claimable now, at ``now_us``
        on the wall clock if given): move the lane on past the page (or end it), learn where
        items are and what the pool holds (:class:`FleetView`), keep candidates. Returns how
        many were kept."""
        self.now = max(self.now, now)
        self._busy.discard(read.lane)
        self._observe(read, raw, claimable, now, now_us)
        if len(claimable) < len(raw):
            self._note_unclaimable(raw, claimable)
        if read.lane and read.lane == self.lane_id:
            last = claimable[-1] if claimable else None
            if last is None or last.lease_available is None:
                self._end_lane()  # nothing claimable at all: another lane, elsewhere
            elif len(raw) < read.limit or len(claimable) < len(raw):
                # the end of the sub-partition, or its quarantined tail: on from the head,
                # unless this read was from the head already
                if read.after is None:
                    self._end_lane()
                else:
                    self.lane_after, self.lane_wrap = None, True
            else:
                self.lane_after = (last.lease_available, last.resource)
                self.lane_wrap = False
        self.learn(read.n, claimable)
        if read.lane and read.lane in self._lost_lanes:
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

    def _end_lane(self) -> None:
        self.lane_id, self.lane_after, self.lane_wrap = 0, None, False

    def read_failed(self, read: Read) -> None:
        """``read`` raised: its lane may be read again."""
        self._busy.discard(read.lane)

    # -- exhaustion ----------------------------------------------------------------------
    def exhausted(self, now: float) -> bool:
        return now < self.exhausted_until

    def mark_exhausted(self, now: float) -> None:
        self.exhausted_until = now + self.cfg.exhausted_backoff

    def sweep_began(self) -> None:
        """A sweep starts: what NO_CAPACITY will say is what it reads."""
        self.unclaimable.clear()
        self.why_empty = None

    def partitions(self) -> list[int]:
        """Sub-partitions in the order a sweep reads them: every one, ranked by
        :func:`spread_order` for a new round."""
        self.round += 1
        self._order = []
        return spread_order(self.seed, self.pool, self.round)
